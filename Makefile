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

# The project's main job: the book's Transformer (d2l §11.7) with the book's settings: prints the
# loss, tokens/sec and the translations of its four sentences with their BLEU, writes the loss
# curve and the attention heatmaps (encoder self, decoder self, encoder–decoder; every layer and
# head) into $(OUT) and the checkpoint that `jax-attention translate` reads into
# runs/transformer. (`jax-attention train bahdanau` trains the seq2seq of d2l §11.4.)
run: $(VENV)/.installed
	$(BIN)/jax-attention train transformer --out $(OUT) --json $(OUT)/transformer.json

test: $(VENV)/.installed-test
	$(BIN)/python -m pytest $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) $(OUT) runs .pytest_cache .hypothesis *.egg-info
