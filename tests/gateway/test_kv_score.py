"""gateway/kv_score.py: replicas scored by cached prefix against load (llm-d's precise prefix-cache scorers)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from streamproxy.gateway.balance import Pool
from streamproxy.gateway.config import Deployment, UpstreamPolicy
from streamproxy.gateway.kv_events import BlockStored
from streamproxy.gateway.kv_index import KVIndex, PromptKeys
from streamproxy.gateway.kv_score import KVWeights, choose, normalized, pick, scores
from streamproxy.gateway.prefix import prefix_keys

BS = 16
TOKENS = list(range(1000, 1000 + 160))  # 10 blocks
BODY = {"model": "m", "messages": [{"role": "user", "content": "a long question " * 40}]}


def pool(n: int = 3, seed: int = 7, **policy: Any) -> Pool:
    urls = [f"http://127.0.0.1:{9000 + i}" for i in range(n)]
    return Pool(Deployment(name="d", id="dep-d", upstreams=urls), UpstreamPolicy(**policy), rng=random.Random(seed))


def holds(index: KVIndex, url: str, blocks: int) -> None:
    index.add(url)
    if blocks:
        index.apply(url, [BlockStored(list(range(1, blocks + 1)), None, TOKENS[: blocks * BS], BS)])


def test_normalization_and_the_weighted_sum() -> None:
    assert normalized([0, 5, 10]) == [0.0, 0.5, 1.0]
    assert normalized([0, 5, 10], higher_is_better=False) == [1.0, 0.5, 0.0]
    assert normalized([3, 3]) == [1.0, 1.0]  # all equal: 1 for all, as llm-d
    assert scores([160, 0], [4, 0]) == [3.0, 2.0]  # the whole prefix, busier: 3 x 1 + 2 x 0 against 3 x 0 + 2 x 1
    assert scores([160, 0], [4, 0], KVWeights(prefix_weight=1.0, queue_weight=2.0)) == [1.0, 2.0]


def test_pick_prefers_the_longest_prefix_then_the_lighter_load_then_the_home() -> None:
    anchors = [11, 22, 33]
    assert pick([160, 80, 0], [0, 0, 0], anchors, first_key=5) == 0
    assert pick([160, 80, 0], [2, 0, 0], anchors, first_key=5) == 1  # half of it, idle: 1.5 + 2 beats 3 + 0
    assert pick([80, 80, 0], [2, 1, 0], anchors, first_key=5) == 1  # equal prefixes: the lighter
    first = pick([0, 0, 0], [0, 0, 0], anchors, first_key=5)
    assert all(pick([0, 0, 0], [0, 0, 0], anchors, first_key=5) == first for _ in range(3))  # the home: stable
    assert len({pick([0, 0, 0], [0, 0, 0], anchors, first_key=k) for k in range(40)}) == 3  # ... and spread


def test_the_replica_holding_the_prefix_gets_it() -> None:
    p, index = pool(), KVIndex()
    a, b, c = (r.url for r in p.replicas)
    holds(index, a, 2)
    holds(index, b, 8)
    holds(index, c, 0)
    replica, cached = choose(p, index, PromptKeys(TOKENS), prefix_keys(BODY, 256), set(), 0.0)
    assert replica is not None and replica.url == b and cached == 8 * BS


def test_load_outweighs_a_small_prefix_advantage() -> None:
    p, index = pool(), KVIndex()
    a, b, c = p.replicas
    holds(index, a.url, 9)
    holds(index, b.url, 8)
    holds(index, c.url, 0)
    a.outstanding, b.outstanding, c.outstanding = 6, 1, 6
    replica, _ = choose(p, index, PromptKeys(TOKENS), [], set(), 0.0)
    assert replica is b  # a: 3 + 0; b: 3 x 8/9 + 2 x 1 = 4.67; c: 0 + 0


def test_an_imbalanced_pool_keeps_todays_load_guard() -> None:
    p, index = pool(), KVIndex()
    a, b, c = p.replicas
    holds(index, a.url, 10)
    holds(index, b.url, 0)
    holds(index, c.url, 0)
    a.outstanding, b.outstanding, c.outstanding = 10, 1, 2  # min-max alone: a scores 3 against b's 2
    assert choose(p, index, PromptKeys(TOKENS), [], set(), 0.0)[0] is b  # 10 - 1 > 8 and 10 > 1.5 x 1
    a.outstanding = 9  # within balance_abs_threshold of the least loaded: the prefix wins
    assert choose(p, index, PromptKeys(TOKENS), [], set(), 0.0)[0] is a


def test_replicas_at_their_bound_are_passed_over() -> None:
    p, index = pool(), KVIndex()
    a, b, c = p.replicas
    holds(index, a.url, 10)
    holds(index, b.url, 0)
    holds(index, c.url, 0)
    a.outstanding, b.outstanding, c.outstanding = 4, 3, 4
    assert choose(p, index, PromptKeys(TOKENS), [], set(), 0.0, max_outstanding=4)[0] is b
    a.outstanding = b.outstanding = c.outstanding = 4  # all at it: the best of them
    assert choose(p, index, PromptKeys(TOKENS), [], set(), 0.0, max_outstanding=4)[0] is a


def test_no_replica_with_events_keeps_todays_affinity() -> None:
    keys = prefix_keys(BODY, 256)
    with_kv, today = pool(seed=3), pool(seed=3)
    for i in range(30):
        mine = choose(with_kv, KVIndex(), PromptKeys(TOKENS), keys[: 1 + i % 5], set(), float(i))[0]
        theirs = today.choose(keys[: 1 + i % 5], set(), float(i))[0]
        assert mine is not None and theirs is not None and mine.url == theirs.url
        with_kv.dispatched(mine, keys)
        today.dispatched(theirs, keys)


def test_a_replica_without_events_is_scored_by_the_approximate_index() -> None:
    p, index = pool(), KVIndex()
    a, b, c = p.replicas
    keys = prefix_keys(BODY, 256)
    holds(index, a.url, 2)  # a publishes events: 2 of 10 blocks
    holds(index, c.url, 0)
    b.index.insert(keys)  # b does not: today's index believes it holds the whole prefix
    replica, cached = choose(p, index, PromptKeys(TOKENS), keys, set(), 0.0)
    assert replica is b and cached == len(TOKENS)


@pytest.mark.parametrize("policy", [{"policy": "least_outstanding"}, {"prefix_affinity": False}])
def test_without_prefix_affinity_the_choice_is_todays(policy: dict[str, Any]) -> None:
    p, index = pool(3, 7, **policy), KVIndex()
    for r in p.replicas:
        holds(index, r.url, 0)
    holds(index, p.replicas[0].url, 10)
    p.replicas[0].outstanding = 5
    chosen = [choose(p, index, PromptKeys(TOKENS), [], set(), 0.0)[0] for _ in range(20)]
    assert p.replicas[0] not in chosen  # power of two choices: the busy one loses every draw it is in


def test_excluded_and_ejected_replicas_are_not_candidates() -> None:
    p, index = pool(), KVIndex()
    a, b, c = p.replicas
    for r, blocks in ((a, 10), (b, 5), (c, 0)):
        holds(index, r.url, blocks)
    for _ in range(5):
        a.health.failed(0.0)  # ejected
    assert choose(p, index, PromptKeys(TOKENS), [], set(), 1.0)[0] is b
    assert choose(p, index, PromptKeys(TOKENS), [], {b.url}, 1.0)[0] is c
    assert choose(p, index, PromptKeys(TOKENS), [], {b.url, c.url}, 1.0) == (None, 0)
