"""Tool calls forced by constrained decoding: tool_choice "required" or a named function.

The engine's structured outputs make the model write known JSON: the arguments object itself (named),
or `[{"name": ..., "parameters": {...}}, ...]` (required). Nothing is held back: `NamedToolEmitter`
opens the call at the first character and streams the value; `RequiredToolEmitter` walks the array with
a small state machine (and `ValueScan`), opening a call once its name is complete and streaming the raw
"parameters" text. Text that leaves the shape is content from there on. Finish: "tool_calls" for
required, "stop" kept for named, "length" always kept.
"""

from __future__ import annotations

from streamproxy.filters.base import ContentFilter, Part, content, tool_args, tool_call
from streamproxy.filters.jsonscan import WHITESPACE, ValueScan, loads


class _Emitter(ContentFilter):
    def __init__(self) -> None:
        self.buf = ""
        self.calls = 0
        self.broken = False

    def content(self, part: Part, out: list[Part]) -> None:
        if self.broken:
            out.append(content(part.text))
            return
        self.buf += part.text
        self._scan(out)

    def flush(self) -> list[Part]:
        out: list[Part] = []
        self._end(out)
        rest = self.buf
        self.buf = ""
        if rest.strip(WHITESPACE) and not self.broken:
            out.append(content(rest))
        return out

    def _scan(self, out: list[Part]) -> None:
        raise NotImplementedError

    def _end(self, out: list[Part]) -> None:
        pass

    def _break(self, out: list[Part]) -> None:
        """The text left the expected shape: the rest is content."""
        self.broken = True
        if self.buf:
            out.append(content(self.buf))
        self.buf = ""


class NamedToolEmitter(_Emitter):
    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name
        self.scan: ValueScan | None = None

    def _scan(self, out: list[Part]) -> None:
        buf = self.buf
        if self.scan is None:
            buf = buf.lstrip(WHITESPACE)
            if not buf:
                self.buf = ""
                return
            self.scan = ValueScan()
            out.extend(tool_call(0, self.name))
            self.calls = 1
        if self.scan.done:
            self.buf = buf
            if buf.strip(WHITESPACE):
                self._break(out)
            return
        used = self.scan.feed(buf)
        if used:
            out.append(tool_args(0, buf[:used]))
        self.buf = buf[used:]
        if self.scan.done and self.buf.strip(WHITESPACE):
            self._break(out)

    def finish_reason(self, reason: str) -> str:
        return reason


_ARRAY, _ELEMENT, _KEY, _COLON, _VALUE, _AFTER_VALUE, _AFTER_ELEMENT, _DONE = range(8)


class RequiredToolEmitter(_Emitter):
    def __init__(self) -> None:
        super().__init__()
        self.state = _ARRAY
        self.scan = ValueScan()
        self.key = ""
        self.value = ""  # a member value being read ("name", or "parameters" before the name)
        self.name: str | None = None
        self.args_sent = False
        self.early_args = ""

    def _scan(self, out: list[Part]) -> None:
        while self.buf and not self.broken:
            state = self.state
            if state == _VALUE:
                self._member_value(out)
                continue
            if state == _KEY and self.value:
                self._key(out)
                continue
            self.buf = buf = self.buf.lstrip(WHITESPACE)
            if not buf:
                return
            ch = buf[0]
            if state == _ARRAY and ch == "[":
                self.state = _ELEMENT
            elif state == _ELEMENT and ch == "{":
                self.state = _KEY
                self.name, self.args_sent, self.early_args = None, False, ""
            elif state == _KEY and ch == '"':
                self.scan = ValueScan()
                self._key(out)
                continue
            elif state == _COLON and ch == ":":
                self.state, self.scan, self.value = _VALUE, ValueScan(), ""
            elif state == _AFTER_VALUE and ch == ",":
                self.state = _KEY
            elif state in (_KEY, _AFTER_VALUE) and ch == "}":
                if not self._close_element():
                    return self._break(out)
                if not self.args_sent:
                    out.append(tool_args(self.calls - 1, "{}"))
                self.state = _AFTER_ELEMENT
            elif state == _AFTER_ELEMENT and ch == ",":
                self.state = _ELEMENT
            elif state == _AFTER_ELEMENT and ch == "]":
                self.state = _DONE
            else:
                return self._break(out)
            self.buf = buf[1:]

    def _key(self, out: list[Part]) -> None:
        used = self.scan.feed(self.buf)
        self.value += self.buf[:used]
        self.buf = self.buf[used:]
        if self.scan.done:
            self.key, self.value = loads(self.value), ""
            self.state = _COLON

    def _member_value(self, out: list[Part]) -> None:
        if not self.scan.started:
            self.buf = self.buf.lstrip(WHITESPACE)
            if not self.buf:
                return
        used = self.scan.feed(self.buf)
        piece, self.buf = self.buf[:used], self.buf[used:]
        streaming = self.key == "parameters" and self.name is not None
        if streaming:
            if piece:
                out.append(tool_args(self.calls - 1, piece))
                self.args_sent = True
        else:
            self.value += piece
        if not self.scan.done:
            return
        self.state = _AFTER_VALUE
        value, self.value = self.value, ""
        if self.key == "name":
            try:
                name = loads(value)
            except ValueError:
                name = None
            if not isinstance(name, str) or self.name is not None:
                return self._break(out)
            self.name = name
            out.extend(tool_call(self.calls, name))
            self.calls += 1
            if self.early_args:
                out.append(tool_args(self.calls - 1, self.early_args))
                self.args_sent = True
        elif self.key == "parameters" and not streaming:
            self.early_args = value

    def _close_element(self) -> bool:
        return self.name is not None

    def finish_reason(self, reason: str) -> str:
        return "tool_calls" if self.calls and reason == "stop" else reason
