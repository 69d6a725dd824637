"""The managed deployment's config and its sans-IO life cycle, fed events with an injected clock."""

from __future__ import annotations

import random

import pytest

from streamproxy.gateway.balance import Pool
from streamproxy.gateway.config import ConfigError, Deployment, Launch, UpstreamPolicy, seconds
from streamproxy.gateway.config_file import split
from streamproxy.gateway.lifecycle import Lifecycle, Phase


def test_durations():
    assert [seconds(v) for v in (90, 1.5, "90", "90s", "15m", "2h", "0")] == [90, 1.5, 90, 90, 900, 7200, 0]
    with pytest.raises(ConfigError):
        seconds("soon")


def test_launch_config_parses_and_needs_exactly_one_of_upstreams_and_launch():
    config, rest = split(
        "port: 9000\nmax_resident: 2\ndeployments:\n"
        "  - {name: smol, id: dep-smol, launch: {model: fake, args: [--fake-ttft, '0.1'], idle_park_after: 15m, boot_guess: 5}}\n"
    )
    launch = config.deployments[0].launch
    assert launch is not None and launch.idle_seconds == 900 and launch.args == ["--fake-ttft", "0.1"] and launch.replicas == 1
    assert config.max_resident == 2 and rest == {"port": 9000}
    for bad in (
        "deployments:\n  - {name: a, id: b}\n",
        "deployments:\n  - {name: a, id: b, upstreams: ['http://x'], launch: {model: fake}}\n",
        "deployments:\n  - {name: a, id: b, launch: {model: fake, replicas: 0}}\n",
        "max_resident: 1\ndeployments:\n  - {name: a, id: b, launch: {model: fake, replicas: 2}}\n",
        "admin_key_env: STREAMPROXY_TEST_NO_SUCH_VAR\ndeployments:\n  - {name: a, id: b, launch: {model: fake}}\n",
    ):
        with pytest.raises(ConfigError):
            split(bad)


def life(**kw) -> Lifecycle:
    return Lifecycle(Launch(model="fake", idle_park_after=60, boot_guess=7, **kw), now=0.0)


def test_first_request_wakes_once_and_the_boot_is_timed():
    lc = life()
    assert lc.phase is Phase.PARKED and lc.retry_after() == 7
    assert lc.want(10.0) is True and lc.phase is Phase.WAKING
    assert lc.want(10.5) is False  # already waking: no second start
    assert not lc.serving
    lc.replica_up(12.5)
    assert lc.phase is Phase.READY and lc.serving and lc.last_boot == 2.5 and lc.retry_after() == 3 and lc.boots == 1


def test_idle_parking_waits_for_requests_in_flight_and_the_idle_time():
    lc = life()
    lc.want(0.0)
    lc.replica_up(1.0)
    lc.begin(2.0)
    assert not lc.park_due(1000.0)  # a request in flight
    lc.end(10.0)
    assert not lc.park_due(69.0) and lc.park_due(70.0)
    assert lc.park() and lc.phase is Phase.DRAINING
    assert lc.want(71.0) is False  # draining: the wake waits until parked
    lc.replica_exited(72.0, was_up=True, expected=True)
    lc.parked()
    assert lc.phase is Phase.PARKED and lc.parks == 1 and lc.up == 0
    assert lc.want(80.0) is True


def test_zero_idle_never_parks():
    lc = Lifecycle(Launch(model="fake", idle_park_after=0))
    lc.want(0.0)
    lc.replica_up(1.0)
    assert not lc.park_due(1e9)


def test_unexpected_exits_restart_with_backoff_then_fail():
    lc = life(restart_backoff=0.5)
    lc.want(0.0)
    lc.replica_up(1.0)
    assert lc.replica_exited(5.0, was_up=True, expected=False) == 0.5
    assert lc.phase is Phase.WAKING and lc.up == 0  # no replica left: requests are told to wait
    assert lc.replica_exited(6.0, was_up=False, expected=False) == 1.0  # the restart failed too
    assert lc.replica_exited(8.0, was_up=False, expected=False) is None
    assert lc.phase is Phase.FAILED and lc.restarts == 2
    assert lc.want(9.0) is False and lc.phase is Phase.FAILED  # requests do not revive it
    assert lc.want(9.0, admin=True) is True and lc.phase is Phase.WAKING and lc.failures == 0


def test_a_good_boot_resets_the_failure_count():
    lc = life()
    lc.want(0.0)
    lc.replica_up(1.0)
    for t in (2.0, 4.0, 6.0):
        assert lc.replica_exited(t, was_up=True, expected=False) == 1.0
        lc.replica_up(t + 1)
    assert lc.phase is Phase.READY and lc.last_boot == 1.0


def test_expected_exits_and_exits_while_parking_are_not_failures():
    lc = life()
    lc.want(0.0)
    lc.replica_up(1.0)
    assert lc.replica_exited(2.0, was_up=True, expected=True) is None and lc.failures == 0
    lc2 = life()
    lc2.want(0.0)
    lc2.replica_up(1.0)
    lc2.park()
    assert lc2.replica_exited(2.0, was_up=True, expected=False) is None and lc2.failures == 0


def test_pool_set_replicas_keeps_the_kept_ones_state():
    p = Pool(Deployment(name="d", id="dep-d", launch=Launch(model="fake")), UpstreamPolicy(), rng=random.Random(1))
    assert p.replicas == [] and p.choose([], set(), 0.0) == (None, 0)
    p.set_replicas(["http://127.0.0.1:9001/", "http://127.0.0.1:9002"])
    first = p.replicas[0]
    p.dispatched(first, [])
    p.set_replicas(["http://127.0.0.1:9001", "http://127.0.0.1:9003"])
    assert [r.url for r in p.replicas] == ["http://127.0.0.1:9001", "http://127.0.0.1:9003"]
    assert p.replicas[0] is first and first.outstanding == 1  # the kept replica keeps its load
    p.completed(first)  # a request finishing on it (or on a removed one) is fine
    p.set_replicas([])
    assert p.choose([], set(), 0.0) == (None, 0) and p.retry_after(0.0) == 1
