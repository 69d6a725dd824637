"""Shared fixtures: one real vLLM engine for the whole test session.

The server runs as a subprocess (`python -m streamproxy serve`, default model,
`-O0` so it starts in ~20 s instead of ~60 s): vLLM spawns its engine core,
which must not re-import pytest's main module, and a real process also tests
the CLI and start-up path. Tests talk to it over HTTP on loopback.

It lives here (not in tests/engine/) because tests/engine and tests/compat
both use it, and a session fixture defined once is started once: every test
marked `engine` in any folder shares the same server.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

ROOT = Path(__file__).resolve().parents[1]
START_TIMEOUT = 600


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_server(tmp_path_factory: pytest.TempPathFactory, name: str, args: list[str]):
    """Start `python -m streamproxy serve ARGS` on a free loopback port, yield its
    base URL once /health is 200, stop it after. The server exits 1 when its
    engine cannot start, so a dead engine fails the fixture at once."""
    port = _free_port()
    log_path = tmp_path_factory.mktemp(name) / "server.log"
    env = dict(os.environ)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    cmd = [sys.executable, "-m", "streamproxy", "serve", "--host", "127.0.0.1", "--port", str(port), *args]
    log = open(log_path, "wb")
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_TIMEOUT
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}:\n{log_path.read_text()[-4000:]}")
            try:
                if requests.get(base + "/health", timeout=2).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"engine not ready after {START_TIMEOUT} s:\n{log_path.read_text()[-4000:]}")
            time.sleep(1)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.fixture(scope="session")
def launch_server(tmp_path_factory: pytest.TempPathFactory):
    """`with launch_server(name, args) as base_url:` for a test module's own server."""
    return lambda name, args: contextlib.contextmanager(run_server)(tmp_path_factory, name, args)


@pytest.fixture(scope="session")
def engine_server(tmp_path_factory: pytest.TempPathFactory):
    args = ["-O0", "--max-model-len", "2048", "--max-num-seqs", "32", "--sse-heartbeat", "5"]
    yield from run_server(tmp_path_factory, "engine", args)


@pytest.fixture(scope="session")
def model_name(engine_server: str) -> str:
    return requests.get(engine_server + "/v1/models", timeout=10).json()["data"][0]["id"]
