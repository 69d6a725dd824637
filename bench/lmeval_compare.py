"""lm-eval on streamproxy and on vLLM's own server, by hand, on more documents than CI takes.

    python -m bench.lmeval_compare [--limit N] [--model DIR]     (make lmeval-compare [LIMIT=N])

Starts `streamproxy serve` and `python -m vllm.entrypoints.openai.api_server` on the same model
(default: the prepared SmolLM2-135M-Instruct) with the CI test's engine flags, one after the
other, runs the same `lm_eval run` command (harness.lmeval: the tasks of evals/lmeval/,
every document unless --limit) against each, and prints each server's scores, the number of
documents and requests, the time, and how far the two runs are apart (harness.lmeval.compare,
the same check as tests/engine/test_lmeval_engine.py). Everything goes to bench/results/lmeval/
(lm-eval's output, the servers' logs, summary.json). Exit 1 when the runs disagree.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

from harness.lmeval import GEN, GEN_METRIC, MC, Run, compare, max_difference, run_lm_eval
from harness.process import ServerProcess
from harness.server import ENGINE_ARGS, VLLM_ENGINE_ARGS, serve_process, vllm_process

RESULTS = Path(__file__).resolve().parent / "results" / "lmeval"
TOLERANCE = 0.05


def _run(label: str, launch: Callable[..., AbstractContextManager[ServerProcess]], args: list[str], name: str,
         tokenizer: Path, limit: int | None, out: Path) -> tuple[Run, float]:
    start = time.monotonic()
    with launch(args, log_dir=out, name=label, timeout=1800, interval=0.5, stop_timeout=60) as server:
        ready = time.monotonic() - start
        print(f"{label}: ready after {ready:.0f} s; running lm-eval ...", flush=True)
        return run_lm_eval(server.base, name, tokenizer, out / label, limit, timeout=7200), ready


def main(argv: list[str] | None = None) -> int:
    from engine_adapter.default_model import DEFAULT_MODEL_NAME, ensure_default_model

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=None, help="documents per task (default: all)")
    parser.add_argument("--model", type=Path, default=None, help="an HF model folder (default: the prepared default model)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    opts = parser.parse_args(argv)
    model = opts.model or ensure_default_model()
    name = DEFAULT_MODEL_NAME if opts.model is None else model.name
    opts.out.mkdir(parents=True, exist_ok=True)
    common = [str(model), "--served-model-name", name]
    ours, ours_ready = _run("streamproxy", serve_process, [*common, *ENGINE_ARGS], name, model, opts.limit, opts.out)
    theirs, theirs_ready = _run("vllm", vllm_process, ["--model", *common, *VLLM_ENGINE_ARGS], name, model, opts.limit, opts.out)

    problems = compare(ours, theirs, TOLERANCE)
    same_text = sum(a == b for a, b in zip(ours.generations().values(), theirs.generations().values()))
    summary = {
        "model": str(model), "limit": opts.limit, "tolerance": TOLERANCE,
        "documents": {MC: len(ours.samples[MC]), GEN: len(ours.samples[GEN])},
        "loglikelihood_requests": sum(len(r["resps"]) for r in ours.samples[MC]),
        "servers": {label: {"acc": run.score(MC, "acc,none"), "acc_norm": run.score(MC, "acc_norm,none"),
                            "exact_match": run.score(GEN, GEN_METRIC), "lm_eval_seconds": round(run.seconds, 1),
                            "ready_seconds": round(ready, 1)}
                    for label, run, ready in (("streamproxy", ours, ours_ready), ("vllm", theirs, theirs_ready))},
        "max_loglikelihood_difference": max_difference(ours, theirs),
        "identical_generations": same_text,
        "problems": problems,
    }
    (opts.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
