"""Responses and Anthropic Messages requests of the continuation cases (tests/support/continued.py), and
helpers that read their event streams (serve's tests and the gateway's).

`REQUESTS[api](fields)`: the path and body of a stream of that API asking what the chat case's `fields`
ask (its tools in the API's own shape). `normalized` makes what is random or timed per answer equal:
Responses' `created_at`.
"""

from __future__ import annotations

import re
from typing import Any

from engine_adapter.fake import FakeScript
from tests.support.continued import CASES, REASONING_TOKENS, WEATHER

RESPONSES, MESSAGES = "/v1/responses", "/v1/messages"
_CREATED_AT = re.compile(rb'"created_at":\d+')
_SEQ = re.compile(rb'"sequence_number":(\d+)')
IDS = re.compile(rb',"(prompt_)?token_ids":\[[0-9,]*\]')


def responses_body(fields: dict[str, Any], **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "fake", "input": "hi", "stream": True, "max_output_tokens": 100, **extra}
    if "tools" in fields:
        body["tools"] = [{"type": "function", "name": "get_weather", "parameters": WEATHER}]
    return body


def messages_body(fields: dict[str, Any], **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 100, **extra}
    if "tools" in fields:
        body["tools"] = [{"name": "get_weather", "input_schema": WEATHER}]
    return body


BODIES = {RESPONSES: responses_body, MESSAGES: messages_body}

# Plain text, and the chat cases. On Responses the reasoning case's character split over two tokens is
# one token: its items' `.done` events repeat their whole text, and a continuation cut right after the
# first half reads the earlier tokens' text as vLLM's detokenizer does (core/continuation.pieces: a token
# that ends inside a character says nothing), where the fake engine's byte tokens sent the text before
# the character at once: the primed item would lack it (Messages repeats no text: it takes the split).
_WHOLE_CHARACTER = [*REASONING_TOKENS[:9], " café", *REASONING_TOKENS[11:]]
CASES_BY_API: dict[str, dict[str, tuple[list[str | bytes], dict[str, Any], dict[str, Any]]]] = {
    MESSAGES: {"text": (["Hel", "lo", " world"], {}, {}), **CASES},
    RESPONSES: {"text": (["Hel", "lo", " world"], {}, {}), "tool-calls": CASES["tool-calls"],
                "reasoning": (_WHOLE_CHARACTER, CASES["reasoning"][1], {})},
}


def script(api: str, case: str) -> FakeScript:
    return FakeScript(tokens=CASES_BY_API[api][case][0])


def normalized(raw: bytes) -> bytes:
    return _CREATED_AT.sub(b'"created_at":0', raw)


def events(raw: bytes) -> list[bytes]:
    return [e + b"\n\n" for e in raw.split(b"\n\n") if e]


def renumbered(raw: bytes, start: int) -> bytes:
    """A Responses stream's events numbered from `start` on, in order."""
    count = iter(range(start, start + 1_000_000))
    return _SEQ.sub(lambda m: b'"sequence_number":%d' % next(count), raw)


def stripped(raw: bytes) -> bytes:
    return IDS.sub(b"", raw)
