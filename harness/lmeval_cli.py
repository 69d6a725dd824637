"""`python -m harness.lmeval_cli run ...`: lm-eval's own command line (`python -m lm_eval run ...`, the same
arguments and entry point), with one difference: its task index holds the `--include_path` folders only, not
lm-eval's own ~14,000 task files.

lm-eval's `TaskManager` reads every YAML file under `lm_eval/tasks/` to index the built-in tasks before it
loads the ones asked for; that took 40-50 s of one core per run here, more than the rest of a short run
together. `harness.lmeval` runs only the tasks of `evals/lmeval/` (`--include_path`), which need none of
them, so the index is built with `include_defaults=False` (the argument lm-eval's Python API has and its
command line does not pass).
"""

from __future__ import annotations

import functools

from lm_eval.__main__ import cli_evaluate  # type: ignore[import-untyped]
from lm_eval.tasks import TaskManager  # type: ignore[import-untyped]

TaskManager.__init__ = functools.partialmethod(TaskManager.__init__, include_defaults=False)

if __name__ == "__main__":
    cli_evaluate()
