"""gateway/kv_events.py: vLLM's KV-event batches, encoded by vLLM's own classes, decoded by ours.

vLLM is imported inside the tests only (the gateway never imports it): its structs and
msgspec encoder (the one its ZmqEventPublisher uses) make the reference bytes.
"""

from __future__ import annotations

import random
from typing import Any

import msgspec
import pytest

from streamproxy.gateway.kv_events import (
    END_SEQ,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventError,
    decode_batch,
    split_message,
)


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
    fields: dict[str, Any] = dict(block_hashes=[b"\x01" * 32, b"\x02" * 32], parent_block_hash=None,
                                  token_ids=list(range(32)), block_size=16, lora_id=None, medium="GPU", lora_name=None)
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
    from tests.support.vllm_cache import VllmCache

    cache = VllmCache(block_size=4, blocks=32)
    cache.run("a", list(range(10)))
    cache.run("b", list(range(14)), lora=("adapter", 1), cache_salt="salt")
    events = cache.take()
    batch, _ = decode_batch(encode(vllm_events, *events))
    assert len(batch.events) == len(events) == 2
    for ours, theirs in zip(batch.events, events):
        same_fields(ours, theirs, STORED_FIELDS)


class _OldStored(msgspec.Struct, array_like=True, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None


class _OldRemoved(msgspec.Struct, array_like=True, tag="BlockRemoved"):
    block_hashes: list[int]


class _OldBatch(msgspec.Struct, array_like=True):
    ts: float
    events: list[_OldStored | _OldRemoved]


def test_the_legacy_array_layout_of_earlier_vllm_releases_decodes() -> None:
    payload = msgspec.msgpack.encode(_OldBatch(2.0, [_OldStored([1, 2], None, [1, 2, 3, 4], 2, None), _OldRemoved([2])]))
    batch, skipped = decode_batch(payload)
    assert skipped == 0 and batch.data_parallel_rank is None
    first, second = batch.events
    assert isinstance(first, BlockStored) and first.block_hashes == [1, 2] and first.token_ids == [1, 2, 3, 4]
    assert first.medium is None and first.lora_name is None
    assert isinstance(second, BlockRemoved) and second.block_hashes == [2]


def test_events_of_an_unknown_type_are_left_out_and_counted(vllm_events: Any) -> None:
    known = msgspec.msgpack.decode(encode(vllm_events, stored(vllm_events), vllm_events.AllBlocksCleared()))
    known[1].insert(1, {"type": "BlockMoved", "block_hashes": [1], "to": "CPU"})
    batch, skipped = decode_batch(msgspec.msgpack.encode(known))
    assert skipped == 1
    assert [type(e) for e in batch.events] == [BlockStored, AllBlocksCleared]


@pytest.mark.parametrize("payload", [
    b"",
    b"\xc1",  # never used in msgpack
    msgspec.msgpack.encode({"ts": 1.0, "events": []}),
    msgspec.msgpack.encode([1.0]),
    msgspec.msgpack.encode(["soon", []]),
    msgspec.msgpack.encode([1.0, "events"]),
    msgspec.msgpack.encode([1.0, [{"type": "BlockStored", "block_hashes": [1]}]]),  # fields missing
    msgspec.msgpack.encode([1.0, [{"type": "BlockRemoved", "block_hashes": "x"}, {"type": "Other"}]]),
    msgspec.msgpack.encode([1.0, [{"block_hashes": [1]}]]),  # no tag
    msgspec.msgpack.encode([1.0, [17]]),
], ids=["empty", "reserved-byte", "map", "short", "ts-type", "events-type", "missing-fields", "broken-known",
        "untagged", "not-an-event"])
def test_malformed_payloads_raise_kv_event_error(payload: bytes) -> None:
    with pytest.raises(KVEventError):
        decode_batch(payload)


def test_mutated_payloads_raise_kv_event_error_or_decode(vllm_events: Any) -> None:
    """Whatever the bytes, the decoder answers a batch or KVEventError: nothing else escapes."""
    good = encode(vllm_events, stored(vllm_events, parent_block_hash=5, lora_name="x", extra_keys=[("x",), ("x",)]),
                  vllm_events.BlockRemoved(block_hashes=[1], medium="GPU"))
    rng = random.Random(35)
    for _ in range(3000):
        data = bytearray(good)
        for _ in range(rng.randint(1, 4)):
            if not data:
                break
            choice = rng.random()
            at = rng.randrange(len(data))
            if choice < 0.6:
                data[at] = rng.randrange(256)
            elif choice < 0.8:
                del data[at:]
            else:
                data[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        try:
            decode_batch(bytes(data))
        except KVEventError:
            pass


def test_split_message_reads_the_three_frames() -> None:
    assert split_message([b"kv@pod@model", (7).to_bytes(8, "big"), b"payload"]) == (b"kv@pod@model", 7, b"payload")
    assert split_message([b"", END_SEQ, b""])[1] == 2**64 - 1
    with pytest.raises(KVEventError, match="3 frames"):
        split_message([b"", b"payload"])
    with pytest.raises(KVEventError, match="8 bytes"):
        split_message([b"", b"\x00\x01", b"payload"])
