"""An aiohttp app on our server (`make_runner`: serve's connection handler, timeouts and caps) on a
free loopback port, for tests that talk to it over a raw socket; the caller cleans the runner up.
`WriteRecorder`: a connection's transport that records each write (put in place through the
handler's public `transport`), for tests that count the writes of a response."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from streamproxy.config import Settings
from streamproxy.http.server import make_runner


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
