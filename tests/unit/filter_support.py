"""Helpers for the filter tests: run a chain over scripted pieces, read the result."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from streamproxy.filters.base import CONTENT, TOOL_ARGS, TOOL_CALL, Part, Pipeline
from streamproxy.filters.toolset import ToolSet

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
    "required": ["city"],
    "additionalProperties": False,
}
TOOLS = ToolSet({"get_weather": WEATHER, "get_time": None})


def run(make: Callable[[], list], pieces: Sequence[str | bytes], reason: str = "stop") -> tuple[list[Part], str]:
    """Feed every piece through a fresh pipeline, then finish it."""
    pipe = Pipeline(make())
    parts: list[Part] = []
    for piece in pieces:
        parts += pipe.feed(piece)
    tail, final = pipe.finish(reason)
    return parts + tail, final


def outcome(parts: list[Part]) -> tuple[str, list[tuple[str, str]]]:
    """(content text, [(name, arguments)]) a client would reassemble; checks fragment order."""
    text = "".join(p.text for p in parts if p.kind == CONTENT)
    calls: list[list[str]] = []
    for p in parts:
        if p.kind == TOOL_CALL:
            assert p.index == len(calls), (p.index, len(calls))
            assert p.id and p.id.startswith("call_") and len(p.id) == 29, p.id
            assert p.name is not None, p
            calls.append([p.name, ""])
        elif p.kind == TOOL_ARGS:
            assert 0 <= p.index < len(calls), "arguments before their call"
            calls[p.index][1] += p.text
    return text, [(name, args) for name, args in calls]


def every_split(text: str) -> list[list[str]]:
    """The text cut in two at every position (and whole)."""
    return [[text[:i], text[i:]] for i in range(len(text) + 1)]


def bytewise(text: str) -> list[bytes]:
    data = text.encode()
    return [data[i : i + 1] for i in range(len(data))]
