"""The Responses and Anthropic Messages APIs on the real vLLM engine: plain text, stream and not.

Through the real SDKs (sync clients against the session's subprocess server)
and raw HTTP, every stream checked event by event against the SDKs' models.
"""

from __future__ import annotations

from typing import Any

import anthropic
import openai
import pytest
import requests
from anthropic.types import MessageParam

from tests.support.api_events import anthropic_order, anthropic_text, check_anthropic, check_responses, responses_order, responses_text
from tests.support.sdk import text_of
from tests.support.sse import named_events

pytestmark = pytest.mark.engine

QUESTION = "What is the capital of France? Answer in one sentence."


def test_responses_non_stream_and_stream(engine_server, model_name):
    api = openai.OpenAI(base_url=engine_server + "/v1", api_key="x", max_retries=0)
    resp = api.responses.create(model=model_name, input=QUESTION, max_output_tokens=30, temperature=0)
    assert resp.status in ("completed", "incomplete")
    assert resp.usage is not None and resp.usage.output_tokens >= 1
    assert resp.usage.total_tokens == resp.usage.input_tokens + resp.usage.output_tokens
    with api.responses.stream(model=model_name, input=QUESTION, max_output_tokens=30, temperature=0) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response() if resp.status == "completed" else None
    # Greedy decoding: the stream says what the non-stream answer said.
    assert "".join(deltas) == resp.output_text
    if final is not None:
        assert final.output_text == resp.output_text
        assert final.usage is not None and final.usage.input_tokens == resp.usage.input_tokens


def test_responses_raw_stream_events(engine_server, model_name):
    r = requests.post(
        engine_server + "/v1/responses",
        json={"model": model_name, "input": QUESTION, "instructions": "Be brief.", "max_output_tokens": 20, "stream": True, "temperature": 0},
        timeout=120,
    )
    assert r.status_code == 200 and r.headers["Content-Type"] == "text/event-stream"
    events = named_events(r.content)
    check_responses(events)
    responses_order(events)
    final = events[-1][1]["response"]
    assert final["output"][0]["content"][0]["text"] == responses_text(events)
    assert final["usage"]["output_tokens"] >= 1


def test_anthropic_create_stream_and_count(engine_server, model_name):
    api = anthropic.Anthropic(base_url=engine_server, api_key="x", max_retries=0)
    messages: list[MessageParam] = [{"role": "user", "content": QUESTION}]
    greedy: dict[str, Any] = {"extra_body": {"temperature": 0}}  # current SDKs no longer take `temperature` as an argument
    message = api.messages.create(model=model_name, max_tokens=30, messages=messages, **greedy)
    assert message.stop_reason in ("end_turn", "max_tokens")
    with api.messages.stream(model=model_name, max_tokens=30, messages=messages, **greedy) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == text_of(message.content[0]) == text_of(final.content[0])
    assert final.usage.output_tokens == message.usage.output_tokens
    counted = api.messages.count_tokens(model=model_name, messages=messages)
    billed = final.usage.input_tokens + (final.usage.cache_read_input_tokens or 0)
    assert counted.input_tokens == billed == message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0)


def test_anthropic_raw_stream_events(engine_server, model_name):
    r = requests.post(
        engine_server + "/v1/messages",
        json={
            "model": model_name,
            "max_tokens": 20,
            "system": "Be brief.",
            "messages": [{"role": "user", "content": QUESTION}],
            "stream": True,
            "temperature": 0,
        },
        headers={"anthropic-version": "2023-06-01"},
        timeout=120,
    )
    assert r.status_code == 200 and r.headers["Content-Type"] == "text/event-stream"
    events = named_events(r.content)
    check_anthropic(events)
    anthropic_order(events)
    assert isinstance(anthropic_text(events), str)
    delta = [p for e, p in events if e == "message_delta"][0]
    assert delta["delta"]["stop_reason"] in ("end_turn", "max_tokens") and delta["usage"]["output_tokens"] >= 1
