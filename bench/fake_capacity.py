"""`make bench-fake`: what streamproxy itself costs per streamed chunk, and per idle stream.

Server: `streamproxy serve --engine fake` (a child process; the fake engine
gives every running request one token per step, a step every
`--token-delay` s, so one engine step = one chunk per stream). Client: this
process, the raw-socket closed-loop generator of bench/loadgen.py in counting
mode (it de-chunks and counts bytes, no JSON), so it stays far cheaper than
the server; its CPU is reported next to the server's to show it.

1. CPU per chunk: `--rounds` rounds (10), each visiting every concurrency
   level in turn; per level N keep-alive streams request `--max-tokens`
   tokens each (ignore_eos) back to back for `--seconds` (4);
   server CPU (utime+stime, and the schedstat sum of its threads in ns) over
   the window / chunks delivered (requests x max_tokens). Request handling
   (parse, admission, role/finish/usage/[DONE] frames, access log) is
   included, amortised over the request's chunks. Why a round is slow: the
   server's run-queue wait (schedstat: runnable, not running), wake-ups,
   preemptions and write calls per 1,000 chunks, the hypervisor's steal.
   Cells are medians over the rounds; a second table gives min / median /
   max and the slow rounds (chunks/s below half the level's best round).
2. Memory per idle stream: a second server with a fake TTFT of an hour;
   `--idle-streams` requests are opened and left waiting; RSS delta / streams;
   then they are closed and the RSS after release is shown too.
3. API servers (`--api-server-count 1,2`): the same server with
   `--api-server-count N` for each N, all up at once, in alternating rounds
   (the order rotating per round), at `--api-levels` streams (default
   1,024), with the fake engine stepping as fast as it can
   (`--api-token-delay`, default 0: the load is CPU-bound, so chunks/s is
   capacity). Each worker has its own fake engine. Server CPU is the
   parent's and the workers' together; the client (this process) runs on
   the same cores, and its share is reported. Issue 17's target: N=2 at
   least 1.5x the chunks/s of N=1, per-chunk CPU within 10%.
4. Profile (`--profile C`): py-spy records the server for `--profile-seconds`
   under the C-stream load (speedscope JSON for https://www.speedscope.app,
   plus a text summary of the top functions by self and total time).

No real-time priority by default, as users run; `--chrt PRIO` runs the
servers and this process under SCHED_FIFO (the server's own cost), labelled
in the title and in every table's heading.

Results: bench/results/fake-capacity-<time>.{json,md} (+ profile files).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time

from harness.server import wait_workers

from . import loadgen, procstat, write_floor
from .profile import profile_under_load
from .report import SLOW, _median, chrt_label, scheduling, set_fifo, spread_table
from .servers import RESULTS, Server, fake_server


def _raw(srv: Server, endpoint: str, max_tokens: int, model: str = "fake") -> bytes:
    return loadgen.build_request("127.0.0.1", srv.port, loadgen.endpoint_path(endpoint),
                                 loadgen.request_body(endpoint, model, max_tokens, prompt="Hello there"))


async def _sanity(srv: Server, endpoint: str, max_tokens: int) -> dict:
    res = await loadgen.run_load(srv.base, _raw(srv, endpoint, max_tokens), 2, 2, parse=True)
    s = loadgen.summarize(res)
    if s["errors"] or s["tokens"] != 2 * max_tokens:
        raise RuntimeError(f"fake server sanity check failed: {s}")
    s["bytes_per_request"] = res.records[0].nbytes
    return s


async def _level(srv: Server, conc: int, seconds: float, endpoint: str, max_tokens: int, *,
                 model: str | None = None, warm: bool = True, pids: list[int] | None = None) -> dict:
    if model is None:
        model = await asyncio.to_thread(srv.model_id)
    # The server's processes: with --api-server-count N, the parent and its N workers (a real engine's
    # processes are descendants too: bench/profile.py gives the front end's alone as `pids`).
    pids = pids or [srv.pid, *procstat.descendants(srv.pid)]
    conns = await loadgen.connect_all("127.0.0.1", srv.port, conc, parse=False)
    try:
        if warm:  # at this concurrency (short requests), on the same connections
            await loadgen.run_load(srv.base, _raw(srv, endpoint, 8, model), conc, conc, parse=False, conns=conns)
        snap: dict[str, float] = {}

        def sample() -> dict[str, float]:
            vol, invol = procstat.tree_switches(pids)
            return {"cpu": procstat.tree_cpu_seconds(pids), "ns": procstat.tree_cpu_ns(pids),
                    "sys": procstat.system_busy_seconds(), "stime": procstat.tree_user_sys(pids)[1],
                    "wait": procstat.tree_sched(pids)[1] / 1e9, "vol": vol, "invol": invol,
                    "writes": procstat.tree_write_calls(pids), "steal": procstat.steal_seconds()}

        res = await loadgen.run_load(srv.base, _raw(srv, endpoint, max_tokens, model), conc, duration=seconds,
                                     parse=False, conns=conns, on_start=lambda: snap.update(sample()))
        end = sample()
        cpu, ns, busy, stime = end["cpu"], end["ns"], end["sys"], end["stime"]
    finally:
        loadgen.close_all(conns)
    ok = res.ok
    chunks = len(ok) * max_tokens
    d_cpu, d_ns = cpu - snap["cpu"], ns - snap["ns"]
    return {
        "concurrency": conc, "requests": len(res.records), "errors": len(res.errors),
        "first_error": res.errors[0] if res.errors else None,
        "chunks": chunks, "wall_s": res.wall, "chunks_per_s": chunks / res.wall,
        "tok_per_s_per_stream": chunks / res.wall / conc,
        "us_per_chunk": d_ns / 1e3 / max(chunks, 1),
        "us_per_chunk_stat": d_cpu * 1e6 / max(chunks, 1),
        "kernel_share": (stime - snap["stime"]) / d_cpu if d_cpu > 0 else float("nan"),
        "server_cores": d_ns / 1e9 / res.wall,
        "client_cores": res.client_cpu / res.wall,
        "other_cores": max(0.0, (busy - snap["sys"]) - d_ns / 1e9 - res.client_cpu) / res.wall,
        "bytes_per_request": sum(r.nbytes for r in ok) / max(len(ok), 1),
        # Why a round is slow: the server kept off the CPU while runnable (run-queue wait), its
        # wake-ups (voluntary switches), preemptions (involuntary) and write calls per 1,000
        # chunks, the hypervisor's steal.
        "wait_us_per_chunk": (end["wait"] - snap["wait"]) * 1e6 / max(chunks, 1),
        "wakeups_per_1k": (end["vol"] - snap["vol"]) * 1e3 / max(chunks, 1),
        "preempted_per_1k": (end["invol"] - snap["invol"]) * 1e3 / max(chunks, 1),
        "writes_per_1k": (end["writes"] - snap["writes"]) * 1e3 / max(chunks, 1),
        "steal_cores": (end["steal"] - snap["steal"]) / res.wall,
    }


async def _idle_memory(srv: Server, n: int, endpoint: str) -> dict:
    raw = _raw(srv, endpoint, 128)

    async def open_streams(k: int) -> tuple[list, list[loadgen.RequestRecord], float]:
        conns = await loadgen.connect_all("127.0.0.1", srv.port, k, parse=False)
        recs = [loadgen.RequestRecord() for _ in conns]
        for c, r in zip(conns, recs):
            c.send(raw, r)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not all(r.status for r in recs):
            await asyncio.sleep(0.05)
        return conns, recs, time.monotonic()

    # Warm-up: open and close a batch, so lazily built state and pools exist.
    conns, recs, _ = await open_streams(min(200, n))
    loadgen.close_all(conns)
    await asyncio.sleep(2.0)
    rss0 = procstat.rss_bytes(srv.pid)
    conns, recs, _ = await open_streams(n)
    await asyncio.sleep(2.0)
    rss1 = procstat.rss_bytes(srv.pid)
    headers = sum(1 for r in recs if r.status == 200)
    loadgen.close_all(conns)
    await asyncio.sleep(3.0)
    rss2 = procstat.rss_bytes(srv.pid)
    # A second open/close cycle: growth from here on is a leak, not allocator retention.
    conns, _, _ = await open_streams(n)
    await asyncio.sleep(2.0)
    loadgen.close_all(conns)
    await asyncio.sleep(3.0)
    rss3 = procstat.rss_bytes(srv.pid)
    return {"streams": n, "headers_received": headers, "rss_before_mib": rss0 / 2**20,
            "rss_open_mib": rss1 / 2**20, "rss_after_close_mib": rss2 / 2**20,
            "rss_after_2nd_cycle_mib": rss3 / 2**20,
            "kib_per_idle_stream": (rss1 - rss0) / 1024 / n,
            "kib_per_stream_kept_after_close": (rss2 - rss0) / 1024 / n,
            "kib_per_stream_growth_2nd_cycle": (rss3 - rss2) / 1024 / n}


COST = "the server's own cost"
# The distribution tables (bench/report.py's `spread_table`): min / median / max of these ...
SPREAD = [
    ("chunks_per_s", "chunks/s", "{:.0f}"),
    ("tok_per_s_per_stream", "tok/s per stream", "{:.1f}"),
    ("us_per_chunk", "µs CPU/chunk (schedstat)", "{:.2f}"),
    ("wait_us_per_chunk", "server wait µs/chunk", "{:.2f}"),
]
# ... and the median of these in the slow rounds vs in the others.
WHY = [
    ("wait_us_per_chunk", "server wait µs/chunk", "{:.2f}"),
    ("preempted_per_1k", "preempted /1k chunks", "{:.1f}"),
    ("other_cores", "other cores", "{:.2f}"),
]
SLOW_NOTE = (f"Slow rounds: chunks/s below {SLOW:.0%} of the best round at that level (and N). Wait: the server's "
             "run-queue wait (schedstat: its threads runnable but not running) per chunk. 'slow / rest': the median "
             "over the slow rounds and over the others ('-': none). The client counts bytes (no event timing), so "
             "there is no TTFT here; `make bench-gateway` and `make bench` time every event.")


def medians(rows: list[dict], by: tuple[str, ...] = ("concurrency",)) -> list[dict]:
    """One dict per group of rounds (same `by` values, first-seen order): the median of every number,
    `rounds`, and requests and errors summed; `values`: every round's figures (for `spread_table`)."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in by), []).append(r)
    out = []
    for key, rs in groups.items():
        nums = [k for k, v in rs[0].items() if isinstance(v, (int, float)) and k not in by and k != "round"]
        m: dict = {k: _median([r.get(k) for r in rs]) for k in nums}
        m.update(zip(by, key))
        m.update(rounds=len(rs), requests=sum(r["requests"] for r in rs), errors=sum(r["errors"] for r in rs),
                 first_error=next((r["first_error"] for r in rs if r.get("first_error")), None),
                 values={k: [r.get(k) for r in rs] for k, _, _ in (*SPREAD, *WHY)})
        if any(r.get("write_floor_us") is not None for r in rs):
            m["write_floor_us"] = _median([r.get("write_floor_us") for r in rs])
            m["values"]["write_floor_us"] = [r.get("write_floor_us") for r in rs]
        out.append(m)
    return out


def markdown(meta: dict, rows: list[dict], idle: dict | None) -> str:
    label = chrt_label(meta, COST)
    under = " (under chrt)" if label else ""
    levels = medians(rows)
    lines = [f"# streamproxy fake-engine capacity{label} ({meta['when']})", ""]
    lines += [f"- {k}: {v}" for k, v in meta.items() if k != "when"]
    lines += ["", f"Cells: median over the rounds{under}; requests and errors: summed.", "",
              "| streams | µs CPU/chunk (schedstat) | µs CPU/chunk (stat) | kernel share | server cores "
              "| client cores | other cores | chunks/s | tok/s per stream | rounds | requests | errors "
              "| write floor µs/chunk |",
              "|" + "---|" * 13]
    for r in levels:
        floor = r.get("write_floor_us")
        lines.append(f"| {r['concurrency']} | {r['us_per_chunk']:.2f} | {r['us_per_chunk_stat']:.2f} | "
                     f"{r['kernel_share'] * 100:.0f}% | "
                     f"{r['server_cores']:.2f} | {r['client_cores']:.2f} | {r['other_cores']:.2f} | "
                     f"{r['chunks_per_s']:.0f} | {r['tok_per_s_per_stream']:.1f} | {r['rounds']} | {r['requests']} | "
                     f"{r['errors']} | {'n/a' if floor is None else f'{floor:.2f}'} |")
    if any(r.get("write_floor_us") is not None for r in levels):
        lines += ["", "Write floor: the same number of loopback TCP connections, one frame of the same size per "
                  "connection per step at the same step interval, written through uvloop transports by a bare "
                  "loop (bench/write_floor.py): no HTTP, no encoding, no engine. It is what one write per chunk "
                  "costs the sender here; on loopback the kernel charges it for delivering to the reader too."]
    if levels:
        floors = [("write_floor_us", "write floor µs/chunk", "{:.2f}")] if any("write_floor_us" in m for m in levels) else []
        lines += ["", f"## Every round: min / median / max{under}", "", SLOW_NOTE, "",
                  *spread_table(["streams"], [([str(m["concurrency"])], m["values"]) for m in levels],
                                SPREAD + floors, "chunks_per_s", WHY)]
    lines += _targets(levels, idle, under)
    if idle:
        lines += ["", "| idle streams | headers received | RSS before MiB | RSS open MiB | KiB per idle stream "
                  "| RSS after close MiB | KiB/stream kept after close | RSS after 2nd open+close MiB "
                  "| KiB/stream growth in 2nd cycle |", "|" + "---|" * 9,
                  f"| {idle['streams']} | {idle['headers_received']} | {idle['rss_before_mib']:.1f} | "
                  f"{idle['rss_open_mib']:.1f} | {idle['kib_per_idle_stream']:.2f} | "
                  f"{idle['rss_after_close_mib']:.1f} | {idle['kib_per_stream_kept_after_close']:.2f} | "
                  f"{idle['rss_after_2nd_cycle_mib']:.1f} | {idle['kib_per_stream_growth_2nd_cycle']:.2f} |"]
    return "\n".join(lines)


# Issue 7's targets for this benchmark.
TARGET_US_PER_CHUNK = (256, 6.0)
TARGET_KIB_PER_IDLE_STREAM = 16.0


def api_markdown(all_rows: list[dict], token_delay: float, under: str = "") -> list[str]:
    """The --api-server-count tables (medians over rounds; every round's spread) and issue 17's target
    (N=2 vs N=1 at the same streams, on the medians)."""
    if not all_rows:
        return []
    rows = medians(all_rows, ("api_servers", "concurrency"))
    lines = ["", f"## API servers (`--api-server-count N`, fake engine step every {token_delay:g} s: CPU-bound){under}",
             "", "Cells: median over the rounds (the N alternating, all up at once); requests and errors: summed.", "",
             "| N | streams | chunks/s | µs CPU/chunk (schedstat) | µs CPU/chunk (stat) | server cores | client cores "
             "| client share of busy CPU | other cores | rounds | requests | errors |", "|" + "---|" * 12]
    for r in rows:
        busy = r["server_cores"] + r["client_cores"] + r["other_cores"]
        lines.append(f"| {r['api_servers']} | {r['concurrency']} | {r['chunks_per_s']:.0f} | {r['us_per_chunk']:.2f} | "
                     f"{r['us_per_chunk_stat']:.2f} | {r['server_cores']:.2f} | {r['client_cores']:.2f} | "
                     f"{r['client_cores'] / busy * 100 if busy else 0:.0f}% | {r['other_cores']:.2f} | "
                     f"{r['rounds']} | {r['requests']} | {r['errors']} |")
    lines += ["", f"### Every round: min / median / max{under}", "", SLOW_NOTE, "",
              *spread_table(["N", "streams"], [([str(m["api_servers"]), str(m["concurrency"])], m["values"])
                                               for m in rows], SPREAD, "chunks_per_s", WHY)]
    targets = []
    for conc in sorted({r["concurrency"] for r in rows}):
        by_n = {r["api_servers"]: r for r in rows if r["concurrency"] == conc}
        if 1 in by_n and 2 in by_n:
            one, two = by_n[1], by_n[2]
            speedup = two["chunks_per_s"] / one["chunks_per_s"]
            cpu = two["us_per_chunk"] / one["us_per_chunk"]
            targets.append(f"| N=2 at least 1.5x the chunks/s of N=1 at {conc} streams | {speedup:.2f}x "
                           f"({two['chunks_per_s']:.0f} vs {one['chunks_per_s']:.0f}) | "
                           f"{'yes' if speedup >= 1.5 else '**no**'} |")
            targets.append(f"| N=2 per-chunk CPU within 10% of N=1 at {conc} streams | {cpu:.2f}x "
                           f"({two['us_per_chunk']:.2f} vs {one['us_per_chunk']:.2f} µs) | "
                           f"{'yes' if cpu <= 1.10 else '**no**'} |")
    if targets:
        lines += ["", f"| target (issue 17; medians){under} | measured | met |", "|---|---|---|", *targets]
    return lines


def _line(r: dict) -> str:
    """One run, as printed while the benchmark goes."""
    return (f"{r['us_per_chunk']:6.2f} µs/chunk (stat {r['us_per_chunk_stat']:6.2f}, kernel "
            f"{r['kernel_share'] * 100:.0f}%)  server {r['server_cores']:.2f} cores  client {r['client_cores']:.2f}  "
            f"other {r['other_cores']:.2f}  {r['chunks_per_s']:8.0f} chunks/s  {r['tok_per_s_per_stream']:.1f} "
            f"tok/s/stream  wait {r['wait_us_per_chunk']:.2f} µs/chunk  wake-ups {r['wakeups_per_1k']:.0f} preempted "
            f"{r['preempted_per_1k']:.1f} writes {r['writes_per_1k']:.0f} /1k chunks  steal {r['steal_cores']:.2f}  "
            f"errors {r['errors']}")


def _targets(levels: list[dict], idle: dict | None, under: str = "") -> list[str]:
    lines = []
    conc, bound = TARGET_US_PER_CHUNK
    for r in levels:
        if r["concurrency"] == conc:
            met = "yes" if r["us_per_chunk"] <= bound else "**no**"
            lines.append(f"| server CPU per streamed chunk at {conc} streams at most {bound:g} µs | "
                         f"{r['us_per_chunk']:.2f} µs | {met} |")
    if idle:
        kib = idle["kib_per_idle_stream"]
        met = "yes" if kib < TARGET_KIB_PER_IDLE_STREAM else "**no**"
        lines.append(f"| an idle open stream under {TARGET_KIB_PER_IDLE_STREAM:g} KiB | {kib:.2f} KiB | {met} |")
    if not lines:
        return []
    return ["", f"## Targets (issue 7; medians){under}", "", "| target | measured | met |", "|---|---|---|", *lines]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.fake_capacity", description=__doc__.split("\n\n")[0])
    ap.add_argument("--levels", default="1,64,256,1024", help="concurrent streams (default 1,64,256,1024)")
    ap.add_argument("--rounds", type=int, default=10,
                    help="rounds: each visits every level (and every --api-server-count N, in turn); default 10, "
                         "for min / median / max and the slow rounds")
    ap.add_argument("--seconds", type=float, default=4.0,
                    help="load per level and round, closed loop (default 4: two 128-token requests per stream at "
                         "the 0.02 s step; every request sent before the end counts, so a run lasts until its "
                         "last request ends, about 5.2 s)")
    ap.add_argument("--chrt", type=int, default=0, metavar="PRIO",
                    help="run the servers and this load generator under SCHED_FIFO at this priority (root): "
                         "isolates the server's own cost from the scheduler's; every figure is labelled so. "
                         "Default 0: normal scheduling, the way users run")
    ap.add_argument("--token-delay", type=float, default=0.02,
                    help="fake engine step interval in s: one token per stream per step (default 0.02)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--endpoint", choices=["chat", "completions"], default="chat")
    ap.add_argument("--idle-streams", type=int, default=1000, help="0 skips the memory test")
    ap.add_argument("--profile", type=int, default=0, metavar="C",
                    help="also profile the server with py-spy at C streams (e.g. 256)")
    ap.add_argument("--profile-seconds", type=float, default=15.0)
    ap.add_argument("--profile-rate", type=int, default=200, help="py-spy samples per second")
    ap.add_argument("--native", action="store_true", help="py-spy --native (C frames too)")
    ap.add_argument("--api-server-count", default="1,2", metavar="N,N",
                    help="also measure `--api-server-count N` for each N at --api-levels streams (default 1,2; "
                         "'' skips it)")
    ap.add_argument("--api-levels", default="1024", help="streams for the --api-server-count runs (default 1024)")
    ap.add_argument("--api-token-delay", type=float, default=0.0,
                    help="fake engine step interval for the --api-server-count runs (default 0: as fast as it can)")
    ap.add_argument("--api-seconds", type=float, default=0.0, help="load per run (default: --seconds)")
    ap.add_argument("--server-args", default="", help="extra flags for `streamproxy serve --engine fake`")
    ap.add_argument("--quick", action="store_true", help="2 rounds of 3 s per level, 300 idle streams")
    ap.add_argument("--only-idle", action="store_true", help="skip the CPU levels: only the idle-memory test")
    ap.add_argument("--no-floor", action="store_true", help="skip the write-floor measurement per level and round")
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the `finally`: stop the server
    if args.quick:
        given = {a.split("=", 1)[0] for a in (sys.argv[1:] if argv is None else argv)}
        args.seconds, args.idle_streams = 3.0, min(args.idle_streams, 300)
        if "--rounds" not in given:
            args.rounds = 2
    set_fifo(args.chrt)
    import shlex

    import uvloop

    levels = [int(x) for x in args.levels.split(",") if x]
    stamp = time.strftime("%Y%m%d-%H%M%S")
    RESULTS.mkdir(parents=True, exist_ok=True)
    extra = shlex.split(args.server_args)
    meta = {"when": time.strftime("%Y-%m-%d %H:%M"),
            "server": f"streamproxy serve --engine fake --fake-token-delay {args.token_delay} {args.server_args}".strip(),
            "scheduling": scheduling(args.chrt, "the servers and the load generator", COST),
            "load": f"{args.endpoint}, stream, {args.max_tokens} tokens/request (one per engine step), "
                    f"keep-alive closed loop for {args.seconds:g} s per level and round, {args.rounds} rounds "
                    f"(each visits every level); client = raw-socket counter (separate process)",
            "CPU": "server process utime+stime (stat) and its threads' schedstat run time (ns); per chunk = "
                   "CPU / (finished requests x max_tokens), request handling included"}
    rows: list[dict] = []
    idle = prof = None
    if not args.only_idle and levels:
        srv = fake_server(["--fake-token-delay", str(args.token_delay), *extra], stamp).fifo(args.chrt)
        srv.start()
        try:
            srv.wait_ready(60)
            sanity = uvloop.run(_sanity(srv, args.endpoint, args.max_tokens))
            meta["sanity"] = "{tokens} tokens in 2 requests, {bytes_per_request} bytes/request".format(**sanity)
            chunk_bytes = max(1, sanity["bytes_per_request"] // args.max_tokens)
            for rnd in range(args.rounds):
                for conc in levels:
                    r = uvloop.run(_level(srv, conc, args.seconds, args.endpoint, args.max_tokens))
                    r["round"] = rnd + 1
                    rows.append(r)
                    print(f"round {rnd + 1} c={conc:5d}: {_line(r)}", flush=True)
                    if r["errors"]:
                        print(f"   first error: {r['first_error']}", flush=True)
                    if not args.no_floor:
                        r["write_floor_us"], _ = write_floor.measure(conc, max(64, 256 // conc), chunk_bytes,
                                                                     args.token_delay, transport_mode=True)
                        print(f"         write floor at {conc} connections: {r['write_floor_us']:.2f} µs/chunk",
                              flush=True)
            if args.profile:
                out = RESULTS / f"profile-fake-c{args.profile}-{stamp}.speedscope.json"
                prof = profile_under_load(srv, args.profile, args.profile_seconds, args.endpoint, args.max_tokens, out,
                                          rate=args.profile_rate, native=args.native)
                print(f"\nprofile at {args.profile} streams: {prof['speedscope']}\n{prof['summary']}\n", flush=True)
        finally:
            srv.stop(10)
    api_rows: list[dict] = []
    counts = [int(x) for x in args.api_server_count.split(",") if x]
    asrvs: dict[int, Server] = {}
    try:
        for count in counts:  # all up at once (an idle fake engine waits on an event: ~no CPU)
            asrvs[count] = asrv = fake_server(["--fake-token-delay", str(args.api_token_delay),
                                               "--api-server-count", str(count), "--access-log", "off", *extra],
                                              f"{stamp}-api{count}").fifo(args.chrt)
            asrv.start()
            asrv.wait_ready(120)
            if count > 1:
                wait_workers(asrv, count, 300)
        for conc in [int(x) for x in args.api_levels.split(",") if x] if counts else []:
            for rnd in range(args.rounds):
                for count in counts[rnd % len(counts):] + counts[:rnd % len(counts)]:
                    r = uvloop.run(_level(asrvs[count], conc, args.api_seconds or args.seconds, args.endpoint,
                                          args.max_tokens))
                    r["api_servers"], r["round"] = count, rnd + 1
                    api_rows.append(r)
                    print(f"round {rnd + 1} N={count} c={conc:5d}: {_line(r)}", flush=True)
    finally:
        for asrv in asrvs.values():
            asrv.stop(30)
    if args.idle_streams:
        isrv = fake_server(["--fake-ttft", "3600", "--fake-token-delay", str(args.token_delay), *extra],
                           stamp + "-idle").fifo(args.chrt)
        isrv.start()
        try:
            isrv.wait_ready(60)
            idle = uvloop.run(_idle_memory(isrv, args.idle_streams, args.endpoint))
            print(f"idle streams: {idle['kib_per_idle_stream']:.2f} KiB per stream "
                  f"({idle['headers_received']}/{idle['streams']} got headers; RSS {idle['rss_before_mib']:.1f} -> "
                  f"{idle['rss_open_mib']:.1f} MiB, {idle['rss_after_close_mib']:.1f} MiB after close)", flush=True)
        finally:
            isrv.stop(10)
    md = markdown(meta, rows, idle)
    md += "\n" + "\n".join(api_markdown(api_rows, args.api_token_delay, " (under chrt)" if args.chrt else ""))
    if prof:
        md += f"\n\nProfile at {args.profile} streams ({prof['speedscope']}):\n\n```\n{prof['summary']}\n```\n"
    (RESULTS / f"fake-capacity-{stamp}.md").write_text(md + "\n")
    (RESULTS / f"fake-capacity-{stamp}.json").write_text(
        json.dumps({"meta": meta, "levels": rows, "api_servers": api_rows, "idle": idle, "profile": prof,
                    "medians": {"levels": medians(rows), "api_servers": medians(api_rows, ("api_servers", "concurrency"))}},
                   indent=1))
    print("\n" + md)
    print(f"\nwrote {RESULTS / f'fake-capacity-{stamp}.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
