"""`SqliteStore`: the embedded default; stdlib sqlite3 in one worker thread of its own.

One connection, opened and used only by the store's single-thread executor
(sqlite3 connections belong to a thread), so the event loop only awaits a
future. WAL journal: readers (the query API, `streamproxy usage` in another
process) never block the writer, and `synchronous=NORMAL` makes a commit
cost no fsync (a power cut may lose the last commits; a crashed process
loses nothing committed). `busy_timeout`: several gateway processes on one
file wait for each other's write lock instead of failing. A batch is one
transaction. A file that cannot be written (a full disk, permissions) makes
`write` raise: the writer keeps the batch and tries again.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

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
BUSY_TIMEOUT_MS = 5000


class SqliteStore:
    def __init__(self, path: str) -> None:
        self.path = path
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ledger-sqlite",
                                        initializer=name_this_thread, initargs=("ledger-sqlite",))
        self._db: sqlite3.Connection | None = None
        self._closed = False
        self._insert = sql.insert("sqlite")

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, self._call, fn)

    def _call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._db is None:
            self._db = self._connect()
        return fn(self._db)

    def _connect(self) -> sqlite3.Connection:
        folder = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(folder, exist_ok=True)
        db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None, check_same_thread=False)
        try:
            db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            mode = db.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise sqlite3.OperationalError(f"{self.path}: the WAL journal mode is not available (got {mode})")
            db.execute("PRAGMA synchronous = NORMAL")
        except BaseException:
            db.close()
            raise
        return db

    async def migrate(self) -> int:
        return await self._run(_migrate)

    async def write(self, records: Sequence[LedgerRecord]) -> None:
        rows = [row(r) for r in records]
        insert = self._insert

        def write(db: sqlite3.Connection) -> None:
            db.execute("BEGIN IMMEDIATE")
            try:
                db.executemany(insert, rows)
                db.execute("COMMIT")
            except BaseException:
                _rollback(db)
                raise

        try:
            await self._run(write)
        except sqlite3.Error:
            # The next try opens the file anew (it may have come back, or been replaced).
            await asyncio.get_running_loop().run_in_executor(self._pool, self._drop)
            raise

    def _drop(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    async def requests(self, query: RequestQuery) -> RequestPage:
        text, args = sql.requests("sqlite", query)
        rows = await self._run(lambda db: db.execute(text, args).fetchall())
        data = [record_of(r[1:]) for r in rows[: query.limit]]
        cursor = sql.next_cursor(rows, query.limit)
        return RequestPage(data=data, has_more=cursor is not None, next_cursor=cursor)

    async def usage(self, query: UsageQuery) -> list[UsageRow]:
        text, args = sql.usage("sqlite", query)
        rows = await self._run(lambda db: db.execute(text, args).fetchall())
        return sort_usage([usage_row(d, k, p, n, a, b, c) for d, k, p, n, a, b, c in rows if n])

    async def put_key(self, key: StoredKey) -> None:
        text, values = sql.put_key("sqlite"), sql.key_row(key)

        def put(db: sqlite3.Connection) -> None:
            db.execute(text, values)

        try:
            await self._run(put)
        except sqlite3.IntegrityError:
            raise KeyExists(key.id) from None

    async def list_keys(self) -> list[StoredKey]:
        rows = await self._run(lambda db: db.execute(sql.LIST_KEYS).fetchall())
        return [sql.key_of(r) for r in rows]

    async def revoke_key(self, key_id: str, when: int) -> bool:
        text = sql.revoke_key("sqlite")
        return bool(await self._run(lambda db: db.execute(text, (when, key_id)).rowcount))

    async def put_deployment(self, deployment: StoredDeployment) -> None:
        text, values = sql.put_deployment("sqlite"), sql.deployment_row(deployment)
        try:
            await self._run(lambda db: _changed(db, text, values))
        except sqlite3.IntegrityError:
            raise DeploymentExists(deployment.name) from None

    async def list_deployments(self) -> list[StoredDeployment]:
        rows = await self._run(lambda db: db.execute(sql.LIST_DEPLOYMENTS).fetchall())
        return [sql.deployment_of(r) for r in rows]

    async def delete_deployment(self, deployment_id: str) -> bool:
        text = sql.delete_deployment("sqlite")
        return bool(await self._run(lambda db: _changed(db, text, (deployment_id,))))

    async def deployments_version(self) -> int:
        found = await self._run(lambda db: db.execute(sql.DEPLOYMENTS_VERSION).fetchone())
        return int(found[0])

    async def put_holds(self, process: str, holds: Mapping[str, int], now_us: int, stale_us: int) -> None:
        drop, insert = sql.drop_holds("sqlite"), sql.insert_hold("sqlite")
        rows = [(process, key_id, tokens, now_us) for key_id, tokens in holds.items()]

        def put(db: sqlite3.Connection) -> None:
            db.execute("BEGIN IMMEDIATE")
            try:
                db.execute(drop, (process, stale_us))
                db.executemany(insert, rows)
                db.execute("COMMIT")
            except BaseException:
                _rollback(db)
                raise

        await self._run(put)

    async def other_holds(self, process: str, since_us: int) -> dict[str, int]:
        text = sql.other_holds("sqlite")
        rows = await self._run(lambda db: db.execute(text, (process, since_us)).fetchall())
        return {key_id: int(tokens) for key_id, tokens in rows}

    async def close(self) -> None:
        """Once; again is a no-op."""
        if self._closed:
            return
        self._closed = True
        try:
            await asyncio.get_running_loop().run_in_executor(self._pool, self._drop)
        finally:
            self._pool.shutdown(wait=True)



def _migrate(db: sqlite3.Connection) -> int:
    db.execute("BEGIN IMMEDIATE")  # the write lock: another process migrating waits here
    try:
        db.execute(schema.CREATE_VERSION_TABLE)
        found = db.execute("SELECT version FROM ledger_schema").fetchone()
        version = found[0] if found else 0
        schema.check_known(version)
        for number, statements in schema.statements("sqlite", version):
            for statement in statements:
                db.execute(statement)
            version = number
        if found is None:
            db.execute("INSERT INTO ledger_schema (version) VALUES (?)", (version,))
        else:
            db.execute("UPDATE ledger_schema SET version = ?", (version,))
        db.execute("COMMIT")
    except BaseException:
        _rollback(db)
        raise
    return version


def _changed(db: sqlite3.Connection, text: str, values: tuple[object, ...]) -> int:
    """A change of ledger_deployments and, when it changed a row, the counter's bump: one transaction."""
    db.execute("BEGIN IMMEDIATE")
    try:
        count = db.execute(text, values).rowcount
        if count:
            db.execute(sql.BUMP_DEPLOYMENTS)
        db.execute("COMMIT")
    except BaseException:
        _rollback(db)
        raise
    return count


def _rollback(db: sqlite3.Connection) -> None:
    if db.in_transaction:
        db.execute("ROLLBACK")
