"""Anthropic's Messages API, its stream facts (`apis.spec.ApiSpec`): read by `stream.AnthropicEncoder` and the gateway.

A failure after the first byte is one `error` event, after which the stream
ends (Anthropic's own streams do so, also before `message_start`); a silent
stream sends `ping` events, which Anthropic's clients expect, not SSE
comments. Usage: `message_start` carries the prompt's (`input_tokens`
less what the prefix cache read, `cache_read_input_tokens`), the final
`message_delta` the output's (and, from ours, the final prompt split).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from streamproxy.apis.anthropic import errors
from streamproxy.apis.spec import ApiSpec, Usage, count, positive
from streamproxy.core import sse
from streamproxy.errors import APIError

PING = sse.event_frame(b"ping", b'{"type":"ping"}')
# Anthropic's stop reasons in the access log's (serve's) words; others as they are.
FINISH = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length", "tool_use": "tool_calls"}


class _Anthropic(ApiSpec):
    name = "anthropic"
    done = (b"event: message_stop", b"event: error")  # (an error ends the stream: nothing follows it)
    deltas = (b"event: content_block_delta",)
    keepalive = PING
    finish = (b'"stop_reason":"', b'"stop_reason": "')  # message_delta's (message_start's is null)

    def read_finish(self, body: dict[str, Any], into: dict[int, str]) -> None:
        delta = body.get("delta")  # message_delta's; a non-stream Message has it at the top
        reason = delta.get("stop_reason") if isinstance(delta, dict) else body.get("stop_reason")
        if isinstance(reason, str):
            into[0] = FINISH.get(reason, reason)

    def read_usage(self, body: dict[str, Any], into: Usage) -> None:
        usage = body.get("usage")  # message_delta's, a non-stream Message's
        if usage is None:
            inner = body.get("message")  # message_start's
            usage = inner.get("usage") if isinstance(inner, dict) else None
        if not isinstance(usage, dict):
            return
        cached = count(usage.get("cache_read_input_tokens"))
        fresh = count(usage.get("input_tokens")) + count(usage.get("cache_creation_input_tokens"))
        if fresh or cached:
            into.prompt_tokens, into.cached_tokens = fresh + cached, cached
        into.completion_tokens = max(into.completion_tokens, count(usage.get("output_tokens")))
        into.billed = True

    def error(self, exc: APIError, sequence_number: int = 0, kept: Sequence[dict[str, Any]] = ()) -> bytes:
        return sse.event_frame(b"error", errors.error_json(exc))

    def cap(self, body: dict[str, Any]) -> tuple[int | None, int]:
        return positive(body.get("max_tokens")), 1


ANTHROPIC = _Anthropic()
