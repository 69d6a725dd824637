"""The newer APIs as their own SDKs see them (issue 5): the OpenAI Responses API
through `openai` (Codex's API) and the Anthropic Messages API through
`anthropic` (Claude Code's). The spec folder has no schemas for these, so the
SDKs' own typed parsing plus the event order are the check.

The fake engine only ends an answer at `max_tokens` (Responses: status
"incomplete", event `response.incomplete`; Anthropic: stop_reason
"max_tokens") or at a stop sequence; the real model ends on its own.
"""

from __future__ import annotations

from typing import Any

import anthropic
import openai

from tests.compat.conftest import Target
from tests.support.sdk import text_of


def test_openai_responses_create_and_stream(target: Target, wire):
    client = openai.OpenAI(base_url=target.v1, api_key="unused", http_client=wire.client(), max_retries=0)
    limit = 48 if target.real else 4
    r = client.responses.create(model=target.model, input="Say hello in five words.", max_output_tokens=limit, temperature=0)
    assert r.output_text, f"openai-python responses.create: output_text = {r.output_text!r}"
    assert r.status in ("completed", "incomplete"), f"openai-python responses.create: status = {r.status!r}"
    assert r.usage and r.usage.output_tokens <= limit and r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    if not target.real:
        assert (r.output_text, r.status, r.incomplete_details and r.incomplete_details.reason) == ("Hello! This is a", "incomplete", "max_output_tokens")
    with client.responses.stream(model=target.model, input="Say hello in five words.", max_output_tokens=limit, temperature=0) as stream:
        events = list(stream)
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"], f"openai-python responses stream: first events {types[:2]}"
    assert types[-1] in ("response.completed", "response.incomplete"), f"openai-python responses stream: last event {types[-1]}"
    assert types.count("response.output_text.done") == 1
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    last = events[-1]
    assert last.type in ("response.completed", "response.incomplete")
    assert deltas == last.response.output_text == r.output_text, f"openai-python responses stream: deltas {deltas!r}"
    seq = [e.sequence_number for e in events]
    assert seq == sorted(seq) and len(set(seq)) == len(seq), f"openai-python responses stream: sequence_number {seq}"


def test_anthropic_messages_create_and_stream(target: Target):
    client = anthropic.Anthropic(base_url=target.base, api_key="unused", max_retries=0)
    kw: dict[str, Any] = dict(model=target.model, max_tokens=48 if target.real else 4, messages=[{"role": "user", "content": "Say hello in five words."}], extra_body={"temperature": 0})
    m = client.messages.create(**kw)
    assert m.role == "assistant" and m.content and m.content[0].type == "text", f"anthropic messages.create: content = {m.content!r}"
    assert m.stop_reason in ("end_turn", "max_tokens"), f"anthropic: stop_reason = {m.stop_reason!r}"
    assert m.usage.output_tokens <= kw["max_tokens"] and m.usage.input_tokens > 0, f"anthropic: usage = {m.usage}"
    with client.messages.stream(**kw) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == text_of(final.content[0]) == text_of(m.content[0]), f"anthropic messages.stream: {text!r} vs create {m.content!r}"
    assert final.stop_reason == m.stop_reason and final.usage.output_tokens == m.usage.output_tokens
    if not target.real:
        stopped = client.messages.create(**{**kw, "max_tokens": 20}, stop_sequences=[" fake"])
        assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", " fake"), f"anthropic: {stopped.stop_reason!r} {stopped.stop_sequence!r}"
