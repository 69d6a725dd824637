"""What ends up in the text: UTF-8 carry, n>1 choices, stop strings, length limits."""

from __future__ import annotations

import pytest

from engine_adapter.fake import FakeScript
from tests.support import USER_HI, USER_HI_PROMPT_TOKENS, sse

TEXT = "aé€😀z"
# "é" = C3 A9, "€" = E2 82 AC, "😀" = F0 9F 98 80, each split across deltas.
SPLIT = [b"a\xc3", b"\xa9\xe2", b"\x82", b"\xac\xf0\x9f", b"\x98", b"\x80z"]
assert b"".join(SPLIT).decode() == TEXT
# With one engine step per write the carry emits whole characters only:
SPLIT_CONTENTS = ["a", "é", "€", "😀z"]


def chat_contents(payloads: list[dict], index: int = 0) -> list[str]:
    return [
        c["delta"]["content"]
        for p in payloads
        for c in p["choices"]
        if c["index"] == index and c["delta"].get("content") and "role" not in c["delta"]
    ]


# -- UTF-8 -----------------------------------------------------------------------------


async def test_utf8_split_across_deltas_chat_stream(serve):
    client, _ = await serve(FakeScript(tokens=[*SPLIT], token_delay=0.03))
    resp = await client.post("/v1/chat/completions", json={"messages": USER_HI, "stream": True})
    assert resp.status == 200
    raw = await resp.read()
    assert b"\xef\xbf\xbd" not in raw and b"\\ufffd" not in raw.lower()
    raw.decode("utf-8")  # strict: the body itself is valid UTF-8
    payloads = sse.payloads(raw)
    contents = chat_contents(payloads)
    assert all("\ufffd" not in c for c in contents)
    assert "".join(contents) == TEXT
    assert contents == SPLIT_CONTENTS
    assert payloads[-1]["choices"][0]["finish_reason"] == "stop"


async def test_utf8_split_across_deltas_completions_stream(serve):
    client, _ = await serve(FakeScript(tokens=[*SPLIT], token_delay=0.03))
    resp = await client.post("/v1/completions", json={"prompt": "hi", "stream": True, "max_tokens": 50})
    raw = await resp.read()
    assert b"\xef\xbf\xbd" not in raw and b"\\ufffd" not in raw.lower()
    texts = [c["text"] for p in sse.payloads(raw) for c in p["choices"] if c["text"]]
    assert texts == SPLIT_CONTENTS


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
async def test_utf8_split_across_deltas_nonstream(serve, path):
    client, _ = await serve(FakeScript(tokens=[*SPLIT]))
    body = {"messages": USER_HI} if "chat" in path else {"prompt": "hi", "max_tokens": 50}
    resp = await client.post(path, json=body)
    assert resp.status == 200
    data = await resp.json()
    choice = data["choices"][0]
    text = choice["message"]["content"] if "chat" in path else choice["text"]
    assert text == TEXT
    assert data["usage"]["completion_tokens"] == len(SPLIT)


async def test_utf8_dangling_tail_at_end_becomes_replacement_char(serve):
    # Documented in utf8.py: an incomplete character at the very end is U+FFFD, not dropped.
    client, _ = await serve(FakeScript(tokens=[b"ok", b"\xe2\x82"], token_delay=0.01))
    resp = await client.post("/v1/chat/completions", json={"messages": USER_HI, "stream": True})
    contents = chat_contents(sse.payloads(await resp.read()))
    assert "".join(contents) == "ok\ufffd"
    resp = await client.post("/v1/chat/completions", json={"messages": USER_HI})
    assert (await resp.json())["choices"][0]["message"]["content"] == "ok\ufffd"


# -- n = 2 -----------------------------------------------------------------------------


async def test_n2_stream_keeps_choices_apart(serve):
    client, _ = await serve(FakeScript(tokens=["A", "B", "C"], token_delay=0.01))
    resp = await client.post(
        "/v1/chat/completions",
        json={"messages": USER_HI, "stream": True, "n": 2, "stream_options": {"include_usage": True}},
    )
    assert resp.status == 200
    payloads = sse.payloads(await resp.read())
    usage = payloads.pop()
    assert usage["choices"] == []
    assert usage["usage"] == {
        "prompt_tokens": USER_HI_PROMPT_TOKENS,
        "completion_tokens": 6,
        "total_tokens": USER_HI_PROMPT_TOKENS + 6,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    for p in payloads:
        assert len(p["choices"]) == 1, p
    for index in (0, 1):
        mine = [p["choices"][0] for p in payloads if p["choices"][0]["index"] == index]
        assert mine[0]["delta"] == {"role": "assistant", "content": ""}
        assert sum("role" in c["delta"] for c in mine) == 1
        assert mine[-1]["delta"] == {} and mine[-1]["finish_reason"] == "stop"
        assert sum(c["finish_reason"] is not None for c in mine) == 1
        assert "".join(c["delta"].get("content") or "" for c in mine) == "ABC"
        assert [c["delta"]["content"] for c in mine[1:-1]] == ["A", "B", "C"]
    assert {p["choices"][0]["index"] for p in payloads} == {0, 1}


async def test_n2_completions_stream_keeps_choices_apart(serve):
    client, _ = await serve(FakeScript(tokens=["A", "B"], token_delay=0.01))
    resp = await client.post("/v1/completions", json={"prompt": "hi", "stream": True, "n": 2})
    payloads = sse.payloads(await resp.read())
    for index in (0, 1):
        mine = [p["choices"][0] for p in payloads if p["choices"][0]["index"] == index]
        assert [c["text"] for c in mine] == ["A", "B", ""]
        assert [c["finish_reason"] for c in mine] == [None, None, "stop"]


async def test_n2_nonstream(serve):
    client, _ = await serve(FakeScript(tokens=["A", "B", "C"]))
    resp = await client.post("/v1/chat/completions", json={"messages": USER_HI, "n": 2})
    assert resp.status == 200
    data = await resp.json()
    assert [c["index"] for c in data["choices"]] == [0, 1]
    for c in data["choices"]:
        assert c["message"]["role"] == "assistant"
        assert c["message"]["content"] == "ABC"
        assert c["finish_reason"] == "stop"
    assert data["usage"]["completion_tokens"] == 6
    assert data["usage"]["total_tokens"] == USER_HI_PROMPT_TOKENS + 6


# -- stop / length --------------------------------------------------------------------

STOP_TOKENS = ["Hello", " world", ",", " bye", " now"]


@pytest.mark.parametrize(
    ("stop", "expected"),
    [
        ("world", "Hello "),
        (["bye", ","], "Hello world"),
        (["nothing-matches"], "Hello world, bye now"),
    ],
)
async def test_stop_nonstream(serve, stop, expected):
    client, engine = await serve(FakeScript(tokens=[*STOP_TOKENS]))
    resp = await client.post("/v1/chat/completions", json={"messages": USER_HI, "stop": stop})
    assert resp.status == 200
    choice = (await resp.json())["choices"][0]
    assert choice["message"]["content"] == expected
    assert choice["finish_reason"] == "stop"
    assert engine.submitted[-1][2].stop == ([stop] if isinstance(stop, str) else stop)


@pytest.mark.parametrize(("stop", "expected"), [("world", "Hello "), (["bye", ","], "Hello world")])
async def test_stop_stream(serve, stop, expected):
    client, _ = await serve(FakeScript(tokens=[*STOP_TOKENS], token_delay=0.005))
    resp = await client.post("/v1/chat/completions", json={"messages": USER_HI, "stop": stop, "stream": True})
    payloads = sse.payloads(await resp.read())
    assert "".join(chat_contents(payloads)) == expected
    finishes = [c["finish_reason"] for p in payloads for c in p["choices"] if c["finish_reason"]]
    assert finishes == ["stop"]
    assert payloads[-1]["choices"][0]["delta"] == {}


async def test_stop_completions(serve):
    client, _ = await serve(FakeScript(tokens=[*STOP_TOKENS]))
    resp = await client.post("/v1/completions", json={"prompt": "hi", "stop": ["bye"], "max_tokens": 50})
    choice = (await resp.json())["choices"][0]
    assert choice["text"] == "Hello world, "
    assert choice["finish_reason"] == "stop"


REPEAT = FakeScript(text="one two three four five six seven ")


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
async def test_max_tokens_gives_length(serve, field):
    client, engine = await serve(REPEAT)
    resp = await client.post("/v1/chat/completions", json={"messages": USER_HI, field: 3})
    assert resp.status == 200
    data = await resp.json()
    assert data["choices"][0]["message"]["content"] == "one two three"
    assert data["choices"][0]["finish_reason"] == "length"
    assert data["usage"]["completion_tokens"] == 3
    assert engine.submitted[-1][2].max_tokens == 3


async def test_max_completion_tokens_wins_over_max_tokens(serve):
    client, engine = await serve(REPEAT)
    resp = await client.post(
        "/v1/chat/completions", json={"messages": USER_HI, "max_tokens": 5, "max_completion_tokens": 2}
    )
    data = await resp.json()
    assert data["choices"][0]["message"]["content"] == "one two"
    assert data["usage"]["completion_tokens"] == 2
    assert engine.submitted[-1][2].max_tokens == 2


async def test_max_tokens_stream_length(serve):
    client, _ = await serve(FakeScript(text="one two three four five six seven ", token_delay=0.005))
    resp = await client.post(
        "/v1/chat/completions", json={"messages": USER_HI, "max_completion_tokens": 4, "stream": True}
    )
    payloads = sse.payloads(await resp.read())
    assert chat_contents(payloads) == ["one", " two", " three", " four"]
    assert payloads[-1]["choices"][0] == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "length"}


async def test_completions_max_tokens_length(serve):
    client, _ = await serve(REPEAT)
    resp = await client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
    choice = (await resp.json())["choices"][0]
    assert choice["text"] == "one two"
    assert choice["finish_reason"] == "length"


async def test_omitted_max_tokens_means_rest_of_context(serve):
    client, engine = await serve(REPEAT, max_model_len=40)
    resp = await client.post("/v1/chat/completions", json={"messages": USER_HI})
    data = await resp.json()
    assert engine.submitted[-1][2].max_tokens == 40 - USER_HI_PROMPT_TOKENS
    assert data["usage"]["completion_tokens"] == 40 - USER_HI_PROMPT_TOKENS
    assert data["choices"][0]["finish_reason"] == "length"
