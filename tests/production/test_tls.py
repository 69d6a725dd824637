"""`streamproxy serve` as `vllm serve --ssl-certfile ... --root-path ... --chat-template ...` runs:
HTTPS with a certificate the test makes, streamed through the OpenAI SDK under the proxy's
path prefix with the template's prompt; mutual TLS (`--ssl-cert-reqs 2`) refusing a client
without a certificate; the certificate reloaded with --enable-ssl-refresh; a Unix socket (`--uds`)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import aiohttp
import openai
import pytest
import requests

from engine_adapter.fake import FakeEngine, FakeScript
from harness.server import FAKE_ARGS, serve_process
from harness.waiting import wait_until
from streamproxy.config import Settings
from streamproxy.http import tls
from streamproxy.http.app import create_app
from streamproxy.http.server import run_app
from tests.support.fake import USER_HI
from tests.support.tls import make_certs

TEMPLATE = "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}>"


def test_https_root_path_and_chat_template_through_the_sdk(tmp_path: Path) -> None:
    certs = make_certs(tmp_path)
    template = tmp_path / "t.jinja"
    template.write_text(TEMPLATE)
    args = [*FAKE_ARGS, "--fake-text", "Hi there", "--ssl-certfile", str(certs.cert), "--ssl-keyfile", str(certs.key),
            "--root-path", "/proxy", "--chat-template", str(template)]
    with serve_process(args, log_dir=tmp_path, tls=(str(certs.ca), None)) as srv:
        assert srv.base.startswith("https://")
        client = openai.OpenAI(base_url=srv.base + "/proxy/v1", api_key="x", http_client=openai.DefaultHttpxClient(verify=str(certs.ca)))
        stream = client.chat.completions.create(model="fake", messages=USER_HI, max_tokens=2, stream=True,
                                                stream_options={"include_usage": True})
        chunks = list(stream)
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hi there"
        assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens == len("[user]hi>")  # the template's prompt
        with pytest.raises(requests.exceptions.SSLError):  # an untrusted certificate is refused by the client
            requests.get(srv.url("/health"), timeout=5)
        with pytest.raises(requests.exceptions.ConnectionError):  # plain HTTP to the TLS port gets nowhere
            requests.get(srv.url("/health").replace("https://", "http://"), timeout=5)


def test_mutual_tls_refuses_a_client_without_a_certificate(tmp_path: Path) -> None:
    certs = make_certs(tmp_path)
    args = [*FAKE_ARGS, "--ssl-certfile", str(certs.cert), "--ssl-keyfile", str(certs.key),
            "--ssl-ca-certs", str(certs.ca), "--ssl-cert-reqs", "2"]
    mine = (str(certs.client_cert), str(certs.client_key))
    with serve_process(args, log_dir=tmp_path, tls=(str(certs.ca), mine)) as srv:
        assert requests.get(srv.url("/v1/models"), verify=str(certs.ca), cert=mine, timeout=5).status_code == 200
        with pytest.raises(requests.exceptions.ConnectionError):  # SSLError is one; so is a reset after the handshake
            requests.get(srv.url("/v1/models"), verify=str(certs.ca), timeout=5).raise_for_status()


def test_certificate_refresh(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first, second = make_certs(tmp_path / "a"), make_certs(tmp_path / "b", server_name="second")
    settings = Settings(ssl_certfile=str(first.cert), ssl_keyfile=str(first.key), enable_ssl_refresh=True)
    ctx = tls.server_context(settings)
    assert ctx is not None
    refresher = tls.Refresher(ctx, settings)
    assert refresher.check() is False  # nothing changed
    first.cert.write_bytes(second.cert.read_bytes())
    first.key.write_bytes(second.key.read_bytes())
    later = os.stat(first.cert).st_mtime + 5
    os.utime(first.cert, (later, later))
    assert refresher.check() is True and refresher.reloads == 1
    first.key.write_text("not a key")
    os.utime(first.key, (later + 5, later + 5))
    assert refresher.check() is False  # a broken file: the old certificate stays


async def test_unix_socket(tmp_path: Path) -> None:
    path = str(tmp_path / "sp.sock")
    settings = Settings(engine="fake", uds=path, access_log="off")
    engine = FakeEngine(FakeScript(tokens=["Hel", "lo"]))
    app = create_app(settings, engine)
    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(run_app(app, settings, stop=stop, ready=ready))
    try:
        await asyncio.wait_for(ready.wait(), 10)
        assert await wait_until(lambda: engine.state == "ready", timeout=5.0)
        async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=path)) as session:
            r = await session.post("http://sp/v1/chat/completions", json={"messages": USER_HI, "max_tokens": 2})
            assert (await r.json())["choices"][0]["message"]["content"] == "Hello"
    finally:
        stop.set()
        await asyncio.wait_for(task, 20)
