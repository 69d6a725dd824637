"""Application factory: routes, middlewares, response hooks, engine life cycle.

Middlewares, outermost first: `context.edge` (id, context, finish subscribers), `error_middleware`,
CORS (with --allowed-origins), API-key auth (with --api-key). The server listens before the engine is
ready: `on_startup` starts it in a task and generation routes answer 503 `engine_loading` until it is
up; then `engine_watch.watch` waits for its death. Every error leaves through `error_middleware` as an
OpenAI-shaped body (or the route's API's shape, `error_shapes`); an unexpected one is logged and a bare
500.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from engine_adapter.base import Engine
from streamproxy.config import Settings
from streamproxy.errors import APIError, InternalError, MethodNotAllowed, NotFound, PayloadTooLarge
from streamproxy.filters.detect import AUTO, resolve
from streamproxy.http import accesslog, context, tracing
from streamproxy.http import metrics as metrics_module
from streamproxy.http.auth import make_auth_middleware
from streamproxy.http.context import CONTEXT, Subscriber
from streamproxy.http.cors import Cors
from streamproxy.http.deprecation import DEPRECATIONS_KEY, Deprecations
from streamproxy.http.drain import INFLIGHT_KEY
from streamproxy.http.engine_watch import watch
from streamproxy.http.error_shapes import error_response
from streamproxy.http.metrics import watch_engine
from streamproxy.http.routes import add_routes, background
from streamproxy.http.routes.lora import load_static
from streamproxy.http.state import STATE_KEY, AppState

log = logging.getLogger("streamproxy")

ENGINE_TASK_KEY: web.AppKey[asyncio.Task[None]] = web.AppKey("engine_task", asyncio.Task)


def _from_http_exception(exc: web.HTTPException, request: web.Request) -> APIError:
    if exc.status == 404:
        return NotFound(f"no route for {request.method} {request.path}")
    if exc.status == 405:
        return MethodNotAllowed(f"method {request.method} is not allowed on {request.path}")
    if exc.status == 413:
        limit = request.client_max_size
        return PayloadTooLarge(f"the request body is larger than the limit of {limit} bytes")
    err = APIError(exc.reason or "HTTP error", status=exc.status)
    err.type = "invalid_request_error" if exc.status < 500 else "internal_error"
    return err


# What every request's end is told to, in this order (serve's and the gateway's; the ledger's comes after).
EDGE_SUBSCRIBERS: tuple[Subscriber, ...] = (metrics_module.finished, accesslog.finished, tracing.finished)


def _error(request: web.Request, exc: APIError) -> web.Response:
    request[CONTEXT].fail(exc.code)
    return error_response(request, exc)


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except APIError as exc:
        state = request.app.get(STATE_KEY)  # (the gateway's app shares this middleware, without a state)
        if state is not None and state.settings.log_error_stack:  # vLLM's --log-error-stack
            log.error("error response %d on %s %s: %s", exc.status, request.method, request.path, exc.message, exc_info=exc)
        return _error(request, exc)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        response = _error(request, _from_http_exception(exc, request))
        if "Allow" in exc.headers:  # a 405 must say which methods are allowed
            response.headers["Allow"] = exc.headers["Allow"]
        return response
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception:
        log.exception("unhandled error on %s %s (request %s)", request.method, request.path, request[CONTEXT].request_id)
        return _error(request, InternalError("the server failed to handle this request"))


async def _start_engine(app: web.Application) -> None:
    state = app[STATE_KEY]

    async def start() -> None:
        limit = state.settings.engine_start_timeout
        try:
            async with asyncio.timeout(limit):
                await state.engine.start()
                await load_static(state)  # --lora-modules; one that cannot be loaded stops the server, as in vLLM
            log.info("engine ready: serving %s", ", ".join(state.engine.info.served_names))
            _resolve_auto_parsers(state.settings, state.engine)
        except Exception as exc:
            state.engine_error = str(exc) or type(exc).__name__
            if isinstance(exc, TimeoutError):
                log.error("engine did not start within %.0f s (--engine-start-timeout)", limit)
            else:
                log.exception("engine failed to start")
            for callback in state.on_engine_failure:
                callback()
            return
        state.death_watch = asyncio.create_task(watch(state), name="engine-death-watch")

    app[ENGINE_TASK_KEY] = asyncio.create_task(start(), name="engine-start")


def _resolve_auto_parsers(settings: Settings, engine: Engine) -> None:
    """`--tool-call-parser auto` / `--reasoning-parser auto`: chosen from the loaded model's chat template."""
    tool, reasoning = settings.tool_call_parser, settings.reasoning_parser
    if AUTO not in (tool, reasoning):
        return
    info = engine.info
    settings.tool_call_parser, settings.reasoning_parser = resolve(tool, reasoning, info.chat_template, info.model_type)
    if tool == AUTO:
        if settings.tool_call_parser is None:
            log.info("--tool-call-parser auto: the chat template shows no tool-call syntax we know; "
                     "tool_choice \"auto\" is refused (required and named tool choice work)")
        else:
            log.info("--tool-call-parser auto: %s (from the chat template)", settings.tool_call_parser)
    if reasoning == AUTO:
        log.info("--reasoning-parser auto: %s", settings.reasoning_parser or "none (the chat template does not think)")


async def _stop_engine(app: web.Application) -> None:
    for task in (app.get(ENGINE_TASK_KEY), app[STATE_KEY].death_watch):  # closing makes the engine "dead" too
        if task is not None and not task.done():
            task.cancel()
    await app[STATE_KEY].engine.close()


async def _publish_metrics(app: web.Application) -> AsyncIterator[None]:
    """--api-server-count: this worker's own values into the shared metric files (metrics.publish)."""
    task = asyncio.create_task(metrics_module.publish(), name="metrics-publish")
    yield
    task.cancel()
    metrics_module.publish_now()


def create_app(settings: Settings, engine: Engine) -> web.Application:
    middlewares: list[Middleware] = [context.edge, error_middleware]
    cors = None
    if settings.allowed_origins:
        cors = Cors(settings.allowed_origins, settings.allowed_methods, settings.allowed_headers, settings.allow_credentials)
        middlewares.append(cors.middleware)
    if settings.api_key:
        middlewares.append(
            make_auth_middleware(
                settings.api_key,
                protect_health=settings.health_requires_api_key,
                protect_metrics=settings.metrics_requires_api_key,
                root_path=settings.root_path,
            )
        )
    elif settings.health_requires_api_key or settings.metrics_requires_api_key:
        log.warning("--health/metrics-requires-api-key without --api-key: there is no key to require")
    app = web.Application(middlewares=middlewares, client_max_size=settings.max_body_bytes)
    app[STATE_KEY] = AppState(settings, engine)
    app[INFLIGHT_KEY] = app[STATE_KEY].inflight
    app[context.SUBSCRIBERS] = list(EDGE_SUBSCRIBERS)
    watch_engine(engine)
    app.on_response_prepare.append(context.on_prepare)
    if cors is not None:
        app.on_response_prepare.append(cors.on_prepare)
    deprecations = Deprecations(settings.deprecated, settings.deprecation_link)
    if deprecations:
        app[DEPRECATIONS_KEY] = deprecations
        app.on_response_prepare.append(deprecations.on_prepare)
    app.on_startup.append(_start_engine)
    app.on_shutdown.append(background.stop)
    app.on_cleanup.append(_stop_engine)
    if metrics_module.MULTIPROCESS:
        app.cleanup_ctx.append(_publish_metrics)
    add_routes(app)
    return app
