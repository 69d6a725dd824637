"""Where a deployment's requests go and when: KV-event routing and flow control (issue 35).

One `Scheduler` per deployment pool (kept across a reload with its pool).

KV events. One `KVIndex` per pool; a `Feed` + `KVSubscriber` per replica
that publishes (`Pool.kv_endpoints`: the deployment's `kv_events`, or a
`launch:` replica's own ports), made and dropped as the pool's replicas
change (`Pool.listeners`): a replica removed leaves the index at once
(`Feed.close`), its subscriber stopped in the background. Subscribers run
from `start` (the gateway's start, or a reload's `take_over`) to `stop`.

Routing. A generating request to a pool where some replica's block size is
known gets its prompt as token ids: the ids of a `/v1/completions` prompt
of ids as they are; otherwise the replica's own `POST /tokenize` (the chat
messages and tools rendered by its chat template: the ids it will prefill,
for any model, with no tokenizer in the gateway; one more round trip,
`streamproxy_gateway_kv_tokenize_seconds`), asked of the least busy
publishing replica, bounded by `TOKENIZE_TIMEOUT`; a failure falls back to today's affinity.
`kv_score.choose` then weighs each replica's cached prefix against its
load (replicas without events: today's approximate index); after dispatch
`KVIndex.speculate` counts the prompt's blocks on the chosen replica while
the request lasts (however long it waits in the replica's queue) and
`speculative_ttl` after, until its events arrive, so a burst of one prefix
follows its first request.
Responses and Anthropic requests, and prompts that are batches, keep
today's affinity.

Flow control. With `flow_control.max_concurrency` > 0, `FlowControl`
admits a generating request while the deployment has fewer in flight than
the sum of its routable replicas' bounds (`fairq.deployment_limit`), else
queues it per tenant (the key) and band (vLLM's `priority`), VTC-fair
within a band (cost: the prompt's bytes / `prompt_bytes_per_token` at
admission, corrected to the tokens metered at the end), strict across
bands; 429 with Retry-After past `max_queued` or `max_wait`. A deployment
with no routable replica admits at once (the call's 503 says why). A
replica whose /metrics (read after each health probe, flow control on)
reports `queue_depth_threshold` or more requests waiting of its own
(`vllm:num_requests_waiting`, streamproxy's `streamproxy_requests_queued`)
takes no more than it has now (`fairq.replica_limit`); while it is held so,
its /metrics is read again every `HELD_RELOOK` seconds (not only at the next
probe), so another client's burst in its queue holds our requests back no
longer than it lasts.

Metrics at scrape time (a collector over the live schedulers: nothing per
event): each subscriber's state and counters, blocks indexed, queue lengths
per tenant and band, admission outcomes.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Iterator
from time import perf_counter
from typing import Any

import msgspec
from prometheus_client import REGISTRY
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from streamproxy.gateway import metrics as M
from streamproxy.gateway.balance import Pool, Replica
from streamproxy.gateway.config import KVEventsEndpoint
from streamproxy.gateway.fairq import FairQueue, deployment_limit, saturated
from streamproxy.gateway.flowcontrol import FlowControl, Ticket
from streamproxy.gateway.kv_feed import Feed
from streamproxy.gateway.kv_index import KVIndex, PromptKeys
from streamproxy.gateway.kv_score import choose, estimated_cached
from streamproxy.gateway.kv_subscriber import KVSubscriber
from streamproxy.gateway.upstream import CONNECT_ERRORS, ask
from streamproxy.gateway.upstream_tls import ClientTLS
from streamproxy.gateway.wire import Upstreams

log = logging.getLogger("streamproxy.gateway")

SPECULATIVE_HOLD = 600.0  # seconds a request's blocks count on its replica at most before it ends
TOKENIZE_TIMEOUT = 2.0  # seconds for a replica's /tokenize; past it the request keeps today's affinity
HELD_RELOOK = 1.0  # seconds between reads of a held-back replica's /metrics, between its probes
_decode_tokens = msgspec.json.Decoder(dict[str, Any]).decode
_encode = msgspec.json.Encoder().encode


def tokenize_request(path: str, data: dict[str, Any]) -> bytes | list[int] | None:
    """What turns a request into the token ids its replica will prefill: the ids themselves (a
    completion's prompt of ids), the body of a `/tokenize` (chat messages, a completion's text), or
    None (a batch, another API: today's affinity)."""
    if path == "/v1/chat/completions":
        messages = data.get("messages")
        if not isinstance(messages, list):
            return None
        ask_: dict[str, Any] = {"model": data.get("model"), "messages": messages}
        for name in ("tools", "add_generation_prompt", "continue_final_message", "chat_template", "chat_template_kwargs"):
            if data.get(name) is not None:
                ask_[name] = data[name]
        return _encode(ask_)
    if path == "/v1/completions":
        prompt = data.get("prompt")
        if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
            return list(prompt)
        if isinstance(prompt, str):
            return _encode({"model": data.get("model"), "prompt": prompt})
    return None


_METRICS_LIMIT = 8 << 20  # bytes of a replica's /metrics read (vLLM's histograms run to a few hundred KB)
_WAITING = (b"vllm:num_requests_waiting", b"streamproxy_requests_queued")


def requests_waiting(text: bytes) -> int | None:
    """The requests waiting of a replica's own in its Prometheus text (summed over their labels; None: not there).
    A scan for the two gauges' lines, not a parse of the whole text (it runs on the event loop)."""
    total, seen = 0.0, False
    text = b"\n" + text
    for name in _WAITING:
        at = text.find(b"\n" + name)
        while at >= 0:
            end = text.find(b"\n", at + 1)
            line = text[at + 1 : end if end >= 0 else len(text)]
            rest = line[len(name):]
            if rest[:1] in (b" ", b"{"):
                value = rest.rsplit(b"}", 1)[-1].split()
                try:
                    total += float(value[0])
                    seen = True
                except (IndexError, ValueError):
                    pass
            at = text.find(b"\n" + name, at + 1)
    return int(total) if seen else None


class Scheduler:
    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.index = KVIndex()
        self.subscribers: dict[str, KVSubscriber] = {}
        self._endpoints: dict[str, KVEventsEndpoint] = {}
        self.running = False
        self._stopping: set[asyncio.Task[None]] = set()
        fc = pool.deployment.flow_control
        self.max_concurrency = fc.max_concurrency
        self.flow = FlowControl(pool.deployment.name, FairQueue(fc.max_queued, fc.max_wait), self.limit) if fc.max_concurrency > 0 else None
        self.decisions = {by: M.KV_DECISIONS.labels(pool.deployment.name, by) for by in ("kv_events", "affinity")}
        self.predicted = M.KV_PREDICTED.labels(pool.deployment.name)
        self.observed_tokens = M.KV_OBSERVED.labels(pool.deployment.name)
        self.tokenize_seconds = M.KV_TOKENIZE.labels(pool.deployment.name)
        self.tokenize_failures = 0
        self.waiting: dict[str, int] = {}  # a replica's own requests waiting, from its /metrics (flow control on)
        self._relooks: dict[str, asyncio.Task[None]] = {}  # a held-back replica's next read of its /metrics
        pool.listeners.append(self.sync)
        self.sync()
        _LIVE.add(self)

    # -- the replicas' event streams ---------------------------------------------------
    def sync(self) -> None:
        """The pool's replicas changed: a subscriber for each that publishes, none for the others."""
        urls = {r.url for r in self.pool.replicas}
        for url in [u for u in self.waiting if u not in urls]:
            del self.waiting[url]
        wanted = self.pool.kv_endpoints
        for url in [u for u in self.subscribers if wanted.get(u) != self._endpoints.get(u)]:
            self._drop(url)
        for url, kv in wanted.items():
            if url not in self.subscribers:
                feed = Feed(url, self.index, replay=kv.replay_endpoint is not None)
                sub = self.subscribers[url] = KVSubscriber(feed, kv.endpoint, replay_endpoint=kv.replay_endpoint,
                                                           topic=kv.topic, bind=kv.bind)
                self._endpoints[url] = kv
                if self.running:
                    sub.start()
        if self.running and self.flow is not None:
            self.flow.poke()  # (a replica came: room for who waits)

    def _drop(self, url: str) -> None:
        sub = self.subscribers.pop(url)
        self._endpoints.pop(url, None)
        sub.feed.close()  # its blocks leave the index now: no stale owner
        if sub.started:
            task = asyncio.get_running_loop().create_task(sub.stop(), name=f"kv-events-stop-{url}")
            self._stopping.add(task)
            task.add_done_callback(self._stopping.discard)

    def start(self) -> None:
        if self.running:
            return
        self.running = True
        for sub in self.subscribers.values():
            sub.start()

    async def stop(self) -> None:
        self.running = False
        _LIVE.discard(self)  # (a reload's replacement of the same name reports alone)
        relooks = list(self._relooks.values())
        for task in relooks:
            task.cancel()
        await asyncio.gather(*(sub.stop() for sub in self.subscribers.values()), *list(self._stopping), *relooks,
                             return_exceptions=True)

    @property
    def publishing(self) -> bool:
        """Some replica's events are known (its block size): prompts are worth tokenizing."""
        return any(self.index.block_size(url) for url in self.subscribers)

    # -- routing ----------------------------------------------------------------------
    async def prompt(self, upstreams: Upstreams, source: bytes | list[int], cache_salt: str | None,
                     headers: dict[str, str], tls: ClientTLS | None) -> PromptKeys | None:
        """The request's prompt as token ids (None: not known; today's affinity applies)."""
        if isinstance(source, list):
            return PromptKeys(source, cache_salt=cache_salt)
        now = time.monotonic()
        publishing = [r for r in self.pool.replicas if r.url in self.subscribers and r.health.available(now)]
        if not publishing:
            return None
        url = min(publishing, key=lambda r: r.outstanding).url  # (the least busy: not always the first one)
        began = perf_counter()
        try:
            async with asyncio.timeout(TOKENIZE_TIMEOUT):
                exchange = await ask(upstreams, url, "/tokenize", source, {"Content-Type": "application/json", **headers}, tls)
                try:
                    raw = await exchange.read()
                finally:
                    exchange.finish(reuse=True)
            if exchange.status != 200:
                raise ValueError(f"status {exchange.status}")
            tokens = _decode_tokens(raw).get("tokens")
            if not isinstance(tokens, list):
                raise ValueError("no `tokens`")
        except (*CONNECT_ERRORS, ValueError, msgspec.DecodeError) as exc:
            self.tokenize_failures += 1
            log.debug("deployment %s: /tokenize of %s failed (%s); routing by affinity", self.pool.deployment.name, url, exc)
            return None
        self.tokenize_seconds.observe(perf_counter() - began)
        return PromptKeys(tokens, cache_salt=cache_salt)

    def choose(self, prompt: PromptKeys | None, keys: list[int], exclude: set[str],
               now: float) -> tuple[Replica | None, int, int | None]:
        """The replica for an attempt, how many of `keys` (today's prefix keys) it holds, and the prompt
        tokens its events say it holds (None: not chosen by its events)."""
        if prompt is None or not self.subscribers:
            self.decisions["affinity"].inc()
            return (*self.pool.choose(keys, exclude, now, self.max_concurrency), None)
        if log.isEnabledFor(logging.DEBUG):
            self._explain(prompt, keys, exclude, now)
        replica, cached = choose(self.pool, self.index, prompt, keys, exclude, now, self.max_concurrency)
        if replica is None:
            return None, 0, None
        by_events = self.pool.policy.affinity and replica.url in self.subscribers
        self.decisions["kv_events" if by_events else "affinity"].inc()
        if cached:
            self.predicted.inc(cached)
        return replica, replica.index.matched(keys) if keys else 0, cached if by_events else None

    def _explain(self, prompt: PromptKeys, keys: list[int], exclude: set[str], now: float) -> None:
        candidates = [r for r in self.pool.replicas if r.url not in exclude and r.health.available(now)]
        cached = estimated_cached(self.index, candidates, prompt, keys, now)
        log.debug("deployment %s: KV choice for %d prompt tokens: %s", self.pool.deployment.name, len(prompt.token_ids),
                  ", ".join(f"{r.url} cached {int(c)} load {r.outstanding}" for r, c in zip(candidates, cached)))

    def observed(self, replica: Replica, predicted: int, prompt_tokens: int, cached_tokens: int) -> None:
        """A request routed by KV events ended: the replica reported `cached_tokens` of `prompt_tokens`."""
        self.observed_tokens.inc(cached_tokens)
        log.debug("deployment %s: %s predicted %d cached, reported %d of %d prompt tokens",
                  self.pool.deployment.name, replica.url, predicted, cached_tokens, prompt_tokens)

    def dispatched(self, replica: Replica, prompt: PromptKeys | None, now: float) -> None:
        """The prompt went to `replica`: its blocks count there while the request lasts (it may wait in
        the replica's queue for long), up to `SPECULATIVE_HOLD`."""
        if prompt is not None and replica.url in self.subscribers:
            self.index.speculate(replica.url, prompt, now, hold=SPECULATIVE_HOLD)

    def ended(self, replica: Replica, prompt: PromptKeys | None, now: float) -> None:
        """The attempt on `replica` is over: its speculative blocks last `speculative_ttl` more (their events' way)."""
        if prompt is not None and replica.url in self.subscribers:
            self.index.speculate(replica.url, prompt, now)

    # -- flow control -----------------------------------------------------------------
    def limit(self) -> float:
        now = time.monotonic()
        waiting = self.waiting
        return deployment_limit([(r.outstanding, waiting.get(r.url)) for r in self.pool.replicas if r.health.available(now)],
                                self.max_concurrency, self.pool.deployment.flow_control.queue_depth_threshold)

    async def look(self, upstreams: Upstreams, replica: Replica, headers: dict[str, str], tls: ClientTLS | None,
                   timeout: float) -> None:
        """After a health probe, with flow control on: the replica's own requests waiting, from its /metrics."""
        if self.flow is None:
            return
        try:
            reply = await upstreams.get(replica.url, "/metrics", timeout=timeout, headers=headers, tls=tls, limit=_METRICS_LIMIT)
            found = requests_waiting(reply.body) if reply.status == 200 else None
        except (*CONNECT_ERRORS, ValueError):
            found = None
        if found is None:
            self.waiting.pop(replica.url, None)
        else:
            self.waiting[replica.url] = found
        if not self.running:
            return
        self.flow.poke()
        held = saturated(found, self.pool.deployment.flow_control.queue_depth_threshold)
        if held and replica.url not in self._relooks and replica in self.pool.replicas:
            task = asyncio.get_running_loop().create_task(self._relook(upstreams, replica, headers, tls, timeout),
                                                          name=f"flow-relook-{replica.url}")
            self._relooks[replica.url] = task

    async def _relook(self, upstreams: Upstreams, replica: Replica, headers: dict[str, str], tls: ClientTLS | None,
                      timeout: float) -> None:
        """A held-back replica's /metrics read again in `HELD_RELOOK` seconds (another then, while it stays held)."""
        try:
            await asyncio.sleep(HELD_RELOOK)
        finally:
            self._relooks.pop(replica.url, None)
        if replica.health.available(time.monotonic()):
            await self.look(upstreams, replica, headers, tls, timeout)

    async def admit(self, tenant: str, band: int, cost: float, weight: float) -> Ticket | None:
        """A place for a generating request (None: no flow control, or no replica to wait for); 429 if refused."""
        flow = self.flow
        now = time.monotonic()
        if flow is None or not any(r.health.available(now) for r in self.pool.replicas):
            return None
        return await flow.admit(tenant, band, cost, weight)

    def release(self, ticket: Ticket, cost: float | None) -> None:
        if self.flow is not None:
            self.flow.release(ticket, cost)

    # -- views ------------------------------------------------------------------------
    def describe_replica(self, url: str) -> dict[str, object] | None:
        sub = self.subscribers.get(url)
        if sub is None:
            return None
        feed = sub.feed
        return {
            "endpoint": sub.endpoint, "replay_endpoint": sub.replay_endpoint, "state": _state(sub),
            "blocks": self.index.blocks(url), "block_size": self.index.block_size(url), "last_seq": feed.last_seq,
            "batches": feed.batches, "gaps": feed.gaps, "replays": feed.replays, "resets": feed.resets, "lost": feed.lost,
            "decode_errors": feed.decode_errors, "last_error": feed.last_error or None,
        }

    def describe(self) -> dict[str, object]:
        flow = self.flow
        if flow is None:
            return {}
        queued = flow.queue.queued()
        return {"flow_control": {
            "max_concurrency": self.max_concurrency, "limit": self.limit(), "in_flight": flow.inflight,
            "queued": {str(band): tenants for band, tenants in queued.items()},
            "waiting": len(flow.queue),
        }}


def _state(sub: KVSubscriber) -> str:
    if sub.feed.replaying:
        return "replaying"
    return "connected" if sub.connected else "disconnected"


_STATES = {"disconnected": 0, "connected": 1, "replaying": 2}
_LIVE: weakref.WeakSet[Scheduler] = weakref.WeakSet()


class _Collector(Collector):
    """The live schedulers' state, read at scrape time."""

    def collect(self) -> Iterator[Any]:
        state = GaugeMetricFamily("streamproxy_gateway_kv_subscriber_state",
                                  "A replica's KV-event stream: 0 disconnected, 1 connected, 2 replaying", labels=["deployment", "upstream"])
        blocks = GaugeMetricFamily("streamproxy_gateway_kv_blocks", "Blocks of a replica's prefix cache the gateway indexes",
                                   labels=["deployment", "upstream"])
        stream = CounterMetricFamily("streamproxy_gateway_kv_stream_events",
                                     "A replica's KV-event stream: batches applied, gaps, replays, resets, streams lost, undecodable batches",
                                     labels=["deployment", "upstream", "kind"])
        queued = GaugeMetricFamily("streamproxy_gateway_flow_queued", "Requests waiting for a saturated deployment, by tenant (key) and priority band",
                                   labels=["deployment", "tenant", "band"])
        inflight = GaugeMetricFamily("streamproxy_gateway_flow_in_flight", "Requests admitted by a deployment's flow control and not ended",
                                     labels=["deployment"])
        outcomes = CounterMetricFamily("streamproxy_gateway_flow_outcomes",
                                       "Requests that waited for a saturated deployment, by band and outcome (dispatched, rejected_capacity, evicted_ttl, cancelled)",
                                       labels=["deployment", "band", "outcome"])
        # Summed by labels: a deployment a reload changed has two schedulers until the old one's requests end.
        families = {f.name: f for f in (state, blocks, stream, queued, inflight, outcomes)}
        values: dict[tuple[str, tuple[str, ...]], float] = {}

        def add(family: Any, labels: tuple[str, ...], value: float) -> None:
            key = (family.name, labels)
            values[key] = values.get(key, 0.0) + value

        for s in list(_LIVE):
            name = s.pool.deployment.name
            for url, sub in s.subscribers.items():
                add(state, (name, url), _STATES[_state(sub)])
                add(blocks, (name, url), s.index.blocks(url))
                feed = sub.feed
                for kind, count in (("batches", feed.batches), ("gaps", feed.gaps), ("replays", feed.replays),
                                    ("resets", feed.resets), ("lost", feed.lost), ("decode_errors", feed.decode_errors)):
                    add(stream, (name, url, kind), count)
            if s.flow is not None:
                add(inflight, (name,), s.flow.inflight)
                for band, tenants in s.flow.queue.queued().items():
                    for tenant, n in tenants.items():
                        add(queued, (name, tenant, str(band)), n)
                for (band, outcome), n in s.flow.queue.outcomes.items():
                    add(outcomes, (name, str(band), outcome.value), n)
        for (family_name, labels), total in values.items():
            families[family_name].add_metric(list(labels), total)
        yield from (state, blocks, stream, queued, inflight, outcomes)

    def describe(self) -> Iterator[Any]:
        return iter(())


REGISTRY.register(_Collector())
