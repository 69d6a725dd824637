"""Choosing a replica by the prompt prefix it has cached, weighed against its load.

llm-d's precise prefix-cache scheduling (its inference scheduler's
`precise-prefix-cache-scorer` and `queue-scorer`, summed with weights and
picked by `max-score-picker`): over the candidate replicas, each scorer's raw
value is min-max normalized to [0, 1] (all equal: 1 for all, as llm-d does),
  prefix = (cached - min) / (max - min)     cached: the prompt's leading tokens the replica holds
  queue  = (max - load) / (max - min)       load: its outstanding requests (counted by the gateway)
  score  = prefix_weight * prefix + queue_weight * queue
with llm-d's weights of its precise prefix-cache profile, 3 and 2 (its
`kv-cache-utilization-scorer`, also 2 there, needs each replica's
`vllm:kv_cache_usage_perc`, which the gateway does not read yet). The
highest score wins; on a tie, fewer outstanding requests, then the prefix's
rendezvous home (`balance.rendezvous_score` of the request's first prefix
key and the replica's URL: the same in every gateway), so a prefix no
replica holds yet gets the home today's affinity gives it. Replicas at
`max_outstanding` (when given) are passed over while another is below it,
and today's load guard applies (`guarded`: SGLang's imbalance test): min-max
normalization maps any spread of loads onto [0, 1], so without it a cached
prefix would win against a replica at any load.

A replica that publishes KV events is scored by the `KVIndex`; one that does
not, by today's approximate index (the share of the request's prefix keys it
is believed to hold, times the prompt's tokens). When no candidate publishes
events, or the pool's policy has no prefix affinity, the choice is today's
(`Pool.choose`). Pure functions, sans-IO.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from streamproxy.gateway.balance import Pool, Replica, rendezvous_score
from streamproxy.gateway.kv_index import KVIndex, PromptKeys


@dataclass(frozen=True)
class KVWeights:
    prefix_weight: float = 3.0  # llm-d: precise-prefix-cache-scorer
    queue_weight: float = 2.0  # llm-d: queue-scorer


def normalized(values: Sequence[float], *, higher_is_better: bool = True) -> list[float]:
    """llm-d's min-max normalization: each value in [0, 1] across the candidates (all equal: 1)."""
    low, high = min(values), max(values)
    if high == low:
        return [1.0] * len(values)
    span = high - low
    if higher_is_better:
        return [(v - low) / span for v in values]
    return [(high - v) / span for v in values]


def scores(cached: Sequence[float], loads: Sequence[int], weights: KVWeights = KVWeights()) -> list[float]:
    """Each candidate's weighted score: its cached prefix against its outstanding requests."""
    prefix = normalized(cached)
    queue = normalized(loads, higher_is_better=False)
    return [weights.prefix_weight * p + weights.queue_weight * q for p, q in zip(prefix, queue)]


def pick(cached: Sequence[float], loads: Sequence[int], anchors: Sequence[int], first_key: int | None,
         weights: KVWeights = KVWeights()) -> int:
    """The index of the winner: the highest score, then fewer outstanding, then the rendezvous home."""
    total = scores(cached, loads, weights)
    home = [rendezvous_score(first_key, a) for a in anchors] if first_key is not None else [0] * len(anchors)
    return max(range(len(total)), key=lambda i: (total[i], -loads[i], home[i]))


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
    `balance_abs_threshold` of the least loaded compete (min-max normalization alone would let a
    cached prefix win at any load)."""
    if not candidates:
        return candidates
    policy = pool.policy
    loads = [r.outstanding for r in candidates]
    low, high = min(loads), max(loads)
    if high - low > policy.balance_abs_threshold and high > policy.balance_rel_threshold * low:
        return [r for r in candidates if r.outstanding <= low + policy.balance_abs_threshold]
    return candidates


def choose(pool: Pool, index: KVIndex, prompt: PromptKeys, keys: list[int], exclude: set[str], now: float,
           weights: KVWeights = KVWeights(), max_outstanding: int = 0) -> tuple[Replica | None, int]:
    """The replica for this attempt and the prompt tokens it is believed to hold (None: no replica can
    take it). `keys`: the request's prefix keys (prefix.prefix_keys), for replicas without events and the
    rendezvous home; `prompt`: its token ids."""
    candidates = [r for r in pool.replicas if r.url not in exclude and r.health.available(now)]
    if not pool.policy.affinity or not any(r.url in index for r in candidates):
        replica, matched = pool.choose(keys, exclude, now)
        return replica, (matched * len(prompt.token_ids) // len(keys) if keys and replica is not None else 0)
    if max_outstanding > 0:
        below = [r for r in candidates if r.outstanding < max_outstanding]
        candidates = below or candidates
    candidates = guarded(pool, candidates)
    if len(candidates) == 1:
        only = candidates[0]
        return only, int(estimated_cached(index, candidates, prompt, keys, now)[0])
    cached = estimated_cached(index, candidates, prompt, keys, now)
    winner = pick(cached, [r.outstanding for r in candidates], [r.anchor for r in candidates],
                  keys[0] if keys else None, weights)
    return candidates[winner], int(cached[winner])
