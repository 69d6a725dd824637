"""LoRA on the real engine: a rank-8 random peft adapter (q_proj, v_proj) on the tiny 1-layer
Llama changes greedy decoding, the same with logprobs as without (both on the direct route), and the
run-time routes load and unload adapters in the running engine.

The server is this module's own (`--enable-lora`, the tiny model, `-O0`): the session's engine
has no LoRA. The adapter is made here with peft from a fixed seed, with random (not zero)
B matrices, so it is no identity. Nothing depends on what the random model says, only on
whether two answers are the same.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import requests

pytestmark = pytest.mark.engine

PROMPT = "The capital of France is"
GREEDY = {"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "ignore_eos": True}


def _adapter(base: Path, dest: Path, seed: int) -> Path:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM.from_pretrained(base, dtype=torch.float32)
    config = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False, task_type="CAUSAL_LM")
    get_peft_model(model, config).save_pretrained(dest)
    assert (dest / "adapter_config.json").is_file()
    return dest


@pytest.fixture(scope="module")
def lora_server(tmp_path_factory):
    from engine_adapter.default_model import build_tiny_model
    from tests.support.server import serve_process

    base = build_tiny_model(progress=False)
    folder = tmp_path_factory.mktemp("adapters")
    first, second = _adapter(base, folder / "rand", 0), _adapter(base, folder / "rand2", 1)
    args = [str(base), "--served-model-name", "tiny", "-O0", "--max-model-len", "512", "--max-num-seqs", "4",
            "--enable-lora", "--max-lora-rank", "8", "--max-loras", "2", "--lora-modules", f"rand={first}"]
    with serve_process(args, log_dir=tmp_path_factory.mktemp("lora"), name="lora", timeout=600, interval=0.5,
                       stop_timeout=60, env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"}) as server:
        yield server.base, second


def _text(base_url: str, model: str, **extra) -> str:
    resp = requests.post(base_url + "/v1/completions", json={"model": model, **GREEDY, **extra}, timeout=120)
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["model"] == model
    return body["choices"][0]["text"]


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
