"""Flow control in the request path (scheduler.py, flowcontrol.py): a saturated deployment queues
per tenant (the key) and priority band, serves tenants fairly within a band and bands strictly,
answers 429 with Retry-After past its bounds (the lowest band shed first), passes `priority` on
only where the replicas schedule by it, and shows its queues in /v1/deployments and /metrics.

The replica is a stub that answers each request only when the test opens its gate, so what is in
flight and what waits is the test's to say; nothing is timed.
"""

from __future__ import annotations

import asyncio
import functools
import json
from typing import Any

import aiohttp

from harness.waiting import wait_until
from streamproxy.gateway import scheduler as scheduler_module
from tests.gateway.conftest import Gateway, StartGateway, Stub
from tests.gateway.gateway_support import DEPLOYMENT, DEPLOYMENT_ID, SERVED, error_body, fits, post

ANSWER = (b'{"id":"c","object":"chat.completion","created":0,"model":"' + SERVED.encode() + b'","choices":[],'
          b'"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}')
KEYS = [{"id": name, "key": f"sk-{name}"} for name in ("heavy", "light", "other")]


class Gates:
    """The stub's handler: each request waits for its own gate, in arrival order; the gateway's looks at
    its /metrics (after each health probe, with flow control on) find `waiting` requests of its own, or none."""

    def __init__(self) -> None:
        self.gates: list[asyncio.Event] = []
        self.stub: Stub | None = None
        self.waiting: int | None = None

    async def __call__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert self.stub is not None
        if self.stub.requests[-1][0].startswith("GET /metrics "):
            text = b"" if self.waiting is None else (
                b'# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{engine="0",model_name="m"} %d.0\n' % self.waiting)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n" % len(text) + text)
            await writer.drain()
            return
        gate = asyncio.Event()
        self.gates.append(gate)
        await gate.wait()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(ANSWER) + ANSWER)
        await writer.drain()


def said(s: Stub) -> list[str]:
    """What each request the stub received said, in order."""
    return [json.loads(body)["messages"][0]["content"] for line, _, body in s.requests if line.startswith("POST ")]


async def gated(stub: Any) -> tuple[Stub, Gates]:
    gates = Gates()
    s = gates.stub = await stub(gates)
    return s, gates


def posts(s: Stub) -> list[tuple[str, dict[str, str], bytes]]:
    return [r for r in s.requests if r[0].startswith("POST ")]


async def saturated(stub: Any, gateway: StartGateway, **flow: Any) -> tuple[Gateway, Stub, Gates]:
    s, gates = await gated(stub)
    gw = await gateway(deployments=[{"name": DEPLOYMENT, "id": DEPLOYMENT_ID, "served_model": SERVED, "upstreams": [s.base],
                                     "flow_control": {"max_concurrency": 1, **flow}}], keys=KEYS)
    return gw, s, gates


def send(session: aiohttp.ClientSession, gw: Gateway, tenant: str, text: str, headers: dict[str, str] | None = None,
         **extra: Any) -> asyncio.Task[Any]:
    body = {"model": DEPLOYMENT, "messages": [{"role": "user", "content": text}], **extra}
    return asyncio.ensure_future(post(session, gw.url("/v1/chat/completions"), body,
                                      **{"Authorization": f"Bearer sk-{tenant}", **(headers or {})}))


def waiting(gw: Gateway) -> int:
    flow = gw.state.schedulers[DEPLOYMENT].flow
    assert flow is not None
    return len(flow.queue)


async def queue_up(session: aiohttp.ClientSession, gw: Gateway, s: Stub, sends: list[tuple[str, str, dict[str, Any]]]) -> list[asyncio.Task[Any]]:
    """The first request in flight on the stub, the others queued, in this order."""
    tasks = []
    for i, (tenant, text, extra) in enumerate(sends):
        tasks.append(send(session, gw, tenant, text, **extra))
        if i == 0:
            assert await wait_until(lambda: len(posts(s)) == 1, 10.0)
        else:
            assert await wait_until(functools.partial(lambda n: waiting(gw) == n, i), 10.0), (i, waiting(gw))
    return tasks


async def drain(gw: Gateway, s: Stub, gates: Gates, n: int) -> None:
    """Answer the requests one at a time: each answer lets the next one in."""
    for i in range(n):
        assert await wait_until(functools.partial(lambda n: len(gates.gates) == n, i + 1), 10.0), said(s)
        gates.gates[i].set()


async def test_a_saturated_deployment_serves_tenants_fairly_not_first_come(stub, gateway, session) -> None:
    gw, s, gates = await saturated(stub, gateway)
    sends: list[tuple[str, str, dict[str, Any]]] = [("heavy", "heavy-1", {}), ("heavy", "heavy-2", {}), ("heavy", "heavy-3", {}), ("heavy", "heavy-4", {}),
             ("light", "light-1", {})]
    tasks = await queue_up(session, gw, s, sends)
    await drain(gw, s, gates, len(sends))
    results = await asyncio.gather(*tasks)
    assert [status for status, _, _ in results] == [200] * 5
    # First come, first served would be heavy-1..4 then light-1: the light tenant, lifted to the heavy one's
    # counter, goes first on the tie (it has fewer waiting), next after the one in flight.
    assert said(s) == ["heavy-1", "light-1", "heavy-2", "heavy-3", "heavy-4"]


async def test_priority_bands_are_strict(stub, gateway, session) -> None:
    gw, s, gates = await saturated(stub, gateway)
    sends: list[tuple[str, str, dict[str, Any]]] = [("other", "first", {}), ("heavy", "low-1", {"priority": 5}), ("heavy", "low-2", {"priority": 5}),
             ("light", "high-1", {"headers": {"X-Vllm-Priority": "0"}}), ("light", "high-2", {"priority": 0})]
    tasks = await queue_up(session, gw, s, sends)
    await drain(gw, s, gates, len(sends))
    assert [status for status, _, _ in await asyncio.gather(*tasks)] == [200] * 5
    assert said(s) == ["first", "high-1", "high-2", "low-1", "low-2"]
    # The replicas do not schedule by priority (the default): the body's `priority` is not sent on.
    assert all(b'"priority"' not in body for _, _, body in posts(s))


async def test_past_the_queue_bound_429_with_retry_after_and_the_lowest_band_goes_first(stub, gateway, session) -> None:
    gw, s, gates = await saturated(stub, gateway, max_queued=2)
    tasks = await queue_up(session, gw, s, [("other", "first", {}), ("heavy", "low", {"priority": 5}), ("light", "mid", {"priority": 1})])
    # The queue is full: a newcomer of a higher band displaces the lowest band's newest waiter ...
    high = send(session, gw, "other", "high", priority=0)
    status, headers, got = await tasks[1]
    assert status == 429
    assert headers["Retry-After"] == "5"  # (no dispatch seen yet to measure the rate by: 5 s, as fairq says)
    assert json.loads(got) == error_body(
        "deployment `support-bot` is saturated and its queue is full (priority 5); retry after 5 s", "rate_limit_error", "too_many_requests")
    # ... and one of the lowest band waiting now finds nobody below it: refused itself.
    status, headers, got = await send(session, gw, "heavy", "lower", priority=9)
    assert (status, headers["Retry-After"]) == (429, "5")
    assert json.loads(got)["error"]["message"] == (
        "deployment `support-bot` is saturated and its queue is full (priority 9); retry after 5 s")
    await drain(gw, s, gates, 3)
    assert [status for status, _, _ in await asyncio.gather(tasks[0], tasks[2], high)] == [200] * 3
    assert said(s) == ["first", "high", "mid"]


async def test_past_the_wait_bound_429_queue_timeout(stub, gateway, session) -> None:
    gw, s, gates = await saturated(stub, gateway, max_wait=0.05)
    first = send(session, gw, "other", "first")
    assert await wait_until(lambda: len(posts(s)) == 1, 10.0)
    status, headers, got = await send(session, gw, "heavy", "late")  # waits its bound (the queue's timer), then 429
    assert (status, headers["Retry-After"]) == (429, "1")
    body = json.loads(got)["error"]
    assert (body["type"], body["code"]) == ("rate_limit_error", "queue_timeout")
    assert body["message"].startswith("deployment `support-bot` is saturated: waited ")
    assert body["message"].endswith(" s for a replica (priority 0); retry after 1 s")
    gates_open = asyncio.ensure_future(drain(gw, s, gates, 1))
    assert (await first)[0] == 200
    await gates_open


async def test_the_band_goes_on_as_priority_where_the_replicas_schedule_by_it(stub, gateway, session) -> None:
    s, gates = await gated(stub)
    gw = await gateway(deployments=[{"name": DEPLOYMENT, "id": DEPLOYMENT_ID, "served_model": SERVED, "upstreams": [s.base],
                                     "flow_control": {"priority": 3, "scheduling_priority": True}}],
                       keys=[{"id": "vip", "key": "sk-vip", "priority": -1}, {"id": "plain", "key": "sk-plain"}])
    tasks = [asyncio.ensure_future(post(session, gw.url("/v1/chat/completions"),
                                        {"model": DEPLOYMENT, "messages": [{"role": "user", "content": "x"}], **extra}, **headers))
             for extra, headers in (({}, {"Authorization": "Bearer sk-vip"}), ({}, {"Authorization": "Bearer sk-plain"}),
                                    ({"priority": 7}, {"Authorization": "Bearer sk-plain"}),
                                    ({"priority": 7}, {"Authorization": "Bearer sk-plain", "X-Vllm-Priority": "2"}))]
    assert await wait_until(lambda: len(gates.gates) == 4, 10.0)  # (no flow control: all in flight at once)
    for gate in gates.gates:
        gate.set()
    assert [r[0] for r in await asyncio.gather(*tasks)] == [200] * 4
    # The key's default, the deployment's, the body's, the header's (over the body's), as the replica got them.
    head = b'{"model":"' + SERVED.encode() + b'","messages":[{"role":"user","content":"x"}]'
    assert sorted(body for _, _, body in posts(s)) == sorted([
        head + b',"priority":-1}', head + b',"priority":3}', head + b',"priority":7}', head + b',"priority":2}'])


async def test_a_priority_that_is_not_an_integer_is_400(stub, gateway, session) -> None:
    gw, s, _ = await saturated(stub, gateway)
    status, _, got = await post(session, gw.url("/v1/chat/completions"), {"model": DEPLOYMENT, "messages": [], "priority": "high"},
                                Authorization="Bearer sk-heavy")
    assert (status, json.loads(got)) == (400, error_body("'priority' must be an integer", "invalid_request_error", None, "priority"))
    status, _, got = await post(session, gw.url("/v1/chat/completions"), {"model": DEPLOYMENT, "messages": []},
                                Authorization="Bearer sk-heavy", **{"X-Vllm-Priority": "x1"})
    assert (status, json.loads(got)) == (400, error_body("X-Vllm-Priority must be an integer, not 'x1'", "invalid_request_error", None,
                                                         "priority"))
    assert posts(s) == []


async def test_deployments_and_metrics_show_the_queues_per_tenant_and_band(stub, gateway, session) -> None:
    gw, s, gates = await saturated(stub, gateway)
    sends: list[tuple[str, str, dict[str, Any]]] = [("other", "first", {}), ("heavy", "h1", {}), ("heavy", "h2", {}), ("light", "l1", {"priority": 2})]
    tasks = await queue_up(session, gw, s, sends)
    async with session.get(gw.url(f"/v1/deployments/{DEPLOYMENT_ID}"), headers={"Authorization": "Bearer sk-other"}) as resp:
        assert resp.status == 200
        described = await resp.json()
    assert described["flow_control"] == {"max_concurrency": 1, "limit": 1.0, "in_flight": 1, "waiting": 3,
                                         "queued": {"0": {"heavy": 2}, "2": {"light": 1}}}
    fits(f"/v1/deployments/{DEPLOYMENT_ID}", "get", 200, described)
    async with session.get(gw.url("/metrics")) as resp:
        text = await resp.text()
    assert f'streamproxy_gateway_flow_queued{{band="0",deployment="{DEPLOYMENT}",tenant="heavy"}} 2.0' in text
    assert f'streamproxy_gateway_flow_queued{{band="2",deployment="{DEPLOYMENT}",tenant="light"}} 1.0' in text
    assert f'streamproxy_gateway_flow_in_flight{{deployment="{DEPLOYMENT}"}} 1.0' in text
    await drain(gw, s, gates, 4)
    await asyncio.gather(*tasks)
    async with session.get(gw.url("/metrics")) as resp:
        text = await resp.text()
    assert f'streamproxy_gateway_flow_outcomes_total{{band="0",deployment="{DEPLOYMENT}",outcome="dispatched"}} 2.0' in text
    assert f'streamproxy_gateway_flow_in_flight{{deployment="{DEPLOYMENT}"}} 0.0' in text
    assert "streamproxy_gateway_flow_queued{" not in text


async def test_a_replica_reporting_its_own_queue_takes_no_more_until_it_drains(stub, gateway, session) -> None:
    s, gates = await gated(stub)
    gates.waiting = 9
    gw = await gateway(deployments=[{"name": DEPLOYMENT, "id": DEPLOYMENT_ID, "served_model": SERVED, "upstreams": [s.base],
                                     "flow_control": {"max_concurrency": 4}}], keys=KEYS,
                       upstream={"health_check_interval": 0.02})
    scheduler = gw.state.schedulers[DEPLOYMENT]
    assert await wait_until(lambda: scheduler.waiting.get(s.base) == 9, 10.0)
    task = send(session, gw, "heavy", "queued")
    assert await wait_until(lambda: waiting(gw) == 1, 10.0)  # 9 of its own waiting: none of ours (limit 0, not 4)
    assert scheduler.limit() == 0
    gates.waiting = 0
    assert await wait_until(lambda: len(gates.gates) == 1, 10.0)  # the next look lets it in
    assert scheduler.limit() == 4
    gates.gates[0].set()
    assert (await task)[0] == 200
    assert [line for line, _, _ in posts(s)] == ["POST /v1/chat/completions HTTP/1.1"]
    gates.waiting = None  # no such gauge: the bound alone
    assert await wait_until(lambda: s.base not in scheduler.waiting, 10.0)


async def test_a_held_back_replica_is_read_again_before_its_next_probe(stub, gateway, session, monkeypatch) -> None:
    monkeypatch.setattr(scheduler_module, "HELD_RELOOK", 0.05)
    s, gates = await gated(stub)
    gates.waiting = 9
    gw = await gateway(deployments=[{"name": DEPLOYMENT, "id": DEPLOYMENT_ID, "served_model": SERVED, "upstreams": [s.base],
                                     "flow_control": {"max_concurrency": 4}}], keys=KEYS,
                       upstream={"health_check_interval": 3600})  # one probe, at the start
    scheduler = gw.state.schedulers[DEPLOYMENT]
    assert await wait_until(lambda: scheduler.waiting.get(s.base) == 9, 10.0)
    task = send(session, gw, "heavy", "queued")
    assert await wait_until(lambda: waiting(gw) == 1, 10.0)
    assert await wait_until(lambda: sum(line.startswith("GET /metrics ") for line, _, _ in s.requests) > 2, 10.0)  # while held
    gates.waiting = 0  # its queue drained: the next read (every HELD_RELOOK, not the probe an hour away) lets ours in
    assert await wait_until(lambda: len(gates.gates) == 1, 10.0)
    assert scheduler.limit() == 4
    gates.gates[0].set()
    assert (await task)[0] == 200
    reads = [line for line, _, _ in s.requests if line.startswith("GET /metrics ")]
    await asyncio.sleep(6 * scheduler_module.HELD_RELOOK)  # not held now: no more reads until the next probe
    assert [line for line, _, _ in s.requests if line.startswith("GET /metrics ")] == reads
