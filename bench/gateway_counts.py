"""What a relayed stream costs the gateway, in counts a noisy machine does not change.

    python -m bench.gateway_counts TREE [TREE ...] [--requests 200] [-c 16] [--max-tokens 32] [--profile]
                                   [--upstream-tree DIR]

One `streamproxy serve --engine fake` replica (from `--upstream-tree`, default this
tree; step `--token-delay`), and in front of it one `streamproxy gateway` per source
TREE (its `PYTHONPATH`), all up at once. Each gateway in turn gets a warm-up, then a
fixed closed-loop load (`--requests` streams, `-c` at a time, bench/loadgen.py
parsing every event) over the same kept-alive connections; over that window it reads
the gateway's `/proc/PID/io` (`syscw`: write-class system calls, the socket writes of
an event-loop server; `syscr`: reads) and the replica's `syscw`, per stream. With
`--profile` each gateway runs under cProfile, switched on for the window only
(SIGUSR1 on, SIGUSR2 off and dumped): Python function calls (builtins included) per
stream and per event, deterministic but for how the replica's events fall into reads.
Two `--max-tokens` values split a stream's cost into per event and per stream. CPU per
event is printed too, labelled noisy (10 ms ticks over a short window). One JSON line
per gateway.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pstats
import signal
import sys
import tempfile
from pathlib import Path

from . import loadgen, procstat, relays
from .servers import ROOT, Server, fake_server


def _io(pid: int) -> dict[str, int]:
    with open(f"/proc/{pid}/io") as f:
        return {k: int(v) for k, v in (line.split(":") for line in f)}


# `streamproxy gateway ARGS` under cProfile (run with `python -c`, so that the gateway's tree comes
# first on sys.path): SIGUSR1 starts the profile, SIGUSR2 stops it and dumps it to $COUNTS_PROFILE.
PROFILED_GATEWAY = """
import cProfile, os, runpy, signal, sys
prof = cProfile.Profile()
def stop(*_):
    prof.disable()
    prof.dump_stats(os.environ["COUNTS_PROFILE"])
signal.signal(signal.SIGUSR1, lambda *_: prof.enable())
signal.signal(signal.SIGUSR2, stop)
sys.argv = ["streamproxy", "gateway", *sys.argv[1:]]
runpy.run_module("streamproxy", run_name="__main__")
"""


async def _window(gw: Server, args: argparse.Namespace, up_pid: int) -> dict:
    raw = loadgen.build_request("127.0.0.1", gw.port, "/v1/chat/completions",
                                loadgen.request_body("chat", relays.UPSTREAM_NAME, args.max_tokens))
    conns = await loadgen.connect_all("127.0.0.1", gw.port, args.concurrency, parse=True)
    try:
        await loadgen.run_load(gw.base, raw, args.concurrency, args.concurrency * 2, conns=conns)  # warm-up
        if args.profile:
            os.kill(gw.pid, signal.SIGUSR1)
        await asyncio.sleep(0.2)
        io0, up0, cpu0 = _io(gw.pid), _io(up_pid), procstat.tree_cpu_seconds([gw.pid])
        res = await loadgen.run_load(gw.base, raw, args.concurrency, args.requests, conns=conns)
        io1, up1, cpu1 = _io(gw.pid), _io(up_pid), procstat.tree_cpu_seconds([gw.pid])
        if args.profile:
            os.kill(gw.pid, signal.SIGUSR2)
            await asyncio.sleep(1.0)
    finally:
        loadgen.close_all(conns)
    s = loadgen.summarize(res)
    streams, events = max(s["requests"] - s["errors"], 1), max(s["sse_events"], 1)
    return {"streams": streams, "errors": s["errors"], "events_per_stream": round(events / streams, 2),
            "gateway_writes_per_stream": round((io1["syscw"] - io0["syscw"]) / streams, 2),
            "gateway_reads_per_stream": round((io1["syscr"] - io0["syscr"]) / streams, 2),
            "replica_writes_per_stream": round((up1["syscw"] - up0["syscw"]) / streams, 2),
            "cpu_us_per_event_noisy": round((cpu1 - cpu0) / events * 1e6, 1), "_events": events}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.gateway_counts", description=__doc__.split("\n\n")[0])
    ap.add_argument("trees", nargs="+", help="source trees whose gateway to count (PYTHONPATH)")
    ap.add_argument("--requests", type=int, default=200, help="streams in the counted window (default 200)")
    ap.add_argument("-c", "--concurrency", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--token-delay", type=float, default=0.02, help="the replica's step in s (default 0.02)")
    ap.add_argument("--upstream-tree", default=str(ROOT), help="the replica's source tree (default this one)")
    ap.add_argument("--profile", action="store_true", help="count Python function calls too (cProfile)")
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="gateway-counts-"))
    up = fake_server(["--fake-token-delay", str(args.token_delay)], "counts-upstream")
    up.cwd, up.env = args.upstream_tree, {"PYTHONPATH": args.upstream_tree}
    servers: list[Server] = [up]
    try:
        up.start()
        up.wait_ready(60)
        gws = []
        for i, tree in enumerate(args.trees):
            gw = relays.gateway_server([up.base], "counts", tmp, label=f"gateway{i}")
            gw.cwd, gw.env = tree, {"PYTHONPATH": tree, "COUNTS_PROFILE": str(tmp / f"gateway{i}.prof")}
            if args.profile:
                gw.cmd = [sys.executable, "-c", PROFILED_GATEWAY, *gw.cmd[4:]]
            gw.start()
            servers.append(gw)
            gws.append(gw)
        for gw in gws:
            gw.wait_ready(120)
        for i, (tree, gw) in enumerate(zip(args.trees, gws)):
            row = {"tree": tree, **asyncio.run(_window(gw, args, up.pid))}
            events = row.pop("_events")
            if args.profile:
                calls = pstats.Stats(str(tmp / f"gateway{i}.prof")).total_calls  # type: ignore[attr-defined]
                row["python_calls_per_stream"] = round(calls / row["streams"], 1)
                row["python_calls_per_event"] = round(calls / events, 2)
            print(json.dumps(row), flush=True)
    finally:
        for srv in reversed(servers):
            srv.stop(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
