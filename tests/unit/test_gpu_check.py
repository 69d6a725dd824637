"""bench/gpu_check.py (`make gpu-check`) as far as a machine without a GPU can run it: it refuses
to start, names why, and its one table reads the tests' JUnit counts and bench/compare.py's rounds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import gpu_check
from harness.server import real_engine


def test_without_a_gpu_it_says_so_and_exits_2(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(gpu_check, "gpu_present", lambda: False)
    assert gpu_check.main([]) == 2
    assert "needs a GPU" in capsys.readouterr().err


def test_the_table(tmp_path: Path) -> None:
    junit = tmp_path / "t.xml"
    junit.write_text('<testsuites><testsuite tests="10" failures="1" errors="0" skipped="2"/></testsuites>')
    rounds = [{"model": "smollm2", "concurrency": 64, "server": s, "tok_per_s": t, "ttft_p50_ms": 40.0, "itl_p99_ms": 9.0,
               "fe_cpu_ms_per_1k": c} for s, t, c in [("vllm", 1000.0, 100.0), ("streamproxy", 1500.0, 30.0)] for _ in range(2)]
    bench = tmp_path / "compare.json"
    bench.write_text(json.dumps({"meta": {"vllm": "0.33.0", "machine": "x86_64, 8 cores"}, "rows": rounds}))
    text = gpu_check.table(gpu_check.test_counts(junit), 1, bench)
    assert "| real-engine tests (exit 1) | | 7 passed, 1 failed, 0 errors, 2 skipped |" in text
    assert "| smollm2, 64 streams | vllm | 1000 | 40 | 9.0 | 100.0 |" in text
    assert "| smollm2, 64 streams | ratio | 1.50x | 1.00x | 1.00x | 0.30x |" in text
    assert "vLLM 0.33.0" in text


def test_everyreal_engine_a_test_starts_gets_the_extra_engine_args() -> None:
    assert real_engine("streamproxy", "serve", ["--model", "m"])
    assert real_engine("vllm.entrypoints.openai.api_server", None, ["--model", "m"])
    assert not real_engine("streamproxy", "serve", ["--engine", "fake"])
    assert not real_engine("streamproxy", "gateway", ["--config", "g.yaml"])
