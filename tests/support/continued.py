"""Scripted answers whose streams a parser shapes, for the continuation tests (serve's and the gateway's).

`TOOL`: some content, then two hermes tool calls, three characters a token (the parser holds text
back, starts each call, streams its arguments); `REASONING`: deepseek_r1 thinking, then an answer with
a character split over two tokens. Each names the serve settings that parse it and a request.
"""

from __future__ import annotations

import re
from typing import Any

from engine_adapter.fake import FakeScript

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}
TOOLS: list[Any] = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]
_CALLS = ('Let me check. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
          '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome", "days": 2}}\n</tool_call>')
TOOL_TOKENS: list[str | bytes] = [_CALLS[i : i + 3] for i in range(0, len(_CALLS), 3)]
REASONING_TOKENS: list[str | bytes] = ["<think>", "Paris", " is", " in", " Fr", "ance", "</think>", "It", " is", b" caf\xc3", b"\xa9", " weather", "."]

CASES: dict[str, tuple[list[str | bytes], dict[str, Any], dict[str, Any]]] = {
    # name: (the script's tokens, serve's settings, the request's own fields)
    "tool-calls": (TOOL_TOKENS, {"enable_auto_tool_choice": True, "tool_call_parser": "hermes"}, {"tools": TOOLS}),
    "reasoning": (REASONING_TOKENS, {"reasoning_parser": "deepseek_r1"}, {}),
}
_CALL_ID = re.compile(rb'"id":"call_[0-9a-f]+"')


def script(name: str) -> FakeScript:
    return FakeScript(tokens=CASES[name][0])


def same_calls(raw: bytes) -> bytes:
    """Tool-call ids are random per answer: made equal (what the test compares is everything else)."""
    return _CALL_ID.sub(b'"id":"call_x"', raw)
