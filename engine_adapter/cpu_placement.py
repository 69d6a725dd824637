"""Keep the front end off the cores the engine's compute threads are bound to.

vLLM's CPU backend binds each worker's OpenMP threads to a list of cores
(`VLLM_CPU_OMP_THREADS_BIND=auto`: every core but `reserve_cpu_num`, which it
leaves to its engine-core scheduler process and the API server), but binds
neither of those two. The kernel's balancer then moves the front end onto a
worker's core whenever the reserved one looks busy: each such slice preempts
the compute thread in the middle of a model step (every stream waits), and
the front end itself waits behind a thread that never sleeps.

`confine(engine_processes)` reads the cores the engine's workers are bound to
(a worker's affinity is narrower than the machine's) and confines this
process, every thread of it, and the engine's unbound processes (the engine
core) to the other cores. It needs no privilege: a process may narrow its own
and its children's affinity. It does nothing where there is nothing to
separate: no bound worker (GPU, `VLLM_CPU_OMP_THREADS_BIND=nobind`) or
workers bound to every core this process may use. Threads started later
inherit the affinity of the thread that starts them.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable

log = logging.getLogger("streamproxy.engine")


def plan(own: set[int], engine: dict[int, set[int]]) -> tuple[set[int], list[int]] | None:
    """The cores to confine to and the engine processes to confine, or None to leave all as they are.

    `own`: the cores this process may use; `engine`: each engine process's allowed cores.
    A process allowed fewer cores than `own` is a bound worker; the others are confined with us."""
    bound = set().union(*(cpus for cpus in engine.values() if cpus < own)) if engine else set()
    rest = own - bound
    if not bound or not rest:
        return None
    return rest, sorted(pid for pid, cpus in engine.items() if not cpus < own)


def confine(engine_pids: Iterable[int]) -> set[int] | None:
    """Confine this process and the engine's unbound processes to the cores its workers leave free."""
    own = os.sched_getaffinity(0)
    engine = {}
    for pid in engine_pids:
        try:
            engine[pid] = os.sched_getaffinity(pid)
        except OSError:  # gone already (e.g. a resource tracker)
            continue
    decided = plan(own, engine)
    if decided is None:
        return None
    cores, others = decided
    for pid in [*_threads(), *others]:
        try:
            os.sched_setaffinity(pid, cores)
        except OSError as exc:  # a thread that ended meanwhile, or a foreign process
            log.debug("could not confine %d to cores %s: %s", pid, sorted(cores), exc)
    log.info("front end and engine core on cores %s; the engine's workers keep %s",
             _ranges(cores), _ranges(own - cores))
    return cores


def _threads() -> list[int]:
    try:
        return [int(tid) for tid in os.listdir("/proc/self/task")]
    except OSError:
        return [0]


def _ranges(cpus: set[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))
