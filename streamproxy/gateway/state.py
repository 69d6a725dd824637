"""What the gateway's handlers share: deployments and their pools, keys, the upstream client.

`resolve` finds the deployment a request names (404 `model_not_found`); `identify` its key (401);
`authorize` checks the key's deployments (401) and per-minute limits (429 + Retry-After); `reserve`
holds a budgeted key's worst case (keyring.py, holds.py). Keys come from the config, `--api-key` and
the `keyring`; only the key's id reaches the context. `retries` is Envoy's retry budget.
A reload builds a new `GatewayState` from `previous`: what outlives a config is taken over, and a
deployment whose section and `upstream:` policy are equal keeps its pool and source. `Current.state` is
set once per reload; a request reads it once and keeps its state and pool until it ends, so a removed
deployment stops only after its last request.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import time
from typing import Any

from aiohttp import web

from streamproxy.apis.spec import ApiSpec
from streamproxy.config import Settings
from streamproxy.errors import AuthenticationError, InvalidRequest, ModelNotFound, RateLimited, ServerShuttingDown
from streamproxy.gateway.balance import Pool
from streamproxy.gateway.config import ApiKey, Deployment, GatewayConfig
from streamproxy.gateway.holds import Hold, worst_case
from streamproxy.gateway.keyring import Keyring
from streamproxy.gateway.limits import KeyLimiter
from streamproxy.gateway.managed import ManagedDeployment, Supervisor
from streamproxy.gateway.scheduler import Scheduler
from streamproxy.gateway.source import FixedSource, ReplicaSource
from streamproxy.gateway.upstream_tls import ClientTLS, contexts
from streamproxy.gateway.wire import Upstreams
from streamproxy.http.auth import presented_key
from streamproxy.http.context import CONTEXT
from streamproxy.http.drain import InFlight
from streamproxy.ledger.writer import Ledger

log = logging.getLogger("streamproxy.gateway")


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
    def __init__(self, settings: Settings, config: GatewayConfig, previous: GatewayState | None = None) -> None:
        self.settings = settings
        self.config = config
        self.policy = config.upstream
        self.pools: dict[str, Pool] = {}
        self.sources: dict[str, ReplicaSource] = {}  # by name and by id
        self.schedulers: dict[str, Scheduler] = {}  # by name and by id: KV-event routing and flow control
        # Built for this state and not started yet (`take_over` starts them after a reload).
        self.fresh: list[ReplicaSource] = []
        self.fresh_managed: list[ManagedDeployment] = []
        self.from_api: set[str] = set()  # the ids of the deployments made through the admin API
        if previous is None:
            self.inflight = InFlight()
            self.started = int(time.time())
            self.supervisor = Supervisor(settings, config.max_resident)
            self.retries = RetryBudget(config.upstream.retry_budget_percent, config.upstream.min_retry_concurrency)
            self.upstreams: Upstreams | None = None  # the gateway's one client (wire.py): relays, probes, boot checks, pods' /metrics
            self.ledger: Ledger | None = None  # the request ledger (books.py), unless `ledger: off`
            self.keyring: Keyring | None = None  # keys made through POST /v1/keys (in the ledger's store)
            # Deployments a reload removed, still serving requests that began before it (shared by every state).
            self.retiring: dict[Pool, ReplicaSource] = {}
            self.retired_schedulers: dict[Pool, Scheduler] = {}
            self.tasks: set[asyncio.Task[None]] = set()
        else:
            self.inflight, self.started, self.supervisor = previous.inflight, previous.started, previous.supervisor
            self.retries, self.upstreams = previous.retries, previous.upstreams
            self.ledger, self.keyring = previous.ledger, previous.keyring
            self.retiring, self.tasks = previous.retiring, previous.tasks
            self.retired_schedulers = previous.retired_schedulers
        for d in config.deployments:
            kept = previous.unchanged(d, config) if previous is not None else None
            if kept is not None and previous is not None:
                pool, source = kept
                scheduler = previous.schedulers[d.name]
            else:
                pool = Pool(d, config.upstream)
                scheduler = Scheduler(pool)  # (before the source: it follows the pool's replicas from the first)
                source = self._source(d, pool, registered=previous is None)
            self.pools[d.name] = self.pools[d.id] = pool
            self.sources[d.name] = self.sources[d.id] = source
            self.schedulers[d.name] = self.schedulers[d.id] = scheduler
        admin = os.environ.get(config.admin_key_env, "") if config.admin_key_env else (settings.admin_key or "")
        self.admin_key = admin.encode()
        self.keys: list[tuple[bytes, ApiKey, KeyLimiter]] = [
            (k.secret().encode(), k, KeyLimiter(k.rpm, k.tpm)) for k in config.keys
        ]
        # `--api-key` keys of the edge open every deployment.
        for i, secret in enumerate(settings.api_key):
            self.keys.append((secret.encode(), ApiKey(id=f"api-key-{i + 1}", key=secret), KeyLimiter(0, 0)))
        # How to reach each deployment's https:// replicas, by name and id (CA files read now: ConfigError).
        self.tls: dict[str, ClientTLS] = contexts(config)
        if previous is not None:
            self._keep_limits(previous)

    def unchanged(self, d: Deployment, config: GatewayConfig) -> tuple[Pool, ReplicaSource] | None:
        """This state's pool and source for `d` when a reload to `config` leaves it as it is: the same
        `deployments:` entry under the same `upstream:` policy (the pool, health and index are built from both)."""
        pool = self.pools.get(d.name)
        if pool is None or pool.deployment != d or self.policy != config.upstream:
            return None
        return pool, self.sources[d.name]

    def _keep_limits(self, previous: GatewayState) -> None:
        """A key whose id and limits are unchanged keeps its limiter (its minute's counts)."""
        old = {key.id: (key, limiter) for _, key, limiter in previous.keys}
        for i, (secret, key, _) in enumerate(self.keys):
            was = old.get(key.id)
            if was is not None and (was[0].rpm, was[0].tpm) == (key.rpm, key.tpm):
                self.keys[i] = (secret, key, was[1])

    def _source(self, d: Deployment, pool: Pool, *, registered: bool = True) -> ReplicaSource:
        if d.launch is not None:
            if registered:
                return self.supervisor.add(d, pool)
            managed = ManagedDeployment(d, pool, self.supervisor)
            self.fresh_managed.append(managed)
            return managed
        if d.kubernetes is not None:
            from streamproxy.gateway.kubernetes import KubernetesSource  # its client library is imported only then

            source: ReplicaSource = KubernetesSource(d, d.kubernetes, pool)
        else:
            source = FixedSource(pool)
        if not registered:
            self.fresh.append(source)
        return source

    def take_over(self, previous: GatewayState) -> list[str]:
        """Right after this state replaced `previous` (`reload.py`): start what is new, retire what is
        gone (stopped once its requests end). Returns the retired deployments' names."""
        config = self.config
        self.supervisor.max_resident = config.max_resident  # (its settings: the drain timeout, a restart's)
        self.retries.percent = config.upstream.retry_budget_percent
        self.retries.floor = config.upstream.min_retry_concurrency
        kept = {id(p) for p in self.pools.values()}
        gone: dict[int, tuple[Pool, ReplicaSource]] = {}
        for name, pool in previous.pools.items():
            if id(pool) not in kept:
                gone[id(pool)] = (pool, previous.sources[name])
                self.retired_schedulers[pool] = previous.schedulers[name]
        for scheduler in self.schedulers.values():
            scheduler.start()
        for _, source in gone.values():
            self.supervisor.forget(source)
        for managed in self.fresh_managed:
            self.supervisor.attach(managed)
        if self.upstreams is not None:
            for source in self.fresh:
                source.start(self.upstreams)
        self.fresh, self.fresh_managed = [], []
        for pool, source in gone.values():
            if pool.active:
                self.retiring[pool] = source
            else:
                self._stop_retired(pool, source)
        return [pool.deployment.name for pool, _ in gone.values()]

    def request_ended(self, pool: Pool) -> None:
        """A request on `pool` ended (`Pool.active` already counts it out)."""
        if not pool.active and self.retiring:
            source = self.retiring.pop(pool, None)
            if source is not None:
                self._stop_retired(pool, source)

    def _stop_retired(self, pool: Pool, source: ReplicaSource) -> None:
        scheduler = self.retired_schedulers.pop(pool, None)

        async def stop() -> None:
            try:
                if scheduler is not None:
                    await scheduler.stop()
                await source.stop()
                log.info("deployment %s (%s): stopped, as the reload removed or changed it", pool.deployment.name, pool.deployment.id)
            except Exception:
                log.exception("deployment %s: stopping its old source failed", pool.deployment.name)

        task = asyncio.get_running_loop().create_task(stop(), name=f"gateway-retire-{pool.deployment.name}")
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def stop_retired(self) -> None:
        """At shutdown: the retired deployments' sources still serving, and the stops under way."""
        for pool, source in list(self.retiring.items()):
            del self.retiring[pool]
            self._stop_retired(pool, source)
        if self.tasks:
            await asyncio.gather(*list(self.tasks), return_exceptions=True)

    def start_sources(self, upstreams: Upstreams) -> None:
        for d in self.deployments:
            self.schedulers[d.name].start()
        self.supervisor.start(upstreams)
        for d in self.deployments:
            self.sources[d.name].start(upstreams)

    async def stop_sources(self) -> None:
        """Every source's replicas (managed: SIGTERM, drain, SIGKILL after the drain timeout; others: their watches),
        also those of deployments a reload removed."""
        await self.supervisor.shutdown()
        for d in self.deployments:
            await self.sources[d.name].stop()
            await self.schedulers[d.name].stop()
        await self.stop_retired()

    def describe(self, name: str) -> dict[str, object]:
        """`/v1/deployments`' view of one deployment: its replicas' health and load, its source's fields."""
        pool = self.pools[name]
        scheduler = self.schedulers[name]
        now = time.monotonic()
        replicas: list[dict[str, object]] = []
        for r in pool.replicas:
            replica: dict[str, object] = {
                "url": r.url,
                "available": r.health.routable(now),
                "healthy": r.health.probed_healthy,
                "breaker": r.health.breaker.name.lower(),
                "ejections": r.health.ejections,
                "in_flight": r.outstanding,
                "requests": r.requests,
            }
            kv = scheduler.describe_replica(r.url)
            if kv is not None:
                replica["kv_events"] = kv
            replicas.append(replica)
        d = pool.deployment
        described: dict[str, object] = {"id": d.id, "name": d.name, "served_model": d.upstream_model, "replicas": replicas}
        described.update(self.sources[name].describe(replicas))
        described.update(scheduler.describe())
        described["source"] = "api" if d.id in self.from_api else "config"
        return described

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
        request[CONTEXT].key(found[0].id)
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
        return limiter

    def reserve(self, found: tuple[ApiKey, KeyLimiter] | None, api: ApiSpec, generates: bool, data: dict[str, Any],
                body_bytes: int) -> Hold | None:
        """A key with a token budget (made through POST /v1/keys): hold the request's worst case
        (holds.worst_case) until it ends, or 429 insufficient_quota; None for any other key."""
        keyring = self.keyring
        if found is None or not keyring:
            return None
        entry = keyring.by_id(found[0].id)
        if entry is None or entry.stored.budget_tokens is None:
            return None
        worst = worst_case(api, generates, data, body_bytes, self.config.budgets)
        return keyring.reserve(entry, worst, time.time())

    def authorize_admin(self, request: web.Request) -> None:
        """The admin routes: the admin key (`admin_key_env`, `--admin-key`), or 401; none configured: always 401."""
        presented = (presented_key(request) or "").encode()
        if not self.admin_key or not hmac.compare_digest(presented, self.admin_key):
            raise AuthenticationError("the admin routes need the gateway's admin key")


class Current:
    """The gateway's state now: the one reference a reload changes (`reload.py`); and what it is made
    of: the config file's sections, and the deployments made through the admin API (by id, in order)."""

    __slots__ = ("state", "file_config", "api")

    def __init__(self, state: GatewayState) -> None:
        self.state = state
        self.file_config = state.config
        self.api: dict[str, Deployment] = {}


STATE_KEY: web.AppKey[Current] = web.AppKey("gateway_state", Current)


def gateway_state(request: web.Request) -> GatewayState:
    """The state a request works with from start to end: read it once and keep it."""
    return request.app[STATE_KEY].state
