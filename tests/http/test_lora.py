"""LoRA adapters as `vllm serve` serves them, on the fake engine: --lora-modules, /v1/models with
`parent`, `model: ADAPTER` reaching the engine as `GenerationParams.adapter`, and the run-time
load/unload routes (VLLM_ALLOW_RUNTIME_LORA_UPDATING)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from engine_adapter.base import Adapter
from engine_adapter.fake import FakeEngine
from harness.process import free_port
from streamproxy.config import Settings
from streamproxy.http.server import serve as run_server
from streamproxy.http.state import STATE_KEY
from tests.http.http_support import assert_openai_error
from tests.support import USER_HI, wait_until


@pytest.fixture
def folders(tmp_path: Path) -> tuple[str, str]:
    a, b = tmp_path / "sql", tmp_path / "chat"
    a.mkdir()
    b.mkdir()
    return str(a), str(b)


async def _serve_with(serve, modules: list[str], **kw):
    client, engine = await serve(served_names=["base", "alias"], lora_modules=modules, **kw)
    state = client.app[STATE_KEY]
    assert await wait_until(lambda: len(state.adapters) == len(modules), timeout=5.0)
    return client, engine


async def _error(resp, status: int, **kw):
    return assert_openai_error(resp.status, resp.headers, await resp.read(), expect_status=status, **kw)


async def test_static_adapters_are_listed_with_their_parent(serve, folders):
    sql, chat = folders
    client, engine = await _serve_with(serve, [f"sql={sql}", json.dumps({"name": "chat", "path": chat, "base_model_name": "alias"})])
    data = await (await client.get("/v1/models")).json()
    cards = {c["id"]: c for c in data["data"]}
    assert list(cards) == ["base", "alias", "sql", "chat"]
    assert cards["base"]["parent"] is None and cards["alias"]["parent"] is None
    assert (cards["sql"]["parent"], cards["sql"]["root"]) == ("base", sql)
    assert (cards["chat"]["parent"], cards["chat"]["root"]) == ("alias", chat)
    assert cards["sql"]["max_model_len"] == cards["base"]["max_model_len"]
    one = await (await client.get("/v1/models/sql")).json()
    assert one == cards["sql"]
    assert set(engine.adapters) == {"sql", "chat"}  # loaded into the engine at start


async def test_model_names_the_adapter_on_every_generating_route(serve, folders):
    sql, chat = folders
    client, engine = await _serve_with(serve, [f"sql={sql}", f"chat={chat}"])
    sql_adapter = Adapter(name="sql", id=1, path=sql, parent="base")

    resp = await client.post("/v1/chat/completions", json={"model": "sql", "messages": USER_HI})
    assert resp.status == 200 and (await resp.json())["model"] == "sql"
    assert engine.submitted[-1][2].adapter == sql_adapter

    resp = await client.post("/v1/chat/completions", json={"model": "chat", "messages": USER_HI, "stream": True})
    assert resp.status == 200 and b'"model":"chat"' in await resp.read()
    assert engine.submitted[-1][2].adapter == Adapter(name="chat", id=2, path=chat, parent="base")

    resp = await client.post("/v1/chat/completions", json={"model": "alias", "messages": USER_HI})
    assert resp.status == 200 and engine.submitted[-1][2].adapter is None

    resp = await client.post("/v1/completions", json={"model": "sql", "prompt": ["a", "b"], "max_tokens": 2})
    assert resp.status == 200 and (await resp.json())["model"] == "sql"
    assert [p.adapter for _, _, p in engine.submitted[-2:]] == [sql_adapter, sql_adapter]

    resp = await client.post("/v1/responses", json={"model": "sql", "input": "hi"})
    assert resp.status == 200 and engine.submitted[-1][2].adapter == sql_adapter

    resp = await client.post("/v1/messages", json={"model": "sql", "max_tokens": 5, "messages": USER_HI})
    assert resp.status == 200 and engine.submitted[-1][2].adapter == sql_adapter

    resp = await client.post("/tokenize", json={"model": "sql", "prompt": "hi"})
    assert resp.status == 200  # the base model's tokenizer, as vLLM


async def test_unknown_model_is_404_and_embeddings_do_not_take_an_adapter(serve, folders):
    client, _ = await _serve_with(serve, [f"sql={folders[0]}"])
    resp = await client.post("/v1/chat/completions", json={"model": "nope", "messages": USER_HI})
    await _error(resp, 404, param="model", code="model_not_found")
    resp = await client.post("/v1/embeddings", json={"model": "sql", "input": "hi"})
    await _error(resp, 404, param="model", code="model_not_found")
    resp = await client.get("/v1/models/nope")
    await _error(resp, 404, code="model_not_found")


async def test_the_runtime_routes_are_off_without_vllms_switch(serve, folders, monkeypatch):
    monkeypatch.delenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", raising=False)
    client, _ = await serve()
    resp = await client.post("/v1/load_lora_adapter", json={"lora_name": "sql", "lora_path": folders[0]})
    assert resp.status == 404
    paths = (await (await client.get("/openapi.json")).json())["paths"]
    assert "/v1/load_lora_adapter" not in paths


async def test_load_serve_reload_unload(serve, folders, monkeypatch):
    monkeypatch.setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "1")
    sql, chat = folders
    client, engine = await serve(served_names=["base"])
    paths = (await (await client.get("/openapi.json")).json())["paths"]
    assert {"/v1/load_lora_adapter", "/v1/unload_lora_adapter"} <= set(paths)

    resp = await client.post("/v1/load_lora_adapter", json={"lora_name": "sql", "lora_path": sql})
    assert resp.status == 200 and await resp.text() == "Success: LoRA adapter 'sql' added successfully."
    assert engine.adapters["sql"] == Adapter(name="sql", id=1, path=sql, parent="base")
    ids = [c["id"] for c in (await (await client.get("/v1/models")).json())["data"]]
    assert ids == ["base", "sql"]
    resp = await client.post("/v1/chat/completions", json={"model": "sql", "messages": USER_HI})
    assert resp.status == 200 and engine.submitted[-1][2].adapter == engine.adapters["sql"]

    # Loaded already: 400, unless in place (same id, new path).
    resp = await client.post("/v1/load_lora_adapter", json={"lora_name": "sql", "lora_path": chat})
    await _error(resp, 400, type="invalid_request_error", param="lora_name")
    resp = await client.post("/v1/load_lora_adapter", json={"lora_name": "sql", "lora_path": chat, "load_inplace": True})
    assert resp.status == 200
    assert client.app[STATE_KEY].adapters.get("sql") == Adapter(name="sql", id=1, path=chat, parent="base")

    resp = await client.post("/v1/unload_lora_adapter", json={"lora_name": "sql"})
    assert resp.status == 200 and await resp.text() == "Success: LoRA adapter 'sql' removed successfully."
    resp = await client.post("/v1/chat/completions", json={"model": "sql", "messages": USER_HI})
    await _error(resp, 404, param="model", code="model_not_found")
    resp = await client.post("/v1/unload_lora_adapter", json={"lora_name": "sql"})
    body = await _error(resp, 404, param="lora_name")
    assert "cannot be found" in body["message"]
    # A new load after an unload gets a new id.
    resp = await client.post("/v1/load_lora_adapter", json={"lora_name": "sql", "lora_path": sql})
    assert resp.status == 200 and client.app[STATE_KEY].adapters.get("sql").id == 2


async def test_load_refusals(serve, folders, tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "true")
    client, _ = await serve(served_names=["base"])
    resp = await client.post("/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": str(tmp_path / "missing")})
    body = await _error(resp, 400, type="invalid_request_error", param="lora_path")
    assert "No adapter found" in body["message"]
    resp = await client.post("/v1/load_lora_adapter", json={"lora_name": "base", "lora_path": folders[0]})
    await _error(resp, 400, param="lora_name")
    resp = await client.post("/v1/load_lora_adapter", json={"lora_name": "x"})
    await _error(resp, 400, param="lora_path")
    resp = await client.post("/v1/load_lora_adapter", json={"lora_name": "", "lora_path": folders[0]})
    await _error(resp, 400, param="lora_name")
    resp = await client.post("/v1/unload_lora_adapter", json={})
    await _error(resp, 400, param="lora_name")
    assert [c["id"] for c in (await (await client.get("/v1/models")).json())["data"]] == ["base"]


async def test_a_static_adapter_that_cannot_load_stops_the_server(tmp_path):
    settings = Settings(engine="fake", host="127.0.0.1", port=free_port(), lora_modules=[f"x={tmp_path / 'missing'}"])
    assert await asyncio.wait_for(run_server(settings, FakeEngine()), timeout=20) == 1
