"""Stream encoders: scripted Deltas in, exact SSE bytes out."""

from __future__ import annotations

import json
from typing import Any

import pytest

from engine_adapter.base import Delta
from streamproxy.core.stream import ChatStreamEncoder, CompletionStreamEncoder
from streamproxy.errors import ContextLengthExceeded, EngineError
from tests.support import schema_errors, sse

HEAD = b'data: {"id":"chatcmpl-x","object":"chat.completion.chunk","created":1700000000,"model":"m","system_fingerprint":"fp"'
ROLE = HEAD + b',"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}\n\n'
DONE = b"data: [DONE]\n\n"

CHAT_SCHEMA = "CreateChatCompletionStreamResponse"


def chat(**kw) -> ChatStreamEncoder:
    args: dict[str, Any] = dict(response_id="chatcmpl-x", created=1700000000, model="m", n=1, system_fingerprint="fp")
    args.update(kw)
    return ChatStreamEncoder(**args)


def completion(**kw) -> CompletionStreamEncoder:
    args: dict[str, Any] = dict(response_id="cmpl-x", created=1700000000, model="m", n=1)
    args.update(kw)
    return CompletionStreamEncoder(**args)


def content(text: str, index: int = 0) -> bytes:
    return (
        HEAD
        + b',"choices":[{"index":'
        + str(index).encode()
        + b',"delta":{"content":'
        + json.dumps(text, ensure_ascii=False).encode()
        + b'},"logprobs":null,"finish_reason":null}]}\n\n'
    )


def finish_chunk(reason: str, index: int = 0) -> bytes:
    return HEAD + b',"choices":[{"index":' + str(index).encode() + b',"delta":{},"logprobs":null,"finish_reason":"' + reason.encode() + b'"}]}\n\n'


def frames(data: bytes) -> list[bytes]:
    """The payload of each SSE frame; every frame must be `data: <one line>\\n\\n` (no comments)."""
    return sse.data(data, comments=False)


def json_chunks(data: bytes) -> list[dict]:
    """Every payload except the final [DONE], parsed; asserts the [DONE] is last and only there."""
    return sse.payloads(data, comments=False)


def run_chat(encoder, steps) -> bytes:
    return encoder.start() + b"".join(encoder.step(s) for s in steps) + encoder.finish()


def assert_chat_schema(chunks: list[dict]) -> None:
    for chunk in chunks:
        assert schema_errors(CHAT_SCHEMA, chunk) == [], chunk


def chat_text(chunks: list[dict], index: int = 0) -> str:
    return "".join(
        c["delta"].get("content") or "" for chunk in chunks for c in chunk["choices"] if c["index"] == index
    )


# ------------------------------------------------------------ chat: golden


def test_chat_start_is_the_role_chunk():
    assert chat().start() == ROLE


def test_chat_content_chunk_exact_bytes():
    assert chat().step([Delta(0, "Hello", 1)]) == content("Hello")


def test_chat_finish_chunk_has_empty_delta_and_reason():
    enc = chat()
    assert enc.step([Delta(0, "", 0, "length")]) == finish_chunk("length")


def test_chat_text_and_finish_in_one_delta_give_content_then_finish():
    assert chat().step([Delta(0, "!", 1, "stop")]) == content("!") + finish_chunk("stop")


def test_chat_whole_stream_without_usage_golden():
    stream = run_chat(chat(), [[Delta(0, "Hel", 1)], [Delta(0, "lo", 1)], [Delta(0, "", 0, "stop")]])
    assert stream == ROLE + content("Hel") + content("lo") + finish_chunk("stop") + DONE


def test_chat_whole_stream_with_usage_golden():
    enc = chat(include_usage=True)
    body = enc.start() + enc.step([Delta(0, "Hi", 2)]) + enc.step([Delta(0, "", 0, "stop")])
    enc.prompt_tokens = 7
    tail = enc.finish()
    assert body == ROLE + content("Hi") + finish_chunk("stop")
    assert tail == (
        HEAD + b',"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":2,"total_tokens":9,"prompt_tokens_details":{"cached_tokens":0}}}\n\n' + DONE
    )


def test_chat_finish_without_usage_is_only_done():
    assert chat().finish() == DONE


def test_chat_stream_usage_reports_cached_tokens_like_the_non_stream_answer():
    enc = chat(include_usage=True)
    enc.prompt_tokens, enc.cached_tokens = 10, 4
    enc.step([Delta(0, "x", 1, "stop")])
    assert enc.finish() == (
        HEAD
        + b',"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":1,"total_tokens":11,'
        + b'"prompt_tokens_details":{"cached_tokens":4}}}\n\n'
        + DONE
    )


def test_chat_without_system_fingerprint_omits_the_key():
    assert chat(system_fingerprint=None).start() == (
        b'data: {"id":"chatcmpl-x","object":"chat.completion.chunk","created":1700000000,"model":"m",'
        b'"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}\n\n'
    )


def test_chat_error_is_in_band_then_done():
    enc = chat()
    enc.start()
    assert enc.error(EngineError("engine died")) == (
        b'data: {"error":{"message":"engine died","type":"internal_error","param":null,"code":"engine_error"}}\n\n'
        + DONE
    )


def test_chat_error_frame_fits_openai_error_schema():
    payload = json_chunks(chat().error(ContextLengthExceeded("too long", param="messages")))
    assert payload == [
        {"error": {"message": "too long", "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}}
    ]
    assert schema_errors("ErrorResponse", payload[0]) == []


def test_chat_empty_text_delta_writes_nothing():
    assert chat().step([Delta(0, "", 0)]) == b""


def test_chat_step_with_no_deltas_writes_nothing():
    assert chat().step([]) == b""


# ------------------------------------------------------------ chat: invariants


def _sample_stream(**kw) -> bytes:
    enc = chat(n=2, include_usage=True, **kw)
    enc.prompt_tokens = 3
    return run_chat(
        enc,
        [
            [Delta(0, "Hi", 1), Delta(1, "Yo", 1)],
            [Delta(0, " there", 1)],
            [Delta(1, "!", 1, "length"), Delta(0, ".", 1, "stop")],
        ],
    )


@pytest.mark.parametrize("continuous", [False, True])
def test_every_chat_chunk_is_schema_valid_json(continuous):
    chunks = json_chunks(_sample_stream(continuous_usage=continuous))
    assert len(chunks) == 10  # 2 role, 5 content, 2 finish, 1 usage
    assert_chat_schema(chunks)


def test_one_id_created_model_across_the_stream():
    chunks = json_chunks(_sample_stream())
    assert {(c["id"], c["object"], c["created"], c["model"], c["system_fingerprint"]) for c in chunks} == {
        ("chatcmpl-x", "chat.completion.chunk", 1700000000, "m", "fp")
    }


def test_role_only_in_first_chunk_of_each_choice():
    chunks = json_chunks(_sample_stream())
    for index in (0, 1):
        deltas = [c["delta"] for chunk in chunks for c in chunk["choices"] if c["index"] == index]
        assert deltas[0] == {"role": "assistant", "content": ""}
        assert all("role" not in d for d in deltas[1:])


def test_n2_keeps_indices_apart():
    chunks = json_chunks(_sample_stream())
    assert all(len(chunk["choices"]) == 1 for chunk in chunks[:-1])
    assert chat_text(chunks, 0) == "Hi there."
    assert chat_text(chunks, 1) == "Yo!"
    finishes = {c["index"]: c["finish_reason"] for chunk in chunks for c in chunk["choices"] if c["finish_reason"]}
    assert finishes == {0: "stop", 1: "length"}


def test_n2_start_gives_one_role_chunk_per_choice():
    start = chat(n=2).start()
    assert [json.loads(p)["choices"][0]["index"] for p in frames(start)] == [0, 1]
    assert frames(start)[0] == ROLE[len(b"data: ") : -2]


def test_usage_chunk_is_last_before_done_and_counts_all_choices():
    chunks = json_chunks(_sample_stream())
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8, "prompt_tokens_details": {"cached_tokens": 0}}
    assert all("usage" not in c for c in chunks[:-1])


def test_continuous_usage_puts_running_usage_in_every_chunk():
    chunks = json_chunks(_sample_stream(continuous_usage=True))
    completions = [c["usage"]["completion_tokens"] for c in chunks]
    # role x2 | step 1: a chunk per choice | step 2 | step 3: choice 1 text+finish, choice 0 text+finish | usage
    assert completions == [0, 0, 1, 2, 3, 4, 4, 5, 5, 5]
    assert all(c["usage"]["prompt_tokens"] == 3 for c in chunks)
    assert all(c["usage"]["total_tokens"] == 3 + c["usage"]["completion_tokens"] for c in chunks)


def test_continuous_usage_golden_content_chunk():
    enc = chat(include_usage=True, continuous_usage=True)
    enc.prompt_tokens = 4
    assert enc.step([Delta(0, "a", 1)]) == (
        HEAD
        + b',"choices":[{"index":0,"delta":{"content":"a"},"logprobs":null,"finish_reason":null}],'
        + b'"usage":{"prompt_tokens":4,"completion_tokens":1,"total_tokens":5}}\n\n'
    )


def test_continuous_usage_without_include_usage_is_off():
    enc = chat(include_usage=False, continuous_usage=True)
    assert run_chat(enc, [[Delta(0, "a", 1, "stop")]]) == ROLE + content("a") + finish_chunk("stop") + DONE


# ------------------------------------------------------------ chat: text handling

TEXT = "aé€😀"
DATA = TEXT.encode("utf-8")


@pytest.mark.parametrize("cut", range(1, len(DATA)))
def test_bytes_split_anywhere_never_yield_half_a_character(cut):
    enc = chat()
    stream = run_chat(enc, [[Delta(0, DATA[:cut], 1)], [Delta(0, DATA[cut:], 1, "stop")]])
    chunks = json_chunks(stream)
    assert "\ufffd" not in stream.decode("utf-8")
    assert chat_text(chunks, 0) == TEXT
    assert_chat_schema(chunks)


def test_bytes_byte_at_a_time_emit_one_chunk_per_whole_character():
    enc = chat()
    steps = [[Delta(0, DATA[i : i + 1], 1)] for i in range(len(DATA))] + [[Delta(0, b"", 0, "stop")]]
    outputs = [enc.step(s) for s in steps]
    assert [json.loads(frames(o)[0])["choices"][0]["delta"].get("content") for o in outputs if o] == [
        "a", "é", "€", "😀", None
    ]
    assert sum(1 for o in outputs if o == b"") == len(DATA) - 4


def test_dangling_bytes_at_finish_become_replacement_before_finish_chunk():
    enc = chat()
    assert enc.step([Delta(0, b"ok\xe2\x82", 1, "stop")]) == content("ok") + content("\ufffd") + finish_chunk("stop")


def test_several_deltas_of_one_choice_in_one_step_make_one_chunk():
    enc = chat()
    out = enc.step([Delta(0, "a", 1), Delta(0, "b", 1), Delta(0, "c", 1)])
    assert out == content("abc")
    assert enc.completion_tokens == 3


def test_merged_bytes_deltas_make_one_whole_chunk():
    enc = chat()
    pieces = [DATA[i : i + 1] for i in range(len(DATA))]
    assert enc.step([Delta(0, p, 1) for p in pieces]) == content(TEXT)


def test_merge_keeps_the_finish_after_the_text():
    enc = chat()
    assert enc.step([Delta(0, "a", 1), Delta(0, "b", 1, "stop")]) == content("ab") + finish_chunk("stop")


def test_merge_of_two_choices_gives_one_chunk_per_choice():
    enc = chat(n=2)
    out = enc.step([Delta(0, "a", 1), Delta(1, "x", 1), Delta(0, "b", 1), Delta(1, "y", 1)])
    assert out == content("ab", 0) + content("xy", 1)


def test_str_and_bytes_deltas_of_one_choice_are_all_written_in_order():
    enc = chat()
    assert enc.step([Delta(0, b"a", 1), Delta(0, "b", 1), Delta(0, b"c", 1)]) == content("a") + content("b") + content("c")
    assert enc.completion_tokens == 3


def test_merge_does_not_mutate_the_callers_deltas():
    first, second = Delta(0, "a", 1), Delta(0, "b", 1)
    chat().step([first, second])
    assert (first.text, first.num_tokens, second.text) == ("a", 1, "b")


def test_text_with_newlines_and_quotes_stays_one_json_line():
    enc = chat()
    out = enc.step([Delta(0, 'line1\nline2\r"q"\t\\', 1)])
    assert json.loads(frames(out)[0])["choices"][0]["delta"]["content"] == 'line1\nline2\r"q"\t\\'


def test_id_and_model_with_special_characters_are_escaped():
    enc = ChatStreamEncoder(response_id='id"1', created=1, model="m\\/ü", n=1)
    chunk = json.loads(frames(enc.start())[0])
    assert (chunk["id"], chunk["model"]) == ('id"1', "m\\/ü")


# ------------------------------------------------------------ completions

CHEAD = b'data: {"id":"cmpl-x","object":"text_completion","created":1700000000,"model":"m"'


def test_completion_start_writes_nothing():
    assert completion().start() == b""


def test_completion_whole_stream_golden():
    enc = completion(include_usage=True)
    enc.prompt_tokens = 2
    stream = run_chat(enc, [[Delta(0, "Hi", 1)], [Delta(0, "!", 1, "length")]])
    assert stream == (
        CHEAD + b',"choices":[{"index":0,"text":"Hi","logprobs":null,"finish_reason":null}]}\n\n'
        + CHEAD + b',"choices":[{"index":0,"text":"!","logprobs":null,"finish_reason":null}]}\n\n'
        + CHEAD + b',"choices":[{"index":0,"text":"","logprobs":null,"finish_reason":"length"}]}\n\n'
        + CHEAD + b',"choices":[],"usage":{"prompt_tokens":2,"completion_tokens":2,"total_tokens":4,"prompt_tokens_details":{"cached_tokens":0}}}\n\n'
        + DONE
    )


def test_completion_n2_indices_and_text():
    enc = completion(n=2)
    stream = run_chat(enc, [[Delta(0, "a", 1), Delta(1, "b", 1)], [Delta(0, "", 0, "stop"), Delta(1, "c", 1, "stop")]])
    chunks = json_chunks(stream)
    texts = {0: "", 1: ""}
    for chunk in chunks:
        (choice,) = chunk["choices"]
        texts[choice["index"]] += choice["text"]
        assert chunk["object"] == "text_completion"
    assert texts == {0: "a", 1: "bc"}


@pytest.mark.parametrize("cut", range(1, len(DATA)))
def test_completion_bytes_split_anywhere_never_yield_half_a_character(cut):
    stream = run_chat(completion(), [[Delta(0, DATA[:cut], 1)], [Delta(0, DATA[cut:], 1, "stop")]])
    assert "\ufffd" not in stream.decode("utf-8")
    assert "".join(c["choices"][0]["text"] for c in json_chunks(stream)) == TEXT


def test_completion_error_is_in_band_then_done():
    assert completion().error(EngineError("x")) == (
        b'data: {"error":{"message":"x","type":"internal_error","param":null,"code":"engine_error"}}\n\n' + DONE
    )
