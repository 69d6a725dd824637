"""Every kind of `LedgerStore` (streamproxy/ledger/store.py) for a test, open and closed after it.

    async def test_x(store: LedgerStore) -> None: ...   # the fixture, a plugin of tests/conftest.py

`store` is parametrized over the kinds: "memory" (the fake), "sqlite" (a file
under the test's tmp_path), "postgresql" (a fresh database on the session's
real server, `postgres_server` in tests/conftest.py, asked for only by that
kind, so the others run where PostgreSQL cannot).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from streamproxy.ledger.store import LedgerStore, open_store

KINDS = ("memory", "sqlite", "postgresql")


@pytest.fixture(params=KINDS)
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[LedgerStore]:
    if request.param == "memory":
        url = "memory:"
    elif request.param == "sqlite":
        url = f"sqlite://{tmp_path}/ledger.db"
    else:
        url = request.getfixturevalue("postgres_server").database()
    s = await open_store(url)
    try:
        yield s
    finally:
        await s.close()
