"""The ledger's writer (streamproxy/ledger/writer.py) over the fake store: batches by size and by
interval, a store that is down (records kept, written when it returns), the bound on the buffer
(dropped and counted), close writing everything, and the metrics."""

from __future__ import annotations

import asyncio

from prometheus_client import REGISTRY

from harness.waiting import wait_until
from streamproxy.ledger.memory import MemoryStore
from streamproxy.ledger.records import LedgerRecord
from streamproxy.ledger.writer import Ledger


def rec(i: int) -> LedgerRecord:
    return LedgerRecord(ts_us=1_764_547_200_000_000 + i, request_id=f"r{i}", deployment="bot", replica=None, key_id=None,
                        route="/v1/chat/completions", status=200, duration_ms=1.0)


def metric(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


def ids(store: MemoryStore) -> list[str]:
    return [r.request_id for _, r in store.rows]


async def test_a_full_batch_is_written_at_once_and_less_waits_for_the_interval() -> None:
    store = MemoryStore()
    ledger = Ledger(store, interval=3600, batch_size=3)
    ledger.start()
    ledger.add(rec(1))
    ledger.add(rec(2))
    await asyncio.sleep(0.05)  # the writer had its chance: two records are not a batch
    assert store.rows == [] and ledger.buffered == 2
    ledger.add(rec(3))
    assert await wait_until(lambda: len(store.rows) == 3, timeout=5)
    assert store.writes == 1 and ledger.buffered == 0
    await ledger.close()


async def test_records_are_written_within_the_interval() -> None:
    store = MemoryStore()
    ledger = Ledger(store, interval=0.02, batch_size=1000)
    ledger.start()
    for i in range(5):
        ledger.add(rec(i))
    assert await wait_until(lambda: ids(store) == [f"r{i}" for i in range(5)], timeout=5)
    await ledger.close()


async def test_a_store_that_is_down_keeps_the_records_and_gets_them_when_it_returns(caplog) -> None:
    store = MemoryStore()
    store.fail = True
    failures, written = metric("streamproxy_ledger_write_failures_total"), metric("streamproxy_ledger_records_written_total")
    ledger = Ledger(store, interval=0.01, batch_size=4, max_backoff=0.05)
    ledger.start()
    for i in range(10):
        ledger.add(rec(i))
    assert await wait_until(lambda: ledger.failures >= 3, timeout=5)
    assert store.rows == [] and ledger.buffered == 10
    assert metric("streamproxy_ledger_records_buffered") == 10
    assert metric("streamproxy_ledger_write_failures_total") >= failures + 3
    store.fail = False
    assert await wait_until(lambda: len(store.rows) == 10, timeout=5)
    assert ids(store) == [f"r{i}" for i in range(10)]  # in order, each once
    assert metric("streamproxy_ledger_records_written_total") == written + 10
    # One warning when it went down, one when it came back; not one per try.
    warnings = [r.getMessage() for r in caplog.records if r.name == "streamproxy.ledger"]
    assert len(warnings) == 2 and "retrying" in warnings[0] and "back after" in warnings[1]
    await ledger.close()


async def test_past_the_bound_new_records_are_dropped_and_counted() -> None:
    store = MemoryStore()
    store.fail = True
    before = metric("streamproxy_ledger_records_dropped_total")
    ledger = Ledger(store, interval=3600, batch_size=5, max_buffered=10)
    for i in range(15):
        ledger.add(rec(i))
    assert (ledger.buffered, ledger.dropped) == (10, 5)
    assert metric("streamproxy_ledger_records_dropped_total") == before + 5
    store.fail = False
    await ledger.close()
    assert ids(store) == [f"r{i}" for i in range(10)]


async def test_close_writes_everything_in_batches() -> None:
    store = MemoryStore()
    ledger = Ledger(store, interval=3600, batch_size=1000)
    ledger.start()
    for i in range(2500):
        ledger.add(rec(i))
    await ledger.close()
    assert len(store.rows) == 2500 and len(set(ids(store))) == 2500
    assert store.writes == 3


async def test_close_waits_for_a_slow_store_within_its_bound_and_gives_up_after(caplog) -> None:
    store = MemoryStore()
    store.stall = asyncio.Event()
    ledger = Ledger(store, interval=3600, batch_size=10)
    ledger.add(rec(1))
    closing = asyncio.ensure_future(ledger.close())
    await asyncio.sleep(0.02)
    assert not closing.done()
    store.stall.set()
    await asyncio.wait_for(closing, 5)
    assert ids(store) == ["r1"]

    down = MemoryStore()
    down.fail = True
    ledger = Ledger(down, interval=3600, close_timeout=0.2)
    ledger.add(rec(2))
    await asyncio.wait_for(ledger.close(), 5)
    assert any("1 record(s) not written" in r.getMessage() for r in caplog.records)


async def test_a_store_that_is_down_is_tried_at_the_backoff_not_at_every_full_batch() -> None:
    store = MemoryStore()
    store.fail = True
    ledger = Ledger(store, interval=0.01, batch_size=2, max_backoff=0.5)
    ledger.start()
    loop = asyncio.get_running_loop()
    end = loop.time() + 0.4
    n = 0
    while loop.time() < end:  # a full batch every few adds, for 0.4 s
        ledger.add(rec(n))
        n += 1
        await asyncio.sleep(0.001)
    # Backoff 0.01, 0.02, 0.04, ... 0.32: at most 6 tries in 0.4 s (a try per full batch would be hundreds).
    assert 1 <= ledger.failures <= 7, ledger.failures
    store.fail = False
    await ledger.close()
    assert len(store.rows) == n and ledger.dropped == 0


async def test_flush_while_the_task_writes_writes_each_record_once() -> None:
    store = MemoryStore()
    store.stall = asyncio.Event()
    ledger = Ledger(store, interval=0.001, batch_size=5)
    ledger.start()
    for i in range(5):
        ledger.add(rec(i))
    assert await wait_until(lambda: store.stall is not None and ledger._writing.locked(), timeout=5)  # the task is writing
    flushing = asyncio.ensure_future(ledger.flush())
    await asyncio.sleep(0.01)
    store.stall.set()
    assert await asyncio.wait_for(flushing, 5)
    await ledger.close()
    assert ids(store) == [f"r{i}" for i in range(5)]
