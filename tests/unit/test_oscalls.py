"""`oscalls.name_this_thread` sets the OS-level name /proc shows for the calling thread (15 bytes at most)."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from streamproxy.oscalls import name_this_thread

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="prctl(PR_SET_NAME) is Linux's")


def _named(name: str) -> str:
    seen: list[str] = []

    def run() -> None:
        name_this_thread(name)
        seen.append(Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text().strip())

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return seen[0]


def test_a_thread_names_itself_for_the_os() -> None:
    assert _named("ledger-sqlite") == "ledger-sqlite"


def test_a_long_name_is_cut_to_fifteen_bytes() -> None:
    assert _named("ledger-postgres-writer") == "ledger-postgres"
