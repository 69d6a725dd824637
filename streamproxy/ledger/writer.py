"""`Ledger`: records queued by the event loop, written to the store in batches by one task.

`add` is the request path's whole cost: one deque append. The writer task wakes every `interval` s or
at `batch_size` records and writes a batch; it leaves the buffer only once the store has it, so an
outage keeps records buffered (retries with backoff up to `MAX_BACKOFF`, a warning at its start and
end) and a batch whose commit answer was lost is written again (`record_id` is stored once). Past
`max_buffered` new records are dropped and counted. `close` writes what is left, until `close_timeout`.
A `kill -9` loses at most the last `interval` plus the batch in flight.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from itertools import islice

from prometheus_client import Counter, Gauge

from streamproxy.ledger.records import LedgerRecord
from streamproxy.ledger.store import LedgerStore, kind, open_store, redact

log = logging.getLogger("streamproxy.ledger")

BUFFERED = Gauge("streamproxy_ledger_records_buffered", "Ledger records waiting to be written")
DROPPED = Counter("streamproxy_ledger_records_dropped", "Ledger records dropped: the buffer was full (the store down or slow)")
WRITTEN = Counter("streamproxy_ledger_records_written", "Ledger records written to the store")
FAILURES = Counter("streamproxy_ledger_write_failures", "Batches the store refused or did not take in time (retried)")

INTERVAL = 0.5  # s between writes: the kill -9 loss bound
BATCH_SIZE = 1000  # records per write; a full batch is written at once
MAX_BUFFERED = 200_000  # records held while the store is away (a few hundred bytes each)
MAX_BACKOFF = 5.0  # s between tries while the store is down
CLOSE_TIMEOUT = 10.0  # s that close() keeps trying to write what is left


class Ledger:
    def __init__(self, store: LedgerStore, *, interval: float = INTERVAL, batch_size: int = BATCH_SIZE,
                 max_buffered: int = MAX_BUFFERED, close_timeout: float = CLOSE_TIMEOUT, max_backoff: float = MAX_BACKOFF,
                 on_written: Callable[[list[LedgerRecord]], None] | None = None) -> None:
        self.store = store
        self.interval = interval
        self.batch_size = batch_size
        self.max_buffered = max_buffered
        self.close_timeout = close_timeout
        self.max_backoff = max_backoff
        self.on_written = on_written  # each batch once the store has it (the keyring's budgets)
        self._buffer: deque[LedgerRecord] = deque()
        self._full = asyncio.Event()
        self._stop = asyncio.Event()
        self._writing = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self.written = 0
        self.dropped = 0
        self.failures = 0
        self._down_since: float | None = None
        BUFFERED.set_function(lambda: len(self._buffer))

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    def add(self, record: LedgerRecord) -> bool:
        """Queue one record (the event loop's thread; O(1), never waits); False: dropped (the buffer is full)."""
        buffer = self._buffer
        if len(buffer) >= self.max_buffered:
            self.dropped += 1
            DROPPED.inc()
            return False
        buffer.append(record)
        if len(buffer) >= self.batch_size and not self._full.is_set():
            self._full.set()
        return True

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="ledger-writer")

    async def _run(self) -> None:
        delay: float | None = None  # while the store refuses: the backoff (a full buffer does not hurry it)
        while not self._closing:
            event = self._full if delay is None else self._stop
            try:
                await asyncio.wait_for(event.wait(), self.interval if delay is None else delay)
            except TimeoutError:
                pass
            self._full.clear()
            if self._closing:
                return
            if await self._write_all():
                delay = None
            else:
                delay = min(max((delay or self.interval) * 2, self.interval), self.max_backoff)

    async def _write_all(self) -> bool:
        """Write what is buffered now, a batch at a time; False at the first failure (the rest waits).
        One writer at a time: the task, `flush` and `close` never write the same batch twice."""
        async with self._writing:
            while self._buffer:
                if not await self._write_batch():
                    return False
            return True

    async def _write_batch(self) -> bool:
        buffer = self._buffer
        batch = list(islice(buffer, self.batch_size))
        try:
            await self.store.write(batch)
        except Exception as exc:
            self.failures += 1
            FAILURES.inc()
            if self._down_since is None:
                self._down_since = time.monotonic()
                log.warning("ledger: the store did not take %d record(s), keeping them and retrying: %s: %s",
                            len(batch), type(exc).__name__, exc)
            return False
        for _ in range(len(batch)):  # only add() appends meanwhile, at the other end
            buffer.popleft()
        self.written += len(batch)
        WRITTEN.inc(len(batch))
        if self.on_written is not None:
            self.on_written(batch)
        if self._down_since is not None:
            log.warning("ledger: the store is back after %.1f s; %d record(s) still buffered",
                        time.monotonic() - self._down_since, len(buffer))
            self._down_since = None
        return True

    async def flush(self) -> bool:
        """Write everything buffered now (tests, and close); False if the store refused."""
        return await self._write_all()

    async def close(self) -> None:
        """Stop the task and write what is left, trying until `close_timeout`; then close the store."""
        self._closing = True
        self._full.set()
        self._stop.set()
        if self._task is not None:
            task, self._task = self._task, None
            try:
                await task  # a write in progress finishes (or fails) first
            except Exception:
                pass
        deadline = time.monotonic() + self.close_timeout
        pause = 0.05
        while self._buffer and not await self._write_all() and time.monotonic() + pause < deadline:
            await asyncio.sleep(pause)
            pause = min(pause * 2, 1.0)
        if self._buffer:
            log.error("ledger: %d record(s) not written: the store did not take them within %.0f s",
                      len(self._buffer), self.close_timeout)
        await self.store.close()


class LedgerStartError(SystemExit):
    """A ledger that cannot be opened at start: one line on stderr naming the setting."""


async def open_ledger(url: str | None, setting: str, *, interval: float = INTERVAL, batch_size: int = BATCH_SIZE,
                      max_buffered: int = MAX_BUFFERED) -> Ledger | None:
    """The ledger at `url`, its store reached and migrated; None for none or `off`. A store that
    cannot be opened is a `LedgerStartError` naming `setting` (serve's --ledger, the gateway's field)."""
    try:
        if url is None or kind(url) == "off":
            log.info("ledger: off")
            return None
        store = await open_store(url)
    except Exception as exc:
        reason = "; ".join(" ".join(part.split()) for part in str(exc).splitlines() if part.strip())  # one line
        raise LedgerStartError(f"{setting}: cannot open {redact(url) if url else url}: {type(exc).__name__}: {reason}") from None
    log.info("ledger: %s (a batch every %g s or %d records)", redact(url), interval, batch_size)
    return Ledger(store, interval=interval, batch_size=batch_size, max_buffered=max_buffered)
