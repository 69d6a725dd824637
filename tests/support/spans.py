"""`recorded_spans(service)`: the process's tracer swapped for one that keeps its spans in memory,
for a test (the `spans` fixtures of tests/http/test_tracing.py and tests/gateway/test_migration.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from streamproxy.http import tracing


@contextlib.contextmanager
def recorded_spans(service: str) -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    tracing.TRACER = tracing.Tracer("", service, exporter=exporter)
    try:
        yield exporter
    finally:
        tracing.TRACER.shutdown()
        tracing.TRACER = None
