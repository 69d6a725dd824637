"""The engine died: answer for it, let the requests in flight end, then exit 1 (as vLLM's server does).

At once `/health` and new generation requests answer 503 (`engine_dead`, Retry-After): both read
`engine.state`. `watch` polls it every `INTERVAL` s (vLLM offers no callback) and gives the requests in
flight `--engine-death-grace` s before their Lifetime ends them; then the `on_engine_failure` callbacks
stop the server with exit 1. With `--api-server-count` the parent tells a worker (SIGUSR1):
`engine_lost` kills the engine's client side and the same steps follow.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol, runtime_checkable

from engine_adapter.base import Engine
from streamproxy.http.state import AppState, engine_dead

log = logging.getLogger("streamproxy.engine")

INTERVAL = 0.2
# Seconds past the grace for requests ended at its deadline to write their error.
ENDING = 2.0


async def watch(state: AppState, interval: float = INTERVAL) -> None:
    """From a ready engine until it is dead, then steps 2 and 3 above."""
    engine = state.engine
    while engine.state != "dead":
        await asyncio.sleep(interval)
    state.engine_died = True  # the server's exit code is 1 now, even if a signal ends it first
    grace = max(state.settings.engine_death_grace, 0.0)
    inflight = state.inflight
    log.error(
        "the inference engine died: %d request(s) in flight end with an error, new ones get 503 engine_dead; "
        "exiting in %.1f s to be restarted", len(inflight), grace,
    )
    inflight.begin_drain(asyncio.get_running_loop().time() + grace, engine_dead())
    await asyncio.sleep(grace)
    if not await inflight.wait_idle(ENDING):
        log.error("%d request(s) still in flight after the engine died: leaving them", len(inflight))
    for callback in state.on_engine_failure:
        callback()


@runtime_checkable
class Killable(Protocol):
    def kill(self, reason: str = ...) -> None:
        """State "dead" at once; requests in flight end with an error."""


def engine_lost(engine: Engine, reason: str) -> None:
    """The engine died where only someone else could see it (the parent of the API servers)."""
    log.error("%s", reason)
    if isinstance(engine, Killable):
        engine.kill(reason)
