"""Routing: by `model`, by the deployment id in the path (with and without a second /v1/),
404 for an unknown name, `GET /v1/models`; the model renamed to the replica's on the way up
and back to the deployment's in every chunk, event and body, byte for byte otherwise."""

from __future__ import annotations

import json
import re

import pytest

from streamproxy.protocol.common import ModelCard, ModelList, encode
from tests.gateway.gateway_support import DEPLOYMENT, DEPLOYMENT_ID, SERVED, chat, error_body, post, renamed, timeless
from tests.support import sse

OTHER = {"name": "other-bot", "id": "dep-0b", "served_model": SERVED}


def msg_ids(raw: bytes) -> bytes:
    """Responses' item ids are random per answer."""
    return re.sub(rb'"(msg_[0-9a-f]+)"', b'"msg_X"', raw)


ROUTES = {
    "chat": ("/v1/chat/completions", chat(max_tokens=5)),
    "completions": ("/v1/completions", {"model": DEPLOYMENT, "prompt": "hi", "max_tokens": 5}),
    "responses": ("/v1/responses", {"model": DEPLOYMENT, "input": "hi", "max_output_tokens": 5}),
    "messages": ("/v1/messages", {"model": DEPLOYMENT, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}),
}


@pytest.mark.parametrize("stream", [False, True], ids=["body", "stream"])
@pytest.mark.parametrize("route", list(ROUTES))
async def test_model_is_renamed_up_and_back_and_the_rest_is_the_replicas_bytes(replica, gateway, session, route, stream):
    r = await replica()
    gw = await gateway(r)
    path, body = ROUTES[route]
    body = {**body, "stream": stream}
    if stream and route == "chat":
        body["stream_options"] = {"include_usage": True}  # asked by the client: the gateway adds and removes nothing
    status, headers, got = await post(session, gw.url(path), body, **{"X-Request-Id": f"rename-{route}"})
    assert status == 200, got
    # What the replica was asked: its own name for the model.
    assert [(s.path, s.model, s.request_id) for s in r.inference()] == [(path, SERVED, f"rename-{route}")]
    # The same request straight to the replica, with its name: the gateway's answer is it, renamed.
    direct_status, _, direct = await post(session, r.url(path), {**body, "model": SERVED}, **{"X-Request-Id": f"rename-{route}"})
    assert direct_status == 200
    assert SERVED.encode() in direct and SERVED.encode() not in got
    assert msg_ids(timeless(got)) == msg_ids(timeless(renamed(direct)))
    if stream:
        payloads = [f.json() for f in sse.events(got) if f.data and not f.is_done]
        models = [p.get("model") or (p.get("response") or p.get("message") or {}).get("model") for p in payloads]
        assert {m for m in models if m is not None} == {DEPLOYMENT}
        assert headers["Content-Type"] == "text/event-stream"
    else:
        assert json.loads(got)["model"] == DEPLOYMENT


@pytest.mark.parametrize("prefix", ["/v1/deployments/dep-7f3a", "/v1/deployments/dep-7f3a/v1", "/v1/deployments/support-bot"])
async def test_routes_by_the_deployment_in_the_path(replica, gateway, session, prefix):
    r = await replica()
    other = await replica()
    gw = await gateway(deployments=[
        {"name": DEPLOYMENT, "id": DEPLOYMENT_ID, "served_model": SERVED, "upstreams": [r.base]},
        {**OTHER, "upstreams": [other.base]},
    ])
    # No model in the body: the path names the deployment, and the answer names it too.
    status, _, got = await post(session, gw.url(prefix + "/chat/completions"), chat(model=None))
    assert status == 200, got
    assert json.loads(got)["model"] == DEPLOYMENT
    assert [(s.path, s.model) for s in r.inference()] == [("/v1/chat/completions", SERVED)]
    assert other.inference() == []


async def test_routes_by_model_between_deployments(replica, gateway, session):
    a, b = await replica(), await replica()
    gw = await gateway(deployments=[
        {"name": DEPLOYMENT, "id": DEPLOYMENT_ID, "served_model": SERVED, "upstreams": [a.base]},
        {**OTHER, "upstreams": [b.base]},
    ])
    status, _, got = await post(session, gw.url("/v1/chat/completions"), chat(model="other-bot"))
    assert status == 200 and json.loads(got)["model"] == "other-bot"
    assert a.inference() == [] and [s.model for s in b.inference()] == [SERVED]


async def test_unknown_model_is_404_model_not_found(replica, gateway, session):
    r = await replica()
    gw = await gateway(r)
    status, _, got = await post(session, gw.url("/v1/chat/completions"), chat(model="no-such-bot"))
    assert status == 404
    assert json.loads(got) == error_body("The model `no-such-bot` does not exist.", "invalid_request_error", "model_not_found", "model")
    status, _, got = await post(session, gw.url("/v1/deployments/dep-nope/chat/completions"), chat(model=None))
    assert status == 404
    assert json.loads(got) == error_body("no deployment `dep-nope`", "invalid_request_error", "model_not_found", "model")
    assert r.inference() == []


async def test_model_is_required_when_there_are_several_deployments(replica, gateway, session):
    r = await replica()
    gw = await gateway(deployments=[
        {"name": DEPLOYMENT, "id": DEPLOYMENT_ID, "served_model": SERVED, "upstreams": [r.base]},
        {**OTHER, "upstreams": [r.base]},
    ])
    status, _, got = await post(session, gw.url("/v1/chat/completions"), chat(model=None))
    assert status == 400
    assert json.loads(got) == error_body(
        "'model' is required: name one of the deployments (GET /v1/models)", "invalid_request_error", None, "model"
    )
    assert r.inference() == []


async def test_models_lists_the_deployments(replica, gateway, session):
    r = await replica()
    gw = await gateway(deployments=[
        {"name": DEPLOYMENT, "id": DEPLOYMENT_ID, "served_model": SERVED, "upstreams": [r.base]},
        {**OTHER, "upstreams": [r.base]},
    ])
    async with session.get(gw.url("/v1/models")) as resp:
        assert resp.status == 200
        body = await resp.read()
    listing = json.loads(body)
    assert listing["object"] == "list"
    assert [(m["id"], m["object"], m["owned_by"]) for m in listing["data"]] == [
        (DEPLOYMENT, "model", "streamproxy"), ("other-bot", "model", "streamproxy"),
    ]
    # Serve's typed cards, byte for byte (`root`, `max_model_len`, `parent` null: a deployment has none).
    created = listing["data"][0]["created"]
    card = ModelCard(id=DEPLOYMENT, created=created)
    assert body == encode(ModelList(data=[card, ModelCard(id="other-bot", created=created)]))
    async with session.get(gw.url("/v1/deployments/dep-0b/v1/models")) as resp:
        assert [m["id"] for m in (await resp.json())["data"]] == ["other-bot"]
    async with session.get(gw.url(f"/v1/models/{DEPLOYMENT}")) as resp:
        assert resp.status == 200 and await resp.read() == encode(card)
    async with session.get(gw.url(f"/v1/models/{SERVED}")) as resp:  # the replicas' name is not the gateway's
        assert resp.status == 404
        assert (await resp.json())["error"]["code"] == "model_not_found"
    assert r.inference() == []  # listing is the gateway's own answer


async def test_a_deployment_whose_id_is_its_name(replica, gateway, session):
    """`id: d0` with `name: d0` is one deployment with two equal names (it was refused at start
    with "'d0' names two deployments"): routed by model and by path, listed once."""
    r = await replica()
    gw = await gateway(deployments=[
        {"name": "d0", "id": "d0", "served_model": SERVED, "upstreams": [r.base]},
        {**OTHER, "upstreams": [r.base]},
    ])
    for path, model in [("/v1/chat/completions", "d0"), ("/v1/deployments/d0/chat/completions", None)]:
        status, _, got = await post(session, gw.url(path), chat(model=model))
        assert status == 200 and json.loads(got)["model"] == "d0", got
    async with session.get(gw.url("/v1/models")) as resp:
        assert [m["id"] for m in (await resp.json())["data"]] == ["d0", "other-bot"]
    assert [s.model for s in r.inference()] == [SERVED, SERVED]
