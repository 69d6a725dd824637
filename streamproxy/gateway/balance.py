"""Choosing a replica: least outstanding requests, prompt-prefix affinity, health.

`Pool.choose(keys, exclude, now)`: among replicas whose `Health` lets a request through and not yet
tried (and below flow control's per-replica bound while one is), with prefix affinity and loads balanced (SGLang's abs/rel thresholds), the one holding the
longest share of the prefix keys (at least `cache_threshold`, load within `balance_abs_threshold`), or
for an unknown prefix its `rendezvous` home (the same in every gateway process); else power of two
choices on outstanding requests (or `policy: round_robin`). `dispatched`/`completed` keep counts, health
and prefix index right; `observed_cache` corrects the index. Sans-IO; the random source is injectable.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from streamproxy.gateway.config import Deployment, KVEventsEndpoint, UpstreamPolicy
from streamproxy.gateway.health import Health
from streamproxy.gateway.metrics import DeploymentSeries, ReplicaSeries
from streamproxy.gateway.prefix import PrefixIndex, stable_hash

_MASK = (1 << 64) - 1


def rendezvous_score(key: int, anchor: int) -> int:
    """A replica's score for a prefix: splitmix64's finalizer of the two, the same in every process."""
    z = (key ^ anchor) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


@dataclass(eq=False)
class Replica:
    url: str
    deployment: str
    health: Health
    index: PrefixIndex
    outstanding: int = 0
    requests: int = 0
    token_ids: bool | None = None  # it sends token ids when asked (stream migration); None: not seen yet
    series: ReplicaSeries = field(init=False, repr=False)
    anchor: int = field(init=False, repr=False)  # its URL's stable hash, for rendezvous scores

    def __post_init__(self) -> None:
        self.series = ReplicaSeries(self.deployment, self.url)
        self.anchor = stable_hash(self.url.encode())


class Pool:
    def __init__(self, deployment: Deployment, policy: UpstreamPolicy, rng: random.Random | None = None) -> None:
        self.deployment = deployment
        self.policy = policy
        self.upstream_headers = deployment.upstream_headers()  # the replicas' key, read once
        self.series = DeploymentSeries(deployment.name)
        self.replicas: list[Replica] = []
        self.kv_endpoints: dict[str, KVEventsEndpoint] = {}  # the replicas that publish KV-cache events
        self.listeners: list[Callable[[], None]] = []  # told when the replicas change (kv_routing)
        self.set_replicas(deployment.upstreams)
        self._rng = rng or random.Random()
        self._turn = 0  # round robin's next replica
        self.active = 0  # requests on this deployment now (from the choice of deployment to the end)

    def set_replicas(self, urls: list[str], events: Mapping[str, KVEventsEndpoint | None] | None = None) -> None:
        """The replicas are now these (a managed deployment's come and go): the ones kept keep
        their health, load and index; requests on a removed one finish on it. `events`: where each
        publishes KV-cache events (None: as the deployment's `kv_events` says)."""
        kept = {r.url: r for r in self.replicas}
        policy = self.policy
        self.replicas = [
            kept.get(url) or Replica(url, self.deployment.name, Health(policy), PrefixIndex(policy.prefix_index_blocks))
            for url in (u.rstrip("/") for u in urls)
        ]
        config = self.deployment.kv_events
        found = {r.url: events.get(r.url) if events is not None else config.for_replica(r.url) if config is not None else None
                 for r in self.replicas}
        self.kv_endpoints = {url: kv for url, kv in found.items() if kv is not None}
        self.token_ids = any(r.token_ids is not False for r in self.replicas)  # a stream here may be tracked
        for listener in self.listeners:
            listener()

    def without_token_ids(self, replica: Replica) -> None:
        """`replica` answered a stream without the token ids it was asked for (a `streamproxy serve`
        replica): when none of the replicas sends them, streams here are not tracked for migration."""
        replica.token_ids = False
        self.token_ids = any(r.token_ids is not False for r in self.replicas)

    def choose(self, keys: list[int], exclude: set[str], now: float, max_outstanding: int = 0) -> tuple[Replica | None, int]:
        """The replica for this attempt and how many of `keys` it holds (None: no replica can take it).
        `max_outstanding` (flow control's per-replica bound, 0: none): while some replica is below it,
        only those compete (a request sent to a full replica would wait in its queue, first come first
        served, beside one with room)."""
        candidates = [r for r in self.replicas if r.url not in exclude and r.health.available(now)]
        if not candidates:
            return None, 0
        if max_outstanding > 0:
            candidates = [r for r in candidates if r.outstanding < max_outstanding] or candidates
        if len(candidates) == 1:
            only = candidates[0]
            return only, only.index.matched(keys) if keys else 0
        policy = self.policy
        if policy.policy == "round_robin":
            chosen = candidates[self._turn % len(candidates)]
            self._turn += 1
            return chosen, 0
        loads = [r.outstanding for r in candidates]
        low, high = min(loads), max(loads)
        imbalanced = high - low > policy.balance_abs_threshold and high > policy.balance_rel_threshold * low
        if policy.affinity and keys and not imbalanced:
            best, matched = max(((r, r.index.matched(keys)) for r in candidates), key=lambda rm: (rm[1], -rm[0].outstanding))
            if matched / len(keys) >= policy.cache_threshold and best.outstanding <= low + policy.balance_abs_threshold:
                return best, matched
            if policy.rendezvous:
                first = keys[0]
                home = max(candidates, key=lambda r: rendezvous_score(first, r.anchor))
                if home.outstanding <= low + policy.balance_abs_threshold:
                    return home, home.index.matched(keys)
        a, b = self._rng.sample(candidates, 2)
        chosen = a if a.outstanding <= b.outstanding else b
        return chosen, chosen.index.matched(keys) if keys else 0

    def dispatched(self, replica: Replica, keys: list[int]) -> None:
        replica.outstanding += 1
        replica.requests += 1
        replica.health.dispatched()
        if keys and self.policy.affinity:
            replica.index.insert(keys)

    def completed(self, replica: Replica) -> None:
        replica.outstanding -= 1

    def observed_cache(self, replica: Replica, keys: list[int], matched: int, prompt_tokens: int, cached_tokens: int) -> None:
        """The replica reported `cached_tokens` of `prompt_tokens`: if the index promised much
        more than that, the replica evicted the rest of this prefix."""
        if not keys or prompt_tokens <= 0 or not self.policy.affinity:
            return
        held = int(len(keys) * cached_tokens / prompt_tokens)
        if held + 1 < matched:
            replica.index.forget_after(keys, held)

    def retry_after(self, now: float) -> int:
        """Seconds until some replica may take a request (for a 503's Retry-After), at least 1."""
        waits = [r.health.retry_after(now) for r in self.replicas]
        return max(1, int(min(waits) + 0.999)) if waits else 1
