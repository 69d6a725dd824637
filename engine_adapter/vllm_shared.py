"""vLLM's engine core(s) shared by N API-server processes: `streamproxy serve --api-server-count N`.

The engine half of vLLM's `run_multi_api_server`, called, not copied: bind the ZMQ listeners, start
the engine cores (and the DP coordinator) with `launch_core_engines`, and hand each worker the client
config vLLM's `APIServerProcessManager` builds; each worker's `VllmEngine` is then a client. Liveness is
vLLM's `monitor_engine_liveness` (a thread), reported to the parent (workers.py). `abort()` kills all
started since `launch` began, within `ABORT_BOUND` s (spawned.py). vLLM is imported lazily.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from collections.abc import Callable, Sequence
from multiprocessing.process import BaseProcess
from typing import Any

from . import spawned

log = logging.getLogger("streamproxy.engine.vllm")

# Seconds `abort()` keeps killing what an aborted launch starts, waiting for it to end.
ABORT_BOUND = 15.0


class SharedCores:
    """The engine cores the workers share (satisfies `streamproxy.workers.EngineHost`)."""

    def __init__(self, engine_args: Any) -> None:
        self._args = engine_args
        self._manager: Any = None
        self._coordinator: Any = None
        self._listeners: list[Any] = []
        self._processes: list[Any] = []  # psutil handles of the engine's processes (spawned.reap)
        self._spawned: spawned.Spawned | None = None  # from the launch's beginning: what an abort kills
        self._launched: concurrent.futures.Future[None] = concurrent.futures.Future()  # the launch has ended
        self._aborted = threading.Event()
        self._up = False

    def launch(self, count: int, start: Callable[[list[Any]], Sequence[BaseProcess]]) -> None:
        self._spawned = spawned.Spawned()
        self._launched.set_running_or_notify_cancel()
        try:
            self._launch(count, start)
        finally:
            self._launched.set_result(None)

    def _launch(self, count: int, start: Callable[[list[Any]], Sequence[BaseProcess]]) -> None:
        from vllm.usage.usage_lib import UsageContext
        from vllm.v1.engine.utils import bind_engine_zmq_listeners, launch_core_engines
        from vllm.v1.executor import Executor

        args = self._args
        args._api_process_count = count
        args._api_process_rank = -1
        vllm_config = args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
        executor_class = Executor.get_class(vllm_config)
        if self._aborted.is_set():
            raise RuntimeError("the engine's launch was aborted")
        assert self._spawned is not None
        listeners = bind_engine_zmq_listeners(vllm_config, count)
        self._listeners = [*listeners.inputs, *listeners.outputs]
        with launch_core_engines(vllm_config, executor_class, not args.disable_log_stats,
                                 listeners.addresses) as launch:
            self._manager, self._coordinator = launch.engine_manager, launch.coordinator
            stats = self._coordinator.get_stats_publish_address() if self._coordinator else None
            configs = []
            for index, (inputs, outputs) in enumerate(zip(listeners.inputs, listeners.outputs, strict=True)):
                config: dict[str, Any] = {
                    "input_address": inputs.address, "output_address": outputs.address,
                    "input_listener": inputs.socket, "output_listener": outputs.socket,
                    "client_count": count, "client_index": index,
                }
                if stats is not None:
                    config["stats_update_address"] = stats
                if launch.tensor_queue is not None:
                    config["tensor_queue"] = launch.tensor_queue
                configs.append(config)
            try:
                procs = start(configs)
            finally:
                for listener in (*listeners.inputs, *listeners.outputs):
                    listener.close()  # the workers hold them now (vLLM's APIServerProcessManager does the same)
            # A worker that dies while the engine cores start aborts the start (vLLM's startup barrier).
            launch.watched_frontend_processes = procs
        workers = {proc.pid for proc in procs}
        self._processes = [p for p in self._spawned.processes() if p.pid not in workers and p.ppid() not in workers]
        self._up = True
        log.info("engine core(s) ready for %d API servers", count)

    def abort(self) -> None:
        """While `launch` runs (in another thread): end it now, leaving none of its processes."""
        self._aborted.set()
        if self._spawned is not None:
            self._spawned.kill_until(self._launched, ABORT_BOUND)

    def watch(self, on_death: Callable[[], None]) -> None:
        manager = self._manager
        if manager is None:
            return

        def monitor() -> None:
            try:
                manager.monitor_engine_liveness()
            finally:
                if getattr(manager, "failed_proc_name", None) is not None:
                    on_death()

        threading.Thread(target=monitor, name="engine-core-liveness", daemon=True).start()

    def shutdown(self, timeout: float) -> None:
        if self._manager is not None:
            self._manager.shutdown(timeout=timeout)
        if self._coordinator is not None:
            self._coordinator.shutdown(timeout=timeout)
        for listener in self._listeners:
            listener.cleanup()  # unlinks the ipc:// paths
        # A SIGTERMed engine core can leave its model worker spinning as an orphan (vllm_engine.py).
        processes, self._processes = self._processes, []
        if processes:
            spawned.reap(processes, timeout)
        elif self._spawned is not None and not self._up:
            self._spawned.kill()  # the launch failed or was aborted: whatever it started goes too
