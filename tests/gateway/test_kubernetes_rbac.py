"""deploy/kubernetes/: the RBAC Role grants exactly the (verb, resource) pairs the gateway calls
(the fake API server refuses anything else with 403 and records every call), and the manifests fit
together: the gateway's ConfigMap is a valid config whose selector, port name and scale target are
the replica Deployment's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.fake_kube import FakeKube
from streamproxy.gateway.config_file import split
from tests.gateway.gateway_support import DEPLOYMENT, DEPLOYMENT_ID, SERVED, chat, post
from tests.gateway.test_kubernetes import BOUND, CHAT, LABELS, source, urls
from tests.support import wait_until

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"


def documents(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]


def granted() -> set[tuple[str, str]]:
    [role] = [d for d in documents("rbac.yaml") if d["kind"] == "Role"]
    return {(verb, resource) for rule in role["rules"] for resource in rule["resources"] for verb in rule["verbs"]}


def test_the_role_is_namespaced_and_bound_to_the_gateways_service_account():
    docs = {d["kind"]: d for d in documents("rbac.yaml")}
    assert set(docs) == {"ServiceAccount", "Role", "RoleBinding"}  # no ClusterRole: one namespace only
    assert docs["RoleBinding"]["subjects"] == [{"kind": "ServiceAccount", "name": "streamproxy-gateway", "namespace": "llm"}]
    assert docs["RoleBinding"]["roleRef"]["name"] == docs["Role"]["metadata"]["name"]
    [gateway] = [d for d in documents("gateway.yaml") if d["kind"] == "Deployment"]
    assert gateway["spec"]["template"]["spec"]["serviceAccountName"] == "streamproxy-gateway"


def test_the_gateway_config_matches_the_replicas():
    [config_map] = [d for d in documents("gateway.yaml") if d["kind"] == "ConfigMap"]
    config, _ = split(config_map["data"]["gateway.yaml"])
    k = config.deployments[0].kubernetes
    assert k is not None and k.scale is not None
    [replicas] = [d for d in documents("replica.yaml") if d["kind"] == "Deployment"]
    template = replicas["spec"]["template"]
    assert (k.namespace, k.scale.kind, k.scale.name) == (replicas["metadata"]["namespace"], "Deployment", replicas["metadata"]["name"])
    assert k.selector.items() <= template["metadata"]["labels"].items()
    [container] = template["spec"]["containers"]
    assert k.port in [p["name"] for p in container["ports"]]
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    drain = float(container["args"][container["args"].index("--drain-timeout") + 1])
    assert template["spec"]["terminationGracePeriodSeconds"] >= drain + container["lifecycle"]["preStop"]["sleep"]["seconds"]


@pytest.fixture
async def rbac_kube(replica):
    async def start_replica():
        r = await replica()
        return r.port, r.stop

    fake = FakeKube(start_replica=start_replica, grants=granted())
    yield fake
    await fake.close()


async def test_the_role_grants_exactly_what_the_gateway_calls(rbac_kube, replica, gateway, session, tmp_path):
    kube = rbac_kube
    await kube.start_server()
    w = kube.workload("qwen3-8b", LABELS, replicas=0)
    section = {
        "namespace": "llm", "selector": LABELS, "port": "http", "kubeconfig": kube.kubeconfig(tmp_path / "kubeconfig"),
        "scale": {"kind": "Deployment", "name": "qwen3-8b", "replicas": 1}, "idle_park_after": 0.3,
        "backoff_initial": 0.02, "backoff_max": 0.1,
    }
    gw = await gateway(deployments=[{"name": DEPLOYMENT, "id": DEPLOYMENT_ID, "served_model": SERVED, "kubernetes": section}])
    # Every path the code has to the API: list, watch, a cut watch resumed, a 410 re-list, wake, serve, park.
    assert await wait_until(lambda: kube.open_watches() == 1, BOUND)
    status, _, _ = await post(session, gw.url(CHAT), chat())
    assert status == 503
    assert await wait_until(lambda: bool(urls(gw)), BOUND)
    status, _, _ = await post(session, gw.url(CHAT), chat())
    assert status == 200
    kube.cut_watches()
    assert await wait_until(lambda: len(kube.watch_from) == 2 and kube.open_watches() == 1, BOUND)
    kube.expire_watches()
    assert await wait_until(lambda: kube.count("list", "pods") == 2, BOUND)
    assert await wait_until(lambda: w.replicas == 0 and source(gw).lifecycle.phase.value == "parked", BOUND)
    assert source(gw).fault is None
    assert set(kube.calls) == granted() == {("list", "pods"), ("watch", "pods"), ("get", "deployments/scale"), ("patch", "deployments/scale")}
