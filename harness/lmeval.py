"""lm-evaluation-harness against a server, and the comparison of two servers' runs.

    run = run_lm_eval(base_url, model, tokenizer_dir, out_dir, limit=8)   # one `lm_eval run` process
    problems = compare(run_a, run_b, tolerance=0.05)                       # [] when they agree

`run_lm_eval` runs lm-eval's own command line (`python -m lm_eval run --model local-completions
...`) as a user would (through harness/lmeval_cli.py, which only leaves lm-eval's ~14,000 built-in
task files out of its task index: 40-50 s of a core per run), from the repository's root, on the tasks defined in `evals/lmeval/`
(`--include_path`): `streamproxy_mc`, a multiple-choice (loglikelihood) task, and
`streamproxy_gen`, a generate_until task. Its tokenizer is the local model folder
(`tokenizer_backend=huggingface`), so both servers get the same token-id prompts; the hub
and dataset hub are off (`HF_*_OFFLINE`), the JSONL files are read through `dataset_path: json`.
`--log_samples` keeps every request's answer; `Run` holds the aggregated results, the
samples and the wall time.

`compare` is how "the same scores as vLLM" is checked without freezing any number from one
machine: two servers on the same machine and model, same command. Each choice's
loglikelihood must agree within `tolerance` (nats) plus `RELATIVE` of its size; accuracy must be equal, except where a
document's top two choices are a near-tie (within twice the tolerance) on either server,
where a rounding difference may pick the other one. It also refuses a vacuous comparison:
the runs must have hit different servers, and hold finite, not all equal, loglikelihoods.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TASKS_DIR = ROOT / "evals" / "lmeval"
MC, GEN = "streamproxy_mc", "streamproxy_gen"
# lm-eval's command line, its task index without lm-eval's own ~14,000 task files (harness/lmeval_cli.py).
LM_EVAL = "harness.lmeval_cli"
GEN_METRIC = "exact_match,first_word"


@dataclass
class Run:
    base_url: str
    results: dict[str, Any]  # lm-eval's results_*.json
    samples: dict[str, list[dict[str, Any]]]  # task -> its samples_*.jsonl rows, by doc_id
    seconds: float

    def score(self, task: str, metric: str) -> float:
        return float(self.results["results"][task][metric])

    def loglikelihoods(self) -> dict[int, list[float]]:
        """doc_id -> each choice's loglikelihood, from the multiple-choice task's samples."""
        return {row["doc_id"]: [float(resp[0][0]) for resp in row["resps"]] for row in self.samples[MC]}

    def targets(self) -> dict[int, int]:
        return {row["doc_id"]: int(row["target"]) for row in self.samples[MC]}

    def generations(self) -> dict[int, str]:
        return {row["doc_id"]: row["resps"][0][0] for row in self.samples[GEN]}


def lm_eval_command(base_url: str, model: str, tokenizer: Path | str, out_dir: Path, limit: int | None,
                    tasks: tuple[str, ...] = (MC, GEN), batch_size: int = 8) -> list[str]:
    model_args = ",".join([f"model={model}", f"base_url={base_url}/v1/completions", "tokenizer_backend=huggingface",
                           f"tokenizer={tokenizer}", "num_concurrent=1", "max_retries=1", "timeout=600"])
    cmd = [sys.executable, "-m", LM_EVAL, "run", "--model", "local-completions", "--model_args", model_args,
           "--batch_size", str(batch_size), "--include_path", str(TASKS_DIR.relative_to(ROOT)),
           "--tasks", ",".join(tasks), "--log_samples", "--output_path", str(out_dir)]
    return cmd + (["--limit", str(limit)] if limit is not None else [])


def run_lm_eval(base_url: str, model: str, tokenizer: Path | str, out_dir: Path, limit: int | None = None,
                timeout: float = 1200, tasks: tuple[str, ...] = (MC, GEN)) -> Run:
    """One `lm_eval run` against `base_url`; its output in `out_dir` (log in `out_dir/lm_eval.log`)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "HF_DATASETS_CACHE": str(out_dir / "datasets-cache"), "PYTHONUNBUFFERED": "1"}
    log = out_dir / "lm_eval.log"
    start = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.run(lm_eval_command(base_url, model, tokenizer, out_dir, limit, tasks), cwd=ROOT, env=env,
                              stdout=out, stderr=subprocess.STDOUT, timeout=timeout)
    seconds = time.monotonic() - start
    if proc.returncode != 0:
        raise AssertionError(f"lm_eval exited {proc.returncode}:\n{log.read_text(errors='replace')[-4000:]}")
    results = sorted(out_dir.rglob("results_*.json"))
    if not results:
        raise AssertionError(f"lm_eval wrote no results in {out_dir}:\n{log.read_text(errors='replace')[-4000:]}")
    samples = {}
    for task in tasks:
        (path,) = sorted(out_dir.rglob(f"samples_{task}_*.jsonl"))[-1:]
        samples[task] = sorted((json.loads(line) for line in path.read_text().splitlines() if line), key=lambda r: r["doc_id"])
    return Run(base_url, json.loads(results[-1].read_text()), samples, seconds)


def _best(scores: list[float]) -> int:
    return max(range(len(scores)), key=scores.__getitem__)


# Besides `tolerance` (nats), a share of the loglikelihood itself: a continuation of several tokens sums
# each token's rounding, and two engine processes on one CPU differed by 0.089 on -6.9 (2026-12-01).
RELATIVE = 0.02


def _near_tie(scores: list[float], i: int, j: int, tolerance: float) -> bool:
    return abs(scores[i] - scores[j]) <= 2 * tolerance


def compare(a: Run, b: Run, tolerance: float) -> list[str]:
    """What disagrees between two runs of the multiple-choice task ([] when nothing)."""
    problems: list[str] = []
    if a.results["config"]["model_args"] == b.results["config"]["model_args"] or a.base_url == b.base_url:
        problems.append("both runs went to the same server")
    la, lb = a.loglikelihoods(), b.loglikelihoods()
    if la.keys() != lb.keys() or not la:
        return problems + [f"different documents: {sorted(la)} vs {sorted(lb)}"]
    values = [x for scores in la.values() for x in scores]
    if not all(math.isfinite(x) and x <= 0 for x in values) or len(set(values)) < 2:
        problems.append(f"loglikelihoods not finite, positive, or all equal: {values[:8]}")
    disagreements = 0
    for doc in sorted(la):
        sa, sb = la[doc], lb[doc]
        if len(sa) != len(sb):
            problems.append(f"doc {doc}: {len(sa)} vs {len(sb)} choices")
            continue
        for choice, (x, y) in enumerate(zip(sa, sb)):
            if abs(x - y) > tolerance + RELATIVE * max(abs(x), abs(y)):
                problems.append(f"doc {doc} choice {choice}: loglikelihood {x:.6f} vs {y:.6f}")
        pa, pb = _best(sa), _best(sb)
        if pa != pb:
            disagreements += 1
            if not (_near_tie(sa, pa, pb, tolerance) or _near_tie(sb, pa, pb, tolerance)):
                problems.append(f"doc {doc}: answer {pa} vs {pb}, not a near-tie ({sa} vs {sb})")
    acc_a, acc_b = a.score(MC, "acc,none"), b.score(MC, "acc,none")
    if abs(acc_a - acc_b) > disagreements / len(la) + 1e-9:
        problems.append(f"acc {acc_a} vs {acc_b}: more than the {disagreements} near-tie document(s) explain")
    return problems


def max_difference(a: Run, b: Run) -> float:
    la, lb = a.loglikelihoods(), b.loglikelihoods()
    return max((abs(x - y) for doc in la for x, y in zip(la[doc], lb.get(doc, []))), default=math.nan)
