"""The processes an engine starts: recorded from the start, ended on every way out.

vLLM's engine start blocks and cannot be interrupted, so it runs in a daemon thread (`in_thread`), and
`Spawned` notes this process's children before it: every child since, with its descendants, is the
engine's (not multiprocessing's resource tracker). `kill_until(done, bound)` kills them, again as more
start, until the thread ends or `bound` s pass; `kill_tree` SIGSTOPs each process before listing its
children, then SIGKILLs all. psutil is imported lazily (it comes with vLLM).
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
