"""`make gpu-check`: on a GPU machine, what no CPU machine can check, in one table.

Two runs, each a child process, on whatever vLLM the GPU extra installed:

1. the real-engine tests (`pytest -m engine`); every engine a test starts gets
   `--gpu-memory-utilization` (`--test-gpu-share`) through
   $STREAMPROXY_TEST_ENGINE_ARGS (harness/server.py), so the several
   engines a session runs at once fit on one GPU;
2. `make bench`'s comparison (bench/compare.py) of streamproxy with vLLM's own
   server on the default model, both up at once (`--bench-gpu-share` each),
   alternating rounds at each level.

Then one Markdown table: the tests' counts (from pytest's JUnit XML), and per
model and level each server's tok/s, TTFT p50, ITL p99 and front-end CPU per
1,000 tokens (medians over the rounds), with the streamproxy / vLLM ratio.
Nothing here names a path or a CPU-only flag: it runs as it is on any machine
where `nvidia-smi` works; elsewhere it says so and exits 2.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from . import report
from .servers import RESULTS, ROOT

COLUMNS = [("tok_per_s", "tok/s", "{:.0f}"), ("ttft_p50_ms", "TTFT p50 ms", "{:.0f}"),
           ("itl_p99_ms", "ITL p99 ms", "{:.1f}"), ("fe_cpu_ms_per_1k", "front-end CPU ms/1k tok", "{:.1f}")]


def gpu_present() -> bool:
    if shutil.which("nvidia-smi") is None:
        return False
    return subprocess.run(["nvidia-smi"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0


def run_tests(share: float, junit: Path) -> int:
    env = {**os.environ, "STREAMPROXY_TEST_ENGINE_ARGS": f"--gpu-memory-utilization {share}"}
    cmd = [sys.executable, "-m", "pytest", "-q", "tests", "-m", "engine", f"--junitxml={junit}"]
    return subprocess.run(cmd, cwd=ROOT, env=env).returncode


def test_counts(junit: Path) -> dict[str, int]:
    if not junit.exists():
        return {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    root = ET.parse(junit).getroot()
    suites = [root] if root.tag == "testsuite" else list(root)
    return {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}


def run_bench(args: argparse.Namespace) -> Path | None:
    before = set(RESULTS.glob("compare-*.json")) if RESULTS.exists() else set()
    engine_args = f"--max-model-len 1024 --max-num-seqs {max(int(x) for x in args.levels.split(','))} " \
                  f"--gpu-memory-utilization {args.bench_gpu_share}"
    cmd = [sys.executable, "-m", "bench.compare", "--models", args.models, "--levels", args.levels,
           "--rounds", str(args.rounds), "--engine-args", engine_args]
    subprocess.run(cmd, cwd=ROOT, check=False)
    made = sorted(set(RESULTS.glob("compare-*.json")) - before)
    return made[-1] if made else None


def table(counts: dict[str, int], tests_rc: int, bench: Path | None) -> str:
    passed = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    lines = ["| what | server | " + " | ".join(title for _, title, _ in COLUMNS) + " |",
             "|---|---|" + "---|" * len(COLUMNS),
             f"| real-engine tests (exit {tests_rc}) | | {passed} passed, {counts['failures']} failed, "
             f"{counts['errors']} errors, {counts['skipped']} skipped |" + " |" * (len(COLUMNS) - 1)]
    if bench is None:
        lines.append("| benchmark | | no result (see its output above) |" + " |" * (len(COLUMNS) - 1))
        return "\n".join(lines)
    data = json.loads(bench.read_text())
    med = report.medians(data["rows"])
    for model, level in sorted({(m, c) for m, c, _ in med}):
        for server in ("vllm", "streamproxy"):
            m = med.get((model, level, server))
            if m is not None:
                cells = [fmt.format(m[key]) for key, _, fmt in COLUMNS]
                lines.append(f"| {model}, {level} streams | {server} | " + " | ".join(cells) + " |")
        a, b = med.get((model, level, "streamproxy")), med.get((model, level, "vllm"))
        if a and b:
            ratios = [f"{a[key] / b[key]:.2f}x" if b[key] else "-" for key, _, _ in COLUMNS]
            lines.append(f"| {model}, {level} streams | ratio | " + " | ".join(ratios) + " |")
    lines.append(f"\nvLLM {data['meta'].get('vllm')}, {data['meta'].get('machine')}; rounds: {bench}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.gpu_check", description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="smollm2", help="bench/compare.py's --models (default smollm2, the default model)")
    ap.add_argument("--levels", default="64,256,1024")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--test-gpu-share", type=float, default=0.15, help="--gpu-memory-utilization of each test engine")
    ap.add_argument("--bench-gpu-share", type=float, default=0.4, help="--gpu-memory-utilization of each bench server")
    ap.add_argument("--no-tests", action="store_true")
    args = ap.parse_args(argv)
    if not gpu_present():
        print("make gpu-check needs a GPU: nvidia-smi did not answer here", file=sys.stderr)
        return 2
    RESULTS.mkdir(parents=True, exist_ok=True)
    junit = RESULTS / "gpu-check-tests.xml"
    junit.unlink(missing_ok=True)
    tests_rc = 0 if args.no_tests else run_tests(args.test_gpu_share, junit)
    bench = run_bench(args)
    text = table(test_counts(junit), tests_rc, bench)
    (RESULTS / "gpu-check.md").write_text(text + "\n")
    print("\n" + text)
    return tests_rc


if __name__ == "__main__":
    raise SystemExit(main())
