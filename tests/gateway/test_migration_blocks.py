"""Stream migration of Responses and Anthropic Messages streams on `streamproxy serve` replicas.

As tests/gateway/test_migration_serve.py for chat: two fake-engine serve replicas of the same scripted
answer (plain text, hermes tool calls, deepseek_r1 reasoning: tests/support/block_cases.py), the first
behind a stub that relays its stream one event a chunk and dies after its k-th event, for every k. The
client reads the unbroken run's bytes each time (Responses' `created_at`, the one thing timed, made
equal; the ids follow from the request's id, the same on every attempt): cut after the headers alone
the request is sent again, after the last event the stream is whole, after any other it is continued
(`continue_token_ids`), its Responses events numbered on. A vLLM replica's streams are not continued.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson
import pytest

from engine_adapter.fake import FakeScript
from harness.waiting import wait_until
from streamproxy.ledger.memory import MemoryStore
from streamproxy.ledger.writer import Ledger
from tests.gateway.conftest import refused_url
from tests.gateway.gateway_support import DEPLOYMENT, UPSTREAM, Dying, deployment, line_for, sample
from tests.support.block_cases import BODIES, CASES_BY_API, MESSAGES, RESPONSES, events, normalized, script

CASES = [(api, case) for api, cases in CASES_BY_API.items() for case in cases]


async def read(session: aiohttp.ClientSession, url: str, body: dict[str, Any], request_id: str = "cut-1") -> bytes:
    async with session.post(url, json=body, headers={"X-Request-Id": request_id}) as r:
        assert r.status == 200
        return normalized(await r.read())


def migrations(outcome: str) -> float:
    return sample("streamproxy_gateway_migrations_total", deployment=DEPLOYMENT, outcome=outcome) or 0


@pytest.mark.parametrize("asks", ["", "ids"])
@pytest.mark.parametrize(("api", "case"), CASES)
async def test_a_stream_cut_after_any_event_reads_as_the_unbroken_one(api, case, asks, replica, gateway, stub, session):
    _, settings, fields = CASES_BY_API[api][case]
    a = await replica(script(api, case), **settings)
    b = await replica(script(api, case), **settings)
    dying = Dying(a.base)
    front = dying.stub = await stub(dying)
    body = BODIES[api](fields, model=DEPLOYMENT)
    if asks == "ids":  # the client's own: kept, on its events as serve puts them
        body["return_token_ids"] = True
    reference = await gateway(b, deployments=deployment(b.base), upstream=UPSTREAM)
    whole = await read(session, reference.url(api), body)
    assert (b'"token_ids":[' in whole) == (asks == "ids") and b"event: error" not in whole
    if case != "text":
        assert any(kind in whole for kind in (b"function_call", b"tool_use", b"reasoning", b"thinking"))
    gw = await gateway(deployments=deployment(front.base, b.base), upstream=UPSTREAM)
    gw.in_order()
    assert await read(session, gw.url(api), body) == whole  # relayed whole through the stub
    n = dying.events
    assert dying.bodies[-1]["return_token_ids"] is True  # the gateway asked the replica for the ids
    before = {outcome: migrations(outcome) for outcome in ("continued", "resent", "finished", "refused", "failed")}
    for k in range(n + 1):
        dying.cut = k
        got = await read(session, gw.url(api), body)
        assert got == whole, (k, n)
    assert len(dying.bodies) == n + 2  # every first attempt went to the dying replica: its whole run, and n + 1 cuts
    # Cut before the client had an event (the headers alone, or Responses' response.created, which serve
    # holds open until response.in_progress brings the prompt's ids) the request is sent again; after the
    # last event (k = n) the stream is whole; after any other it is continued.
    opening = 2 if api == RESPONSES else 1
    after = {outcome: migrations(outcome) - count for outcome, count in before.items()}
    assert after == {"continued": n - opening, "resent": opening, "finished": 1, "refused": 0, "failed": 0}


@pytest.mark.parametrize("api", [RESPONSES, MESSAGES])
async def test_a_vllm_replica_s_stream_still_ends_in_band_and_its_chat_streams_are_still_tracked(api, replica, gateway, stub, session):
    a = await replica(script(api, "text"))
    b = await replica(script(api, "text"))
    dying = Dying(a.base, vllm=True)
    front = dying.stub = await stub(dying)
    gw = await gateway(deployments=deployment(front.base, b.base), upstream=UPSTREAM)
    gw.in_order()
    body = BODIES[api]({}, model=DEPLOYMENT)
    refused = migrations("refused")
    dying.cut = 4
    got = await read(session, gw.url(api), body)
    assert b"event: error" in got and b"the answer is incomplete" in got and b"token_ids" not in got
    assert got.startswith(b"event: response.created" if api == RESPONSES else b"event: message_start")
    assert migrations("refused") == refused + 1 and not any("continue_token_ids" in x for x in dying.bodies)
    dying.cut = None  # the replica still counts as one that sends ids: its chat streams are asked for them
    chat_body = {"model": DEPLOYMENT, "messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 5}
    await read(session, gw.url("/v1/chat/completions"), chat_body)
    assert dying.bodies[-1]["return_token_ids"] is True


@pytest.mark.parametrize("api", [RESPONSES, MESSAGES])
async def test_a_moved_stream_is_one_access_log_line_and_one_ledger_record_of_the_whole_generation(api, replica, gateway, stub, session,
                                                                                                   access_log):
    tokens, settings, fields = CASES_BY_API[api]["tool-calls"]
    a = await replica(script(api, "tool-calls"), **settings)
    b = await replica(script(api, "tool-calls"), **settings)
    dying = Dying(a.base)
    front = dying.stub = await stub(dying)
    store = MemoryStore()
    gw = await gateway(deployments=deployment(front.base, b.base), upstream=UPSTREAM, ledger=Ledger(store, interval=0.05))
    gw.in_order()
    body = BODIES[api](fields, model=DEPLOYMENT)
    await read(session, gw.url(api), body, request_id="whole-1")
    dying.cut = 6  # inside the text, before the calls
    await read(session, gw.url(api), body, request_id="moved-1")
    whole, moved = line_for(access_log, "whole-1"), line_for(access_log, "moved-1")
    assert (moved["status"], moved["error_code"], moved["migrations"], moved["replicas"]) == (200, None, 1, [front.base, b.base])
    assert (whole["migrations"], whole["replicas"]) == (0, [front.base])
    assert moved["completion_tokens"] == whole["completion_tokens"] == len(tokens)
    assert (moved["prompt_tokens"], moved["finish_reason"], moved["usage_source"]) == (whole["prompt_tokens"], whole["finish_reason"], "billed")
    assert await wait_until(lambda: len(store.rows) == 2, timeout=20.0)
    records = {r.request_id: r for _, r in store.rows}
    record = records["moved-1"]
    assert (record.replicas, record.replica, record.migrations, record.status) == ([front.base, b.base], b.base, 1, 200)
    assert (record.prompt_tokens, record.completion_tokens) == (records["whole-1"].prompt_tokens, len(tokens))


async def test_a_responses_stream_no_replica_takes_on_ends_numbered_after_what_the_client_had(replica, gateway, stub, session):
    a = await replica(script(RESPONSES, "text"))
    dying = Dying(a.base)
    front = dying.stub = await stub(dying)
    gw = await gateway(deployments=deployment(front.base, refused_url()), upstream=UPSTREAM)
    gw.in_order()
    failed = migrations("failed")
    dying.cut = 3  # response.created, .in_progress, and the item's output_item.added (held: its step's ids did not come)
    got = await read(session, gw.url(RESPONSES), BODIES[RESPONSES]({}, model=DEPLOYMENT))
    out = events(got)
    assert [e.split(b"\n")[0] for e in out] == [b"event: response.created", b"event: response.in_progress", b"event: error",
                                                  b"event: response.failed"]
    assert [orjson.loads(e.split(b"data: ")[1])["sequence_number"] for e in out] == [0, 1, 2, 3]
    assert orjson.loads(out[-1].split(b"data: ")[1])["response"]["output"] == []  # (the held item never reached the client)
    assert migrations("failed") == failed + 1


async def test_a_continued_responses_stream_that_breaks_again_fails_its_whole_response_in_band(replica, gateway, stub, session):
    a = await replica(script(RESPONSES, "text"))
    b = await replica(script(RESPONSES, "text"))
    first, second = Dying(a.base), Dying(b.base)
    first.stub, second.stub = await stub(first), await stub(second)
    gw = await gateway(deployments=deployment(first.stub.base, second.stub.base, refused_url()), upstream=UPSTREAM)
    gw.in_order()
    first.cut, second.cut = 5, 1  # the opening, the item and its part, "Hel"; then the continuation's "lo"
    got = await read(session, gw.url(RESPONSES), BODIES[RESPONSES]({}, model=DEPLOYMENT))
    out = [orjson.loads(e.split(b"data: ")[1]) for e in events(got)]
    assert [e["type"] for e in out][-4:] == ["response.output_text.delta", "response.output_text.delta", "error", "response.failed"]
    assert [e["sequence_number"] for e in out] == list(range(8)) and [e["delta"] for e in out[4:6]] == ["Hel", "lo"]
    assert "continue_token_ids" in second.bodies[-1]
    failed = out[-1]["response"]
    assert failed["id"] == "resp_cut-1" and failed["status"] == "failed"
    assert [(item["id"], item["status"]) for item in failed["output"]] == [(out[2]["item"]["id"], "incomplete")]


@pytest.mark.parametrize("fail_as", ["failure", "rejected"])
@pytest.mark.parametrize("api", [RESPONSES, MESSAGES])
async def test_a_replica_s_own_in_band_failure_is_the_break_and_the_request_s_error_is_passed_on(api, fail_as, replica, gateway, session):
    tokens = CASES_BY_API[api]["text"][0]
    a = await replica(FakeScript(tokens=tokens, fail_after=2, fail_as=fail_as))
    b = await replica(FakeScript(tokens=tokens))
    body = BODIES[api]({}, model=DEPLOYMENT)
    reference = await gateway(b, deployments=deployment(b.base), upstream=UPSTREAM)
    whole = await read(session, reference.url(api), body)
    gw = await gateway(deployments=deployment(a.base, b.base), upstream=UPSTREAM)
    gw.in_order()
    continued = migrations("continued")
    got = await read(session, gw.url(api), body)
    if fail_as == "failure":  # the engine's failure (a 503 in-band): continued on b
        assert got == whole and migrations("continued") == continued + 1
        return
    # The engine's refusal of the request (a 400 in-band): the client's, as the replica sent it.
    assert b"event: error" in got and b"injected failure after 2 tokens" in got and migrations("continued") == continued
    last = got.split(b"\n\n")[-2]
    assert last.startswith(b"event: response.failed" if api == RESPONSES else b"event: error") and b"token_ids" not in got
    assert got.count(b"event: error") == 1  # (the replica's alone: the stream ended there)


async def test_a_messages_stream_that_had_only_pings_is_sent_again(replica, gateway, stub, session):
    """A queued serve request pings before its message_start: a break then leaves the client nothing to continue."""
    b = await replica(script(MESSAGES, "text"))
    ping = b'event: ping\ndata: {"type":"ping"}\n\n'

    async def pings_then_dies(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
                     b"Streamproxy-Continuation: continue_token_ids\r\n\r\n" + b"%x\r\n%s\r\n" % (len(ping), ping))
        await writer.drain()

    front = await stub(pings_then_dies)
    body = BODIES[MESSAGES]({}, model=DEPLOYMENT)
    reference = await gateway(b, deployments=deployment(b.base), upstream=UPSTREAM)
    whole = await read(session, reference.url(MESSAGES), body)
    gw = await gateway(deployments=deployment(front.base, b.base), upstream=UPSTREAM)
    gw.in_order()
    resent = migrations("resent")
    assert await read(session, gw.url(MESSAGES), body) == ping + whole
    assert migrations("resent") == resent + 1
