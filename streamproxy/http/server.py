"""Run the app on uvloop until SIGTERM/SIGINT, then drain and shut down in order.

`make_runner`: aiohttp's `web.ServerRunner` over `connection.Connections`, with
`handler_cancellation=True` (a client gone cancels its handler, whose `finally` aborts the engine
request), header caps from `--max-header-bytes` and aiohttp's access log off (accesslog.py writes ours).
Requests aiohttp rejects while parsing get an OpenAI error body from `connection.Protocol.handle_error`.

`drain`, on the first signal: stop listening; give every in-flight generation the `--drain-timeout`
deadline (new requests get 503 `server_shutting_down`, idle connections close); wait until nothing is in
flight (a `Lifetime` ends what is left at the deadline); `runner.cleanup()`; exit 0. A second signal moves
the deadline to now. An engine that cannot start or dies (engine_watch.py) runs the same shutdown and
exits 1; a signal during the engine's start exits 128 + the signal; either within `FAILURE_EXIT_LIMIT` s.
Once the engine is up, `gc.freeze()` and vLLM's env cache (`vllm.envs.enable_envs_cache`).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable
from typing import Any

import uvloop
from aiohttp import web

from engine_adapter.base import Engine
from streamproxy import workers
from streamproxy.config import Settings
from streamproxy.http import accesslog, tls, tracing
from streamproxy.http.app import ENGINE_TASK_KEY, create_app
from streamproxy.http.connection import Connections, Limits
from streamproxy.http.drain import INFLIGHT_KEY
from streamproxy.http.engine_watch import engine_lost
from streamproxy.http.state import STATE_KEY

log = logging.getLogger("streamproxy.server")

# Seconds past the drain deadline for ended streams to write their error event
# and for aiohttp to close the connections.
DRAIN_GRACE = 5.0
# Seconds from an engine failure to exit 1 at the latest, whatever the clean-up is waiting for.
FAILURE_EXIT_LIMIT = 20.0


class Runner(web.ServerRunner):
    """aiohttp's runner for a low-level server, `connection.Connections` (timeouts, the connection
    cap), serving an application: a `web.AppRunner` (never given a site) runs the app's start-up
    and builds the app's own server, whose public `request_handler` and `request_factory` ours
    serves with; the app's shutdown and clean-up run as `AppRunner.cleanup` would run them."""

    def __init__(self, app: web.Application, *, limits: Limits, shutdown_timeout: float, **handler_args: Any) -> None:
        self.app_runner = web.AppRunner(app)
        self.connections = Connections(limits, **handler_args)
        super().__init__(self.connections, shutdown_timeout=shutdown_timeout)

    @property
    def app(self) -> web.Application:
        return self.app_runner.app

    @property
    def limits(self) -> Limits:
        return self.connections.limits

    async def setup(self) -> None:
        await self.app_runner.setup()  # on_startup, then the app's server
        app_server = self.app_runner.server
        assert app_server is not None
        self.connections.serve(app_server.request_handler, app_server.request_factory)
        await super().setup()

    async def shutdown(self) -> None:
        """Between closing the idle connections and waiting for the busy ones (`BaseRunner.cleanup`)."""
        await self.app.shutdown()

    async def cleanup(self) -> None:
        try:
            await super().cleanup()
        finally:
            await self.app.cleanup()


def make_runner(app: web.Application, settings: Settings, **kwargs: Any) -> Runner:
    """The runner serve and the gateway use; `kwargs` (e.g. `shutdown_timeout`) override its defaults."""
    args: dict[str, Any] = {
        "handler_cancellation": True,
        "access_log": None,
        "shutdown_timeout": DRAIN_GRACE,
        "max_line_size": settings.max_header_bytes,
        "max_field_size": settings.max_header_bytes,
        "max_headers": settings.max_header_count,
    }
    return Runner(app, limits=Limits.from_settings(settings), **{**args, **kwargs})


async def drain(runner: web.BaseRunner, app: web.Application, timeout: float) -> int:
    """Stop accepting, let in-flight requests finish for `timeout` s, end the rest; how many were ended."""
    inflight = app[INFLIGHT_KEY]
    loop = asyncio.get_running_loop()
    for site in list(runner.sites):
        await site.stop()
    running = len(inflight)
    log.info("draining: %d request(s) in flight, up to %.1f s", running, timeout)
    inflight.begin_drain(loop.time() + timeout)
    if runner.server is not None:
        runner.server.pre_shutdown()  # idle keep-alive connections close now, busy ones after their response
    if not await inflight.wait_idle(timeout):
        # The deadline passed: the Lifetimes are ending the rest; let them write their error events.
        await inflight.wait_idle(DRAIN_GRACE)
    ended = inflight.ended_by_drain
    log.info("drained: %d request(s) finished, %d ended at the deadline", max(running - ended, 0), ended)
    return ended


async def serve(settings: Settings, engine: Engine, *, ready: asyncio.Event | None = None, hard_exit: bool = False,
                sock: socket.socket | None = None) -> int:
    """Serve until a signal (exit code 0), or until the engine fails to start or dies (1).
    `hard_exit` (the process's own server, `run`): exit 1 anyway if the shutdown after an
    engine failure hangs. `sock`: a listening socket from the parent (one of --api-server-count
    workers, streamproxy/workers.py) instead of binding host:port."""
    ledger = None
    if settings.ledger is not None:  # --ledger: each worker writes its own records (the ledger's metrics only then)
        from streamproxy.ledger.writer import open_ledger

        ledger = await open_ledger(settings.ledger, "--ledger")
    listener = accesslog.configure(settings.access_log, settings.disable_access_log_for_endpoints)
    tracer = tracing.configure(settings.otlp_traces_endpoint, "streamproxy")
    if sock is not None:
        accesslog.PID = os.getpid()  # the log says which of the workers served each request
    app = create_app(settings, engine)
    if ledger is not None:
        from streamproxy.http import books

        books.install(app, app[STATE_KEY], ledger)  # closed (every record written) after the drain
    stop = asyncio.Event()
    engine_failed = False

    def on_engine_failure() -> None:
        nonlocal engine_failed
        engine_failed = True
        log.error("no engine: shutting down, exit code 1")
        stop.set()
        if hard_exit:
            _exit_later(FAILURE_EXIT_LIMIT)

    app[STATE_KEY].on_engine_failure.append(on_engine_failure)
    # An engine that died before the stop (a signal during engine_watch's grace) still makes the exit 1.
    dead_at_stop = False
    # A signal before the engine was up: the start is aborted (the engine's close kills what it
    # started), and the exit code is 128 + the signal's number (143 for SIGTERM, 130 for SIGINT), the
    # shell's code for a process ended by that signal: not 0, which says the server served and drained,
    # nor 1, which says the engine failed (restart me); a script waiting for readiness sees it never came.
    aborted_by = 0

    def note_stop(sig: int) -> None:
        nonlocal dead_at_stop, aborted_by
        dead_at_stop = engine.state == "dead"
        if sig and engine.state == "loading":
            aborted_by = sig
            log.info("the engine is not up yet: stopping its start (exit code %d)", 128 + sig)
            if hard_exit:
                _exit_later(FAILURE_EXIT_LIMIT, 128 + sig)

    try:
        await run_app(app, settings, stop=stop, ready=ready, sock=sock, on_stop=note_stop, own_process=hard_exit)
    finally:
        if listener is not None:
            listener.stop()
        if tracer is not None:
            tracer.shutdown()
    if engine_failed or dead_at_stop or app[STATE_KEY].engine_died:
        return 1
    return 128 + aborted_by if aborted_by else 0


def _exit_later(seconds: float, code: int = 1) -> None:
    def bail() -> None:
        log.error("the shutdown did not finish within %.0f s: exiting %d now", seconds, code)
        os._exit(code)

    timer = threading.Timer(seconds, bail)
    timer.daemon = True
    timer.start()


async def run_app(app: web.Application, settings: Settings, *, stop: asyncio.Event, ready: asyncio.Event | None = None,
                  sock: socket.socket | None = None, on_stop: Callable[[int], None] | None = None,
                  own_process: bool = False) -> None:
    """Listen until the first SIGTERM/SIGINT (or `stop`), then drain and clean up; `on_stop` gets the
    first signal's number (0: `stop` was set); `own_process`: the process's own server (`run`).

    The signal handlers are in place before the app starts its engine (`runner.setup`), so a
    signal at any moment of the start-up reaches the clean-up, which stops the engine however far
    it got (its `close`). The TCP port is bound (not yet listening) before that start, as vLLM does:
    a free port chosen for a process the start launches (a managed replica) cannot be ours. As a
    worker (`sock` given) SIGINT is left to the parent, and SIGUSR1 means the engine the workers
    share died (the parent saw it): the engine's death path (engine_watch.py)."""
    runner = make_runner(app, settings)
    loop = asyncio.get_running_loop()
    signals: list[signal.Signals] = []

    def on_signal(sig: signal.Signals) -> None:
        signals.append(sig)
        if len(signals) == 1:
            log.info("%s: shutting down", sig.name)
            stop.set()
        else:
            log.info("%s again: ending in-flight requests now", sig.name)
            app[INFLIGHT_KEY].begin_drain(loop.time())

    worker = sock is not None
    if sock is None and not settings.uds:
        sock = workers.bind(settings.host, settings.port, 1)[0]
    handled = (signal.SIGTERM, signal.SIGINT) if not worker else (signal.SIGTERM,)
    for sig in handled:
        loop.add_signal_handler(sig, on_signal, sig)
    if worker:
        loop.add_signal_handler(signal.SIGUSR1, engine_lost, app[STATE_KEY].engine, "the shared engine core died")
    freezer: asyncio.Task[None] | None = None
    refresher: asyncio.Task[None] | None = None
    try:
        await runner.setup()
        site: web.BaseSite
        ctx = tls.server_context(settings)
        if sock is not None:
            site = web.SockSite(runner, sock, backlog=2048, ssl_context=ctx)
        else:
            site = web.UnixSite(runner, settings.uds or "", backlog=2048, ssl_context=ctx)
        if ctx is not None and settings.enable_ssl_refresh:
            refresher = asyncio.create_task(tls.Refresher(ctx, settings).run(), name="tls-refresh")
        await site.start()
        log.info("listening on %s (pid %d)", site.name, os.getpid())
        limits = runner.limits
        log.info(
            "client timeouts: headers %g s, body %g s between reads, keep-alive %g s; at most %s connections",
            limits.header_timeout, limits.body_timeout, limits.keepalive_timeout, limits.max_connections or "unlimited",
        )
        freezer = asyncio.create_task(_freeze_after_start(app, own_process=own_process), name="gc-freeze")
        if ready is not None:
            ready.set()
        await stop.wait()
        if on_stop is not None:
            on_stop(signals[0] if signals else 0)
        await drain(runner, app, settings.drain_timeout)
    finally:
        for task in (freezer, refresher):
            if task is not None:
                task.cancel()
        await runner.cleanup()
        if sock is not None:
            sock.close()  # the site's server closed it, unless the start failed before the site started
        for sig in (*handled, *((signal.SIGUSR1,) if worker else ())):
            loop.remove_signal_handler(sig)
        log.info("stopped")


async def _freeze_after_start(app: web.Application, *, own_process: bool) -> None:
    """Once the engine is up, `gc.freeze()` what start-up built, so full collections under load walk only
    what requests allocate (and, in the process's own server, cache vLLM's environment reads).
    """
    task = app.get(ENGINE_TASK_KEY)
    if task is not None:
        try:
            await asyncio.shield(task)
        except Exception:  # the start-up task reports its own failure
            return
    gc.collect()
    gc.freeze()
    log.debug("gc: %d objects frozen", gc.get_freeze_count())
    vllm_envs = sys.modules.get("vllm.envs")
    if own_process and vllm_envs is not None:  # no VLLM_* variable changes past the start (as vLLM's engine core assumes)
        vllm_envs.enable_envs_cache()


def run(settings: Settings, engine: Engine, *, sock: socket.socket | None = None) -> None:
    code = uvloop.run(serve(settings, engine, hard_exit=True, sock=sock))
    # The interpreter's last collection at exit walks every object it has not frozen: after a
    # start-up cut short (nothing frozen yet: `_freeze_after_start`), vLLM's and torch's took
    # 2 s to 10 s of the exit on a busy 2-core machine. Frozen, they are skipped.
    gc.freeze()
    if code:
        raise SystemExit(code)
