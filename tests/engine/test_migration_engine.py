"""Stream migration against vLLM's own server (the session's `vllm_server`, the default model):
its `return_token_ids` chunks and token-id prompts, as the gateway relies on them.

The gateway (a process) has two replicas that are one vLLM: through a TCP proxy that cuts
a stream after its k-th event when armed, and directly. A greedy stream cut by the proxy
goes on on the direct one; the client's bytes equal vLLM's own unbroken answer to the same
request without `return_token_ids` (its `id` and `created` aside, and the model renamed).
Nothing depends on what the model says: only equality between the two paths.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from harness.process import ServerProcess
from harness.server import start_gateway
from tests.support import sse

pytestmark = pytest.mark.engine

DEPLOYMENT = "smol-migrating"
MESSAGES = [{"role": "user", "content": "Count from one to twenty in words."}]


class CuttingProxy:
    """127.0.0.1:port -> the target; `arm(k)`: the next POST's response is cut after its k-th event."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.armed: int | None = None
        self.cuts = 0
        self.loop = asyncio.new_event_loop()
        self.port = 0
        started = threading.Event()
        threading.Thread(target=self._run, args=(started,), daemon=True).start()
        started.wait(10)

    def arm(self, k: int) -> None:
        self.armed = k

    def _run(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        started.set()
        self.loop.run_forever()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        victim: list[int | None] = [None]  # events left before the cut, for this connection's current response

        async def upward() -> None:
            while data := await reader.read(65536):
                if self.armed is not None and data.startswith(b"POST /v1/"):
                    victim[0], self.armed = self.armed, None
                up_writer.write(data)
                await up_writer.drain()
            up_writer.close()

        async def downward() -> None:
            while data := await up_reader.read(65536):
                left = victim[0]
                if left is not None:
                    at = 0
                    while left > 0 and (found := data.find(b"\n\n", at)) >= 0:
                        at, left = found + 2, left - 1
                    if left == 0:
                        writer.write(data[:at])
                        await writer.drain()
                        self.cuts += 1
                        writer.transport.abort()
                        up_writer.transport.abort()
                        return
                    victim[0] = left
                writer.write(data)
                await writer.drain()
            writer.close()

        try:
            await asyncio.gather(upward(), downward())
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()
            up_writer.close()


@pytest.fixture(scope="module")
def migrating(vllm_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, CuttingProxy]]:
    proxy = CuttingProxy(int(vllm_server.rsplit(":", 1)[1]))
    model = requests.get(vllm_server + "/v1/models", timeout=10).json()["data"][0]["id"]
    config = {"deployments": [{"name": DEPLOYMENT, "id": "dep-migrating", "served_model": model,
                               "upstreams": [f"http://127.0.0.1:{proxy.port}", vllm_server]}],
              "upstream": {"policy": "round_robin", "consecutive_errors": 1000}}
    gw = start_gateway(config, tmp_path_factory.mktemp("gateway-migration"))
    try:
        yield gw, proxy
    finally:
        gw.stop()


def _normal(raw: bytes, model: str = DEPLOYMENT) -> bytes:
    """`id` and `created` fixed, the model named as the gateway names it."""
    raw = re.sub(rb'"(id|created)":("[^"]*"|\d+)', rb'"\1":0', raw)
    return re.sub(rb'"model":"[^"]*"', b'"model":"' + model.encode() + b'"', raw)


def _events(raw: bytes) -> list[bytes]:
    return [e + b"\n\n" for e in raw.split(b"\n\n") if e]


def _cut_run(gw: ServerProcess, proxy: CuttingProxy, path: str, body: dict[str, Any], k: int) -> bytes:
    """The request through the gateway until one went through the proxy and was cut (round robin: at most two)."""
    for _ in range(2):
        before = proxy.cuts
        proxy.arm(k)
        relayed = requests.post(gw.url(path), json={**body, "model": DEPLOYMENT}, timeout=120)
        assert relayed.status_code == 200
        if proxy.cuts == before + 1:
            return relayed.content
    raise AssertionError("no request went through the cutting proxy")


def _direct(base: str, path: str, body: dict[str, Any]) -> bytes:
    """vLLM's own answer, asked twice: the second finds the prompt in its prefix cache, as the gateway's will
    (a cached prompt's KV is not computed as a fresh one's: the same answer needs the same cache)."""
    requests.post(base + path, json=body, timeout=120)
    return requests.post(base + path, json=body, timeout=120).content


def _ids(chunks: list[dict[str, Any]]) -> list[int]:
    return [t for c in chunks if c["choices"] for t in c["choices"][0].get("token_ids") or ()]


def _text(chunks: list[dict[str, Any]]) -> str:
    return "".join(c["choices"][0].get("text") or (c["choices"][0].get("delta") or {}).get("content") or "" for c in chunks if c["choices"])


# Greedy decoding after the break equals an unbroken run's only up to the engine's numerics: the
# continuation computes the generated tokens' KV in one prefill (those of the last, partial block:
# the full ones are in the prefix cache), the unbroken run in decode steps, and a near tie can flip
# (seen on CPU with the default model). So the part after the break is held against vLLM's own
# answer to the continuation request, which finds the same cache and computes the same.
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "chat": ("/v1/chat/completions", {"messages": MESSAGES}),
    "completions": ("/v1/completions", {"prompt": "One, two, three,"}),
}


@pytest.mark.parametrize("k", [1, 3, 6])
@pytest.mark.parametrize("case", list(CASES))
def test_a_greedy_stream_cut_by_its_replica_goes_on_with_no_token_missing_or_twice(migrating, vllm_server, case, k):
    gw, proxy = migrating
    model = requests.get(vllm_server + "/v1/models", timeout=10).json()["data"][0]["id"]
    path, prompt = CASES[case]
    body: dict[str, Any] = {**prompt, "max_tokens": 16, "temperature": 0, "stream": True, "return_token_ids": True,
                            "stream_options": {"include_usage": True}}
    direct = _direct(vllm_server, path, {**body, "model": model})
    got = _cut_run(gw, proxy, path, body, k)
    assert sse.verdict(got) == "done"
    assert [_normal(e) for e in _events(got)[:k]] == [_normal(e) for e in _events(direct)[:k]]
    chunks = sse.payloads(got)
    assert len({c["id"] for c in chunks}) == 1 and len(_ids(chunks)) == 16 == chunks[-1]["usage"]["completion_tokens"]
    assert chunks[-1]["usage"]["prompt_tokens"] == sse.payloads(direct)[-1]["usage"]["prompt_tokens"]
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"
    before = sse.payloads(b"".join(_events(got)[:k]), done=False)
    prompt_ids = before[0].get("prompt_token_ids") or before[0]["choices"][0]["prompt_token_ids"]
    done = _ids(before)
    continuation = {"model": model, "prompt": prompt_ids + done, "max_tokens": 16 - len(done), "temperature": 0, "stream": True,
                    "return_token_ids": True}
    rest = sse.payloads(requests.post(vllm_server + "/v1/completions", json=continuation, timeout=120).content)
    after = sse.payloads(b"".join(_events(got)[k:]))
    assert _ids(after) == _ids(rest) and _text(after) == _text(rest)


@pytest.mark.parametrize("k", [2, 5])
def test_the_ids_the_gateway_asked_for_are_stripped_to_vllm_s_own_bytes(migrating, vllm_server, k):
    gw, proxy = migrating
    model = requests.get(vllm_server + "/v1/models", timeout=10).json()["data"][0]["id"]
    body: dict[str, Any] = {"messages": MESSAGES, "max_tokens": 12, "temperature": 0, "stream": True,
                            "stream_options": {"include_usage": True}}
    direct = _direct(vllm_server, "/v1/chat/completions", {**body, "model": model})
    got = _cut_run(gw, proxy, "/v1/chat/completions", body, k)
    assert b'"token_ids":[' not in got and b'"prompt_token_ids":[' not in got and sse.verdict(got) == "done"
    assert [_normal(e) for e in _events(got)[:k]] == [_normal(e) for e in _events(direct)[:k]]
    assert len(_events(got)) == len(_events(direct))
    assert sse.payloads(got)[-1]["usage"] == sse.payloads(direct)[-1]["usage"]
