"""What the gateway makes of a request before it relays it: serve's decoding rules for the body, its
values passed on exactly, `stream` only where a route streams, the headers it passes on as sent.

Regression tests of what tests/fuzz/test_gateway_routes.py found, each on its exact input.
"""

from __future__ import annotations

import json

import pytest

from tests.fuzz.fuzz_support import deep
from tests.gateway.gateway_support import DEPLOYMENT_ID
from tests.support import USER_HI


async def test_json_nested_past_the_limit_is_400_json_too_deep_not_a_500(replica, gateway, session):
    # Found: `{"a":[{"a":[...` 300 levels deep was decoded (orjson reads 1024) and failed to be encoded
    # again (orjson writes 254): a 500 with a traceback in the log. Now serve's rule: 400 past 128.
    r = await replica()
    gw = await gateway(r)
    for depth in (300, 129, 2000):
        async with session.post(gw.url(f"/v1/deployments/{DEPLOYMENT_ID}/chat/completions"), data=deep(depth),
                                headers={"Content-Type": "application/json"}) as resp:
            assert resp.status == 400, depth
            assert (await resp.json())["error"]["code"] == "json_too_deep"
    assert r.inference() == []


async def test_integers_past_64_bits_reach_the_replica_exactly(replica, gateway, session):
    # orjson read them as floats: the replica got 1.2345678901234568e+29 for 123456789012345678901234567890.
    r = await replica()
    gw = await gateway(r)
    body = ('{"messages":' + json.dumps(USER_HI) + ',"max_tokens":3,"tool_choice":"none","tools":[{"type":"function","function":'
            '{"name":"f","parameters":{"type":"object","properties":{"n":{"type":"integer","maximum":123456789012345678901234567890}}}}}]}')
    sent: list[bytes] = []
    original = gw.state.upstreams.send

    async def spy(url, path, data, headers, **kw):
        sent.append(data)
        return await original(url, path, data, headers, **kw)

    gw.state.upstreams.send = spy
    async with session.post(gw.url("/v1/chat/completions"), data=body, headers={"Content-Type": "application/json"}) as resp:
        assert resp.status == 200, await resp.text()
    assert b'"maximum":123456789012345678901234567890' in sent[0]


@pytest.mark.parametrize(
    ("route", "body"),
    [
        ("messages/count_tokens", {"messages": [{"role": "user", "content": "Hi"}], "stream": True}),
        ("embeddings", {"input": "Hi", "stream": True}),
        ("tokenize", {"prompt": "Hi", "stream": True}),
        ("detokenize", {"tokens": [72, 105], "stream": True}),
    ],
)
async def test_stream_true_on_a_route_that_does_not_stream_is_its_json(replica, gateway, session, route, body):
    # Found: `"stream": true` on count_tokens (and embeddings, tokenize, detokenize) made the gateway
    # relay the replica's JSON as SSE: a 200 text/event-stream carrying only an in-band
    # `upstream_unavailable` ("the replica ended the stream before its end"), and the healthy
    # replica counted as failed: a few such requests ejected it.
    r = await replica(runner="pooling") if route == "embeddings" else await replica()
    gw = await gateway(r)
    for _ in range(8):  # past `consecutive_errors`
        async with session.post(gw.url(f"/v1/deployments/{DEPLOYMENT_ID}/{route}"), json=body) as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("application/json")
            assert "error" not in await resp.json()
    (replica_,) = gw.pool().replicas
    assert replica_.health.routable(0.0) and replica_.health.breaker.name == "CLOSED"


@pytest.mark.parametrize("options", ["x", {"include_usage": 0}, {"include_usage": "yes"}, [True]])
async def test_stream_options_the_replica_refuses_are_not_replaced(replica, gateway, session, options):
    # Seen while writing the fuzzers: a `stream_options` that is not an object, or an `include_usage`
    # that is not a boolean, was replaced by {"include_usage": true}: the gateway answered 200
    # where serve (and the replica) answer 400.
    r = await replica()
    gw = await gateway(r)
    body = {"messages": USER_HI, "max_tokens": 3, "stream": True, "stream_options": options}
    async with session.post(gw.url("/v1/chat/completions"), json=body) as resp:
        got = await resp.json()
        assert resp.status == 400, got
    assert got["error"]["param"].startswith("stream_options")
    async with session.post(r.url("/v1/chat/completions"), json=body) as resp:  # the replica's own answer, the same
        assert resp.status == 400 and (await resp.json())["error"] == got["error"]


@pytest.mark.parametrize("value", ["\u0100", "\u20ac", "\u00e9", "2023-06-01"])
@pytest.mark.parametrize("route", ["chat/completions", "messages"])
async def test_passed_on_headers_reach_the_replica_as_sent(replica, gateway, session, route, value):
    # Found: `anthropic-version: \u0100` (any of anthropic-version, anthropic-beta, OpenAI-Beta past
    # Latin-1) was a 500: the decoded value could not be written upstream; "\u00e9" reached the
    # replica as another byte (0xE9, not UTF-8's C3 A9).
    r = await replica()
    gw = await gateway(r)
    body = {"model": "support-bot", "max_tokens": 3, "messages": USER_HI}
    for name in ("anthropic-version", "anthropic-beta", "OpenAI-Beta"):
        async with session.post(gw.url(f"/v1/{route}"), json=body, headers={name: value}) as resp:
            assert resp.status == 200, await resp.text()
        assert r.seen[-1].headers[name] == value
