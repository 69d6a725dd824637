"""One structured JSON access-log line per request, and the per-response metrics.

`observe` is the outermost middleware. It gives the request its id and a
`Record`; the layers below fill the record in (the body decoder: model, user,
stream; the generation route: tokens, time to first token, finish reason;
the error middleware: the error code), and when the handler returns, raises
or is cancelled (the client went away), `observe` writes the line and counts
the response, once. Nothing here runs per token.

The line has no prompt or completion text (the completion's only with
`--enable-log-outputs`, vLLM's flag, at most `--max-log-len` characters per
choice) and never a header value, so no API key can reach it; `path` is the path only (no query string). It goes to
`configure()`'s `BatchWriter`: a line costs the event loop one list append,
and one background thread writes the lines to stdout, stderr or a file in
batches (waking once per batch, at most every `FLUSH_INTERVAL` s), so a slow
sink never blocks the loop and a busy server does not hand the GIL to a
logging thread per request. Handlers added to the `streamproxy.access` logger
(an embedding application's, the tests') get each line as a record too.
aiohttp's own access log is off (server.py). Paths named by
`--disable-access-log-for-endpoints` (vLLM's flag) get no line.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from itertools import count
from time import perf_counter
from typing import Any, Protocol, TextIO

import orjson
from aiohttp import web

from streamproxy.http import tracing
from streamproxy.http.metrics import CLIENT_DISCONNECTS, REQUEST_DURATION, RESPONSES, TIME_TO_FIRST_BYTE, TIME_TO_FIRST_TOKEN
from streamproxy.oscalls import name_this_thread

log = logging.getLogger("streamproxy.access")
log.propagate = False
_errors = logging.getLogger("streamproxy")

_REQUEST_ID_OK = re.compile(r"[A-Za-z0-9._:\-]{1,128}")
# Generated request ids: 32 hex digits like a UUID's, a random prefix per process and a counter,
# unique without a getrandom() system call and a UUID object per request.
_ID_PREFIX = os.urandom(8).hex()
_ids = count()


def new_request_id() -> str:
    return f"{_ID_PREFIX}{next(_ids):016x}"

# Status logged for a request whose client left before any response went out (nginx's convention).
CLIENT_CLOSED = 499


class Record:
    """What the access-log line says about one request; filled in along the way."""

    __slots__ = (
        "request_id", "start", "sent_status", "ttfb", "ttft", "model", "user", "stream", "generation",
        "prompt_tokens", "completion_tokens", "cached_tokens", "finish_reason", "error_code", "disconnected",
        "deployment", "upstream", "key_id", "usage_source", "outputs", "span", "max_tokens",
    )

    def __init__(self, request_id: str, start: float) -> None:
        self.request_id = request_id
        self.start = start
        self.sent_status: int | None = None  # the status whose headers went out
        self.ttfb: float | None = None
        self.ttft: float | None = None
        self.model: str | None = None
        self.user: str | None = None
        self.stream: bool | None = None
        self.generation = False
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.cached_tokens: int | None = None
        self.finish_reason: str | list[str | None] | None = None
        self.error_code: str | None = None
        self.disconnected = False
        # The gateway's: where the request went, whose key, and whether the tokens were
        # reported by the replica ("billed") or counted by the gateway ("counted").
        self.deployment: str | None = None
        self.upstream: str | None = None
        self.key_id: str | None = None
        self.usage_source: str | None = None
        # --enable-log-outputs: the generated text per choice (cut to --max-log-len).
        self.outputs: list[str] | None = None
        # --otlp-traces-endpoint: the request's span (tracing.py), and the max_tokens it asked for.
        self.span: Any = None
        self.max_tokens: int | None = None

    def first_token(self, now: float) -> None:
        """`now` is `time.perf_counter()` (uvloop's loop.time() only has milliseconds)."""
        if self.ttft is None:
            self.ttft = now - self.start
            TIME_TO_FIRST_TOKEN.observe(self.ttft)

    def usage(self, prompt: int, completion: int, cached: int, finish_reasons: Sequence[str | None]) -> None:
        self.prompt_tokens = prompt
        self.completion_tokens = completion
        self.cached_tokens = cached
        if finish_reasons:
            first = finish_reasons[0]
            self.finish_reason = first if all(r == first for r in finish_reasons) else list(finish_reasons)


# What each request carries for the whole app (aiohttp's typed request storage).
REQUEST_ID: web.RequestKey[str] = web.RequestKey("request_id", str)
RECORD: web.RequestKey[Record] = web.RequestKey("record", Record)

# An app's own use of each finished request (the gateway's ledger), with the line's facts:
# (request, record, status, error code or "", duration in s). Called once per request, after the metrics.
Finished = Callable[[web.Request, Record, int, str, float], None]
ON_FINISH: web.AppKey[Finished] = web.AppKey("on_finish")


def record(request: web.Request) -> Record:
    return request[RECORD]


def note_body(request: web.Request, body: Any) -> None:
    """The decoded request body: what the log line may say about it (never the prompt)."""
    rec = request.get(RECORD)
    if rec is None:
        return
    model = getattr(body, "model", None)
    user = getattr(body, "user", None)
    rec.model = model if isinstance(model, str) else None
    rec.user = user if isinstance(user, str) else None
    rec.stream = bool(getattr(body, "stream", False))
    if rec.span is not None:
        limit = getattr(body, "max_completion_tokens", None) or getattr(body, "max_tokens", None)
        rec.max_tokens = limit if isinstance(limit, int) else None


def _route(request: web.Request) -> str:
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else "unmatched"


@web.middleware
async def observe(request: web.Request, handler: Any) -> web.StreamResponse:
    rid = request.headers.get("X-Request-Id")
    if not (rid and _REQUEST_ID_OK.fullmatch(rid)):
        rid = new_request_id()
    rec = Record(rid, perf_counter())
    request[REQUEST_ID] = rid
    request[RECORD] = rec
    if tracing.TRACER is not None and request.method == "POST":
        rec.span = tracing.TRACER.start(request)
    response: web.StreamResponse | None = None
    try:
        response = await handler(request)
        return response
    except (asyncio.CancelledError, ConnectionResetError):
        rec.disconnected = True
        raise
    finally:
        _finish(request, rec, response, perf_counter())


async def on_prepare(request: web.Request, response: web.StreamResponse) -> None:
    """Response headers are going out: the time to first byte, and the status really sent."""
    rec = request.get(RECORD)
    if rec is not None and rec.sent_status is None:
        rec.sent_status = response.status
        rec.ttfb = perf_counter() - rec.start
        response.headers["X-Request-Id"] = rec.request_id


def _finish(request: web.Request, rec: Record, response: web.StreamResponse | None, now: float) -> None:
    duration = now - rec.start
    if rec.sent_status is not None:
        status = rec.sent_status
    elif response is not None:
        status = response.status  # a plain Response: aiohttp sends it right after this
    else:
        status = CLIENT_CLOSED if rec.disconnected else 500
    if rec.ttfb is None and response is not None:
        rec.ttfb = duration
    if rec.disconnected:
        CLIENT_DISCONNECTS.inc()
    code = rec.error_code or ("client_disconnected" if rec.disconnected else "")
    _responses(_route(request), status, code).inc()
    if rec.generation:
        REQUEST_DURATION.observe(duration)
        if rec.ttfb is not None:
            TIME_TO_FIRST_BYTE.observe(rec.ttfb)
    hook = request.app.get(ON_FINISH)
    try:
        if hook is not None:  # the books (ledger record, budget hold) first: they must not depend on the log line
            hook(request, rec, status, code, duration)
    finally:
        try:  # best effort, as nginx's: a line that cannot be written never fails the request it describes
            if enabled() and request.path not in QUIET_PATHS:
                write(line(request, rec, status, duration))
            if rec.span is not None and tracing.TRACER is not None:
                tracing.TRACER.end(rec.span, request, rec, status)
        except Exception:
            _errors.exception("access log line or span of request %s not written", rec.request_id)


_RESPONSE_SERIES: dict[tuple[str, int, str], Any] = {}


def _responses(route: str, status: int, code: str) -> Any:
    """The `streamproxy_responses_total` child, looked up once per (route, status, code), not per request."""
    key = (route, status, code)
    child = _RESPONSE_SERIES.get(key)
    if child is None:
        child = _RESPONSE_SERIES[key] = RESPONSES.labels(route, str(status), code)
    return child


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 3)


# One of --api-server-count workers: which process served the request (server.py sets it).
PID: int | None = None


class RequestLine(Protocol):
    """What a line says of the request: a `web.BaseRequest`, or (a request never read) a stand-in."""

    @property
    def method(self) -> str: ...

    @property
    def path(self) -> str: ...

    @property
    def remote(self) -> str | None: ...


def line(request: RequestLine, rec: Record, status: int, duration: float) -> str:
    fields = {
        "ts": round(time.time(), 3),
        "request_id": rec.request_id,
        "method": request.method,
        "path": request.path,
        "status": status,
        "model": rec.model,
        "user": rec.user,
        "stream": rec.stream,
        "prompt_tokens": rec.prompt_tokens,
        "completion_tokens": rec.completion_tokens,
        "cached_tokens": rec.cached_tokens,
        "finish_reason": rec.finish_reason,
        "error_code": rec.error_code,
        "ttfb_ms": _ms(rec.ttfb),
        "ttft_ms": _ms(rec.ttft),
        "duration_ms": _ms(duration),
        "client_disconnected": rec.disconnected,
        "remote": request.remote,
    }
    if PID is not None:
        fields["pid"] = PID
    if rec.outputs is not None:
        fields["output"] = rec.outputs[0] if len(rec.outputs) == 1 else rec.outputs
    if rec.deployment is not None:
        fields.update(
            deployment=rec.deployment, upstream=rec.upstream, key_id=rec.key_id,
            cached_prompt_tokens=rec.cached_tokens, usage_source=rec.usage_source,
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
