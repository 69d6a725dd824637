"""Where a deployment's replicas come from: one interface, one implementation per source.

`ReplicaSource` keeps the pool's URLs current (`Pool.set_replicas`); balancing, probes and ejection see
only those. `FixedSource` (here, `upstreams:`), `managed.ManagedDeployment` (`launch:`),
`kubernetes.KubernetesSource` (`kubernetes:`). Per request: `admit()` before anything is sent (the 503
the deployment gives now, and a wake), `until_ready` for held requests, `begin`/`end` around it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from streamproxy.errors import ServiceUnavailable
from streamproxy.gateway.balance import Pool
from streamproxy.gateway.lifecycle import Lifecycle, Phase
from streamproxy.gateway.wire import Upstreams


class ReplicaSource(Protocol):
    """What the gateway asks of a deployment's source. The members with a body are what a source that
    neither wakes nor parks does (a fixed list of URLs); a source that does more says so by
    overriding them. `FixedSource` subclasses this protocol to take those defaults; the others
    satisfy it by shape (mypy proves each)."""

    @property
    def name(self) -> str: ...

    @property
    def managed(self) -> bool:
        """The gateway wakes and parks it (the admin routes apply)."""
        return False

    @property
    def why_not_managed(self) -> str:
        """When not `managed`: why, for the admin routes' 400."""
        return "its replicas are not the gateway's to wake or park"

    @property
    def serving(self) -> bool:
        """A request may be sent now; False: `until_ready` first."""
        return True

    def admit(self) -> None:
        """Before a request is relayed: raises the 503 it gets now (and starts a wake)."""
        return None

    async def until_ready(self, timeout: float) -> None:
        """Hold a request until the deployment serves (at most `timeout` s; 0: no bound), or raise its 503."""
        return None

    def begin(self, now: float) -> None:
        return None

    def end(self, now: float) -> None:
        return None

    def wake(self, *, admin: bool = False) -> None:
        return None

    async def park(self, reason: str) -> None:
        return None

    def down(self, now: float) -> bool:
        """For /health: the deployment cannot take requests, and will not on demand either."""
        ...

    def describe(self, replicas: list[dict[str, object]]) -> dict[str, object]:
        """`/v1/deployments` fields beyond id, name and served_model (`replicas`: the pool's view)."""
        ...

    def start(self, upstreams: Upstreams) -> None:
        """Begin (discovery, tickers); `upstreams` is the gateway's one client (wire.py), for any look at a replica."""
        return None

    async def stop(self) -> None:
        return None


class FixedSource(ReplicaSource):
    """`upstreams:`: the URLs are the replicas; health probes and ejection decide which take requests."""

    why_not_managed = "it has `upstreams`, not `launch`"

    def __init__(self, pool: Pool) -> None:
        self.pool = pool

    @property
    def name(self) -> str:
        return self.pool.deployment.name

    def down(self, now: float) -> bool:
        return not any(r.health.routable(now) for r in self.pool.replicas)

    def describe(self, replicas: list[dict[str, object]]) -> dict[str, object]:
        return {"managed": False, "state": "ready" if any(r["available"] for r in replicas) else "unavailable"}


def wake_or_refuse(name: str, lifecycle: Lifecycle, failed: str, wake: Callable[[], object], hold: bool) -> None:
    """A request to a deployment with no replica to serve it, for a source that wakes: a failed one is
    503 `deployment_failed` (no retry: `failed` says why); otherwise the wake starts and the request is held
    (`hold`: wait_for_wake) or refused with 503 `deployment_waking` and the lifecycle's Retry-After."""
    if lifecycle.phase is Phase.FAILED:
        raise ServiceUnavailable(f"deployment `{name}` {failed}; an operator must wake it", code="deployment_failed",
                                 should_retry=False)
    wake()
    if hold:
        return
    wait = lifecycle.retry_after()
    raise ServiceUnavailable(f"deployment `{name}` is waking up; retry after {wait} s", code="deployment_waking", retry_after=wait)
