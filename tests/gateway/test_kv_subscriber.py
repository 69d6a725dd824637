"""gateway/kv_subscriber.py: a replica's KV events over ZMQ on 127.0.0.1, into the index.

Against a fake publisher that frames exactly as vLLM's (tests/support/kv_publisher.py; its
bytes are held against vLLM's encoder here), and against vLLM's own ZmqEventPublisher (no
engine: its events come from vLLM's KV-cache manager, tests/support/vllm_cache.py): normal
flow, a batch dropped on the way and replayed, a restarted publisher, a publisher gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest

from streamproxy.gateway.kv_feed import Feed, FeedPolicy
from streamproxy.gateway.kv_index import KVIndex
from streamproxy.gateway.kv_subscriber import KVSubscriber
from tests.support.kv_publisher import CLEARED, Publisher, ZmqPublisher, encode_batch, free_port, removed_event, stored_event
from tests.support.waiting import wait_until

R = "http://replica:8000"
BS = 4


def held(index: KVIndex) -> set[object]:
    return set(index._owners[R].entries) if R in index else set()


def prompts(seed: int, n: int) -> list[list[int]]:
    rng = random.Random(seed)
    base = [rng.randrange(500) for _ in range(8)]
    return [base + [rng.randrange(500) for _ in range(rng.randint(4, 16))] for _ in range(n)]


@contextlib.asynccontextmanager
async def subscribed(endpoint: str, replay: str | None, *, bind: bool = False,
                     **policy: float) -> AsyncIterator[KVSubscriber]:
    index = KVIndex()
    feed = Feed(R, index, replay=replay is not None, policy=FeedPolicy(**policy))  # type: ignore[arg-type]
    subscriber = KVSubscriber(feed, endpoint, replay_endpoint=replay, bind=bind, heartbeat=0.2)
    subscriber.start()
    try:
        yield subscriber
    finally:
        await subscriber.stop()


def endpoints() -> tuple[str, str]:
    return f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"


async def heard(sub: KVSubscriber) -> None:
    """Connected, and the subscription through to the PUB (which drops what no subscriber asked for yet)."""
    assert await wait_until(lambda: sub.connected, 10.0)
    await asyncio.sleep(0.2)


async def publish_until_heard(fake: ZmqPublisher, sub: KVSubscriber, tokens: list[list[int]]) -> None:
    """(Batches sent before the SUB is connected are lost, ZMQ's slow joiner: the feed replays them.)"""
    for p in tokens:
        await fake.send(fake.publisher.cache.prompt(p))
    assert await wait_until(lambda: sub.feed.last_seq == fake.publisher.seq - 1 and not sub.feed.replaying, 10.0), (
        sub.feed.last_seq, fake.publisher.seq)


def test_the_fake_publishers_bytes_are_vllms() -> None:
    from vllm.distributed import kv_events as v

    theirs = v.KVEventBatch(ts=12.5, events=[
        v.BlockStored(block_hashes=[1, 2], parent_block_hash=None, token_ids=list(range(8)), block_size=4,
                      lora_id=None, medium="GPU", lora_name=None),
        v.BlockStored(block_hashes=[3], parent_block_hash=2, token_ids=list(range(8, 12)), block_size=4,
                      lora_id=None, medium="GPU", lora_name=None, group_idx=0),
        v.BlockRemoved(block_hashes=[1, 2], medium="GPU"),
        v.AllBlocksCleared(),
    ])
    ours = encode_batch([stored_event([1, 2], None, list(range(8)), 4), stored_event([3], 2, list(range(8, 12)), 4, group_idx=0),
                         removed_event([1, 2]), CLEARED], ts=12.5)
    assert ours == msgspec.msgpack.Encoder().encode(theirs)


async def test_batches_flow_into_the_index() -> None:
    pub, replay = endpoints()
    async with ZmqPublisher.running(Publisher(BS), pub, replay) as fake, subscribed(pub, replay) as sub:
        await publish_until_heard(fake, sub, prompts(1, 30))
        assert held(sub.feed.index) == fake.publisher.cache.cached() and sub.feed.resets == 0
        assert sub.connected and sub.malformed == 0


async def test_a_dropped_batch_is_replayed() -> None:
    pub, replay = endpoints()
    async with ZmqPublisher.running(Publisher(BS, capacity=12), pub, replay) as fake, subscribed(pub, replay) as sub:
        await heard(sub)
        await publish_until_heard(fake, sub, prompts(2, 3))
        fake.drop = {fake.publisher.seq + 1}  # lost on the way; still in the replay buffer
        await publish_until_heard(fake, sub, prompts(3, 8))  # (these evict: the lost batch holds removals)
        assert sub.feed.gaps == 1 and fake.publisher.seq - 7 in fake.replay_requests
        assert held(sub.feed.index) == fake.publisher.cache.cached() and sub.feed.resets == 0


async def test_malformed_messages_are_counted_and_skipped() -> None:
    pub, replay = endpoints()
    async with ZmqPublisher.running(Publisher(BS), pub, replay) as fake, subscribed(pub, replay) as sub:
        await publish_until_heard(fake, sub, prompts(4, 2))
        await fake.pub.send_multipart([b"", b"short"])
        await fake.pub.send_multipart([b"", b"\x00" * 4, b"payload"])
        await publish_until_heard(fake, sub, prompts(5, 2))
        assert sub.malformed == 2 and held(sub.feed.index) == fake.publisher.cache.cached()


async def test_a_restarted_publisher_resets_the_replica() -> None:
    pub, replay = endpoints()
    publisher = Publisher(BS)
    async with subscribed(pub, replay) as sub:
        async with ZmqPublisher.running(publisher, pub, replay) as fake:
            await publish_until_heard(fake, sub, prompts(6, 10))
        publisher.restart()  # a new engine process on the same ports: sequence 0, empty cache
        async with ZmqPublisher.running(publisher, pub, replay) as fake:
            await publish_until_heard(fake, sub, prompts(7, 3))
            assert sub.feed.resets >= 1 and held(sub.feed.index) == publisher.cache.cached()


async def test_a_publisher_gone_is_a_lost_stream() -> None:
    pub, replay = endpoints()
    async with subscribed(pub, replay, idle_probe=0.3, replay_timeout=0.3) as sub:
        async with ZmqPublisher.running(Publisher(BS), pub, replay) as fake:
            await publish_until_heard(fake, sub, prompts(8, 5))
            assert await wait_until(lambda: fake.replay_requests.count(fake.publisher.seq) >= 1, 5.0)  # idle: probed
            assert sub.feed.lost == 0 and held(sub.feed.index)
        assert await wait_until(lambda: sub.feed.lost == 1, 5.0)
        assert held(sub.feed.index) == set() and sub.feed.last_seq is None


async def test_without_replay_a_publisher_gone_is_lost_after_its_connection_is() -> None:
    pub, _ = endpoints()
    async with subscribed(pub, None, lost_after=0.3) as sub:
        async with ZmqPublisher.running(Publisher(BS), pub, None) as fake:
            await heard(sub)
            for p in prompts(9, 5):
                await fake.send(fake.publisher.cache.prompt(p))
                await asyncio.sleep(0.05)
            assert await wait_until(lambda: held(sub.feed.index), 5.0)
        assert await wait_until(lambda: sub.feed.lost == 1, 5.0)
        assert held(sub.feed.index) == set()


# -- against vLLM's own publisher -------------------------------------------------------------


class Dropping:
    """vLLM's PUB socket, leaving the batches of `drop` unsent (they stay in its replay buffer)."""

    def __init__(self, socket: Any, drop: set[int]) -> None:
        self.socket, self.drop = socket, drop

    def send_multipart(self, frames: Any, *args: Any, **kw: Any) -> Any:
        if int.from_bytes(frames[1], "big") in self.drop:
            return None
        return self.socket.send_multipart(frames, *args, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.socket, name)


@pytest.fixture
def vllm_publisher() -> Any:
    """vLLM's ZmqEventPublisher connecting to our SUB (an endpoint without `*`) with a replay ROUTER it binds."""
    from vllm.distributed.kv_events import ZmqEventPublisher

    made: list[Any] = []

    def make(pub: str, replay: str, drop: set[int] | None = None) -> Any:
        publisher = ZmqEventPublisher(0, endpoint=pub, replay_endpoint=replay)
        if drop:
            publisher._pub = Dropping(publisher._pub, drop)
        made.append(publisher)
        return publisher

    yield make
    for publisher in made:
        publisher.shutdown()


async def vllm_publish(publisher: Any, cache: Any, sub: KVSubscriber, tokens: list[list[int]], start: int) -> int:
    from vllm.distributed.kv_events import KVEventBatch

    for i, p in enumerate(tokens):
        cache.run(f"r{start + i}", p)
        events = cache.take()
        if events:
            publisher.publish(KVEventBatch(ts=0.0, events=events))
            start += 1
    return start


async def test_vllms_publisher_into_the_index_with_a_replayed_gap_and_a_restart(vllm_publisher: Any) -> None:
    from tests.support.vllm_cache import VllmCache

    pub, replay = endpoints()
    cache = VllmCache(block_size=BS, blocks=40)
    async with subscribed(pub, replay, bind=True) as sub:
        publisher = vllm_publisher(pub, replay, drop={5})
        await heard(sub)
        n = await vllm_publish(publisher, cache, sub, prompts(10, 25), 0)
        assert await wait_until(lambda: sub.feed.last_seq == n - 1 and not sub.feed.replaying, 15.0), sub.feed.last_seq
        assert sub.feed.gaps >= 1 and sub.feed.resets == 0
        assert held(sub.feed.index) == cache.cached()

        publisher.shutdown()  # the engine restarts: a new publisher, sequence 0, an empty cache
        cache = VllmCache(block_size=BS, blocks=40)
        await asyncio.sleep(0.2)
        publisher = vllm_publisher(pub, replay)
        await heard(sub)
        n = await vllm_publish(publisher, cache, sub, prompts(11, 6), 0)
        assert await wait_until(lambda: sub.feed.last_seq == n - 1 and sub.feed.resets >= 1 and not sub.feed.replaying, 15.0)
        assert held(sub.feed.index) == cache.cached()
