"""A managed deployment's life cycle, sans-IO: which state it is in and what to do next.

    parked --want--> waking --replica_up--> ready --park_due/park--> draining --parked--> parked
                       ^                      |
                       +---- no replica up ---+  (a replica exited on its own: restart after a backoff)
    any --(max_failures unexpected exits or failed starts in a row)--> failed --want(admin)--> waking

The supervisor feeds it events with the (injected) time and does what the answers say. Requests in
flight (`begin`/`end`) keep it from parking; `retry_after` is the last boot's duration (`boot_guess` at
first). A source others may scale (Kubernetes) also reports `adopted`, `lost_all` and `failed_to_wake`.
"""

from __future__ import annotations

import math
from enum import StrEnum
from typing import Protocol


class Timings(Protocol):
    """What the life cycle needs of a deployment's settings (`Launch`, `Kubernetes`)."""

    @property
    def idle_seconds(self) -> float: ...
    @property
    def boot_guess(self) -> float: ...
    @property
    def max_failures(self) -> int: ...
    @property
    def restart_backoff(self) -> float: ...


class Phase(StrEnum):
    PARKED = "parked"
    WAKING = "waking"
    READY = "ready"
    DRAINING = "draining"
    FAILED = "failed"


GAUGE = {Phase.PARKED: 0, Phase.WAKING: 1, Phase.READY: 2, Phase.DRAINING: 3, Phase.FAILED: 4}


class Lifecycle:
    def __init__(self, launch: Timings, now: float = 0.0) -> None:
        self.launch = launch
        self.phase = Phase.PARKED
        self.up = 0  # replicas answering /health
        self.in_flight = 0
        self.last_used = now
        self.wake_started: float | None = None
        self.last_boot: float | None = None  # seconds the last wake took
        self.failures = 0  # unexpected exits / failed starts in a row
        self.boots = 0
        self.parks = 0
        self.restarts = 0

    # -- what requests see ---------------------------------------------------------------
    @property
    def serving(self) -> bool:
        return self.phase is Phase.READY and self.up > 0

    def retry_after(self) -> int:
        guess = self.last_boot if self.last_boot is not None else self.launch.boot_guess
        return max(1, math.ceil(guess))

    def begin(self, now: float) -> None:
        self.in_flight += 1
        self.last_used = now

    def end(self, now: float) -> None:
        self.in_flight -= 1
        self.last_used = now

    # -- events --------------------------------------------------------------------------
    def want(self, now: float, *, admin: bool = False) -> bool:
        """A request (or the admin) wants the deployment up: True when the replicas must be started.
        A failed deployment is only woken by the admin; a draining one once it is parked."""
        self.last_used = now
        if self.phase is Phase.FAILED and admin:
            self.failures = 0
            self.phase = Phase.PARKED
        if self.phase is not Phase.PARKED:
            return False
        self.phase = Phase.WAKING
        self.wake_started = now
        return True

    def replica_up(self, now: float) -> None:
        self.up += 1
        self.failures = 0
        if self.phase is Phase.WAKING:
            self.phase = Phase.READY
            if self.wake_started is not None:
                self.last_boot = now - self.wake_started
                self.boots += 1
            self.wake_started = None
            self.last_used = now

    def replica_exited(self, now: float, *, was_up: bool, expected: bool) -> float | None:
        """A replica's process ended (or its start failed). The delay before restarting it;
        None when it is not to be restarted (expected, or the deployment just failed)."""
        if was_up:
            self.up -= 1
        if expected or self.phase in (Phase.DRAINING, Phase.PARKED, Phase.FAILED):
            return None
        self.failures += 1
        if self.failures >= self.launch.max_failures:
            self.phase = Phase.FAILED
            self.wake_started = None
            return None
        self.restarts += 1
        if self.up == 0 and self.phase is Phase.READY:
            self.phase = Phase.WAKING
            self.wake_started = now
        return float(self.launch.restart_backoff * 2 ** (self.failures - 1))

    def park_due(self, now: float) -> bool:
        idle = self.launch.idle_seconds
        return idle > 0 and self.phase is Phase.READY and self.in_flight == 0 and now - self.last_used >= idle

    def park(self) -> bool:
        """Begin parking (idle, the admin, or room for another deployment): True when there is
        something to stop. A failed deployment stays failed (its replicas are already stopped)."""
        if self.phase in (Phase.READY, Phase.WAKING):
            self.phase = Phase.DRAINING
            self.wake_started = None
            return True
        return False

    def parked(self) -> None:
        self.up = 0
        if self.phase is Phase.DRAINING:
            self.phase = Phase.PARKED
            self.parks += 1

    def adopted(self, now: float) -> None:
        """Replicas are up that no wake of ours started (someone else scaled the deployment up)."""
        if self.phase in (Phase.PARKED, Phase.FAILED):
            self.phase = Phase.READY
            self.failures = 0
            self.wake_started = None
            self.last_used = now

    def lost_all(self) -> None:
        """Every replica of a ready deployment went away without a park of ours: parked (a
        request wakes it again)."""
        if self.phase is Phase.READY:
            self.phase = Phase.PARKED
            self.up = 0

    def failed_to_wake(self) -> None:
        if self.phase is Phase.WAKING:
            self.phase = Phase.FAILED
            self.wake_started = None
            self.failures += 1

    def stopped_all(self) -> None:
        """The replicas of a failed deployment were stopped."""
        self.up = 0
