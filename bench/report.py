"""Medians over rounds, ratios, the Markdown table and the PNG chart.

Input: one dict per measured round with at least `model`, `concurrency`,
`server` and the metric keys of `METRICS`. Each cell is the median over the
rounds of that (model, concurrency, server); the ratio row divides
streamproxy's median by vLLM's (for tok/s higher is better, for everything
else lower is better).

Shared with bench/gateway_report.py and bench/fake_capacity.py: `slow_rounds`
(rounds below `SLOW` x the best one), `spread` (min / median / max),
`spread_table` (those per group of rounds, as Markdown), `slow_vs_rest` (a
"why slow" figure's median in the slow rounds and in the others), and
`scheduling` / `chrt_label` (the `--chrt PRIO` option's meta line and the
title label every report under SCHED_FIFO carries).
"""

from __future__ import annotations

import math
import os
import statistics
from pathlib import Path
from typing import Any

# key, column title, format
METRICS = [
    ("tok_per_s", "out tok/s", "{:.0f}"),
    ("ttft_p50_ms", "TTFT p50 ms", "{:.1f}"),
    ("ttft_p99_ms", "TTFT p99 ms", "{:.1f}"),
    ("itl_p50_ms", "ITL p50 ms", "{:.1f}"),
    ("itl_p99_ms", "ITL p99 ms", "{:.1f}"),
    ("fe_cpu_ms_per_1k", "front-end CPU ms/1k tok", "{:.1f}"),
    ("engine_cpu_ms_per_1k", "engine CPU ms/1k tok", "{:.0f}"),
    ("fe_cores", "front-end cores", "{:.2f}"),
    ("other_cores", "other cores", "{:.2f}"),
]
# "streamproxy-base": the same server from another source tree (compare.py --baseline), when run.
SERVERS = ["vllm", "vllm-rust", "streamproxy-base", "streamproxy"]  # vllm-rust: the gpu regime's (bench/gpu.py)
CHART_TITLE = "streamproxy vs vLLM OpenAI server (bars: median of rounds; dots: each round)"


def _median(values: list[float | None]) -> float:
    present = [v for v in values if v is not None and not math.isnan(v)]
    return statistics.median(present) if present else float("nan")


def medians(rows: list[dict]) -> dict[tuple[str, int, str], dict]:
    groups: dict[tuple[str, int, str], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["model"], r["concurrency"], r["server"]), []).append(r)
    out = {}
    for key, rs in groups.items():
        m: dict[str, Any] = {k: _median([r.get(k) for r in rs]) for k, _, _ in METRICS}
        m["rounds"] = len(rs)
        m["errors"] = sum(r.get("errors", 0) for r in rs)
        m["values"] = {k: [r.get(k) for r in rs] for k, _, _ in METRICS}
        out[key] = m
    return out


def _fmt(fmt: str, v: float) -> str:
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else fmt.format(v)


def ratio(a: float, b: float) -> float:
    if a is None or b is None or math.isnan(a) or math.isnan(b) or b == 0:
        return float("nan")
    return a / b


# A round below this fraction of the same server's best round (same model and level) is a slow round.
SLOW = 0.5


def slow_rounds(values: list[float]) -> int:
    """Rounds whose tok/s fell below `SLOW` x the best round's."""
    vals = [v for v in values if v is not None and not math.isnan(v)]
    return sum(v < SLOW * max(vals) for v in vals) if vals else 0


def slow_vs_rest(throughput: list[float], values: list[float], fmt: str) -> str:
    """The median of `values` over the slow rounds (by `throughput`) and over the others: 'slow / rest'.

    The two lists run in parallel (one entry per round); '-' where a side has no round."""
    vals = [v for v in throughput if v is not None and not math.isnan(v)]
    if not vals:
        return "n/a"
    bar = SLOW * max(vals)
    slow: list[float] = []
    rest: list[float] = []
    for t, v in zip(throughput, values):
        if t is None or math.isnan(t) or v is None or math.isnan(v):
            continue
        (slow if t < bar else rest).append(v)
    return " / ".join(fmt.format(statistics.median(side)) if side else "-" for side in (slow, rest))


def scheduling(prio: int, who: str, cost: str = "the front end's own cost") -> str:
    """The `scheduling` meta line of a run with `--chrt PRIO` (0: none): `who` ran under SCHED_FIFO."""
    if prio:
        return f"SCHED_FIFO (chrt -f {prio}) for {who}: {cost}, not how users run"
    return "normal (no chrt), as users run"


def chrt_label(meta: dict, cost: str = "the front end's own cost") -> str:
    """The title's label of a run under SCHED_FIFO (`scheduling` meta line), else ''."""
    if str(meta.get("scheduling", "")).startswith("SCHED_FIFO"):
        return f" -- every process under chrt (SCHED_FIFO): {cost}, not how users run"
    return ""


def set_fifo(prio: int) -> None:
    """`--chrt PRIO`: this process (the load generator) under SCHED_FIFO at PRIO; 0 leaves it alone.
    Children started after this inherit it (compare.py also prefixes the servers with `chrt -f`)."""
    if prio:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(prio))


# The distribution table: key, title, format.
SPREAD = [
    ("tok_per_s", "out tok/s", "{:.0f}"),
    ("ttft_p50_ms", "TTFT p50 ms", "{:.0f}"),
    ("fe_cpu_ms_per_1k", "front-end CPU ms/1k tok", "{:.1f}"),
]


def spread(v: list[float] | list[float | None], fmt: str) -> str:
    vals = sorted(x for x in v if x is not None and not math.isnan(x))
    if not vals:
        return "n/a"
    return " / ".join(fmt.format(x) for x in (vals[0], statistics.median(vals), vals[-1]))


def spread_table(head: list[str], groups: list[tuple[list[str], dict[str, list]]],
                 cols: list[tuple[str, str, str]], throughput: str = "tok_per_s",
                 extra: list[tuple[str, str, str]] | None = None) -> list[str]:
    """Markdown: per group of rounds, its `head` cells, the rounds, min / median / max of each of
    `cols` (key, title, format), the slow rounds (by `throughput`), then for each of `extra` the
    median over the slow rounds and over the others ('slow / rest')."""
    extra = extra or []
    lines = ["| " + " | ".join(head) + " | rounds | " + " | ".join(t for _, t, _ in cols) + " | slow rounds |"
             + "".join(f" {t}: slow / rest |" for _, t, _ in extra),
             "|" + "---|" * (len(head) + len(cols) + 2 + len(extra))]
    for cells, vals in groups:
        lines.append("| " + " | ".join(cells) + f" | {len(vals[throughput])} | "
                     + " | ".join(spread(vals.get(k, []), f) for k, _, f in cols)
                     + f" | {slow_rounds(vals[throughput])} |"
                     + "".join(f" {slow_vs_rest(vals[throughput], vals.get(k, []), f)} |" for k, _, f in extra))
    return lines


def distribution(rows: list[dict], med: dict) -> list[str]:
    """Per model, level and server: min / median / max over the rounds, and the slow rounds."""
    lines = ["## Every round: min / median / max", "",
             f"Slow rounds: tok/s below {SLOW:.0%} of the same server's best round at that level.", ""]
    lines += spread_table(["model", "conc", "server"],
                          [([model, str(conc), server], m["values"]) for (model, conc, server), m in med.items()],
                          SPREAD)
    return lines + [""]


def markdown(rows: list[dict], meta: dict) -> str:
    med = medians(rows)
    title = "streamproxy vs vLLM's OpenAI server" + chrt_label(meta)
    lines = [f"# {title} ({meta.get('when', '')})", ""]
    for k, v in meta.items():
        if k != "when":
            lines.append(f"- {k}: {v}")
    lines += ["", "Cells: median over alternating rounds (A B A B ...). ratio = streamproxy / vLLM "
              "(tok/s: higher is better; everything else: lower is better). CPU: utime+stime from "
              "/proc/PID/stat of the API-server process (front end) and of its descendants "
              "(engine: VLLM::EngineCore + VLLM::Worker). 'other cores': busy CPU of everything else on the machine during the "
              "round (load generator excluded): noise from other work.", ""]
    head = "| model | conc | server | " + " | ".join(t for _, t, _ in METRICS) + " | rounds | errors |"
    models = sorted({r["model"] for r in rows}, key=lambda m: [r["model"] for r in rows].index(m))
    for model in models:
        lines += [f"## {model}", "", head, "|" + "---|" * (len(METRICS) + 5)]
        for conc in sorted({r["concurrency"] for r in rows if r["model"] == model}):
            labels = _labels(rows)
            cells = {s: med.get((model, conc, s)) for s in labels}
            for s in labels:
                m = cells[s]
                if m is None:
                    continue
                lines.append(f"| {model} | {conc} | {s} | " + " | ".join(_fmt(f, m[k]) for k, _, f in METRICS)
                             + f" | {m['rounds']} | {m['errors']} |")
            for s, title in (("streamproxy-base", "base ratio"), ("streamproxy", "**ratio**")):
                a, b = cells.get(s), cells.get("vllm")
                if a is not None and b is not None:
                    lines.append(f"| {model} | {conc} | {title} | "
                                 + " | ".join(_fmt("{:.2f}", ratio(a[k], b[k])) for k, _, _ in METRICS) + " | | |")
            for s in labels:
                # --api-server-count N (streamproxy-nN) and --variant NAME (streamproxy-NAME) against plain streamproxy.
                if s.startswith("streamproxy-") and s != "streamproxy-base" and cells.get(s) and cells.get("streamproxy"):
                    a, b = cells[s], cells["streamproxy"]
                    assert a is not None and b is not None
                    name = s.removeprefix("streamproxy-")
                    base = "n1" if name[:1] == "n" and name[1:].isdigit() else "streamproxy"
                    lines.append(f"| {model} | {conc} | **{name} / {base}** | "
                                 + " | ".join(_fmt("{:.2f}", ratio(a[k], b[k])) for k, _, _ in METRICS) + " | | |")
        lines.append("")
    lines += distribution(rows, med)
    lines += slow_targets(med)
    lines += targets(med)
    lines += api_targets(med)
    return "\n".join(lines)


def _labels(rows: list[dict]) -> list[str]:
    """vllm, streamproxy, then streamproxy-nN (--api-server-count N) in the order they ran."""
    seen = list(dict.fromkeys(r["server"] for r in rows))
    return [s for s in SERVERS if s in seen] + [s for s in seen if s not in SERVERS]


def api_targets(med: dict) -> list[str]:
    """Issue 17: with --api-server-count 2, tok/s and TTFT p50 no worse than with 1 (tiny model, 256 streams)."""
    lines = []
    for (model, conc, server), two in sorted(med.items()):
        if server != "streamproxy-n2" or (model, conc, "streamproxy") not in med:
            continue
        one = med[(model, conc, "streamproxy")]
        for key, kind in (("tok_per_s", "min"), ("ttft_p50_ms", "max")):
            r = ratio(two[key], one[key])
            ok = r >= 1.0 if kind == "min" else r <= 1.0
            met = "yes" if ok else (f"tie (within ±{TIE:.0%})" if abs(r - 1.0) <= TIE else "**no**")
            lines.append(f"| {model} | {conc} | {key}: N=2 no worse than N=1 | {r:.2f} | {met} |")
    if not lines:
        return []
    return ["", "## Targets (issue 17: --api-server-count)", "", "| model | conc | target | N=2 / N=1 | met |",
            "|---|---|---|---|---|", *lines]


# Issues 7's and 17's targets, checked on the medians: (model, concurrency, metric, bound, what).
# A ratio is streamproxy / vLLM; "min" means the ratio must be at least the bound.
TARGETS = [
    ("tiny", 64, "fe_cpu_ms_per_1k", ("max", 0.35), "front-end CPU per token at most 0.35x vLLM's"),
    ("tiny", 256, "fe_cpu_ms_per_1k", ("max", 0.35), "front-end CPU per token at most 0.35x vLLM's"),
    ("tiny", 256, "tok_per_s", ("min", 1.05), "output tok/s at least 1.05x vLLM's"),
    ("tiny", 64, "ttft_p50_ms", ("max", 1.0), "TTFT p50 no worse than vLLM's"),
    ("tiny", 256, "ttft_p50_ms", ("max", 1.0), "TTFT p50 no worse than vLLM's"),
] + [
    ("smollm2", conc, key, ("min" if key == "tok_per_s" else "max", 1.0), "default model: no metric worse than vLLM's")
    for conc in (1, 64, 256)
    for key in ("tok_per_s", "ttft_p50_ms", "itl_p50_ms", "fe_cpu_ms_per_1k")
] + [  # issue 24: the way users run (no chrt), both levels
    ("tiny", conc, key, bound, "issue 24: " + what)
    for conc in (64, 256)
    for key, bound, what in (("tok_per_s", ("min", 1.05), "output tok/s at least 1.05x vLLM's"),
                             ("fe_cpu_ms_per_1k", ("max", 0.5), "front-end CPU per token at most 0.5x vLLM's"))
] + [  # issue 17: plain requests, the tighter bound
    ("tiny", conc, "fe_cpu_ms_per_1k", ("max", 0.25), "issue 17: front-end CPU per token at most 0.25x vLLM's")
    for conc in (64, 256)
] + [  # issue 17: requests with n: 2 and with logprobs (compare.py --kinds)
    (f"tiny/{kind}", conc, "fe_cpu_ms_per_1k", ("max", 0.5), "front-end CPU per token at most 0.5x vLLM's")
    for kind in ("n2", "logprobs") for conc in (64, 256)
]


# A ratio this close to its bound is called a tie, not a miss: on this machine the
# same server's medians move by more than that between runs.
TIE = 0.03


def targets(med: dict) -> list[str]:
    """The targets this run measured, each with its ratio and whether it is met."""
    lines = ["## Targets (issues 7, 17 and 24; medians)", "", "| model | conc | target | ratio | met |", "|---|---|---|---|---|"]
    titles = {k: t for k, t, _ in METRICS}
    seen = False
    for model, conc, key, (kind, bound), what in TARGETS:
        a, b = med.get((model, conc, "streamproxy")), med.get((model, conc, "vllm"))
        if a is None or b is None:
            continue
        seen = True
        r = ratio(a[key], b[key])
        if math.isnan(r):
            met = "n/a"
        elif r >= bound if kind == "min" else r <= bound:
            met = "yes"
        elif abs(r - bound) <= TIE:
            met = f"tie (within ±{TIE:.0%} of the bound: run-to-run noise here)"
        else:
            met = "**no**"
        lines.append(f"| {model} | {conc} | {what} ({titles[key]}) | {_fmt('{:.2f}', r)} | {met} |")
    return lines + [""] if seen else []


def slow_targets(med: dict) -> list[str]:
    """Issue 24: streamproxy's slow rounds no more frequent than vLLM's in the same run."""
    lines = []
    for (model, conc, server), m in med.items():
        if server != "streamproxy" or (model, conc, "vllm") not in med:
            continue
        ours, theirs = slow_rounds(m["values"]["tok_per_s"]), slow_rounds(med[(model, conc, "vllm")]["values"]["tok_per_s"])
        lines.append(f"| {model} | {conc} | slow rounds no more than vLLM's | {ours} vs {theirs} | "
                     f"{'yes' if ours <= theirs else '**no**'} |")
    if not lines:
        return []
    return ["## Targets (issue 24: slow rounds)", "", "| model | conc | target | streamproxy vs vLLM | met |",
            "|---|---|---|---|---|", *lines, ""]


def chart(rows: list[dict], path: Path, title: str = CHART_TITLE) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    med = medians(rows)
    models = list(dict.fromkeys(r["model"] for r in rows))
    panels = [("tok_per_s", "output tokens/s"), ("fe_cpu_ms_per_1k", "front-end CPU ms / 1k tokens"),
              ("ttft_p50_ms", "TTFT p50 (ms)"), ("itl_p50_ms", "ITL p50 (ms)")]
    fig, axes = plt.subplots(len(models), len(panels), figsize=(4.2 * len(panels), 3.4 * len(models)),
                             squeeze=False)
    colors = {"vllm": "#8c8c8c", "vllm-rust": "#d62728", "streamproxy-base": "#aec7e8", "streamproxy": "#1f77b4", "streamproxy-n2": "#ff7f0e",
              "streamproxy-n4": "#2ca02c"}
    servers = _labels(rows)
    for i, model in enumerate(models):
        concs = sorted({r["concurrency"] for r in rows if r["model"] == model})
        for j, (key, title) in enumerate(panels):
            ax = axes[i][j]
            width = 0.76 / max(len(servers), 1)
            for k, s in enumerate(servers):
                xs, ys = [], []
                for x, c in enumerate(concs):
                    m = med.get((model, c, s))
                    if m is None:
                        continue
                    offset = (k - (len(servers) - 1) / 2) * width
                    xs.append(x + offset)
                    ys.append(m[key])
                    vals = [v for v in m["values"][key] if v is not None]
                    ax.scatter([x + offset] * len(vals), vals, s=8, color="black", zorder=3)
                ax.bar(xs, ys, width, label=s, color=colors.get(s, "#9467bd"))
            ax.set_xticks(range(len(concs)), [f"c={c}" for c in concs])
            ax.set_title(f"{model}: {title}", fontsize=9)
            ax.grid(axis="y", alpha=0.3)
            if i == 0 and j == 0:
                ax.legend(fontsize=8, loc="lower left")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
