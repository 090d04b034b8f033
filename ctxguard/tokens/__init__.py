"""Token counters: what a chat request really costs on the server.

One contract, :class:`TokenCounter`, and one door, :func:`load_counter`::

    load_counter("tiktoken:cl100k_base")    OpenAI cookbook rule over tiktoken (openai_rule.py)
    load_counter("hf:/path/to/tokenizer")   the model's chat template via transformers (hf.py)
    load_counter("mistral:v3-tekken")       mistral_common's prompt builder (mistral.py)
    load_counter("vllm:http://host:8000")   the serving vLLM's own /tokenize (vllm.py)
    load_counter("approx")                  dependency-free estimate, exact=False (approx.py)

Template-based counters (``hf:``, ``mistral:``) always count a request by rendering it
(``count_request``); per-message counts come from fixed frames (``_templated.py``) and
the counter is ``additive`` only if every build-time probe (``_probes.py``) agrees.

Which path each family takes, as the probes found it (transformers 5.24, mistral_common
1.13.1; ``probe_report`` on the counter lists every probe's outcome):

==================  ========  ===========================================================
family              path      probes that disagree (why)
==================  ========  ===========================================================
OpenAI cl100k/o200k additive  none: the cookbook rule is a sum by construction
approx              additive  none: a sum by construction
Mistral v7          additive  none (system prompts stay in place; refused probes skipped)
Mistral v3 tekken   render    consecutive_users (merged into one [INST] with "\n\n")
Mistral v1/v3 SP    render    two_systems (joined into one user turn, SentencePiece "▁")
Qwen2.5-Instruct    render    two_systems*, system_after_turns (default system text only
                              disappears when a system message comes first)
Qwen3               render    reasoning_before_tool_result (<think> kept after the last
                              query), tools_system_user / tools_tool_round (the first
                              system message is folded into the tools block)
DeepSeek-V3         render    two_systems_no_punctuation (systems joined with "\n\n" at
                              the start); tool calls are not rendered at all when content
                              is "" (transformers 5 drops content=None)
DeepSeek-R1         render    tool_round_then_user, two_tool_rounds (tool-output markers
                              and generation prompt depend on the neighbours),
                              consecutive_users, two_systems_no_punctuation
GLM-4.7-Flash       render    reasoning_before_tool_result (reasoning dropped in history)
==================  ========  ===========================================================

"render" means: per-message counts are close estimates used to pre-select a window;
the guard must call ``count_request`` on the candidate window. On the additive path the
guard never renders, so it calls ``validate`` (``_protocol.validate_request``) on the
window it sends: every counter refuses there exactly what ``count_request`` refuses
(mistral_common's checks without encoding text; the Jinja template without tokenizing;
a vLLM server's /tokenize; nothing for the tiktoken rule and ``approx``).

Prefix stability (:func:`prefix_probes`): whether a template renders earlier turns
the same once later turns follow, so the server's prefix cache can reuse them. Qwen3
breaks it by itself when a reply carried a ``<think>`` block (dropped from earlier
turns), so each such reply and everything after it is prefilled again.

Importing this package imports no tokenizer library; each loader imports its own.
"""

from ctxguard.tokens._protocol import TokenCounter, Tools
from ctxguard.tokens.loader import SPEC_FORMS, load_counter
from ctxguard.tokens.prompt_ids import prefix_probes, prompt_ids

__all__ = ["SPEC_FORMS", "TokenCounter", "Tools", "load_counter", "prefix_probes", "prompt_ids"]
