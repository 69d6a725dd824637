"""`streamproxy usage`: the ledger's usage sums as a table, read from the store directly.

    streamproxy usage --since 7d --by key [--until T] [--deployment D] [--key K]
                      [--ledger URL | --config gateway.yaml] [--json]

The store is `--ledger`, else the `ledger:` of the gateway's `--config`,
else the gateway's default (`$STREAMPROXY_LEDGER`, ~/.local/state/...). The
rows are `GET /v1/usage`'s (the same query, `ledger.params`), printed as a
table with a total line, or as that route's JSON with `--json`.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import TextIO

import msgspec
import yaml

from streamproxy.errors import APIError
from streamproxy.ledger import params
from streamproxy.ledger.records import UsageReport, UsageRow
from streamproxy.ledger.store import default_url, kind, open_store, redact

_COUNTS = ("requests", "prompt_tokens", "cached_prompt_tokens", "completion_tokens", "total_tokens")
_HEADS = {"deployment": "deployment", "key": "key", "day": "day", "month": "month", "requests": "requests",
          "prompt_tokens": "prompt", "cached_prompt_tokens": "cached", "completion_tokens": "completion", "total_tokens": "total"}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="streamproxy usage", description="Requests and tokens from the request ledger.")
    p.add_argument("--since", default="30d", help="how far back: 7d, 12h, 30m (default 30d)")
    p.add_argument("--start", help="from this time instead (unix seconds or ISO 8601)")
    p.add_argument("--until", help="up to this time (default: now)")
    p.add_argument("--by", default="deployment,key,day", help="comma-separated: deployment, key, day or month")
    p.add_argument("--deployment", help="only this deployment (its name)")
    p.add_argument("--key", help="only this key (its id)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--ledger", help="the ledger's URL (sqlite:///path, postgresql://...)")
    where.add_argument("--config", help="the gateway's config file: its `ledger:`")
    p.add_argument("--json", action="store_true", help="GET /v1/usage's JSON instead of a table")
    return p


def ledger_url(ns: argparse.Namespace) -> str:
    if ns.ledger:
        return str(ns.ledger)
    if ns.config:
        data = yaml.safe_load(Path(ns.config).read_text()) or {}
        if isinstance(data, dict) and data.get("ledger"):
            return str(data["ledger"])
    return default_url()


def query_params(ns: argparse.Namespace, now: float) -> dict[str, str]:
    start = ns.start if ns.start else str(now - params.duration_s(ns.since, "since"))
    out = {"start": start, "group_by": ns.by}
    if ns.until:
        out["end"] = ns.until
    if ns.deployment:
        out["deployment"] = ns.deployment
    if ns.key:
        out["key_id"] = ns.key
    return out


def table(report: UsageReport, out: TextIO) -> None:
    dims = [d for d in report.group_by]
    heads = [_HEADS[d] for d in dims] + [_HEADS[c] for c in _COUNTS]

    def cells(r: UsageRow) -> list[str]:
        values = {"deployment": r.deployment, "key": r.key_id, "day": r.period, "month": r.period}
        return [str(values[d] if values[d] is not None else "-") for d in dims] + [str(getattr(r, c)) for c in _COUNTS]

    rows = [cells(r) for r in report.data]
    totals = [sum(getattr(r, c) for r in report.data) for c in _COUNTS]
    rows.append((["total"] + [""] * (len(dims) - 1) if dims else []) + [str(t) for t in totals])
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(heads)]
    numeric = [False] * len(dims) + [True] * len(_COUNTS)

    def line(values: list[str]) -> str:
        return "  ".join(v.rjust(w) if n else v.ljust(w) for v, w, n in zip(values, widths, numeric)).rstrip()

    out.write(line(heads) + "\n")
    for r in rows[:-1]:
        out.write(line(r) + "\n")
    out.write(line(["-" * w for w in widths]) + "\n")
    out.write(line(rows[-1]) + "\n")


async def _report(url: str, query: params.UsageQuery) -> UsageReport:
    store = await open_store(url)
    try:
        rows = await store.usage(query)
    finally:
        await store.close()
    return UsageReport(data=rows, start=query.start_us // 1_000_000, end=-(-query.end_us // 1_000_000), group_by=list(query.group_by))


def main(argv: list[str], out: TextIO = sys.stdout) -> int:
    ns = parser().parse_args(argv)
    url = ledger_url(ns)
    if kind(url) == "off":
        raise SystemExit("streamproxy usage: the ledger is off (`ledger: off`): nothing to read")
    now = time.time()
    try:
        query = params.usage_query(query_params(ns, now), int(now * 1_000_000))
    except APIError as exc:
        raise SystemExit(f"streamproxy usage: {exc.message}".replace("`since`", "--since").replace("`group_by`", "--by")) from None
    try:
        report = asyncio.run(_report(url, query))
    except Exception as exc:
        raise SystemExit(f"streamproxy usage: cannot read the ledger at {redact(url)}: {type(exc).__name__}: {exc}") from None
    if ns.json:
        out.write(msgspec.json.encode(report).decode() + "\n")
    else:
        table(report, out)
    return 0
