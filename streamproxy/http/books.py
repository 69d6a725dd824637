"""`serve`'s use of the request ledger (`--ledger URL`): a record per request on a generation route.

Off unless `--ledger` names a store; opened and migrated (`ledger.writer.open_ledger`) before the server
listens. `recorder`, a finish subscriber as in the gateway, queues one `LedgerRecord` per generation
request from its context (`Ledger.add`; the writer task batches), except one refused for its key.
`deployment` is the served (or adapter) name, `replica` this server's address, `key_id`
`auth.key_id(secret)` (never the key), `usage_source` "billed". Closed in `on_cleanup`, after the drain;
with `--api-server-count` each worker writes its own records.
"""

from __future__ import annotations

import time

from aiohttp import web

from streamproxy.config import Settings
from streamproxy.http.context import RequestContext, Subscriber, on_finish
from streamproxy.http.state import AppState
from streamproxy.ledger.records import LedgerRecord
from streamproxy.ledger.writer import Ledger

# The generation routes (with usage in the access log) and the route each record names.
GENERATION_ROUTES = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages", "/v1/embeddings"})


def address(settings: Settings) -> str:
    return settings.uds if settings.uds else f"{settings.host}:{settings.port}"


def ledger_record(ctx: RequestContext, *, deployment: str | None, replica: str | None, route: str,
                  usage_source: str | None, replicas: list[str] | None = None, migrations: int | None = None) -> LedgerRecord:
    """The ledger's record of a request that ended, from its context (serve's and the gateway's; the
    gateway's names every replica its attempts went to and how often its stream moved on)."""
    return LedgerRecord(
        ts_us=int((time.time() - ctx.duration) * 1_000_000),
        request_id=ctx.request_id,
        deployment=deployment,
        replica=replica,
        key_id=ctx.key_id,
        route=route,
        status=ctx.status,
        error_code=ctx.code or None,
        prompt_tokens=ctx.prompt_tokens,
        cached_prompt_tokens=ctx.cached_tokens,
        completion_tokens=ctx.completion_tokens,
        usage_source=usage_source,
        ttft_ms=None if ctx.ttft is None else round(ctx.ttft * 1000.0, 3),
        duration_ms=round(ctx.duration * 1000.0, 3),
        replicas=replicas,
        migrations=migrations,
    )


def recorder(state: AppState, ledger: Ledger) -> Subscriber:
    settings = state.settings
    root = settings.root_path or ""
    replica = address(settings)
    keyed = bool(settings.api_key)

    def record(ctx: RequestContext) -> None:
        path = ctx.route
        if root and path.startswith(root + "/"):
            path = path[len(root):]
        if path not in GENERATION_ROUTES or (keyed and ctx.key_id is None):
            return
        model = ctx.model
        served = state.engine.info.served_names
        if model is None or not (model in served or model in state.adapters):
            model = served[0] if served else model
        usage_source = "billed" if ctx.prompt_tokens is not None or ctx.completion_tokens is not None else None
        ledger.add(ledger_record(ctx, deployment=model, replica=replica, route=path, usage_source=usage_source))

    return record


def install(app: web.Application, state: AppState, ledger: Ledger) -> None:
    """The ledger's subscriber, its writer task's start, and its close after the drain."""
    on_finish(app, recorder(state, ledger))

    async def start(app: web.Application) -> None:
        ledger.start()

    async def close(app: web.Application) -> None:  # last, after the drain: every record is queued; write them all
        await ledger.close()

    app.on_startup.append(start)
    app.on_cleanup.append(close)
