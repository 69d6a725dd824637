"""Per-key requests/min and tokens/min, as sliding one-minute windows. Sans-IO.

`admit(now)` answers None (go on) or the seconds to wait (a 429's
Retry-After): over `rpm` requests in the last 60 s, or over `tpm` tokens
metered in the last 60 s. Tokens are charged when a request ends
(`charge`), so a burst can overshoot `tpm` by the requests in flight, the
way token-bucket limiters in front of LLMs behave.
"""

from __future__ import annotations

from collections import deque

WINDOW = 60.0


class KeyLimiter:
    __slots__ = ("rpm", "tpm", "_requests", "_tokens", "_token_sum")

    def __init__(self, rpm: int, tpm: int) -> None:
        self.rpm = rpm
        self.tpm = tpm
        self._requests: deque[float] = deque()
        self._tokens: deque[tuple[float, int]] = deque()
        self._token_sum = 0

    def admit(self, now: float) -> float | None:
        self._expire(now)
        if self.rpm and len(self._requests) >= self.rpm:
            return self._requests[0] + WINDOW - now
        if self.tpm and self._token_sum >= self.tpm:
            return self._tokens[0][0] + WINDOW - now
        if self.rpm:
            self._requests.append(now)
        return None

    def charge(self, now: float, tokens: int) -> None:
        if self.tpm and tokens > 0:
            self._tokens.append((now, tokens))
            self._token_sum += tokens

    def _expire(self, now: float) -> None:
        start = now - WINDOW
        while self._requests and self._requests[0] <= start:
            self._requests.popleft()
        while self._tokens and self._tokens[0][0] <= start:
            self._token_sum -= self._tokens.popleft()[1]
