"""Find where a JSON value ends, fed in pieces; and the raw text of an object's members.

`ValueScan` tracks nesting and string/escape state only, so text arriving a few characters at a time
can be split at the end of one JSON value; it jumps between the characters that matter with one regex
search. `members(text)` splits a complete object into `{key: raw value text}`, so arguments go on
exactly as the model wrote them.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

_STRUCTURAL = re.compile(r'["{}\[\]]')
_IN_STRING = re.compile(r'["\\]')
# A scalar (number, true, false, null) ends at the first character that cannot continue it.
_SCALAR_END = re.compile(r"[\s,:\]}\[{\"]")
WHITESPACE = " \t\r\n"


class ValueScan:
    """Consume one JSON value from pieces of text; `done` once it is complete."""

    __slots__ = ("depth", "in_string", "escape", "scalar", "started", "done")

    def __init__(self) -> None:
        self.depth = 0
        self.in_string = False
        self.escape = False
        self.scalar = False
        self.started = False
        self.done = False

    def feed(self, text: str) -> int:
        """Consume from `text` (which must not start with whitespace before the
        value begins); return how many characters belong to the value: all of
        them while it goes on, fewer when it ends inside `text`."""
        i, n = 0, len(text)
        if not self.started:
            if not n:
                return 0
            self.started = True
            first = text[0]
            if first in "{[":
                self.depth = 1
            elif first == '"':
                self.in_string = True
            else:
                self.scalar = True
            i = 1
        while i < n:
            if self.scalar:
                m = _SCALAR_END.search(text, i)
                if m is None:
                    return n
                self.done = True
                return m.start()
            if self.in_string:
                if self.escape:
                    self.escape = False
                    i += 1
                    continue
                m = _IN_STRING.search(text, i)
                if m is None:
                    return n
                i = m.end()
                if m.group() == "\\":
                    self.escape = True
                    continue
                self.in_string = False
                if self.depth == 0:
                    self.done = True
                    return i
                continue
            m = _STRUCTURAL.search(text, i)
            if m is None:
                return n
            i = m.end()
            ch = m.group()
            if ch == '"':
                self.in_string = True
            elif ch in "{[":
                self.depth += 1
            else:
                self.depth -= 1
                if self.depth == 0:
                    self.done = True
                    return i
        return n

    def end_of_input(self) -> bool:
        """At the end of all text: a bare scalar is complete then."""
        if self.scalar and not self.done:
            self.done = True
        return self.done


def value_end(text: str, start: int = 0) -> int:
    """Index just past the JSON value starting at `text[start]`, or -1 if it does not end."""
    scan = ValueScan()
    used = scan.feed(text[start:])
    if not scan.done and not scan.end_of_input():
        return -1
    return start + used


def skip_ws(text: str, i: int) -> int:
    n = len(text)
    while i < n and text[i] in WHITESPACE:
        i += 1
    return i


def members(text: str) -> dict[str, str] | None:
    """The raw text of each member value of the JSON object `text`, or None if it is not one."""
    text = text.strip()
    if not text.startswith("{"):
        return None
    out: dict[str, str] = {}
    i = skip_ws(text, 1)
    if i < len(text) and text[i] == "}":
        return out if skip_ws(text, i + 1) == len(text) else None
    while i < len(text):
        if text[i] != '"':
            return None
        end = value_end(text, i)
        if end < 0:
            return None
        try:
            key = orjson.loads(text[i:end])
        except orjson.JSONDecodeError:
            return None
        i = skip_ws(text, end)
        if i >= len(text) or text[i] != ":":
            return None
        i = skip_ws(text, i + 1)
        end = value_end(text, i)
        if end < 0:
            return None
        out[key] = text[i:end]
        i = skip_ws(text, end)
        if i < len(text) and text[i] == ",":
            i = skip_ws(text, i + 1)
            continue
        if i < len(text) and text[i] == "}" and skip_ws(text, i + 1) == len(text):
            return out
        return None
    return None


def loads(text: str) -> Any:
    """Strict JSON (no NaN/Infinity, which Python's json accepts); raises ValueError."""
    return orjson.loads(text)
