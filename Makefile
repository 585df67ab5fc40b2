# Two commands do all set-up from a fresh clone: `make run` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
OUT ?= plots
PYTEST_ARGS ?=

.PHONY: run test clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Stamps re-install only when the package metadata changes.
$(VENV)/.installed: $(BIN)/python setup.cfg pyproject.toml
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(VENV)/.installed-test: $(BIN)/python setup.cfg pyproject.toml
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@ $(VENV)/.installed

run: $(VENV)/.installed
	$(BIN)/jax-attention train kernel-regression --out $(OUT) --json $(OUT)/kernel_regression.json

test: $(VENV)/.installed-test
	$(BIN)/python -m pytest $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) $(OUT) .pytest_cache .hypothesis *.egg-info
