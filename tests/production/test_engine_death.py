"""The engine dies under load and the server exits 1, for its supervisor to restart it.

A `streamproxy serve --engine fake` process whose engine dies the way vLLM's
engine core does when a step raises: a poison prompt (`--fake-crash-on`)
makes a step raise while 50 streams and 10 non-streaming requests run.
Every client gets its error, /health and new requests say 503 at once, and
the process exits 1 within a few seconds (tests/support/engine_death.py
has the checks; the same with the real engine core killed by SIGKILL is
tests/engine/test_engine_death.py). In-process, with the engine's `kill()`,
the same answers are checked in test_limits.py.
"""

from __future__ import annotations

import aiohttp

from harness.server import FAKE_ARGS, start_server
from tests.support.engine_death import engine_dies_under_load

CRASH = "poison-CRASH-prompt"
GRACE = 2.0


async def test_engine_step_raising_under_load_ends_every_request_then_exits_1(tmp_path, record_property):
    server = start_server(
        [*FAKE_ARGS, "--fake-token-delay", "0.05", "--fake-crash-on", CRASH, "--fake-max-model-len", "1000000",
         "--engine-death-grace", str(GRACE)],
        tmp_path,
    )

    async def poison(session: aiohttp.ClientSession) -> None:
        body = {"messages": [{"role": "user", "content": CRASH}], "max_tokens": 5}
        async with session.post(server.url("/v1/chat/completions"), json=body) as resp:
            assert resp.status == 500 and (await resp.json())["error"]["code"] == "engine_error"

    try:
        outcome = await engine_dies_under_load(server, poison, model="fake", max_tokens=900_000)
    finally:
        server.stop()
    for name in ("loaded_after", "unhealthy_after", "answered_after", "exit_after"):
        record_property(name, round(getattr(outcome, name), 3))
    assert outcome.exit_code == 1, server.log()[-3000:]
    # Every request the engine held failed with it (none needed the grace's deadline).
    assert set(outcome.stream_codes) == {"engine_error"}, outcome.stream_codes
    assert set(outcome.nonstream_statuses) == {500}
    assert outcome.unhealthy_after < 1.0
    assert GRACE <= outcome.exit_after < GRACE + 8.0, outcome.exit_after
    log = server.log()
    assert "the inference engine died" in log and "Traceback" not in log, log[-3000:]

