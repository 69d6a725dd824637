"""Test support for the Responses and Anthropic event streams: check, validate.

The events come from `tests.support.sse.named_events(body)`: `(event, payload)`
pairs, the framing already asserted.

`check_responses(events)` validates every payload against the OpenAI SDK's own
pydantic model for its type (strictly: a wrong or missing field fails) and
checks the sequence numbers count 0, 1, 2, ...; `check_anthropic(events)` does
the same with the Anthropic SDK's models. `responses_order(events)` and
`anthropic_order(events)` check the life cycle: what may follow what.
"""

from __future__ import annotations

import typing
from functools import lru_cache
from typing import Any

import anthropic.types as at
from openai.types import responses as ot


def _by_type(union: Any) -> dict[str, Any]:
    classes = typing.get_args(typing.get_args(union)[0])
    return {typing.get_args(cls.model_fields["type"].annotation)[0]: cls for cls in classes}


@lru_cache(maxsize=1)
def _openai_models() -> dict[str, Any]:
    return _by_type(ot.ResponseStreamEvent)


@lru_cache(maxsize=1)
def _anthropic_models() -> dict[str, Any]:
    return _by_type(at.RawMessageStreamEvent)


def check_responses(events: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    models = _openai_models()
    parsed = []
    for n, (event, payload) in enumerate(events):
        assert payload["sequence_number"] == n, (n, event, payload)
        parsed.append(models[event].model_validate(payload))
    return parsed


def check_anthropic(events: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    models = _anthropic_models()
    parsed = []
    for event, payload in events:
        if event == "ping":
            assert payload == {"type": "ping"}
            continue
        if event == "error":
            assert set(payload) == {"type", "error"} and set(payload["error"]) == {"type", "message"}, payload
            continue
        parsed.append(models[event].model_validate(payload))
    return parsed


def responses_order(events: list[tuple[str, dict[str, Any]]]) -> None:
    """created, in_progress, then well-nested items (added ... done, one at a time), then the end."""
    names = [e for e, _ in events]
    assert names[:2] == ["response.created", "response.in_progress"], names[:3]
    end = names[-1]
    assert end in ("response.completed", "response.incomplete", "response.failed"), end
    open_item: int | None = None
    next_index = 0
    for name, payload in events[2:-1]:
        if name == "response.output_item.added":
            assert open_item is None, "an item opened while another is open"
            assert payload["output_index"] == next_index
            open_item = next_index
            next_index += 1
        elif name == "response.output_item.done":
            assert payload["output_index"] == open_item
            open_item = None
        elif name == "error":
            assert end == "response.failed"
        else:
            assert "output_index" in payload and payload["output_index"] == open_item, (name, payload, open_item)
    assert open_item is None or end == "response.failed"
    final = events[-1][1]["response"]
    assert len(final["output"]) == next_index


def anthropic_order(events: list[tuple[str, dict[str, Any]]]) -> None:
    """message_start, well-nested blocks with indices 0, 1, ..., message_delta, message_stop."""
    names = [e for e, _ in events if e != "ping"]
    body = [(e, p) for e, p in events if e != "ping"]
    assert names[0] == "message_start", names[:2]
    if names[-1] == "error":
        return
    assert names[-2:] == ["message_delta", "message_stop"], names[-3:]
    open_block: int | None = None
    next_index = 0
    for name, payload in body[1:-2]:
        if name == "content_block_start":
            assert open_block is None and payload["index"] == next_index
            open_block = next_index
            next_index += 1
        elif name == "content_block_stop":
            assert payload["index"] == open_block
            open_block = None
        else:
            assert name == "content_block_delta" and payload["index"] == open_block, (name, payload)
    assert open_block is None


def responses_text(events: list[tuple[str, dict[str, Any]]]) -> str:
    return "".join(p["delta"] for e, p in events if e == "response.output_text.delta")


def anthropic_text(events: list[tuple[str, dict[str, Any]]]) -> str:
    return "".join(p["delta"]["text"] for e, p in events if e == "content_block_delta" and p["delta"]["type"] == "text_delta")
