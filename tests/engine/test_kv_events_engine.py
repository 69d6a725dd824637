"""A real engine's KV-cache events into the gateway's index (issue 35), on 127.0.0.1.

`streamproxy serve` on the default model with `--kv-events-config`: vLLM's publisher connects
its PUB to the subscriber's bound SUB (an endpoint without `*` makes vLLM connect) and binds
its replay ROUTER on loopback. The index, fed by the events, predicts the prefix-cache hit the
replica then reports (`usage.prompt_tokens_details.cached_tokens`) for a prompt of token ids;
the replica killed (its whole process tree, as a crash) leaves the index empty once the stream
is found lost, and a new replica on the same endpoints is indexed afresh (new hashes, sequence
from 0) and predicted exactly again.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
import requests

from harness.kv_publisher import loopback_endpoints
from harness.process import ServerProcess
from harness.server import ENGINE_IN_CORE, launch, start_server
from harness.waiting import wait_until
from streamproxy.gateway.kv_feed import Feed, FeedPolicy
from streamproxy.gateway.kv_index import KVIndex, PromptKeys
from streamproxy.gateway.kv_subscriber import KVSubscriber
from tests.conftest import ENGINE_ARGS, START_TIMEOUT
from tests.support import prestart

pytestmark = pytest.mark.engine

R = "replica"
SYSTEM = list(range(1000, 1000 + 150))  # a shared prefix of token ids, several blocks long


def replica_args(pub: str, replay: str) -> list[str]:
    config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": pub, "replay_endpoint": replay}
    return [*ENGINE_ARGS, "--kv-events-config", json.dumps(config)]


def start_replica(pub: str, replay: str, log_dir: Path) -> ServerProcess:
    log_dir.mkdir(parents=True, exist_ok=True)
    return start_server(replica_args(pub, replay), log_dir, name="kv-replica", timeout=START_TIMEOUT, interval=0.5,
                        attempts=1, env=ENGINE_IN_CORE)


@dataclass
class First:
    """The first replica's endpoints. The subscriber's port is held (bound, not listening: no other socket binds
    it or gets it as an ephemeral port) from the launch until the test lets it go and its subscriber binds it."""

    pub: str
    replay: str
    hold: socket.socket


FIRST: list[First] = []


def _first_replica(logs: Path) -> list[ServerProcess]:
    while FIRST:
        FIRST.pop().hold.close()
    hold = socket.socket()
    hold.bind(("127.0.0.1", 0))
    FIRST.append(First(f"tcp://127.0.0.1:{hold.getsockname()[1]}", loopback_endpoints()[1], hold))
    return [launch(replica_args(FIRST[0].pub, FIRST[0].replay), logs, "kv-replica", ENGINE_IN_CORE)]


# Launched ahead, while earlier tests run (tests/support/prestart.py): vLLM's publisher connects its PUB
# to an endpoint that nothing listens on yet (ZeroMQ connects again until the subscriber binds it); its
# engine makes no event before this test's first request.
prestart.define("first_replica", _first_replica)


@pytest.fixture
def first_replica() -> Iterator[tuple[ServerProcess, First]]:
    with prestart.ready("first_replica", START_TIMEOUT) as (server,):
        yield server, FIRST[0]


def complete(server: ServerProcess, prompt: list[int]) -> dict[str, Any]:
    model = requests.get(server.url("/v1/models"), timeout=10).json()["data"][0]["id"]
    answer = requests.post(server.url("/v1/completions"), timeout=120, json={
        "model": model, "prompt": prompt, "max_tokens": 4, "temperature": 0})
    assert answer.status_code == 200, answer.text
    return dict(answer.json()["usage"])


def crash(server: ServerProcess) -> None:
    """SIGKILL the replica's whole process tree (its engine core too), as a killed pod."""
    tree = [psutil.Process(server.proc.pid), *psutil.Process(server.proc.pid).children(recursive=True)]
    for proc in tree:
        proc.kill()
    psutil.wait_procs(tree, timeout=30)


async def predicted_then_reported(server: ServerProcess, sub: KVSubscriber, prompt: list[int]) -> tuple[int, int]:
    index = sub.feed.index
    predicted = index.cached_tokens(PromptKeys(prompt), [R], 0.0)[R]
    usage = await asyncio.to_thread(complete, server, prompt)
    reported = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    return predicted, reported


async def test_the_index_predicts_a_real_replicas_prefix_hits_across_a_crash_and_restart(
        first_replica: tuple[ServerProcess, First], tmp_path: Path) -> None:
    server, endpoints = first_replica
    pub, replay = endpoints.pub, endpoints.replay
    index = KVIndex(speculative_ttl=0.0)
    feed = Feed(R, index, replay=True, policy=FeedPolicy(idle_probe=1.0, replay_timeout=1.0))
    sub = KVSubscriber(feed, pub, replay_endpoint=replay, bind=True, heartbeat=0.5)
    endpoints.hold.close()  # the subscriber's port, bound next
    sub.start()
    try:
        assert await wait_until(lambda: sub.connected, 30.0)  # the running replica's publisher connected to it
        first = SYSTEM + list(range(5000, 5040))
        await asyncio.to_thread(complete, server, first)
        assert await wait_until(lambda: index.blocks(R) > 0, 30.0), (feed.batches, feed.last_error)
        size = index.block_size(R)
        assert size > 0 and index.cached_tokens(PromptKeys(first), [R], 0.0)[R] == len(first) // size * size

        for tail in (range(6000, 6030), range(7000, 7050)):  # the same system prompt, other questions
            predicted, reported = await predicted_then_reported(server, sub, SYSTEM + list(tail))
            assert predicted == reported == len(SYSTEM) // size * size
            assert await wait_until(lambda: not feed.replaying and feed.batches > 0, 10.0)

        await asyncio.to_thread(crash, server)
        assert await wait_until(lambda: feed.lost >= 1 and index.blocks(R) == 0, 30.0), (feed.lost, index.blocks(R))

        server = await asyncio.to_thread(start_replica, pub, replay, tmp_path / "second")
        predicted, reported = await predicted_then_reported(server, sub, first)
        assert predicted == reported == 0  # a new engine: nothing cached, and the index knows it
        await asyncio.to_thread(complete, server, SYSTEM + [9, 9, 9])
        assert await wait_until(lambda: index.cached_tokens(PromptKeys(SYSTEM), [R], 0.0)[R] > 0, 30.0)
        predicted, reported = await predicted_then_reported(server, sub, SYSTEM + list(range(8000, 8020)))
        assert predicted == reported == len(SYSTEM) // size * size
        assert feed.decode_errors == 0 and sub.malformed == 0 and index.orphaned == 0
    finally:
        await sub.stop()
        await asyncio.to_thread(server.stop, 60)
