"""metrics.FileHistogram: a FastHistogram's counts in prometheus_client's per-process files
(--api-server-count) read back exactly as a prometheus_client Histogram's with the same
observations, through prometheus_client's public collector."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Histogram, values
from prometheus_client.multiprocess import MultiProcessCollector

from streamproxy.http import metrics

BOUNDS = (0.01, 0.1, 1.0)
SEEN = [0.005, 0.01, 0.05, 0.5, 0.5, 2.0, 7.5]


def test_flushed_counts_read_back_as_a_histogram_with_the_same_observations(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    monkeypatch.setattr(values, "ValueClass", values.MultiProcessValue())
    monkeypatch.setattr(metrics, "MULTIPROCESS", True)
    fast = metrics.FastHistogram("sp_test_fast_seconds", "t", BOUNDS, registry=CollectorRegistry())
    plain = Histogram("sp_test_plain_seconds", "t", buckets=BOUNDS, registry=None)
    for i, amount in enumerate(SEEN):
        fast.observe(amount)
        plain.observe(amount)
        if i in (2, 4):
            fast.flush()  # in steps, as `publish` does once a second
    fast.flush()
    fast.flush()  # nothing new: adds nothing

    registry = CollectorRegistry()
    MultiProcessCollector(registry, str(tmp_path))
    got: dict[str, dict[tuple, float]] = {}
    for family in registry.collect():
        for sample in family.samples:
            kind = sample.name.split("_seconds")[0]
            got.setdefault(kind, {})[(sample.name.rsplit("_seconds", 1)[1], tuple(sorted(sample.labels.items())))] = sample.value
    assert got["sp_test_fast"] == got["sp_test_plain"]
    assert got["sp_test_fast"][("_count", ())] == len(SEEN)
    assert got["sp_test_fast"][("_sum", ())] == pytest.approx(sum(SEEN))
    assert got["sp_test_fast"][("_bucket", (("le", "0.1"),))] == 3
