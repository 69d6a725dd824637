"""Managed deployments end to end: a `streamproxy gateway` process that runs its own
`--engine fake` replicas (with `--fake-boot-delay`, so waking can be seen).

Parked -> 503 deployment_waking + Retry-After -> ready -> served (and the OpenAI SDK's
own retries hide the wake); idle parking and waking again; admin wake/park; a replica
killed mid-stream; a replica that cannot start (failed); wait_for_wake; the gateway's
SIGTERM and SIGKILL taking the replicas with it (checked by pid)."""

from __future__ import annotations

import concurrent.futures
import json
import math
import os
import signal
from typing import Any

import openai
import requests

from harness.waiting import wait_until_sync
from tests.gateway.gateway_support import fits
from tests.support.gateway import alive, gateway_process

CHAT: dict[str, Any] = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
FAKE = '["--fake-boot-delay", "0.3"'


def config(*deployments: str, extra: str = "") -> str:
    return "deployments:\n" + "".join(deployments) + extra


def managed(name: str, *, args: str = "", idle: str = "0", boot_guess: float = 1, wait: bool = False, more: str = "") -> str:
    return (
        f"  - name: {name}\n    id: dep-{name}\n    launch:\n      model: fake\n"
        f"      args: {FAKE}{', ' + args if args else ''}]\n"
        f"      idle_park_after: {idle}\n      boot_guess: {boot_guess}\n      wait_for_wake: {str(wait).lower()}\n{more}"
    )


def chat(gw, model: str, **kw) -> requests.Response:
    return requests.post(gw.url("/v1/chat/completions"), json={"model": model, **CHAT, **kw}, timeout=60)


def wait_state(gw, dep: str, state: str, timeout: float = 60.0) -> dict:
    assert wait_until_sync(lambda: gw.state(dep) == state, timeout), (gw.deployment(dep), gw.log()[-3000:])
    return gw.deployment(dep)


def pids_of(info: dict) -> list[int]:
    return [r["pid"] for r in info["replicas"] if "pid" in r]


def test_parked_answers_waking_then_serves_and_the_sdk_retries_through_the_wake(tmp_path):
    yaml = config(managed("smol", idle="10m", boot_guess=2), managed("sdk", idle="10m"))
    with gateway_process(tmp_path, yaml) as gw:
        assert gw.state("dep-smol") == "parked" and gw.deployment("dep-smol")["replicas"] == []
        fits("/v1/deployments/dep-smol", "get", 200, gw.deployment("dep-smol"))  # as GET /openapi.json says
        assert requests.get(gw.url("/health"), timeout=10).status_code == 200  # parked is not down: it wakes on demand
        first = chat(gw, "smol")
        assert first.status_code == 503, first.text
        assert first.headers["Retry-After"] == "2"  # boot_guess, before any boot was timed
        error = first.json()["error"]
        assert (error["type"], error["code"]) == ("service_unavailable", "deployment_waking")
        fits("/v1/chat/completions", "post", 503, first.json())
        info = wait_state(gw, "dep-smol", "ready")
        fits("/v1/deployments/dep-smol", "get", 200, info)
        assert info["last_boot_seconds"] > 0 and info["boots"] == 1
        (replica,) = info["replicas"]
        assert replica["port"] and replica["pid"] in gw.replica_pids() and replica["url"].endswith(f":{replica['port']}")
        served = chat(gw, "smol")
        assert served.status_code == 200 and served.json()["model"] == "smol", (served.text, gw.log()[-2000:])
        # The SDK honours Retry-After on the 503 and retries: the caller sees only the answer.
        client = openai.OpenAI(base_url=gw.url("/v1"), api_key="unused", max_retries=20)
        answer = client.chat.completions.create(model="sdk", **CHAT)
        assert answer.choices[0].finish_reason == "length" and answer.model == "sdk"
        assert gw.deployment("dep-sdk")["boots"] == 1


def test_idle_parking_and_waking_again_and_admin_wake_and_park(tmp_path):
    # 3 s idle: room for a busy machine between "ready" and the next request.
    with gateway_process(tmp_path, config(managed("smol", idle="3s")), "--admin-key", "adm-secret") as gw:
        assert chat(gw, "smol").status_code == 503
        info = wait_state(gw, "dep-smol", "ready")
        (pid,) = pids_of(info)
        assert chat(gw, "smol").status_code == 200
        info = wait_state(gw, "dep-smol", "parked")  # idle
        assert info["parks"] == 1 and info["replicas"] == []
        assert wait_until_sync(lambda: not alive(pid), 30), "the parked replica still runs"
        again = chat(gw, "smol")
        assert again.status_code == 503
        boot = info["last_boot_seconds"]  # the last boot, rounded up (the report rounds it to ms)
        assert int(again.headers["Retry-After"]) in {max(1, math.ceil(boot - 0.001)), max(1, math.ceil(boot + 0.001))}
        wait_state(gw, "dep-smol", "ready")
        assert chat(gw, "smol").status_code == 200
        # Admin routes: the key or 401.
        assert requests.post(gw.url("/v1/deployments/dep-smol/park"), timeout=30).status_code == 401
        wrong = {"Authorization": "Bearer nope"}
        assert requests.post(gw.url("/v1/deployments/dep-smol/park"), headers=wrong, timeout=30).status_code == 401
        admin = {"Authorization": "Bearer adm-secret"}
        parked = requests.post(gw.url("/v1/deployments/dep-smol/park"), headers=admin, timeout=60)
        assert parked.status_code == 200 and parked.json()["state"] == "parked"
        woken = requests.post(gw.url("/v1/deployments/dep-smol/wake"), headers=admin, timeout=30)
        assert woken.status_code == 200 and woken.json()["state"] in ("waking", "ready")
        wait_state(gw, "dep-smol", "ready")


def test_a_replica_killed_mid_stream_ends_the_stream_in_band_and_is_restarted(tmp_path):
    # Migration off: with it on, the stream may go on on the restarted replica, when the supervisor has seen the
    # exit before the gateway the break (a race; either way the client gets one stream, whole or ended in-band).
    more = "      restart_backoff: 0.1\n    migration: {enabled: false}\n"
    yaml = config(managed("smol", args='"--fake-token-delay", "0.05"', more=more))
    with gateway_process(tmp_path, yaml) as gw:
        info = wait_state(gw, "dep-smol", "ready")  # idle 0: always on, woken at start
        (pid,) = pids_of(info)
        with requests.post(gw.url("/v1/chat/completions"), json={"model": "smol", **CHAT, "max_tokens": 400, "stream": True}, stream=True, timeout=60) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            first = next(line for line in lines if line.startswith(b"data: "))
            assert json.loads(first[6:])["object"] == "chat.completion.chunk"
            os.kill(pid, signal.SIGKILL)
            rest = [line for line in lines if line.startswith(b"data: ")]
        assert rest[-1] == b"data: [DONE]"
        assert json.loads(rest[-2][6:]).get("error", {}).get("code") == "upstream_unavailable", (rest[-3:], gw.log()[-3000:])
        wait_until_sync(lambda: gw.deployment("dep-smol")["restarts"] == 1 and gw.state("dep-smol") == "ready", 60)
        info = gw.deployment("dep-smol")
        assert info["restarts"] == 1 and pids_of(info) and pids_of(info)[0] != pid, info
        assert chat(gw, "smol").status_code == 200


def test_a_replica_that_cannot_start_fails_the_deployment_with_its_log_in_the_gateways_log(tmp_path):
    yaml = config(managed("bad", args='"--no-such-flag"', more="      restart_backoff: 0.05\n"))
    with gateway_process(tmp_path, yaml, "--admin-key", "adm") as gw:
        assert chat(gw, "bad").status_code == 503
        info = wait_state(gw, "dep-bad", "failed")
        assert info["replicas"] == [] and info["restarts"] == 2
        refused = chat(gw, "bad")
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "deployment_failed"
        assert "no-such-flag" not in refused.text  # the replica's log never goes into a response
        assert refused.headers.get("x-should-retry") == "false"
        assert "unrecognized arguments: --no-such-flag" in gw.log()
        assert requests.get(gw.url("/health"), timeout=10).status_code == 503


def test_wait_for_wake_holds_the_request_with_keepalives_instead_of_a_503(tmp_path):
    # Boots of a second or more (`--fake-boot-delay 1` plus the start) against keepalives every 0.1 s.
    slow = '"--fake-boot-delay", "1"'
    yaml = config(managed("patient", wait=True, idle="1s", args=slow))
    with gateway_process(tmp_path, yaml, "--sse-heartbeat", "0.1", "--nonstream-keepalive-after", "0.1", "--nonstream-keepalive-interval", "0.1") as gw:
        streamed = chat(gw, "patient", stream=True)
        assert streamed.status_code == 200 and streamed.text.rstrip().endswith("data: [DONE]")
        assert streamed.text.startswith(":"), streamed.text[:200]  # SSE comments while it woke
        wait_state(gw, "dep-patient", "parked")
        plain = chat(gw, "patient")
        assert plain.status_code == 200 and plain.text.startswith("\n")  # the early 200's keepalive newlines
        assert json.loads(plain.text)["choices"][0]["finish_reason"] == "length"


def test_max_resident_parks_the_least_recently_used_idle_deployment_or_says_why_not(tmp_path):
    yaml = config(
        *(managed(name, idle="10m", args='"--fake-token-delay", "0.05"') for name in "abc"),
        extra="max_resident: 2\n",
    )
    with gateway_process(tmp_path, yaml) as gw:
        for name in ("a", "b"):
            assert chat(gw, name).status_code == 503
            wait_state(gw, f"dep-{name}", "ready")
        assert chat(gw, "b").status_code == 200  # b used after a: a is the least recently used
        assert chat(gw, "c").status_code == 503
        wait_state(gw, "dep-c", "ready")
        assert gw.state("dep-a") == "parked" and gw.state("dep-b") == "ready"
        # b busy with a stream, c just used but idle: waking a parks c, never b.
        with requests.post(gw.url("/v1/chat/completions"), json={"model": "b", **CHAT, "max_tokens": 2000, "stream": True}, stream=True, timeout=60) as r:
            lines = r.iter_lines()
            next(line for line in lines if line.startswith(b"data: "))
            assert chat(gw, "a").status_code == 503
            wait_state(gw, "dep-a", "ready")
            assert gw.state("dep-c") == "parked" and gw.state("dep-b") == "ready"
            # Now a (idle) can make room for c; but with a busy too, nothing can be parked:
            with requests.post(gw.url("/v1/chat/completions"), json={"model": "a", **CHAT, "max_tokens": 2000, "stream": True}, stream=True, timeout=60) as busy:
                assert busy.status_code == 200
                full = chat(gw, "c")
                assert full.status_code == 503 and full.json()["error"]["code"] == "max_resident", full.text
                assert gw.state("dep-c") == "parked"
        metrics = requests.get(gw.url("/metrics"), timeout=10).text
        assert 'streamproxy_gateway_deployment_state{deployment="c"} 0.0' in metrics
        assert 'streamproxy_gateway_deployment_state{deployment="a"} 2.0' in metrics
        assert 'streamproxy_gateway_boots_total{deployment="a"} 2.0' in metrics
        assert 'streamproxy_gateway_parks_total{deployment="c"} 1.0' in metrics
        assert 'streamproxy_gateway_boot_seconds_count{deployment="a"} 2.0' in metrics


def test_gateway_sigterm_lets_a_live_stream_finish_then_stops_every_replica(tmp_path):
    yaml = config(managed("smol", args='"--fake-token-delay", "0.02"'))
    with gateway_process(tmp_path, yaml) as gw:
        pids = pids_of(wait_state(gw, "dep-smol", "ready"))
        gw.replica_pids()
        with requests.post(gw.url("/v1/chat/completions"), json={"model": "smol", **CHAT, "max_tokens": 100, "stream": True}, stream=True, timeout=60) as r:
            lines = r.iter_lines()
            next(line for line in lines if line.startswith(b"data: "))
            gw.proc.send_signal(signal.SIGTERM)
            rest = [line for line in lines if line.startswith(b"data: ")]
        assert rest[-1] == b"data: [DONE]" and b"error" not in rest[-2]  # finished during the drain
        assert gw.proc.wait(60) == 0
        assert pids and not any(alive(pid) for pid in pids)


def test_replicas_exit_by_themselves_when_the_gateway_is_killed(tmp_path):
    yaml = config(managed("smol", args='"--drain-timeout", "1"'))
    with gateway_process(tmp_path, yaml) as gw:
        pids = pids_of(wait_state(gw, "dep-smol", "ready"))
        gw.replica_pids()
        gw.proc.kill()
        gw.proc.wait(30)
        assert pids and wait_until_sync(lambda: not any(alive(pid) for pid in pids), 30), "a replica outlived the gateway"


def test_a_replica_not_healthy_by_boot_timeout_is_killed_and_counts_as_a_failed_start(tmp_path):
    # The engine would load for a minute; boot_timeout is a second.
    yaml = config(managed("slow", args='"--fake-boot-delay", "60"', more="      boot_timeout: 1\n      restart_backoff: 0.05\n"))
    with gateway_process(tmp_path, yaml) as gw:
        assert chat(gw, "slow").status_code == 503
        info = wait_state(gw, "dep-slow", "failed")
        assert info["restarts"] == 2 and info["replicas"] == []
        assert "not healthy after 1 s" in gw.log()
        assert not gw.replica_pids()  # every start was killed and reaped


def test_gateway_sigterm_while_waking_stops_the_booting_replica(tmp_path):
    yaml = config(managed("slow", args='"--fake-boot-delay", "60"'))  # idle 0: woken at start
    with gateway_process(tmp_path, yaml) as gw:
        assert wait_until_sync(lambda: gw.deployment("dep-slow")["replicas"], 30)
        pids = pids_of(gw.deployment("dep-slow"))
        gw.replica_pids()
        assert gw.state("dep-slow") == "waking"
        gw.proc.send_signal(signal.SIGTERM)
        assert gw.proc.wait(60) == 0
        assert pids and not any(alive(pid) for pid in pids)


def test_two_replicas_one_wake_for_many_requests_and_one_lost_leaves_the_other_serving(tmp_path):
    yaml = config(managed("pair", idle="10m", more="      replicas: 2\n      restart_backoff: 0.1\n"))
    with gateway_process(tmp_path, yaml) as gw:
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda _: chat(gw, "pair").status_code, range(8)))
        assert answers == [503] * 8

        def both_up() -> bool:
            info = gw.deployment("dep-pair")
            return info["state"] == "ready" and len(info["replicas"]) == 2 and not any(r.get("booting") for r in info["replicas"])
        assert wait_until_sync(both_up, 60), gw.deployment("dep-pair")
        info = gw.deployment("dep-pair")
        assert info["boots"] == 1 and len({r["port"] for r in info["replicas"]}) == 2
        lost, kept = pids_of(info)
        os.kill(lost, signal.SIGKILL)
        assert wait_until_sync(lambda: lost not in pids_of(gw.deployment("dep-pair")), 30)
        assert gw.state("dep-pair") == "ready" and kept in pids_of(gw.deployment("dep-pair"))
        assert chat(gw, "pair").status_code == 200  # the other replica serves meanwhile
        assert wait_until_sync(both_up, 60) and gw.deployment("dep-pair")["restarts"] == 1


def test_two_deployments_that_cannot_both_be_resident_serve_alternating_requests(tmp_path):
    """One slot (`max_resident: 1`), two deployments, requests alternating between them: each
    one parks the other and wakes its own, and the SDK's own retries hide every wake."""
    yaml = config(managed("a", idle="10m"), managed("b", idle="10m"), extra="max_resident: 1\n")
    with gateway_process(tmp_path, yaml) as gw:
        client = openai.OpenAI(base_url=gw.url("/v1"), api_key="unused", max_retries=30)
        order = ["a", "b", "a", "b"]
        answers = [client.chat.completions.create(model=name, **CHAT) for name in order]
        assert [a.model for a in answers] == order
        assert all(a.choices[0].finish_reason == "length" for a in answers)
        a, b = gw.deployment("dep-a"), gw.deployment("dep-b")
        assert (a["boots"], b["boots"]) == (2, 2)  # every switch was a boot
        assert a["last_boot_seconds"] > 0 and b["last_boot_seconds"] > 0
        assert {a["state"], b["state"]} == {"parked", "ready"}  # never both resident
        metrics = requests.get(gw.url("/metrics"), timeout=10).text
        assert 'streamproxy_gateway_boots_total{deployment="a"} 2.0' in metrics
        assert 'streamproxy_gateway_parks_total{deployment="a"} 2.0' in metrics
        assert 'streamproxy_gateway_parks_total{deployment="b"} 1.0' in metrics


def test_sighup_swaps_managed_deployments_the_removed_one_drains_after_its_stream_and_a_bad_file_is_refused(tmp_path):
    """The process's own SIGHUP: `smol` (streaming) replaced by `smol2`; `smol` answers 404 to new requests,
    its stream ends whole, then its replica exits; `smol2` wakes and serves; a file that does not parse is
    refused (one log line naming it) and the running config serves on."""
    slow = '"--fake-token-delay", "0.05"'
    with gateway_process(tmp_path, config(managed("smol", args=slow))) as gw:
        (pid,) = pids_of(wait_state(gw, "dep-smol", "ready"))
        body = {"model": "smol", **CHAT, "max_tokens": 40, "stream": True}
        with requests.post(gw.url("/v1/chat/completions"), json=body, stream=True, timeout=60) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            next(line for line in lines if line.startswith(b"data: "))
            (tmp_path / "gateway.yaml").write_text(config(managed("smol2")))
            gw.proc.send_signal(signal.SIGHUP)
            assert wait_until_sync(lambda: "reloaded " in gw.log(), 30), gw.log()[-3000:]
            gone = chat(gw, "smol")
            assert gone.status_code == 404 and gone.json()["error"]["code"] == "model_not_found"
            assert alive(pid)  # its stream is still running on it
            rest = [line for line in lines if line.startswith(b"data: ")]
        assert rest[-1] == b"data: [DONE]"
        assert not any(b'"error"' in line for line in rest)
        assert wait_until_sync(lambda: not alive(pid), 30), gw.log()[-3000:]
        # Logged once the source's stop returns, a moment after the replica's process is gone.
        stopped = "deployment smol (dep-smol): stopped, as the reload removed or changed it"
        assert wait_until_sync(lambda: stopped in gw.log(), 10), gw.log()[-3000:]
        wait_state(gw, "dep-smol2", "ready")
        assert chat(gw, "smol2").status_code == 200
        (tmp_path / "gateway.yaml").write_text("deployments: [\n")
        gw.proc.send_signal(signal.SIGHUP)
        assert wait_until_sync(lambda: "reload refused" in gw.log(), 30), gw.log()[-3000:]
        refused = [line for line in gw.log().splitlines() if "reload refused" in line]
        assert len(refused) == 1 and refused[0].endswith(
            f"reload refused: {tmp_path / 'gateway.yaml'}: not valid YAML: line 2, column 1: expected the node content, "
            "but found '<stream end>' (while parsing a flow node at line 2, column 1); still serving the previous config"
        ), refused
        assert chat(gw, "smol2").status_code == 200
        metrics = requests.get(gw.url("/metrics"), timeout=10).text
        assert 'streamproxy_gateway_config_reloads_total{outcome="applied"} 1.0' in metrics
        assert 'streamproxy_gateway_config_reloads_total{outcome="refused"} 1.0' in metrics


def test_a_managed_deployment_made_through_the_admin_api_survives_a_restart_and_its_delete_stops_its_replica(tmp_path):
    ledger = f"ledger: sqlite:///{tmp_path}/ledger.db\n"
    admin = {"Authorization": "Bearer adm"}
    made: dict[str, Any] = {"name": "api-smol", "id": "dep-api-smol", "launch": {"model": "fake", "args": ["--fake-boot-delay", "0.3"]}}
    with gateway_process(tmp_path, config(managed("smol"), extra=ledger), "--admin-key", "adm") as gw:
        answer = requests.post(gw.url("/v1/deployments"), json=made, headers=admin, timeout=30)
        assert answer.status_code == 200, answer.text
        assert (answer.json()["source"], answer.json()["managed"]) == ("api", True)
        wait_state(gw, "dep-api-smol", "ready")
        assert chat(gw, "api-smol").status_code == 200
    with gateway_process(tmp_path, config(managed("smol"), extra=ledger), "--admin-key", "adm", name="again") as gw:
        (pid,) = pids_of(wait_state(gw, "dep-api-smol", "ready"))  # served again from the store, always on
        assert chat(gw, "api-smol").status_code == 200
        gone = requests.delete(gw.url("/v1/deployments/dep-api-smol"), headers=admin, timeout=30)
        assert gone.json() == {"id": "dep-api-smol", "deleted": True, "object": "deployment"}
        assert wait_until_sync(lambda: not alive(pid), 30), gw.log()[-3000:]
        assert chat(gw, "api-smol").status_code == 404
