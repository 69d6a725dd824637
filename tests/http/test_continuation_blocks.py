"""`return_token_ids` and `continue_token_ids` on serve's Responses and Anthropic Messages streams.

For each scripted answer (plain text, and tests/support/continued.py's tool calls and reasoning) and
each cut k, the continuation with the first k generated ids streams exactly the events the unbroken
stream sent after the step it cuts (no opening events; Responses' numbered from 0, the gateway numbers
them on), its ids included when k ends a step; asked for nothing, the stream's bytes are the asked
stream's without the ids. Then what each API refuses: OpenAI-shaped 400s on Responses, Anthropic-shaped
on Messages, naming the field.
"""

from __future__ import annotations

import re
from typing import Any

import orjson
import pytest

from engine_adapter.fake import SCRIPT_IDS, FakeScript
from tests.support.block_cases import BODIES, CASES_BY_API, MESSAGES, RESPONSES, events, normalized, renumbered, script, stripped

_STEP_IDS = re.compile(rb',"token_ids":\[([0-9,]+)\]\}\n\n$')
CASES = [(api, case) for api, cases in CASES_BY_API.items() for case in cases]

# A text stream asked for nothing (X-Request-Id req-1, created_at made 0): the bytes as before this
# server took ids on these routes, but for the item's id, which follows from the response's now.
SHELL = b'{"id":"resp_req-1","object":"response","created_at":0,"status":"in_progress","background":false,"error":null,"incomplete_details":null,"instructions":null,"max_output_tokens":null,"max_tool_calls":null,"model":"fake","output":[],"parallel_tool_calls":true,"previous_response_id":null,"reasoning":{"effort":null,"summary":null},"service_tier":"default","store":false,"temperature":null,"text":{"format":{"type":"text"}},"tool_choice":"auto","tools":[],"top_logprobs":0,"top_p":null,"truncation":"disabled","usage":null,"user":null,"metadata":{}}'
_RESPONSES_EVENTS = (
    b'event: response.created\ndata: {"type":"response.created","response":%(shell)s,"sequence_number":0}\n\n'
    b'event: response.in_progress\ndata: {"type":"response.in_progress","response":%(shell)s,"sequence_number":1}\n\n'
    b'event: response.output_item.added\ndata: {"type":"response.output_item.added","output_index":0,"item":{"id":"msg_88124d8d6dcb0","type":"message","status":"in_progress","role":"assistant","content":[]},"sequence_number":2}\n\n'
    b'event: response.content_part.added\ndata: {"type":"response.content_part.added","item_id":"msg_88124d8d6dcb0","output_index":0,"content_index":0,"part":{"type":"output_text","text":"","annotations":[],"logprobs":[]},"sequence_number":3}\n\n'
    b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","item_id":"msg_88124d8d6dcb0","output_index":0,"content_index":0,"delta":"Hel","logprobs":[],"sequence_number":4}\n\n'
    b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","item_id":"msg_88124d8d6dcb0","output_index":0,"content_index":0,"delta":"lo","logprobs":[],"sequence_number":5}\n\n'
    b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","item_id":"msg_88124d8d6dcb0","output_index":0,"content_index":0,"delta":" world","logprobs":[],"sequence_number":6}\n\n'
    b'event: response.output_text.done\ndata: {"type":"response.output_text.done","item_id":"msg_88124d8d6dcb0","output_index":0,"content_index":0,"text":"Hello world","logprobs":[],"sequence_number":7}\n\n'
    b'event: response.content_part.done\ndata: {"type":"response.content_part.done","item_id":"msg_88124d8d6dcb0","output_index":0,"content_index":0,"part":{"type":"output_text","text":"Hello world","annotations":[],"logprobs":[]},"sequence_number":8}\n\n'
    b'event: response.output_item.done\ndata: {"type":"response.output_item.done","output_index":0,"item":{"id":"msg_88124d8d6dcb0","type":"message","status":"completed","role":"assistant","content":[{"type":"output_text","text":"Hello world","annotations":[],"logprobs":[]}]},"sequence_number":9}\n\n'
    b'event: response.completed\ndata: {"type":"response.completed","response":{"id":"resp_req-1","object":"response","created_at":0,"status":"completed","background":false,"error":null,"incomplete_details":null,"instructions":null,"max_output_tokens":null,"max_tool_calls":null,"model":"fake","output":[{"id":"msg_88124d8d6dcb0","type":"message","status":"completed","role":"assistant","content":[{"type":"output_text","text":"Hello world","annotations":[],"logprobs":[]}]}],"parallel_tool_calls":true,"previous_response_id":null,"reasoning":{"effort":null,"summary":null},"service_tier":"default","store":false,"temperature":null,"text":{"format":{"type":"text"}},"tool_choice":"auto","tools":[],"top_logprobs":0,"top_p":null,"truncation":"disabled","usage":{"input_tokens":24,"input_tokens_details":{"cached_tokens":0,"cache_write_tokens":0},"output_tokens":3,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":27},"user":null,"metadata":{}},"sequence_number":10}\n\n'
)
MESSAGES_GOLDEN = (
    b'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_req-1","type":"message","role":"assistant","model":"fake","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":24,"output_tokens":0,"cache_creation_input_tokens":0,"cache_read_input_tokens":0}}}\n\n'
    b'event: content_block_start\ndata: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}\n\n'
    b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hel"}}\n\n'
    b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"lo"}}\n\n'
    b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" world"}}\n\n'
    b'event: content_block_stop\ndata: {"type":"content_block_stop","index":0}\n\n'
    b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"input_tokens":24,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":3}}\n\n'
    b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
)
COMPLETED = SHELL.replace(b'"status":"in_progress"', b'"status":"completed"').replace(
    b'"usage":null', b'"usage":{"input_tokens":24,"input_tokens_details":{"cached_tokens":0,"cache_write_tokens":0},"output_tokens":3,'
    b'"output_tokens_details":{"reasoning_tokens":0},"total_tokens":27}').replace(
    b'"output":[]', b'"output":[{"id":"msg_88124d8d6dcb0","type":"message","status":"completed","role":"assistant","content":'
    b'[{"type":"output_text","text":"Hello world","annotations":[],"logprobs":[]}]}]')
RESPONSES_GOLDEN = _RESPONSES_EVENTS.replace(b"%(shell)s", SHELL, 2).replace(b"%(shell)s", COMPLETED)


async def post(client, path: str, body: dict[str, Any]) -> tuple[bytes, Any]:
    r = await client.post(path, json=body, headers={"X-Request-Id": "req-1"})
    assert r.status == 200, await r.text()
    return normalized(await r.read()), r.headers


def steps(raw: bytes) -> tuple[bytes, list[tuple[bytes, int]]]:
    """The opening events, and each step's events with how many ids end them (a step's ids are on its last
    event; the events before it, marked open, and the steps that sent nothing belong to it)."""
    out = events(raw)
    at = next(i for i, e in enumerate(out) if b'"prompt_token_ids":' in e) + 1
    assert all(e.endswith(b',"token_ids":[]}\n\n') for e in out[: at - 1])  # (the opening's others are open)
    groups, pending = [], b""
    for event in out[at:]:
        pending += event
        found = _STEP_IDS.search(event)
        if found:
            groups.append((pending, len(found[1].split(b","))))
            pending = b""
    assert not pending
    return b"".join(out[:at]), groups


@pytest.mark.parametrize(("api", "case"), CASES)
async def test_a_continuation_after_any_token_streams_what_the_unbroken_stream_sent_after_its_step(serve, api, case):
    tokens, settings, fields = CASES_BY_API[api][case]
    client, engine = await serve(script(api, case), **settings)
    body = BODIES[api](fields, return_token_ids=True)
    whole, headers = await post(client, api, body)
    assert headers["Streamproxy-Continuation"] == "continue_token_ids"
    prompt = engine.submitted[-1][1]
    opening, groups = steps(whole)
    assert orjson.loads(opening.split(b"data: ")[-1].split(b"\n")[0])["prompt_token_ids"] == prompt
    assert sum(n for _, n in groups) == len(tokens)
    if case != "text":
        assert (b"function_call" in whole or b"tool_use" in whole) if case == "tool-calls" else (b"reasoning" in whole or b"thinking" in whole)
    generated = [SCRIPT_IDS + i for i in range(len(tokens))]
    plain, plain_headers = await post(client, api, {**body, "return_token_ids": False})
    assert plain == stripped(whole) and "Streamproxy-Continuation" not in plain_headers  # asked for nothing: no ids, same bytes
    start = 0
    for g, (_, n) in enumerate(groups):
        after = b"".join(e for e, _ in groups[g:])
        after = renumbered(after, 0) if api == RESPONSES else after
        for k in range(start, start + n):
            got, _ = await post(client, api, {**body, "continue_token_ids": generated[:k]})
            assert stripped(got) == stripped(after), (k, g)
            if k == start:  # the cut ends a step: its ids are the unbroken stream's too
                assert got == after, k
            assert engine.submitted[-1][1] == [*prompt, *generated[:k]] and engine.submitted[-1][2].max_tokens == 100 - k
        start += n
    # Not asked for ids, a continuation's bytes are the unasked stream's after the cut.
    cut = groups[0][1]
    rest, _ = await post(client, api, {**body, "return_token_ids": False, "continue_token_ids": generated[:cut]})
    expect = stripped(b"".join(e for e, _ in groups[1:]))
    assert rest == (renumbered(expect, 0) if api == RESPONSES else expect)


@pytest.mark.parametrize("api", [RESPONSES, MESSAGES])
async def test_a_stream_that_asks_nothing_is_the_golden_bytes_and_one_that_asks_has_the_ids_on_its_events(serve, api):
    client, engine = await serve(FakeScript(tokens=["Hel", "lo", " world"], token_delay=0.01))
    body = {"model": "fake", "input": "hi", "stream": True} if api == RESPONSES else \
        {"model": "fake", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    plain, _ = await post(client, api, body)
    golden = RESPONSES_GOLDEN if api == RESPONSES else MESSAGES_GOLDEN
    assert plain == golden
    asked, _ = await post(client, api, {**body, "return_token_ids": True})
    prompt = b',"prompt_token_ids":' + orjson.dumps(engine.submitted[-1][1])
    hel, lo, world = (b',"token_ids":[%d]' % (SCRIPT_IDS + i) for i in range(3))
    opened = b',"token_ids":[]'
    # Responses: created, in_progress, item and part added, the three deltas, the three done events, completed;
    # Messages: message_start, block start, the three deltas, block stop, message_delta, message_stop.
    # " world" finishes: its step's events stay open, its id comes on the last event.
    marks = [opened, prompt, opened, opened, hel, lo, opened, opened, opened, opened, world] if api == RESPONSES else \
        [prompt, opened, hel, lo, opened, opened, opened, world]
    expect = b"".join(e[:-3] + mark + b"}\n\n" for e, mark in zip(events(golden), marks, strict=True))
    assert asked == expect


def _openai(status: int, raw: bytes) -> tuple[int, str | None, str]:
    error = orjson.loads(raw)["error"]
    assert error["type"] == "invalid_request_error"
    return status, error["param"], error["message"]


def _anthropic(status: int, raw: bytes) -> tuple[int, str | None, str]:
    data = orjson.loads(raw)
    assert data["type"] == "error" and data["error"]["type"] == "invalid_request_error"
    message = data["error"]["message"]
    return status, message.split("'")[1], message  # (Anthropic's shape has no param: the message names it)


REFUSED = [
    (RESPONSES, {"stream": False}, "continue_token_ids", "stream"),
    (RESPONSES, {"stream": False, "continue_token_ids": None, "return_token_ids": True}, "return_token_ids", "streams"),
    (RESPONSES, {"background": True}, "continue_token_ids", "background"),
    (RESPONSES, {"background": True, "continue_token_ids": None, "return_token_ids": True}, "return_token_ids", "background"),
    (RESPONSES, {"text": {"format": {"type": "json_object"}}}, "continue_token_ids", "structured outputs"),
    (RESPONSES, {"tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}], "tool_choice": "required"},
     "continue_token_ids", "structured outputs"),
    (RESPONSES, {"continue_token_ids": [1, 0x110000]}, "continue_token_ids", "vocabulary"),
    (RESPONSES, {"continue_token_ids": [1, 2, 3]}, "continue_token_ids", "nothing is left"),
    (MESSAGES, {"stream": False}, "continue_token_ids", "stream"),
    (MESSAGES, {"stream": False, "continue_token_ids": None, "return_token_ids": True}, "return_token_ids", "streams"),
    (MESSAGES, {"stop_sequences": ["x"]}, "continue_token_ids", "stop strings"),
    (MESSAGES, {"continue_token_ids": [1, 0x110000]}, "continue_token_ids", "vocabulary"),
    (MESSAGES, {"continue_token_ids": [1, 2, 3]}, "continue_token_ids", "nothing is left"),
]


@pytest.mark.parametrize(("api", "extra", "param", "why"), REFUSED)
async def test_what_cannot_be_continued_or_carry_ids_is_a_400_in_the_api_s_shape(serve, api, extra, param, why):
    client, _ = await serve()
    cap = {"max_output_tokens": 3} if api == RESPONSES else {"max_tokens": 3}
    body = {k: v for k, v in {**BODIES[api]({}, continue_token_ids=[SCRIPT_IDS], **cap), **extra}.items() if v is not None}
    r = await client.post(api, json=body)
    shape = _openai if api == RESPONSES else _anthropic
    status, named, message = shape(r.status, await r.read())
    assert (status, named) == (400, param) and why in message, message
    r = await client.post(api, json={**body, "continue_token_ids": ["a"]})
    assert r.status == 400 and "continue_token_ids" in (await r.text())
