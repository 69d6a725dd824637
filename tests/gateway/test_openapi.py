"""GET /openapi.json of the gateway: every route it registers, valid OpenAPI 3.1, serve's request
schemas, and real answers (its own routes, its own errors) that fit what it documents.

The schemas the document shares with serve's are serve's (the same builder,
the same msgspec Structs): checked here by equality of the components, so
the gateway's document cannot drift from what replicas decode.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import jsonschema
import pytest

from harness.waiting import wait_until
from streamproxy.gateway import openapi
from streamproxy.gateway.routes import ROUTES, relayed_paths
from streamproxy.http import openapi as serve_openapi
from tests.gateway.conftest import refused_url
from tests.gateway.gateway_support import DEPLOYMENT, DEPLOYMENT_ID, chat, fits
from tests.support.openapi_doc import app_routes, assert_refs_closed, assert_valid_3_1


@cache
def doc() -> dict[str, Any]:
    return openapi.build()


async def test_served_once_and_lists_exactly_the_routes(gateway, replica, session):
    gw = await gateway(await replica())
    async with session.get(gw.url("/openapi.json")) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("application/json")
        served = await resp.json()
        body = await resp.read()
    async with session.get(gw.url("/openapi.json")) as again:
        assert await again.read() == body
    assert openapi.document() is openapi.document()  # built once
    assert served == doc()
    documented = {(method, path) for path, item in served["paths"].items() for method in item}
    assert documented == app_routes(gw.app)


def test_valid_openapi_3_1():
    assert_valid_3_1(doc(), "/v1/deployments/{deployment}/chat/completions")


def test_every_ref_resolves_and_every_component_is_used():
    assert_refs_closed(doc(), openapi.document().decode())


def test_relayed_routes_are_serves_operations():
    serve = serve_openapi.build()
    ours = doc()
    for name, route in ROUTES.items():
        theirs = serve["paths"][route.upstream_path]["post"]
        for path in relayed_paths(name):
            op = ours["paths"][path]["post"]
            assert op["requestBody"] == theirs["requestBody"], path
            assert op["responses"]["200"] == theirs["responses"]["200"], path
            assert op["responses"]["4XX"] == theirs["responses"]["4XX"], path  # the API's error shape
            for status in ("401", "413", "429", "503"):
                assert op["responses"][status]["content"] == theirs["responses"]["4XX"]["content"], (path, status)
            assert "Retry-After" in op["responses"]["429"]["headers"] and "Retry-After" in op["responses"]["503"]["headers"]
            assert [p["name"] for p in op.get("parameters", [])] == (["deployment"] if "{deployment}" in path else [])
    # Every schema the two documents share is the same (the requests' among them).
    shared = set(serve["components"]["schemas"]) & set(ours["components"]["schemas"])
    assert {"ChatCompletionRequest", "MessagesRequest", "ResponsesRequest", "TokenizeRequest"} <= shared
    for name in shared:
        assert ours["components"]["schemas"][name] == serve["components"]["schemas"][name], name


# --- real answers against the document -------------------------------------------------


async def _get(session, url: str, **headers: str) -> tuple[int, dict[str, str], Any]:
    async with session.get(url, headers=headers) as resp:
        return resp.status, dict(resp.headers), await resp.json()


async def test_the_gateways_own_answers_fit_the_document(gateway, replica, session):
    r = await replica()
    down = refused_url()
    gw = await gateway(deployments=[
        {"name": DEPLOYMENT, "id": DEPLOYMENT_ID, "served_model": "Qwen/Qwen3-8B", "upstreams": [r.base]},
        {"name": "down", "id": "dep-down", "served_model": "m", "upstreams": [down]},
    ], upstream={"health_check_interval": 0.05, "unhealthy_threshold": 1})
    checks = [
        ("/v1/models", 200),
        (f"/v1/deployments/{DEPLOYMENT_ID}/models", 200),
        (f"/v1/deployments/{DEPLOYMENT}/v1/models", 200),
        (f"/v1/models/{DEPLOYMENT}", 200),
        ("/v1/models/nope", 404),
        ("/v1/deployments", 200),
        (f"/v1/deployments/{DEPLOYMENT_ID}", 200),
        ("/v1/deployments/nope", 404),
        ("/version", 200),
    ]
    for path, status in checks:
        got, _, data = await _get(session, gw.url(path))
        assert got == status, (path, got, data)
        fits(path, "get", got, data)
    # Admin routes with no admin key configured: closed.
    async with session.post(gw.url(f"/v1/deployments/{DEPLOYMENT_ID}/park")) as resp:
        assert resp.status == 401
        fits("/v1/deployments/{deployment}/park", "post", 401, await resp.json())
    # "down" cannot serve: a request to it is 503 upstream_unavailable with Retry-After (on an
    # Anthropic route in Anthropic's envelope); once probed, /health is 503 degraded.
    for path in ("/v1/chat/completions", "/v1/deployments/dep-down/v1/messages"):
        async with session.post(gw.url(path), json={**chat("down"), "max_tokens": 3}) as resp:
            assert resp.status == 503 and int(resp.headers["Retry-After"]) >= 1
            fits(path, "post", 503, await resp.json())
    assert await wait_until(lambda: not gw.pool("down").replicas[0].health.probed_healthy, 10.0)
    status, _, data = await _get(session, gw.url("/health"))
    assert (status, data["status"], data["unavailable"]) == (503, "degraded", ["down"])
    fits("/health", "get", 503, data)


async def test_key_limit_and_size_errors_fit_the_document(gateway, replica, session):
    r = await replica()
    gw = await gateway(r, keys=[{"id": "a", "key": "sk-a", "rpm": 1}], max_body_bytes=2000)
    ok = {"Authorization": "Bearer sk-a"}
    cases = [
        ("/v1/chat/completions", chat(), {}, 401),
        ("/v1/messages", {**chat(), "max_tokens": 3}, {"x-api-key": "wrong"}, 401),
        (f"/v1/deployments/{DEPLOYMENT_ID}/chat/completions", chat(max_tokens=3), ok, 200),
        ("/v1/chat/completions", chat(max_tokens=3), ok, 429),  # rpm 1
        ("/v1/messages", {**chat(), "max_tokens": 3}, ok, 429),
        ("/v1/completions", {"prompt": "x" * 3000}, ok, 413),
    ]
    for path, body, headers, status in cases:
        async with session.post(gw.url(path), json=body, headers=headers) as resp:
            assert resp.status == status, (path, resp.status, await resp.text())
            if status == 429:
                assert int(resp.headers["Retry-After"]) >= 1
            fits(path, "post", status, await resp.json())
    status, _, data = await _get(session, gw.url("/v1/deployments"))
    assert status == 401
    fits("/v1/deployments", "get", 401, data)


def test_the_schemas_do_not_accept_anything():
    with pytest.raises(jsonschema.ValidationError):
        fits("/health", "get", 200, {"status": "fine"})
    with pytest.raises(jsonschema.ValidationError):
        fits("/v1/deployments", "get", 200, {"object": "list", "data": [{"id": "x"}]})
    with pytest.raises(jsonschema.ValidationError):
        fits("/v1/messages", "post", 401, {"type": "error", "error": "m"})
    with pytest.raises(jsonschema.ValidationError):
        fits("/v1/deployments/x/chat/completions", "post", 503, {"error": {"message": "m"}})
