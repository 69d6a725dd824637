"""tests/support/prestart.py: which server is launched ahead, when, and what `ready` hands over (stand-in servers)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from harness.process import ServerFailed
from tests.support import prestart


class StandIn:
    """What prestart uses of a ServerProcess: healthy, wait_ready, stop, label, stdout_path."""

    FAILS: list[str | None] = []  # the logs the next stand-ins fail with (None: comes up)

    def __init__(self, logs: Path, key: str) -> None:
        self.key, self.label, self.up, self.stopped = key, key, False, 0
        self.fail = StandIn.FAILS.pop(0) if StandIn.FAILS else None
        self.stdout_path = logs / f"{key}.out"

    def healthy(self) -> bool:
        return self.up

    def wait_ready(self, timeout: float, interval: float) -> None:
        if self.fail:
            raise ServerFailed(f"{self.key} failed", self.fail)
        self.up = True

    def stop(self, timeout: float = 10.0) -> int:
        self.stopped += 1
        return 0


@pytest.fixture
def launched(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[StandIn]:
    """Every stand-in launched, in order; the registry empty for the test."""
    monkeypatch.setattr(prestart, "_SPECS", {})
    monkeypatch.setattr(prestart, "_PLAN", {})
    monkeypatch.setattr(prestart, "_LOGS", [tmp_path])
    monkeypatch.setattr(prestart, "_STOPS", [])
    out: list[StandIn] = []

    def launcher(key: str) -> Any:
        def launch(logs: Path) -> list[StandIn]:
            out.append(StandIn(logs, key))
            return [out[-1]]
        return launch

    for key in ("a", "b", "c"):
        prestart.define(key, launcher(key))
    return out


def settle() -> None:
    """Every launch ahead has run its launcher (they run in threads)."""
    for spec in prestart._SPECS.values():
        if spec.thread is not None:
            spec.thread.join()


def session(*needs: tuple[str, ...]) -> list[Any]:
    items: list[Any] = []
    holder = SimpleNamespace(items=items)
    items.extend(SimpleNamespace(nodeid=f"t{i}", fixturenames=list(names), session=holder) for i, names in enumerate(needs))
    return items


def test_the_next_server_a_later_test_needs_is_launched_once_none_is_starting(launched: list[StandIn]) -> None:
    items = session((), ("b",), (), ("a", "b"), ("c",))
    prestart.ahead(items[0])
    settle()
    assert [s.key for s in launched] == ["b"]  # b's first test comes before a's
    prestart.ahead(items[1])
    settle()
    assert [s.key for s in launched] == ["b"]  # b still starting, untaken
    launched[0].up = True
    prestart.ahead(items[1])
    settle()
    assert [s.key for s in launched] == ["b", "a"]
    launched[1].up = True
    prestart.ahead(items[2])
    settle()
    assert [s.key for s in launched] == ["b", "a"]  # HELD (2) servers wait untaken
    with prestart.ready("b", 1.0) as (server,):
        assert server is launched[0]
        prestart.ahead(items[3])
        settle()
        assert [s.key for s in launched] == ["b", "a", "c"]
    prestart.finish()
    assert [s.stopped for s in launched] == [1, 1, 1]  # b after its block, a and c (never taken) at the end


def test_a_server_no_later_test_needs_is_not_launched_ahead(launched: list[StandIn]) -> None:
    items = session(("a",), ("b",))
    prestart.ahead(items[1])  # b's own test: its fixture launches it, a's test is past
    assert launched == []
    with prestart.ready("b", 1.0) as (server,):
        assert [s.key for s in launched] == ["b"] and launched[0].up


def test_ready_launches_again_only_when_the_port_was_taken(launched: list[StandIn], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(StandIn, "FAILS", ["OSError: [Errno 98] Address already in use", None, "engine died"])
    with prestart.ready("a", 1.0) as (server,):
        assert server is launched[1] and launched[0].stopped == 1
    assert server.stdout_path.parent.name == "a-1"
    with pytest.raises(ServerFailed, match="b failed"), prestart.ready("b", 1.0):
        pass
    prestart.finish()
    assert launched[-1].stopped == 1 and [s.key for s in launched] == ["a", "a", "b"]


def test_what_no_test_took_is_stopped_at_the_end(launched: list[StandIn]) -> None:
    items = session((), ("a",))
    prestart.ahead(items[0])
    prestart.finish()
    assert [(s.key, s.stopped) for s in launched] == [("a", 1)]


def test_a_launcher_that_fails_ahead_fails_the_test_that_takes_it(launched: list[StandIn]) -> None:
    def broken(logs: Path) -> list[Any]:
        raise RuntimeError("no model here")

    prestart.define("d", broken)
    items = session((), ("d",))
    prestart.ahead(items[0])
    with pytest.raises(RuntimeError, match="no model here"), prestart.ready("d", 1.0):
        pass
    prestart.finish()


def test_take_hands_the_launched_servers_over_unwaited_and_unstopped(launched: list[StandIn]) -> None:
    items = session((), ("a",))
    prestart.ahead(items[0])
    settle()
    (server,) = prestart.take("a")
    assert server is launched[0] and not launched[0].up  # not waited for: the taker waits its own way
    prestart.finish()
    assert launched[0].stopped == 0  # nor stopped: the taker stops it
    (again,) = prestart.take("a")  # taken before: a fresh one
    assert again is launched[1] and [s.key for s in launched] == ["a", "a"]


def test_early_launches_before_the_plan_and_drop_unneeded_stops_what_no_test_names(launched: list[StandIn]) -> None:
    prestart.early("a")
    prestart.early("b")
    settle()
    assert [s.key for s in launched] == ["a", "b"]
    items = session((), ("a",))
    prestart.drop_unneeded(items)
    for stop in prestart._STOPS:
        stop.join()
    assert [(s.key, s.stopped) for s in launched] == [("a", 0), ("b", 1)]
    with prestart.ready("a", 1.0) as (server,):
        assert server is launched[0]  # the one launched early
    with prestart.ready("b", 1.0) as (server,):
        assert server is launched[2]  # dropped: launched anew when asked for by name
    prestart.finish()
