"""Which stop sequence ended the output: a filter for APIs that report it (Anthropic).

Anthropic's `stop_reason: "stop_sequence"` names the sequence that matched,
but an engine's finish reason is just "stop" for an end-of-sequence token and
a stop string alike. So the route asks the engine to keep the stop string in
its output (`include_stop_str_in_output`) and puts this filter first in the
choice's chain: it holds back the last `max(len(stop))` characters (what
vLLM itself holds back while stop strings are set), and at the end strips a
stop sequence the text ends with and remembers it in `matched`. The engine
stops as soon as a stop string appears, so "the text ends with it" is
exactly "the engine stopped on it"; what the client sees is the text without
it, as with the plain OpenAI path.

Sans-IO, per choice, like every filter (see `filters/base.py`).
"""

from __future__ import annotations

from streamproxy.filters.base import CONTENT, ContentFilter, Part


class StopSequenceFilter(ContentFilter):
    __slots__ = ("stops", "hold", "buf", "matched")

    def __init__(self, stops: list[str]) -> None:
        # Longest first: of "a" and "ba", a text ending in "ba" stopped on "ba".
        self.stops = sorted(stops, key=len, reverse=True)
        self.hold = len(self.stops[0]) if self.stops else 0
        self.buf = ""
        self.matched: str | None = None

    def content(self, part: Part, out: list[Part]) -> None:
        buf = self.buf + part.text
        cut = len(buf) - self.hold
        if cut > 0:
            out.append(Part(CONTENT, buf[:cut], token_ids=part.token_ids))
            buf = buf[cut:]
        elif part.token_ids:
            out.append(Part(CONTENT, "", token_ids=part.token_ids))  # token ids still flow on
        self.buf = buf

    def flush(self) -> list[Part]:
        buf = self.buf
        self.buf = ""
        for stop in self.stops:
            if buf.endswith(stop):
                self.matched = stop
                buf = buf[: len(buf) - len(stop)]
                break
        return [Part(CONTENT, buf)] if buf else []
