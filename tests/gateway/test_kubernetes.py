"""`kubernetes:` deployments against a fake API server (harness/fake_kube.py) driven by
kubernetes_asyncio: pods found by label, Ready / unready / deleted with a stream running, a watch
cut and resumed from its resourceVersion, a 410 re-list that keeps every replica once, wake and
park through the scale subresource, the API server down at start and gone for a while, 403s and a
port name no container has. Replicas are in-process fake-engine servers on loopback (`replica`)."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest

from engine_adapter.fake import FakeScript
from harness.fake_kube import FakeKube
from streamproxy.gateway.kubernetes import KubernetesSource
from tests.gateway.gateway_support import DEPLOYMENT, DEPLOYMENT_ID, SERVED, chat, error_body, post, sample
from tests.support import wait_until

BOUND = 30.0  # generous: a passing test never waits it out (tests/README: wait for events, not time)
LABELS = {"app": "qwen3-8b"}
CHAT = "/v1/chat/completions"


@pytest.fixture
async def kube(replica, tmp_path):
    async def start_replica():
        r = await replica()
        return r.port, r.stop

    fake = FakeKube(start_replica=start_replica)
    fake.kubeconfig_path = tmp_path / "kubeconfig"  # type: ignore[attr-defined]
    yield fake
    await fake.close()


def k8s(fake: FakeKube, **extra: Any) -> list[dict]:
    section = {
        "namespace": "llm", "selector": LABELS, "port": "http", "kubeconfig": fake.kubeconfig(fake.kubeconfig_path),  # type: ignore[attr-defined]
        "backoff_initial": 0.02, "backoff_max": 0.1, "request_timeout": 2, **extra,
    }
    return [{"name": DEPLOYMENT, "id": DEPLOYMENT_ID, "served_model": SERVED, "kubernetes": section}]


def source(gw) -> KubernetesSource:
    s = gw.state.sources[DEPLOYMENT]
    assert isinstance(s, KubernetesSource)
    return s


def urls(gw) -> list[str]:
    return [r.url for r in gw.pool().replicas]


async def describe(session, gw) -> dict:
    async with session.get(gw.url(f"/v1/deployments/{DEPLOYMENT}")) as resp:
        assert resp.status == 200
        return await resp.json()


async def ok(session, gw) -> None:
    status, _, body = await post(session, gw.url(CHAT), chat())
    assert status == 200, body


# -- discovery -------------------------------------------------------------------------


async def test_pods_appear_become_ready_and_take_requests(kube, replica, gateway, session):
    a, b = await replica(), await replica()
    await kube.start_server()
    kube.add_pod("qwen-a", LABELS, port=a.port)  # not Ready yet
    kube.add_pod("other", {"app": "else"}, port=b.port, ready=True)  # another selector's pod
    gw = await gateway(deployments=k8s(kube))
    assert await wait_until(lambda: kube.open_watches() == 1, BOUND)
    assert urls(gw) == []
    status, headers, body = await post(session, gw.url(CHAT), chat())
    assert status == 503 and headers["Retry-After"] == "60"
    assert json.loads(body) == error_body(
        f"deployment `{DEPLOYMENT}` has no replica: no Ready pod matches app=qwen3-8b in namespace llm",
        "service_unavailable", "upstream_unavailable",
    )
    kube.set_ready("qwen-a")
    assert await wait_until(lambda: urls(gw) == [a.base], BOUND)
    await ok(session, gw)
    assert len(a.inference()) == 1
    kube.add_pod("qwen-b", LABELS, port=b.port, ready=True)
    assert await wait_until(lambda: urls(gw) == [a.base, b.base], BOUND)
    view = await describe(session, gw)
    assert [(r["url"], r["pod"]) for r in view["replicas"]] == [(a.base, "qwen-a"), (b.base, "qwen-b")]
    assert (view["managed"], view["state"], view["problem"]) == (False, "ready", None)
    # One list, then one watch from the list's resourceVersion, with bookmarks.
    assert kube.calls == [("list", "pods"), ("watch", "pods")]
    assert kube.watch_from == ["102"]


async def test_a_pod_turning_unready_takes_no_new_request(kube, replica, gateway, session):
    a, b = await replica(), await replica()
    await kube.start_server()
    kube.add_pod("qwen-a", LABELS, port=a.port, ready=True)
    kube.add_pod("qwen-b", LABELS, port=b.port, ready=True)
    gw = await gateway(deployments=k8s(kube))
    assert await wait_until(lambda: urls(gw) == [a.base, b.base], BOUND)
    kube.set_ready("qwen-b", False)
    assert await wait_until(lambda: urls(gw) == [a.base], BOUND)
    for _ in range(4):
        await ok(session, gw)
    assert (len(a.inference()), len(b.inference())) == (4, 0)
    kube.set_ready("qwen-b")
    assert await wait_until(lambda: urls(gw) == [a.base, b.base], BOUND)


async def test_a_pod_deleted_with_a_stream_running_finishes_the_stream(kube, replica, gateway, session):
    slow = await replica(FakeScript(tokens=[f"t{i} " for i in range(12)], token_delay=0.05))
    await kube.start_server()
    kube.add_pod("qwen-a", LABELS, port=slow.port, ready=True)
    gw = await gateway(deployments=k8s(kube))
    assert await wait_until(lambda: urls(gw) == [slow.base], BOUND)
    async with session.post(gw.url(CHAT), json=chat(stream=True)) as resp:
        assert resp.status == 200
        first = await resp.content.readline()
        assert first.startswith(b"data: ")
        kube.mark_deleting("qwen-a")  # deletionTimestamp: no new request, the running stream goes on
        assert await wait_until(lambda: urls(gw) == [], BOUND)
        status, _, body = await post(session, gw.url(CHAT), chat())
        assert status == 503 and json.loads(body)["error"]["code"] == "upstream_unavailable"
        rest = await resp.read()
    text = (first + rest).decode()
    assert text.endswith("data: [DONE]\n\n")
    assert "".join(json.loads(line[6:])["choices"][0]["delta"].get("content", "")
                   for line in text.splitlines() if line.startswith("data: {") and json.loads(line[6:])["choices"]) == "".join(
        f"t{i} " for i in range(12))
    kube.remove_pod("qwen-a")
    assert await wait_until(lambda: not source(gw).table.pods, BOUND)


async def test_a_watch_cut_midway_resumes_from_the_last_resource_version(kube, replica, gateway, session, caplog):
    a, b = await replica(), await replica()
    await kube.start_server()
    kube.add_pod("qwen-a", LABELS, port=a.port, ready=True)
    gw = await gateway(deployments=k8s(kube))
    assert await wait_until(lambda: urls(gw) == [a.base] and kube.open_watches() == 1, BOUND)
    kube.set_ready("qwen-a", False)
    kube.set_ready("qwen-a", True)  # resourceVersion 103
    kube.bookmark()  # carries 103 too
    assert await wait_until(lambda: source(gw).resource_version == "103", BOUND)
    kube.cut_watches()
    assert await wait_until(lambda: len(kube.watch_from) == 2 and kube.open_watches() == 1, BOUND)
    assert kube.watch_from == ["101", "103"]  # resumed, not listed again
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]  # a cut watch is routine, not a fault
    assert kube.count("list", "pods") == 1
    kube.add_pod("qwen-b", LABELS, port=b.port, ready=True)
    assert await wait_until(lambda: urls(gw) == [a.base, b.base], BOUND)
    await ok(session, gw)


async def test_a_410_lists_again_and_keeps_every_replica_once(kube, replica, gateway, session):
    a, b, c = await replica(FakeScript(tokens=[f"t{i} " for i in range(10)], token_delay=0.05)), await replica(), await replica()
    await kube.start_server()
    kube.add_pod("qwen-a", LABELS, port=a.port, ready=True)
    kube.add_pod("qwen-b", LABELS, port=b.port, ready=True)
    gw = await gateway(deployments=k8s(kube))
    gw.in_order()
    assert await wait_until(lambda: urls(gw) == [a.base, b.base], BOUND)
    kept = gw.pool().replicas[0]
    async with session.post(gw.url(CHAT), json=chat(stream=True)) as resp:  # goes to qwen-a (in order, both idle)
        assert resp.status == 200
        await resp.content.readline()
        assert kept.outstanding == 1
        # Changes the watch misses, then its history is gone: an ERROR 410, and resuming fails with 410 too.
        kube.remove_pod("qwen-b", quiet=True)
        kube.add_pod("qwen-c", LABELS, port=c.port, ready=True, quiet=True)
        kube.expire_watches()
        assert await wait_until(lambda: urls(gw) == [a.base, c.base], BOUND)
        body = await resp.read()
    assert body.endswith(b"data: [DONE]\n\n")
    assert gw.pool().replicas[0] is kept and kept.outstanding == 0  # the same replica: its load and index kept
    assert kube.count("list", "pods") == 2
    assert kube.watch_from[-1] == str(kube.rv)  # watching from the new list's resourceVersion


# -- the API server ----------------------------------------------------------------------


async def test_the_api_server_down_at_start_then_back(kube, replica, gateway, session, caplog):
    caplog.set_level(logging.INFO, "streamproxy.gateway")
    a = await replica()
    kube.reserve_port()  # nothing listens there yet
    gw = await gateway(deployments=k8s(kube))
    assert await wait_until(lambda: source(gw).fault is not None, BOUND)
    status, headers, body = await post(session, gw.url(CHAT), chat())
    assert status == 503 and headers["Retry-After"] == "60"
    error = json.loads(body)["error"]
    assert error["code"] == "upstream_unavailable" and "the API server cannot be reached" in error["message"]
    assert (await describe(session, gw))["problem"].startswith("the API server cannot be reached")
    kube.add_pod("qwen-a", LABELS, port=a.port, ready=True)
    await kube.start_server()
    assert await wait_until(lambda: urls(gw) == [a.base], BOUND)
    await ok(session, gw)
    assert (await describe(session, gw))["problem"] is None
    lines = [r.getMessage() for r in caplog.records if "kubernetes:" in r.getMessage()]
    assert lines[0].startswith(f"deployment {DEPLOYMENT}: kubernetes: the API server cannot be reached")
    assert lines[-1].startswith(f"deployment {DEPLOYMENT}: kubernetes: back to normal (it was: the API server cannot be reached")
    assert len(lines) == 2  # one line when it starts, one when it ends


async def test_the_api_server_gone_for_a_while_keeps_the_pods_and_resumes(kube, replica, gateway, session):
    a, b = await replica(), await replica()
    await kube.start_server()
    kube.add_pod("qwen-a", LABELS, port=a.port, ready=True)
    gw = await gateway(deployments=k8s(kube))
    assert await wait_until(lambda: urls(gw) == [a.base] and kube.open_watches() == 1, BOUND)
    await kube.stop_server()
    assert await wait_until(lambda: source(gw).fault is not None, BOUND)
    await ok(session, gw)  # the pods last seen still serve
    await kube.start_server()  # back, with nothing new: the fault ends once a watch is accepted
    assert await wait_until(lambda: source(gw).fault is None and kube.open_watches() == 1, BOUND)
    await kube.stop_server()
    kube.add_pod("qwen-b", LABELS, port=b.port, ready=True)  # while the gateway cannot see it
    await kube.start_server()
    assert await wait_until(lambda: urls(gw) == [a.base, b.base], BOUND)
    assert kube.count("list", "pods") == 1 and kube.watch_from[-1] == "101"  # resumed from where it was


async def test_403_on_list_is_a_clear_503_and_log_line(kube, gateway, session, caplog):
    await kube.start_server()
    kube.forbid.add(("list", "pods"))
    gw = await gateway(deployments=k8s(kube))
    assert await wait_until(lambda: source(gw).fault is not None, BOUND)
    status, headers, body = await post(session, gw.url(CHAT), chat())
    assert status == 503 and headers["Retry-After"] == "60"
    message = json.loads(body)["error"]["message"]
    assert message.startswith(f"deployment `{DEPLOYMENT}` has no replica: the gateway may not list pods in namespace llm (403 Forbidden: ")
    assert any("403 Forbidden" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)


async def test_a_selector_matching_nothing_or_an_unknown_namespace(kube, replica, gateway, session, caplog):
    a = await replica()
    await kube.start_server()
    kube.add_pod("qwen-a", LABELS, port=a.port, ready=True)  # in namespace llm
    gw = await gateway(deployments=k8s(kube, namespace="nowhere"))  # lists nothing there, as the real API server
    assert await wait_until(lambda: kube.open_watches() == 1, BOUND)
    status, headers, body = await post(session, gw.url(CHAT), chat())
    assert status == 503 and headers["Retry-After"] == "60"
    assert json.loads(body)["error"]["message"] == (
        f"deployment `{DEPLOYMENT}` has no replica: no Ready pod matches app=qwen3-8b in namespace nowhere"
    )
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        f"deployment {DEPLOYMENT}: kubernetes: no pod matches app=qwen3-8b in namespace nowhere (is the namespace or the selector wrong?)"
    ]
    async with session.get(gw.url(f"/v1/models/{DEPLOYMENT}")) as resp:
        assert resp.status == 200  # configured: never a 404


async def test_a_port_name_no_container_has(kube, replica, gateway, session, caplog):
    a = await replica()
    await kube.start_server()
    kube.add_pod("qwen-a", LABELS, port=a.port, port_name="metrics", ready=True)
    gw = await gateway(deployments=k8s(kube))
    assert await wait_until(lambda: source(gw).table.pods, BOUND)
    assert urls(gw) == []
    status, _, _ = await post(session, gw.url(CHAT), chat())
    assert status == 503
    assert (await describe(session, gw))["problem"] == "pod qwen-a has no container port named 'http'"
    assert any("pod qwen-a has no container port named 'http'; it takes no request" in r.getMessage() for r in caplog.records)


async def test_a_port_number(kube, replica, gateway, session):
    a = await replica()
    await kube.start_server()
    kube.add_pod("qwen-a", LABELS, port=1, port_name="other", ready=True)
    gw = await gateway(deployments=k8s(kube, port=a.port))
    assert await wait_until(lambda: urls(gw) == [a.base], BOUND)
    await ok(session, gw)


# -- wake and park through the scale subresource ----------------------------------------------


def scaled(fake: FakeKube, **extra: Any) -> list[dict]:
    return k8s(fake, scale={"kind": "Deployment", "name": "qwen3-8b", "replicas": 1}, boot_guess=7, **extra)


async def test_a_parked_deployment_wakes_through_the_scale_and_parks_again(kube, replica, gateway, session):
    await kube.start_server()
    w = kube.workload("qwen3-8b", LABELS, replicas=0)
    gw = await gateway(deployments=scaled(kube, idle_park_after=0.5))
    assert await wait_until(lambda: kube.open_watches() == 1, BOUND)
    assert (await describe(session, gw))["state"] == "parked"
    status, headers, body = await post(session, gw.url(CHAT), chat())
    assert status == 503 and headers["Retry-After"] == "7"
    assert json.loads(body) == error_body(
        f"deployment `{DEPLOYMENT}` is waking up; retry after 7 s", "service_unavailable", "deployment_waking"
    )
    assert await wait_until(lambda: source(gw).serving, BOUND)
    assert w.replicas == 1 and kube.calls[2:4] == [("get", "deployments/scale"), ("patch", "deployments/scale")]
    await ok(session, gw)
    view = await describe(session, gw)
    assert (view["state"], view["boots"], view["managed"]) == ("ready", 1, True)
    assert (sample("streamproxy_gateway_cold_requests_total", deployment=DEPLOYMENT) or 0) >= 1
    # Idle for 0.5 s: scaled to 0, its pod deleted; nothing was in flight.
    assert await wait_until(lambda: w.replicas == 0 and not w.pods, BOUND)
    assert await wait_until(lambda: source(gw).lifecycle.phase.value == "parked", BOUND)
    view = await describe(session, gw)
    assert (view["state"], view["parks"], view["replicas"]) == ("parked", 1, [])
    # Woken again: Retry-After is now the boot it timed.
    status, headers, _ = await post(session, gw.url(CHAT), chat())
    assert status == 503 and int(headers["Retry-After"]) == max(1, -(-view["last_boot_seconds"] // 1))
    assert await wait_until(lambda: source(gw).serving, BOUND)
    await ok(session, gw)


async def test_wait_for_wake_holds_requests_and_counts_them(kube, replica, gateway, session):
    await kube.start_server()
    w = kube.workload("qwen3-8b", LABELS, replicas=0)
    kube.hold_ready = True
    gw = await gateway(deployments=scaled(kube, wait_for_wake=True))
    assert await wait_until(lambda: kube.open_watches() == 1, BOUND)
    held = asyncio.ensure_future(post(session, gw.url(CHAT), chat()))
    assert await wait_until(lambda: sample("streamproxy_gateway_waiting_requests", deployment=DEPLOYMENT) == 1, BOUND)
    assert await wait_until(lambda: w.pods and kube._held, BOUND)
    kube.release()
    status, _, _ = await held
    assert status == 200
    assert sample("streamproxy_gateway_waiting_requests", deployment=DEPLOYMENT) == 0


async def test_no_pod_ready_within_boot_timeout_fails_the_deployment(kube, replica, gateway, session, caplog):
    await kube.start_server()
    w = kube.workload("qwen3-8b", LABELS, replicas=0)
    kube.hold_ready = True
    gw = await gateway(deployments=scaled(kube, boot_timeout=0.5))
    assert await wait_until(lambda: kube.open_watches() == 1, BOUND)
    status, _, _ = await post(session, gw.url(CHAT), chat())
    assert status == 503
    assert await wait_until(lambda: source(gw).lifecycle.phase.value == "failed" and w.replicas == 0, BOUND)
    status, headers, body = await post(session, gw.url(CHAT), chat())
    assert status == 503 and headers["x-should-retry"] == "false"
    assert json.loads(body) == error_body(
        f"deployment `{DEPLOYMENT}` failed to wake: no pod became Ready within boot_timeout (0.5 s); an operator must wake it",
        "service_unavailable", "deployment_failed",
    )
    async with session.get(gw.url("/health")) as resp:
        assert resp.status == 503 and (await resp.json())["unavailable"] == [DEPLOYMENT]


async def test_403_on_patch_fails_the_wake_with_a_clear_503(kube, replica, gateway, session, caplog):
    await kube.start_server()
    w = kube.workload("qwen3-8b", LABELS, replicas=0)
    kube.forbid.add(("patch", "deployments/scale"))
    gw = await gateway(deployments=scaled(kube))
    assert await wait_until(lambda: kube.open_watches() == 1, BOUND)
    status, _, body = await post(session, gw.url(CHAT), chat())
    assert status == 503 and json.loads(body)["error"]["code"] == "deployment_waking"
    assert await wait_until(lambda: source(gw).lifecycle.phase.value == "failed", BOUND)
    status, _, body = await post(session, gw.url(CHAT), chat())
    error = json.loads(body)["error"]
    assert status == 503 and error["code"] == "deployment_failed"
    assert error["message"].startswith(
        f"deployment `{DEPLOYMENT}` failed to wake: the gateway may not patch the scale of Deployment/qwen3-8b in namespace llm (403 Forbidden: "
    )
    assert w.replicas == 0 and ("patch", "deployments/scale") in kube.calls
    kube.cut_watches()  # discovery reconnecting (and fine) does not hide why the wake failed
    assert await wait_until(lambda: len(kube.watch_from) == 2 and kube.open_watches() == 1, BOUND)
    status, _, body = await post(session, gw.url(CHAT), chat())
    assert json.loads(body)["error"]["message"] == error["message"]
    assert (await describe(session, gw))["problem"] == error["message"][len(f"deployment `{DEPLOYMENT}` failed to wake: "):-len("; an operator must wake it")]
    assert any(r.levelno == logging.ERROR and "403 Forbidden" in r.getMessage() for r in caplog.records)


async def test_an_unknown_workload_or_namespace_is_a_clear_503(kube, replica, gateway, session):
    await kube.start_server()
    gw = await gateway(deployments=scaled(kube))  # no such Deployment (and nothing in namespace llm)
    assert await wait_until(lambda: kube.open_watches() == 1, BOUND)
    await post(session, gw.url(CHAT), chat())
    assert await wait_until(lambda: source(gw).lifecycle.phase.value == "failed", BOUND)
    status, _, body = await post(session, gw.url(CHAT), chat())
    assert status == 503 and json.loads(body)["error"]["message"] == (
        f"deployment `{DEPLOYMENT}` failed to wake: cannot get the scale of Deployment/qwen3-8b in namespace llm: "
        '404 Not Found (deployments.apps "qwen3-8b" not found); an operator must wake it'
    )


async def test_admin_park_and_wake(kube, replica, gateway, session, monkeypatch):
    monkeypatch.setenv("K8S_ADMIN", "admin-secret")
    await kube.start_server()
    w = kube.workload("qwen3-8b", LABELS, replicas=1)  # up already: the gateway adopts it
    gw = await gateway(deployments=scaled(kube), admin_key="admin-secret")
    assert await wait_until(lambda: source(gw).serving, BOUND)
    headers = {"Authorization": "Bearer admin-secret"}
    async with session.post(gw.url(f"/v1/deployments/{DEPLOYMENT}/park"), headers=headers) as resp:
        assert resp.status == 200 and (await resp.json())["state"] == "parked"
    assert w.replicas == 0
    async with session.post(gw.url(f"/v1/deployments/{DEPLOYMENT}/wake"), headers=headers) as resp:
        assert resp.status == 200 and (await resp.json())["state"] == "waking"
    assert await wait_until(lambda: source(gw).serving and w.replicas == 1, BOUND)


# -- two gateways over the same pods -------------------------------------------------------


def prefixes(n: int) -> list[dict]:
    """`n` conversations, each with its own long system prompt (more than one prefix block)."""
    return [chat(messages=[{"role": "system", "content": f"You are assistant number {i}. " + "Be brief and exact. " * 30},
                           {"role": "user", "content": "hi"}]) for i in range(n)]


async def served_by(session, gw, body: dict, pods: dict[str, Any]) -> str:
    async with session.post(gw.url(CHAT), json=body) as resp:
        assert resp.status == 200
        await resp.read()
        request_id = resp.headers["X-Request-ID"]
    [pod] = [name for name, r in pods.items() if any(s.request_id == request_id for s in r.seen)]
    return pod


async def test_two_gateways_send_a_prefix_to_the_same_pod_and_so_does_a_restarted_one(kube, replica, gateway, session):
    pods = {f"qwen-{i}": await replica() for i in range(3)}
    await kube.start_server()
    for name, r in pods.items():
        kube.add_pod(name, LABELS, port=r.port, ready=True)
    first, second = await gateway(deployments=k8s(kube)), await gateway(deployments=k8s(kube))
    assert await wait_until(lambda: len(urls(first)) == 3 and len(urls(second)) == 3, BOUND)
    bodies = prefixes(24)
    homes: dict[int, list[str]] = {i: [] for i in range(len(bodies))}
    for round_ in range(4):  # each prefix through both gateways, twice each, in turn
        for i, body in enumerate(bodies):
            homes[i].append(await served_by(session, first if (round_ + i) % 2 == 0 else second, body, pods))
    same = sum(h.count(max(set(h), key=h.count)) for h in homes.values())
    assert same / (4 * len(bodies)) >= 0.95, homes
    assert len({max(set(h), key=h.count) for h in homes.values()}) == 3  # and the prefixes spread over every pod
    # The first gateway restarts (nothing of its index kept): the prefixes keep their pods.
    await first.runner.cleanup()
    restarted = await gateway(deployments=k8s(kube))
    assert await wait_until(lambda: len(urls(restarted)) == 3, BOUND)
    after = [await served_by(session, restarted, body, pods) for body in bodies]
    kept = sum(after[i] == max(set(h), key=h.count) for i, h in homes.items())
    assert kept / len(bodies) >= 0.95


async def test_a_gateway_does_not_park_pods_another_gateway_keeps_busy(kube, replica, gateway, session):
    await kube.start_server()
    w = kube.workload("qwen3-8b", LABELS, replicas=1)
    quiet = await gateway(deployments=scaled(kube, idle_park_after=0.6))
    busy = await gateway(deployments=scaled(kube, idle_park_after=0.6))
    assert await wait_until(lambda: source(quiet).serving and source(busy).serving, BOUND)
    for _ in range(30):  # 1.5 s of traffic through one gateway only (12 requests an idle period): the other's idle timer runs out twice
        await ok(session, busy)
        await asyncio.sleep(0.05)
    assert kube.count("patch", "deployments/scale") == 0 and w.replicas == 1
    assert await wait_until(lambda: w.replicas == 0, BOUND)  # once nobody sends anything, parked


async def test_a_kubeconfig_that_does_not_load_is_a_clear_503(kube, gateway, session, tmp_path, caplog):
    section = {**k8s(kube)[0]["kubernetes"], "kubeconfig": str(tmp_path / "missing")}
    gw = await gateway(deployments=[{**k8s(kube)[0], "kubernetes": section}])
    assert await wait_until(lambda: source(gw).fault is not None, BOUND)
    status, _, body = await post(session, gw.url(CHAT), chat())
    assert status == 503 and json.loads(body)["error"]["message"] == (
        f"deployment `{DEPLOYMENT}` has no replica: the kubeconfig {tmp_path / 'missing'} does not exist"
    )
    assert [r.levelno for r in caplog.records if "does not exist" in r.getMessage()] == [logging.WARNING]


async def test_a_reload_that_removes_the_deployment_closes_its_watch_once_its_stream_ends(kube, replica, gateway, session, tmp_path, caplog):
    import yaml

    from streamproxy.cli import load_gateway
    from streamproxy.gateway.reload import reload

    slow, plain = await replica(FakeScript(tokens=[f"t{i} " for i in range(12)], token_delay=0.05)), await replica()
    await kube.start_server()
    kube.add_pod("qwen-a", LABELS, port=slow.port, ready=True)
    gw = await gateway(deployments=k8s(kube))
    assert await wait_until(lambda: urls(gw) == [slow.base], BOUND)
    old = source(gw)
    caplog.set_level(logging.INFO, "streamproxy.gateway")
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump({"deployments": [{"name": "plain", "id": "dep-plain", "served_model": SERVED, "upstreams": [plain.base]}]}))
    async with session.post(gw.url(CHAT), json=chat(stream=True)) as resp:
        assert resp.status == 200
        first = await resp.content.readline()
        assert reload(gw.app, lambda: load_gateway(str(path), [], strict=True), str(path))
        status, _, body = await post(session, gw.url(CHAT), chat())
        assert status == 404 and json.loads(body)["error"]["code"] == "model_not_found"
        assert old._tasks and kube.open_watches() == 1  # its stream still runs on the deployment's pod: still watched
        rest = await resp.read()
    assert (first + rest).endswith(b"data: [DONE]\n\n")
    # Its watch (the client's side: the fake API server learns of it only when it next writes) ends.
    assert await wait_until(lambda: not old._tasks, BOUND)
    assert f"deployment {DEPLOYMENT} ({DEPLOYMENT_ID}): stopped, as the reload removed or changed it" in caplog.messages
    status, _, body = await post(session, gw.url(CHAT), chat(model="plain"))
    assert status == 200, body
