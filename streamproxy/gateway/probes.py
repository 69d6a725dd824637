"""Active health checks: `GET /health` on every replica, every `health_check_interval`.

One task for the gateway; each round probes all replicas at once, each
bounded by `health_check_timeout`. A 200 is healthy; anything else (a
status, a refused connection, a timeout) is not. Never an inference request:
a probe costs the replica nothing but an HTTP round trip. An https:// replica
is probed with its deployment's `tls` (upstream_tls.py), as requests reach it:
the probe is `wire.Upstreams.get`, on the connections and pool the relayed
requests use; any failure it reports (`UpstreamClosed`) is unhealthy. A healthy
replica of a deployment with flow control is then asked its /metrics (its
requests waiting: `Scheduler.look`).
"""

from __future__ import annotations

import asyncio
import logging
import time

from streamproxy.gateway import metrics as M
from streamproxy.gateway.balance import Pool, Replica
from streamproxy.gateway.exchange import UpstreamClosed
from streamproxy.gateway.state import Current, GatewayState

log = logging.getLogger("streamproxy.gateway")


async def probe_forever(current: Current) -> None:
    """Each round probes the deployments of the state current then (a reload changes them)."""
    while True:
        state = current.state
        pools = list({id(p): p for p in state.pools.values()}.values())
        await probe_once(state, pools)
        await asyncio.sleep(current.state.policy.health_check_interval)


async def probe_once(state: GatewayState, pools: list[Pool]) -> None:
    checks = [_probe(state, pool, replica) for pool in pools for replica in pool.replicas]
    await asyncio.gather(*checks)


async def _probe(state: GatewayState, pool: Pool, replica: Replica) -> None:
    upstreams = state.upstreams
    assert upstreams is not None
    tls = state.tls.get(pool.deployment.name) if replica.url.startswith("https://") else None
    why = ""
    try:
        reply = await upstreams.get(replica.url, "/health", timeout=state.policy.health_check_timeout,
                                    headers=pool.upstream_headers, tls=tls)
        ok = reply.status == 200
    except (UpstreamClosed, OSError, TimeoutError) as exc:
        ok = False
        why = exc.reason if isinstance(exc, UpstreamClosed) and exc.tls else ""
    was = replica.health.probed_healthy, replica.health.breaker
    replica.health.probed(ok, time.monotonic())
    now = replica.health.probed_healthy, replica.health.breaker
    if now != was:
        if why:
            log.warning("deployment %s: upstream %s is down: TLS handshake failed: %s", pool.deployment.name, replica.url, why)
        else:
            log.info("deployment %s: upstream %s is %s", pool.deployment.name, replica.url, "up" if now[0] else "down")
    if ok:
        scheduler = state.schedulers.get(pool.deployment.name)
        if scheduler is not None and scheduler.pool is pool:
            await scheduler.look(upstreams, replica, pool.upstream_headers, tls, state.policy.health_check_timeout)
    M.PROBE_HEALTHY.labels(pool.deployment.name, replica.url).set(1 if now[0] else 0)
    M.BREAKER.labels(pool.deployment.name, replica.url).set(int(now[1]))

