"""OpenAI's Responses API, its stream facts (`apis.spec.ApiSpec`): read by `stream.ResponsesEncoder` and the gateway.

A stream's events carry a `sequence_number` counting every event from 0,
and it ends with a terminal response event; a failure after the first byte
is `error` (our code, message, param) and then `response.failed`, whose
response is the stream's own (the same id as its `response.created`: the
SDK's accumulator refuses another) with `status: failed` and `error` in
OpenAI's words (`failure`). Serve's encoder fails its Response with what it
generated; the gateway, which does not rebuild it, fails the replica's
`response.created` one with the items the replica announced (`kept`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from streamproxy.apis.spec import ApiSpec, Usage, count, positive
from streamproxy.core import sse
from streamproxy.errors import APIError

_encode = msgspec.json.Encoder().encode
SEQ = b',"sequence_number":'


def failure(exc: APIError) -> tuple[str, str]:
    """A failed response's `error` (code, message): the code is one of OpenAI's (the error event carries ours)."""
    code = "rate_limit_exceeded" if exc.status == 429 else "invalid_prompt" if exc.status < 500 else "server_error"
    return code, exc.message


def failed_events(exc: APIError, sequence_number: int, response_json: bytes | None) -> bytes:
    """`error` (numbered `sequence_number`), then `response.failed` with `response_json` (None: `error` alone)."""
    head = _encode({"type": "error", "code": exc.code or "server_error", "message": exc.message, "param": exc.param})[:-1]
    out = sse.event_frame(b"error", head + SEQ + str(sequence_number).encode() + b"}")
    if response_json is None:
        return out
    failed = b'{"type":"response.failed","response":' + response_json + SEQ + str(sequence_number + 1).encode() + b"}"
    return out + sse.event_frame(b"response.failed", failed)


class _Responses(ApiSpec):
    name = "responses"
    done = (b"event: response.completed", b"event: response.incomplete", b"event: response.failed")
    deltas = (b"event: response.output_text.delta", b"event: response.reasoning_text.delta",
              b"event: response.function_call_arguments.delta")
    kept = (b"event: response.created", b"event: response.output_item.")
    finish = (b"event: response.completed", b"event: response.incomplete")

    def read_finish(self, body: dict[str, Any], into: dict[int, str]) -> None:
        """The terminal event's response (a non-stream answer: the Response): completed is `stop`,
        incomplete its reason (`max_output_tokens`: `length`); failed says none."""
        response = body.get("response") if "response" in body else body
        if not isinstance(response, dict):
            return
        status = response.get("status")
        if status == "completed":
            into[0] = "stop"
        elif status == "incomplete":
            details = response.get("incomplete_details")
            reason = details.get("reason") if isinstance(details, dict) else None
            into[0] = "length" if reason == "max_output_tokens" else reason if isinstance(reason, str) else "incomplete"

    def read_usage(self, body: dict[str, Any], into: Usage) -> None:
        usage = body.get("usage")  # a non-stream answer is the Response itself
        if usage is None:
            inner = body.get("response")  # the terminal event's
            usage = inner.get("usage") if isinstance(inner, dict) else None
        if not isinstance(usage, dict):
            return
        if "input_tokens" in usage:  # input tokens include the cached ones
            into.prompt_tokens = count(usage.get("input_tokens"))
            into.cached_tokens = count((usage.get("input_tokens_details") or {}).get("cached_tokens"))
        into.completion_tokens = max(into.completion_tokens, count(usage.get("output_tokens")))
        into.billed = True

    def error(self, exc: APIError, sequence_number: int = 0, kept: Sequence[dict[str, Any]] = ()) -> bytes:
        """`kept`: the stream's response.created and output_item.added/.done events, which the failed
        response is made of: its items as they were last announced, one still open `incomplete`
        (its text so far is what the client's deltas already hold)."""
        response: Any = None
        items: dict[int, Any] = {}
        for event in kept:
            if event.get("type") == "response.created":
                response = event.get("response")
            elif isinstance(index := event.get("output_index"), int):
                items[index] = event.get("item")
        if not isinstance(response, dict):
            return failed_events(exc, sequence_number, None)
        output = [{**item, "status": "incomplete"} if isinstance(item, dict) and item.get("status") == "in_progress" else item
                  for _, item in sorted(items.items())]
        code, message = failure(exc)
        failed = {**response, "status": "failed", "output": output, "error": {"code": code, "message": message}}
        return failed_events(exc, sequence_number, _encode(failed))

    def cap(self, body: dict[str, Any]) -> tuple[int | None, int]:
        return positive(body.get("max_output_tokens")), 1


RESPONSES = _Responses()
