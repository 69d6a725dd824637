"""Which replica holds which prompt blocks, from the KV-cache events the replicas publish.

Keys. A block's key is a hash the gateway computes itself of its parent's
key, its token ids and its extra keys (LoRA name, cache salt, ...), chained
from `ROOT` for a prompt's first block: the "request keys" of llm-d's
kv-cache indexer, as opposed to vLLM's own block hashes ("engine keys"),
which depend on the replica's hash seed (NONE_HASH is random per process
unless PYTHONHASHSEED is set) and so cannot be recomputed here. A
`BlockStored` event carries each block's tokens: its keys are computed from
them, after the key of its parent, found through the engine hash the event
names (a parent the index does not know, evicted or stored before the
gateway listened, leaves its children out: a prefix match could never reach
them). `BlockRemoved` names engine hashes only: each replica's map of engine
hash -> key resolves them. A prompt's token ids become the same keys
(`PromptKeys`), once per block size. The keys are Python's `hash` of a
tuple: valid in this process only, which is all the index needs.

State. Per replica (its URL, the "owner"), `entries` maps each engine block
it holds to its key, least recently stored first; `holders` maps a key to the
replica holding it, or to those holding it with a count each (the same
tokens may sit in two KV-cache groups or tiers of one replica). An event
costs O(its blocks); nothing is per token. About 300 bytes a block tracked
(bench/kv_cost.py). At most `max_blocks` engine blocks over all replicas:
past that, the replica tracking the most loses its least recently stored
block (vLLM announces a block again when a request reuses it, if the
request asks it to: `kv_cache_report_mode: full` in its `vllm_xargs`; then
recently used blocks stay, and come back after a reset). `reset` (AllBlocksCleared, a gap that replay cannot fill,
a lost stream, a restarted replica) and `drop` (the replica is gone) forget
a replica's blocks in O(its blocks).

Traces. A block a replica no longer holds (removed, forgotten for
`max_blocks`, or reset) leaves a trace: its key -> that replica, the last
`max_traces` of them, a trace gone when its key is stored again anywhere
(then where it lives is known again) and with its replica on `drop`. Every
gateway fed the same events holds the same traces: where a prefix lived
before it was evicted everywhere, which the prefix's next request, from
whichever gateway, can go back to (`kv_score`). About 140 bytes a trace
(bench/kv_cost.py).

Queries. `longest_prefix(keys, owners)` walks a prompt's keys from the first
and says how many leading blocks each replica holds: O(blocks x replicas).
`last_held(prompt, owners, now)` is `cached_tokens` with the traces counted
as held: where the prefix lives or last lived.
`speculate(owner, prompt, now, hold)` records that a prompt was sent to a
replica (llm-d's speculative indexing): its blocks will be there once the
prefill ran, before their events arrive, so a burst of requests sharing a
prefix follows the first. A request waits in a busy replica's queue for
longer than any fixed TTL, so the entry lasts `hold` seconds (the request's
life: the gateway renews it with the default `speculative_ttl` when the
request ends, time for its events to come). Sans-IO: times are arguments.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence
from typing import Any

from streamproxy.gateway.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, EngineHash, Event

ROOT = 0  # the parent key of a prompt's first block
DEFAULT_MAX_BLOCKS = 262_144  # about 80 MB; 4 replicas of 65k blocks (a million tokens each at 16 a block)
DEFAULT_MAX_TRACES = 65_536  # about 9 MB
Extra = tuple[Any, ...] | None


def chain(parent: int, tokens: tuple[int, ...], extra: Extra) -> int:
    """A block's key: its parent's key, its tokens and its extra keys."""
    return hash((parent, tokens, extra))


def block_keys(token_ids: Sequence[int], block_size: int, extras: Sequence[Extra] | None = None) -> list[int]:
    """The keys of the full blocks of `token_ids` (a last partial block has none, as in vLLM)."""
    keys: list[int] = []
    parent = ROOT
    for i in range(len(token_ids) // block_size):
        extra = extras[i] if extras is not None and i < len(extras) else None
        parent = chain(parent, tuple(token_ids[i * block_size : (i + 1) * block_size]), extra)
        keys.append(parent)
    return keys


def prompt_extras(n_blocks: int, lora_name: str | None = None, cache_salt: str | None = None) -> list[Extra] | None:
    """Each block's extra keys as vLLM publishes them for a text prompt: the LoRA name, then the
    cache salt on the first block (vllm.v1.core.kv_cache_utils.generate_block_hash_extra_keys)."""
    if not lora_name and not cache_salt:
        return None
    lora: tuple[Any, ...] = (lora_name,) if lora_name else ()
    first = lora + ((cache_salt,) if cache_salt else ())
    return [first or None] + [lora or None] * (n_blocks - 1) if n_blocks else []


def _freeze(value: Any) -> Any:
    return tuple(_freeze(v) for v in value) if isinstance(value, list | tuple) else value


def event_extras(event: BlockStored) -> list[Extra] | None:
    """Each block's extra keys from a BlockStored: its `extra_keys`, else (vLLM before them) its LoRA."""
    n = len(event.block_hashes)
    if event.extra_keys is not None and len(event.extra_keys) == n:
        return [_freeze(keys) if keys else None for keys in event.extra_keys]
    if event.lora_name:
        return [(event.lora_name,)] * n
    if event.lora_id is not None:  # no name to match a request by: at least never taken for the base model's
        return [("lora_id", event.lora_id)] * n
    return None


def engine_key(block_hash: EngineHash, group: int | None, medium: str | None) -> Hashable:
    """A replica's block: vLLM's hash, qualified by KV-cache group and tier when not the usual ones."""
    if not group and medium in (None, "GPU"):
        return block_hash
    return (block_hash, group or 0, medium)


class PromptKeys:
    """One request's prompt as block keys, computed once per block size in use."""

    __slots__ = ("_by_size", "cache_salt", "lora_name", "token_ids")

    def __init__(self, token_ids: Sequence[int], lora_name: str | None = None, cache_salt: str | None = None) -> None:
        self.token_ids = token_ids
        self.lora_name = lora_name
        self.cache_salt = cache_salt
        self._by_size: dict[int, list[int]] = {}

    def keys(self, block_size: int) -> list[int]:
        keys = self._by_size.get(block_size)
        if keys is None:
            extras = prompt_extras(len(self.token_ids) // block_size, self.lora_name, self.cache_salt)
            keys = self._by_size[block_size] = block_keys(self.token_ids, block_size, extras)
        return keys


class _Owner:
    __slots__ = ("block_size", "entries", "last_size")

    def __init__(self) -> None:
        self.entries: OrderedDict[Hashable, int] = OrderedDict()  # engine block -> key, least recently stored first
        self.block_size = 0  # of its full blocks (KV-cache group 0); 0: not known yet
        self.last_size = 0  # the block size it last had (its traces'), kept across a reset


class KVIndex:
    """The blocks each replica of one deployment holds, by key."""

    def __init__(self, max_blocks: int = DEFAULT_MAX_BLOCKS, speculative_ttl: float = 2.0,
                 max_speculative: int = 100_000, max_traces: int = DEFAULT_MAX_TRACES) -> None:
        self.max_blocks = max_blocks
        self.max_traces = max_traces
        self.speculative_ttl = speculative_ttl
        self.max_speculative = max_speculative
        self._owners: dict[str, _Owner] = {}
        # key -> its one holder (the common case, held once), or {holder: how many of its engine blocks}
        self._holders: dict[int, str | dict[str, int]] = {}
        self._size = 0
        self._traces: OrderedDict[int, str] = OrderedDict()  # key -> the replica that last held it, oldest first
        self._guesses: dict[int, dict[str, float]] = {}  # key -> {owner: until}: speculative entries
        self._guess_order: list[tuple[float, str, int]] = []  # a heap of (until, owner, key)
        # Counters, for metrics and tests.
        self.orphaned = 0  # blocks left out: their parent is not known
        self.unaligned = 0  # BlockStored events whose tokens do not fill their blocks
        self.unknown_removed = 0  # BlockRemoved of a block not tracked (evicted here, or stored before we listened)
        self.evicted = 0  # blocks forgotten for `max_blocks`
        self.resets = 0

    # -- replicas ---------------------------------------------------------------------

    def add(self, owner: str) -> None:
        """`owner` publishes events (its blocks are tracked from now)."""
        self._owners.setdefault(owner, _Owner())

    def __contains__(self, owner: object) -> bool:
        return owner in self._owners

    @property
    def owners(self) -> list[str]:
        return list(self._owners)

    def block_size(self, owner: str) -> int:
        o = self._owners.get(owner)
        return o.block_size if o is not None else 0

    def blocks(self, owner: str) -> int:
        o = self._owners.get(owner)
        return len(o.entries) if o is not None else 0

    def __len__(self) -> int:
        return self._size

    def reset(self, owner: str, trace: bool = True) -> None:
        """Forget every block of `owner` (its cache was cleared, or what it holds is no longer known),
        each leaving a trace unless not `trace`."""
        o = self._owners.get(owner)
        if o is None:
            return
        self.resets += 1
        for key in o.entries.values():
            self._unhold(owner, key)
            if trace:
                self._trace(owner, key)
        self._size -= len(o.entries)
        o.entries.clear()
        o.block_size = 0
        self._forget_guesses(owner)

    def drop(self, owner: str) -> None:
        """`owner` is gone: nothing of it stays (nor its traces)."""
        self.reset(owner, trace=False)
        self._owners.pop(owner, None)
        traces = self._traces
        for key in [k for k, name in traces.items() if name == owner]:
            del traces[key]

    def retain(self, owners: Iterable[str]) -> None:
        """The replicas are now `owners`: drop every other."""
        keep = set(owners)
        for owner in [o for o in self._owners if o not in keep]:
            self.drop(owner)

    # -- events -----------------------------------------------------------------------

    def apply(self, owner: str, events: Iterable[Event]) -> None:
        """One batch's events from `owner`, in order."""
        for event in events:
            if isinstance(event, BlockStored):
                self.stored(owner, event)
            elif isinstance(event, BlockRemoved):
                self.removed(owner, event)
            elif isinstance(event, AllBlocksCleared):
                self.reset(owner)

    def stored(self, owner: str, event: BlockStored) -> None:
        o = self._owners.get(owner)
        if o is None:
            o = self._owners[owner] = _Owner()
        hashes, tokens, size = event.block_hashes, event.token_ids, event.block_size
        if size <= 0 or len(tokens) != len(hashes) * size:
            self.unaligned += 1
            return
        group, medium = event.group_idx, event.medium
        parent = ROOT
        if event.parent_block_hash is not None:
            known = o.entries.get(engine_key(event.parent_block_hash, group, medium))
            if known is None:
                self.orphaned += len(hashes)
                return
            parent = known
        if not group and size > o.block_size:  # (a partial block's event is smaller)
            o.block_size = o.last_size = size
        extras = event_extras(event)
        for i, block_hash in enumerate(hashes):
            parent = chain(parent, tuple(tokens[i * size : (i + 1) * size]), extras[i] if extras else None)
            self._hold(owner, o, engine_key(block_hash, group, medium), parent)
        if self._size > self.max_blocks:
            self._evict()

    def removed(self, owner: str, event: BlockRemoved) -> None:
        o = self._owners.get(owner)
        if o is None:
            return
        entries, group, medium = o.entries, event.group_idx, event.medium
        for block_hash in event.block_hashes:
            key = entries.pop(engine_key(block_hash, group, medium), None)
            if key is None:
                self.unknown_removed += 1
                continue
            self._size -= 1
            self._unhold(owner, key)
            self._trace(owner, key)

    def _trace(self, owner: str, key: int) -> None:
        """`owner` no longer holds `key`: it last lived there."""
        if self.max_traces <= 0:
            return
        traces = self._traces
        traces[key] = owner
        traces.move_to_end(key)
        if len(traces) > self.max_traces:
            traces.popitem(last=False)

    def _hold(self, owner: str, o: _Owner, block: Hashable, key: int) -> None:
        if self._traces:
            self._traces.pop(key, None)  # it lives again
        entries = o.entries
        old = entries.get(block)
        if old is not None:
            entries.move_to_end(block)  # stored again (a reused block): recently used
            if old == key:
                return
            self._unhold(owner, old)
            entries[block] = key
        else:
            entries[block] = key
            self._size += 1
        holders = self._holders
        held = holders.get(key)
        if held is None:
            holders[key] = owner
        elif isinstance(held, str):
            holders[key] = {held: 1, owner: 1} if held != owner else {owner: 2}
        else:
            held[owner] = held.get(owner, 0) + 1

    def _unhold(self, owner: str, key: int) -> None:
        holders = self._holders
        held = holders.get(key)
        if held is None:
            return
        if isinstance(held, str):
            if held == owner:
                del holders[key]
            return
        count = held.get(owner, 0) - 1
        if count > 0:
            held[owner] = count
        else:
            held.pop(owner, None)
        if not held:
            del holders[key]
        elif len(held) == 1:
            ((only, n),) = held.items()
            if n == 1:
                holders[key] = only

    def _evict(self) -> None:
        """Back to `max_blocks`: the least recently stored blocks of the replica tracking the most."""
        while self._size > self.max_blocks:
            name, o = max(self._owners.items(), key=lambda item: len(item[1].entries))
            _, key = o.entries.popitem(last=False)
            self._size -= 1
            self.evicted += 1
            self._unhold(name, key)
            self._trace(name, key)

    # -- queries ----------------------------------------------------------------------

    def longest_prefix(self, keys: Sequence[int], owners: Iterable[str], now: float, traces: bool = False) -> dict[str, int]:
        """How many leading blocks of `keys` each of `owners` holds (or is speculated to, until its TTL;
        with `traces`, or last held)."""
        live = list(dict.fromkeys(owners))
        result = dict.fromkeys(live, 0)
        holders, guesses = self._holders, self._guesses
        lived = self._traces if traces else {}
        for n, key in enumerate(keys, 1):
            held = holders.get(key)
            guess = guesses.get(key)
            last = lived.get(key)
            if held is None and guess is None and last is None:
                break
            live = [o for o in live if (held is not None and (held == o if isinstance(held, str) else o in held))
                    or (guess is not None and guess.get(o, 0.0) > now) or last == o]
            if not live:
                break
            for o in live:
                result[o] = n
        return result

    def cached_tokens(self, prompt: PromptKeys, owners: Iterable[str], now: float, traces: bool = False) -> dict[str, int]:
        """How many leading tokens of the prompt each of `owners` holds (0 for one whose block size is not known)."""
        by_size: dict[int, list[str]] = {}
        result: dict[str, int] = {}
        for owner in owners:
            o = self._owners.get(owner)
            size = 0 if o is None else o.block_size or (o.last_size if traces else 0)
            result[owner] = 0
            if size:
                by_size.setdefault(size, []).append(owner)
        for size, group in by_size.items():
            for owner, n in self.longest_prefix(prompt.keys(size), group, now, traces).items():
                result[owner] = n * size
        return result

    def last_held(self, prompt: PromptKeys, owners: Iterable[str], now: float) -> dict[str, int]:
        """How many leading tokens of the prompt each of `owners` holds or last held (traces)."""
        return self.cached_tokens(prompt, owners, now, traces=True)

    def speculate(self, owner: str, prompt: PromptKeys, now: float, hold: float | None = None) -> None:
        """The prompt was sent to `owner`: count its blocks there for `hold` seconds (default:
        `speculative_ttl`), or until their events come; a second call renews (or shortens) the first."""
        size = self.block_size(owner)
        if self.speculative_ttl <= 0 or not size:
            return
        until = now + (self.speculative_ttl if hold is None else hold)
        order = self._guess_order
        for key in prompt.keys(size):
            held = self._guesses.get(key)
            if held is None:
                self._guesses[key] = {owner: until}
            else:
                held[owner] = until
            heapq.heappush(order, (until, owner, key))
        self._expire_guesses(now)

    def _expire_guesses(self, now: float) -> None:
        order, guesses = self._guess_order, self._guesses
        while order and (order[0][0] <= now or len(order) > self.max_speculative):
            until, owner, key = heapq.heappop(order)
            held = guesses.get(key)
            if held is not None and held.get(owner) == until:
                del held[owner]
                if not held:
                    del guesses[key]

    def _forget_guesses(self, owner: str) -> None:
        for key in [k for k, held in self._guesses.items() if owner in held]:
            held = self._guesses[key]
            del held[owner]
            if not held:
                del self._guesses[key]
