"""The gateway's `upstream.policy`: prefix (default), least_outstanding, round_robin."""

from __future__ import annotations

import random

import pytest

from streamproxy.gateway.balance import Pool, Replica
from streamproxy.gateway.config import ConfigError
from streamproxy.gateway.config_file import split

URLS = ["http://127.0.0.1:9001", "http://127.0.0.1:9002", "http://127.0.0.1:9003"]


def pool(upstream: str = "") -> Pool:
    text = f"deployments: [{{name: m, id: d, upstreams: [{', '.join(URLS)}]}}]\n{upstream}"
    config, _ = split(text)
    return Pool(config.deployments[0], config.upstream, random.Random(1))


def url_of(replica: Replica | None) -> str:
    assert replica is not None
    return replica.url


def test_default_policy_is_prefix_affinity() -> None:
    p = pool()
    assert p.policy.policy == "prefix" and p.policy.affinity
    keys = [11, 22, 33]
    first, _ = p.choose(keys, set(), 0.0)
    assert first is not None
    p.dispatched(first, keys)
    p.completed(first)
    for _ in range(5):  # the same prefix keeps going where it went
        again, matched = p.choose(keys, set(), 0.0)
        assert again is first and matched == 3


def test_round_robin_takes_the_replicas_in_turn_and_ignores_prefix_and_load() -> None:
    p = pool("upstream: {policy: round_robin}")
    assert not p.policy.affinity
    keys = [11, 22, 33]
    chosen = []
    for _ in range(6):
        r, matched = p.choose(keys, set(), 0.0)
        assert r is not None
        p.dispatched(r, keys)  # never completed: loads grow, round robin does not care
        chosen.append(r.url)
        assert matched == 0
    assert chosen == URLS + URLS
    assert all(len(r.index) == 0 for r in p.replicas)  # no prefix index kept


def test_round_robin_skips_excluded_replicas() -> None:
    p = pool("upstream: {policy: round_robin}")
    picks = [url_of(p.choose([], {URLS[1]}, 0.0)[0]) for _ in range(4)]
    assert URLS[1] not in picks and set(picks) == {URLS[0], URLS[2]}


def test_least_outstanding_has_no_affinity() -> None:
    p = pool("upstream: {policy: least_outstanding}")
    assert not p.policy.affinity
    busy = p.replicas[0]
    busy.outstanding = 5
    for _ in range(20):  # power of two choices: two distinct draws, so the busiest never wins
        r, matched = p.choose([1, 2], set(), 0.0)
        assert matched == 0 and r is not busy


def test_unknown_policy_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        pool("upstream: {policy: random}")
