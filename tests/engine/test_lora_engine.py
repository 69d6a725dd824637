"""LoRA on the real engine: a rank-8 random peft adapter (q_proj, v_proj) on the tiny 1-layer
Llama changes greedy decoding, the same with logprobs as without (both on the direct route), gives the
same text as `vllm serve` with the same adapter, feeds vLLM's `vllm:lora_requests_info`, and the
run-time routes load and unload adapters in the running engine.

The servers are this module's own (`--enable-lora`, the tiny model, `-O0`): the session's engine
has no LoRA. streamproxy and vLLM's own api_server (the reference) start side by side with the
same engine flags and adapter. The adapter is made here with peft from a fixed seed, with random
(not zero) B matrices, so it is no identity. Nothing depends on what the random model says, only
on whether two answers are the same.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from harness.process import ServerProcess
from harness.server import CPU_DTYPE, ENGINE_IN_CORE, VLLM_SERVER, launch
from harness.waiting import wait_until_sync
from tests.conftest import START_TIMEOUT
from tests.support import prestart

pytestmark = pytest.mark.engine

PROMPT = "The capital of France is"
GREEDY: dict[str, Any] = {"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "ignore_eos": True}


def _adapter(base: Path, dest: Path, seed: int) -> Path:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM.from_pretrained(base, dtype=torch.float32)
    config = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False, task_type="CAUSAL_LM")
    get_peft_model(model, config).save_pretrained(str(dest))
    assert (dest / "adapter_config.json").is_file()
    return dest


SECOND = "rand2"  # the second adapter's folder, beside the servers' logs
ENGINE_ARGS = ["--served-model-name", "tiny", "-O0", *CPU_DTYPE, "--max-model-len", "512", "--max-num-seqs", "4",
               "--enable-lora", "--max-lora-rank", "8", "--max-loras", "2"]


def _launch(logs: Path) -> list[ServerProcess]:
    """streamproxy and vLLM's api_server, both on the tiny model with adapter `rand`, launched side by side."""
    from engine_adapter.default_model import build_tiny_model

    base = build_tiny_model(progress=False)
    first = _adapter(base, logs / "rand", 0)
    _adapter(base, logs / SECOND, 1)  # for the run-time load route
    args = [*ENGINE_ARGS, "--lora-modules", f"rand={first}"]
    env = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1", **ENGINE_IN_CORE}
    return [launch([str(base), *args], logs, "lora", env),
            launch(["--model", str(base), *args], logs, "vllm-lora", env, command=None, module=VLLM_SERVER)]


# Started ahead, while earlier tests run (tests/support/prestart.py).
prestart.define("lora_servers", _launch)


@pytest.fixture(scope="module")
def lora_servers():
    """(streamproxy's URL, vLLM's URL, the second adapter's folder), both ready."""
    with prestart.ready("lora_servers", START_TIMEOUT) as (ours, theirs):
        yield ours.base, theirs.base, ours.stdout_path.parent / SECOND


@pytest.fixture(scope="module")
def lora_server(lora_servers):
    return lora_servers[0], lora_servers[2]


@pytest.fixture(scope="module")
def vllm_lora_server(lora_servers):
    return lora_servers[1]


def _texts(base_url: str, model: str, **extra) -> list[str]:
    resp = requests.post(base_url + "/v1/completions", json={"model": model, **GREEDY, **extra}, timeout=120)
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["model"] == model
    return [choice["text"] for choice in sorted(body["choices"], key=lambda c: c["index"])]


def _text(base_url: str, model: str, **extra) -> str:
    (text,) = _texts(base_url, model, **extra)
    return text


def _stream_text(base_url: str, model: str) -> str:
    resp = requests.post(base_url + "/v1/completions", json={"model": model, **GREEDY, "stream": True}, timeout=120, stream=True)
    assert resp.status_code == 200
    text = ""
    for line in resp.iter_lines():
        if line.startswith(b"data: {"):
            text += "".join(c["text"] for c in json.loads(line[6:])["choices"])
    return text


def test_the_adapter_is_listed_with_its_parent(lora_server):
    base_url, _ = lora_server
    cards = {c["id"]: c for c in requests.get(base_url + "/v1/models", timeout=10).json()["data"]}
    assert cards["rand"]["parent"] == "tiny" and cards["rand"]["root"].endswith("rand")


def test_the_adapter_changes_greedy_output_on_both_output_routes(lora_server):
    base_url, _ = lora_server
    base = _text(base_url, "tiny")
    direct = _text(base_url, "rand")  # the direct route
    with_logprobs = _text(base_url, "rand", logprobs=1)  # the direct route's logprobs too
    assert direct != base
    assert with_logprobs == direct
    assert _stream_text(base_url, "rand") == direct
    assert _text(base_url, "tiny") == base  # the base is untouched by the adapter's requests
    chat = requests.post(base_url + "/v1/chat/completions", timeout=120, json={
        "model": "rand", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 8, "temperature": 0})
    assert chat.status_code == 200 and chat.json()["model"] == "rand"


def test_load_and_unload_at_run_time(lora_server):
    base_url, second = lora_server
    resp = requests.post(base_url + "/v1/load_lora_adapter", json={"lora_name": "rand2", "lora_path": str(second)}, timeout=120)
    assert resp.status_code == 200, resp.text
    assert _text(base_url, "rand2") not in (_text(base_url, "tiny"), _text(base_url, "rand"))

    bad = requests.post(base_url + "/v1/load_lora_adapter", json={"lora_name": "bad", "lora_path": str(second.parent / "missing")}, timeout=120)
    assert bad.status_code == 400, bad.text
    assert bad.json()["error"]["param"] == "lora_path"
    assert requests.get(base_url + "/health", timeout=10).status_code == 200  # the engine survived it

    resp = requests.post(base_url + "/v1/unload_lora_adapter", json={"lora_name": "rand2"}, timeout=10)
    assert resp.status_code == 200
    gone = requests.post(base_url + "/v1/completions", json={"model": "rand2", **GREEDY}, timeout=10)
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "model_not_found"


PROMPTS = [PROMPT, "Once upon a time", "def fibonacci(n):"]


def test_the_same_adapter_through_vllm_serve_gives_the_same_text(lora_server, vllm_lora_server):
    """Each request goes to both servers in the same shape (one prompt, or the batch of three), so
    the engine batches the same sequences together on both."""
    ours, _ = lora_server
    theirs_base, theirs = _texts(vllm_lora_server, "tiny", prompt=PROMPTS), _texts(vllm_lora_server, "rand", prompt=PROMPTS)
    assert all(a != b for a, b in zip(theirs, theirs_base))  # vLLM's server applies the adapter too: no vacuous match
    assert _texts(ours, "rand", prompt=PROMPTS) == theirs  # the direct route
    assert _texts(ours, "rand", prompt=PROMPTS, logprobs=1) == theirs  # with logprobs (also the direct route since n/logprobs joined it)
    assert _texts(ours, "tiny", prompt=PROMPTS) == theirs_base
    theirs_one = [_text(vllm_lora_server, "rand", prompt=p) for p in PROMPTS]
    assert [_text(ours, "rand", prompt=p) for p in PROMPTS] == theirs_one  # one prompt a request


def _lora_info(base_url: str) -> list[tuple[dict[str, str], float]]:
    """vllm:lora_requests_info's series: (labels, value: when it was last set, Unix time)."""
    text = requests.get(base_url + "/metrics", timeout=10).text
    return [(s.labels, s.value) for fam in text_string_to_metric_families(text) if fam.name == "vllm:lora_requests_info"
            for s in fam.samples if s.name == "vllm:lora_requests_info"]


def _metric(base_url: str, name: str) -> float:
    text = requests.get(base_url + "/metrics", timeout=10).text
    return sum(s.value for fam in text_string_to_metric_families(text) for s in fam.samples if s.name == name)


def _direct_requests(base_url: str) -> float:
    return _metric(base_url, "streamproxy_direct_requests_total")


def _latest(series: list[tuple[dict[str, str], float]]) -> dict[str, str]:
    return max(series, key=lambda item: item[1])[0]


def test_adapter_requests_on_the_direct_route_feed_vllms_lora_metrics(lora_server, vllm_lora_server):
    """As vLLM's OutputProcessor does: an adapter request is counted running (and waiting) under
    its adapter's name while it runs, and no longer once it is finished or aborted."""
    ours, _ = lora_server
    since, direct = time.time(), _direct_requests(ours)
    _text(ours, "rand")  # n=1, no logprobs: the direct route
    assert _direct_requests(ours) == direct + 1
    series = _lora_info(ours)
    assert any(labels["running_lora_adapters"] == "rand" and value >= since for labels, value in series), series
    # Finished: the last step recorded shows no adapter request running or waiting.
    assert _latest(series) == {"max_lora": "2", "running_lora_adapters": "", "waiting_lora_adapters": ""}, series

    # Aborted mid-stream (the client leaves): forgotten too; a base request's steps show nothing running.
    successes = _metric(ours, "vllm:request_success_total")
    with requests.post(ours + "/v1/completions", json={"model": "rand", **GREEDY, "max_tokens": 480, "stream": True},
                       stream=True, timeout=120) as resp:
        assert resp.status_code == 200
        next(line for line in resp.iter_lines() if line.startswith(b"data: {"))
    assert wait_until_sync(lambda: _metric(ours, "streamproxy_active_streams") == 0, 30)
    assert _direct_requests(ours) == direct + 2
    assert _metric(ours, "vllm:request_success_total") == successes  # it was aborted, not finished
    since = time.time()
    _text(ours, "tiny")
    series = _lora_info(ours)
    assert _latest(series)["running_lora_adapters"] == "" and _latest(series)["waiting_lora_adapters"] == "", series
    assert max(value for _, value in series) >= since

    # vLLM's own server, after the same request: the same family, labels and label values (vLLM lists an
    # adapter with a request in either state under both labels: its count of the other one is 0).
    _text(vllm_lora_server, "rand")
    theirs = _lora_info(vllm_lora_server)
    with_rand = [labels for labels, _ in theirs if labels["running_lora_adapters"] == "rand"]
    assert with_rand and all(labels in [ours_labels for ours_labels, _ in series] for labels in with_rand), (theirs, series)
    assert _latest(theirs) == _latest(series)
