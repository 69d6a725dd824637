"""Mistral tool calls after the `[TOOL_CALLS]` marker, in both of its formats.

    [TOOL_CALLS][{"name": "f", "arguments": {...}}, ...]     (tokenizers before v11)
    [TOOL_CALLS]f[ARGS]{...}[TOOL_CALLS]g[ARGS]{...}         (v11 and later;
                                                              `[CALL_ID]id` may sit before [ARGS])

Text before the marker is content (a tail that could start the marker is
held). After it, the JSON (the array, or one call's arguments) is delimited
by `ValueScan`; the block is then checked and sent (see `toolparse`), and
parsing goes back to looking for the next marker. The markers are special
tokens, so the request keeps special tokens in the text.
"""

from __future__ import annotations

from typing import Any

from streamproxy.filters.base import Part
from streamproxy.filters.jsonscan import ValueScan, loads, skip_ws, value_end
from streamproxy.filters.toolparse import WS, ToolCallParser, json_call, tag_overlap

BOT = "[TOOL_CALLS]"
ARGS = "[ARGS]"
CALL_ID = "[CALL_ID]"

_TEXT, _AFTER_BOT, _NAME, _CALL_ID, _ARGS, _VALUE = range(6)


class MistralParser(ToolCallParser):
    keep_special_tokens = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.state = _TEXT
        self.raw = ""  # the block's text so far, returned as content if it fails
        self.name = ""
        self.array = False
        self.scan = ValueScan()
        self.value = ""  # the JSON value being delimited

    def _consume(self, n: int) -> None:
        self.raw += self.buf[:n]
        self.buf = self.buf[n:]

    def _scan(self, out: list[Part], final: bool) -> None:
        while True:
            buf = self.buf
            state = self.state
            if state == _TEXT:
                at = buf.find(BOT)
                if at < 0:
                    keep = 0 if final else tag_overlap(buf, BOT)
                    self.text(out, buf[: len(buf) - keep])
                    self.buf = buf[len(buf) - keep :]
                    return
                self.text(out, buf[:at])
                self.buf = buf[at:]
                self.raw = ""
                self._consume(len(BOT))
                self.state = _AFTER_BOT
                continue
            if state in (_AFTER_BOT, _ARGS):
                self._consume(len(buf) - len(buf.lstrip(WS)))
                if not self.buf:
                    break
                self.array = state == _AFTER_BOT and self.buf[0] == "["
                if state == _ARGS or self.array:
                    self.scan = ValueScan()
                    self.value = ""
                    self.state = _VALUE
                else:
                    self.state = _NAME
                continue
            if state == _NAME:
                ends = [(at, tag) for tag in (ARGS, CALL_ID, "{") if (at := buf.find(tag)) >= 0]
                if not ends:
                    break
                at, tag = min(ends)
                self.name = buf[:at].strip()
                self._consume(at if tag == "{" else at + len(tag))
                self.state = _CALL_ID if tag == CALL_ID else _ARGS
                continue
            if state == _CALL_ID:
                at = buf.find(ARGS)
                if at < 0:
                    break
                self._consume(at + len(ARGS))
                self.state = _ARGS
                continue
            # _VALUE
            used = self.scan.feed(buf)
            self.value += buf[:used]
            self._consume(used)
            if not self.scan.done:
                break
            self.block(out, self.raw, self._calls(self.value))
            self.state = _TEXT
        if final and self.state != _TEXT:
            self.block(out, self.raw + self.buf, None)
            self.buf = ""
            self.state = _TEXT

    def _calls(self, value: str) -> list[tuple[str, str]] | None:
        if not self.array:
            return [(self.name, value.strip())] if self.name else None
        try:
            items = loads(value)
        except ValueError:
            return None
        if not isinstance(items, list) or not items:
            return None
        # Re-find each element's raw text to keep the arguments as written.
        calls: list[tuple[str, str]] = []
        i = skip_ws(value, 1)
        while i < len(value) and value[i] == "{":
            end = value_end(value, i)
            call = json_call(value[i:end])
            if call is None:
                return None
            calls.append(call)
            i = skip_ws(value, end)
            if i < len(value) and value[i] == ",":
                i = skip_ws(value, i + 1)
        return calls if len(calls) == len(items) else None
