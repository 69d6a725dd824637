"""Start, watch and stop the servers under test (vLLM's own, streamproxy).

Each server is a child process in its own session (so it and everything it
spawns can be stopped together), bound to 127.0.0.1 on a free port, with its
output in a log file under bench/results/logs/. The front-end process is the
one we start (`python -m ...`): vLLM's API server and streamproxy both run
their HTTP layer and AsyncLLM there and spawn the engine core
(`VLLM::EngineCore`) as a child; `engine_pids()` returns those children.
vLLM's Rust front end (`rust_server`) is the other way round: the process we
start is `vllm serve`'s Python launcher, which spawns the engine core and the
`vllm-rs` binary; the front end is that child (`frontend_exe`), and the
launcher is neither front end nor engine.
"""

from __future__ import annotations

import signal
from pathlib import Path

from harness.process import ROOT, ServerProcess, free_port
from harness.server import VLLM_SERVER, command_line

from . import procstat

RESULTS = ROOT / "bench" / "results"
SERVED_NAME = "bench-model"


def stop_on_signals() -> None:
    """Ctrl-C and SIGTERM both end a benchmark through KeyboardInterrupt, so its `finally` stops
    the servers. Inside `uvloop.run` SIGINT cancels the main task (asyncio.Runner); an exception
    raised by a handler there could land in a protocol callback and be taken for a lost
    connection, so SIGTERM is turned into SIGINT. SIGINT is reset too: a job started in the
    background by a non-interactive shell inherits it ignored."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: signal.raise_signal(signal.SIGINT))


class Server(ServerProcess):
    """A benchmarked server (harness.process): its own session, one log file, and which of its
    processes are the front end and which the engine."""

    def __init__(self, label: str, cmd: list[str], port: int, log_path: Path, env: dict[str, str] | None = None, *,
                 health_path: str = "/health", frontend_exe: str | None = None) -> None:
        super().__init__(cmd, port, log_path, env=env, label=label, health_path=health_path, new_session=True)
        self.frontend_exe = frontend_exe  # the front end is the descendant running this executable (not our process)

    def wait_ready(self, timeout: float = 900.0, interval: float = 0.5) -> None:
        super().wait_ready(timeout, interval)

    def stop(self, timeout: float = 60.0) -> int:
        """Room for an engine's own shutdown before SIGKILL (then the whole group)."""
        return super().stop(timeout)

    def fifo(self, prio: int) -> Server:
        """`--chrt PRIO`: start under `chrt -f PRIO` (it execs the server: the pid we watch is the server's); 0: as is."""
        if prio:
            self.cmd = ["chrt", "-f", str(prio), *self.cmd]
        return self

    def frontend_pids(self) -> list[int]:
        """The API-server processes: this one, and with `--api-server-count N` its N workers
        (spawned children that are not vLLM's retitled engine processes nor a resource tracker).
        With `frontend_exe`: the descendants running that executable instead."""
        if self.frontend_exe is not None:
            return [p for p in procstat.descendants(self.pid)
                    if Path(procstat.name(p).split(" ", 1)[0]).name == self.frontend_exe]
        workers = [p for p in procstat.descendants(self.pid)
                   if procstat.ppid(p) == self.pid and "spawn_main" in procstat.name(p)]
        return [self.pid, *workers]

    def engine_pids(self) -> list[int]:
        """Everything below the front end: the engine core(s), their workers (and the DP coordinator)."""
        front = set(self.frontend_pids())
        return [p for p in procstat.descendants(self.pid) if p not in front]

    def engine_core_pid(self) -> int | None:
        for p in self.engine_pids():
            if "EngineCore" in procstat.name(p):
                return p
        return None


def engine_cmd_args(model: str, extra: list[str]) -> list[str]:
    return ["--model", model, "--served-model-name", SERVED_NAME, *extra]


def vllm_server(model: str, engine_args: list[str], tag: str, env: dict[str, str]) -> Server:
    port = free_port()
    cmd = command_line(VLLM_SERVER, None, port, engine_cmd_args(model, engine_args))
    return Server("vllm", cmd, port, RESULTS / "logs" / f"{tag}-vllm.log", env)


def rust_server(model: str, engine_args: list[str], tag: str, env: dict[str, str], binary: Path) -> Server:
    """`vllm serve` with vLLM's Rust front end (bench/rust_frontend.py) over the same engine flags."""
    from . import rust_frontend

    port = free_port()
    cmd = command_line("bench.rust_frontend", "serve", port, engine_cmd_args(model, engine_args))
    return Server("vllm-rust", cmd, port, RESULTS / "logs" / f"{tag}-vllm-rust.log",
                  {**env, **rust_frontend.env(binary)}, frontend_exe=binary.name)


def streamproxy_server(model: str, engine_args: list[str], tag: str, env: dict[str, str],
                       extra: list[str] | None = None, label: str = "streamproxy") -> Server:
    port = free_port()
    cmd = command_line("streamproxy", "serve", port, [*engine_cmd_args(model, engine_args), *(extra or [])])
    return Server(label, cmd, port, RESULTS / "logs" / f"{tag}-{label}.log", env)


def fake_server(args: list[str], tag: str) -> Server:
    port = free_port()
    cmd = command_line("streamproxy", "serve", port, ["--engine", "fake", *args])
    return Server("streamproxy-fake", cmd, port, RESULTS / "logs" / f"{tag}-fake.log")
