"""Llama 3.x JSON tool calls: `{"name": ..., "parameters": {...}}`, `;`-separated.

As in vLLM, an answer is a tool call only when it starts with one: after
optional whitespace and `<|python_tag|>`, the first character is `{`.
Otherwise the whole answer is content, streamed as it comes. In call mode
each JSON object is one block (found by `ValueScan`, so braces inside
strings do not confuse it), checked and sent as soon as it closes; `;` and
whitespace between objects are separators. Anything else after a call
ends call mode: the rest is content.
"""

from __future__ import annotations

from typing import Any

from streamproxy.filters.base import Part
from streamproxy.filters.jsonscan import ValueScan
from streamproxy.filters.toolparse import WS, ToolCallParser, json_call

BOT = "<|python_tag|>"

_START, _CALLS, _VALUE, _TEXT = range(4)


class Llama3JsonParser(ToolCallParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.state = _START
        self.lead = ""  # whitespace before the first decision
        self.scan = ValueScan()
        self.raw = ""

    def _scan(self, out: list[Part], final: bool) -> None:
        while True:
            buf = self.buf
            state = self.state
            if state == _TEXT:
                self.text(out, buf)
                self.buf = ""
                return
            if state == _START:
                stripped = buf.lstrip(WS)
                self.lead += buf[: len(buf) - len(stripped)]
                self.buf = buf = stripped
                if not buf:
                    if final:
                        self.text(out, self.lead)
                    return
                if buf.startswith(BOT):
                    self.buf = buf[len(BOT) :]
                    self.state = _CALLS
                elif BOT.startswith(buf) and not final:
                    return
                elif buf[0] == "{":
                    self.state = _CALLS
                else:
                    self.buf = self.lead + buf
                    self.state = _TEXT
                continue
            if state == _CALLS:
                stripped = buf.lstrip(WS + ";")
                self.buf = buf = stripped
                if not buf:
                    return
                if buf[0] == "{":
                    self.state = _VALUE
                    self.scan = ValueScan()
                    self.raw = ""
                else:
                    self.state = _TEXT
                continue
            # _VALUE
            used = self.scan.feed(buf)
            self.raw += buf[:used]
            self.buf = buf[used:]
            if self.scan.done:
                call = json_call(self.raw)
                self.block(out, self.raw, None if call is None else [call])
                self.state = _CALLS
                continue
            if final:
                self.block(out, self.raw, None)
                self.buf = ""
                self.state = _TEXT
            return
