"""Hermes / Qwen tool calls: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.

Text outside the tags is content, streamed except for a tail that could start `<tool_call>`. Inside,
`ValueScan` delimits the object (a `</tool_call>` or brace in a string does not end it); the block ends
at the `</tool_call>` after it, then `json_call` parses and `toolparse` checks. Several blocks are
parallel calls; an unclosed block with complete JSON still counts; a body that is not an object runs to
the next `</tool_call>`.
"""

from __future__ import annotations

from typing import Any

from streamproxy.filters.base import Part
from streamproxy.filters.jsonscan import WHITESPACE, ValueScan
from streamproxy.filters.toolparse import ToolCallParser, json_call, tag_overlap

START = "<tool_call>"
END = "</tool_call>"


class HermesParser(ToolCallParser):
    keep_special_tokens = True  # <tool_call> is a special token in some Hermes models

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.inside = False
        self.body = ""  # the block's text after <tool_call>, consumed so far
        self.scan: ValueScan | None = None  # None: not JSON (yet); look for END plainly

    def _scan(self, out: list[Part], final: bool) -> None:
        while self.buf or (final and self.inside):
            if not self.inside:
                buf = self.buf
                at = buf.find(START)
                if at < 0:
                    keep = 0 if final else tag_overlap(buf, START)
                    self.text(out, buf[: len(buf) - keep])
                    self.buf = buf[len(buf) - keep :]
                    return
                self.text(out, buf[:at])
                self.buf = buf[at + len(START) :]
                self.inside, self.body, self.scan = True, "", ValueScan()
                continue
            if not self._inside(out, final):
                return

    def _take(self, n: int) -> None:
        self.body += self.buf[:n]
        self.buf = self.buf[n:]

    def _end_block(self, out: list[Part], closed: bool, json_end: int | None) -> None:
        raw = START + self.body + (END if closed else "")
        body = self.body if json_end is None else self.body[:json_end]
        call = json_call(body.strip()) if json_end is not None or closed else None
        self.inside, self.body, self.scan = False, "", None
        self.block(out, raw, None if call is None else [call])

    def _inside(self, out: list[Part], final: bool) -> bool:
        """Advance inside a block; False when more text is needed."""
        scan = self.scan
        if scan is not None and not scan.done:
            if not scan.started:
                self._take(len(self.buf) - len(self.buf.lstrip(WHITESPACE)))
                if not self.buf:
                    if final:
                        self._end_block(out, False, None)
                    return final
                if self.buf[0] != "{":
                    self.scan = None
                    return True
            used = scan.feed(self.buf)
            self._take(used)
            if not scan.done:
                if final:
                    self._end_block(out, False, None)
                return final
        if scan is not None:  # the JSON is complete: expect </tool_call>
            json_end = len(self.body)
            rest = self.buf.lstrip(WHITESPACE)
            if rest.startswith(END):
                self._take(len(self.buf) - len(rest))
                self.buf = self.buf[len(END) :]
                self._end_block(out, True, json_end)
                return True
            if not rest and final:
                self._end_block(out, False, json_end)  # unclosed but complete
                return True
            if (not rest or END.startswith(rest)) and not final:
                return False
            self.scan = None  # something else follows the JSON: fall back to the plain search
        at = self.buf.find(END)
        if at >= 0:
            self._take(at)
            self.buf = self.buf[len(END) :]
            self._end_block(out, True, None)
            return True
        if final:
            self._take(len(self.buf))
            self._end_block(out, False, None)
            return True
        return False
