"""The start's first call to a vLLM engine core that is up, bounded and asked again.

`first_call(ask, name)` makes a call (`ask()`), and while none has been
answered asks again, as a fresh call, every `FIRST_CALL_REASK` s: the first
answer wins and the other asks are cancelled (a warning says how many asks
it took). None answered within `FIRST_CALL_TIMEOUT` s fails the start with
`EngineFailure` naming the call (a worker of --api-server-count N exits 1, and
the parent with it) instead of hanging. Seen twice with `--api-server-count 2`
in full test runs: both API servers waited on the first ask for 10 minutes;
the cause is not known. A lost message is answered by the next ask; an engine
core that answers nothing fails.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from .base import EngineFailure

log = logging.getLogger("streamproxy.engine.vllm")

# Seconds the engine core has to answer the start's first call once it is up.
FIRST_CALL_TIMEOUT = 120.0
# Seconds before the first call is asked again (a fresh call), while no ask has been answered.
FIRST_CALL_REASK = 15.0

T = TypeVar("T")


async def first_call(ask: Callable[[], Awaitable[T]], name: str, timeout: float | None = None,
                     reask: float | None = None) -> T:
    """The start's first call to the engine core (`ask()` makes one), bounded: asked again every
    `reask` s while no ask has been answered (the first answer wins, the other asks are cancelled),
    `EngineFailure` when none is answered within `timeout` s."""
    limit = FIRST_CALL_TIMEOUT if timeout is None else timeout
    every = FIRST_CALL_REASK if reask is None else reask
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    asks: set[asyncio.Future[T]] = set()
    try:
        while True:
            if asks:
                log.warning("the engine core has not answered %s after %.0f s; asking again (ask %d)",
                            name, limit - (deadline - loop.time()), len(asks) + 1)
            asks.add(asyncio.ensure_future(ask()))
            left = deadline - loop.time()
            answered, _ = await asyncio.wait(asks, timeout=min(every, left), return_when=asyncio.FIRST_COMPLETED)
            if answered:
                result = next(iter(answered)).result()  # (a call that failed raises its error)
                if len(asks) > 1:
                    log.warning("the engine core answered %s after %d asks", name, len(asks))
                return result
            if left <= every:
                raise EngineFailure(f"the engine core did not answer its first call ({name}) within {limit:g} s "
                                    f"of its start ({len(asks)} asks)")
    finally:
        for pending in asks:
            pending.cancel()
