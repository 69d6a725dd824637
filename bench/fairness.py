"""`make bench-gateway BENCH_ARGS="--fairness"`: issue 35's fairness must-show, in rounds.

Two tenants (two API keys) share saturated replicas, the heavy one sending
`--heavy-ratio` (10) times the light one's rate (Poisson, open loop, each
phase `--seconds` long). Phases, in one run, their order rotating per round:

  a. the light tenant alone (through the flow-control gateway: nothing waits);
  b. both through a gateway without flow control: first come, first served
     (the replicas' own FIFO queues);
  c. both through a gateway with flow control (`flow_control.max_concurrency`
     = the replicas' bound): weighted fair queuing per tenant;
  d. one tenant (one key) sending the light rate at priority 0 (the
     `X-Vllm-Priority` header) and the heavy rate at priority 5: whether a
     flood in a lower band touches a higher band's TTFT, with tenant
     fairness unable to help (the same key for both).

The light tenant's arrivals are the same in a, b and c of a round. Each
phase starts after `--settle` s of quiet (past a health probe: the
flow-control gateway reads the replicas' own queues, which phase b leaves
long, at its probes).

Replicas (`--engine fake`, the default): `streamproxy serve --engine fake`
processes with a fixed concurrency (`--max-concurrent-requests`
`--max-num-seqs`, FIFO beyond it: vLLM's waiting queue in the small), the
first token `--fake-ttft` s after a request starts, then one every
`--fake-token-delay` s. What is measured is the gateway's queueing, which
does not need a model; the output says so. The offered load is
`--overload` (1.3) times their capacity (replicas x bound / (TTFT +
max_tokens x token delay)). `--engine vllm`: real-engine replicas of
`--model` with `--max-num-seqs`, at `--rate` requests/s in all.

Every request's outcome is counted: ok (200 and `[DONE]`), 429 (with or
without `Retry-After`), anything else. Criteria, per round and printed with
min / median / max over the rounds: the light tenant's TTFT p50 in c within
1.5x of a's (against b's); the high band's TTFT p50 in d within 1.5x of a's;
no request lost without a 429, every 429 with a Retry-After.
Results: bench/results/gateway-fairness-<time>.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import random
import shlex
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from harness.process import free_port
from harness.server import command_line

from . import scheduling as S
from .compare import _git_rev, model_path
from .servers import RESULTS, SERVED_NAME, Server

BOUND = 1.5  # the issue's: within 1.5x of alone
KEYS = [{"id": "heavy", "key": "sk-heavy"}, {"id": "light", "key": "sk-light"}, {"id": "mixed", "key": "sk-mixed"}]
PHASES = ("a. light alone", "b. both, FCFS (no flow control)", "c. both, flow control (fair)",
          "d. bands: one key, high 0 + flood 5")

Arrival = tuple[float, str, dict[str, Any], dict[str, str]]


def fake_replica(args: argparse.Namespace, tag: str, i: int) -> Server:
    port = free_port()
    cmd = command_line("streamproxy", "serve", port, [
        "--engine", "fake", "--served-model-name", SERVED_NAME, "--fake-ttft", str(args.fake_ttft),
        "--fake-token-delay", str(args.fake_token_delay), "--max-concurrent-requests", str(args.max_num_seqs),
        "--max-queued-requests", "100000", "--access-log", "off"])
    return Server(f"replica{i}", cmd, port, RESULTS / "logs" / f"{tag}-replica{i}.log")


def capacity(args: argparse.Namespace) -> float:
    """The fake replicas' requests/s when saturated."""
    return args.replicas * args.max_num_seqs / (args.fake_ttft + args.max_tokens * args.fake_token_delay)


def arrivals(args: argparse.Namespace, seed: int, prompt: dict[str, str], light_rate: float, phase: str) -> list[Arrival]:
    """One phase's requests: (time, who, body, headers). The light stream first, from its own seed."""
    heavy_rate = light_rate * args.heavy_ratio

    def times(rate: float, rng: random.Random) -> list[float]:
        return [t for t in S.poisson(int(rate * args.seconds * 2) + 10, rate, rng) if t <= args.seconds]

    light = times(light_rate, random.Random(seed))
    heavy = times(heavy_rate, random.Random(seed + 7919))
    out: list[Arrival] = []
    if phase.startswith("d."):
        mixed = {"Authorization": "Bearer sk-mixed"}
        out += [(t, "high", S.body(prompt["mixed"], f"high {n}", args.max_tokens), {**mixed, "X-Vllm-Priority": "0"})
                for n, t in enumerate(light)]
        out += [(t, "low", S.body(prompt["mixed"], f"low {n}", args.max_tokens), {**mixed, "X-Vllm-Priority": "5"})
                for n, t in enumerate(heavy)]
    else:
        out += [(t, "light", S.body(prompt["light"], f"light {n}", args.max_tokens), {"Authorization": "Bearer sk-light"})
                for n, t in enumerate(light)]
        if not phase.startswith("a."):
            out += [(t, "heavy", S.body(prompt["heavy"], f"heavy {n}", args.max_tokens), {"Authorization": "Bearer sk-heavy"})
                    for n, t in enumerate(heavy)]
    return sorted(out, key=lambda a: a[0])


def spread(values: list[float]) -> str:
    finite = [v for v in values if v == v]
    if not finite:
        return "n/a"
    return f"{min(finite):.2f} / {statistics.median(finite):.2f} / {max(finite):.2f}"


def run(args: argparse.Namespace) -> int:
    import uvloop

    stamp = time.strftime("%Y%m%d-%H%M%S")
    tag = f"gateway-fairness-{stamp}"
    RESULTS.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="bench-fairness-"))
    if args.engine == "fake":
        reps = [fake_replica(args, tag, i) for i in range(args.replicas)]
        total = args.overload * capacity(args)
        what = (f"{args.replicas} x `streamproxy serve --engine fake` (FAKE replicas: a fixed concurrency of "
                f"{args.max_num_seqs} each, FIFO beyond it; first token after {args.fake_ttft:g} s, then one every "
                f"{args.fake_token_delay:g} s): what is measured is the gateway's queueing, not a model; capacity "
                f"{capacity(args):.1f} requests/s, offered {total:.1f}/s ({args.overload:g}x)")
    else:
        model = model_path(args.model)
        extra = ["--max-num-seqs", str(args.max_num_seqs), "--block-size", str(args.block_size)]
        reps = [S.replica(model, shlex.split(args.engine_args), tag, i, extra).server for i in range(args.replicas)]
        total = args.rate
        what = f"{args.replicas} x `streamproxy serve` {args.model} (real engines), {args.engine_args} {' '.join(extra)}; offered {total:g}/s"
    light_rate = total / (1 + args.heavy_ratio)
    holders = [S.Replica(r, "", "") for r in reps]
    fcfs = S.gateway("gw-fcfs", holders, tmp, tag, keys=KEYS)
    flow = {"max_concurrency": args.max_num_seqs, "max_wait": args.max_wait, "max_queued": args.max_queued}
    fair = S.gateway("gw-fair", holders, tmp, tag, keys=KEYS, flow=flow)
    words = S.WORDS
    prompt = {who: f"You are {who}'s assistant. " + " ".join(words[(i * 7 + k) % len(words)] for k in range(args.system_words))
              for i, who in enumerate(("light", "heavy", "mixed"))}
    meta = {"when": time.strftime("%Y-%m-%d %H:%M"), "streamproxy": _git_rev(), "replicas": what,
            "load": (f"light {light_rate:.2f}/s + heavy {args.heavy_ratio:g}x ({light_rate * args.heavy_ratio:.2f}/s), Poisson, "
                     f"{args.seconds:g} s per phase, max_tokens {args.max_tokens}, {args.rounds} rounds, phase order rotating"),
            "flow_control": flow, "smoke": args.smoke}
    print("\n".join(f"{k}: {v}" for k, v in meta.items()), flush=True)
    started: list[Server] = []
    rows: list[dict[str, Any]] = []
    try:
        for s in [*reps, fcfs, fair]:
            s.start()
            started.append(s)
            s.wait_ready(900 if args.engine == "vllm" else 60)
        for rnd in range(args.rounds):
            order = PHASES[rnd % len(PHASES):] + PHASES[: rnd % len(PHASES)]
            for phase in order:
                time.sleep(args.settle)  # (see --settle)
                load = arrivals(args, args.seed + rnd, prompt, light_rate, phase)
                peer = S.Peer(phase, [fcfs if phase.startswith("b.") else fair])
                uvloop.run(S.open_loop(peer, load))
                for who in ("light", "heavy", "high", "low"):
                    mine = [o for o in peer.outcomes if o.tenant == who]
                    if not mine:
                        continue
                    row = {"round": rnd + 1, "phase": phase, "tenant": who, **S.summary(mine),
                           "retry_after": sorted({o.retry_after for o in mine if o.retry_after})[:6]}
                    rows.append(row)
                    print(f"round {rnd + 1} {phase:>36} {who:>5}: TTFT p50 {row['ttft_p50_ms']:8.1f} ms  p90 "
                          f"{row['ttft_p90_ms']:8.1f} ms  ok {row['ok']}/{row['requests']}  429 {row['refused_429']} "
                          f"(no Retry-After {row['refused_without_retry_after']})  other {row['errors']} {row['first_error']}",
                          flush=True)
    finally:
        for s in reversed(started):
            s.stop(30)
        shutil.rmtree(tmp, ignore_errors=True)
    verdict = criteria(rows, args.rounds)
    md = markdown(rows, meta, verdict)
    (RESULTS / f"{tag}.json").write_text(json.dumps({"meta": meta, "rows": rows, "criteria": verdict}, indent=1))
    (RESULTS / f"{tag}.md").write_text(md + "\n")
    print("\n" + md + f"\n\nwrote {RESULTS / f'{tag}.json'}")
    return 0


def p50(rows: list[dict[str, Any]], rnd: int, phase: str, who: str) -> float:
    for r in rows:
        if r["round"] == rnd and r["phase"] == phase and r["tenant"] == who:
            return float(r["ttft_p50_ms"])
    return float("nan")


def criteria(rows: list[dict[str, Any]], rounds: int) -> dict[str, Any]:
    a, b, c, d = PHASES
    alone = [p50(rows, n, a, "light") for n in range(1, rounds + 1)]
    fcfs = [p50(rows, n, b, "light") for n in range(1, rounds + 1)]
    fair = [p50(rows, n, c, "light") for n in range(1, rounds + 1)]
    high = [p50(rows, n, d, "high") for n in range(1, rounds + 1)]
    sent = sum(r["requests"] for r in rows)
    answered = sum(r["ok"] + r["refused_429"] for r in rows)
    return {
        "light_alone_p50_ms": alone, "light_fcfs_p50_ms": fcfs, "light_fair_p50_ms": fair, "high_band_p50_ms": high,
        "fcfs_over_alone": [f / x for f, x in zip(fcfs, alone)], "fair_over_alone": [f / x for f, x in zip(fair, alone)],
        "high_over_alone": [h / x for h, x in zip(high, alone)],
        "requests": sent, "ok_or_429": answered, "other_outcomes": sum(r["errors"] for r in rows),
        "refused_429": sum(r["refused_429"] for r in rows),
        "refused_without_retry_after": sum(r["refused_without_retry_after"] for r in rows),
        "fair_within_bound": all(f / x <= BOUND for f, x in zip(fair, alone)),
        "high_within_bound": all(h / x <= BOUND for h, x in zip(high, alone)),
        "nothing_lost": sent == answered and not sum(r["refused_without_retry_after"] for r in rows),
    }


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any], v: dict[str, Any]) -> str:
    smoke = " — SMOKE RUN (`--smoke`): checks the harness, not a measurement" if meta.get("smoke") else ""
    lines = [f"# Gateway fairness ({meta['when']}){smoke}", ""] + [f"- {k}: {x}" for k, x in meta.items() if k not in ("when", "smoke")]
    lines += ["", "Over the rounds, min / median / max:", "", "| what | min / median / max |", "|---|---|",
              f"| light TTFT p50, a. alone (ms) | {spread(v['light_alone_p50_ms'])} |",
              f"| light TTFT p50, b. FCFS (ms) | {spread(v['light_fcfs_p50_ms'])} |",
              f"| light TTFT p50, c. flow control (ms) | {spread(v['light_fair_p50_ms'])} |",
              f"| high-band TTFT p50, d. flood at 5 (ms) | {spread(v['high_band_p50_ms'])} |",
              f"| b / a | {spread(v['fcfs_over_alone'])} |",
              f"| c / a (must be <= {BOUND}) | {spread(v['fair_over_alone'])} |",
              f"| d high / a (must be <= {BOUND}) | {spread(v['high_over_alone'])} |", "",
              f"- c within {BOUND}x of a in every round: {'PASS' if v['fair_within_bound'] else 'FAIL'}",
              f"- d's high band within {BOUND}x of a in every round: {'PASS' if v['high_within_bound'] else 'FAIL'}",
              f"- outcomes: {v['requests']} requests, {v['ok_or_429'] - v['refused_429']} ok, {v['refused_429']} 429 "
              f"({v['refused_without_retry_after']} without Retry-After), {v['other_outcomes']} other: "
              f"{'PASS' if v['nothing_lost'] else 'FAIL'} (nothing lost without a 429)", ""]
    cols = ["round", "phase", "tenant", "ttft_p50_ms", "ttft_p90_ms", "ok", "requests", "refused_429", "errors"]
    lines += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(f"{r[c]:.1f}" if isinstance(r[c], float) else str(r[c]) for c in cols) + " |")
    return "\n".join(lines)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--engine", choices=("fake", "vllm"), default="fake", help="fairness: the replicas (fake: fixed concurrency)")
    ap.add_argument("--rounds", type=int, default=5, help="fairness: rounds (every phase once each)")
    ap.add_argument("--seconds", type=float, default=30.0, help="fairness: seconds of arrivals per phase")
    ap.add_argument("--overload", type=float, default=1.3, help="fairness, fake: offered load / the replicas' capacity")
    ap.add_argument("--fake-ttft", type=float, default=0.25, help="fairness, fake: seconds to a request's first token")
    ap.add_argument("--fake-token-delay", type=float, default=0.025, help="fairness, fake: seconds between tokens")
    ap.add_argument("--max-wait", type=float, default=10.0, help="fairness: flow_control.max_wait")
    ap.add_argument("--max-queued", type=int, default=1024, help="fairness: flow_control.max_queued")
    ap.add_argument("--settle", type=float, default=6.0,
                    help="fairness: seconds of quiet before each phase: more than the gateways' health-probe interval (5 s), "
                         "after which the flow-control gateway reads the replicas' own queues again (phase b, through the other "
                         "gateway, leaves them long; until the next probe that gateway admits no more than it has in flight)")
    ap.add_argument("--system-words", type=int, default=120, help="fairness: words in each tenant's system prompt")
