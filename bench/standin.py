"""vLLM's engine with a GPU-like forward pass on a CPU machine: the stand-in executor.

Given to every server alike as `--distributed-executor-backend
bench.standin.StandInExecutor`: vLLM resolves the qualified name inside the
engine-core process (`Executor.get_class`), so this module must import there
(the servers run with the repository on PYTHONPATH). It is a
`UniProcExecutor`: the real CPU worker is set up in the engine-core process
(device, the model built with `--load-format dummy`, so no weights are read,
and its KV cache from VLLM_CPU_KVCACHE_SPACE), so the KV-cache specs, block
size and block count are vLLM's own. With `-O0` and an explicit KV-cache size
the worker runs no warm-up pass, and the forward pass never runs at all:

- `execute_model` takes the step's SchedulerOutput, plans it
  (bench/standin_model.py: which requests sample, their next token of the
  fixed text, the step's modelled time) and returns nothing (a done Future
  when `non_block`), or vLLM's empty output when nothing was scheduled, as the
  real model runner does;
- `sample_tokens` sleeps until the modelled step has passed since
  `execute_model` was called (the GIL is free meanwhile: the engine core's
  input and output threads run, as they do while a GPU computes) and returns
  a `ModelRunnerOutput(req_ids, req_id_to_index, sampled_token_ids)`.

Everything else is vLLM's: the scheduler (batching, chunked prefill,
preemption, prefix caching), the KV-cache manager, the stop checks
(`max_tokens`, `ignore_eos`, stop strings), IPC to the front end and the
front end's detokenizer. vLLM on CPU turns async scheduling off, so the
engine core schedules between steps (a GPU deployment would overlap it).
This module imports vLLM; only the benchmark's engine-core processes load it.
"""

from __future__ import annotations

import logging
import os
import time
from concurrent.futures import Future
from typing import Any

from vllm.v1.executor.uniproc_executor import UniProcExecutor
from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, ModelRunnerOutput

from .standin_model import ENV_STATS, TEXT, Plan, Stats, StepModel, Tracker

log = logging.getLogger("vllm.bench.standin")


def _done(value: Any) -> Future:
    f: Future = Future()
    f.set_result(value)
    return f


class StandInExecutor(UniProcExecutor):
    def _init_executor(self) -> None:
        super()._init_executor()
        from vllm.tokenizers import cached_tokenizer_from_config

        tokenizer = cached_tokenizer_from_config(self.vllm_config.model_config)
        ids = tokenizer.encode(TEXT, add_special_tokens=False)
        self.model = StepModel.from_env()
        self.tracker = Tracker(ids, tokenizer.eos_token_id)
        self.stats: Stats | None = None
        self._plan: Plan | None = None
        self._deadline = 0.0
        log.warning("stand-in executor: the forward pass is a sleep of %s; the answer is a fixed text of %d tokens "
                    "then EOS (%s)", self.model.describe(), len(ids), tokenizer.eos_token_id)

    def execute_model(self, scheduler_output: Any, non_block: bool = False) -> Any:
        start = time.monotonic()
        if self.stats is None:  # the block count is known once the KV cache is set up
            self.stats = Stats(os.environ.get(ENV_STATS), self.vllm_config.cache_config.num_gpu_blocks or 0)
        plan = self.tracker.plan(scheduler_output)
        if not plan.req_ids:
            self._plan = None
            return _done(EMPTY_MODEL_RUNNER_OUTPUT) if non_block else EMPTY_MODEL_RUNNER_OUTPUT
        self._plan = plan
        self._modelled = self.model.seconds(plan.seqs, plan.prefill_tokens)
        self._deadline = start + self._modelled
        return _done(None) if non_block else None

    def sample_tokens(self, grammar_output: Any, non_block: bool = False) -> Any:
        plan, self._plan = self._plan, None
        if plan is None:
            out = EMPTY_MODEL_RUNNER_OUTPUT
        else:
            left = self._deadline - time.monotonic()
            if left > 0:
                time.sleep(left)
            out = ModelRunnerOutput(req_ids=plan.req_ids, req_id_to_index={r: i for i, r in enumerate(plan.req_ids)},
                                    sampled_token_ids=plan.sampled)
            assert self.stats is not None
            self.stats.step(plan, self._modelled, max(0.0, -left), self.tracker.blocks_in_use())
        return _done(out) if non_block else out

    def take_draft_token_ids(self) -> None:
        return None
