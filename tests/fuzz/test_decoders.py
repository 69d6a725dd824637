"""Every route's request path, called directly: any body ends in a 4xx APIError or is accepted.

The bulk of the request fuzzing budget (no sockets, a few hundred examples a
second): `http.routes.body.decode` with the route's decoder, then the sans-IO
preparation the route runs (`core.prepare` for chat, Responses and
Anthropic after their `to_chat`; the sampling, prompt and structured-output
checks of completions; the input checks of embeddings and tokenize, as the
handlers make them). Whatever the body, the only exception allowed out is an
`APIError` with a 4xx status whose error bodies (OpenAI's and Anthropic's)
encode; anything else (a TypeError, a RecursionError, a 500) is a bug.
`test_http_routes.py` runs the real handlers over HTTP on a smaller budget.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
import orjson
from hypothesis import event, given
from hypothesis import strategies as st

from engine_adapter.fake import FakeEngine
from streamproxy.apis.anthropic import convert as anthropic_convert
from streamproxy.apis.anthropic import errors as anthropic_errors
from streamproxy.apis.anthropic import protocol as anthropic
from streamproxy.apis.responses import convert as responses_convert
from streamproxy.apis.responses import protocol as responses
from streamproxy.config import Settings
from streamproxy.core import params as P
from streamproxy.core import structured as S
from streamproxy.core.prepare import prepare, prompt, renamed, render_prompt
from streamproxy.errors import APIError
from streamproxy.http.routes.body import decode, nesting
from streamproxy.protocol import embeddings, openai_chat, openai_completions, tokenize
from tests.fuzz.fuzz_support import budget, request_bodies

ENGINE = FakeEngine(record=False)
SETTINGS = Settings(engine="fake", enable_auto_tool_choice=True, tool_call_parser="hermes", reasoning_parser="qwen3")


def chat(body: bytes) -> None:
    prepare(SETTINGS, ENGINE, decode(body, openai_chat.decode_request))


def completions(body: bytes) -> None:
    # completions.completions, up to generation.run
    req = decode(body, openai_completions.decode_request)
    prompts = P.completion_prompts(req.prompt)
    prompt_ids = ENGINE.encode(prompts[0]) if isinstance(prompts[0], str) else list(prompts[0])
    P.sampling_params(
        req, prompt_len=len(prompt_ids), max_model_len=ENGINE.info.max_model_len, requested_max_tokens=req.max_tokens,
        max_n=SETTINGS.max_n, vocab_size=ENGINE.info.vocab_size, logprobs=P.completion_logprobs(req),
    )
    S.constraint(req)


def responses_(body: bytes) -> None:
    req = decode(body, responses.decode_request)
    with renamed(responses_convert.CHAT_NAMES):
        prepare(SETTINGS, ENGINE, responses_convert.to_chat(req))


def messages(body: bytes) -> None:
    req = decode(body, anthropic.decode_request)
    with renamed(anthropic_convert.CHAT_NAMES):
        prepare(SETTINGS, ENGINE, anthropic_convert.to_chat(req), cap_to_context=True)


def count_tokens(body: bytes) -> None:
    req = decode(body, anthropic.decode_count_request)
    with renamed(anthropic_convert.CHAT_NAMES):
        prompt(SETTINGS, ENGINE, anthropic_convert.to_chat(req), counting=True)


def embed(body: bytes) -> None:
    req = decode(body, embeddings.decode_request)
    P.completion_prompts(req.input)


def tokenize_(body: bytes) -> None:
    req = decode(body, tokenize.decode_tokenize)
    if req.messages is not None:
        render_prompt(SETTINGS, ENGINE, req.messages, req)


def detokenize(body: bytes) -> None:
    decode(body, tokenize.decode_detokenize)


def check(step: Callable[[bytes], Any], body: bytes) -> None:
    try:
        step(body)
        event("accepted")
    except APIError as exc:
        event(f"{exc.status} {exc.code} {exc.param}"[:60])
        assert 400 <= exc.status < 500, (exc.status, exc.message)
        assert exc.param is None or isinstance(exc.param, str)
        orjson.loads(exc.to_json())
        orjson.loads(anthropic_errors.error_json(exc))
    except Exception as exc:
        raise AssertionError(f"{type(exc).__name__}: {exc} on the body {body[:3000]!r}") from exc


@budget(150)
@given(request_bodies("ChatCompletionRequest"))
def test_chat(body):
    check(chat, body)


@budget(100)
@given(request_bodies("CompletionRequest"))
def test_completions(body):
    check(completions, body)


@budget(150)
@given(request_bodies("ResponsesRequest"))
def test_responses(body):
    check(responses_, body)


@budget(150)
@given(request_bodies("MessagesRequest"))
def test_messages(body):
    check(messages, body)


@budget(50)
@given(request_bodies("CountTokensRequest"))
def test_count_tokens(body):
    check(count_tokens, body)


@budget(50)
@given(request_bodies("EmbeddingRequest"))
def test_embeddings(body):
    check(embed, body)


@budget(50)
@given(request_bodies("TokenizeRequest"))
def test_tokenize(body):
    check(tokenize_, body)


@budget(30)
@given(request_bodies("DetokenizeRequest"))
def test_detokenize(body):
    check(detokenize, body)


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


_tricky_text = st.text(alphabet='[]{}"\\ab', max_size=8)
_nested = st.recursive(
    st.none() | st.integers() | _tricky_text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_tricky_text, inner, max_size=3),
    max_leaves=20,
)


@budget(200)
@given(_nested)
def test_nesting_counts_brackets_outside_strings(value):
    assert nesting(msgspec.json.encode(value)) == _depth(value)
