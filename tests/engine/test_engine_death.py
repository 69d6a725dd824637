"""vLLM's engine core killed with SIGKILL under load: every client gets its error, the server exits 1.

Its own `streamproxy serve` of the default model (it is about to die, so
not the session's shared server), with room for all 60 requests at once
(`--max-num-seqs 64`). While 50 streams and 10 non-streaming requests run,
the engine-core child process (`VLLM::EngineCore`, found under the server's
pid) is killed; the checks are tests/support/engine_death.py's, the same
as the fake engine's in tests/production/test_engine_death.py. Afterwards
no process the server started is left.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import aiohttp
import psutil
import pytest
import requests

from harness.process import ServerProcess
from harness.server import CPU_DTYPE, launch
from tests.conftest import START_TIMEOUT
from tests.support import prestart
from tests.support.engine_death import engine_dies_under_load

pytestmark = pytest.mark.engine

GRACE = 2.0
ARGS = ["-O0", *CPU_DTYPE, "--max-model-len", "1024", "--max-num-seqs", "64", "--engine-death-grace", str(GRACE), "--access-log", "off"]


def engine_core(pid: int) -> psutil.Process:
    for child in psutil.Process(pid).children(recursive=True):
        if "EngineCore" in " ".join(child.cmdline()):
            return child
    raise AssertionError(f"no engine core under pid {pid}")


# Started ahead, while earlier tests run (tests/support/prestart.py); nothing reaches it before this test.
prestart.define("dying_server", lambda logs: [launch(ARGS, logs, "dying-engine")])


@pytest.fixture
def dying_server() -> Iterator[ServerProcess]:
    with prestart.ready("dying_server", START_TIMEOUT, stop_timeout=30) as (server,):
        yield server


async def test_engine_core_killed_under_load_ends_every_request_then_exits_1(dying_server, record_property):
    server = dying_server
    # The cold start when this test runs alone (bench/reliability.py); in a whole run, launched ahead, it is longer.
    record_property("start_s", round(server.ready_after, 1))
    try:
        model = requests.get(server.url("/v1/models"), timeout=10).json()["data"][0]["id"]
        core = engine_core(server.proc.pid)
        family = psutil.Process(server.proc.pid).children(recursive=True)

        async def kill(session: aiohttp.ClientSession) -> None:
            os.kill(core.pid, signal.SIGKILL)

        outcome = await engine_dies_under_load(server, kill, model=model, max_tokens=900, bound=120.0)
    finally:
        server.stop(30)
    for name in ("loaded_after", "unhealthy_after", "answered_after", "exit_after"):
        record_property(name, round(getattr(outcome, name), 3))
    print(f"\nall 60 running after {outcome.loaded_after:.1f} s; engine core killed: /health 503 after {outcome.unhealthy_after:.3f} s, every request answered after "
          f"{outcome.answered_after:.3f} s, exit {outcome.exit_code} after {outcome.exit_after:.2f} s")
    assert outcome.exit_code == 1, server.log()[-3000:]
    assert outcome.unhealthy_after < 5.0
    assert outcome.exit_after < GRACE + 15.0, outcome.exit_after
    gone, alive = psutil.wait_procs(family, timeout=10)
    assert not alive, alive
