"""The gateway in front of a real engine replica (the session's `streamproxy serve` of the
default model): the model renamed both ways, the usage chunk the gateway asked for removed,
and the replica's usage metered, cached prompt tokens included (vLLM caches prefixes by
default, so the same long prompt a second time reports cached tokens). Nothing here depends
on what the model says: only shapes, counts and equality between the two paths."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import requests

from harness.process import ServerProcess
from harness.server import start_gateway
from tests.support import sse, wait_until_sync

pytestmark = pytest.mark.engine

DEPLOYMENT = "smol-gateway"
# Long enough to fill several of the engine's 16-token KV blocks.
MESSAGES: list[Any] = [{"role": "system", "content": "You are a terse assistant for a boat shop. " * 12}, {"role": "user", "content": "Hello!"}]


@pytest.fixture(scope="module")
def gateway(engine_server: str, model_name: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Path]]:
    logs = tmp_path_factory.mktemp("gateway-engine")
    access = logs / "access.log"
    config = {
        "access_log": str(access),
        "deployments": [{"name": DEPLOYMENT, "id": "dep-smol", "served_model": model_name, "upstreams": [engine_server]}],
    }
    gw = start_gateway(config, logs)
    try:
        yield gw, access
    finally:
        gw.stop()


def _lines(access: Path) -> list[dict]:
    return [orjson.loads(line) for line in access.read_text().splitlines() if line.strip()]


def test_stream_through_the_gateway_equals_the_replicas_answer(gateway, engine_server, model_name):
    gw, access = gateway
    body: dict[str, Any] = {"messages": MESSAGES, "max_tokens": 12, "temperature": 0, "stream": True}
    direct = requests.post(engine_server + "/v1/chat/completions", json={**body, "model": model_name}, timeout=120)
    relayed = requests.post(gw.url("/v1/chat/completions"), json={**body, "model": DEPLOYMENT}, timeout=120)
    assert relayed.status_code == 200 and relayed.headers["X-Accel-Buffering"] == "no"
    assert sse.verdict(relayed.content) == "done"
    chunks = sse.payloads(relayed.content)
    assert {c["model"] for c in chunks} == {DEPLOYMENT}
    assert all(c["choices"] for c in chunks)  # the usage chunk the gateway asked for is not passed on

    def text(payloads: list[dict]) -> str:
        return "".join(c["choices"][0]["delta"].get("content") or "" for c in payloads if c["choices"])

    assert text(chunks) == text(sse.payloads(direct.content))  # greedy: the same answer either way


def test_the_replicas_usage_is_metered_cached_tokens_included(gateway, model_name):
    gw, access = gateway
    body: dict[str, Any] = {"model": DEPLOYMENT, "messages": MESSAGES, "max_tokens": 4, "temperature": 0}
    answers = [requests.post(gw.url("/v1/chat/completions"), json={**body, "stream": stream}, timeout=120) for stream in (False, True, True)]
    assert [a.status_code for a in answers] == [200, 200, 200]
    usage = answers[0].json()["usage"]
    assert answers[0].json()["model"] == DEPLOYMENT
    ids = [a.headers["X-Request-Id"] for a in answers]
    # The access log is written from a queue by a thread of its own: wait for these three lines.
    assert wait_until_sync(lambda: {line["request_id"] for line in _lines(access)} >= set(ids), 30, interval=0.1)
    by_id = {line["request_id"]: line for line in _lines(access)}
    lines = [by_id[i] for i in ids]
    assert [line["usage_source"] for line in lines] == ["billed"] * 3
    assert {line["deployment"] for line in lines} == {DEPLOYMENT}
    assert lines[0]["prompt_tokens"] == usage["prompt_tokens"] and lines[0]["completion_tokens"] == usage["completion_tokens"]
    # The same prompt again: the replica reports cached prefix tokens, in a stream's usage too.
    assert lines[2]["prompt_tokens"] == usage["prompt_tokens"]
    assert 0 < lines[2]["cached_prompt_tokens"] <= usage["prompt_tokens"]
