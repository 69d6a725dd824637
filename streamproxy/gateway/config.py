"""The gateway's YAML as typed structs: deployments, API keys, and the upstream policy (nginx/Envoy knobs).

Top-level sections: `deployments` (each with `upstreams`, `launch` or `kubernetes`, and an optional
`tls`, `migration`, `kv_events` and `flow_control`), `keys`, `upstream`, `admin_key_env`, `max_resident`, `ledger`, `ledger_writer`, `budgets`;
every other key is one of the server's flags, as in `streamproxy serve --config`. The fields are
documented in docs/gateway.md (configs/gateway.yaml is a commented example). Reading the file and
checking what msgspec's types cannot say (one deployment per name, URLs, Kubernetes names, ...) is
config_file.py's. Sans-IO.
"""

from __future__ import annotations

import os
from typing import Literal
from urllib.parse import urlsplit

import msgspec


class ConfigError(ValueError):
    pass


def seconds(value: float | str) -> float:
    """`90`, `90s`, `15m`, `2h` -> seconds."""
    if isinstance(value, (int, float)):
        return float(value)
    text = value.strip().lower()
    scale = {"s": 1, "m": 60, "h": 3600}.get(text[-1:], None)
    try:
        return float(text[:-1]) * scale if scale is not None else float(text)
    except ValueError:
        raise ConfigError(f"{value!r} is not a duration (a number of seconds, or with an s/m/h suffix)") from None


class Launch(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A managed deployment: the gateway starts `python -m streamproxy serve` replicas itself."""

    model: str  # a model folder or hub id, or "fake" (`--engine fake`)
    args: list[str] = []
    replicas: int = 1
    idle_park_after: float | str = 0  # 0: always on
    boot_guess: float = 60.0
    wait_for_wake: bool = False
    boot_timeout: float = 900.0  # a replica not healthy by then is a failed start
    max_failures: int = 3  # unexpected exits in a row before the deployment is `failed`
    restart_backoff: float = 1.0  # the first restart's delay, doubled per failure in a row

    @property
    def idle_seconds(self) -> float:
        return seconds(self.idle_park_after)


class Scale(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The workload whose `scale` subresource the gateway sets: `replicas` to wake, 0 to park."""

    kind: Literal["Deployment", "StatefulSet"] = "Deployment"
    name: str
    replicas: int = 1


class Kubernetes(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A deployment whose replicas are pods found through the Kubernetes API (`kubernetes.py`)."""

    namespace: str = "default"
    selector: dict[str, str]  # the pods' labels (a labelSelector of `key=value` terms)
    port: int | str = "http"  # the container port's name, or its number
    scale: Scale | None = None  # None: discover only (an HPA, KEDA or a person owns the replica count)
    kubeconfig: str | None = None  # a kubeconfig file; else $KUBECONFIG, else the in-cluster service account
    context: str | None = None  # the kubeconfig's context (its current one when None)
    idle_park_after: float | str = 0  # with `scale`: scaled to 0 after this long idle; 0: never
    boot_guess: float = 60.0  # Retry-After (s) while no pod is Ready, until a wake was timed
    boot_timeout: float | str = 900  # with `scale`: no pod Ready this long after the wake: `deployment_failed`
    wait_for_wake: bool = False  # true: requests wait for a Ready pod instead of a 503
    watch_timeout: float = 300.0  # a watch request's `timeoutSeconds` (it is renewed from the last resourceVersion)
    request_timeout: float = 10.0  # one list, get or patch
    backoff_initial: float = 0.5  # the first retry's delay while the API server cannot be reached
    backoff_max: float = 30.0  # the longest (jittered, doubled per failure in a row)

    # What the wake/park life cycle (`lifecycle.py`) needs of it, as it needs of `Launch`.
    max_failures: int = 1
    restart_backoff: float = 1.0

    @property
    def idle_seconds(self) -> float:
        return seconds(self.idle_park_after)

    @property
    def boot_seconds(self) -> float:
        return seconds(self.boot_timeout)

    def label_selector(self) -> str:
        return ",".join(f"{k}={v}" for k, v in sorted(self.selector.items()))


class UpstreamTLS(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    """How the gateway checks an https:// replica (tls.py builds the `ssl.SSLContext`, once per distinct value)."""

    ca_file: str | None = None  # PEM: the CAs a replica's certificate must chain to; None: the system's store
    verify: bool = True  # False: no certificate or name check at all
    server_name: str | None = None  # the name checked (and sent as SNI); None: the URL's host
    cert_file: str | None = None  # the gateway's client certificate (mutual TLS), with key_file
    key_file: str | None = None


class KVEventsEndpoint(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    """Where one replica publishes its KV-cache events: vLLM's `--kv-events-config` names."""

    endpoint: str  # its PUB socket (the gateway's SUB connects to it)
    replay_endpoint: str | None = None  # its replay ROUTER; None: gaps reset the replica's blocks
    topic: str = ""
    # The gateway binds `endpoint` and the replica's PUB connects to it (vLLM connects when its
    # endpoint has no `*`: llm-d's layout, and the gateway's own `launch:` replicas').
    bind: bool = False


class KVEvents(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    """A deployment's KV-cache events (`kv_events:`; vLLM's `--kv-events-config` field names). For
    `upstreams:` and `kubernetes:`, `endpoint` and `replay_endpoint` are patterns: `{host}` (or vLLM's
    `*`) is each replica's host, `{port}` its HTTP port; `replicas` names them per replica URL instead.
    `launch:` replicas of a vLLM model publish by default, on free loopback ports the gateway picks."""

    enable_kv_cache_events: bool = True  # false: no subscription (and no flag for `launch:` replicas)
    endpoint: str | None = None  # e.g. tcp://{host}:5557
    replay_endpoint: str | None = None  # e.g. tcp://{host}:5558
    topic: str = ""
    replicas: dict[str, KVEventsEndpoint] = {}  # by replica URL
    buffer_steps: int = 10_000  # `launch:`: the replay buffer (vLLM's default)

    def for_replica(self, url: str) -> KVEventsEndpoint | None:
        """The endpoints of the replica at `url` (None: it publishes none known here)."""
        if not self.enable_kv_cache_events:
            return None
        given = self.replicas.get(url.rstrip("/"))
        if given is not None:
            return given
        if self.endpoint is None:
            return None
        parts = urlsplit(url)
        host, port = parts.hostname or "", str(parts.port or (443 if parts.scheme == "https" else 80))
        if ":" in host:
            host = f"[{host}]"

        def fill(pattern: str) -> str:
            return pattern.replace("{host}", host).replace("{port}", port).replace("*", host)

        return KVEventsEndpoint(endpoint=fill(self.endpoint),
                                replay_endpoint=fill(self.replay_endpoint) if self.replay_endpoint else None, topic=self.topic)


class FlowControl(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    """A deployment's admission when its replicas are saturated (`flow_control:`; llm-d's flow control):
    requests queue per tenant (the API key) and priority band, fair within a band, strict across bands."""

    max_concurrency: int = 0  # requests in flight per replica before requests queue; 0: no queueing
    queue_depth_threshold: int = 5  # a replica reporting this many `vllm:num_requests_waiting` is saturated
    max_queued: int = 1024  # waiting requests, over every tenant and band; past it: 429 (lowest band first)
    max_wait: float = 30.0  # seconds a request may wait for a place; past it: 429
    priority: int = 0  # the band of a request whose key and body name none (vLLM's numbers: lower first)
    # The replicas schedule by priority (`--scheduling-policy priority`): a request's band goes on as
    # its body's `priority`; false: the gateway queues by it and sends nothing.
    scheduling_priority: bool = False
class Migration(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    """Stream migration (`resume.py`): a chat or completions stream a replica broke off goes on on another."""

    enabled: bool = True
    max_migrations: int = 2  # per request (as Envoy's `num_retries`, but after the first byte)
    max_tracked_tokens: int = 32768  # prompt + generated ids kept per stream; a longer one is not migrated
    # Envoy's `stream_idle_timeout`: seconds without a byte from the replica, once a continuable stream's
    # first event came, that count as a broken replica (then migrated); 0: only `upstream.read_timeout`.
    stream_idle_timeout: float = 30.0


class Deployment(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    name: str
    id: str
    upstreams: list[str] = []
    launch: Launch | None = None  # instead of `upstreams`: the gateway runs the replicas
    kubernetes: Kubernetes | None = None  # instead of either: pods found through the Kubernetes API
    served_model: str | None = None  # None: the same as `name`
    # The replicas' own API key (`vllm serve --api-key`), from this environment variable.
    upstream_key_env: str | None = None
    tls: UpstreamTLS | None = None  # for its https:// upstreams; None: `upstream.tls`
    kv_events: KVEvents | None = None  # where its replicas publish KV-cache events (None: `launch:` vLLM ones do)
    flow_control: FlowControl = msgspec.field(default_factory=FlowControl)
    migration: Migration = msgspec.field(default_factory=Migration)

    @property
    def upstream_model(self) -> str:
        return self.served_model or self.name

    def upstream_headers(self) -> dict[str, str]:
        if not self.upstream_key_env:
            return {}
        key = os.environ.get(self.upstream_key_env)
        if not key:
            raise ConfigError(f"deployment {self.name!r}: the environment variable {self.upstream_key_env} is not set")
        return {"Authorization": f"Bearer {key}"}


class ApiKey(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    id: str
    key: str | None = None
    key_env: str | None = None
    deployments: list[str] = msgspec.field(default_factory=lambda: ["*"])
    rpm: int = 0
    tpm: int = 0
    priority: int | None = None  # its requests' priority band when they name none (None: the deployment's)
    weight: float = 1.0  # its share against other keys in a band of a saturated deployment

    def secret(self) -> str:
        value = self.key if self.key is not None else os.environ.get(self.key_env or "", "")
        if not value:
            raise ConfigError(f"key {self.id!r}: give `key`, or `key_env` naming a set environment variable")
        return value

    def allows(self, deployment: Deployment) -> bool:
        return "*" in self.deployments or deployment.name in self.deployments or deployment.id in self.deployments


class UpstreamPolicy(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Names and defaults from Envoy's cluster settings and nginx's proxy module."""

    # Seconds to open a connection to a replica (Envoy `connect_timeout`: 5 s).
    connect_timeout: float = 5.0
    # Longest silence between two reads from a replica (nginx `proxy_read_timeout`); 0: the request timeout.
    read_timeout: float = 0.0
    # Envoy's retry policy: attempts on another replica before the first byte (connect failure, 503, 429).
    num_retries: int = 2
    retry_on_status: list[int] = msgspec.field(default_factory=lambda: [429, 503])
    # Envoy's retry budget: retries in flight at most this share of requests in flight, or this many.
    retry_budget_percent: float = 20.0
    min_retry_concurrency: int = 3
    # Envoy's outlier detection: consecutive failures eject a replica for base time x times ejected.
    consecutive_errors: int = 5
    base_ejection_time: float = 30.0
    max_ejection_time: float = 300.0
    # Active health checks of GET /health (Envoy `interval`, `timeout`, thresholds).
    health_check_interval: float = 5.0
    health_check_timeout: float = 2.0
    unhealthy_threshold: int = 2
    healthy_threshold: int = 1
    # Connections kept open to each replica (nginx `keepalive`).
    keepalive: int = 256
    # How a replica is chosen: `prefix` (least outstanding, with prefix affinity when `prefix_affinity`),
    # `least_outstanding` (power of two choices, no affinity), `round_robin` (in turn; for comparisons).
    policy: Literal["round_robin", "least_outstanding", "prefix"] = "prefix"
    # Prefix affinity (SGLang router's cache-aware policy): a request goes to the replica that holds
    # the longest share of its prefix when that share is at least `cache_threshold`, unless the
    # replicas' loads are imbalanced (both thresholds exceeded), when it goes to the least loaded.
    prefix_affinity: bool = True
    # A prefix no replica holds yet goes to its rendezvous-hash home (the same in every gateway and
    # after a restart), under the same load guard; false: to the less loaded of two random replicas.
    rendezvous: bool = True
    cache_threshold: float = 0.3
    balance_abs_threshold: int = 8
    balance_rel_threshold: float = 1.5
    prefix_block_bytes: int = 256
    prefix_index_blocks: int = 100_000
    # How https:// upstreams are verified, unless a deployment gives its own `tls`.
    tls: UpstreamTLS = msgspec.field(default_factory=UpstreamTLS)

    @property
    def affinity(self) -> bool:
        """Prefix affinity is on: the `prefix` policy with `prefix_affinity`."""
        return self.policy == "prefix" and self.prefix_affinity


class LedgerWriter(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The ledger writer's knobs (`ledger.writer.Ledger`)."""

    interval: float = 0.5
    batch_size: int = 1000
    max_buffered: int = 200_000


class Budgets(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """How a key's token budget holds each request's worst case while it runs (`gateway.holds`)."""

    default_max_tokens: int = 4096  # completion tokens held for a request that names no max_tokens
    prompt_bytes_per_token: int = 4  # the prompt's tokens held: the request body's bytes / this


class GatewayConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    deployments: list[Deployment]
    keys: list[ApiKey] = []
    upstream: UpstreamPolicy = msgspec.field(default_factory=UpstreamPolicy)
    admin_key_env: str | None = None  # the admin routes' key, from this environment variable
    max_resident: int = 0  # replicas of managed deployments running at once (0: no limit)
    ledger: str | None = None  # the request ledger's URL; None: the default (`ledger.store.default_url`); "off"
    ledger_writer: LedgerWriter = msgspec.field(default_factory=LedgerWriter)
    budgets: Budgets = msgspec.field(default_factory=Budgets)
