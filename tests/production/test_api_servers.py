"""`--api-server-count N` on the fake engine: N processes on one port, one server to the client.

Each test starts a parent with two workers (each with its own fake engine)
and checks one edge feature across them: connections land on both pids (the
access log's `pid`), response ids are unique, /metrics is the sum whichever
worker answers, the limits add up to the one asked for, SIGTERM drains every
worker, a disconnect aborts in the worker's engine, and an engine's death
ends them all with exit 1. The split of the limits is checked sans-IO too.
"""

from __future__ import annotations

import json
import os
import signal
import socket
from typing import Any

import psutil
import pytest
import requests

from streamproxy.config import Settings
from streamproxy.workers import bind, check, share, worker_settings
from tests.support import USER_HI, wait_until_sync
from tests.support.workers import ApiServers, api_servers

CHAT = "/v1/chat/completions"


def _stream(srv: ApiServers, max_tokens: int, **extra: Any) -> requests.Response:
    """A stream on a connection of its own (no session), its first event read."""
    resp = requests.post(srv.url(CHAT), json={"model": "fake", "messages": USER_HI, "stream": True,
                                              "max_tokens": max_tokens, **extra}, stream=True, timeout=30)
    assert resp.status_code == 200, resp.text
    lines = resp.iter_lines()
    assert next(line for line in lines if line).startswith(b"data: ")
    resp._lines = lines  # type: ignore[attr-defined]
    return resp


def _rest(resp: requests.Response) -> list[dict]:
    events = []
    for line in resp._lines:  # type: ignore[attr-defined]
        if line.startswith(b"data: ") and line != b"data: [DONE]":
            events.append(json.loads(line[6:]))
        elif line == b"data: [DONE]":
            events.append({"done": True})
    return events


def test_limits_split_so_the_totals_are_what_was_asked() -> None:
    assert [share(10, 3, i) for i in range(3)] == [4, 3, 3]
    assert [share(1, 2, i) for i in range(2)] == [1, 0]
    s = Settings(api_server_count=3, max_concurrent_requests=10, max_queued_requests=5, max_connections=7)
    parts = [worker_settings(s, i, 3) for i in range(3)]
    assert sum(p.max_concurrent_requests for p in parts) == 10
    assert sum(p.max_queued_requests for p in parts) == 5
    assert sum(p.max_connections or 0 for p in parts) == 7
    unlimited = worker_settings(Settings(api_server_count=3), 1, 3)
    assert unlimited.max_concurrent_requests == 0 and unlimited.max_queued_requests == 0
    with pytest.raises(SystemExit, match="at least 3"):
        check(Settings(api_server_count=3, max_concurrent_requests=2))  # a worker with 0 slots would have no limit


def test_runtime_lora_updates_are_refused_with_several_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "1")
    with pytest.raises(SystemExit, match="VLLM_ALLOW_RUNTIME_LORA_UPDATING"):
        check(Settings(api_server_count=2))
    check(Settings(api_server_count=1))


def test_the_port_is_bound_once_for_every_worker_and_nothing_listens_yet() -> None:
    socks = bind("127.0.0.1", 0, 3)
    try:
        ports = {s.getsockname()[1] for s in socks}
        assert len(ports) == 1
        with socket.socket() as probe:  # bound, not listening: the kernel refuses rather than queueing
            assert probe.connect_ex(("127.0.0.1", ports.pop())) != 0
    finally:
        for s in socks:
            s.close()


def test_two_workers_serve_one_port_with_unique_ids() -> None:
    with api_servers(2) as srv:
        workers = srv.pids()
        assert len(workers) == 2
        ids = []
        for _ in range(30):  # a connection each: the kernel spreads them by the 4-tuple's hash
            resp = requests.post(srv.url(CHAT), json={"model": "fake", "messages": USER_HI, "max_tokens": 2}, timeout=10)
            assert resp.status_code == 200
            ids.append(resp.json()["id"])
        assert len(set(ids)) == len(ids)
        assert wait_until_sync(lambda: len([d for d in srv.log_lines() if d["path"] == CHAT]) == 30, 10)
        served = {d["pid"] for d in srv.log_lines() if d["path"] == CHAT}
        assert served == workers  # both served, and nothing else did


def test_metrics_are_the_sum_whichever_worker_answers() -> None:
    with api_servers(2, "--fake-token-delay", "0.01") as srv:
        for _ in range(20):
            resp = requests.post(srv.url(CHAT), json={"model": "fake", "messages": USER_HI, "max_tokens": 3,
                                                      "stream": True}, timeout=10)
            assert resp.status_code == 200 and resp.text.endswith("data: [DONE]\n\n")
        # The access log is written in batches (up to 50 ms later): wait for the lines.
        assert wait_until_sync(lambda: len([d for d in srv.log_lines() if d["path"] == CHAT]) >= 20, 10)
        served = {d["pid"] for d in srv.log_lines() if d["path"] == CHAT}
        assert len(served) == 2
        scrapes = [srv.metrics_text() for _ in range(20)]
        assert wait_until_sync(lambda: len([d for d in srv.log_lines() if d["path"] == "/metrics"]) >= 20, 10)
        assert len({d["pid"] for d in srv.log_lines() if d["path"] == "/metrics"}) == 2  # both answered scrapes
        for text in scrapes:
            assert srv.metric("streamproxy_responses_total", text, route=CHAT, status="200") == 20
            assert srv.metric("streamproxy_time_to_first_token_seconds_count", text) == 20
            assert srv.metric("streamproxy_requests_running", text) == 0
        # The per-write histogram reaches the files once a second (metrics.publish): a token per step, so
        # at least one gap between writes of text per stream.
        assert wait_until_sync(lambda: srv.metric("streamproxy_inter_token_latency_seconds_count") >= 20, 10)


def test_limits_hold_in_total_across_workers() -> None:
    flags = ("--fake-token-delay", "0.2", "--max-concurrent-requests", "2", "--max-queued-requests", "0")
    with api_servers(2, *flags) as srv:
        answers = [requests.post(srv.url(CHAT), json={"model": "fake", "messages": USER_HI, "max_tokens": 200,
                                                      "stream": True}, stream=True, timeout=30) for _ in range(12)]
        try:
            codes = [r.status_code for r in answers]
            assert set(codes) <= {200, 429} and 1 <= codes.count(200) <= 2, codes
            assert srv.metric("streamproxy_requests_running") == codes.count(200)
            assert srv.metric("streamproxy_admission_rejections_total") == codes.count(429)
        finally:
            for r in answers:
                r.close()


def test_sigterm_drains_every_worker() -> None:
    with api_servers(2, "--fake-token-delay", "0.05", "--drain-timeout", "60") as srv:
        streams = [_stream(srv, 40) for _ in range(12)]
        running = srv.metric("streamproxy_active_streams")
        assert running == 12
        srv.server.proc.send_signal(signal.SIGTERM)
        for resp in streams:
            events = _rest(resp)
            assert events[-1] == {"done": True}
            finish = [e["choices"][0]["finish_reason"] for e in events[:-1] if e.get("choices")]
            assert finish[-1] == "length"  # finished in full, not ended by the drain
        assert srv.server.proc.wait(60) == 0, srv.server.log()[-4000:]
        served = {d["pid"] for d in srv.log_lines() if d["path"] == CHAT}
        assert len(served) == 2  # both workers had streams to drain
        assert "draining: " in srv.server.log() and srv.server.log().count("] streamproxy.server: stopped") == 2


def test_a_disconnect_aborts_in_the_workers_engine() -> None:
    with api_servers(2, "--fake-token-delay", "0.05") as srv:
        streams = [_stream(srv, 3000) for _ in range(10)]
        assert srv.metric("streamproxy_active_streams") == 10
        for resp in streams:
            resp.close()
        assert wait_until_sync(lambda: srv.metric("streamproxy_engine_aborts_total") == 10, 20), srv.metrics_text()
        assert wait_until_sync(lambda: srv.metric("streamproxy_engine_requests") == 0, 20)
        assert srv.metric("streamproxy_client_disconnects_total") == 10
        assert wait_until_sync(lambda: len([d for d in srv.log_lines() if d["path"] == CHAT]) == 10, 10)  # written in batches
        assert len({d["pid"] for d in srv.log_lines() if d["path"] == CHAT}) == 2


def test_an_engine_death_ends_every_worker_with_exit_1() -> None:
    with api_servers(2) as srv:
        workers = srv.pids()
        victim = min(workers)
        os.kill(victim, signal.SIGUSR1)  # what the parent sends when the shared engine core dies
        assert srv.server.proc.wait(60) == 1, srv.server.log()[-4000:]
        assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in workers)
        log = srv.server.log()
        assert "the inference engine died" in log and f"pid {victim}) exited with 1" in log


def test_a_crash_in_one_workers_engine_answers_503_then_ends_all() -> None:
    with api_servers(2, "--fake-crash-on", "BOOM", "--engine-death-grace", "30") as srv:
        resp = requests.post(srv.url(CHAT), json={"model": "fake", "messages": [{"role": "user", "content": "BOOM"}],
                                                  "max_tokens": 5}, timeout=30)
        assert resp.status_code >= 500
        assert wait_until_sync(lambda: any(d["path"] == CHAT for d in srv.log_lines()), 10)
        dead = next(d["pid"] for d in srv.log_lines() if d["path"] == CHAT)
        # That worker answers 503 engine_dead for the grace; the other one still serves meanwhile.
        answers = set()
        for _ in range(20):
            health = requests.get(srv.url("/health"), timeout=10)
            answers.add(health.status_code)
        assert answers == {200, 503}
        assert wait_until_sync(lambda: len([d for d in srv.log_lines() if d["path"] == "/health"]) >= 20, 10)  # and the readiness probe's
        assert {d["pid"] for d in srv.log_lines() if d["path"] == "/health" and d["status"] == 503} == {dead}
        srv.server.proc.send_signal(signal.SIGTERM)
        assert srv.server.proc.wait(60) == 1, srv.server.log()[-4000:]
