"""HTTPS replicas: a deployment's `tls` (or the gateway-wide `upstream.tls`) verifies them.

The replica is serve on the fake engine over HTTPS in-process
(`replica(ssl_certfile=..., ssl_keyfile=...)`, a certificate for 127.0.0.1
that tests/support/tls.py makes); the gateway in front of it streams through
the OpenAI SDK. A replica whose certificate the configured CA did not sign is
a failed connect: 503 `upstream_unavailable`, a warning that names the
deployment, the replica and the reason, and the probe marks it down.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import aiohttp
import openai
import pytest

from streamproxy.cli import build_gateway
from streamproxy.gateway import probes
from streamproxy.gateway.config import ConfigError
from tests.gateway.conftest import StartGateway, StartReplica, config
from tests.gateway.gateway_support import DEPLOYMENT, DEPLOYMENT_ID, SERVED, chat, error_body, post, sample
from tests.support.fake import USER_HI
from tests.support.tls import make_certs

UNAVAILABLE = f"no replica of deployment `{DEPLOYMENT}` can take the request now; retry shortly"


async def test_streams_through_an_https_replica_with_the_configured_ca(
    tmp_path: Path, replica: StartReplica, gateway: StartGateway
) -> None:
    certs = make_certs(tmp_path)
    r = await replica(ssl_certfile=str(certs.cert), ssl_keyfile=str(certs.key))
    assert r.base.startswith("https://127.0.0.1:")
    deployments = [{"name": DEPLOYMENT, "id": DEPLOYMENT_ID, "served_model": SERVED, "upstreams": [r.base],
                    "tls": {"ca_file": str(certs.ca)}}]
    gw = await gateway(deployments=deployments)
    client = openai.AsyncOpenAI(base_url=gw.url("/v1"), api_key="x", max_retries=0)
    stream = await client.chat.completions.create(model=DEPLOYMENT, messages=USER_HI, stream=True,
                                                  stream_options={"include_usage": True})
    chunks = [c async for c in stream]
    await client.close()
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hello world"
    assert {c.model for c in chunks} == {DEPLOYMENT}
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3
    assert [s.path for s in r.inference()] == ["/v1/chat/completions"]
    await probes.probe_once(gw.state, [gw.pool()])
    assert sample("streamproxy_gateway_upstream_healthy", deployment=DEPLOYMENT, upstream=r.base) == 1.0


async def test_the_gateway_wide_ca_applies(tmp_path: Path, replica: StartReplica, gateway: StartGateway,
                                           session: aiohttp.ClientSession) -> None:
    certs = make_certs(tmp_path)
    r = await replica(ssl_certfile=str(certs.cert), ssl_keyfile=str(certs.key))
    gw = await gateway(r, upstream={"tls": {"ca_file": str(certs.ca)}})
    status, _, body = await post(session, gw.url("/v1/chat/completions"), chat(max_tokens=3))
    assert status == 200, body


async def test_a_certificate_of_another_ca_is_upstream_unavailable(
    tmp_path: Path, replica: StartReplica, gateway: StartGateway, session: aiohttp.ClientSession,
    caplog: pytest.LogCaptureFixture,
) -> None:
    (tmp_path / "ours").mkdir()
    (tmp_path / "theirs").mkdir()
    ours, theirs = make_certs(tmp_path / "ours"), make_certs(tmp_path / "theirs")
    r = await replica(ssl_certfile=str(theirs.cert), ssl_keyfile=str(theirs.key))
    gw = await gateway(r, upstream={"tls": {"ca_file": str(ours.ca)}})
    with caplog.at_level(logging.INFO, logger="streamproxy.gateway"):
        status, headers, body = await post(session, gw.url("/v1/chat/completions"), chat(stream=True))
        assert status == 503
        assert headers["Retry-After"].isdigit()
        assert json.loads(body) == error_body(UNAVAILABLE, "service_unavailable", "upstream_unavailable")
        await probes.probe_once(gw.state, [gw.pool()])
    warnings = [rec.getMessage() for rec in caplog.records if rec.levelno == logging.WARNING]
    # Both CAs are named alike, so OpenSSL finds "ours" as the issuer and the signature does not verify.
    reason = "certificate signature failure (SSLCertVerificationError)"
    assert warnings == [
        f"deployment {DEPLOYMENT}: upstream {r.base} refused: TLS handshake with 127.0.0.1:{r.port} failed: {reason}; trying another",
        f"deployment {DEPLOYMENT}: upstream {r.base} is down: TLS handshake failed: {reason}",
    ]
    assert sample("streamproxy_gateway_upstream_healthy", deployment=DEPLOYMENT, upstream=r.base) == 0.0
    assert r.inference() == []
    # The gateway itself is fine.
    async with session.get(gw.url("/v1/models")) as resp:
        assert resp.status == 200


async def test_verify_false_takes_any_certificate(tmp_path: Path, replica: StartReplica, gateway: StartGateway,
                                                  session: aiohttp.ClientSession) -> None:
    certs = make_certs(tmp_path)
    r = await replica(ssl_certfile=str(certs.cert), ssl_keyfile=str(certs.key))
    gw = await gateway(r, upstream={"tls": {"verify": False}})
    status, _, body = await post(session, gw.url("/v1/chat/completions"), chat(max_tokens=3))
    assert status == 200, body


async def test_the_name_checked_is_server_name(tmp_path: Path, replica: StartReplica, gateway: StartGateway,
                                               session: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture) -> None:
    """The certificate is for 127.0.0.1 and localhost: `server_name: localhost` passes, another name fails."""
    certs = make_certs(tmp_path)
    r = await replica(ssl_certfile=str(certs.cert), ssl_keyfile=str(certs.key))
    good = await gateway(r, upstream={"tls": {"ca_file": str(certs.ca), "server_name": "localhost"}})
    status, _, body = await post(session, good.url("/v1/chat/completions"), chat(max_tokens=3))
    assert status == 200, body
    bad = await gateway(r, upstream={"tls": {"ca_file": str(certs.ca), "server_name": "replica.example"}})
    with caplog.at_level(logging.WARNING, logger="streamproxy.gateway"):
        status, _, body = await post(session, bad.url("/v1/chat/completions"), chat(max_tokens=3))
    assert status == 503 and json.loads(body) == error_body(UNAVAILABLE, "service_unavailable", "upstream_unavailable")
    assert any("Hostname mismatch" in rec.getMessage() for rec in caplog.records), [r.getMessage() for r in caplog.records]


def test_tls_config_errors_name_the_field(tmp_path: Path) -> None:
    from streamproxy.gateway.upstream_tls import contexts

    url = "https://127.0.0.1:8443"
    missing = str(tmp_path / "nope.pem")
    with pytest.raises(ConfigError, match=r"^gateway config: `upstream.tls.ca_file`: cannot load '.*nope.pem': No such file"):
        contexts(config([url], upstream={"tls": {"ca_file": missing}}))
    deployment = {"name": DEPLOYMENT, "id": DEPLOYMENT_ID, "upstreams": [url]}
    with pytest.raises(ConfigError, match=rf"^deployment '{DEPLOYMENT}': `tls.ca_file`: cannot load"):
        contexts(config([], deployments=[{**deployment, "tls": {"ca_file": missing}}]))
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    with pytest.raises(ConfigError, match=r"`tls.cert_file`/`key_file`: cannot load"):
        contexts(config([], deployments=[{**deployment, "tls": {"cert_file": str(junk), "key_file": str(junk)}}]))
    with pytest.raises(ConfigError, match=r"give both `cert_file` and `key_file`"):
        config([], deployments=[{**deployment, "tls": {"cert_file": str(junk)}}])
    with pytest.raises(ConfigError, match=r"`ca_file` and `server_name` mean nothing with `verify: false`"):
        config([url], upstream={"tls": {"verify": False, "ca_file": str(junk)}})
    with pytest.raises(ConfigError, match=r"`tls` is given but no upstream is an https:// URL"):
        config([], deployments=[{**deployment, "upstreams": ["http://127.0.0.1:1"], "tls": {}}])
    # Plain http:// deployments read no file at all.
    assert contexts(config(["http://127.0.0.1:1"], upstream={"tls": {"ca_file": missing}})) == {}


def test_an_unreadable_ca_file_stops_the_start(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    conf = tmp_path / "gateway.yaml"
    conf.write_text(f"deployments:\n  - {{name: a, id: a, upstreams: [https://127.0.0.1:8443], tls: {{ca_file: {tmp_path}/nope.pem}}}}\n")
    with pytest.raises(SystemExit) as exit_:
        build_gateway(["--config", str(conf)])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == (
        f"streamproxy gateway: {conf}: deployment 'a': `tls.ca_file`: cannot load '{tmp_path}/nope.pem': No such file or directory\n"
    )


async def test_a_plain_http_replica_behind_an_https_url(replica: StartReplica, gateway: StartGateway,
                                                        session: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture) -> None:
    r = await replica()
    url = r.base.replace("http://", "https://")
    gw = await gateway(url)
    with caplog.at_level(logging.WARNING, logger="streamproxy.gateway"):
        status, _, body = await post(session, gw.url("/v1/chat/completions"), chat(max_tokens=3))
    assert status == 503 and json.loads(body) == error_body(UNAVAILABLE, "service_unavailable", "upstream_unavailable")
    assert [rec.getMessage() for rec in caplog.records] == [
        f"deployment {DEPLOYMENT}: upstream {url} refused: TLS handshake with 127.0.0.1:{r.port} failed: "
        "WRONG_VERSION_NUMBER, the replica may be serving plain HTTP (SSLError); trying another"
    ]
