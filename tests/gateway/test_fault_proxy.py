"""harness/fault_proxy.py (bench/failover.py's variants) in front of a replica, through the gateway.

A token replica (tests/support/token_replica.py) behind the fault proxy holds a chat stream after
its second event; the proxy is made faulty (SIGUSR1): the gateway continues the stream on the other
replica while the first still holds it (the break is the fault's, whatever the replica does next),
and the client reads the bytes of the unbroken run, whatever the fault.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal

import pytest

from harness.server import launch
from harness.waiting import wait_until
from tests.gateway.test_migration import BODIES, NO_EJECTION, deployment, read


@pytest.mark.parametrize("fault", ["reset", "stall", "error"])
async def test_a_stream_through_the_faulty_proxy_reads_as_the_unbroken_one(fault, pair, gateway, session, tmp_path):
    (a, b), _ = await pair()
    proxy = launch(["--target", a.base.rsplit(":", 1)[1], "--fault", fault], tmp_path, "proxy", command=None,
                   module="harness.fault_proxy")
    try:
        await asyncio.to_thread(proxy.wait_ready, 30.0, 0.05)  # its /health is the replica's, on this loop
        # the idle bound: past the time to the fault (a loaded machine's), so that the break is the fault's; in
        # stall mode the bound is what ends the stalled stream, so short, but not shorter than that time either
        deployments = deployment([b], stream_idle_timeout=2.0 if fault == "stall" else 60.0)
        deployments[0]["upstreams"] = [proxy.base, b.base]
        gw = await gateway(deployments=deployments, upstream={**NO_EJECTION, "policy": "round_robin"})
        path, body = BODIES["chat-usage"]
        whole = await read(session, gw.url(path), body)
        a.hold_after, a.gate = 2, asyncio.Event()
        reads = [asyncio.ensure_future(read(session, gw.url(path), body)) for _ in range(2)]  # one of them on `a`
        assert await wait_until(lambda: a.held == 1, 10)
        os.kill(proxy.pid, signal.SIGUSR1)
        # (reset: every connection, the idle kept-alive ones too; stall, error: those with a body under way)
        faulted = re.compile(r"faulted [1-9]\d* connections" if fault == "reset" else r"faulted 1 connections")
        assert await wait_until(lambda: faulted.search(proxy.log()) is not None, 30), proxy.log()
        # the break is the fault's, not the held replica's next event: the stream moves while `a` still holds it
        assert await wait_until(lambda: [p for p, _ in b.seen if p == "/v1/completions"], 10)
        a.gate.set()
        assert await asyncio.gather(*reads) == [whole, whole]
        assert len([p for p, _ in b.seen if p == "/v1/completions"]) == 1  # the continuation
    finally:
        proxy.stop()
