"""Refreshing from the ledger's store in the background: one loop for the keyring and the deployments' sync.

`StorePoll` calls its `refresh` every `interval()` seconds (read each time, so
a test may shorten it) until `stop()`. A store that fails is one warning when
it starts failing and one when it answers again, not a line per try; what was
last read keeps serving meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

log = logging.getLogger("streamproxy.gateway")


class StorePoll:
    def __init__(self, what: str, keeping: str, refresh: Callable[[], Awaitable[Any]], interval: Callable[[], float],
                 name: str) -> None:
        self.what, self.keeping = what, keeping  # for the log: "keys", "keeping the last keys"
        self._refresh = refresh
        self._interval = interval
        self._name = name
        self._task: asyncio.Task[None] | None = None
        self.failing = False

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name=self._name)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval())
            try:
                await self._refresh()
                if self.failing:
                    log.warning("%s: the ledger's store is back; %s refreshed", self.what, self.what)
                    self.failing = False
            except Exception as exc:
                if not self.failing:
                    log.warning("%s: cannot refresh from the ledger's store (%s): %s: %s", self.what, self.keeping,
                                type(exc).__name__, exc)
                    self.failing = True

    async def stop(self) -> None:
        if self._task is not None:
            task, self._task = self._task, None
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
