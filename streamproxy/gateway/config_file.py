"""Reading the gateway's YAML (`split`) and checking it (`check`): what the structs' types cannot say.

`split(text)` parses the YAML, takes the gateway's own sections (config.py's structs, converted by
msgspec) from the rest (the server's flags) and runs `check`, which refuses, with the field named,
two deployments of one name, a deployment with both or neither of `upstreams` and `launch`, non-HTTP
upstreams, TLS or KV-event settings that would be ignored, Kubernetes names outside apimachinery's
rules, keys naming unknown deployments. `check` runs again on every reload and admin change. Sans-IO.
"""

from __future__ import annotations

import os
import re
from typing import Any

import msgspec
import yaml

from streamproxy.gateway.config import ConfigError, Deployment, GatewayConfig, Kubernetes, UpstreamTLS, seconds
from streamproxy.ledger.store import LedgerURLError
from streamproxy.ledger.store import kind as ledger_kind

SECTIONS: tuple[str, ...] = GatewayConfig.__struct_fields__  # the gateway's own top-level keys; the rest are flags


def split(text: str) -> tuple[GatewayConfig, dict[str, Any]]:
    """The gateway's own sections, and the rest (server flags) as a mapping."""
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"not valid YAML: {_yaml_problem(exc, text)}") from None
    if not isinstance(data, dict):
        raise ConfigError("the gateway config must be a mapping with a `deployments` list")
    own = {k: data.pop(k) for k in SECTIONS if k in data}
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
