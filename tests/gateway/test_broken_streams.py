"""A Responses and an Anthropic stream broken mid-way end the same through serve and through the gateway.

Through serve, the fake engine fails after two tokens: the encoder ends the
stream in-band. Through the gateway, the replica's connection breaks after
two tokens: a stub replica writes the start of serve's own stream of the
same request (with a keep-alive comment among its events, as a replica's
heartbeat puts one) and closes. Either way the events after the last text
delta are the API's ending of a broken stream (`apis/<api>/spec.py`):
Responses `error` then `response.failed` (the stream's own response, failed,
in OpenAI's words), numbered on from the events before; Anthropic one
`error`. Every event fits the SDK's own model and the API's life cycle.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from engine_adapter.fake import FakeScript
from tests.gateway.gateway_support import DEPLOYMENT, SERVED, SSE_HEAD, chunked
from tests.support.api_events import anthropic_order, check_anthropic, check_responses, responses_order
from tests.support.sse import named_events

TEXT = "one two three four five six"
HI = [{"role": "user", "content": "hi"}]
APIS: dict[str, tuple[str, dict[str, Any], str, list[str]]] = {
    "responses": ("/v1/responses", {"input": "hi"}, "response.output_text.delta", ["error", "response.failed"]),
    "anthropic": ("/v1/messages", {"max_tokens": 50, "messages": HI}, "content_block_delta", ["error"]),
}
Events = list[tuple[str, dict[str, Any]]]


async def _stream(session: aiohttp.ClientSession, base: str, path: str, body: dict[str, Any]) -> bytes:
    async with session.post(base + path, json={**body, "stream": True}) as r:
        assert r.status == 200
        return await r.read()


def _ending(events: Events, delta: str) -> Events:
    """The events after the last text delta (two came before it)."""
    deltas = [i for i, (name, _) in enumerate(events) if name == delta]
    assert len(deltas) == 2, [name for name, _ in events]
    return events[deltas[-1] + 1 :]


def _check(api: str, events: Events) -> None:
    if api == "responses":
        check_responses(events)  # also: the sequence numbers count 0, 1, 2, ... with no gap
        responses_order(events)
    else:
        check_anthropic(events)
        anthropic_order(events)


def _replica_start(raw: bytes, delta: bytes) -> bytes:
    """A clean stream's events up to its second text delta, a keep-alive comment after the first."""
    events = [e + b"\n\n" for e in raw.split(b"\n\n") if e]
    second = [i for i, e in enumerate(events) if e.startswith(b"event: " + delta)][1]
    start = events[: second + 1]
    return b"".join(start[:1] + [b": keepalive\n\n"] + start[1:])


@pytest.mark.parametrize("api", list(APIS))
async def test_a_stream_broken_mid_way_ends_the_same_through_serve_and_the_gateway(api, replica, gateway, stub, session):
    path, body, delta, ending = APIS[api]
    failing = await replica(FakeScript(text=TEXT, fail_after=2))
    served = named_events(await _stream(session, failing.base, path, {"model": SERVED, **body}))

    clean = await replica(FakeScript(text=TEXT))
    start = _replica_start(await _stream(session, clean.base, path, {"model": SERVED, **body}), delta.encode())

    async def breaking(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(SSE_HEAD + chunked(start))
        await writer.drain()  # and the connection closes, mid-stream

    relayed = named_events(await _stream(session, (await gateway((await stub(breaking)).base)).base, path, {"model": DEPLOYMENT, **body}))

    for events in (served, relayed):
        _check(api, events)
        assert [name for name, _ in _ending(events, delta)] == ending
    serve_end, gateway_end = _ending(served, delta), _ending(relayed, delta)
    assert set(serve_end[0][1]) == set(gateway_end[0][1])  # the error event's fields
    if api == "responses":
        for events, end in ((served, serve_end), (relayed, gateway_end)):
            failed = end[1][1]["response"]
            assert failed["id"] == events[0][1]["response"]["id"]  # the stream's own response
            assert (failed["status"], failed["error"]["code"]) == ("failed", "server_error")
        assert gateway_end[1][1]["response"]["model"] == DEPLOYMENT
    else:
        assert set(serve_end[0][1]["error"]) == set(gateway_end[0][1]["error"]) == {"type", "message"}
        assert gateway_end[0][1]["error"]["type"] == "overloaded_error"  # the replica is gone: a 503's type
