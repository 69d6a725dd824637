"""Run the app on uvloop until SIGTERM/SIGINT, then shut down in order.

`AppRunner(handler_cancellation=True)`: when a client goes away, aiohttp
cancels its handler, and the route's `finally` aborts the engine request.
aiohttp's own access log is off (it formats a line per request on the hot
path); the server listens before the engine is ready (see app.py).
"""

from __future__ import annotations

import asyncio
import logging
import signal

import uvloop
from aiohttp import web

from .app import create_app
from .config import Settings

log = logging.getLogger("streamproxy.server")


async def serve(settings: Settings, engine: object, *, ready: asyncio.Event | None = None) -> None:
    app = create_app(settings, engine)  # type: ignore[arg-type]
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=settings.drain_timeout)
    await runner.setup()
    site = web.TCPSite(runner, settings.host, settings.port, reuse_address=True, backlog=2048)
    await site.start()
    log.info("listening on http://%s:%d", settings.host, settings.port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if ready is not None:
        ready.set()
    try:
        await stop.wait()
        log.info("shutting down: draining for up to %.0f s", settings.drain_timeout)
    finally:
        await runner.cleanup()


def run(settings: Settings, engine: object) -> None:
    uvloop.run(serve(settings, engine))
