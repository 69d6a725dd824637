"""gateway/kv_score.py: today's cache-aware rule with each replica's cached prefix from its KV events."""

from __future__ import annotations

import random
from typing import Any

import pytest

from streamproxy.gateway.balance import Pool, rendezvous_score
from streamproxy.gateway.config import Deployment, UpstreamPolicy
from streamproxy.gateway.kv_events import BlockRemoved, BlockStored
from streamproxy.gateway.kv_index import KVIndex, PromptKeys
from streamproxy.gateway.kv_score import choose, home_key
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


def evicts(index: KVIndex, url: str, down_to: int, blocks: int = 10) -> None:
    """`url` frees its blocks tail first (as vLLM does) down to `down_to` of them."""
    index.apply(url, [BlockRemoved(list(range(blocks, down_to, -1)))])


def home_of(p: Pool, keys: list[int]) -> str:
    return max(p.replicas, key=lambda r: rendezvous_score(home_key(PromptKeys(TOKENS), keys), r.anchor)).url


def test_a_header_block_every_replica_but_one_holds_decides_nothing() -> None:
    # The first run's failure: the block a chat template's header (and a shared preamble) fills was cached on
    # the replicas that had served anything, not yet on the third; min-max normalization made those 16 tokens
    # worth the whole prefix score, so every new tenant piled onto the replicas holding them.
    keys = prefix_keys(BODY, 256)
    for seed in range(6):
        p, index = pool(seed=seed), KVIndex()
        home = home_of(p, keys)
        for r in p.replicas:
            holds(index, r.url, 0 if r.url == home else 1)
        replica, cached = choose(p, index, PromptKeys(TOKENS), keys, set(), 0.0)
        assert replica is not None and replica.url == home and cached == 0


def test_a_prefix_held_nowhere_goes_home_whatever_the_loads_within_the_guard() -> None:
    # Min-max on loads sent a prefix evicted everywhere to whichever replica was idlest that moment:
    # tenants wandered over every replica's cache. It goes to its home, as today's affinity sends it.
    keys = prefix_keys(BODY, 256)
    p, index = pool(), KVIndex()
    home = next(r for r in p.replicas if r.url == home_of(p, keys))
    for r in p.replicas:
        holds(index, r.url, 1)
        r.outstanding = 2
    home.outstanding = 2 + 8  # (balance_abs_threshold: 8)
    assert choose(p, index, PromptKeys(TOKENS), keys, set(), 0.0)[0] is home
    home.outstanding = 2 + 9  # past it: another
    assert choose(p, index, PromptKeys(TOKENS), keys, set(), 0.0)[0] is not home


def test_a_new_prefix_goes_to_the_smallest_tree_and_an_evicted_one_back_where_it_was_sent() -> None:
    keys = prefix_keys(BODY, 256)
    p, index = pool(), KVIndex()
    a, b, c = p.replicas
    for r in p.replicas:
        holds(index, r.url, 1)
    a.index.insert(list(range(50)))  # other tenants' prefixes sent to a and c
    c.index.insert(list(range(100, 130)))
    assert choose(p, index, PromptKeys(TOKENS), keys, set(), 0.0)[0] is b
    c.index.insert(keys)  # sent to c before (its blocks since evicted there: the events hold none)
    assert choose(p, index, PromptKeys(TOKENS), keys, set(), 0.0)[0] is c


def test_the_replica_holding_the_prefix_gets_it() -> None:
    p, index = pool(), KVIndex()
    a, b, c = (r.url for r in p.replicas)
    holds(index, a, 2)
    holds(index, b, 8)
    holds(index, c, 0)
    replica, cached = choose(p, index, PromptKeys(TOKENS), prefix_keys(BODY, 256), set(), 0.0)
    assert replica is not None and replica.url == b and cached == 8 * BS


def test_load_outweighs_a_small_prefix_advantage_not_a_large_one() -> None:
    p, index = pool(), KVIndex()
    a, b, c = p.replicas
    holds(index, a.url, 10)
    holds(index, b.url, 9)  # within CLOSE (0.9) of a's
    holds(index, c.url, 0)
    a.outstanding, b.outstanding, c.outstanding = 6, 1, 0
    assert choose(p, index, PromptKeys(TOKENS), [], set(), 0.0)[0] is b
    index.reset(b.url)
    holds(index, b.url, 8)
    assert choose(p, index, PromptKeys(TOKENS), [], set(), 0.0)[0] is a  # (6 - 0 is within the guard)


def test_an_imbalanced_pool_keeps_todays_load_guard() -> None:
    p, index = pool(), KVIndex()
    a, b, c = p.replicas
    holds(index, a.url, 10)
    holds(index, b.url, 0)
    holds(index, c.url, 0)
    a.outstanding, b.outstanding, c.outstanding = 10, 1, 2
    assert choose(p, index, PromptKeys(TOKENS), [], set(), 0.0)[0] in (b, c)  # 10 - 1 > 8 and 10 > 1.5 x 1
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


def test_two_gateways_fed_the_same_events_send_an_evicted_prefix_back_where_it_lived() -> None:
    # Two gateways sharing nothing: one sent the tenant to b, whose cache then evicted all but the header
    # block every replica holds; the other never sent it, and by what it alone sent (smallest tree) would
    # place it on another replica: one tenant twice. Both go by the events' traces instead.
    keys = prefix_keys(BODY, 256)
    first, second = pool(seed=1), pool(seed=2)
    indexes = KVIndex(), KVIndex()
    for index in indexes:  # the same events into each
        for url in ("http://127.0.0.1:9000", "http://127.0.0.1:9002"):
            holds(index, url, 1)
        holds(index, "http://127.0.0.1:9001", 10)
        evicts(index, "http://127.0.0.1:9001", 1)
    first.replicas[1].index.insert(keys)  # the first gateway sent it to b
    second.replicas[1].index.insert(list(range(50)))  # the second sent other prefixes there: b's tree the biggest
    assert min(second.replicas, key=lambda r: len(r.index)) is not second.replicas[1]
    for p, index in zip((first, second), indexes):
        replica, cached = choose(p, index, PromptKeys(TOKENS), keys, set(), 0.0)
        assert replica is p.replicas[1] and cached == BS  # (it holds the header block only)


def evicted_on_b(left: int) -> tuple[list[int], Pool, KVIndex]:
    """Every replica holds the header block; b held the prompt's first 10 blocks and has `left` of them."""
    p, index = pool(), KVIndex()
    for r in p.replicas:
        holds(index, r.url, 1)
    holds(index, p.replicas[1].url, 10)
    evicts(index, p.replicas[1].url, left)
    return prefix_keys(BODY, 256), p, index


def test_a_head_below_the_cache_threshold_beyond_the_shared_header_decides_a_miss() -> None:
    # vLLM frees a request's blocks tail first: the tenant's head outlives its tail.
    keys, p, index = evicted_on_b(2)  # 2 of 10 blocks left: below cache_threshold (0.3)
    a, b, c = p.replicas
    b.index.insert(list(range(50)))  # and by this gateway's sends alone the biggest tree
    replica, cached = choose(p, index, PromptKeys(TOKENS), keys, set(), 0.0)
    assert replica is b and cached == 2 * BS


def test_where_the_events_say_it_lived_outweighs_where_this_gateway_last_sent_it() -> None:
    keys, p, index = evicted_on_b(1)
    a, b, c = p.replicas
    c.index.insert(keys)  # this gateway sent it to c long ago; another gateway's request moved it to b since
    assert choose(p, index, PromptKeys(TOKENS), keys, set(), 0.0)[0] is b
    evicts(index, b.url, 0, blocks=1)  # b lost even the header: its trace still reaches further than any
    assert choose(p, index, PromptKeys(TOKENS), keys, set(), 0.0)[0] is b
    index.drop(b.url)  # b is gone: nothing of it (traces neither) decides; this gateway's memory does
    assert choose(p, index, PromptKeys(TOKENS), keys, set(), 0.0)[0] is c


def test_where_it_lived_keeps_the_load_guard() -> None:
    keys, p, index = evicted_on_b(1)
    a, b, c = p.replicas
    a.index.insert(list(range(50)))
    b.outstanding = 8  # within balance_abs_threshold of the least loaded
    assert choose(p, index, PromptKeys(TOKENS), keys, set(), 0.0)[0] is b
    b.outstanding = 9  # past it: the smallest tree of the others
    assert choose(p, index, PromptKeys(TOKENS), keys, set(), 0.0)[0] is c
