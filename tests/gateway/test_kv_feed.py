"""gateway/kv_feed.py: one replica's KV-event stream, sans-IO: order, gaps and replay, resets, loss.

A fake replica (harness/kv_publisher.py) caches prompts and publishes vLLM's batches
with a replay buffer; the tests hand its batches to a Feed (some lost, late or replayed) and
check that the index ends holding what the replica's cache holds.
"""

from __future__ import annotations

import random

from harness.kv_publisher import Publisher
from streamproxy.gateway.kv_feed import Feed, FeedPolicy
from streamproxy.gateway.kv_index import KVIndex, PromptKeys

R = "http://replica:8000"
BS = 4


def held(index: KVIndex) -> set[object]:
    return set(index._owners[R].entries) if R in index else set()


def prompts(rng: random.Random, n: int) -> list[list[int]]:
    base = [rng.randrange(500) for _ in range(12)]
    return [base + [rng.randrange(500) for _ in range(rng.randint(4, 20))] for _ in range(n)]


class Link:
    """A replica's publisher and a feed, with a hand on what is delivered."""

    def __init__(self, *, replay: bool = True, buffer_steps: int = 10_000, capacity: int = 1000, **policy: float) -> None:
        self.replica = Publisher(BS, capacity=capacity, buffer_steps=buffer_steps)
        self.index = KVIndex()
        self.feed = Feed(R, self.index, replay=replay, policy=FeedPolicy(**policy))  # type: ignore[arg-type]
        self.now = 0.0
        self.asked: list[int] = []

    def publish(self, tokens: list[int], *, deliver: bool = True) -> int:
        seq, payload = self.replica.publish(self.replica.cache.prompt(tokens))
        if deliver:
            self.deliver(seq, payload)
        return seq

    def deliver(self, seq: int, payload: bytes) -> None:
        self.now += 0.01
        start = self.feed.live(seq, payload, self.now)
        if start is not None:
            self.asked.append(start)

    def answer(self) -> None:
        """The replica's ROUTER answers the last replay asked for."""
        for seq, payload in self.replica.replay(self.asked[-1]):
            self.feed.replayed(seq, payload, self.now)
        self.feed.replay_end(self.now)

    def in_sync(self) -> bool:
        return held(self.index) == self.replica.cache.cached()


def test_batches_in_order_are_applied() -> None:
    link = Link()
    for p in prompts(random.Random(1), 20):
        link.publish(p)
    assert link.asked == [] and link.feed.batches == 20 and link.in_sync()
    prompt = PromptKeys(prompts(random.Random(1), 20)[-1])
    assert link.index.cached_tokens(prompt, [R], link.now)[R] == len(prompt.token_ids) // BS * BS


def test_a_lost_batch_is_replayed_and_batches_meanwhile_are_held() -> None:
    link = Link()
    ps = prompts(random.Random(2), 12)
    for p in ps[:4]:
        link.publish(p)
    link.replica.cache.capacity = 6  # the next batches evict: a lost one holds BlockRemoved events
    lost = link.publish(ps[4], deliver=False)
    link.publish(ps[5])
    assert link.asked == [lost] and link.feed.replaying and link.feed.gaps == 1
    link.publish(ps[6])  # arrives while the replay runs: held
    link.answer()
    assert not link.feed.replaying and link.feed.last_seq == link.replica.seq - 1
    assert link.feed.resets == 0 and link.in_sync()


def test_a_gap_the_replay_cannot_fill_resets_the_replica() -> None:
    link = Link(buffer_steps=2)
    ps = prompts(random.Random(3), 10)
    link.publish(ps[0])
    link.replica.cache.capacity = 4
    for p in ps[1:5]:
        link.publish(p, deliver=False)  # four lost: the replica's buffer keeps the last two only
    link.publish(ps[5])
    link.answer()
    assert link.feed.resets == 1 and link.feed.last_seq == 5
    assert held(link.index) <= link.replica.cache.cached()  # no block it no longer holds
    link.replica.cache.capacity = 1000
    for p in ps[6:]:
        link.publish(p)
    assert held(link.index) <= link.replica.cache.cached() and link.feed.resets == 1


def test_a_replay_that_brings_nothing_resets_and_applies_what_was_held() -> None:
    link = Link()
    ps = prompts(random.Random(4), 4)
    link.publish(ps[0])
    link.publish(ps[1], deliver=False)
    link.replica.buffer.clear()  # (e.g. a restart of the publisher in between)
    link.publish(ps[2])
    link.feed.replay_end(link.now)  # the end marker alone
    assert link.feed.resets == 1 and link.feed.last_seq == 2 and held(link.index) <= link.replica.cache.cached()


def test_a_restarted_publisher_resets_the_replica() -> None:
    link = Link(replay=False)
    ps = prompts(random.Random(5), 6)
    for p in ps[:3]:
        link.publish(p)
    link.replica.restart()  # a new engine: sequence 0 again, an empty cache, new hashes
    link.publish(ps[3])
    assert link.feed.resets == 1 and link.feed.last_seq == 0 and link.in_sync()


def test_the_first_batch_heard_asks_for_the_replicas_history() -> None:
    link = Link()
    ps = prompts(random.Random(6), 6)
    for p in ps[:4]:
        link.publish(p, deliver=False)  # before the gateway listened
    link.publish(ps[4])
    assert link.asked == [0]
    link.answer()
    assert link.in_sync() and link.feed.resets == 0


def test_a_batch_that_does_not_decode_resets_without_replay() -> None:
    link = Link()
    link.publish(prompts(random.Random(7), 1)[0])
    link.deliver(1, b"\x93not msgpack")
    assert link.feed.decode_errors == 1 and link.feed.resets == 1 and link.feed.last_seq == 1
    assert link.asked == [] and held(link.index) == set()
    link.replica.seq = 2
    link.publish(prompts(random.Random(8), 1)[0])
    assert link.feed.last_seq == 2 and link.asked == []


def test_silence_is_probed_and_no_answer_is_a_lost_stream() -> None:
    link = Link(idle_probe=10.0, replay_timeout=2.0)
    link.publish(prompts(random.Random(9), 1)[0])
    assert link.feed.next_deadline() == link.now + 10.0
    assert link.feed.due(link.now + 5.0) is None
    assert link.feed.due(link.now + 10.0) == 1  # a probe: replay from the next sequence
    link.feed.replay_end(link.now + 10.1)  # a live publisher answers at once
    assert not link.feed.replaying and link.feed.lost == 0 and link.in_sync()
    assert link.feed.due(link.now + 20.2) == 1
    assert link.feed.due(link.now + 22.3) is None  # no answer within replay_timeout: lost
    assert link.feed.lost == 1 and held(link.index) == set() and link.feed.last_seq is None
    for t in (34.4, 36.5, 48.6, 50.7):  # probing goes on, every idle_probe; the loss counts once
        link.feed.due(link.now + t)
    assert link.feed.lost == 1 and link.feed.replays == 4


def test_a_probe_finds_a_lost_last_batch() -> None:
    link = Link(idle_probe=10.0)
    ps = prompts(random.Random(10), 2)
    link.publish(ps[0])
    link.publish(ps[1], deliver=False)  # the last batch before a silence: no later one reveals the gap
    assert link.feed.due(link.now + 10.0) == 1
    link.asked.append(1)
    link.answer()
    assert link.in_sync() and link.feed.last_seq == 1


def test_without_replay_a_gap_resets_and_a_long_disconnect_is_a_lost_stream() -> None:
    link = Link(replay=False, lost_after=15.0)
    ps = prompts(random.Random(11), 5)
    link.publish(ps[0])
    link.publish(ps[1], deliver=False)
    link.publish(ps[2])
    assert link.feed.resets == 1 and link.asked == [] and held(link.index) <= link.replica.cache.cached()
    link.feed.disconnected(100.0)
    assert link.feed.next_deadline() == 115.0 and link.feed.due(114.0) is None
    link.feed.due(115.0)
    assert link.feed.lost == 1 and held(link.index) == set()


def test_a_reconnect_starts_over_from_the_replicas_buffer() -> None:
    link = Link()
    ps = prompts(random.Random(12), 6)
    link.publish(ps[0])
    link.feed.disconnected(link.now)
    link.replica.restart()  # (or not: after a reconnect the numbers cannot tell)
    link.publish(ps[1], deliver=False)  # its first batches, lost before the connection was back
    link.feed.connected(link.now)
    deadline = link.feed.next_deadline()
    assert deadline is not None and deadline <= link.now
    start = link.feed.due(link.now)
    assert start == 0
    link.asked.append(start)
    assert link.asked == [0] and link.feed.resets == 1 and held(link.index) == set()
    link.answer()
    assert link.in_sync()
    link.feed.disconnected(link.now)
    link.feed.connected(link.now)
    link.publish(ps[2])  # a batch before the resync was due: it starts over all the same
    assert link.asked == [0, 0] and link.feed.resets == 2
    link.answer()
    assert link.in_sync()


def test_held_batches_are_bounded() -> None:
    link = Link(max_held=3)
    ps = prompts(random.Random(13), 12)
    link.publish(ps[0])
    link.publish(ps[1], deliver=False)
    for p in ps[2:10]:
        link.publish(p)  # a replay under way: only the last 3 are kept
    link.feed.replay_end(link.now)  # it brought nothing
    assert link.feed.resets == 1 and link.feed.last_seq == 9 and held(link.index) <= link.replica.cache.cached()


def test_close_drops_the_replica() -> None:
    link = Link()
    link.publish(prompts(random.Random(14), 1)[0])
    link.feed.close()
    assert R not in link.index and len(link.index) == 0


def test_random_losses_with_replay_end_in_sync() -> None:
    rng = random.Random(15)
    link = Link(capacity=40)
    pending_answer = 0
    for p in prompts(rng, 400):
        asked = len(link.asked)
        link.publish(p, deliver=rng.random() > 0.1)
        if len(link.asked) > asked:
            pending_answer = rng.randint(0, 3)  # the answer comes after a few more live batches
        elif link.feed.replaying:
            pending_answer -= 1
        if link.feed.replaying and pending_answer <= 0:
            link.answer()
    if link.feed.replaying:
        link.answer()
    last = link.replica.seq - 1
    if link.feed.last_seq != last:  # the very last batches were lost: the next probe finds them
        start = link.feed.due(link.now + 60.0)
        assert start is not None
        link.asked.append(start)
        link.answer()
    assert link.feed.resets == 0 and link.feed.gaps > 10 and link.in_sync()
