"""The engine died: answer for it, let the requests in flight end, then exit 1.

A dead engine (its engine-core process killed, a step that raised) does not
come back: vLLM's AsyncLLM cannot restart its engine core, and a server that
stays up serving nothing is never restarted by a supervisor that restarts on
exit. vLLM's own server exits when its engine dies (its watchdog); so does
this one, in three steps:

  1. at once: `/health` answers 503 and every new generation request 503
     `engine_dead` with Retry-After (both read `engine.state`, which turns
     "dead" as soon as the engine knows: vLLM's monitor thread sees the
     engine core's process end);
  2. `watch` notices within `INTERVAL` s and gives the requests in flight
     `--engine-death-grace` seconds: those the engine failed end their error
     path (an in-band error event and `data: [DONE]`, or a 5xx OpenAI error);
     any still running at the deadline is ended by its Lifetime with
     `engine_dead` (drain.py's mechanism). The server keeps answering 503s
     meanwhile, so a load balancer sees why;
  3. the `on_engine_failure` callbacks run: `server.serve` stops listening,
     cleans up and exits 1.

Polling `state` (a property read, five times a second) is the one way that
works for every engine: vLLM learns of its engine core's death in a monitor
thread and offers no callback.

With `--api-server-count N` and vLLM, the engine cores belong to the parent,
and an API server learns of their death from it (SIGUSR1, server.py):
`engine_lost` kills the engine's client side (`Killable`), its state turns
"dead", and the same three steps follow.
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
