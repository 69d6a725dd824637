"""The gateway's YAML: deployments, API keys, and the upstream policy (nginx/Envoy knobs).

Top-level sections: `deployments` (each with `upstreams`, `launch` or `kubernetes`, and an optional
`tls`, `migration`, `kv_events` and `flow_control`), `keys`, `upstream`, `admin_key_env`, `max_resident`, `ledger`, `ledger_writer`, `budgets`;
every other key is one of the server's flags, as in `streamproxy serve --config`. The fields are
documented in docs/gateway.md (configs/gateway.yaml is a commented example). Sans-IO: `load(text)`
only parses and checks.
"""

from __future__ import annotations

import os
import re
from typing import Any, Literal
from urllib.parse import urlsplit

import msgspec
import yaml

from streamproxy.ledger.store import LedgerURLError
from streamproxy.ledger.store import kind as ledger_kind


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


_SECTIONS = ("deployments", "keys", "upstream", "admin_key_env", "max_resident", "ledger", "ledger_writer", "budgets")


def split(text: str) -> tuple[GatewayConfig, dict[str, Any]]:
    """The gateway's own sections, and the rest (server flags) as a mapping."""
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"not valid YAML: {_yaml_problem(exc, text)}") from None
    if not isinstance(data, dict):
        raise ConfigError("the gateway config must be a mapping with a `deployments` list")
    own = {k: data.pop(k) for k in _SECTIONS if k in data}
    try:
        config = msgspec.convert(own, GatewayConfig)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"gateway config: {exc}") from None
    check(config)
    return config, data


def _yaml_problem(exc: yaml.YAMLError, text: str) -> str:
    """Where and what, on one line: `line 2, column 5: expected ',' or ']', but got ':' (while parsing ...)`."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark, problem = exc.problem_mark, exc.problem or "unreadable"
        where = f"line {mark.line + 1}, column {mark.column + 1}"
        if exc.context and exc.context_mark is not None:
            problem += f" ({exc.context} at line {exc.context_mark.line + 1}, column {exc.context_mark.column + 1})"
        elif exc.context:
            problem += f" ({exc.context})"
    elif isinstance(exc, yaml.reader.ReaderError):  # a character YAML does not allow, at a character position
        line, line_start = text.count("\n", 0, exc.position) + 1, text.rfind("\n", 0, exc.position) + 1
        where = f"line {line}, column {exc.position - line_start + 1}"
        problem = f"unacceptable character #x{exc.character:04x}: {exc.reason}"
    else:  # pragma: no cover - every error PyYAML raises is one of the above
        return " ".join(str(exc).split())
    return f"{where}: {' '.join(problem.split())}"


def check(config: GatewayConfig) -> None:
    if not config.deployments:
        raise ConfigError("gateway config: `deployments` is empty")
    seen: set[str] = set()
    for d in config.deployments:
        for name in dict.fromkeys((d.name, d.id)):  # an id may equal its own name: one deployment, one name (in order)
            if name in seen:
                raise ConfigError(f"gateway config: {name!r} names two deployments")
            seen.add(name)
        d.upstream_headers()
        if d.kubernetes is not None:
            if d.upstreams or d.launch is not None:
                raise ConfigError(f"deployment {d.name!r}: give exactly one of `upstreams`, `launch` and `kubernetes`")
            check_kubernetes(d.name, d.kubernetes)
        elif (d.launch is None) == (not d.upstreams):
            raise ConfigError(f"deployment {d.name!r}: give exactly one of `upstreams` (a non-empty list) and `launch`")
        if d.launch is not None:
            launch = d.launch
            if launch.replicas < 1:
                raise ConfigError(f"deployment {d.name!r}: `launch.replicas` must be at least 1")
            if launch.idle_seconds < 0 or launch.boot_guess <= 0 or launch.max_failures < 1:
                raise ConfigError(f"deployment {d.name!r}: `idle_park_after` >= 0, `boot_guess` > 0, `max_failures` >= 1")
            if config.max_resident and launch.replicas > config.max_resident:
                raise ConfigError(f"deployment {d.name!r}: {launch.replicas} replicas exceed `max_resident`")
        for url in d.upstreams:
            if not url.startswith(("http://", "https://")):
                raise ConfigError(f"deployment {d.name!r}: upstream {url!r} is not an http(s) URL")
        if d.tls is not None:
            if not d.upstreams:
                raise ConfigError(f"deployment {d.name!r}: `tls` is for `upstreams` given as https:// URLs "
                                  "(managed and Kubernetes replicas are reached over plain HTTP)")
            if not any(url.startswith("https://") for url in d.upstreams):
                raise ConfigError(f"deployment {d.name!r}: `tls` is given but no upstream is an https:// URL")
            check_tls(f"deployment {d.name!r}: `tls", d.tls)
        check_scheduling(d)
        m = d.migration
        if m.max_migrations < 0 or m.max_tracked_tokens < 1 or m.stream_idle_timeout < 0:
            raise ConfigError(f"deployment {d.name!r}: `migration`: max_migrations >= 0, max_tracked_tokens >= 1, "
                              "stream_idle_timeout >= 0")
    check_tls("gateway config: `upstream.tls", config.upstream.tls)
    if config.admin_key_env and not os.environ.get(config.admin_key_env):
        raise ConfigError(f"gateway config: the environment variable {config.admin_key_env} (admin_key_env) is not set")
    if config.max_resident < 0:
        raise ConfigError("gateway config: `max_resident` must be >= 0")
    if config.ledger is not None:
        try:
            ledger_kind(config.ledger)
        except LedgerURLError as exc:
            raise ConfigError(f"gateway config: `ledger`: {exc}") from None
    w = config.ledger_writer
    if not (w.interval > 0 and w.batch_size >= 1 and w.max_buffered >= w.batch_size):
        raise ConfigError("gateway config: `ledger_writer`: interval > 0, batch_size >= 1, max_buffered >= batch_size")
    for name in ("default_max_tokens", "prompt_bytes_per_token"):
        if getattr(config.budgets, name) < 1:
            raise ConfigError(f"gateway config: `budgets`: `{name}` must be a positive number")
    names = {d.name for d in config.deployments} | {d.id for d in config.deployments}
    ids: set[str] = set()
    for key in config.keys:
        key.secret()
        if key.id in ids:
            raise ConfigError(f"gateway config: two keys have the id {key.id!r}")
        ids.add(key.id)
        unknown = [n for n in key.deployments if n != "*" and n not in names]
        if unknown:
            raise ConfigError(f"key {key.id!r}: no deployment named {', '.join(unknown)}")


_ZMQ_SCHEMES = ("tcp://", "ipc://")


def check_scheduling(d: Deployment) -> None:
    """`kv_events` and `flow_control`: each mistake named by its field."""
    where = f"deployment {d.name!r}: "
    kv = d.kv_events
    if kv is not None:
        given = [kv.endpoint, kv.replay_endpoint] + [e for r in kv.replicas.values() for e in (r.endpoint, r.replay_endpoint)]
        for endpoint in given:
            if endpoint is not None and not endpoint.startswith(_ZMQ_SCHEMES):
                raise ConfigError(f"{where}`kv_events` endpoint {endpoint!r} is not a ZMQ endpoint (tcp://host:port or ipc://path)")
        if kv.replay_endpoint is not None and kv.endpoint is None:
            raise ConfigError(f"{where}`kv_events.replay_endpoint` needs `kv_events.endpoint`")
        unknown = [url for url in kv.replicas if url.rstrip("/") not in {u.rstrip("/") for u in d.upstreams}]
        if unknown:
            raise ConfigError(f"{where}`kv_events.replicas` names {', '.join(unknown)}, not among its `upstreams`")
        if kv.buffer_steps < 1:
            raise ConfigError(f"{where}`kv_events.buffer_steps` must be at least 1")
    fc = d.flow_control
    if fc.max_concurrency < 0 or fc.queue_depth_threshold < 1 or fc.max_queued < 0 or fc.max_wait <= 0:
        raise ConfigError(f"{where}`flow_control`: max_concurrency >= 0, queue_depth_threshold >= 1, max_queued >= 0, max_wait > 0")


def check_tls(where: str, tls: UpstreamTLS) -> None:
    """Fields that would be ignored are refused (the files themselves are read by tls.py at start)."""
    if (tls.cert_file is None) != (tls.key_file is None):
        raise ConfigError(f"{where}`: give both `cert_file` and `key_file` (the client certificate and its key), or neither")
    if not tls.verify and (tls.ca_file or tls.server_name):
        raise ConfigError(f"{where}`: `ca_file` and `server_name` mean nothing with `verify: false`")


# Kubernetes' own rules for names, label keys and values, and port names (apimachinery's validation).
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_PORT_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def _label_key(key: str) -> bool:
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.fullmatch(prefix)):
        return False
    return len(name) <= 63 and bool(_LABEL_NAME.fullmatch(name))


def check_kubernetes(name: str, k: Kubernetes) -> None:
    """A `kubernetes:` section: each mistake named by its field."""
    where = f"deployment {name!r}: `kubernetes."
    if len(k.namespace) > 63 or not _DNS_LABEL.fullmatch(k.namespace):
        raise ConfigError(f"{where}namespace` {k.namespace!r} is not a namespace name (lowercase letters, digits, '-')")
    if not k.selector:
        raise ConfigError(f"{where}selector` is empty: give the labels of the deployment's pods, e.g. {{app: qwen3-8b}}")
    for key, value in k.selector.items():
        if not _label_key(key):
            raise ConfigError(f"{where}selector` key {key!r} is not a label name")
        if value and (len(value) > 63 or not _LABEL_NAME.fullmatch(value)):
            raise ConfigError(f"{where}selector` value {value!r} (of {key!r}) is not a label value")
    if isinstance(k.port, int):
        if not 1 <= k.port <= 65535:
            raise ConfigError(f"{where}port` {k.port} is not a port number (1-65535)")
    elif len(k.port) > 15 or not _PORT_NAME.fullmatch(k.port) or not any(c.isalpha() for c in k.port):
        raise ConfigError(f"{where}port` {k.port!r} is neither a port number nor a container port name")
    for field in ("idle_park_after", "boot_timeout"):
        if seconds(getattr(k, field)) < 0:
            raise ConfigError(f"{where}{field}` must be >= 0")
    for field in ("boot_guess", "watch_timeout", "request_timeout", "backoff_initial", "backoff_max"):
        if getattr(k, field) <= 0:
            raise ConfigError(f"{where}{field}` must be > 0")
    if k.scale is None:
        if k.idle_seconds:
            raise ConfigError(f"{where}idle_park_after` needs `kubernetes.scale` (the workload the gateway parks)")
        return
    if k.scale.replicas < 1:
        raise ConfigError(f"{where}scale.replicas` must be at least 1")
    if len(k.scale.name) > 253 or not _DNS_SUBDOMAIN.fullmatch(k.scale.name):
        raise ConfigError(f"{where}scale.name` {k.scale.name!r} is not a {k.scale.kind}'s name")
    if k.boot_seconds <= 0:
        raise ConfigError(f"{where}boot_timeout` must be > 0 with `scale`")
