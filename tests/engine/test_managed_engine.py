"""A managed deployment of the real default model: the gateway boots `streamproxy serve`
with the model on the first request (503 deployment_waking + Retry-After), the OpenAI
SDK's own retries wait through the boot, and the answer comes from the booted replica.
Nothing depends on what the model says."""

from __future__ import annotations

import openai
import pytest
import requests

from engine_adapter.default_model import ensure_default_model
from harness.server import ENGINE_IN_CORE
from tests.support.gateway import gateway_process

pytestmark = pytest.mark.engine


def test_a_parked_model_deployment_boots_on_demand_and_the_sdk_waits_through_it(tmp_path):
    # The gateway's environment, which its replica inherits (not this process's: a server launched ahead meanwhile
    # must not): a small KV cache (the session engine holds its own), the model in the engine-core process.
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", **ENGINE_IN_CORE}
    model = ensure_default_model()
    yaml = (
        "deployments:\n"
        "  - name: smol\n    id: dep-smol\n    launch:\n"
        f"      model: {model}\n"
        '      args: ["-O0", "--dtype", "float32", "--max-model-len", "1024", "--max-num-seqs", "4"]\n'
        "      idle_park_after: 0\n      boot_guess: 2\n"
    )
    with gateway_process(tmp_path, yaml, env=env) as gw:
        first = requests.post(gw.url("/v1/chat/completions"), json={"model": "smol", "messages": [{"role": "user", "content": "Hi"}]}, timeout=60)
        assert first.status_code == 503 and first.json()["error"]["code"] == "deployment_waking"
        assert first.headers["Retry-After"] == "2"
        # The SDK waits Retry-After (boot_guess: 2 s, not the floor of 1) between its tries: it sees the replica up within 2 s.
        client = openai.OpenAI(base_url=gw.url("/v1"), api_key="unused", max_retries=300)
        answer = client.chat.completions.create(model="smol", messages=[{"role": "user", "content": "Hi"}], max_tokens=8, temperature=0)
        assert answer.model == "smol" and isinstance(answer.choices[0].message.content, str)
        assert answer.usage is not None and answer.usage.completion_tokens >= 1
        info = gw.deployment("dep-smol")
        assert info["state"] == "ready" and info["boots"] == 1 and info["last_boot_seconds"] > 0
        (replica,) = info["replicas"]
        assert replica["pid"] in gw.replica_pids()
