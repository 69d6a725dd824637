"""Application factory: routes, the error/request-id middleware, engine life cycle.

The server listens before the engine is ready: `on_startup` starts the engine
in a background task, and until it is up the generation routes answer 503
`engine_loading` (and /health says not ready). Every error a handler raises
(our `APIError`s, aiohttp's own 404/405/413, anything unexpected) leaves
through `error_middleware` as an OpenAI-shaped JSON body; an unexpected one is
logged with its traceback and answered with a bare 500, never the traceback.
"""

from __future__ import annotations

import asyncio
import logging
import re
import uuid

from aiohttp import web

from engine_adapter.base import Engine

from .auth import make_auth_middleware
from .config import Settings
from .errors import APIError, InternalError, MethodNotAllowed, NotFound, PayloadTooLarge
from .routes import add_routes
from .state import STATE_KEY, AppState

log = logging.getLogger("streamproxy")

_REQUEST_ID_OK = re.compile(r"[A-Za-z0-9._:\-]{1,128}")
ENGINE_TASK_KEY: web.AppKey[asyncio.Task[None]] = web.AppKey("engine_task", asyncio.Task)


def error_response(exc: APIError) -> web.Response:
    return web.Response(status=exc.status, body=exc.to_json(), content_type="application/json", headers=exc.headers())


def _from_http_exception(exc: web.HTTPException, request: web.Request) -> APIError:
    if exc.status == 404:
        return NotFound(f"no route for {request.method} {request.path}")
    if exc.status == 405:
        return MethodNotAllowed(f"method {request.method} is not allowed on {request.path}")
    if exc.status == 413:
        limit = request.app[STATE_KEY].settings.max_body_bytes
        return PayloadTooLarge(f"the request body is larger than the limit of {limit} bytes")
    err = APIError(exc.reason or "HTTP error", status=exc.status)
    err.type = "invalid_request_error" if exc.status < 500 else "internal_error"
    return err


@web.middleware
async def error_middleware(request: web.Request, handler):  # type: ignore[no-untyped-def]
    rid = request.headers.get("X-Request-Id")
    request["request_id"] = rid if rid and _REQUEST_ID_OK.fullmatch(rid) else uuid.uuid4().hex
    try:
        return await handler(request)
    except APIError as exc:
        return error_response(exc)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error_response(_from_http_exception(exc, request))
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception:
        log.exception("unhandled error on %s %s (request %s)", request.method, request.path, request["request_id"])
        return error_response(InternalError("the server failed to handle this request"))


async def _add_request_id(request: web.Request, response: web.StreamResponse) -> None:
    rid = request.get("request_id")
    if rid is not None:
        response.headers["X-Request-Id"] = rid


async def _start_engine(app: web.Application) -> None:
    state = app[STATE_KEY]

    async def start() -> None:
        try:
            await state.engine.start()
            log.info("engine ready: serving %s", ", ".join(state.engine.info.served_names))
        except Exception as exc:
            state.engine_error = str(exc)
            log.exception("engine failed to start")

    app[ENGINE_TASK_KEY] = asyncio.create_task(start(), name="engine-start")


async def _stop_engine(app: web.Application) -> None:
    task = app.get(ENGINE_TASK_KEY)
    if task is not None and not task.done():
        task.cancel()
    await app[STATE_KEY].engine.close()


def create_app(settings: Settings, engine: Engine) -> web.Application:
    middlewares = [error_middleware]
    if settings.api_key:
        middlewares.append(make_auth_middleware(settings.api_key))
    app = web.Application(middlewares=middlewares, client_max_size=settings.max_body_bytes)
    app[STATE_KEY] = AppState(settings, engine)
    app.on_response_prepare.append(_add_request_id)
    app.on_startup.append(_start_engine)
    app.on_cleanup.append(_stop_engine)
    add_routes(app)
    return app
