"""Admin routes of the keys kept in the ledger's store: `POST /v1/keys`, `GET /v1/keys`, `DELETE /v1/keys/{key_id}`.

A new key's secret is in the answer to its POST and nowhere else (the store
keeps its SHA-256). It works in this gateway at once, and in every other
gateway sharing the store within `keyring.REFRESH`; a DELETE revokes it the
same way. The config file's keys are listed too (`source: "config"`), but
are changed by editing the file. Without a ledger (`ledger: off`): 404
`ledger_off`.
"""

from __future__ import annotations

import time

import msgspec
from aiohttp import web

from streamproxy.errors import APIError, InvalidRequest, NotFound
from streamproxy.gateway.books import read_store
from streamproxy.gateway.keyring import Keyring
from streamproxy.gateway.state import GatewayState, gateway_state
from streamproxy.http.routes.body import read_body
from streamproxy.ledger import keys as K

_encode = msgspec.json.Encoder().encode


class KeyConflict(APIError):
    status = 409
    type = "invalid_request_error"
    code = "key_exists"


def _keyring(request: web.Request) -> tuple[GatewayState, Keyring]:
    state = gateway_state(request)
    state.authorize_admin(request)
    if state.keyring is None:
        raise NotFound("the gateway's ledger is off (`ledger: off` in its config): it has nowhere to keep keys", code="ledger_off")
    return state, state.keyring


def _json(data: msgspec.Struct) -> web.Response:
    return web.Response(body=_encode(data), content_type="application/json")


async def create_key(request: web.Request) -> web.Response:
    state, keyring = _keyring(request)
    known = {name for d in state.deployments for name in (d.name, d.id)}
    req = K.parse_create(await read_body(request), known)
    key_id = req.id or K.new_id()
    if any(k.id == key_id for k in state.config.keys):
        raise KeyConflict(f"the config file has a key `{key_id}`", param="id")
    secret = K.new_secret()
    stored = K.StoredKey(id=key_id, hash=K.hash_secret(secret), deployments=req.deployments, rpm=req.rpm, tpm=req.tpm,
                         budget_tokens=req.budget_tokens, budget_period=req.budget_period, created=int(time.time()))
    try:
        await read_store(keyring.store.put_key(stored))
    except K.KeyExists:
        raise KeyConflict(f"a key `{key_id}` exists (or existed: ids are not given twice)", param="id") from None
    keyring.add(stored)
    return _json(K.KeyCreated(id=key_id, secret=secret, deployments=stored.deployments, rpm=stored.rpm, tpm=stored.tpm,
                              budget_tokens=stored.budget_tokens, budget_period=stored.budget_period, created=stored.created))


async def list_keys(request: web.Request) -> web.Response:
    state, keyring = _keyring(request)
    stored = await read_store(keyring.store.list_keys())
    config = [K.KeyInfo(id=k.id, deployments=k.deployments, rpm=k.rpm, tpm=k.tpm, budget_tokens=None, budget_period=None,
                        created=state.started, source="config") for k in state.config.keys]
    return _json(K.KeyList(data=config + [K.info(k) for k in stored]))


async def delete_key(request: web.Request) -> web.Response:
    state, keyring = _keyring(request)
    key_id = request.match_info["key_id"]
    if any(k.id == key_id for k in state.config.keys):
        raise InvalidRequest(f"`{key_id}` is a key of the config file: remove it there", param="key_id")
    if not await read_store(keyring.store.revoke_key(key_id, int(time.time()))):
        raise NotFound(f"no key `{key_id}` (or it is revoked already)", param="key_id", code="key_not_found")
    keyring.remove(key_id)
    return _json(K.KeyDeleted(id=key_id))
