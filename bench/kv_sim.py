"""A discrete-event simulation of the KV-pressure benchmark: `python -m bench.kv_sim --policy kv --seeds 6`.

No engines: `--replicas` FIFO replicas, each an LRU cache of `--capacity`
blocks of `--block-size` tokens that frees a request's blocks tail first (as
vLLM's block pool does, so a prefix's head outlives its tail); a request's
service time is 0.3 s + its uncached tokens / `--prefill-rate`; its cache
lookup at the start of its service, its blocks stored (and the evicted
ones removed) at its end, as BlockStored / BlockRemoved into the gateway's
own `KVIndex`. The choice is the gateway's own code: `rr` round robin,
`aff` today's affinity (`Pool.choose`), `kv` KV-event routing
(`kv_score.choose`, speculation held while the request lasts). `--tenants`
prompts of `--system-tokens` sharing their first block (a chat template's
header), Poisson arrivals at `--rate`, tenants uniform or Zipf-skewed (`--zipf S`);
`--gateways N` gateways sharing nothing (each its own pool and index, every index fed the same
events, requests alternating); `--wipe-mid`: replica 0's cache wiped halfway (AllBlocksCleared to
every index; the restart's downtime is not modelled). Prints the cached-token ratio and
TTFT p50/p90 per seed: a quick check of a choice rule, not a measurement.
"""

from __future__ import annotations

import argparse
import heapq
import random
import sys
from collections import OrderedDict
from typing import Any

from streamproxy.gateway import kv_score
from streamproxy.gateway.balance import Pool, Replica
from streamproxy.gateway.config import Deployment, UpstreamPolicy
from streamproxy.gateway.kv_events import BlockRemoved, BlockStored
from streamproxy.gateway.kv_index import KVIndex, PromptKeys
from streamproxy.gateway.prefix import prefix_keys


class Cache:
    def __init__(self, capacity: int, block_size: int) -> None:
        self.capacity, self.block_size = capacity, block_size
        self.blocks: OrderedDict[int, None] = OrderedDict()

    def keys(self, tokens: list[int]) -> list[int]:
        bs, parent, out = self.block_size, 0, []
        for i in range(len(tokens) // bs):
            parent = hash((parent, tuple(tokens[i * bs : (i + 1) * bs])))
            out.append(parent)
        return out

    def hit(self, keys: list[int]) -> int:
        n = 0
        while n < len(keys) and keys[n] in self.blocks:
            n += 1
        return n

    def store(self, keys: list[int]) -> list[int]:
        for k in reversed(keys):  # the head most recently used
            self.blocks[k] = None
            self.blocks.move_to_end(k)
        evicted = []
        while len(self.blocks) > self.capacity:
            evicted.append(self.blocks.popitem(last=False)[0])
        return evicted


def run(args: argparse.Namespace, seed: int) -> tuple[float, float, float]:
    rng = random.Random(seed)
    bs = args.block_size
    urls = [f"http://r{i}" for i in range(args.replicas)]
    pools, indexes = [], []
    for g in range(args.gateways):
        pool = Pool(Deployment(name="d", id="dep-d", upstreams=urls),
                    UpstreamPolicy(policy="round_robin" if args.policy == "rr" else "prefix"), rng=random.Random(seed + g))
        for r in pool.replicas:
            r.health.probed_healthy = True
        index = KVIndex()
        for u in urls:
            index.add(u)
        pools.append(pool)
        indexes.append(index)
    caches = {u: Cache(args.capacity, bs) for u in urls}
    busy = dict.fromkeys(urls, 0.0)
    queues: dict[str, list[tuple[float, list[int], Replica, int]]] = {u: [] for u in urls}
    prompts = [[1] * bs + [1000 * (t + 1) + i for i in range(args.system_tokens - bs)] for t in range(args.tenants)]
    events: list[tuple[float, int, str, Any]] = []
    t, n = 0.0, 0
    weights = [1.0 / (k + 1) ** args.zipf for k in range(args.tenants)]
    for n in range(args.requests):
        t += rng.expovariate(args.rate)
        tenant = rng.choices(range(args.tenants), weights)[0]
        heapq.heappush(events, (t, n, "arrive", (t, tenant, prompts[tenant] + [5_000_000 + n] * 12, n % args.gateways)))
    if args.wipe_mid:
        heapq.heappush(events, (t / 2, -1, "wipe", None))
    order = n + 1
    prompt_total = cached_total = 0
    ttfts: list[float] = []

    def start(u: str, now: float) -> None:
        nonlocal prompt_total, cached_total, order
        if busy[u] > now or not queues[u]:
            return
        at, tokens, replica, g = queues[u].pop(0)
        keys = caches[u].keys(tokens)
        hit = min(caches[u].hit(keys), (len(tokens) - 1) // bs)
        cached_total += hit * bs
        prompt_total += len(tokens)
        busy[u] = now + 0.3 + (len(tokens) - hit * bs) / args.prefill_rate
        order += 1
        heapq.heappush(events, (busy[u], order, "done", (u, tokens, keys, hit, at, replica, g)))

    while events:
        now, _, kind, data = heapq.heappop(events)
        if kind == "wipe":
            caches[urls[0]].blocks.clear()
            for index in indexes:
                index.reset(urls[0])
        elif kind == "arrive":
            at, tenant, tokens, g = data
            pool, index = pools[g], indexes[g]
            pkeys = prefix_keys({"messages": [{"role": "system", "content": f"tenant {tenant} " + "x" * 600}]}, 256)
            if args.policy == "kv":
                chosen, _ = kv_score.choose(pool, index, PromptKeys(tokens), pkeys, set(), now)
            else:
                chosen, _ = pool.choose(pkeys, set(), now)
            assert chosen is not None
            replica = chosen
            if args.policy == "kv":
                index.speculate(replica.url, PromptKeys(tokens), now, hold=600.0)
            pool.dispatched(replica, pkeys)
            queues[replica.url].append((at, tokens, replica, g))
            start(replica.url, now)
        else:
            u, tokens, keys, hit, at, replica, g = data
            evicted = caches[u].store(keys)
            for index in indexes:
                if keys[hit:]:
                    index.stored(u, BlockStored(block_hashes=keys[hit:], parent_block_hash=keys[hit - 1] if hit else None,
                                                token_ids=tokens[hit * bs : len(keys) * bs], block_size=bs))
                if evicted:
                    index.removed(u, BlockRemoved(block_hashes=list[bytes | int](evicted)))
            ttfts.append(now - at)
            pools[g].completed(replica)
            if args.policy == "kv":
                indexes[g].speculate(u, PromptKeys(tokens), now)
            start(u, now)
    ttfts.sort()
    return cached_total / prompt_total, ttfts[len(ttfts) // 2], ttfts[int(0.9 * len(ttfts))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.kv_sim", description=__doc__.split("\n\n")[0])
    ap.add_argument("--policy", choices=("rr", "aff", "kv"), default="kv")
    ap.add_argument("--seeds", type=int, default=6)
    ap.add_argument("--requests", type=int, default=96)
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--capacity", type=int, default=225)
    ap.add_argument("--block-size", type=int, default=32)
    ap.add_argument("--tenants", type=int, default=16)
    ap.add_argument("--system-tokens", type=int, default=1500)
    ap.add_argument("--rate", type=float, default=0.7)
    ap.add_argument("--zipf", type=float, default=0.0, help="tenant popularity skew (0: uniform)")
    ap.add_argument("--gateways", type=int, default=1, help="gateways sharing nothing")
    ap.add_argument("--wipe-mid", action="store_true", help="replica 0's cache wiped halfway")
    ap.add_argument("--prefill-rate", type=float, default=200.0, help="uncached prompt tokens per second")
    args = ap.parse_args(argv)
    for seed in range(1, args.seeds + 1):
        ratio, p50, p90 = run(args, seed)
        print(f"{args.policy} seed {seed}: cached {ratio:.3f}  TTFT p50 {p50:.1f} s  p90 {p90:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
