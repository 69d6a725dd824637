"""The wire checker itself: a checker that passes everything would hide every bug.

Each case breaks one rule in an otherwise valid stream and expects a problem
naming that field.
"""

from __future__ import annotations

import json

import pytest

from tests.compat.capture import Exchange
from tests.compat.wirecheck import problems

HEAD = {"id": "chatcmpl-x", "object": "chat.completion.chunk", "created": 1, "model": "m", "system_fingerprint": "fp"}


def chunk(choices, **extra) -> dict:
    return {**HEAD, "choices": choices, **extra}


def choice(delta, finish=None, index=0) -> dict:
    return {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}


def valid() -> list[dict]:
    return [
        chunk([choice({"role": "assistant", "content": ""})]),
        chunk([choice({"content": "Hi"})]),
        chunk([choice({}, "stop")]),
        chunk([], usage={"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}),
    ]


def exchange(chunks: list[dict], request: dict | None = None, done: bool = True) -> Exchange:
    ex = Exchange("POST", "http://h/v1/chat/completions", json.dumps(request or {"stream": True, "stream_options": {"include_usage": True}}).encode())
    ex.status, ex.headers, ex.complete = 200, {"content-type": "text/event-stream"}, True
    ex.body = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + (b"data: [DONE]\n\n" if done else b"")
    return ex


def test_valid_stream_has_no_problems():
    assert problems([exchange(valid())], "c") == []


def _set(chunks, n, path, value):
    target = chunks[n]
    for key in path[:-1]:
        target = target[key]
    if value is KeyError:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return chunks


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda c: _set(c, 0, ["choices", 0, "delta", "content"], None), "delta/content"),
        (lambda c: _set(c, 1, ["choices", 0, "delta", "role"], "assistant"), "delta/role"),
        (lambda c: _set(c, 1, ["choices", 0, "finish_reason"], "stop"), "after the finish_reason chunk"),
        (lambda c: _set(c, 2, ["system_fingerprint"], KeyError), "system_fingerprint"),
        (lambda c: c[:1] + c[3:] + c[1:3], "usage"),
        (lambda c: c[:3], "include_usage"),
        (lambda c: _set(c, 1, ["choices", 0, "delta", "content"], 5), "chunk 1"),
        (lambda c: _set(c, 3, ["choices"], None), "choices"),
    ],
    ids=["content-null", "role-twice", "finish-not-last", "fingerprint", "usage-not-last", "usage-missing", "schema", "usage-choices"],
)
def test_each_rule_is_enforced(mutate, expected):
    found = problems([exchange(mutate(valid()))], "client-x")
    assert found and all(p.startswith("client-x POST /v1/chat/completions") for p in found), found
    assert any(expected in p for p in found), found


def test_missing_done():
    assert any("[DONE]" in p for p in problems([exchange(valid(), done=False)], "c"))


def tool_stream(first_args: str, index=0) -> list[dict]:
    call = {"index": index, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": first_args}}
    return [
        chunk([choice({"role": "assistant", "content": None, "tool_calls": [call]})]),
        chunk([choice({"tool_calls": [{"index": index, "function": {"arguments": '{"a": 1}'[len(first_args):]}}]})]),
        chunk([choice({}, "tool_calls")]),
    ]


def test_tool_fragments():
    request = {"stream": True, "tools": [{"type": "function", "function": {"name": "f"}}]}
    assert problems([exchange(tool_stream(""), request)], "c") == []
    assert any("arguments: '{' in the first fragment" in p for p in problems([exchange(tool_stream("{"), request)], "c"))
    assert any("index" in p for p in problems([exchange(tool_stream("", index="0"), request)], "c"))
