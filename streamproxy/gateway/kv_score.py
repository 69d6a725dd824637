"""Choosing a replica by the prompt prefix it has cached, weighed against its load.

Today's cache-aware rule (SGLang's router, `Pool.choose`) with each
replica's cached prefix measured precisely, from its KV events:
  - the candidates: available, not yet tried, below `max_outstanding` (when
    given, while one is), and within today's load guard (`guarded`: when the
    loads are imbalanced, only those within `balance_abs_threshold` of the
    least loaded);
  - a hit: when some candidate holds at least `cache_threshold` of the
    prompt's tokens, the least loaded of those holding nearly the longest
    prefix (`CLOSE` of it: a block or two more is not worth a queue);
  - a miss: else, among the replicas within `balance_abs_threshold` of the
    least loaded, the one whose events say it holds or last held (the
    index's traces of evicted blocks) the longest part of the prompt beyond
    what every replica holding any block holds (`lived_beyond`: a chat
    template's header decides nothing), however short: vLLM frees a
    request's blocks tail first, so a tenant's head outlives its tail, and
    a prefix evicted everywhere goes back where it lived. Every gateway fed
    the same events chooses alike here, also one that never sent the
    prefix (two gateways sharing nothing would otherwise place one tenant
    on two replicas, each by what it alone sent); else the one this
    gateway last sent the prefix to (today's approximate index holds
    `cache_threshold` of its prefix keys: traces since dropped), else (a new prefix)
    the one it has sent the fewest prefix keys (SGLang's "smallest tree":
    tenants spread evenly over the caches, where a hash would leave one
    replica with more than its cache holds), then the rendezvous home
    (`balance.rendezvous_score` of the first prefix key and the URL).
Cached shares are of the whole prompt, never normalized across the
candidates: the block a chat template's header fills on every replica, or
a few blocks more on one, decide nothing, and a prefix evicted everywhere
does not go to whichever replica is idlest that moment (which would
scatter tenants over every replica's cache, each holding all of them for a
while and none for long).

A replica that publishes KV events is measured by the `KVIndex`; one that
does not, by today's approximate index (the share of the request's prefix
keys it is believed to hold, times the prompt's tokens). When no candidate
publishes events, or the pool's policy has no prefix affinity, the choice
is today's (`Pool.choose`). Pure functions, sans-IO.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from streamproxy.gateway.balance import Pool, Replica, rendezvous_score
from streamproxy.gateway.kv_index import KVIndex, PromptKeys

CLOSE = 0.9  # holders of at least this share of the longest cached prefix compete on load


def estimated_cached(index: KVIndex, replicas: Sequence[Replica], prompt: PromptKeys, keys: list[int],
                     now: float) -> list[float]:
    """Each replica's cached prompt tokens: from its events, or else from today's approximate index."""
    by_events = index.cached_tokens(prompt, [r.url for r in replicas if r.url in index], now)
    total = len(prompt.token_ids)
    return [float(by_events[r.url]) if r.url in by_events else
            (r.index.matched(keys) / len(keys) * total if keys else 0.0) for r in replicas]


def guarded(pool: Pool, candidates: list[Replica]) -> list[Replica]:
    """Today's load guard (SGLang's cache-aware policy): when the loads are imbalanced (max - min over
    `balance_abs_threshold` and max over `balance_rel_threshold` x min), only the replicas within
    `balance_abs_threshold` of the least loaded compete."""
    if not candidates:
        return candidates
    policy = pool.policy
    loads = [r.outstanding for r in candidates]
    low, high = min(loads), max(loads)
    if high - low > policy.balance_abs_threshold and high > policy.balance_rel_threshold * low:
        return [r for r in candidates if r.outstanding <= low + policy.balance_abs_threshold]
    return candidates


def home_key(prompt: PromptKeys, keys: list[int]) -> int:
    """The prefix's rendezvous key: today's first prefix key, else its first block of ids (hashes of int
    tuples are the same in every process)."""
    if keys:
        return keys[0]
    return hash(tuple(prompt.token_ids[:16]))


def lived_beyond(index: KVIndex, replicas: Sequence[Replica], prompt: PromptKeys, now: float) -> list[float]:
    """Each replica's prompt tokens it holds or last held (`KVIndex.last_held`: its events' traces) beyond
    the blocks every replica holding any block holds (a chat template's header): where the prefix lives,
    or lived before it was evicted there, as every gateway fed the same events sees it (0 without events)."""
    lived = index.last_held(prompt, [r.url for r in replicas if r.url in index], now)
    warm = [lived[r.url] for r in replicas if r.url in lived and index.blocks(r.url)]
    floor = min(warm, default=0)
    return [float(max(0, lived[r.url] - floor)) if r.url in lived else 0.0 for r in replicas]


def pick(pool: Pool, candidates: list[Replica], cached: Sequence[float], prompt_tokens: int, keys: list[int],
         home: int, lived: Callable[[], Sequence[float]] | None = None) -> int:
    """The index of the winner among `candidates` (each holding `cached[i]` of `prompt_tokens`; `lived()`:
    each one's part beyond what every replica holds, `lived_beyond`, asked on a miss only)."""
    loads = [r.outstanding for r in candidates]
    homes = [rendezvous_score(home, r.anchor) for r in candidates]
    best = max(cached)
    if prompt_tokens > 0 and best / prompt_tokens >= pool.policy.cache_threshold:
        close = [i for i, c in enumerate(cached) if c >= CLOSE * best]
        return min(close, key=lambda i: (loads[i], -cached[i], -homes[i]))
    low = min(loads)
    near = [i for i in range(len(candidates)) if loads[i] <= low + pool.policy.balance_abs_threshold]
    if lived is not None:
        beyond = lived()
        back = max(near, key=lambda i: (beyond[i], -loads[i], homes[i]))
        if beyond[back] > 0:
            return back
    if keys:
        sent = [candidates[i].index.matched(keys) for i in near]
        if max(sent) / len(keys) >= pool.policy.cache_threshold:
            return near[max(range(len(near)), key=lambda j: (sent[j], -loads[near[j]]))]
    return min(near, key=lambda i: (len(candidates[i].index), -homes[i]))


def choose(pool: Pool, index: KVIndex, prompt: PromptKeys, keys: list[int], exclude: set[str], now: float,
           max_outstanding: int = 0) -> tuple[Replica | None, int]:
    """The replica for this attempt and the prompt tokens it is believed to hold (None: no replica can
    take it). `keys`: the request's prefix keys (prefix.prefix_keys), for replicas without events and the
    rendezvous home; `prompt`: its token ids."""
    candidates = [r for r in pool.replicas if r.url not in exclude and r.health.available(now)]
    if not pool.policy.affinity or not any(r.url in index for r in candidates):
        replica, matched = pool.choose(keys, exclude, now, max_outstanding)
        return replica, (matched * len(prompt.token_ids) // len(keys) if keys and replica is not None else 0)
    if max_outstanding > 0:
        below = [r for r in candidates if r.outstanding < max_outstanding]
        candidates = below or candidates
    candidates = guarded(pool, candidates)
    cached = estimated_cached(index, candidates, prompt, keys, now)
    winner = pick(pool, candidates, cached, len(prompt.token_ids), keys, home_key(prompt, keys),
                  lambda: lived_beyond(index, candidates, prompt, now))
    return candidates[winner], int(cached[winner])
