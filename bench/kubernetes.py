"""`kubernetes:` deployments, timed against the fake API server (harness/fake_kube.py), in one process.

    .venv/bin/python -m bench.kubernetes [--ready N] [--wakes N]

Two figures (median and p99), written to bench/results/kubernetes.json:
  ready -> routable   from a pod's Ready condition set on the API server to its URL in the
                      gateway's pool (the watch event's trip and the pool update);
  wake overhead       from a request to a parked deployment (`scale:`, `wait_for_wake`) to its
                      first token, minus the pod's boot (the scale patch to the pod's Ready):
                      what the gateway adds to a cold start.
The API server, the replicas (fake engine) and the gateway share one event loop on loopback:
these are the gateway's own costs, not a cluster's (a real API server's watch latency and
a real pod's scheduling come on top).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
from aiohttp import web

from engine_adapter.fake import FakeEngine, FakeScript
from harness.fake_kube import FakeKube
from streamproxy.config import Settings
from streamproxy.gateway.app import create_gateway_app
from streamproxy.gateway.config import GatewayConfig
from streamproxy.gateway.config_file import check
from streamproxy.gateway.state import STATE_KEY
from streamproxy.http.app import create_app
from streamproxy.http.server import make_runner

RESULTS = Path(__file__).parent / "results"
LABELS = {"app": "bench"}
BODY = {"model": "bench", "messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 4}


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))]


async def serve(app: web.Application, settings: Settings) -> tuple[web.BaseRunner, int]:
    runner = make_runner(app, settings)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, runner.addresses[0][1]


async def replica() -> tuple[int, Any]:
    settings = Settings(engine="fake", host="127.0.0.1", port=0, served_model_name=["bench"], access_log="off")
    runner, port = await serve(create_app(settings, FakeEngine(FakeScript(tokens=["a", "b"]), served_names=["bench"])), settings)
    return port, runner.cleanup


async def gateway(section: dict[str, Any]) -> tuple[web.Application, web.BaseRunner, str]:
    conf = msgspec.convert({"deployments": [{"name": "bench", "id": "dep-bench", "kubernetes": section}]}, GatewayConfig)
    check(conf)
    settings = Settings(host="127.0.0.1", port=0, access_log="off")
    app = create_gateway_app(settings, conf)
    runner, port = await serve(app, settings)
    return app, runner, f"http://127.0.0.1:{port}"


async def until(predicate: Any) -> None:
    while not predicate():
        await asyncio.sleep(0)


async def ready_to_routable(kube: FakeKube, base: dict[str, Any], n: int) -> list[float]:
    app, runner, _ = await gateway(base)
    pool = app[STATE_KEY].state.pools["bench"]
    await until(lambda: kube.open_watches() == 1)
    port, stop = await replica()
    took = []
    for i in range(n):
        kube.add_pod(f"p{i}", LABELS, port=port)
        await asyncio.sleep(0.005)
        start = time.perf_counter()
        kube.set_ready(f"p{i}")
        await until(lambda: bool(pool.replicas))
        took.append(time.perf_counter() - start)
        kube.remove_pod(f"p{i}")
        await until(lambda: not pool.replicas)
    await runner.cleanup()
    await stop()
    return took


async def wake_overhead(kube: FakeKube, base: dict[str, Any], n: int) -> list[float]:
    w = kube.workload("bench", LABELS, replicas=0)
    patched: list[float] = []
    readied: list[float] = []
    scale_to, set_ready = kube._scale_to, kube.set_ready

    def timed_scale(workload: Any, replicas: int) -> None:
        if replicas:
            patched.append(time.perf_counter())
        scale_to(workload, replicas)

    def timed_ready(name: str, ready: bool = True, namespace: str = "llm") -> None:
        if ready:
            readied.append(time.perf_counter())
        set_ready(name, ready, namespace)

    kube._scale_to, kube.set_ready = timed_scale, timed_ready  # type: ignore[method-assign, assignment]
    app, runner, url = await gateway({**base, "scale": {"name": "bench", "replicas": 1}, "wait_for_wake": True})
    source = app[STATE_KEY].state.sources["bench"]
    await until(lambda: kube.open_watches() == 1)
    extra = []
    async with aiohttp.ClientSession() as session:
        for _ in range(n):
            patched.clear()
            readied.clear()
            start = time.perf_counter()
            async with session.post(url + "/v1/chat/completions", json=BODY) as resp:
                assert resp.status == 200, await resp.text()
                while b'"content"' not in await resp.content.readline():
                    pass
                first = time.perf_counter()
                await resp.read()
            extra.append((first - start) - (readied[0] - patched[0]))
            await source.park("bench")
            while w.pods:
                await asyncio.sleep(0.005)
    await runner.cleanup()
    return extra


async def main(ready_n: int, wakes: int) -> dict[str, Any]:
    logging.disable(logging.WARNING)
    kube = FakeKube(start_replica=replica)
    await kube.start_server()
    folder = Path(tempfile.mkdtemp(prefix="bench-kubernetes-"))
    base = {"namespace": "llm", "selector": LABELS, "port": "http", "kubeconfig": kube.kubeconfig(folder / "kubeconfig")}
    results: dict[str, Any] = {}
    try:
        for name, xs in (("ready_to_routable", await ready_to_routable(kube, base, ready_n)),
                         ("wake_overhead", await wake_overhead(kube, base, wakes))):
            results[name] = {"n": len(xs), "median_ms": round(statistics.median(xs) * 1e3, 3), "p99_ms": round(pct(xs, 99) * 1e3, 3)}
    finally:
        await kube.close()
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ready", type=int, default=200)
    parser.add_argument("--wakes", type=int, default=50)
    args = parser.parse_args()
    found = asyncio.run(main(args.ready, args.wakes))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "kubernetes.json").write_text(json.dumps(found, indent=2))
    for name, r in found.items():
        print(f"{name:18} median {r['median_ms']:8.3f} ms   p99 {r['p99_ms']:8.3f} ms   (n={r['n']})")
