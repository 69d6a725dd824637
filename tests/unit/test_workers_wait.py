"""The `--api-server-count` parent's wait loop: a worker's exit code is read once it is reaped.

A process's sentinel becomes ready when it closes its files, a moment before it can be reaped;
read in that moment, `exitcode` is None, which the parent took for a failed drain (exit 1 after a
clean SIGTERM, seen once in a full test run)."""

from __future__ import annotations

import os
import threading

from streamproxy.config import Settings
from streamproxy.workers import Parent


class _Worker:
    """A worker that drains and exits 0, whose exit code is readable only after `join()`."""

    def __init__(self) -> None:
        self.sentinel, self._open = os.pipe()
        self.pid = None  # nothing to signal
        self.name = "ApiServer_0"
        self.joined = False

    def close_files(self) -> None:
        os.close(self._open)

    @property
    def exitcode(self) -> int | None:
        return 0 if self.joined else None

    def join(self, timeout: float | None = None) -> None:
        self.joined = True


def test_a_worker_that_drained_is_not_a_failure_when_its_sentinel_comes_before_its_exit_code() -> None:
    parent = Parent(Settings(), [], target=None, host=None)  # type: ignore[arg-type]  # only the wait loop runs
    worker = _Worker()
    parent.procs = [worker]  # type: ignore[list-item]
    parent._on_signal(15, None)  # SIGTERM: the parent starts stopping its workers
    timer = threading.Timer(0.2, worker.close_files)  # the worker exits after the parent has begun stopping
    timer.start()
    try:
        parent._wait()
    finally:
        timer.join()
        os.close(worker.sentinel)
    assert worker.joined
    assert not parent.failed
