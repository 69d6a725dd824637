"""GET /openapi.json of the gateway: serve's document builder over the gateway's route table.

A relayed route is serve's `Operation` for the path the replica is asked
(`routes.ROUTES`), once per path the gateway has for it (`relayed_paths`):
the same request and response Structs, stream and error shape (Anthropic's
on the Messages routes), plus the errors the gateway itself answers
(`RELAY_ERRORS`: 401 keys, 413 the body cap, 429 a key's limits, 503 no
replica / a managed deployment waking, both with Retry-After). A replica's
own error answers pass through unchanged: 4XX and 5XX, as serve documents
them. The gateway's own routes (the deployments and their admin, /health)
answer JSON built in `app.py`; the Structs below only describe it (nothing
encodes them), and tests/gateway/test_openapi.py checks real answers
against them.

The document does not name the deployments (a client without a key would
learn them here): `{deployment}` is any string, and an unknown one a 404.
Built once, on the first request, like serve's.
"""

from __future__ import annotations

from dataclasses import replace
from functools import cache
from typing import Any, Literal

import msgspec
from aiohttp import web
from msgspec import UNSET, UnsetType

from streamproxy.gateway.routes import DEPLOYMENT_PREFIXES, MODELS_PATHS, ROUTES, relayed_paths
from streamproxy.http.openapi import METRICS, OPERATIONS, ErrorStatus, Operation, build_document
from streamproxy.protocol.common import ModelCard, ModelList, VersionInfo

# -- what the gateway's own routes answer -------------------------------------------------


class DeploymentReplica(msgspec.Struct):
    """One replica of a deployment; a managed replica still booting has only url, port, pid, booting."""

    url: str
    available: bool | UnsetType = UNSET  # routable now: healthy and not ejected
    healthy: bool | UnsetType = UNSET  # the last active probes' verdict
    breaker: Literal["closed", "open", "half_open"] | UnsetType = UNSET
    ejections: int | UnsetType = UNSET
    in_flight: int | UnsetType = UNSET
    requests: int | UnsetType = UNSET
    port: int | UnsetType = UNSET  # managed replicas
    pid: int | UnsetType = UNSET
    booting: bool | UnsetType = UNSET
    pod: str | UnsetType = UNSET  # `kubernetes:` replicas: the pod's name


class DeploymentInfo(msgspec.Struct):
    """GET /v1/deployments/{deployment}; the managed-only fields are there for `launch:` deployments
    and `kubernetes:` ones with `scale`."""

    id: str
    name: str
    served_model: str
    replicas: list[DeploymentReplica]
    managed: bool
    state: Literal["ready", "unavailable", "parked", "waking", "draining", "failed"]
    last_boot_seconds: float | None | UnsetType = UNSET
    requests_in_flight: int | UnsetType = UNSET
    boots: int | UnsetType = UNSET
    parks: int | UnsetType = UNSET
    restarts: int | UnsetType = UNSET
    problem: str | None | UnsetType = UNSET  # `kubernetes:`: what keeps the API from telling its pods, or a pod from serving


class DeploymentList(msgspec.Struct):
    data: list[DeploymentInfo]
    object: Literal["list"] = "list"


class GatewayHealth(msgspec.Struct):
    """GET /health: "ok" (200); "degraded" with the deployments that cannot serve, or "draining" (503)."""

    status: Literal["ok", "degraded", "draining"]
    unavailable: list[str] | UnsetType = UNSET


# -- the operations -----------------------------------------------------------------------

_DRAINING = "`server_shutting_down`: the gateway is draining"
UNAUTHORIZED = ErrorStatus(401, "`invalid_api_key`: no key, a wrong one, or a key that may not use this deployment "
                                "(only when the gateway has keys)")
NOT_FOUND = ErrorStatus(404, "`model_not_found`: no deployment of that name or id (or not one this key may use)")
RELAY_ERRORS = (
    ErrorStatus(400, "`invalid_json`, or `model` missing (with several deployments) or not a string; "
                     "or the replica's own 400, passed through"),
    UNAUTHORIZED,
    NOT_FOUND,
    ErrorStatus(413, "`request_too_large`: the body is over --max-body-bytes (said by Content-Length: before it is read)"),
    ErrorStatus(429, "`rate_limit_exceeded`: over the key's rpm or tpm; or the replicas' own 429", retry_after=True),
    ErrorStatus(503, "`upstream_unavailable`: no replica can take the request now; `deployment_waking`: a managed "
                     "deployment is starting (Retry-After: its last boot's seconds); `deployment_failed` "
                     "(x-should-retry: false); `max_resident`; " + _DRAINING, retry_after=True),
)
_SERVE = {op.path: op for op in OPERATIONS}
_BY_PATH = " (relayed to the deployment `{deployment}`, by id or name)"


def _relayed() -> list[Operation]:
    out = []
    for name, route in ROUTES.items():
        served = _SERVE[route.upstream_path]
        for path in relayed_paths(name):
            where = _BY_PATH if "{deployment}" in path else " (relayed to the deployment named by `model`)"
            out.append(replace(served, path=path, summary=served.summary + where, statuses=RELAY_ERRORS))
    return out


def _gateway(method: str, path: str, summary: str, response: type | None, *statuses: ErrorStatus, tag: str = "Gateway",
             **rest: Any) -> Operation:
    return Operation(method, path, summary, response=response, tag=tag, statuses=statuses, **rest)


_ADMIN = ErrorStatus(401, "`invalid_api_key`: the admin routes need the gateway's admin key (closed when it has none)")
_NOT_MANAGED = ErrorStatus(400, "the deployment is not managed (it has `upstreams`, not `launch`)")
_DRAINING_503 = ErrorStatus(503, _DRAINING, retry_after=True)
GATEWAY_OPERATIONS: tuple[Operation, ...] = (
    *_relayed(),
    _gateway("get", MODELS_PATHS[0], "List the deployments this key may use, as models", ModelList, UNAUTHORIZED, tag="OpenAI"),
    *(_gateway("get", path, "The deployment, as a list of one model", ModelList, UNAUTHORIZED, NOT_FOUND, _DRAINING_503, tag="OpenAI")
      for path in MODELS_PATHS[1:]),
    _gateway("get", "/v1/models/{model_id}", "Retrieve a deployment, as a model", ModelCard, UNAUTHORIZED, NOT_FOUND, tag="OpenAI"),
    _gateway("get", "/v1/deployments", "The deployments this key may use: replicas' health, breaker, load; managed state",
             DeploymentList, UNAUTHORIZED),
    _gateway("get", DEPLOYMENT_PREFIXES[0], "One deployment", DeploymentInfo, UNAUTHORIZED, NOT_FOUND, _DRAINING_503),
    _gateway("post", DEPLOYMENT_PREFIXES[0] + "/wake", "Admin: start a managed deployment's replicas (answers at once)",
             DeploymentInfo, _NOT_MANAGED, _ADMIN, NOT_FOUND),
    _gateway("post", DEPLOYMENT_PREFIXES[0] + "/park", "Admin: drain and stop a managed deployment's replicas (answers once stopped)",
             DeploymentInfo, _NOT_MANAGED, _ADMIN, NOT_FOUND),
    _gateway("get", "/health", "200 while every deployment can take requests (a parked one wakes on demand); 503 otherwise",
             GatewayHealth, also=(503,)),
    _gateway("get", "/version", "The gateway's version", VersionInfo),
    _gateway("get", "/metrics", "Prometheus metrics (the edge's and streamproxy_gateway_*)", None, media=METRICS),
    _gateway("get", "/openapi.json", "This document", None, media="application/json"),
)
PARAMETERS = {"deployment": "A deployment's id or name", "model_id": "A deployment's name or id"}


def build() -> dict[str, Any]:
    """The gateway's OpenAPI document as a dict (a fresh one on every call; `document()` caches the bytes)."""
    return build_document(
        GATEWAY_OPERATIONS,
        title="streamproxy gateway",
        description="Relays OpenAI-compatible (and Anthropic Messages) requests to a deployment's replicas, named by "
                    "`model` or by the path. Request bodies are serve's; unknown fields pass through to the replica.",
        key_note="Only when the gateway's config has `keys` or it runs with --api-key; the admin routes take the admin key",
        parameters=PARAMETERS,
    )


@cache
def document() -> bytes:
    return msgspec.json.encode(build())


async def openapi_json(request: web.Request) -> web.Response:
    return web.Response(body=document(), content_type="application/json")
