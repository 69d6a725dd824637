"""What every auto-mode tool-call parser shares: blocks, validation, whitespace.

A parser subclasses `ToolCallParser` and implements `_scan(out, final)` over `self.buf`, reporting
`self.text(out, s)` (content) and `self.block(out, raw, calls)` (a complete block, `calls=None` when it
did not parse), keeping the rest in `self.buf`. The block is the unit of trust: its calls are sent,
whole, only if every one fits a tool's schema (`ToolSet.check`), else its raw text is content. The
finish reason becomes "tool_calls" when the engine stopped and a call was sent ("length" stays).
Whitespace that only separates content from a tool call is dropped; other whitespace is kept exactly.
"""

from __future__ import annotations

from collections.abc import Sequence

from streamproxy.filters.base import ContentFilter, Part, content, tool_args, tool_call
from streamproxy.filters.jsonscan import loads, members
from streamproxy.filters.toolset import ToolSet

WS = " \t\r\n"


def tag_overlap(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag`."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


def json_call(raw: str, args_keys: Sequence[str] = ("arguments", "parameters")) -> tuple[str, str] | None:
    """{"name": ..., "arguments": {...}} -> (name, raw arguments text), or None."""
    found = members(raw)
    if found is None or "name" not in found:
        return None
    try:
        name = loads(found["name"])
    except ValueError:
        return None
    if not isinstance(name, str):
        return None
    args = "{}"
    for key in args_keys:
        if key in found:
            args = found[key]
            break
    if args.startswith('"'):
        # Arguments sent as a JSON-encoded string: hand on the string's content.
        try:
            args = loads(args)
        except ValueError:
            return None
    return name, args.strip()


class ToolCallParser(ContentFilter):
    """Base of the auto-mode parsers; see the module docstring."""

    # The parser needs special tokens (e.g. [TOOL_CALLS]) kept in the text.
    keep_special_tokens = False

    def __init__(self, tools: ToolSet, *, parallel: bool = True) -> None:
        self.tools = tools
        self.parallel = parallel
        self.buf = ""
        self.calls = 0
        self._ws = ""  # trailing whitespace of content, held until we know what follows
        self._after_call = False  # whitespace right after a sent call is dropped too

    # -- the Filter protocol ------------------------------------------
    def content(self, part: Part, out: list[Part]) -> None:
        self.buf += part.text
        self._scan(out, False)

    def flush(self) -> list[Part]:
        out: list[Part] = []
        self._scan(out, True)
        if self.buf:
            self.text(out, self.buf)
            self.buf = ""
        if self._ws and not self.calls:
            out.append(content(self._ws))
        self._ws = ""
        return out

    def finish_reason(self, reason: str) -> str:
        return "tool_calls" if self.calls and reason == "stop" else reason

    # -- for subclasses -------------------------------------------------
    def _scan(self, out: list[Part], final: bool) -> None:
        raise NotImplementedError

    def text(self, out: list[Part], s: str) -> None:
        if self._after_call:
            s = s.lstrip(WS)
            if not s:
                return
            self._after_call = False
        if not s:
            return
        body = s.rstrip(WS)
        if not body:
            self._ws += s
            return
        out.append(content(self._ws + body))
        self._ws = s[len(body) :]

    def block(self, out: list[Part], raw: str, calls: list[tuple[str, str]] | None) -> None:
        tools = self.tools
        if not calls or not all(tools.check(name, args) for name, args in calls):
            self.text(out, raw)
            return
        self._ws = ""
        self._after_call = True
        for name, args in calls:
            if self.calls and not self.parallel:
                break  # parallel_tool_calls=false: at most one call
            index = self.calls
            self.calls += 1
            out.extend(tool_call(index, name))
            out.append(tool_args(index, args))
