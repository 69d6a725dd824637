"""`python -m bench.gateway --affinity`: what prompt-prefix affinity buys on real engine replicas.

Replicas: 2 `streamproxy serve` processes of the tiny model (the 1-layer
random Llama, `engine_adapter.default_model.build_tiny_model()`) with vLLM's
`--enable-prefix-caching`, `-O0`, a small `--max-model-len`,
VLLM_CPU_KVCACHE_SPACE=1 and each engine's worker bound to its own core
(VLLM_CPU_OMP_THREADS_BIND=0 and 1).

Load (bench/loadgen.py, closed loop, `--concurrency` streams): `--tenants`
tenants, each with its own system prompt of about `--system-tokens` tokens
(random words, measured with the model's tokenizer), short user turns,
`max_tokens` 16, `--requests` requests with the tenants interleaved (each
cycle visits every tenant once, in a shuffled order). The same load goes
through the gateway with `policy: round_robin`, with least outstanding only
(`prefix_affinity: false`), and with its default (prefix affinity), and, as
the ceiling, through a gateway in front of one replica alone (every prefix
on the one replica). Each run gets its own system prompts (a salt at their
start), so no run finds the prefixes of the run before in a cache: with
VLLM_CPU_KVCACHE_SPACE=1 each replica has room for far more than one run's
prefixes, so old ones are not evicting new ones either.

Per run: cached-token ratio (sum of usage.prompt_tokens_details.cached_tokens
/ sum of prompt_tokens, from the responses), TTFT p50/p99, tok/s, and how
the requests spread over the replicas (the gateway's /v1/deployments).
Results: bench/results/gateway-affinity-<time>.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import random
import shlex
import shutil
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from . import loadgen, relays
from .compare import _git_rev, model_path
from .servers import RESULTS, SERVED_NAME, Server, stop_on_signals, streamproxy_server

ENGINE_ARGS = "--max-model-len 2048 --max-num-seqs 32 --dtype float32 --enable-prefix-caching -O0"
POLICIES: list[tuple[str, dict[str, Any], int]] = [  # label, the gateway's `upstream:` section, replicas
    ("round robin", {"policy": "round_robin"}, 2),
    ("least outstanding (prefix_affinity: false)", {"prefix_affinity": False}, 2),
    ("prefix affinity (default)", {}, 2),
    ("single replica (ceiling)", {}, 1),
]
WORDS = ("account", "billing", "invoice", "order", "shipment", "refund", "policy", "customer", "support", "ticket",
         "priority", "escalate", "product", "warranty", "return", "exchange", "discount", "coupon", "subscription",
         "renewal", "contract", "region", "language", "holiday", "schedule", "opening", "hours", "manager",
         "approval", "record", "privacy", "consent", "data", "retention", "audit")


def system_prompts(tokenizer, tenants: int, tokens: int, salt: str, seed: int, vocabulary: tuple[str, ...] = WORDS) -> list[str]:
    """One system prompt per tenant, each about `tokens` tokens long, all different from the first token."""
    rng = random.Random(seed)
    prompts = []
    for t in range(tenants):
        words = [f"[{salt}] You are the assistant of tenant {t}. Rules:"]
        while len(tokenizer.encode(" ".join(words))) < tokens:
            words += [rng.choice(vocabulary) for _ in range(20)] + [f"rule-{t}-{len(words)}."]
        prompts.append(" ".join(words))
    return prompts


def requests(prompts: list[str], n: int, max_tokens: int, port: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    out: list[bytes] = []
    cycle = 0
    while len(out) < n:
        order = list(range(len(prompts)))
        rng.shuffle(order)
        for t in order[: n - len(out)]:
            body = loadgen.request_body("chat", SERVED_NAME, max_tokens)
            question = " ".join(rng.choice(WORDS) for _ in range(8))
            body["messages"] = [{"role": "system", "content": prompts[t]},
                                {"role": "user", "content": f"Question {cycle}: what about {question}?"}]
            out.append(loadgen.build_request("127.0.0.1", port, loadgen.endpoint_path("chat"), body))
        cycle += 1
    return out


def _spread(gw: Server) -> dict[str, int]:
    with urllib.request.urlopen(gw.base + "/v1/deployments/dep-bench", timeout=10) as r:
        return {rep["url"]: rep["requests"] for rep in json.load(r)["replicas"]}


def run_policy(gw: Server, raws: list[bytes], concurrency: int) -> dict:
    import uvloop

    before = _spread(gw)
    res = uvloop.run(loadgen.run_load(gw.base, iter(raws).__next__, concurrency, len(raws)))
    s = loadgen.summarize(res)
    after = _spread(gw)
    s["spread"] = {url.rsplit(":", 1)[1]: after[url] - before.get(url, 0) for url in after}
    s["cached_ratio"] = s["cached_tokens"] / s["prompt_tokens"] if s["prompt_tokens"] else float("nan")
    s["prompt_tokens_mean"] = s["prompt_tokens"] / max(s["requests"] - s["errors"], 1)
    return s


def markdown(rows: list[dict], meta: dict) -> str:
    quick = " — QUICK RUN (`--quick`), not a full measurement" if meta.get("quick") else ""
    lines = [f"# Gateway prefix affinity on 2 engine replicas ({meta['when']}){quick}", ""]
    lines += [f"- {k}: {v}" for k, v in meta.items() if k not in ("when", "quick")]
    lines += ["", ("| policy | cached-token ratio | TTFT p50 ms | TTFT p99 ms | out tok/s | prompt tokens/request "
                   "| requests per replica (port: n) | requests | errors |"), "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        spread = ", ".join(f"{p}: {n}" for p, n in r["spread"].items())
        lines.append(f"| {r['policy']} | {r['cached_ratio']:.3f} | {r['ttft_p50_ms']:.1f} | {r['ttft_p99_ms']:.1f} | "
                     f"{r['tok_per_s']:.0f} | {r['prompt_tokens_mean']:.0f} | {spread} | {r['requests']} | "
                     f"{r['errors']} |")
    by = {r["policy"]: r for r in rows}
    rr, aff, one = by.get(POLICIES[0][0]), by.get(POLICIES[2][0]), by.get(POLICIES[3][0])
    lines += ["", "## Targets (issue 13)", "", "| target | measured | met |", "|---|---|---|"]
    if aff and one:
        rel = aff["cached_ratio"] / one["cached_ratio"] if one["cached_ratio"] else float("nan")
        lines.append(f"| affinity's cached-token ratio at least 0.9x the single replica's | {aff['cached_ratio']:.3f} "
                     f"vs {one['cached_ratio']:.3f} ({rel:.2f}x) | {'yes' if rel >= 0.9 else '**no**'} |")
    if aff and rr:
        lines.append(f"| affinity's TTFT p50 better than round robin's | {aff['ttft_p50_ms']:.1f} ms vs "
                     f"{rr['ttft_p50_ms']:.1f} ms | {'yes' if aff['ttft_p50_ms'] < rr['ttft_p50_ms'] else '**no**'} |")
    if meta.get("quick"):
        lines += ["", ("Quick run: few requests, one pass per policy, on a shared 2-core machine; these figures "
                       "validate the harness and are not a verdict.")]
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.gateway --affinity", description=__doc__.split("\n\n")[0])
    ap.add_argument("--tenants", type=int, default=16)
    ap.add_argument("--system-tokens", type=int, default=1500, help="tokens per tenant system prompt (default 1500)")
    ap.add_argument("--requests", type=int, default=320, help="requests per policy (default 320)")
    ap.add_argument("--concurrency", type=int, default=8, help="concurrent streams (default 8)")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--engine-args", default=ENGINE_ARGS, help=f"for both replicas (default {ENGINE_ARGS!r})")
    ap.add_argument("--kv-cache-gib", default="1", help="VLLM_CPU_KVCACHE_SPACE (default 1)")
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument("--quick", action="store_true", help="96 requests per policy")
    args = ap.parse_args(argv)
    if args.quick and "--requests" not in (sys.argv[1:] if argv is None else argv):
        args.requests = 96
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    stop_on_signals()  # Ctrl-C, SIGTERM: the `finally` stops every server
    import uvloop
    from transformers import AutoTokenizer

    model = model_path("tiny")
    tokenizer = AutoTokenizer.from_pretrained(model)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    RESULTS.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="bench-affinity-"))
    eargs = shlex.split(args.engine_args)
    reps = [streamproxy_server(model, eargs, f"gateway-affinity-{stamp}-replica{i}",
                               {"VLLM_CPU_KVCACHE_SPACE": args.kv_cache_gib, "VLLM_CPU_OMP_THREADS_BIND": str(i)})
            for i in range(2)]
    meta = {"when": time.strftime("%Y-%m-%d %H:%M"), "quick": args.quick, "streamproxy": _git_rev(),
            "replicas": f"2 x `streamproxy serve` tiny model, {args.engine_args}, VLLM_CPU_KVCACHE_SPACE="
                        f"{args.kv_cache_gib}, one core each (VLLM_CPU_OMP_THREADS_BIND)",
            "load": f"{args.tenants} tenants, system prompt ~{args.system_tokens} tokens each, short user turns, "
                    f"max_tokens {args.max_tokens}, {args.requests} requests per policy interleaved across "
                    f"tenants, {args.concurrency} concurrent streams, closed loop; fresh prompts per policy"}
    rows: list[dict] = []
    started: list[Server] = []
    try:
        for rep in reps:  # one at a time: they would race for the cores while loading
            rep.start()
            started.append(rep)
            rep.wait_ready()
            print(f"{rep.label} ready on :{rep.port} in {rep.ready_after:.0f} s (log {rep.stdout_path})", flush=True)
        urls = [r.base for r in reps]
        gws = []
        for i, (_label, policy, n) in enumerate(POLICIES):
            gw = relays.gateway_server(urls[:n], f"gateway-affinity-{stamp}", tmp, policy=policy,
                                       label=f"gateway{i}", served=SERVED_NAME)
            gw.start()
            started.append(gw)
            gws.append(gw)
        for gw in gws:
            gw.wait_ready(60)
        for i, rep in enumerate(reps):  # warm each engine up, with prompts no run uses
            warm = requests(system_prompts(tokenizer, 2, args.system_tokens, f"warm{i}", args.seed), 4,
                            args.max_tokens, rep.port, args.seed)
            res = uvloop.run(loadgen.run_load(rep.base, iter(warm).__next__, 2, len(warm)))
            if res.errors:
                raise RuntimeError(f"warm-up of {rep.label} failed: {res.errors[0]}")
        for i, ((label, _, _), gw) in enumerate(zip(POLICIES, gws)):
            prompts = system_prompts(tokenizer, args.tenants, args.system_tokens, f"run{i}-{stamp}", args.seed + i)
            raws = requests(prompts, args.requests, args.max_tokens, gw.port, args.seed + i)
            r = run_policy(gw, raws, args.concurrency)
            r["policy"] = label
            rows.append(r)
            (RESULTS / f"gateway-affinity-{stamp}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
            print(f"{label:>45}: cached {r['cached_ratio']:.3f}  TTFT p50 {r['ttft_p50_ms']:7.1f} ms p99 "
                  f"{r['ttft_p99_ms']:7.1f} ms  {r['tok_per_s']:6.0f} tok/s  spread {r['spread']}  "
                  f"errors {r['errors']}" + (f" ({r['first_error']})" if r["errors"] else ""), flush=True)
    finally:
        for srv in reversed(started):
            srv.stop(30)
        shutil.rmtree(tmp, ignore_errors=True)
    md = markdown(rows, meta)
    md_path = RESULTS / f"gateway-affinity-{stamp}.md"
    md_path.write_text(md + "\n")
    print("\n" + md + f"\n\nwrote {RESULTS / f'gateway-affinity-{stamp}.json'}\n      {md_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
