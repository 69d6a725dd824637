"""The request ledger's costs: records/s each store takes, the event loop's cost per record, and the
gateway's CPU per event and TTFT with the ledger off, on SQLite and on PostgreSQL (same run).

    python -m bench.ledger [--records 50000] [--requests 1500] [--concurrency 16] [--tokens 16]
                           [--rounds 2] [--postgres URL] [--skip-gateway]

Stores: `write` of 1000-record batches straight into each store (memory,
SQLite in a temporary folder, PostgreSQL: `--postgres URL`, else a server
from pgserver's binaries, as the tests start it), and the `Ledger` writer end
to end (N `add`s, then `close`: the event loop's share is the `add` time).
Gateway: one `streamproxy serve --engine fake` replica and three gateway
processes over it (ledger off / SQLite / PostgreSQL); rounds of the same
closed-loop load (bench.loadgen) go to each in turn (the order rotated per round), and each gateway's
utime+stime over its rounds is divided by the events it relayed. Printed as
a table; nothing is written.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import yaml

from bench.loadgen import build_request, request_body, run_load
from bench.procstat import cpu_seconds
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
    from tests.support.postgres import PostgresServer

    server = PostgresServer()
    return server.database(), server


async def gateway_costs(args: argparse.Namespace, pg_url: str, folder: Path) -> list[tuple[str, float, float, float, int]]:
    from tests.support.server import FAKE_ARGS, serve_process, start_gateway

    rows = []
    with serve_process([*FAKE_ARGS, "--served-model-name", "fake", "--fake-token-delay", "0.002"], log_dir=folder, name="replica") as rep:
        gateways = {}
        for name, ledger in (("off", "off"), ("sqlite", f"sqlite://{folder}/ledger.db"), ("postgresql", pg_url)):
            config = {"access_log": "off", "ledger": ledger,
                      "deployments": [{"name": "fake", "id": "dep-fake", "upstreams": [rep.base]}]}
            gateways[name] = start_gateway(config, folder, name=f"gw-{name}")
        try:
            cpu = dict.fromkeys(gateways, 0.0)
            events = dict.fromkeys(gateways, 0)
            ttfts: dict[str, list[float]] = {name: [] for name in gateways}
            body = request_body("chat", "fake", args.tokens)
            names = list(gateways)
            for k in range(args.rounds):
                for name in names[k % 3:] + names[:k % 3]:  # each ledger first in turn: no order effect
                    gw = gateways[name]
                    raw = build_request("127.0.0.1", gw.port, "/v1/chat/completions", body)
                    before = cpu_seconds(gw.proc.pid)
                    result = await run_load(gw.base, raw, args.concurrency, args.requests)
                    time.sleep(0.7)  # the ledger's batch of this round is written within it, and counted here
                    cpu[name] += cpu_seconds(gw.proc.pid) - before
                    ok = result.ok
                    assert len(ok) == args.requests, result.errors[:3]
                    events[name] += sum(r.sse_events for r in ok)
                    ttfts[name] += [r.ttft for r in ok if r.ttft is not None]
            for name in gateways:
                rows.append((name, cpu[name] / events[name] * 1e6, statistics.median(ttfts[name]) * 1e3,
                             statistics.quantiles(ttfts[name], n=100)[98] * 1e3, events[name]))
        finally:
            for gw in gateways.values():
                gw.stop()
    return rows


async def main_async(args: argparse.Namespace) -> None:
    folder = Path(tempfile.mkdtemp(prefix="bench-ledger-"))
    pg, server = postgres_url(args.postgres)
    try:
        print(f"stores: {args.records} records, batches of 1000")
        print(f"{'store':<12}{'write rec/s':>14}{'Ledger rec/s':>14}{'add µs':>9}{'CPU µs/rec':>12}")
        for name, url in (("memory", "memory:"), ("sqlite", f"sqlite://{folder}/store.db"), ("postgresql", pg)):
            direct, through, add_us, cpu_us = await store_rates(url, args.records)
            print(f"{name:<12}{direct:>14,.0f}{through:>14,.0f}{add_us:>9.2f}{cpu_us:>12.2f}")
        if not args.skip_gateway:
            pg2 = server.database() if server is not None else pg  # type: ignore[attr-defined]
            rows = await gateway_costs(args, pg2, folder)
            base = rows[0][1]
            print(f"\ngateway: {args.rounds} x {args.requests} streams of {args.tokens} tokens, {args.concurrency} at once, per ledger")
            print(f"{'ledger':<12}{'CPU µs/event':>14}{'vs off':>9}{'TTFT p50 ms':>13}{'p99 ms':>9}{'events':>9}")
            for name, per_event, p50, p99, n in rows:
                print(f"{name:<12}{per_event:>14.1f}{(per_event / base - 1) * 100:>+8.1f}%{p50:>13.2f}{p99:>9.2f}{n:>9}")
    finally:
        if server is not None:
            server.close()  # type: ignore[attr-defined]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=50_000)
    ap.add_argument("--requests", type=int, default=1500)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--postgres", help="a PostgreSQL URL (default: a server from pgserver's binaries)")
    ap.add_argument("--skip-gateway", action="store_true")
    asyncio.run(main_async(ap.parse_args()))


if __name__ == "__main__":
    main()
