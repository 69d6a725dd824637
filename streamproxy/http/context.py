"""One request's context: made once at the edge, told what happens, finished once.

`edge`, the outermost middleware of serve and the gateway, gives each request an id and a
`RequestContext` (`request[CONTEXT]`); the layers below tell it what they learn through narrow methods
(`body`, `key`, `routed`, `tried`, `first_token`, `fail`, `gone`, `usage`), and `on_prepare` notes the
status sent and the time to first byte. When the handler returns, raises or is cancelled, `edge`
finishes the context and calls the app's finish subscribers (`on_finish(app, fn)`) in order: metrics,
access log, span (`EDGE_SUBSCRIBERS`), then the gateway's budget release and the ledger. Each runs once;
one that raises is logged and stops nothing else. Nothing here runs per token.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
from collections.abc import Callable, Sequence
from itertools import count
from time import perf_counter
from typing import Any, Protocol

from aiohttp import web

from streamproxy.http import tracing
from streamproxy.http.metrics import TIME_TO_FIRST_TOKEN

log = logging.getLogger("streamproxy")

_REQUEST_ID_OK = re.compile(r"[A-Za-z0-9._:\-]{1,128}")
# Generated request ids: 32 hex digits like a UUID's, a random prefix per process and a counter,
# unique without a getrandom() system call and a UUID object per request.
_ID_PREFIX = os.urandom(8).hex()
_ids = count()

# Status of a request whose client left before any response went out (nginx's convention).
CLIENT_CLOSED = 499


def new_request_id() -> str:
    return f"{_ID_PREFIX}{next(_ids):016x}"


class Releasable(Protocol):
    """What a request holds until it ends (the gateway's budget hold, holds.py)."""

    def release(self) -> None: ...


class RequestContext:
    """Everything one request is and became: who, what, where, how much, how it ended."""

    __slots__ = (
        "request_id", "start", "method", "path", "route", "remote",
        "generation", "stream", "model", "user", "max_tokens", "key_id", "deployment", "replicas", "migrations", "hold",
        "prompt_tokens", "completion_tokens", "cached_tokens", "usage_source", "finish_reason", "outputs",
        "sent_status", "status", "error_code", "disconnected", "ttfb", "ttft", "duration", "span",
    )

    def __init__(self, request_id: str, start: float, method: str = "-", path: str = "-", route: str = "unmatched") -> None:
        self.request_id = request_id
        self.start = start  # perf_counter(): uvloop's loop.time() only has milliseconds
        self.method = method
        self.path = path  # the path only, never the query string
        self.route = route  # the matched route's canonical path, the metrics' label
        self.remote: str | None = None
        self.generation = False  # a generating route: the duration and TTFB histograms count it
        self.stream: bool | None = None
        self.model: str | None = None
        self.user: str | None = None
        self.max_tokens: int | None = None  # (traced requests only: the span's attribute)
        self.key_id: str | None = None  # the key's id, never the key
        # The gateway's: the deployment, each replica an attempt went to (the last answered), and the
        # request's hold on its key's budget.
        self.deployment: str | None = None
        self.replicas: list[str] | None = None
        self.migrations = 0  # the gateway's: times its stream moved on to another replica (stream migration)
        self.hold: Releasable | None = None
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.cached_tokens: int | None = None
        self.usage_source: str | None = None  # the gateway's: "billed" (the replica's usage) or "counted"
        self.finish_reason: str | list[str | None] | None = None
        self.outputs: list[str] | None = None  # --enable-log-outputs: each choice's text, cut to --max-log-len
        self.sent_status: int | None = None  # the status whose headers went out
        self.status = 0  # the status logged (set when the request ends)
        self.error_code: str | None = None
        self.disconnected = False
        self.ttfb: float | None = None
        self.ttft: float | None = None
        self.duration = 0.0
        self.span: Any = None  # --otlp-traces-endpoint: the request's span (tracing.py)

    # -- what the layers below tell it -------------------------------------------------
    def body(self, body: Any) -> None:
        """The decoded request body: what the context may say about it (never the prompt)."""
        model = getattr(body, "model", None)
        user = getattr(body, "user", None)
        self.model = model if isinstance(model, str) else None
        self.user = user if isinstance(user, str) else None
        self.stream = bool(getattr(body, "stream", False))
        if self.span is not None:
            limit = getattr(body, "max_completion_tokens", None) or getattr(body, "max_tokens", None)
            self.max_tokens = limit if isinstance(limit, int) else None

    def generating(self, stream: bool) -> None:
        self.generation = True
        self.stream = stream

    def key(self, key_id: str) -> None:
        self.key_id = key_id

    def routed(self, deployment: str) -> None:
        self.deployment = self.model = deployment

    def tried(self, replica: str) -> None:
        """An attempt went to `replica` (so a request abandoned while one holds it names it)."""
        if self.replicas is None:
            self.replicas = [replica]
        else:
            self.replicas.append(replica)

    def migrated(self) -> None:
        """The stream went on on another replica (the last `tried`)."""
        self.migrations += 1

    @property
    def upstream(self) -> str | None:
        """The replica of the last attempt."""
        return self.replicas[-1] if self.replicas else None

    def first_token(self, now: float) -> None:
        """`now` is `time.perf_counter()`."""
        if self.ttft is None:
            self.ttft = now - self.start
            TIME_TO_FIRST_TOKEN.observe(self.ttft)

    def usage(self, prompt: int | None, completion: int, cached: int | None, finish_reasons: Sequence[str | None] = (),
              source: str | None = None) -> None:
        """`source`, the gateway's: the replica's usage ("billed"), or a cut stream's events ("counted")."""
        self.prompt_tokens, self.completion_tokens, self.cached_tokens = prompt, completion, cached
        self.usage_source = source
        if finish_reasons:
            first = finish_reasons[0]
            self.finish_reason = first if all(r == first for r in finish_reasons) else list(finish_reasons)

    def fail(self, code: str | None) -> None:
        self.error_code = code

    def gone(self) -> None:
        self.disconnected = True

    @property
    def code(self) -> str:
        """The outcome's code: the error's, `client_disconnected`, or ""."""
        return self.error_code or ("client_disconnected" if self.disconnected else "")

    # -- the end -----------------------------------------------------------------------
    def finish(self, response: web.StreamResponse | None, now: float, subscribers: Sequence[Subscriber]) -> None:
        self.duration = now - self.start
        if self.sent_status is not None:
            self.status = self.sent_status
        elif response is not None:
            self.status = response.status  # a plain Response: aiohttp sends it right after this
        else:
            self.status = CLIENT_CLOSED if self.disconnected else 500
        if self.ttfb is None and response is not None:
            self.ttfb = self.duration
        for subscriber in subscribers:
            try:  # best effort, as nginx's log: a subscriber never fails the request it describes, nor the others
                subscriber(self)
            except Exception:
                log.exception("request %s: finish subscriber %s failed", self.request_id, getattr(subscriber, "__qualname__", subscriber))


Subscriber = Callable[[RequestContext], None]
CONTEXT: web.RequestKey[RequestContext] = web.RequestKey("context", RequestContext)
SUBSCRIBERS: web.AppKey[list[Subscriber]] = web.AppKey("finish_subscribers", list)


def on_finish(app: web.Application, subscriber: Subscriber) -> None:
    """Call `subscriber` with each request's context once it ended (in the order registered)."""
    subscribers = app.get(SUBSCRIBERS)
    if subscribers is None:
        subscribers = app[SUBSCRIBERS] = []
    subscribers.append(subscriber)


def _route(request: web.Request) -> str:
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else "unmatched"


@web.middleware
async def edge(request: web.Request, handler: Any) -> web.StreamResponse:
    rid = request.headers.get("X-Request-Id")
    if not (rid and _REQUEST_ID_OK.fullmatch(rid)):
        rid = new_request_id()
    ctx = request[CONTEXT] = RequestContext(rid, perf_counter(), request.method, request.path, _route(request))
    if tracing.TRACER is not None and request.method == "POST":
        ctx.span = tracing.TRACER.start(request)
    response: web.StreamResponse | None = None
    try:
        response = await handler(request)
        return response
    except (asyncio.CancelledError, ConnectionResetError):
        ctx.disconnected = True
        raise
    finally:
        subscribers = request.app.get(SUBSCRIBERS)
        ctx.remote = request.remote
        ctx.finish(response, perf_counter(), subscribers or ())


async def on_prepare(request: web.Request, response: web.StreamResponse) -> None:
    """Response headers are going out: the time to first byte, and the status really sent."""
    ctx = request.get(CONTEXT)
    if ctx is not None and ctx.sent_status is None:
        ctx.sent_status = response.status
        ctx.ttfb = perf_counter() - ctx.start
        response.headers["X-Request-Id"] = ctx.request_id
