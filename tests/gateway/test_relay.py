"""The relay's bytes: whole events out whatever the reads, exact edits, usage metered.

Fed byte by byte and in every two-way split: the output is the same bytes."""

from __future__ import annotations

from typing import Any

import pytest

from streamproxy.apis.anthropic.spec import ANTHROPIC
from streamproxy.apis.responses.spec import RESPONSES
from streamproxy.apis.spec import OPENAI, Usage
from streamproxy.errors import ServiceUnavailable
from streamproxy.gateway.relay import SSERelay, meter_body

ROLE = b'data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"Qwen/Qwen3-8B","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
TEXT = b'data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"Qwen/Qwen3-8B","choices":[{"index":0,"delta":{"content":"\\"model\\":\\"Qwen/Qwen3-8B\\" \xf0\x9f\x8c\x8a"}}]}\n\n'
FINISH = b'data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"Qwen/Qwen3-8B","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
USAGE = (
    b'data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"Qwen/Qwen3-8B","choices":[],'
    b'"usage":{"prompt_tokens":618,"completion_tokens":2,"total_tokens":620,"prompt_tokens_details":{"cached_tokens":512}}}\n\n'
)
DONE = b"data: [DONE]\n\n"
STREAM = ROLE + TEXT + FINISH + USAGE + DONE


def public(event: bytes) -> bytes:
    return event.replace(b'"model":"Qwen/Qwen3-8B"', b'"model":"support-bot"')


def relay_all(pieces: list[bytes], **kw) -> tuple[bytes, SSERelay]:
    relay = SSERelay(OPENAI, served="Qwen/Qwen3-8B", public="support-bot", **kw)
    return b"".join(relay.feed(p) for p in pieces), relay


def test_byte_by_byte_gives_whole_events_renamed_and_the_unasked_usage_chunk_removed():
    out, relay = relay_all([STREAM[i : i + 1] for i in range(len(STREAM))], strip_usage=True)
    # The content's escaped "model":"..." is text, not the key: it stays as the replica wrote it.
    assert out == public(ROLE) + TEXT.replace(b'"model":"Qwen/Qwen3-8B","choices"', b'"model":"support-bot","choices"') + public(FINISH) + DONE
    assert (relay.usage.prompt_tokens, relay.usage.completion_tokens, relay.usage.cached_tokens, relay.usage.billed) == (618, 2, 512, True)
    assert relay.done and not relay.pending


@pytest.mark.parametrize("cut", range(1, len(STREAM)))
def test_every_two_way_split_is_the_same_bytes(cut):
    out, _ = relay_all([STREAM[:cut], STREAM[cut:]], strip_usage=False)
    whole, _ = relay_all([STREAM], strip_usage=False)
    assert out == whole


def test_no_output_until_an_event_is_whole():
    relay = SSERelay(OPENAI, served="m", public="m", strip_usage=False)
    assert relay.feed(ROLE[:-1]) == b""
    assert relay.pending
    assert relay.feed(b"\n") == ROLE


def test_the_asked_usage_chunk_stays_and_is_metered():
    out, relay = relay_all([STREAM], strip_usage=False)
    assert out == public(ROLE) + TEXT.replace(b'"model":"Qwen/Qwen3-8B","choices"', b'"model":"support-bot","choices"') + public(FINISH) + public(USAGE) + DONE
    assert relay.usage.cached_tokens == 512


def test_same_name_needs_no_rewrite_and_spaced_json_is_renamed_too():
    relay = SSERelay(OPENAI, served="a", public="b", strip_usage=False)
    assert relay.feed(b'data: {"model": "a", "x": 1}\n\n') == b'data: {"model": "b", "x": 1}\n\n'
    same = SSERelay(OPENAI, served="a", public="a", strip_usage=False)
    assert same.feed(b'data: {"model":"a"}\n\n') == b'data: {"model":"a"}\n\n'


def test_crlf_framed_replica():
    relay = SSERelay(OPENAI, served="m", public="m", strip_usage=False)
    assert relay.feed(b"data: 1\r\n\r\ndata: [DO") == b"data: 1\r\n\r\n"
    assert relay.feed(b"NE]\r\n\r\n") == b"data: [DONE]\r\n\r\n"
    assert relay.done


def test_a_cut_stream_is_not_done_and_counts_what_it_relayed():
    out, relay = relay_all([ROLE + TEXT + TEXT + FINISH[:10]], strip_usage=True)
    assert not relay.done and relay.pending
    relay.counted()
    assert (relay.usage.billed, relay.usage.completion_tokens) == (False, 2)  # 3 events less the role chunk ([DONE] never came)


def test_a_count_leaves_out_comments_and_the_end_marker():
    _, cut = relay_all([b": keepalive\n\n" + ROLE + b": keepalive\n\n" + TEXT], strip_usage=True)
    cut.counted()
    assert cut.usage.completion_tokens == 1  # the replica's keepalives are not tokens
    _, ended = relay_all([ROLE + TEXT + TEXT + DONE], strip_usage=True)  # a replica that sent no usage
    ended.counted()
    assert (ended.done, ended.usage.completion_tokens) == (True, 2)


def test_comments_pass_through_between_events():
    out, relay = relay_all([b": keepalive\n\n" + ROLE], strip_usage=True)
    assert out == b": keepalive\n\n" + public(ROLE)


def test_responses_usage_from_the_final_event():
    created = b'event: response.created\ndata: {"type":"response.created","response":{"model":"m","usage":null}}\n\n'
    done = (
        b'event: response.completed\ndata: {"type":"response.completed","response":{"model":"m",'
        b'"usage":{"input_tokens":30,"output_tokens":4,"total_tokens":34,"input_tokens_details":{"cached_tokens":16}}}}\n\n'
    )
    relay = SSERelay(RESPONSES, served="m", public="m", strip_usage=False)
    assert relay.feed(created + done) == created + done
    assert (relay.usage.prompt_tokens, relay.usage.completion_tokens, relay.usage.cached_tokens, relay.done) == (30, 4, 16, True)


def test_anthropic_usage_from_message_start_and_delta():
    start = (
        b'event: message_start\ndata: {"type":"message_start","message":{"model":"m",'
        b'"usage":{"input_tokens":10,"output_tokens":1,"cache_read_input_tokens":20}}}\n\n'
    )
    delta = b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":7}}\n\n'
    stop = b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
    relay = SSERelay(ANTHROPIC, served="m", public="m", strip_usage=False)
    relay.feed(start)
    relay.feed(delta + stop)
    assert (relay.usage.prompt_tokens, relay.usage.completion_tokens, relay.usage.cached_tokens, relay.done) == (30, 7, 20, True)


def test_non_stream_body_usage():
    usage = Usage()
    meter_body(OPENAI, b'{"usage":{"prompt_tokens":5,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":4}}}', usage)
    assert (usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens, usage.billed) == (5, 3, 4, True)
    broken = Usage()
    meter_body(OPENAI, b"not json", broken)
    assert not broken.billed


def test_error_events_in_each_api_shape():
    exc = ServiceUnavailable("gone", code="upstream_unavailable")
    assert OPENAI.error(exc) == (
        b'data: {"error":{"message":"gone","type":"service_unavailable","param":null,"code":"upstream_unavailable"}}\n\ndata: [DONE]\n\n'
    )
    assert ANTHROPIC.error(exc).startswith(b'event: error\ndata: {"type":"error","error":{"type":')
    assert RESPONSES.error(exc, 7) == (
        b'event: error\ndata: {"type":"error","code":"upstream_unavailable","message":"gone","param":null,"sequence_number":7}\n\n'
    )
    assert OPENAI.keepalive == RESPONSES.keepalive == b": keepalive\n\n"
    assert ANTHROPIC.keepalive == b'event: ping\ndata: {"type":"ping"}\n\n'


def test_a_cut_responses_or_anthropic_stream_counts_only_its_text_events():
    responses = (
        b'event: response.created\ndata: {"type":"response.created","response":{"usage":null}}\n\n'
        b'event: response.output_item.added\ndata: {"type":"response.output_item.added"}\n\n'
        b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","delta":"Hi"}\n\n'
        b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","delta":" there"}\n\n'
    )
    anthropic = (
        b'event: message_start\ndata: {"type":"message_start","message":{"model":"m"}}\n\n'
        b'event: content_block_start\ndata: {"type":"content_block_start","index":0}\n\n'
        b'event: ping\ndata: {"type":"ping"}\n\n'
        b'event: content_block_delta\ndata: {"type":"content_block_delta","delta":{"text":"Hi"}}\n\n'
    )
    for api, stream, tokens in ((RESPONSES, responses, 2), (ANTHROPIC, anthropic, 1)):
        relay = SSERelay(api, served="m", public="m", strip_usage=False)
        for i in range(len(stream)):  # byte by byte: a marker cut between reads is counted once
            relay.feed(stream[i : i + 1])
        relay.counted()
        assert (relay.usage.billed, relay.usage.completion_tokens, relay.done) == (False, tokens, False)


def test_a_broken_responses_stream_ends_as_serve_ends_one_numbered_after_the_events_relayed():
    created = b'event: response.created\ndata: {"type":"response.created","response":{"id":"resp_1","model":"m","status":"in_progress","output":[],"usage":null},"sequence_number":0}\n\n'
    progress = b'event: response.in_progress\ndata: {"type":"response.in_progress","response":{"id":"resp_1"},"sequence_number":1}\n\n'
    added = b'event: response.output_item.added\ndata: {"type":"response.output_item.added","output_index":0,"item":{"id":"msg_1","type":"message","status":"in_progress","content":[]},"sequence_number":2}\n\n'
    delta = b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","delta":"Hi","sequence_number":3}\n\n'
    relay = SSERelay(RESPONSES, served="m", public="pub", strip_usage=False)
    for piece in (b": keepalive\n\n", created, b": keepalive\n\n", progress + added, delta):
        relay.feed(piece)
    exc = ServiceUnavailable("cut", code="upstream_unavailable")
    out = relay.error(exc)
    error, failed = out.split(b"\n\n")[:2]
    assert error == b'event: error\ndata: {"type":"error","code":"upstream_unavailable","message":"cut","param":null,"sequence_number":4}'
    assert b'"output":[{"id":"msg_1","type":"message","status":"incomplete","content":[]}]' in failed  # its items, the open one cut
    assert failed.startswith(b'event: response.failed\ndata: {"type":"response.failed","response":{"id":"resp_1","model":"pub",')
    assert failed.endswith(b'"error":{"code":"server_error","message":"cut"}},"sequence_number":5}')
    assert b'"status":"failed"' in failed
    # Nothing relayed yet (no response.created): the error alone.
    assert SSERelay(RESPONSES, served="m", public="m", strip_usage=False).error(exc).count(b"event: ") == 1


def _choice_end(index: int, reason: str, spaced: bool = False) -> bytes:
    colon = b": " if spaced else b":"
    return (b'data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":%d,"delta":{},'
            b'"finish_reason"%s"%s"}]}\n\n' % (index, colon, reason.encode()))


def test_why_each_choice_ended_is_read_from_its_finish_chunk_only():
    finishes: dict[int, str] = {}
    relay = SSERelay(OPENAI, served="m", public="m", strip_usage=False, finishes=finishes)
    for piece in (ROLE, TEXT, _choice_end(1, "length"), _choice_end(0, "stop", spaced=True), USAGE, DONE):
        for k in range(len(piece)):  # every two-way split of each event
            relay.feed(piece[:k])
            relay.feed(piece[k:])
    assert finishes == {1: "length", 0: "stop"} and relay.finishes is finishes
    assert SSERelay(OPENAI, served="m", public="m", strip_usage=False).finishes == {}  # its own when none is shared
    quiet: dict[int, str] = {}
    SSERelay(OPENAI, served="m", public="m", strip_usage=False, finishes=quiet).feed(ROLE + TEXT + DONE)
    assert quiet == {}  # a stream cut before its finish says none


def test_why_a_messages_or_responses_stream_ended_in_the_access_log_s_words():
    for reason, logged in (("end_turn", "stop"), ("stop_sequence", "stop"), ("max_tokens", "length"), ("tool_use", "tool_calls"),
                           ("refusal", "refusal")):
        finishes: dict[int, str] = {}
        relay = SSERelay(ANTHROPIC, served="m", public="m", strip_usage=False, finishes=finishes)
        relay.feed(b'event: message_start\ndata: {"type":"message_start","message":{"stop_reason":null}}\n\n')
        assert finishes == {}
        relay.feed(b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"%s"}}\n\n' % reason.encode())
        assert finishes == {0: logged}
    for terminal, logged in ((b'response.completed","response":{"status":"completed"', "stop"),
                             (b'response.incomplete","response":{"status":"incomplete","incomplete_details":{"reason":"max_output_tokens"}',
                              "length"),
                             (b'response.incomplete","response":{"status":"incomplete","incomplete_details":{"reason":"content_filter"}',
                              "content_filter")):
        finishes = {}
        event = terminal.split(b'"', 1)[0]
        SSERelay(RESPONSES, served="m", public="m", strip_usage=False, finishes=finishes).feed(
            b"event: " + event + b'\ndata: {"type":"' + terminal + b"}}\n\n")
        assert finishes == {0: logged}


def test_why_a_non_stream_answer_ended():
    cases: tuple[tuple[Any, bytes, dict[int, str]], ...] = (
        (OPENAI, b'{"choices":[{"index":0,"finish_reason":"stop"},{"index":1,"finish_reason":"length"}]}', {0: "stop", 1: "length"}),
        (OPENAI, b'{"data":[{"embedding":[0.5]}]}', {}),
        (ANTHROPIC, b'{"type":"message","stop_reason":"max_tokens"}', {0: "length"}),
        (RESPONSES, b'{"object":"response","status":"completed"}', {0: "stop"}),
        (RESPONSES, b'{"object":"response","status":"failed"}', {}),
    )
    for api, body, expected in cases:
        finishes: dict[int, str] = {}
        meter_body(api, body, Usage(), finishes)
        assert finishes == expected, body
