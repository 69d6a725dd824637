"""Stream migration on `streamproxy serve` replicas: parser-shaped streams continued with `continue_token_ids`.

Two fake-engine serve replicas (the `replica` fixture) of the same scripted answer, with the parser
that shapes it (tests/support/continued.py: hermes tool calls, deepseek_r1 reasoning), behind the
gateway; in front of the first, a `stub` that relays the replica's stream (its headers and events,
one chunk each) and dies after its k-th event, for every k. The gateway continues on the second
replica, and the client reads the bytes of a run without the cut (created and tool-call ids, which
differ between any two answers, made equal).
"""

from __future__ import annotations

import re
from typing import Any

import aiohttp
import pytest

from tests.gateway.gateway_support import DEPLOYMENT, DEPLOYMENT_ID, SERVED, UPSTREAM, Dying, chat, deployment, sample
from tests.support.continued import CASES, same_calls, script

CHAT = "/v1/chat/completions"
CREATED = re.compile(rb'"created":\d+')


async def read(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> bytes:
    async with session.post(url, json=body, headers={"X-Request-Id": "cut-1"}) as r:
        assert r.status == 200
        return CREATED.sub(b'"created":0', same_calls(await r.read()))


@pytest.mark.parametrize("asks", ["", "usage", "ids"])
@pytest.mark.parametrize("case", list(CASES))
async def test_a_parsed_stream_cut_after_any_event_reads_as_the_unbroken_one(case, asks, replica, gateway, stub, session):
    _, settings, fields = CASES[case]
    a = await replica(script(case), **settings)
    b = await replica(script(case), **settings)
    dying = Dying(a.base)
    front = dying.stub = await stub(dying)
    body = chat(stream=True, max_tokens=100, **fields)
    usage = asks == "usage"
    if usage:
        body["stream_options"] = {"include_usage": True}
    if asks == "ids":  # the client's own: kept, on its chunks as serve puts them
        body["return_token_ids"] = True
    reference = await gateway(b, deployments=deployment(b.base), upstream=UPSTREAM)
    whole = await read(session, reference.url(CHAT), body)
    assert (b'"token_ids":[' in whole) == (asks == "ids") and b"error" not in whole and (b"tool_calls" in whole or b"reasoning" in whole)
    gw = await gateway(deployments=deployment(front.base, b.base), upstream=UPSTREAM)
    gw.in_order()
    assert await read(session, gw.url(CHAT), body) == whole  # relayed whole through the stub
    n = dying.events
    continued = sample("streamproxy_gateway_migrations_total", deployment=DEPLOYMENT, outcome="continued") or 0
    assert dying.bodies[-1]["return_token_ids"] is True  # the gateway asked the replica for the ids
    for k in range(n - 1):  # (after the last event, [DONE], the stream is whole)
        dying.cut = k
        got = await read(session, gw.url(CHAT), body)
        if usage and k == n - 2:  # the finish went out, serve's usage chunk did not: the gateway makes one
            assert got.split(b"\n\n")[:-3] == whole.split(b"\n\n")[:-3], k
            continue
        assert got == whole, (k, n)
    assert len(dying.bodies) == n  # every first attempt went to the dying replica: its whole run, and n - 1 cuts
    # Cut after the headers alone (k = 0) the request is sent again; after the finish chunk (the replica
    # is always asked for usage) the stream is whole but for its end; after any other event it is continued.
    assert sample("streamproxy_gateway_migrations_total", deployment=DEPLOYMENT, outcome="continued") == continued + n - 3


async def test_a_vllm_replica_s_tool_call_stream_is_still_refused_in_band(pair, gateway, session):
    """The token replicas are vLLM's: a stream of a request with tools is not continued there."""
    (a, b), breaks = await pair()
    deployments = [{"name": DEPLOYMENT, "id": DEPLOYMENT_ID, "served_model": SERVED, "upstreams": [a.base, b.base],
                    "migration": {"stream_idle_timeout": 0}}]
    gw = await gateway(deployments=deployments, upstream={"consecutive_errors": 100_000})
    body = chat(stream=True, max_tokens=6, tools=CASES["tool-calls"][2]["tools"])
    breaks.append(("close", 3))
    async with session.post(gw.url(CHAT), json=body) as r:
        raw = await r.read()
    assert b'"code":"upstream_unavailable"' in raw and raw.endswith(b"data: [DONE]\n\n")
    assert all(path == CHAT for r in (a, b) for path, _ in r.seen)  # no continuation was sent
