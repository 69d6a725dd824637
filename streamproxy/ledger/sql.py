"""The SQL both stores run, built once per query shape and dialect. Sans-IO.

Placeholders are `?` (sqlite3) or `%s` (psycopg); every value is a
parameter, never text in the statement. The day or month of a record is
computed in the database from `ts_us`, in UTC, as `records.period_of` does.
"""

from __future__ import annotations

import json

from streamproxy.ledger.deployments import COLUMNS as DEPLOYMENT_COLUMNS
from streamproxy.ledger.deployments import StoredDeployment
from streamproxy.ledger.keys import StoredKey
from streamproxy.ledger.records import COLUMNS, Cursor, RequestQuery, UsageQuery
from streamproxy.ledger.schema import Dialect

_PLACEHOLDER = {"sqlite": "?", "postgresql": "%s"}


def insert(dialect: Dialect) -> str:
    """One record; nothing when its `record_id` is stored already (a batch written again). Not
    `INSERT OR IGNORE`: that would also skip a row breaking NOT NULL, where the batch must fail."""
    marks = ", ".join([_PLACEHOLDER[dialect]] * len(COLUMNS))
    return f"INSERT INTO ledger_requests ({', '.join(COLUMNS)}) VALUES ({marks}) ON CONFLICT (record_id) DO NOTHING"


# PostgreSQL: a batch is COPied into a temporary table of the same columns (emptied at each commit),
# then moved with one INSERT that skips the ids already stored (COPY itself cannot skip a row).
BATCH_TABLE = (f"CREATE TEMPORARY TABLE IF NOT EXISTS ledger_batch ON COMMIT DELETE ROWS AS "
               f"SELECT {', '.join(COLUMNS)} FROM ledger_requests WITH NO DATA")
COPY_BATCH = f"COPY ledger_batch ({', '.join(COLUMNS)}) FROM STDIN"
MOVE_BATCH = (f"INSERT INTO ledger_requests ({', '.join(COLUMNS)}) SELECT {', '.join(COLUMNS)} FROM ledger_batch "
              "ON CONFLICT (record_id) DO NOTHING")


def requests(dialect: Dialect, q: RequestQuery) -> tuple[str, list[object]]:
    """The page's rows (`seq` first, then COLUMNS), one more than the limit (whether there are more)."""
    p = _PLACEHOLDER[dialect]
    where = [f"deployment = {p}", f"ts_us >= {p}", f"ts_us < {p}"]
    args: list[object] = [q.deployment, q.start_us, q.end_us]
    if q.key_id is not None:
        where.append(f"key_id = {p}")
        args.append(q.key_id)
    if q.status is not None:
        where.append(f"status = {p}")
        args.append(q.status)
    if q.status_class is not None:
        where.append(f"status >= {p} AND status < {p}")
        args += [q.status_class * 100, q.status_class * 100 + 100]
    if q.cursor is not None:
        where.append(f"(ts_us < {p} OR (ts_us = {p} AND seq < {p}))")
        args += [q.cursor.ts_us, q.cursor.ts_us, q.cursor.seq]
    args.append(q.limit + 1)
    text = (f"SELECT seq, {', '.join(COLUMNS)} FROM ledger_requests WHERE {' AND '.join(where)} "
            f"ORDER BY ts_us DESC, seq DESC LIMIT {p}")
    return text, args


_TS = 1 + COLUMNS.index("ts_us")  # in a `requests` row: seq, then COLUMNS


def next_cursor(rows: list[tuple], limit: int) -> str | None:
    if len(rows) <= limit:
        return None
    last = rows[limit - 1]
    return Cursor(last[_TS], last[0]).encode()


def _period(dialect: Dialect, period: str) -> str:
    if dialect == "sqlite":
        return f"strftime('{'%Y-%m-%d' if period == 'day' else '%Y-%m'}', ts_us / 1000000, 'unixepoch')"
    return f"to_char(to_timestamp(ts_us / 1000000) AT TIME ZONE 'UTC', '{'YYYY-MM-DD' if period == 'day' else 'YYYY-MM'}')"


def usage(dialect: Dialect, q: UsageQuery) -> tuple[str, list[object]]:
    """Rows of (deployment, key_id, period, requests, prompt, cached, completion); a dimension not
    grouped by is NULL."""
    p = _PLACEHOLDER[dialect]
    period = q.period
    dims = [
        "deployment" if "deployment" in q.group_by else "NULL",
        "key_id" if "key" in q.group_by else "NULL",
        _period(dialect, period) if period else "NULL",
    ]
    where = [f"ts_us >= {p}", f"ts_us < {p}"]
    args: list[object] = [q.start_us, q.end_us]
    if q.deployment is not None:
        where.append(f"deployment = {p}")
        args.append(q.deployment)
    if q.key_id is not None:
        where.append(f"key_id = {p}")
        args.append(q.key_id)
    grouped = [str(i + 1) for i, d in enumerate(dims) if d != "NULL"]
    text = (
        f"SELECT {dims[0]}, {dims[1]}, {dims[2]}, COUNT(*), COALESCE(SUM(prompt_tokens), 0), "
        f"COALESCE(SUM(cached_prompt_tokens), 0), COALESCE(SUM(completion_tokens), 0) "
        f"FROM ledger_requests WHERE {' AND '.join(where)}"
        + (f" GROUP BY {', '.join(grouped)}" if grouped else "")
    )
    return text, args


KEY_COLUMNS = ("id", "hash", "deployments", "rpm", "tpm", "budget_tokens", "budget_period", "created", "revoked")


def put_key(dialect: Dialect) -> str:
    marks = ", ".join([_PLACEHOLDER[dialect]] * len(KEY_COLUMNS))
    return f"INSERT INTO ledger_keys ({', '.join(KEY_COLUMNS)}) VALUES ({marks})"


def key_row(key: StoredKey) -> tuple[object, ...]:
    return (key.id, key.hash, json.dumps(key.deployments), key.rpm, key.tpm, key.budget_tokens, key.budget_period, key.created,
            key.revoked)


def key_of(values: tuple) -> StoredKey:
    fields = dict(zip(KEY_COLUMNS, values))
    fields["deployments"] = json.loads(fields["deployments"])
    return StoredKey(**fields)


LIST_KEYS = f"SELECT {', '.join(KEY_COLUMNS)} FROM ledger_keys ORDER BY created, id"


def revoke_key(dialect: Dialect) -> str:
    p = _PLACEHOLDER[dialect]
    return f"UPDATE ledger_keys SET revoked = {p} WHERE id = {p} AND revoked IS NULL"


def put_deployment(dialect: Dialect) -> str:
    """Insert, or replace the row of the same id (its `created` stays)."""
    marks = ", ".join([_PLACEHOLDER[dialect]] * len(DEPLOYMENT_COLUMNS))
    return (
        f"INSERT INTO ledger_deployments ({', '.join(DEPLOYMENT_COLUMNS)}) VALUES ({marks}) "
        "ON CONFLICT (id) DO UPDATE SET name = excluded.name, spec = excluded.spec, updated = excluded.updated"
    )


def deployment_row(d: StoredDeployment) -> tuple[object, ...]:
    return (d.id, d.name, d.spec, d.created, d.updated)


def deployment_of(values: tuple) -> StoredDeployment:
    return StoredDeployment(**dict(zip(DEPLOYMENT_COLUMNS, values)))


LIST_DEPLOYMENTS = f"SELECT {', '.join(DEPLOYMENT_COLUMNS)} FROM ledger_deployments ORDER BY created, id"


def delete_deployment(dialect: Dialect) -> str:
    return f"DELETE FROM ledger_deployments WHERE id = {_PLACEHOLDER[dialect]}"


# The counter every put or delete of a deployment bumps in its own transaction (migration 4).
BUMP_DEPLOYMENTS = "UPDATE ledger_changes SET version = version + 1 WHERE name = 'deployments'"
DEPLOYMENTS_VERSION = "SELECT version FROM ledger_changes WHERE name = 'deployments'"


# Holds on keys' budgets (migration 6): a process's rows replaced at once; the others' summed.
def drop_holds(dialect: Dialect) -> str:
    """This process's rows, and any not renewed since a time (a process gone without a word)."""
    p = _PLACEHOLDER[dialect]
    return f"DELETE FROM ledger_holds WHERE process = {p} OR updated_us < {p}"


def insert_hold(dialect: Dialect) -> str:
    p = _PLACEHOLDER[dialect]
    return f"INSERT INTO ledger_holds (process, key_id, tokens, updated_us) VALUES ({p}, {p}, {p}, {p})"


def other_holds(dialect: Dialect) -> str:
    p = _PLACEHOLDER[dialect]
    return f"SELECT key_id, SUM(tokens) FROM ledger_holds WHERE process <> {p} AND updated_us >= {p} GROUP BY key_id"
