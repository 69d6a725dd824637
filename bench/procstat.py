"""Process CPU and memory from /proc (Linux only), for the benchmarks.

`cpu_seconds(pid)` is utime+stime of /proc/PID/stat: every thread of the
process, dead ones included, at clock-tick resolution (10 ms). It is what the
side-by-side benchmark reports for a front-end process. `cpu_ns(pid)` sums the
run time of the live threads from /proc/PID/task/*/schedstat (nanoseconds):
precise enough for a short low-load interval of a single-threaded server, but
blind to threads that ended. `descendants(pid)` walks the ppid links, so a
server's engine-core child (and its workers) can be measured apart from the
front end.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

TICK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def _stat_fields(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat") as f:
        raw = f.read()
    # comm may contain spaces and parentheses: split after the last ')'.
    return raw[raw.rindex(")") + 2:].split()


def cpu_seconds(pid: int) -> float:
    """utime + stime of the whole process (all threads, also finished ones)."""
    fields = _stat_fields(pid)
    return (int(fields[11]) + int(fields[12])) / TICK


def threads_cpu_seconds(pid: int, prefix: str) -> float:
    """CPU time of the live threads of `pid` whose name (comm) starts with `prefix`, in ns resolution
    (/proc/PID/task/TID/schedstat's time on the CPU, not clock ticks)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                if not f.read().startswith(prefix):
                    continue
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total / 1e9


def cpu_user_sys(pid: int) -> tuple[float, float]:
    """(utime, stime) in seconds: user-space vs kernel (syscalls, loopback TCP) time."""
    fields = _stat_fields(pid)
    return int(fields[11]) / TICK, int(fields[12]) / TICK


def cpu_ns(pid: int) -> int:
    """Run time of the process's live threads, in ns (schedstat)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            pass
    return total


def tree_cpu_ns(pids: list[int]) -> int:
    """`cpu_ns` summed over processes (e.g. the workers of `--api-server-count N` and their parent)."""
    total = 0
    for p in pids:
        try:
            total += cpu_ns(p)
        except (FileNotFoundError, ProcessLookupError):
            pass
    return total


def tree_user_sys(pids: list[int]) -> tuple[float, float]:
    user = system = 0.0
    for p in pids:
        try:
            u, s = cpu_user_sys(p)
        except (FileNotFoundError, ProcessLookupError):
            continue
        user, system = user + u, system + s
    return user, system


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * PAGE


def ppid(pid: int) -> int:
    return int(_stat_fields(pid)[1])


def name(pid: int) -> str:
    """The process title (cmdline; vLLM retitles its engine core 'VLLM::EngineCore')."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").strip().decode(errors="replace")
        if cmd:
            return cmd
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except (FileNotFoundError, ProcessLookupError):
        return ""


def descendants(pid: int) -> list[int]:
    """Every live process below `pid` (children, grandchildren, ...)."""
    parent_of: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                parent_of[int(entry)] = ppid(int(entry))
            except (FileNotFoundError, ProcessLookupError, ValueError):
                pass
    found, frontier = [], [pid]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parent_of.items() if pp == p]
        found.extend(kids)
        frontier.extend(kids)
    return found


def tree_cpu_seconds(pids: list[int]) -> float:
    total = 0.0
    for p in pids:
        try:
            total += cpu_seconds(p)
        except (FileNotFoundError, ProcessLookupError):
            pass
    return total


def system_busy_seconds() -> float:
    """CPU seconds all cores spent busy (not idle/iowait), from /proc/stat."""
    with open("/proc/stat") as f:
        vals = [int(v) for v in f.readline().split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = (vals + [0] * 8)[:8]
    return (user + nice + system + irq + softirq + steal) / TICK


def _thread_files(pids: list[int], name: str) -> Iterator[str]:
    """The text of /proc/PID/task/TID/`name` for every live thread of `pids` (threads that ended are skipped)."""
    for p in pids:
        try:
            tids = os.listdir(f"/proc/{p}/task")
        except (FileNotFoundError, ProcessLookupError):
            continue
        for tid in tids:
            try:
                with open(f"/proc/{p}/task/{tid}/{name}") as f:
                    yield f.read()
            except (FileNotFoundError, ProcessLookupError):
                continue


def tree_sched(pids: list[int]) -> tuple[int, int, int]:
    """(run ns, run-queue wait ns, time slices) summed over the live threads of `pids` (schedstat).

    The wait is the time a thread was runnable but not running: how much the
    scheduler kept a process off the CPU (other work, the engine) while it had
    work to do. Threads that ended are not counted (a server's threads live on)."""
    run = wait = slices = 0
    for text in _thread_files(pids, "schedstat"):
        a, b, c = (int(v) for v in text.split()[:3])
        run, wait, slices = run + a, wait + b, slices + c
    return run, wait, slices


def tree_switches(pids: list[int]) -> tuple[int, int]:
    """(voluntary, involuntary) context switches summed over the live threads of `pids`.

    Involuntary: the thread was preempted while it had work (contention);
    voluntary: it went to sleep (an event loop waiting for I/O: its wake-ups)."""
    vol = invol = 0
    for text in _thread_files(pids, "status"):
        for line in text.splitlines():
            if line.startswith("voluntary_ctxt_switches"):
                vol += int(line.split()[1])
            elif line.startswith("nonvoluntary_ctxt_switches"):
                invol += int(line.split()[1])
    return vol, invol


def tree_write_calls(pids: list[int]) -> int:
    """Write-class system calls (write, writev, ...; /proc/PID/io `syscw`) of `pids`: the socket
    writes of an event-loop server. Needs the same user or root; 0 where it cannot be read."""
    total = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/io") as f:
                for line in f:
                    if line.startswith("syscw"):
                        total += int(line.split()[1])
                        break
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return total


def steal_seconds() -> float:
    """CPU time the hypervisor gave to other guests while this machine wanted it (/proc/stat steal)."""
    with open("/proc/stat") as f:
        vals = [int(v) for v in f.readline().split()[1:]]
    return (vals + [0] * 8)[7] / TICK
