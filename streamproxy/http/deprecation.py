"""Deprecated routes and request fields answer with a `Deprecation` header.

`--deprecated ENTRY` (repeatable) marks a route (`/v1/completions`) or a
field of a route's JSON body (`/v1/chat/completions#max_tokens`), optionally
with the date it took effect (`...@2025-06-30`; without one, the server's
start). A response to a deprecated route, or to a request that used a
deprecated field (its value differs from the field's default), carries
`Deprecation: @<unix seconds>` (RFC 9745), plus `Link: <URL>; rel="deprecation"`
when `--deprecation-link` is set. Nothing else changes: the request is
served as before. Routes are matched by their canonical path
(`/v1/models/{model_id}`), so a path parameter does not defeat the match.
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

import msgspec
from aiohttp import web

_NO_DEFAULT = object()
_DEPRECATION: web.RequestKey[str] = web.RequestKey("deprecation", str)  # the field that made this request deprecated


def _header_value(date: str | None, started: float) -> str:
    if not date:
        return f"@{int(started)}"
    day = dt.datetime.strptime(date, "%Y-%m-%d").replace(tzinfo=dt.UTC)
    return f"@{int(day.timestamp())}"


def _default(struct_type: type, field: str) -> Any:
    for info in msgspec.structs.fields(struct_type):
        if info.name == field:
            if info.default is not msgspec.NODEFAULT:
                return info.default
            if info.default_factory is not msgspec.NODEFAULT:
                return info.default_factory()
            return _NO_DEFAULT
    return _NO_DEFAULT


class Deprecations:
    def __init__(self, entries: list[str], link: str | None = None, started: float | None = None) -> None:
        started = time.time() if started is None else started
        self.link = link
        self.routes: dict[str, str] = {}
        self.fields: dict[str, list[tuple[str, str]]] = {}
        for entry in entries:
            spec, _, date = entry.partition("@")
            value = _header_value(date.strip() or None, started)
            path, _, field = spec.strip().partition("#")
            if field:
                self.fields.setdefault(path, []).append((field, value))
            else:
                self.routes[path] = value

    def __bool__(self) -> bool:
        return bool(self.routes or self.fields)

    def note_body(self, request: web.Request, body: Any) -> None:
        """Mark the request if `body` uses a deprecated field of this route."""
        fields = self.fields.get(_canonical(request))
        if not fields:
            return
        for field, value in fields:
            used = getattr(body, field, _NO_DEFAULT)
            if used is _NO_DEFAULT:
                continue
            default = _default(type(body), field)
            if default is _NO_DEFAULT or used != default:
                request[_DEPRECATION] = value
                return

    async def on_prepare(self, request: web.Request, response: web.StreamResponse) -> None:
        value = request.get(_DEPRECATION) or self.routes.get(_canonical(request))
        if value is not None:
            response.headers["Deprecation"] = value
            if self.link:
                response.headers.add("Link", f'<{self.link}>; rel="deprecation"')


def _canonical(request: web.Request) -> str:
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else request.path


DEPRECATIONS_KEY: web.AppKey[Deprecations] = web.AppKey("streamproxy_deprecations", Deprecations)


def note_body(request: web.Request, body: Any) -> None:
    deprecations = request.app.get(DEPRECATIONS_KEY)
    if deprecations:
        deprecations.note_body(request, body)
