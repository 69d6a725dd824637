"""vLLM's input path for one request in the front end's process, in-process and without an engine.

    python -m bench.input_cost [before|after ...]   # default: before after (each in its own process)

What `VllmEngine.generate` does before the ZMQ send, on the tiny model's config (no engine core,
no weights): our params as vLLM's `SamplingParams`, then vLLM's `InputProcessor.process_inputs`
and `assign_request_id` for the loadgen's 47-token prompt, with vLLM's env cache on (as serve
turns it on once up). "before": `SamplingParams(...)` per request on the tokenizer as vLLM gives
it; "after": `vllm_params.SamplingBuilder` and `vllm_reads.cheap_eos_id`, as serve runs it now.
The tokenizer's class change cannot be undone, so each variant runs in a process of its own.
Min / median / max over 7 rounds of 3,000 requests, µs of CPU per request; Python and C calls
per request under cProfile.
"""

from __future__ import annotations

import cProfile
import os
import pstats
import statistics
import subprocess
import sys
import time
from typing import Any

ROUNDS, PER_ROUND = 7, 3000


def measure(variant: str) -> str:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import envs
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.inputs import tokens_input
    from vllm.v1.engine.input_processor import InputProcessor

    from engine_adapter.base import GenerationParams
    from engine_adapter.default_model import build_tiny_model
    from engine_adapter.vllm_params import SamplingBuilder, eos_ids, sampling_params
    from engine_adapter.vllm_reads import cheap_eos_id

    args = AsyncEngineArgs(model=str(build_tiny_model(progress=False)), load_format="dummy", max_model_len=1024,
                           enforce_eager=True)
    processor = InputProcessor(args.create_engine_config())
    envs.enable_envs_cache()
    make: Any = sampling_params
    if variant == "after":
        tokenizer = processor.renderer.get_tokenizer()
        cheap_eos_id(tokenizer)
        make = SamplingBuilder(eos_ids(tokenizer, processor))
    prompt = list(range(100, 147))
    params = GenerationParams(max_tokens=128, temperature=0.0, ignore_eos=True)  # bench-gpu's requests

    def run(n: int) -> None:
        for i in range(n):
            request = processor.process_inputs(f"r{i}", tokens_input(prompt), make(params), supported_tasks=("generate",))
            processor.assign_request_id(request)

    run(300)
    cpu = []
    for _ in range(ROUNDS):
        t0 = time.process_time()
        run(PER_ROUND)
        cpu.append((time.process_time() - t0) / PER_ROUND * 1e6)
    profile = cProfile.Profile()
    profile.enable()
    run(PER_ROUND)
    profile.disable()
    calls = sum(nc for (_, nc, _, _, _) in pstats.Stats(profile).stats.values()) / PER_ROUND  # type: ignore[attr-defined]
    return (f"{variant}: {min(cpu):.1f} / {statistics.median(cpu):.1f} / {max(cpu):.1f} µs CPU per request, "
            f"{calls:.0f} calls per request")


def main(argv: list[str] | None = None) -> None:
    variants = (argv if argv is not None else sys.argv[1:]) or ["before", "after"]
    if len(variants) == 1 and os.environ.get("BENCH_INPUT_COST_CHILD"):
        print(measure(variants[0]), flush=True)
        return
    for variant in variants:
        if variant not in ("before", "after"):
            raise SystemExit(f"unknown variant {variant!r}: before or after")
        out = subprocess.run([sys.executable, "-m", "bench.input_cost", variant], capture_output=True, text=True,
                             env={**os.environ, "BENCH_INPUT_COST_CHILD": "1"}, check=True)
        print(out.stdout.strip().splitlines()[-1], flush=True)


if __name__ == "__main__":
    main()
