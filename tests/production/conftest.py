"""Fixtures for the production-contract tests: the real runner on loopback.

`server(script, **settings)` starts `create_app` on `server.make_runner` (the
runner `streamproxy serve` uses: handler cancellation, header caps, the JSON
answer to unparseable requests) with a TCPSite on 127.0.0.1, port 0, over a
FakeEngine, and waits until the engine is ready. The loop is uvloop's, as
in production (transport buffering and write-pausing are the loop's). Every
test is bounded: a hang dumps the stacks and ends the run after `HARD_LIMIT`
seconds.
"""

from __future__ import annotations

import faulthandler
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
import uvloop
from aiohttp import web

from engine_adapter.fake import FakeEngine, FakeScript
from harness.waiting import wait_until
from streamproxy.config import Settings
from streamproxy.http import accesslog
from streamproxy.http.app import create_app
from streamproxy.http.server import Runner, make_runner
from streamproxy.http.state import STATE_KEY, AppState

HARD_LIMIT = 120.0


@pytest.fixture(scope="session")
def event_loop_policy() -> Any:
    return uvloop.EventLoopPolicy()


@pytest.fixture(autouse=True)
def _bounded() -> Any:
    faulthandler.dump_traceback_later(HARD_LIMIT, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


class Running:
    def __init__(self, app: web.Application, runner: Runner, engine: FakeEngine, port: int) -> None:
        self.app = app
        self.runner = runner
        self.engine = engine
        self.port = port
        self.base = f"http://127.0.0.1:{port}"

    @property
    def state(self) -> AppState:
        return self.app[STATE_KEY]

    def url(self, path: str) -> str:
        return self.base + path


StartServer = Callable[..., Awaitable[Running]]


@pytest.fixture
async def server() -> AsyncIterator[StartServer]:
    started: list[Running] = []

    async def start(
        script: FakeScript | None = None,
        *,
        max_model_len: int = 4096,
        load_delay: float = 0.0,
        wait_ready: bool = True,
        **settings: Any,
    ) -> Running:
        engine = FakeEngine(script or FakeScript(tokens=["Hel", "lo", " world"]), max_model_len=max_model_len, load_delay=load_delay)
        conf = Settings(engine="fake", host="127.0.0.1", port=0, **settings)
        app = create_app(conf, engine)
        runner = make_runner(app, conf)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=2048)
        await site.start()
        port = runner.addresses[0][1]
        running = Running(app, runner, engine, port)
        started.append(running)
        if wait_ready:
            assert await wait_until(lambda: engine.state == "ready", timeout=5.0)
        return running

    yield start
    for running in started:
        await running.runner.cleanup()


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s:
        yield s


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def access_log() -> Any:
    handler = _Collect()
    previous = accesslog.log.level
    accesslog.log.addHandler(handler)
    accesslog.log.setLevel(logging.INFO)
    yield handler.lines
    accesslog.log.removeHandler(handler)
    accesslog.log.setLevel(previous)
