"""The request ledger's costs: records/s each store takes, the event loop's cost per record, and the
gateway's CPU per event and TTFT with the ledger off, on SQLite and on PostgreSQL (same run).

    python -m bench.ledger [--records 50000] [--store-rounds 3] [--requests 1500] [--concurrency 16] [--tokens 16]
                           [--rounds 5] [--postgres URL] [--skip-gateway] [--quick]
    make bench-gateway BENCH_ARGS="--ledger [--quick] [the flags above]"

Stores: `write` of 1000-record batches straight into each store (memory,
SQLite in a temporary folder, PostgreSQL: `--postgres URL`, else a server
from pgserver's binaries, as the tests start it), and the `Ledger` writer end
to end (N `add`s, then `close`: the event loop's share is the `add` time).
Gateway: one `streamproxy serve --engine fake` replica and three gateway
processes over it (ledger off / SQLite / PostgreSQL); in each round the same
closed-loop load (bench.loadgen) goes to all three at once, so that whatever
else the machine does in that round (a busy SMT sibling, other sessions) it
does to all three alike (`--sequential`: one after the other, the order
rotated per round): per round, each gateway's utime+stime divided by the
events it relayed, its TTFT p50, and both against the ledger-off gateway of
that round. Printed as Markdown tables of min / median / max over the
rounds (bench.report.spread); nothing is written.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.loadgen import build_request, request_body, run_load
from bench.procstat import cpu_seconds, threads_cpu_seconds
from bench.report import spread
from streamproxy.ledger.records import LedgerRecord
from streamproxy.ledger.store import open_store
from streamproxy.ledger.writer import Ledger


def record(i: int) -> LedgerRecord:
    return LedgerRecord(ts_us=1_764_547_200_000_000 + i * 1000, request_id=f"bench-{i:08x}", deployment="support-bot",
                        replica="http://127.0.0.1:8001", key_id="team-a", route="/v1/chat/completions", status=200,
                        prompt_tokens=24, cached_prompt_tokens=0, completion_tokens=16, usage_source="billed", ttft_ms=3.25,
                        duration_ms=40.5)


async def store_rates(url: str, n: int) -> tuple[float, float, float, float]:
    """(records/s by store.write in 1000-record batches, records/s through Ledger add+close, µs per add,
    this process's CPU µs per record through the Ledger: the loop's and the store thread's together)."""
    records = [record(i) for i in range(n)]
    store = await open_store(url)
    t0 = time.perf_counter()
    for i in range(0, n, 1000):
        await store.write(records[i:i + 1000])
    direct = n / (time.perf_counter() - t0)
    await store.close()
    ledger = Ledger(await open_store(url), interval=0.5, max_buffered=n + 1)
    ledger.start()
    cpu0, t0 = time.process_time(), time.perf_counter()
    for r in records:
        ledger.add(r)
    added = time.perf_counter() - t0
    await ledger.close()
    through = n / (time.perf_counter() - t0)
    return direct, through, added / n * 1e6, (time.process_time() - cpu0) / n * 1e6


def postgres_url(given: str | None) -> tuple[str, object | None]:
    if given:
        return given, None
    from harness.postgres import PostgresServer

    server = PostgresServer()
    return server.database(), server


# Per ledger, per round: CPU µs per event, TTFT p50 ms, and against the ledger-off gateway of the same round:
# the CPU per event's difference (%) and the added TTFT p50 (ms).
Rounds = dict[str, dict[str, list[float]]]
LEDGERS = ("off", "sqlite", "postgresql")


async def measure(gateways: dict[str, Any], args: argparse.Namespace, body: dict, events: dict[str, int]
                  ) -> dict[str, tuple[float, float, float]]:
    """One load per gateway, all at once: (CPU µs per event, TTFT p50 ms, the ledger's writer thread's
    CPU µs per event) for each."""
    before = {name: cpu_seconds(gw.proc.pid) for name, gw in gateways.items()}
    writer_before = {name: threads_cpu_seconds(gw.proc.pid, "ledger-") for name, gw in gateways.items()}
    results = await asyncio.gather(*(
        run_load(gw.base, build_request("127.0.0.1", gw.port, "/v1/chat/completions", body), args.concurrency, args.requests)
        for gw in gateways.values()))
    await asyncio.sleep(0.7)  # the ledger's batch of this round is written within it, and counted here
    out = {}
    for (name, gw), result in zip(gateways.items(), results, strict=True):
        cpu = cpu_seconds(gw.proc.pid) - before[name]
        ok = result.ok
        assert len(ok) == args.requests, result.errors[:3]
        n = sum(r.sse_events for r in ok)
        events[name] += n
        writer = threads_cpu_seconds(gw.proc.pid, "ledger-") - writer_before[name]
        out[name] = (cpu / n * 1e6, statistics.median([r.ttft for r in ok if r.ttft is not None]) * 1e3, writer / n * 1e6)
    return out


async def gateway_costs(args: argparse.Namespace, pg_url: str, folder: Path) -> tuple[Rounds, dict[str, int]]:
    from harness.server import FAKE_ARGS, serve_process, start_gateway

    per: Rounds = {name: {"cpu_us": [], "ttft_p50": [], "cpu_vs_off": [], "ttft_vs_off": [], "writer_us": []} for name in LEDGERS}
    events = dict.fromkeys(LEDGERS, 0)
    with serve_process([*FAKE_ARGS, "--served-model-name", "fake", "--fake-token-delay", "0.002"], log_dir=folder, name="replica") as rep:
        gateways = {}
        for name, ledger in zip(LEDGERS, ("off", f"sqlite://{folder}/ledger.db", pg_url)):
            config = {"access_log": "off", "ledger": ledger,
                      "deployments": [{"name": "fake", "id": "dep-fake", "upstreams": [rep.base]}]}
            gateways[name] = start_gateway(config, folder, name=f"gw-{name}")
        try:
            body = request_body("chat", "fake", args.tokens)
            names = list(gateways)
            for k in range(args.rounds):
                this: dict[str, tuple[float, float, float]] = {}
                if args.sequential:
                    for name in names[k % 3:] + names[:k % 3]:  # each ledger first in turn: no order effect
                        this[name] = (await measure({name: gateways[name]}, args, body, events))[name]
                else:
                    this = await measure(gateways, args, body, events)
                off_cpu, off_ttft, _ = this["off"]
                for name, (cpu_us, ttft, writer_us) in this.items():
                    per[name]["writer_us"].append(writer_us)
                    per[name]["cpu_us"].append(cpu_us)
                    per[name]["ttft_p50"].append(ttft)
                    per[name]["cpu_vs_off"].append((cpu_us / off_cpu - 1) * 100)
                    per[name]["ttft_vs_off"].append(ttft - off_ttft)
        finally:
            for gw in gateways.values():
                gw.stop()
    return per, events


async def main_async(args: argparse.Namespace) -> None:
    folder = Path(tempfile.mkdtemp(prefix="bench-ledger-"))
    pg, server = postgres_url(args.postgres)
    try:
        print(f"# The request ledger's cost ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})\n")
        print(f"Stores: {args.records} records in batches of 1000, {args.store_rounds} rounds; min / median / max.\n")
        print("| store | write rec/s | via Ledger rec/s | add µs (loop) | CPU µs/record |\n|---|---:|---:|---:|---:|")
        for name, url in (("memory", "memory:"), ("sqlite", f"sqlite://{folder}/store.db"), ("postgresql", pg)):
            rates: list[tuple[float, float, float, float]] = []
            for k in range(args.store_rounds):
                target = url if name != "sqlite" else f"sqlite://{folder}/store-{k}.db"
                rates.append(await store_rates(target, args.records))
            cols = list(zip(*rates))
            print(f"| {name} | {spread(list(cols[0]), '{:,.0f}')} | {spread(list(cols[1]), '{:,.0f}')} | "
                  f"{spread(list(cols[2]), '{:.2f}')} | {spread(list(cols[3]), '{:.2f}')} |")
        if not args.skip_gateway:
            pg2 = server.database() if server is not None else pg  # type: ignore[attr-defined]
            per, events = await gateway_costs(args, pg2, folder)
            print(f"\nGateway: {args.rounds} rounds of {args.requests} streams of {args.tokens} tokens, {args.concurrency} at "
                  f"once, {'to each gateway in turn (the order rotated per round)' if args.sequential else 'to all three gateways at once'}; "
                  "min / median / max over the rounds; "
                  "'vs off': against the ledger-off gateway of the same round.\n")
            tick = 1e6 / os.sysconf("SC_CLK_TCK") / (events["off"] / args.rounds)
            print(f"CPU from /proc/PID/stat in clock ticks: one tick is {tick:.2f} µs per event in a round.\n")
            print("'writer thread': the ledger's store thread's own CPU (schedstat, ns) per event, and against the "
                  "off gateway's CPU per event of the same round.\n")
            print("| ledger | CPU µs/event | CPU vs off | writer thread µs/event | writer thread vs off | TTFT p50 ms | "
                  "added TTFT p50 ms | events |\n|---|---:|---:|---:|---:|---:|---:|---:|")
            for name in LEDGERS:
                v = per[name]
                share = [w / off * 100 for w, off in zip(v["writer_us"], per["off"]["cpu_us"], strict=True)]
                print(f"| {name} | {spread(v['cpu_us'], '{:.1f}')} | {spread(v['cpu_vs_off'], '{:+.1f}%')} | "
                      f"{spread(v['writer_us'], '{:.2f}')} | {spread(share, '{:.1f}%')} | "
                      f"{spread(v['ttft_p50'], '{:.2f}')} | {spread(v['ttft_vs_off'], '{:+.2f}')} | {events[name]} |")
    finally:
        if server is not None:
            server.close()  # type: ignore[attr-defined]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.ledger", description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=50_000)
    ap.add_argument("--requests", type=int, default=1500)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=5, help="gateway rounds (each: every ledger once)")
    ap.add_argument("--store-rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="10000 records, 2 store rounds, 3 gateway rounds of 500 streams")
    ap.add_argument("--postgres", help="a PostgreSQL URL (default: a server from pgserver's binaries)")
    ap.add_argument("--skip-gateway", action="store_true")
    ap.add_argument("--sequential", action="store_true",
                    help="drive one gateway at a time (the order rotated per round) instead of all three at once")
    args = ap.parse_args(argv)
    if args.quick:
        given = {a.split("=", 1)[0] for a in (argv if argv is not None else sys.argv[1:])}
        for flag, value in (("--records", 10_000), ("--store-rounds", 2), ("--rounds", 3), ("--requests", 500)):
            if flag not in given:
                setattr(args, flag[2:].replace("-", "_"), value)
    asyncio.run(main_async(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
