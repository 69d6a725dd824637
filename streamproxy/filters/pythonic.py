"""Pythonic tool calls (Llama 3.2, ToolACE): `[get_weather(city="Paris"), f(x=1)]`.

As in vLLM, an answer is a tool-call list only when it starts with `[`
(after whitespace); otherwise it is all content. The list is delimited by a
small incremental scanner of Python brackets and string literals (quotes
and escapes, so `"]"` inside a string does not end it), and parsed with
`ast` once it closes: every element must be a call with keyword arguments
whose values are literals (`null`/`true`/`false` are read as JSON's). The
whole list is one block; arguments are re-serialised as JSON. Text after
the closing `]` is content.
"""

from __future__ import annotations

import ast
import json
from typing import Any

from streamproxy.filters.base import Part
from streamproxy.filters.toolparse import WS, ToolCallParser

_START, _LIST, _TEXT = range(3)
_NAMES = {"null": None, "true": True, "false": False, "None": None, "True": True, "False": False}


class PythonicParser(ToolCallParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.state = _START
        self.lead = ""
        self.raw = ""
        self.depth = 0
        self.quote = ""  # the open string's quote character, "" outside strings
        self.escape = False

    def _scan(self, out: list[Part], final: bool) -> None:
        if self.state == _START:
            stripped = self.buf.lstrip(WS)
            self.lead += self.buf[: len(self.buf) - len(stripped)]
            self.buf = stripped
            if not stripped:
                if final:
                    self.text(out, self.lead)
                return
            if stripped[0] == "[":
                self.state = _LIST
            else:
                self.buf = self.lead + stripped
                self.state = _TEXT
        if self.state == _LIST:
            end = self._delimit(self.buf)
            if end < 0:
                self.raw += self.buf
                self.buf = ""
                if final:
                    self.block(out, self.lead + self.raw, None)
                    self.state = _TEXT
                return
            self.raw += self.buf[:end]
            self.buf = self.buf[end:]
            self.state = _TEXT
            self.block(out, self.lead + self.raw, parse_calls(self.raw))
        if self.state == _TEXT:
            self.text(out, self.buf)
            self.buf = ""

    def _delimit(self, text: str) -> int:
        """Index just past the list's closing bracket in `text`, or -1."""
        for i, ch in enumerate(text):
            if self.quote:
                if self.escape:
                    self.escape = False
                elif ch == "\\":
                    self.escape = True
                elif ch == self.quote:
                    self.quote = ""
            elif ch in "\"'":
                self.quote = ch
            elif ch in "([{":
                self.depth += 1
            elif ch in ")]}":
                self.depth -= 1
                if self.depth == 0:
                    return i + 1
        return -1


def _value(node: ast.expr) -> Any:
    if isinstance(node, ast.Name) and node.id in _NAMES:
        return _NAMES[node.id]
    if isinstance(node, ast.Dict):
        out = {}
        for k, v in zip(node.keys, node.values):
            if k is None:  # `**spread`: not a literal (literal_eval refuses it with ValueError too)
                raise ValueError("malformed node or string: ** in a dict")
            out[_value(k)] = _value(v)
        return out
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_value(e) for e in node.elts]
    return ast.literal_eval(node)


def _name(func: ast.expr) -> str:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return _name(func.value) + "." + func.attr
    raise ValueError("not a function name")


def parse_calls(text: str) -> list[tuple[str, str]] | None:
    try:
        tree = ast.parse(text.strip(), mode="eval").body
        if not isinstance(tree, ast.List) or not tree.elts:
            return None
        calls = []
        for call in tree.elts:
            if not isinstance(call, ast.Call) or call.args:
                return None
            kwargs = {kw.arg: _value(kw.value) for kw in call.keywords if kw.arg is not None}
            if len(kwargs) != len(call.keywords):
                return None
            calls.append((_name(call.func), json.dumps(kwargs, ensure_ascii=False)))
        return calls
    except (SyntaxError, ValueError, TypeError, RecursionError):
        return None
