"""GET /openapi.json of the gateway: serve's document builder over the gateway's route table.

A relayed route is serve's `Operation` for the replica's path, once per gateway path
(`relayed_paths`), plus the errors the gateway answers itself (`RELAY_ERRORS`); replicas' own errors
pass through. The gateway's own routes answer JSON built in `app.py`; the Structs here only describe it
(tests/gateway/test_openapi.py checks real answers against them). Deployments are not named
(`{deployment}` is any string). Built once, on the first request.
"""

from __future__ import annotations

from dataclasses import replace
from functools import cache
from typing import Any, Literal

import msgspec
from aiohttp import web
from msgspec import UNSET, UnsetType

from streamproxy.gateway.config import Deployment, FlowControl, Kubernetes, KVEvents, Launch
from streamproxy.gateway.deployadmin import DeploymentDeleted
from streamproxy.gateway.routes import DEPLOYMENT_PREFIXES, MODELS_PATHS, ROUTES, relayed_paths
from streamproxy.http.openapi import METRICS, OPERATIONS, ErrorStatus, Operation, QueryParam, build_document
from streamproxy.ledger.keys import KeyCreate, KeyCreated, KeyDeleted, KeyList
from streamproxy.ledger.params import MAX_LIMIT
from streamproxy.ledger.records import RequestPage, UsageReport
from streamproxy.protocol.common import ModelCard, ModelList, VersionInfo

# -- what the gateway's own routes answer -------------------------------------------------


class KVEventsState(msgspec.Struct):
    """A replica's KV-cache event stream, as the gateway follows it (scheduler.py)."""

    endpoint: str
    replay_endpoint: str | None
    state: Literal["connected", "disconnected", "replaying"]
    blocks: int  # of its prefix cache, indexed
    block_size: int  # 0: not known yet (no event heard)
    last_seq: int | None  # the last batch applied
    batches: int
    gaps: int
    replays: int
    resets: int
    lost: int
    decode_errors: int
    last_error: str | None


class FlowState(msgspec.Struct):
    """A deployment's flow control: what is in flight, what waits, by band (vLLM's priority) and tenant (key)."""

    max_concurrency: int
    limit: float
    in_flight: int
    waiting: int
    queued: dict[str, dict[str, int]]


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
    kv_events: KVEventsState | UnsetType = UNSET  # a replica that publishes KV-cache events


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
    source: Literal["config", "api"] = "config"  # the config file, or POST /v1/deployments
    flow_control: FlowState | UnsetType = UNSET  # with `flow_control.max_concurrency`


class DeploymentList(msgspec.Struct):
    data: list[DeploymentInfo]
    object: Literal["list"] = "list"


class GatewayHealth(msgspec.Struct):
    """GET /health: "ok" (200); "degraded" with the deployments that cannot serve, or "draining" (503)."""

    status: Literal["ok", "degraded", "draining"]
    unavailable: list[str] | UnsetType = UNSET


class DeploymentPatch(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """PATCH /v1/deployments/{deployment}: the fields to change (null: back to the default); `id` never changes."""

    name: str | UnsetType = UNSET
    upstreams: list[str] | None | UnsetType = UNSET
    launch: Launch | None | UnsetType = UNSET
    kubernetes: Kubernetes | None | UnsetType = UNSET
    served_model: str | None | UnsetType = UNSET
    upstream_key_env: str | None | UnsetType = UNSET
    kv_events: KVEvents | None | UnsetType = UNSET
    flow_control: FlowControl | None | UnsetType = UNSET


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
    ErrorStatus(429, "`rate_limit_exceeded`: over the key's rpm or tpm; `insufficient_quota`: a key made through "
                     "POST /v1/keys whose token budget has no room for the request's worst case (its prompt's "
                     "estimate + max_tokens) beside its spend and its requests running: until the day or month turns "
                     "(x-should-retry: false), or until those requests end (Retry-After: 1, x-should-retry: true); "
                     "or the replicas' own 429", retry_after=True),
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


_DEPLOYMENT_400 = ErrorStatus(400, "`invalid_parameter` (the field named, e.g. `upstreams[0]`), `invalid_json`")
_DEPLOYMENT_409 = ErrorStatus(409, "`deployment_exists`: the name or id is another deployment's (the config file's too)")
_ADMIN = ErrorStatus(401, "`invalid_api_key`: the admin routes need the gateway's admin key (closed when it has none)")
_NOT_MANAGED = ErrorStatus(400, "the deployment is not managed (it has `upstreams`, not `launch`)")
_DRAINING_503 = ErrorStatus(503, _DRAINING, retry_after=True)
# The ledger's query routes (books.py, ledger/params.py).
_BAD_PARAMETER = ErrorStatus(400, "`invalid_parameter` (the `param` named), or `invalid_cursor`")
_LEDGER_404 = ErrorStatus(404, "`ledger_off`: the gateway runs without a ledger (`ledger: off`)")
_LEDGER_503 = ErrorStatus(503, "`ledger_unavailable`: the ledger's store cannot be read now", retry_after=True)
_TIME = {"type": "string", "description": "unix seconds, or an ISO 8601 date or time (UTC unless it has a zone)"}
_START = QueryParam("start", "From this time on (inclusive)", _TIME)
_END = QueryParam("end", "Before this time (exclusive); default: now", _TIME)
_KEY = QueryParam("key_id", "Only this API key's requests (its id)", {"type": "string"})
LEDGER_REQUESTS_QUERY = (
    _START, _END, _KEY,
    QueryParam("status", "Only this status (429) or class (2xx, 4xx, 5xx)", {"type": "string", "pattern": "^([1-5][0-9][0-9]|[1-5]xx)$"}),
    QueryParam("limit", f"Records per page, 1 to {MAX_LIMIT} (default 100)", {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT}),
    QueryParam("cursor", "The `next_cursor` of the page before", {"type": "string"}),
)
USAGE_QUERY = (
    QueryParam("start", "From this time on (inclusive); default: 30 days ago", _TIME),
    _END,
    QueryParam("group_by", "Comma-separated: deployment, key, and day or month (UTC); default deployment,key,day",
               {"type": "string"}),
    QueryParam("deployment", "Only this deployment (its name or id)", {"type": "string"}),
    _KEY,
)
GATEWAY_OPERATIONS: tuple[Operation, ...] = (
    *_relayed(),
    _gateway("get", MODELS_PATHS[0], "List the deployments this key may use, as models", ModelList, UNAUTHORIZED, tag="OpenAI"),
    *(_gateway("get", path, "The deployment, as a list of one model", ModelList, UNAUTHORIZED, NOT_FOUND, _DRAINING_503, tag="OpenAI")
      for path in MODELS_PATHS[1:]),
    _gateway("get", "/v1/models/{model_id}", "Retrieve a deployment, as a model", ModelCard, UNAUTHORIZED, NOT_FOUND, tag="OpenAI"),
    _gateway("get", "/v1/deployments", "The deployments this key may use: replicas' health, breaker, load; managed state",
             DeploymentList, UNAUTHORIZED),
    _gateway("get", DEPLOYMENT_PREFIXES[0], "One deployment", DeploymentInfo, UNAUTHORIZED, NOT_FOUND, _DRAINING_503),
    _gateway("post", "/v1/deployments", "Admin: add a deployment (a config entry as JSON; kept in the ledger's store, served at once)",
             DeploymentInfo, _DEPLOYMENT_400, _ADMIN, _LEDGER_404, _DEPLOYMENT_409, _LEDGER_503, request=Deployment),
    _gateway("patch", DEPLOYMENT_PREFIXES[0], "Admin: change a deployment made through the API (the fields given; null: the default)",
             DeploymentInfo, _DEPLOYMENT_400, _ADMIN, ErrorStatus(404, "`model_not_found`; or `ledger_off`"), _DEPLOYMENT_409,
             _LEDGER_503, request=DeploymentPatch),
    _gateway("delete", DEPLOYMENT_PREFIXES[0], "Admin: delete a deployment made through the API (its requests in flight finish)",
             DeploymentDeleted, ErrorStatus(400, "a deployment of the config file (edit the file), or one a key of the file names"),
             _ADMIN, ErrorStatus(404, "`model_not_found`; or `ledger_off`"), _LEDGER_503),
    _gateway("post", DEPLOYMENT_PREFIXES[0] + "/wake", "Admin: start a managed deployment's replicas (answers at once)",
             DeploymentInfo, _NOT_MANAGED, _ADMIN, NOT_FOUND),
    _gateway("post", DEPLOYMENT_PREFIXES[0] + "/park", "Admin: drain and stop a managed deployment's replicas (answers once stopped)",
             DeploymentInfo, _NOT_MANAGED, _ADMIN, NOT_FOUND),
    _gateway("get", DEPLOYMENT_PREFIXES[0] + "/requests",
             "Admin: the deployment's requests from the ledger, newest first, a page at a time",
             RequestPage, _BAD_PARAMETER, _ADMIN, _LEDGER_404, _LEDGER_503, query=LEDGER_REQUESTS_QUERY),
    _gateway("get", "/v1/usage", "Admin: requests and tokens from the ledger, summed by deployment, key, day or month",
             UsageReport, _BAD_PARAMETER, _ADMIN, _LEDGER_404, _LEDGER_503, query=USAGE_QUERY),
    _gateway("post", "/v1/keys", "Admin: make an API key (its secret is in this answer only; the store keeps a hash)",
             KeyCreated, ErrorStatus(400, "`invalid_parameter` (the field named), `invalid_json`"), _ADMIN, _LEDGER_404,
             ErrorStatus(409, "`key_exists`: the id is taken (also by a revoked key, or the config file)"), _LEDGER_503,
             request=KeyCreate),
    _gateway("get", "/v1/keys", "Admin: the API keys (the config file's and the API's; never a secret)", KeyList, _ADMIN, _LEDGER_404,
             _LEDGER_503),
    _gateway("delete", "/v1/keys/{key_id}", "Admin: revoke a key made through the API, at once (other gateways: within a second)",
             KeyDeleted, ErrorStatus(400, "a key of the config file (edit the file)"), _ADMIN,
             ErrorStatus(404, "`key_not_found`; or `ledger_off`"), _LEDGER_503),
    _gateway("get", "/health", "200 while every deployment can take requests (a parked one wakes on demand); 503 otherwise",
             GatewayHealth, also=(503,)),
    _gateway("get", "/version", "The gateway's version", VersionInfo),
    _gateway("get", "/metrics", "Prometheus metrics (the edge's and streamproxy_gateway_*)", None, media=METRICS),
    _gateway("get", "/openapi.json", "This document", None, media="application/json"),
)
PARAMETERS = {"deployment": "A deployment's id or name", "model_id": "A deployment's name or id", "key_id": "An API key's id"}


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
