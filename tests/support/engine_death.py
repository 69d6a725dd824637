"""The engine dies under load: what every client and the process must see.

    outcome = await engine_dies_under_load(server, fault, model=..., max_tokens=...)

`server` is a `streamproxy serve` process (harness/server.py) this test
owns: it is about to die. N streams and M non-streaming chat requests start
and are all in the engine (every stream has its first content, and the
server's `streamproxy_engine_requests` gauge counts them all); then
`fault(session)` is started (a poison prompt for the fake engine, `kill -9`
of the engine core for vLLM's) and from then on:

- /health answers 503 (timed: `unhealthy_after`);
- new requests, streaming or not, get 503 `engine_dead` with Retry-After;
- every stream ends with an in-band error event and `data: [DONE]`;
- every non-streaming request gets a 5xx OpenAI error (or, after an early
  200, the error in the body);
- the process exits 1 (timed: `exit_after`).

Every wait is bounded: a hang fails the test instead of stalling it.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import aiohttp

from harness.process import ServerProcess
from tests.support import sse

STREAMS, NONSTREAMS = 50, 10
_ENGINE_REQUESTS = re.compile(rb"^streamproxy_engine_requests (\S+)$", re.M)


@dataclass
class Outcome:
    loaded_after: float  # seconds from the first request to every one running (the fault's moment)
    unhealthy_after: float  # seconds from the fault to /health's first 503
    answered_after: float  # ... to the last in-flight request's end
    exit_after: float  # ... to the process's exit
    exit_code: int
    stream_codes: list[str]  # the error codes of the streams' in-band errors
    nonstream_statuses: list[int]


def _error(raw: bytes) -> dict:
    data = json.loads(raw)
    assert list(data) == ["error"] and set(data["error"]) == {"message", "type", "param", "code"}, data
    return data["error"]


async def engine_requests(session: aiohttp.ClientSession, base: str) -> float:
    async with session.get(base + "/metrics") as resp:
        found = _ENGINE_REQUESTS.search(await resp.read())
    return float(found.group(1)) if found else -1.0


async def engine_dies_under_load(
    server: ServerProcess, fault: Callable[[aiohttp.ClientSession], Awaitable[None]], *, model: str, max_tokens: int,
    streams: int = STREAMS, nonstreams: int = NONSTREAMS, bound: float = 60.0,
) -> Outcome:
    base = server.base
    url = base + "/v1/chat/completions"
    timeout = aiohttp.ClientTimeout(total=bound)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
        started = 0

        def body(i: int, stream: bool) -> dict:
            return {
                "model": model, "messages": [{"role": "user", "content": f"Tell me a long story, number {i}."}],
                "stream": stream, "max_tokens": max_tokens, "ignore_eos": True,
            }

        async def one_stream(i: int) -> bytes:
            nonlocal started
            async with session.post(url, json=body(i, True)) as resp:
                assert resp.status == 200, await resp.read()
                got = b""
                while got.count(b"data: ") < 2:  # the role chunk, then content
                    got += await resp.content.readuntil(b"\n\n")
                started += 1
                return got + await resp.read()

        async def one_nonstream(i: int) -> tuple[int, bytes]:
            async with session.post(url, json=body(streams + i, False)) as resp:
                return resp.status, await resp.read()

        t_load = time.monotonic()
        stream_tasks = [asyncio.ensure_future(one_stream(i)) for i in range(streams)]
        plain_tasks = [asyncio.ensure_future(one_nonstream(i)) for i in range(nonstreams)]
        everything = [*stream_tasks, *plain_tasks]
        deadline = time.monotonic() + bound
        while started < streams or await engine_requests(session, base) < streams + nonstreams:
            failed = [t for t in everything if t.done()]
            assert not failed, failed[0].result()
            assert time.monotonic() < deadline, f"only {started} streams started"
            await asyncio.sleep(0.05)

        t0 = time.monotonic()
        loaded_after = t0 - t_load
        faulting = asyncio.ensure_future(fault(session))
        while True:
            async with session.get(base + "/health") as resp:
                if resp.status == 503:
                    assert (await resp.json())["status"] == "dead"
                    break
            assert time.monotonic() - t0 < bound, "/health never said 503"
            await asyncio.sleep(0.01)
        unhealthy_after = time.monotonic() - t0

        # New work is refused at once, with a reason and a time to come back.
        for stream in (False, True):
            async with session.post(url, json=body(-1, stream)) as resp:
                assert resp.status == 503, (resp.status, await resp.read())
                assert int(resp.headers["Retry-After"]) > 0
                err = _error(await resp.read())
            assert (err["type"], err["code"]) == ("service_unavailable", "engine_dead"), err

        async with asyncio.timeout(bound):
            stream_bodies = await asyncio.gather(*stream_tasks)
            plain = await asyncio.gather(*plain_tasks)
            await faulting
        answered_after = time.monotonic() - t0

    codes = []
    for raw in stream_bodies:
        assert sse.verdict(raw) == "error", raw[-300:]
        frames = sse.frames(raw)
        assert frames[-1] == b"data: [DONE]", frames[-2:]
        codes.append(json.loads(frames[-2][6:])["error"]["code"])
    for status, raw in plain:
        if status == 200:  # the early 200 of a slow answer: the error is the body (after keepalive newlines)
            _error(raw.strip())
        else:
            assert status >= 500, (status, raw)
            _error(raw)

    code = await asyncio.to_thread(server.proc.wait, bound)
    return Outcome(loaded_after, unhealthy_after, answered_after, time.monotonic() - t0, code, codes, [s for s, _ in plain])
