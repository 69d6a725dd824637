"""The request ledger behind the gateway: one record per request, on every store.

A mixed run (stream with and without usage asked for, non-stream, a stream the
client cuts, a replica's 400, no replica to take it, an unknown model, bad
JSON, a wrong key) leaves exactly one record per request that reached a
deployment's route with the key known, with the token counts the client saw
in `usage`; the store down (PostgreSQL stopped) or slow (SQLite locked by
another connection) for seconds in the middle of a load fails no request and
loses no record; the query routes page every record once and sum as the
records do, behind the admin key, with 400s for bad parameters.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import AsyncIterator

import pytest

from engine_adapter.fake import FakeScript
from streamproxy.ledger.records import LedgerRecord, RequestQuery, UsageQuery
from streamproxy.ledger.store import LedgerStore, open_store
from streamproxy.ledger.writer import Ledger
from tests.gateway.conftest import refused_url
from tests.gateway.gateway_support import DEPLOYMENT, DEPLOYMENT_ID, SERVED, chat, post
from tests.support import sse, wait_until

KEY, ADMIN = "sk-ledger-team-a", "sk-ledger-admin"
SLOW = FakeScript(text=" word", token_delay=0.05)
BOUND = 10.0


@pytest.fixture(params=["memory", "sqlite", "postgresql"])
async def store(request: pytest.FixtureRequest, tmp_path) -> AsyncIterator[LedgerStore]:
    if request.param == "memory":
        url = "memory:"
    elif request.param == "sqlite":
        url = f"sqlite://{tmp_path}/ledger.db"
    else:
        url = request.getfixturevalue("postgres_server").database()
    s = await open_store(url)
    yield s
    await s.close()


def auth(request_id: str, key: str = KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}", "X-Request-Id": request_id}


async def everything(store: LedgerStore, deployment: str | None) -> list[LedgerRecord]:
    if deployment is None:
        return [r for _, r in getattr(store, "rows", [])]
    return (await store.requests(RequestQuery(deployment=deployment, limit=1000))).data


def seen_usage(usage: dict) -> tuple[int, int, int]:
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return usage["prompt_tokens"], cached, usage["completion_tokens"]


def tokens(r: LedgerRecord) -> tuple[int | None, int | None, int | None]:
    return r.prompt_tokens, r.cached_prompt_tokens, r.completion_tokens


async def test_a_mixed_run_leaves_one_record_per_request_with_the_usage_the_client_saw(
        replica, gateway, session, store, monkeypatch):
    monkeypatch.setenv("LEDGER_ADMIN", ADMIN)
    fast, slow = await replica(), await replica(SLOW)
    deployments = [
        {"name": DEPLOYMENT, "id": DEPLOYMENT_ID, "served_model": SERVED, "upstreams": [fast.base]},
        {"name": "slow", "id": "dep-slow", "served_model": SERVED, "upstreams": [slow.base]},
        {"name": "dead", "id": "dep-dead", "served_model": SERVED, "upstreams": [refused_url()]},
    ]
    ledger = Ledger(store, interval=3600)  # written by the flush below, not by the clock
    gw = await gateway(deployments=deployments, keys=[{"id": "team-a", "key": KEY}], ledger=ledger)
    url = gw.url("/v1/chat/completions")

    status, _, body = await post(session, url, chat(), **auth("non-stream"))
    assert status == 200
    nonstream_usage = seen_usage(json.loads(body)["usage"])
    status, _, body = await post(session, url, chat(stream=True, stream_options={"include_usage": True}), **auth("stream-usage"))
    assert status == 200
    stream_usage = seen_usage(sse.payloads(body)[-1]["usage"])
    status, _, body = await post(session, url, chat(stream=True), **auth("stream-plain"))
    assert status == 200 and b'"usage"' not in body
    # Cut by the client after two tokens.
    resp = await session.post(gw.url("/v1/chat/completions"), json=chat("slow", stream=True, max_tokens=1000), headers=auth("cut"))
    seen = b""
    while seen.count(b" word") < 2:
        seen += await asyncio.wait_for(resp.content.readany(), BOUND)
    resp.close()
    status, _, _ = await post(session, url, chat(max_tokens=-1), **auth("replica-400"))
    assert status == 400
    status, _, _ = await post(session, url, chat("dead"), **auth("no-replica"))
    assert status == 503
    status, _, _ = await post(session, url, chat("nobody"), **auth("unknown-model"))
    assert status == 404
    async with session.post(url, data=b"{not json", headers={**auth("bad-json"), "Content-Type": "application/json"}) as bad:
        assert bad.status == 400
    status, _, _ = await post(session, url, chat(), **auth("wrong-key", key="sk-wrong"))
    assert status == 401
    # Not a deployment's route: not in the books.
    async with session.get(gw.url("/v1/models"), headers=auth("models")) as models:
        assert models.status == 200

    expected = {"non-stream", "stream-usage", "stream-plain", "cut", "replica-400", "no-replica", "unknown-model", "bad-json"}
    assert await wait_until(lambda: ledger.buffered == len(expected), BOUND), ledger.buffered
    assert await ledger.flush()
    records = [r for name in (DEPLOYMENT, "slow", "dead") for r in await everything(store, name)]
    unrouted = [r for r in await everything(store, None) if r.deployment is None] if hasattr(store, "rows") else []
    by_id = {r.request_id: r for r in records + unrouted}
    assert len(records + unrouted) == len(by_id)  # one each
    if hasattr(store, "rows"):
        assert set(by_id) == expected
    else:  # the SQL stores are read per deployment: the two without one are counted in the usage
        assert set(by_id) == expected - {"unknown-model", "bad-json"}
    total = await store.usage(UsageQuery(start_us=0, end_us=2**62, group_by=()))
    assert [u.requests for u in total] == [len(expected)]

    nonstream, with_usage, plain = by_id["non-stream"], by_id["stream-usage"], by_id["stream-plain"]
    assert tokens(nonstream) == nonstream_usage and nonstream.usage_source == "billed"
    assert tokens(with_usage) == stream_usage and with_usage.usage_source == "billed"
    assert tokens(plain) == stream_usage  # the same answer: billed from the usage the gateway asked for
    for r in (nonstream, with_usage, plain):
        assert (r.deployment, r.key_id, r.route, r.status, r.error_code) == (DEPLOYMENT, "team-a", "/v1/chat/completions", 200, None)
        assert r.replica == fast.base and r.ttft_ms is not None and 0 < r.ttft_ms <= r.duration_ms
    cut = by_id["cut"]
    assert (cut.deployment, cut.status, cut.error_code, cut.usage_source) == ("slow", 200, "client_disconnected", "counted")
    assert cut.prompt_tokens is None and cut.completion_tokens is not None and cut.completion_tokens >= 2
    r400 = by_id["replica-400"]
    assert (r400.deployment, r400.status, r400.replica, r400.ttft_ms) == (DEPLOYMENT, 400, fast.base, None)
    dead = by_id["no-replica"]
    assert (dead.deployment, dead.status, dead.error_code) == ("dead", 503, "upstream_unavailable")
    if hasattr(store, "rows"):
        assert (by_id["unknown-model"].deployment, by_id["unknown-model"].status) == (None, 404)
        assert (by_id["bad-json"].status, by_id["bad-json"].error_code) == (400, "invalid_json")


# -- the store down or slow in the middle of a load ------------------------------------------


async def _load(session, url: str, prefix: str, count: int, concurrency: int = 8) -> list[int]:
    statuses: list[int] = []
    queue = list(range(count))

    async def worker() -> None:
        while queue:
            i = queue.pop()
            status, _, _ = await post(session, url, chat(max_tokens=2), **auth(f"{prefix}-{i}"))
            statuses.append(status)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return statuses


async def _down_for_a_while(replica, gateway, session, store: LedgerStore, down, up) -> None:
    r = await replica()
    ledger = Ledger(store, interval=0.05, batch_size=50, max_backoff=0.2)
    gw = await gateway(r, keys=[{"id": "team-a", "key": KEY}], ledger=ledger)
    url = gw.url("/v1/chat/completions")
    statuses = await _load(session, url, "before", 60)
    assert await wait_until(lambda: ledger.written == 60, BOUND)
    await down()
    try:
        statuses += await _load(session, url, "during", 150)
        assert await wait_until(lambda: ledger.failures >= 1, BOUND)  # it did try, and failed
        assert ledger.buffered > 0
    finally:
        await up()
    statuses += await _load(session, url, "after", 60)
    assert statuses == [200] * 270  # no request failed
    assert await wait_until(lambda: ledger.written == 270 and ledger.buffered == 0, BOUND), (ledger.written, ledger.buffered)
    got = [r.request_id for r in await everything(store, DEPLOYMENT)]
    assert len(got) == len(set(got)) == 270 and ledger.dropped == 0


async def test_postgresql_stopped_mid_load_fails_no_request_and_every_record_arrives(replica, gateway, session, postgres_server):
    store = await open_store(postgres_server.database())

    async def down() -> None:
        await asyncio.to_thread(postgres_server.stop)

    async def up() -> None:
        await asyncio.sleep(1.0)  # down for a while: under load, then idle
        await asyncio.to_thread(postgres_server.start)

    try:
        await _down_for_a_while(replica, gateway, session, store, down, up)
    finally:
        if postgres_server.proc is None:
            postgres_server.start()


async def test_sqlite_locked_by_another_writer_mid_load_fails_no_request_and_every_record_arrives(
        replica, gateway, session, tmp_path, monkeypatch):
    import streamproxy.ledger.sqlite as sqlite_store

    monkeypatch.setattr(sqlite_store, "BUSY_TIMEOUT_MS", 300)  # a locked file fails a write fast, for this test
    path = tmp_path / "ledger.db"
    store = await open_store(f"sqlite://{path}")
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)

    async def down() -> None:
        holder.execute("BEGIN EXCLUSIVE")  # every other writer waits (busy_timeout), then fails

    async def up() -> None:
        await asyncio.sleep(1.0)
        holder.execute("COMMIT")

    try:
        await _down_for_a_while(replica, gateway, session, store, down, up)
    finally:
        holder.close()
