"""The gateway's application: the edge of `serve`, with relaying routes instead of an engine.

Every route `serve` has is here three times (`routes.py`: by the body's
`model`, and by the deployment's id or name in the path), beside the
gateway's own: the deployments, their admin, and `GET /openapi.json`
(`openapi.py`). The edge is `serve`'s own: the access log and request ids,
the error middleware and error shapes (Anthropic's on its routes; a
replica's own error answers pass through unchanged), the body cap, drain. The upstream
client (wire.py's `Upstreams`: relays, probes and every other look at a replica) and the
health probes start with the app and stop with it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from functools import partial

import msgspec
import orjson
import uvloop
from aiohttp import web

from streamproxy.apis.anthropic import errors as anthropic_errors
from streamproxy.apis.anthropic.spec import ANTHROPIC
from streamproxy.config import Settings
from streamproxy.errors import APIError, InvalidRequest, ModelNotFound
from streamproxy.gateway import books, deployadmin, keyadmin
from streamproxy.gateway.config import GatewayConfig
from streamproxy.gateway.deploysync import DeploymentSync
from streamproxy.gateway.keyring import Keyring, release_hold
from streamproxy.gateway.openapi import openapi_json
from streamproxy.gateway.probes import probe_forever
from streamproxy.gateway.proxy import relay
from streamproxy.gateway.reload import Load, Reloader
from streamproxy.gateway.routes import MODELS_PATHS, ROUTES, relayed_paths
from streamproxy.gateway.source import ReplicaSource
from streamproxy.gateway.state import STATE_KEY, Current, GatewayState, gateway_state
from streamproxy.gateway.upstream import UpstreamError
from streamproxy.gateway.wire import Upstreams
from streamproxy.http import accesslog, context, error_shapes, tracing
from streamproxy.http.app import EDGE_SUBSCRIBERS, error_middleware
from streamproxy.http.cors import Cors
from streamproxy.http.drain import INFLIGHT_KEY
from streamproxy.http.metrics import metrics
from streamproxy.http.server import run_app
from streamproxy.http.state import VERSION
from streamproxy.ledger import writer
from streamproxy.ledger.store import default_url
from streamproxy.ledger.writer import Ledger
from streamproxy.protocol.common import ModelCard, ModelList, VersionInfo, encode

log = logging.getLogger("streamproxy.gateway")

_PROBES_KEY: web.AppKey[asyncio.Task[None]] = web.AppKey("gateway_probes", asyncio.Task)
SYNC_KEY: web.AppKey[DeploymentSync] = web.AppKey("gateway_deployment_sync", DeploymentSync)


def _anthropic_error_json(exc: APIError) -> bytes:
    return exc.raw if isinstance(exc, UpstreamError) else anthropic_errors.error_json(exc)


def add_routes(app: web.Application) -> None:
    for name, route in ROUTES.items():
        handler = partial(relay, route=route)
        for path in relayed_paths(name):
            added = app.router.add_post(path, handler)
            if route.api is ANTHROPIC:
                error_shapes.register(app, added, _anthropic_error_json)
    for path in MODELS_PATHS:
        app.router.add_get(path, list_models)
    app.router.add_get("/v1/models/{model_id:.+}", get_model)
    app.router.add_get("/v1/deployments", list_deployments)
    app.router.add_get("/v1/deployments/{deployment}", get_deployment)
    app.router.add_post("/v1/deployments", deployadmin.create_deployment)
    app.router.add_patch("/v1/deployments/{deployment}", deployadmin.patch_deployment)
    app.router.add_delete("/v1/deployments/{deployment}", deployadmin.delete_deployment)
    app.router.add_post("/v1/deployments/{deployment}/wake", wake_deployment)
    app.router.add_post("/v1/deployments/{deployment}/park", park_deployment)
    app.router.add_get("/v1/deployments/{deployment}/requests", books.list_requests)
    app.router.add_get("/v1/usage", books.usage)
    app.router.add_post("/v1/keys", keyadmin.create_key)
    app.router.add_get("/v1/keys", keyadmin.list_keys)
    app.router.add_delete("/v1/keys/{key_id}", keyadmin.delete_key)
    app.router.add_get("/health", health)
    app.router.add_get("/version", version)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/openapi.json", openapi_json)


def _visible(request: web.Request) -> list[str]:
    """The deployments the request's key may see (all of them when no key is configured); 401."""
    state = gateway_state(request)
    found = state.identify(request)
    return [d.name for d in state.deployments if found is None or found[0].allows(d)]


def _card(state: GatewayState, name: str) -> ModelCard:
    """A deployment as serve's model card: the gateway knows no weights' path or context length
    (`root`, `max_model_len` null) and lists no adapters (`parent` null)."""
    return ModelCard(id=name, created=state.started)


def _json(data: object, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


def _typed(data: msgspec.Struct) -> web.Response:
    """A response struct of `protocol/` encoded as serve encodes it (`protocol.common.encode`)."""
    return web.Response(body=encode(data), content_type="application/json")


async def list_models(request: web.Request) -> web.Response:
    state = gateway_state(request)
    names = _visible(request)
    only = request.match_info.get("deployment")
    if only is not None:
        pool = state.resolve(None, only)
        names = [n for n in names if n == pool.deployment.name]
    return _typed(ModelList(data=[_card(state, n) for n in names]))


async def get_model(request: web.Request) -> web.Response:
    state = gateway_state(request)
    name = request.match_info["model_id"]
    pool = state.pools.get(name)
    if pool is None or pool.deployment.name not in _visible(request):
        raise ModelNotFound(f"The model `{name}` does not exist.", param="model")
    return _typed(_card(state, pool.deployment.name))


async def list_deployments(request: web.Request) -> web.Response:
    state = gateway_state(request)
    return _json({"object": "list", "data": [state.describe(n) for n in _visible(request)]})


async def get_deployment(request: web.Request) -> web.Response:
    state = gateway_state(request)
    pool = state.resolve(None, request.match_info["deployment"])
    if pool.deployment.name not in _visible(request):
        raise ModelNotFound(f"no deployment `{request.match_info['deployment']}`")
    return _json(state.describe(pool.deployment.name))


def _managed(request: web.Request) -> ReplicaSource:
    state = gateway_state(request)
    state.authorize_admin(request)
    name = request.match_info["deployment"]
    source = state.sources.get(name)
    if source is None:
        raise ModelNotFound(f"no deployment `{name}`")
    if not source.managed:
        raise InvalidRequest(f"deployment `{name}` is not managed ({source.why_not_managed})")
    return source


async def wake_deployment(request: web.Request) -> web.Response:
    """Admin: start a parked (or failed) managed deployment's replicas; answers at once."""
    managed = _managed(request)
    managed.wake(admin=True)
    return _json(gateway_state(request).describe(managed.name))


async def park_deployment(request: web.Request) -> web.Response:
    """Admin: drain and stop a managed deployment's replicas; answers once they are stopped."""
    managed = _managed(request)
    await managed.park("admin")
    return _json(gateway_state(request).describe(managed.name))


async def health(request: web.Request) -> web.Response:
    """200 while every deployment can take requests (a managed one unless it failed: a parked one
    wakes on demand); 503 otherwise (with which not)."""
    state = gateway_state(request)
    now = time.monotonic()

    down_names = [d.name for d in state.deployments if state.sources[d.name].down(now)]
    if state.inflight.draining:
        return _json({"status": "draining"}, status=503)
    if down_names:
        return _json({"status": "degraded", "unavailable": down_names}, status=503)
    return _json({"status": "ok"})


async def version(request: web.Request) -> web.Response:
    return _typed(VersionInfo(version=VERSION))


async def _start(app: web.Application) -> None:
    state = app[STATE_KEY].state
    policy = state.policy
    state.upstreams = Upstreams(
        connect_timeout=policy.connect_timeout,
        read_timeout=policy.read_timeout or state.settings.request_timeout or None,
        keepalive=policy.keepalive,
    )
    app[_PROBES_KEY] = asyncio.create_task(probe_forever(app[STATE_KEY]), name="gateway-probes")
    state.start_sources(state.upstreams)
    if state.ledger is not None:
        state.ledger.start()
        sync = app[SYNC_KEY] = DeploymentSync(app, state.ledger.store)
        await sync.load()  # the admin API's deployments, beside the file's
        sync.start()  # and, within a second, those another gateway sharing the store makes, changes or deletes
    if state.keyring is not None:
        try:
            await state.keyring.refresh()
        except Exception as exc:  # the store answered at start; a blip now leaves the keyring to its refresh
            log.warning("keys: first read from the ledger's store failed: %s: %s", type(exc).__name__, exc)
        state.keyring.start()


async def _stop(app: web.Application) -> None:
    """After the gateway's own drain: every managed replica drains and exits, watches and probes end."""
    await app[STATE_KEY].state.stop_sources()
    task = app.get(_PROBES_KEY)
    if task is not None:
        task.cancel()
    state = app[STATE_KEY].state
    if state.upstreams is not None:
        state.upstreams.close()


async def _close_ledger(app: web.Application) -> None:
    """Last, after the drain: every request's record is queued; write them all."""
    state = app[STATE_KEY].state
    sync = app.get(SYNC_KEY)
    if sync is not None:
        await sync.stop()
    if state.keyring is not None:
        await state.keyring.stop()
    if state.ledger is not None:
        await state.ledger.close()


def create_gateway_app(settings: Settings, config: GatewayConfig, ledger: Ledger | None = None) -> web.Application:
    """`ledger`: the request ledger (an opened store, see `ledger.writer.open_ledger`), or None (off)."""
    middlewares = [context.edge, error_middleware]
    cors = None
    if settings.allowed_origins:
        cors = Cors(settings.allowed_origins, settings.allowed_methods, settings.allowed_headers, settings.allow_credentials)
        middlewares.append(cors.middleware)
    app = web.Application(middlewares=middlewares, client_max_size=settings.max_body_bytes)
    state = GatewayState(settings, config)
    app[STATE_KEY] = Current(state)
    app[INFLIGHT_KEY] = state.inflight
    app[context.SUBSCRIBERS] = list(EDGE_SUBSCRIBERS)
    app.on_response_prepare.append(context.on_prepare)
    if cors is not None:
        app.on_response_prepare.append(cors.on_prepare)
    app.on_startup.append(_start)
    app.on_cleanup.append(_stop)
    if ledger is not None:
        state.ledger = ledger
        state.keyring = Keyring(ledger.store)
        ledger.on_written = state.keyring.written
        context.on_finish(app, release_hold)  # and its real tokens counted by the next, in the same step
        context.on_finish(app, books.recorder(app[STATE_KEY], ledger))
        app.on_cleanup.append(_close_ledger)
    add_routes(app)
    return app


async def serve_gateway(settings: Settings, config: GatewayConfig, *, ready: asyncio.Event | None = None,
                        reload: Load | None = None, source: str = "") -> int:
    """`reload`: how SIGHUP loads the config again (`reload.py`); None: SIGHUP is not handled."""
    named, w = config.ledger is not None, config.ledger_writer  # the config's ledger, else its default (None: `off`)
    field = "ledger" if named else "ledger (its default, $STREAMPROXY_LEDGER or ~/.local/state)"
    ledger = await writer.open_ledger(config.ledger if named else default_url(), f"gateway config: `{field}`",
                                      interval=w.interval, batch_size=w.batch_size, max_buffered=w.max_buffered)
    listener = accesslog.configure(settings.access_log, settings.disable_access_log_for_endpoints)
    tracer = tracing.configure(settings.otlp_traces_endpoint, "streamproxy-gateway")
    app = create_gateway_app(settings, config, ledger)
    reloader = Reloader(app, reload, source) if reload is not None else None
    for d in config.deployments:
        if d.launch is not None:
            where = f"managed: {d.launch.replicas} x {d.launch.model}"
        elif d.kubernetes is not None:
            k = d.kubernetes
            where = f"kubernetes: pods {k.label_selector()} in {k.namespace}, port {k.port}"
            if k.scale is not None:
                where += f"; scale {k.scale.kind}/{k.scale.name} to {k.scale.replicas}"
        else:
            where = ", ".join(d.upstreams)
        log.info("deployment %s (%s): %s -> %s", d.name, d.id, d.upstream_model, where)
    if reloader is not None:
        reloader.install()
    try:
        await run_app(app, settings, stop=asyncio.Event(), ready=ready)
    finally:
        if reloader is not None:
            reloader.uninstall()
        if listener is not None:
            listener.stop()
        if tracer is not None:
            tracer.shutdown()
    return 0


def run_gateway(settings: Settings, config: GatewayConfig, reload: Load | None = None, source: str = "") -> None:
    uvloop.run(serve_gateway(settings, config, reload=reload, source=source))
