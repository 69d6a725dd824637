"""The server exits 1 when the engine cannot start (error or --engine-start-timeout),
so a supervisor sees the failure instead of a server that answers 503 forever; a signal
while the engine starts ends the start at once, leaving none of its processes."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing import resource_tracker
from pathlib import Path
from typing import Any

import psutil
import pytest
import requests
from aiohttp import web

from engine_adapter.fake import FakeEngine
from engine_adapter.vllm_engine import VllmEngine
from engine_adapter.vllm_shared import SharedCores
from harness.process import free_port
from harness.procs import Descendants, describe, running
from harness.server import FAKE_ARGS, launch
from streamproxy.config import Settings
from streamproxy.http.app import create_app
from streamproxy.http.server import run_app, serve
from streamproxy.workers import Parent
from tests.support import wait_until, wait_until_sync


class BrokenEngine(FakeEngine):
    async def start(self) -> None:
        raise RuntimeError("weights are missing")


async def test_engine_start_failure_exits_1():
    settings = Settings(engine="fake", host="127.0.0.1", port=free_port())
    assert await asyncio.wait_for(serve(settings, BrokenEngine()), timeout=20) == 1


async def test_engine_start_timeout_exits_1():
    settings = Settings(engine="fake", host="127.0.0.1", port=free_port(), engine_start_timeout=0.2)
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await asyncio.wait_for(serve(settings, FakeEngine(load_delay=30)), timeout=20) == 1
    assert loop.time() - started < 10


async def test_the_port_is_bound_before_the_app_starts():
    # As vLLM does: no process the start launches (a gateway's managed replica, given a free port)
    # can be handed the server's port between the start and the listen.
    port = free_port()
    seen: list[int] = []

    async def on_startup(app: web.Application) -> None:
        with socket.socket() as other:
            try:
                other.bind(("127.0.0.1", port))
            except OSError as e:
                seen.append(e.errno or 0)
        stop.set()

    app = create_app(Settings(engine="fake"), FakeEngine())
    app.on_startup.insert(0, on_startup)
    stop = asyncio.Event()
    await asyncio.wait_for(run_app(app, Settings(engine="fake", host="127.0.0.1", port=port), stop=stop), timeout=20)
    assert seen == [errno.EADDRINUSE]
    with socket.socket() as again:
        again.bind(("127.0.0.1", port))  # and given back when the server ends


# -- a signal while the engine starts ---------------------------------------------------------
# The server stops at once, exits 128 + the signal's number, and leaves none of the processes
# the engine's start started (engine_adapter/spawned.py). vLLM's part is tests/engine/test_start_abort_engine.py;
# here the start is a stand-in with the same shape: a blocking call in a thread that starts an
# "engine core" process, which keeps starting "workers" of its own, and returns (with an error)
# only once that core has died, as vLLM's start-up barrier does.

# An engine core: starts a worker every 20 ms (and notes its pid), as long as it runs.
CORE = """
import subprocess, sys, time
with open(sys.argv[1], "a") as pids:
    for _ in range(500):
        pids.write(f"{subprocess.Popen(['sleep', '600']).pid}\\n")
        pids.flush()
        time.sleep(0.02)
time.sleep(600)
"""


def _blocking_start(pidfile: Path, cores: int) -> Callable[[], Any]:
    """vLLM's start as seen from outside: start a core, block until it is gone. With `cores` 2 a
    second core starts once the first is gone (a start that looked at the abort flag just before it
    was set): the abort must end that one too."""

    def build() -> Any:
        for _ in range(cores):
            core = subprocess.Popen([sys.executable, "-c", CORE, str(pidfile)])
            core.wait()
        raise RuntimeError("engine core initialization failed")

    return build


def _workers(pidfile: Path) -> list[psutil.Process]:
    found = []
    for line in pidfile.read_text().split() if pidfile.exists() else []:
        with contextlib.suppress(psutil.Error):
            found.append(psutil.Process(int(line)))
    return found


def _health(base: str) -> int:
    try:
        return requests.get(base + "/health", timeout=2).status_code
    except requests.RequestException:
        return 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_the_engine_loads_exits_at_once_with_128_plus_it(sig: signal.Signals, tmp_path: Path) -> None:
    server = launch([*FAKE_ARGS, "--fake-boot-delay", "600"], tmp_path)
    try:
        assert wait_until_sync(lambda: _health(server.base) == 503, 30), server.log()  # listening, engine loading
        sent = time.monotonic()
        server.proc.send_signal(sig)
        assert server.proc.wait(15) == 128 + sig, server.log()
        assert time.monotonic() - sent < 15
        assert "stopping its start" in server.log()
    finally:
        server.kill()


@pytest.mark.parametrize("cores", [1, 2])
async def test_closing_a_starting_vllm_engine_kills_what_its_start_started(cores: int, tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    pidfile = tmp_path / "workers"
    engine = VllmEngine(None, ["m"], root="m")
    monkeypatch.setattr(engine, "_build", _blocking_start(pidfile, cores))
    seen = Descendants(os.getpid(), new_only=True)  # not the session's servers
    task = asyncio.create_task(engine.start())
    assert await wait_until(lambda: len(_workers(pidfile)) >= 3, 30)  # a core with workers of its own
    seen.record()
    task.cancel()
    loop = asyncio.get_running_loop()
    started = loop.time()
    await engine.close()
    assert loop.time() - started < 10
    assert engine.state == "dead"
    everything = [*seen.seen.values(), *_workers(pidfile)]
    assert not [p for p in everything if running(p)], describe(p for p in everything if running(p))


def _idle_api_server(*args: Any) -> None:
    time.sleep(600)


def test_a_signal_while_shared_engine_cores_launch_aborts_the_launch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--api-server-count 2`: SIGTERM to the parent while its host launches (as SharedCores does:
    the API servers started while the engine core loads, then the wait for it) ends the launch;
    the engine core, its workers and the API servers are all gone, and the parent exits 143."""
    pidfile = tmp_path / "workers"
    build = _blocking_start(pidfile, 1)
    host = SharedCores(None)

    def launch(count: int, start: Callable[[list[Any]], Any]) -> None:
        api_servers.extend(start([None] * count))
        build()

    api_servers: list[Any] = []
    monkeypatch.setattr(host, "_launch", launch)
    settings = Settings(engine="vllm", host="127.0.0.1", port=0, api_server_count=2)
    parent = Parent(settings, [], target=_idle_api_server, host=host)
    seen = Descendants(os.getpid(), new_only=True)  # not the session's servers

    def signal_once_the_core_has_workers() -> None:
        if wait_until_sync(lambda: len(_workers(pidfile)) >= 3 and len(api_servers) == 2, 30):
            seen.record()
            os.kill(os.getpid(), signal.SIGTERM)

    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    sender = threading.Thread(target=signal_once_the_core_has_workers)
    sender.start()
    try:
        started = time.monotonic()
        assert parent.run() == 128 + signal.SIGTERM
        assert time.monotonic() - started < 30
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        sender.join()
    assert {proc.pid for proc in api_servers} <= set(seen.seen)
    # Not multiprocessing's resource tracker, which the first spawn started: it is the test process's now.
    tracker = getattr(resource_tracker._resource_tracker, "_pid", None)
    everything = [p for pid, p in seen.seen.items() if pid != tracker]
    everything += _workers(pidfile)
    assert len(everything) >= 5  # the core, its workers, the API servers
    assert not [p for p in everything if running(p)], describe(p for p in everything if running(p))


# -- once the engine is up ------------------------------------------------------------------------


@pytest.mark.parametrize("own_process", [True, False])
async def test_vllm_env_reads_cached_after_the_start_only_in_the_process_own_server(monkeypatch, own_process):
    """vLLM's engine core turns on its env cache after its start; the server process does the
    same once its engine is up. A test process serving in-process keeps reading the environment."""
    from aiohttp import web

    from streamproxy.http.server import _freeze_after_start

    calls: list[str] = []
    monkeypatch.setitem(sys.modules, "vllm.envs", type(sys)("vllm.envs"))
    sys.modules["vllm.envs"].enable_envs_cache = lambda: calls.append("cached")  # type: ignore[attr-defined]
    try:
        await _freeze_after_start(web.Application(), own_process=own_process)
    finally:
        import gc

        gc.unfreeze()
    assert calls == (["cached"] if own_process else [])
