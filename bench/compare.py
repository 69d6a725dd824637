"""`make bench`: streamproxy against vLLM's own OpenAI server, side by side.

For each model (the 1-layer random Llama, where the serving layer dominates,
and the default SmolLM2-135M), both servers are started on 127.0.0.1 with the
same engine arguments (one after the other, so their torch.compile warm-ups
do not race), warmed up, and then, for each concurrency level, measured in
alternating rounds (vLLM, streamproxy, vLLM, streamproxy, ...) under the same
closed-loop streaming load (bench/loadgen.py: N streams, each request
`max_tokens` output tokens with ignore_eos, fixed prompt, greedy).

Per round: output tokens/s, TTFT and inter-token latency p50/p99, and CPU per
1,000 streamed tokens of the front-end process (the API-server process we
started: /proc/PID/stat utime+stime) and, separately, of its descendants (the
engine core and its worker). Cells are medians over rounds; the ratio row is
streamproxy / vLLM. The idle server of the pair stays up while the other is
measured (its CPU is counted in 'other cores', which also shows whatever else
runs on the machine). Results: bench/results/compare-<time>.{json,md,png}.

`--regime gpu` (`make bench-gpu`): the same rounds on vLLM's engine with a
timed stand-in for the forward pass, with vLLM's Rust front end as a third
server (bench/gpu.py says how); its own defaults and report
(bench/gpu_report.py), results in bench/results/compare-gpu-<time>.*.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from harness.server import wait_workers

from . import gpu, gpu_report, loadgen, procstat, report
from .servers import RESULTS, ROOT, Server, rust_server, stop_on_signals, streamproxy_server, vllm_server

DEFAULT_ENGINE_ARGS = "--max-model-len 1024 --max-num-seqs 256"
# The tiny model exists to make the model nearly free. In bf16 its 256 x 49,152
# lm_head alone kept the worker at ~70 ms per step at 64 streams on a CPU
# without avx512_bf16 (~750 tok/s, engine-bound); float32 was ~3x faster.
DEFAULT_TINY_ARGS = "--dtype float32"


# Request kinds (--kinds): what is added to every request's body. Usage counts every choice's tokens,
# so CPU per token stays comparable; the model column is "<model>/<kind>" for all but plain.
KINDS: dict[str, dict[str, dict[str, Any]]] = {
    "plain": {"chat": {}, "completions": {}},
    "n2": {"chat": {"n": 2, "temperature": 1.0}, "completions": {"n": 2, "temperature": 1.0}},  # n > 1 is not greedy in vLLM
    "logprobs": {"chat": {"logprobs": True, "top_logprobs": 5}, "completions": {"logprobs": 5}},
}


def body(endpoint: str, model: str, max_tokens: int, kind: str) -> dict:
    return {**loadgen.request_body(endpoint, model, max_tokens), **KINDS[kind][endpoint]}


def model_path(name: str) -> str:
    from engine_adapter import default_model

    if name == "tiny":
        return str(default_model.build_tiny_model(progress=True))
    if name in ("smollm2", "default"):
        return str(default_model.ensure_default_model(progress=True))
    return name  # a local folder


def model_label(name: str) -> str:
    return {"default": "smollm2"}.get(name, name.rstrip("/").split("/")[-1])


async def _round(srv: Server, peers: list[Server], conc: int, n_requests: int, raw: bytes) -> dict:
    fe = srv.frontend_pids()  # with --api-server-count N: the parent and its N API servers
    eng = srv.engine_pids()
    core = [p for p in eng if "EngineCore" in procstat.name(p)]
    peer_pids = [p for peer in peers for p in (peer.pid, *procstat.descendants(peer.pid))]
    launcher = [] if srv.pid in fe else [srv.pid]  # the Rust front end's: `vllm serve`'s Python process
    conns = await loadgen.connect_all("127.0.0.1", srv.port, conc, parse=True)
    snap: dict[str, float] = {}
    engine0: dict[str, float] = {}

    def sample() -> dict[str, float]:
        fe_run, fe_wait, _ = procstat.tree_sched(fe)
        vol, invol = procstat.tree_switches(fe)
        return {"fe": procstat.tree_cpu_seconds(fe), "eng": procstat.tree_cpu_seconds(eng),
                "core": procstat.tree_cpu_seconds(core),
                "peer": procstat.tree_cpu_seconds(peer_pids), "sys": procstat.system_busy_seconds(),
                "steal": procstat.steal_seconds(), "fe_wait": fe_wait / 1e9, "fe_vol": vol, "fe_invol": invol,
                "fe_writes": procstat.tree_write_calls(fe), "launcher": procstat.tree_cpu_seconds(launcher)}

    def on_start() -> None:
        snap.update(sample())
        engine0.update(gpu.engine_snapshot(srv.env))

    try:
        res = await loadgen.run_load(srv.base, raw, conc, n_requests, conns=conns, on_start=on_start)
    finally:
        loadgen.close_all(conns)
    end = sample()
    engine1 = gpu.engine_snapshot(srv.env)
    s = loadgen.summarize(res)
    d = {k: end[k] - snap[k] for k in end}
    tokens = max(s["tokens"], 1)
    s.update({
        "fe_cpu_s": d["fe"], "engine_cpu_s": d["eng"], "peer_cpu_s": d["peer"],
        "fe_cpu_ms_per_1k": d["fe"] / tokens * 1e6,
        "engine_cpu_ms_per_1k": d["eng"] / tokens * 1e6,
        "engine_core_only_ms_per_1k": d["core"] / tokens * 1e6,
        "worker_ms_per_1k": (d["eng"] - d["core"]) / tokens * 1e6,
        "fe_cores": d["fe"] / res.wall, "engine_cores": d["eng"] / res.wall,
        "other_cores": max(0.0, d["sys"] - d["fe"] - d["eng"] - res.client_cpu) / res.wall,
        "peer_cores": d["peer"] / res.wall,
        "client_cores": res.client_cpu / res.wall,
        # Why a round is slow: the front end kept off the CPU while runnable (run-queue wait), its
        # wake-ups (voluntary switches), preemptions (involuntary), socket writes, and the
        # hypervisor's steal, per 1,000 tokens or in cores.
        "fe_wait_ms_per_1k": d["fe_wait"] / tokens * 1e6,
        "fe_wakeups_per_1k": d["fe_vol"] / tokens * 1e3,
        "fe_preempted_per_1k": d["fe_invol"] / tokens * 1e3,
        "fe_writes_per_1k": d["fe_writes"] / tokens * 1e3,
        "steal_cores": d["steal"] / res.wall,
        "launcher_cpu_ms_per_1k": d["launcher"] / tokens * 1e6,
        **gpu.engine_delta(engine0, engine1, res.wall),  # the stand-in engine's figures (gpu regime), else none
    })
    return s


def run_round(srv: Server, peers: list[Server], conc: int, n_requests: int, raw: bytes) -> dict:
    import uvloop

    return uvloop.run(_round(srv, peers, conc, n_requests, raw))


def warm_up(srv: Server, conc: int, endpoint: str, model: str, kind: str = "plain") -> None:
    import uvloop

    raw = loadgen.build_request("127.0.0.1", srv.port, loadgen.endpoint_path(endpoint), body(endpoint, model, 16, kind))
    res = uvloop.run(loadgen.run_load(srv.base, raw, conc, conc))
    if res.errors:
        raise RuntimeError(f"{srv.label} warm-up failed: {res.errors[0]}")


def _git_rev() -> str:
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                             text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True).stdout.strip()
        return rev + ("+dirty" if dirty else "")
    except OSError:
        return "?"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.compare", description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="tiny",
                    help="comma-separated: tiny, smollm2, or model folders (default: tiny)")
    ap.add_argument("--levels", default="64,256", help="concurrency levels (default 64,256)")
    ap.add_argument("--rounds", type=int, default=20,
                    help="rounds per server and level (default 20: this machine's rounds swing by 5x, "
                         "so fewer say little)")
    ap.add_argument("--max-tokens", type=int, default=128, help="output tokens per request (default 128)")
    ap.add_argument("--per-stream", type=int, default=3,
                    help="requests per stream and round (closed loop; default 3)")
    ap.add_argument("--chrt", type=int, default=0, metavar="PRIO",
                    help="run both servers and the load generator under SCHED_FIFO at this priority (root): "
                         "isolates the front end's own cost from the scheduler's; every figure is labelled so. "
                         "Default 0: normal scheduling, the way users run")
    ap.add_argument("--min-requests", type=int, default=16,
                    help="at least this many requests per round (for low concurrency; default 16)")
    ap.add_argument("--endpoint", choices=["chat", "completions"], default="chat")
    ap.add_argument("--engine-args", default=DEFAULT_ENGINE_ARGS,
                    help=f"engine flags given to both servers (default {DEFAULT_ENGINE_ARGS!r})")
    ap.add_argument("--tiny-engine-args", default=DEFAULT_TINY_ARGS,
                    help=f"added for the tiny model only (default {DEFAULT_TINY_ARGS!r})")
    ap.add_argument("--kv-cache-gib", default="2", help="VLLM_CPU_KVCACHE_SPACE for both (default 2)")
    ap.add_argument("--servers", default="vllm,streamproxy", help="which to run (default both)")
    ap.add_argument("--api-server-count", default="1", metavar="N,N",
                    help="streamproxy with `--api-server-count N` for each N (default 1); N > 1 is labelled "
                         "streamproxy-nN and measured in the same alternating rounds")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=FLAGS",
                    help="also run streamproxy with these extra flags, as the server 'streamproxy-NAME', in the same "
                         "alternating rounds (e.g. nopush=--no-stream-push); repeatable")
    ap.add_argument("--kinds", default="plain",
                    help=f"comma-separated request kinds, each measured in its own alternating rounds: "
                         f"{', '.join(KINDS)} (default plain)")
    ap.add_argument("--baseline", metavar="DIR",
                    help="also run streamproxy from this source tree (e.g. `git archive` of an older commit), "
                         "as the server 'streamproxy-base', in the same alternating rounds")
    ap.add_argument("--quick", action="store_true",
                    help="tiny model, c=64 and 256, 2 rounds (gpu regime: 1), 1 request per stream")
    ap.add_argument("--regime", choices=["cpu", "gpu"], default="cpu",
                    help="cpu: the engine on this CPU (default); gpu: vLLM's engine core with a timed stand-in for "
                         "the forward pass (bench/standin.py), vLLM's Rust front end as a third server, and its own "
                         "defaults: levels 64,256,1024, 5 rounds, 3 requests per stream, "
                         f"engine args {gpu.ENGINE_ARGS!r} (bench/gpu.py)")
    ap.add_argument("--base-ms", type=float, default=gpu.StepModel.base_ms,
                    help="gpu regime: a step's fixed time, ms (default %(default)s)")
    ap.add_argument("--us-per-seq", type=float, default=gpu.StepModel.us_per_seq,
                    help="gpu regime: a step's time per request in it, µs (default %(default)s)")
    ap.add_argument("--prefill-us", type=float, default=gpu.StepModel.prefill_us,
                    help="gpu regime: a step's time per prompt token it computes, µs (default %(default)s)")
    ap.add_argument("--vllm-wheel", metavar="WHL",
                    help="gpu regime: take vLLM's Rust front end out of this GPU wheel (default: the cached binary, "
                         "else `pip download --no-deps vllm==<installed version>`)")
    given = set()
    for a in (sys.argv[1:] if argv is None else argv):
        given.add(a.split("=", 1)[0])
    args = ap.parse_args(argv)
    presets: list[tuple[str, str, Any]] = list(gpu.DEFAULTS) if args.regime == "gpu" else []
    if args.quick:
        presets += [("--models", "models", "tiny"), ("--levels", "levels", "64,256"), ("--rounds", "rounds", 2),
                    ("--per-stream", "per_stream", 1)]
        presets += gpu.QUICK if args.regime == "gpu" else []
    for flag, attr, value in presets:  # defaults only: flags given explicitly still win; later presets win
        if flag not in given:
            setattr(args, attr, value)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    stop_on_signals()  # Ctrl-C, SIGTERM: the `finally` stops every server (sys.exit in a handler could be lost in a round)
    levels = [int(x) for x in args.levels.split(",") if x]
    models = [m for m in args.models.split(",") if m]
    which = [s for s in args.servers.split(",") if s]
    kinds = [k for k in args.kinds.split(",") if k]
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise SystemExit(f"unknown --kinds {', '.join(unknown)} (known: {', '.join(KINDS)})")
    engine_args = shlex.split(args.engine_args)
    if args.chrt:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(args.chrt))
    env = {"VLLM_CPU_KVCACHE_SPACE": args.kv_cache_gib}
    stamp = time.strftime("%Y%m%d-%H%M%S")
    RESULTS.mkdir(parents=True, exist_ok=True)
    regime = gpu.Regime(args, stamp, RESULTS / "logs", ROOT) if args.regime == "gpu" else None
    rust = regime.rust_binary() if regime and "vllm-rust" in which else None
    meta = {
        "when": time.strftime("%Y-%m-%d %H:%M"),
        "machine": f"{platform.machine()}, {procstat.os.cpu_count()} cores",
        "vllm": _version("vllm-cpu") or _version("vllm"),
        "streamproxy": _git_rev(),
        "engine args (both)" if not regime else "engine args (every server)":
            " ".join(engine_args) + (f" (tiny model: + {args.tiny_engine_args})" if args.tiny_engine_args else "")
            + f", VLLM_CPU_KVCACHE_SPACE={args.kv_cache_gib}",
        "scheduling": (f"SCHED_FIFO (chrt -f {args.chrt}) for both servers and the load generator: the front "
                       f"end's own cost, not how users run") if args.chrt else "normal (no chrt), as users run",
        "load": f"{args.endpoint}, stream, {args.max_tokens} tokens/request, ignore_eos, greedy, "
                f"{args.per_stream} request(s) per stream per round (min {args.min_requests}), "
                f"{args.rounds} rounds, kinds {', '.join(kinds)}",
        **({"baseline (streamproxy-base)": args.baseline} if args.baseline else {}),
        **(regime.meta(rust) if regime else {}),
    }
    rows: list[dict] = []
    name_stem = f"compare-gpu-{stamp}" if regime else f"compare-{stamp}"
    json_path = RESULTS / f"{name_stem}.json"

    def save() -> None:
        json_path.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))

    for name in models:
        path, label = model_path(name), model_label(name)
        shown = f"{label}, {gpu.LABEL}" if regime else label  # the model column: every gpu-regime row is labelled

        def env_for(server: str, label: str = label) -> dict[str, str]:  # the gpu regime: the step model, a stats file per server
            return {**env, **regime.env(f"{label}-{server}")} if regime else env

        margs = engine_args + (shlex.split(args.tiny_engine_args) if name == "tiny" else [])
        srvs: list[Server] = []
        if "vllm" in which:
            srvs.append(vllm_server(path, margs, f"{stamp}-{label}", env_for("vllm")))
        if isinstance(rust, Path):
            srvs.append(rust_server(path, margs, f"{stamp}-{label}", env_for("vllm-rust"), rust))
        if args.baseline:
            base = streamproxy_server(path, margs, f"{stamp}-{label}-base",
                                      {**env_for("streamproxy-base"), "PYTHONPATH": args.baseline})
            base.label, base.cwd = "streamproxy-base", args.baseline
            srvs.append(base)
        for variant in args.variant:
            name, _, flags = variant.partition("=")
            srvs.append(streamproxy_server(path, margs, f"{stamp}-{label}-{name}", env_for(f"streamproxy-{name}"),
                                           shlex.split(flags), label=f"streamproxy-{name}"))
        if "streamproxy" in which:
            for count in [int(x) for x in args.api_server_count.split(",") if x]:
                extra, tag = (["--api-server-count", str(count)], f"streamproxy-n{count}") if count != 1 else ([], "streamproxy")
                srvs.append(streamproxy_server(path, margs, f"{stamp}-{label}", env_for(tag), extra, label=tag))
        for srv in srvs:
            srv.fifo(args.chrt)
        try:
            for srv in srvs:  # one at a time: no racing compile caches, cleaner start-up
                print(f"[{label}] starting {srv.label} on :{srv.port} (log {srv.stdout_path})", flush=True)
                srv.start()
                srv.wait_ready()
                if srv.label.startswith("streamproxy-n") and srv.label[13:].isdigit():
                    wait_workers(srv, int(srv.label.removeprefix("streamproxy-n")), 300)
                print(f"[{label}] {srv.label} ready in {srv.ready_after:.0f} s; front end pid {srv.pid}, "
                      f"engine core pid {srv.engine_core_pid()}", flush=True)
                warm_up(srv, 4, args.endpoint, srv.model_id())
                if regime:  # an engine that answers anything else would make the figures meaningless
                    why = gpu.check_answer(srv.base, srv.model_id())
                    if why:
                        raise RuntimeError(f"{srv.label}: the {gpu.LABEL}'s answer is wrong: {why}")
                    print(f"[{label}] {srv.label} answers the {gpu.LABEL}'s text, detokenized whole, ended by EOS",
                          flush=True)
            model_ids = {srv.label: srv.model_id() for srv in srvs}
            for conc, kind in [(c, k) for c in levels for k in kinds]:
                n_requests = max(conc * args.per_stream, args.min_requests)
                tag = shown if kind == "plain" else f"{shown}/{kind}"
                choices = KINDS[kind][args.endpoint].get("n", 1)
                for srv in srvs:
                    warm_up(srv, conc, args.endpoint, model_ids[srv.label], kind)
                for rnd in range(args.rounds):
                    for srv in srvs:
                        peers = [p for p in srvs if p is not srv]
                        raw = loadgen.build_request("127.0.0.1", srv.port, loadgen.endpoint_path(args.endpoint),
                                                    body(args.endpoint, model_ids[srv.label], args.max_tokens, kind))
                        r = run_round(srv, peers, conc, n_requests, raw)
                        r.update(model=tag, concurrency=conc, server=srv.label, round=rnd + 1)
                        rows.append(r)
                        save()
                        expected = r["requests"] * args.max_tokens * choices
                        short = "" if r["tokens"] == expected else f" (expected {expected} tokens)"
                        print(f"[{tag}] c={conc} round {rnd + 1} {srv.label:>16}: {r['tok_per_s']:7.0f} tok/s  "
                              f"TTFT p50 {r['ttft_p50_ms']:7.1f} ms  ITL p50 {r['itl_p50_ms']:6.1f} ms  "
                              f"front end {r['fe_cpu_ms_per_1k']:6.1f} ms/1k tok  engine "
                              f"{r['engine_cpu_ms_per_1k']:6.1f} ms/1k (core {r['engine_core_only_ms_per_1k']:.0f})  "
                              f"client {r['client_cores']:.2f} other {r['other_cores']:.2f} cores  "
                              f"fe wait {r['fe_wait_ms_per_1k']:.1f} ms/1k  writes {r['fe_writes_per_1k']:.0f}/1k  "
                              f"wake-ups {r['fe_wakeups_per_1k']:.0f}/1k  preempted {r['fe_preempted_per_1k']:.0f}/1k  "
                              f"steal {r['steal_cores']:.2f}  errors {r['errors']}{short}"
                              + (f"  stand-in engine: {r['engine_steps_per_s']:.0f} steps/s, "
                                 f"{r['engine_batch_mean']:.0f} requests/step, busy {r['engine_busy']:.2f}"
                                 if "engine_batch_mean" in r else ""), flush=True)
                        if r["errors"]:
                            print(f"    first error: {r['first_error']}", flush=True)
        finally:
            for srv in srvs:
                srv.stop()
    md = gpu_report.markdown(rows, meta) if regime else report.markdown(rows, meta)
    md_path = RESULTS / f"{name_stem}.md"
    md_path.write_text(md + "\n")
    png_path = RESULTS / f"{name_stem}.png"
    try:
        report.chart(rows, png_path, gpu_report.CHART_TITLE if regime else report.CHART_TITLE)
    except ImportError:
        png_path = None  # type: ignore[assignment]
        print("matplotlib is missing (pip install -e '.[bench]'): no chart", file=sys.stderr)
    print()
    print(md)
    print(f"\nwrote {json_path}\n      {md_path}" + (f"\n      {png_path}" if png_path else ""))
    return 0


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


if __name__ == "__main__":
    sys.exit(main())
