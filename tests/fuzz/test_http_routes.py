"""Every route through HTTP on the fake engine: any body is a 200 or a 4xx in the route's shape.

The real handlers (their inline checks, generation, the stream encoders and
the filter chain: the app runs with --reasoning-parser qwen3 and the hermes
tool parser, and the fake engine's answer thinks and calls a tool) behind
aiohttp's test server. For every body (`answers.check`): never a 5xx,
nothing logged at ERROR (an unhandled exception, even one answered in
time), no traceback; a 4xx is OpenAI's exact error envelope (Anthropic's
on /v1/messages*); a 200 is JSON, or a stream that parses cleanly, ends
the way its API ends, and carries no in-band server error. A smaller budget than test_decoders.py,
which fuzzes the same decoders and preparation directly.
"""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import quote

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.fuzz.answers import check
from tests.fuzz.fuzz_support import WORDS, budget, request_bodies
from tests.fuzz.live import Live


@pytest.fixture(scope="module")
def live() -> Iterator[Live]:
    server = Live()
    yield server
    server.close()


@pytest.fixture(scope="module")
def pooling() -> Iterator[Live]:
    server = Live(runner="pooling")
    yield server
    server.close()


@budget(40)
@given(request_bodies("ChatCompletionRequest"))
def test_chat(live, body):
    check(live, "/v1/chat/completions", body, kind="chunks")


@budget(25)
@given(request_bodies("CompletionRequest"))
def test_completions(live, body):
    check(live, "/v1/completions", body, kind="chunks")


@budget(40)
@given(request_bodies("ResponsesRequest"))
def test_responses(live, body):
    check(live, "/v1/responses", body, kind="responses")


@budget(40)
@given(request_bodies("MessagesRequest"))
def test_messages(live, body):
    check(live, "/v1/messages", body, kind="anthropic", anthropic=True)


@budget(15)
@given(request_bodies("CountTokensRequest"))
def test_count_tokens(live, body):
    check(live, "/v1/messages/count_tokens", body, anthropic=True)


@budget(20)
@given(request_bodies("EmbeddingRequest"))
def test_embeddings(pooling, body):
    check(pooling, "/v1/embeddings", body)


@budget(15)
@given(st.sampled_from(["/tokenize", "/v1/tokenize"]), request_bodies("TokenizeRequest"))
def test_tokenize(live, path, body):
    check(live, path, body)


@budget(10)
@given(request_bodies("DetokenizeRequest"))
def test_detokenize(live, body):
    check(live, "/detokenize", body)


@budget(15)
@given(st.sampled_from(WORDS) | st.text(min_size=1, max_size=20))
def test_model_ids(live, model_id):
    check(live, "/v1/models/" + quote(model_id, safe=""), None, method="GET")
