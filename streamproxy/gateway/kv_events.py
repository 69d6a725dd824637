"""vLLM's KV-cache events, decoded: the wire format of `vllm/distributed/kv_events.py`.

A replica started with `--kv-events-config` publishes, on a ZMQ PUB socket,
one message of three frames per engine step that changed its prefix cache:
the topic (the config's `topic`, empty by default), the batch's sequence
number (8 bytes, big-endian, from 0 for each publisher process) and a
msgpack `KVEventBatch`. The batch is an array-like struct, `[ts, events,
data_parallel_rank]`; each event is a tagged struct encoded as a map whose
`type` is the class name (`BlockStored`, `BlockRemoved`, `AllBlocksCleared`)
and whose fields with defaults may be left out (`omit_defaults`). vLLM
releases before the map layout encoded events as arrays (`array_like`, the
tag first): a batch the map decoder refuses is read with the legacy one. A
batch holding an event of a type this module does not know is read event by
event, and the unknown events are left out (`KVEventBatch.skipped`).

Block hashes are vLLM's (`bytes` of SHA-256, or 64-bit ints under
`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`): opaque to the gateway, which keys
blocks by their token ids instead (`kv_index`). The decoders are built once,
here. Anything that is not such a batch raises `KVEventError`, never
another exception, so a subscriber counts it and goes on.
"""

from __future__ import annotations

from typing import Any

import msgspec

EngineHash = bytes | int  # vLLM's ExternalBlockHash


class KVEventError(ValueError):
    """A message or payload that is not vLLM's KV-event wire format."""


class BlockStored(msgspec.Struct, tag=True, omit_defaults=True, gc=False):
    """Blocks now in the replica's prefix cache: `block_hashes[i]` holds
    `token_ids[i * block_size:(i + 1) * block_size]`, chained after `parent_block_hash`
    (None: the first block of a prompt)."""

    block_hashes: list[EngineHash]
    parent_block_hash: EngineHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None  # deprecated in vLLM for lora_name
    medium: str | None = None  # "GPU", "CPU", ... (the tier); None: unspecified
    lora_name: str | None = None
    # One entry per block: what besides the tokens went into its hash, untagged: the LoRA
    # name, (mm_identifier, offset) pairs, the cache_salt (first block), prompt-embeds digests.
    extra_keys: list[list[Any] | None] | None = None
    group_idx: int | None = None  # the KV-cache group (hybrid models have several)
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None


class BlockRemoved(msgspec.Struct, tag=True, omit_defaults=True, gc=False):
    block_hashes: list[EngineHash]
    medium: str | None = None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(msgspec.Struct, tag=True, omit_defaults=True, gc=False):
    """The replica's prefix cache was reset (`/reset_prefix_cache`, a sleep)."""


Event = BlockStored | BlockRemoved | AllBlocksCleared


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Event]
    data_parallel_rank: int | None = None


class _LegacyStored(BlockStored, tag="BlockStored", array_like=True):
    pass


class _LegacyRemoved(BlockRemoved, tag="BlockRemoved", array_like=True):
    pass


class _LegacyCleared(AllBlocksCleared, tag="AllBlocksCleared", array_like=True):
    pass


class _LegacyBatch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[_LegacyStored | _LegacyRemoved | _LegacyCleared]
    data_parallel_rank: int | None = None


class _RawBatch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[msgspec.Raw]
    data_parallel_rank: int | None = None


_decode_batch = msgspec.msgpack.Decoder(KVEventBatch).decode
_decode_legacy = msgspec.msgpack.Decoder(_LegacyBatch).decode
_decode_raw = msgspec.msgpack.Decoder(_RawBatch).decode
_decode_event = msgspec.msgpack.Decoder(Event).decode
_decode_legacy_event = msgspec.msgpack.Decoder(_LegacyStored | _LegacyRemoved | _LegacyCleared).decode

END_SEQ = b"\xff" * 8  # a replay's last message: sequence -1 (vLLM's ZmqEventPublisher.END_SEQ)


def decode_batch(payload: bytes) -> tuple[KVEventBatch, int]:
    """One msgpack `KVEventBatch` (either layout) and how many of its events were of a type not
    known here (left out); `KVEventError` if it is not such a batch, or an event of a known type
    is broken (leaving that one out could leave a removed block in the index)."""
    try:
        return _decode_batch(payload), 0
    except msgspec.DecodeError as e:  # (ValidationError is a DecodeError)
        first = e
    try:
        legacy = _decode_legacy(payload)
        return KVEventBatch(legacy.ts, list(legacy.events), legacy.data_parallel_rank), 0
    except msgspec.DecodeError:
        pass
    try:
        raw = _decode_raw(payload)
    except msgspec.DecodeError:
        raise KVEventError(f"not a KVEventBatch: {first}") from None
    events = [e for e in map(_one_event, raw.events) if e is not None]
    return KVEventBatch(raw.ts, events, raw.data_parallel_rank), len(raw.events) - len(events)


_KNOWN = frozenset(("BlockStored", "BlockRemoved", "AllBlocksCleared"))
_decode_any = msgspec.msgpack.Decoder().decode


def _one_event(item: msgspec.Raw) -> Event | None:
    """One event of a batch read event by event: None for a type not known here."""
    try:
        value = _decode_any(item)
    except msgspec.DecodeError as e:
        raise KVEventError(f"a broken KV event: {e}") from None
    decode = _decode_event if isinstance(value, dict) else _decode_legacy_event  # the map layout, or the legacy array
    try:
        event: Event = decode(item)
        return event
    except msgspec.DecodeError as e:
        error = e
    tag = value.get("type") if isinstance(value, dict) else value[0] if isinstance(value, list) and value else None
    if isinstance(tag, str) and tag not in _KNOWN:
        return None
    raise KVEventError(f"a broken KV event ({error}): {value!r:.200}")


def split_message(frames: list[bytes]) -> tuple[bytes, int, bytes]:
    """A PUB message's three frames -> (topic, sequence, payload); `KVEventError` otherwise."""
    if len(frames) != 3:
        raise KVEventError(f"a KV-event message has 3 frames (topic, sequence, payload), not {len(frames)}")
    topic, seq, payload = frames
    if len(seq) != 8:
        raise KVEventError(f"a KV-event sequence number is 8 bytes, not {len(seq)}")
    return topic, int.from_bytes(seq, "big"), payload
