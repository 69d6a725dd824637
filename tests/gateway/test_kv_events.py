"""gateway/kv_events.py: decoding KV-event batches; the legacy layout, unknown events, malformed input.

The bytes come from harness/kv_publisher.py's encoder; test_kv_vllm.py holds that encoder,
and this decoder, against vLLM's own structs and encoder for every event type and field.
"""

from __future__ import annotations

import random

import msgspec
import pytest

from harness.kv_publisher import CLEARED, encode_batch, removed_event, stored_event
from streamproxy.gateway.kv_events import (
    END_SEQ,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventError,
    decode_batch,
    split_message,
)


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


def test_events_of_an_unknown_type_are_left_out_and_counted() -> None:
    payload = encode_batch([stored_event([1], None, [1, 2, 3, 4], 4), {"type": "BlockMoved", "block_hashes": [1], "to": "CPU"},
                            CLEARED])
    batch, skipped = decode_batch(payload)
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


def test_mutated_payloads_raise_kv_event_error_or_decode() -> None:
    """Whatever the bytes, the decoder answers a batch or KVEventError: nothing else escapes."""
    good = encode_batch([stored_event([1, 2], 5, list(range(8)), 4, lora_name="x", extra_keys=[["x"], ["x"]]),
                         removed_event([1])], ts=3.5)
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
