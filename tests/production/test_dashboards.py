"""configs/grafana/: the dashboards' shape, the PromQL checker itself, and serve's dashboard against /metrics.

Every series `serve.json` queries is one that `streamproxy serve` exposes:
ours from /metrics of serve on the fake engine (minus the gateway's and the
ledger's families, which share this process's registry but a `serve`
process never has), vLLM's `vllm:*` from the installed vLLM's
`PrometheusStatLogger` source, and `streamproxy_direct_requests` from the
vLLM adapter's module (it registers on import, without vLLM). The gateway's
dashboard is checked the same way in tests/gateway/test_dashboards.py.
"""

from __future__ import annotations

from types import ModuleType

import aiohttp
import pytest
from prometheus_client.metrics import MetricWrapperBase

import engine_adapter.vllm_direct
import streamproxy.gateway.metrics
import streamproxy.ledger.writer
from tests.production.conftest import StartServer
from tests.support import dashboards as D
from tests.support.fake import USER_HI

NAMES = ("serve.json", "gateway.json")


def families_of(module: ModuleType) -> D.Series:
    """The sample names of the metrics a module defines at import."""
    out: D.Series = {}
    for value in vars(module).values():
        if isinstance(value, MetricWrapperBase):
            out.update(D.samples(value._name, str(value._type), frozenset(value._labelnames)))
    return out


@pytest.mark.parametrize("name", NAMES)
def test_dashboard_shape(name: str) -> None:
    board = D.load(name)
    assert board["schemaVersion"] >= 39  # Grafana 11 and later
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    panels = D.panels(board)
    assert len({p["id"] for p in panels}) == len(panels)
    for panel in panels:
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
    for var in variables.values():
        if var["type"] == "query":
            assert var["datasource"]["uid"] == "${datasource}"


def test_uids_differ() -> None:
    assert len({D.load(name)["uid"] for name in NAMES}) == len(NAMES)


def test_parse_names_series_labels_and_functions() -> None:
    parsed = D.parse(
        'histogram_quantile(0.99, sum by (deployment, le) (rate(a_bucket{x=~"$v", y!="2.."}[$__rate_interval])))'
        ' / on(instance) group_left sum without (z) (b_total offset 5m) > bool 0.5e3 or vector(1)'
    )
    assert parsed.series == [("a_bucket", frozenset({"x", "y"})), ("b_total", frozenset())]
    assert parsed.functions == ["histogram_quantile", "sum", "rate", "sum", "vector"]
    assert parsed.grouping == {"deployment", "le", "instance", "z"}
    assert D.parse('vllm:kv_cache_usage_perc{model_name="m", s="}{,"}').series == [
        ("vllm:kv_cache_usage_perc", frozenset({"model_name", "s"}))
    ]


def test_problems_are_found() -> None:
    """The check is not vacuous: a misspelt series, a label it lacks, an unknown function, a grouping by nothing."""
    series = D.samples("m", "histogram", frozenset({"a"})) | D.samples("c", "counter", frozenset())
    board = {
        "panels": [{"type": "row", "title": "r", "panels": [{"title": "p", "targets": [
            {"refId": "A", "expr": 'sum by (le) (rate(m_bucket{a="1"}[5m]))'},
            {"refId": "B", "expr": "rate(c[5m])"},
            {"refId": "C", "expr": 'm_count{b="1"}'},
            {"refId": "D", "expr": "ratee(c_total[5m])"},
            {"refId": "E", "expr": "sum by (a) (c_total)"},
        ]}]}],
        "templating": {"list": [{"name": "v", "type": "query", "query": {"query": "label_values(m_sum, nope)"}}]},
    }
    assert D.problems(board, series) == [
        "panel 'p' B: 'c' is not exposed",
        "panel 'p' C: m_count has no label ['b']",
        "panel 'p' D: unknown function 'ratee'",
        "panel 'p' E: groups by ['a'], which no series it reads has",
        "variable v: groups by ['nope'], which no series it reads has",
    ]


def test_vllm_families_from_source() -> None:
    """Only families `__init__` always makes count; labels as vLLM passes them."""
    source = '''
class PrometheusStatLogger:
    _gauge_cls = Gauge
    def __init__(self, vllm_config):
        labelnames = ["model_name", "engine"]
        g = self._gauge_cls(name="vllm:g", documentation="", labelnames=labelnames)
        c = self._counter_cls(name="vllm:c", documentation="", labelnames=labelnames + ["reason"])
        h = self._histogram_cls(name="vllm:h", documentation="", labelnames=["model_name"])
        if envs.SOMETHING:
            self._counter_cls(name="vllm:maybe", documentation="", labelnames=labelnames)
'''
    assert D.vllm_families(source) == {
        "vllm:g": frozenset({"model_name", "engine"}),
        "vllm:c_total": frozenset({"model_name", "engine", "reason"}),
        "vllm:c_created": frozenset({"model_name", "engine", "reason"}),
        "vllm:h_bucket": frozenset({"model_name", "le"}),
        "vllm:h_sum": frozenset({"model_name"}),
        "vllm:h_count": frozenset({"model_name"}),
        "vllm:h_created": frozenset({"model_name"}),
    }


def test_installed_vllm_families() -> None:
    families = D.vllm_families()
    assert families["vllm:num_requests_running"] == {"model_name", "engine"}
    assert families["vllm:request_success_total"] == {"model_name", "engine", "finished_reason"}
    assert families["vllm:time_to_first_token_seconds_bucket"] == {"model_name", "engine", "le"}
    assert "vllm:corrupted_requests_total" not in families  # only with VLLM_COMPUTE_NANS_IN_LOGITS


async def test_serve_dashboard_queries_what_serve_exposes(server: StartServer, session: aiohttp.ClientSession) -> None:
    srv = await server()
    async with session.post(srv.url("/v1/chat/completions"), json={"model": "fake", "messages": USER_HI, "stream": True}) as resp:
        assert resp.status == 200
        await resp.read()
    async with session.get(srv.url("/metrics")) as resp:
        assert resp.status == 200
        text = await resp.text()
    ours = D.exposed(text)
    for module in (streamproxy.gateway.metrics, streamproxy.ledger.writer):  # not a serve process's
        for sample in families_of(module):
            ours.pop(sample, None)
    series = ours | D.vllm_families() | families_of(engine_adapter.vllm_direct)
    board = D.load("serve.json")
    assert D.problems(board, series) == []
    queried = {name for _, expr in D.queries(board) for name, _ in D.parse(expr).series}
    assert any(n.startswith("vllm:") for n in queried) and any(n.startswith("streamproxy_") for n in queried)
    assert not any(n.startswith(("streamproxy_gateway_", "streamproxy_ledger_")) for n in queried)
