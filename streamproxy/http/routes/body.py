"""Read and decode a JSON request body into a typed Struct, with OpenAI errors.

Size is capped by `client_max_size` (413). Malformed JSON is 400 `invalid_json`; a wrong field a 400
whose `param` is its path (`messages[0].role`); nesting deeper than MAX_DEPTH a 400 `json_too_deep`
(msgspec's RecursionError or `nesting`), so schema validators, orjson, templates and grammar compilers
never see it. The body is read without aiohttp's `request.read()` cache: only the Struct holds it.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import accumulate
from typing import TypeVar

import msgspec
from aiohttp import web

from streamproxy.errors import InvalidJSON, InvalidRequest, from_validation_error
from streamproxy.http import deprecation
from streamproxy.http.context import CONTEXT

T = TypeVar("T")

# A body a dispatching route (/invocations) has read already, for the route it hands the request to.
PRELOADED: web.RequestKey[bytes] = web.RequestKey("preloaded_body", bytes)


async def read_body(request: web.Request) -> bytes:
    """`request.read()` without its cache: the request object (alive as long as a
    stream is) does not keep the raw body once it has been decoded."""
    if PRELOADED in request:
        return request.pop(PRELOADED)
    limit = request.client_max_size
    declared = request.content_length
    if limit and declared is not None and declared > limit:
        # Said up front: refused before a byte of the body is read.
        raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=declared)
    payload = request.content
    set_chunk = getattr(payload, "set_read_chunk_size", None)  # aiohttp >= 3.13, as read() does
    if limit and set_chunk is not None:
        set_chunk(limit)
    body = bytearray()
    while chunk := await payload.readany():
        body += chunk
        if limit and len(body) > limit:
            raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=len(body))
    return bytes(body)


MAX_DEPTH = 128

_NOT_STRUCTURE = bytes(c for c in range(256) if c not in b'"[]{}')
_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


def nesting(body: bytes) -> int:
    """How deep the (valid) JSON in `body` nests; brackets inside strings do not count.

    No Python loop over the bytes: escaped backslashes, then escaped quotes go,
    so every quote left opens or closes a string; of the quotes and brackets,
    neighbouring quotes go in pairs (the others keep their turns), so only the
    strings that hold brackets are left to split off. About 6 ms for a 450 kB
    body of 2,000 tools; none for a body with fewer than MAX_DEPTH brackets."""
    plain = body.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _NOT_STRUCTURE).replace(b'""', b"")
    outside = b"".join(plain.split(b'"')[0::2]) if b'"' in plain else plain
    return max(accumulate(map(_STEP.__getitem__, outside)), default=0)


def _too_deep() -> InvalidRequest:
    return InvalidRequest(f"the request body nests deeper than {MAX_DEPTH} levels", code="json_too_deep")


def decode(body: bytes, decoder: Callable[[bytes], T]) -> T:
    """`decoder(body)`, its every failure a 400 in our error tree (sans-IO: the fuzzers call it directly)."""
    if not body.strip():
        raise InvalidJSON("the request body is empty; expected a JSON object")
    try:
        decoded = decoder(body)
    except msgspec.ValidationError as exc:
        raise from_validation_error(exc) from None
    except msgspec.DecodeError as exc:
        raise InvalidJSON(f"the request body is not valid JSON: {exc}") from None
    except UnicodeDecodeError:
        raise InvalidRequest("the request body is not valid UTF-8") from None
    except RecursionError:
        raise _too_deep() from None
    # Cheap first: that deep needs at least MAX_DEPTH opening brackets.
    if body.count(b"[") + body.count(b"{") > MAX_DEPTH and nesting(body) > MAX_DEPTH:
        raise _too_deep()
    return decoded


async def decode_body(request: web.Request, decoder: Callable[[bytes], T]) -> T:
    decoded = decode(await read_body(request), decoder)
    # What the request's context may say about it (model, user, stream), deprecated fields.
    request[CONTEXT].body(decoded)
    deprecation.note_body(request, decoded)
    return decoded
