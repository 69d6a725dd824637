"""Watch the writer's push sink (streamproxy.http.body.StreamBody.push) from a test.

`spy_pushes(monkeypatch)` wraps `StreamBody.push` and returns the list it
fills: one `(request id, whether the sink took the step)` per call. The
`pushes` fixture (tests/conftest.py) is this, for any test folder.
`keep(into)` is a push sink (`OutputStream.arm`) that appends every step to
`into` and takes it.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from engine_adapter.base import Delta
from streamproxy.http.body import StreamBody


def keep(into: list[list[Delta]]) -> Callable[[list[Delta]], bool]:
    """A sink for `arm` that keeps every step it is handed and takes it."""

    def sink(deltas: list[Delta]) -> bool:
        into.append(deltas)
        return True

    return sink


def spy_pushes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str | None, bool]]:
    calls: list[tuple[str | None, bool]] = []
    original = StreamBody.push

    def spy(self: StreamBody, deltas):
        took = original(self, deltas)
        calls.append((self.record.request_id if self.record else None, took))
        return took

    monkeypatch.setattr(StreamBody, "push", spy)
    return calls
