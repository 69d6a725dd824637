"""Which stop sequence ended the output: a filter for APIs that report it (Anthropic).

An engine says "stop" for an EOS token and a stop string alike, so the route asks it to keep stop
strings in the output (`include_stop_str_in_output`) and this filter, first in the chain, holds back
the last `max(len(stop))` characters and at the end strips a stop sequence the text ends with, noted in
`matched`. The engine stops at the first stop string, so "ends with it" is "stopped on it". Sans-IO.
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
