"""One suite over every `LedgerStore` (streamproxy/ledger/store.py): the fake, SQLite, PostgreSQL.

SQLite in a temporary folder; PostgreSQL a real server from the PyPI package
pgserver on 127.0.0.1 (`postgres_server`, one per session; a fresh database
per test). Each test drives a store through the protocol only: migrate (and
again: idempotent), write batches, page a deployment's records newest first
with every filter, sum usage by every grouping, keep each record id once (a
batch written again after a lost acknowledgement, also through the writer),
keep what each gateway process holds against keys' budgets;
then what one store alone does (SQLite's WAL, a schema newer than the code, a
batch the database refuses leaving nothing behind, migrations 5 to the latest on a
database with rows written before them: `record_id`, `replicas` and `migrations` null).
"""

from __future__ import annotations

import datetime as dt
import sqlite3
from collections.abc import Sequence
from typing import Literal

import pytest

from streamproxy.ledger import schema
from streamproxy.ledger.deployments import DeploymentExists, StoredDeployment
from streamproxy.ledger.keys import KeyExists, StoredKey, hash_secret
from streamproxy.ledger.memory import MemoryStore
from streamproxy.ledger.records import Cursor, LedgerRecord, RequestQuery, UsageQuery, period_of
from streamproxy.ledger.store import LedgerStore, open_store
from streamproxy.ledger.writer import Ledger

DAY_US = 86_400_000_000
T0 = int(dt.datetime(2026, 11, 30, 23, 0, tzinfo=dt.UTC).timestamp()) * 1_000_000  # an hour before December


def rec(i: int, *, ts_us: int | None = None, deployment: str = "bot", key: str | None = "team-a", status: int = 200,
        prompt: int | None = 10, cached: int | None = 2, completion: int | None = 5) -> LedgerRecord:
    return LedgerRecord(
        ts_us=T0 + i * 60_000_000 if ts_us is None else ts_us, request_id=f"req-{i}", deployment=deployment,
        replica="http://127.0.0.1:8001", key_id=key, route="/v1/chat/completions", status=status,
        error_code=None if status < 400 else "upstream_error", prompt_tokens=prompt, cached_prompt_tokens=cached,
        completion_tokens=completion, usage_source="billed" if prompt is not None else "counted", ttft_ms=12.5,
        duration_ms=40.25,
    )


async def all_pages(s: LedgerStore, query: RequestQuery) -> list[LedgerRecord]:
    out: list[LedgerRecord] = []
    cursor = None
    for _ in range(1000):
        page = await s.requests(_with(query, cursor))
        out += page.data
        assert page.has_more == (page.next_cursor is not None)
        if not page.has_more:
            return out
        assert len(page.data) == query.limit
        cursor = Cursor.decode(page.next_cursor)  # type: ignore[arg-type]
    raise AssertionError("paging does not end")


def _with(query: RequestQuery, cursor: Cursor | None) -> RequestQuery:
    import dataclasses

    return dataclasses.replace(query, cursor=cursor)


async def test_migrate_is_idempotent_and_says_the_latest_version(store: LedgerStore) -> None:
    assert await store.migrate() == schema.LATEST
    assert await store.migrate() == schema.LATEST


async def test_a_record_comes_back_as_it_was_written(store: LedgerStore) -> None:
    written = [rec(1), rec(2, key=None, prompt=None, cached=None, completion=3, status=499)]
    written[1].ttft_ms = None
    written[1].error_code = "client_disconnected"
    written[0].replicas, written[0].migrations = ["http://127.0.0.1:8002", "http://127.0.0.1:8001"], 1  # (migration 7)
    await store.write(written)
    page = await store.requests(RequestQuery(deployment="bot"))
    assert page.data == written[::-1]  # newest first, every field as written
    assert (page.has_more, page.next_cursor) == (False, None)


async def test_paging_returns_every_record_once_newest_first_also_with_ties_in_time(store: LedgerStore) -> None:
    records = [rec(i, ts_us=T0 + (i // 3) * 1000) for i in range(53)]  # three records per µs timestamp
    for start in range(0, 53, 10):
        await store.write(records[start:start + 10])
    got = await all_pages(store, RequestQuery(deployment="bot", limit=7))
    assert sorted(r.request_id for r in got) == sorted(r.request_id for r in records)
    assert len({r.request_id for r in got}) == 53
    assert [r.ts_us for r in got] == sorted((r.ts_us for r in records), reverse=True)
    # A record written between two pages does not shift the pages (it is newer than the cursor).
    first = await store.requests(RequestQuery(deployment="bot", limit=10))
    await store.write([rec(999, ts_us=T0 + 10 * DAY_US)])
    second = await store.requests(RequestQuery(deployment="bot", limit=10, cursor=Cursor.decode(first.next_cursor or "")))
    assert {r.request_id for r in first.data}.isdisjoint(r.request_id for r in second.data)
    assert [r.request_id for r in (first.data + second.data)] == [r.request_id for r in got[:20]]


async def test_filters_by_time_key_and_status_and_deployment(store: LedgerStore) -> None:
    await store.write([
        rec(0), rec(1, key="team-b"), rec(2, status=429), rec(3, status=502), rec(4, deployment="other"), rec(5, status=400),
    ])

    async def ids(**kw: object) -> list[str]:
        page = await store.requests(RequestQuery(deployment=str(kw.pop("deployment", "bot")), **kw))  # type: ignore[arg-type]
        return [r.request_id for r in page.data]

    assert await ids() == ["req-5", "req-3", "req-2", "req-1", "req-0"]
    assert await ids(deployment="other") == ["req-4"]
    assert await ids(deployment="nobody") == []
    assert await ids(key_id="team-b") == ["req-1"]
    assert await ids(status=429) == ["req-2"]
    assert await ids(status_class=4) == ["req-5", "req-2"]
    assert await ids(status_class=2) == ["req-1", "req-0"]
    # start inclusive, end exclusive
    assert await ids(start_us=T0 + 60_000_000, end_us=T0 + 3 * 60_000_000) == ["req-2", "req-1"]


async def test_usage_sums_equal_the_sums_of_the_records_in_every_grouping(store: LedgerStore) -> None:
    records = [
        rec(i, ts_us=T0 + i * 7 * 60_000_000 * 60, deployment=("bot", "other")[i % 2], key=("team-a", "team-b", None)[i % 3],
            prompt=None if i % 5 == 0 else 10 + i, cached=None if i % 5 == 0 else i % 4, completion=i)
        for i in range(40)
    ]  # every 7 hours: over several days and two months (Nov 30 -> Dec)
    await store.write(records[:25])
    await store.write(records[25:])
    end = T0 + 400 * DAY_US
    for group_by in [(), ("deployment",), ("key",), ("day",), ("month",), ("deployment", "key", "day"), ("key", "month")]:
        rows = await store.usage(UsageQuery(start_us=T0, end_us=end, group_by=group_by))  # type: ignore[arg-type]
        expected: dict[tuple, list[int]] = {}
        for r in records:
            period: Literal["day", "month"] | None = "day" if "day" in group_by else "month" if "month" in group_by else None
            group = (r.deployment if "deployment" in group_by else None, r.key_id if "key" in group_by else None,
                     period_of(r.ts_us, period) if period else None)
            s = expected.setdefault(group, [0, 0, 0, 0])
            s[0] += 1
            s[1] += r.prompt_tokens or 0
            s[2] += r.cached_prompt_tokens or 0
            s[3] += r.completion_tokens or 0
        got = {(u.deployment, u.key_id, u.period): [u.requests, u.prompt_tokens, u.cached_prompt_tokens, u.completion_tokens]
               for u in rows}
        assert got == expected, group_by
        assert all(u.total_tokens == u.prompt_tokens + u.completion_tokens for u in rows)
        assert [(u.period or "", u.deployment or "", u.key_id or "") for u in rows] == sorted(
            (u.period or "", u.deployment or "", u.key_id or "") for u in rows)
    months = await store.usage(UsageQuery(start_us=T0, end_us=end, group_by=("month",)))
    assert [m.period for m in months] == ["2026-11", "2026-12"]
    assert (await store.usage(UsageQuery(start_us=T0, end_us=end, group_by=("day",))))[0].period == "2026-11-30"


async def test_usage_filters_and_an_empty_range(store: LedgerStore) -> None:
    await store.write([rec(0), rec(1, key="team-b"), rec(2, deployment="other")])
    rows = await store.usage(UsageQuery(start_us=T0, end_us=T0 + DAY_US, group_by=("key",), deployment="bot"))
    assert [(u.key_id, u.requests) for u in rows] == [("team-a", 1), ("team-b", 1)]
    rows = await store.usage(UsageQuery(start_us=T0, end_us=T0 + DAY_US, group_by=(), key_id="team-a"))
    assert [(u.requests, u.prompt_tokens, u.completion_tokens) for u in rows] == [(2, 20, 10)]
    assert await store.usage(UsageQuery(start_us=0, end_us=T0, group_by=())) == []
    assert await store.usage(UsageQuery(start_us=0, end_us=T0, group_by=("deployment",))) == []


# -- each record once -------------------------------------------------------------------


async def test_a_batch_written_again_stores_each_record_once(store: LedgerStore) -> None:
    """A commit whose answer was lost: the writer writes the same batch again, maybe with more records."""
    batch = [rec(1), rec(2), rec(3)]
    await store.write(batch)
    await store.write(batch)
    await store.write([batch[2], rec(4)])
    got = await all_pages(store, RequestQuery(deployment="bot", limit=2))
    assert [r.request_id for r in got] == ["req-4", "req-3", "req-2", "req-1"]
    assert got[1:] == batch[::-1]  # as first written, every field
    rows = await store.usage(UsageQuery(start_us=T0, end_us=T0 + DAY_US, group_by=()))
    assert [(u.requests, u.prompt_tokens, u.completion_tokens) for u in rows] == [(4, 40, 20)]


async def test_the_request_id_is_not_the_record_id(store: LedgerStore) -> None:
    """A client may send one X-Request-Id twice (and a gateway and its serve record one request under
    the same): two records, each kept."""
    a, b = rec(1), rec(1)
    assert a.request_id == b.request_id and a.record_id != b.record_id
    await store.write([a])
    await store.write([b])
    assert [r.record_id for r in (await store.requests(RequestQuery(deployment="bot"))).data] == [b.record_id, a.record_id]


async def test_records_without_an_id_are_all_kept(store: LedgerStore) -> None:
    """Rows from before migration 5 have no id; null ids never collide."""
    old = [rec(1), rec(2)]
    for r in old:
        r.record_id = None
    await store.write(old)
    await store.write(old)
    got = (await store.requests(RequestQuery(deployment="bot"))).data
    assert [(r.request_id, r.record_id) for r in got] == [("req-2", None)] * 2 + [("req-1", None)] * 2


class LostAcks:
    """A store whose first `n` writes commit and then raise, as when the connection drops after COMMIT
    and before its answer."""

    def __init__(self, inner: LedgerStore, n: int) -> None:
        self.inner = inner
        self.n = n

    async def write(self, records: Sequence[LedgerRecord]) -> None:
        await self.inner.write(records)
        if self.n > 0:
            self.n -= 1
            raise ConnectionResetError("the answer to the commit was lost")

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


async def test_the_writer_retrying_a_batch_whose_answer_was_lost_stores_it_once(store: LedgerStore) -> None:
    if isinstance(store, MemoryStore):
        store.lose_acks = 2  # the fake's own
        lossy: LedgerStore = store
    else:
        lossy = LostAcks(store, 2)  # type: ignore[assignment]
    taken: list[LedgerRecord] = []
    ledger = Ledger(lossy, interval=0.01, batch_size=4, max_backoff=0.01, on_written=taken.extend)
    records = [rec(i) for i in range(10)]
    for r in records:
        assert ledger.add(r)
    assert not await ledger.flush()  # the first batch committed, its answer lost: still buffered
    assert ledger.buffered == 10
    assert not await ledger.flush()  # again
    assert await ledger.flush()
    assert (ledger.buffered, ledger.failures, ledger.written) == (0, 2, 10)
    assert taken == records  # each record counted once (the keyring's budgets)
    got = await all_pages(store, RequestQuery(deployment="bot", limit=3))
    assert sorted(r.record_id or "" for r in got) == sorted(r.record_id or "" for r in records)
    rows = await store.usage(UsageQuery(start_us=T0, end_us=T0 + DAY_US, group_by=()))
    assert rows[0].requests == 10


# -- one store alone ---------------------------------------------------------------------


async def test_sqlite_is_in_wal_mode_and_readable_by_another_connection_while_open(tmp_path) -> None:
    path = tmp_path / "ledger.db"
    s = await open_store(f"sqlite://{path}")
    try:
        await s.write([rec(1)])
        other = sqlite3.connect(path)
        assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert other.execute("SELECT request_id FROM ledger_requests").fetchall() == [("req-1",)]
        assert other.execute("SELECT version FROM ledger_schema").fetchall() == [(schema.LATEST,)]
        other.close()
    finally:
        await s.close()


async def test_a_schema_newer_than_the_code_is_refused(tmp_path) -> None:
    path = tmp_path / "ledger.db"
    await (await open_store(f"sqlite://{path}")).close()
    db = sqlite3.connect(path)
    db.execute("UPDATE ledger_schema SET version = ?", (schema.LATEST + 1,))
    db.commit()
    db.close()
    with pytest.raises(schema.SchemaTooNew, match=f"version {schema.LATEST + 1}"):
        await open_store(f"sqlite://{path}")


async def test_a_batch_is_all_or_nothing(store: LedgerStore) -> None:
    bad = rec(2)
    bad.route = None  # type: ignore[assignment]  # NOT NULL: the database refuses the batch
    if isinstance(store, MemoryStore):
        pytest.skip("the fake stores what it is given")
    import psycopg

    with pytest.raises((sqlite3.IntegrityError, psycopg.IntegrityError)):
        await store.write([rec(1), bad])
    await store.write([rec(3)])  # the store still works after a refused batch
    assert [r.request_id for r in (await store.requests(RequestQuery(deployment="bot"))).data] == ["req-3"]




# -- keys made through the admin API ---------------------------------------------------------


def stored(key_id: str, secret: str, **kw: object) -> StoredKey:
    return StoredKey(id=key_id, hash=hash_secret(secret), deployments=["bot", "dep-x"], created=1_764_547_200, **kw)  # type: ignore[arg-type]


async def test_keys_are_put_listed_and_revoked(store: LedgerStore) -> None:
    a = stored("key-a", "sk-a", rpm=60, budget_tokens=1000, budget_period="month")
    b = stored("key-b", "sk-b")
    await store.put_key(a)
    await store.put_key(b)
    assert await store.list_keys() == [a, b]
    with pytest.raises(KeyExists):
        await store.put_key(stored("key-a", "sk-other"))  # the same id
    with pytest.raises(KeyExists):
        await store.put_key(stored("key-c", "sk-b"))  # the same secret
    assert await store.revoke_key("key-a", 1_764_547_300) is True
    assert await store.revoke_key("key-a", 1_764_547_400) is False  # once
    assert await store.revoke_key("key-zzz", 1_764_547_400) is False
    a.revoked = 1_764_547_300
    assert await store.list_keys() == [a, b]  # the revoked with their time
    with pytest.raises(KeyExists):
        await store.put_key(stored("key-a", "sk-new"))  # a revoked key's id is not given again


async def test_deployments_are_put_replaced_listed_and_deleted(store: LedgerStore) -> None:
    a = StoredDeployment(id="dep-a", name="a", spec='{"name":"a","id":"dep-a","upstreams":["http://127.0.0.1:1"]}', created=10, updated=10)
    b = StoredDeployment(id="dep-b", name="b", spec='{"name":"b"}', created=20, updated=20)
    await store.put_deployment(a)
    await store.put_deployment(b)
    assert await store.list_deployments() == [a, b]
    # The same id again replaces name, spec and updated; `created` stays.
    await store.put_deployment(StoredDeployment(id="dep-a", name="a2", spec='{"name":"a2"}', created=30, updated=30))
    assert await store.list_deployments() == [StoredDeployment(id="dep-a", name="a2", spec='{"name":"a2"}', created=10, updated=30), b]
    with pytest.raises(DeploymentExists):
        await store.put_deployment(StoredDeployment(id="dep-c", name="b", spec="{}", created=40, updated=40))  # b's name
    assert await store.delete_deployment("dep-a") is True
    assert await store.delete_deployment("dep-a") is False
    assert await store.list_deployments() == [b]


async def test_every_change_of_the_deployments_bumps_their_version_and_nothing_else_does(store: LedgerStore) -> None:
    v0 = await store.deployments_version()
    a = StoredDeployment(id="dep-a", name="a", spec='{"name":"a"}', created=10, updated=10)
    await store.put_deployment(a)
    v1 = await store.deployments_version()
    assert v1 > v0
    await store.put_deployment(StoredDeployment(id="dep-a", name="a", spec='{"name":"a","served_model":"m"}', created=10, updated=20))
    v2 = await store.deployments_version()
    assert v2 > v1
    # Refused or changing nothing: the same version (a gateway polling it lists nothing again).
    with pytest.raises(DeploymentExists):
        await store.put_deployment(StoredDeployment(id="dep-b", name="a", spec="{}", created=30, updated=30))
    assert await store.delete_deployment("dep-none") is False
    await store.put_key(stored("key-a", "sk-a"))
    await store.write([rec(1)])
    assert await store.deployments_version() == v2
    assert await store.delete_deployment("dep-a") is True
    assert await store.deployments_version() > v2
    assert await store.migrate() == schema.LATEST
    assert await store.deployments_version() > v2  # a migration run again does not reset it


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
async def test_the_version_is_shared_by_every_store_on_one_database(kind: str, tmp_path, request: pytest.FixtureRequest) -> None:
    """What another gateway process sees: a second store on the same database reads the first one's changes."""
    url = f"sqlite://{tmp_path}/ledger.db" if kind == "sqlite" else request.getfixturevalue("postgres_server").database()
    one, other = await open_store(url), await open_store(url)
    try:
        before = await other.deployments_version()
        await one.put_deployment(StoredDeployment(id="dep-a", name="a", spec="{}", created=1, updated=1))
        assert await other.deployments_version() > before
        assert [d.id for d in await other.list_deployments()] == ["dep-a"]
        after = await one.deployments_version()
        assert await other.delete_deployment("dep-a") is True
        assert await one.deployments_version() > after
        assert await one.list_deployments() == []
    finally:
        await one.close()
        await other.close()


# -- holds on keys' budgets, per gateway process ----------------------------------------------


async def test_holds_are_replaced_per_process_summed_over_the_others_and_go_stale(store: LedgerStore) -> None:
    now = 1_764_547_200_000_000
    await store.put_holds("p1", {"k1": 100, "k2": 5}, now, now - 10**7)
    await store.put_holds("p2", {"k1": 30}, now, now - 10**7)
    assert await store.other_holds("p3", now - 10**7) == {"k1": 130, "k2": 5}
    assert await store.other_holds("p1", now - 10**7) == {"k1": 30}  # never its own
    await store.put_holds("p1", {"k2": 7}, now + 1, now - 10**7)  # replaced as a whole: k1 is gone
    assert await store.other_holds("p2", now - 10**7) == {"k2": 7}
    assert await store.other_holds("p3", now + 1) == {"k2": 7}  # p2's row is older than `since`: not counted
    await store.put_holds("p1", {}, now + 2, now)  # nothing held now; and p2's row, not renewed since `now`, stays
    assert await store.other_holds("p3", 0) == {"k1": 30}
    await store.put_holds("p1", {}, now + 3, now + 1)  # p2's row is stale: dropped
    assert await store.other_holds("p3", 0) == {}
    await store.write([rec(1)])
    assert (await store.requests(RequestQuery(deployment="bot"))).data[0].request_id == "req-1"  # nothing else touched


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
async def test_holds_are_seen_by_every_store_on_one_database(kind: str, tmp_path, request: pytest.FixtureRequest) -> None:
    url = f"sqlite://{tmp_path}/ledger.db" if kind == "sqlite" else request.getfixturevalue("postgres_server").database()
    one, other = await open_store(url), await open_store(url)
    try:
        await one.put_holds("gw-1", {"team": 500}, 2_000, 0)
        await other.put_holds("gw-2", {"team": 20, "solo": 1}, 2_000, 0)
        assert await other.other_holds("gw-2", 1_000) == {"team": 500}
        assert await one.other_holds("gw-1", 1_000) == {"team": 20, "solo": 1}
    finally:
        await one.close()
        await other.close()


# -- migration 5 on a database written before it ------------------------------------------------

OLD_COLUMNS = ("ts_us", "request_id", "deployment", "replica", "key_id", "route", "status", "error_code", "prompt_tokens",
               "cached_prompt_tokens", "completion_tokens", "usage_source", "ttft_ms", "duration_ms")


def _old_database(kind: str, url: str, old: list[LedgerRecord]) -> None:
    """The schema at version 4 (as a gateway before record ids left it), with `old` in it."""
    dialect: schema.Dialect = "sqlite" if kind == "sqlite" else "postgresql"
    mark = "?" if kind == "sqlite" else "%s"
    insert = f"INSERT INTO ledger_requests ({', '.join(OLD_COLUMNS)}) VALUES ({', '.join([mark] * len(OLD_COLUMNS))})"
    values = [tuple(getattr(r, c) for c in OLD_COLUMNS) for r in old]
    statements = [sql for version, sqls in schema.statements(dialect, 0) if version <= 4 for sql in sqls]
    if kind == "sqlite":
        db = sqlite3.connect(url[len("sqlite://"):])
        with db:
            db.execute(schema.CREATE_VERSION_TABLE)
            for statement in statements:
                db.execute(statement)
            db.execute("INSERT INTO ledger_schema (version) VALUES (4)")
            db.executemany(insert, values)
        db.close()
    else:
        import psycopg

        with psycopg.connect(url) as conn:
            conn.execute(schema.CREATE_VERSION_TABLE)
            for statement in statements:
                conn.execute(statement)  # our own constant SQL
            conn.execute("INSERT INTO ledger_schema (version) VALUES (4)")
            with conn.cursor() as cur:
                cur.executemany(insert, values)


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
async def test_migrations_5_on_keep_the_rows_written_before_them(kind: str, tmp_path, request: pytest.FixtureRequest) -> None:
    url = f"sqlite://{tmp_path}/ledger.db" if kind == "sqlite" else request.getfixturevalue("postgres_server").database()
    old = [rec(1), rec(2, key="team-b"), rec(2)]  # the last two: one request id, two records, as before
    for r in old:
        r.record_id = None
    _old_database(kind, url, old)
    s = await open_store(url)
    try:
        assert await s.migrate() == schema.LATEST
        got = await all_pages(s, RequestQuery(deployment="bot", limit=2))
        assert sorted(got, key=lambda r: (r.ts_us, r.key_id or "")) == sorted(old, key=lambda r: (r.ts_us, r.key_id or ""))
        new = [rec(3), rec(4)]
        await s.write(new)
        await s.write(new)  # again: kept once
        await s.write(old)  # null ids: no conflict, as before migration 5 (the old rows stay valid)
        got = await all_pages(s, RequestQuery(deployment="bot", limit=2))
        assert [r.request_id for r in got][:2] == ["req-4", "req-3"]
        assert len(got) == 2 + 2 * len(old)
        rows = await s.usage(UsageQuery(start_us=T0, end_us=T0 + DAY_US, group_by=("key",)))
        assert [(u.key_id, u.requests) for u in rows] == [("team-a", 6), ("team-b", 2)]
    finally:
        await s.close()
