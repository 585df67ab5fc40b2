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

# The book's seq2seq with Bahdanau attention (d2l §11.4), with the book's settings: prints the
# loss and the translations of its four sentences with their BLEU, writes the loss curve and the
# attention heatmap into $(OUT) and the checkpoint that `jax-attention translate` reads into
# runs/bahdanau.
run: $(VENV)/.installed
	$(BIN)/jax-attention train bahdanau --out $(OUT) --json $(OUT)/bahdanau.json

test: $(VENV)/.installed-test
	$(BIN)/python -m pytest $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) $(OUT) runs .pytest_cache .hypothesis *.egg-info
