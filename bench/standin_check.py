"""Is the stand-in engine honest? `python -m bench.standin_check` answers on vLLM's own AsyncLLM.

It embeds AsyncLLM with the stand-in executor (bench/standin.py) on the tiny
model and the GPU-regime flags (bench/gpu.py), then checks, in one process:

1. detokenized output: a request's streamed text is the tokenizer's decoding
   of the stand-in's fixed text, token for token (vLLM's detokenizer made it);
2. `max_tokens` and `ignore_eos`: with `ignore_eos` a request runs to
   `max_tokens` past the text's end-of-sequence token; without it, it stops
   at that token (finish_reason "stop");
3. the scheduler batches: N concurrent requests share steps (the stats
   file's largest step holds more than one request), a step lasts about what
   the step model says, and the KV-cache manager handed out blocks (its peak
   of blocks held is above the blocks of one request).

Exit status 1 when a check fails. About 30 s on two cores (engine start).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import sys
import tempfile
import time

from .standin_model import ENV_STATS, TEXT, StepModel, read_stats


async def _collect(engine, prompt: str, params, rid: str) -> tuple[str, int, str | None]:
    text, tokens, finish = "", 0, None
    async for out in engine.generate(prompt, params, rid):
        c = out.outputs[0]
        text += c.text
        tokens += len(c.token_ids)
        finish = c.finish_reason or finish
    return text, tokens, finish


async def _run(model: str, engine_args: list[str], streams: int) -> list[str]:
    from vllm import SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.sampling_params import RequestOutputKind
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from vllm.v1.engine.async_llm import AsyncLLM

    parser = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser())
    ns = parser.parse_args(["--model", model, *engine_args])
    engine = AsyncLLM.from_engine_args(AsyncEngineArgs.from_cli_args(ns))
    failures: list[str] = []
    try:
        tok = engine.tokenizer
        ids = tok.encode(TEXT, add_special_tokens=False)
        n = len(ids)
        delta = RequestOutputKind.DELTA

        # 1 + 2a: ignore_eos, past the end of the text: the text, (EOS: not shown), the text again.
        want = n + 1 + 16
        text, tokens, finish = await _collect(
            engine, "Tell me a story.", SamplingParams(max_tokens=want, ignore_eos=True, output_kind=delta), "a")
        expected = tok.decode(ids) + tok.decode(ids[:16])
        if tokens != want or finish != "length":
            failures.append(f"ignore_eos: {tokens} tokens, finish {finish!r} (want {want}, 'length')")
        if text != expected:
            failures.append(f"detokenized text differs: {text[:80]!r}... vs {expected[:80]!r}...")
        # 2b: without ignore_eos the request ends at the text's EOS.
        text, tokens, finish = await _collect(
            engine, "Tell me a story.", SamplingParams(max_tokens=want, output_kind=delta), "b")
        if tokens != n + 1 or finish != "stop" or text != tok.decode(ids):
            failures.append(f"EOS: {tokens} tokens, finish {finish!r} (want {n + 1}, 'stop')")
        # 2c: max_tokens short of the text.
        text, tokens, finish = await _collect(
            engine, "Tell me a story.", SamplingParams(max_tokens=32, ignore_eos=True, output_kind=delta), "c")
        if tokens != 32 or finish != "length" or text != tok.decode(ids[:32]):
            failures.append(f"max_tokens 32: {tokens} tokens, finish {finish!r}")

        # 3: concurrent requests share steps; steps last what the model says; KV blocks are held.
        stats0 = read_stats(os.environ[ENV_STATS]) or {}
        t0 = time.monotonic()
        results = await asyncio.gather(*(
            _collect(engine, f"Request {i}: tell me a story.",
                     SamplingParams(max_tokens=128, ignore_eos=True, output_kind=delta), f"s{i}")
            for i in range(streams)))
        wall = time.monotonic() - t0
        stats = read_stats(os.environ[ENV_STATS]) or {}
        d = {k: stats.get(k, 0.0) - stats0.get(k, 0.0) for k in stats}
        short = [r for r in results if r[1] != 128]
        if short:
            failures.append(f"{len(short)} of {streams} concurrent requests did not get 128 tokens")
        print(f"{streams} streams x 128 tokens: {wall:.2f} s, {d['steps']:.0f} steps, largest step "
              f"{stats['max_seqs']:.0f} requests, mean {d['seqs'] / max(d['steps'], 1):.1f}; modelled "
              f"{d['modelled_s']:.2f} s, overrun {d['overrun_s'] * 1e3:.1f} ms; KV blocks held at peak "
              f"{stats['blocks_peak']:.0f} of {stats['blocks_total']:.0f}; prefill tokens {d['prefill_tokens']:.0f}")
        if stats["max_seqs"] < min(streams, 2):
            failures.append(f"no batching: largest step {stats['max_seqs']:.0f} requests")
        if d["modelled_s"] > wall or d["modelled_s"] < 0.5 * wall:
            failures.append(f"modelled step time {d['modelled_s']:.2f} s against {wall:.2f} s of wall time")
        block = engine.vllm_config.cache_config.block_size
        one_request_blocks = -(-(len(tok.encode("Request 0: tell me a story.")) + 128) // block)
        if stats["blocks_peak"] <= one_request_blocks:
            failures.append(f"KV blocks at peak {stats['blocks_peak']:.0f}: not above one request's")
    finally:
        engine.shutdown()
        del engine  # collected now, not at interpreter exit (AsyncLLM.__del__ fails there)
    return failures


def main(argv: list[str] | None = None) -> int:
    from engine_adapter import default_model

    from .gpu import ENGINE_ARGS

    ap = argparse.ArgumentParser(prog="python -m bench.standin_check", description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--engine-args", default=ENGINE_ARGS)
    args = ap.parse_args(argv)
    model = str(default_model.build_tiny_model(progress=False))
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        os.environ[ENV_STATS] = os.path.join(tmp, "stats")
        os.environ.update(StepModel.from_env().env())
        failures = asyncio.run(_run(model, shlex.split(args.engine_args), args.streams))
    for f in failures:
        print("FAIL:", f)
    print("stand-in engine: all checks passed" if not failures else f"stand-in engine: {len(failures)} check(s) failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
