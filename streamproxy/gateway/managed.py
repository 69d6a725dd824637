"""Managed deployments (`launch:`): the gateway runs their replicas as child processes.

Each replica is a `streamproxy serve` on a free loopback port (replicas.py). `ManagedDeployment` does
what its `Lifecycle` says: wake starts every replica and adds each to the `Pool` once /health answers
200; a replica that exits leaves the pool at once and restarts after the backoff; park (idle, the
admin, or `max_resident`) takes them out and SIGTERMs each group, SIGKILL after the drain timeout.
`admit` answers 503 `deployment_waking` + Retry-After (and wakes it) or `deployment_failed`; with
`wait_for_wake`, `until_ready` waits instead. `Supervisor.shutdown` stops every replica.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import signal
import tempfile
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from streamproxy.config import Settings
from streamproxy.errors import ServiceUnavailable
from streamproxy.gateway import metrics as M
from streamproxy.gateway.balance import Pool
from streamproxy.gateway.config import Deployment
from streamproxy.gateway.exchange import UpstreamClosed
from streamproxy.gateway.lifecycle import GAUGE, Lifecycle, Phase
from streamproxy.gateway.replicas import ReplicaProcess, spawn, watch
from streamproxy.gateway.source import wake_or_refuse
from streamproxy.gateway.wire import Upstreams

log = logging.getLogger("streamproxy.gateway")

_KILL_GRACE = 5.0  # seconds past the replica's own drain before SIGKILL
_BOOT_CHECK_TIMEOUT = 2.0  # seconds for one look at a booting replica's /health


class ManagedDeployment:
    """A `source.ReplicaSource`: the `launch:` deployment's replicas are its child processes."""

    managed = True
    why_not_managed = ""

    def __init__(self, deployment: Deployment, pool: Pool, supervisor: Supervisor) -> None:
        assert deployment.launch is not None
        self.deployment = deployment
        self.launch = deployment.launch
        self.pool = pool
        self.supervisor = supervisor
        self.lifecycle = Lifecycle(self.launch, time.monotonic())
        self.processes: dict[int, ReplicaProcess] = {}  # slot -> its current process
        self._tasks: set[asyncio.Task[None]] = set()
        self._changed = asyncio.Event()
        self._wake_after_park = False
        self._sync()

    @property
    def name(self) -> str:
        return self.deployment.name

    # -- requests ---------------------------------------------------------------------
    @property
    def serving(self) -> bool:
        return self.lifecycle.serving

    def begin(self, now: float) -> None:
        self.lifecycle.begin(now)

    def end(self, now: float) -> None:
        self.lifecycle.end(now)

    def down(self, now: float) -> bool:
        return self.lifecycle.phase is Phase.FAILED

    def start(self, upstreams: Upstreams) -> None:
        return  # the `Supervisor` starts and stops every managed deployment

    async def stop(self) -> None:
        """Its replicas drain and exit (SIGKILL after the drain timeout): at shutdown after the `Supervisor`'s
        own stop (nothing left then), or once a deployment a reload removed has no request left."""
        await self._stop(self.supervisor.settings.drain_timeout + _KILL_GRACE)

    def admit(self) -> None:
        """Before a request is relayed: raises the 503 it gets when the deployment cannot serve it now."""
        lc = self.lifecycle
        if lc.serving:
            return
        M.COLD_REQUESTS.labels(self.name).inc()
        wake_or_refuse(self.name, lc, "failed: its replicas kept exiting", self.wake, self.launch.wait_for_wake)

    async def until_ready(self, timeout: float) -> None:
        """Wait (at most `timeout` s; 0: no bound) until the deployment can serve (`wait_for_wake`)."""
        waiting = M.WAITING.labels(self.name)
        waiting.inc()
        try:
            async with asyncio.timeout(timeout or None):
                while not self.lifecycle.serving:
                    if self.lifecycle.phase is Phase.FAILED:
                        self.admit()  # raises deployment_failed
                    if self.lifecycle.phase is Phase.PARKED:
                        self.wake()
                    await self._changed.wait()
        except TimeoutError:
            raise ServiceUnavailable(
                f"deployment `{self.name}` did not wake within {timeout:g} s", code="deployment_waking",
                retry_after=self.lifecycle.retry_after(),
            ) from None
        finally:
            waiting.dec()

    # -- wake -------------------------------------------------------------------------
    def wake(self, *, admin: bool = False) -> None:
        lc = self.lifecycle
        if lc.phase is Phase.DRAINING:
            self._wake_after_park = True
            return
        parks: list[asyncio.Task[None]] = []
        if lc.phase is Phase.PARKED or (admin and lc.phase is Phase.FAILED):
            parks = self.supervisor.make_room(self)
        if not lc.want(time.monotonic(), admin=admin):
            return
        log.info("deployment %s: waking %d replica(s)", self.name, self.launch.replicas)
        for slot in range(self.launch.replicas):
            self._spawn_task(self._boot(slot, after=parks))
        self._sync()

    def _spawn_task(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _boot(self, slot: int, delay: float = 0.0, after: list[asyncio.Task[None]] | None = None) -> None:
        if after:
            await asyncio.gather(*after, return_exceptions=True)  # the deployments parked to make room
        if delay:
            await asyncio.sleep(delay)
            if self.lifecycle.phase not in (Phase.WAKING, Phase.READY):
                return
        rp = self._start(slot)
        if rp is None:
            return
        deadline = time.monotonic() + self.launch.boot_timeout
        upstreams = self.supervisor.upstreams
        while rp.proc.returncode is None and not rp.expected:
            if time.monotonic() > deadline:
                log.warning("deployment %s: replica %s not healthy after %.0f s; killing it", self.name, rp.url, self.launch.boot_timeout)
                rp.signal(signal.SIGKILL)
                return
            try:
                assert upstreams is not None
                if (await upstreams.get(rp.url, "/health", timeout=_BOOT_CHECK_TIMEOUT)).status == 200:
                    break
            except (UpstreamClosed, OSError, TimeoutError):
                pass
            await asyncio.sleep(0.05)
        else:
            return  # it exited (`_exited` counts it) or is being stopped
        rp.up = True
        boots = self.lifecycle.boots
        self.lifecycle.replica_up(time.monotonic())
        if self.lifecycle.boots > boots and self.lifecycle.last_boot is not None:  # this one woke the deployment
            M.BOOTS.labels(self.name).inc()
            M.BOOT_SECONDS.labels(self.name).observe(self.lifecycle.last_boot)
        log.info("deployment %s: replica %s (pid %d) is up after %.1f s", self.name, rp.url, rp.pid, time.monotonic() - rp.started)
        self._sync()

    def _start(self, slot: int) -> ReplicaProcess | None:
        try:
            rp = spawn(self.deployment, self.launch, slot, self.supervisor.log_dir)
        except OSError as exc:
            log.error("deployment %s: cannot start a replica: %s", self.name, exc)
            self._after_exit(None, None, slot)
            return None
        self.processes[slot] = rp
        watch(rp, self._exited)
        return rp

    def _exited(self, rp: ReplicaProcess) -> None:
        if self.processes.get(rp.slot) is rp:
            del self.processes[rp.slot]
        was_up, rp.up = rp.up, False
        self._publish()
        code = rp.proc.returncode
        if not rp.expected:
            log.warning("deployment %s: replica %s (pid %d) exited on its own with %s", self.name, rp.url, rp.pid, code)
        delay = self.lifecycle.replica_exited(time.monotonic(), was_up=was_up, expected=rp.expected)
        if not rp.expected:
            self._after_exit(delay, rp)
        self._sync()

    def _after_exit(self, delay: float | None, rp: ReplicaProcess | None = None, slot: int = 0) -> None:
        lc = self.lifecycle
        if delay is None and rp is None:
            delay = lc.replica_exited(time.monotonic(), was_up=False, expected=False)
        if lc.phase is Phase.FAILED:
            tail = rp.tail() if rp is not None else "(it did not start)"
            log.error(
                "deployment %s failed: %d replica failures in a row; the end of the last one's log:\n%s",
                self.name, lc.failures, tail,
            )
            self._stop_all(signal.SIGTERM)
            lc.stopped_all()
        elif delay is not None:
            slot = rp.slot if rp is not None else slot
            log.info("deployment %s: restarting replica %d in %.1f s", self.name, slot, delay)
            M.RESTARTS.labels(self.name).inc()
            self._spawn_task(self._boot(slot, delay))

    # -- park -------------------------------------------------------------------------
    async def park(self, reason: str) -> None:
        if not self.lifecycle.park():
            return
        log.info("deployment %s: parking (%s)", self.name, reason)
        self._sync()
        await self._stop(self.supervisor.settings.drain_timeout + _KILL_GRACE)
        self.lifecycle.parked()
        M.PARKS.labels(self.name).inc()
        self._sync()
        if self._wake_after_park:
            self._wake_after_park = False
            self.wake()

    def _stop_all(self, sig: signal.Signals) -> list[ReplicaProcess]:
        for task in list(self._tasks):
            if task is not asyncio.current_task():
                task.cancel()  # boots and pending restarts
        running = list(self.processes.values())
        for rp in running:
            rp.expected = True
            rp.up = False
            rp.signal(sig)
        self._publish()
        return running

    async def _stop(self, grace: float) -> None:
        """SIGTERM every replica (each drains), SIGKILL what is left after `grace` s; wait for all."""
        running = self._stop_all(signal.SIGTERM)
        if not running:
            return
        waits = [rp.exited.wait() for rp in running]
        try:
            async with asyncio.timeout(grace):
                await asyncio.gather(*waits)
        except TimeoutError:
            for rp in running:
                rp.signal(signal.SIGKILL)
            await asyncio.gather(*(rp.exited.wait() for rp in running))

    # -- state ------------------------------------------------------------------------
    def _publish(self) -> None:
        up = [rp for rp in sorted(self.processes.values(), key=lambda r: r.slot) if rp.up]
        self.pool.set_replicas([rp.url for rp in up], events={rp.url: rp.kv_events for rp in up})

    def _sync(self) -> None:
        self._publish()
        M.MANAGED_STATE.labels(self.name).set(GAUGE[self.lifecycle.phase])
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def describe(self, replicas: list[dict[str, object]]) -> dict[str, object]:
        processes = {p.url: p for p in self.running()}
        for r in replicas:
            process = processes.get(str(r["url"]))
            if process is not None:
                r.update(port=process.port, pid=process.pid)
        # Replicas still booting (not in the pool yet) are shown too.
        booting = [{"url": p.url, "port": p.port, "pid": p.pid, "booting": True} for p in processes.values() if not p.up]
        lc = self.lifecycle
        return {
            "replicas": replicas + booting,
            "managed": True,
            "state": lc.phase.value,
            "last_boot_seconds": None if lc.last_boot is None else round(lc.last_boot, 3),
            "requests_in_flight": lc.in_flight,
            "boots": lc.boots,
            "parks": lc.parks,
            "restarts": lc.restarts,
        }

    def running(self) -> list[ReplicaProcess]:
        return sorted(self.processes.values(), key=lambda r: r.slot)


class Supervisor:
    """Every managed deployment of the gateway, the idle ticker, and `max_resident`."""

    def __init__(self, settings: Settings, max_resident: int) -> None:
        self.settings = settings
        self.max_resident = max_resident
        self.deployments: dict[str, ManagedDeployment] = {}
        self.upstreams: Upstreams | None = None  # the gateway's client (wire.py), once started
        self.log_dir = Path(tempfile.mkdtemp(prefix="streamproxy-gateway-"))
        self._ticker: asyncio.Task[None] | None = None

    def add(self, deployment: Deployment, pool: Pool) -> ManagedDeployment:
        managed = ManagedDeployment(deployment, pool, self)
        self.deployments[deployment.name] = managed
        return managed

    def start(self, upstreams: Upstreams) -> None:
        self.upstreams = upstreams
        if self.deployments:
            self._ticker = asyncio.create_task(self._tick_forever(), name="gateway-managed")
        for managed in self.deployments.values():
            if managed.launch.idle_seconds == 0:
                managed.wake()  # always on

    def attach(self, managed: ManagedDeployment) -> None:
        """A deployment a reload added, once the gateway serves it: as `add` + `start` for it alone."""
        self.deployments[managed.name] = managed
        if self.upstreams is None:
            return
        if self._ticker is None:
            self._ticker = asyncio.create_task(self._tick_forever(), name="gateway-managed")
        if managed.launch.idle_seconds == 0:
            managed.wake()

    def forget(self, source: object) -> None:
        """A deployment a reload removed: no longer parked, counted or woken here (its `stop` ends it)."""
        for name, managed in list(self.deployments.items()):
            if managed is source:
                del self.deployments[name]

    async def _tick_forever(self) -> None:
        while True:
            idles = [m.launch.idle_seconds for m in self.deployments.values() if m.launch.idle_seconds > 0]
            interval = min([1.0, *(i / 4 for i in idles)])  # again each round: a reload may add or remove some
            await asyncio.sleep(max(interval, 0.02))
            now = time.monotonic()
            for managed in list(self.deployments.values()):
                if managed.lifecycle.park_due(now):
                    managed._spawn_task(managed.park("idle"))

    def resident(self) -> int:
        return sum(m.launch.replicas for m in self.deployments.values() if m.lifecycle.phase in (Phase.WAKING, Phase.READY, Phase.DRAINING))

    def make_room(self, waking: ManagedDeployment) -> list[asyncio.Task[None]]:
        """Under `max_resident`: park the least recently used idle deployments until `waking` fits;
        raises 503 when they cannot be parked."""
        if not self.max_resident:
            return []
        need = self.resident() + waking.launch.replicas - self.max_resident
        if need <= 0:
            return []
        idle = sorted(
            (m for m in self.deployments.values() if m is not waking and m.lifecycle.phase is Phase.READY and m.lifecycle.in_flight == 0),
            key=lambda m: m.lifecycle.last_used,
        )
        chosen: list[ManagedDeployment] = []
        for m in idle:
            if need <= 0:
                break
            chosen.append(m)
            need -= m.launch.replicas
        if need > 0:
            raise ServiceUnavailable(
                f"deployment `{waking.name}` cannot wake: {self.max_resident} replicas are resident (max_resident) and none "
                "of them is idle; retry later",
                code="max_resident",
                retry_after=max(1, int(waking.lifecycle.retry_after())),
            )
        parks = []
        for m in chosen:  # resident() counts them until they are parked; the wake's boots wait for them
            task = asyncio.ensure_future(m.park(f"making room for {waking.name}"))
            parks.append(task)
        return parks

    async def shutdown(self) -> None:
        """Stop every replica (SIGTERM, each drains; SIGKILL after the drain timeout) and wait for them."""
        if self._ticker is not None:
            self._ticker.cancel()
        grace = self.settings.drain_timeout + _KILL_GRACE
        await asyncio.gather(*(m._stop(grace) for m in self.deployments.values()))
        for m in self.deployments.values():
            for rp in list(m.processes.values()):
                rp.signal(signal.SIGKILL)
        shutil.rmtree(self.log_dir, ignore_errors=True)
