"""The stand-in engine's step model and bookkeeping, without vLLM (bench/standin.py runs it).

A GPU user's engine steps every few milliseconds. The stand-in keeps vLLM's
engine core (scheduler, KV-cache manager, IPC, the front end's detokenizer)
and replaces only the forward pass by a sleep of

    base_ms + us_per_seq x (requests in the step) + prefill_us x (prefill tokens in the step)

where a step's prefill tokens are its scheduled tokens minus the one token of
each request that samples (a decode step schedules one token and samples it;
a prompt chunk that does not end the prompt samples nothing). The parameters
come from environment variables that every server of a run gets alike:
BENCH_STANDIN_BASE_MS, BENCH_STANDIN_US_PER_SEQ, BENCH_STANDIN_PREFILL_US.

The "model" answers every request with the same fixed English text, token by
token (ids from the model's tokenizer), then its end-of-sequence token, then
the text again: `ignore_eos` and `max_tokens` decide where a request ends,
in vLLM's scheduler, as with a real model. `Tracker.plan` reads one step's
SchedulerOutput (duck-typed: only its fields are used, so a test can feed
plain objects) and says which requests sample which token; it also counts
the KV blocks the scheduler has handed out to the running requests.

Counters go to a small file (BENCH_STANDIN_STATS, `Stats`), rewritten in
place through mmap after every step, so the benchmark can read a round's
steps, batch sizes and modelled time from outside the engine-core process
(`read_stats`).
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from typing import Any

ENV_BASE_MS = "BENCH_STANDIN_BASE_MS"
ENV_US_PER_SEQ = "BENCH_STANDIN_US_PER_SEQ"
ENV_PREFILL_US = "BENCH_STANDIN_PREFILL_US"
ENV_STATS = "BENCH_STANDIN_STATS"

# About a mid-size model on one current GPU: weights read once per decode step (~8 ms), a little more per
# sequence (attention over its context, sampling), and prompt tokens at ~40k tokens/s.
DEFAULT_BASE_MS = 8.0
DEFAULT_US_PER_SEQ = 20.0
DEFAULT_PREFILL_US = 25.0

# Not a sample from any model: an original paragraph, long enough (about 250 tokens) that a 128-token
# request never reaches its end, with a few non-ASCII characters for the detokenizers' UTF-8 paths.
TEXT = (
    "The lighthouse stood at the end of a long spit of shingle, and for thirty years its keeper had "
    "climbed the one hundred and twelve steps every evening to light the lamp. He knew the sea in all "
    "its moods: the flat grey calm of a winter morning, the short steep chop that came before a gale, "
    "the long swell that rolled in from storms a thousand miles away. One spring morning, walking the "
    "tideline after a rough night, he found a green glass bottle wedged between two rocks. Its cork "
    "was sealed with wax, and inside, rolled tight and tied with a faded ribbon, was a letter. The "
    "paper was dry. The handwriting was careful and slanted, the ink brown with age, and it began: "
    "\u201cTo whoever finds this \u2014 I am writing from the caf\u00e9 by the harbour at Saint-Malo, "
    "where the fishing boats come in at dawn.\u201d He read it twice standing on the shingle, then "
    "carried it up the steps to the lamp room, where the light was best, and read it a third time. "
    "The writer asked for nothing except to be remembered, and to know that the letter had reached "
    "someone. That evening, after he had lit the lamp, he sat down at the small table by the window "
    "and began, for the first time in many years, to write a letter of his own."
)


@dataclass(frozen=True)
class StepModel:
    base_ms: float = DEFAULT_BASE_MS
    us_per_seq: float = DEFAULT_US_PER_SEQ
    prefill_us: float = DEFAULT_PREFILL_US

    @classmethod
    def from_env(cls, env: dict[str, str] | os._Environ[str] = os.environ) -> StepModel:
        return cls(float(env.get(ENV_BASE_MS, DEFAULT_BASE_MS)), float(env.get(ENV_US_PER_SEQ, DEFAULT_US_PER_SEQ)),
                   float(env.get(ENV_PREFILL_US, DEFAULT_PREFILL_US)))

    def env(self) -> dict[str, str]:
        return {ENV_BASE_MS: repr(self.base_ms), ENV_US_PER_SEQ: repr(self.us_per_seq),
                ENV_PREFILL_US: repr(self.prefill_us)}

    def seconds(self, seqs: int, prefill_tokens: int) -> float:
        """One step's modelled time; a step that schedules nothing costs nothing."""
        if seqs == 0:
            return 0.0
        return self.base_ms / 1e3 + (self.us_per_seq * seqs + self.prefill_us * prefill_tokens) / 1e6

    def describe(self) -> str:
        return (f"{self.base_ms:g} ms + {self.us_per_seq:g} \u00b5s per sequence + {self.prefill_us:g} \u00b5s "
                f"per prefill token")


@dataclass
class Plan:
    req_ids: list[str]
    sampled: list[list[int]]  # per request in req_ids' order: [] or [next token]
    seqs: int
    prefill_tokens: int


class Tracker:
    """Per-request state across steps: prompt length, tokens sampled so far, KV blocks held."""

    def __init__(self, text_ids: list[int], eos_id: int | None) -> None:
        self.answer = list(text_ids) + ([eos_id] if eos_id is not None else [])
        if not self.answer:
            raise ValueError("the stand-in's text has no tokens")
        self.reqs: dict[str, list[int]] = {}  # req_id -> [prompt tokens, sampled tokens, KV blocks]

    def blocks_in_use(self) -> int:
        return sum(st[2] for st in self.reqs.values())

    def plan(self, so: Any) -> Plan:
        reqs = self.reqs
        for rid in so.finished_req_ids:
            reqs.pop(rid, None)
        computed: dict[str, int] = {}
        for new in so.scheduled_new_reqs:
            prompt = len(new.prompt_token_ids) if new.prompt_token_ids is not None else len(new.prompt_embeds)
            reqs[new.req_id] = [prompt, 0, sum(len(g) for g in new.block_ids)]
            computed[new.req_id] = new.num_computed_tokens
        cached = so.scheduled_cached_reqs
        for i, rid in enumerate(cached.req_ids):
            computed[rid] = cached.num_computed_tokens[i]
            blocks = cached.new_block_ids[i]
            if blocks is not None:
                n = sum(len(g) for g in blocks)
                st = reqs[rid]
                st[2] = n if rid in cached.resumed_req_ids else st[2] + n
        req_ids = list(so.num_scheduled_tokens)
        sampled: list[list[int]] = []
        sampling = 0
        answer, size = self.answer, len(self.answer)
        for rid in req_ids:
            st = reqs[rid]
            # The step computes this request's last known token (prompt + sampled so far): it samples the next.
            if computed[rid] + so.num_scheduled_tokens[rid] >= st[0] + st[1]:
                sampled.append([answer[st[1] % size]])
                st[1] += 1
                sampling += 1
            else:
                sampled.append([])  # a prompt chunk (or a recompute after preemption) short of its end
        return Plan(req_ids, sampled, len(req_ids), so.total_num_scheduled_tokens - sampling)


# steps, sum of requests per step, max requests in a step, sampled tokens, prefill tokens, modelled s,
# overrun s (the step began later than the model allowed: the engine core's own work took longer),
# KV blocks in use (now), KV blocks in use (peak), KV blocks in total.
FIELDS = ("steps", "seqs", "max_seqs", "sampled", "prefill_tokens", "modelled_s", "overrun_s",
          "blocks_in_use", "blocks_peak", "blocks_total")
_FMT = "<" + "d" * len(FIELDS)
_SIZE = struct.calcsize(_FMT)


class Stats:
    """The counters, written in place (mmap) after each step; `path` None: kept in memory only."""

    def __init__(self, path: str | None, blocks_total: int = 0) -> None:
        self.values = dict.fromkeys(FIELDS, 0.0)
        self.values["blocks_total"] = float(blocks_total)
        self._map: mmap.mmap | None = None
        if path:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.ftruncate(fd, _SIZE)
                self._map = mmap.mmap(fd, _SIZE)
            finally:
                os.close(fd)

    def step(self, plan: Plan, modelled: float, overrun: float, blocks: int) -> None:
        v = self.values
        v["steps"] += 1
        v["seqs"] += plan.seqs
        v["max_seqs"] = max(v["max_seqs"], plan.seqs)
        v["sampled"] += sum(map(len, plan.sampled))
        v["prefill_tokens"] += plan.prefill_tokens
        v["modelled_s"] += modelled
        v["overrun_s"] += overrun
        v["blocks_in_use"] = blocks
        v["blocks_peak"] = max(v["blocks_peak"], blocks)
        if self._map is not None:
            struct.pack_into(_FMT, self._map, 0, *v.values())


def read_stats(path: str | os.PathLike[str]) -> dict[str, float] | None:
    """The counters as the engine core last wrote them (None: no file yet, or a short one)."""
    try:
        with open(path, "rb") as f:
            raw = f.read(_SIZE)
    except FileNotFoundError:
        return None
    if len(raw) < _SIZE:
        return None
    return dict(zip(FIELDS, struct.unpack(_FMT, raw)))
