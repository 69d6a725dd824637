"""The server exits 1 when the engine cannot start (error or --engine-start-timeout),
so a supervisor sees the failure instead of a server that answers 503 forever."""

from __future__ import annotations

import asyncio
import socket

from engine_adapter.fake import FakeEngine
from streamproxy.config import Settings
from streamproxy.http.server import serve


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class BrokenEngine(FakeEngine):
    async def start(self) -> None:
        raise RuntimeError("weights are missing")


async def test_engine_start_failure_exits_1():
    settings = Settings(engine="fake", host="127.0.0.1", port=_port())
    assert await asyncio.wait_for(serve(settings, BrokenEngine()), timeout=20) == 1


async def test_engine_start_timeout_exits_1():
    settings = Settings(engine="fake", host="127.0.0.1", port=_port(), engine_start_timeout=0.2)
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await asyncio.wait_for(serve(settings, FakeEngine(load_delay=30)), timeout=20) == 1
    assert loop.time() - started < 10
