"""A fake Kubernetes API server on 127.0.0.1 (aiohttp), for what the gateway's `kubernetes:` source uses.

It answers the real client library (kubernetes_asyncio, through a kubeconfig
`FakeKube.kubeconfig` writes: a bearer token, plain HTTP on loopback) as the
API server does:
  GET  /api/v1/namespaces/{ns}/pods?labelSelector=...        a PodList with the resourceVersion now
       (an unknown namespace lists nothing, as the real one);
  GET  ...pods?watch=true&resourceVersion=R[&allowWatchBookmarks=true][&timeoutSeconds=T]
       a stream of JSON lines: the events after R (replayed from the history),
       then live ADDED / MODIFIED / DELETED, BOOKMARK when `bookmark()` is
       called; R older than the compaction point (`compact()`) is an ERROR
       event with a 410 Status; the stream ends after T seconds;
  GET  /apis/apps/v1/namespaces/{ns}/{deployments|statefulsets}/{name}/scale   an autoscaling/v1 Scale;
  PATCH the same, `{"spec": {"replicas": n}}`: the workload's desired count,
       which the kubelet stand-in makes true;
  401 without the token, 403 (a Status, the real message's shape) for a
  (verb, resource) in `forbid` or, given `grants` (a Role's rules), not in it, 404 for a workload that does not exist.
Every call is recorded as (verb, resource) in `calls` (resource "pods",
"deployments/scale", ...), and each watch's resourceVersion in `watch_from`.

The kubelet stand-in (`workload(...)`): for each pod a scale-up creates it
calls `start_replica()` (the test's: a fake-engine replica, in-process on
loopback) and adds the pod with IP 127.0.0.1 and that port as the container
port `port_name`; when the replica's GET /health answers 200 it marks the pod
Ready (`hold_ready` keeps pods unready until `release()`). A scale-down marks
the newest pods deleting (deletionTimestamp), waits `grace` seconds, stops
their replicas and deletes them. Tests also drive pods by hand: `add_pod`,
`set_ready`, `mark_deleting`, `remove_pod` (`quiet=True`: no event to the
watches open now, a change they miss), `cut_watches` (connections dropped
mid-stream), `expire_watches` (an ERROR 410 to each open watch),
`stop_server` / `start_server` (the API server down and back on its port,
its state kept, as etcd keeps it).

`ThreadedFakeKube` runs one on its own event loop in a thread, for tests
that are not async (a `streamproxy gateway` process's API server).
"""

from __future__ import annotations

import asyncio
import copy
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import yaml
from aiohttp import web

from harness.process import free_port

TOKEN = "fake-token"
StartReplica = Callable[[], Awaitable[tuple[int, Callable[[], Awaitable[None]]]]]


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message, "reason": reason, "code": code}


def _selector(text: str) -> list[tuple[str, str | None, bool]]:
    """`a=b,c!=d,e`: (key, value or None for "exists", equal)."""
    terms: list[tuple[str, str | None, bool]] = []
    for term in filter(None, (t.strip() for t in text.split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            terms.append((key, value, False))
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            terms.append((key, value, True))
        else:
            terms.append((term, None, True))
    return terms


def _matches(labels: dict[str, str], terms: list[tuple[str, str | None, bool]]) -> bool:
    for key, value, equal in terms:
        if value is None:
            if key not in labels:
                return False
        elif (labels.get(key) == value) != equal:
            return False
    return True


@dataclass
class Workload:
    kind: str  # "Deployment" or "StatefulSet"
    namespace: str
    name: str
    labels: dict[str, str]
    port_name: str = "http"
    replicas: int = 0
    pods: list[str] = field(default_factory=list)  # its pods' names, oldest first


@dataclass
class _Watch:
    namespace: str
    terms: list[tuple[str, str | None, bool]]
    bookmarks: bool
    queue: asyncio.Queue[dict[str, Any] | None]
    response: web.StreamResponse


class FakeKube:
    def __init__(self, *, start_replica: StartReplica | None = None, grace: float = 0.05, port: int = 0,
                 grants: set[tuple[str, str]] | None = None) -> None:
        self.start_replica = start_replica
        self.grants = grants  # None: every verb; else 403 for any (verb, resource) not in it (an RBAC Role's rules)
        self.grace = grace
        self.port = port
        self.rv = 100
        self.oldest = 0  # a watch from a resourceVersion before this gets 410
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.history: list[tuple[int, str, dict[str, Any]]] = []
        self.calls: list[tuple[str, str]] = []
        self.watch_from: list[str | None] = []
        self.forbid: set[tuple[str, str]] = set()
        self.workloads: dict[tuple[str, str, str], Workload] = {}
        self.hold_ready = False
        self._held: list[tuple[str, str, int]] = []
        self._stops: dict[tuple[str, str], Callable[[], Awaitable[None]]] = {}
        self._watches: list[_Watch] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self._uid = 0
        self.runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    # -- the server ------------------------------------------------------------------
    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def kubeconfig(self, path: Path) -> str:
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.base}}],
            "users": [{"name": "fake", "user": {"token": TOKEN}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
        }))
        return str(path)

    def reserve_port(self) -> int:
        """A port for the server before it starts (the API server down at the gateway's start)."""
        if not self.port:
            self.port = free_port()
        return self.port

    async def start_server(self) -> None:
        app = web.Application()
        app.router.add_get("/api/v1/namespaces/{ns}/pods", self._pods)
        app.router.add_get("/apis/apps/v1/namespaces/{ns}/{plural}/{name}/scale", self._get_scale)
        app.router.add_patch("/apis/apps/v1/namespaces/{ns}/{plural}/{name}/scale", self._patch_scale)
        self.runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port, reuse_address=True).start()
        self.port = self.runner.addresses[0][1]
        if self._session is None:
            self._session = aiohttp.ClientSession()

    async def stop_server(self) -> None:
        """Down: the port refuses, every open watch is cut."""
        runner, self.runner = self.runner, None
        if runner is None:
            return
        for site in list(runner.sites):
            await site.stop()
        self.cut_watches()
        if runner.server is not None:
            for connection in runner.server.connections:
                connection.force_close()
        await runner.cleanup()

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.stop_server()
        for stop in list(self._stops.values()):
            await stop()
        self._stops.clear()
        if self._session is not None:
            await self._session.close()

    def _allowed(self, request: web.Request, verb: str, resource: str) -> web.Response | None:
        self.calls.append((verb, resource))
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return web.json_response(_status(401, "Unauthorized", "Unauthorized"), status=401)
        if (verb, resource) in self.forbid or (self.grants is not None and (verb, resource) not in self.grants):
            kind = resource.partition("/")[0]
            group = '""' if kind == "pods" else '"apps"'
            subject = "pods" if kind == "pods" else f'{kind}.apps "{request.match_info["name"]}"'
            message = (f'{subject} is forbidden: User "system:serviceaccount:llm:gateway" cannot {verb} resource "{resource}" '
                       f'in API group {group} in the namespace "{request.match_info["ns"]}"')
            return web.json_response(_status(403, "Forbidden", message), status=403)
        return None

    # -- pods ------------------------------------------------------------------------
    async def _pods(self, request: web.Request) -> web.StreamResponse:
        ns = request.match_info["ns"]
        watch = request.query.get("watch", "").lower() in ("true", "1")
        refused = self._allowed(request, "watch" if watch else "list", "pods")
        if refused is not None:
            return refused
        terms = _selector(request.query.get("labelSelector", ""))
        if not watch:
            items = [copy.deepcopy(p) for (pns, _), p in sorted(self.pods.items()) if pns == ns and _matches(p["metadata"]["labels"], terms)]
            return web.json_response({"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": str(self.rv)}, "items": items})
        since = request.query.get("resourceVersion") or None
        self.watch_from.append(since)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        if since is not None and int(since) < self.oldest:
            gone = _status(410, "Expired", f"too old resource version: {since} ({self.oldest})")
            await response.write(orjson.dumps({"type": "ERROR", "object": gone}) + b"\n")
            return response
        w = _Watch(ns, terms, request.query.get("allowWatchBookmarks", "").lower() in ("true", "1"), asyncio.Queue(), response)
        start = int(since) if since is not None else self.rv
        for rv, kind, pod in self.history:
            if rv > start and self._sees(w, pod):
                w.queue.put_nowait({"type": kind, "object": copy.deepcopy(pod)})
        self._watches.append(w)
        timeout = float(request.query.get("timeoutSeconds", "1800"))
        try:
            async with asyncio.timeout(timeout):
                while True:
                    event = await w.queue.get()
                    if event is None:  # cut: drop the connection mid-stream
                        if request.transport is not None:
                            request.transport.close()
                        return response
                    await response.write(orjson.dumps(event) + b"\n")
                    if event["type"] == "ERROR":
                        return response
        except (TimeoutError, ConnectionError):  # the watch's time is up, or its client went away
            return response
        finally:
            if w in self._watches:
                self._watches.remove(w)

    def _sees(self, w: _Watch, pod: dict[str, Any]) -> bool:
        return pod["metadata"]["namespace"] == w.namespace and _matches(pod["metadata"]["labels"], w.terms)

    def _emit(self, kind: str, pod: dict[str, Any], *, quiet: bool = False) -> None:
        self.rv += 1
        pod["metadata"]["resourceVersion"] = str(self.rv)
        snapshot = copy.deepcopy(pod)
        self.history.append((self.rv, kind, snapshot))
        if quiet:
            return
        for w in self._watches:
            if self._sees(w, snapshot):
                w.queue.put_nowait({"type": kind, "object": copy.deepcopy(snapshot)})

    def add_pod(self, name: str, labels: dict[str, str], *, port: int, namespace: str = "llm", port_name: str = "http",
                ready: bool = False, ip: str = "127.0.0.1", quiet: bool = False) -> dict[str, Any]:
        self._uid += 1
        pod = {
            "kind": "Pod", "apiVersion": "v1",
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{self._uid}-{name}", "labels": dict(labels)},
            "spec": {"containers": [{"name": "serve", "ports": [{"name": port_name, "containerPort": port, "protocol": "TCP"}]}]},
            "status": {"phase": "Running", "podIP": ip, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
        }
        self.pods[(namespace, name)] = pod
        self._emit("ADDED", pod, quiet=quiet)
        return pod

    def set_ready(self, name: str, ready: bool = True, namespace: str = "llm") -> None:
        pod = self.pods[(namespace, name)]
        pod["status"]["conditions"] = [{"type": "Ready", "status": "True" if ready else "False"}]
        self._emit("MODIFIED", pod)

    def mark_deleting(self, name: str, namespace: str = "llm") -> None:
        pod = self.pods[(namespace, name)]
        pod["metadata"]["deletionTimestamp"] = "2026-12-01T00:00:00Z"
        self._emit("MODIFIED", pod)

    def remove_pod(self, name: str, namespace: str = "llm", *, quiet: bool = False) -> None:
        pod = self.pods.pop((namespace, name))
        self._emit("DELETED", pod, quiet=quiet)

    def bookmark(self) -> None:
        for w in self._watches:
            if w.bookmarks:
                w.queue.put_nowait({"type": "BOOKMARK", "object": {"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": str(self.rv)}}})

    def cut_watches(self) -> None:
        for w in list(self._watches):
            w.queue.put_nowait(None)

    def compact(self) -> None:
        """Forget the history so far: a watch from an older resourceVersion gets 410."""
        self.oldest = self.rv

    def expire_watches(self) -> None:
        """An ERROR event with a 410 Status on every open watch (after `compact`, resuming fails too)."""
        self.compact()
        for w in list(self._watches):
            w.queue.put_nowait({"type": "ERROR", "object": _status(410, "Expired", "too old resource version")})

    def open_watches(self) -> int:
        return len(self._watches)

    def count(self, verb: str, resource: str) -> int:
        return self.calls.count((verb, resource))

    # -- workloads, their scale, and the kubelet stand-in ----------------------------------
    def workload(self, name: str, labels: dict[str, str], *, kind: str = "Deployment", namespace: str = "llm",
                 replicas: int = 0, port_name: str = "http") -> Workload:
        w = Workload(kind, namespace, name, dict(labels), port_name)
        self.workloads[(kind, namespace, name)] = w
        self._scale_to(w, replicas)
        return w

    def _find(self, request: web.Request) -> Workload | None:
        kind = {"deployments": "Deployment", "statefulsets": "StatefulSet"}.get(request.match_info["plural"], "")
        return self.workloads.get((kind, request.match_info["ns"], request.match_info["name"]))

    def _scale(self, w: Workload) -> dict[str, Any]:
        selector = ",".join(f"{k}={v}" for k, v in sorted(w.labels.items()))
        return {
            "kind": "Scale", "apiVersion": "autoscaling/v1",
            "metadata": {"name": w.name, "namespace": w.namespace, "resourceVersion": str(self.rv)},
            "spec": {"replicas": w.replicas}, "status": {"replicas": len(w.pods), "selector": selector},
        }

    async def _get_scale(self, request: web.Request) -> web.Response:
        refused = self._allowed(request, "get", request.match_info["plural"] + "/scale")
        if refused is not None:
            return refused
        w = self._find(request)
        if w is None:
            return self._not_found(request)
        return web.json_response(self._scale(w))

    async def _patch_scale(self, request: web.Request) -> web.Response:
        refused = self._allowed(request, "patch", request.match_info["plural"] + "/scale")
        if refused is not None:
            return refused
        w = self._find(request)
        if w is None:
            return self._not_found(request)
        body = orjson.loads(await request.read())
        self._scale_to(w, int(body["spec"]["replicas"]))
        return web.json_response(self._scale(w))

    def _not_found(self, request: web.Request) -> web.Response:
        plural, name = request.match_info["plural"], request.match_info["name"]
        return web.json_response(_status(404, "NotFound", f'{plural}.apps "{name}" not found'), status=404)

    def _scale_to(self, w: Workload, replicas: int) -> None:
        w.replicas = replicas
        live = [n for n in w.pods if "deletionTimestamp" not in self.pods[(w.namespace, n)]["metadata"]]
        for _ in range(replicas - len(live)):
            self._uid += 1
            name = f"{w.name}-{self._uid}"
            w.pods.append(name)
            self._spawn(self._run_pod(w, name))
        for name in live[replicas:][::-1] if replicas < len(live) else []:
            self._spawn(self._terminate(w, name))

    async def _run_pod(self, w: Workload, name: str) -> None:
        assert self.start_replica is not None, "FakeKube(start_replica=...) runs the pods of a workload"
        port, stop = await self.start_replica()
        self._stops[(w.namespace, name)] = stop
        self.add_pod(name, w.labels, port=port, namespace=w.namespace, port_name=w.port_name)
        assert self._session is not None
        while True:
            try:
                async with self._session.get(f"http://127.0.0.1:{port}/health") as response:
                    if response.status == 200:
                        break
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.02)
        if self.hold_ready:
            self._held.append((w.namespace, name, port))
            return
        if (w.namespace, name) in self.pods:
            self.set_ready(name, namespace=w.namespace)

    def release(self) -> None:
        """The pods held unready (`hold_ready`) become Ready."""
        self.hold_ready = False
        for ns, name, _ in self._held:
            if (ns, name) in self.pods:
                self.set_ready(name, namespace=ns)
        self._held.clear()

    async def _terminate(self, w: Workload, name: str) -> None:
        self.mark_deleting(name, w.namespace)
        await asyncio.sleep(self.grace)  # the pod's grace period: its streams drain
        stop = self._stops.pop((w.namespace, name), None)
        if stop is not None:
            await stop()
        if name in w.pods:
            w.pods.remove(name)
        if (w.namespace, name) in self.pods:
            self.remove_pod(name, w.namespace)

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


class ThreadedFakeKube:
    """A `FakeKube` on its own loop in a daemon thread; `call(fn, *args)` runs `fn` there."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="fake-kube", daemon=True)
        self.kube = FakeKube()

    def start(self) -> FakeKube:
        self.thread.start()
        self._run(self.kube.start_server())
        return self.kube

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=30)

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        async def run() -> Any:
            return fn(*args, **kwargs)

        return self._run(run())

    def stop(self) -> None:
        self._run(self.kube.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()
