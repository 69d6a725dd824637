"""A server under test or under load: a child process on 127.0.0.1, its output in files.

    srv = ServerProcess(cmd, port, log_dir / "x.out", log_dir / "x.err", env={...})   # nothing runs yet
    srv.start(); srv.wait_ready(30)     # or ServerFailed with the end of its output
    srv.base, srv.url("/v1/models"), srv.log(), srv.ready_after
    srv.stop()                          # SIGTERM, then SIGKILL after a bound; the exit code
    srv.kill()                          # SIGKILL now, as a crash

The command names the port itself (picked by the caller: `free_port()`).
The process gets the environment plus `env`, runs in `cwd` (the
repository: `python -m` imports from there first), reads /dev/null, and
writes stdout and stderr to files (both to one when `stderr_path` is None),
so a chatty server never blocks on a full pipe. Ready means `health_path`
answers 200 while this process, or one it started, listens on the port: an
answer from another server that took the same free port first (parallel
test workers starting servers at once can) is not this one's. A process
that exits first, or is not ready by the deadline, raises `ServerFailed`.

`new_session`: the process leads a session (and process group) of its own,
which every process it starts stays in, also one orphaned by its death
(`procs.in_session`); `stop()` then also kills what is left of the group.
`start()` may be called again after a stop: a restart, same command and port.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

import requests

from harness.procs import listens
from harness.waiting import wait_until_sync

ROOT = Path(__file__).resolve().parents[1]
# An HTTPS server: (the CA file to trust, the client's (cert, key) or None).
Tls = tuple[str, tuple[str, str] | None]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerFailed(RuntimeError):
    def __init__(self, message: str, log: str) -> None:
        super().__init__(f"{message}:\n{log[-4000:]}")
        self.log = log


class ServerProcess:
    def __init__(
        self, cmd: Sequence[str], port: int, stdout_path: Path, stderr_path: Path | None = None, *,
        env: Mapping[str, str] | None = None, cwd: str | Path = ROOT, label: str = "server", health_path: str = "/health",
        new_session: bool = False, tls: Tls | None = None,
    ) -> None:
        self.cmd = list(cmd)
        self.port = port
        self.stdout_path = stdout_path
        self.stderr_path = stderr_path
        self.env = dict(env or {})
        self.cwd = cwd
        self.label = label
        self.health_path = health_path
        self.new_session = new_session
        self.tls = tls
        self.base = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
        self._proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0
        self.ready_after = 0.0  # seconds from start() to ready

    @property
    def proc(self) -> subprocess.Popen[bytes]:
        if self._proc is None:
            raise RuntimeError(f"{self.label} was not started")
        return self._proc

    @property
    def pid(self) -> int:
        return self.proc.pid

    def start(self) -> None:
        self.stdout_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.stdout_path, "wb") as out:
            if self.stderr_path is None:
                self._popen(out, subprocess.STDOUT)
            else:
                with open(self.stderr_path, "wb") as err:
                    self._popen(out, err)

    def _popen(self, out: IO[bytes], err: IO[bytes] | int) -> None:
        self.started_at = time.monotonic()
        self._proc = subprocess.Popen(self.cmd, cwd=self.cwd, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                      env={**os.environ, **self.env}, start_new_session=self.new_session)

    def url(self, path: str) -> str:
        return self.base + path

    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace") if self.stdout_path.exists() else ""

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace") if self.stderr_path and self.stderr_path.exists() else ""

    def log(self) -> str:
        return self.stdout() + self.stderr()

    def get(self, path: str, timeout: float) -> requests.Response:
        if self.tls is None:
            return requests.get(self.url(path), timeout=timeout)
        ca, cert = self.tls
        return requests.get(self.url(path), timeout=timeout, verify=ca, cert=cert)

    def healthy(self) -> bool:
        if self.proc.poll() is not None:
            raise ServerFailed(f"{self.label} exited with {self.proc.returncode}", self.log())
        try:
            healthy = self.get(self.health_path, 2).status_code == 200
        except requests.RequestException:
            return False
        return healthy and listens(self.proc.pid, self.port)

    def wait_ready(self, timeout: float = 30.0, interval: float = 0.05) -> None:
        if not wait_until_sync(self.healthy, timeout, interval):
            raise ServerFailed(f"{self.label} not ready after {timeout} s", self.log())
        self.ready_after = time.monotonic() - self.started_at

    def model_id(self) -> str:
        """The first model /v1/models lists."""
        return self.get("/v1/models", 10).json()["data"][0]["id"]

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM, then SIGKILL after `timeout` s (and, with `new_session`, to what is left of the group); the exit
        code (0 for a server never started: nothing to stop)."""
        if self._proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        code = self.proc.wait()
        if self.new_session:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        return code

    def kill(self) -> int:
        """SIGKILL now, as a crash: no drain, connections reset by the kernel."""
        if self.proc.poll() is None:
            self.proc.kill()
        return self.proc.wait()
