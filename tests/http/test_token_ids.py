"""`return_token_ids` on serve, as vLLM 0.32 sends them: exact bytes of chat and completions streams
(the prompt's ids on chat's role chunk and on each completions choice's first chunk, every chunk its
own `token_ids` (a step's on its last chunk), id-only chunks where a parser holds text back), the non-stream answers' fields, and
the header that says the server takes `continue_token_ids`. Without the field the bytes are as before
(test_stream_golden.py)."""

from __future__ import annotations

import json

from engine_adapter.fake import SCRIPT_IDS, FakeScript
from streamproxy.http.state import SYSTEM_FINGERPRINT
from tests.http.http_support import normalize_created
from tests.support import USER_HI, sse

FP = SYSTEM_FINGERPRINT.encode()
DONE = b"data: [DONE]\n\n"
CHAT_HEAD = b'data: {"id":"chatcmpl-req-1","object":"chat.completion.chunk","created":0,"model":"fake","system_fingerprint":"' + FP + b'",'
CMPL_HEAD = b'data: {"id":"cmpl-req-1","object":"text_completion","created":0,"model":"fake","system_fingerprint":"' + FP + b'",'
SCRIPT = FakeScript(tokens=["Hel", "lo", " world"], token_delay=0.01)
PROMPT = json.dumps([ord(c) for c in "<|user|>hi\n<|assistant|>"], separators=(",", ":")).encode()
A, B, C = SCRIPT_IDS, SCRIPT_IDS + 1, SCRIPT_IDS + 2


def ids(*tokens: int) -> bytes:
    return b',"token_ids":' + json.dumps(list(tokens), separators=(",", ":")).encode()


async def post(client, path: str, body: dict) -> tuple[bytes, dict]:
    r = await client.post(path, json=body, headers={"X-Request-Id": "req-1"})
    assert r.status == 200, await r.text()
    return normalize_created(await r.read())[0], dict(r.headers)


async def test_a_chat_stream_carries_its_prompt_s_ids_first_and_every_chunk_its_own(serve):
    client, _ = await serve(SCRIPT)
    body, headers = await post(client, "/v1/chat/completions", {"messages": USER_HI, "stream": True, "return_token_ids": True,
                                                                "stream_options": {"include_usage": True}})
    assert body == (
        CHAT_HEAD + b'"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],'
        b'"prompt_token_ids":' + PROMPT + b"}\n\n"
        + CHAT_HEAD + b'"choices":[{"index":0,"delta":{"content":"Hel"},"logprobs":null,"finish_reason":null' + ids(A) + b"}]}\n\n"
        + CHAT_HEAD + b'"choices":[{"index":0,"delta":{"content":"lo"},"logprobs":null,"finish_reason":null' + ids(B) + b"}]}\n\n"
        # The last token's step makes two chunks: its ids ride on the last one.
        + CHAT_HEAD + b'"choices":[{"index":0,"delta":{"content":" world"},"logprobs":null,"finish_reason":null' + ids() + b"}]}\n\n"
        + CHAT_HEAD + b'"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"' + ids(C) + b"}]}\n\n"
        + CHAT_HEAD + b'"choices":[],"usage":{"prompt_tokens":24,"completion_tokens":3,"total_tokens":27,'
        b'"prompt_tokens_details":{"cached_tokens":0}}}\n\n' + DONE
    )
    assert headers["Streamproxy-Continuation"] == "continue_token_ids"
    # Not asked: neither the fields nor the header.
    plain, headers = await post(client, "/v1/chat/completions", {"messages": USER_HI, "stream": True, "return_token_ids": False})
    assert b"token_ids" not in plain and "Streamproxy-Continuation" not in headers


async def test_a_completions_stream_carries_the_prompt_s_ids_on_its_first_chunk(serve):
    client, _ = await serve(SCRIPT)
    body, _ = await post(client, "/v1/completions", {"prompt": "hi", "stream": True, "return_token_ids": True})
    assert body == (
        CMPL_HEAD + b'"choices":[{"index":0,"text":"Hel","logprobs":null,"finish_reason":null,"prompt_token_ids":[104,105]'
        + ids(A) + b"}]}\n\n"
        + CMPL_HEAD + b'"choices":[{"index":0,"text":"lo","logprobs":null,"finish_reason":null' + ids(B) + b"}]}\n\n"
        + CMPL_HEAD + b'"choices":[{"index":0,"text":" world","logprobs":null,"finish_reason":null' + ids() + b"}]}\n\n"
        + CMPL_HEAD + b'"choices":[{"index":0,"text":"","logprobs":null,"finish_reason":"stop"' + ids(C) + b"}]}\n\n" + DONE
    )


async def test_a_step_a_parser_holds_back_sends_its_ids_in_an_id_only_chunk(serve):
    client, _ = await serve(FakeScript(tokens=["<think>", "hm", "</think>", "Hi"], token_delay=0.01), reasoning_parser="deepseek_r1")
    body, _ = await post(client, "/v1/chat/completions", {"messages": USER_HI, "stream": True, "return_token_ids": True})
    chunks = [c["choices"][0] for c in sse.payloads(body)]
    assert [(c["delta"], c.get("token_ids")) for c in chunks] == [
        ({"role": "assistant", "content": ""}, None),
        ({}, [SCRIPT_IDS]),  # `<think>`: dropped by the splitter, its id still goes
        ({"reasoning": "hm", "reasoning_content": "hm"}, [SCRIPT_IDS + 1]),
        ({}, [SCRIPT_IDS + 2]),
        ({"content": "Hi"}, []),
        ({}, [SCRIPT_IDS + 3]),  # the last step: its content, then its finish with its ids
    ]
    assert chunks[-1]["finish_reason"] == "stop"


async def test_a_character_split_over_two_tokens_has_an_id_only_chunk_then_the_character(serve):
    client, _ = await serve(FakeScript(tokens=[b"caf\xc3", b"\xa9!"], token_delay=0.01))
    body, _ = await post(client, "/v1/completions", {"prompt": "hi", "stream": True, "return_token_ids": True})
    chunks = [c["choices"][0] for c in sse.payloads(body)]
    assert [(c["text"], c["token_ids"]) for c in chunks] == [("caf", [SCRIPT_IDS]), ("é!", []), ("", [SCRIPT_IDS + 1])]


async def test_non_stream_answers_carry_the_ids_where_vllm_puts_them(serve):
    client, _ = await serve(SCRIPT)
    r = await client.post("/v1/chat/completions", json={"messages": USER_HI, "return_token_ids": True})
    data = await r.json()
    assert data["prompt_token_ids"] == json.loads(PROMPT) and data["choices"][0]["token_ids"] == [A, B, C]
    assert "Streamproxy-Continuation" not in r.headers
    r = await client.post("/v1/completions", json={"prompt": ["hi", "yo"], "return_token_ids": True})
    choices = (await r.json())["choices"]
    assert [(c["prompt_token_ids"], c["token_ids"]) for c in choices] == [([104, 105], [A, B, C]), ([121, 111], [A, B, C])]
    r = await client.post("/v1/chat/completions", json={"messages": USER_HI})
    data = await r.json()
    assert "prompt_token_ids" not in data and "token_ids" not in data["choices"][0]
