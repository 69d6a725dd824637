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

from engine_adapter.fake import SCRIPT_IDS
from tests.support.block_cases import BODIES, CASES_BY_API, MESSAGES, RESPONSES, events, normalized, renumbered, script, stripped

_STEP_IDS = re.compile(rb',"token_ids":\[([0-9,]+)\]\}\n\n$')
CASES = [(api, case) for api, cases in CASES_BY_API.items() for case in cases]


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
