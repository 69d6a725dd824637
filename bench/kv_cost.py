"""What the gateway's KV-cache index costs, in-process: decoding vLLM's event batches, applying them, asking it.

    python -m bench.kv_cost [--replicas 4] [--batches 5000] [--rounds 5]

A fake replica per owner (harness/kv_publisher.py's FakeCache: block
size 16, a cache of 2000 blocks, so it evicts) caches chat-like prompts
(system prompts shared, turns that extend threads) and makes vLLM's batches,
encoded as vLLM encodes them. Timed, in CPU time (process time), per batch,
per event and per block:
  decode   kv_events.decode_batch;
  apply    KVIndex.apply of the decoded events;
  feed     kv_feed.Feed.live: both, with the sequence checks (what the subscriber does per message);
  query    PromptKeys + KVIndex.cached_tokens for a 2,000-token prompt over every replica
           (the request path's cost per request), and its key computation alone;
and the index's memory per block tracked and per trace of an evicted block (tracemalloc). min / median / max of `--rounds`.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time
import tracemalloc
from collections.abc import Callable

from harness.kv_publisher import FakeCache, encode_batch
from streamproxy.gateway.kv_events import Event, decode_batch
from streamproxy.gateway.kv_feed import Feed
from streamproxy.gateway.kv_index import DEFAULT_MAX_TRACES, KVIndex, PromptKeys

BS = 16


def workload(replicas: int, batches: int, seed: int = 35) -> tuple[list[tuple[str, bytes, int, int]], list[int]]:
    """(owner, payload, events, blocks) per batch, round robin over the replicas; and the last prompt."""
    rng = random.Random(seed)
    systems = [[rng.randrange(50_000) for _ in range(rng.randint(200, 800))] for _ in range(8)]
    caches = {f"http://replica-{i}:8000": FakeCache(BS, capacity=2000) for i in range(replicas)}
    threads: list[list[int]] = []
    out = []
    owners = list(caches)
    for n in range(batches):
        if threads and rng.random() < 0.6:
            thread = rng.choice(threads)
            thread.extend(rng.randrange(50_000) for _ in range(rng.randint(20, 200)))
        else:
            thread = list(rng.choice(systems)) + [rng.randrange(50_000) for _ in range(rng.randint(20, 300))]
            threads.append(thread)
            if len(threads) > 200:
                threads.pop(0)
        owner = owners[n % len(owners)]
        events = caches[owner].prompt(thread)
        if not events:
            continue
        blocks = sum(len(e["block_hashes"]) for e in events)
        out.append((owner, encode_batch(events, ts=float(n)), len(events), blocks))
    return out, thread


def cpu(fn: Callable[[], object]) -> float:
    gc.collect()
    start = time.process_time()
    fn()
    return time.process_time() - start


def spread(values: list[float], per: float) -> str:
    us = [v / per * 1e6 for v in values]
    return f"{min(us):8.2f} {statistics.median(us):8.2f} {max(us):8.2f}"


def fed_index(batches: list[tuple[str, bytes, int, int]], owners: list[str]) -> KVIndex:
    """Every batch through a Feed per replica (no replay: in order), as the subscriber would."""
    index = KVIndex()
    feeds = {o: Feed(o, index, replay=False) for o in owners}
    seqs = dict.fromkeys(owners, 0)
    for owner, payload, _, _ in batches:
        feeds[owner].live(seqs[owner], payload, 0.0)
        seqs[owner] += 1
    return index


def one_round(batches: list[tuple[str, bytes, int, int]], payloads: list[bytes], decoded: list[list[Event]],
              owners: list[str], tokens: list[int]) -> dict[str, float]:
    """One round's CPU seconds: decode, apply, feed (both), and 200 queries and key computations (scaled to len(batches))."""
    index = KVIndex()

    def apply_all() -> None:
        for (owner, _, _, _), events in zip(batches, decoded):
            index.apply(owner, events)

    took = {"decode": cpu(lambda: [decode_batch(p) for p in payloads]), "apply": cpu(apply_all)}
    fed: list[KVIndex] = []
    took["feed"] = cpu(lambda: fed.append(fed_index(batches, owners)))
    scale = len(batches) / 200
    took["query"] = cpu(lambda: [fed[0].cached_tokens(PromptKeys(tokens), owners, 0.0) for _ in range(200)]) * scale
    took["keys"] = cpu(lambda: [PromptKeys(tokens).keys(BS) for _ in range(200)]) * scale
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--batches", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    batches, last = workload(args.replicas, args.batches)
    payloads = [p for _, p, _, _ in batches]
    n, events, blocks = len(batches), sum(b[2] for b in batches), sum(b[3] for b in batches)
    decoded = [decode_batch(p)[0].events for p in payloads]
    owners = sorted({o for o, _, _, _ in batches})
    timings: dict[str, list[float]] = {"decode": [], "apply": [], "feed": [], "query": [], "keys": []}
    tokens = (last + list(range(2000)))[:2000]  # the last prompt (held by one replica), then tokens no one holds
    for _ in range(args.rounds):
        for name, took in one_round(batches, payloads, decoded, owners, tokens).items():
            timings[name].append(took)
    held = max(fed_index(batches, owners).cached_tokens(PromptKeys(tokens), owners, 0.0).values())

    def memory(max_traces: int) -> tuple[KVIndex, int]:
        tracemalloc.start()
        index = KVIndex(max_traces=max_traces)
        before = tracemalloc.get_traced_memory()[0]
        for (o, _, _, _), e in zip(batches, decoded):
            index.apply(o, e)
        used = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        return index, used

    index, used = memory(0)
    traced, with_traces = memory(DEFAULT_MAX_TRACES)
    traces = len(traced._traces)

    print(f"{n} batches, {events} events, {blocks} blocks stored or removed, {args.replicas} replicas, "
          f"block size {BS}; index at the end: {len(index)} blocks")
    print(f"{'µs (CPU), min median max':34} {'per batch':>26} {'per event':>26} {'per block':>26}")
    for name in ("decode", "apply", "feed"):
        values = timings[name]
        print(f"{name:34} {spread(values, n)} {spread(values, events)} {spread(values, blocks)}")
    print(f"{'query (2,000-token prompt)':34} {spread(timings['query'], n)}   per request, over {len(owners)} replicas"
          f" ({held} tokens of it held)")
    print(f"{'  of which its keys':34} {spread(timings['keys'], n)}   per request (125 blocks)")
    print(f"index memory: {used / max(1, len(index)):.0f} bytes per block tracked ({used / 1e6:.1f} MB for {len(index)}), "
          f"{(with_traces - used) / max(1, traces):.0f} bytes per trace ({(with_traces - used) / 1e6:.1f} MB for {traces})")


if __name__ == "__main__":
    main()
