"""KV-event routing in the request path (scheduler.py): fake-engine replicas beside fake publishers
speaking vLLM's wire format (tests/support/kv_publisher.py), on 127.0.0.1.

A request goes to the replica whose published cache holds its prompt's prefix (its token ids from
a replica's own /tokenize), not to the one today's choice would give; a replica that publishes
nothing is still scored by today's approximate index; a replica the pool no longer has leaves no
block in the index; /v1/deployments and /metrics show each replica's stream.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from harness.kv_publisher import Publisher, ZmqPublisher, loopback_endpoints
from harness.waiting import wait_until
from streamproxy.gateway.balance import rendezvous_score
from streamproxy.gateway.kv_index import PromptKeys
from streamproxy.gateway.prefix import prefix_keys
from streamproxy.gateway.scheduler import SPECULATIVE_HOLD
from tests.gateway.conftest import Gateway, Replica, StartGateway, StartReplica
from tests.gateway.gateway_support import DEPLOYMENT, DEPLOYMENT_ID, SERVED, fits, post, sample

CHAT = "/v1/chat/completions"


def messages(system: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": "hi"}]


async def tokens_of(session: aiohttp.ClientSession, r: Replica, msgs: list[dict[str, str]]) -> list[int]:
    async with session.post(r.url("/tokenize"), json={"model": SERVED, "messages": msgs}) as resp:
        assert resp.status == 200
        return list((await resp.json())["tokens"])


@contextlib.asynccontextmanager
async def publishing(gateway: StartGateway, replicas: list[Replica], publishers: list[int],
                     **deployment: Any) -> AsyncIterator[tuple[Gateway, dict[str, ZmqPublisher]]]:
    """A gateway over `replicas`, those at the indices `publishers` with a fake publisher each (block size 4)."""
    ends = {replicas[i].base: loopback_endpoints() for i in publishers}
    async with contextlib.AsyncExitStack() as stack:
        pubs = {url: await stack.enter_async_context(ZmqPublisher.running(Publisher(block_size=4), pub, replay))
                for url, (pub, replay) in ends.items()}
        gw = await gateway(deployments=[{
            "name": DEPLOYMENT, "id": DEPLOYMENT_ID, "served_model": SERVED, "upstreams": [r.base for r in replicas],
            "kv_events": {"replicas": {url: {"endpoint": pub, "replay_endpoint": replay} for url, (pub, replay) in ends.items()}},
            **deployment,
        }])
        subs = gw.state.schedulers[DEPLOYMENT].subscribers
        for url in ends:
            # Connected, and its first replay (from 0) answered: what it publishes now is heard.
            assert await wait_until(functools.partial(lambda u: subs[u].connected and subs[u].feed.replays and not subs[u].feed.replaying, url), 10.0)
        yield gw, pubs


async def stored(gw: Gateway, pub: ZmqPublisher, url: str, tokens: list[int]) -> None:
    """`url`'s replica caches `tokens` and says so; the index has heard it."""
    index = gw.state.schedulers[DEPLOYMENT].index
    before = index.blocks(url)
    events = pub.publisher.cache.prompt(tokens)
    await pub.send(events)
    new = sum(len(e["block_hashes"]) for e in events if e["type"] == "BlockStored")
    assert await wait_until(lambda: index.blocks(url) == before + new, 10.0), (index.blocks(url), before, new)


def counted(name: str, **labels: str) -> float:
    return sample(name, deployment=DEPLOYMENT, **labels) or 0.0


def served(r: Replica) -> int:
    return sum(1 for s in r.seen if s.path == CHAT)


async def test_a_request_goes_to_the_replica_whose_events_say_it_holds_the_prefix(
        replica: StartReplica, gateway: StartGateway, session: aiohttp.ClientSession) -> None:
    a, b = await replica(), await replica()
    async with publishing(gateway, [a, b], [0, 1]) as (gw, pubs):
        gw.in_order()  # today's choice: `a` (the first listed of two equally loaded)
        msgs = messages("You are a helpful assistant. " * 3)
        tokens = await tokens_of(session, a, msgs)
        await stored(gw, pubs[a.base], a.base, [1, 2, 3, 4, 5, 6, 7, 8])  # `a` publishes too (another prompt)
        await stored(gw, pubs[b.base], b.base, tokens)
        predicted = len(tokens) // 4 * 4
        before = [counted("streamproxy_gateway_kv_routing_decisions_total", by="kv_events"),
                  counted("streamproxy_gateway_kv_predicted_cached_tokens_total"), counted("streamproxy_gateway_kv_tokenize_seconds_count")]
        for stream in (False, True):
            status, _, got = await post(session, gw.url(CHAT), {"model": DEPLOYMENT, "messages": msgs, "stream": stream})
            assert status == 200, got
        assert (served(a), served(b)) == (0, 2)
        # The prompt's ids came from a publishing replica's /tokenize (its chat template), once per request
        # (and once for the test itself, above).
        assert [s.path for s in a.seen + b.seen if s.path == "/tokenize"] == ["/tokenize"] * 3
        after = [counted("streamproxy_gateway_kv_routing_decisions_total", by="kv_events"),
                 counted("streamproxy_gateway_kv_predicted_cached_tokens_total"), counted("streamproxy_gateway_kv_tokenize_seconds_count")]
        assert [a - b for a, b in zip(after, before)] == [2, 2 * predicted, 2]


async def test_a_completion_prompt_of_token_ids_is_routed_without_tokenizing(
        replica: StartReplica, gateway: StartGateway, session: aiohttp.ClientSession) -> None:
    a, b = await replica(), await replica()
    async with publishing(gateway, [a, b], [0, 1]) as (gw, pubs):
        gw.in_order()
        prompt = list(range(100, 140))
        await stored(gw, pubs[a.base], a.base, [1, 2, 3, 4])
        await stored(gw, pubs[b.base], b.base, prompt)
        status, _, got = await post(session, gw.url("/v1/completions"), {"model": DEPLOYMENT, "prompt": prompt, "max_tokens": 2})
        assert status == 200, got
        assert [s.path for s in b.seen if s.path != "/health"] == ["/v1/completions"]
        assert [s.path for s in a.seen if s.path != "/health"] == []


async def test_a_prompt_sent_counts_on_its_replica_before_its_events_come(
        replica: StartReplica, gateway: StartGateway, session: aiohttp.ClientSession) -> None:
    a, b = await replica(), await replica()
    async with publishing(gateway, [a, b], [0, 1]) as (gw, pubs):
        await stored(gw, pubs[a.base], a.base, [1, 2, 3, 4])
        await stored(gw, pubs[b.base], b.base, [5, 6, 7, 8])
        index = gw.state.schedulers[DEPLOYMENT].index
        index.speculative_ttl = 3600.0  # (a machine however slow is within it)
        prompt = list(range(300, 340))
        status, _, got = await post(session, gw.url("/v1/completions"), {"model": DEPLOYMENT, "prompt": prompt, "max_tokens": 2})
        assert status == 200, got
        chosen = next(r.base for r in (a, b) if any(s.path == "/v1/completions" for s in r.seen))
        other = b.base if chosen == a.base else a.base
        # No event said so (the fake replicas publish nothing by themselves): llm-d's speculative entry, held
        # while the request lasted (up to SPECULATIVE_HOLD) and renewed for its TTL when it ended.
        now = time.monotonic()
        assert index.cached_tokens(PromptKeys(prompt), [chosen, other], now) == {chosen: 40, other: 0}
        assert index.cached_tokens(PromptKeys(prompt), [chosen], now + SPECULATIVE_HOLD + 1) == {chosen: 40}  # (renewed)
        assert index.cached_tokens(PromptKeys(prompt), [chosen], now + index.speculative_ttl + 1) == {chosen: 0}


async def test_a_replica_without_events_keeps_todays_affinity(
        replica: StartReplica, gateway: StartGateway, session: aiohttp.ClientSession) -> None:
    a, b = await replica(), await replica()  # `b` publishes; `a` does not
    async with publishing(gateway, [a, b], [1]) as (gw, pubs):
        await stored(gw, pubs[b.base], b.base, [1, 2, 3, 4, 5, 6, 7, 8])  # (another prompt's blocks: events are known)
        pool = gw.pool()
        ra, rb = pool.replicas
        # A prompt whose rendezvous home is `b`, which `a` is believed to hold (it served it before).
        for n in range(64):
            body = {"model": SERVED, "messages": messages(f"Policy {n}. " + "Answer briefly and well. " * 20)}
            keys = prefix_keys(body, gw.state.policy.prefix_block_bytes)
            if rendezvous_score(keys[0], rb.anchor) > rendezvous_score(keys[0], ra.anchor):
                break
        ra.index.insert(keys)
        before = counted("streamproxy_gateway_kv_routing_decisions_total", by="affinity")
        status, _, got = await post(session, gw.url(CHAT), {**body, "model": DEPLOYMENT})
        assert status == 200, got
        assert (served(a), served(b)) == (1, 0)
        assert counted("streamproxy_gateway_kv_routing_decisions_total", by="affinity") - before == 1


async def test_a_replica_removed_leaves_no_stale_ownership(
        replica: StartReplica, gateway: StartGateway, session: aiohttp.ClientSession) -> None:
    a, b = await replica(), await replica()
    async with publishing(gateway, [a, b], [0, 1]) as (gw, pubs):
        gw.in_order()
        scheduler = gw.state.schedulers[DEPLOYMENT]
        prompt = list(range(200, 232))
        await stored(gw, pubs[a.base], a.base, [1, 2, 3, 4])
        await stored(gw, pubs[b.base], b.base, prompt)
        assert scheduler.index.blocks(b.base) == 8
        gw.pool().set_replicas([a.base])  # what a source does when the replica goes (a pod deleted, a process exited)
        assert scheduler.index.owners == [a.base]
        assert scheduler.index.blocks(b.base) == 0 and len(scheduler.index) == 1
        assert list(scheduler.subscribers) == [a.base]
        assert await wait_until(lambda: not scheduler._stopping, 10.0)  # its subscriber stopped too
        status, _, got = await post(session, gw.url("/v1/completions"), {"model": DEPLOYMENT, "prompt": prompt, "max_tokens": 2})
        assert status == 200, got
        assert [s.path for s in a.seen if s.path != "/health"] == ["/v1/completions"]
        # Back (a restarted pod at the same URL): a fresh subscriber, its blocks learnt from its events alone.
        gw.pool().set_replicas([a.base, b.base])
        assert scheduler.index.blocks(b.base) == 0
        sub = scheduler.subscribers[b.base]
        assert await wait_until(lambda: sub.connected and sub.feed.replays and not sub.feed.replaying, 10.0)
        assert scheduler.index.blocks(b.base) == 8  # (the replay from 0 brings what the publisher still buffers)


async def test_deployments_and_metrics_show_each_replicas_event_stream(
        replica: StartReplica, gateway: StartGateway, session: aiohttp.ClientSession) -> None:
    a, b = await replica(), await replica()
    async with publishing(gateway, [a, b], [1]) as (gw, pubs):
        await stored(gw, pubs[b.base], b.base, list(range(12)))
        async with session.get(gw.url(f"/v1/deployments/{DEPLOYMENT_ID}")) as resp:
            assert resp.status == 200
            described = await resp.json()
        by_url = {r["url"]: r for r in described["replicas"]}
        assert "kv_events" not in by_url[a.base]
        pub, replay = gw.state.schedulers[DEPLOYMENT]._endpoints[b.base].endpoint, gw.state.schedulers[DEPLOYMENT]._endpoints[b.base].replay_endpoint
        assert by_url[b.base]["kv_events"] == {
            "endpoint": pub, "replay_endpoint": replay, "state": "connected", "blocks": 3, "block_size": 4, "last_seq": 0,
            "batches": 1, "gaps": 0, "replays": 1, "resets": 0, "lost": 0, "decode_errors": 0, "last_error": None,
        }
        async with session.get(gw.url("/metrics")) as resp:
            text = await resp.text()
        assert f'streamproxy_gateway_kv_subscriber_state{{deployment="{DEPLOYMENT}",upstream="{b.base}"}} 1.0' in text
        assert f'streamproxy_gateway_kv_blocks{{deployment="{DEPLOYMENT}",upstream="{b.base}"}} 3.0' in text
        assert f'streamproxy_gateway_kv_stream_events_total{{deployment="{DEPLOYMENT}",kind="batches",upstream="{b.base}"}} 1.0' in text
        fits(f"/v1/deployments/{DEPLOYMENT_ID}", "get", 200, described)  # as /openapi.json documents it
