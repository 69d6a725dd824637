"""One structured JSON access-log line per request: the request context's finish subscriber.

`finished` writes the line from the `RequestContext`. No prompt text, the completion only with
`--enable-log-outputs` (at most `--max-log-len` per choice), never a header value, and `path` without
the query. Lines go to `configure()`'s `BatchWriter`: one list append on the loop, one thread writing
batches (at most every `FLUSH_INTERVAL` s), so a slow sink never blocks the loop. Handlers on the
`streamproxy.access` logger get each line too; `--disable-access-log-for-endpoints` paths get none.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections import deque
from typing import TextIO

import orjson

from streamproxy.http.context import RequestContext, new_request_id
from streamproxy.oscalls import name_this_thread

log = logging.getLogger("streamproxy.access")
log.propagate = False
_errors = logging.getLogger("streamproxy")


def finished(ctx: RequestContext) -> None:
    """The request's line (a finish subscriber)."""
    if enabled() and ctx.path not in QUIET_PATHS:
        write(line(ctx))


def unread(method: str, path: str, remote: str | None, status: int, code: str | None) -> None:
    """The line of a request refused before aiohttp read it (connection.py: a bad request, headers too slow)."""
    if enabled():
        ctx = RequestContext(new_request_id(), 0.0, method, path)
        ctx.remote, ctx.status, ctx.error_code = remote, status, code
        write(line(ctx))


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 3)


# One of --api-server-count workers: which process served the request (server.py sets it).
PID: int | None = None


def line(ctx: RequestContext) -> str:
    fields = {
        "ts": round(time.time(), 3),
        "request_id": ctx.request_id,
        "method": ctx.method,
        "path": ctx.path,
        "status": ctx.status,
        "model": ctx.model,
        "user": ctx.user,
        "stream": ctx.stream,
        "prompt_tokens": ctx.prompt_tokens,
        "completion_tokens": ctx.completion_tokens,
        "cached_tokens": ctx.cached_tokens,
        "finish_reason": ctx.finish_reason,
        "error_code": ctx.error_code,
        "ttfb_ms": _ms(ctx.ttfb),
        "ttft_ms": _ms(ctx.ttft),
        "duration_ms": _ms(ctx.duration),
        "client_disconnected": ctx.disconnected,
        "remote": ctx.remote,
    }
    if PID is not None:
        fields["pid"] = PID
    if ctx.outputs is not None:
        fields["output"] = ctx.outputs[0] if len(ctx.outputs) == 1 else ctx.outputs
    if ctx.deployment is not None:
        # `replicas`: every replica its attempts went to, in order (failover before the first byte, then
        # each migration of its stream); `upstream` is the last.
        fields.update(
            deployment=ctx.deployment, upstream=ctx.upstream, replicas=ctx.replicas or [], migrations=ctx.migrations,
            key_id=ctx.key_id, cached_prompt_tokens=ctx.cached_tokens, usage_source=ctx.usage_source,
        )
    return orjson.dumps(fields).decode()


# The longest a line waits in memory before its batch is written.
FLUSH_INTERVAL = 0.05
# Bytes per write(2): whole lines, at most PIPE_BUF, so the lines of several processes sharing
# one stdout pipe or one O_APPEND file (--api-server-count) never interleave inside a line.
ATOMIC_WRITE = 4096

_writer: BatchWriter | None = None
# Paths that get no line (--disable-access-log-for-endpoints).
QUIET_PATHS: frozenset[str] = frozenset()


def enabled() -> bool:
    """Whether a line written now goes anywhere (build it only then)."""
    return _writer is not None or (bool(log.handlers) and log.isEnabledFor(logging.INFO))


def write(text: str) -> None:
    """One access-log line."""
    if _writer is not None:
        _writer.add(text)
    if log.handlers and log.isEnabledFor(logging.INFO):
        log.info(text)


class StreamSink:
    """stdout or stderr (looked up at each write: they may be swapped), or any text stream."""

    def __init__(self, stream: str | TextIO) -> None:
        self._stream = stream

    def write(self, chunk: str) -> None:
        stream = getattr(sys, self._stream) if isinstance(self._stream, str) else self._stream
        stream.write(chunk)
        stream.flush()  # one write(2) per chunk

    def close(self) -> None:
        pass


class FileSink:
    """A file we open ourselves with O_APPEND (not a logging handler: `logging.config.dictConfig`,
    which importing vLLM runs, closes every handler there is), reopened when logrotate has moved it."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd = -1
        self._id = (0, 0)
        self._open()

    def _open(self) -> None:
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        st = os.fstat(self._fd)
        self._id = (st.st_dev, st.st_ino)

    def reopen_if_moved(self) -> None:
        try:
            st = os.stat(self.path)
            moved = (st.st_dev, st.st_ino) != self._id
        except FileNotFoundError:
            moved = True
        if moved:
            os.close(self._fd)
            self._open()

    def write(self, chunk: str) -> None:
        view = memoryview(chunk.encode())
        while view:
            view = view[os.write(self._fd, view):]

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class BatchWriter:
    """Lines from the event loop, written by one thread in batches to a sink.

    `add` appends; the first line of a batch wakes the thread, which waits
    `FLUSH_INTERVAL` for more, then writes them all, whole lines of at most
    `ATOMIC_WRITE` bytes per write. `stop` writes what is left."""

    def __init__(self, sink: StreamSink | FileSink) -> None:
        self._sink = sink
        self._lines: deque[str] = deque()  # append and popleft are atomic: no lock between the two threads
        self._wake = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="access-log", daemon=True)
        self._thread.start()

    def add(self, text: str) -> None:
        self._lines.append(text)
        if not self._wake.is_set():
            self._wake.set()

    def _run(self) -> None:
        name_this_thread("access-log")
        while not self._stopping:
            self._wake.wait()
            if not self._stopping:
                time.sleep(FLUSH_INTERVAL)
            self._wake.clear()  # before taking the lines: one added from now on wakes the thread again
            self._flush()
        self._flush()

    def _flush(self) -> None:
        pending = self._lines
        lines = [pending.popleft() for _ in range(len(pending))]
        if not lines:
            return
        sink = self._sink
        try:
            if isinstance(sink, FileSink):
                sink.reopen_if_moved()
            for chunk in _whole_lines(lines, ATOMIC_WRITE):
                sink.write(chunk)
        except Exception as exc:  # a full disk or a closed pipe must not end the server
            _errors.warning("access log: %d line(s) lost: %s: %s", len(lines), type(exc).__name__, exc)

    def stop(self) -> None:
        """Write what is left and close the sink (once; again is a no-op)."""
        if self._stopping:
            return
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout=5.0)
        self._sink.close()


def _whole_lines(lines: list[str], limit: int) -> list[str]:
    """The lines, newline-terminated, joined into chunks of at most `limit` UTF-8 bytes (a longer
    line is a chunk of its own)."""
    chunks: list[str] = []
    part: list[str] = []
    size = 0
    for text in lines:
        n = len(text.encode()) + 1
        if part and size + n > limit:
            chunks.append("\n".join(part) + "\n")
            part, size = [], 0
        part.append(text)
        size += n
    if part:
        chunks.append("\n".join(part) + "\n")
    return chunks


def configure(target: str, quiet: str | None = None) -> BatchWriter | None:
    """Send access-log lines to `target` ("stdout", "stderr", a file path, or "off"), none for the
    comma-separated paths `quiet`."""
    global _writer, QUIET_PATHS
    QUIET_PATHS = frozenset(p.strip() for p in (quiet or "").split(",") if p.strip())
    if _writer is not None:
        _writer.stop()
        _writer = None
    if target.lower() in ("off", "none", "false", ""):
        return None
    sink = StreamSink(target) if target in ("stdout", "stderr") else FileSink(target)
    _writer = BatchWriter(sink)
    return _writer
