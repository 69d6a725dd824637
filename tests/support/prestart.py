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

A launch ahead runs its launcher in a thread (LoRA's builds its adapters first), so the test
before goes on meanwhile. `ready(key, timeout)` takes the key's servers (launching them now if
nothing did) and waits for each to be ready, as `harness.server.start_server` does: a server
that lost its free port to another process before it listened is launched again (all of the
key's servers, on new ports). What a test sees is the same fresh server as before, only started
earlier: no request reaches it before the test's. After the `with` block each server gets its
SIGTERM at once and the wait for its exit (seconds: an engine core's shutdown) goes on in a
thread; `finish()` (the session's end) stops what no test took and waits for every stop.
`take(key)` hands the launched servers over unwaited, for a fixture that waits and stops them itself.
`early(key)` launches before the tests are known (the session engine, while pytest collects; `drop_unneeded`
stops it after collection when no test needs it).
Logs go to a folder of the session's (`log_dir()`), named after the key.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
import threading
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
    thread: threading.Thread | None = None  # a launch ahead runs `launch` here (a launcher may take a while itself)
    error: BaseException | None = None  # what `launch` raised there


_STOPS: list[threading.Thread] = []  # servers being stopped after their tests (a stop may take seconds)


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


def _launch(spec: _Spec, background: bool = False) -> None:
    folder = log_dir() / (spec.key if spec.attempt == 0 else f"{spec.key}-{spec.attempt}")
    folder.mkdir(parents=True, exist_ok=True)
    spec.launched, spec.servers, spec.error = True, [], None

    def run() -> None:
        try:
            spec.servers = list(spec.launch(folder))
        except BaseException as exc:  # raised again in the test that takes it
            spec.error = exc

    if background:
        spec.thread = threading.Thread(target=run, name=f"prestart-{spec.key}", daemon=True)
        spec.thread.start()
    else:
        run()


def _launched(spec: _Spec) -> list[ServerProcess]:
    if spec.thread is not None:
        spec.thread.join()
        spec.thread = None
    if spec.error is not None:
        raise spec.error
    return spec.servers


def _starting(spec: _Spec) -> bool:
    if spec.thread is not None and spec.thread.is_alive():
        return True
    for server in spec.servers:
        try:
            if not server.healthy():
                return True
        except ServerFailed:  # exited: the test that takes it fails with its log
            pass
    return False


def _stop(servers: Sequence[ServerProcess], timeout: float) -> None:
    """Each server's SIGTERM now, and the wait for its exit (SIGKILL after `timeout`) in a thread: the next test
    need not wait for it. `finish()` waits for them all."""
    for server in servers:
        stop = threading.Thread(target=server.stop, args=(timeout,), name=f"stop-{server.label}", daemon=True)
        stop.start()
        _STOPS.append(stop)


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
    if sum(max(1, len(spec.servers)) for spec in waiting) >= HELD or any(_starting(spec) for spec in waiting):
        return
    _launch(_SPECS[later[0]], background=True)


@contextmanager
def ready(key: str, timeout: float, interval: float = 0.5, stop_timeout: float = 60.0) -> Iterator[list[ServerProcess]]:
    """The key's servers, ready, for the `with` block; stopped after it (the wait for their exit in the background)."""
    spec = _SPECS[key]
    if spec.taken:  # taken before (its servers stopped): fresh ones
        spec.launched, spec.attempt = False, 0
    spec.taken = True
    if not spec.launched:
        _launch(spec)
    servers: list[ServerProcess] = []
    try:
        while True:
            servers = _launched(spec)
            try:
                for server in servers:
                    server.wait_ready(timeout, interval)
                break
            except ServerFailed as exc:
                if "address already in use" not in exc.log.lower() or spec.attempt == ATTEMPTS - 1:
                    raise
                for server in servers:
                    server.stop(stop_timeout)
                spec.attempt += 1
                _launch(spec)
        yield servers
    finally:
        _stop(servers, stop_timeout)


def early(key: str) -> None:
    """Launch the key's servers now, in the background, before the run's tests are known (while pytest collects:
    tests/conftest.py does it for the session's engine in the real-engine run). `drop_unneeded(items)` stops them
    once collected, if no test of the run names the key among its fixtures."""
    spec = _SPECS[key]
    if not spec.launched:
        _launch(spec, background=True)


def drop_unneeded(items: Sequence[pytest.Item]) -> None:
    """After collection: servers launched `early` that no collected test names among its fixtures are stopped (a
    test asking for one at run time, by name, launches it anew)."""
    needed = {name for item in items for name in getattr(item, "fixturenames", ())}
    for spec in _SPECS.values():
        if spec.launched and not spec.taken and spec.key not in needed:
            try:
                servers = _launched(spec)
            except BaseException:  # a launch that failed has nothing to stop
                servers = []
            _stop(servers, 60)
            spec.launched, spec.servers, spec.error = False, [], None


def take(key: str) -> list[ServerProcess]:
    """The key's servers as launched (launching them now if nothing did), not waited for: the caller waits for
    them its own way and stops them (`tests/support/workers.py`'s `api_servers`, which may start a parent again)."""
    spec = _SPECS[key]
    if spec.taken:  # taken before: fresh ones
        spec.launched, spec.attempt = False, 0
    spec.taken = True
    if not spec.launched:
        _launch(spec)
    return _launched(spec)


def finish() -> None:
    """The session's end: stop what no test took, and wait for every stop."""
    for spec in _SPECS.values():
        if spec.launched and not spec.taken:
            spec.taken = True
            try:
                servers = _launched(spec)
            except BaseException:  # a launch that failed has nothing to stop
                continue
            _stop(servers, 60)
    while _STOPS:
        _STOPS.pop().join()
