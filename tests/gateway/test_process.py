"""`streamproxy gateway --config FILE.yaml` as a process: the example config parses, the
file's other keys are the edge's flags, requests are relayed, and SIGTERM drains: a stream
under way finishes, then the process exits 0. A file it cannot use (missing, not UTF-8, not
YAML, not a valid config) is one line on stderr naming it, and exit code 2. HTTPS end to end:
a gateway on TLS over an HTTPS replica."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import openai
import pytest
import requests
import yaml

from harness.process import ROOT
from harness.server import FAKE_ARGS, serve_process, start_gateway
from streamproxy.cli import build_gateway
from streamproxy.gateway.config_file import split
from tests.gateway.gateway_support import DEPLOYMENT, DEPLOYMENT_ID, SERVED, chat
from tests.support import sse
from tests.support.fake import USER_HI
from tests.support.tls import make_certs


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


@pytest.mark.parametrize(
    "content, says",
    [
        (b"deployments: [a, b\nkeys: 1\n", "not valid YAML: line 2, column 5: expected ',' or ']', but got ':' "
         "(while parsing a flow sequence at line 1, column 14)"),
        (b"port: 1\n\tdeployments: []\n", "not valid YAML: line 2, column 1: found character '\\t' that cannot start any "
         "token (while scanning for the next token)"),
        (b"deployments: caf\xe9\n", "not UTF-8 text (byte 16)"),
        (b"deployments:\n  - {name: a, id: b, upstreams: [http://127.0.0.1:1]}\n  - {name: b, id: c, upstreams: [http://127.0.0.1:1]}\n",
         "gateway config: 'b' names two deployments"),
        (None, "No such file or directory"),
    ],
    ids=["flow-sequence", "tab", "not-utf8", "names-clash", "missing"],
)
def test_a_config_file_it_cannot_use_is_one_line_naming_it_and_exit_2(tmp_path: Path, capsys, content, says):
    path = tmp_path / "gateway.yaml"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(SystemExit) as exited:
        build_gateway(["--config", str(path), "--port", "1"])
    assert exited.value.code == 2
    assert capsys.readouterr().err == f"streamproxy gateway: {path}: {says}\n"


def test_a_config_that_is_not_yaml_ends_the_process_with_no_traceback(tmp_path: Path):
    path = tmp_path / "gateway.yaml"
    path.write_text("deployments: [a, b\nkeys: 1\n")
    done = subprocess.run([sys.executable, "-m", "streamproxy", "gateway", "--config", str(path), "--host", "127.0.0.1", "--port", "1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == (f"streamproxy gateway: {path}: not valid YAML: line 2, column 5: expected ',' or ']', but got ':' "
                           "(while parsing a flow sequence at line 1, column 14)\n")


def test_https_end_to_end_a_gateway_on_tls_over_an_https_replica_through_the_sdk(tmp_path: Path):
    """`serve --engine fake --ssl-*` as the replica, the gateway verifying it with `tls.ca_file` and
    listening on HTTPS itself (`--ssl-*`): the OpenAI SDK streams through both."""
    certs = make_certs(tmp_path)
    ssl_flags = ["--ssl-certfile", str(certs.cert), "--ssl-keyfile", str(certs.key)]
    replica_args = [*FAKE_ARGS, "--served-model-name", SERVED, "--fake-text", "Hi there", *ssl_flags]
    with serve_process(replica_args, log_dir=tmp_path, name="replica", tls=(str(certs.ca), None)) as replica:
        assert replica.base.startswith("https://")
        config = tmp_path / "gateway.yaml"
        config.write_text(yaml.safe_dump({"access_log": "off", "deployments": [
            {"name": DEPLOYMENT, "id": DEPLOYMENT_ID, "served_model": SERVED, "upstreams": [replica.base],
             "tls": {"ca_file": str(certs.ca)}}]}))
        with serve_process(["--config", str(config), *ssl_flags], log_dir=tmp_path, name="gateway", command="gateway",
                           tls=(str(certs.ca), None)) as gw:  # ready: its /health saw the replica through TLS
            client = openai.OpenAI(base_url=gw.url("/v1"), api_key="x", max_retries=0,
                                   http_client=openai.DefaultHttpxClient(verify=str(certs.ca)))
            chunks = list(client.chat.completions.create(model=DEPLOYMENT, messages=USER_HI, max_tokens=2, stream=True,
                                                         stream_options={"include_usage": True}))
            assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hi there"
            assert {c.model for c in chunks} == {DEPLOYMENT}
            assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 2
