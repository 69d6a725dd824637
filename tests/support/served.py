"""An aiohttp app on our server (`make_runner`: serve's connection handler, timeouts and caps) on a
free loopback port, for tests that talk to it over a raw socket; the caller cleans the runner up.
`WriteRecorder`: a connection's transport that records each write (put in place through the
handler's public `transport`), for tests that count the writes of a response (`StackRecorder`:
also the files on the call stack of each, for `through`: who wrote them); `recorded_answer`
sends one request on a new connection and gives the server's writes on it and the bytes read."""

from __future__ import annotations

import asyncio
import traceback
from collections.abc import Callable
from typing import Any

from aiohttp import web

from streamproxy.config import Settings
from streamproxy.http.server import make_runner
from tests.support import wait_until


async def serve_app(app: web.Application, settings: Settings | None = None, **runner_args: Any) -> tuple[web.BaseRunner, int]:
    """(the set-up runner, its port)."""
    runner = make_runner(app, settings or Settings(), **runner_args)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, runner.addresses[0][1]


class WriteRecorder:
    """A transport that records what is written to it (one entry per `write`/`writelines` call)
    and passes everything on to the real one."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))
        self.inner.write(data)

    def writelines(self, lines: list[bytes]) -> None:
        self.writes.append(b"".join(lines))
        self.inner.writelines(lines)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class StackRecorder(WriteRecorder):
    """A WriteRecorder that also keeps, per write, the files on the call stack."""

    def __init__(self, inner: object) -> None:
        super().__init__(inner)
        self.stacks: list[set[str]] = []

    def write(self, data: bytes) -> None:
        self.stacks.append({frame.filename for frame in traceback.extract_stack()})
        super().write(data)

    def writelines(self, lines: list[bytes]) -> None:
        self.stacks.append({frame.filename for frame in traceback.extract_stack()})
        super().writelines(lines)


def through(module: str, recorder: StackRecorder) -> None:
    """Every write `recorder` saw was made with `module` (a path's end) on the call stack."""
    assert recorder.writes
    strays = [(data[:60], sorted(f for f in stack if "streamproxy" in f)) for data, stack in zip(recorder.writes, recorder.stacks)
              if not any(f.endswith(module) for f in stack)]
    assert strays == [], f"written to the transport without {module}: {strays}"


async def recorded_answer(connections: Callable[[], list[Any]], port: int, request: bytes,
                          recording: Callable[[WriteRecorder], None] | None = None) -> tuple[list[bytes], bytes]:
    """Send `request` on a new connection to the server at `port` (whose handlers `connections()`
    lists: its runner's `server.connections`) and read its chunked answer to the terminating chunk:
    (the server's writes on that connection, from when it was accepted; the bytes read).
    `recording` gets the recorder as soon as it is in place."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        assert await wait_until(lambda: len(connections()) == 1, timeout=10.0)
        (connection,) = connections()
        recorder = connection.transport = WriteRecorder(connection.transport)
        if recording is not None:
            recording(recorder)
        writer.write(request)
        got = b""
        while not got.endswith(b"\r\n0\r\n\r\n"):
            more = await asyncio.wait_for(reader.read(65536), 10)
            assert more, got
            got += more
    finally:
        writer.close()
    return recorder.writes, got
