"""ctxguard in one screen: a multi-turn chat kept inside a KV-derived limit.

Runs on the in-process store (memory://): no Redis, no model server, no
downloads. It stores a session, lets the window slide as the chat grows past
the limit, folds old turns into a summary, lists the session, reads it back
and shows the audit trail of what was sent on each turn.

    python examples/quickstart.py
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from ctxguard import ExtractiveSummarizer, Guard, ModelLimit

console = Console(width=110)

# The limit comes from the KV cache: Llama-3.1-8B on a 24 GiB GPU, max_model_len
# 8192, 64 requests in flight -> each request's fair share of the cache.
limit = ModelLimit(
    "meta-llama/Llama-3.1-8B-Instruct",
    max_model_len=8192,
    gpu_memory_gib=24,
    concurrency=64,
)
resolved = limit.resolve()
console.print(
    f"[bold]Context limit[/]: {resolved.tokens} tokens per request "
    f"({resolved.source}; {resolved.details['bytes_per_token']:,} KV bytes/token, "
    f"{resolved.details['capacity_tokens']:,} tokens of KV cache)"
)

guard = Guard(
    "memory://",
    counter="approx",  # exact counters: "tiktoken:cl100k_base", "hf:/path/to/tokenizer"
    limit=limit,
    max_tokens=160,  # output reserved on every request
    summarizer=ExtractiveSummarizer(max_chars=400),
    summarize_after=6,
)

SESSION = "user-42:support"
guard.append(SESSION, [{"role": "system", "content": "You are a concise support assistant."}])

questions = [
    "My order 1138 has not arrived. It was due on Monday.",
    "The tracking page says 'label created' and nothing since.",
    "I paid for express shipping, can I get that refunded?",
    "Also, the invoice shows the wrong billing address.",
    "It should be 12 Rue des Lilas, Lyon.",
    "Can you send the corrected invoice to my work email?",
    "Actually, use billing@example.com instead.",
    "How long will the refund take to appear?",
    "And if the parcel arrives after the refund, what do I do?",
    "Thanks. One last thing: can I change the delivery to a pickup point?",
    "The one near Part-Dieu station would be best.",
    "Great, please confirm everything we agreed.",
]


def _ranges(seqs: list[int]) -> str:
    """Message positions as runs: [1, 2, 3, 7] -> '1-3, 7'."""
    runs: list[list[int]] = []
    for seq in seqs:
        if runs and runs[-1][1] == seq - 1:
            runs[-1][1] = seq
        else:
            runs.append([seq, seq])
    return ", ".join(f"{a}-{b}" if a != b else str(a) for a, b in runs)


turns = Table("turn", "sent msgs", "tokens", "limit", "dropped", "summary", title="Requests")
for number, question in enumerate(questions, 1):
    request = guard.prepare(SESSION, [{"role": "user", "content": question}])
    # ... send request.request_kwargs() to your OpenAI-compatible server here ...
    answer = f"(answer {number}) Noted: {question.split('.')[0].lower()}. I have updated the case."
    guard.complete(
        SESSION,
        {"role": "assistant", "content": answer},
        prepared=request,
        usage={"prompt_tokens": request.tokens},
    )
    # request.dropped spans the history left out of the window; the pinned system
    # message inside that span was sent all the same, so it is not listed.
    sent = set(request.sent_seqs)
    left_out = [seq for a, b in request.dropped for seq in range(a, b) if seq not in sent]
    dropped = _ranges(left_out) or "-"
    turns.add_row(
        str(request.turn),
        str(len(request.messages)),
        str(request.tokens),
        f"{request.limit} - {request.reserved_output}",
        dropped,
        f"v{request.summary_version}" if request.summary_version else "-",
    )
console.print(turns)

console.print(f"[bold]Sessions in the store[/]: {list(guard.store.list_sessions())}")
info = guard.store.info(SESSION)
assert info is not None
console.print(
    f"[bold]{SESSION}[/]: {info.message_count} messages, {info.token_total} tokens stored"
)

history = Table("seq", "role", "tokens", title="Stored history (never trimmed)")
history.add_column("content", no_wrap=True, max_width=60, overflow="ellipsis")
for stored in guard.store.read(SESSION):
    history.add_row(
        str(stored.seq), stored.message.role, str(stored.tokens), stored.message.text[:70]
    )
console.print(history)

console.print("[bold]Last request, as sent[/]:")
for message in request.messages:
    console.print(f"  [cyan]{message.role:>9}[/] {message.text[:90]!r}", overflow="ellipsis")

summary = guard.store.get_summary(SESSION)
if summary is not None:
    console.print(f"[bold]Summary v{summary.version}[/] covers messages 0-{summary.covers_to - 1}")

audit = [r for r in guard.store.read_audit(SESSION) if r["kind"] == "request"]
last = audit[-1]
console.print(
    f"[bold]Audit of turn {last['turn']}[/]: {last['tokens']} tokens "
    f"(approximate={not last['exact']}) within {last['limit']} - {last['reserved_output']}; "
    f"decisions: {[d['policy'] for d in last['decisions']]}"
)
