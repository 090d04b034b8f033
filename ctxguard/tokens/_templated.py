"""Counting through a renderer (a chat template or prompt builder) — the exact path.

``count_request`` renders the whole conversation once: that number is what the server
sees. Per-message counts come from *frames*: a message is rendered inside a small fixed
conversation and the frame's known parts are subtracted, computed once per message::

    user       R([m])                      - base
    system     R([m, U1])                  - base - c(U1)
    assistant  R([U0, m, results..., U1])  - base - c(U0) - c(U1) - sum(c(result_i))
    tool       R([U0, call(m), m, U1])     - R([U0, call(m), ref, U1]) + c(ref)

``base`` is the render of no messages or ``R([U0])`` minus a user turn's marginal cost
(after an assistant, a tool result or a user: ``BASE_MODES``); the reference tool
result's cost is measured between users, at the end, or as raw text (``REF_MODES``).
``build`` tries these calibrations and keeps the one under which the most build-time
probes (``_probes.py``) add up; ``additive`` is True only if all of them do.
When a frame is refused, the message gets an estimate (its raw tokens plus
the per-message framing seen on ``U0``); the full render remains the truth.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Protocol

from ctxguard._validate import one_line
from ctxguard.errors import TemplateRefusedError, TokenizerError
from ctxguard.messages import Message
from ctxguard.tokens._openai_dicts import openai_dicts, text_parts
from ctxguard.tokens._protocol import Tools

Dict = dict[str, Any]
U0: Dict = {"role": "user", "content": "Hello there."}
U1: Dict = {"role": "user", "content": "Thanks, please go on."}
REF_RESULT = "ok"
TOOL_ANCHOR_ID = "anchor123"


class Renderer(Protocol):
    """Renders OpenAI dicts into the prompt's token count, exactly as the server would."""

    def render(self, conversation: Sequence[Dict], tools: Tools | None = None) -> int:
        """Prompt length with the generation prompt; raises TemplateRefusedError."""
        ...

    def raw_count(self, text: str) -> int:
        """Tokens of bare text, no special tokens added."""
        ...


# A renderer may also define ``validate(conversation, tools=None) -> None``: raise the
# TemplateRefusedError ``render`` would raise, more cheaply (no tokenizing). Without it,
# ``TemplateCounter.validate`` renders.


def call_for(ids: Sequence[str]) -> Dict:
    """A fixed assistant message that calls one tool per id."""
    calls = [
        {"id": i, "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
        for i in ids
    ]
    return {"role": "assistant", "content": None, "tool_calls": calls}


def result_for(call_id: str) -> Dict:
    return {"role": "tool", "tool_call_id": call_id, "content": REF_RESULT}


A0: Dict = {"role": "assistant", "content": "Sure."}
BASE_MODES = ("empty", "after_assistant", "after_tool", "after_user")
REF_MODES = ("between_users", "at_end", "raw")


class TemplateCounter:
    """A TokenCounter over any :class:`Renderer`; ``additive`` is set by ``build``.

    ``base_mode`` and ``ref_mode`` choose how the two free anchors of the frame
    arithmetic are measured (see ``_base_cost`` and ``_measure_ref``); ``build`` picks
    the pair under which the most probes add up.
    """

    exact = True

    def __init__(self, renderer: Renderer, fingerprint: str, base_mode: str, ref_mode: str) -> None:
        self._renderer = renderer
        self.fingerprint = fingerprint
        self.calibration = f"{base_mode}/{ref_mode}"
        self._ref_mode = ref_mode
        self._ref_costs: dict[str, int] = {}
        self._base = self._base_cost(base_mode)
        self._u0 = renderer.render([U0]) - self._base
        self._u1 = renderer.render([U1]) - self._base
        self.probe_report: dict[str, str] = {}
        self.additive = False

    def _base_cost(self, mode: str) -> int:
        """The fixed part: ``R([])``, or ``R([U0])`` minus a user turn's marginal cost."""
        render = self._renderer.render
        if mode == "empty":
            return render([])
        if mode == "after_assistant":
            return render([U0]) - (render([U1, A0, U0]) - render([U1, A0]))
        if mode == "after_tool":
            prefix = [U1, call_for([TOOL_ANCHOR_ID]), result_for(TOOL_ANCHOR_ID)]
            return render([U0]) - (render([*prefix, U0]) - render(prefix))
        return render([U0]) - (render([U1, U0]) - render([U1]))

    # -- the contract -------------------------------------------------------

    def count_request(self, messages: Sequence[Message], *, tools: Tools | None = None) -> int:
        """The full render: exact, or TemplateRefusedError with the template's message."""
        return self._renderer.render(openai_dicts(messages), tools)

    def request_overhead(self, *, tools: Tools | None = None) -> int:
        """``base`` plus what the tool schemas add to a one-user-message prompt."""
        if not tools:
            return self._base
        with_tools = self._renderer.render([U0], tools)
        return self._base + with_tools - self._renderer.render([U0])

    def validate(self, messages: Sequence[Message], *, tools: Tools | None = None) -> None:
        """Refuse exactly what ``count_request`` refuses, for the additive path.

        Uses the renderer's own cheap check when it has one (mistral_common's validator
        and prompt builder without tokenizing; a Jinja render without tokenizing),
        else renders.
        """
        conversation = openai_dicts(messages)
        check = getattr(self._renderer, "validate", None)
        if check is not None:
            check(conversation, tools)
        else:
            self._renderer.render(conversation, tools)

    def count_message(self, message: Message) -> int:
        """The message's frame cost; an estimate when its frame is refused."""
        data = openai_dicts([message])[0]
        try:
            return self.frame_cost(data)
        except TemplateRefusedError:
            return self.estimate(data)

    # -- frames ---------------------------------------------------------------

    def frame_cost(self, data: Dict) -> int:
        """Tokens ``data`` adds to a request, measured in its role's frame."""
        render = self._renderer.render
        role = data["role"]
        if role == "user":
            return render([data]) - self._base
        if role == "assistant":
            ids = [c["id"] for c in data.get("tool_calls") or ()]
            frame = [U0, data, *[result_for(i) for i in ids], U1]
            known = self._base + self._u0 + self._u1 + sum(self._ref_cost(i) for i in ids)
            return render(frame) - known
        if role == "tool":
            call = call_for([data["tool_call_id"]])
            ref = render([U0, call, result_for(data["tool_call_id"]), U1])
            return render([U0, call, data, U1]) - ref + self._ref_cost(data["tool_call_id"])
        return render([data, U1]) - self._base - self._u1

    def _ref_cost(self, call_id: str) -> int:
        """Cost credited to the reference tool result (an anchor; probes check the sums)."""
        if call_id not in self._ref_costs:
            if len(self._ref_costs) > 4096:
                self._ref_costs.clear()
            try:
                self._ref_costs[call_id] = self._measure_ref(call_id)
            except TemplateRefusedError:
                self._ref_costs[call_id] = self._renderer.raw_count(REF_RESULT)
        return self._ref_costs[call_id]

    def _measure_ref(self, call_id: str) -> int:
        render = self._renderer.render
        call, ref = call_for([call_id]), result_for(call_id)
        if self._ref_mode == "between_users":
            return render([U0, call, ref, U1]) - render([U0, call, U1])
        if self._ref_mode == "at_end":
            return render([U0, call, ref]) - render([U0, call])
        return self._renderer.raw_count(REF_RESULT)

    def estimate(self, data: Dict) -> int:
        """Raw tokens of the message's text plus the framing one user message gets."""
        text = "\n".join(text_parts(data.get("content")))
        if data.get("name"):
            text += "\n" + str(data["name"])
        if data.get("tool_calls"):
            text += json.dumps([c["function"] for c in data["tool_calls"]], ensure_ascii=False)
        framing = max(self._u0 - self._renderer.raw_count(U0["content"]), 0)
        return self._renderer.raw_count(text) + framing


class _MemoRenderer:
    """Caches renders while ``build`` tries calibrations (same frames, many times)."""

    def __init__(self, inner: Renderer) -> None:
        self.inner = inner
        self._seen: dict[str, int | TemplateRefusedError] = {}

    def render(self, conversation: Sequence[Dict], tools: Tools | None = None) -> int:
        key = json.dumps([conversation, tools], sort_keys=True, default=str)
        if key not in self._seen:
            try:
                self._seen[key] = self.inner.render(conversation, tools)
            except TemplateRefusedError as exc:
                self._seen[key] = exc
        found = self._seen[key]
        if isinstance(found, TemplateRefusedError):
            raise found
        return found

    def raw_count(self, text: str) -> int:
        return self.inner.raw_count(text)


def build(renderer: Renderer, fingerprint: str) -> TemplateCounter:
    """The counter whose calibration makes the most probes add up; additive if all do."""
    from ctxguard.tokens._probes import failures, run_probes

    memo = _MemoRenderer(renderer)
    best: TemplateCounter | None = None
    refused: TemplateRefusedError | None = None
    for base_mode in BASE_MODES:
        for ref_mode in REF_MODES:
            try:
                candidate = TemplateCounter(memo, fingerprint, base_mode, ref_mode)
            except TemplateRefusedError as exc:
                refused = exc
                continue
            candidate.probe_report = run_probes(candidate)
            if best is None or failures(candidate.probe_report) < failures(best.probe_report):
                best = candidate
            if failures(best.probe_report) == 0:
                return _finish(best, renderer)
    if best is None:  # the template's own words (or the render budget's) in the one line
        why = f": {one_line(str(refused), 200)}" if refused is not None else ""
        raise TokenizerError(
            f"the template refuses even a one-user-message conversation{why}"
        ) from refused
    return _finish(best, renderer)


def _finish(counter: TemplateCounter, renderer: Renderer) -> TemplateCounter:
    from ctxguard.tokens._protocol import fingerprint

    counter._renderer = renderer
    counter.additive = not any(v.startswith("differs") for v in counter.probe_report.values())
    counter.fingerprint = fingerprint(counter.fingerprint, "frames/1", counter.calibration)
    return counter
