"""What a storm may leave behind: nothing.

    before = Baseline.take()
    ... a storm of disconnects, slow readers, engine errors ...
    await before.back(srv)

The server runs in the test's own process (the `server` fixture), so its open
file descriptors are this process's (`/proc/self/fd`: sockets, the loop's
own), and its tasks are this loop's (`asyncio.all_tasks()`: a handler per
connection, the engine's step loop, the engine-death watch). `back` waits
until both are at most what they were, the engine runs nothing, admission
holds and queues nobody, no Lifetime is open and no connection is left, and
fails with the numbers if that does not happen in time. The test's clients
must be closed by then (their sockets are this process's descriptors too).
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from typing import Any

from tests.support import wait_until


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@dataclass
class Baseline:
    fds: int
    tasks: int

    @classmethod
    def take(cls) -> Baseline:
        return cls(open_fds(), len(asyncio.all_tasks()))

    def now(self, srv: Any) -> dict[str, int]:
        state = srv.state
        return {
            "fds": open_fds(), "tasks": len(asyncio.all_tasks()), "engine_running": srv.engine.num_running,
            "admitted": state.admission.active, "queued": state.admission.queued, "in_flight": len(state.inflight),
            "connections": len(srv.runner.server.connections),
        }

    def _clean(self, srv: Any) -> bool:
        now = self.now(srv)
        return now.pop("fds") <= self.fds and now.pop("tasks") <= self.tasks and not any(now.values())

    async def back(self, srv: Any, timeout: float = 15.0) -> None:
        assert await wait_until(lambda: self._clean(srv), timeout, interval=0.02), (
            f"not back to the baseline (fds {self.fds}, tasks {self.tasks}): {self.now(srv)}\n"
            + "\n".join(sorted(repr(t.get_coro()) for t in asyncio.all_tasks()))
        )
