"""`PostgresStore`: the ledger in PostgreSQL, for several gateway processes or machines (psycopg 3, async).

Two connections, opened on first use and again after any failure: the writer's is blocking, in a thread
of its own (encoding rows for COPY, the ledger's largest CPU cost, stays off the loop; a batch is one
transaction: COPY into a temporary table, then `INSERT ... SELECT` skipping stored record ids); queries
use an asyncio one, so a slow report never holds up the writer. Every operation has a deadline
(`TIMEOUT`, `tcp_user_timeout`, `statement_timeout`). Migrations run under an advisory lock.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import psycopg

from streamproxy.ledger import schema, sql
from streamproxy.ledger.deployments import DeploymentExists, StoredDeployment
from streamproxy.ledger.keys import KeyExists, StoredKey
from streamproxy.ledger.records import (
    LedgerRecord,
    RequestPage,
    RequestQuery,
    UsageQuery,
    UsageRow,
    record_of,
    row,
    sort_usage,
    usage_row,
)
from streamproxy.oscalls import name_this_thread

T = TypeVar("T")
CONNECT_TIMEOUT = 5  # s, libpq's connect_timeout
TIMEOUT = 15.0  # s, any one operation
_LOCK = 0x1ED6E2  # the advisory lock migrations hold


class PostgresStore:
    def __init__(self, url: str) -> None:
        self.url = url
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ledger-postgres",
                                        initializer=name_this_thread, initargs=("ledger-postgres",))
        self._writer: psycopg.Connection[Any] | None = None  # used in the pool's thread only
        self._reader: psycopg.AsyncConnection[Any] | None = None
        self._closed = False

    async def _connect(self) -> psycopg.AsyncConnection[Any]:
        return await psycopg.AsyncConnection.connect(self.url, connect_timeout=CONNECT_TIMEOUT, application_name="streamproxy-ledger")

    async def migrate(self) -> int:
        async with asyncio.timeout(TIMEOUT):
            conn = await self._connect()
            try:
                async with conn.transaction():
                    await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK,))
                    await conn.execute(schema.CREATE_VERSION_TABLE)
                    found = await (await conn.execute("SELECT version FROM ledger_schema")).fetchone()
                    version = int(found[0]) if found else 0
                    schema.check_known(version)
                    for number, statements in schema.statements("postgresql", version):
                        for statement in statements:
                            await conn.execute(statement)  # our own constant SQL
                        version = number
                    if found is None:
                        await conn.execute("INSERT INTO ledger_schema (version) VALUES (%s)", (version,))
                    else:
                        await conn.execute("UPDATE ledger_schema SET version = %s", (version,))
                return version
            finally:
                await conn.close()

    async def write(self, records: Sequence[LedgerRecord]) -> None:
        await asyncio.get_running_loop().run_in_executor(self._pool, self._write, records)

    def _write(self, records: Sequence[LedgerRecord]) -> None:
        """In the pool's thread."""
        try:
            if self._writer is None or self._writer.closed:
                self._writer = psycopg.Connection.connect(
                    self.url, connect_timeout=CONNECT_TIMEOUT, application_name="streamproxy-ledger",
                    tcp_user_timeout=int(TIMEOUT * 1000), options=f"-c statement_timeout={int(TIMEOUT * 1000)}",
                )
                self._writer.execute(sql.BATCH_TABLE)  # this connection's, emptied at each commit
                self._writer.commit()
            conn = self._writer
            with conn.transaction(), conn.cursor() as cur:
                with cur.copy(sql.COPY_BATCH) as copy:
                    for r in records:
                        copy.write_row(row(r))
                cur.execute(sql.MOVE_BATCH)
        except BaseException:
            self._drop_writer()
            raise

    def _drop_writer(self) -> None:
        conn, self._writer = self._writer, None
        if conn is not None:
            try:
                conn.close()
            except Exception:
                pass

    async def put_key(self, key: StoredKey) -> None:
        try:
            await self._query(sql.put_key("postgresql"), list(sql.key_row(key)), rows=False)
        except psycopg.errors.UniqueViolation:
            raise KeyExists(key.id) from None

    async def list_keys(self) -> list[StoredKey]:
        return [sql.key_of(r) for r in await self._query(sql.LIST_KEYS, [])]

    async def revoke_key(self, key_id: str, when: int) -> bool:
        return bool(await self._query(sql.revoke_key("postgresql"), [when, key_id], rows=False))

    async def put_deployment(self, deployment: StoredDeployment) -> None:
        try:
            await self._query(sql.put_deployment("postgresql"), list(sql.deployment_row(deployment)), rows=False,
                              then=sql.BUMP_DEPLOYMENTS)
        except psycopg.errors.UniqueViolation:
            raise DeploymentExists(deployment.name) from None

    async def list_deployments(self) -> list[StoredDeployment]:
        return [sql.deployment_of(r) for r in await self._query(sql.LIST_DEPLOYMENTS, [])]

    async def delete_deployment(self, deployment_id: str) -> bool:
        return bool(await self._query(sql.delete_deployment("postgresql"), [deployment_id], rows=False, then=sql.BUMP_DEPLOYMENTS))

    async def deployments_version(self) -> int:
        return int((await self._query(sql.DEPLOYMENTS_VERSION, []))[0][0])

    async def _query(self, text: str, args: list[object], rows: bool = True, then: str | None = None) -> Any:
        """The rows, or (`rows=False`) the count of rows changed; `then`: a statement run in the same
        transaction when `text` changed a row (a counter's bump)."""

        async def work(conn: psycopg.AsyncConnection[Any]) -> Any:
            if then is not None:
                async with conn.transaction():
                    cur = await conn.execute(text, args)  # built from our own constants
                    if cur.rowcount:
                        await conn.execute(then)
                return cur.rowcount
            cur = await conn.execute(text, args)
            return await cur.fetchall() if rows else cur.rowcount

        return await self._use(work)

    async def _use(self, work: Callable[[psycopg.AsyncConnection[Any]], Awaitable[T]]) -> T:
        """`work` on the query connection (autocommit), within `TIMEOUT`; any failure but a refused
        statement drops the connection (the next use opens another)."""
        try:
            async with asyncio.timeout(TIMEOUT):
                if self._reader is None or self._reader.closed:
                    self._reader = await self._connect()
                    await self._reader.set_autocommit(True)
                return await work(self._reader)
        except psycopg.errors.IntegrityError:
            raise  # the connection is fine: the statement was refused
        except BaseException:
            conn, self._reader = self._reader, None
            if conn is not None:
                await _close(conn)
            raise

    async def put_holds(self, process: str, holds: Mapping[str, int], now_us: int, stale_us: int) -> None:
        rows = [(process, key_id, tokens, now_us) for key_id, tokens in holds.items()]

        async def work(conn: psycopg.AsyncConnection[Any]) -> None:
            async with conn.transaction():
                await conn.execute(sql.drop_holds("postgresql"), (process, stale_us))  # our own constant SQL
                if rows:
                    async with conn.cursor() as cur:
                        await cur.executemany(sql.insert_hold("postgresql"), rows)

        await self._use(work)

    async def other_holds(self, process: str, since_us: int) -> dict[str, int]:
        rows = await self._query(sql.other_holds("postgresql"), [process, since_us])
        return {key_id: int(tokens) for key_id, tokens in rows}

    async def requests(self, query: RequestQuery) -> RequestPage:
        rows = await self._query(*sql.requests("postgresql", query))
        data = [record_of(r[1:]) for r in rows[: query.limit]]
        cursor = sql.next_cursor(rows, query.limit)
        return RequestPage(data=data, has_more=cursor is not None, next_cursor=cursor)

    async def usage(self, query: UsageQuery) -> list[UsageRow]:
        rows = await self._query(*sql.usage("postgresql", query))
        return sort_usage([usage_row(d, k, p, int(n), int(a), int(b), int(c)) for d, k, p, n, a, b, c in rows if n])

    async def close(self) -> None:
        """Once; again is a no-op."""
        if self._closed:
            return
        self._closed = True
        try:
            await asyncio.get_running_loop().run_in_executor(self._pool, self._drop_writer)
        finally:
            self._pool.shutdown(wait=True)
            conn, self._reader = self._reader, None
            if conn is not None:
                await _close(conn)


async def _close(conn: psycopg.AsyncConnection[Any]) -> None:
    try:
        await asyncio.wait_for(conn.close(), 2.0)
    except Exception:
        pass
