"""`make bench-gateway`: what relaying an SSE stream costs: streamproxy gateway, nginx, LiteLLM.

Upstreams: `--replicas` (2) `streamproxy serve --engine fake` processes with a
fixed step (`--token-delay` 0.02 s: one token per stream per step). In front
of the same upstreams, all up at once (bench/relays.py): the gateway, nginx
and the LiteLLM proxy; 'direct' is the client calling the upstreams itself
(its streams split evenly over them), the baseline.

For each level (`--levels` 64,256 streams) and round (`--rounds`, 20), each
relay in turn (the order rotates per round) carries a closed-loop load for
`--seconds` (5: two requests per stream; bench/loadgen.py, parsing: every
SSE event is split and timed,
`max_tokens` 128, ignore_eos, usage asked for; a random pause of up to one
step before each request, so requests arrive at any phase of the upstreams'
step clock and a relay's added latency shows in TTFT instead of being hidden
by the wait for the next step). Per run: the relay's CPU (utime+stime from
/proc of the process we started and its descendants: nginx's worker) over
the window / the SSE events the client received (`data:` events, [DONE]
included), the upstreams' CPU the same way, tok/s, TTFT and ITL p50/p99,
and why a round is slow: the relay's and the upstreams' run-queue wait
(schedstat: runnable, not running), the relay's wake-ups, preemptions and
write calls per 1,000 events, the hypervisor's steal. Cells are medians over
rounds; 'added TTFT' is a relay's TTFT p50 minus direct's; the distribution
table gives each relay's min / median / max over the rounds and its slow
rounds (tok/s below half its best). No real-time priority by default, as
users run; `--chrt PRIO` runs every process under SCHED_FIFO (the relays' own
cost), labelled in the title. `--affinity` runs the other benchmark
(bench/affinity.py); `--ledger` the request ledger's (bench/ledger.py: the
gateway's CPU per event and TTFT with the ledger off, on SQLite and on
PostgreSQL, and each store's records per second).
Results: bench/results/gateway-<time>.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import gateway_report, loadgen, procstat, relays
from .compare import _git_rev
from .report import scheduling, set_fifo
from .servers import RESULTS, Server, fake_server, stop_on_signals

RELAYS = ("direct", "gateway", "nginx", "litellm")
# Not run by default: the gateway with another balancing policy (`--relays direct,gateway,gateway-rr`).
VARIANTS = {"gateway-rr": {"policy": "round_robin"}, "gateway-lo": {"policy": "least_outstanding"}}
# With `--baseline DIR`: the gateway of another source tree, in the same rounds (before/after a change).
BASELINE = "gateway-base"


def _raw(port: int, model: str, max_tokens: int) -> bytes:
    return loadgen.build_request("127.0.0.1", port, loadgen.endpoint_path("chat"),
                                 loadgen.request_body("chat", model, max_tokens))


async def _connect(ports: list[int], conc: int) -> list:
    """`conc` connections spread evenly over `ports` (one port: the relay; several: direct)."""
    conns: list = []
    for i, port in enumerate(ports):
        n = conc // len(ports) + (1 if i < conc % len(ports) else 0)
        conns += await loadgen.connect_all("127.0.0.1", port, n, parse=True)
    return conns


async def _run(label: str, ports: list[int], pids: list[int], ups: list[int], conc: int, seconds: float,
               model: str, max_tokens: int, jitter: float, spread: float = 0.0) -> dict:
    conns = await _connect(ports, conc)
    url = f"http://127.0.0.1:{ports[0]}"
    try:  # warm-up at this concurrency on the same connections (short requests)
        warm = await loadgen.run_load(url, _raw(ports[0], model, 8), conc, conc, conns=conns)
        if warm.errors:
            raise RuntimeError(f"{label}: warm-up failed: {warm.errors[0]}")
        snap: dict[str, float] = {}

        def sample() -> dict[str, float]:
            vol, invol = procstat.tree_switches(pids)
            return {"relay": procstat.tree_cpu_seconds(pids), "up": procstat.tree_cpu_seconds(ups),
                    "sys": procstat.system_busy_seconds(), "steal": procstat.steal_seconds(),
                    "relay_wait": procstat.tree_sched(pids)[1] / 1e9, "up_wait": procstat.tree_sched(ups)[1] / 1e9,
                    "relay_vol": vol, "relay_invol": invol, "relay_writes": procstat.tree_write_calls(pids)}

        res = await loadgen.run_load(url, _raw(ports[0], model, max_tokens), conc, duration=seconds, conns=conns,
                                     on_start=lambda: snap.update(sample()), jitter=jitter, spread=spread)
        end = sample()
    finally:
        loadgen.close_all(conns)
    s = loadgen.summarize(res)
    d = {k: end[k] - snap[k] for k in end}
    events = max(s["sse_events"], 1)
    s.update({
        "relay": label, "concurrency": conc,
        "relay_cpu_s": d["relay"] if pids else None,
        "us_per_event": d["relay"] / events * 1e6 if pids else None,
        "upstream_us_per_event": d["up"] / events * 1e6,
        "events_per_request": s["sse_events"] / max(s["requests"] - s["errors"], 1),
        "relay_cores": d["relay"] / res.wall if pids else None,
        "upstream_cores": d["up"] / res.wall, "client_cores": res.client_cpu / res.wall,
        "other_cores": max(0.0, d["sys"] - d["relay"] - d["up"] - res.client_cpu) / res.wall,
        # Why a round is slow: the relay (and the upstreams) kept off the CPU while runnable
        # (run-queue wait; µs per event = ms per 1,000 events), the relay's wake-ups (voluntary
        # switches), preemptions (involuntary) and write calls per 1,000 events, the hypervisor's steal.
        "relay_wait_us_per_event": d["relay_wait"] / events * 1e6 if pids else None,
        "relay_wakeups_per_1k": d["relay_vol"] / events * 1e3 if pids else None,
        "relay_preempted_per_1k": d["relay_invol"] / events * 1e3 if pids else None,
        "relay_writes_per_1k": d["relay_writes"] / events * 1e3 if pids else None,
        "upstream_wait_us_per_event": d["up_wait"] / events * 1e6,
        "steal_cores": d["steal"] / res.wall,
    })
    return s


def _rev(tree: str) -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tree, capture_output=True, text=True)
    return done.stdout.strip() or "?"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.gateway", description=__doc__.split("\n\n")[0])
    ap.add_argument("--affinity", action="store_true",
                    help="run the prefix-affinity benchmark instead (python -m bench.affinity --help)")
    ap.add_argument("--ledger", action="store_true",
                    help="run the request ledger's benchmark instead (python -m bench.ledger --help)")
    ap.add_argument("--kv-pressure", action="store_true",
                    help="run KV-event routing's benchmark instead (python -m bench.scheduling --help)")
    ap.add_argument("--fairness", action="store_true",
                    help="run flow control's benchmark instead (python -m bench.scheduling --help)")
    ap.add_argument("--levels", default="64,256", help="concurrent streams (default 64,256)")
    ap.add_argument("--rounds", type=int, default=20,
                    help="rounds per relay and level (default 20: this machine's rounds swing by several x, so "
                         "fewer say little; a run takes about 6.5 s with the defaults, so 4 relays at 2 levels take about "
                         "18 minutes)")
    ap.add_argument("--seconds", type=float, default=5.0,
                    help="closed-loop load per run (default 5: two 128-token requests per stream at a 0.02 s "
                         "step, each run about 5.3 s; every request sent before the end counts, so a run lasts "
                         "until its last request ends)")
    ap.add_argument("--chrt", type=int, default=0, metavar="PRIO",
                    help="run the upstreams, the relays and the load generator under SCHED_FIFO at this priority "
                         "(root): isolates the relays' own cost from the scheduler's; every figure is labelled so. "
                         "Default 0: normal scheduling, the way users run")
    ap.add_argument("--token-delay", type=float, default=0.02, help="the fake upstreams' step in s (default 0.02)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--replicas", type=int, default=2, help="fake upstreams (default 2)")
    ap.add_argument("--relays", default=",".join(RELAYS), help=f"which (default {','.join(RELAYS)})")
    ap.add_argument("--jitter", type=float, default=None,
                    help="random pause of up to this many s before each request (default: one step)")
    ap.add_argument("--spread", action="store_true",
                    help="spread the clients' first requests over one request's duration (max tokens x step), "
                         "so arrivals stay spread out; by default they all start together and, every request "
                         "taking the same time, keep arriving in waves of the whole concurrency")
    ap.add_argument("--public-name", default=None,
                    help="the gateway's and LiteLLM's name for the model (default: the upstreams' own, "
                         "`fake`, so every relay gets the same request; another name makes them rename it)")
    ap.add_argument("--baseline", metavar="DIR", default=None,
                    help=f"also run the gateway of the source tree DIR as '{BASELINE}' in the same rounds")
    ap.add_argument("--baseline-python", metavar="PYTHON", default=None,
                    help=f"the interpreter '{BASELINE}' runs on (default this one; e.g. another Python version)")
    ap.add_argument("--quick", action="store_true", help="2 rounds of 3 s per relay and level")
    args, rest = ap.parse_known_args(argv)
    if rest and not (args.affinity or args.ledger or args.kv_pressure or args.fairness):
        ap.error(f"unrecognized arguments: {' '.join(rest)}")
    args.rest = rest
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if args.quick:
        given = {a.split("=", 1)[0] for a in (sys.argv[1:] if argv is None else argv)}
        if "--rounds" not in given:
            args.rounds = 2
        if "--seconds" not in given:
            args.seconds = 3.0
    if (args.affinity or args.ledger) and args.chrt:
        ap.error("--chrt is for the relay benchmark; --affinity and --ledger do not take it")
    if args.baseline_python and not args.baseline:
        ap.error("--baseline-python needs --baseline DIR")
    if args.jitter is None:
        args.jitter = args.token_delay
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.kv_pressure or args.fairness:
        from . import scheduling as issue35

        return issue35.main(args.argv)
    if args.affinity:
        from . import affinity

        return affinity.main(args.rest + (["--quick"] if args.quick else []))
    if args.ledger:
        from . import ledger

        return ledger.main([a for a in args.argv if a != "--ledger"])  # every flag its own (--rounds, --quick too)
    stop_on_signals()  # Ctrl-C, SIGTERM: the `finally` stops every server
    set_fifo(args.chrt)
    import uvloop

    levels = [int(x) for x in args.levels.split(",") if x]
    which = [r for r in args.relays.split(",") if r] + ([BASELINE] if args.baseline else [])
    stamp = time.strftime("%Y%m%d-%H%M%S")
    RESULTS.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="bench-gateway-"))
    up_args = ["--fake-token-delay", str(args.token_delay)]
    ups = [fake_server(up_args, f"gateway-{stamp}-upstream{i}") for i in range(args.replicas)]
    for u in ups:
        u.fifo(args.chrt)
    started: list[Server] = []
    meta = {"when": time.strftime("%Y-%m-%d %H:%M"), "quick": args.quick, "streamproxy": _git_rev(),
            "machine": f"{procstat.os.cpu_count()} cores",
            "scheduling": scheduling(args.chrt, "the upstreams, the relays and the load generator",
                                     "the relays' own cost"),
            "upstreams": f"{args.replicas} x `streamproxy serve --engine fake {' '.join(up_args)}`",
            "load": f"chat, stream, {args.max_tokens} tokens/request, ignore_eos, include_usage; closed loop for "
                    f"{args.seconds:g} s per run, a random 0-{args.jitter * 1e3:g} ms pause before each request; "
                    + (f"first requests spread over {args.max_tokens * args.token_delay:g} s (`--spread`), "
                       "the clock started once all were going; " if args.spread else
                       "all clients start together (requests arrive in waves; `--spread` spreads them); ")
                    + f"{args.rounds} round(s), the relays' order rotating per round; client = bench/loadgen.py "
                      "parsing every event (separate process)"}
    rows: list[dict] = []
    json_path = RESULTS / f"gateway-{stamp}.json"
    try:
        for u in ups:
            u.start()
            started.append(u)
        for u in ups:
            u.wait_ready(60)
        urls = [u.base for u in ups]
        up_pids = [u.pid for u in ups]
        public = args.public_name or relays.UPSTREAM_NAME
        tag = f"gateway-{stamp}"
        servers: dict[str, Server] = {}
        if "gateway" in which:
            servers["gateway"] = relays.gateway_server(urls, tag, tmp, public=public)
        for label, policy in VARIANTS.items():
            if label in which:
                servers[label] = relays.gateway_server(urls, tag, tmp, public=public, policy=policy, label=label)
        if args.baseline:
            base = relays.gateway_server(urls, tag, tmp, public=public, label=BASELINE)
            base.cwd, base.env = args.baseline, {**base.env, "PYTHONPATH": args.baseline}
            if args.baseline_python:
                base.cmd[0] = args.baseline_python
            servers[BASELINE] = base
            python = args.baseline_python or sys.executable
            meta["baseline"] = f"{BASELINE}: the gateway from {args.baseline} ({_rev(args.baseline)}) on {python}"
        if "nginx" in which:
            servers["nginx"] = relays.nginx_server(urls, tag, tmp)
        if "litellm" in which:
            servers["litellm"] = relays.litellm_server(urls, tag, tmp, public=public)
        for srv in servers.values():
            srv.fifo(args.chrt)
        for srv in servers.values():
            srv.start()
            started.append(srv)
        for srv in servers.values():
            srv.wait_ready(180)
            print(f"{srv.label} ready on :{srv.port} in {srv.ready_after:.1f} s (log {srv.stdout_path})", flush=True)
        meta["relays"] = gateway_report.describe(servers, tmp, public)
        order = [r for r in (*RELAYS, *VARIANTS, BASELINE) if r in which]
        for conc in levels:
            for rnd in range(args.rounds):
                for label in order[rnd % len(order):] + order[:rnd % len(order)]:
                    if label == "direct":
                        ports, pids, model = [u.port for u in ups], [], relays.UPSTREAM_NAME
                    else:
                        srv = servers[label]
                        ports, pids, model = [srv.port], relays.relay_pids(srv), public
                    try:
                        r = uvloop.run(_run(label, ports, pids, up_pids, conc, args.seconds, model, args.max_tokens,
                                            args.jitter, args.max_tokens * args.token_delay if args.spread else 0.0))
                    except Exception as exc:  # one relay's failed run must not lose the others' figures
                        print(f"c={conc:4d} round {rnd + 1} {label}: run failed: {type(exc).__name__}: {exc}", flush=True)
                        continue
                    r["round"] = rnd + 1
                    rows.append(r)
                    json_path.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
                    print(gateway_report.line(r), flush=True)
    finally:
        for srv in reversed(started):
            srv.stop(15)
        shutil.rmtree(tmp, ignore_errors=True)
    md = gateway_report.markdown(rows, meta)
    md_path = RESULTS / f"gateway-{stamp}.md"
    md_path.write_text(md + "\n")
    json_path.write_text(json.dumps({"meta": meta, "rows": rows, "summary": gateway_report.summary(rows)}, indent=1))
    print("\n" + md + f"\n\nwrote {json_path}\n      {md_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
