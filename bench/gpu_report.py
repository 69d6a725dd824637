"""The gpu regime's report (bench/gpu.py): every figure as min / median / max over rounds, and ratios per round.

Input: compare.py's rows (one per measured round: model, concurrency, server,
round and the metrics), the model column already labelled "stand-in engine".
Three kinds of table, each titled with that label:

- per level and server, min / median / max over the rounds of front-end CPU
  per 1,000 tokens, tok/s, TTFT p50, ITL p50 and p99, with the stand-in
  engine's requests per step and busy share (the modelled steps' share of
  the wall time: below 1, the engine waited for the front end) and the
  machine's other cores (noise) as medians;
- per level, streamproxy / vLLM's Rust front end and streamproxy / vLLM's
  Python server: each round's ratio (round r of one against round r of the
  other, measured back to back), min / median / max, and the ratio of the
  medians;
- per level, the per-round ratios of front-end CPU per token, listed.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable

from .gpu import LABEL
from .report import _fmt, chrt_label, spread

CHART_TITLE = f"{LABEL}: streamproxy vs vLLM's Rust and Python front ends (bars: median of rounds; dots: each round)"
SERVERS = ["vllm", "vllm-rust", "streamproxy-base", "streamproxy"]
NAMES = {"vllm": "vLLM's Python server", "vllm-rust": "vLLM's Rust front end"}

# key, column title, format; lower is better for all but tok/s.
FIGURES = [
    ("fe_cpu_ms_per_1k", "front-end CPU ms/1k tok", "{:.1f}"),
    ("tok_per_s", "out tok/s", "{:.0f}"),
    ("ttft_p50_ms", "TTFT p50 ms", "{:.0f}"),
    ("itl_p50_ms", "ITL p50 ms", "{:.1f}"),
    ("itl_p99_ms", "ITL p99 ms", "{:.1f}"),
]
CONTEXT = [
    ("engine_batch_mean", "engine requests/step", "{:.0f}"),
    ("engine_busy", "engine busy", "{:.2f}"),
    ("other_cores", "other cores", "{:.2f}"),
]


def _median(values: Iterable[float | None]) -> float:
    vals = [v for v in values if v is not None and not math.isnan(v)]
    return statistics.median(vals) if vals else float("nan")


def _groups(rows: list[dict]) -> dict[tuple[str, int, str], list[dict]]:
    out: dict[tuple[str, int, str], list[dict]] = {}
    for r in rows:
        out.setdefault((r["model"], r["concurrency"], r["server"]), []).append(r)
    return out


def _servers(rows: list[dict]) -> list[str]:
    seen = list(dict.fromkeys(r["server"] for r in rows))
    return [s for s in SERVERS if s in seen] + [s for s in seen if s not in SERVERS]


def _ratios(a: list[dict], b: list[dict], key: str) -> list[float]:
    """Round r of `a` over round r of `b`, for the rounds both have."""
    by_round = {r["round"]: r for r in b}
    out = []
    for r in a:
        other = by_round.get(r["round"])
        if other is None:
            continue
        x, y = r.get(key), other.get(key)
        if x is not None and y and not math.isnan(x) and not math.isnan(y):
            out.append(x / y)
    return out


def spread_table(rows: list[dict]) -> list[str]:
    groups, servers = _groups(rows), _servers(rows)
    lines = [f"## Every round: min / median / max ({LABEL})", "",
             "| model | conc | server | rounds | " + " | ".join(t for _, t, _ in FIGURES) + " | "
             + " | ".join(f"{t} (median)" for _, t, _ in CONTEXT) + " | errors |",
             "|" + "---|" * (len(FIGURES) + len(CONTEXT) + 5)]
    for model, conc in dict.fromkeys((m, c) for m, c, _ in groups):
        for s in servers:
            rs = groups.get((model, conc, s))
            if not rs:
                continue
            lines.append(f"| {model} | {conc} | {NAMES.get(s, s)} | {len(rs)} | "
                         + " | ".join(spread([r.get(k) for r in rs], f) for k, _, f in FIGURES) + " | "
                         + " | ".join(_fmt(f, _median(r.get(k) for r in rs)) for k, _, f in CONTEXT)
                         + f" | {sum(r.get('errors', 0) for r in rs)} |")
    return lines + [""]


def ratio_table(rows: list[dict], theirs: str) -> list[str]:
    """Each streamproxy server against `theirs`: per-round ratios (min / median / max) and the medians' ratio."""
    groups = _groups(rows)
    ours = [s for s in _servers(rows) if s.startswith("streamproxy")]
    lines: list[str] = []
    for model, conc in dict.fromkeys((m, c) for m, c, _ in groups):
        b = groups.get((model, conc, theirs))
        for s in ours:
            a = groups.get((model, conc, s))
            if not a or not b:
                continue
            cells = []
            for k, _, _ in FIGURES:
                per_round = _ratios(a, b, k)
                medians = _median(r.get(k) for r in a) / _median(r.get(k) for r in b)
                cells.append(f"{spread(per_round, '{:.2f}')} ({_fmt('{:.2f}', medians)})")
            lines.append(f"| {model} | {conc} | {s} / {theirs} | {len(_ratios(a, b, 'tok_per_s'))} | "
                         + " | ".join(cells) + " |")
    if not lines:
        return []
    return [f"## {NAMES[theirs]}: streamproxy / {theirs}, per round ({LABEL})", "",
            "Cells: min / median / max of the rounds' own ratios (round r of each, measured back to back), and in "
            "brackets the ratio of the two medians. tok/s: higher is better; everything else: lower is better.", "",
            "| model | conc | ratio | rounds | " + " | ".join(t for _, t, _ in FIGURES) + " |",
            "|" + "---|" * (len(FIGURES) + 4), *lines, ""]


def cpu_rounds(rows: list[dict], theirs: str = "vllm-rust") -> list[str]:
    groups = _groups(rows)
    lines = []
    for model, conc in dict.fromkeys((m, c) for m, c, _ in groups):
        a, b = groups.get((model, conc, "streamproxy")), groups.get((model, conc, theirs))
        if a and b:
            vals = ", ".join(f"{x:.2f}" for x in _ratios(a, b, "fe_cpu_ms_per_1k"))
            lines.append(f"| {model} | {conc} | {vals} |")
    if not lines:
        return []
    return [f"## Front-end CPU per token, streamproxy / {theirs}, every round in order ({LABEL})", "",
            "| model | conc | rounds 1, 2, ... |", "|---|---|---|", *lines, ""]


def markdown(rows: list[dict], meta: dict) -> str:
    lines = [f"# streamproxy vs vLLM's Rust front end vs vLLM's Python server, {LABEL}{chrt_label(meta)} "
             f"({meta.get('when', '')})", ""]
    lines += [f"- {k}: {v}" for k, v in meta.items() if k != "when"]
    lines += ["", f"{LABEL}: the engine's pace is modelled (a GPU-like step), the front ends' work is real: each "
              "one's CPU is its serving process alone (/proc/PID/stat utime+stime over the round / tokens; for the "
              "Rust front end the vllm-rs process, not `vllm serve`'s Python launcher above it). Rounds alternate "
              "between the servers, all up at once on the same engine flags; the load generator shares the "
              "machine.", ""]
    lines += spread_table(rows)
    lines += ratio_table(rows, "vllm-rust")
    lines += ratio_table(rows, "vllm")
    lines += cpu_rounds(rows)
    return "\n".join(lines)
