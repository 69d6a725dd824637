"""API-key check for the /v1 routes (Bearer or x-api-key), constant time.

Every configured key is compared with `hmac.compare_digest` (no early exit); keys are never logged.
`/health`, `/metrics` and `/version` stay open unless `--health-requires-api-key` /
`--metrics-requires-api-key`; preflights pass; `/invocations` needs the key. Under `--root-path` the
same rules apply to the prefixed paths.
"""

from __future__ import annotations

import hashlib
import hmac

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from streamproxy.errors import AuthenticationError
from streamproxy.http.context import CONTEXT

PROTECTED_PREFIXES = ("/v1/", "/tokenize", "/detokenize", "/invocations")


def key_id(secret: str) -> str:
    """The id a key's ledger records carry (`serve --ledger`): `sha256:` and the first 12 hex digits
    of the key's SHA-256, never the key; the same for the same key on every start."""
    return "sha256:" + hashlib.sha256(secret.encode()).hexdigest()[:12]


def presented_key(request: web.Request) -> str | None:
    header = request.headers.get("Authorization")
    if header:
        scheme, _, token = header.partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
    return request.headers.get("x-api-key")


def make_auth_middleware(
    keys: list[str], *, protect_health: bool = False, protect_metrics: bool = False, root_path: str | None = None
) -> Middleware:
    encoded = [k.encode() for k in keys]
    ids = [key_id(k) for k in keys]
    exact = frozenset(p for p, on in (("/health", protect_health), ("/metrics", protect_metrics)) if on)

    @web.middleware
    async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        path = request.path
        if root_path and path.startswith(root_path + "/"):
            path = path[len(root_path) :]
        if (path.startswith(PROTECTED_PREFIXES) or path in exact) and request.method != "OPTIONS":
            presented = presented_key(request)
            candidate = (presented or "").encode()
            matched = None
            for key, key_id in zip(encoded, ids):  # every key compared: no early exit
                if hmac.compare_digest(candidate, key):
                    matched = key_id
            if matched is None:
                if presented is None:
                    raise AuthenticationError("missing API key: send 'Authorization: Bearer <key>'")
                raise AuthenticationError("incorrect API key provided")
            request[CONTEXT].key(matched)  # the ledger's key id (auth.key_id), never the key
        return await handler(request)

    return auth_middleware
