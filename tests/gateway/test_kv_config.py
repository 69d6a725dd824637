"""Where replicas publish KV-cache events (config.KVEvents, replicas.kv_events_for): `launch:` vLLM
replicas get vLLM's `--kv-events-config` by default, on loopback ports the gateway binds and
subscribes to; patterns and per-replica endpoints for `upstreams:`; the config's refusals."""

from __future__ import annotations

import json
import sys

import msgspec
import pytest

from streamproxy.gateway.balance import Pool
from streamproxy.gateway.config import ConfigError, Deployment, GatewayConfig, KVEventsEndpoint, UpstreamPolicy
from streamproxy.gateway.config_file import check
from streamproxy.gateway.replicas import kv_events_for, replica_command


def deployment(**fields: object) -> Deployment:
    return msgspec.convert({"name": "d", "id": "dep-d", **fields}, Deployment)


def test_a_launch_replica_of_a_vllm_model_gets_the_kv_events_flag_on_loopback_ports():
    d = deployment(launch={"model": "/models/qwen", "args": ["--max-model-len", "4096"]})
    assert d.launch is not None
    kv = kv_events_for(d, d.launch)
    assert kv is not None and kv.bind and kv.topic == ""
    assert kv.endpoint.startswith("tcp://127.0.0.1:") and kv.replay_endpoint is not None and kv.replay_endpoint.startswith("tcp://127.0.0.1:")
    assert kv.endpoint != kv.replay_endpoint
    assert replica_command(d, d.launch, 8123, kv) == [
        sys.executable, "-m", "streamproxy", "serve", "--host", "127.0.0.1", "--port", "8123", "--model", "/models/qwen",
        "--served-model-name", "d", "--access-log", "off", "--kv-events-config",
        '{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"' + kv.endpoint + '","replay_endpoint":"'
        + kv.replay_endpoint + '","buffer_steps":10000,"topic":""}',
        "--max-model-len", "4096",
    ]
    # vLLM connects its PUB to an endpoint without `*`: the gateway's SUB binds it.
    assert json.loads(replica_command(d, d.launch, 8123, kv)[15])["endpoint"] == kv.endpoint


def test_no_flag_for_the_fake_engine_or_when_turned_off_and_a_given_flag_is_read_not_replaced():
    fake = deployment(launch={"model": "fake"})
    assert fake.launch is not None and kv_events_for(fake, fake.launch) is None
    off = deployment(launch={"model": "/m"}, kv_events={"enable_kv_cache_events": False})
    assert off.launch is not None and kv_events_for(off, off.launch) is None
    assert "--kv-events-config" not in replica_command(off, off.launch, 1, None)
    own = '{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:6000", "replay_endpoint": "tcp://*:6001"}'
    given = deployment(launch={"model": "/m", "args": ["--kv-events-config", own]})
    assert given.launch is not None
    kv = kv_events_for(given, given.launch)
    assert kv == KVEventsEndpoint(endpoint="tcp://127.0.0.1:6000", replay_endpoint="tcp://127.0.0.1:6001", bind=False)
    assert replica_command(given, given.launch, 1, kv).count("--kv-events-config") == 1


def test_upstreams_take_their_endpoints_from_a_pattern_or_by_url():
    d = deployment(upstreams=["http://10.0.0.7:8000", "http://10.0.0.8:8000/", "http://[::1]:9000"],
                   kv_events={"endpoint": "tcp://*:5557", "replay_endpoint": "tcp://{host}:{port}5", "topic": "kv",
                              "replicas": {"http://10.0.0.8:8000": {"endpoint": "ipc:///run/kv8"}}})
    check(GatewayConfig(deployments=[d]))
    pool = Pool(d, UpstreamPolicy())
    assert pool.kv_endpoints == {
        "http://10.0.0.7:8000": KVEventsEndpoint(endpoint="tcp://10.0.0.7:5557", replay_endpoint="tcp://10.0.0.7:80005", topic="kv"),
        "http://10.0.0.8:8000": KVEventsEndpoint(endpoint="ipc:///run/kv8"),
        "http://[::1]:9000": KVEventsEndpoint(endpoint="tcp://[::1]:5557", replay_endpoint="tcp://[::1]:90005", topic="kv"),
    }
    assert Pool(deployment(upstreams=["http://a:1"]), UpstreamPolicy()).kv_endpoints == {}


@pytest.mark.parametrize(("fields", "message"), [
    ({"kv_events": {"endpoint": "http://x:1"}}, "`kv_events` endpoint 'http://x:1' is not a ZMQ endpoint (tcp://host:port or ipc://path)"),
    ({"kv_events": {"replay_endpoint": "tcp://x:1"}}, "`kv_events.replay_endpoint` needs `kv_events.endpoint`"),
    ({"kv_events": {"replicas": {"http://b:1": {"endpoint": "tcp://b:2"}}}}, "`kv_events.replicas` names http://b:1, not among its `upstreams`"),
    ({"flow_control": {"max_concurrency": -1}}, "`flow_control`: max_concurrency >= 0, queue_depth_threshold >= 1, max_queued >= 0, max_wait > 0"),
])
def test_the_config_refuses_what_cannot_work(fields, message):
    with pytest.raises(ConfigError) as caught:
        check(GatewayConfig(deployments=[deployment(upstreams=["http://a:1"], **fields)]))
    assert str(caught.value) == "deployment 'd': " + message
