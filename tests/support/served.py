"""An aiohttp app on our server (`make_runner`: serve's connection handler, timeouts and caps) on a
free loopback port, for tests that talk to it over a raw socket; the caller cleans the runner up."""

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
