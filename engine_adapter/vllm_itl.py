"""vLLM's inter-token-latency histogram, fed once per engine step instead of once per token.

vLLM's `PrometheusStatLogger.record` calls `Histogram.observe` (two locks and a Python walk of the
buckets) per token of every stream in the batch. `batch_inter_token_latencies(llm)` wraps `record` on
each Prometheus stat logger of an `AsyncLLM`: the step's latencies are sorted, bucketed with `bisect` and
added once per bucket touched and once to the sum, then vLLM's `record` runs with the list empty (given back
after). Same bucket counts and count; the sum up to float addition order. Nothing is wrapped when the
logger or histogram lacks an attribute this relies on.
"""

from __future__ import annotations

import logging
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from typing import Any

log = logging.getLogger("streamproxy.engine.vllm")


def observe_many(histogram: Any, values: Sequence[float]) -> None:
    """`histogram.observe(v)` for each value (a prometheus_client Histogram child), one increment per bucket.

    The values sorted once (in C), each bucket's count is the step between two `bisect_right`s: a
    value goes into the first bucket whose bound it does not exceed, as `observe` puts it. With a NaN
    (sorting is undefined then) value by value: a NaN goes into the sum and no bucket, as with observe."""
    if not values:
        return
    total = sum(values)
    if total != total and any(v != v for v in values):
        _observe_each(histogram, values, total)
        return
    histogram._sum.inc(total)
    ordered = sorted(values)
    n = len(ordered)
    buckets = histogram._buckets
    below = 0
    for i, bound in enumerate(histogram._upper_bounds):
        upto = bisect_right(ordered, bound, below)
        if upto != below:
            buckets[i].inc(upto - below)
            if upto == n:
                return
            below = upto


def _observe_each(histogram: Any, values: Sequence[float], total: float) -> None:
    bounds = histogram._upper_bounds
    counts: dict[int, int] = {}
    for value in values:
        if value == value:
            i = bisect_left(bounds, value)
            counts[i] = counts.get(i, 0) + 1
    histogram._sum.inc(total)
    buckets = histogram._buckets
    for i, count in counts.items():
        buckets[i].inc(count)


def _batchable(stat_logger: Any) -> bool:
    children = getattr(stat_logger, "histogram_inter_token_latency", None)
    if not isinstance(children, dict) or not children:
        return False
    return all(hasattr(child, "_upper_bounds") and hasattr(child, "_buckets") and hasattr(child, "_sum") for child in children.values())


def _wrap(stat_logger: Any) -> None:
    record = stat_logger.record
    children = stat_logger.histogram_inter_token_latency

    def record_batched(scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None, engine_idx: int = 0) -> None:
        latencies = None if iteration_stats is None else iteration_stats.inter_token_latencies_iter
        if not latencies:
            record(scheduler_stats, iteration_stats, mm_cache_stats=mm_cache_stats, engine_idx=engine_idx)
            return
        observe_many(children[engine_idx], latencies)
        iteration_stats.inter_token_latencies_iter = []
        try:
            record(scheduler_stats, iteration_stats, mm_cache_stats=mm_cache_stats, engine_idx=engine_idx)
        finally:
            iteration_stats.inter_token_latencies_iter = latencies

    stat_logger.record = record_batched


def batch_inter_token_latencies(llm: Any) -> int:
    """Wrap every Prometheus stat logger of `llm` (an AsyncLLM); returns how many were wrapped."""
    manager = getattr(llm, "logger_manager", None)
    wrapped = 0
    for stat_logger in getattr(manager, "stat_loggers", None) or ():
        if _batchable(stat_logger):
            _wrap(stat_logger)
            wrapped += 1
    if manager is not None and not wrapped:
        log.debug("inter-token latencies: vLLM's stat loggers observe them one by one (no histogram to batch into)")
    return wrapped
