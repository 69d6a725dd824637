"""Our error tree in Anthropic's words: `{"type": "error", "error": {"type", "message"}}`.

The server has one error tree (`errors.py`); the Anthropic routes only
render it differently. The error `type` follows from the HTTP status the way
Anthropic's API assigns it (400 invalid_request_error, 401
authentication_error, 403 permission_error, 404 not_found_error, 413
request_too_large, 429 rate_limit_error, 500 api_error, 504 timeout_error,
503/529 overloaded_error; any other 4xx invalid_request_error, 5xx
api_error). The status itself and the retry headers stay as they are, so
the SDK's retry logic sees the same thing an OpenAI client does.
"""

from __future__ import annotations

from streamproxy.apis.anthropic.protocol import ErrorBody, ErrorEnvelope, encode
from streamproxy.errors import APIError

_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def error_type(exc: APIError) -> str:
    found = _BY_STATUS.get(exc.status)
    if found is not None:
        return found
    return "invalid_request_error" if exc.status < 500 else "api_error"


def error_json(exc: APIError) -> bytes:
    message = exc.message
    if exc.param and exc.param not in message:
        message = f"{exc.param}: {message}"  # Anthropic's shape has no `param`: say it first, as Anthropic does
    return encode(ErrorEnvelope(error=ErrorBody(type=error_type(exc), message=message)))
