"""A Kubernetes deployment's pods as the gateway sees them, sans-IO: which are replicas, at which URL.

`PodTable` takes a list's items (`reset`, reconciling after a re-list) and watch events (`apply`). A pod
is a replica when Ready, with an IP, no `deletionTimestamp` and a known port (a number, or a container
port by name); `replicas()` gives (uid, URL) in name order, and the pool keeps state by URL, so a
re-list never drops or duplicates one. `problems()` says why a pod cannot be one. `Backoff` is the
jittered wait while the API is unreachable. `PodActivity` reads the pods' /metrics request counters
and says whether any pod served something since the last look (other gateways' traffic included).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True, slots=True)
class Pod:
    uid: str
    name: str
    url: str | None  # None: no pod IP yet, or its port is unknown
    ready: bool
    deleting: bool
    problem: str | None = None

    @property
    def replica(self) -> bool:
        return self.ready and not self.deleting and self.url is not None


def _ready(status: Mapping[str, Any]) -> bool:
    for condition in status.get("conditions") or ():
        if condition.get("type") == "Ready":
            return condition.get("status") == "True"
    return False


def _port(spec: Mapping[str, Any], port: int | str) -> int | None:
    if isinstance(port, int):
        return port
    for container in spec.get("containers") or ():
        for p in container.get("ports") or ():
            if p.get("name") == port and isinstance(p.get("containerPort"), int):
                return int(p["containerPort"])
    return None


def parse(obj: Mapping[str, Any], port: int | str) -> Pod:
    """One pod object of the API (a list's item or a watch event's object)."""
    meta = obj.get("metadata") or {}
    name = str(meta.get("name", ""))
    status = obj.get("status") or {}
    number = _port(obj.get("spec") or {}, port)
    ip = status.get("podIP")
    url = None
    problem = None
    if number is None:
        problem = f"pod {name} has no container port named {port!r}"
    elif ip:
        url = f"http://[{ip}]:{number}" if ":" in ip else f"http://{ip}:{number}"
    return Pod(
        uid=str(meta.get("uid") or name), name=name, url=url, ready=_ready(status),
        deleting=meta.get("deletionTimestamp") is not None, problem=problem,
    )


class PodTable:
    def __init__(self, port: int | str) -> None:
        self.port = port
        self.pods: dict[str, Pod] = {}  # by uid

    def reset(self, items: Iterable[Mapping[str, Any]]) -> None:
        """A list's items are every pod there is now (the first list, or a re-list after 410 Gone)."""
        self.pods = {pod.uid: pod for pod in (parse(item, self.port) for item in items)}

    def apply(self, kind: str, obj: Mapping[str, Any]) -> Pod:
        pod = parse(obj, self.port)
        if kind == "DELETED":
            self.pods.pop(pod.uid, None)
        else:  # ADDED, MODIFIED
            self.pods[pod.uid] = pod
        return pod

    def replicas(self, exclude: AbstractSet[str] = frozenset()) -> list[tuple[str, str]]:
        """(uid, URL) of each pod that may take new requests, by pod name; `exclude`: uids left out."""
        chosen: list[tuple[str, str]] = []
        seen: set[str] = set()
        for pod in sorted(self.pods.values(), key=lambda p: p.name):
            if pod.replica and pod.uid not in exclude and pod.url not in seen:
                assert pod.url is not None
                seen.add(pod.url)
                chosen.append((pod.uid, pod.url))
        return chosen

    def problems(self) -> list[str]:
        return sorted(p.problem for p in self.pods.values() if p.problem is not None)


class Backoff:
    """`next()`: `initial` x 2^(failures in a row), at most `maximum`, times a random factor in
    [0.5, 1] (so many gateways do not retry in step); `reset()` after a success."""

    def __init__(self, initial: float, maximum: float, rng: random.Random | None = None) -> None:
        self.initial = initial
        self.maximum = maximum
        self.failures = 0
        self._rng = rng or random.Random()

    def next(self) -> float:
        delay = min(self.maximum, self.initial * 2 ** min(self.failures, 30))
        self.failures += 1
        return delay * self._rng.uniform(0.5, 1.0)

    def reset(self) -> None:
        self.failures = 0


# In progress now (gauges), and finished so far (counters): streamproxy serve's, and vLLM's own server's.
_BUSY = frozenset({"streamproxy_requests_running", "streamproxy_requests_queued", "vllm:num_requests_running", "vllm:num_requests_waiting"})
_DONE = frozenset({"streamproxy_request_duration_seconds_count", "vllm:request_success_total"})


def activity(text: str) -> tuple[float, float] | None:
    """(requests in progress, requests finished) in a pod's /metrics text; None when it has neither."""
    busy = done = 0.0
    seen = False
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in _BUSY:
                    busy += sample.value
                    seen = True
                elif sample.name in _DONE:
                    done += sample.value
                    seen = True
    except ValueError:
        return None
    return (busy, done) if seen else None


class PodActivity:
    """Per pod URL, the finished-requests count of the last look."""

    def __init__(self) -> None:
        self.finished: dict[str, float] = {}

    def saw(self, url: str, busy: float, done: float) -> bool:
        """True when the pod is serving now or finished something since the last look."""
        before = self.finished.get(url)
        self.finished[url] = done
        return busy > 0 or (before is not None and done != before)

    def keep(self, urls: AbstractSet[str]) -> None:
        for url in [u for u in self.finished if u not in urls]:
            del self.finished[url]
