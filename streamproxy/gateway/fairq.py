"""Requests waiting for a saturated deployment: per tenant and priority band, served fairly.

The shape is llm-d's flow control: a *flow* is a tenant (the API key) within
a *priority band*; bands are served in strict priority, and within a band
the tenants share fairly. Priorities are vLLM's numbers (`priority`, lower
first, 0 by default), so the number a request waits under is the number the
replica schedules it by.

Fairness within a band is a virtual token counter per tenant (VTC, Sheng et
al., "Fairness in Serving Large Language Models", OSDI 2024; AIBrix's
fairness): the next request is the head of the backlogged tenant with the
least counter (ties: the tenant with fewer waiting, then the earlier
arrival: a light tenant lifted to a heavy one's counter goes first, not one
dispatch later), and a dispatch adds its cost over
the tenant's weight to that tenant's counter. A tenant that becomes
backlogged is lifted to the least counter of those already waiting, so
being idle banks no credit. Chosen over deficit round robin because a
request's cost (its tokens) is only estimated when it is dispatched and
known when it ends: `charge` corrects the counter afterwards, which a
deficit round robin's quantum cannot take back; and a tenant at 10x another's
rate still lets the light tenant's next request out within one dispatch per
other tenant waiting. A pick costs O(tenants waiting in the band).

Bounds: at most `max_queued` waiters and `max_wait` seconds each (or the
request's own deadline). A request that finds the queue full displaces the
newest waiter of the lowest band below its own (the lowest band is shed
first); within its own band, that of the tenant with the most waiters, if
that tenant has more than one more than the newcomer's; otherwise the
newcomer is refused. `refusal` turns a waiter refused (`REJECTED_CAPACITY`)
or expired (`EVICTED_TTL`, llm-d's outcome names) into the 429 with a
`Retry-After` from the recent dispatch rate. Sans-IO: it hands out
decisions (`pop`: admit this waiter now); `flowcontrol.py` awaits them.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter, deque
from dataclasses import dataclass, field
from enum import Enum

from streamproxy.errors import QueueTimeout, RateLimited


class Outcome(Enum):
    DISPATCHED = "dispatched"
    REJECTED_CAPACITY = "rejected_capacity"
    EVICTED_TTL = "evicted_ttl"
    CANCELLED = "cancelled"


@dataclass(eq=False, slots=True)
class Waiter:
    tenant: str
    band: int = 0  # vLLM's priority: lower is served first
    cost: float = 1.0  # what a dispatch adds to the tenant's counter (times 1 / weight)
    weight: float = 1.0
    deadline: float = math.inf  # the request's own bound on waiting, if sooner than the queue's
    enqueued: float = 0.0
    seq: int = 0
    outcome: Outcome | None = None  # None: waiting
    handle: object = field(default=None, repr=False)  # the waiting side's (flowcontrol: a future)


class _Band:
    __slots__ = ("counters", "flows", "priority", "size")

    def __init__(self, priority: int) -> None:
        self.priority = priority
        self.flows: dict[str, deque[Waiter]] = {}  # the backlogged tenants, in the order they became so
        self.counters: dict[str, float] = {}
        self.size = 0


class FairQueue:
    RATE_WINDOW = 32  # dispatches the Retry-After's rate is measured over

    def __init__(self, max_queued: int = 1024, max_wait: float = 30.0, max_idle_counters: int = 1024) -> None:
        self.max_queued = max_queued
        self.max_wait = max_wait
        self.max_idle_counters = max_idle_counters  # counters kept for tenants not waiting now
        self._bands: dict[int, _Band] = {}
        self._size = 0
        self._seq = 0
        self._deadlines: list[tuple[float, int, Waiter]] = []
        self._dispatch_times: deque[float] = deque(maxlen=self.RATE_WINDOW)
        self.outcomes: Counter[tuple[int, Outcome]] = Counter()  # (band, outcome) -> requests, for metrics

    def __len__(self) -> int:
        return self._size

    def queued(self) -> dict[int, dict[str, int]]:
        """Waiters now, by band and tenant (metrics, /v1/deployments)."""
        return {p: {t: len(f) for t, f in b.flows.items()} for p, b in sorted(self._bands.items())}

    # -- in ---------------------------------------------------------------------------

    def push(self, w: Waiter, now: float) -> list[Waiter]:
        """Queue `w`. Returns the waiters refused to keep the bound (`w` itself when it does not fit),
        each with its outcome set."""
        shed: list[Waiter] = []
        if self._size >= self.max_queued:
            victim = self._victim(w)
            if victim is None:
                self._finish(w, Outcome.REJECTED_CAPACITY)
                return [w]
            self._remove(victim)
            self._finish(victim, Outcome.REJECTED_CAPACITY)
            shed.append(victim)
        self._seq += 1
        w.seq, w.enqueued, w.outcome = self._seq, now, None
        w.deadline = min(w.deadline, now + self.max_wait)
        band = self._bands.get(w.band)
        if band is None:
            band = self._bands[w.band] = _Band(w.band)
        flow = band.flows.get(w.tenant)
        if flow is None:
            band.counters[w.tenant] = self._entry_counter(band, w.tenant)
            flow = band.flows[w.tenant] = deque()
        flow.append(w)
        band.size += 1
        self._size += 1
        heapq.heappush(self._deadlines, (w.deadline, w.seq, w))
        return shed

    def _entry_counter(self, band: _Band, tenant: str) -> float:
        """A tenant's counter as it becomes backlogged: its own, lifted to the least of those waiting."""
        own = band.counters.get(tenant)
        waiting = [band.counters[t] for t in band.flows]
        if not waiting:
            return own if own is not None else 0.0
        lift = min(waiting)
        return lift if own is None else max(own, lift)

    def _victim(self, w: Waiter) -> Waiter | None:
        """Whom a newcomer to a full queue displaces: the lowest band's biggest flow's newest, if fair."""
        if not self._bands:
            return None
        lowest = self._bands[max(self._bands)]
        tenant = max(lowest.flows, key=lambda t: (len(lowest.flows[t]), lowest.counters[t]))
        flow = lowest.flows[tenant]
        if lowest.priority > w.band:
            return flow[-1]
        if lowest.priority == w.band and tenant != w.tenant:
            own = lowest.flows.get(w.tenant)
            if len(flow) > (len(own) if own else 0) + 1:
                return flow[-1]
        return None

    # -- out --------------------------------------------------------------------------

    def pop(self, now: float) -> Waiter | None:
        """The waiter to dispatch now (None: none waits). Call `expire` first to refuse the expired."""
        if not self._size:
            return None
        band = self._bands[min(self._bands)]
        counters, flows = band.counters, band.flows
        tenant = min(flows, key=lambda t: (counters[t], len(flows[t]), flows[t][0].seq))
        w = flows[tenant][0]
        self._remove(w)
        counters[tenant] = counters.get(tenant, 0.0) + w.cost / w.weight
        self._finish(w, Outcome.DISPATCHED)
        self._dispatch_times.append(now)
        return w

    def charge(self, tenant: str, band: int, cost: float) -> None:
        """A dispatched request cost `cost` more (or less, negative) than it was charged: correct the
        tenant's counter, if the band still keeps one."""
        b = self._bands.get(band)
        if b is not None and tenant in b.counters:
            b.counters[tenant] += cost

    def cancel(self, w: Waiter) -> bool:
        """The waiting side gave up (its client went away). False when it was no longer waiting."""
        if w.outcome is not None:
            return False
        self._remove(w)
        self._finish(w, Outcome.CANCELLED)
        return True

    def expire(self, now: float) -> list[Waiter]:
        """The waiters whose bound passed, refused (EVICTED_TTL)."""
        expired: list[Waiter] = []
        heap = self._deadlines
        while heap and heap[0][0] <= now:
            _, _, w = heapq.heappop(heap)
            if w.outcome is None:
                self._remove(w)
                self._finish(w, Outcome.EVICTED_TTL)
                expired.append(w)
        return expired

    def next_deadline(self) -> float | None:
        heap = self._deadlines
        while heap and heap[0][2].outcome is not None:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    # -- refusals ---------------------------------------------------------------------

    def retry_after(self, now: float, ahead: int | None = None) -> int:
        """Seconds until `ahead` waiters (default: all) are likely dispatched, from the recent
        dispatch rate; at least 1, at most `max_wait` (5 s before any dispatch was seen)."""
        times = self._dispatch_times
        waiting = self._size if ahead is None else ahead
        ceiling = max(1, math.ceil(self.max_wait))
        if len(times) < 2 or times[-1] <= times[0]:
            return min(5, ceiling)
        rate = (len(times) - 1) / (max(now, times[-1]) - times[0])
        return max(1, min(ceiling, math.ceil((waiting + 1) / rate)))

    def refusal(self, w: Waiter, now: float, deployment: str) -> RateLimited:
        """The 429 for a waiter refused (queue full) or expired (waited its bound)."""
        wait = self.retry_after(now)
        if w.outcome is Outcome.EVICTED_TTL:
            return QueueTimeout(
                f"deployment `{deployment}` is saturated: waited {now - w.enqueued:.0f} s for a replica "
                f"(priority {w.band}); retry after {wait} s",
                retry_after=wait, should_retry=True,
            )
        return RateLimited(
            f"deployment `{deployment}` is saturated and its queue is full (priority {w.band}); retry after {wait} s",
            retry_after=wait, should_retry=True,
        )

    # -- inside -----------------------------------------------------------------------

    def _remove(self, w: Waiter) -> None:
        band = self._bands[w.band]
        flow = band.flows[w.tenant]
        if flow[0] is w:
            flow.popleft()
        else:
            flow.remove(w)
        if not flow:
            del band.flows[w.tenant]
        band.size -= 1
        self._size -= 1
        if not band.size:
            del self._bands[w.band]  # no backlog, no debts: its counters go with it
        elif len(band.counters) > len(band.flows) + self.max_idle_counters:
            self._prune(band, self.max_idle_counters)
        if len(self._deadlines) > 2 * self._size + 64:
            self._deadlines = [d for d in self._deadlines if d[2].outcome is None and d[2] is not w]
            heapq.heapify(self._deadlines)

    @staticmethod
    def _prune(band: _Band, keep: int) -> None:
        """Forget the counters of tenants not waiting: first those a lift would raise anyway, then the
        oldest, down to half of `keep` (a tenant forgotten comes back at the least counter waiting)."""
        lift = min(band.counters[t] for t in band.flows)
        idle = [t for t in band.counters if t not in band.flows]
        gone = [t for t in idle if band.counters[t] <= lift]
        rest = [t for t in idle if band.counters[t] > lift]
        gone += rest[: max(0, len(rest) - keep // 2)]
        for tenant in gone:
            del band.counters[tenant]

    def _finish(self, w: Waiter, outcome: Outcome) -> None:
        w.outcome = outcome
        self.outcomes[(w.band, outcome)] += 1


# -- saturation: how many requests a deployment may have in flight ----------------------


def saturated(waiting: int | None, queue_depth_threshold: int = 5) -> bool:
    """A replica reporting `queue_depth_threshold` or more requests waiting of its own is held back."""
    return waiting is not None and waiting >= queue_depth_threshold


def replica_limit(outstanding: int, bound: int, waiting: int | None = None, queue_depth_threshold: int = 5) -> float:
    """One replica's concurrency bound now: `bound` (0: none), and no more than it has while it
    reports `queue_depth_threshold` or more requests waiting of its own (`vllm:num_requests_waiting`,
    the saturation detector's queue-depth test of the Gateway API Inference Extension)."""
    limit = float(bound) if bound > 0 else math.inf
    if saturated(waiting, queue_depth_threshold):
        limit = min(limit, float(outstanding))
    return limit


def deployment_limit(replicas: list[tuple[int, int | None]], bound: int, queue_depth_threshold: int = 5) -> float:
    """The requests a deployment may have in flight: the sum of its routable replicas' limits
    (`replicas`: each one's outstanding requests and, if exported, its requests waiting)."""
    return sum((replica_limit(o, bound, w, queue_depth_threshold) for o, w in replicas), 0.0)
