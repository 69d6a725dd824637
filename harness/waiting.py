"""Wait for a condition instead of sleeping a guessed time.

`await wait_until(predicate, timeout)` polls inside the event loop (the
server under test keeps running meanwhile); `wait_until_sync` is the same
for plain threads (a subprocess server, a metrics endpoint). Both return
the predicate's last value rather than raising, so the caller asserts with
its own message: `assert await wait_until(lambda: engine.num_running == 0, 2.0), engine.aborted`.

Timeouts are bounds, not expectations: on a busy machine a condition may
take far longer than on a quiet one, so give them room (seconds, not
milliseconds); a passing test returns as soon as the condition holds.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any


async def wait_until(predicate: Callable[[], Any], timeout: float, interval: float = 0.005) -> bool:
    """Poll `predicate` until it is true or `timeout` seconds pass; return whether it held."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return bool(predicate())
        await asyncio.sleep(interval)


def wait_until_sync(predicate: Callable[[], Any], timeout: float, interval: float = 0.05) -> bool:
    """`wait_until` for code outside an event loop (blocks the thread while it polls)."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return bool(predicate())
        time.sleep(interval)
