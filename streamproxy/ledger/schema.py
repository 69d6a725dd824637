"""The ledger's tables, as numbered migrations in both SQL dialects. Sans-IO.

`ledger_schema` holds one row: the version the database is at. At start the
store runs, in one transaction (under a lock: several gateways may start at
once), every migration past that version, in order, and records the new
version. A database at a version newer than this code knows is refused (an
older gateway must not write to a schema it does not understand). A
migration is never edited once released: a change is a new one.
"""

from __future__ import annotations

from typing import Literal

Dialect = Literal["sqlite", "postgresql"]

_TYPES = {
    "sqlite": {"SEQ": "INTEGER PRIMARY KEY AUTOINCREMENT", "BIGINT": "INTEGER", "FLOAT": "REAL"},
    "postgresql": {"SEQ": "BIGSERIAL PRIMARY KEY", "BIGINT": "BIGINT", "FLOAT": "DOUBLE PRECISION"},
}

# (version, statements); {SEQ}, {BIGINT}, {FLOAT} per dialect.
MIGRATIONS: tuple[tuple[int, tuple[str, ...]], ...] = (
    (1, (
        """CREATE TABLE ledger_requests (
            seq {SEQ},
            ts_us {BIGINT} NOT NULL,
            request_id TEXT NOT NULL,
            deployment TEXT,
            replica TEXT,
            key_id TEXT,
            route TEXT NOT NULL,
            status INTEGER NOT NULL,
            error_code TEXT,
            prompt_tokens {BIGINT},
            cached_prompt_tokens {BIGINT},
            completion_tokens {BIGINT},
            usage_source TEXT,
            ttft_ms {FLOAT},
            duration_ms {FLOAT} NOT NULL
        )""",
        # A deployment's requests, newest first; usage over a time range.
        "CREATE INDEX ledger_requests_deployment_time ON ledger_requests (deployment, ts_us, seq)",
        "CREATE INDEX ledger_requests_time ON ledger_requests (ts_us)",
    )),
    (2, (
        # API keys made through POST /v1/keys: the secret's SHA-256, never the secret.
        """CREATE TABLE ledger_keys (
            id TEXT PRIMARY KEY,
            hash TEXT NOT NULL UNIQUE,
            deployments TEXT NOT NULL,
            rpm INTEGER NOT NULL,
            tpm INTEGER NOT NULL,
            budget_tokens {BIGINT},
            budget_period TEXT,
            created {BIGINT} NOT NULL,
            revoked {BIGINT}
        )""",
        # A key's budget: its tokens since the period began.
        "CREATE INDEX ledger_requests_key_time ON ledger_requests (key_id, ts_us)",
    )),
    (3, (
        # Deployments made through POST /v1/deployments: their config entry as JSON.
        """CREATE TABLE ledger_deployments (
            id TEXT PRIMARY KEY,
            name TEXT NOT NULL UNIQUE,
            spec TEXT NOT NULL,
            created {BIGINT} NOT NULL,
            updated {BIGINT} NOT NULL
        )""",
    )),
    (4, (
        # Counters of changes: a gateway polls one row to learn that another changed something
        # (`deployments`: bumped in the transaction of every put or delete of ledger_deployments).
        """CREATE TABLE ledger_changes (
            name TEXT PRIMARY KEY,
            version {BIGINT} NOT NULL
        )""",
        "INSERT INTO ledger_changes (name, version) VALUES ('deployments', 0)",
    )),
    (5, (
        # Each record's own id (records.new_record_id), stored once: a batch written again after a
        # commit whose answer was lost adds nothing (the stores' inserts skip an id already there).
        # Rows written before have none: NULLs never conflict with each other in a unique index.
        "ALTER TABLE ledger_requests ADD COLUMN record_id TEXT",
        "CREATE UNIQUE INDEX ledger_requests_record_id ON ledger_requests (record_id)",
    )),
    (6, (
        # What each gateway process holds against keys' budgets and has not yet written (its requests
        # running, its records still buffered), per key: rewritten by that process about once a second
        # (gateway/keyring.py), so that the others count it too; a row not renewed goes stale.
        """CREATE TABLE ledger_holds (
            process TEXT NOT NULL,
            key_id TEXT NOT NULL,
            tokens {BIGINT} NOT NULL,
            updated_us {BIGINT} NOT NULL,
            PRIMARY KEY (process, key_id)
        )""",
    )),
    (7, (
        # The gateway's: every replica a request's attempts went to, in order (a JSON array of URLs), and
        # how often its stream moved on to another (stream migration). Rows written before: NULL.
        "ALTER TABLE ledger_requests ADD COLUMN replicas TEXT",
        "ALTER TABLE ledger_requests ADD COLUMN migrations INTEGER",
    )),
)

LATEST = MIGRATIONS[-1][0]

CREATE_VERSION_TABLE = "CREATE TABLE IF NOT EXISTS ledger_schema (version INTEGER NOT NULL)"


def statements(dialect: Dialect, after: int) -> list[tuple[int, list[str]]]:
    """The migrations past version `after`, their SQL in `dialect`."""
    types = _TYPES[dialect]
    return [(version, [sql.format(**types) for sql in sqls]) for version, sqls in MIGRATIONS if version > after]


class SchemaTooNew(RuntimeError):
    pass


def check_known(version: int) -> None:
    if version > LATEST:
        raise SchemaTooNew(f"the ledger's schema is at version {version}, newer than this streamproxy knows ({LATEST}): upgrade it")
