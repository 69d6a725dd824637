"""The processes an engine starts: recorded from the start, ended on every way out.

vLLM's engine start blocks for seconds to minutes (its engine core process
loads the weights, profiles the KV cache, warms up) and cannot be
interrupted. A server asked to stop meanwhile must not wait for it, and must
not leave the engine core and its workers running without it: they keep a
core busy and hold shared memory, and the next server on the machine never
becomes ready. So the start runs in a daemon thread (`in_thread`: nothing
waits for it at exit), and the processes it starts are known without vLLM's
help: `Spawned` notes this process's children before the start, and every
child started since then is the engine's, with all its descendants (not
multiprocessing's resource tracker, which ends by itself once every process
using it has, and then cleans up what they leaked).

`Spawned.kill_until(done, bound)` is the abort: it kills them all, again and
again as the start thread starts more, until that thread has ended (vLLM's
start-up barrier sees its engine core die and raises) or `bound` s pass.
`kill_tree` stops each process (SIGSTOP) before it lists its children, so
none can start another unseen, then SIGKILLs them all: nothing to save in an
engine that never served, and a killed engine core's worker must not
outlive it (orphaned, it spins on its shared-memory queue).

psutil is imported lazily: it comes with vLLM, and only its adapters call this.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

log = logging.getLogger("streamproxy.engine")

T = TypeVar("T")

# Seconds between two sweeps while an aborted start is still running.
SWEEP_INTERVAL = 0.1
# Seconds to wait for a SIGSTOP to take effect before listing the process's children anyway.
STOP_WAIT = 1.0


def children() -> dict[int, float]:
    """This process's children now: pid -> start time (a pid may be reused)."""
    import psutil

    found = {}
    for child in psutil.Process().children():
        try:
            found[child.pid] = child.create_time()
        except psutil.Error:
            pass
    return found


def started_since(before: dict[int, float]) -> list[Any]:
    """The processes started since `before` (`children()`), theirs too (psutil handles); not
    multiprocessing's resource tracker."""
    from multiprocessing import resource_tracker

    import psutil

    tracker = getattr(resource_tracker._resource_tracker, "_pid", None)
    found = []
    for child in psutil.Process().children():
        try:
            if child.pid == tracker or before.get(child.pid) == child.create_time():
                continue
            found += [child, *child.children(recursive=True)]
        except psutil.Error:
            pass
    return found


def reap(processes: list[Any], timeout: float) -> None:
    """Wait up to `timeout` s for an engine's processes to end (its own shutdown), then kill the rest."""
    import psutil

    _, alive = psutil.wait_procs(processes, timeout=timeout)
    for proc in alive:
        try:
            log.warning("engine process %d (%s) outlived the engine: killing it", proc.pid, proc.name())
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=timeout)


def kill_tree(roots: list[Any], timeout: float = 5.0) -> list[Any]:
    """SIGKILL `roots` and every descendant, leaving none: each is stopped before its children are
    listed (a stopped process starts no other), then all are killed. The ones killed."""
    import psutil

    stopped: dict[int, Any] = {}
    todo = list(roots)
    while todo:
        proc = todo.pop()
        if proc.pid in stopped:
            continue
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue  # dead already, its parent has not reaped it yet
            proc.suspend()
            stopped[proc.pid] = proc
            _wait_stopped(proc)
            todo += proc.children()
        except psutil.Error:
            pass  # gone already
    for proc in stopped.values():
        try:
            proc.kill()
        except psutil.Error:
            pass
    _wait_dead(list(stopped.values()), timeout)
    return list(stopped.values())


def _wait_dead(processes: list[Any], timeout: float) -> None:
    """Until each has exited (a zombie counts), without reaping any: a child's exit code is for its
    `multiprocessing.Process` to collect (reaped here, it would think the process still runs)."""
    import psutil

    deadline = time.monotonic() + timeout
    for proc in processes:
        while time.monotonic() < deadline:
            try:
                if proc.status() == psutil.STATUS_ZOMBIE:
                    break
            except psutil.Error:
                break
            time.sleep(0.01)


def _wait_stopped(proc: Any) -> None:
    """Until the SIGSTOP has taken effect (a fork under way has finished and shows in the children)."""
    import psutil

    deadline = time.monotonic() + STOP_WAIT
    while proc.status() not in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP, psutil.STATUS_ZOMBIE):
        if time.monotonic() > deadline:
            return
        time.sleep(0.001)


class Spawned:
    """The processes started from here on, and theirs."""

    def __init__(self) -> None:
        self.before = children()

    def processes(self) -> list[Any]:
        return started_since(self.before)

    def kill(self) -> list[Any]:
        killed = kill_tree(self.processes())
        if killed:
            log.info("killed the engine's processes %s", sorted(proc.pid for proc in killed))
        return killed

    def kill_until(self, done: concurrent.futures.Future[Any], bound: float) -> bool:
        """Kill every process started since, again as more start, until `done` (the start that
        starts them has ended) or `bound` s have passed. True if the start ended."""
        deadline = time.monotonic() + bound
        while True:
            self.kill()
            finished, _ = concurrent.futures.wait([done], timeout=SWEEP_INTERVAL)
            if finished or time.monotonic() >= deadline:
                break
        self.kill()  # what it started on its way out
        if not finished:
            log.warning("the engine's start did not end within %.0f s of its abort: leaving its thread behind", bound)
        return bool(finished)


def in_thread(fn: Callable[[], T], name: str) -> concurrent.futures.Future[T]:
    """`fn()` in a daemon thread: the process may exit without waiting for it (asyncio's executor
    threads are joined at exit, and a blocking engine start would hold the exit for minutes)."""
    future: concurrent.futures.Future[T] = concurrent.futures.Future()

    def run() -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            result = fn()
        except BaseException as exc:
            future.set_exception(exc)
        else:
            future.set_result(result)

    threading.Thread(target=run, name=name, daemon=True).start()
    return future
