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
from typing import Literal

import pytest

from engine_adapter.fake import FakeScript
from streamproxy.ledger.memory import MemoryStore as MemoryStoreForTests
from streamproxy.ledger.records import LedgerRecord, RequestQuery, UsageQuery
from streamproxy.ledger.store import LedgerStore, open_store
from streamproxy.ledger.writer import Ledger
from tests.gateway.conftest import refused_url
from tests.gateway.gateway_support import DEPLOYMENT, DEPLOYMENT_ID, SERVED, chat, post
from tests.support import sse, wait_until

KEY, ADMIN = "sk-ledger-team-a", "sk-ledger-admin"
SLOW = FakeScript(text=" word", token_delay=0.05)
BOUND = 10.0


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


# -- the query routes ------------------------------------------------------------------------

T0 = 1_764_547_200  # 2025-12-01T00:00:00Z


def book(i: int) -> LedgerRecord:
    return LedgerRecord(
        ts_us=(T0 + i * 3000) * 1_000_000 + i, request_id=f"book-{i}", deployment=DEPLOYMENT if i % 4 else "other",
        replica="http://127.0.0.1:1", key_id=("team-a", "team-b")[i % 2], route="/v1/chat/completions",
        status=(200, 200, 429, 502)[i % 4 if i % 3 else 0], prompt_tokens=i, cached_prompt_tokens=i % 3,
        completion_tokens=2 * i, usage_source="billed", ttft_ms=1.5, duration_ms=9.25,
    )


BOOKS = [book(i) for i in range(1, 121)]  # 120 records over about four days


async def booked(replica, gateway, store: LedgerStore, monkeypatch):
    monkeypatch.setenv("LEDGER_ADMIN", ADMIN)
    await store.write(BOOKS)
    r = await replica()
    deployments = [{"name": DEPLOYMENT, "id": DEPLOYMENT_ID, "served_model": SERVED, "upstreams": [r.base]},
                   {"name": "other", "id": "dep-other", "served_model": SERVED, "upstreams": [r.base]}]
    gw = await gateway(deployments=deployments, ledger=Ledger(store, interval=3600))
    gw.state.admin_key = ADMIN.encode()
    return gw


async def get(session, url: str, key: str | None = ADMIN) -> tuple[int, dict]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with session.get(url, headers=headers) as resp:
        return resp.status, await resp.json()


async def test_paging_through_the_api_returns_every_record_once_newest_first(replica, gateway, session, store, monkeypatch):
    from tests.gateway.gateway_support import fits

    gw = await booked(replica, gateway, store, monkeypatch)
    for name in (DEPLOYMENT, DEPLOYMENT_ID):  # by name or id
        got: list[dict] = []
        path = f"/v1/deployments/{name}/requests?limit=7"
        for _ in range(100):
            status, page = await get(session, gw.url(path))
            assert status == 200, page
            fits(path.split("?")[0], "get", 200, page)
            got += page["data"]
            if not page["has_more"]:
                assert page["next_cursor"] is None
                break
            path = f"/v1/deployments/{name}/requests?limit=7&cursor={page['next_cursor']}"
        mine = [r for r in BOOKS if r.deployment == DEPLOYMENT]
        assert [g["request_id"] for g in got] == [r.request_id for r in sorted(mine, key=lambda r: r.ts_us, reverse=True)]
        assert got[0] == {f: getattr(mine[-1], f) for f in LedgerRecord.__struct_fields__}  # every field, as written
    # Filters: key, status class, exact status, time range.
    _, page = await get(session, gw.url(f"/v1/deployments/{DEPLOYMENT}/requests?key_id=team-b&status=4xx&limit=1000"))
    assert [g["request_id"] for g in page["data"]] == [
        r.request_id for r in reversed(BOOKS) if r.deployment == DEPLOYMENT and r.key_id == "team-b" and 400 <= r.status < 500]
    start, end = T0 + 30 * 3000, T0 + 40 * 3000
    _, page = await get(session, gw.url(f"/v1/deployments/{DEPLOYMENT}/requests?start={start}&end={end}&status=502"))
    assert [g["request_id"] for g in page["data"]] == [
        r.request_id for r in reversed(BOOKS) if r.deployment == DEPLOYMENT and start * 10**6 <= r.ts_us < end * 10**6 and r.status == 502]


async def test_usage_sums_equal_the_sums_of_the_records(replica, gateway, session, store, monkeypatch):
    from streamproxy.ledger.records import period_of
    from tests.gateway.gateway_support import fits

    gw = await booked(replica, gateway, store, monkeypatch)
    start, end = T0, T0 + 10 * 86400
    for group_by in ("deployment,key,day", "key", "month", "deployment"):
        status, report = await get(session, gw.url(f"/v1/usage?start={start}&end={end}&group_by={group_by}"))
        assert status == 200, report
        fits("/v1/usage", "get", 200, report)
        dims = group_by.split(",")
        expected: dict[tuple, list[int]] = {}
        for r in BOOKS:
            period: Literal["day", "month"] | None = "day" if "day" in dims else "month" if "month" in dims else None
            group = (r.deployment if "deployment" in dims else None, r.key_id if "key" in dims else None,
                     period_of(r.ts_us, period) if period else None)
            s = expected.setdefault(group, [0, 0, 0, 0, 0])
            s[0] += 1
            s[1] += r.prompt_tokens or 0
            s[2] += r.cached_prompt_tokens or 0
            s[3] += r.completion_tokens or 0
            s[4] += (r.prompt_tokens or 0) + (r.completion_tokens or 0)
        got = {(u["deployment"], u["key_id"], u["period"]): [u["requests"], u["prompt_tokens"], u["cached_prompt_tokens"],
                                                            u["completion_tokens"], u["total_tokens"]] for u in report["data"]}
        assert got == expected, group_by
        assert (report["start"], report["end"], report["group_by"]) == (start, end, dims)
    _, report = await get(session, gw.url(f"/v1/usage?start=2025-12-01&end=2025-12-02&group_by=&deployment={DEPLOYMENT_ID}&key_id=team-a"))
    day_one = [r for r in BOOKS if r.ts_us < (T0 + 86400) * 10**6 and r.deployment == DEPLOYMENT and r.key_id == "team-a"]
    assert [(u["requests"], u["prompt_tokens"]) for u in report["data"]] == [(len(day_one), sum(r.prompt_tokens or 0 for r in day_one))]


def error(message: str, param: str | None, code: str) -> dict:
    return {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": code}}


@pytest.mark.parametrize(("query", "param", "message"), [
    ("limit=0", "limit", "`limit` must be an integer from 1 to 1000, not '0'"),
    ("limit=many", "limit", "`limit` must be an integer from 1 to 1000, not 'many'"),
    ("status=teapot", "status", "`status` must be a status (429) or a class (2xx, 4xx, 5xx), not 'teapot'"),
    ("start=yesterday", "start", "`start` must be unix seconds or an ISO 8601 date or time, not 'yesterday'"),
    ("start=200&end=100", "end", "`end` must be later than `start`"),
    ("key=team-a", "key", "unknown parameter `key`; this route takes start, end, key_id, status, limit, cursor"),
])
async def test_bad_parameters_of_the_requests_route_are_400s_naming_them(replica, gateway, session, query, param, message, monkeypatch):
    gw = await booked(replica, gateway, MemoryStoreForTests(), monkeypatch)
    status, body = await get(session, gw.url(f"/v1/deployments/{DEPLOYMENT}/requests?{query}"))
    assert (status, body) == (400, error(message, param, "invalid_parameter"))


@pytest.mark.parametrize(("query", "param", "message", "code"), [
    ("group_by=day,month", "group_by", "`group_by` takes day or month, not both", "invalid_parameter"),
    ("group_by=year", "group_by", "`group_by` takes deployment, key, day and month (comma-separated), not 'year'", "invalid_parameter"),
    ("end=2025-13-01", "end", "`end` must be unix seconds or an ISO 8601 date or time, not '2025-13-01'", "invalid_parameter"),
])
async def test_bad_parameters_of_the_usage_route_are_400s_naming_them(replica, gateway, session, query, param, message, code,
                                                                      monkeypatch):
    gw = await booked(replica, gateway, MemoryStoreForTests(), monkeypatch)
    status, body = await get(session, gw.url(f"/v1/usage?{query}"))
    assert (status, body) == (400, error(message, param, code))
    status, body = await get(session, gw.url(f"/v1/deployments/{DEPLOYMENT}/requests?cursor=12x"))
    assert (status, body) == (400, error("`cursor` is not one this API returned (use `next_cursor` as it is)", "cursor",
                                         "invalid_cursor"))


async def test_the_query_routes_need_the_admin_key_and_a_ledger(replica, gateway, session, monkeypatch):
    gw = await booked(replica, gateway, MemoryStoreForTests(), monkeypatch)
    for path in (f"/v1/deployments/{DEPLOYMENT}/requests", "/v1/usage"):
        for key in (None, KEY, "sk-wrong"):
            status, body = await get(session, gw.url(path), key=key)
            assert status == 401 and body["error"]["code"] == "invalid_api_key"
    r = await replica()
    off = await gateway(r)  # no ledger
    off.state.admin_key = ADMIN.encode()
    status, body = await get(session, off.url("/v1/usage"))
    assert (status, body["error"]["code"]) == (404, "ledger_off")
