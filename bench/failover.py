"""`python -m bench.failover`: a stream outlives its replica (issue 36, docs/gateway.md "Stream migration").

Three replicas of the default model (SmolLM2-135M-Instruct), each vLLM's own OpenAI server
(`python -m vllm.entrypoints.openai.api_server`: it honors `return_token_ids` and token-id
prompts), each engine's worker on core i % 2, behind one `streamproxy gateway` (round robin,
`migration:` at its defaults but `--idle-timeout`). Load: `--streams` greedy streams at once
(chat and completions in turn, a prompt of its own each), `max_tokens` `--max-tokens`,
`ignore_eos`, `return_token_ids` asked by the client (so it can check the ids it reads) and
usage. The same streams run twice: unbroken (the reference), then with replica 0 broken once
every stream read its first token and the furthest one `--at` of its tokens (`--mode`), so that
every stream is under way whichever replica is quickest (a share of all tokens, as before, let a
quick replica 0 finish its streams first):

  - kill: replica 0's process group SIGKILLed (front end and engine);
  - reset / stall / error: replica 0 behind harness/fault_proxy.py, which then resets every
    connection, stops sending without closing (the gateway's bound: `stream_idle_timeout`),
    or ends every stream under way with vLLM's in-band engine error.

Per stream the client keeps the ids, text, finish reason, usage, error events and when each
chunk came; the gateway's access log says which streams migrated. Reported: streams that end
with `finish_reason` "length" and no error event; completion tokens (usage and ids read) equal
to `max_tokens`; ids and text equal to the reference run's, for migrated streams and (the
control: batch-dependent numerics alone) for the others; for a migrated stream that differs,
where it first differs from the break, and whether the engine's own answer to the
continuation request, asked afterwards of a live replica alone, is what the client read after
the break (no token missing or twice); the stall at the break (the longest gap between two
chunks around the fault: last token before, first after) p50/p99, beside the run's ITL.
Results: bench/results/failover-<mode>-<time>.{json,md}, logs in bench/results/logs/.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shlex
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from harness.process import ServerProcess
from harness.server import CPU_DTYPE, VLLM_SERVER, launch, start_gateway

from .compare import _git_rev
from .servers import RESULTS, SERVED_NAME, stop_on_signals

MODES = ("kill", "reset", "stall", "error")
TOPICS = ("a lighthouse keeper", "the river Danube", "bread baking", "a chess endgame", "volcanoes", "the printing press",
          "honeybees", "a night train", "glaciers", "the violin", "tide pools", "a mountain village", "comets",
          "the Silk Road", "paper making", "owls", "a desert oasis", "clockmakers", "coral reefs", "the first bicycle")
# The tests' engine flags (harness.server) with room for the streams of a dead replica: no queue on the others.
ENGINE_ARGS = ["-O0", *CPU_DTYPE, "--max-model-len", "2048", "--max-num-seqs", "64"]


def prompts(n: int) -> list[tuple[str, dict[str, Any]]]:
    """(path, the body's prompt part) for stream i: chat and completions in turn, each its own words."""
    out: list[tuple[str, dict[str, Any]]] = []
    for i in range(n):
        topic = TOPICS[i % len(TOPICS)]
        if i % 2 == 0:
            out.append(("/v1/chat/completions",
                        {"messages": [{"role": "user", "content": f"Tell story number {i} about {topic}, in detail."}]}))
        else:
            out.append(("/v1/completions", {"prompt": f"Chapter {i}. An essay on {topic}.\n\n"}))
    return out


def body(prompt: dict[str, Any], max_tokens: int) -> dict[str, Any]:
    return {**prompt, "model": SERVED_NAME, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True,
            "return_token_ids": True, "stream_options": {"include_usage": True}}


class Load:
    """One run: every stream at once; `fault` is called once `at_tokens` tokens came."""

    def __init__(self, base: str, tag: str, reqs: list[tuple[str, dict[str, Any]]], at_tokens: int | None, fault: Any) -> None:
        self.base, self.tag, self.reqs = base, tag, reqs
        self.at_tokens, self.fault = at_tokens, fault  # at_tokens: of the furthest stream
        self.lead = 0  # the most ids one stream read
        self.begun = 0  # streams that read a token: the fault waits for all (a stream broken before its first
        # event is another case: the gateway bounds that silence by `upstream.read_timeout` only)
        self.fault_at: float | None = None
        self.fault_wall = 0.0  # time.time() of the fault: the gateway's log lines say when it saw each break

    async def run(self) -> list[dict[str, Any]]:
        import aiohttp

        conn = aiohttp.TCPConnector(limit=0)
        timeout = aiohttp.ClientTimeout(total=1200, sock_read=600)
        async with aiohttp.ClientSession(connector=conn, timeout=timeout, read_bufsize=1 << 20) as session:
            return list(await asyncio.gather(*(self.one(session, i, p, b) for i, (p, b) in enumerate(self.reqs))))

    async def one(self, session: Any, i: int, path: str, req: dict[str, Any]) -> dict[str, Any]:
        import orjson

        rec: dict[str, Any] = {"i": i, "path": path, "rid": f"{self.tag}-{i}", "status": None, "ids": [], "text": "",
                               "arrivals": [], "finish": None, "usage": None, "errors": [], "done": False,
                               "prompt_ids": None, "client_error": None}
        start = rec["start"] = time.perf_counter()
        try:
            async with session.post(self.base + path, json=req, headers={"X-Request-Id": rec["rid"]}) as r:
                rec["status"] = r.status
                if r.status != 200:
                    rec["client_error"] = (await r.text())[:300]
                    return rec
                async for line in r.content:
                    if not line.startswith(b"data: "):
                        continue
                    now = time.perf_counter() - start
                    data = line[6:].strip()
                    if data == b"[DONE]":
                        rec["done"] = True
                        continue
                    p = orjson.loads(data)
                    if "error" in p:
                        rec["errors"].append(p["error"])
                        continue
                    if p.get("usage"):
                        rec["usage"] = p["usage"]
                    if p.get("prompt_token_ids") is not None:
                        rec["prompt_ids"] = p["prompt_token_ids"]
                    for c in p.get("choices") or ():
                        if c.get("prompt_token_ids") is not None:
                            rec["prompt_ids"] = c["prompt_token_ids"]
                        ids = c.get("token_ids") or []
                        rec["text"] += c.get("text") or (c.get("delta") or {}).get("content") or ""
                        if c.get("finish_reason"):
                            rec["finish"] = c["finish_reason"]
                        if ids:
                            self.begun += not rec["ids"]
                            rec["ids"] += ids
                            rec["arrivals"].append((now, len(ids)))
                            self.lead = max(self.lead, len(rec["ids"]))
                    if (self.at_tokens is not None and self.fault_at is None and self.lead >= self.at_tokens
                            and self.begun == len(self.reqs)):
                        self.fault()
                        self.fault_at, self.fault_wall = time.perf_counter(), time.time()
        except Exception as exc:  # the client's view: a stream cut without an event is what this looks for
            rec["client_error"] = f"{type(exc).__name__}: {exc}"
        return rec


def break_at(rec: dict[str, Any], fault_at: float, window: float = 2.0) -> tuple[int, float, float] | None:
    """(ids read before the break, the gap, when the first chunk after it came): the longest gap between two chunks, the later at or after the
    fault and the earlier at most `window` s after it (bytes already under way arrive just after the fault)."""
    t0 = fault_at - rec["start"]
    best: tuple[int, float, float] | None = None
    before = 0
    arrivals = rec["arrivals"]
    for (t_prev, n_prev), (t_next, _) in zip(arrivals, arrivals[1:]):
        before += n_prev
        if t_next >= t0 and t_prev <= t0 + window and (best is None or t_next - t_prev > best[1]):
            best = (before, t_next - t_prev, t_next)
    if best is None and arrivals and arrivals[0][0] >= t0:  # nothing had come before the fault: resent
        best = (0, arrivals[0][0] - t0, arrivals[0][0])
    return best


def first_difference(a: list[int], b: list[int]) -> int | None:
    for k, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return k
    return None if len(a) == len(b) else min(len(a), len(b))


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


def access_lines(gw: ServerProcess, prefix: str) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for line in gw.log().splitlines():
        if '"request_id"' not in line:
            continue
        try:
            rec = json.loads(line[line.index("{"):])
        except (ValueError, json.JSONDecodeError):
            continue
        if str(rec.get("request_id", "")).startswith(prefix):
            out[rec["request_id"]] = rec
    return out


def detected(gw: ServerProcess, fault_wall: float) -> str:
    """When the gateway logged each break ("... broke off a stream"), after the fault: first / last, ms."""
    import datetime

    seen = []
    for line in gw.log().splitlines():
        if "broke off a stream" in line:
            when = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            seen.append((when - fault_wall) * 1e3)
    return f"{min(seen):.0f} / {max(seen):.0f}" if seen else "none"


def migration_counts(gw: ServerProcess) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in gw.get("/metrics", 10).text.splitlines():
        if line.startswith("streamproxy_gateway_migrations_total{"):
            outcome = line.split('outcome="', 1)[1].split('"', 1)[0]
            out[outcome] = out.get(outcome, 0) + float(line.rsplit(" ", 1)[1])
    return out


def continuation_matches(base: str, rec: dict[str, Any], b: int, max_tokens: int) -> bool | None:
    """The engine's own answer to the continuation (prompt ids + the ids read before the break), asked alone."""
    import requests

    if rec["prompt_ids"] is None:
        return None
    req = {"model": SERVED_NAME, "prompt": rec["prompt_ids"] + rec["ids"][:b], "max_tokens": max_tokens - b, "temperature": 0,
           "ignore_eos": True, "return_token_ids": True}
    got = requests.post(base + "/v1/completions", json=req, timeout=300).json()
    return list(got["choices"][0].get("token_ids") or []) == rec["ids"][b:]


def analyse(ref: list[dict[str, Any]], run: list[dict[str, Any]], lines: dict[str, dict[str, Any]], fault_at: float,
            max_tokens: int) -> dict[str, Any]:
    n = len(run)
    ok = [r for r in run if r["finish"] == "length" and not r["errors"] and r["done"] and not r["client_error"]]
    tokens_ok = [r for r in run if len(r["ids"]) == max_tokens and (r["usage"] or {}).get("completion_tokens") == max_tokens]
    migrated = [r for r in run if lines.get(r["rid"], {}).get("migrations")]
    others = [r for r in run if not lines.get(r["rid"], {}).get("migrations")]

    def same(r: dict[str, Any]) -> bool:
        return r["ids"] == ref[r["i"]]["ids"] and r["text"] == ref[r["i"]]["text"]

    stalls: list[float] = []
    breaks: list[float] = []  # ids read before the break, per migrated stream
    recover: list[float] = []  # from the fault to the first token after the break
    differ: list[dict[str, Any]] = []
    resent = 0
    for r in migrated:
        at = break_at(r, fault_at)
        r["break"] = at
        if at is None:
            continue
        b, gap, _ = at
        resent += b == 0
        breaks.append(b)
        stalls.append(gap)
        recover.append(at[2] - (fault_at - r["start"]))
        if not same(r):
            d = first_difference(r["ids"], ref[r["i"]]["ids"])
            differ.append({"i": r["i"], "break_index": b, "first_difference": d,
                           "from_break": None if d is None else d - b, "replicas": lines[r["rid"]].get("replicas")})
    paused = [at[1] for r in others if (at := break_at(r, fault_at)) is not None]
    itl = [t2 - t1 for r in ref for (t1, _), (t2, _) in zip(r["arrivals"], r["arrivals"][1:])]
    prompt_once = [r for r in migrated if (r["usage"] or {}).get("prompt_tokens") == (ref[r["i"]]["usage"] or {}).get("prompt_tokens")]
    return {
        "streams": n, "length_no_error": len(ok), "completion_tokens_ok": len(tokens_ok),
        "errors": [{"i": r["i"], "errors": r["errors"], "client_error": r["client_error"], "finish": r["finish"]}
                   for r in run if r not in ok],
        "migrated": len(migrated), "resent": resent, "continued": len(migrated) - resent,
        "migrated_prompt_tokens_once": len(prompt_once),
        "migrated_equal_reference": len(migrated) - len(differ), "migrated_differ": differ,
        "others": len(others), "others_equal_reference": sum(same(r) for r in others),
        "reference_ok": sum(r["finish"] == "length" and not r["errors"] and len(r["ids"]) == max_tokens for r in ref),
        "stall_ms": {"p50": pct(stalls, 50) * 1e3, "p99": pct(stalls, 99) * 1e3, "max": max(stalls, default=float("nan")) * 1e3,
                     "n": len(stalls)},
        "break_index": {"min": min(breaks, default=float("nan")), "p50": pct(breaks, 50), "max": max(breaks, default=float("nan"))},
        "fault_to_next_token_ms": {"p50": pct(recover, 50) * 1e3, "p99": pct(recover, 99) * 1e3},
        "others_gap_at_fault_ms": {"p50": pct(paused, 50) * 1e3, "p99": pct(paused, 99) * 1e3},
        "reference_itl_ms": {"p50": pct(itl, 50) * 1e3, "p99": pct(itl, 99) * 1e3},
    }


def markdown(meta: dict[str, Any], s: dict[str, Any]) -> str:
    m, n = s["migrated"], s["streams"]
    lines = [f"# Stream failover: {meta['mode']} ({meta['when']})", ""]
    lines += [f"- {k}: {v}" for k, v in meta.items() if k not in ("when",)]
    lines += ["", "| figure | value |", "|---|---|",
              f"| streams ending with finish_reason \"length\", no error event, [DONE] | {s['length_no_error']} of {n} |",
              f"| completion tokens = max_tokens (usage and ids read) | {s['completion_tokens_ok']} of {n} |",
              f"| streams that migrated (access log) | {m} ({s['continued']} continued, {s['resent']} resent) |",
              f"| migrated streams whose prompt tokens equal the reference's (counted once) | {s['migrated_prompt_tokens_once']} of {m} |",
              f"| migrated streams with ids and text equal to the unbroken run | {s['migrated_equal_reference']} of {m} |",
              f"| streams that did not migrate, equal to the unbroken run (control) | {s['others_equal_reference']} of {s['others']} |",
              f"| ids read before the break, migrated streams: min / median / max | {s['break_index']['min']} / "
              f"{s['break_index']['p50']} / {s['break_index']['max']} |",
              f"| stall at the break p50 / p99 / max (ms, n={s['stall_ms']['n']}) | {s['stall_ms']['p50']:.0f} / "
              f"{s['stall_ms']['p99']:.0f} / {s['stall_ms']['max']:.0f} |",
              f"| from the fault to the first token after the break p50 / p99 (ms) | "
              f"{s['fault_to_next_token_ms']['p50']:.0f} / {s['fault_to_next_token_ms']['p99']:.0f} |",
              f"| streams that did not migrate: their longest gap around the fault p50 / p99 (ms) | "
              f"{s['others_gap_at_fault_ms']['p50']:.0f} / {s['others_gap_at_fault_ms']['p99']:.0f} |",
              f"| the gateway saw the break, after the fault: first / last (ms) | {meta.get('detected_ms')} |",
              f"| the unbroken run's inter-chunk gap p50 / p99 (ms) | {s['reference_itl_ms']['p50']:.0f} / "
              f"{s['reference_itl_ms']['p99']:.0f} |",
              f"| gateway migrations by outcome | {meta.get('migrations_total')} |"]
    if s["migrated_differ"]:
        lines += ["", "Migrated streams that differ from the unbroken run (break index: ids read before the break; "
                  "first difference counted from the break; `continuation alone`: the engine's own answer to the "
                  "continuation request, asked of a live replica afterwards, equals what the client read after the break):", "",
                  "| stream | break index | first difference (from the break) | continuation alone |", "|---|---|---|---|"]
        lines += [f"| {d['i']} | {d['break_index']} | {d['first_difference']} ({d['from_break']:+d}) | "
                  f"{d.get('continuation_alone')} |" if d["from_break"] is not None else
                  f"| {d['i']} | {d['break_index']} | text only | {d.get('continuation_alone')} |" for d in s["migrated_differ"]]
    if s["errors"]:
        lines += ["", "Streams that did not end well:", ""] + [f"- {e}" for e in s["errors"][:20]]
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.failover", description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", default="kill", help=f"one of {', '.join(MODES)}, or several comma-separated, kill last "
                    "(one start-up and one unbroken run for all; default kill)")
    ap.add_argument("--streams", type=int, default=120)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--at", type=float, default=0.5, help="break replica 0 once the furthest stream read this share of its tokens and every stream its first (default 0.5)")
    ap.add_argument("--idle-timeout", type=float, default=30.0, help="the deployment's migration.stream_idle_timeout (default 30)")
    ap.add_argument("--kv-cache-gib", default="1", help="VLLM_CPU_KVCACHE_SPACE per replica (default 1)")
    ap.add_argument("--engine-args", default=shlex.join(ENGINE_ARGS), help=f"each replica's (default {shlex.join(ENGINE_ARGS)!r})")
    return ap.parse_args(argv)


def machine() -> str:
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("model name")), "?")
    mem = next((ln.split()[1] for ln in Path("/proc/meminfo").read_text().splitlines() if ln.startswith("MemTotal")), "0")
    return f"{platform.node()}: {os.cpu_count()} x {cpu}, {int(mem) // 2**20} GiB, load {os.getloadavg()[0]:.1f} at start"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    modes = args.mode.split(",")
    if any(m not in MODES for m in modes) or ("kill" in modes and modes[-1] != "kill"):
        raise SystemExit(f"--mode: a comma-separated list of {', '.join(MODES)}, kill (if any) last")
    stop_on_signals()
    import requests
    import uvloop

    from engine_adapter.default_model import DEFAULT_MODEL_NAME, ensure_default_model

    stamp = time.strftime("%Y%m%d-%H%M%S")
    logs = RESULTS / "logs" / f"failover-{'-'.join(modes)}-{stamp}"
    logs.mkdir(parents=True, exist_ok=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    model = str(ensure_default_model(progress=False))
    common: dict[str, Any] = {
        "machine": machine(), "command": "python -m bench.failover " + shlex.join(sys.argv[1:] if argv is None else argv),
        "streamproxy": _git_rev(),
        "replicas": f"3 x vLLM api_server {DEFAULT_MODEL_NAME}, {args.engine_args}, VLLM_CPU_KVCACHE_SPACE={args.kv_cache_gib}, "
                    "worker on core i % 2",
        "load": f"{args.streams} streams at once (chat and completions in turn), max_tokens {args.max_tokens}, greedy, "
                f"ignore_eos, return_token_ids; replica 0 broken once every stream read a token and "
                f"the furthest {args.at:.0%} of its tokens",
        "gateway": f"round robin, migration: defaults but stream_idle_timeout {args.idle_timeout:g}; a new gateway per mode"}
    started: list[ServerProcess] = []
    whole = True
    try:
        reps = []
        for i in range(3):  # one at a time: they would race for the cores while loading
            rep = launch(["--model", model, "--served-model-name", SERVED_NAME, *shlex.split(args.engine_args)], logs, f"replica{i}",
                         {"VLLM_CPU_KVCACHE_SPACE": args.kv_cache_gib, "VLLM_CPU_OMP_THREADS_BIND": str(i % 2)},
                         command=None, module=VLLM_SERVER, new_session=True)
            started.append(rep)
            rep.wait_ready(600, 0.5)
            reps.append(rep)
            print(f"replica{i} ready on :{rep.port} in {rep.ready_after:.0f} s", flush=True)
        for rep in reps:  # warm-up, prompts no run uses
            for path, prompt in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]}),
                                 ("/v1/completions", {"prompt": "Hello"})):
                requests.post(rep.base + path, json={**{k: v for k, v in body(prompt, 8).items() if k != "stream_options"}, "stream": False},
                              timeout=300).raise_for_status()
        reqs = [(path, body(prompt, args.max_tokens)) for path, prompt in prompts(args.streams)]
        ref: list[dict[str, Any]] | None = None
        for mode in modes:
            meta: dict[str, Any] = {"mode": mode, "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), **common}
            proxy: ServerProcess | None = None
            first = reps[0].base
            if mode != "kill":
                proxy = launch(["--target", str(reps[0].port), "--fault", mode], logs, f"fault-proxy-{mode}", command=None,
                               module="harness.fault_proxy")
                started.append(proxy)
                proxy.wait_ready(30, 0.1)
                first = proxy.base
            config = {"deployments": [{"name": SERVED_NAME, "id": "dep-failover", "served_model": SERVED_NAME,
                                       "upstreams": [first, reps[1].base, reps[2].base],
                                       "migration": {"stream_idle_timeout": args.idle_timeout}}],
                      "upstream": {"policy": "round_robin"}}
            gw = start_gateway(config, logs, name=f"gateway-{mode}", env={"STREAMPROXY_LEDGER": f"sqlite://{logs}/ledger.db"})
            started.append(gw)
            if ref is None:  # the unbroken run, once, through the first mode's gateway (its proxy relaying as is)
                t = time.monotonic()
                ref = uvloop.run(Load(gw.base, f"ref-{stamp}", reqs, None, None).run())
                common["reference run s"] = meta["reference run s"] = round(time.monotonic() - t, 1)
                print(f"reference run: {meta['reference run s']} s, "
                      f"{sum(r['finish'] == 'length' and not r['errors'] for r in ref)} of {len(ref)} whole", flush=True)

            exited: list[float] = []  # kill: when replica 0's front end had exited (its sockets closed), time.time()

            def fault(mode: str = mode, proxy: ServerProcess | None = proxy, exited: list[float] = exited) -> None:
                if mode == "kill":
                    os.killpg(reps[0].pid, signal.SIGKILL)
                    def reaped() -> None:
                        reps[0].proc.wait()
                        exited.append(time.time())

                    threading.Thread(target=reaped, daemon=True).start()
                else:
                    assert proxy is not None
                    os.kill(proxy.pid, signal.SIGUSR1)

            tag = f"run-{mode}-{stamp}"
            load = Load(gw.base, tag, reqs, max(1, int(args.at * args.max_tokens)), fault)
            t = time.monotonic()
            run = uvloop.run(load.run())
            meta["fault run s"] = round(time.monotonic() - t, 1)
            time.sleep(2)  # the access log's writer thread
            lines = access_lines(gw, tag)
            meta["migrations_total"] = migration_counts(gw)
            meta["detected_ms"] = detected(gw, load.fault_wall)
            if exited:  # the kernel ends a killed process (its memory, then its files) before its peers see a close
                meta["replica 0 exited after the SIGKILL ms"] = round((exited[0] - load.fault_wall) * 1e3)
            assert load.fault_at is not None, "the fault never fired"
            s = analyse(ref, run, lines, load.fault_at, args.max_tokens)
            for d in s["migrated_differ"]:
                d["continuation_alone"] = continuation_matches(reps[1].base, run[d["i"]], d["break_index"], args.max_tokens)
            out = RESULTS / f"failover-{mode}-{stamp}"
            out.with_suffix(".json").write_text(json.dumps({"meta": meta, "summary": s, "reference": ref, "run": run}, indent=0))
            md = markdown(meta, s)
            out.with_suffix(".md").write_text(md + "\n")
            print("\n" + md + f"\n\nwrote {out}.json and .md\n", flush=True)
            if not s["migrated"]:
                print(f"{mode}: no stream migrated: the fault did not break a stream under way, so this mode shows nothing",
                      flush=True)
            whole = whole and s["length_no_error"] == s["streams"] and s["migrated"] > 0
            gw.stop(30)
            if proxy is not None:
                proxy.stop(10)
    finally:
        for srv in reversed(started):
            try:
                srv.stop(30)
            except Exception:
                pass
    return 0 if whole else 1


if __name__ == "__main__":
    sys.exit(main())
