"""CORS for browser clients: off unless `--allowed-origins` is given.

vLLM's flags (Starlette's CORSMiddleware): `--allowed-origins` (`*` for any), `--allowed-methods`,
`--allowed-headers`, `--allow-credentials`; unlike vLLM, no origin by default. A preflight is answered
here, before authentication; every other response to an allowed `Origin` (errors and streams included)
gets `Access-Control-Allow-Origin` in `on_prepare` and exposes `X-Request-Id`, `Retry-After`,
`x-should-retry` and `Deprecation`.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from streamproxy.errors import InvalidRequest

ALL_METHODS = ("DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT")
EXPOSE = "X-Request-Id, Retry-After, x-should-retry, Deprecation"
MAX_AGE = "600"
_PREFLIGHT: web.RequestKey[bool] = web.RequestKey("cors_preflight", bool)


class Cors:
    def __init__(self, origins: list[str], methods: list[str], headers: list[str], credentials: bool) -> None:
        self.any_origin = "*" in origins
        self.origins = frozenset(origins)
        self.methods = ALL_METHODS if "*" in methods else tuple(m.upper() for m in methods)
        self.any_header = "*" in headers
        self.headers = frozenset(h.lower() for h in headers)
        self.credentials = credentials

    def allows(self, origin: str) -> bool:
        return self.any_origin or origin in self.origins

    def _origin_headers(self, origin: str, headers: Any) -> None:
        if self.any_origin and not self.credentials:
            headers["Access-Control-Allow-Origin"] = "*"
        else:
            headers["Access-Control-Allow-Origin"] = origin
            headers.add("Vary", "Origin")
        if self.credentials:
            headers["Access-Control-Allow-Credentials"] = "true"

    @web.middleware
    async def middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        origin = request.headers.get("Origin")
        if request.method != "OPTIONS" or origin is None or "Access-Control-Request-Method" not in request.headers:
            return await handler(request)
        return self.preflight(request, origin)

    def preflight(self, request: web.Request, origin: str) -> web.Response:
        if not self.allows(origin):
            raise InvalidRequest("disallowed CORS origin", code="cors_origin_not_allowed")
        method = request.headers["Access-Control-Request-Method"].upper()
        if method not in self.methods:
            raise InvalidRequest(f"disallowed CORS method {method}", code="cors_method_not_allowed")
        asked = request.headers.get("Access-Control-Request-Headers", "")
        if not self.any_header:
            bad = [h for h in (x.strip().lower() for x in asked.split(",")) if h and h not in self.headers]
            if bad:
                raise InvalidRequest(f"disallowed CORS headers {', '.join(bad)}", code="cors_headers_not_allowed")
        response = web.Response(status=200, text="OK")
        headers = response.headers
        # Marked so on_prepare does not add the actual-request headers again.
        request[_PREFLIGHT] = True
        self._origin_headers(origin, headers)
        headers["Access-Control-Allow-Methods"] = ", ".join(self.methods)
        if self.any_header:
            if asked:
                headers["Access-Control-Allow-Headers"] = asked
        else:
            headers["Access-Control-Allow-Headers"] = ", ".join(sorted(self.headers))
        headers["Access-Control-Max-Age"] = MAX_AGE
        return response

    async def on_prepare(self, request: web.Request, response: web.StreamResponse) -> None:
        origin = request.headers.get("Origin")
        if origin is None or request.get(_PREFLIGHT) or not self.allows(origin):
            return
        self._origin_headers(origin, response.headers)
        response.headers["Access-Control-Expose-Headers"] = EXPOSE
