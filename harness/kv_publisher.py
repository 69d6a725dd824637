"""A fake vLLM replica's prefix cache and KV-event publisher, speaking vLLM's wire format.

`FakeCache` (sans-IO) is the part of a replica the events describe: a
prefix cache of blocks (`block_size` tokens, at most `capacity` blocks,
least recently used out first) whose engine hashes chain from a per-process
random seed, as vLLM's do without PYTHONHASHSEED; `prompt(tokens)` caches a
prompt's full blocks and returns the events vLLM would queue (a BlockStored
of the blocks not cached yet, after the cached prefix; BlockRemoved for
those it evicts), `clear()` an AllBlocksCleared; `cached()` the hashes held.

`Publisher` numbers batches from 0 and keeps the last `buffer_steps` for
replay, as vLLM's ZmqEventPublisher does: `publish(events)` -> (sequence,
payload), `replay(start)`; `restart()` is a new engine process (sequence
from 0, empty buffer and cache, a new hash seed). `encode_batch` writes the
bytes vLLM's msgspec encoder writes (tests/gateway/test_kv_subscriber.py
holds them against vLLM's).

`ZmqPublisher` puts a `Publisher` on sockets on 127.0.0.1 as vLLM does: a
PUB (bound, or connecting to a subscriber that binds) sending three frames
(topic, 8-byte big-endian sequence, payload) and a ROUTER answering replay
requests (empty delimiter, start sequence) with (delimiter, topic,
sequence, payload) per buffered batch and the end marker (sequence -1).
`drop` names sequences the PUB leaves unsent (lost on the way, still in the
replay buffer); `answer_replays = False` makes the ROUTER silent.

The subscribing side: `subscribed(owner, endpoint, replay)` is a started
`KVSubscriber` over a fresh index (stopped after the block), `heard(sub)`
waits until its connection and subscription are through (a PUB drops what
no subscriber asked for yet), `loopback_endpoints()` two free tcp:// ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import zmq
import zmq.asyncio

from harness.process import free_port
from harness.waiting import wait_until
from streamproxy.gateway.kv_feed import Feed, FeedPolicy
from streamproxy.gateway.kv_index import KVIndex
from streamproxy.gateway.kv_subscriber import KVSubscriber

END_SEQ = (-1).to_bytes(8, "big", signed=True)
_encode = msgspec.msgpack.Encoder().encode


def stored_event(hashes: list[int], parent: int | None, tokens: list[int], block_size: int, **extra: Any) -> dict[str, Any]:
    """A BlockStored as vLLM encodes it: a map, its tag first, fields in its order, defaults left out."""
    event: dict[str, Any] = {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent, "token_ids": tokens,
                             "block_size": block_size, "lora_id": None, "medium": "GPU", "lora_name": None}
    event.update(extra)
    return event


def removed_event(hashes: list[int]) -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": "GPU"}


CLEARED: dict[str, Any] = {"type": "AllBlocksCleared"}


def encode_batch(events: list[dict[str, Any]], ts: float = 0.0, rank: int | None = None) -> bytes:
    return _encode([ts, events, rank])


class FakeCache:
    def __init__(self, block_size: int = 4, capacity: int = 1000) -> None:
        self.block_size = block_size
        self.capacity = capacity
        self.seed = int.from_bytes(os.urandom(8), "big")
        self.blocks: OrderedDict[int, None] = OrderedDict()

    def _hash(self, parent: int, tokens: list[int]) -> int:
        return hash((self.seed, parent, tuple(tokens))) & (2**64 - 1)

    def prompt(self, tokens: list[int]) -> list[dict[str, Any]]:
        bs = self.block_size
        hashes, parent = [], self.seed
        for i in range(len(tokens) // bs):
            parent = self._hash(parent, tokens[i * bs : (i + 1) * bs])
            hashes.append(parent)
        hit = 0
        while hit < len(hashes) and hashes[hit] in self.blocks:
            self.blocks.move_to_end(hashes[hit])
            hit += 1
        events: list[dict[str, Any]] = []
        new = hashes[hit:]
        if new:
            events.append(stored_event(new, hashes[hit - 1] if hit else None, tokens[hit * bs : len(hashes) * bs], bs))
            self.blocks.update(dict.fromkeys(new))
        evicted = []
        while len(self.blocks) > self.capacity:
            evicted.append(self.blocks.popitem(last=False)[0])
        if evicted:
            events.append(removed_event(evicted))
        return events

    def evict(self, n: int) -> list[dict[str, Any]]:
        gone = [self.blocks.popitem(last=False)[0] for _ in range(min(n, len(self.blocks)))]
        return [removed_event(gone)] if gone else []

    def clear(self) -> list[dict[str, Any]]:
        self.blocks.clear()
        return [CLEARED]

    def cached(self) -> set[int]:
        return set(self.blocks)


class Publisher:
    def __init__(self, block_size: int = 4, capacity: int = 1000, buffer_steps: int = 10_000) -> None:
        self.block_size, self.capacity, self.buffer_steps = block_size, capacity, buffer_steps
        self.restart()

    def restart(self) -> None:
        self.cache = FakeCache(self.block_size, self.capacity)
        self.seq = 0
        self.buffer: deque[tuple[int, bytes]] = deque(maxlen=self.buffer_steps)

    def publish(self, events: list[dict[str, Any]]) -> tuple[int, bytes]:
        seq, payload = self.seq, encode_batch(events, ts=time.time())
        self.seq += 1
        self.buffer.append((seq, payload))
        return seq, payload

    def replay(self, start: int) -> list[tuple[int, bytes]]:
        return [(seq, payload) for seq, payload in self.buffer if seq >= start]


class ZmqPublisher:
    """A Publisher on 127.0.0.1 sockets; use `async with ZmqPublisher.running(...)`."""

    def __init__(self, publisher: Publisher, pub_endpoint: str, replay_endpoint: str | None, *, connect: bool = False,
                 topic: bytes = b"") -> None:
        self.publisher = publisher
        self.topic = topic
        self.drop: set[int] = set()
        self.answer_replays = True
        self.replay_requests: list[int] = []
        context = zmq.asyncio.Context.instance()
        self.pub = context.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        if connect:
            self.pub.connect(pub_endpoint)
        else:
            _bind(self.pub, pub_endpoint)
        self.router: zmq.asyncio.Socket | None = None
        if replay_endpoint is not None:
            self.router = context.socket(zmq.ROUTER)
            self.router.setsockopt(zmq.LINGER, 0)
            _bind(self.router, replay_endpoint)
        self._task: asyncio.Task[None] | None = None

    @classmethod
    @contextlib.asynccontextmanager
    async def running(cls, publisher: Publisher, pub_endpoint: str, replay_endpoint: str | None,
                      **kw: Any) -> AsyncIterator[ZmqPublisher]:
        fake = cls(publisher, pub_endpoint, replay_endpoint, **kw)
        fake.start()
        try:
            yield fake
        finally:
            await fake.close()

    def start(self) -> None:
        if self.router is not None:
            self._task = asyncio.get_running_loop().create_task(self._serve())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.pub.close(linger=0)
        if self.router is not None:
            self.router.close(linger=0)

    async def send(self, events: list[dict[str, Any]]) -> int:
        seq, payload = self.publisher.publish(events)
        if seq not in self.drop:
            await self.pub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload])
        return seq

    async def _serve(self) -> None:
        assert self.router is not None
        while True:
            frames = await self.router.recv_multipart()
            if len(frames) != 3:
                continue
            client, _, start = frames
            self.replay_requests.append(int.from_bytes(start, "big"))
            if not self.answer_replays:
                continue
            for seq, payload in self.publisher.replay(int.from_bytes(start, "big")):
                await self.router.send_multipart([client, b"", self.topic, seq.to_bytes(8, "big"), payload])
            await self.router.send_multipart([client, b"", b"", END_SEQ, b""])


def _bind(socket: zmq.asyncio.Socket, endpoint: str) -> None:
    """Bind, waiting out a port a socket of this process just closed (ZMQ unbinds in its I/O thread, later)."""
    deadline = time.monotonic() + 5.0
    while True:
        try:
            socket.bind(endpoint)
            return
        except zmq.ZMQError as e:
            if e.errno != zmq.EADDRINUSE or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def loopback_endpoints() -> tuple[str, str]:
    return f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"


@contextlib.asynccontextmanager
async def subscribed(owner: str, endpoint: str, replay: str | None, *, bind: bool = False,
                     **policy: Any) -> AsyncIterator[KVSubscriber]:
    feed = Feed(owner, KVIndex(), replay=replay is not None, policy=FeedPolicy(**policy))
    subscriber = KVSubscriber(feed, endpoint, replay_endpoint=replay, bind=bind, heartbeat=0.2)
    subscriber.start()
    try:
        yield subscriber
    finally:
        await subscriber.stop()


async def heard(sub: KVSubscriber) -> None:
    """Connected, and the subscription through to the PUB (which drops what no subscriber asked for yet)."""
    assert await wait_until(lambda: sub.connected, 10.0)
    await asyncio.sleep(0.2)
