"""Stream encoders and the accumulator with filters and logprobs: exact chunks.

The plain path (no filters, no logprobs) is covered byte for byte in
test_stream.py; here the parts path: tool-call fragments as OpenAI shapes
them, logprobs riding on the chunk of their own tokens, every chunk valid
against OpenAI's schema, and the non-stream accumulator agreeing with what
a client reassembles from the stream.
"""

from __future__ import annotations

from engine_adapter.base import Delta, TokenLogprob, token_text
from streamproxy.core.accumulate import ChoiceAccumulator
from streamproxy.core.stream import ChatStreamEncoder, CompletionStreamEncoder
from streamproxy.filters.constrained import NamedToolEmitter, RequiredToolEmitter
from streamproxy.filters.hermes import HermesParser
from tests.support import schema_errors, sse
from tests.support.chat import reassemble
from tests.unit.filter_support import TOOLS

HERMES_TEXT = 'Hi!\n<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


def chat(**kw) -> ChatStreamEncoder:
    return ChatStreamEncoder(response_id="chatcmpl-x", created=1, model="m", n=kw.pop("n", 1), system_fingerprint="fp", **kw)


def chunks(data: bytes) -> list[dict]:
    out = sse.payloads(data)
    for c in out:
        assert schema_errors("CreateChatCompletionStreamResponse", c) == [], c
    return out


def feed_all(enc, text: str, index: int = 0, n: int = 1, reason: str = "stop") -> bytes:
    out = enc.start()
    for i, ch in enumerate(text):
        last = i == len(text) - 1
        out += enc.step([Delta(k, ch, 1, reason if last else None) for k in range(n)])
    return out + enc.finish()


def test_hermes_stream_golden_fragments():
    enc = chat(filters=lambda: [HermesParser(TOOLS)])
    cs = chunks(feed_all(enc, HERMES_TEXT))
    deltas = [c["choices"][0]["delta"] for c in cs]
    assert deltas[0] == {"role": "assistant", "content": ""}
    tool_deltas = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    call_id = tool_deltas[0]["id"]
    assert tool_deltas == [
        {"index": 0, "id": call_id, "type": "function", "function": {"name": "get_weather", "arguments": ""}},
        {"index": 0, "function": {"arguments": '{"city": "Paris"}'}},
    ]
    assert cs[-1]["choices"][0] == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "tool_calls"}
    content, calls, reason = reassemble(cs)
    assert (content, reason) == ("Hi!", "tool_calls")
    assert [c._asdict() for c in calls] == [{"id": call_id, "name": "get_weather", "arguments": '{"city": "Paris"}'}]


def test_required_stream_arguments_arrive_token_by_token():
    text = '[{"name": "get_weather", "parameters": {"city": "Paris"}}]'
    enc = chat(filters=lambda: [RequiredToolEmitter()])
    enc.role_content = b"null"
    cs = chunks(feed_all(enc, text))
    assert cs[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    args = [c["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"] for c in cs[2:-1]]
    assert len(args) == len('{"city": "Paris"}')  # one piece per generated character
    content, calls, reason = reassemble(cs)
    assert (content, reason) == (None, "tool_calls")
    assert [(c.name, c.arguments) for c in calls] == [("get_weather", '{"city": "Paris"}')]


def test_n2_choices_parse_apart():
    enc = chat(n=2, filters=lambda: [HermesParser(TOOLS)])
    cs = chunks(feed_all(enc, HERMES_TEXT, n=2))
    a, b = reassemble(cs, 0), reassemble(cs, 1)
    assert a.calls[0].id != b.calls[0].id
    assert (a[0], a[2], a.calls[0].arguments) == (b[0], b[2], b.calls[0].arguments) == ("Hi!", "tool_calls", '{"city": "Paris"}')


def test_invalid_call_streams_as_content_with_stop():
    text = '<tool_call>{"name": "get_weather", "arguments": {"town": "x"}}</tool_call>'
    cs = chunks(feed_all(chat(filters=lambda: [HermesParser(TOOLS)]), text))
    assert reassemble(cs) == (text, [], "stop")


def lp(token: str | bytes, value: float, top=()) -> TokenLogprob:
    data = token.encode() if isinstance(token, str) else token
    return TokenLogprob(0, token_text(data), data, value, list(top))


def test_chat_logprobs_ride_on_their_own_chunk():
    enc = chat(logprobs=True)
    a = lp("Hi", -0.5, [lp("Hi", -0.5), lp("Yo", -2.0)])
    out = enc.step([Delta(0, "Hi", 1, logprobs=[a])])
    (c,) = chunks(out + b"data: [DONE]\n\n")
    assert c["choices"][0]["logprobs"] == {
        "content": [
            {
                "token": "Hi",
                "logprob": -0.5,
                "bytes": [72, 105],
                "top_logprobs": [{"token": "Hi", "logprob": -0.5, "bytes": [72, 105]}, {"token": "Yo", "logprob": -2.0, "bytes": [89, 111]}],
            }
        ],
        "refusal": None,
    }


def test_half_character_token_keeps_its_bytes_and_rides_on_the_next_chunk():
    enc = chat(logprobs=True)
    first, second = lp(b"\xe4\xbd", -1.0), lp(b"\xa0", -float("inf"))
    assert enc.step([Delta(0, b"\xe4\xbd", 1, logprobs=[first])]) == b""  # no text yet: nothing sent
    out = enc.step([Delta(0, b"\xa0", 1, "stop", logprobs=[second])])
    cs = chunks(out + b"data: [DONE]\n\n")
    assert cs[0]["choices"][0]["delta"] == {"content": "你"}
    entries = cs[0]["choices"][0]["logprobs"]["content"]
    assert [(e["token"], e["bytes"], e["logprob"]) for e in entries] == [
        ("\\xe4\\xbd", [0xE4, 0xBD], -1.0),
        ("\\xa0", [0xA0], -9999.0),
    ]
    assert cs[1]["choices"][0]["logprobs"] is None  # nothing left for the finish chunk


def test_logprobs_of_held_back_tokens_go_out_with_the_finish_chunk():
    enc = chat(filters=lambda: [NamedToolEmitter("f")], logprobs=True)
    out = enc.step([Delta(0, " ", 1, logprobs=[lp(" ", -0.1)])])
    assert out == b""
    out = enc.step([Delta(0, "", 0, "stop")])
    (c,) = chunks(out + b"data: [DONE]\n\n")
    assert c["choices"][0]["finish_reason"] == "stop"
    assert [e["token"] for e in c["choices"][0]["logprobs"]["content"]] == [" "]


def test_merged_steps_keep_every_logprob():
    enc = chat(logprobs=True)
    out = enc.step([Delta(0, "a", 1, logprobs=[lp("a", -1.0)]), Delta(0, "b", 1, logprobs=[lp("b", -2.0)])])
    (c,) = chunks(out + b"data: [DONE]\n\n")
    assert c["choices"][0]["delta"] == {"content": "ab"}
    assert [e["token"] for e in c["choices"][0]["logprobs"]["content"]] == ["a", "b"]


def test_completion_legacy_logprobs_with_text_offsets():
    enc = CompletionStreamEncoder(response_id="cmpl-x", created=1, model="m", n=1, logprobs=True)
    out = enc.step([Delta(0, "Hé", 1, logprobs=[lp("Hé", -0.5, [lp("Hé", -0.5), lp("Ha", -1.5)])])])
    out += enc.step([Delta(0, b"\xe4\xbd", 1, logprobs=[lp(b"\xe4\xbd", -1.0)])])
    out += enc.step([Delta(0, b"\xa0!", 1, "length", logprobs=[lp(b"\xa0!", -2.0)])])
    frames = sse.payloads(out, done=False)
    assert [f["choices"][0]["logprobs"] for f in frames] == [
        {"tokens": ["Hé"], "token_logprobs": [-0.5], "top_logprobs": [{"Hé": -0.5, "Ha": -1.5}], "text_offset": [0]},
        {
            "tokens": ["\\xe4\\xbd", "\\xa0!"],
            "token_logprobs": [-1.0, -2.0],
            "top_logprobs": [{"\\xe4\\xbd": -1.0}, {"\\xa0!": -2.0}],
            "text_offset": [2, 2],
        },
        None,
    ]
    assert [f["choices"][0]["text"] for f in frames] == ["Hé", "你!", ""]


def test_plain_path_is_unchanged_without_filters_or_logprobs():
    enc = chat()
    assert enc._one == enc._one_plain
    enc = chat(logprobs=True)
    assert enc._one == enc._one_parts


# -- the accumulator agrees with the stream ------------------------------------------------


def test_accumulator_builds_the_same_calls_and_content():
    acc = ChoiceAccumulator(2, lambda: [HermesParser(TOOLS)], logprobs=True)
    for i, ch in enumerate(HERMES_TEXT):
        last = i == len(HERMES_TEXT) - 1
        acc.step([Delta(k, ch, 1, "stop" if last else None, logprobs=[lp(ch, -1.0)]) for k in range(2)])
    for k in range(2):
        assert acc.text(k) == "Hi!"
        ((cid, name, args),) = acc.tool_calls(k)
        assert cid.startswith("call_") and (name, args) == ("get_weather", '{"city": "Paris"}')
        assert acc.finish_reasons[k] == "tool_calls"
        assert "".join(t.token for t in acc.logprobs(k) or ()) == HERMES_TEXT
    assert acc.tool_calls(0)[0][0] != acc.tool_calls(1)[0][0]


def test_accumulator_without_filters_has_no_calls_and_no_logprobs():
    acc = ChoiceAccumulator(1)
    acc.step([Delta(0, "x", 1, "stop")])
    assert (acc.text(0), acc.tool_calls(0), acc.logprobs(0)) == ("x", [], None)
