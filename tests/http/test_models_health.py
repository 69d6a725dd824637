"""/v1/models, /v1/models/{id}, /health, /version, and the 503 while the engine loads."""

from __future__ import annotations

from tests.http.http_support import assert_openai_error
from tests.support import USER_HI, validate, wait_until
from tests.support.fake import hold_start


async def test_list_models(serve):
    client, engine = await serve(max_model_len=1234)
    resp = await client.get("/v1/models")
    assert resp.status == 200
    assert resp.headers["Content-Type"].startswith("application/json")
    data = await resp.json()
    validate("ListModelsResponse", data)
    assert data["object"] == "list"
    assert [m["id"] for m in data["data"]] == ["fake"]
    card = data["data"][0]
    assert card["object"] == "model"
    assert card["owned_by"] and isinstance(card["owned_by"], str)
    assert card["created"] == engine.info.created
    assert card["max_model_len"] == 1234


async def test_list_models_several_names(serve):
    client, _ = await serve(served_names=["alpha", "beta"])
    data = await (await client.get("/v1/models")).json()
    assert [m["id"] for m in data["data"]] == ["alpha", "beta"]
    resp = await client.post("/v1/chat/completions", json={"model": "beta", "messages": USER_HI})
    assert resp.status == 200
    assert (await resp.json())["model"] == "beta"
    resp = await client.post("/v1/chat/completions", json={"messages": USER_HI})
    assert (await resp.json())["model"] == "alpha"
    resp = await client.post("/v1/chat/completions", json={"model": "fake", "messages": USER_HI})
    assert resp.status == 404


async def test_get_model(serve):
    client, _ = await serve()
    resp = await client.get("/v1/models/fake")
    assert resp.status == 200
    data = await resp.json()
    validate("Model", data)
    assert data["id"] == "fake" and data["object"] == "model"


async def test_get_unknown_model_404(serve):
    client, _ = await serve()
    resp = await client.get("/v1/models/other")
    assert_openai_error(resp.status, resp.headers, await resp.read(), expect_status=404, param="model", code="model_not_found")


async def test_health_and_version(serve):
    client, _ = await serve()
    resp = await client.get("/health")
    assert resp.status == 200
    assert await resp.json() == {"status": "ok"}
    resp = await client.get("/version")
    assert resp.status == 200
    version = (await resp.json())["version"]
    assert isinstance(version, str) and version


async def test_loading_engine_answers_503(serve, monkeypatch):
    release = hold_start(monkeypatch)  # loading until the checks below are done, however long they take
    client, engine = await serve(wait_ready=False)
    assert engine.state == "loading"

    resp = await client.get("/health")
    assert resp.status == 503
    assert (await resp.json())["status"] == "loading"

    for path, body in [("/v1/chat/completions", {"messages": USER_HI}), ("/v1/completions", {"prompt": "hi"})]:
        resp = await client.post(path, json=body)
        assert_openai_error(
            resp.status, resp.headers, await resp.read(), expect_status=503, type="service_unavailable", code="engine_loading"
        )
        retry = resp.headers["Retry-After"]
        assert retry.isdigit() and int(retry) > 0

    # Listing models does not need the engine.
    assert (await client.get("/v1/models")).status == 200
    assert engine.submitted == []
    assert engine.state == "loading", "the checks above must run while the engine still loads"

    release.set()
    assert await wait_until(lambda: engine.state == "ready", timeout=10.0)
    assert (await client.get("/health")).status == 200
    resp = await client.post("/v1/chat/completions", json={"messages": USER_HI})
    assert resp.status == 200
