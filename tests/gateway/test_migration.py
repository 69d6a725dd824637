"""Stream migration: a stream a replica breaks off goes on on another, and the client reads the bytes of an unbroken run.

The replicas are `tests/support/token_replica.py`'s fake vLLM (`return_token_ids`, token-id
prompts, a model that is a function of the whole sequence): two of them behind the gateway,
the next stream's break shared (`breaks`), so whichever replica takes the request breaks and
the other takes the continuation. Each case cuts the stream after each of its events in turn
(0: the replica answered its head only) and compares the client's bytes with a run without
the cut.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from harness.waiting import wait_until
from streamproxy.ledger.memory import MemoryStore
from streamproxy.ledger.writer import Ledger
from tests.gateway.gateway_support import DEPLOYMENT, DEPLOYMENT_ID, SERVED, chat, line_for, sample
from tests.support.spans import recorded_spans
from tests.support.sse import payloads
from tests.support.token_replica import TokenReplica, next_token

BOUND = 20.0

Breaks = list[tuple[str, int]]
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"


NO_EJECTION = {"consecutive_errors": 100_000}  # every cut counts against its replica: none is ejected in these runs


def deployment(replicas: list[TokenReplica], **migration: Any) -> list[dict[str, Any]]:
    return [{"name": DEPLOYMENT, "id": DEPLOYMENT_ID, "served_model": SERVED, "upstreams": [r.base for r in replicas],
             "migration": {"stream_idle_timeout": 0, **migration}}]


async def read(session: aiohttp.ClientSession, url: str, body: dict[str, Any], request_id: str | None = None) -> bytes:
    headers = {"X-Request-Id": request_id} if request_id else {}
    async with session.post(url, json=body, headers=headers) as r:
        assert r.status == 200
        return await r.read()


def events(raw: bytes) -> list[bytes]:
    return [e + b"\n\n" for e in raw.split(b"\n\n") if e]


BODIES: dict[str, tuple[str, dict[str, Any]]] = {
    "chat": (CHAT, chat(stream=True, max_tokens=6)),
    "chat-usage": (CHAT, chat(stream=True, max_tokens=6, stream_options={"include_usage": True})),
    "chat-ids": (CHAT, chat(stream=True, stream_options={"include_usage": True}, return_token_ids=True)),
    "completions": (COMPLETIONS, {"model": DEPLOYMENT, "prompt": "Say hi", "max_tokens": 5, "stream": True}),
    "completions-usage-ids": (COMPLETIONS, {"model": DEPLOYMENT, "prompt": [5, 6, 7], "max_tokens": 5, "stream": True,
                                            "stream_options": {"include_usage": True}, "return_token_ids": True}),
}


@pytest.mark.parametrize("mode", ["close", "reset", "error"])
@pytest.mark.parametrize("case", list(BODIES))
async def test_a_stream_cut_after_any_event_reads_as_the_unbroken_one(case, mode, pair, gateway, session):
    replicas, breaks = await pair()
    gw = await gateway(deployments=deployment(replicas), upstream=NO_EJECTION)
    path, body = BODIES[case]
    url = gw.url(path)
    whole = await read(session, url, body)
    assert whole.endswith(b"data: [DONE]\n\n") and b"error" not in whole
    if "ids" not in case:
        assert b"token_ids\":[" not in whole and b'"delta":{}' not in whole
    n = len(events(whole))
    for k in range(n - 1):  # after the last one ([DONE]) the stream is whole
        breaks.append((mode, k))
        got = await read(session, url, body)
        assert got == whole, (k, got)
        assert not breaks
    continued = sample("streamproxy_gateway_migrations_total", deployment=DEPLOYMENT, outcome="continued")
    assert continued is not None and continued >= 1


async def test_the_continuation_is_the_prompt_s_ids_and_the_generated_ones(pair, gateway, session, access_log):
    (a, b), breaks = await pair()
    gw = await gateway(deployments=deployment([a, b]), upstream=NO_EJECTION)
    body = chat(stream=True, max_tokens=6, temperature=0, seed=7, stream_options={"include_usage": True})
    whole = await read(session, gw.url(CHAT), body)
    breaks.append(("reset", 3))  # the role chunk and two tokens
    got = await read(session, gw.url(CHAT), body, request_id="migrated-1")
    assert got == whole
    second, first = (a, b) if a.seen[-1][0] == COMPLETIONS else (b, a)
    path, sent = first.seen[-1]
    assert path == CHAT and sent["return_token_ids"] is True and sent["stream_options"] == {"include_usage": True}
    path, cont = second.seen[-1]
    usage = payloads(whole)[-1]["usage"]
    prompt = usage["prompt_tokens"]
    assert path == COMPLETIONS and len(cont["prompt"]) == prompt + 2
    seq = cont["prompt"][:prompt]
    for _ in range(2):
        seq.append(next_token(seq))
    assert cont["prompt"] == seq  # the prompt's ids and the two the client has had
    assert {k: v for k, v in cont.items() if k != "prompt"} == {
        "model": SERVED, "max_tokens": 4, "temperature": 0, "seed": 7, "stream": True,
        "stream_options": {"include_usage": True}, "return_token_ids": True}
    assert sample("streamproxy_gateway_requests_total", deployment=DEPLOYMENT, upstream=first.base, status="502") == 1
    line = line_for(access_log, "migrated-1")
    assert (line["status"], line["error_code"], line["migrations"]) == (200, None, 1)
    assert line["replicas"] == [first.base, second.base] and line["upstream"] == second.base
    assert line["finish_reason"] == "length"
    assert (line["prompt_tokens"], line["completion_tokens"], line["usage_source"]) == (prompt, 6, "billed")


async def test_chunks_of_several_tokens_continue_to_the_same_text_and_ids(pair, gateway, session):
    replicas, breaks = await pair(per_chunk=3)
    gw = await gateway(deployments=deployment(replicas), upstream=NO_EJECTION)
    body = chat(stream=True, max_tokens=8, return_token_ids=True, stream_options={"include_usage": True})
    whole = await read(session, gw.url(CHAT), body)

    def flat(raw: bytes) -> tuple[str, list[int], Any]:
        chunks = payloads(raw)
        text = "".join(c["choices"][0]["delta"]["content"] for c in chunks if c["choices"])
        ids = [t for c in chunks if c["choices"] for t in c["choices"][0].get("token_ids") or ()]
        return text, ids, (chunks[-2]["choices"][0]["finish_reason"], chunks[-1]["usage"])

    for k in range(1, 4):
        breaks.append(("close", k))
        got = await read(session, gw.url(CHAT), body)
        assert flat(got) == flat(whole) and len(flat(got)[1]) == 8
        assert payloads(got)[0] == payloads(whole)[0]  # one role chunk, with the prompt's ids asked for


async def test_a_stalled_replica_is_left_after_stream_idle_timeout(pair, gateway, session):
    replicas, breaks = await pair()
    gw = await gateway(deployments=deployment(replicas, stream_idle_timeout=0.05), upstream=NO_EJECTION)
    path, body = BODIES["chat-usage"]
    whole = await read(session, gw.url(path), body)
    for k in (1, 4):
        breaks.append(("stall", k))
        assert await read(session, gw.url(path), body) == whole


async def test_a_stream_that_cannot_be_continued_ends_in_band_and_asks_for_no_ids(pair, gateway, session):
    (a, b), breaks = await pair()
    gw = await gateway(deployments=deployment([a, b]), upstream=NO_EJECTION)
    body = chat(stream=True, max_tokens=6, logprobs=True)
    whole = await read(session, gw.url(CHAT), body)
    breaks.append(("close", 3))
    got = await read(session, gw.url(CHAT), body)
    assert events(got)[:3] == events(whole)[:3]
    error = payloads(got)[-1]["error"]
    assert (error["type"], error["code"]) == ("service_unavailable", "upstream_unavailable")
    assert got.endswith(b"data: [DONE]\n\n") and len(events(got)) == 5
    assert all("return_token_ids" not in seen for r in (a, b) for _, seen in r.seen)
    assert len(a.seen) + len(b.seen) == 2  # not sent again
    # Cut before any event went out, it is sent again whole, whatever it asked.
    breaks.append(("close", 0))
    assert await read(session, gw.url(CHAT), body) == whole


async def test_a_replica_s_error_in_a_stream_that_cannot_go_on_reaches_the_client_as_it_came(pair, gateway, session):
    replicas, breaks = await pair()
    gw = await gateway(deployments=deployment(replicas), upstream=NO_EJECTION)
    body = chat(stream=True, max_tokens=6, logprobs=True)
    breaks.append(("error", 2))
    got = await read(session, gw.url(CHAT), body)
    assert payloads(got)[-1] == {"error": {"message": "EngineCore encountered an issue.", "type": "InternalServerError",
                                           "param": None, "code": 500}}


async def test_max_migrations_bounds_the_moves_and_migration_can_be_off(pair, gateway, session):
    replicas, breaks = await pair(3)
    gw = await gateway(deployments=deployment(replicas, max_migrations=1), upstream=NO_EJECTION)
    path, body = BODIES["chat-usage"]
    whole = await read(session, gw.url(path), body)
    outcomes = ("continued", "exhausted", "refused")
    before = [sample("streamproxy_gateway_migrations_total", deployment=DEPLOYMENT, outcome=o) or 0 for o in outcomes]
    breaks.extend([("close", 2), ("close", 3)])  # the continuation breaks too
    got = await read(session, gw.url(path), body)
    assert events(got)[:3] == events(whole)[:3] and payloads(got)[-1]["error"]["code"] == "upstream_unavailable"
    breaks.clear()
    after = [sample("streamproxy_gateway_migrations_total", deployment=DEPLOYMENT, outcome=o) or 0 for o in outcomes]
    assert [a - b for a, b in zip(after, before)] == [1, 1, 0]  # moved once, then out of moves (not `refused`)

    off = await gateway(deployments=deployment(replicas, enabled=False), upstream=NO_EJECTION)
    before = [len(r.seen) for r in replicas]
    breaks.append(("close", 2))
    got = await read(session, off.url(path), body)
    assert payloads(got)[-1]["error"]["code"] == "upstream_unavailable"
    new = [seen for r, n in zip(replicas, before) for _, seen in r.seen[n:]]
    assert len(new) == 1 and "return_token_ids" not in new[0]


async def test_a_stream_too_long_to_track_is_not_migrated(pair, gateway, session):
    replicas, breaks = await pair()
    gw = await gateway(deployments=deployment(replicas, max_tracked_tokens=8), upstream=NO_EJECTION)
    path, body = BODIES["chat"]
    breaks.append(("close", 3))
    got = await read(session, gw.url(path), body)
    assert payloads(got)[-1]["error"]["code"] == "upstream_unavailable"
    assert b"token_ids\":[" not in got


async def test_a_stream_whose_finish_went_out_ends_without_another_replica(pair, gateway, session):
    (a, b), breaks = await pair(eos_len=40)
    gw = await gateway(deployments=deployment([a, b]), upstream=NO_EJECTION)
    body = chat(stream=True, stream_options={"include_usage": True})
    whole = await read(session, gw.url(CHAT), body)
    assert payloads(whole)[-2]["choices"][0]["finish_reason"] == "stop"
    seen = len(a.seen) + len(b.seen)
    breaks.append(("close", len(events(whole)) - 2))  # the finish went out; the usage chunk did not
    assert await read(session, gw.url(CHAT), body) == whole
    assert len(a.seen) + len(b.seen) == seen + 1


async def test_a_replica_killed_under_load_loses_no_stream(pair, gateway, session):
    """Streams spread over three replicas, each held mid-way; one replica is killed; every stream ends whole."""
    replicas, _ = await pair(3)
    deployments = deployment(replicas)
    gw = await gateway(deployments=deployments, upstream={**NO_EJECTION, "policy": "least_outstanding"})
    n = 24
    bodies = [chat(messages=[{"role": "user", "content": f"hi {i}"}], stream=True, max_tokens=10) for i in range(n)]
    expected = [await read(session, gw.url(CHAT), body) for body in bodies]
    gate = asyncio.Event()
    for r in replicas:
        r.hold_after, r.gate = 4, gate
    streams = [asyncio.ensure_future(read(session, gw.url(CHAT), body)) for body in bodies]
    assert await wait_until(lambda: sum(r.held for r in replicas) == n, timeout=BOUND)
    victim = max(replicas, key=lambda r: r.held)
    assert victim.held > 0
    continued = sample("streamproxy_gateway_migrations_total", deployment=DEPLOYMENT, outcome="continued") or 0
    await victim.kill()
    gate.set()
    got = await asyncio.gather(*streams)
    assert got == expected
    assert sample("streamproxy_gateway_migrations_total", deployment=DEPLOYMENT, outcome="continued") == continued + victim.held


async def test_replicas_that_send_no_ids_are_not_asked_for_them_again(pair, gateway, session):
    (a, b), breaks = await pair(sends_ids=False)
    gw = await gateway(deployments=deployment([a]), upstream=NO_EJECTION)
    body = chat(stream=True, max_tokens=6)
    first = await read(session, gw.url(CHAT), body)
    assert await read(session, gw.url(CHAT), body) == first
    assert [seen.get("return_token_ids") for _, seen in a.seen] == [True, None]
    # While one replica is not known to send none, the gateway asks (b may send them).
    both = await gateway(deployments=deployment([a, b]), upstream=NO_EJECTION)
    for _ in range(20):
        if b.seen:
            break
        assert await read(session, both.url(CHAT), body) == first
    assert b.seen and b.seen[0][1].get("return_token_ids") is True
    # A break after events went out is not migrated: the client gets the in-band error.
    breaks.append(("close", 3))
    got = await read(session, gw.url(CHAT), body)
    assert events(got)[:3] == events(first)[:3] and payloads(got)[-1]["error"]["code"] == "upstream_unavailable"
    assert [seen.get("return_token_ids") for _, seen in a.seen][-1] is None


async def test_the_ledger_record_names_every_replica_and_the_moves(pair, gateway, session):
    (a, b), breaks = await pair()
    store = MemoryStore()
    gw = await gateway(deployments=deployment([a, b]), upstream=NO_EJECTION, ledger=Ledger(store, interval=0.05))
    body = chat(stream=True, max_tokens=6)
    await read(session, gw.url(CHAT), body, request_id="unbroken-1")
    breaks.append(("reset", 3))
    await read(session, gw.url(CHAT), body, request_id="moved-1")
    assert await wait_until(lambda: len(store.rows) == 2, timeout=BOUND)
    records = {r.request_id: r for _, r in store.rows}
    moved, unbroken = records["moved-1"], records["unbroken-1"]
    second, first = (a, b) if a.seen[-1][0] == COMPLETIONS else (b, a)
    assert (moved.replicas, moved.replica, moved.migrations, moved.status) == ([first.base, second.base], second.base, 1, 200)
    assert (unbroken.replicas, unbroken.migrations) == ([unbroken.replica], 0)
    assert (moved.prompt_tokens, moved.completion_tokens) == (unbroken.prompt_tokens, 6)


@pytest.fixture
def spans():
    with recorded_spans("streamproxy-gateway") as exporter:
        yield exporter


async def test_each_attempt_of_a_moved_stream_is_a_span_of_its_own(pair, gateway, session, spans):
    (a, b), breaks = await pair()
    gw = await gateway(deployments=deployment([a, b]), upstream=NO_EJECTION)
    breaks.append(("reset", 3))
    await read(session, gw.url(CHAT), chat(stream=True, max_tokens=6), request_id="traced-1")
    second, first = (a, b) if a.seen[-1][0] == COMPLETIONS else (b, a)
    assert await wait_until(lambda: len(spans.get_finished_spans()) == 3, timeout=BOUND)
    (request,) = [s for s in spans.get_finished_spans() if s.parent is None]
    attempts = sorted((s for s in spans.get_finished_spans() if s.parent is not None), key=lambda s: s.start_time or 0)
    assert [s.parent.span_id for s in attempts if s.parent] == [request.context.span_id] * 2
    assert [{k: v for k, v in (s.attributes or {}).items()} for s in attempts] == [
        {"streamproxy.deployment": DEPLOYMENT, "server.address": first.base, "streamproxy.retry": 0,
         "http.response.status_code": 200, "error.type": "broken"},
        {"streamproxy.deployment": DEPLOYMENT, "server.address": second.base, "streamproxy.retry": 0,
         "streamproxy.migration": "continue", "http.response.status_code": 200},
    ]
    assert (request.attributes or {})["gen_ai.response.finish_reasons"] == ("length",)
