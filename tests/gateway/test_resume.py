"""resume.py, sans-IO: a stream's record, its continuation request and its rewriting, fed one byte at a time.

The replica's bytes are `tests/support/token_replica.py`'s (vLLM 0.32's chunks), through the
relay's `SSERelay` as the gateway runs them: relay.feed, then Stream.feed.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest

from streamproxy.apis.spec import OPENAI
from streamproxy.gateway.relay import SSERelay
from streamproxy.gateway.resume import CHAT, COMPLETIONS, CONTINUE, FINISHED, REFUSED, RESEND, Stream, parser_refusal, refusal
from tests.support.token_replica import TokenReplica, encode, next_token

SERVED, PUBLIC = "served/m", "public-m"
HI = [{"role": "user", "content": "hi"}]
ERROR = b'data: {"error":{"message":"EngineCore encountered an issue.","type":"InternalServerError","param":null,"code":500}}\n\n'


def replica_events(path: str, body: dict[str, Any]) -> list[bytes]:
    """What the fake replica streams for `body` (its model is the served one)."""
    fake = TokenReplica("r", [])
    body = {**body, "model": SERVED}
    if path == CHAT:
        prompt = encode(json.dumps(body["messages"])) + [49]
        return fake._chat_events(body, prompt, body.get("max_tokens"))
    prompt = body["prompt"] if isinstance(body["prompt"], list) else encode(body["prompt"])
    return fake._completion_events(body, prompt, body.get("max_tokens"))


def client_view(events: list[bytes]) -> bytes:
    return b"".join(events).replace(SERVED.encode(), PUBLIC.encode())


def bytewise(relay: SSERelay, stream: Stream, raw: bytes) -> bytes:
    return b"".join(stream.feed(relay.feed(raw[i : i + 1])) for i in range(len(raw)))


def start(path: str, client: dict[str, Any]) -> tuple[Stream, dict[str, Any], bool]:
    """The gateway's edits (proxy.py): usage and ids asked for; the record."""
    upstream = {**client, "model": SERVED}
    strip = "stream_options" not in client
    upstream["stream_options"] = {"include_usage": True}
    asked = client.get("return_token_ids") is True
    why = refusal(path, upstream)
    if why is None:
        upstream["return_token_ids"] = True
    stream = Stream(path, upstream, limit=1000, migrations=2, client_ids=asked, usage_chunk=not strip, why=why)
    return stream, upstream, strip


CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "chat": (CHAT, {"messages": HI, "stream": True, "max_tokens": 5}),
    "chat-usage-ids": (CHAT, {"messages": HI, "stream": True, "max_tokens": 5, "stream_options": {"include_usage": True},
                              "return_token_ids": True}),
    "completions": (COMPLETIONS, {"prompt": "Say", "stream": True, "max_tokens": 4}),
    "completions-usage": (COMPLETIONS, {"prompt": [3, 4, 5], "stream": True, "max_tokens": 4, "stream_options": {"include_usage": True}}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_relayed_with_ids_the_client_reads_what_it_would_without_them(case):
    path, client = CASES[case]
    stream, upstream, strip = start(path, client)
    unasked = {**upstream, "return_token_ids": client.get("return_token_ids", False)}
    expected = [e for e in replica_events(path, unasked) if strip is False or b'"choices":[]' not in e]
    relay = SSERelay(OPENAI, served=SERVED, public=PUBLIC, strip_usage=strip)
    got = bytewise(relay, stream, b"".join(replica_events(path, upstream)))
    assert got == client_view(expected)
    assert relay.done and stream.failed is None and stream.plan() == (FINISHED, None)
    assert stream.prompt is not None and len(stream.generated) == client["max_tokens"]
    seq = list(stream.prompt)
    for token in stream.generated:
        assert token == next_token(seq)
        seq.append(token)


@pytest.mark.parametrize("case", list(CASES))
def test_a_continuation_after_any_event_gives_the_client_the_unbroken_bytes(case):
    path, client = CASES[case]
    _, upstream, strip = start(path, client)
    whole = replica_events(path, upstream)
    reference = Stream(path, upstream, limit=1000, migrations=2, client_ids=client.get("return_token_ids") is True, usage_chunk=not strip)
    expected = bytewise(SSERelay(OPENAI, served=SERVED, public=PUBLIC, strip_usage=strip), reference, b"".join(whole))
    for k in range(1, len(whole) - 1):  # (chat: from its role chunk on; completions: its first token)
        stream, _, _ = start(path, client)
        got = bytewise(SSERelay(OPENAI, served=SERVED, public=PUBLIC, strip_usage=strip), stream, b"".join(whole[:k]) + b"data: {")
        action, why = stream.plan()
        if action == FINISHED:
            got += stream.ending()
        else:
            assert (action, why) == (CONTINUE, None), k
            body = orjson.loads(stream.continuation())
            assert body["prompt"] == [*stream.prompt, *stream.generated]  # type: ignore[misc]
            assert body["max_tokens"] == int(client["max_tokens"]) - len(stream.generated)
            stream.migrating(action)
            relay = SSERelay(OPENAI, served=SERVED, public=PUBLIC, strip_usage=strip)
            got += bytewise(relay, stream, b"".join(replica_events(COMPLETIONS, body)))
            assert relay.done
        assert got == expected, k
        assert stream.totals()[:2] == (reference.totals()[0], client["max_tokens"])


def test_the_continuation_of_a_chat_request_is_a_completions_request_of_its_ids():
    client = {"messages": HI, "stream": True, "max_completion_tokens": 9, "min_tokens": 3, "temperature": 0.5, "top_p": 0.9,
              "seed": 11, "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "none",
              "chat_template_kwargs": {"enable_thinking": False}, "user": "u1", "ignore_eos": True}
    stream, upstream, _ = start(CHAT, client)
    events = replica_events(CHAT, upstream)
    relay = SSERelay(OPENAI, served=SERVED, public=PUBLIC, strip_usage=True)
    stream.feed(relay.feed(b"".join(events[:3])))
    assert stream.plan() == (CONTINUE, None)
    prompt = ",".join(str(t) for t in [*stream.prompt, *stream.generated]).encode()  # type: ignore[misc]
    assert stream.continuation() == (
        b'{"temperature":0.5,"top_p":0.9,"seed":11,"user":"u1","ignore_eos":true,"model":"served/m",'
        b'"prompt":[' + prompt + b'],"max_tokens":7,"min_tokens":1,"stream":true,"stream_options":{"include_usage":true},'
        b'"return_token_ids":true}')


def test_a_replica_s_server_error_is_the_break_and_the_client_s_own_passes():
    path, client = CASES["chat"]
    stream, upstream, strip = start(path, client)
    events = replica_events(path, upstream)
    relay = SSERelay(OPENAI, served=SERVED, public=PUBLIC, strip_usage=strip)
    out = bytewise(relay, stream, b"".join(events[:3]) + ERROR + b"data: [DONE]\n\n")
    assert b"error" not in out and out.count(b"data: ") == 3
    assert stream.failed is not None and stream.failed["code"] == 500 and stream.plan() == (CONTINUE, None)

    stream, _, _ = start(path, client)
    own = b'data: {"error":{"message":"bad","type":"BadRequestError","param":null,"code":400}}\n\n'
    out = bytewise(SSERelay(OPENAI, served=SERVED, public=PUBLIC, strip_usage=strip), stream, b"".join(events[:2]) + own)
    assert out.endswith(own) and stream.failed is None
    # Before any event: sent again; past the migrations allowed: refused, and the replica's error goes on.
    stream, _, _ = start(path, client)
    assert bytewise(SSERelay(OPENAI, served=SERVED, public=PUBLIC, strip_usage=strip), stream, ERROR) == b""
    assert stream.plan() == (RESEND, None)
    stream, _, _ = start(path, client)
    stream.left = 0
    out = bytewise(SSERelay(OPENAI, served=SERVED, public=PUBLIC, strip_usage=strip), stream, b"".join(events[:2]) + ERROR)
    assert out.endswith(ERROR) and stream.plan() == (REFUSED, "max_migrations reached")


def test_a_parsed_stream_is_not_continued_and_its_id_only_chunks_are_dropped():
    stream, _, _ = start(CHAT, {"messages": HI, "stream": True})
    relay = SSERelay(OPENAI, served=SERVED, public=PUBLIC, strip_usage=True)
    head = b'{"id":"c","object":"chat.completion.chunk","created":1,"model":"served/m","choices":[{"index":0,'
    role = b"data: " + head + b'"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":[1,2],"prompt_text":null}\n\n'
    ids_only = b"data: " + head + b'"delta":{},"logprobs":null,"finish_reason":null,"token_ids":[7]}]}\n\n'
    thinking = b"data: " + head + b'"delta":{"reasoning":"hm"},"logprobs":null,"finish_reason":null,"token_ids":[8]}]}\n\n'
    out = bytewise(relay, stream, role + ids_only + thinking)
    assert out == (role.replace(b"[1,2]", b"null") + thinking.replace(b"[8]", b"null")).replace(b"served/m", b"public-m")
    assert stream.plan() == (REFUSED, "the replica's parser shaped the deltas (tool calls or reasoning)")


def test_a_stream_past_max_tracked_tokens_stops_being_tracked():
    path, client = CASES["chat"]
    stream, upstream, strip = start(path, client)
    stream.limit = 38  # the prompt's 36 ids and 2 generated
    relay = SSERelay(OPENAI, served=SERVED, public=PUBLIC, strip_usage=strip)
    out = bytewise(relay, stream, b"".join(replica_events(path, upstream)[:4]))  # the role chunk and 3 tokens
    assert b'"token_ids":[' not in out and stream.prompt is None
    assert stream.plan() == (REFUSED, "longer than max_tracked_tokens")


@pytest.mark.parametrize(("body", "why"), [
    ({"messages": HI, "n": 2}, "n > 1, best_of and beam search (several sequences)"),
    ({"messages": HI, "response_format": {"type": "json_object"}}, "structured outputs (the grammar's state is the replica's)"),
    ({"messages": HI, "structured_outputs": {"regex": "a+"}}, "structured outputs (the grammar's state is the replica's)"),
    ({"messages": HI, "logprobs": True}, "logprobs"),
    ({"messages": HI, "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "required"},
     "tool_choice required or named (a grammar's state is the replica's)"),
    ({"messages": HI, "stop": ["x"]}, "stop strings (the replica holds back text that may begin one)"),
    ({"messages": HI, "frequency_penalty": 0.5}, "presence and frequency penalties (counted over generated tokens only)"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}]},
     "multimodal input (the prompt's ids alone are not the input)"),
    ({"messages": HI, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}, "continuous usage stats"),
    ({"messages": HI, "response_format": {"type": "text"}, "tool_choice": "none", "tools": [{}], "seed": 1}, None),
])
def test_refusal_names_what_cannot_be_continued_exactly(body, why):
    assert refusal(CHAT, body) == why


def test_tool_calls_are_refused_on_vllm_replicas_only():
    body = {"messages": HI, "tools": [{"type": "function", "function": {"name": "f"}}]}
    assert refusal(CHAT, body) is None and parser_refusal(CHAT, body) == "tool calls (the replica's parser state)"
    assert parser_refusal(CHAT, {**body, "tool_choice": "none"}) is None and parser_refusal(COMPLETIONS, {"prompt": "a"}) is None


@pytest.mark.parametrize(("body", "why"), [
    ({"prompt": "a", "best_of": 2}, "n > 1, best_of and beam search (several sequences)"),
    ({"prompt": "a", "logprobs": 0}, "logprobs"),
    ({"prompt": "a", "echo": True}, "echo, suffix and prompt embeddings"),
    ({"prompt": ["a", "b"]}, "several prompts in one request"),
    ({"prompt": [1, 2, 3], "logprobs": None}, None),
])
def test_refusal_of_completions(body, why):
    assert refusal(COMPLETIONS, body) == why
    assert refusal("/v1/embeddings", body) == "only chat, completions, Responses and Messages streams are continued"


_GRAMMAR = "(a grammar's state is the replica's)"
_TOOLS = [{"type": "function", "name": "f", "parameters": {"type": "object"}}]


@pytest.mark.parametrize(("path", "body", "why"), [
    ("/v1/responses", {"input": "hi"}, None),
    ("/v1/responses", {"input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}], "tools": _TOOLS}, None),
    ("/v1/responses", {"input": "hi", "text": {"format": {"type": "json_object"}}}, "structured outputs (the grammar's state is the replica's)"),
    ("/v1/responses", {"input": "hi", "tools": _TOOLS, "tool_choice": "required"}, f"tool_choice required or named {_GRAMMAR}"),
    ("/v1/responses", {"input": "hi", "background": True}, "background responses and previous_response_id (the replica's store)"),
    ("/v1/responses", {"input": "hi", "previous_response_id": "resp_1"}, "background responses and previous_response_id (the replica's store)"),
    ("/v1/responses", {"input": "hi", "include": ["message.output_text.logprobs"]}, "logprobs"),
    ("/v1/responses", {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "multimodal input (the prompt's ids alone are not the input)"),
    ("/v1/messages", {"messages": HI, "max_tokens": 5}, None),
    ("/v1/messages", {"messages": HI, "tools": [{"name": "f"}], "tool_choice": {"type": "auto"}}, None),
    ("/v1/messages", {"messages": HI, "stop_sequences": ["x"]}, "stop strings (the replica holds back text that may begin one)"),
    ("/v1/messages", {"messages": HI, "tools": [{"name": "f"}], "tool_choice": {"type": "any"}}, f"tool_choice any or tool {_GRAMMAR}"),
    ("/v1/messages", {"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
     "multimodal input (the prompt's ids alone are not the input)"),
])
def test_refusal_of_responses_and_messages(path, body, why):
    assert refusal(path, body) == why and parser_refusal(path, body) is None  # (vLLM's: their events carry no ids)
