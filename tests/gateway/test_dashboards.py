"""configs/grafana/gateway.json queries only series `streamproxy gateway` exposes.

The gateway over one fake-engine replica, in-process: the families its
/metrics lists (the edge's, the gateway's, the ledger's), less the engine
adapter's, which share this process's registry but a gateway never imports.
The dashboards' shape and the PromQL checker are tests/production/test_dashboards.py.
"""

from __future__ import annotations

import aiohttp

import engine_adapter.vllm_direct
from tests.gateway.conftest import StartGateway, StartReplica
from tests.gateway.gateway_support import DEPLOYMENT, chat, post
from tests.production.test_dashboards import families_of
from tests.support import dashboards as D


async def test_gateway_dashboard_queries_what_the_gateway_exposes(
    replica: StartReplica, gateway: StartGateway, session: aiohttp.ClientSession
) -> None:
    r = await replica()
    gw = await gateway(r)
    status, _, _ = await post(session, gw.url("/v1/chat/completions"), chat(stream=True))
    assert status == 200
    async with session.get(gw.url("/metrics")) as resp:
        assert resp.status == 200
        text = await resp.text()
    series = D.exposed(text)
    for sample in families_of(engine_adapter.vllm_direct):
        series.pop(sample, None)
    assert f'streamproxy_gateway_requests_total{{deployment="{DEPLOYMENT}",status="200",upstream="{r.base}"}} 1.0' in text
    board = D.load("gateway.json")
    assert D.problems(board, series) == []
    queried = {name for _, expr in D.queries(board) for name, _ in D.parse(expr).series}
    assert not any(n.startswith("vllm:") for n in queried)
    for family in ("requests_total", "in_flight", "breaker_state", "upstream_healthy", "upstream_ttft_seconds_bucket",
                   "added_latency_seconds_bucket", "tokens_total", "deployment_state", "waiting_requests"):
        assert "streamproxy_gateway_" + family in queried
    assert {"streamproxy_ledger_records_buffered", "streamproxy_ledger_records_dropped_total"} <= queried
