"""A real `python -m streamproxy serve --engine fake` process, for tests of sync clients.

The SDKs' sync clients block, so they cannot talk to the in-loop aiohttp
test server; a subprocess on a free port also runs the CLI and start-up
path. `fake_server(*flags)` yields the base URL and stops the process (its
own pid, SIGTERM, then SIGKILL) on the way out.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def fake_server(*flags: str, timeout: float = 20.0) -> Iterator[str]:
    port = _free_port()
    cmd = [sys.executable, "-m", "streamproxy", "serve", "--engine", "fake", "--host", "127.0.0.1", "--port", str(port), "--access-log", "off", *flags]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}: {proc.stderr.read().decode()[-2000:] if proc.stderr else ''}")
            try:
                if requests.get(base + "/health", timeout=1).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the fake server did not become ready")
            time.sleep(0.05)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
