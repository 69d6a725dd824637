"""The Kubernetes API calls of a `kubernetes:` deployment, through kubernetes_asyncio.

kubernetes_asyncio (imported here only, on first use) runs on aiohttp and reads a kubeconfig or the
in-cluster account. Responses are read raw as JSON (`_preload_content=False`), and the watch stream is
parsed here: the library's `Watch` retries a 410 with the stale resourceVersion where the API asks for
a re-list. `KubeApi`: `list_pods`, `watch_pods` (None once accepted, then events with bookmarks;
`WatchCut` when the connection breaks), `get_scale`/`patch_scale`. Errors: `ApiStatus` (`Gone` for 410)
and `UNREACHABLE`; `refused` words a status for the log and the 503s.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson

from streamproxy.gateway.config import Kubernetes


class ApiStatus(Exception):
    """The API server answered with an error status (or an ERROR event in a watch)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status} {message}")
        self.status = status
        self.message = message


class Gone(ApiStatus):
    """410: the resourceVersion is too old; list again."""


class WatchCut(Exception):
    """The watch's connection broke mid-stream: resume from the last resourceVersion."""


class KubeConfigMissing(Exception):
    """The kubeconfig named does not exist (kubernetes_asyncio would say "Expected key current-context")."""


UNREACHABLE = (aiohttp.ClientError, OSError, TimeoutError, asyncio.IncompleteReadError)


def status_error(status: int, message: str) -> ApiStatus:
    return (Gone if status == 410 else ApiStatus)(status, message)


async def _json(response: Any) -> Any:
    """A raw response's JSON, or ApiStatus with the API's own message."""
    try:
        raw = await response.read()
    finally:
        response.release()
    if 200 <= response.status < 300:
        return orjson.loads(raw)
    try:
        message = orjson.loads(raw).get("message") or ""
    except (orjson.JSONDecodeError, AttributeError):
        message = raw[:200].decode("utf-8", "replace")
    raise status_error(response.status, message or response.reason or "")


def refused(k: Kubernetes, verb: str, what: str, exc: ApiStatus) -> str:
    where = f"in namespace {k.namespace}"
    if exc.status == 403:
        return f"the gateway may not {verb} {what} {where} (403 Forbidden: {exc.message}); its RBAC must grant it"
    if exc.status == 404:
        return f"cannot {verb} {what} {where}: 404 Not Found ({exc.message})"
    if exc.status == 401:
        return f"the API server refused the gateway's credentials to {verb} {what} (401: {exc.message})"
    return f"cannot {verb} {what} {where}: {exc.status} {exc.message}"


class KubeApi:
    def __init__(self, k: Kubernetes) -> None:
        self.k = k
        self.client: Any = None  # kubernetes_asyncio's ApiClient, made once
        self._connecting = asyncio.Lock()

    async def connect(self) -> Any:
        """The API client (discovery and a wake may both ask first): the `kubeconfig` given,
        else $KUBECONFIG, else the in-cluster service account, else ~/.kube/config."""
        async with self._connecting:
            if self.client is None:
                from kubernetes_asyncio import client, config

                conf = client.Configuration()
                path = self.k.kubeconfig or os.environ.get("KUBECONFIG")
                if path is not None and not any(os.path.exists(p) for p in path.split(os.pathsep) if p):
                    raise KubeConfigMissing(f"the kubeconfig {path} does not exist")
                if path is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
                    config.load_incluster_config(client_configuration=conf)
                else:
                    await config.load_kube_config(config_file=path, context=self.k.context, client_configuration=conf, persist_config=False)
                self.client = client.ApiClient(conf)
        return self.client

    async def close(self) -> None:
        if self.client is not None:
            api, self.client = self.client, None
            await api.close()

    async def _core(self) -> Any:
        from kubernetes_asyncio import client

        return client.CoreV1Api(await self.connect())

    async def list_pods(self) -> tuple[list[dict[str, Any]], str | None]:
        core = await self._core()
        response = await core.list_namespaced_pod(
            self.k.namespace, label_selector=self.k.label_selector(), _preload_content=False, _request_timeout=self.k.request_timeout,
        )
        data = await _json(response)
        return data.get("items") or [], str((data.get("metadata") or {}).get("resourceVersion") or "") or None

    async def watch_pods(self, resource_version: str | None) -> AsyncIterator[dict[str, Any] | None]:
        """None first, once the API server accepted the watch; then its events."""
        k = self.k
        core = await self._core()
        response = await core.list_namespaced_pod(
            k.namespace, label_selector=k.label_selector(), watch=True, resource_version=resource_version,
            allow_watch_bookmarks=True, timeout_seconds=max(1, int(k.watch_timeout)), _preload_content=False,
            _request_timeout=aiohttp.ClientTimeout(connect=k.request_timeout, sock_read=k.watch_timeout + k.request_timeout),
        )
        try:
            if response.status != 200:
                await _json(response)  # raises the status
            yield None
            try:
                async for line in response.content:
                    if not line.strip():
                        continue
                    event = orjson.loads(line)
                    if event.get("type") == "ERROR":
                        obj = event.get("object") or {}
                        raise status_error(int(obj.get("code") or 0), str(obj.get("message") or obj.get("reason") or ""))
                    yield event
            except (aiohttp.ClientPayloadError, ConnectionResetError) as exc:
                raise WatchCut(type(exc).__name__) from exc
        finally:
            response.release()

    def _scale_calls(self, client: Any) -> tuple[Any, Any]:
        from kubernetes_asyncio.client import AppsV1Api

        apps = AppsV1Api(client)
        assert self.k.scale is not None
        if self.k.scale.kind == "StatefulSet":
            return apps.read_namespaced_stateful_set_scale, apps.patch_namespaced_stateful_set_scale
        return apps.read_namespaced_deployment_scale, apps.patch_namespaced_deployment_scale

    async def get_scale(self) -> int:
        read, _ = self._scale_calls(await self.connect())
        assert self.k.scale is not None
        data = await _json(await read(self.k.scale.name, self.k.namespace, _preload_content=False, _request_timeout=self.k.request_timeout))
        return int((data.get("spec") or {}).get("replicas") or 0)

    async def patch_scale(self, replicas: int) -> None:
        _, patch = self._scale_calls(await self.connect())
        assert self.k.scale is not None
        await _json(await patch(
            self.k.scale.name, self.k.namespace, {"spec": {"replicas": replicas}}, _preload_content=False,
            _request_timeout=self.k.request_timeout,
        ))
