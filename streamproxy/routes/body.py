"""Read and decode a JSON request body into a typed Struct, with OpenAI errors.

Body size is capped by the application (`client_max_size`, a 413 rendered by
the middleware). Malformed JSON is a 400 `invalid_json`; a wrong or missing
field is a 400 whose `param` is the field's path (`messages[0].role`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import msgspec
from aiohttp import web

from .. import accesslog, deprecation
from ..errors import InvalidJSON, InvalidRequest, from_validation_error

T = TypeVar("T")


async def decode_body(request: web.Request, decode: Callable[[bytes], T]) -> T:
    body = await request.read()
    if not body.strip():
        raise InvalidJSON("the request body is empty; expected a JSON object")
    try:
        decoded = decode(body)
    except msgspec.ValidationError as exc:
        raise from_validation_error(exc) from None
    except msgspec.DecodeError as exc:
        raise InvalidJSON(f"the request body is not valid JSON: {exc}") from None
    except UnicodeDecodeError:
        raise InvalidRequest("the request body is not valid UTF-8") from None
    # What the access log may say about it (model, user, stream), deprecated fields.
    accesslog.note_body(request, decoded)
    deprecation.note_body(request, decoded)
    return decoded
