"""API keys (Bearer or x-api-key, 401 with an OpenAI body, /health and /metrics
closable), CORS (off by default, vLLM's flags), and keys never in the access log."""

from __future__ import annotations

import json

import openai
import pytest

from tests.support import USER_HI

KEY = "sk-test-0123456789abcdef"


def _err(raw: bytes) -> dict:
    data = json.loads(raw)
    assert list(data) == ["error"] and set(data["error"]) == {"message", "type", "param", "code"}, data
    return data["error"]


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {KEY}"}, {"x-api-key": "wrong"}, {"Authorization": "Bearer "}],
    ids=["none", "wrong-bearer", "basic-scheme", "wrong-x-api-key", "empty-bearer"],
)
async def test_401_with_openai_body(server, session, headers):
    srv = await server(api_key=[KEY, "sk-other"])
    for method, path, body in (("POST", "/v1/chat/completions", {"messages": USER_HI}), ("GET", "/v1/models", None)):
        async with session.request(method, srv.url(path), json=body, headers=headers) as resp:
            assert resp.status == 401
            assert resp.headers["Content-Type"].startswith("application/json")
            err = _err(await resp.read())
        assert err["type"] == "authentication_error" and err["code"] == "invalid_api_key"
        assert KEY not in err["message"]
    assert srv.engine.submitted == []


@pytest.mark.parametrize("headers", [{"Authorization": f"Bearer {KEY}"}, {"authorization": f"bearer {KEY}"}, {"x-api-key": KEY}])
async def test_key_accepted_as_bearer_or_x_api_key(server, session, headers):
    srv = await server(api_key=["sk-other", KEY])
    async with session.post(srv.url("/v1/chat/completions"), json={"messages": USER_HI}, headers=headers) as resp:
        assert resp.status == 200


async def test_openai_sdk_with_key(server):
    srv = await server(api_key=[KEY])
    client = openai.AsyncOpenAI(base_url=srv.base + "/v1", api_key=KEY, max_retries=0)
    assert (await client.models.list()).data[0].id == "fake"
    bad = openai.AsyncOpenAI(base_url=srv.base + "/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        await bad.models.list()
    await client.close()
    await bad.close()


async def test_health_and_metrics_open_by_default_closable_by_flags(server, session):
    srv = await server(api_key=[KEY])
    for path in ("/health", "/metrics", "/version"):
        async with session.get(srv.url(path)) as resp:
            assert resp.status == 200, path
    srv = await server(api_key=[KEY], health_requires_api_key=True, metrics_requires_api_key=True)
    for path in ("/health", "/metrics"):
        async with session.get(srv.url(path)) as resp:
            assert resp.status == 401, path
            _err(await resp.read())
        async with session.get(srv.url(path), headers={"Authorization": f"Bearer {KEY}"}) as resp:
            assert resp.status == 200, path
    async with session.get(srv.url("/version")) as resp:
        assert resp.status == 200


async def test_key_never_in_access_log(server, session, access_log):
    srv = await server(api_key=[KEY])
    await (await session.post(srv.url("/v1/chat/completions"), json={"messages": USER_HI}, headers={"Authorization": f"Bearer {KEY}"})).read()
    await (await session.post(srv.url("/v1/chat/completions?api_key=" + KEY), json={"messages": USER_HI}, headers={"x-api-key": KEY + "x"})).read()
    await (await session.get(srv.url("/v1/models"), headers={"Authorization": f"Bearer {KEY}-wrong"})).read()
    assert len(access_log) == 3
    assert all(KEY not in line for line in access_log)
    assert [json.loads(line)["status"] for line in access_log] == [200, 401, 401]


async def test_cors_off_by_default(server, session):
    srv = await server()
    headers = {"Origin": "https://app.example", "Access-Control-Request-Method": "POST"}
    async with session.options(srv.url("/v1/chat/completions"), headers=headers) as resp:
        assert resp.status == 405
        assert "Access-Control-Allow-Origin" not in resp.headers
    async with session.post(srv.url("/v1/chat/completions"), json={"messages": USER_HI}, headers={"Origin": "https://app.example"}) as resp:
        assert resp.status == 200
        assert "Access-Control-Allow-Origin" not in resp.headers


async def test_cors_configured(server, session):
    srv = await server(api_key=[KEY], allowed_origins=["https://app.example"], allowed_headers=["authorization", "content-type"])
    pre = {"Origin": "https://app.example", "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization, content-type"}
    # The preflight needs no key (browsers never send one on it).
    async with session.options(srv.url("/v1/chat/completions"), headers=pre) as resp:
        assert resp.status == 200
        assert resp.headers["Access-Control-Allow-Origin"] == "https://app.example"
        assert "POST" in resp.headers["Access-Control-Allow-Methods"]
        assert set(resp.headers["Access-Control-Allow-Headers"].split(", ")) == {"authorization", "content-type"}
        assert "Origin" in resp.headers.getall("Vary")
    # The actual request, streaming, and an error response, both readable cross-origin.
    ok = {"Origin": "https://app.example", "Authorization": f"Bearer {KEY}"}
    async with session.post(srv.url("/v1/chat/completions"), json={"messages": USER_HI, "stream": True}, headers=ok) as resp:
        assert resp.status == 200
        assert resp.headers["Access-Control-Allow-Origin"] == "https://app.example"
        assert "X-Request-Id" in resp.headers["Access-Control-Expose-Headers"]
        await resp.read()
    async with session.post(srv.url("/v1/chat/completions"), json={"messages": USER_HI}, headers={"Origin": "https://app.example"}) as resp:
        assert resp.status == 401
        assert resp.headers["Access-Control-Allow-Origin"] == "https://app.example"
    # Another origin: no CORS headers, and its preflight is refused.
    async with session.post(srv.url("/v1/chat/completions"), json={"messages": USER_HI}, headers={"Origin": "https://evil.example", "Authorization": f"Bearer {KEY}"}) as resp:
        assert resp.status == 200
        assert "Access-Control-Allow-Origin" not in resp.headers
    async with session.options(srv.url("/v1/chat/completions"), headers={**pre, "Origin": "https://evil.example"}) as resp:
        assert resp.status == 400
        assert "Access-Control-Allow-Origin" not in resp.headers
    async with session.options(srv.url("/v1/chat/completions"), headers={**pre, "Access-Control-Request-Headers": "x-custom"}) as resp:
        assert resp.status == 400


async def test_cors_any_origin(server, session):
    srv = await server(allowed_origins=["*"])
    pre = {"Origin": "https://a.example", "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "x-stainless-os"}
    async with session.options(srv.url("/v1/completions"), headers=pre) as resp:
        assert resp.status == 200
        assert resp.headers["Access-Control-Allow-Origin"] == "*"
        assert resp.headers["Access-Control-Allow-Headers"] == "x-stainless-os"
