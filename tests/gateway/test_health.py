"""Replica health: consecutive failed requests eject a replica (its breaker open in
`GET /v1/deployments` and in `streamproxy_gateway_breaker_state`), a good probe brings it
back; probes fail a replica that is down (and the gateway's /health says so); probes are
`GET /health` and nothing else, with the replicas' own key when they have one."""

from __future__ import annotations

import json

from engine_adapter.fake import FakeScript
from tests.gateway.gateway_support import DEPLOYMENT, SERVED, chat, error_body, post, sample
from tests.support import wait_until

EJECT_FOR_LONG = {"consecutive_errors": 2, "base_ejection_time": 200}  # only a probe can end this ejection
BOUND = 10.0


async def replicas(session, gw) -> list[dict]:
    async with session.get(gw.url(f"/v1/deployments/{DEPLOYMENT}")) as resp:
        assert resp.status == 200
        return (await resp.json())["replicas"]


async def breaker(session, gw, url: str) -> float:
    """The replica's `streamproxy_gateway_breaker_state`, as the gateway's /metrics says it."""
    async with session.get(gw.url("/metrics")) as resp:
        text = await resp.text()
    series = f'streamproxy_gateway_breaker_state{{deployment="{DEPLOYMENT}",upstream="{url}"}} '
    [value] = [line[len(series):] for line in text.splitlines() if line.startswith(series)]
    return float(value)


async def test_consecutive_failures_eject_a_replica(replica, gateway, session, probe_rounds):
    r = await replica(FakeScript(text=" word", fail_after=0))  # every request fails: 500 engine_error
    gw = await gateway(r, upstream={**EJECT_FOR_LONG, "health_check_interval": 3600})
    assert await wait_until(lambda: probe_rounds.done == 1, BOUND)  # the start-up probe is over (it found it healthy)
    for _ in range(2):
        status, _, got = await post(session, gw.url("/v1/chat/completions"), chat())
        assert status == 500 and json.loads(got)["error"]["code"] == "engine_error"  # the replica's own answer
    [state] = await replicas(session, gw)
    assert (state["url"], state["breaker"], state["available"], state["ejections"]) == (r.base, "open", False, 1)
    assert await breaker(session, gw, r.base) == 1
    # Ejected: the next request does not reach it, and says for how long.
    status, headers, got = await post(session, gw.url("/v1/chat/completions"), chat())
    assert status == 503 and 190 <= int(headers["Retry-After"]) <= 200
    assert json.loads(got) == error_body(
        f"no replica of deployment `{DEPLOYMENT}` can take the request now; retry shortly", "service_unavailable", "upstream_unavailable"
    )
    assert len(r.inference()) == 2


async def test_an_ejected_replica_is_back_once_a_probe_finds_it_healthy(replica, gateway, session, probe_rounds):
    r = await replica()
    # (A probe caught by the stop may hang until its timeout: a short one keeps the test short.)
    gw = await gateway(r, upstream={**EJECT_FOR_LONG, "health_check_interval": 0.1, "health_check_timeout": 0.5, "unhealthy_threshold": 1000})
    await r.stop()  # connections refused from now on
    for _ in range(2):
        status, _, _ = await post(session, gw.url("/v1/chat/completions"), chat())
        assert status == 503
    [state] = await replicas(session, gw)
    assert (state["breaker"], state["available"]) == ("open", False)
    assert await breaker(session, gw, r.base) == 1
    rounds = probe_rounds.done
    assert await wait_until(lambda: probe_rounds.done >= rounds + 2, BOUND)  # failed probes do not bring it back
    assert (await replicas(session, gw))[0]["breaker"] == "open"
    await r.restart()  # the same port
    assert await wait_until(lambda: gw.pool().replicas[0].health.routable(0.0), BOUND)
    [state] = await replicas(session, gw)
    assert (state["breaker"], state["available"], state["healthy"]) == ("closed", True, True)
    assert await breaker(session, gw, r.base) == 0
    status, _, _ = await post(session, gw.url("/v1/chat/completions"), chat())
    assert status == 200 and len(r.inference()) == 1


async def test_probes_take_a_replica_that_is_down_out_of_rotation(replica, gateway, session):
    up, down = await replica(), await replica()
    gw = await gateway(up, down, upstream={"health_check_interval": 0.05, "unhealthy_threshold": 2})
    await down.stop()
    assert await wait_until(lambda: not gw.pool().replicas[1].health.probed_healthy, BOUND)
    assert sample("streamproxy_gateway_upstream_healthy", deployment=DEPLOYMENT, upstream=down.base) == 0
    states = {s["url"]: s for s in await replicas(session, gw)}
    assert (states[down.base]["healthy"], states[down.base]["available"]) == (False, False)
    assert (states[up.base]["healthy"], states[up.base]["available"]) == (True, True)
    # Requests go to the healthy one only, without trying the other.
    for _ in range(4):
        status, _, _ = await post(session, gw.url("/v1/chat/completions"), chat())
        assert status == 200
    assert len(up.inference()) == 4 and gw.pool().replicas[1].requests == 0
    await up.stop()
    assert await wait_until(lambda: not gw.pool().replicas[0].health.probed_healthy, BOUND)
    async with session.get(gw.url("/health")) as resp:
        assert resp.status == 503
        assert await resp.json() == {"status": "degraded", "unavailable": [DEPLOYMENT]}


async def test_probes_are_get_health_only(replica, gateway, probe_rounds):
    r = await replica()
    await gateway(r, upstream={"health_check_interval": 0.02})
    assert await wait_until(lambda: probe_rounds.done >= 5, BOUND)
    assert len(r.seen) >= 5
    assert {(s.method, s.path) for s in r.seen} == {("GET", "/health")}
    assert r.engine.submitted == [] and r.inference() == []


async def test_the_replicas_own_key_goes_with_requests_and_probes(replica, gateway, session, probe_rounds, monkeypatch):
    monkeypatch.setenv("REPLICA_KEY", "sk-replica-77")
    r = await replica(api_key=["sk-replica-77"], health_requires_api_key=True)
    gw = await gateway(deployments=[
        {"name": DEPLOYMENT, "id": "dep-k", "served_model": SERVED, "upstreams": [r.base], "upstream_key_env": "REPLICA_KEY"},
    ], upstream={"health_check_interval": 0.05})
    assert await wait_until(lambda: probe_rounds.done >= 2, BOUND)
    assert gw.pool().replicas[0].health.probed_healthy  # the probes got in
    status, _, _ = await post(session, gw.url("/v1/chat/completions"), chat())
    assert status == 200
    assert {s.headers.get("Authorization") for s in r.seen} == {"Bearer sk-replica-77"}
