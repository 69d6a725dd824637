"""lm-evaluation-harness against streamproxy and against vLLM's own server, same machine, same command.

lm-eval's `local-completions` model runs the two tasks of `evals/lmeval/` (a loglikelihood
multiple-choice task: batched token-id prompts with `echo`, `logprobs: 1`, `max_tokens: 1`;
and a generate_until task: batched string prompts with `stop`) with a small sample limit,
against the session's `streamproxy serve` and, at the same time, against `vllm_server` (vLLM's
`api_server`, same model, name and engine flags). Nothing here is a number frozen from one
machine: the loglikelihood task must give each choice the same loglikelihood on both servers
(within TOLERANCE nats) and the same accuracy (see `harness.lmeval.compare`); the
generate_until task must run and give a score on both. `make lmeval-compare` runs the same
comparison by hand on the whole data set.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import pytest

from harness.lmeval import GEN, GEN_METRIC, MC, Run, compare, max_difference, run_lm_eval

pytestmark = pytest.mark.engine

LIMIT = 8  # documents per task: 8 x 4 loglikelihood requests (batches of 8) and 8 generations
TOLERANCE = 0.05  # nats per choice, plus harness.lmeval.RELATIVE of its size: two engine processes differ by rounding


@pytest.fixture(scope="module")
def runs(engine_server: str, vllm_server: str, model_name: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Run, Run]:
    from engine_adapter.default_model import ensure_default_model

    tokenizer = ensure_default_model(progress=False)
    out = tmp_path_factory.mktemp("lmeval")
    # The two lm-eval processes at once: each spends most of its time importing its libraries on one core.
    with ThreadPoolExecutor(2) as pool:
        started = [pool.submit(run_lm_eval, base, model_name, tokenizer, out / label, LIMIT)
                   for base, label in ((engine_server, "streamproxy"), (vllm_server, "vllm"))]
        ours, theirs = (future.result() for future in started)
    print(f"\nlm-eval: streamproxy {ours.seconds:.1f} s, vLLM {theirs.seconds:.1f} s; acc {ours.score(MC, 'acc,none')} vs "
          f"{theirs.score(MC, 'acc,none')}, largest loglikelihood difference {max_difference(ours, theirs):.2e}")
    return ours, theirs


@pytest.mark.parametrize("server", [0, 1], ids=["streamproxy", "vllm"])
def test_both_tasks_run_and_score(runs: tuple[Run, Run], server: int) -> None:
    run = runs[server]
    for task in (MC, GEN):
        assert len(run.samples[task]) == LIMIT, task
    for metric in ("acc,none", "acc_norm,none"):
        assert 0 <= run.score(MC, metric) <= 1
    assert 0 <= run.score(GEN, GEN_METRIC) <= 1
    # Every generation came back as a string (lm-eval fails the run on an error answer).
    assert all(isinstance(text, str) for text in run.generations().values())
    # Every choice got a real loglikelihood: the echoed prompt's logprobs were read back.
    assert all(math.isfinite(x) and x < 0 for scores in run.loglikelihoods().values() for x in scores)


def test_loglikelihoods_and_accuracy_match_vllm(runs: tuple[Run, Run]) -> None:
    ours, theirs = runs
    assert compare(ours, theirs, TOLERANCE) == []


def test_the_comparison_can_fail(runs: tuple[Run, Run]) -> None:
    """The check above is no tautology: one choice moved by more than the tolerance, or a run
    compared with itself, is caught."""
    ours, theirs = runs
    assert compare(ours, ours, TOLERANCE) == ["both runs went to the same server"]
    row = theirs.samples[MC][0]
    moved = [[[str(float(resp[0][0]) - 1.0), resp[0][1]]] for resp in row["resps"][:1]] + row["resps"][1:]  # a whole nat
    shifted = Run(theirs.base_url, theirs.results, {**theirs.samples, MC: [{**row, "resps": moved}, *theirs.samples[MC][1:]]},
                  theirs.seconds)
    problems = compare(ours, shifted, TOLERANCE)
    assert problems and problems[0].startswith(f"doc {row['doc_id']} choice 0: loglikelihood")
