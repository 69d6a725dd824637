"""gateway/kv_subscriber.py: a replica's KV events over ZMQ on 127.0.0.1, into the index.

Against a fake publisher that frames exactly as vLLM's (harness/kv_publisher.py; its bytes
are held against vLLM's encoder, and the subscriber against vLLM's own ZmqEventPublisher, in
test_kv_vllm.py): normal flow, a batch dropped on the way and replayed, malformed messages, a
restarted publisher, a publisher gone (with and without replay).
"""

from __future__ import annotations

import asyncio
import random

from harness.kv_publisher import Publisher, ZmqPublisher, heard, loopback_endpoints, subscribed
from harness.waiting import wait_until
from streamproxy.gateway.kv_index import KVIndex
from streamproxy.gateway.kv_subscriber import KVSubscriber

R = "http://replica:8000"
BS = 4


def held(index: KVIndex) -> set[object]:
    return set(index._owners[R].entries) if R in index else set()


def prompts(seed: int, n: int) -> list[list[int]]:
    rng = random.Random(seed)
    base = [rng.randrange(500) for _ in range(8)]
    return [base + [rng.randrange(500) for _ in range(rng.randint(4, 16))] for _ in range(n)]


async def publish_until_heard(fake: ZmqPublisher, sub: KVSubscriber, tokens: list[list[int]]) -> None:
    """(Batches sent before the SUB is connected are lost, ZMQ's slow joiner: the feed replays them.)"""
    for p in tokens:
        await fake.send(fake.publisher.cache.prompt(p))
    assert await wait_until(lambda: sub.feed.last_seq == fake.publisher.seq - 1 and not sub.feed.replaying, 10.0), (
        sub.feed.last_seq, fake.publisher.seq)


async def test_batches_flow_into_the_index() -> None:
    pub, replay = loopback_endpoints()
    async with ZmqPublisher.running(Publisher(BS), pub, replay) as fake, subscribed(R, pub, replay) as sub:
        await publish_until_heard(fake, sub, prompts(1, 30))
        assert held(sub.feed.index) == fake.publisher.cache.cached() and sub.feed.resets == 0
        assert sub.connected and sub.malformed == 0


async def test_a_dropped_batch_is_replayed() -> None:
    pub, replay = loopback_endpoints()
    async with ZmqPublisher.running(Publisher(BS, capacity=12), pub, replay) as fake, subscribed(R, pub, replay) as sub:
        await heard(sub)
        await publish_until_heard(fake, sub, prompts(2, 3))
        fake.drop = {fake.publisher.seq + 1}  # lost on the way; still in the replay buffer
        await publish_until_heard(fake, sub, prompts(3, 8))  # (these evict: the lost batch holds removals)
        assert sub.feed.gaps == 1 and fake.publisher.seq - 7 in fake.replay_requests
        assert held(sub.feed.index) == fake.publisher.cache.cached() and sub.feed.resets == 0


async def test_malformed_messages_are_counted_and_skipped() -> None:
    pub, replay = loopback_endpoints()
    async with ZmqPublisher.running(Publisher(BS), pub, replay) as fake, subscribed(R, pub, replay) as sub:
        await publish_until_heard(fake, sub, prompts(4, 2))
        await fake.pub.send_multipart([b"", b"short"])
        await fake.pub.send_multipart([b"", b"\x00" * 4, b"payload"])
        await publish_until_heard(fake, sub, prompts(5, 2))
        assert sub.malformed == 2 and held(sub.feed.index) == fake.publisher.cache.cached()


async def test_a_restarted_publisher_resets_the_replica() -> None:
    pub, replay = loopback_endpoints()
    publisher = Publisher(BS)
    async with subscribed(R, pub, replay) as sub:
        async with ZmqPublisher.running(publisher, pub, replay) as fake:
            await publish_until_heard(fake, sub, prompts(6, 10))
        publisher.restart()  # a new engine process on the same ports: sequence 0, empty cache
        async with ZmqPublisher.running(publisher, pub, replay) as fake:
            await publish_until_heard(fake, sub, prompts(7, 3))
            assert sub.feed.resets >= 1 and held(sub.feed.index) == publisher.cache.cached()


async def test_a_publisher_gone_is_a_lost_stream() -> None:
    pub, replay = loopback_endpoints()
    async with subscribed(R, pub, replay, idle_probe=0.3, replay_timeout=0.3) as sub:
        async with ZmqPublisher.running(Publisher(BS), pub, replay) as fake:
            await publish_until_heard(fake, sub, prompts(8, 5))
            assert await wait_until(lambda: fake.replay_requests.count(fake.publisher.seq) >= 1, 5.0)  # idle: probed
            assert sub.feed.lost == 0 and held(sub.feed.index)
        assert await wait_until(lambda: sub.feed.lost == 1, 5.0)
        assert held(sub.feed.index) == set() and sub.feed.last_seq is None


async def test_without_replay_a_publisher_gone_is_lost_after_its_connection_is() -> None:
    pub, _ = loopback_endpoints()
    async with subscribed(R, pub, None, lost_after=0.3) as sub:
        async with ZmqPublisher.running(Publisher(BS), pub, None) as fake:
            await heard(sub)
            for p in prompts(9, 5):
                await fake.send(fake.publisher.cache.prompt(p))
                await asyncio.sleep(0.05)
            assert await wait_until(lambda: held(sub.feed.index), 5.0)
        assert await wait_until(lambda: sub.feed.lost == 1, 5.0)
        assert held(sub.feed.index) == set()


async def test_a_lost_stream_that_comes_back_ends_with_the_index_matching_the_cache() -> None:
    # The publisher (the same engine process: its cache and replay buffer intact) stops answering and
    # publishing: the stream is lost and the replica's blocks are forgotten (nothing stale). When it
    # publishes again, the feed replays its buffer from 0 and the index holds what its cache holds.
    pub, replay = loopback_endpoints()
    async with ZmqPublisher.running(Publisher(BS, capacity=20), pub, replay) as fake, \
            subscribed(R, pub, replay, idle_probe=0.3, replay_timeout=0.3) as sub:
        await heard(sub)
        await publish_until_heard(fake, sub, prompts(10, 6))
        fake.answer_replays = False
        assert await wait_until(lambda: sub.feed.lost == 1, 5.0)
        assert held(sub.feed.index) == set() and sub.feed.last_seq is None
        for p in prompts(11, 4):  # (meanwhile, unheard: it evicts some of what the index knew)
            fake.publisher.publish(fake.publisher.cache.prompt(p))
        fake.answer_replays = True
        await publish_until_heard(fake, sub, prompts(12, 3))
        assert 0 in fake.replay_requests[1:] and held(sub.feed.index) == fake.publisher.cache.cached()
        assert sub.feed.resets >= 1 and sub.feed.index.unknown_removed == 0
