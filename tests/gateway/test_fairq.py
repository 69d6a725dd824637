"""gateway/fairq.py: per-tenant, per-band fair queueing (sans-IO) and the saturation limits."""

from __future__ import annotations

import math
import random

import pytest

from streamproxy.errors import QueueTimeout, RateLimited
from streamproxy.gateway.fairq import FairQueue, Outcome, Waiter, deployment_limit, replica_limit


def drain(q: FairQueue, now: float = 0.0) -> list[Waiter]:
    out = []
    while (w := q.pop(now)) is not None:
        out.append(w)
    return out


def test_a_light_tenants_wait_is_bounded_against_a_heavy_one_at_ten_times_its_rate() -> None:
    """Saturated: 2 dispatches a tick; the heavy tenant sends 10 a tick, the light one 1."""
    q = FairQueue(max_queued=200, max_wait=math.inf)
    rng = random.Random(35)
    light_waits: list[int] = []
    pending: dict[int, int] = {}  # a light waiter's seq -> dispatches when it arrived
    dispatched = 0
    shed: dict[str, int] = {"heavy": 0, "light": 0}
    for tick in range(500):
        arrivals = [Waiter("heavy") for _ in range(10)] + [Waiter("light")]
        rng.shuffle(arrivals)
        for w in arrivals:
            for refused in q.push(w, float(tick)):
                shed[refused.tenant] += 1
            if w.tenant == "light" and w.outcome is None:
                pending[w.seq] = dispatched
        for _ in range(2):
            out = q.pop(float(tick))
            assert out is not None
            dispatched += 1
            if out.tenant == "light":
                light_waits.append(dispatched - pending.pop(out.seq))
    assert shed["light"] == 0 and shed["heavy"] > 4000  # the burst is what is shed
    assert len(light_waits) >= 495 and max(light_waits) <= 2  # out within one other dispatch
    assert len(q) >= 190


def test_a_tenant_lifted_to_a_backlogged_ones_counter_goes_first_on_the_tie() -> None:
    q = FairQueue(max_queued=100, max_wait=math.inf)
    for _ in range(5):
        q.push(Waiter("heavy"), 0.0)
    q.push(Waiter("light"), 1.0)  # lifted to heavy's counter (0), arriving later
    assert q.pop(1.0).tenant == "light"  # type: ignore[union-attr]
    assert [w.tenant for w in drain(q, 1.0)] == ["heavy"] * 5


def test_weights_share_a_band_in_proportion() -> None:
    q = FairQueue(max_queued=10_000)
    for _ in range(300):
        q.push(Waiter("gold", weight=3.0), 0.0)
        q.push(Waiter("bronze", weight=1.0), 0.0)
    first = [w.tenant for w in drain(q)[:200]]
    assert first.count("gold") == 150 and first.count("bronze") == 50


def test_a_higher_band_never_waits_behind_a_lower_one() -> None:
    q = FairQueue()
    for i in range(20):
        q.push(Waiter(f"batch-{i % 3}", band=5), 0.0)
    q.push(Waiter("interactive", band=0), 1.0)
    q.push(Waiter("urgent", band=-1), 2.0)  # vLLM's numbers: lower goes first
    order = drain(q, 3.0)
    assert [w.band for w in order] == [-1, 0] + [5] * 20


def test_a_full_queue_sheds_the_lowest_band_first() -> None:
    q = FairQueue(max_queued=4)
    low = [Waiter("t", band=9) for _ in range(3)]
    for w in low:
        q.push(w, 0.0)
    q.push(Waiter("u", band=1), 0.0)
    newcomer = Waiter("v", band=0)
    assert q.push(newcomer, 1.0) == [low[-1]]  # the lowest band's newest goes
    assert low[-1].outcome is Outcome.REJECTED_CAPACITY and newcomer.outcome is None
    late = Waiter("t", band=9)
    assert q.push(late, 2.0) == [late]  # nothing below it, and its own flow is the biggest: refused
    assert late.outcome is Outcome.REJECTED_CAPACITY
    assert q.queued() == {0: {"v": 1}, 1: {"u": 1}, 9: {"t": 2}}
    assert q.outcomes[(9, Outcome.REJECTED_CAPACITY)] == 2
    assert q.push(Waiter("u", band=5), 3.0) == [low[1]]  # band 9 is still the first to go


def test_within_a_band_a_full_queue_sheds_the_biggest_flow() -> None:
    q = FairQueue(max_queued=4)
    burst = [Waiter("heavy") for _ in range(4)]
    for w in burst:
        q.push(w, 0.0)
    light = Waiter("light")
    assert q.push(light, 1.0) == [burst[-1]] and light.outcome is None
    second = Waiter("light")
    assert q.push(second, 1.0) == [burst[-2]]  # heavy 2, light 2 now
    third = Waiter("light")
    assert q.push(third, 1.0) == [third]  # no more: light would hold more than its share
    assert q.queued() == {0: {"heavy": 2, "light": 2}}


def test_the_waiting_bound_expires_with_a_queue_timeout() -> None:
    q = FairQueue(max_wait=5.0)
    w = Waiter("t", band=2)
    soon = Waiter("t", deadline=3.0)  # the request's own bound, sooner
    q.push(w, 0.0)
    q.push(soon, 0.0)
    assert q.next_deadline() == 3.0 and q.expire(2.9) == []
    assert q.expire(3.0) == [soon] and soon.outcome is Outcome.EVICTED_TTL
    assert q.expire(5.0) == [w] and w.outcome is Outcome.EVICTED_TTL and len(q) == 0
    error = q.refusal(w, 5.0, "support-bot")
    assert isinstance(error, QueueTimeout) and error.status == 429 and error.code == "queue_timeout"
    assert error.headers() == {"Retry-After": "5", "x-should-retry": "true"}
    assert "support-bot" in error.message and "waited 5 s" in error.message and "priority 2" in error.message


def test_a_refusal_for_a_full_queue_is_a_rate_limit_with_retry_after_from_the_dispatch_rate() -> None:
    q = FairQueue(max_queued=20, max_wait=60.0)
    for _ in range(20):
        q.push(Waiter("t"), 0.0)
    for i in range(10):  # 10 dispatches a second
        q.pop(i / 10)
        q.push(Waiter("t"), i / 10)
    refused = Waiter("t", band=3)
    assert q.push(refused, 1.0) == [refused]
    error = q.refusal(refused, 1.0, "d")
    assert type(error) is RateLimited and error.status == 429 and error.code == "too_many_requests"
    assert error.retry_after == 3  # (20 waiting + 1) / 10 a second, rounded up
    assert FairQueue(max_wait=30.0).retry_after(0.0) == 5  # no dispatch seen yet


def test_cancelled_waiters_leave_the_queue() -> None:
    q = FairQueue()
    a, b, c = Waiter("x"), Waiter("x"), Waiter("y")
    for w in (a, b, c):
        q.push(w, 0.0)
    assert q.cancel(b) and not q.cancel(b)
    assert drain(q) == [a, c] and b.outcome is Outcome.CANCELLED
    assert q.next_deadline() is None


def test_an_idle_tenant_banks_no_credit() -> None:
    q = FairQueue(max_queued=10_000)
    for _ in range(100):
        q.push(Waiter("steady"), 0.0)
    for _ in range(50):
        q.pop(0.0)  # steady's counter: 50
    for _ in range(10):
        q.push(Waiter("newcomer"), 1.0)  # lifted to 50, not 0: no run of 10
    order = [w.tenant for w in drain(q)[:20]]
    assert order[:20:2].count("newcomer") + order[1:20:2].count("newcomer") == 10
    assert max(len(run) for run in "".join("n" if t == "newcomer" else "s" for t in order).split("s")) == 1


def test_charge_corrects_a_tenants_share() -> None:
    q = FairQueue()
    for _ in range(3):
        q.push(Waiter("a"), 0.0)
        q.push(Waiter("b"), 0.0)
    first = q.pop(0.0)
    assert first is not None and first.tenant == "a"
    q.charge("a", 0, 10.0)  # its request turned out ten times dearer than estimated
    assert [w.tenant for w in drain(q)] == ["b", "b", "b", "a", "a"]


def test_counters_of_tenants_gone_are_pruned() -> None:
    q = FairQueue(max_queued=100_000, max_idle_counters=16)
    q.push(Waiter("resident"), 0.0)
    for i in range(1000):
        q.push(Waiter(f"once-{i}"), 0.0)
        q.push(Waiter("resident"), 0.0)
        q.pop(0.0)
    band = q._bands[0]
    assert len(band.counters) <= len(band.flows) + 16


def test_saturation_limits() -> None:
    assert replica_limit(3, bound=8) == 8.0
    assert replica_limit(3, bound=0) == math.inf  # no bound configured
    assert replica_limit(6, bound=8, waiting=5) == 6.0  # the replica queues requests itself: no more than it has
    assert replica_limit(6, bound=8, waiting=4) == 8.0
    assert replica_limit(6, bound=0, waiting=9, queue_depth_threshold=9) == 6.0
    assert deployment_limit([(2, None), (6, 7), (0, 0)], bound=8) == 8 + 6 + 8
    assert deployment_limit([], bound=8) == 0


@pytest.mark.parametrize("seed", range(3))
def test_random_operations_keep_the_counts_right(seed: int) -> None:
    rng = random.Random(seed)
    q = FairQueue(max_queued=30, max_wait=10.0)
    waiting: set[int] = set()
    now = 0.0
    everyone: list[Waiter] = []
    for _ in range(3000):
        now += rng.random() * 0.1
        op = rng.random()
        if op < 0.5:
            w = Waiter(rng.choice("abcde"), band=rng.choice([0, 1, 2]))
            everyone.append(w)
            for refused in q.push(w, now):
                waiting.discard(id(refused))
            if w.outcome is None:
                waiting.add(id(w))
        elif op < 0.8:
            for w in q.expire(now):
                waiting.discard(id(w))
            popped = q.pop(now)
            if popped is not None:
                assert id(popped) in waiting
                waiting.discard(id(popped))
                assert all(w.outcome is not None or w.band >= popped.band for w in everyone)  # strict bands
        else:
            live = [w for w in everyone if w.outcome is None]
            if live:
                victim = rng.choice(live)
                assert q.cancel(victim)
                waiting.discard(id(victim))
        assert len(q) == len(waiting) == sum(1 for w in everyone if w.outcome is None) <= 30
        assert sum(n for flows in q.queued().values() for n in flows.values()) == len(q)
