"""Choosing a replica (sans-IO): prefix keys, the index, affinity under load, health, limits."""

from __future__ import annotations

import random
import re

import pytest

from streamproxy.gateway.balance import Pool
from streamproxy.gateway.config import ConfigError, Deployment, UpstreamPolicy
from streamproxy.gateway.config_file import split
from streamproxy.gateway.health import Breaker, Health
from streamproxy.gateway.limits import KeyLimiter
from streamproxy.gateway.prefix import PrefixIndex, canonical, prefix_keys

SYSTEM = {"role": "system", "content": "You are the support bot of a company that sells boats. " * 40}


def chat(*turns: str, system: dict = SYSTEM, tools: list | None = None) -> dict:
    body: dict = {"model": "m", "messages": [system] + [{"role": "user", "content": t} for t in turns]}
    if tools:
        body["tools"] = tools
    return body


def pool(n: int = 3, **policy) -> Pool:
    urls = [f"http://127.0.0.1:{9000 + i}" for i in range(n)]
    return Pool(Deployment(name="d", id="dep-d", upstreams=urls), UpstreamPolicy(**policy), rng=random.Random(7))


# -- prefix keys ----------------------------------------------------------------------


def test_keys_chain_over_every_message_and_the_tools():
    a, b = prefix_keys(chat("hi"), 64), prefix_keys(chat("hi", "more"), 64)
    assert len(a) > 10 and b[: len(a) - 1] == a[:-1]  # the next turn shares every whole block before it
    other = prefix_keys(chat("hi", system={"role": "system", "content": "Another tenant. " * 100}), 64)
    assert other[0] != a[0]
    with_tools = prefix_keys(chat("hi", tools=[{"type": "function", "function": {"name": "f"}}]), 64)
    assert with_tools[0] != a[0]  # tools come first, as the chat template renders them


def test_canonical_reads_responses_and_anthropic_bodies():
    assert b"be brief" in canonical({"instructions": "be brief", "input": "hello"})
    assert b"sys" in canonical({"system": "sys", "messages": [{"role": "user", "content": "x"}]})
    assert canonical({"prompt": "text"}) == b'"text"'


def test_index_matches_leading_keys_is_bounded_and_forgets():
    index = PrefixIndex(capacity=4)
    index.insert([1, 2, 3])
    assert index.matched([1, 2, 9]) == 2 and index.matched([9, 1]) == 0
    index.insert([5, 6])
    assert len(index) == 4 and index.matched([1]) == 0  # least recently used out first
    index.forget_after([2, 3], 1)
    assert index.matched([2, 3]) == 1


# -- choice -------------------------------------------------------------------------


def test_the_same_prefix_goes_to_the_same_replica():
    p = pool()
    keys = prefix_keys(chat("q1"), p.policy.prefix_block_bytes)
    first, _ = p.choose(keys, set(), 0.0)
    assert first is not None
    p.dispatched(first, keys)
    p.completed(first)
    again_keys = prefix_keys(chat("q2"), p.policy.prefix_block_bytes)
    again, matched = p.choose(again_keys, set(), 0.0)
    assert again is first and matched >= len(again_keys) - 2


def test_a_hot_prefix_spreads_when_its_replica_is_busier_by_the_margin():
    p = pool(balance_abs_threshold=2)
    keys = prefix_keys(chat("q"), p.policy.prefix_block_bytes)
    home, _ = p.choose(keys, set(), 0.0)
    assert home is not None
    for _ in range(3):
        p.dispatched(home, keys)
    elsewhere, _ = p.choose(keys, set(), 0.0)
    assert elsewhere is not home


def test_under_flow_controls_bound_a_prefix_goes_past_its_full_home_to_a_replica_with_room():
    p = pool()
    keys = prefix_keys(chat("q"), p.policy.prefix_block_bytes)
    home, _ = p.choose(keys, set(), 0.0)
    assert home is not None
    for _ in range(4):  # within balance_abs_threshold (8) of the idle ones: affinity alone keeps it home
        p.dispatched(home, keys)
    assert p.choose(keys, set(), 0.0)[0] is home
    elsewhere, _ = p.choose(keys, set(), 0.0, max_outstanding=4)
    assert elsewhere is not None and elsewhere is not home
    for r in p.replicas:
        r.outstanding = 4
    assert p.choose(keys, set(), 0.0, max_outstanding=4)[0] is home  # all full: the choice as without the bound


def test_least_outstanding_without_affinity():
    p = pool(prefix_affinity=False)
    busy = p.replicas[0]
    busy.outstanding = 5
    p.replicas[1].outstanding = 5
    picks = {p.choose([], set(), 0.0)[0].url for _ in range(20)}  # type: ignore[union-attr]
    assert busy.url not in picks or len(picks) > 1
    assert p.replicas[2].url in picks


def test_excluded_and_unhealthy_replicas_are_never_chosen():
    p = pool()
    for r in p.replicas[1:]:
        r.health.probed_healthy = False
    assert p.choose([], {p.replicas[0].url}, 0.0) == (None, 0)
    assert p.retry_after(0.0) == 1  # the first replica is fine: only this request tried it
    p.replicas[0].health.probed_healthy = False
    assert p.choose([], set(), 0.0) == (None, 0)
    assert p.retry_after(0.0) == 5  # a probe interval


def test_observed_cache_forgets_what_the_replica_evicted():
    p = pool()
    keys = prefix_keys(chat("q"), p.policy.prefix_block_bytes)
    r = p.replicas[0]
    p.dispatched(r, keys)
    p.observed_cache(r, keys, matched=len(keys), prompt_tokens=1000, cached_tokens=0)
    assert r.index.matched(keys) == 0


# -- health -------------------------------------------------------------------------


def test_ejection_half_open_trial_and_longer_ejection():
    h = Health(UpstreamPolicy(consecutive_errors=2, base_ejection_time=10))
    assert not h.failed(0.0) and h.failed(0.0)
    assert h.breaker is Breaker.OPEN and not h.available(5.0)
    assert h.available(10.0) and h.breaker is Breaker.HALF_OPEN
    h.dispatched()
    assert not h.available(10.0)  # one trial at a time
    assert h.failed(11.0) and h.ejected_until == 31.0  # twice ejected: twice as long
    assert h.available(31.0)
    h.dispatched()
    h.succeeded()
    assert h.breaker is Breaker.CLOSED and h.available(31.0)


def test_the_failures_of_many_requests_at_once_are_one_ejection():
    """40 streams a replica broke at once (bench/failover.py saw 30, 60, 90, 120 s of ejection from one fault)."""
    h = Health(UpstreamPolicy(consecutive_errors=5, base_ejection_time=30))
    assert [h.failed(0.0) for _ in range(40)] == [False] * 4 + [True] + [False] * 35
    assert (h.ejections, h.ejected_until, h.errors) == (1, 30.0, 0)
    assert h.available(30.0) and h.breaker is Breaker.HALF_OPEN
    h.dispatched()
    assert h.failed(30.5) and (h.ejections, h.ejected_until) == (2, 90.5)  # the trial failed: out again, for longer


def test_probes_take_out_and_bring_back_and_a_good_probe_ends_an_ejection():
    h = Health(UpstreamPolicy(unhealthy_threshold=2, healthy_threshold=1, consecutive_errors=1))
    h.probed(False, 0.0)
    assert h.available(0.0)
    h.probed(False, 0.0)
    assert not h.available(0.0) and h.retry_after(0.0) == 5.0
    h.failed(0.0)
    h.probed(True, 1.0)
    assert h.available(1.0) and h.breaker is Breaker.CLOSED


# -- limits and config ----------------------------------------------------------------


def test_rpm_and_tpm_windows():
    limiter = KeyLimiter(rpm=2, tpm=100)
    assert limiter.admit(0.0) is None and limiter.admit(1.0) is None
    assert limiter.admit(2.0) == pytest.approx(58.0)
    assert limiter.admit(60.5) is None
    limiter.charge(61.0, 150)
    assert limiter.admit(62.0) == pytest.approx(59.0)
    assert limiter.admit(121.5) is None


def test_config_sections_and_errors(monkeypatch):
    monkeypatch.setenv("K1", "sk-1")
    text = """
port: 9000
deployments:
  - {name: a, id: dep-a, upstreams: [http://127.0.0.1:1]}
keys:
  - {id: k, key_env: K1, deployments: [a]}
"""
    config, rest = split(text)
    assert rest == {"port": 9000} and config.keys[0].secret() == "sk-1"
    assert config.deployments[0].upstream_model == "a"
    for bad, says in [
        ("deployments: []", "empty"),
        ("deployments: [{name: a, id: b, upstreams: [http://x]}, {name: b, id: c, upstreams: [http://x]}]", "'b' names two deployments"),
        ("deployments: [{name: a, id: a, upstreams: [http://x]}, {name: c, id: a, upstreams: [http://x]}]", "'a' names two deployments"),
        ("deployments: [a, b\nkeys: 1\n", "not valid YAML: line 2, column 5: expected ',' or ']', but got ':' "
         "(while parsing a flow sequence at line 1, column 14)"),
        ("deployments:\n  - name: a\n   id: b\n", "not valid YAML: line 3, column 4: expected <block end>, but found "
         "'<block mapping start>' (while parsing a block collection at line 2, column 3)"),
        ("deployments: []\nx: '\x00'\n",
         "not valid YAML: line 2, column 5: unacceptable character #x0000: special characters are not allowed"),
        ("deployments: [{name: a, id: b, upstreams: [ftp://x]}]", "http(s)"),
        ("deployments: [{name: a, id: b, upstreams: [http://x]}]\nkeys: [{id: k, key: s, deployments: [zz]}]", "no deployment named zz"),
        ("deployments: [{name: a, id: b, upstream: [http://x]}]", "unknown field"),
    ]:
        with pytest.raises(ConfigError, match=re.escape(says)):
            split(bad)
    # An id equal to its own name: one deployment, two equal names.
    config, _ = split("deployments: [{name: d0, id: d0, upstreams: [http://127.0.0.1:1]}]")
    assert [(d.name, d.id) for d in config.deployments] == [("d0", "d0")]


def test_a_prefix_has_the_same_first_key_and_home_in_every_process():
    """Two gateways are two processes with their own hash seeds: the rendezvous key and score must not use them."""
    import subprocess
    import sys

    script = (
        "from streamproxy.gateway.prefix import prefix_keys; from streamproxy.gateway.balance import rendezvous_score;"
        "from streamproxy.gateway.prefix import stable_hash;"
        "body = {'messages': [{'role': 'system', 'content': 'You are the support bot. ' * 40}]};"
        "k = prefix_keys(body, 256)[0];"
        "urls = [f'http://127.0.0.{i + 1}:8000' for i in range(8)];"
        "print(k, max(urls, key=lambda u: rendezvous_score(k, stable_hash(u.encode()))))"
    )
    answers = {
        subprocess.run([sys.executable, "-c", script], env={**__import__("os").environ, "PYTHONHASHSEED": seed},
                       capture_output=True, text=True, check=True).stdout
        for seed in ("1", "2")
    }
    assert len(answers) == 1


def test_a_new_prefix_goes_to_its_rendezvous_home_and_a_removed_replica_moves_only_its_own():
    p = pool(5)
    bodies = [chat("q", system={"role": "system", "content": f"Bot {i}. " + "Answer well. " * 40}) for i in range(40)]
    keys = [prefix_keys(b, p.policy.prefix_block_bytes) for b in bodies]
    homes = [p.choose(k, set(), 0.0)[0] for k in keys]
    assert len({h.url for h in homes}) == 5  # type: ignore[union-attr]
    fresh = pool(5)  # another gateway: no index, the same homes
    assert [fresh.choose(k, set(), 0.0)[0].url for k in keys] == [h.url for h in homes]  # type: ignore[union-attr]
    gone = homes[0].url  # type: ignore[union-attr]
    fresh.set_replicas([r.url for r in fresh.replicas if r.url != gone])
    moved = [fresh.choose(k, set(), 0.0)[0].url for k in keys]  # type: ignore[union-attr]
    assert [m for m, h in zip(moved, homes, strict=True) if h.url != gone] == [h.url for h in homes if h.url != gone]  # type: ignore[union-attr]
    without = pool(5, rendezvous=False)
    assert [without.choose(k, set(), 0.0)[0].url for k in keys] != [h.url for h in homes]  # type: ignore[union-attr]
