"""The response store's bounds: finished responses dropped oldest first, running background ones never."""

from __future__ import annotations

import pytest

from streamproxy.apis.responses.store import ResponseStore
from streamproxy.errors import InvalidRequest, NotFound, RateLimited


class Running:
    def snapshot(self) -> bytes:
        return b"running"


def test_running_entries_are_kept_and_bounded():
    store = ResponseStore(2)
    store.start("a", Running())
    store.keep("b", b"B")
    store.keep("c", b"C")  # over 2: the oldest finished ("b") goes, not the running "a"
    assert [store.get(rid) for rid in ("a", "c")] == [b"running", b"C"]
    with pytest.raises(NotFound):
        store.get("b")
    store.start("d", Running())  # "c" goes
    with pytest.raises(RateLimited):
        store.start("e", Running())  # two running: the bound
    assert store.running == 2 and len(store) == 2
    store.keep("a", b"other")  # a synchronous response never replaces a running one
    assert store.get("a") == b"running"
    assert isinstance(store.cancellable("a"), Running)
    store.end("a", b"A")
    assert (store.get("a"), store.running) == (b"A", 1)
    with pytest.raises(InvalidRequest, match="Cannot cancel a synchronous response."):
        store.cancellable("a")
    store.end("d", None)  # a streamed one stays, finished (its entry answers)
    assert store.get("d") == b"running" and store.running == 0
    with pytest.raises(InvalidRequest):
        store.cancellable("d")
