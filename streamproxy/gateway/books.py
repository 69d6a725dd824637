"""The gateway's use of the ledger: a record per relayed request, and the admin routes that query it.

`recorder(state)`, a finish subscriber, queues one `LedgerRecord` per relayed request from its context
(`Ledger.add`: `replica` the last replica tried, `replicas` all of them in order, `migrations` its
stream's moves) and counts its tokens against its key's budget (`Keyring.queued`) in the same loop
step as its hold is released. A request refused for its key is not recorded (a flood of bad keys must not
fill the books), nor are other routes. `GET /v1/deployments/{deployment}/requests` and `GET /v1/usage`
take the admin key (parameters: `ledger.params`); without a ledger: 404 `ledger_off`.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Awaitable
from typing import TypeVar

import msgspec
from aiohttp import web

from streamproxy.errors import NotFound, ServiceUnavailable
from streamproxy.gateway.routes import ROUTES, relayed_paths
from streamproxy.gateway.state import Current, GatewayState, gateway_state
from streamproxy.http.books import ledger_record
from streamproxy.http.context import RequestContext, Subscriber
from streamproxy.ledger import params
from streamproxy.ledger.deployments import DeploymentExists
from streamproxy.ledger.keys import KeyExists
from streamproxy.ledger.records import UsageReport
from streamproxy.ledger.writer import Ledger

log = logging.getLogger("streamproxy.ledger")
T = TypeVar("T")

# A relayed route's canonical path (any of its three) -> the API path the record names.
_LEDGERED: dict[str, str] = {path: route.upstream_path for name, route in ROUTES.items() for path in relayed_paths(name)}


def recorder(current: Current, ledger: Ledger) -> Subscriber:
    def record(ctx: RequestContext) -> None:
        state = current.state
        route = _LEDGERED.get(ctx.route)
        if route is None or (ctx.key_id is None and (state.keys or state.keyring)):
            return
        entry = ledger_record(ctx, deployment=ctx.deployment, replica=ctx.upstream, route=route, usage_source=ctx.usage_source,
                              replicas=list(ctx.replicas or ()), migrations=ctx.migrations)
        if state.keyring and ctx.key_id is not None:  # its key's budget counts it from now, kept or not
            if ledger.add(entry):
                state.keyring.queued(entry)
            else:
                state.keyring.dropped(entry)
        else:
            ledger.add(entry)

    return record


_encode = msgspec.json.Encoder().encode


def _ledger(request: web.Request) -> tuple[GatewayState, Ledger]:
    state = gateway_state(request)
    state.authorize_admin(request)
    if state.ledger is None:
        raise NotFound("the gateway's ledger is off (`ledger: off` in its config)", code="ledger_off")
    return state, state.ledger


async def read_store(work: Awaitable[T]) -> T:
    """A query's answer; the store down is a 503, not a 500."""
    try:
        return await work
    except (KeyExists, DeploymentExists):
        raise  # an answer, not a failure
    except Exception as exc:
        log.warning("ledger: a query failed: %s: %s", type(exc).__name__, exc)
        raise ServiceUnavailable("the ledger's store cannot be read now; retry", code="ledger_unavailable", retry_after=5) from None


def _now_us() -> int:
    return int(time.time() * 1_000_000)


async def list_requests(request: web.Request) -> web.Response:
    """Admin: a deployment's records, newest first, a page at a time."""
    state, ledger = _ledger(request)
    name = request.match_info["deployment"]
    pool = state.pools.get(name)
    # A deployment no longer in the config still has its records, under its name.
    deployment = pool.deployment.name if pool is not None else name
    query = params.requests_query(deployment, request.query, _now_us())
    page = await read_store(ledger.store.requests(query))
    return web.Response(body=_encode(page), content_type="application/json")


async def usage(request: web.Request) -> web.Response:
    """Admin: requests and tokens summed by deployment, key, day or month."""
    state, ledger = _ledger(request)
    query = params.usage_query(request.query, _now_us())
    if query.deployment is not None and query.deployment in state.pools:  # an id or a name: the name
        query = dataclasses.replace(query, deployment=state.pools[query.deployment].deployment.name)
    rows = await read_store(ledger.store.usage(query))
    report = UsageReport(data=rows, start=query.start_us // 1_000_000, end=-(-query.end_us // 1_000_000), group_by=list(query.group_by))
    return web.Response(body=_encode(report), content_type="application/json")
