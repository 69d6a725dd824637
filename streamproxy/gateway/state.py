"""What the gateway's handlers share: deployments and their pools, keys, the upstream client.

`resolve(model, deployment_id)` finds the deployment a request names (404
`model_not_found` otherwise); `identify(request)` finds the request's key
first (401), and `authorize(key, deployment)` checks it against the
deployments it may use (401), its per-minute limits (429 + Retry-After) and, for
a key made through the admin API, its token budget (429 `insufficient_quota`).
Keys come from the config, `--api-key`, and the `keyring` (keys.py's routes);
the gateway asks for a key once there is one of any kind. The key's id, never the key, goes to the record.
`retries` is Envoy's retry budget: retries in flight stay under a share of
the requests in flight, or under `min_retry_concurrency`.
"""

from __future__ import annotations

import hmac
import os
import time

import aiohttp
from aiohttp import web

from streamproxy.config import Settings
from streamproxy.errors import AuthenticationError, InvalidRequest, ModelNotFound, QuotaExceeded, RateLimited, ServerShuttingDown
from streamproxy.gateway.balance import Pool
from streamproxy.gateway.config import ApiKey, Deployment, GatewayConfig
from streamproxy.gateway.keyring import Keyring
from streamproxy.gateway.limits import KeyLimiter
from streamproxy.gateway.managed import Supervisor
from streamproxy.gateway.source import FixedSource, ReplicaSource
from streamproxy.gateway.upstream_tls import ClientTLS, contexts
from streamproxy.gateway.wire import Upstreams
from streamproxy.http.accesslog import RECORD
from streamproxy.http.auth import presented_key
from streamproxy.http.drain import InFlight
from streamproxy.ledger.writer import Ledger


class RetryBudget:
    __slots__ = ("percent", "floor", "active", "retrying")

    def __init__(self, percent: float, floor: int) -> None:
        self.percent = percent
        self.floor = floor
        self.active = 0  # requests in flight
        self.retrying = 0  # of those, the ones on a retry now

    def allows(self) -> bool:
        return self.retrying < max(self.floor, self.active * self.percent / 100.0)


class GatewayState:
    def __init__(self, settings: Settings, config: GatewayConfig) -> None:
        self.settings = settings
        self.config = config
        self.policy = config.upstream
        self.inflight = InFlight()
        self.started = int(time.time())
        self.pools: dict[str, Pool] = {}
        self.supervisor = Supervisor(settings, config.max_resident)
        self.sources: dict[str, ReplicaSource] = {}  # by name and by id
        for d in config.deployments:
            pool = Pool(d, config.upstream)
            self.pools[d.name] = self.pools[d.id] = pool
            self.sources[d.name] = self.sources[d.id] = self._source(d, pool)
        admin = os.environ.get(config.admin_key_env, "") if config.admin_key_env else (settings.admin_key or "")
        self.admin_key = admin.encode()
        self.keys: list[tuple[bytes, ApiKey, KeyLimiter]] = [
            (k.secret().encode(), k, KeyLimiter(k.rpm, k.tpm)) for k in config.keys
        ]
        # `--api-key` keys of the edge open every deployment.
        for i, secret in enumerate(settings.api_key):
            self.keys.append((secret.encode(), ApiKey(id=f"api-key-{i + 1}", key=secret), KeyLimiter(0, 0)))
        self.retries = RetryBudget(config.upstream.retry_budget_percent, config.upstream.min_retry_concurrency)
        self.session: aiohttp.ClientSession | None = None  # probes and managed replicas' health
        self.upstreams: Upstreams | None = None  # relayed requests (wire.py)
        # How to reach each deployment's https:// replicas, by name and id (CA files read now: ConfigError).
        self.tls: dict[str, ClientTLS] = contexts(config)
        self.ledger: Ledger | None = None  # the request ledger (books.py), unless `ledger: off`
        self.keyring: Keyring | None = None  # keys made through POST /v1/keys (in the ledger's store)

    def _source(self, d: Deployment, pool: Pool) -> ReplicaSource:
        if d.launch is not None:
            return self.supervisor.add(d, pool)
        if d.kubernetes is not None:
            from streamproxy.gateway.kubernetes import KubernetesSource  # its client library is imported only then

            return KubernetesSource(d, d.kubernetes, pool)
        return FixedSource(pool)

    def start_sources(self, session: aiohttp.ClientSession) -> None:
        self.supervisor.start(session)
        for d in self.deployments:
            self.sources[d.name].start(session)

    async def stop_sources(self) -> None:
        """Every source's replicas (managed: SIGTERM, drain, SIGKILL after the drain timeout; others: their watches)."""
        await self.supervisor.shutdown()
        for d in self.deployments:
            await self.sources[d.name].stop()

    @property
    def deployments(self) -> list[Deployment]:
        return self.config.deployments

    def resolve(self, model: object, deployment_id: str | None) -> Pool:
        if self.inflight.draining:
            raise ServerShuttingDown("the gateway is shutting down; retry on another instance")
        if deployment_id is not None:
            pool = self.pools.get(deployment_id)
            if pool is None:
                raise ModelNotFound(f"no deployment `{deployment_id}`", param="model")
            return pool
        if model is None:
            if len(self.deployments) == 1:
                return self.pools[self.deployments[0].name]
            raise InvalidRequest("'model' is required: name one of the deployments (GET /v1/models)", param="model")
        if not isinstance(model, str):
            raise InvalidRequest("'model' must be a string", param="model")
        pool = self.pools.get(model)
        if pool is None:
            raise ModelNotFound(f"The model `{model}` does not exist.", param="model")
        return pool

    def identify(self, request: web.Request) -> tuple[ApiKey, KeyLimiter] | None:
        """The request's key (None when no key is configured), before anything is looked up
        for it, so that a client without a valid key learns nothing of the deployments; 401."""
        keyring = self.keyring
        if not self.keys and not keyring:
            return None
        presented = presented_key(request)
        candidate = (presented or "").encode()
        found: tuple[ApiKey, KeyLimiter] | None = None
        for secret, key, limiter in self.keys:  # every key compared: timing says nothing
            if hmac.compare_digest(candidate, secret) and found is None:
                found = (key, limiter)
        if found is None and keyring and presented is not None:
            entry = keyring.find(presented)  # by the secret's hash: a dict lookup
            if entry is not None:
                found = (entry.key, entry.limiter)
        if found is None:
            if presented is None:
                raise AuthenticationError("missing API key: send 'Authorization: Bearer <key>'")
            raise AuthenticationError("incorrect API key provided")
        request[RECORD].key_id = found[0].id
        return found

    def authorize(self, found: tuple[ApiKey, KeyLimiter] | None, deployment: Deployment) -> KeyLimiter | None:
        """`identify`'s key may use `deployment` now: its limiter, or 401 / 429."""
        if found is None:
            return None
        key, limiter = found
        if not key.allows(deployment):
            raise AuthenticationError(f"this API key may not use the deployment `{deployment.name}`")
        wait = limiter.admit(time.monotonic())
        if wait is not None:
            raise RateLimited(
                f"API key `{key.id}` is over its per-minute limit; retry after {wait:.0f} s",
                code="rate_limit_exceeded",
                retry_after=max(1, int(wait + 0.999)),
            )
        if self.keyring:
            entry = self.keyring.by_id(key.id)
            if entry is not None:
                over = self.keyring.over_budget(entry, time.time())
                if over is not None:
                    raise QuotaExceeded(over[0], retry_after=over[1])
        return limiter


    def authorize_admin(self, request: web.Request) -> None:
        """The admin routes: the admin key (`admin_key_env`, `--admin-key`), or 401; none configured: always 401."""
        presented = (presented_key(request) or "").encode()
        if not self.admin_key or not hmac.compare_digest(presented, self.admin_key):
            raise AuthenticationError("the admin routes need the gateway's admin key")


STATE_KEY: web.AppKey[GatewayState] = web.AppKey("gateway_state", GatewayState)


def gateway_state(request: web.Request) -> GatewayState:
    return request.app[STATE_KEY]
