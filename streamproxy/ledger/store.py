"""`LedgerStore`: what the ledger needs of a database, and `open_store(url)` to pick one.

`write` stores a batch in one transaction (all or none); `requests` pages a deployment's records newest
first, `usage` sums them; `migrate` brings the schema up. Admin-made keys (`put_key`, `list_keys`,
`revoke_key`), deployments (`put_deployment`, ..., with `deployments_version` that gateways poll) and
each process's budget holds (`put_holds`, `other_holds`) live here too. Implementations: memory,
sqlite, postgres, one contract (tests/contract/test_ledger_store.py). URLs: `sqlite:///abs/path.db`
(or `sqlite:relative.db`), `postgresql://...` (or `postgres://`), `memory:`, `off`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Protocol

from streamproxy.ledger.deployments import StoredDeployment
from streamproxy.ledger.keys import KeyExists, StoredKey
from streamproxy.ledger.records import LedgerRecord, RequestPage, RequestQuery, UsageQuery, UsageRow


class LedgerStore(Protocol):
    async def migrate(self) -> int: ...

    async def put_key(self, key: StoredKey) -> None: ...

    async def list_keys(self) -> list[StoredKey]: ...

    async def revoke_key(self, key_id: str, when: int) -> bool: ...

    async def put_deployment(self, deployment: StoredDeployment) -> None:
        """Insert, or replace the one of the same id (keeping its `created`); `DeploymentExists` when
        another id has its name."""

    async def list_deployments(self) -> list[StoredDeployment]: ...

    async def delete_deployment(self, deployment_id: str) -> bool: ...

    async def deployments_version(self) -> int:
        """A number that grows with every put, and every delete that removed one, of a deployment by
        any process sharing the store (committed with it): one cheap read tells a gateway whether to
        list them again."""

    async def put_holds(self, process: str, holds: Mapping[str, int], now_us: int, stale_us: int) -> None:
        """Replace, in one transaction, what `process` holds per key id against keys' budgets with
        `holds` (stamped `now_us`), and drop every row not renewed since `stale_us`."""

    async def other_holds(self, process: str, since_us: int) -> dict[str, int]:
        """The tokens every other process holds per key id, from rows renewed since `since_us`."""

    async def write(self, records: Sequence[LedgerRecord]) -> None: ...

    async def requests(self, query: RequestQuery) -> RequestPage: ...

    async def usage(self, query: UsageQuery) -> list[UsageRow]: ...

    async def close(self) -> None: ...


__all__ = ["KeyExists", "LedgerStore", "LedgerURLError", "open_store"]


class LedgerURLError(ValueError):
    pass


OFF = ("off", "none", "false", "")


def default_path() -> str:
    """Where the ledger is when the config names none: `$STREAMPROXY_LEDGER` (a URL), else
    `$XDG_STATE_HOME/streamproxy/ledger.db` (~/.local/state/streamproxy/ledger.db)."""
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(state, "streamproxy", "ledger.db")


def default_url() -> str:
    return os.environ.get("STREAMPROXY_LEDGER") or "sqlite://" + os.path.abspath(default_path())


def kind(url: str) -> str:
    """"sqlite", "postgresql", "memory" or "off"; LedgerURLError for anything else."""
    lowered = url.strip().lower()
    if lowered in OFF:
        return "off"
    if lowered.startswith("sqlite:"):
        return "sqlite"
    if lowered.startswith(("postgresql://", "postgres://")):
        return "postgresql"
    if lowered == "memory:":
        return "memory"
    raise LedgerURLError(f"{redact(url)!r} is not a ledger URL: use sqlite:///path/to/ledger.db, postgresql://..., or off")


def sqlite_path(url: str) -> str:
    """`sqlite:///abs/x.db` -> /abs/x.db; `sqlite:x.db` or `sqlite://x.db` -> x.db."""
    rest = url.strip()[len("sqlite:"):]
    if rest.startswith("///"):
        return "/" + rest[3:]
    if rest.startswith("//"):
        return rest[2:]
    if not rest:
        raise LedgerURLError("a sqlite ledger URL needs a path: sqlite:///path/to/ledger.db")
    return rest


def redact(url: str) -> str:
    """The URL without its password, for messages and logs."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    userinfo, at, host = rest.rpartition("@")
    user = userinfo.split(":", 1)[0]
    return f"{scheme}://{user}{':***' if ':' in userinfo else ''}@{host}"


async def open_store(url: str) -> LedgerStore:
    """The store `url` names, connected and migrated; LedgerURLError for a bad URL, and whatever the
    database raises (OSError, sqlite3.Error, psycopg.Error) when it cannot be reached."""
    which = kind(url)
    store: LedgerStore
    if which == "sqlite":
        from streamproxy.ledger.sqlite import SqliteStore

        store = SqliteStore(sqlite_path(url))
    elif which == "postgresql":
        from streamproxy.ledger.postgres import PostgresStore

        store = PostgresStore(url)
    elif which == "memory":
        from streamproxy.ledger.memory import MemoryStore

        store = MemoryStore()
    else:
        raise LedgerURLError("the ledger is off")
    try:
        await store.migrate()
    except BaseException:
        await store.close()
        raise
    return store
