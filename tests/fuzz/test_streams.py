"""The UTF-8 carry, SSE framing and the stream encoders, fed the same output cut anywhere.

Whatever the cut (engines hand over bytes that may end inside a character;
a slow reader makes the writer hand several steps at once; an upstream's
SSE arrives in any TCP pieces): what comes out, put together, is what the
whole input gives, and no piece carries half a character (a U+FFFD the
input did not have).
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from engine_adapter.base import Delta
from streamproxy.apis.anthropic.stream import AnthropicEncoder
from streamproxy.apis.responses.protocol import ReasoningEcho, Response, TextEcho, TextFormat
from streamproxy.apis.responses.stream import ResponsesEncoder
from streamproxy.core import sse
from streamproxy.core.stream import ChatStreamEncoder, CompletionStreamEncoder
from streamproxy.core.utf8 import Utf8Carry
from streamproxy.filters.chain import chat_filters, reasoning_spec
from tests.fuzz.fuzz_support import budget, chunkings
from tests.support import sse as wire
from tests.support.chat import reassemble

# Every UTF-8 length, and the characters whose bytes look most alike.
CHARS = st.sampled_from(list("aZ \n\"\\<>{}é€😀中\u0000\u2028\ufeff")) | st.characters(blacklist_categories=["Cs"])
texts = st.text(CHARS, max_size=40)


@st.composite
def byte_pieces(draw: st.DrawFn, text: str) -> list[bytes]:
    return draw(chunkings(text.encode()))


# --- the UTF-8 carry -------------------------------------------------------


@budget(200)
@given(st.data(), texts)
def test_carry_joins_any_byte_split(data, text):
    carry = Utf8Carry()
    out = [carry.feed(piece) for piece in data.draw(byte_pieces(text))]
    assert "".join(out) + carry.flush() == text
    assert not carry.pending


@budget(200)
@given(st.data(), st.binary(max_size=40))
def test_carry_of_any_bytes_is_the_tolerant_decode(data, raw):
    carry = Utf8Carry()
    out = "".join(carry.feed(p) for p in data.draw(chunkings(raw))) + carry.flush()
    assert out == raw.decode("utf-8", "replace")


@budget(100)
@given(st.data(), st.lists(texts, max_size=5))
def test_carry_with_str_and_bytes_mixed(data, texts_):
    # str pieces pass through; bytes pending before one can no longer be completed: U+FFFD.
    carry = Utf8Carry()
    out, expected = [], []
    for text in texts_:
        if data.draw(st.booleans()):
            out.append(carry.feed(text))
            expected.append(text)
        else:
            out += [carry.feed(p) for p in data.draw(byte_pieces(text))]
            expected.append(text)
    assert "".join(out) + carry.flush() == "".join(expected)


# --- SSE framing -----------------------------------------------------------

events = st.lists(
    st.tuples(st.none() | st.sampled_from(["message_start", "response.created", "x"]), st.text(CHARS.filter(lambda c: c not in "\r\n"), max_size=20)),
    max_size=6,
)


def encode_events(evs: list[tuple[str | None, str]]) -> bytes:
    out = b""
    for name, payload in evs:
        data = json.dumps(payload, ensure_ascii=False).encode()
        out += sse.event_frame(name.encode(), data) if name else sse.frame(data)
    return out


def parse_all(pieces: list[bytes]) -> list[tuple[str | None, str]]:
    parser = sse.SSEParser()
    out = []
    for piece in pieces:
        out += parser.feed(piece)
    return out


@budget(150)
@given(st.data(), events, st.sampled_from([b"\n", b"\r\n", b"\r"]))
def test_sse_parser_any_split_any_line_end(data, evs, newline):
    body = encode_events(evs)
    if newline != b"\n":
        body = body.replace(b"\n", newline)
    body = b": keepalive" + newline + newline + body
    expected = [(name, json.dumps(payload, ensure_ascii=False)) for name, payload in evs]
    assert parse_all([body]) == expected
    assert parse_all(data.draw(chunkings(body))) == expected


# --- stream encoders -------------------------------------------------------


def deltas_for(pieces: list[bytes], tokens: int | None = None, reason: str = "stop") -> list[Delta]:
    """One Delta per piece (a token each), the last one finishing; `tokens`: the count of one whole piece."""
    out = [Delta(0, piece, 1 if tokens is None else tokens) for piece in pieces] or [Delta(0, b"", 0)]
    out[-1].finish_reason = reason
    return out


def run_chunks(encoder: Any, deltas: list[Delta], groups: list[int]) -> bytes:
    """Feed `deltas` in steps of the given sizes (several deltas in one step: a reader fell behind)."""
    out = encoder.start()
    i = 0
    for size in groups:
        if i >= len(deltas):
            break
        out += encoder.step(deltas[i : i + size])
        i += size
    if i < len(deltas):
        out += encoder.step(deltas[i:])
    return out + encoder.finish()


REPLACEMENT = "\ufffd"


@budget(150)
@given(st.data(), texts, st.sampled_from(["chat", "completion"]), st.booleans())
def test_chunk_encoders_join_any_split(data, text, kind, logprobs):
    def encoder() -> Any:
        args = dict(response_id="x", created=1, model="m", n=1, include_usage=True, logprobs=logprobs)
        return ChatStreamEncoder(**args) if kind == "chat" else CompletionStreamEncoder(**args)

    pieces = data.draw(byte_pieces(text))
    groups = data.draw(st.lists(st.integers(1, 4), max_size=10))
    body = run_chunks(encoder(), deltas_for(pieces), groups)
    whole = run_chunks(encoder(), deltas_for([text.encode()], len(pieces)), [])
    chunks = wire.payloads(body)  # strict: every frame a `data:` line, [DONE] last
    if kind == "chat":
        got, want = reassemble(chunks), reassemble(wire.payloads(whole))
        assert (got.content or "", got.finish_reason) == (text, "stop")
        assert got == want
    else:
        got_text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
        assert got_text == text
    assert body.count(REPLACEMENT.encode()) == text.count(REPLACEMENT)
    assert chunks[-1]["usage"] == wire.payloads(whole)[-1]["usage"]


_SHELL = Response(
    id="resp_x", created_at=1, status="in_progress", model="m", output=[], reasoning=ReasoningEcho(),
    text=TextEcho(format=TextFormat(type="text")),
)
@budget(100)
@given(st.data(), st.lists(st.sampled_from(["<think>", "</think>", "hm ", "Hi", "é", "😀", "\n"]) | texts, max_size=8).map("".join),
       st.sampled_from(["responses", "anthropic"]))
def test_block_encoders_join_any_split(data, text, kind):
    """Responses and Anthropic events (with the qwen3 reasoning splitter): the streamed text and the
    final object are the same whatever the byte split, and equal the non-stream answer."""
    filters = chat_filters(None, None, reasoning_spec("qwen3", tokenizer=None, template_kwargs={}))

    def encoder(emit: bool) -> Any:
        if kind == "responses":
            return ResponsesEncoder(_SHELL, filters, emit=emit, id_seed="s")
        return AnthropicEncoder(message_id="msg_x", model="m", filters=filters, emit=emit)

    pieces = data.draw(byte_pieces(text))
    groups = data.draw(st.lists(st.integers(1, 4), max_size=10))
    body = run_chunks(encoder(True), deltas_for(pieces), groups)
    whole = run_chunks(encoder(True), deltas_for([text.encode()], len(pieces)), [])
    events, events_whole = wire.named_events(body), wire.named_events(whole)
    # Where the deltas were cut differs (and so the events' sequence numbers); the final state does not.
    if kind == "responses":
        final_event, final_whole = events[-1][1]["response"], events_whole[-1][1]["response"]
    else:
        final_event, final_whole = events[-2][1], events_whole[-2][1]  # message_delta: stop reason, usage
    assert final_event == final_whole
    sink = encoder(False)
    for d in deltas_for(pieces):
        sink.step([d])
    final = json.loads(sink.final_json())
    if kind == "responses":
        assert final["output"] == final_event["output"]
    assert streamed(events, kind) == streamed(events_whole, kind)
    assert body.count(REPLACEMENT.encode()) == text.count(REPLACEMENT)


def streamed(events: list[tuple[str, dict[str, Any]]], kind: str) -> list[tuple[str, str]]:
    """The text of each delta event, joined per kind of text (answer, thinking)."""
    out: dict[str, str] = {}
    for name, p in events:
        if kind == "responses" and name in ("response.output_text.delta", "response.reasoning_text.delta"):
            out[name] = out.get(name, "") + p["delta"]
        elif kind == "anthropic" and name == "content_block_delta":
            key = p["delta"]["type"]
            out[key] = out.get(key, "") + p["delta"].get("text", p["delta"].get("thinking", ""))
    return sorted(out.items())
