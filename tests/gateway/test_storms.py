"""Storms, small enough for `make test` (marker `storm`): the gateway in-process in front of
three `streamproxy serve --engine fake` PROCESSES (a real kill -9 is the point).

(a) One replica killed during 200 concurrent streams: a stream that was running on it goes on
    on another replica (serve replicas continue a stream: `continue_token_ids`) and completes
    with every token, as every other stream (started before or after the kill) does; nothing
    hangs; restarted on its port, the replica is back in rotation within two probe rounds.
(b) 1,000 clients that leave mid-stream: every upstream request is aborted (each replica's
    `streamproxy_engine_requests` gauge is 0 again, its aborts counter up by what it had),
    and the gateway's file descriptors and tasks return to where they were."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator

import aiohttp
import psutil
import pytest

from harness.process import ServerProcess
from harness.server import FAKE_ARGS, launch, start_server
from tests.gateway.gateway_support import SERVED, chat, gateway_lines
from tests.support import sse, wait_until

pytestmark = pytest.mark.storm

# Every token 50 ms apart, the same word: a stream of N tokens lasts N/20 s.
REPLICA_ARGS = [*FAKE_ARGS, "--served-model-name", SERVED, "--fake-text", " word", "--fake-token-delay", "0.05"]
BOUND = 60.0  # nothing here may take longer; a passing run takes a few seconds
LONG = 160  # tokens of the streams a replica's death cuts: 8 s at 50 ms a token


@pytest.fixture(scope="module")
def replica_procs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[ServerProcess]]:
    log_dir = tmp_path_factory.mktemp("storm-replicas")
    procs = [launch(REPLICA_ARGS, log_dir, f"replica-{i}") for i in range(3)]  # started together
    try:
        for proc in procs:
            proc.wait_ready()
        yield procs  # a test that replaces one (a restart) puts the new one in the list
    finally:
        for proc in procs:
            proc.stop()


def client() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=BOUND))


def asking(i: str, **extra) -> dict:
    """A chat stream with a prompt of its own (no prefix affinity: the replicas share the load)."""
    return chat(stream=True, messages=[{"role": "user", "content": f"request {i}"}], **extra)




async def test_kill_9_one_replica_of_three_during_200_streams(replica_procs, gateway, access_log, probe_rounds):
    victim = replica_procs[0]
    gw = await gateway(*(p.base for p in replica_procs), upstream={"health_check_interval": 0.5})
    under_way = 0

    async def stream(session: aiohttp.ClientSession, rid: str, tokens: int) -> bytes:
        nonlocal under_way
        async with session.post(gw.url("/v1/chat/completions"), json=asking(rid, max_tokens=tokens), headers={"X-Request-Id": rid}) as resp:
            assert resp.status == 200, await resp.text()
            first = await resp.content.readuntil(b"\n\n")
            under_way += 1
            return first + await resp.read()

    async with client() as session, asyncio.timeout(BOUND):
        # 150 streams of 8 s (room for a busy machine to start them all before the first ends);
        # once all are under way (some on the victim), kill it; then 50 more.
        before = {f"a{i}": asyncio.ensure_future(stream(session, f"a{i}", LONG)) for i in range(150)}
        assert await wait_until(lambda: under_way == 150 or any(t.done() for t in before.values()), BOUND)
        assert under_way == 150, [t for t in before.values() if t.done()][:1]
        on_victim = gw.pool().replicas[0].outstanding
        assert gw.pool().replicas[0].url == victim.base and on_victim >= 1
        victim.kill()
        after = {f"b{i}": asyncio.ensure_future(stream(session, f"b{i}", 10)) for i in range(50)}
        bodies = {rid: await task for rid, task in {**before, **after}.items()}
    assert await wait_until(lambda: len(gateway_lines(access_log)) == 200, BOUND)
    used = {line["request_id"]: line["replicas"] for line in gateway_lines(access_log)}

    for rid, body in bodies.items():
        assert sse.verdict(body) == "done", (rid, body[-300:])  # no error event: every stream whole
        chunks = [c for c in sse.payloads(body) if c["choices"]]
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
        assert text == " word" * (LONG if rid.startswith("a") else 10), rid  # every token, none twice
    # The streams that moved are exactly those that were running on the victim, each on to a live replica.
    moved = sorted(rid for rid, replicas in used.items() if len(replicas) > 1)
    assert len(moved) == on_victim and all(rid.startswith("a") for rid in moved)
    assert all(used[rid][0] == victim.base and victim.base not in used[rid][1:] for rid in moved)
    assert all(used[rid] != [victim.base] for rid in used)

    # Restarted on its port, it is in rotation again within two probe rounds of being ready.
    routable: list[bool] = []
    probe_rounds.after.append(lambda: routable.append(gw.pool().replicas[0].health.routable(time.monotonic())))
    restarted = await asyncio.to_thread(start_server, REPLICA_ARGS, victim.stdout_path.parent, name="replica-0-again", port=victim.port)
    replica_procs[0] = restarted
    ready_at = len(routable)
    assert await wait_until(lambda: len(routable) >= ready_at + 2, BOUND)
    assert True in routable[: ready_at + 2], (ready_at, routable)
    async with client() as session:
        states = await (await session.get(gw.url("/v1/deployments/dep-7f3a"))).json()
        first = states["replicas"][0]
        assert (first["url"], first["available"], first["healthy"], first["breaker"]) == (restarted.base, True, True, "closed")


def gauge(text: str, name: str) -> float:
    found = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    assert found, name
    return float(found.group(1))


async def replica_metrics(session: aiohttp.ClientSession, procs: list[ServerProcess]) -> list[tuple[float, float]]:
    """(requests in the engine, requests aborted) of each replica."""
    out = []
    for proc in procs:
        async with session.get(proc.url("/metrics")) as resp:
            text = await resp.text()
        out.append((gauge(text, "streamproxy_engine_requests"), gauge(text, "streamproxy_engine_aborts_total")))
    return out


async def test_1000_clients_leave_mid_stream(replica_procs, gateway, probe_rounds):
    gw = await gateway(*(p.base for p in replica_procs), upstream={"health_check_interval": 3600})
    me = psutil.Process()
    # The observer's connections close after each request: they leave nothing behind.
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as observer:
        assert await wait_until(lambda: probe_rounds.done >= 1, BOUND)  # the probes' connections are made
        assert all(running == 0 for running, _ in await replica_metrics(observer, replica_procs))
        aborts_before = sum(aborted for _, aborted in await replica_metrics(observer, replica_procs))
        fds, tasks = me.num_fds(), len(asyncio.all_tasks())

        async def leave(session: aiohttp.ClientSession, i: int) -> None:
            resp = await session.post(gw.url("/v1/chat/completions"), json=asking(str(i), max_tokens=1000))
            assert resp.status == 200
            seen = b""
            while b'"content":" word"' not in seen:  # a token came: the stream is under way
                seen += await resp.content.readany()
            resp.close()

        async with client() as session, asyncio.timeout(BOUND):
            await asyncio.gather(*(leave(session, i) for i in range(1000)))

        async def settled() -> bool:
            return all(running == 0 for running, _ in await replica_metrics(observer, replica_procs))

        deadline = time.monotonic() + BOUND
        while not await settled() and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        after = await replica_metrics(observer, replica_procs)
    assert [running for running, _ in after] == [0, 0, 0]
    assert sum(aborted for _, aborted in after) - aborts_before == 1000  # each upstream request aborted, once
    assert all(r.outstanding == 0 for r in gw.pool().replicas)
    # The gateway is back where it was: no socket or task left behind.
    assert await wait_until(lambda: me.num_fds() <= fds and len(asyncio.all_tasks()) <= tasks, BOUND), (
        me.num_fds(), fds, len(asyncio.all_tasks()), tasks,
    )
