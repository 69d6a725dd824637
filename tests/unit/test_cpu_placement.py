"""engine_adapter/cpu_placement.py: which cores the front end and the engine core are confined to."""

from __future__ import annotations

import os

from engine_adapter import cpu_placement
from engine_adapter.cpu_placement import plan


def test_front_end_and_engine_core_take_the_cores_the_workers_leave():
    # vLLM's auto binding on 2 cores: the worker on core 0, core 1 reserved; the engine core unbound.
    assert plan({0, 1}, {100: {0, 1}, 101: {0}}) == ({1}, [100])


def test_several_workers_and_cores():
    assert plan({0, 1, 2, 3}, {100: {0, 1, 2, 3}, 101: {0, 1}, 102: {2}}) == ({3}, [100])


def test_nothing_to_separate_leaves_everything():
    assert plan({0, 1}, {}) is None  # no engine process (GPU, or API servers sharing a parent's engine)
    assert plan({0, 1}, {100: {0, 1}, 101: {0, 1}}) is None  # nobind: no worker narrower than us
    assert plan({0, 1}, {100: {0, 1}, 101: {0}, 102: {1}}) is None  # workers on every core: no rest


def test_a_worker_bound_beyond_our_cores_is_not_ours_to_avoid():
    # We may use cores 0-1 only (taskset by the user); a worker allowed 0-3 is not narrower than us.
    assert plan({0, 1}, {101: {0, 1, 2, 3}}) is None


def test_confine_sets_every_thread_and_the_unbound_engine_processes(monkeypatch):
    calls: dict[int, set[int]] = {}
    affinity = {0: {0, 1}, 100: {0, 1}, 101: {0}}
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: affinity[pid])
    monkeypatch.setattr(os, "sched_setaffinity", lambda pid, cpus: calls.__setitem__(pid, set(cpus)))
    monkeypatch.setattr(cpu_placement, "_threads", lambda: [7, 8])
    assert cpu_placement.confine([100, 101]) == {1}
    assert calls == {7: {1}, 8: {1}, 100: {1}}


def test_confine_skips_processes_that_are_gone(monkeypatch):
    def getaffinity(pid: int) -> set[int]:
        if pid == 999:
            raise ProcessLookupError(pid)
        return {0: {0, 1}, 101: {0}}[pid]

    calls: list[int] = []
    monkeypatch.setattr(os, "sched_getaffinity", getaffinity)
    monkeypatch.setattr(os, "sched_setaffinity", lambda pid, cpus: calls.append(pid))
    monkeypatch.setattr(cpu_placement, "_threads", lambda: [7])
    assert cpu_placement.confine([999, 101]) == {1}
    assert calls == [7]
