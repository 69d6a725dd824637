"""Watch the writer's push sink (streamproxy.http.writer._Pump) from a test.

`spy_pushes(monkeypatch)` wraps `_Pump.push` and returns the list it
fills: one `(request id, whether the sink took the step)` per call. The
`pushes` fixture (tests/conftest.py) is this, for any test folder.
"""

from __future__ import annotations

import pytest

from streamproxy.http import writer


def spy_pushes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str | None, bool]]:
    calls: list[tuple[str | None, bool]] = []
    original = writer._Pump.push

    def spy(self: writer._Pump, deltas):  # type: ignore[no-untyped-def]
        took = original(self, deltas)
        calls.append((self.record.request_id if self.record else None, took))
        return took

    monkeypatch.setattr(writer._Pump, "push", spy)
    return calls
