"""Keys made through the admin API (POST/GET/DELETE /v1/keys), kept in the ledger's store: the
secret shown once and never listed, the key used at once, stopped at its token budget with 429
`insufficient_quota` (which budget, until when), revoked at once (401); bad requests are 400s
naming the field; and two gateways sharing one PostgreSQL see each other's keys, revocations and
spend within a refresh."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from streamproxy.gateway import keyring as keyring_module
from streamproxy.ledger.keys import period_start
from streamproxy.ledger.memory import MemoryStore
from streamproxy.ledger.store import open_store
from streamproxy.ledger.writer import Ledger
from tests.gateway.gateway_support import DEPLOYMENT, DEPLOYMENT_ID, SERVED, chat, fits, post

ADMIN = "sk-admin-keys"
PER_REQUEST = 27  # the fake replica's 24 prompt + 3 completion tokens for chat()


@pytest.fixture(autouse=True)
def quick_refresh(monkeypatch):
    assert keyring_module.REFRESH <= 1.0  # "within a second"
    monkeypatch.setattr(keyring_module, "REFRESH", 0.1)


async def keyed_gateway(replica, gateway, store=None, **kw):
    r = await replica()
    deployments = [{"name": DEPLOYMENT, "id": DEPLOYMENT_ID, "served_model": SERVED, "upstreams": [r.base]},
                   {"name": "other", "id": "dep-other", "served_model": SERVED, "upstreams": [r.base]}]
    gw = await gateway(deployments=deployments, ledger=Ledger(store or MemoryStore(), interval=0.05), **kw)
    gw.state.admin_key = ADMIN.encode()
    return gw


async def eventually(check, timeout: float = 5.0) -> bool:
    """`await check()` is true within `timeout` (each try is a real request)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await check():
            return True
        await asyncio.sleep(0.05)
    return False


async def admin(session, method: str, url: str, body: object = None, key: str = ADMIN) -> tuple[int, dict]:
    async with session.request(method, url, json=body, headers={"Authorization": f"Bearer {key}"}) as resp:
        return resp.status, await resp.json()


def body_of(model: str = DEPLOYMENT) -> dict:
    return chat(model, max_tokens=3)  # the fake replica's whole answer: the hold is its prompt's estimate + 3


HOLD = len(json.dumps(body_of()).encode()) // 4 + 1 + 3  # what a budget holds for body_of() (holds.worst_case)


async def use(session, gw, secret: str, model: str = DEPLOYMENT) -> tuple[int, dict]:
    status, _, body = await post(session, gw.url("/v1/chat/completions"), body_of(model), Authorization=f"Bearer {secret}")
    return status, json.loads(body)


async def test_a_key_is_made_used_stopped_at_its_budget_and_revoked(replica, gateway, session):
    gw = await keyed_gateway(replica, gateway)
    # An open gateway (no key anywhere) until the first key is made.
    assert (await use(session, gw, "anything"))[0] == 200
    status, made = await admin(session, "POST", gw.url("/v1/keys"),
                               {"id": "cust-1", "deployments": [DEPLOYMENT], "budget_tokens": 60, "budget_period": "day", "rpm": 100})
    assert status == 200, made
    fits("/v1/keys", "post", 200, made)
    secret = made["secret"]
    assert secret.startswith("sk-sp-") and len(secret) > 40
    assert {k: made[k] for k in ("id", "deployments", "rpm", "tpm", "budget_tokens", "budget_period", "object")} == {
        "id": "cust-1", "deployments": [DEPLOYMENT], "rpm": 100, "tpm": 0, "budget_tokens": 60, "budget_period": "day",
        "object": "api_key"}
    # Listed, never with its secret or its hash.
    async with session.get(gw.url("/v1/keys"), headers={"Authorization": f"Bearer {ADMIN}"}) as resp:
        raw = await resp.read()
    assert secret.encode() not in raw and b"hash" not in raw and b"secret" not in raw
    status, listed = await admin(session, "GET", gw.url("/v1/keys"))
    fits("/v1/keys", "get", 200, listed)
    assert [(k["id"], k["source"]) for k in listed["data"]] == [("cust-1", "api")]
    # Now the gateway asks for a key; this one works at once, for its deployments only.
    assert (await use(session, gw, "anything"))[0] == 401
    assert (await use(session, gw, secret, "other"))[0] == 401
    assert 2 * PER_REQUEST + HOLD > 60 >= PER_REQUEST + HOLD
    for _ in range(2):  # 27, 54 tokens: each held its worst case first, and it fit
        status, body = await use(session, gw, secret)
        assert status == 200, body
    status, body = await use(session, gw, secret)  # 54 + its hold would pass 60: refused before it runs
    _, end = period_start(time.time(), "day")
    resets = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(end))
    assert (status, body) == (429, {"error": {
        "message": f"API key `cust-1` has {60 - 2 * PER_REQUEST} tokens left of its daily budget of 60 tokens "
                   f"({2 * PER_REQUEST} used) and this request may use up to {HOLD} tokens (about {HOLD - 3} prompt + 3 "
                   f"completion, its max_tokens); it resets at {resets}",
        "type": "insufficient_quota", "param": None, "code": "insufficient_quota"}})
    # Revoked: refused at once.
    status, gone = await admin(session, "DELETE", gw.url("/v1/keys/cust-1"))
    assert (status, gone) == (200, {"id": "cust-1", "deleted": True, "object": "api_key"})
    assert (await use(session, gw, secret))[0] == 401
    status, again = await admin(session, "DELETE", gw.url("/v1/keys/cust-1"))
    assert (status, again["error"]["code"]) == (404, "key_not_found")
    status, taken = await admin(session, "POST", gw.url("/v1/keys"), {"id": "cust-1", "deployments": ["*"]})
    assert (status, taken["error"]["code"], taken["error"]["param"]) == (409, "key_exists", "id")
    # The ledger has the key's requests under its id (the refused ones too).
    ledger = gw.state.ledger
    assert ledger is not None and await ledger.flush()
    rows = await ledger.store.usage(__import__("streamproxy.ledger.records", fromlist=["UsageQuery"]).UsageQuery(
        start_us=0, end_us=2**62, group_by=("key",)))
    assert {(u.key_id, u.requests, u.prompt_tokens + u.completion_tokens) for u in rows} >= {("cust-1", 4, 2 * PER_REQUEST)}


@pytest.mark.parametrize(("body", "param", "message"), [
    ({"deployments": [DEPLOYMENT], "budget_tokens": 0, "budget_period": "day"}, "budget_tokens",
     "`budget_tokens` must be a positive number of tokens"),
    ({"deployments": [DEPLOYMENT], "budget_tokens": 100}, "budget_period",
     "a budget needs both `budget_tokens` and `budget_period` (day or month)"),
    ({"deployments": ["nope"]}, "deployments", "no deployment named 'nope'"),
    ({"deployments": []}, "deployments", "`deployments` must name at least one deployment (or \"*\")"),
    ({"deployments": ["*"], "rpm": -1}, "rpm", "`rpm` must be 0 (no limit) or a positive number"),
    ({"deployments": ["*"], "id": "bad id!"}, "id", "`id` must be 1 to 64 letters, digits or . _ : -"),
])
async def test_a_bad_key_request_is_a_400_naming_the_field(replica, gateway, session, body, param, message):
    gw = await keyed_gateway(replica, gateway)
    status, answer = await admin(session, "POST", gw.url("/v1/keys"), body)
    assert (status, answer) == (400, {"error": {"message": message, "type": "invalid_request_error", "param": param,
                                                "code": "invalid_parameter"}})


async def test_wrong_types_and_bad_json_and_no_admin_key(replica, gateway, session):
    gw = await keyed_gateway(replica, gateway)
    status, answer = await admin(session, "POST", gw.url("/v1/keys"), {"deployments": ["*"], "budget_tokens": "lots",
                                                                        "budget_period": "day"})
    assert (status, answer["error"]["param"], answer["error"]["code"]) == (400, "budget_tokens", "invalid_parameter")
    status, answer = await admin(session, "POST", gw.url("/v1/keys"), {"deployments": ["*"], "budget_period": "year",
                                                                        "budget_tokens": 5})
    assert (status, answer["error"]["param"]) == (400, "budget_period")
    async with session.post(gw.url("/v1/keys"), data=b"{", headers={"Authorization": f"Bearer {ADMIN}"}) as resp:
        assert resp.status == 400 and (await resp.json())["error"]["code"] == "invalid_json"
    for method, path in (("POST", "/v1/keys"), ("GET", "/v1/keys"), ("DELETE", "/v1/keys/x")):
        status, answer = await admin(session, method, gw.url(path), {"deployments": ["*"]}, key="sk-not-admin")
        assert (status, answer["error"]["code"]) == (401, "invalid_api_key")


async def test_two_gateways_on_one_postgresql_share_keys_revocations_and_budgets(replica, gateway, session, postgres_server):
    url = postgres_server.database()
    a = await keyed_gateway(replica, gateway, await open_store(url))
    b = await keyed_gateway(replica, gateway, await open_store(url))
    status, made = await admin(session, "POST", a.url("/v1/keys"),
                               {"id": "team-both", "deployments": ["*"], "budget_tokens": 100, "budget_period": "month"})
    assert status == 200
    secret = made["secret"]
    assert (await use(session, a, secret))[0] == 200  # at once where it was made

    async def works_on_b() -> bool:
        return (await use(session, b, secret))[0] == 200

    assert await eventually(works_on_b)  # within a refresh on the other
    # Spend on both counts against one budget: 27 x 3 = 81, and a fourth's hold does not fit in 100.
    assert (await use(session, b, secret))[0] == 200
    assert (await use(session, a, secret))[0] == 200  # a: 2 of its own, plus what b spent once both refreshed

    async def over_on(gw) -> bool:
        status, body = await use(session, gw, secret)
        return status == 429 and body["error"]["code"] == "insufficient_quota"

    assert await eventually(lambda: over_on(a))
    assert await eventually(lambda: over_on(b))
    # Revoked on a: refused on b within a refresh.
    status, _ = await admin(session, "DELETE", a.url("/v1/keys/team-both"))
    assert status == 200

    async def refused_on_b() -> bool:
        return (await use(session, b, secret))[0] == 401

    assert await eventually(refused_on_b)
    status, listed = await admin(session, "GET", b.url("/v1/keys"))
    assert [(k["id"], k["revoked"] is not None) for k in listed["data"]] == [("team-both", True)]
