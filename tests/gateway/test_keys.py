"""Per-deployment API keys: 401 without a key, with a wrong one, or with one the deployment
does not allow (in each route's error shape); the key's id in the access log and the key
itself nowhere (not in the log, not sent to the replica); 429 + Retry-After over `rpm`,
and over `tpm` once enough tokens were metered."""

from __future__ import annotations

import json
import re

from tests.gateway.gateway_support import DEPLOYMENT, DEPLOYMENT_ID, SERVED, chat, error_body, gateway_lines, post

TEAM_A = "sk-team-a-4f1c9e0b7d"
TEAM_B = "sk-team-b-83a2d6c511"
PROMPT_TOKENS = 24  # the fake replica's rendering of USER_HI, one token a character
ANSWER_TOKENS = 3  # "Hel", "lo", " world"


async def two_deployments(replica, gateway, **team_a):
    r = await replica()
    gw = await gateway(
        deployments=[
            {"name": DEPLOYMENT, "id": DEPLOYMENT_ID, "served_model": SERVED, "upstreams": [r.base]},
            {"name": "other-bot", "id": "dep-0b", "served_model": SERVED, "upstreams": [r.base]},
        ],
        keys=[
            {"id": "team-a", "key": TEAM_A, "deployments": [DEPLOYMENT], **team_a},
            {"id": "team-b", "key": TEAM_B, "deployments": ["dep-0b"]},
        ],
    )
    return r, gw


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def test_no_key_is_401(replica, gateway, session):
    r, gw = await two_deployments(replica, gateway)
    status, _, got = await post(session, gw.url("/v1/chat/completions"), chat())
    assert status == 401
    assert json.loads(got) == error_body("missing API key: send 'Authorization: Bearer <key>'", "authentication_error", "invalid_api_key")
    assert r.inference() == []


async def test_without_a_valid_key_an_unknown_model_is_401_too(replica, gateway, session):
    # Refused before the deployments are looked up: no way to learn which names exist.
    _, gw = await two_deployments(replica, gateway)
    for headers in ({}, bearer("sk-team-a-guess")):
        status, _, got = await post(session, gw.url("/v1/chat/completions"), chat(model="no-such-model"), **headers)
        assert status == 401 and json.loads(got)["error"]["type"] == "authentication_error"
    status, _, got = await post(session, gw.url("/v1/chat/completions"), chat(model="no-such-model"), **bearer(TEAM_A))
    assert status == 404 and json.loads(got)["error"]["code"] == "model_not_found"


async def test_wrong_key_is_401(replica, gateway, session):
    r, gw = await two_deployments(replica, gateway)
    status, _, got = await post(session, gw.url("/v1/chat/completions"), chat(), **bearer("sk-team-a-guess"))
    assert status == 401
    assert json.loads(got) == error_body("incorrect API key provided", "authentication_error", "invalid_api_key")
    assert r.inference() == []


async def test_a_key_not_allowed_for_the_deployment_is_401(replica, gateway, session):
    r, gw = await two_deployments(replica, gateway)
    status, _, got = await post(session, gw.url("/v1/chat/completions"), chat(), **bearer(TEAM_B))
    assert status == 401
    assert json.loads(got) == error_body(
        f"this API key may not use the deployment `{DEPLOYMENT}`", "authentication_error", "invalid_api_key"
    )
    # The same through the path, and the deployment it may use works.
    status, _, _ = await post(session, gw.url(f"/v1/deployments/{DEPLOYMENT_ID}/chat/completions"), chat(model=None), **bearer(TEAM_B))
    assert status == 401
    status, _, _ = await post(session, gw.url("/v1/chat/completions"), chat(model="other-bot"), **bearer(TEAM_B))
    assert status == 200
    assert len(r.inference()) == 1


async def test_anthropic_route_answers_401_in_its_shape_and_takes_x_api_key(replica, gateway, session):
    _, gw = await two_deployments(replica, gateway)
    body = {"model": DEPLOYMENT, "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}
    status, _, got = await post(session, gw.url("/v1/messages"), body, **{"x-api-key": "sk-wrong"})
    assert status == 401
    assert json.loads(got) == {"type": "error", "error": {"type": "authentication_error", "message": "incorrect API key provided"}}
    status, _, got = await post(session, gw.url("/v1/messages"), body, **{"x-api-key": TEAM_A})
    assert status == 200 and json.loads(got)["model"] == DEPLOYMENT


async def test_models_lists_what_the_key_may_use(replica, gateway, session):
    _, gw = await two_deployments(replica, gateway)
    async with session.get(gw.url("/v1/models"), headers=bearer(TEAM_B)) as resp:
        assert [m["id"] for m in (await resp.json())["data"]] == ["other-bot"]
    async with session.get(gw.url("/v1/models")) as resp:
        assert resp.status == 401


async def test_the_log_has_the_key_id_never_the_key_and_the_replica_never_sees_it(replica, gateway, session, access_log):
    r, gw = await two_deployments(replica, gateway)
    for stream in (False, True):
        status, _, _ = await post(session, gw.url("/v1/chat/completions"), chat(stream=stream), **bearer(TEAM_A))
        assert status == 200
    await post(session, gw.url("/v1/chat/completions"), chat(), **bearer(TEAM_A + "x"))  # a near miss, refused
    lines = gateway_lines(access_log)
    assert [(line["key_id"], line["status"]) for line in lines] == [("team-a", 200), ("team-a", 200)]
    refused = [json.loads(line) for line in access_log if json.loads(line)["status"] == 401]
    # Refused before the body is read or a deployment looked up: the line names none.
    assert [(line["path"], line.get("key_id"), line.get("deployment")) for line in refused] == [("/v1/chat/completions", None, None)]
    assert not any(TEAM_A in line for line in access_log)  # neither the key nor the near miss, in any line
    assert len(r.inference()) == 2
    for seen in r.inference():
        assert "Authorization" not in seen.headers and "x-api-key" not in {k.lower() for k in seen.headers}


async def test_rpm_limit_is_429_with_retry_after(replica, gateway, session):
    r, gw = await two_deployments(replica, gateway, rpm=2)
    for _ in range(2):
        status, _, _ = await post(session, gw.url("/v1/chat/completions"), chat(), **bearer(TEAM_A))
        assert status == 200
    status, headers, got = await post(session, gw.url("/v1/chat/completions"), chat(), **bearer(TEAM_A))
    assert status == 429
    wait = int(headers["Retry-After"])
    assert 1 <= wait <= 60
    message = json.loads(got)["error"]["message"]
    assert re.fullmatch(r"API key `team-a` is over its per-minute limit; retry after \d+ s", message), message
    assert json.loads(got) == error_body(message, "rate_limit_error", "rate_limit_exceeded")
    assert len(r.inference()) == 2
    # Another key has its own window.
    status, _, _ = await post(session, gw.url("/v1/chat/completions"), chat(model="other-bot"), **bearer(TEAM_B))
    assert status == 200


async def test_tpm_limit_is_429_once_enough_tokens_were_metered(replica, gateway, session, access_log):
    per_request = PROMPT_TOKENS + ANSWER_TOKENS
    r, gw = await two_deployments(replica, gateway, tpm=per_request + 1)
    statuses = []
    for _ in range(3):
        status, headers, got = await post(session, gw.url("/v1/chat/completions"), chat(), **bearer(TEAM_A))
        statuses.append(status)
    # 0 tokens, then 27 (< 28): both admitted; then 54 metered: refused.
    assert statuses == [200, 200, 429]
    assert 1 <= int(headers["Retry-After"]) <= 60
    assert json.loads(got)["error"]["code"] == "rate_limit_exceeded"
    assert [(line["prompt_tokens"], line["completion_tokens"]) for line in gateway_lines(access_log)[:2]] == [(24, 3)] * 2
    assert len(r.inference()) == 2
