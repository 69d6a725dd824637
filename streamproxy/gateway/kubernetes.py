"""`kubernetes:` deployments: replicas are pods found through the Kubernetes API, woken and parked through it.

API calls are `kube_api.KubeApi`'s. Discovery (`_discover_forever`) lists the pods by `labelSelector` and
watches from the list's resourceVersion (with bookmarks), resuming where a watch ended; a 410 re-lists
and reconciles (`kube_pods.PodTable.reset`, replicas kept by URL). While the API cannot be reached or
refuses, the last pods stay in the pool and retries back off with jitter; one log line per fault start
and end. With `scale:` the deployment has the managed mode's life cycle (`lifecycle.Lifecycle`): a wake
patches a zero scale to `scale.replicas` (a count someone else set is left alone), `boot_timeout` fails
it, idle for `idle_park_after` patches it to 0. Idle means idle on the pods too: their /metrics request
counters (read with `wire.Upstreams.get`) count other gateways' traffic as use. Without `scale:` it only
discovers. Requests that find no Ready pod are counted (`streamproxy_gateway_cold_requests`,
`..._waiting_requests`): the signal for an external autoscaler. Details: docs/kubernetes.md.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Coroutine
from typing import Any

from streamproxy.errors import ServiceUnavailable
from streamproxy.gateway import metrics as M
from streamproxy.gateway.balance import Pool
from streamproxy.gateway.config import Deployment, Kubernetes
from streamproxy.gateway.exchange import UpstreamClosed
from streamproxy.gateway.kube_api import UNREACHABLE, ApiStatus, Gone, KubeApi, KubeConfigMissing, WatchCut, refused
from streamproxy.gateway.kube_pods import Backoff, PodActivity, PodTable, activity
from streamproxy.gateway.lifecycle import GAUGE, Lifecycle, Phase
from streamproxy.gateway.source import wake_or_refuse
from streamproxy.gateway.wire import Upstreams

log = logging.getLogger("streamproxy.gateway")

_METRICS_LIMIT = 8 << 20  # bytes of a pod's /metrics read (vLLM's histograms run to a few hundred KB)


class KubernetesSource:
    """A `source.ReplicaSource` over the pods a label selector finds."""

    def __init__(self, deployment: Deployment, k: Kubernetes, pool: Pool) -> None:
        self.deployment = deployment
        self.k = k
        self.pool = pool
        self.table = PodTable(k.port)
        self.lifecycle = Lifecycle(k, time.monotonic())
        self.retired: set[str] = set()  # pods that were serving when the gateway parked the deployment
        self.fault: str | None = None  # what keeps discovery from working now, for the log and the 503s
        self.wake_fault: str | None = None  # why the last wake failed
        self.resource_version: str | None = None
        self._listed: str | None = None  # the last list's resourceVersion
        self.api = KubeApi(k)
        self._tasks: set[asyncio.Task[None]] = set()
        self._upstreams: Upstreams | None = None  # the gateway's client (wire.py), for the pods' /metrics
        self._activity = PodActivity()
        self._changed = asyncio.Event()
        self._wake_after_park = False
        self._scaled_up = False  # the last wake patched the scale (a failed boot sets it back)
        self._problems: list[str] = []
        self._empty_logged = False

    # -- the ReplicaSource interface ----------------------------------------------------
    @property
    def name(self) -> str:
        return self.deployment.name

    @property
    def managed(self) -> bool:
        return self.k.scale is not None

    why_not_managed = "its `kubernetes` section has no `scale`: the gateway only discovers its pods"

    @property
    def serving(self) -> bool:
        if self.k.scale is None:
            return bool(self.pool.replicas)
        return self.lifecycle.serving

    def begin(self, now: float) -> None:
        self.lifecycle.begin(now)

    def end(self, now: float) -> None:
        self.lifecycle.end(now)

    def down(self, now: float) -> bool:
        if self.k.scale is not None:
            return self.lifecycle.phase is Phase.FAILED
        return not any(r.health.routable(now) for r in self.pool.replicas)

    def admit(self) -> None:
        if self.serving:
            return
        M.COLD_REQUESTS.labels(self.name).inc()
        if self.k.scale is None:
            if self.k.wait_for_wake:
                return
            raise self._unavailable()
        failed = f"failed to wake: {self.wake_fault or 'no pod became Ready'}"
        wake_or_refuse(self.name, self.lifecycle, failed, self.wake, self.k.wait_for_wake)

    def _unavailable(self) -> ServiceUnavailable:
        why = self.fault or f"no Ready pod matches {self.k.label_selector()} in namespace {self.k.namespace}"
        return ServiceUnavailable(
            f"deployment `{self.name}` has no replica: {why}", code="upstream_unavailable",
            retry_after=max(1, math.ceil(self.k.boot_guess)),
        )

    async def until_ready(self, timeout: float) -> None:
        waiting = M.WAITING.labels(self.name)
        waiting.inc()
        try:
            async with asyncio.timeout(timeout or None):
                while not self.serving:
                    if self.k.scale is not None:
                        if self.lifecycle.phase is Phase.FAILED:
                            self.admit()  # raises deployment_failed
                        if self.lifecycle.phase is Phase.PARKED:
                            self.wake()
                    await self._changed.wait()
        except TimeoutError:
            if self.k.scale is None:
                raise self._unavailable() from None
            raise ServiceUnavailable(
                f"deployment `{self.name}` did not wake within {timeout:g} s", code="deployment_waking",
                retry_after=self.lifecycle.retry_after(),
            ) from None
        finally:
            waiting.dec()

    def describe(self, replicas: list[dict[str, object]]) -> dict[str, object]:
        pods = {p.url: p.name for p in self.table.pods.values() if p.url is not None}
        for r in replicas:
            name = pods.get(str(r["url"]))
            if name is not None:
                r["pod"] = name
        described: dict[str, object] = {"managed": self.managed}
        if self.k.scale is None:
            described["state"] = "ready" if any(r["available"] for r in replicas) else "unavailable"
        else:
            lc = self.lifecycle
            described.update(
                state=lc.phase.value,
                last_boot_seconds=None if lc.last_boot is None else round(lc.last_boot, 3),
                requests_in_flight=lc.in_flight, boots=lc.boots, parks=lc.parks, restarts=lc.restarts,
            )
        failed = self.wake_fault if self.lifecycle.phase is Phase.FAILED else None
        described["problem"] = self.fault or failed or (self._problems[0] if self._problems else None)
        return described

    def start(self, upstreams: Upstreams) -> None:
        self._upstreams = upstreams
        self._sync()
        self._spawn(self._discover_forever())
        if self.k.scale is not None and self.k.idle_seconds > 0:
            self._spawn(self._tick_forever())

    async def stop(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.api.close()

    # -- faults -------------------------------------------------------------------------
    def _say(self, fault: str | None) -> None:
        """One log line when a fault starts or changes, one when it ends."""
        if fault == self.fault:
            return
        if fault is None:
            log.info("deployment %s: kubernetes: back to normal (it was: %s)", self.name, self.fault)
        else:
            log.warning("deployment %s: kubernetes: %s", self.name, fault)
        self.fault = fault
        self._sync()

    def _refused(self, verb: str, what: str, exc: ApiStatus) -> str:
        return refused(self.k, verb, what, exc)

    # -- discovery ----------------------------------------------------------------------
    async def _discover_forever(self) -> None:
        backoff = Backoff(self.k.backoff_initial, self.k.backoff_max)
        while True:
            try:
                await self.api.connect()
                if self.resource_version is None:
                    await self._list()
                    backoff.reset()
                if await self._watch():
                    backoff.reset()
                    continue  # a watch that ended after doing its job: resume at once
            except Gone:
                log.info("deployment %s: kubernetes: resourceVersion %s is gone (410); listing again", self.name, self.resource_version)
                fresh = self.resource_version == self._listed
                self.resource_version = None
                if not fresh:
                    continue  # a re-list at once; a list's own resourceVersion gone already: after the backoff
            except ApiStatus as exc:
                self._say(self._refused("watch" if self.resource_version else "list", "pods", exc))
            except UNREACHABLE as exc:
                self._say(f"the API server cannot be reached ({type(exc).__name__}: {exc}); retrying")
            except KubeConfigMissing as exc:
                self._say(str(exc))
            except Exception as exc:  # a kubeconfig that does not load, or anything else: logged, retried, never a crash
                self._say(f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(backoff.next())

    async def _list(self) -> None:
        items, self.resource_version = await self.api.list_pods()
        self._listed = self.resource_version
        self.table.reset(items)
        self._say(None)
        if not items and not self._empty_logged and self.k.scale is None:
            self._empty_logged = True
            log.warning(
                "deployment %s: kubernetes: no pod matches %s in namespace %s (is the namespace or the selector wrong?)",
                self.name, self.k.label_selector(), self.k.namespace,
            )
        self._sync()

    async def _watch(self) -> bool:
        """One watch request from `resource_version`; True when it ended having done something."""
        started = time.monotonic()
        events = 0
        try:
            async for event in self.api.watch_pods(self.resource_version):
                if event is None:  # accepted: the API server is back, if it was away
                    self._say(None)
                    continue
                self._event(event)
                events += 1
        except WatchCut as exc:
            # Cut mid-stream (a proxy's idle timeout, the API server restarting): resumed from the last resourceVersion.
            log.info("deployment %s: kubernetes: the pods' watch was cut (%s); resuming from resourceVersion %s",
                     self.name, exc, self.resource_version)
        return events > 0 or time.monotonic() - started >= 1.0

    def _event(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        obj = event.get("object") or {}
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        if kind in ("ADDED", "MODIFIED", "DELETED"):
            self.table.apply(kind, obj)
            self._empty_logged = False
            self._sync()
        if rv:
            self.resource_version = str(rv)  # BOOKMARK too

    # -- the pool and the life cycle ------------------------------------------------------
    def _sync(self) -> None:
        ready = self.table.replicas(exclude=self.retired)
        self.retired &= set(self.table.pods)
        lc = self.lifecycle
        if self.k.scale is not None:
            self._follow(len(ready))
            if lc.phase in (Phase.DRAINING, Phase.PARKED):
                ready = []
            M.MANAGED_STATE.labels(self.name).set(GAUGE[lc.phase])
        self.pool.set_replicas([url for _, url in ready])
        problems = self.table.problems()
        for problem in problems:
            if problem not in self._problems:
                log.warning("deployment %s: kubernetes: %s; it takes no request", self.name, problem)
        self._problems = problems
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def _follow(self, ready: int) -> None:
        lc = self.lifecycle
        now = time.monotonic()
        if ready and lc.phase is Phase.WAKING:
            lc.replica_up(now)
            if lc.last_boot is not None:
                M.BOOTS.labels(self.name).inc()
                M.BOOT_SECONDS.labels(self.name).observe(lc.last_boot)
                log.info("deployment %s: a pod is Ready %.1f s after the wake", self.name, lc.last_boot)
        elif ready and lc.phase in (Phase.PARKED, Phase.FAILED):
            log.info("deployment %s: %d Ready pod(s) the gateway did not wake: ready", self.name, ready)
            lc.adopted(now)
        elif not ready and lc.phase is Phase.READY:
            log.info("deployment %s: no Ready pod left: parked (a request wakes it)", self.name)
            lc.lost_all()
        lc.up = ready

    # -- wake and park ------------------------------------------------------------------
    def wake(self, *, admin: bool = False) -> None:
        lc = self.lifecycle
        if self.k.scale is None:
            return
        if lc.phase is Phase.DRAINING:
            self._wake_after_park = True
            return
        if not lc.want(time.monotonic(), admin=admin):
            return
        self._spawn(self._wake())
        self._sync()

    async def _wake(self) -> None:
        scale = self.k.scale
        assert scale is not None
        lc = self.lifecycle
        deadline = time.monotonic() + self.k.boot_seconds
        backoff = Backoff(self.k.backoff_initial, self.k.backoff_max)
        while lc.phase is Phase.WAKING:
            verb = "get"
            try:
                current = await self.api.get_scale()
                if current == 0:
                    verb = "patch"
                    log.info("deployment %s: waking: %s/%s scaled to %d", self.name, scale.kind, scale.name, scale.replicas)
                    await self.api.patch_scale(scale.replicas)
                    self._scaled_up = True
                else:
                    log.info("deployment %s: waking: %s/%s is already at %d replicas", self.name, scale.kind, scale.name, current)
                break
            except ApiStatus as exc:
                self._fail(self._refused(verb, f"the scale of {scale.kind}/{scale.name}", exc))
                return
            except UNREACHABLE as exc:
                if time.monotonic() > deadline:
                    self._fail(f"the API server could not be reached to wake it ({type(exc).__name__})")
                    return
                self._say(f"the API server cannot be reached to wake the deployment ({type(exc).__name__}: {exc}); retrying")
                await asyncio.sleep(min(backoff.next(), max(0.0, deadline - time.monotonic())))
            except Exception as exc:  # a kubeconfig that does not load: logged, never a crash
                self._fail(f"{type(exc).__name__}: {exc}")
                return
        try:
            async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                while lc.phase is Phase.WAKING:
                    await self._changed.wait()
        except TimeoutError:
            self._fail(f"no pod became Ready within boot_timeout ({self.k.boot_seconds:g} s)")
            if self._scaled_up:
                self._scaled_up = False
                try:
                    await self.api.patch_scale(0)
                    log.info("deployment %s: %s/%s scaled back to 0", self.name, scale.kind, scale.name)
                except (ApiStatus, *UNREACHABLE) as exc:
                    log.warning("deployment %s: cannot scale %s/%s back to 0: %s", self.name, scale.kind, scale.name, exc)

    def _fail(self, why: str) -> None:
        log.error("deployment %s: failed to wake: %s", self.name, why)
        self.wake_fault = why
        self.lifecycle.failed_to_wake()
        self._sync()

    async def park(self, reason: str) -> None:
        scale = self.k.scale
        lc = self.lifecycle
        if scale is None or not lc.park():
            return
        log.info("deployment %s: parking (%s): %s/%s scaled to 0", self.name, reason, scale.kind, scale.name)
        for task in list(self._tasks):
            if task.get_name() == "wake":
                task.cancel()
        self.retired = {uid for uid, _ in self.table.replicas()}
        self._sync()
        try:
            await self.api.patch_scale(0)
        except (ApiStatus, *UNREACHABLE) as exc:
            why = self._refused("patch", f"the scale of {scale.kind}/{scale.name}", exc) if isinstance(exc, ApiStatus) else str(exc)
            log.error("deployment %s: cannot park: %s; it stays up", self.name, why)
            lc.phase = Phase.READY
            self.retired.clear()
            self._sync()
            return
        self._scaled_up = False
        lc.parked()
        M.PARKS.labels(self.name).inc()
        self._sync()
        if self._wake_after_park:
            self._wake_after_park = False
            self.wake()

    async def _tick_forever(self) -> None:
        """Idle parking. Idle means idle on the pods too: each look at their /metrics that shows a
        request in progress or finished (through another gateway, say) counts as a use."""
        idle = self.k.idle_seconds
        interval = max(0.02, min(1.0, idle / 4))
        look_every = max(interval, min(idle / 10, 10.0))
        looked = 0.0
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            if self.lifecycle.phase is Phase.READY and now - looked >= look_every:
                looked = now
                if await self._pods_busy():
                    self.lifecycle.last_used = max(self.lifecycle.last_used, time.monotonic())
            if self.lifecycle.park_due(time.monotonic()):
                self._spawn(self.park("idle"))

    async def _pods_busy(self) -> bool:
        urls = [r.url for r in self.pool.replicas]
        self._activity.keep(set(urls))
        if self._upstreams is None or not urls:
            return False
        looks = await asyncio.gather(*(self._look(url) for url in urls))
        return any(looks)

    async def _look(self, url: str) -> bool:
        assert self._upstreams is not None
        try:
            reply = await self._upstreams.get(url, "/metrics", timeout=self.k.request_timeout, headers=self.pool.upstream_headers,
                                              limit=_METRICS_LIMIT)
            text = reply.body.decode() if reply.status == 200 else ""
        except (UpstreamClosed, OSError, TimeoutError, UnicodeDecodeError):
            return False  # its probes and the gateway's own requests judge it
        seen = activity(text)
        return seen is not None and self._activity.saw(url, *seen)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        name = getattr(coro, "__name__", "")
        task.set_name("wake" if name == "_wake" else name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
