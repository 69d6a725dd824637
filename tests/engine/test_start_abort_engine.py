"""SIGTERM while vLLM's engine is still starting: the server stops at once and leaves no engine process.

`streamproxy serve` (and `--api-server-count 2`) on the tiny model gets
SIGTERM as soon as its engine core process (`VLLM::EngineCore`) exists, while
that one is still loading. It must exit 128 + 15 within `GRACE` s (the start
is aborted: engine_adapter/spawned.py), and no process it started may be left:
neither one seen in its tree while it ran, nor any in the session it leads
(an orphan leaves the tree, not the session: harness/procs.py).

A server still there after `GRACE` s gets SIGKILL, as a supervisor sends
once its grace is over (docker stop's is 10 s): before the fix, SIGTERM
waited for the engine's whole start-up, and the SIGKILL left the engine
core (and its worker) running, pinned to a core with its shared memory held.

Each test costs the start of an engine core up to that point, not a whole start.
"""

from __future__ import annotations

import signal
import time

import pytest

from engine_adapter.default_model import build_tiny_model
from harness.procs import Descendants, describe, end_session, in_session
from harness.server import launch
from tests.support import wait_until_sync

pytestmark = pytest.mark.engine

TINY = ("--dtype", "float32", "-O0", "--max-model-len", "512", "--max-num-seqs", "16", "--served-model-name", "tiny",
        "--access-log", "off")
# Seconds from the SIGTERM to the exit, then SIGKILL (it takes under 1 s; the engine's start-up left
# at that point takes 10 s or more on these machines).
GRACE = 5.0
START = 600.0


def _sigterm_while_starting(tmp_path, *flags: str) -> None:
    server = launch(["--model", str(build_tiny_model(progress=False)), *TINY, *flags], tmp_path, new_session=True)
    session = server.proc.pid
    seen = Descendants(server.proc.pid)
    try:
        assert wait_until_sync(lambda: server.proc.poll() is None and any("EngineCore" in c for c in seen.cmdlines()),
                               START, 0.05), server.log()[-3000:]
        assert "engine ready" not in server.log() and "engine core(s) ready" not in server.log()
        sent = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        while server.proc.poll() is None and time.monotonic() - sent < GRACE:
            seen.record()
            time.sleep(0.05)
        took = time.monotonic() - sent
        if server.proc.poll() is None:
            server.proc.kill()  # the supervisor's grace is over
        code = server.proc.wait(60)
        wait_until_sync(lambda: not seen.alive(), 10)  # the resource tracker ends after the last process using it
        left = seen.alive()
        wait_until_sync(lambda: not in_session(session), 10)
        orphans = in_session(session)
        print(f"\nSIGTERM while the engine core starts: exit {code} after {took:.2f} s; "
              f"{len(seen.seen)} processes seen: {seen.summary()}")
        assert not left, describe(left)
        assert not orphans, describe(orphans)
        assert code == 128 + signal.SIGTERM, server.log()[-3000:]
        assert took < GRACE
    finally:
        server.kill()
        end_session(session)  # never leave one behind, even when the test fails


def test_sigterm_while_the_engine_starts_leaves_no_engine_process(tmp_path) -> None:
    _sigterm_while_starting(tmp_path)


def test_sigterm_while_shared_engine_cores_start_leaves_no_process(tmp_path) -> None:
    _sigterm_while_starting(tmp_path, "--api-server-count", "2")
