"""Does the gateway's KV index match a real replica's cache? `python -m bench.kv_accuracy`.

One `streamproxy serve` replica of `--model` with prefix caching, its KV cache
capped (`--blocks`), publishing KV events; a `KVSubscriber` + `KVIndex` here
(the gateway's own classes) follow it. Requests of `--tenants` system prompts
(bench/scheduling.py's) in random order, one at a time (`--concurrency` > 1:
that many at once, each tenant's requests possibly side by side): before each,
the index's cached-prefix prediction for the prompt (its ids from the
replica's /tokenize); after it, the replica's reported `cached_tokens`. A line
per request, then the totals: predicted, reported, and how many requests the
index over- or under-predicted by more than a block (vLLM never counts a
prompt's last token as cached: a fully cached prompt that ends on a block
boundary reports one block less, which is not counted as a miss).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shlex
import sys
import time
from typing import Any

from .compare import model_path
from .scheduling import ENGINE_ARGS, WORDS, replica, system_prompts
from .servers import SERVED_NAME, stop_on_signals


async def run(args: argparse.Namespace, base: str, pub: str, replay: str, prompts: list[str]) -> dict[str, Any]:
    import aiohttp

    from streamproxy.gateway.kv_feed import Feed
    from streamproxy.gateway.kv_index import KVIndex, PromptKeys
    from streamproxy.gateway.kv_subscriber import KVSubscriber

    index = KVIndex(speculative_ttl=0)
    feed = Feed(base, index, replay=True)
    sub = KVSubscriber(feed, pub, replay_endpoint=replay)
    sub.start()
    rng = random.Random(args.seed)
    rows: list[dict[str, Any]] = []
    sem = asyncio.Semaphore(args.concurrency)
    try:
        async with aiohttp.ClientSession() as session:
            async def one(n: int) -> None:
                t = rng.randrange(len(prompts))
                messages = [{"role": "system", "content": prompts[t]},
                            {"role": "user", "content": f"Question {n}: {rng.choice(WORDS)}?"}]
                async with sem:
                    async with session.post(base + "/tokenize", json={"model": SERVED_NAME, "messages": messages}) as r:
                        tokens = (await r.json())["tokens"]
                    size = index.block_size(base)
                    predicted = index.cached_tokens(PromptKeys(tokens), [base], time.monotonic())[base] if size else 0
                    blocks_before = index.blocks(base)
                    body = {"model": SERVED_NAME, "max_tokens": args.max_tokens, "messages": messages}
                    async with session.post(base + "/v1/chat/completions", json=body) as r:
                        usage = (await r.json())["usage"]
                    await asyncio.sleep(args.settle)  # (the step's events on their way)
                reported = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
                rows.append({"n": n, "tenant": t, "prompt_tokens": usage["prompt_tokens"], "predicted": predicted,
                             "reported": reported, "blocks_before": blocks_before, "blocks_after": index.blocks(base)})
                print(json.dumps(rows[-1]), flush=True)

            for n in range(0, args.requests, args.concurrency):
                await asyncio.gather(*(one(k) for k in range(n, min(n + args.concurrency, args.requests))))
    finally:
        await sub.stop()
    size = index.block_size(base) or 1
    over = [r for r in rows if r["predicted"] > r["reported"] + size]
    under = [r for r in rows if r["predicted"] < r["reported"]]
    return {"requests": len(rows), "predicted": sum(r["predicted"] for r in rows), "reported": sum(r["reported"] for r in rows),
            "over_predicted": len(over), "under_predicted": len(under), "block_size": size,
            "feed": {"batches": feed.batches, "gaps": feed.gaps, "replays": feed.replays, "resets": feed.resets,
                     "decode_errors": feed.decode_errors, "skipped_events": feed.skipped_events},
            "index": {"orphaned": index.orphaned, "unaligned": index.unaligned, "unknown_removed": index.unknown_removed,
                      "blocks": index.blocks(base)}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.kv_accuracy", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--engine-args", default=ENGINE_ARGS)
    ap.add_argument("--block-size", type=int, default=32)
    ap.add_argument("--blocks", type=int, default=225, help="--num-gpu-blocks-override")
    ap.add_argument("--tenants", type=int, default=6)
    ap.add_argument("--system-tokens", type=int, default=1500)
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=4)
    ap.add_argument("--settle", type=float, default=0.3, help="seconds after each answer for its events")
    ap.add_argument("--seed", type=int, default=35)
    args = ap.parse_args(argv)
    stop_on_signals()
    from transformers import AutoTokenizer

    model = model_path(args.model)
    prompts = system_prompts(AutoTokenizer.from_pretrained(model), args.tenants, args.system_tokens, "accuracy", args.seed)
    tag = f"kv-accuracy-{time.strftime('%Y%m%d-%H%M%S')}"
    rep = replica(model, shlex.split(args.engine_args), tag, 0,
                  ["--block-size", str(args.block_size), "--num-gpu-blocks-override", str(args.blocks)])
    rep.server.start()
    try:
        rep.server.wait_ready()
        import uvloop

        result = uvloop.run(run(args, rep.server.base, rep.pub, rep.replay, prompts))
    finally:
        rep.server.stop(30)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
