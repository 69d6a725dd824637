"""The real engine shared by `--api-server-count 2`, and `--data-parallel-size 2` in one process.

Kept cheap: the 1-layer tiny model (float32, -O0), a few tokens per request.
Two API servers share one engine core through vLLM's own multi-client
machinery (engine_adapter/vllm_shared.py): both serve (the access log's
`pid`), and a client that goes away mid-stream is aborted in the engine core
(streamproxy's abort counter, and no request left held); when the engine
core is killed, the parent ends them all and exits 1, leaving no engine
process behind. With
`--data-parallel-size 2` vLLM's AsyncLLM starts two engine cores and a DP
coordinator itself and balances requests between them: both engines generate
(`vllm:generation_tokens_total{engine=...}`).
"""

from __future__ import annotations

import concurrent.futures
import os
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import requests

from engine_adapter.default_model import build_tiny_model
from harness.process import ServerProcess
from harness.server import ENGINE_IN_CORE, launch
from tests.support import prestart, wait_until_sync
from tests.support.workers import api_servers, launch_api_servers

pytestmark = pytest.mark.engine

TINY = ("--dtype", "float32", "-O0", "--max-model-len", "512", "--max-num-seqs", "16", "--served-model-name", "tiny")


def _complete(base: str, max_tokens: int = 4) -> dict:
    resp = requests.post(base + "/v1/completions", json={"model": "tiny", "prompt": "Hello there", "max_tokens": max_tokens,
                                                         "ignore_eos": True}, timeout=120)
    assert resp.status_code == 200, resp.text
    return resp.json()


def _health(base: str) -> int:
    try:
        return requests.get(base + "/health", timeout=5).status_code
    except requests.RequestException:
        return 0  # gone: not 200 either


def _engine() -> tuple[str, ...]:
    return ("--model", str(build_tiny_model(progress=False)), *TINY)


# Launched ahead, while earlier tests run (tests/support/prestart.py), and handed over unwaited: `api_servers`
# waits for every worker, and may start the parent again (`retry_unanswered_start`).
prestart.define("shared_core_parent", lambda logs: [launch_api_servers(2, engine=_engine(), log_dir=logs)])


@pytest.fixture
def shared_core_parent() -> ServerProcess:
    (server,) = prestart.take("shared_core_parent")
    return server


def test_two_api_servers_share_the_engine_core_and_abort_a_gone_client(shared_core_parent: ServerProcess) -> None:
    first = shared_core_parent
    with api_servers(2, engine=_engine(), timeout=600, retry_unanswered_start=True, log_dir=first.stdout_path.parent,
                     launched=first) as srv:
        answers = [_complete(srv.base) for _ in range(16)]  # a connection each
        assert all(a["usage"]["completion_tokens"] == 4 for a in answers)
        assert len({a["id"] for a in answers}) == 16
        assert wait_until_sync(lambda: len([d for d in srv.log_lines() if d["path"] == "/v1/completions"]) == 16, 10)
        assert {d["pid"] for d in srv.log_lines() if d["path"] == "/v1/completions"} == srv.pids()
        # vLLM's series summed over both processes (multiprocess mode); the inter-token latencies,
        # fed once per engine step (vllm_itl.py), are a gap per token after each request's first.
        text = srv.metrics_text()
        assert srv.metric("vllm:generation_tokens_total", text) == 16 * 4
        assert srv.metric("vllm:inter_token_latency_seconds_count", text) == 16 * 3
        assert srv.metric("vllm:inter_token_latency_seconds_bucket", text, le="+Inf") == 16 * 3

        resp = requests.post(srv.url("/v1/completions"), json={"model": "tiny", "prompt": "Hello", "max_tokens": 400,
                                                               "ignore_eos": True, "stream": True}, stream=True, timeout=120)
        assert resp.status_code == 200
        assert next(line for line in resp.iter_lines() if line).startswith(b"data: ")
        resp.close()
        assert wait_until_sync(lambda: srv.metric("streamproxy_engine_aborts_total") == 1, 60), srv.metrics_text()
        assert wait_until_sync(lambda: srv.metric("streamproxy_engine_requests") == 0, 60)
        assert srv.metric("streamproxy_client_disconnects_total") == 1
        assert _complete(srv.base)["usage"]["completion_tokens"] == 4  # the engine core serves on

        # The shared engine core dies: the parent sees it (vLLM's liveness monitor), every API server
        # answers 503 engine_dead and exits, the parent exits 1, and no engine process is left behind.
        parent = psutil.Process(srv.server.proc.pid)
        engine_procs = [p for p in parent.children(recursive=True) if "VLLM::" in " ".join(p.cmdline())]
        core = next(p for p in engine_procs if "EngineCore" in " ".join(p.cmdline()))
        core.kill()
        assert wait_until_sync(lambda: _health(srv.base) != 200, 60)
        assert srv.server.proc.wait(120) == 1, srv.server.log()[-4000:]
        assert "the shared engine died" in srv.server.log()
        _, alive = psutil.wait_procs(engine_procs, timeout=30)
        assert not alive, alive


def _one_core_each() -> dict[str, str]:
    """VLLM_CPU_OMP_THREADS_BIND with half of this process's CPUs for each of the two engines' workers: by default
    ("auto") vLLM binds each engine's worker to the first CPUs of the first NUMA node less one kept for the scheduler,
    so on 2 cores both workers ran on CPU 0."""
    cpus = sorted(os.sched_getaffinity(0))
    half = len(cpus) // 2
    if half == 0:
        return {}
    return {"VLLM_CPU_OMP_THREADS_BIND": f"{','.join(map(str, cpus[:half]))}|{','.join(map(str, cpus[half:]))}"}


def _dp2(logs: Path) -> list[ServerProcess]:
    args = ["--model", str(build_tiny_model(progress=False)), *TINY, "--data-parallel-size", "2", "--access-log", "off"]
    # Each engine core runs its model itself (ENGINE_IN_CORE): no worker process to import torch and vLLM again, two
    # fewer in all; what this test checks is the balancing between the two engines, not their process tree.
    return [launch(args, logs, "dp2", {**_one_core_each(), **ENGINE_IN_CORE})]


# Started ahead, while earlier tests run (tests/support/prestart.py).
prestart.define("dp2_server", _dp2)


@pytest.fixture
def dp2_server() -> Iterator[ServerProcess]:
    with prestart.ready("dp2_server", 600) as (server,):
        yield server


def test_data_parallel_two_engine_cores_in_one_process(dp2_server: ServerProcess) -> None:
    srv = dp2_server
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: _complete(srv.base, 32), range(16)))
    assert all(a["usage"]["completion_tokens"] == 32 for a in answers)
    text = requests.get(srv.url("/metrics"), timeout=10).text
    per_engine: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("vllm:generation_tokens_total{"):
            engine = line.split('engine="', 1)[1].split('"', 1)[0]
            per_engine[engine] = per_engine.get(engine, 0.0) + float(line.rsplit(" ", 1)[1])
    assert set(per_engine) == {"0", "1"} and all(v > 0 for v in per_engine.values()), per_engine
    assert sum(per_engine.values()) == 16 * 32
    # Each engine's inter-token latencies in its own series: a gap per token after a request's first.
    for engine, tokens in per_engine.items():
        gaps = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("vllm:inter_token_latency_seconds_count{") and f'engine="{engine}"' in line)
        assert gaps == tokens * 31 / 32, (engine, gaps, tokens)
