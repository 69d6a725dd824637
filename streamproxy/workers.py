"""`--api-server-count N`: N `serve` processes on one port, the way `vllm serve` runs its API servers.

The parent (`run_workers`), no HTTP of its own: sets `PROMETHEUS_MULTIPROC_DIR` (any worker's
`/metrics` shows the sum); binds N SO_REUSEPORT sockets once, before any worker starts, so the kernel
spreads connections over the workers that listen; starts the shared engine cores (`EngineHost`,
vllm_shared.py; nothing for the fake engine); spawns the workers, each with its socket, index and
client config. SIGTERM or SIGINT sends SIGTERM to every worker, which drains as one server does (a second
one too); workers ignore SIGINT and get SIGTERM if the parent dies. A signal during the launch kills
what it started and exits 128 + the signal. A worker's own exit or the shared engine's death (workers
get SIGUSR1: 503 `engine_dead`) ends them all with exit 1. `worker_settings` splits the concurrency,
queue and explicit connection limits so their sums are what was asked; run-time LoRA loading is
refused with N > 1, as vLLM does.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import gc
import logging
import multiprocessing
import os
import queue
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from typing import Any, Protocol

import msgspec

from streamproxy.config import Settings
from streamproxy.oscalls import die_with_parent

log = logging.getLogger("streamproxy.workers")

# Seconds the parent waits past --drain-timeout for its workers before it kills them.
STOP_GRACE = 15.0
# Seconds between two looks at the launch thread (a signal wakes the parent at once).
LAUNCH_POLL = 0.5


class EngineHost(Protocol):
    """What the parent runs for the engine(s) its workers share."""

    def launch(self, count: int, start: Callable[[list[Any]], Sequence[BaseProcess]]) -> None:
        """Start the shared engine(s), and the workers through `start` (one picklable client config each).
        Runs in a thread of its own."""

    def abort(self) -> None:
        """While `launch` runs: end it, leaving no process it started (blocks until then, bounded)."""

    def watch(self, on_death: Callable[[], None]) -> None:
        """Call `on_death` (from any thread) once the shared engine is gone."""

    def shutdown(self, timeout: float) -> None: ...


class NoSharedEngine:
    """Every worker builds its own engine (the fake engine)."""

    def launch(self, count: int, start: Callable[[list[Any]], Sequence[BaseProcess]]) -> None:
        start([None] * count)

    def abort(self) -> None:
        pass  # the workers it started are stopped as after any launch

    def watch(self, on_death: Callable[[], None]) -> None:
        pass

    def shutdown(self, timeout: float) -> None:
        pass


def share(total: int, count: int, index: int) -> int:
    """Worker `index`'s part of `total`: the parts differ by at most one and add up to `total`."""
    return total // count + (1 if index < total % count else 0)


def worker_settings(settings: Settings, index: int, count: int) -> Settings:
    """The settings of worker `index` of `count`: the limits split so that their sum is the one asked for."""
    if count <= 1:
        return settings
    changes: dict[str, Any] = {}
    if settings.max_concurrent_requests > 0:
        changes["max_concurrent_requests"] = share(settings.max_concurrent_requests, count, index)
    if settings.max_queued_requests > 0:
        changes["max_queued_requests"] = share(settings.max_queued_requests, count, index)
    if settings.max_connections:
        changes["max_connections"] = share(settings.max_connections, count, index)
    return msgspec.structs.replace(settings, **changes)


def check(settings: Settings) -> None:
    """Refuse what cannot be split: a worker with no slot at all would have no limit (0 means none)."""
    count = settings.api_server_count
    if count < 1:
        raise SystemExit("--api-server-count must be at least 1")
    if count > 1 and os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "0").strip().lower() in ("1", "true"):
        # A load or unload would reach one process of N (vLLM refuses the same).
        raise SystemExit("VLLM_ALLOW_RUNTIME_LORA_UPDATING cannot be used with --api-server-count > 1")
    for name in ("max_concurrent_requests", "max_connections"):
        value = getattr(settings, name) or 0
        if 0 < value < count:
            flag = "--" + name.replace("_", "-")
            raise SystemExit(f"{flag} {value} is split over --api-server-count {count} processes: give at least {count}")


def bind(host: str, port: int, count: int) -> list[socket.socket]:
    """`count` sockets bound to one address, with SO_REUSEPORT when more than one (port 0: the first
    one's port for all).

    They do not listen yet: each worker's server calls listen() once it serves, so the kernel
    never queues a connection for a worker still starting (a bound socket that does not listen
    is not in the port's SO_REUSEPORT group); the port is held from here on all the same."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(family, socket.SOCK_STREAM)
            socks.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if count > 1:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((host, port))
            port = sock.getsockname()[1]
    except BaseException:
        for sock in socks:
            sock.close()
        raise
    return socks


@contextlib.contextmanager
def multiprocess_metrics() -> Iterator[str]:
    """PROMETHEUS_MULTIPROC_DIR for the workers: a fresh temporary folder unless one is given (as vLLM)."""
    given = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if given:
        log.warning("PROMETHEUS_MULTIPROC_DIR=%s is set: it must be empty, or /metrics adds up old runs", given)
        yield given
        return
    with tempfile.TemporaryDirectory(prefix="streamproxy-metrics-") as folder:
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = folder
        try:
            yield folder
        finally:
            os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)


WorkerTarget = Callable[[int, int, list[str], socket.socket, Any], None]


class Parent:
    """The workers' supervisor: signals in, exit codes out."""

    def __init__(self, settings: Settings, argv: list[str], target: WorkerTarget, host: EngineHost) -> None:
        self.settings = settings
        self.argv = argv
        self.target = target
        self.host = host
        self.count = settings.api_server_count
        self.procs: list[BaseProcess] = []
        self.socks: list[socket.socket] = []
        self.signals = 0
        self.first_signal = 0
        self.aborted = False  # stopped before everything was up: exit 128 + the first signal
        self.failed = False
        self.engine_dead = False
        self._wake_r, self._wake_w = multiprocessing.Pipe(duplex=False)

    def start(self, configs: list[Any]) -> Sequence[BaseProcess]:
        spawn = multiprocessing.get_context("spawn")
        for index, (sock, config) in enumerate(zip(self.socks, configs, strict=True)):
            proc = spawn.Process(target=self.target, name=f"ApiServer_{index}",
                                 args=(index, self.count, self.argv, sock, config))
            proc.start()
            self.procs.append(proc)
        log.info("started %d API server processes: pids %s", len(self.procs), [p.pid for p in self.procs])
        return self.procs

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.signals += 1
        self.first_signal = self.first_signal or signum
        self._wake_w.send(signum)

    def _on_engine_death(self) -> None:
        """From the host's watch thread: the workers end as a single server whose engine died does."""
        log.error("the shared engine died: the API servers answer 503 engine_dead and exit 1")
        self.engine_dead = True
        for proc in self.procs:
            _send(proc, signal.SIGUSR1)
        self._wake_w.send(0)

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        self.socks = bind(self.settings.host, self.settings.port, self.count)
        log.info("listening on http://%s:%d with %d processes (SO_REUSEPORT)", self.settings.host,
                 self.socks[0].getsockname()[1], self.count)
        try:
            if self._launch():
                self.host.watch(self._on_engine_death)
                self._wait()
        finally:
            self._close_sockets()
            self._stop_all(self.settings.drain_timeout + STOP_GRACE)
            self.host.shutdown(10.0)
        if self.failed or self.engine_dead:
            return 1
        return 128 + self.first_signal if self.aborted and self.first_signal else 0

    def _launch(self) -> bool:
        """The host's launch, in a thread while this one waits for it or for a signal; a signal
        first aborts it (False). A launch that fails raises here.

        The workers are started here all the same, in this (the main) thread, when the launch asks
        for them: a worker's PR_SET_PDEATHSIG fires when the thread that started it ends, not the process."""
        done = threading.Event()
        error: list[BaseException] = []
        asked: queue.SimpleQueue[tuple[list[Any], concurrent.futures.Future[Sequence[BaseProcess]]]] = queue.SimpleQueue()

        def start(configs: list[Any]) -> Sequence[BaseProcess]:
            started: concurrent.futures.Future[Sequence[BaseProcess]] = concurrent.futures.Future()
            asked.put((configs, started))
            self._wake_w.send(0)
            while True:
                try:
                    return started.result(LAUNCH_POLL)
                except TimeoutError:
                    if self.aborted:
                        raise RuntimeError("the launch was aborted") from None

        def launch() -> None:
            try:
                self.host.launch(self.count, start)
            except BaseException as exc:
                error.append(exc)
            finally:
                done.set()
                self._wake_w.send(0)

        threading.Thread(target=launch, name="engine-launch", daemon=True).start()
        while not done.is_set():
            if wait([self._wake_r], LAUNCH_POLL):
                self._wake_r.recv()
            while not asked.empty() and not self.signals:
                configs, started = asked.get()
                try:
                    started.set_result(self.start(configs))
                except BaseException as exc:
                    started.set_exception(exc)
            if self.signals and not done.is_set():
                log.info("signal while the engine starts: aborting the start")
                self.aborted = True
                self.host.abort()
                return False
        if error:
            raise error[0]
        return True

    def _wait(self) -> None:
        """Until every worker has exited. The first signal, or a worker that exits on its own, stops
        them all; after the shared engine's death they exit by themselves (bounded)."""
        alive: dict[Any, BaseProcess] = {proc.sentinel: proc for proc in self.procs}
        stopping = False
        forwarded = 0
        give_up: float | None = None
        while alive:
            timeout = None if give_up is None else max(give_up - time.monotonic(), 0.0)
            ready = wait([*alive, self._wake_r], timeout)
            if not ready and give_up is not None and time.monotonic() >= give_up:
                return  # `_stop_all` ends the rest
            for item in ready:
                if item is self._wake_r:
                    self._wake_r.recv()
                    continue
                proc = alive.pop(item)
                # The sentinel is ready once the child has closed its files, which is a moment before
                # it can be reaped: until then `exitcode` is None (read as a failure). Reap it first.
                proc.join(5.0)
                _mark_dead(proc.pid)
                log.info("API server %s (pid %s) exited with %s", proc.name, proc.pid, proc.exitcode)
                if not stopping and not self.engine_dead:
                    log.error("API server %s (pid %s) exited with %s: stopping the others", proc.name, proc.pid,
                              proc.exitcode)
                    self.failed = True
                elif proc.exitcode == 128 + signal.SIGTERM and not self.engine_dead:
                    self.aborted = True  # stopped while its engine client was starting (server.py)
                elif proc.exitcode != 0 and not self.engine_dead:
                    self.failed = True
            if self.engine_dead and give_up is None:
                give_up = time.monotonic() + self.settings.engine_death_grace + STOP_GRACE
            fresh, forwarded = self.signals - forwarded, self.signals
            if fresh or (self.failed and not stopping):
                if not stopping:
                    log.info("shutting down: the API servers drain (up to %.0f s)", self.settings.drain_timeout)
                    self._close_sockets()
                stopping = True
                for _ in range(max(fresh, 1)):  # the first drains; another one ends in-flight requests now
                    for proc in alive.values():
                        _send(proc, signal.SIGTERM)

    def _close_sockets(self) -> None:
        for sock in self.socks:
            sock.close()

    def _stop_all(self, timeout: float) -> None:
        """Every worker gone: SIGTERM to those left, SIGKILL to those still there after `timeout` s."""
        for proc in self.procs:
            if proc.exitcode is None:
                _send(proc, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for proc in self.procs:
            proc.join(max(deadline - time.monotonic(), 0.1))
            if proc.exitcode is None:
                log.error("API server pid %s did not stop: killing it", proc.pid)
                proc.kill()
                proc.join(5)
                self.failed = True
            _mark_dead(proc.pid)


def _send(proc: BaseProcess, sig: int) -> None:
    if proc.pid is not None and proc.exitcode is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, sig)


def _mark_dead(pid: int | None) -> None:
    """A gone worker's live gauges leave /metrics' sums (prometheus_client's multiprocess files)."""
    if pid is None or not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(pid)


def run_workers(settings: Settings, argv: list[str], target: WorkerTarget, host: EngineHost) -> int:
    """Serve with `settings.api_server_count` worker processes; the exit code."""
    check(settings)
    with multiprocess_metrics():
        code = Parent(settings, argv, target, host).run()
    gc.freeze()  # the exit's last collection skips vLLM's objects (seconds on a busy machine: server.run)
    return code


def become_worker() -> None:
    """In a worker, first thing: SIGINT is the parent's to decide; the parent's death is a SIGTERM."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent(signal.SIGTERM)
    if os.getppid() == 1:  # the parent died before the line above
        os.kill(os.getpid(), signal.SIGTERM)
