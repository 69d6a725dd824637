"""`make bench-gateway BENCH_ARGS="--kv-pressure"` / `"--fairness"`: issue 35's two benchmarks.

Replicas: `--replicas` `streamproxy serve` processes of `--model` (the
default model; `tiny` for a smoke run) with vLLM's prefix caching, each
publishing KV-cache events (`--kv-events-config`, its PUB and replay ROUTER
bound on loopback ports so that any number of gateways can subscribe).

--kv-pressure: each replica's KV cache capped (`--num-gpu-blocks-override`,
default: `--cache-share` 0.3 of all tenants' shared prefixes, in blocks),
`--tenants` tenants with system prompts of about `--system-tokens` tokens and
short user turns, Poisson arrivals at `--rate` requests/s (open loop),
tenants uniform or Zipf-skewed (`--zipf S`). The peers, in the same run, each
in front of the same replicas with fresh prompts (a salt at their start, so
no peer finds another's prefixes) and the same arrival times and tenant sequence: round robin, our rendezvous affinity
(today's default), KV-event routing (`kv_events:`), and `vllm-router`
(`--vllm-router PATH`: its `round_robin`, `cache_aware` and `kv_aware`
policies, the last on the same events) when given. `--restart-mid`: replica 0 restarted halfway through each peer's
run (its cache wiped); `--gateways 2`: two gateways of each peer sharing
nothing, the requests alternating. Per peer: cached-prompt-token ratio
(usage.prompt_tokens_details.cached_tokens / prompt_tokens), TTFT p50 and
p90, errors.

--fairness: bench/fairness.py (its arguments below too): two tenants on
saturated replicas (fake ones with a fixed concurrency by default), the light
one alone, both first come first served, both with flow control, and a flood
in a low band beside a high band, in rounds.

`--smoke`: a tiny size that checks the harness, not a measurement.
Results: bench/results/gateway-<kv-pressure|fairness>-<time>.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import shlex
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness.process import free_port

from . import affinity, fairness
from .compare import _git_rev, model_path
from .servers import RESULTS, SERVED_NAME, Server, stop_on_signals, streamproxy_server

ENGINE_ARGS = "--max-model-len 4096 --dtype float32 --enable-prefix-caching -O0"
WORDS = ("account", "billing", "invoice", "order", "shipment", "refund", "policy", "customer", "support", "ticket",
         "warranty", "return", "exchange", "discount", "coupon", "subscription", "renewal", "contract", "region")


@dataclass
class Replica:
    server: Server
    pub: str  # tcp://127.0.0.1:P (the replica binds tcp://*:P)
    replay: str


@dataclass
class Outcome:
    tenant: str
    status: int
    ttft: float | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    retry_after: str | None = None
    error: str = ""
    at: float = 0.0  # its arrival, s from the run's start
    first: bool = False  # its tenant's first request in the run (a miss wherever it goes)


@dataclass
class Peer:
    label: str
    servers: list[Server]  # its gateway(s) or router(s), requests alternate between them
    outcomes: list[Outcome] = field(default_factory=list)


def replica(model: str, engine_args: list[str], tag: str, i: int, extra: list[str]) -> Replica:
    pub_port, replay_port = free_port(), free_port()
    config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{pub_port}",
              "replay_endpoint": f"tcp://*:{replay_port}"}
    server = streamproxy_server(model, [*engine_args, *extra, "--kv-events-config", json.dumps(config)], tag,
                                {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": str(i)}, label=f"replica{i}")
    return Replica(server, f"tcp://127.0.0.1:{pub_port}", f"tcp://127.0.0.1:{replay_port}")


def gateway(label: str, reps: list[Replica], tmp: Path, tag: str, *, upstream: dict[str, Any] | None = None,
            kv: bool = False, flow: dict[str, Any] | None = None, keys: list[dict[str, Any]] | None = None,
            debug: bool = False) -> Server:
    port = free_port()
    deployment: dict[str, Any] = {"name": SERVED_NAME, "id": "dep-bench", "upstreams": [r.server.base for r in reps]}
    if kv:
        deployment["kv_events"] = {"replicas": {r.server.base: {"endpoint": r.pub, "replay_endpoint": r.replay} for r in reps}}
    if flow:
        deployment["flow_control"] = flow
    config = {"host": "127.0.0.1", "port": port, "deployments": [deployment], "upstream": upstream or {},
              "keys": keys or [], "ledger": "off", "access_log": "off"}
    path = tmp / f"{label}.yaml"
    path.write_text(json.dumps(config, indent=1))
    return Server(label, [sys.executable, "-m", "streamproxy", "gateway", "--config", str(path), *(["--log-level", "debug"] if debug else [])], port,
                  RESULTS / "logs" / f"{tag}-{label}.log")


def router(label: str, binary: str, reps: list[Replica], policy: str, tag: str, block_size: int) -> Server:
    port = free_port()
    cmd = [binary, "--host", "127.0.0.1", "--port", str(port), "--policy", policy, "--prometheus-port", str(free_port()),
           "--worker-urls", *[r.server.base for r in reps]]
    if policy == "kv_aware":  # its own subscription to the same replicas' events
        for r in reps:
            cmd += ["--kv-event-source", f"{r.server.base}={r.pub}", "--kv-event-replay-source", f"{r.server.base}={r.replay}"]
        cmd += ["--kv-event-block-size", str(block_size), "--kv-event-model", SERVED_NAME]
    return Server(label, cmd, port, RESULTS / "logs" / f"{tag}-{label}.log")


def system_prompts(tokenizer: Any, tenants: int, tokens: int, salt: str, seed: int) -> list[str]:
    return affinity.system_prompts(tokenizer, tenants, tokens, salt, seed, WORDS)


async def one(session: Any, url: str, tenant: str, body: dict[str, Any], headers: dict[str, str]) -> Outcome:
    """A streamed chat completion: TTFT (the first content chunk), usage from the last chunk."""
    began = time.perf_counter()
    out = Outcome(tenant, 0)
    done = False
    try:
        async with session.post(url + "/v1/chat/completions", json=body, headers=headers) as resp:
            out.status = resp.status
            if resp.status != 200:
                out.retry_after = resp.headers.get("Retry-After")
                out.error = (await resp.text())[:200]
                return out
            async for line in resp.content:
                if line.startswith(b"data: [DONE]"):
                    done = True
                if not line.startswith(b"data: ") or done:
                    continue
                chunk = json.loads(line[6:])
                choices = chunk.get("choices")
                if out.ttft is None and choices and (choices[0].get("delta") or {}).get("content"):
                    out.ttft = time.perf_counter() - began  # the first content, not the role chunk serve sends first
                usage = chunk.get("usage")
                if usage:
                    out.prompt_tokens = usage.get("prompt_tokens") or 0
                    out.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        if not done:
            out.error = "the stream ended without [DONE]"
    except Exception as exc:  # a benchmark counts what went wrong, and goes on
        out.error = f"{type(exc).__name__}: {exc}"
    return out


def body(system: str, question: str, max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {"model": SERVED_NAME, "stream": True, "stream_options": {"include_usage": True}, "max_tokens": max_tokens,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}], **extra}


async def open_loop(peer: Peer, arrivals: list[tuple[float, str, dict[str, Any], dict[str, str]]],
                    midway: Any = None) -> None:
    """Each request at its arrival time (s from now), whatever the others do; `midway()` at half time."""
    import aiohttp

    # (no bound on connections: aiohttp's default of 100 would queue requests in the client, unmeasured)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900), connector=aiohttp.TCPConnector(limit=0)) as session:
        start = time.perf_counter()
        tasks = []
        half = arrivals[len(arrivals) // 2][0] if arrivals else 0.0
        mid_task = None
        for i, (at, tenant, b, headers) in enumerate(arrivals):
            delay = at - (time.perf_counter() - start)
            if delay > 0:
                await asyncio.sleep(delay)
            if midway is not None and mid_task is None and at >= half:
                mid_task = asyncio.ensure_future(asyncio.to_thread(midway))
            url = peer.servers[i % len(peer.servers)].base
            tasks.append(asyncio.ensure_future(one(session, url, tenant, b, headers)))
        peer.outcomes = list(await asyncio.gather(*tasks))
        seen: set[str] = set()
        for (at, tenant, _, _), o in zip(arrivals, peer.outcomes, strict=True):
            o.at, o.first = at, tenant not in seen
            seen.add(tenant)
        if mid_task is not None:
            await mid_task


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def summary(outcomes: list[Outcome]) -> dict[str, Any]:
    ok = [o for o in outcomes if o.status == 200 and not o.error]
    ttft = [o.ttft for o in ok if o.ttft is not None]
    prompt = sum(o.prompt_tokens for o in ok)
    return {"requests": len(outcomes), "ok": len(ok), "refused_429": sum(1 for o in outcomes if o.status == 429),
            "refused_without_retry_after": sum(1 for o in outcomes if o.status == 429 and not o.retry_after),
            "errors": sum(1 for o in outcomes if o.status not in (200, 429) or (o.status == 200 and o.error)),
            "first_error": next((o.error for o in outcomes if o.error and o.status != 429), ""),
            "cached_ratio": sum(o.cached_tokens for o in ok) / prompt if prompt else float("nan"),
            "ttft_p50_ms": pct(ttft, 0.5) * 1e3, "ttft_p90_ms": pct(ttft, 0.9) * 1e3,
            # the same without each tenant's first request: a cold prefix, a miss for every router alike
            "ttft_p90_after_first_ms": pct([o.ttft for o in ok if o.ttft is not None and not o.first], 0.9) * 1e3,
            "first_requests": sum(1 for o in outcomes if o.first)}


def routing_decisions(servers: list[Server]) -> dict[str, float]:
    """Our gateways' choices by what decided them (kv_events, affinity), from their /metrics."""
    import urllib.request

    out: dict[str, float] = {}
    for s in servers:
        try:
            with urllib.request.urlopen(s.base + "/metrics", timeout=10) as r:
                text = r.read().decode()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith("streamproxy_gateway_kv_routing_decisions_total{"):
                by = line.split('by="', 1)[1].split('"', 1)[0]
                out[by] = out.get(by, 0.0) + float(line.rsplit(" ", 1)[1])
            elif line.startswith("streamproxy_gateway_kv_predicted_cached_tokens_total{"):
                out["predicted_cached_tokens"] = out.get("predicted_cached_tokens", 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def poisson(n: int, rate: float, rng: random.Random) -> list[float]:
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(t)
    return out


def zipf_weights(n: int, s: float) -> list[float]:
    return [1.0 / (k + 1) ** s for k in range(n)] if s > 0 else [1.0] * n


# -- the two benchmarks -----------------------------------------------------------------------


def kv_pressure(args: argparse.Namespace, tokenizer: Any, reps: list[Replica], tmp: Path, tag: str,
                started: list[Server]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    import uvloop

    peers: list[tuple[str, list[Server]]] = []
    for label, kw in (("round robin", {"upstream": {"policy": "round_robin"}}), ("our affinity", {}),
                      ("KV events", {"kv": True, "debug": args.debug_kv})):
        peers.append((label, [gateway(f"gw-{label.replace(' ', '-')}-{g}", reps, tmp, tag, **kw) for g in range(args.gateways)]))
    if args.vllm_router:
        for policy in ("round_robin", "cache_aware", "kv_aware"):
            peers.append((f"vllm-router {policy}", [router(f"vllm-router-{policy}-{g}", args.vllm_router, reps, policy, tag,
                                                           args.block_size) for g in range(args.gateways)]))
    rows = []
    for label, servers in peers:
        if args.peers and label not in args.peers.split(","):
            continue
        try:  # one peer at a time: the others' processes would take the cores from it
            for s in servers:
                s.start()
                started.append(s)
            for s in servers:
                s.wait_ready(120)
        except RuntimeError as exc:
            print(f"{label}: did not start: {str(exc)[-300:]}", flush=True)
            rows.append({"peer": label, **summary([]), "first_error": f"did not start: {str(exc)[:200]}"})
            for s in servers:
                s.stop(10)
            continue
        rng = random.Random(args.seed)  # every peer the same arrivals and tenants; its own prompts (the salt)
        prompts = system_prompts(tokenizer, args.tenants, args.system_tokens, f"{label}-{tag}", args.seed)
        weights = zipf_weights(args.tenants, args.zipf)
        arrivals: list[tuple[float, str, dict[str, Any], dict[str, str]]] = []
        for n, at in enumerate(poisson(args.requests, args.rate, rng)):
            t = rng.choices(range(args.tenants), weights)[0]
            arrivals.append((at, f"t{t}", body(prompts[t], f"Question {n}: {rng.choice(WORDS)}?", args.max_tokens), {}))

        def restart() -> None:
            reps[0].server.stop(30)
            reps[0].server.start()
            reps[0].server.wait_ready()

        peer = Peer(label, servers)
        uvloop.run(open_loop(peer, arrivals, restart if args.restart_mid else None))
        decided = routing_decisions(servers) if not label.startswith("vllm-router") else {}
        for s in servers:
            s.stop(30)
        row = {"peer": label, **summary(peer.outcomes), "decisions": decided,
               "reported_cached_tokens": sum(o.cached_tokens for o in peer.outcomes),
               "outcomes": [asdict(o) for o in peer.outcomes]}
        rows.append(row)
        print(f"{label:>26}: cached {row['cached_ratio']:.3f}  TTFT p50 {row['ttft_p50_ms']:8.1f} ms  p90 "
              f"{row['ttft_p90_ms']:8.1f} ms (after each tenant's first {row['ttft_p90_after_first_ms']:8.1f} ms)  ok {row['ok']}/{row['requests']}  errors {row['errors']} {row['first_error']}"
              f"  decided by {decided}  reported cached tokens {row['reported_cached_tokens']}", flush=True)
    return rows, {}


def markdown(kind: str, rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    smoke = " — SMOKE RUN (`--smoke`): checks the harness, not a measurement" if meta.get("smoke") else ""
    lines = [f"# Gateway {kind} ({meta['when']}){smoke}", ""] + [f"- {k}: {v}" for k, v in meta.items() if k not in ("when", "smoke")]
    first = "peer" if kind == "kv-pressure" else "phase"
    cols = [first] + ([] if kind == "kv-pressure" else ["tenant"]) + ["cached_ratio", "ttft_p50_ms", "ttft_p90_ms"] + (
        ["ttft_p90_after_first_ms"] if kind == "kv-pressure" else []) + ["ok", "requests", "refused_429", "errors"]
    lines += ["", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(f"{r[c]:.3f}" if isinstance(r[c], float) and c == "cached_ratio" else
                                       f"{r[c]:.1f}" if isinstance(r[c], float) else str(r[c]) for c in cols) + " |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.gateway --kv-pressure|--fairness", description=__doc__.split("\n\n")[0])
    ap.add_argument("--kv-pressure", action="store_true")
    ap.add_argument("--fairness", action="store_true")
    ap.add_argument("--model", default="default", help="default (SmolLM2-135M-Instruct), tiny, or a folder")
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--engine-args", default=ENGINE_ARGS)
    ap.add_argument("--block-size", type=int, default=32, help="vLLM's --block-size for the replicas (its CPU backend: a multiple of 32)")
    ap.add_argument("--tenants", type=int, default=16)
    ap.add_argument("--system-tokens", type=int, default=1500)
    ap.add_argument("--cache-share", type=float, default=0.3, help="each replica's KV cache: this share of all prefixes")
    ap.add_argument("--rate", type=float, default=0.7, help="requests/s (Poisson)")
    ap.add_argument("--requests", type=int, default=320, help="kv-pressure: requests per peer")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--zipf", type=float, default=0.0, help="tenant popularity skew (0: uniform)")
    ap.add_argument("--restart-mid", action="store_true", help="restart replica 0 halfway through each peer's run")
    ap.add_argument("--gateways", type=int, default=1, help="gateways per peer, sharing nothing (requests alternate)")
    ap.add_argument("--vllm-router", default=shutil.which("vllm-router"), help="vllm-router's binary (default: on PATH)")
    ap.add_argument("--peers", default="", help="kv-pressure: only these peers (comma-separated labels, e.g. 'KV events,our affinity')")
    ap.add_argument("--debug-kv", action="store_true",
                    help="kv-pressure: the KV-events gateways log each choice (cached prefix and load per replica) and each "
                         "request's predicted against reported cached tokens (DEBUG, in their logs)")
    ap.add_argument("--max-num-seqs", type=int, default=4, help="fairness: each replica's batch (its saturation)")
    ap.add_argument("--heavy-ratio", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=35)
    fairness.add_arguments(ap)
    ap.add_argument("--smoke", action="store_true", help="a tiny run: tiny model, 2 replicas, few short requests")
    args = ap.parse_args(argv)
    if args.kv_pressure == args.fairness:
        ap.error("give one of --kv-pressure and --fairness")
    if args.smoke and args.fairness:
        args.model, args.replicas, args.rounds, args.seconds = "tiny", 2, 1, 4.0
    elif args.smoke:
        args.model, args.replicas, args.tenants, args.system_tokens, args.requests = "tiny", 2, 4, 128, 12
        args.rate, args.max_tokens = 4.0, 4
        if args.engine_args == ENGINE_ARGS:
            args.engine_args = ENGINE_ARGS.replace("--max-model-len 4096", "--max-model-len 256")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    stop_on_signals()
    if args.fairness:
        return fairness.run(args)
    from transformers import AutoTokenizer

    kind = "kv-pressure"
    model = model_path(args.model)
    tokenizer = AutoTokenizer.from_pretrained(model)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    tag = f"gateway-{kind}-{stamp}"
    RESULTS.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"bench-{kind}-"))
    # (vLLM wants room for one request of --max-model-len at least)
    max_len = int(shlex.split(args.engine_args)[shlex.split(args.engine_args).index("--max-model-len") + 1]) \
        if "--max-model-len" in args.engine_args else 4096
    blocks = max(math.ceil(max_len / args.block_size) + 1, math.ceil(args.cache_share * args.tenants * args.system_tokens / args.block_size))
    extra = ["--block-size", str(args.block_size), "--num-gpu-blocks-override", str(blocks)]
    reps = [replica(model, shlex.split(args.engine_args), tag, i, extra) for i in range(args.replicas)]
    meta = {"when": time.strftime("%Y-%m-%d %H:%M"), "smoke": args.smoke, "streamproxy": _git_rev(),
            "replicas": f"{args.replicas} x `streamproxy serve` {args.model}, {args.engine_args} {' '.join(extra)}, KV events on",
            "load": (f"{args.tenants} tenants, ~{args.system_tokens}-token system prompts, Poisson {args.rate}/s, "
                     f"{args.requests} requests per peer, max_tokens {args.max_tokens}, zipf {args.zipf}, "
                     f"restart mid-run {args.restart_mid}, gateways per peer {args.gateways}")}
    started: list[Server] = []
    rows: list[dict[str, Any]] = []
    try:
        for r in reps:  # one at a time: they would race for the cores while loading
            r.server.start()
            started.append(r.server)
            r.server.wait_ready()
            print(f"{r.server.label} ready on :{r.server.port} in {r.server.ready_after:.0f} s", flush=True)
        rows, _ = kv_pressure(args, tokenizer, reps, tmp, tag, started)
    finally:
        for s in reversed(started):
            s.stop(30)
        shutil.rmtree(tmp, ignore_errors=True)
    (RESULTS / f"{tag}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    md = markdown(kind, rows, meta)
    (RESULTS / f"{tag}.md").write_text(md + "\n")
    print("\n" + md + f"\n\nwrote {RESULTS / f'{tag}.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
