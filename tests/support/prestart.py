"""Real-engine servers launched ahead of the tests that need them, while earlier tests run.

    prestart.define("embed_server", lambda logs: [launch(args, logs, "embed", ENGINE_IN_CORE)])

    @pytest.fixture(scope="module")
    def embed_server():
        with prestart.ready("embed_server", START_TIMEOUT) as (server,):   # stopped after the block
            yield server.base

A real engine's start takes 37-50 s on a 2-core machine, much of it one core importing torch
and vLLM or waiting, and the real-engine tests run one after another in one process. So before
each test `tests/conftest.py` calls `ahead(item)`: unless a launched server is still starting
(or `HELD` launched servers already wait untaken), it launches the next one that a later test of
the run needs, in the run's order. A key is the name of the fixture that takes the server, so
which test needs which is read from each test's fixture closure (`item.fixturenames`); a
fixture asked for by name at run time (`request.getfixturevalue`) is not seen, and starts its
server when it asks, as does any fixture when the test runs alone.

`ready(key, timeout)` takes the key's servers (launching them now if nothing did) and waits
for each to be ready, as `harness.server.start_server` does: a server that lost its free port
to another process before it listened is launched again (all of the key's servers, on new
ports). What a test sees is the same fresh server as before, only started earlier: no request
reaches it before the test's. `stop_untaken()` (the session's end) stops what no test took.
Logs go to a folder of the session's (`log_dir()`), named after the key.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from harness.process import ServerFailed, ServerProcess

# Launched servers that may wait untaken at once (each holds its engine's memory: ~3 GB here).
HELD = 2
ATTEMPTS = 3  # as harness.server.start_server: a free port taken by someone else before the server listened

Launcher = Callable[[Path], Sequence[ServerProcess]]


@dataclass
class _Spec:
    key: str
    launch: Launcher
    servers: list[ServerProcess] = field(default_factory=list)
    launched: bool = False
    taken: bool = False
    attempt: int = 0


_SPECS: dict[str, _Spec] = {}
_PLAN: dict[int, tuple[dict[str, int], list[tuple[int, str]]]] = {}  # id(items) -> (nodeid -> index, [(first use, key)])
_LOGS: list[Path] = []


def log_dir() -> Path:
    if not _LOGS:
        _LOGS.append(Path(tempfile.mkdtemp(prefix="streamproxy-test-prestart-")))
        atexit.register(shutil.rmtree, _LOGS[0], True)
    return _LOGS[0]


def define(key: str, launch: Launcher) -> None:
    """`launch(log_dir)` starts (does not wait for) the servers the fixture named `key` takes."""
    _SPECS[key] = _Spec(key, launch)


def _launch(spec: _Spec) -> None:
    folder = log_dir() / (spec.key if spec.attempt == 0 else f"{spec.key}-{spec.attempt}")
    folder.mkdir(parents=True, exist_ok=True)
    spec.launched = True
    spec.servers = list(spec.launch(folder))


def _starting(spec: _Spec) -> bool:
    for server in spec.servers:
        try:
            if not server.healthy():
                return True
        except ServerFailed:  # exited: the test that takes it fails with its log
            pass
    return False


def _plan(items: list[pytest.Item]) -> tuple[dict[str, int], list[tuple[int, str]]]:
    if id(items) not in _PLAN:
        first: dict[str, int] = {}
        for index, item in enumerate(items):
            for name in getattr(item, "fixturenames", ()):
                if name in _SPECS:
                    first.setdefault(name, index)
        _PLAN.clear()
        _PLAN[id(items)] = ({item.nodeid: index for index, item in enumerate(items)} if first else {},
                            sorted((index, key) for key, index in first.items()))
    return _PLAN[id(items)]


def ahead(item: pytest.Item) -> None:
    """Before `item` runs: launch the next server a later test needs, unless one launched is still starting."""
    if not _SPECS:
        return
    indices, order = _plan(item.session.items)
    here = indices.get(item.nodeid)
    later = [key for index, key in order if here is not None and index > here and not _SPECS[key].launched]
    if not later:
        return
    waiting = [spec for spec in _SPECS.values() if spec.launched and not spec.taken]
    if sum(len(spec.servers) for spec in waiting) >= HELD or any(_starting(spec) for spec in waiting):
        return
    _launch(_SPECS[later[0]])


@contextmanager
def ready(key: str, timeout: float, interval: float = 0.5, stop_timeout: float = 60.0) -> Iterator[list[ServerProcess]]:
    """The key's servers, ready, for the `with` block; stopped after it."""
    spec = _SPECS[key]
    if spec.taken:  # taken before (its servers stopped): fresh ones
        spec.launched, spec.attempt = False, 0
    spec.taken = True
    if not spec.launched:
        _launch(spec)
    try:
        while True:
            try:
                for server in spec.servers:
                    server.wait_ready(timeout, interval)
                break
            except ServerFailed as exc:
                if "address already in use" not in exc.log.lower() or spec.attempt == ATTEMPTS - 1:
                    raise
                for server in spec.servers:
                    server.stop(stop_timeout)
                spec.attempt += 1
                _launch(spec)
        yield spec.servers
    finally:
        for server in spec.servers:
            server.stop(stop_timeout)


def stop_untaken() -> None:
    for spec in _SPECS.values():
        if spec.launched and not spec.taken:
            spec.taken = True
            for server in spec.servers:
                server.stop(60)
