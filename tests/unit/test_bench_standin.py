"""bench/standin_model.py (the stand-in engine's step model and bookkeeping) and bench/rust_frontend.py's
binary cache: fed plain objects and files, no vLLM, no clock."""

from __future__ import annotations

import os
import stat
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from bench import rust_frontend
from bench.standin_model import FIELDS, Stats, StepModel, Tracker, read_stats


def _new(rid: str, prompt: int, computed: int = 0, blocks: int = 1) -> SimpleNamespace:
    return SimpleNamespace(req_id=rid, prompt_token_ids=list(range(prompt)), prompt_embeds=None,
                           num_computed_tokens=computed, block_ids=([0] * blocks,))


def _step(scheduled: dict[str, int], new=(), cached=(), finished=(), resumed=()) -> SimpleNamespace:
    """A SchedulerOutput's fields the tracker reads; `cached`: (req_id, num_computed_tokens, new blocks)."""
    return SimpleNamespace(
        scheduled_new_reqs=list(new), finished_req_ids=set(finished), num_scheduled_tokens=dict(scheduled),
        total_num_scheduled_tokens=sum(scheduled.values()),
        scheduled_cached_reqs=SimpleNamespace(
            req_ids=[c[0] for c in cached], num_computed_tokens=[c[1] for c in cached],
            new_block_ids=[([0] * c[2],) if c[2] else None for c in cached], resumed_req_ids=set(resumed)))


def test_step_time_is_base_plus_per_request_plus_per_prefill_token():
    m = StepModel(base_ms=8.0, us_per_seq=20.0, prefill_us=25.0)
    assert m.seconds(0, 0) == 0.0  # nothing scheduled: no step
    assert m.seconds(64, 0) == pytest.approx(0.008 + 64 * 20e-6)
    assert m.seconds(2, 100) == pytest.approx(0.008 + 2 * 20e-6 + 100 * 25e-6)
    assert StepModel.from_env(m.env()) == m
    assert StepModel.from_env({}) == StepModel()


def test_a_request_samples_the_text_then_eos_then_the_text_again():
    t = Tracker([11, 12, 13], eos_id=2)
    p = t.plan(_step({"a": 5}, new=[_new("a", 5)]))  # the whole prompt in one step: the first token
    assert (p.req_ids, p.sampled, p.seqs, p.prefill_tokens) == (["a"], [[11]], 1, 4)
    got = [t.plan(_step({"a": 1}, cached=[("a", 5 + i, 0)])).sampled[0][0] for i in range(6)]
    assert got == [12, 13, 2, 11, 12, 13]


def test_decode_steps_cost_no_prefill_and_prompt_chunks_sample_nothing():
    t = Tracker([11, 12], eos_id=None)
    p = t.plan(_step({"a": 8, "b": 1}, new=[_new("a", 20), _new("b", 1)]))
    assert p.sampled == [[], [11]] and p.prefill_tokens == 8  # a: a chunk of its prompt; b: its 1-token prompt
    p = t.plan(_step({"a": 12, "b": 1}, cached=[("a", 8, 1), ("b", 1, 0)]))
    assert p.sampled == [[11], [12]] and p.prefill_tokens == 11 and p.seqs == 2


def test_prefix_cache_hits_and_a_resumed_request():
    t = Tracker([11, 12, 13, 14], eos_id=None)
    p = t.plan(_step({"a": 4}, new=[_new("a", 20, computed=16)]))  # 16 prompt tokens found in the prefix cache
    assert p.sampled == [[11]] and p.prefill_tokens == 3
    t.plan(_step({"a": 1}, cached=[("a", 20, 0)]))
    # Preempted, then resumed: its prompt and its two tokens are computed again; the next token follows them.
    p = t.plan(_step({"a": 22}, cached=[("a", 0, 3)], resumed={"a"}))
    assert p.sampled == [[13]] and p.prefill_tokens == 21
    assert t.blocks_in_use() == 3  # a resumed request's blocks replace its old ones


def test_kv_blocks_are_counted_until_a_request_finishes():
    t = Tracker([11], eos_id=None)
    t.plan(_step({"a": 3, "b": 3}, new=[_new("a", 3, blocks=2), _new("b", 3, blocks=1)]))
    t.plan(_step({"a": 1, "b": 1}, cached=[("a", 3, 1), ("b", 3, 0)]))
    assert t.blocks_in_use() == 4
    p = t.plan(_step({"b": 1}, cached=[("b", 4, 0)], finished={"a"}))
    assert p.req_ids == ["b"] and t.blocks_in_use() == 1


def test_stats_are_readable_from_another_process_s_view(tmp_path: Path):
    path = tmp_path / "stats"
    s = Stats(str(path), blocks_total=100)
    assert read_stats(path) == dict.fromkeys(FIELDS, 0.0)  # created, zeroed until the first step
    t = Tracker([11], eos_id=None)
    s.step(t.plan(_step({"a": 3, "b": 3}, new=[_new("a", 3), _new("b", 3)])), 0.01, 0.0, 2)
    got = read_stats(path)
    assert got is not None
    assert (got["steps"], got["seqs"], got["sampled"], got["prefill_tokens"], got["blocks_total"]) == (1, 2, 2, 4, 100)
    assert read_stats(tmp_path / "missing") is None


def _wheel(path: Path, script: str | None) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("vllm/__init__.py", "")
        if script is not None:
            z.writestr("vllm/vllm-rs", script)
    return path


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("STREAMPROXY_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(rust_frontend, "vllm_version", lambda: "9.9.9")
    return tmp_path


def test_the_binary_is_taken_out_of_a_wheel_once(cache: Path):
    got = rust_frontend.binary(str(_wheel(cache / "v.whl", "#!/bin/sh\necho vllm-rs 9.9.9\n")))
    assert isinstance(got, Path) and got == rust_frontend.cache_path("9.9.9") and got.name == "vllm-rs"
    assert os.stat(got).st_mode & stat.S_IXUSR
    assert rust_frontend.binary(str(cache / "gone.whl")) == got  # cached: the wheel is not read again


def test_a_binary_that_cannot_be_had_is_one_line_saying_why(cache: Path):
    assert rust_frontend.binary(str(_wheel(cache / "a.whl", None))) == "a.whl has no vllm/vllm-rs"
    why = rust_frontend.binary(str(_wheel(cache / "b.whl", "#!/bin/sh\necho vllm-rs 1.0.0\n")))
    assert isinstance(why, str) and "not 9.9.9" in why and "\n" not in why
    assert not rust_frontend.cache_path("9.9.9").exists()  # a wrong binary is not kept
