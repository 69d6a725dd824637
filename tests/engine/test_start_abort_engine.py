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

Each case costs the start of an engine core up to that point, not a whole start (20-30 s on 2 cores, most
of it the server importing torch and vLLM). Both run one after the other as one launch ahead
(tests/support/prestart.py), in a thread while earlier tests run: what each saw is kept, and its test
checks it. Alone, a test runs both when it starts.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from engine_adapter.default_model import build_tiny_model
from harness.process import ServerProcess
from harness.procs import Descendants, describe, end_session, in_session
from harness.server import launch
from tests.support import prestart, wait_until_sync

pytestmark = pytest.mark.engine

TINY = ("--dtype", "float32", "-O0", "--max-model-len", "512", "--max-num-seqs", "16", "--served-model-name", "tiny",
        "--access-log", "off")
# Seconds from the SIGTERM to the exit, then SIGKILL (it takes under 1 s; the engine's start-up left
# at that point takes 10 s or more on these machines).
GRACE = 5.0
START = 600.0
CASES = {"one": (), "shared": ("--api-server-count", "2")}


@dataclass
class Outcome:
    """What one server did after its SIGTERM."""

    code: int
    took: float  # seconds from the SIGTERM to its exit (or to the SIGKILL, at GRACE)
    ready_before: bool  # its log said the engine was ready before the SIGTERM
    left: list[psutil.Process]  # processes seen in its tree still running after it
    orphans: list[psutil.Process]  # processes of its session still running
    seen: str
    log: str


def _sigterm_while_starting(logs: Path, *flags: str) -> Outcome:
    server = launch(["--model", str(build_tiny_model(progress=False)), *TINY, *flags], logs, new_session=True)
    session = server.proc.pid
    seen = Descendants(server.proc.pid)
    try:
        assert wait_until_sync(lambda: server.proc.poll() is None and any("EngineCore" in c for c in seen.cmdlines()),
                               START, 0.05), server.log()[-3000:]
        ready_before = "engine ready" in server.log() or "engine core(s) ready" in server.log()
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
        return Outcome(code, took, ready_before, left, in_session(session), f"{len(seen.seen)} processes seen: {seen.summary()}",
                       server.log()[-3000:])
    finally:
        server.kill()
        end_session(session)  # never leave one behind, even when the test fails


OUTCOMES: dict[str, Outcome | BaseException] = {}


def _both(logs: Path) -> list[ServerProcess]:
    """Both cases, one after the other (each alone on its core, as the exit's bound wants); no server is left to hand over."""
    OUTCOMES.clear()
    for case, flags in CASES.items():
        folder = logs / case
        folder.mkdir(parents=True, exist_ok=True)
        try:
            OUTCOMES[case] = _sigterm_while_starting(folder, *flags)
        except Exception as exc:  # raised in its own test
            OUTCOMES[case] = exc
    return []


prestart.define("sigterm_outcomes", _both)


@pytest.fixture(scope="module")
def sigterm_outcomes() -> Iterator[dict[str, Outcome | BaseException]]:
    with prestart.ready("sigterm_outcomes", START):
        yield dict(OUTCOMES)


def _check(outcomes: dict[str, Outcome | BaseException], case: str) -> None:
    outcome = outcomes[case]
    if isinstance(outcome, BaseException):
        raise outcome
    print(f"\nSIGTERM while the engine core starts: exit {outcome.code} after {outcome.took:.2f} s; {outcome.seen}")
    assert not outcome.ready_before, outcome.log
    assert not outcome.left, describe(outcome.left)
    assert not outcome.orphans, describe(outcome.orphans)
    assert outcome.code == 128 + signal.SIGTERM, outcome.log
    assert outcome.took < GRACE


def test_sigterm_while_the_engine_starts_leaves_no_engine_process(sigterm_outcomes) -> None:
    _check(sigterm_outcomes, "one")


def test_sigterm_while_shared_engine_cores_start_leaves_no_process(sigterm_outcomes) -> None:
    _check(sigterm_outcomes, "shared")
