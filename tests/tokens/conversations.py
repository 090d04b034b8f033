"""Test conversations: OpenAI dicts, with optional tool schemas.

Tool-call ids are nine alphanumerics because Mistral's v3+ validator demands that shape.
"""

from __future__ import annotations

from typing import Any

Dict = dict[str, Any]

WEATHER: Dict = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
            "required": ["city"],
        },
    },
}
SEARCH: Dict = {
    "type": "function",
    "function": {
        "name": "search_docs",
        "description": "Full-text search over the manual. Returns the top hits.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
            "required": ["query"],
        },
    },
}
CODE = '''def fib(n: int) -> int:
    """Return the n-th Fibonacci number."""
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


print({"x": [1, 2, 3]}, f"{fib(10):>8}")
'''
LONG = " ".join(
    f"Paragraph {i}: the quick brown fox jumps over the lazy dog, while 17 otters count "
    f"to {i * 37} in Ünïcödé and 中文 and emoji 🦊."
    for i in range(400)
)


def sys_(text: str) -> Dict:
    return {"role": "system", "content": text}


def usr(text: str, **kw: Any) -> Dict:
    return {"role": "user", "content": text, **kw}


def asst(text: str | None, **kw: Any) -> Dict:
    return {"role": "assistant", "content": text, **kw}


def call(call_id: str, name: str, arguments: str) -> Dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def result(call_id: str, text: str) -> Dict:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


W1 = call("abc123def", "get_weather", '{"city": "Paris"}')
W2 = call("xyz789ghi", "get_weather", '{"city": "東京", "unit": "celsius"}')
S1 = call("srch00001", "search_docs", '{"query": "retry policy", "limit": 3}')

CONVERSATIONS: dict[str, tuple[list[Dict], list[Dict] | None]] = {
    "en_single": ([usr("What is the capital of France?")], None),
    "en_two_turns": (
        [usr("Hi!"), asst("Hello! How can I help?"), usr("Tell me a joke.")],
        None,
    ),
    "en_system": ([sys_("You are a helpful assistant."), usr("Summarise Hamlet.")], None),
    "en_long_dialogue": (
        [sys_("Be concise.")]
        + [m for i in range(6) for m in (usr(f"Question {i}?"), asst(f"Answer {i}."))]
        + [usr("Last question?")],
        None,
    ),
    "zh_single": ([usr("请用三句话介绍一下长城的历史。")], None),
    "zh_dialogue": (
        [
            sys_("你是一个乐于助人的助手。"),
            usr("北京今天天气怎么样？"),
            asst("我无法实时查询。"),
            usr("那明天呢？"),
        ],
        None,
    ),
    "ja_single": ([usr("東京でおすすめのラーメン屋を教えてください。")], None),
    "ja_dialogue": (
        [
            usr("こんにちは"),
            asst("こんにちは！ご用件は何でしょうか？"),
            usr("カタカナとひらがなの違いは？"),
        ],
        None,
    ),
    "emoji_only": ([usr("🦊🐻‍❄️👩🏽‍💻🇫🇷✨")], None),
    "emoji_mixed": ([usr("Rate this 🍕 from 1-10 👉"), asst("9/10 🔥"), usr("why? 🤔")], None),
    "code_user": ([usr("Review this code:\n```python\n" + CODE + "```")], None),
    "code_answer": (
        [usr("Write fib in Python"), asst("```python\n" + CODE + "```"), usr("Thanks")],
        None,
    ),
    "very_long": ([sys_("Summarise."), usr(LONG)], None),
    "very_long_answer": ([usr("Repeat after me."), asst(LONG), usr("Again?")], None),
    "empty_user": ([usr("")], None),
    "empty_system": ([sys_(""), usr("Hi")], None),
    "empty_assistant": ([usr("Say nothing."), asst(""), usr("Now say hi.")], None),
    "whitespace_content": ([usr("   \n\n  padded  \n")], None),
    "special_token_text": ([usr("What does <|im_end|> or </s> or [INST] mean?")], None),
    "named_user": ([usr("Hi, I'm Ann.", name="ann")], None),
    "named_dialogue": (
        [sys_("Group chat."), usr("Hi all", name="bob"), asst("Hi Bob"), usr("Hey", name="eve")],
        None,
    ),
    "two_systems": ([sys_("Be brief"), sys_("Use English"), usr("Explain DNS")], None),
    "consecutive_users": ([usr("First thing."), usr("Second thing.")], None),
    "system_mid": ([usr("Hi"), asst("Hello"), sys_("Switch to French"), usr("Bonjour?")], None),
    "text_parts": (
        [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Part one."},
                    {"type": "text", "text": "Part two."},
                ],
            }
        ],
        None,
    ),
    "reasoning_history": (
        [usr("2+2?"), asst("<think>\nSimple sum.\n</think>\n\n4"), usr("And 3+3?")],
        None,
    ),
    "tool_round": (
        [usr("Weather in Paris?"), asst(None, tool_calls=[W1]), result("abc123def", "18C, sunny")],
        None,
    ),
    "tool_round_with_schema": (
        [usr("Weather in Paris?"), asst(None, tool_calls=[W1]), result("abc123def", "18C, sunny")],
        [WEATHER],
    ),
    "tool_round_answered": (
        [
            usr("Weather in Paris?"),
            asst(None, tool_calls=[W1]),
            result("abc123def", '{"temp": 18, "sky": "sunny"}'),
            asst("It is 18C and sunny in Paris."),
            usr("Thanks!"),
        ],
        [WEATHER],
    ),
    "parallel_tools": (
        [
            usr("Weather in Paris and Tokyo?"),
            asst(None, tool_calls=[W1, W2]),
            result("abc123def", "18C"),
            result("xyz789ghi", "22C"),
        ],
        [WEATHER],
    ),
    "parallel_tools_no_schema": (
        [
            usr("Weather in Paris and Tokyo?"),
            asst(None, tool_calls=[W1, W2]),
            result("abc123def", "18C"),
            result("xyz789ghi", "22C"),
            asst("Paris 18C, Tokyo 22C."),
        ],
        None,
    ),
    "tool_with_system": (
        [
            sys_("You can call tools."),
            usr("Find the retry policy."),
            asst(None, tool_calls=[S1]),
            result("srch00001", "Retries back off exponentially up to 5 times."),
        ],
        [WEATHER, SEARCH],
    ),
    "tool_call_with_text": (
        [usr("Weather?"), asst("Let me check.", tool_calls=[W1]), result("abc123def", "18C")],
        [WEATHER],
    ),
    "two_tool_rounds": (
        [
            usr("Paris?"),
            asst(None, tool_calls=[W1]),
            result("abc123def", "18C"),
            asst("18C."),
            usr("Tokyo?"),
            asst(None, tool_calls=[W2]),
            result("xyz789ghi", "22C"),
        ],
        [WEATHER],
    ),
    "tool_result_json_zh": (
        [
            usr("天气？"),
            asst(None, tool_calls=[W2]),
            result("xyz789ghi", '{"温度": 22, "天空": "晴"}'),
        ],
        [WEATHER],
    ),
    "schema_only_single": ([usr("Hello")], [WEATHER]),
    "schema_two_tools_system": ([sys_("Use tools wisely."), usr("Hello")], [WEATHER, SEARCH]),
    "schema_dialogue": ([usr("Hi"), asst("Hello!"), usr("What can you do?")], [SEARCH]),
    "mixed_scripts": ([usr("English, 中文, 日本語, 한국어, العربية, русский, हिन्दी, ไทย")], None),
    "numbers_and_math": (
        [usr("Compute 12345678901234567890 * 98765 = ? and ∑_{i=1}^{n} i²")],
        None,
    ),
    "markdown_table": ([usr("| a | b |\n|---|---|\n| 1 | 2 |\n\n* item\n* item 2")], None),
    "long_system": ([sys_(LONG[:3000]), usr("Go.")], None),
    "unicode_combining": ([usr("naïve café — e\u0301 a\u0300 ✋🏿 ❤️‍🔥")], None),
    "ends_with_assistant": ([usr("Start a story:"), asst("Once upon a time")], None),
}
