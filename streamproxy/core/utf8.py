"""Incremental UTF-8 carry: never emit half a character.

An engine (or an upstream server) may end a delta in the middle of a
multi-byte character. `Utf8Carry.feed(bytes)` returns the text of every
complete character so far and keeps the incomplete tail for the next call;
invalid bytes become U+FFFD, as a tolerant decoder must. `flush()` at the
end of a stream turns a dangling tail into U+FFFD rather than dropping it.
`str` input passes straight through: a `str` cannot hold half a character.
Until the first `bytes` input (`clean`) nothing can be pending, so a caller
on the hot path may skip `feed` for `str` text altogether.
"""

from __future__ import annotations

import codecs

_Decoder = codecs.getincrementaldecoder("utf-8")


class Utf8Carry:
    __slots__ = ("_decoder", "clean")

    def __init__(self) -> None:
        self._decoder = _Decoder(errors="replace")
        self.clean = True  # no bytes fed yet: nothing can be pending

    def feed(self, data: str | bytes) -> str:
        if type(data) is str:
            # Bytes still pending can no longer be completed in order.
            return self.flush() + data if not self.clean and self._decoder.getstate()[0] else data
        self.clean = False
        return self._decoder.decode(data)  # type: ignore[arg-type]  # bytes; `type() is` does not narrow (isinstance is slower)

    def flush(self) -> str:
        return self._decoder.decode(b"", final=True)

    @property
    def pending(self) -> bool:
        return bool(self._decoder.getstate()[0])
