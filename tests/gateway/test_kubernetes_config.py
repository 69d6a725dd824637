"""The `kubernetes:` section's checks (each mistake names its field), the sans-IO pod table
(which pods are replicas, at which URL, a re-list reconciled) and the API backoff's bounds."""

from __future__ import annotations

import random

import pytest

from streamproxy.gateway.config import ConfigError
from streamproxy.gateway.config_file import split
from streamproxy.gateway.kube_pods import Backoff, PodTable, parse
from streamproxy.gateway.lifecycle import Lifecycle, Phase

GOOD = "{namespace: llm, selector: {app: qwen3-8b}, port: http}"


def one(section: str) -> str:
    return f"deployments:\n  - {{name: bot, id: dep-bot, kubernetes: {section}}}\n"


def test_a_kubernetes_section_parses():
    config, _ = split(one("{namespace: llm, selector: {app: qwen3-8b, tier: gpu}, port: 8000, "
                          "scale: {kind: StatefulSet, name: qwen3-8b, replicas: 2}, idle_park_after: 30m, boot_timeout: 5m}"))
    k = config.deployments[0].kubernetes
    assert k is not None and k.port == 8000 and k.idle_seconds == 1800 and k.boot_seconds == 300
    assert k.label_selector() == "app=qwen3-8b,tier=gpu"
    assert k.scale is not None and (k.scale.kind, k.scale.name, k.scale.replicas) == ("StatefulSet", "qwen3-8b", 2)
    config, _ = split(one(GOOD))
    assert config.deployments[0].kubernetes.port == "http"  # type: ignore[union-attr]


@pytest.mark.parametrize(("section", "message"), [
    ("{namespace: LLM, selector: {app: x}}", "deployment 'bot': `kubernetes.namespace` 'LLM' is not a namespace name"),
    ("{selector: {}}", "deployment 'bot': `kubernetes.selector` is empty"),
    ("{selector: {'a b': x}}", "deployment 'bot': `kubernetes.selector` key 'a b' is not a label name"),
    ("{selector: {app: 'x y'}}", "deployment 'bot': `kubernetes.selector` value 'x y' (of 'app') is not a label value"),
    ("{selector: {app: x}, port: 0}", "deployment 'bot': `kubernetes.port` 0 is not a port number (1-65535)"),
    ("{selector: {app: x}, port: HTTP_1}", "deployment 'bot': `kubernetes.port` 'HTTP_1' is neither a port number nor a container port name"),
    ("{selector: {app: x}, idle_park_after: 10m}", "deployment 'bot': `kubernetes.idle_park_after` needs `kubernetes.scale`"),
    ("{selector: {app: x}, scale: {name: q, replicas: 0}}", "deployment 'bot': `kubernetes.scale.replicas` must be at least 1"),
    ("{selector: {app: x}, scale: {name: Q_1}}", "deployment 'bot': `kubernetes.scale.name` 'Q_1' is not a Deployment's name"),
    ("{selector: {app: x}, boot_guess: 0}", "deployment 'bot': `kubernetes.boot_guess` must be > 0"),
    ("{selector: {app: x}, scale: {name: q}, boot_timeout: 0}", "deployment 'bot': `kubernetes.boot_timeout` must be > 0 with `scale`"),
])
def test_each_mistake_names_its_field(section, message):
    with pytest.raises(ConfigError) as caught:
        split(one(section))
    assert str(caught.value).startswith(message)


def test_unknown_fields_and_a_second_source_are_refused():
    with pytest.raises(ConfigError, match=r"unknown field `sclae` - at `\$.deployments\[0\].kubernetes`"):
        split(one("{selector: {app: x}, sclae: {name: q}}"))
    with pytest.raises(ConfigError, match="exactly one of `upstreams`, `launch` and `kubernetes`"):
        split("deployments:\n  - {name: a, id: b, upstreams: ['http://x'], kubernetes: " + GOOD + "}\n")


def pod(name: str, *, ready: bool = True, ip: str | None = "127.0.0.7", deleting: bool = False, port_name: str = "http",
        uid: str | None = None) -> dict:
    meta: dict = {"name": name, "uid": uid or f"uid-{name}"}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    status: dict = {"conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True" if ready else "False"}]}
    if ip:
        status["podIP"] = ip
    return {"metadata": meta, "spec": {"containers": [{"ports": [{"name": port_name, "containerPort": 8000}]}]}, "status": status}


def test_which_pods_are_replicas():
    assert parse(pod("a"), "http").url == "http://127.0.0.7:8000" and parse(pod("a"), "http").replica
    assert parse(pod("a", ip="fd00::7"), "http").url == "http://[fd00::7]:8000"
    assert parse(pod("a"), 9000).url == "http://127.0.0.7:9000"  # a number is taken as it is
    assert not parse(pod("a", ready=False), "http").replica
    assert not parse(pod("a", deleting=True), "http").replica
    assert not parse(pod("a", ip=None), "http").replica  # not scheduled yet
    missing = parse(pod("a", port_name="metrics"), "http")
    assert (missing.replica, missing.problem) == (False, "pod a has no container port named 'http'")
    assert not parse({"metadata": {"name": "bare"}}, "http").replica  # no status at all


def test_events_and_a_relist_reconcile_by_uid():
    table = PodTable("http")
    table.reset([pod("b", ip="127.0.0.2"), pod("a", ip="127.0.0.1")])
    assert table.replicas() == [("uid-a", "http://127.0.0.1:8000"), ("uid-b", "http://127.0.0.2:8000")]
    table.apply("MODIFIED", pod("b", ip="127.0.0.2", deleting=True))
    table.apply("ADDED", pod("c", ip="127.0.0.3"))
    assert [u for u, _ in table.replicas()] == ["uid-a", "uid-c"]
    assert [u for u, _ in table.replicas(exclude={"uid-a"})] == ["uid-c"]
    table.apply("DELETED", pod("b", ip="127.0.0.2"))
    table.reset([pod("a", ip="127.0.0.1"), pod("d", ip="127.0.0.4")])  # c went while the watch was gone
    assert sorted(table.pods) == ["uid-a", "uid-d"]
    # Two pods on one URL (a recycled IP, the old pod not yet deleted): the URL is one replica.
    table.reset([pod("a", ip="127.0.0.1"), pod("e", ip="127.0.0.1", uid="uid-e")])
    assert table.replicas() == [("uid-a", "http://127.0.0.1:8000")]


def test_backoff_doubles_is_bounded_jittered_and_resets():
    backoff = Backoff(0.5, 4.0, random.Random(7))
    delays = [backoff.next() for _ in range(8)]
    caps = [0.5, 1, 2, 4, 4, 4, 4, 4]
    assert all(cap / 2 <= d <= cap for d, cap in zip(delays, caps, strict=True))
    assert len(set(delays)) == 8  # jittered
    backoff.reset()
    assert 0.25 <= backoff.next() <= 0.5


def test_the_life_cycle_of_a_source_someone_else_scales():
    config, _ = split(one("{selector: {app: x}, scale: {name: q}, boot_guess: 7}"))
    k = config.deployments[0].kubernetes
    lc = Lifecycle(k, now=0.0)  # type: ignore[arg-type]
    lc.adopted(1.0)  # an autoscaler scaled it up: ready, no wake counted
    assert (lc.phase, lc.boots, lc.retry_after()) == (Phase.READY, 0, 7)
    lc.lost_all()  # and down to 0: parked, a request wakes it
    assert lc.phase is Phase.PARKED
    assert lc.want(2.0)
    lc.failed_to_wake()
    assert lc.phase is Phase.FAILED and not lc.want(3.0) and lc.want(3.0, admin=True)


def test_pod_activity_from_streamproxy_and_vllm_metrics():
    from streamproxy.gateway.kube_pods import PodActivity, activity

    ours = ("# TYPE streamproxy_requests_running gauge\nstreamproxy_requests_running 2.0\n"
            "# TYPE streamproxy_request_duration_seconds histogram\nstreamproxy_request_duration_seconds_bucket{le=\"+Inf\"} 7.0\n"
            "streamproxy_request_duration_seconds_count 7.0\nstreamproxy_request_duration_seconds_sum 1.5\n")
    vllm = ('# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name="q"} 0.0\n'
            '# TYPE vllm:request_success counter\nvllm:request_success_total{finished_reason="stop",model_name="q"} 3.0\n'
            'vllm:request_success_total{finished_reason="length",model_name="q"} 4.0\n')
    assert activity(ours) == (2.0, 7.0) and activity(vllm) == (0.0, 7.0)
    assert activity("# nothing we know\nother_metric 1\n") is None and activity("not { prometheus") is None
    seen = PodActivity()
    assert not seen.saw("u", 0.0, 7.0)  # the first look: nothing to compare with, nothing in progress
    assert not seen.saw("u", 0.0, 7.0) and seen.saw("u", 0.0, 8.0) and seen.saw("u", 1.0, 8.0)
    seen.keep(set())
    assert seen.finished == {}
