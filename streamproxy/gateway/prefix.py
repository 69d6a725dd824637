"""Prompt-prefix keys and the per-replica index of what each replica has cached.

`prefix_keys(body)` hashes fixed-size blocks of the request's canonical form (tools, then each message's
role and content), each key chained on the one before, so shared prefixes share leading keys. The first
key is a BLAKE2b digest, the same in every process, which `balance` uses for rendezvous hashing.
`PrefixIndex` keeps, per replica and LRU-bounded, the keys sent there and counts how many leading keys
of a request a replica holds; `forget_after` drops keys a replica's `cached_tokens` shows evicted. Sans-IO.
"""

from __future__ import annotations

from collections import OrderedDict
from hashlib import blake2b
from typing import Any

import msgspec

# Keys sorted; any JSON the request decoder gives (integers past 64 bits too).
_sorted_json = msgspec.json.Encoder(order="sorted").encode


def canonical(body: dict[str, Any]) -> bytes:
    """The part of a request the prompt is made of, in prompt order."""
    parts: list[Any] = []
    if body.get("tools"):
        parts.append(body["tools"])
    for field in ("instructions", "system"):  # Responses, Anthropic
        if body.get(field):
            parts.append(body[field])
    for field in ("messages", "input", "prompt"):
        value = body.get(field)
        if isinstance(value, list):
            parts.extend(value)
        elif value is not None:
            parts.append(value)
    return b"".join(map(_sorted_json, parts))


def stable_hash(data: bytes) -> int:
    """64 bits that are the same in every process and on every machine."""
    return int.from_bytes(blake2b(data, digest_size=8).digest(), "little")


def prefix_keys(body: dict[str, Any], block: int) -> list[int]:
    data = canonical(body)
    keys: list[int] = []
    if len(data) < block:
        return keys
    key = stable_hash(data[:block])  # shared by every gateway: the rendezvous key
    keys.append(key)
    for start in range(block, len(data) - block + 1, block):
        key = hash((key, data[start : start + block]))  # one process's index: its hash seed is fine
        keys.append(key)
    return keys


class PrefixIndex:
    """The prefix keys one replica is believed to hold, at most `capacity` of them."""

    __slots__ = ("capacity", "_keys")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._keys: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._keys)

    def matched(self, keys: list[int]) -> int:
        """How many leading keys of `keys` this replica holds."""
        held = self._keys
        n = 0
        for key in keys:
            if key not in held:
                break
            n += 1
        return n

    def insert(self, keys: list[int]) -> None:
        held = self._keys
        for key in keys:
            if key in held:
                held.move_to_end(key)
            else:
                held[key] = None
        while len(held) > self.capacity:
            held.popitem(last=False)

    def forget_after(self, keys: list[int], kept: int) -> None:
        """The replica holds only the first `kept` keys of this prefix: drop the others."""
        for key in keys[kept:]:
            self._keys.pop(key, None)
