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

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from . import procstat

ROOT = Path(__file__).resolve().parents[1]
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    label: str
    cmd: list[str]
    port: int
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    health_path: str = "/health"  # answers 200 once the server can take requests
    cwd: str | Path = ROOT  # where it runs (`python -m` imports from there first)
    frontend_exe: str | None = None  # the front end is the descendant running this executable (not our process)
    proc: subprocess.Popen | None = None
    started_at: float = 0.0
    ready_after: float = 0.0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "wb")
        env = {**os.environ, **self.env}
        self.started_at = time.monotonic()
        self.proc = subprocess.Popen(self.cmd, cwd=self.cwd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()

    def wait_ready(self, timeout: float = 900.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{self.label} exited with {self.proc.returncode}; log {self.log_path}:\n"
                                   + self.log_tail())
            try:  # streamproxy lists its model while the engine still loads: /health first
                with urllib.request.urlopen(self.url + self.health_path, timeout=5) as r:
                    healthy = r.status == 200
                with urllib.request.urlopen(self.url + "/v1/models", timeout=5) as r:
                    if healthy and r.status == 200 and json.load(r).get("data"):
                        self.ready_after = time.monotonic() - self.started_at
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.label} not ready after {timeout:.0f} s; log {self.log_path}:\n"
                                   + self.log_tail())
            time.sleep(1.0)

    def wait_workers(self, count: int, timeout: float = 300.0) -> None:
        """With `--api-server-count N`: until all N API servers listen (their log lines); /health
        answers as soon as the first one does, and the port serves only those that listen."""
        deadline = time.monotonic() + timeout
        while self.log_tail(10**8).count("streamproxy.server: listening on") < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.label}: not all {count} API servers listen after {timeout:.0f} s; "
                                   f"log {self.log_path}")
            time.sleep(0.5)

    def log_tail(self, n: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except FileNotFoundError:
            return ""

    def model_id(self) -> str:
        with urllib.request.urlopen(self.url + "/v1/models", timeout=10) as r:
            return json.load(r)["data"][0]["id"]

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

    def stop(self, timeout: float = 60.0) -> None:
        """SIGINT (graceful), then SIGTERM, then SIGKILL to the server's own process group."""
        if self.proc is None or self.proc.poll() is not None:
            self._kill_group(signal.SIGKILL)
            return
        for sig, wait in ((signal.SIGINT, timeout), (signal.SIGTERM, 15.0), (signal.SIGKILL, 10.0)):
            try:
                self.proc.send_signal(sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
        self._kill_group(signal.SIGKILL)  # stragglers (engine core) in the server's own session

    def _kill_group(self, sig: int) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, sig)  # the group we created with start_new_session
        except (ProcessLookupError, PermissionError):
            pass


def engine_cmd_args(model: str, extra: list[str]) -> list[str]:
    return ["--model", model, "--served-model-name", SERVED_NAME, *extra]


def vllm_server(model: str, engine_args: list[str], tag: str, env: dict[str, str]) -> Server:
    port = free_port()
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--host", "127.0.0.1",
           "--port", str(port), *engine_cmd_args(model, engine_args)]
    return Server("vllm", cmd, port, RESULTS / "logs" / f"{tag}-vllm.log", env)


def rust_server(model: str, engine_args: list[str], tag: str, env: dict[str, str], binary: Path) -> Server:
    """`vllm serve` with vLLM's Rust front end (bench/rust_frontend.py) over the same engine flags."""
    from . import rust_frontend

    port = free_port()
    cmd = [sys.executable, "-m", "bench.rust_frontend", "serve", "--host", "127.0.0.1", "--port", str(port),
           *engine_cmd_args(model, engine_args)]
    return Server("vllm-rust", cmd, port, RESULTS / "logs" / f"{tag}-vllm-rust.log",
                  {**env, **rust_frontend.env(binary)}, frontend_exe=binary.name)


def streamproxy_server(model: str, engine_args: list[str], tag: str, env: dict[str, str],
                       extra: list[str] | None = None, label: str = "streamproxy") -> Server:
    port = free_port()
    cmd = [sys.executable, "-m", "streamproxy", "serve", "--host", "127.0.0.1", "--port", str(port),
           *engine_cmd_args(model, engine_args), *(extra or [])]
    return Server(label, cmd, port, RESULTS / "logs" / f"{tag}-{label}.log", env)


def fake_server(args: list[str], tag: str) -> Server:
    port = free_port()
    cmd = [sys.executable, "-m", "streamproxy", "serve", "--engine", "fake", "--host", "127.0.0.1",
           "--port", str(port), *args]
    return Server("streamproxy-fake", cmd, port, RESULTS / "logs" / f"{tag}-fake.log")
