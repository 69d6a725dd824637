"""`streamproxy gateway --config FILE.yaml` as a process: the example config parses, the
file's other keys are the edge's flags, requests are relayed, and SIGTERM drains: a stream
under way finishes, then the process exits 0."""

from __future__ import annotations

import signal
from pathlib import Path

import requests

from streamproxy.gateway.config import split
from tests.gateway.gateway_support import DEPLOYMENT, DEPLOYMENT_ID, SERVED, chat
from tests.support import sse
from tests.support.server import FAKE_ARGS, ROOT, serve_process, start_gateway


def test_the_example_config_parses():
    config, flags = split((ROOT / "configs" / "gateway.yaml").read_text())
    assert [(d.name, d.id, d.upstream_model) for d in config.deployments] == [("support-bot", "dep-7f3a", "fake"), ("smol", "dep-smol", "smol")]
    assert config.deployments[1].launch is not None and not config.deployments[1].upstreams
    assert flags["sse_heartbeat"] == 15 and flags["max_body_bytes"] == 8388608


def test_a_gateway_process_relays_takes_its_flags_from_the_file_and_drains_on_sigterm(tmp_path: Path):
    replica_args = [*FAKE_ARGS, "--served-model-name", SERVED, "--fake-text", " word", "--fake-token-delay", "0.05"]
    with serve_process(replica_args, log_dir=tmp_path, name="replica") as replica:
        config = {
            "max_body_bytes": 4096,
            "drain_timeout": 30,
            "access_log": "off",
            "deployments": [{"name": DEPLOYMENT, "id": DEPLOYMENT_ID, "served_model": SERVED, "upstreams": [replica.base]}],
        }
        gw = start_gateway(config, tmp_path)
        try:
            answer = requests.post(gw.url("/v1/chat/completions"), json=chat(max_tokens=2), timeout=30)
            assert answer.status_code == 200 and answer.json()["model"] == DEPLOYMENT
            too_big = requests.post(gw.url("/v1/chat/completions"), json=chat(pad="x" * 5000), timeout=30)
            assert too_big.status_code == 413 and too_big.json()["error"]["code"] == "request_too_large"
            with requests.post(gw.url("/v1/chat/completions"), json=chat(stream=True, max_tokens=20), stream=True, timeout=30) as resp:
                assert resp.status_code == 200
                reading = resp.iter_content(chunk_size=None)
                pieces = [next(reading)]  # under way
                gw.proc.send_signal(signal.SIGTERM)
                pieces.extend(reading)
            body = b"".join(pieces)
            assert sse.verdict(body) == "done"
            assert "".join(c["choices"][0]["delta"].get("content") or "" for c in sse.payloads(body) if c["choices"]) == " word" * 20
            assert gw.proc.wait(30) == 0
        finally:
            gw.stop()
