"""engine_adapter/vllm_itl.py: a step's inter-token latencies in one batch give the histogram
`observe` would have made, value by value."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram

from engine_adapter.vllm_itl import batch_inter_token_latencies, observe_many

# vLLM 0.32's inter_token_latency buckets.
BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0]


def _histogram() -> tuple[CollectorRegistry, Any]:
    registry = CollectorRegistry()
    family = Histogram("vllm:inter_token_latency_seconds", "ITL", buckets=BUCKETS, labelnames=["engine"], registry=registry)
    return registry, family.labels("0")


def _samples(registry: CollectorRegistry) -> dict[tuple[str, str], float]:
    return {(s.name, s.labels.get("le", "")): s.value for m in registry.collect() for s in m.samples if not s.name.endswith("_created")}


def _same(batched: dict[tuple[str, str], float], one_by_one: dict[tuple[str, str], float]) -> None:
    assert batched.keys() == one_by_one.keys()
    for key, value in one_by_one.items():
        if key[0].endswith("_sum"):
            assert (math.isnan(value) and math.isnan(batched[key])) or math.isclose(batched[key], value, rel_tol=1e-9, abs_tol=1e-12), key
        else:
            assert batched[key] == value, key


values = st.one_of(
    st.sampled_from(BUCKETS),  # exactly on a bound: that bucket, as `amount <= bound`
    st.floats(min_value=-1.0, max_value=200.0, allow_nan=False),
    st.just(math.inf),
    st.just(math.nan),
)


# (no health check on generation speed or deadline: four xdist workers share two cores)
@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.lists(st.lists(values, max_size=70), max_size=5))
def test_batches_match_observe_value_by_value(steps: list[list[float]]) -> None:
    batched_registry, batched = _histogram()
    one_registry, one = _histogram()
    for step in steps:
        observe_many(batched, step)
        for value in step:
            one.observe(value)
    _same(_samples(batched_registry), _samples(one_registry))


def test_bucket_boundaries_and_counts() -> None:
    registry, child = _histogram()
    observe_many(child, [0.01, 0.0100001, 0.05, 80.0, 81.0, -0.5])
    samples = _samples(registry)
    le = {key[1]: value for key, value in samples.items() if key[0].endswith("_bucket")}
    assert le["0.01"] == 2  # -0.5 and 0.01 itself
    assert le["0.025"] == 3
    assert le["0.05"] == 4
    assert le["80.0"] == 5
    assert le["+Inf"] == 6
    assert samples[("vllm:inter_token_latency_seconds_count", "")] == 6


class _PrometheusLoggerShape:
    """vLLM's PrometheusStatLogger as far as the wrapper sees it: per-engine children, and a
    `record` that observes each latency (what the wrapper must leave it nothing of) and
    notes what else it was given."""

    def __init__(self) -> None:
        self.registry, child = _histogram()
        self.histogram_inter_token_latency = {0: child}
        self.calls: list[tuple[Any, list[float], Any, int]] = []

    def record(self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None, engine_idx: int = 0) -> None:
        latencies = [] if iteration_stats is None else list(iteration_stats.inter_token_latencies_iter)
        self.calls.append((scheduler_stats, latencies, mm_cache_stats, engine_idx))
        for itl in latencies:
            self.histogram_inter_token_latency[engine_idx].observe(itl)


def test_wrapped_record_counts_each_latency_once_and_gives_the_list_back() -> None:
    prometheus = _PrometheusLoggerShape()
    other = SimpleNamespace(record=lambda *a, **k: None)  # vLLM's logging stat logger: no histogram, not wrapped
    llm = SimpleNamespace(logger_manager=SimpleNamespace(stat_loggers=[other, prometheus]))
    assert batch_inter_token_latencies(llm) == 1

    stats = SimpleNamespace(inter_token_latencies_iter=[0.02, 0.03, 0.2])
    prometheus.record("sched", stats, mm_cache_stats="mm", engine_idx=0)
    prometheus.record(None, None)
    prometheus.record("sched", SimpleNamespace(inter_token_latencies_iter=[]))

    assert stats.inter_token_latencies_iter == [0.02, 0.03, 0.2]  # given back for anything after this logger
    assert [call[1] for call in prometheus.calls] == [[], [], []]  # vLLM's own loop observed nothing again
    assert prometheus.calls[0][0] == "sched" and prometheus.calls[0][2] == "mm"
    samples = _samples(prometheus.registry)
    assert samples[("vllm:inter_token_latency_seconds_count", "")] == 3
    assert math.isclose(samples[("vllm:inter_token_latency_seconds_sum", "")], 0.25)


def test_nothing_wrapped_without_a_histogram_to_batch_into() -> None:
    bare = SimpleNamespace(record=lambda *a, **k: None, histogram_inter_token_latency={0: object()})
    assert batch_inter_token_latencies(SimpleNamespace(logger_manager=SimpleNamespace(stat_loggers=[bare]))) == 0
    assert batch_inter_token_latencies(SimpleNamespace(logger_manager=None)) == 0
