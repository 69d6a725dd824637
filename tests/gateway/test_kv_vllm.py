"""The gateway's KV-event pieces against vLLM's own code (vLLM imported here only: about 9 s of a core,
so this module is `slow` in tests/conftest.py and `make test-fast` leaves it out).

- kv_events: batches encoded by vLLM's structs and msgspec encoder (its ZmqEventPublisher's), every
  event type and optional field, decoded by ours field for field; and the fake publisher's bytes
  (harness/kv_publisher.py) equal to vLLM's;
- kv_index: vLLM's own KV-cache manager (tests/support/vllm_cache.py) driven by chat-like prompts:
  the index, fed its events, predicts each next request's prefix-cache hit exactly and holds the
  blocks its cache holds, LoRA and cache salts included;
- kv_subscriber: vLLM's ZmqEventPublisher (no engine) into the index over 127.0.0.1, a batch it
  dropped replayed by its own ROUTER, and a restart.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import msgspec
import pytest
import zmq

from harness.kv_publisher import CLEARED, encode_batch, heard, loopback_endpoints, removed_event, stored_event, subscribed
from harness.waiting import wait_until
from streamproxy.gateway.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, decode_batch
from streamproxy.gateway.kv_index import KVIndex, PromptKeys
from streamproxy.gateway.kv_subscriber import KVSubscriber
from tests.support.vllm_cache import VllmCache

A = "http://a:8000"
BS = 4


def held(index: KVIndex, owner: str = A) -> set[object]:
    return set(index._owners[owner].entries) if owner in index else set()


# -- kv_events: decoding what vLLM encodes --------------------------------------------------


@pytest.fixture(scope="module")
def vllm_events() -> Any:
    from vllm.distributed import kv_events

    return kv_events


def encode(vllm_events: Any, *events: Any, rank: int | None = None) -> bytes:
    """A batch as vLLM's publisher thread encodes it (`msgspec.msgpack.Encoder().encode(batch)`)."""
    batch = vllm_events.KVEventBatch(ts=1700000000.25, events=list(events), data_parallel_rank=rank)
    return msgspec.msgpack.Encoder().encode(batch)


def plain(value: Any) -> Any:
    """A decoded value compared with vLLM's: tuples (vLLM) and lists (msgpack) alike."""
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


STORED_FIELDS = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name",
                 "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window", "locality",
                 "ownership", "session_id")


def same_fields(ours: Any, theirs: Any, fields: tuple[str, ...]) -> None:
    for name in fields:
        assert plain(getattr(ours, name)) == plain(getattr(theirs, name)), name


def stored(vllm_events: Any, **overrides: Any) -> Any:
    fields: dict[str, Any] = {"block_hashes": [b"\x01" * 32, b"\x02" * 32], "parent_block_hash": None,
                              "token_ids": list(range(32)), "block_size": 16, "lora_id": None, "medium": "GPU", "lora_name": None}
    fields.update(overrides)
    return vllm_events.BlockStored(**fields)


@pytest.mark.parametrize("overrides", [
    {},
    {"block_hashes": [2**63 + 5, 7], "parent_block_hash": 2**64 - 1},  # VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES
    {"parent_block_hash": b"\x09" * 32, "medium": None},
    {"lora_id": 3, "lora_name": "adapter-a", "extra_keys": [("adapter-a", "salt-1"), ("adapter-a",)]},
    {"extra_keys": [("mm-hash", 4), None]},  # a multimodal (identifier, offset) pair, untagged
    {"extra_keys": [(b"\x00" * 32,), ("salt",)]},  # a prompt-embeds digest, a cache salt
    {"group_idx": 1, "kv_cache_spec_kind": "sliding_window", "kv_cache_spec_sliding_window": 4096},
    {"locality": "REMOTE", "ownership": "tier-2", "session_id": "s-1", "medium": "CPU"},
], ids=["sha256", "int-hashes", "parent", "lora", "mm", "embeds-salt", "group", "tiers"])
def test_block_stored_decodes_field_for_field(vllm_events: Any, overrides: dict[str, Any]) -> None:
    theirs = stored(vllm_events, **overrides)
    batch, skipped = decode_batch(encode(vllm_events, theirs))
    assert skipped == 0 and batch.ts == 1700000000.25 and batch.data_parallel_rank is None
    [ours] = batch.events
    assert isinstance(ours, BlockStored)
    same_fields(ours, theirs, STORED_FIELDS)


def test_block_removed_and_all_cleared_decode(vllm_events: Any) -> None:
    removed = vllm_events.BlockRemoved(block_hashes=[b"\x01" * 32, 42], medium="GPU")
    removed_group = vllm_events.BlockRemoved(block_hashes=[7], medium=None, group_idx=2, locality="LOCAL", ownership="o")
    batch, _ = decode_batch(encode(vllm_events, removed, vllm_events.AllBlocksCleared(), removed_group, rank=3))
    assert batch.data_parallel_rank == 3
    first, cleared, second = batch.events
    assert isinstance(first, BlockRemoved) and isinstance(second, BlockRemoved) and isinstance(cleared, AllBlocksCleared)
    for ours, theirs in ((first, removed), (second, removed_group)):
        same_fields(ours, theirs, ("block_hashes", "medium", "group_idx", "locality", "ownership"))


def test_a_batch_from_vllms_own_kv_cache_manager_decodes(vllm_events: Any) -> None:
    """The events vLLM's scheduler would publish for two requests (one with LoRA and a cache salt)."""
    cache = VllmCache(block_size=4, blocks=32)
    cache.run("a", list(range(10)))
    cache.run("b", list(range(14)), lora=("adapter", 1), cache_salt="salt")
    events = cache.take()
    batch, _ = decode_batch(encode(vllm_events, *events))
    assert len(batch.events) == len(events) == 2
    for ours, theirs in zip(batch.events, events):
        same_fields(ours, theirs, STORED_FIELDS)


def test_the_fake_publishers_bytes_are_vllms(vllm_events: Any) -> None:
    v = vllm_events
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


# -- kv_index: vLLM's own KV-cache manager -----------------------------------------------------


def cached(index: KVIndex, tokens: list[int], *owners: str, **kw: Any) -> dict[str, int]:
    return index.cached_tokens(PromptKeys(tokens, **kw), owners, 0.0)


def feed(index: KVIndex, owner: str, payload: bytes) -> None:
    """A batch from vLLM's encoder through our decoder into the index, as the subscriber does."""
    index.apply(owner, decode_batch(payload)[0].events)


def conversations(rng: random.Random, n: int) -> list[list[int]]:
    """Prompts that share prefixes as chats do: system prompts, then turns that extend each other."""
    systems = [[rng.randrange(1000) for _ in range(rng.randint(5, 40))] for _ in range(3)]
    threads: list[list[int]] = []
    prompts = []
    for _ in range(n):
        if threads and rng.random() < 0.6:
            thread = rng.choice(threads)
            thread.extend(rng.randrange(1000) for _ in range(rng.randint(1, 30)))
        else:
            thread = list(rng.choice(systems)) + [rng.randrange(1000) for _ in range(rng.randint(1, 20))]
            threads.append(thread)
        prompts.append(list(thread))
    return prompts


@pytest.mark.parametrize("seed", [1, 2])
def test_the_index_predicts_vllms_prefix_hits_and_holds_its_blocks(seed: int) -> None:
    rng = random.Random(seed)
    vllm = VllmCache(block_size=BS, blocks=48)  # small: blocks get evicted (BlockRemoved)
    index = KVIndex()
    index.add(A)
    for i, prompt in enumerate(conversations(rng, 120)):
        if i == 70:
            assert vllm.reset()  # AllBlocksCleared
            feed(index, A, vllm.payload())
        predicted = cached(index, prompt, A)[A]
        hit = vllm.run(f"r{i}", prompt)
        assert min(predicted, (len(prompt) - 1) // BS * BS) == hit, i  # vLLM computes the last token itself
        feed(index, A, vllm.payload())
        assert set(index._owners[A].entries) == vllm.cached(), i
    assert index.orphaned == 0 and index.unaligned == 0


def test_lora_and_salted_prompts_match_vllms_blocks() -> None:
    vllm = VllmCache(block_size=BS, blocks=64)
    index = KVIndex()
    prompt = list(range(30))
    vllm.run("lora", prompt, lora=("adapter", 1))
    vllm.run("salted", prompt, cache_salt="tenant-7")
    vllm.run("both", prompt, lora=("adapter", 1), cache_salt="tenant-7")
    feed(index, A, vllm.payload())
    for lora, salt in (("adapter", None), (None, "tenant-7"), ("adapter", "tenant-7")):
        assert cached(index, prompt, A, lora_name=lora, cache_salt=salt) == {A: 28}
    assert cached(index, prompt, A) == {A: 0}
    assert cached(index, prompt, A, lora_name="other") == {A: 0}


def test_after_a_reset_reused_blocks_come_back_when_requests_ask_vllm_to_report_them() -> None:
    vllm = VllmCache(block_size=BS, blocks=64)
    index = KVIndex()
    system = list(range(20))
    vllm.run("first", system + [100, 101, 102, 103, 104])
    feed(index, A, vllm.payload())
    index.reset(A)  # a gap the replay could not fill: what the replica holds is no longer known
    vllm.run("plain", system + [200, 201, 202, 203, 204])
    feed(index, A, vllm.payload())
    assert cached(index, system, A) == {A: 0}  # its new blocks chain on a parent the index forgot
    vllm.run("full", system + [300, 301, 302, 303, 304], report_reused=True)
    feed(index, A, vllm.payload())
    assert cached(index, system, A) == {A: 20}  # the reused prefix announced again
    assert set(index._owners[A].entries) <= vllm.cached()


# -- kv_subscriber: vLLM's own publisher --------------------------------------------------------


def small_prompts(seed: int, n: int) -> list[list[int]]:
    rng = random.Random(seed)
    base = [rng.randrange(500) for _ in range(8)]
    return [base + [rng.randrange(500) for _ in range(rng.randint(4, 16))] for _ in range(n)]


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
        for _ in range(250):  # a ROUTER this process just closed may hold the port a moment (ZMQ unbinds later)
            try:
                publisher = ZmqEventPublisher(0, endpoint=pub, replay_endpoint=replay)
                break
            except zmq.ZMQError as e:
                if e.errno != zmq.EADDRINUSE:
                    raise
                time.sleep(0.02)
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
    pub, replay = loopback_endpoints()
    cache = VllmCache(block_size=BS, blocks=40)
    async with subscribed(A, pub, replay, bind=True) as sub:
        publisher = vllm_publisher(pub, replay, drop={5})
        await heard(sub)
        n = await vllm_publish(publisher, cache, sub, small_prompts(10, 25), 0)
        assert await wait_until(lambda: sub.feed.last_seq == n - 1 and not sub.feed.replaying, 15.0), sub.feed.last_seq
        assert sub.feed.gaps >= 1 and sub.feed.resets == 0
        assert held(sub.feed.index) == cache.cached()

        publisher.shutdown()  # the engine restarts: a new publisher, sequence 0, an empty cache
        cache = VllmCache(block_size=BS, blocks=40)
        await asyncio.sleep(0.2)
        publisher = vllm_publisher(pub, replay)
        await heard(sub)
        n = await vllm_publish(publisher, cache, sub, small_prompts(11, 6), 0)
        assert await wait_until(lambda: sub.feed.last_seq == n - 1 and sub.feed.resets >= 1 and not sub.feed.replaying, 15.0)
        assert held(sub.feed.index) == cache.cached()
