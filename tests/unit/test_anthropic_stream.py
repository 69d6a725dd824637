"""Anthropic Messages event mapper: scripted Deltas in, exact named SSE events out.

Every stream is validated event by event against the Anthropic SDK's own
pydantic models (`api_events.check_anthropic`) and its life cycle
(`anthropic_order`); the non-stream `Message` against `anthropic.types.Message`.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic.types as at
import pytest

from engine_adapter.base import Delta
from streamproxy.apis.anthropic.stream import PING, AnthropicEncoder
from streamproxy.core import blockstream
from streamproxy.errors import EngineError, InvalidRequest, RateLimited, ServiceUnavailable
from streamproxy.filters.base import CONTENT, Part
from streamproxy.filters.hermes import HermesParser
from streamproxy.filters.toolset import ToolSet
from tests.support.api_events import anthropic_order, anthropic_text, check_anthropic
from tests.support.sdk import text_of
from tests.support.sse import named_events


def encoder(filters=None, **kw) -> AnthropicEncoder:
    enc = AnthropicEncoder(message_id="msg_x", model="m", filters=filters, **kw)
    enc.prompt_tokens = 7
    return enc


def run(enc: AnthropicEncoder, steps: list[list[Delta]], *, cached: int = 0) -> bytes:
    out = enc.start()
    for deltas in steps:
        out += enc.step(deltas)
    enc.cached_tokens = cached
    return out + enc.finish()


def frame(payload: dict) -> bytes:
    return b"event: " + payload["type"].encode() + b"\ndata: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def test_exact_bytes_of_a_text_stream():
    body = run(encoder(), [[Delta(0, "Hel", 1)], [Delta(0, "lo", 1, "stop")]], cached=3)
    start_usage = {"input_tokens": 7, "output_tokens": 0, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
    message: dict[str, Any] = {
        "id": "msg_x",
        "type": "message",
        "role": "assistant",
        "model": "m",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": start_usage,
    }
    expected: list[dict[str, Any]] = [
        {"type": "message_start", "message": message},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hel"}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "lo"}},
        {"type": "content_block_stop", "index": 0},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
            "usage": {"input_tokens": 4, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 3, "output_tokens": 2},
        },
        {"type": "message_stop"},
    ]
    assert body == b"".join(frame(e) for e in expected)
    check_anthropic(named_events(body))


def test_ping_is_the_keepalive():
    assert AnthropicEncoder.keepalive == PING == frame({"type": "ping"})
    assert encoder().keepalive == PING


TEXT = "Héllo, wörld! 👋 done"


@pytest.mark.parametrize("cut", range(len(TEXT.encode()) + 1))
def test_utf8_split_at_every_byte(cut):
    data = TEXT.encode()
    events = named_events(run(encoder(), [[Delta(0, data[:cut], 1)], [Delta(0, data[cut:], 1, "stop")]]))
    check_anthropic(events)
    anthropic_order(events)
    assert anthropic_text(events) == TEXT


@pytest.mark.parametrize(
    ("reason", "capped", "expected"),
    [("stop", False, "end_turn"), ("length", False, "max_tokens"), ("length", True, "model_context_window_exceeded"), ("abort", False, "end_turn")],
)
def test_stop_reasons(reason, capped, expected):
    enc = encoder(window_capped=capped)
    events = named_events(run(enc, [[Delta(0, "x", 1, reason)]]))
    check_anthropic(events)
    delta = [p for e, p in events if e == "message_delta"][0]
    assert delta["delta"] == {"stop_reason": expected, "stop_sequence": None}
    assert enc.finish_reasons == [expected]


STOP_TEXT = "alpha beta ENDgamma"


@pytest.mark.parametrize("cut", range(len("alpha beta END") + 1))
def test_stop_sequence_named_and_stripped_at_every_split(cut):
    # The engine keeps the stop string in its output (include_stop_str_in_output) and stops on it.
    text = "alpha beta END"
    enc = encoder(stop_sequences=["END", "ND", "zzzz"])
    events = named_events(run(enc, [[Delta(0, text[:cut], 1)], [Delta(0, text[cut:], 1, "stop")]]))
    check_anthropic(events)
    anthropic_order(events)
    assert anthropic_text(events) == "alpha beta "
    delta = [p for e, p in events if e == "message_delta"][0]["delta"]
    assert delta == {"stop_reason": "stop_sequence", "stop_sequence": "END"}


def test_stop_sequences_given_but_not_hit():
    enc = encoder(stop_sequences=["END"])
    events = named_events(run(enc, [[Delta(0, "all of it", 1, "stop")]]))
    assert anthropic_text(events) == "all of it"
    assert [p for e, p in events if e == "message_delta"][0]["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}


# -- tool use ----------------------------------------------------------------------

TOOLS = ToolSet({"get_weather": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}})
MODEL_TEXT = 'Checking. <tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


def hermes():
    return [HermesParser(TOOLS)]


@pytest.mark.parametrize("cut", range(0, len(MODEL_TEXT) + 1, 3))
def test_tool_use_split_anywhere(cut):
    steps = [[Delta(0, MODEL_TEXT[:cut], 1)], [Delta(0, MODEL_TEXT[cut:], 1)], [Delta(0, "", 0, "stop")]]
    events = named_events(run(encoder(hermes), steps))
    check_anthropic(events)
    anthropic_order(events)
    assert anthropic_text(events) == "Checking."
    starts = [p["content_block"] for e, p in events if e == "content_block_start"]
    assert starts[0] == {"type": "text", "text": ""}
    assert starts[1]["type"] == "tool_use" and starts[1]["name"] == "get_weather" and starts[1]["input"] == {}
    assert starts[1]["id"].startswith("toolu_")
    partial = "".join(p["delta"]["partial_json"] for e, p in events if e == "content_block_delta" and p["delta"]["type"] == "input_json_delta")
    assert json.loads(partial) == {"city": "Paris"}
    assert [p for e, p in events if e == "message_delta"][0]["delta"]["stop_reason"] == "tool_use"


def test_sdk_accumulates_the_stream_into_the_non_stream_message():
    from anthropic.lib.streaming._messages import accumulate_event

    steps = [[Delta(0, c, 1)] for c in MODEL_TEXT] + [[Delta(0, "", 0, "stop")]]
    events = named_events(run(encoder(hermes), steps, cached=2))
    snapshot = None
    bufs: dict = {}
    for event in check_anthropic(events):
        snapshot = accumulate_event(event=event, current_snapshot=snapshot, json_bufs=bufs)
    sink = encoder(hermes, emit=False)
    for deltas in steps:
        assert sink.step(deltas) == b""
    sink.cached_tokens = 2
    message = at.Message.model_validate_json(sink.final_json())
    assert snapshot is not None
    assert message.content[0].type == snapshot.content[0].type == "text"
    assert text_of(message.content[0]) == text_of(snapshot.content[0]) == "Checking."
    call, snapshot_call = message.content[1], snapshot.content[1]
    assert isinstance(call, at.ToolUseBlock) and isinstance(snapshot_call, at.ToolUseBlock)
    assert call.name == snapshot_call.name and call.input == snapshot_call.input == {"city": "Paris"}
    assert (message.stop_reason, message.usage.input_tokens, message.usage.cache_read_input_tokens, message.usage.output_tokens) == (
        snapshot.stop_reason,
        snapshot.usage.input_tokens,
        snapshot.usage.cache_read_input_tokens,
        snapshot.usage.output_tokens,
    ) == ("tool_use", 5, 2, len(MODEL_TEXT))


def test_a_call_cut_off_by_max_tokens_has_an_empty_input():
    from streamproxy.filters.constrained import NamedToolEmitter

    sink = encoder(lambda: [NamedToolEmitter("get_weather")], emit=False)
    sink.step([Delta(0, '{"city": "Par', 5, "length")])
    message = at.Message.model_validate_json(sink.final_json())
    assert message.stop_reason == "max_tokens"
    assert message.content[0].type == "tool_use" and message.content[0].input == {}


# -- thinking --------------------------------------------------------------------------

REASONING = 99


class TildeReasoning:
    def feed(self, parts):
        return [Part(REASONING, p.text[1:]) if p.kind == CONTENT and p.text.startswith("~") else p for p in parts]

    def flush(self):
        return []

    def finish_reason(self, reason):
        return reason


def test_thinking_blocks(monkeypatch):
    monkeypatch.setattr(blockstream, "REASONING", REASONING)
    steps = [[Delta(0, "~hmm", 1)], [Delta(0, "~ ok", 1)], [Delta(0, "Answer", 1, "stop")]]
    events = named_events(run(encoder(lambda: [TildeReasoning()]), steps))
    check_anthropic(events)
    anthropic_order(events)
    assert events[1][1] == {"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": "", "signature": ""}}
    thinking = [p["delta"] for e, p in events if e == "content_block_delta" and p["delta"]["type"] == "thinking_delta"]
    assert thinking == [{"type": "thinking_delta", "thinking": "hmm"}, {"type": "thinking_delta", "thinking": " ok"}]
    assert anthropic_text(events) == "Answer"
    sink = encoder(lambda: [TildeReasoning()], emit=False)
    for deltas in steps:
        sink.step(deltas)
    message = at.Message.model_validate_json(sink.final_json())
    assert [b.type for b in message.content] == ["thinking", "text"]
    block = message.content[0]
    assert isinstance(block, at.ThinkingBlock) and block.thinking == "hmm ok" and block.signature == ""


# -- errors ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (EngineError("generation failed"), "api_error"),
        (ServiceUnavailable("busy"), "overloaded_error"),
        (RateLimited("slow down"), "rate_limit_error"),
        (InvalidRequest("bad", param="max_tokens"), "invalid_request_error"),
    ],
)
def test_error_event(exc, kind):
    enc = encoder()
    body = enc.start() + enc.step([Delta(0, "part", 1)]) + enc.error(exc)
    events = named_events(body)
    check_anthropic(events)
    anthropic_order(events)
    assert events[-1][0] == "error"
    assert events[-1][1]["error"]["type"] == kind
    assert events[-1][1]["error"]["message"].endswith(exc.message)


def test_error_before_start_is_only_the_error_event():
    events = named_events(encoder().error(ServiceUnavailable("queue timeout")))
    assert [e for e, _ in events] == ["error"]
