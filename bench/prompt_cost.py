"""Two per-request / per-step costs of `streamproxy serve`'s process, in-process, no engine.

    python -m bench.prompt_cost [--rounds 7]

- encode: the loadgen's chat request rendered by the tiny model's template (47 tokens), its ids by
  the tokenizer's Rust `encode` of the whole text ("whole") and by `fast_encode`'s pieces ("pieces"),
  the same text every time (the bench's requests) and with a different user message each time
  (only the system prompt and the role headers repeat).
- record: vLLM's Prometheus stat logging of one engine step (its `StatLoggerManager.record` on
  the tiny model's config) at 64 outputs and at 1,024 outputs with 8 finished requests, as vLLM
  ships it ("vllm"), with the inter-token latencies batched by `vllm_itl` ("batched").

Min / median / max µs of CPU per call over the rounds. Light (no engine, one process, ~30 s).
"""

from __future__ import annotations

import argparse
import functools
import itertools
import os
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any


def _cpu(f: Callable[[], object], rounds: int, n: int) -> str:
    for _ in range(n // 10):
        f()
    per = []
    for _ in range(rounds):
        t0 = time.process_time()
        for _ in range(n):
            f()
        per.append((time.process_time() - t0) / n * 1e6)
    return f"{min(per):.1f} / {statistics.median(per):.1f} / {max(per):.1f}"


def encode_costs(rounds: int) -> list[str]:
    from vllm.tokenizers import get_tokenizer

    from bench.loadgen import PROMPT
    from engine_adapter.default_model import build_tiny_model
    from engine_adapter.fast_encode import fast_encoder

    tok = get_tokenizer(str(build_tiny_model(progress=False)))
    whole = tok._tokenizer
    pieces = fast_encoder(tok)
    assert pieces is not None

    def render(content: str) -> str:
        return tok.apply_chat_template([{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True)

    same = render(PROMPT)
    assert pieces(same, False) == whole.encode(same, add_special_tokens=False).ids
    count = itertools.count()
    fresh = [render(f"{next(count)} {PROMPT}") for _ in range(2 * 3000 * (rounds + 1))]
    a, b = iter(fresh[: len(fresh) // 2]), iter(fresh[len(fresh) // 2:])
    return [f"encode, same text: whole {_cpu(lambda: whole.encode(same, add_special_tokens=False).ids, rounds, 3000)}, "
            f"pieces {_cpu(lambda: pieces(same, False), rounds, 3000)} µs",
            f"encode, a fresh user message each time: whole {_cpu(lambda: whole.encode(next(a), add_special_tokens=False).ids, rounds, 3000)}, "
            f"pieces {_cpu(lambda: pieces(next(b), False), rounds, 3000)} µs"]


def record_costs(rounds: int) -> list[str]:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine import FinishReason
    from vllm.v1.metrics.loggers import StatLoggerManager
    from vllm.v1.metrics.stats import IterationStats, PrefixCacheStats, RequestStateStats, SchedulerStats

    from engine_adapter.default_model import build_tiny_model
    from engine_adapter.vllm_itl import batch_inter_token_latencies

    config = AsyncEngineArgs(model=str(build_tiny_model(progress=False)), load_format="dummy", max_model_len=1024,
                             enforce_eager=True).create_engine_config()

    def step(n: int, finished: int) -> tuple[SchedulerStats, IterationStats]:
        it = IterationStats()
        it.num_generation_tokens = n
        it.inter_token_latencies_iter = [0.01 + i * 1e-5 for i in range(n)]
        for j in range(finished):
            rs = RequestStateStats(arrival_time=time.time() - 1.3)
            rs.queued_ts, rs.scheduled_ts, rs.first_token_ts, rs.last_token_ts = 1.0, 1.01, 1.05, 2.3
            rs.num_generation_tokens = 128
            it.update_from_finished_request(finish_reason=FinishReason.LENGTH, request_id=f"r{j}", num_prompt_tokens=47,
                                            max_tokens_param=128, req_stats=rs, num_cached_tokens=0)
            it.time_to_first_tokens_iter.append(0.05)
        return SchedulerStats(num_running_reqs=n, kv_cache_usage=0.3, prefix_cache_stats=PrefixCacheStats()), it

    out = []
    for label in ("vllm", "batched"):
        manager = StatLoggerManager(config, engine_idxs=[0])
        if label == "batched":
            holder = type("Llm", (), {"logger_manager": manager})()
            batch_inter_token_latencies(holder)
        for n, finished in ((64, 0), (1024, 8)):
            steps = itertools.cycle([step(n, finished) for _ in range(50)])
            record = functools.partial(_record, manager, steps)
            out.append(f"record, {label}, {n} outputs, {finished} finished: {_cpu(record, rounds, 300)} µs")
    return out


def _record(manager: Any, steps: Iterator[tuple[Any, Any]]) -> None:
    manager.record(*next(steps), engine_idx=0)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.prompt_cost", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args(argv)
    for line in encode_costs(args.rounds) + record_costs(args.rounds):
        print(line, flush=True)


if __name__ == "__main__":
    main()
