"""The relay benchmark's figures: medians over rounds, added TTFT, the Markdown, the targets.

Input: bench/gateway.py's rows, one per (level, round, relay). Each cell is
the median over the rounds of that (level, relay) (bench/report.py's
`_median`); 'added TTFT' is the relay's median TTFT p50 (and mean) minus
direct's at the same level; 'vs nginx' divides a relay's CPU per event by
nginx's. The targets of issue 13 are checked on those medians.

`distribution`: per level and relay, min / median / max over the rounds of
tok/s, TTFT p50, added TTFT p50 (each round against direct's in the same
round), relay CPU and run-queue wait per event, the slow rounds (tok/s below
half the relay's best at that level, bench/report.py's `SLOW`), and the
"why slow" figures' medians in the slow rounds and in the others.
"""

from __future__ import annotations

import math
from pathlib import Path

from .report import SLOW, _fmt, _median, chrt_label, ratio, spread_table
from .servers import Server

# key, column title, format
METRICS = [
    ("us_per_event", "relay µs CPU/event", "{:.2f}"),
    ("upstream_us_per_event", "upstreams µs CPU/event", "{:.2f}"),
    ("relay_cores", "relay cores", "{:.2f}"),
    ("tok_per_s", "out tok/s", "{:.0f}"),
    ("ttft_p50_ms", "TTFT p50 ms", "{:.2f}"),
    ("ttft_mean_ms", "TTFT mean ms", "{:.2f}"),
    ("ttft_p99_ms", "TTFT p99 ms", "{:.1f}"),
    ("itl_p50_ms", "ITL p50 ms", "{:.2f}"),
    ("itl_p99_ms", "ITL p99 ms", "{:.1f}"),
    ("events_per_request", "events/request", "{:.1f}"),
    ("client_cores", "client cores", "{:.2f}"),
    ("other_cores", "other cores", "{:.2f}"),
]
RELAYS = ("direct", "gateway", "nginx", "litellm")
CELLS = ("Cells: median over rounds. relay CPU: utime+stime (/proc/PID/stat, 10 ms ticks) of the relay process and its "
         "descendants over the run / SSE `data:` events the client received ([DONE] included); 'direct' has no relay. "
         "'vs nginx': relay CPU per event / nginx's. 'added TTFT': TTFT minus direct's at the same level. 'other "
         "cores': busy CPU of everything else on the machine (other people's jobs, the idle relays): if high, the run "
         "was disturbed. An ITL p50 of 0 means the relay hands over several events at once.")

# Issue 13's targets: the gateway's relay CPU per event at these levels, and its added TTFT p50 at 64.
TARGET_US_PER_EVENT = 10.0
TARGET_US_LEVELS = (64, 256)
TARGET_ADDED_TTFT_MS = (64, 1.0)


# The distribution table (bench/report.py's `spread_table`): min / median / max of these ...
SPREAD = [
    ("tok_per_s", "out tok/s", "{:.0f}"),
    ("ttft_p50_ms", "TTFT p50 ms", "{:.2f}"),
    ("added_ttft_p50_ms", "added TTFT p50 ms", "{:+.2f}"),
    ("us_per_event", "relay µs CPU/event", "{:.2f}"),
    ("relay_wait_us_per_event", "relay wait µs/event", "{:.2f}"),
]
# ... and the median of these in the slow rounds vs in the others.
WHY = [
    ("relay_wait_us_per_event", "relay wait µs/event", "{:.2f}"),
    ("upstream_wait_us_per_event", "upstreams wait µs/event", "{:.2f}"),
    ("other_cores", "other cores", "{:.2f}"),
]
COST = "the relays' own cost"


def describe(servers: dict[str, Server], tmp: Path, public: str) -> dict[str, str]:
    out = {}
    if "gateway" in servers:
        out["gateway"] = (f"`streamproxy gateway --config` (deployment `{public}` -> upstream model `fake`, "
                          "default upstream policy, access log to its log file)")
    if "nginx" in servers:
        out["nginx"] = ("nginx-light: worker_processes 1, proxy_buffering off, proxy_http_version 1.1, "
                        "upstream keepalive 512, round robin, access log on (temp dir)")
    if "litellm" in servers:
        out["litellm"] = (f"LiteLLM proxy (`litellm --config`, 1 uvicorn worker): model `{public}` = "
                          "`openai/fake` on each upstream, no database, LITELLM_LOG=ERROR, telemetry off")
    return out


def line(r: dict) -> str:
    cpu = "relay    n/a     " if r["us_per_event"] is None else \
        f"relay {r['us_per_event']:6.2f} µs/ev ({r['relay_cores']:.2f} cores, wait {r['relay_wait_us_per_event']:.2f} " \
        f"µs/ev, {r['relay_wakeups_per_1k']:.0f} wake-ups {r['relay_preempted_per_1k']:.0f} preempted " \
        f"{r['relay_writes_per_1k']:.0f} writes /1k ev)"
    return (f"c={r['concurrency']:4d} round {r['round']} {r['relay']:>8}: {cpu}  upstreams "
            f"{r['upstream_us_per_event']:5.2f} µs/ev  {r['tok_per_s']:7.0f} tok/s  TTFT p50 {r['ttft_p50_ms']:6.2f} "
            f"mean {r['ttft_mean_ms']:6.2f} p99 {r['ttft_p99_ms']:6.1f} ms  ITL p50 {r['itl_p50_ms']:5.2f} ms  "
            f"{r['events_per_request']:.1f} ev/req  client {r['client_cores']:.2f} other {r['other_cores']:.2f}  "
            f"upstreams wait {r['upstream_wait_us_per_event']:.2f} µs/ev  steal {r['steal_cores']:.2f}  "
            f"requests {r['requests']} errors {r['errors']}" + (f" ({r['first_error']})" if r["errors"] else ""))


def summary(rows: list[dict]) -> dict:
    """{level: {relay: medians, plus added TTFT and the ratio to nginx, and every round's values}}."""
    out: dict = {}
    labels = [*RELAYS, *sorted({r["relay"] for r in rows} - set(RELAYS))]  # then variants, the baseline
    for conc in sorted({r["concurrency"] for r in rows}):
        cells: dict = {}
        for relay in labels:
            rs = [r for r in rows if r["concurrency"] == conc and r["relay"] == relay]
            if rs:
                m = {k: _median([r.get(k) for r in rs]) for k, _, _ in METRICS}
                m.update(rounds=len(rs), requests=sum(r["requests"] for r in rs), errors=sum(r["errors"] for r in rs))
                cells[relay] = m
        for relay, vals in spreads(rows).get(conc, {}).items():
            cells[relay]["values"] = vals
        for relay, m in cells.items():
            d, n = cells.get("direct"), cells.get("nginx")
            m["added_ttft_p50_ms"] = m["ttft_p50_ms"] - d["ttft_p50_ms"] if d and relay != "direct" else float("nan")
            m["added_ttft_mean_ms"] = m["ttft_mean_ms"] - d["ttft_mean_ms"] if d and relay != "direct" else float("nan")
            m["vs_nginx"] = ratio(m["us_per_event"], n["us_per_event"]) if n else float("nan")
        out[conc] = cells
    return out


def with_added(rows: list[dict]) -> list[dict]:
    """The rows, each relay's with `added_ttft_p50_ms`: its TTFT p50 minus direct's in the same level and round."""
    direct = {(r["concurrency"], r["round"]): r["ttft_p50_ms"] for r in rows if r["relay"] == "direct"}
    out = []
    for r in rows:
        d = direct.get((r["concurrency"], r["round"]))
        added = r["ttft_p50_ms"] - d if d is not None and r["relay"] != "direct" else float("nan")
        out.append({**r, "added_ttft_p50_ms": added})
    return out


def spreads(rows: list[dict]) -> dict:
    """{level: {relay: {key: every round's value}}} for the distribution table (run order)."""
    out: dict = {}
    keys = list(dict.fromkeys(k for k, _, _ in (*SPREAD, *WHY)))  # once each: the lists run parallel to the rounds
    for r in with_added(rows):
        vals = out.setdefault(r["concurrency"], {}).setdefault(r["relay"], {})
        for k in keys:
            vals.setdefault(k, []).append(r.get(k))
    return out


def distribution(rows: list[dict], label: str = "") -> list[str]:
    """Per level and relay: min / median / max over the rounds, slow rounds, and the 'why slow' medians."""
    labels = [*RELAYS, *sorted({r["relay"] for r in rows} - set(RELAYS))]
    groups = [([str(conc), relay], cells[relay]) for conc, cells in sorted(spreads(rows).items())
              for relay in labels if relay in cells]
    return ["", f"## Every round: min / median / max{label}", "",
            f"Slow rounds: tok/s below {SLOW:.0%} of the same relay's best round at that level ('direct' shows the "
            "machine's own). Added TTFT: against direct's TTFT p50 in the same round. Wait: run-queue wait "
            "(schedstat; runnable but not running) of the relay's (upstreams') threads per event, µs = ms per 1,000 "
            "events. 'slow / rest': the median over the slow rounds and over the others ('-': none).", "",
            *spread_table(["streams", "relay"], groups, SPREAD, extra=WHY)]


def markdown(rows: list[dict], meta: dict) -> str:
    summ = summary(rows)
    quick = " — QUICK RUN (`--quick`), not a full measurement" if meta.get("quick") else ""
    label = chrt_label(meta, COST)
    lines = [f"# SSE relay cost: streamproxy gateway vs nginx vs LiteLLM{label} ({meta['when']}){quick}", ""]
    for k, v in meta.items():
        if k in ("when", "quick"):
            continue
        if isinstance(v, dict):
            lines += [f"- {k}:"] + [f"  - {kk}: {vv}" for kk, vv in v.items()]
        else:
            lines.append(f"- {k}: {v}")
    lines += ["", CELLS, ""]
    head = ["streams", "relay", *(t for _, t, _ in METRICS[:3]), "vs nginx", "added TTFT p50 ms",
            "added TTFT mean ms", *(t for _, t, _ in METRICS[3:]), "rounds", "requests", "errors"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for conc, cells in summ.items():
        for relay, m in cells.items():
            vals = [_fmt(f, m[k]) for k, _, f in METRICS]
            lines.append(f"| {conc} | {relay} | " + " | ".join(vals[:3]) + f" | {_fmt('{:.2f}', m['vs_nginx'])} | "
                         f"{_fmt('{:+.2f}', m['added_ttft_p50_ms'])} | {_fmt('{:+.2f}', m['added_ttft_mean_ms'])} | "
                         + " | ".join(vals[3:]) + f" | {m['rounds']} | {m['requests']} | {m['errors']} |")
    lines += distribution(rows, " (under chrt)" if label else "")
    lines += targets(summ, bool(meta.get("quick")), " (under chrt)" if label else "")
    return "\n".join(lines)


def _met(value: float, bound: float) -> str:
    if value is None or math.isnan(value):
        return "n/a"
    return "yes" if value <= bound else "**no**"


def targets(summ: dict, quick: bool, label: str = "") -> list[str]:
    lines = []
    for conc in TARGET_US_LEVELS:
        g = summ.get(conc, {}).get("gateway")
        if g:
            lines.append(f"| gateway relay CPU per SSE event at {conc} streams at most {TARGET_US_PER_EVENT:g} µs | "
                         f"{_fmt('{:.2f}', g['us_per_event'])} µs ({_fmt('{:.2f}x', g['vs_nginx'])} nginx) | "
                         f"{_met(g['us_per_event'], TARGET_US_PER_EVENT)} |")
    conc, bound = TARGET_ADDED_TTFT_MS
    g = summ.get(conc, {}).get("gateway")
    if g:
        lines.append(f"| gateway's added TTFT p50 at {conc} streams (over calling the upstream directly) at most "
                     f"{bound:g} ms | {_fmt('{:+.2f}', g['added_ttft_p50_ms'])} ms (mean "
                     f"{_fmt('{:+.2f}', g['added_ttft_mean_ms'])} ms) | {_met(g['added_ttft_p50_ms'], bound)} |")
    if not lines:
        return []
    note = ["", ("Quick run: one short round per relay on a shared 2-core machine; these figures validate the "
                 "harness and are not a verdict.")] if quick else []
    return ["", f"## Targets (issue 13){label}", "", "| target | measured | met |", "|---|---|---|", *lines, *note]
