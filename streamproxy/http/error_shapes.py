"""Which error body shape a route answers in: OpenAI's by default, its API's own where set.

Routes register their shape when they are added (`routes.add_routes`); the
error middleware (before the first byte) and the non-streaming writer
(after an early 200) both ask `error_json(request)`, so a route's errors
have one shape whatever the phase. Streams carry theirs in the encoder.
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web
from aiohttp.web_urldispatcher import AbstractRoute

from streamproxy.errors import APIError

ErrorJson = Callable[[APIError], bytes]

SHAPES_KEY: web.AppKey[dict[AbstractRoute, ErrorJson]] = web.AppKey("error_shapes", dict)


def openai_error_json(exc: APIError) -> bytes:
    return exc.to_json()


def register(app: web.Application, route: AbstractRoute, error_json: ErrorJson) -> None:
    app.setdefault(SHAPES_KEY, {})[route] = error_json


def error_json(request: web.Request) -> ErrorJson:
    shapes = request.app.get(SHAPES_KEY)
    if not shapes:
        return openai_error_json
    return shapes.get(request.match_info.route, openai_error_json)


def error_response(request: web.Request, exc: APIError) -> web.Response:
    return web.Response(status=exc.status, body=error_json(request)(exc), content_type="application/json", headers=exc.headers())
