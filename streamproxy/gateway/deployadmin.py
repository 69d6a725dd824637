"""Deployments made through the admin API: `POST /v1/deployments`, `PATCH` and `DELETE /v1/deployments/{id}`.

The body is a config file's `deployments:` entry as JSON (`id` optional: `dep-` + 8 hex digits); a PATCH
names the fields to change (null: the default; `id` fixed). Checked by the config's rules and against
the whole config (`reload.merged`): a 400 naming `param`, a 409 for a name or id taken. Written to the
ledger's store (unwritable: 503, nothing changes), then served through the reload swap; other gateways
follow within a second (deploysync.py). The file's deployments are changed in the file (400); without a
ledger: 404 `ledger_off`.
"""

from __future__ import annotations

import argparse
import logging
import re
import secrets
import time
from typing import Any, NoReturn
from urllib.parse import urlsplit

import msgspec
from aiohttp import web

from streamproxy.config import add_arguments
from streamproxy.errors import APIError, InvalidRequest, ModelNotFound, NotFound
from streamproxy.gateway.books import read_store
from streamproxy.gateway.config import ConfigError, Deployment, GatewayConfig
from streamproxy.gateway.config_file import check
from streamproxy.gateway.reload import merged, swap
from streamproxy.gateway.state import STATE_KEY, Current, gateway_state
from streamproxy.http.routes.body import read_body
from streamproxy.ledger.deployments import DeploymentExists, StoredDeployment
from streamproxy.ledger.store import LedgerStore

log = logging.getLogger("streamproxy.gateway")

_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")
_encode = msgspec.json.Encoder().encode
_decode_any = msgspec.json.Decoder().decode


class DeploymentConflict(APIError):
    status = 409
    type = "invalid_request_error"
    code = "deployment_exists"


class DeploymentDeleted(msgspec.Struct, kw_only=True):
    id: str
    deleted: bool = True
    object: str = "deployment"


def _bad(param: str | None, message: str) -> InvalidRequest:
    return InvalidRequest(message, param=param, code="invalid_parameter")


def _admin(request: web.Request) -> tuple[Current, LedgerStore]:
    state = gateway_state(request)
    state.authorize_admin(request)
    if state.ledger is None:
        raise NotFound("the gateway's ledger is off (`ledger: off` in its config): it has nowhere to keep deployments", code="ledger_off")
    return request.app[STATE_KEY], state.ledger.store


def _object(raw: bytes) -> dict[str, Any]:
    try:
        data = _decode_any(raw)
    except msgspec.DecodeError:
        raise InvalidRequest("the request body is not valid JSON", code="invalid_json") from None
    if not isinstance(data, dict):
        raise InvalidRequest("the request body must be a JSON object (a deployment's fields)")
    return data


def _param_of(text: str) -> str | None:
    """msgspec's `... - at `$.launch.replicas`` / `field `name`` -> `launch.replicas` / `name`."""
    at = re.search(r"at `\$\.?([^`]*)`", text)
    field = re.search(r"field `([^`]*)`", text)
    parts = [p for p in ((at.group(1) if at else ""), (field.group(1) if field else "")) if p]
    return ".".join(parts) or None


def parse(data: dict[str, Any]) -> Deployment:
    """A deployment entry, by the config file's rules; a 400 naming the field otherwise."""
    try:
        d = msgspec.convert(data, Deployment)
    except msgspec.ValidationError as exc:
        raise _bad(_param_of(str(exc)), f"invalid deployment: {exc}") from None
    if not _ID.fullmatch(d.id):
        raise _bad("id", "`id` must be 1 to 64 letters, digits or . _ : -")
    if not d.name.strip() or len(d.name) > 256:
        raise _bad("name", "`name` must be 1 to 256 characters, not only spaces")
    for i, url in enumerate(d.upstreams):
        if not _http_url(url):
            raise _bad(f"upstreams[{i}]", f"upstream {url!r} is not an http(s) URL with a host (and a port, if any, from 1 to 65535)")
    if d.launch is not None:
        _check_args(d.launch.model, d.launch.args)
    try:  # the rest of the config's checks, on this entry alone (beside a placeholder-free config)
        check(GatewayConfig(deployments=[d]))
    except ConfigError as exc:
        named = re.search(r"`([a-z_]+(?:\.[a-z_]+)*)`", str(exc))
        raise _bad(named.group(1) if named else None, str(exc)) from None
    return d


class _ArgsError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _ArgsError(message)


_GATEWAY_SETS = ("--host", "--port", "--uds")


def _check_args(model: str, args: list[str]) -> None:
    """`launch.args` as `streamproxy serve` will read them: streamproxy's own flags and their values
    (with `model: fake`, nothing else either; with a real model, the rest is left to vLLM's parser in the replica)."""
    fixed = [a for a in args if a.split("=", 1)[0] in _GATEWAY_SETS]
    if fixed:
        raise _bad("launch.args", f"`launch.args`: {fixed[0].split('=', 1)[0]} is the gateway's to set for its replicas")
    parser = _Parser(prog="streamproxy serve", allow_abbrev=False, add_help=False)
    add_arguments(parser)
    try:
        if model == "fake":
            parser.parse_args(["--engine", "fake", *args])
        else:
            parser.parse_known_args(args)
    except _ArgsError as exc:
        raise _bad("launch.args", f"`launch.args`: {exc}") from None


def _http_url(url: str) -> bool:
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname) and (port is None or 0 < port < 65536)


def _taken(current: Current, d: Deployment, replacing: str | None) -> None:
    """409 when the name or id is another deployment's (the file's, or the API's but `replacing`)."""
    for other in (*current.file_config.deployments, *current.api.values()):
        if other.id == replacing:
            continue
        where = "the config file's" if other in current.file_config.deployments else "a deployment made through the API"
        for field in ("name", "id"):
            value = getattr(d, field)
            if value in (other.name, other.id):
                raise DeploymentConflict(f"`{value}` is taken: it names {where} `{other.name}` ({other.id})", param=field)


def _fits(current: Current, api: dict[str, Deployment]) -> None:
    """The whole config with this change: a 400 (e.g. a key of the file naming a deployment deleted here)."""
    try:
        merged(current.file_config, api)
    except ConfigError as exc:
        raise InvalidRequest(str(exc), code="invalid_parameter") from None


def _stored(d: Deployment, created: int) -> StoredDeployment:
    now = int(time.time())
    return StoredDeployment(id=d.id, name=d.name, spec=_encode(d).decode(), created=created or now, updated=now)


async def _put(request: web.Request, current: Current, store: LedgerStore, d: Deployment, replacing: str | None) -> web.Response:
    api = {**current.api}
    api[replacing or d.id] = d  # a PATCH keeps the deployment's place
    _fits(current, api)
    before = current.api.get(replacing) if replacing else None
    try:
        await read_store(store.put_deployment(_stored(d, 0)))
    except DeploymentExists:
        raise DeploymentConflict(f"`{d.name}` is taken by another deployment in the ledger's store", param="name") from None
    # Since the await: another change may have come; this one goes on top of it.
    api = {**current.api}
    api[replacing or d.id] = d
    state = current.state
    try:
        new, retired = swap(request.app, state.settings, current.file_config, api)
    except Exception as exc:  # not served: the store goes back to what is served
        undo = store.put_deployment(_stored(before, 0)) if before is not None else store.delete_deployment(d.id)
        try:
            await undo
        except Exception:
            log.exception("deployment %s: the store keeps a change the gateway refused", d.id)
        if isinstance(exc, ConfigError):
            raise InvalidRequest(str(exc), code="invalid_parameter") from None
        raise
    log.info("deployment %s (%s) %s through the admin API%s", d.name, d.id, "changed" if replacing else "added",
             f"; retired: {', '.join(retired)}" if retired else "")
    return web.Response(body=_encode(new.describe(d.name)), content_type="application/json")


async def create_deployment(request: web.Request) -> web.Response:
    current, store = _admin(request)
    data = _object(await read_body(request))
    data.setdefault("id", f"dep-{secrets.token_hex(4)}")
    d = parse(data)
    _taken(current, d, None)
    return await _put(request, current, store, d, None)


def _made_here(current: Current, name: str) -> Deployment:
    for d in current.api.values():
        if name in (d.id, d.name):
            return d
    if any(name in (d.id, d.name) for d in current.file_config.deployments):
        raise InvalidRequest(f"`{name}` is a deployment of the config file: change it there and reload (SIGHUP)", param="deployment")
    raise ModelNotFound(f"no deployment `{name}`", param="deployment")


async def patch_deployment(request: web.Request) -> web.Response:
    current, store = _admin(request)
    old = _made_here(current, request.match_info["deployment"])
    patch = _object(await read_body(request))
    if "id" in patch and patch["id"] != old.id:
        raise _bad("id", f"a deployment's id does not change (`{old.id}`): make a new one and delete this one")
    data = {k: v for k, v in {**msgspec.to_builtins(old), **patch}.items() if v is not None}
    d = parse(data)
    _taken(current, d, old.id)
    return await _put(request, current, store, d, old.id)


async def delete_deployment(request: web.Request) -> web.Response:
    current, store = _admin(request)
    d = _made_here(current, request.match_info["deployment"])
    api = {k: v for k, v in current.api.items() if k != d.id}
    _fits(current, api)
    await read_store(store.delete_deployment(d.id))
    api = {k: v for k, v in current.api.items() if k != d.id}
    state = current.state
    try:
        swap(request.app, state.settings, current.file_config, api)
    except Exception as exc:  # still served: the store keeps it too
        try:
            await store.put_deployment(_stored(d, 0))
        except Exception:
            log.exception("deployment %s: served, but gone from the store", d.id)
        if isinstance(exc, ConfigError):
            raise InvalidRequest(str(exc), code="invalid_parameter") from None
        raise
    log.info("deployment %s (%s) deleted through the admin API", d.name, d.id)
    return web.Response(body=_encode(DeploymentDeleted(id=d.id)), content_type="application/json")
