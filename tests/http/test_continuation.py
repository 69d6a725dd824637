"""`continue_token_ids` on serve: a stream that goes on after the ids it already generated.

For each scripted answer a parser shapes (tests/support/continued.py) and each cut k, the
continuation with the first k generated ids streams exactly what the unbroken stream sent after the
chunks of those k tokens (no role chunk, the filters' state brought forward), with the whole answer's
usage; the engine got the prompt and the ids as its prompt and `max_tokens` less k. Then what it
refuses, each an OpenAI 400 naming `continue_token_ids`.
"""

from __future__ import annotations

from typing import Any

import pytest

from engine_adapter.fake import SCRIPT_IDS, FakeScript
from tests.http.http_support import normalize_created
from tests.support import USER_HI, sse
from tests.support.continued import CASES, same_calls, script

CHAT = "/v1/chat/completions"


async def post(client, path: str, body: dict[str, Any]) -> bytes:
    r = await client.post(path, json=body, headers={"X-Request-Id": "req-1"})
    assert r.status == 200, await r.text()
    return same_calls(normalize_created(await r.read())[0])


def steps(raw: bytes) -> tuple[bytes, list[bytes], bytes]:
    """A stream with ids: its role chunk, the chunks of each generated token (a step's ids are on its last
    chunk: a chunk with none of its own belongs to the token after), and its end (usage and [DONE])."""
    events = [e + b"\n\n" for e in raw.split(b"\n\n") if e]
    role, groups, end, pending = events[0], list[bytes](), b"", b""
    for event in events[1:]:
        if event.startswith(b"data: [DONE]") or b'"choices":[]' in event:
            end += event
        elif b'"token_ids":[]' in event:
            pending += event
        else:
            groups.append(pending + event)
            pending = b""
    assert not pending
    return role, groups, end


@pytest.mark.parametrize("case", list(CASES))
async def test_a_continuation_after_any_token_streams_what_the_unbroken_stream_sent_after_it(serve, case):
    tokens, settings, fields = CASES[case]
    client, engine = await serve(script(case), **settings)
    body = {"messages": USER_HI, "stream": True, "return_token_ids": True, "max_tokens": 100,
            "stream_options": {"include_usage": True}, **fields}
    whole = await post(client, CHAT, body)
    prompt = engine.submitted[-1][1]
    role, groups, end = steps(whole)
    assert len(groups) == len(tokens) and (b"tool_calls" in whole or b"reasoning" in whole)
    generated = [SCRIPT_IDS + i for i in range(len(tokens))]
    for k in range(len(tokens)):
        got = await post(client, CHAT, {**body, "continue_token_ids": generated[:k]})
        assert got == b"".join(groups[k:]) + end, k
        assert engine.submitted[-1][1] == [*prompt, *generated[:k]] and engine.submitted[-1][2].max_tokens == 100 - k
    # Without ids asked for, the continuation's bytes are the unasked stream's, after the cut.
    plain = await post(client, CHAT, {**body, "return_token_ids": False, "continue_token_ids": generated[:3]})
    assert b"token_ids" not in plain and sse.payloads(plain)[-1]["usage"]["completion_tokens"] == len(tokens)


async def test_a_completions_continuation_cut_inside_a_character_sends_it_whole(serve):
    client, engine = await serve(FakeScript(tokens=["It", b" caf\xc3", b"\xa9", "!"]))
    body = {"prompt": "hi", "stream": True, "max_tokens": 10}
    whole = sse.payloads(await post(client, "/v1/completions", body))
    assert [c["choices"][0]["text"] for c in whole] == ["It", " caf", "é", "!", ""]
    got = sse.payloads(await post(client, "/v1/completions", {**body, "continue_token_ids": [SCRIPT_IDS, SCRIPT_IDS + 1]}))
    assert [c["choices"][0]["text"] for c in got] == ["é", "!", ""]
    assert engine.submitted[-1][1] == [104, 105, SCRIPT_IDS, SCRIPT_IDS + 1]


@pytest.mark.parametrize(("extra", "why"), [
    ({"stream": False}, "stream"),
    ({"n": 2}, "one sequence"),
    ({"logprobs": True}, "logprobs"),
    ({"response_format": {"type": "json_object"}}, "structured outputs"),
    ({"stop": ["x"]}, "stop strings"),
    ({"presence_penalty": 0.5}, "penalties"),
    ({"continue_token_ids": [1, 0x110000]}, "vocabulary"),
    ({"continue_token_ids": [1, 2, 3]}, "nothing is left"),
])
async def test_what_cannot_be_continued_exactly_is_a_400_naming_the_field(serve, extra, why):
    client, _ = await serve()
    body = {"messages": USER_HI, "stream": True, "max_tokens": 3, "continue_token_ids": [SCRIPT_IDS], **extra}
    r = await client.post(CHAT, json=body)
    assert r.status == 400
    error = (await r.json())["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", "continue_token_ids") and why in error["message"]
    r = await client.post(CHAT, json={**body, "continue_token_ids": ["a"]})
    assert r.status == 400 and "continue_token_ids" in (await r.json())["error"]["message"]


async def test_completions_refuse_echo_and_several_prompts(serve):
    client, _ = await serve()
    for extra in ({"echo": True}, {"prompt": ["a", "b"]}):
        r = await client.post("/v1/completions", json={"prompt": "hi", "stream": True, "continue_token_ids": [], **extra})
        assert r.status == 400 and (await r.json())["error"]["param"] == "continue_token_ids"
