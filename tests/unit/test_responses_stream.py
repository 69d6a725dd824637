"""Responses API event mapper: scripted Deltas in, exact named SSE events out.

Every stream here is also validated event by event against the OpenAI SDK's
own pydantic models (`api_events.check_responses`), and its life cycle
(`responses_order`): created, in_progress, well-nested items, one ending.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from engine_adapter.base import Delta
from streamproxy.apis.responses.protocol import ReasoningEcho, Response, TextEcho, TextFormat
from streamproxy.apis.responses.stream import ResponsesEncoder
from streamproxy.core import blockstream
from streamproxy.errors import EngineError, ServerShuttingDown
from streamproxy.filters.base import CONTENT, Part
from streamproxy.filters.hermes import HermesParser
from streamproxy.filters.toolset import ToolSet
from tests.support.api_events import check_responses, responses_order, responses_text
from tests.support.sse import named_events


def shell(**kw) -> Response:
    args: dict[str, Any] = dict(
        id="resp_x",
        created_at=1700000000,
        status="in_progress",
        model="m",
        output=[],
        reasoning=ReasoningEcho(),
        text=TextEcho(format=TextFormat(type="text")),
    )
    args.update(kw)
    return Response(**args)


def encoder(filters=None, **kw) -> ResponsesEncoder:
    enc = ResponsesEncoder(shell(), filters, id_seed="t", **kw)
    enc.prompt_tokens = 7
    return enc


def run(enc: ResponsesEncoder, steps: list[list[Delta]], *, cached: int = 0) -> bytes:
    out = enc.start()
    for deltas in steps:
        out += enc.step(deltas)
    enc.cached_tokens = cached
    return out + enc.finish()


def frame(payload: dict) -> bytes:
    return b"event: " + payload["type"].encode() + b"\ndata: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


SHELL_JSON = {
    "id": "resp_x",
    "object": "response",
    "created_at": 1700000000,
    "status": "in_progress",
    "background": False,
    "error": None,
    "incomplete_details": None,
    "instructions": None,
    "max_output_tokens": None,
    "max_tool_calls": None,
    "model": "m",
    "output": [],
    "parallel_tool_calls": True,
    "previous_response_id": None,
    "reasoning": {"effort": None, "summary": None},
    "service_tier": "default",
    "store": False,
    "temperature": None,
    "text": {"format": {"type": "text"}},
    "tool_choice": "auto",
    "tools": [],
    "top_logprobs": 0,
    "top_p": None,
    "truncation": "disabled",
    "usage": None,
    "user": None,
    "metadata": {},
}


def test_exact_bytes_of_a_text_stream():
    body = run(encoder(), [[Delta(0, "Hel", 1)], [Delta(0, "lo", 1, "stop")]], cached=2)
    item = {"id": "msg_t0", "type": "message", "status": "in_progress", "role": "assistant", "content": []}
    where = {"item_id": "msg_t0", "output_index": 0, "content_index": 0}
    done_part = {"type": "output_text", "text": "Hello", "annotations": [], "logprobs": []}
    done_item = {**item, "status": "completed", "content": [done_part]}
    usage = {
        "input_tokens": 7,
        "input_tokens_details": {"cached_tokens": 2, "cache_write_tokens": 0},
        "output_tokens": 2,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 9,
    }
    expected: list[dict[str, Any]] = [
        {"type": "response.created", "response": SHELL_JSON},
        {"type": "response.in_progress", "response": SHELL_JSON},
        {"type": "response.output_item.added", "output_index": 0, "item": item},
        {"type": "response.content_part.added", **where, "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []}},
        {"type": "response.output_text.delta", **where, "delta": "Hel", "logprobs": []},
        {"type": "response.output_text.delta", **where, "delta": "lo", "logprobs": []},
        {"type": "response.output_text.done", **where, "text": "Hello", "logprobs": []},
        {"type": "response.content_part.done", **where, "part": done_part},
        {"type": "response.output_item.done", "output_index": 0, "item": done_item},
        {"type": "response.completed", "response": {**SHELL_JSON, "status": "completed", "output": [done_item], "usage": usage}},
    ]
    assert body == b"".join(frame({**e, "sequence_number": n}) for n, e in enumerate(expected))
    check_responses(named_events(body))


def test_one_step_is_one_bytes_object_and_nothing_for_an_empty_delta():
    enc = encoder()
    enc.start()
    assert enc.step([Delta(0, "", 1)]) == b""
    out = enc.step([Delta(0, "a", 1), Delta(0, "b", 1)])
    assert [e for e, _ in named_events(out)] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
    ]


TEXT = "Héllo, wörld! 👋 done"


@pytest.mark.parametrize("cut", range(len(TEXT.encode()) + 1))
def test_utf8_split_at_every_byte(cut):
    data = TEXT.encode()
    body = run(encoder(), [[Delta(0, data[:cut], 1)], [Delta(0, data[cut:], 1, "stop")]])
    events = named_events(body)
    check_responses(events)
    responses_order(events)
    assert responses_text(events) == TEXT
    final = events[-1][1]["response"]
    assert final["status"] == "completed"
    assert final["output"][0]["content"][0]["text"] == TEXT


def test_every_byte_its_own_step():
    body = run(encoder(), [[Delta(0, bytes([b]), 1)] for b in TEXT.encode()] + [[Delta(0, "", 0, "stop")]])
    events = named_events(body)
    check_responses(events)
    assert responses_text(events) == TEXT
    assert events[-1][1]["response"]["usage"]["output_tokens"] == len(TEXT.encode())


def test_length_ends_incomplete():
    body = run(encoder(), [[Delta(0, "cut", 1, "length")]])
    events = named_events(body)
    check_responses(events)
    responses_order(events)
    assert events[-1][0] == "response.incomplete"
    final = events[-1][1]["response"]
    assert final["status"] == "incomplete"
    assert final["incomplete_details"] == {"reason": "max_output_tokens"}
    assert final["output"][0]["status"] == "incomplete"
    item_done = [p for e, p in events if e == "response.output_item.done"]
    assert item_done[0]["item"]["status"] == "incomplete"


def test_no_output_at_all():
    body = run(encoder(), [[Delta(0, "", 1, "stop")]])
    events = named_events(body)
    check_responses(events)
    assert [e for e, _ in events] == ["response.created", "response.in_progress", "response.completed"]
    assert events[-1][1]["response"]["output"] == []


def test_finish_without_a_finish_reason_still_closes_the_item():
    enc = encoder()
    body = enc.start() + enc.step([Delta(0, "partial", 1)]) + enc.finish()
    events = named_events(body)
    check_responses(events)
    responses_order(events)
    assert events[-1][1]["response"]["output"][0]["content"][0]["text"] == "partial"


# -- tool calls --------------------------------------------------------------

TOOLS = ToolSet({"get_weather": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}})
MODEL_TEXT = 'Let me look. <tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


def hermes():
    return [HermesParser(TOOLS)]


@pytest.mark.parametrize("cut", range(0, len(MODEL_TEXT) + 1, 3))
def test_tool_call_split_anywhere(cut):
    steps = [[Delta(0, MODEL_TEXT[:cut], 1)], [Delta(0, MODEL_TEXT[cut:], 1)], [Delta(0, "", 0, "stop")]]
    events = named_events(run(encoder(hermes), steps))
    check_responses(events)
    responses_order(events)
    assert responses_text(events) == "Let me look."
    added = [p["item"] for e, p in events if e == "response.output_item.added"]
    assert [i["type"] for i in added] == ["message", "function_call"]
    call = added[1]
    assert call["name"] == "get_weather" and call["arguments"] == "" and call["status"] == "in_progress"
    assert call["call_id"].startswith("call_") and call["id"] == "fc_t1"
    args = "".join(p["delta"] for e, p in events if e == "response.function_call_arguments.delta")
    assert json.loads(args) == {"city": "Paris"}
    done = [p for e, p in events if e == "response.function_call_arguments.done"]
    assert done == [{"type": "response.function_call_arguments.done", "item_id": "fc_t1", "output_index": 1, "arguments": args, "sequence_number": done[0]["sequence_number"]}]
    final = events[-1][1]["response"]
    assert [o["type"] for o in final["output"]] == ["message", "function_call"]
    assert final["output"][1] == {**call, "status": "completed", "arguments": args}


def test_only_a_tool_call_has_no_message_item():
    text = '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
    events = named_events(run(encoder(hermes), [[Delta(0, c, 1)] for c in text] + [[Delta(0, "", 0, "stop")]]))
    check_responses(events)
    responses_order(events)
    assert [o["type"] for o in events[-1][1]["response"]["output"]] == ["function_call"]


# -- reasoning (the REASONING part kind, as the reasoning splitter will emit it) ----

REASONING = 99


class TildeReasoning:
    """A stand-in splitter: content starting with '~' is reasoning."""

    def feed(self, parts):
        return [Part(REASONING, p.text[1:]) if p.kind == CONTENT and p.text.startswith("~") else p for p in parts]

    def flush(self):
        return []

    def finish_reason(self, reason):
        return reason


def test_reasoning_items(monkeypatch):
    monkeypatch.setattr(blockstream, "REASONING", REASONING)
    steps = [[Delta(0, "~think", 1)], [Delta(0, "~ more", 1)], [Delta(0, "Answer", 1, "stop")]]
    events = named_events(run(encoder(lambda: [TildeReasoning()]), steps))
    check_responses(events)
    responses_order(events)
    names = [e for e, _ in events]
    assert names[2:9] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ]
    added = events[2][1]["item"]
    assert added == {"id": "rs_t0", "type": "reasoning", "summary": [], "content": [], "encrypted_content": None, "status": "in_progress"}
    assert events[3][1]["part"] == {"type": "reasoning_text", "text": ""}
    assert events[6][1]["text"] == "think more"
    final = events[-1][1]["response"]["output"]
    assert final[0]["content"] == [{"type": "reasoning_text", "text": "think more"}]
    assert final[1]["content"][0]["text"] == "Answer"
    assert responses_text(events) == "Answer"  # reasoning never leaks into output_text


def test_reasoning_kind_unknown_to_the_mapper_is_dropped_not_leaked():
    # Without the REASONING constant (today), a part of an unknown kind is not shown as text.
    steps = [[Delta(0, "~secret", 1)], [Delta(0, "Answer", 1, "stop")]]
    events = named_events(run(encoder(lambda: [TildeReasoning()]), steps))
    check_responses(events)
    assert responses_text(events) == "Answer"


# -- errors --------------------------------------------------------------------


def test_error_mid_stream_is_error_then_failed():
    enc = encoder()
    body = enc.start() + enc.step([Delta(0, "par", 1)]) + enc.error(EngineError("generation failed: boom"))
    events = named_events(body)
    check_responses(events)
    responses_order(events)
    names = [e for e, _ in events]
    assert names[-2:] == ["error", "response.failed"]
    err = events[-2][1]
    assert err["code"] == "engine_error" and err["message"] == "generation failed: boom" and err["param"] is None
    failed = events[-1][1]["response"]
    assert failed["status"] == "failed"
    assert failed["error"] == {"code": "server_error", "message": "generation failed: boom"}
    assert failed["output"][0]["status"] == "incomplete" and failed["output"][0]["content"][0]["text"] == "par"


def test_error_before_start_still_opens_the_response():
    enc = encoder()
    events = named_events(enc.error(ServerShuttingDown("draining")))
    check_responses(events)
    assert [e for e, _ in events] == ["response.created", "response.in_progress", "error", "response.failed"]


# -- non-stream ------------------------------------------------------------------


def test_non_stream_sink_renders_what_the_stream_completes_with():
    steps = [[Delta(0, MODEL_TEXT[:20], 3)], [Delta(0, MODEL_TEXT[20:], 4)], [Delta(0, "", 0, "stop")]]
    stream = encoder(hermes)
    events = named_events(run(stream, steps, cached=3))
    sink = encoder(hermes, emit=False)
    for deltas in steps:
        assert sink.step(deltas) == b""
    sink.cached_tokens = 3
    final = json.loads(sink.final_json())
    streamed = events[-1][1]["response"]
    # Call ids are random per parse; everything else agrees.
    for out in (final, streamed):
        out["output"][1]["call_id"] = "call_x"
    assert final == streamed
    assert sink.finish_reasons == ["tool_calls"] and sink.completion_tokens == 7
