"""One replica's health: passive outlier ejection with a half-open breaker, and active probes.

Envoy's outlier detection, reduced: `consecutive_errors` failures in a row (connect error, 5xx, a broken
stream) open the breaker for `base_ejection_time` x times ejected (at most `max_ejection_time`), then
one half-open trial closes it or opens it again for longer. A failure while it is open (a request sent
before the ejection, e.g. the other streams one dead replica broke at once) counts for nothing: one
fault is one ejection, as in Envoy (it skips a host already ejected). Active probes (`GET /health`):
`unhealthy_threshold` failures take it out of rotation, `healthy_threshold` successes bring it back,
and a good probe ends an ejection. Sans-IO: every method takes the time.
"""

from __future__ import annotations

from enum import IntEnum

from streamproxy.gateway.config import UpstreamPolicy


class Breaker(IntEnum):  # the values are what the breaker-state gauge shows
    CLOSED = 0
    OPEN = 1
    HALF_OPEN = 2


class Health:
    __slots__ = ("policy", "breaker", "errors", "ejections", "ejected_until", "trial", "probed_healthy", "_probe_run")

    def __init__(self, policy: UpstreamPolicy) -> None:
        self.policy = policy
        self.breaker = Breaker.CLOSED
        self.errors = 0  # consecutive failures
        self.ejections = 0
        self.ejected_until = 0.0
        self.trial = False  # the half-open breaker's one request is out
        self.probed_healthy = True  # until a probe says otherwise
        self._probe_run = 0  # probes in a row that disagree with `probed_healthy`

    def available(self, now: float) -> bool:
        """May a request go to this replica now?"""
        if not self.probed_healthy:
            return False
        if self.breaker is Breaker.OPEN:
            if now < self.ejected_until:
                return False
            self.breaker = Breaker.HALF_OPEN
        if self.breaker is Breaker.HALF_OPEN:
            return not self.trial
        return True

    def routable(self, now: float) -> bool:
        """`available`, without moving an expired ejection to half-open (for reports)."""
        if not self.probed_healthy:
            return False
        if self.breaker is Breaker.OPEN:
            return now >= self.ejected_until
        return not (self.breaker is Breaker.HALF_OPEN and self.trial)

    def dispatched(self) -> None:
        if self.breaker is Breaker.HALF_OPEN:
            self.trial = True

    def succeeded(self) -> None:
        self.errors = 0
        self.trial = False
        self.breaker = Breaker.CLOSED

    def failed(self, now: float) -> bool:
        """One failure; True when it ejected the replica (not again while it is out)."""
        if self.breaker is Breaker.OPEN:
            return False
        self.errors += 1
        self.trial = False
        if self.breaker is Breaker.HALF_OPEN or self.errors >= self.policy.consecutive_errors:
            self._eject(now)
            return True
        return False

    def probed(self, ok: bool, now: float) -> None:
        if ok and self.breaker is not Breaker.CLOSED:
            self.breaker, self.errors, self.trial = Breaker.CLOSED, 0, False  # uneject on a good probe
        if ok == self.probed_healthy:
            self._probe_run = 0
            return
        self._probe_run += 1
        threshold = self.policy.healthy_threshold if ok else self.policy.unhealthy_threshold
        if self._probe_run >= threshold:
            self.probed_healthy, self._probe_run = ok, 0

    def retry_after(self, now: float) -> float:
        """Seconds until this replica may take a request again (0: now)."""
        if not self.probed_healthy:
            return self.policy.health_check_interval
        if self.breaker is Breaker.OPEN:
            return max(self.ejected_until - now, 0.0)
        return 0.0

    def _eject(self, now: float) -> None:
        self.ejections += 1
        self.breaker = Breaker.OPEN
        self.errors = 0
        self.ejected_until = now + min(self.policy.base_ejection_time * self.ejections, self.policy.max_ejection_time)
