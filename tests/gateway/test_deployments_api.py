"""Deployments made through the admin API (`gateway/deployadmin.py`): POST /v1/deployments, PATCH and
DELETE /v1/deployments/{id}. Served at once (a stream running on a changed or deleted one completes),
answers as /openapi.json documents them, 400s naming the field, 409 for a name or id taken, the
config file's deployments left to the file; kept in the ledger's store so a gateway started again on
it serves them, and kept across a SIGHUP reload."""

from __future__ import annotations

import json
import logging
from functools import partial
from typing import Any

import pytest
import yaml

from engine_adapter.fake import FakeScript
from streamproxy.cli import load_gateway
from streamproxy.gateway.reload import reload
from streamproxy.ledger.memory import MemoryStore
from streamproxy.ledger.store import open_store
from streamproxy.ledger.writer import Ledger
from tests.gateway.gateway_support import DEPLOYMENT, DEPLOYMENT_ID, SERVED, chat, error_body, fits, post

ADMIN = "sk-admin-deployments"
SLOW = FakeScript(tokens=[f"t{i} " for i in range(20)], token_delay=0.05)


async def admin(session, method: str, url: str, body: object = None, key: str = ADMIN, raw: bytes | None = None) -> tuple[int, Any]:
    kw: dict[str, Any] = {"data": raw} if raw is not None else {"json": body}
    async with session.request(method, url, headers={"Authorization": f"Bearer {key}"}, **kw) as resp:
        return resp.status, await resp.json()


def file_deployment(r) -> list[dict]:
    return [{"name": DEPLOYMENT, "id": DEPLOYMENT_ID, "served_model": SERVED, "upstreams": [r.base]}]


async def api_gateway(replica, gateway, store=None, **kw):
    r = await replica()
    gw = await gateway(deployments=file_deployment(r), ledger=Ledger(store or MemoryStore(), interval=0.05), admin_key=ADMIN, **kw)
    return r, gw


def new(r, name: str = "tenant-bot", **extra: Any) -> dict[str, Any]:
    return {"name": name, "id": f"dep-{name}", "served_model": SERVED, "upstreams": [r.base], **extra}


async def chat_to(session, gw, model: str) -> tuple[int, dict]:
    status, _, body = await post(session, gw.url("/v1/chat/completions"), chat(model=model))
    return status, json.loads(body)


async def test_a_deployment_added_is_served_at_once_listed_and_kept_in_the_store(replica, gateway, session):
    store = MemoryStore()
    _, gw = await api_gateway(replica, gateway, store)
    b = await replica()
    status, got = await admin(session, "POST", gw.url("/v1/deployments"), new(b))
    assert status == 200, got
    fits("/v1/deployments", "post", 200, got)
    assert (got["id"], got["name"], got["source"], [r["url"] for r in got["replicas"]]) == ("dep-tenant-bot", "tenant-bot", "api", [b.base])
    status, body = await chat_to(session, gw, "tenant-bot")
    assert status == 200 and body["model"] == "tenant-bot"
    assert [s.model for s in b.inference()] == [SERVED]
    status, listed = await admin(session, "GET", gw.url("/v1/deployments"))
    assert [(d["name"], d["source"]) for d in listed["data"]] == [(DEPLOYMENT, "config"), ("tenant-bot", "api")]
    (stored,) = await store.list_deployments()
    assert (stored.id, stored.name, json.loads(stored.spec)["upstreams"]) == ("dep-tenant-bot", "tenant-bot", [b.base])
    # Without an id: one is made.
    status, got = await admin(session, "POST", gw.url("/v1/deployments"), {"name": "anon", "upstreams": [b.base]})
    assert status == 200 and got["id"].startswith("dep-") and len(got["id"]) == 12


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        ({"name": "x", "upstreams": ["ftp://127.0.0.1:1"]}, "upstreams[0]",
         "upstream 'ftp://127.0.0.1:1' is not an http(s) URL with a host (and a port, if any, from 1 to 65535)"),
        ({"name": "x", "upstreams": ["http://127.0.0.1:99999"]}, "upstreams[0]", None),
        ({"name": "x", "upstreams": ["http://"]}, "upstreams[0]", None),
        ({"name": "x", "upstreams": "http://127.0.0.1:1"}, "upstreams", "invalid deployment: Expected `array`, got `str` - at `$.upstreams`"),
        ({"upstreams": ["http://127.0.0.1:1"]}, "name", "invalid deployment: Object missing required field `name`"),
        ({"name": "x", "upstreams": ["http://127.0.0.1:1"], "replica": 2}, "replica", None),
        ({"name": "x"}, "upstreams", "deployment 'x': give exactly one of `upstreams` (a non-empty list) and `launch`"),
        ({"name": "x", "launch": {"model": "fake", "replicas": 0}}, "launch.replicas", "deployment 'x': `launch.replicas` must be at least 1"),
        ({"name": "x", "launch": {"replicas": 1}}, "launch.model", None),
        ({"name": "x", "launch": {"model": "fake", "args": ["--fake-token-delay", "soon"]}}, "launch.args",
         "`launch.args`: argument --fake-token-delay: invalid float value: 'soon'"),
        ({"name": "x", "launch": {"model": "fake", "args": ["--no-such-flag"]}}, "launch.args", "`launch.args`: unrecognized arguments: --no-such-flag"),
        ({"name": "x", "launch": {"model": "/m", "args": ["--request-timeout", "x"]}}, "launch.args", None),
        ({"name": "x", "launch": {"model": "fake", "args": ["--port", "1"]}}, "launch.args",
         "`launch.args`: --port is the gateway's to set for its replicas"),
        ({"name": "x", "id": "has space", "upstreams": ["http://127.0.0.1:1"]}, "id", "`id` must be 1 to 64 letters, digits or . _ : -"),
        ({"name": " ", "upstreams": ["http://127.0.0.1:1"]}, "name", None),
    ],
)
async def test_bad_input_is_a_400_naming_the_field_and_changes_nothing(replica, gateway, session, body, param, message):
    _, gw = await api_gateway(replica, gateway)
    before = gw.state
    status, got = await admin(session, "POST", gw.url("/v1/deployments"), body)
    assert status == 400, got
    fits("/v1/deployments", "post", 400, got)
    assert (got["error"]["param"], got["error"]["code"], got["error"]["type"]) == (param, "invalid_parameter", "invalid_request_error")
    if message is not None:
        assert got["error"]["message"] == message
    assert gw.state is before


async def test_a_body_that_is_not_a_json_object(replica, gateway, session):
    _, gw = await api_gateway(replica, gateway)
    status, got = await admin(session, "POST", gw.url("/v1/deployments"), raw=b"{nope")
    assert status == 400 and got == error_body("the request body is not valid JSON", "invalid_request_error", "invalid_json")
    status, got = await admin(session, "POST", gw.url("/v1/deployments"), [1])
    assert status == 400 and got["error"]["message"] == "the request body must be a JSON object (a deployment's fields)"


async def test_a_name_or_id_taken_is_a_409_and_the_admin_key_is_needed(replica, gateway, session):
    r, gw = await api_gateway(replica, gateway)
    status, got = await admin(session, "POST", gw.url("/v1/deployments"), new(r, name=DEPLOYMENT))
    assert status == 409
    fits("/v1/deployments", "post", 409, got)
    assert got == error_body(f"`{DEPLOYMENT}` is taken: it names the config file's `{DEPLOYMENT}` ({DEPLOYMENT_ID})",
                             "invalid_request_error", "deployment_exists", "name")
    assert (await admin(session, "POST", gw.url("/v1/deployments"), new(r)))[0] == 200
    status, got = await admin(session, "POST", gw.url("/v1/deployments"), {**new(r, name="again"), "id": "dep-tenant-bot"})
    assert status == 409 and got["error"]["param"] == "id"
    status, got = await admin(session, "POST", gw.url("/v1/deployments"), new(r, name="x"), key="sk-wrong")
    assert status == 401 and got["error"]["code"] == "invalid_api_key"


async def test_patch_changes_new_requests_while_a_stream_on_the_old_one_completes(replica, gateway, session):
    slow = await replica(SLOW)
    _, gw = await api_gateway(replica, gateway)
    b = await replica()
    assert (await admin(session, "POST", gw.url("/v1/deployments"), new(slow)))[0] == 200
    async with session.post(gw.url("/v1/chat/completions"), json=chat(model="tenant-bot", stream=True)) as resp:
        first = await resp.content.readline()
        assert first.startswith(b"data: ")
        status, got = await admin(session, "PATCH", gw.url("/v1/deployments/dep-tenant-bot"), {"upstreams": [b.base]})
        assert status == 200, got
        fits("/v1/deployments/dep-tenant-bot", "patch", 200, got)
        assert [r["url"] for r in got["replicas"]] == [b.base] and got["source"] == "api"
        assert (await chat_to(session, gw, "tenant-bot"))[0] == 200
        assert len(b.inference()) == 1
        rest = await resp.read()
    assert (first + rest).endswith(b"data: [DONE]\n\n") and b'"error"' not in rest
    # A rename, and null back to the default.
    status, got = await admin(session, "PATCH", gw.url("/v1/deployments/tenant-bot"), {"name": "renamed", "served_model": None})
    assert status == 200 and (got["id"], got["name"], got["served_model"]) == ("dep-tenant-bot", "renamed", "renamed")
    assert (await chat_to(session, gw, "tenant-bot"))[0] == 404
    status, got = await admin(session, "PATCH", gw.url("/v1/deployments/renamed"), {"id": "dep-other"})
    assert status == 400 and got["error"]["param"] == "id"
    status, got = await admin(session, "PATCH", gw.url("/v1/deployments/renamed"), {"upstreams": ["nope"]})
    assert status == 400 and got["error"]["param"] == "upstreams[0]"
    status, got = await admin(session, "PATCH", gw.url(f"/v1/deployments/{DEPLOYMENT_ID}"), {"upstreams": [b.base]})
    assert status == 400 and got["error"]["message"] == f"`{DEPLOYMENT_ID}` is a deployment of the config file: change it there and reload (SIGHUP)"
    status, got = await admin(session, "PATCH", gw.url("/v1/deployments/none-such"), {"upstreams": [b.base]})
    assert status == 404 and got["error"]["code"] == "model_not_found"


async def test_delete_answers_404_to_new_requests_while_its_stream_completes(replica, gateway, session):
    store = MemoryStore()
    slow = await replica(SLOW)
    _, gw = await api_gateway(replica, gateway, store)
    assert (await admin(session, "POST", gw.url("/v1/deployments"), new(slow)))[0] == 200
    async with session.post(gw.url("/v1/chat/completions"), json=chat(model="tenant-bot", stream=True)) as resp:
        first = await resp.content.readline()
        status, got = await admin(session, "DELETE", gw.url("/v1/deployments/dep-tenant-bot"))
        assert status == 200 and got == {"id": "dep-tenant-bot", "deleted": True, "object": "deployment"}
        fits("/v1/deployments/dep-tenant-bot", "delete", 200, got)
        status, body = await chat_to(session, gw, "tenant-bot")
        assert status == 404 and body["error"]["code"] == "model_not_found"
        rest = await resp.read()
    assert (first + rest).endswith(b"data: [DONE]\n\n")
    assert await store.list_deployments() == []
    assert gw.state.retiring == {}
    status, got = await admin(session, "DELETE", gw.url(f"/v1/deployments/{DEPLOYMENT}"))
    assert status == 400 and got["error"]["param"] == "deployment"
    status, got = await admin(session, "DELETE", gw.url("/v1/deployments/dep-tenant-bot"))
    assert status == 404


async def test_kept_in_sqlite_served_by_a_gateway_started_again_and_across_a_reload(replica, gateway, session, tmp_path, caplog):
    url = f"sqlite:///{tmp_path}/ledger.db"
    r, gw = await api_gateway(replica, gateway, await open_store(url))
    for name in ("tenant-bot", "clash"):
        assert (await admin(session, "POST", gw.url("/v1/deployments"), new(r, name=name)))[0] == 200
    # The same store, a gateway started again whose file now has a deployment named `clash`.
    caplog.set_level(logging.INFO, "streamproxy.gateway")
    again = await gateway(deployments=[*file_deployment(r), {**new(r, name="clash"), "id": "dep-file-clash"}],
                          ledger=Ledger(await open_store(url), interval=0.05), admin_key=ADMIN)
    assert (await chat_to(session, again, "tenant-bot"))[0] == 200
    assert again.state.describe("tenant-bot")["source"] == "api" and again.state.describe("clash")["id"] == "dep-file-clash"
    assert ("deployment clash (dep-clash) from the ledger's store is not served: gateway config: 'clash' names two deployments"
            in caplog.messages)
    # SIGHUP keeps the API's deployments beside the file's new ones.
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump({"deployments": file_deployment(r)}))
    assert reload(again.app, partial(load_gateway, str(path), [], strict=True), str(path))
    assert (await chat_to(session, again, "tenant-bot"))[0] == 200
    assert [d.name for d in again.state.deployments] == [DEPLOYMENT, "tenant-bot"]


async def test_without_a_ledger_the_routes_say_ledger_off(replica, gateway, session):
    r = await replica()
    gw = await gateway(deployments=file_deployment(r), admin_key=ADMIN)
    status, got = await admin(session, "POST", gw.url("/v1/deployments"), new(r))
    assert status == 404 and got["error"]["code"] == "ledger_off"
