"""`streamproxy_gateway_*`: per deployment and upstream, created once at import.

Requests by status, in flight, retries, ejections, breaker state, the
replica's time to first byte, the gateway's own added latency, and tokens
metered. Observed per request or per event (a retry, an ejection), never
per relayed event. A replica's and a deployment's labelled children are looked
up once (`ReplicaSeries`, `DeploymentSeries`), not per request: `labels()`
costs a lock and a dict lookup each time.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

_LATENCY = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

REQUESTS = Counter(
    "streamproxy_gateway_requests", "Requests relayed, by deployment, upstream and the status the client got",
    ["deployment", "upstream", "status"],
)
IN_FLIGHT = Gauge("streamproxy_gateway_in_flight", "Requests a replica is serving for the gateway now", ["deployment", "upstream"])
RETRIES = Counter("streamproxy_gateway_retries", "Attempts on another replica before the first byte", ["deployment", "reason"])
EJECTIONS = Counter("streamproxy_gateway_ejections", "Replicas taken out of rotation by outlier detection", ["deployment", "upstream"])
BREAKER = Gauge("streamproxy_gateway_breaker_state", "0 closed, 1 open (ejected), 2 half-open", ["deployment", "upstream"])
PROBE_HEALTHY = Gauge("streamproxy_gateway_upstream_healthy", "1 when the active health probe says the replica is up", ["deployment", "upstream"])
UPSTREAM_TTFB = Histogram(
    "streamproxy_gateway_upstream_ttfb_seconds", "From sending a request upstream to its response headers",
    ["deployment"], buckets=_LATENCY,
)
UPSTREAM_TTFT = Histogram(
    "streamproxy_gateway_upstream_ttft_seconds", "From sending a stream upstream to its first event", ["deployment"], buckets=_LATENCY
)
ADDED_LATENCY = Histogram(
    "streamproxy_gateway_added_latency_seconds",
    "The gateway's own time before the first byte: from the request's arrival to sending it upstream",
    buckets=_LATENCY,
)
TOKENS = Counter("streamproxy_gateway_tokens", "Tokens metered, by deployment and kind (prompt, cached, completion)", ["deployment", "kind"])

# Managed deployments (`launch:`): the gateway's own replicas.
MANAGED_STATE = Gauge(
    "streamproxy_gateway_deployment_state", "A managed deployment's state: 0 parked, 1 waking, 2 ready, 3 draining, 4 failed",
    ["deployment"],
)
BOOTS = Counter("streamproxy_gateway_boots", "Wakes of a managed deployment that reached ready", ["deployment"])
BOOT_SECONDS = Histogram(
    "streamproxy_gateway_boot_seconds", "From waking a managed deployment to its first healthy replica", ["deployment"],
    buckets=(0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200),
)
PARKS = Counter("streamproxy_gateway_parks", "Managed deployments parked (idle, admin, or room for another)", ["deployment"])
RESTARTS = Counter("streamproxy_gateway_restarts", "Replicas of managed deployments restarted after exiting on their own", ["deployment"])

# Demand for a deployment that has no ready replica (parked, waking, or scaled to zero by someone
# else): what an external autoscaler (KEDA's prometheus scaler, an HPA on external metrics) wakes it on.
WAITING = Gauge(
    "streamproxy_gateway_waiting_requests", "Requests held now for a deployment with no ready replica (wait_for_wake)",
    ["deployment"],
)
COLD_REQUESTS = Counter(
    "streamproxy_gateway_cold_requests",
    "Requests that found their deployment with no ready replica (parked or waking): held or answered 503",
    ["deployment"],
)

# Keys' token budgets: the worst cases of this process's requests running (holds.py, keyring.py).
BUDGET_HELD = Gauge("streamproxy_gateway_budget_held_tokens",
                    "Tokens held now against keys' budgets by the requests this process is running (their worst cases)")


class ReplicaSeries:
    """One replica's children of the per-upstream series."""

    __slots__ = ("in_flight", "breaker", "_deployment", "_url", "_requests")

    def __init__(self, deployment: str, url: str) -> None:
        self._deployment, self._url = deployment, url
        self.in_flight = IN_FLIGHT.labels(deployment, url)
        self.breaker = BREAKER.labels(deployment, url)
        self._requests: dict[str, Counter] = {}

    def requests(self, status: str) -> Counter:
        child = self._requests.get(status)
        if child is None:
            child = self._requests[status] = REQUESTS.labels(self._deployment, self._url, status)
        return child


class DeploymentSeries:
    """One deployment's children of the per-deployment series."""

    __slots__ = ("ttfb", "ttft", "prompt_tokens", "cached_tokens", "completion_tokens", "_name", "_retries")

    def __init__(self, name: str) -> None:
        self._name = name
        self.ttfb = UPSTREAM_TTFB.labels(name)
        self.ttft = UPSTREAM_TTFT.labels(name)
        self.prompt_tokens = TOKENS.labels(name, "prompt")
        self.cached_tokens = TOKENS.labels(name, "cached")
        self.completion_tokens = TOKENS.labels(name, "completion")
        self._retries: dict[str, Counter] = {}

    def retries(self, reason: str) -> Counter:
        child = self._retries.get(reason)
        if child is None:
            child = self._retries[reason] = RETRIES.labels(self._name, reason)
        return child

# Issue 35: routing by the replicas' KV-cache events (scheduler.py; its collector adds the subscribers'
# state, blocks indexed and the flow-control queues at scrape time).
KV_DECISIONS = Counter("streamproxy_gateway_kv_routing_decisions",
                       "Replica choices, by what decided: kv_events (the replica's published cache) or affinity (today's index)",
                       ["deployment", "by"])
KV_PREDICTED = Counter("streamproxy_gateway_kv_predicted_cached_tokens",
                       "Prompt tokens the chosen replicas were predicted to hold cached when chosen", ["deployment"])
KV_OBSERVED = Counter("streamproxy_gateway_kv_observed_cached_tokens",
                      "Cached prompt tokens the replicas reported for the requests KV events routed (against the prediction)",
                      ["deployment"])
KV_TOKENIZE = Histogram("streamproxy_gateway_kv_tokenize_seconds", "A replica's /tokenize of a prompt, for KV-event routing",
                        ["deployment"], buckets=_LATENCY)

# Reloads of the config (SIGHUP): `applied`, or `refused` (the file did not load or validate; the old one serves).
RELOADS = Counter("streamproxy_gateway_config_reloads", "Config reloads (SIGHUP), by outcome: applied or refused", ["outcome"])

# Stream migration (resume.py): what became of each break of a stream after its first byte.
MIGRATIONS = Counter(
    "streamproxy_gateway_migrations",
    "Streams a replica broke off after the first byte, by what the gateway did: continued (on another replica), "
    "resent (nothing had gone to the client), finished (the finish had gone out), refused (not continuable), "
    "exhausted (its request had made max_migrations), failed (no replica took the continuation)",
    ["deployment", "outcome"],
)
