"""One error tree for the whole server.

Every error a client can see is an `APIError`: it knows its HTTP status, the
OpenAI error `type`, an optional machine-readable `code` and the `param` it is
about. Handlers raise; one place (`app.error_middleware` before the first byte,
`stream` after it) turns the error into bytes. Nothing else formats errors, so
the shape `{"error": {"message", "type", "param", "code"}}` is the same
everywhere, and `param`/`code` are always a string or null (never the status).
"""

from __future__ import annotations

import re

import msgspec


class ErrorBody(msgspec.Struct, omit_defaults=False):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorEnvelope(msgspec.Struct):
    error: ErrorBody


_encode = msgspec.json.Encoder().encode


class APIError(Exception):
    status: int = 500
    type: str = "internal_error"
    code: str | None = None
    # Seconds a client should wait before retrying (sent as Retry-After).
    retry_after: int | None = None
    # Sent as `x-should-retry: true|false`, which the OpenAI SDKs obey over the status.
    should_retry: bool | None = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        status: int | None = None,
        retry_after: int | None = None,
        should_retry: bool | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        if status is not None:
            self.status = status
        if retry_after is not None:
            self.retry_after = retry_after
        if should_retry is not None:
            self.should_retry = should_retry

    def body(self) -> ErrorBody:
        return ErrorBody(message=self.message, type=self.type, param=self.param, code=self.code)

    def to_json(self) -> bytes:
        return _encode(ErrorEnvelope(self.body()))

    def headers(self) -> dict[str, str]:
        headers: dict[str, str] = {}
        if self.retry_after is not None:
            headers["Retry-After"] = str(self.retry_after)
        if self.should_retry is not None:
            headers["x-should-retry"] = "true" if self.should_retry else "false"
        return headers


class InvalidRequest(APIError):
    status = 400
    type = "invalid_request_error"


class InvalidJSON(InvalidRequest):
    code = "invalid_json"


class ContextLengthExceeded(InvalidRequest):
    code = "context_length_exceeded"


class AuthenticationError(APIError):
    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class NotFound(APIError):
    status = 404
    type = "invalid_request_error"
    code = "not_found"


class ModelNotFound(NotFound):
    code = "model_not_found"


class MethodNotAllowed(APIError):
    status = 405
    type = "invalid_request_error"
    code = "method_not_allowed"


class RequestTimeout(APIError):
    """The client was too slow sending its request: the headers within --client-header-timeout,
    or the next bytes of its body within --client-body-timeout (nginx's 408)."""

    status = 408
    type = "invalid_request_error"
    code = "request_timeout"


class PayloadTooLarge(APIError):
    status = 413
    type = "invalid_request_error"
    code = "request_too_large"


class HeaderTooLarge(APIError):
    status = 431
    type = "invalid_request_error"
    code = "request_header_too_large"


class RateLimited(APIError):
    status = 429
    type = "rate_limit_error"
    code = "too_many_requests"
    retry_after = 1


class QuotaExceeded(RateLimited):
    """A key over its token budget (OpenAI's `insufficient_quota`): retrying before the period turns is no use."""

    type = "insufficient_quota"
    code = "insufficient_quota"
    should_retry = False


class QueueTimeout(RateLimited):
    """Waited longer than the request timeout for a generation slot."""

    code = "queue_timeout"


class InternalError(APIError):
    status = 500
    type = "internal_error"
    code = "internal_error"


class EngineError(APIError):
    """The engine failed while generating (after admission)."""

    status = 500
    type = "internal_error"
    code = "engine_error"


class ServiceUnavailable(APIError):
    status = 503
    type = "service_unavailable"
    code = "upstream_unavailable"
    retry_after = 5


class EngineLoading(ServiceUnavailable):
    code = "engine_loading"


class EngineDead(ServiceUnavailable):
    """The inference engine died (its process was killed, a step raised): nothing can be
    generated here any more; the server exits non-zero so its supervisor restarts it."""

    code = "engine_dead"


class ServerShuttingDown(ServiceUnavailable):
    """The server is draining (SIGTERM): no new work, and the drain deadline ends the rest."""

    code = "server_shutting_down"
    retry_after = 1


class GenerationTimeout(APIError):
    """--request-timeout passed. 504: the engine behind this gateway did not answer in
    time. `x-should-retry: false`: the OpenAI SDKs retry 408/5xx by default, and
    re-running a generation that already took the whole timeout only triples the cost."""

    status = 504
    type = "timeout_error"
    code = "generation_timeout"
    should_retry = False


def param_from_msgspec(message: str) -> str | None:
    """msgspec ends its validation messages with "- at `$.a.b[0]`": take the path."""
    marker = " - at `$"
    at = message.rfind(marker)
    if at < 0:
        return None
    path = message[at + len(marker) : -1]
    return path.lstrip(".") or None


_MISSING = re.compile(r"Object missing required field `([^`]+)`")


def from_validation_error(exc: msgspec.ValidationError) -> InvalidRequest:
    text = str(exc)
    param = param_from_msgspec(text)
    message = text[: text.rfind(" - at `$")] if param else text
    missing = _MISSING.match(message)
    if missing:
        # Name the missing field itself, as OpenAI does.
        field = missing.group(1)
        param = f"{param}.{field}" if param else field
        return InvalidRequest(f"missing required parameter '{param}'", param=param, code="missing_required_parameter")
    if param:
        message = f"{message} at '{param}'"
    return InvalidRequest(message, param=param, code="invalid_type" if "Expected" in text else "invalid_value")
