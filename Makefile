# Two commands do all set-up from a fresh clone: `make run` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
OUT ?= plots
PYTEST_ARGS ?=

SITE ?= site

.PHONY: run test test-slow docs test-browser clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Stamps re-install only when the package metadata changes.
$(VENV)/.installed: $(BIN)/python setup.cfg pyproject.toml
	$(BIN)/python -m pip install --quiet -e .
	touch $@

# The test extras include PyTorch (the CPU wheel pinned in setup.cfg) for the cross-framework tests,
# and the docs extra: the suite runs the tutorials and checks the API and command-line references.
# The Chinese figures need a CJK font (Debian's fonts-noto-cjk, installed where missing).
$(VENV)/.installed-test: $(BIN)/python setup.cfg pyproject.toml
	scripts/ensure-cjk-font
	$(BIN)/python -m pip install --quiet -e '.[test,torch,docs]'
	touch $@ $(VENV)/.installed

# The project's main job: the book's Transformer (d2l §11.7) with the book's settings: prints the
# loss, tokens/sec and the translations of its four sentences with their BLEU, writes the loss
# curve and the attention heatmaps (encoder self, decoder self, encoder–decoder; every layer and
# head) into $(OUT) and the checkpoint that `jax-attention translate` reads into
# runs/transformer. (`jax-attention train bahdanau` trains the seq2seq of d2l §11.4.)
run: $(VENV)/.installed
	$(BIN)/jax-attention train transformer --out $(OUT) --json $(OUT)/transformer.json

# One test process per core (at most 4): the suite is dominated by single-threaded XLA compilation.
test: $(VENV)/.installed-test
	$(BIN)/python -m pytest -n auto --maxprocesses=4 --dist loadscope --no-loadscope-reorder $(PYTEST_ARGS)

# The `slow` set that `make test` leaves out (setup.cfg): the long runs (the book's whole runs,
# seeds 0-5; the multi-device runs beyond one; the whole-run benchmark). CI (.ci/run) runs both.
# It compiles with XLA's defaults, as a user's process does: its runs execute far longer than
# they compile, and the documented outputs (docs/) are the default compiler's bits. (`make test` compiles
# at LLVM -O0, faster: tests/compiler_support.py.)
test-slow: $(VENV)/.installed-test
	JAX_ATTENTION_TEST_COMPILER=default $(BIN)/python -m pytest -n auto --maxprocesses=4 --dist loadscope --no-loadscope-reorder -m slow $(PYTEST_ARGS)

# The docs site: Sphinx builds docs/ into build/docs/html, executing the tutorials (a failing cell,
# an undocumented public name or any warning fails it), then it replaces $(SITE)/. The tutorials
# train on the English–French data: `jax-attention data` finds it as the commands do (or downloads
# it into the user cache) and the build stops at once, with the line that says how to supply it,
# when it cannot; the Chinese figures need a CJK font (installed where missing). Offline: open
# $(SITE)/index.html, or serve it (python -m http.server -d $(SITE)) for the search's page summaries.
# Then `make test-browser`.
docs: $(VENV)/.installed-test
	scripts/ensure-cjk-font
	data=$$($(BIN)/jax-attention data) && rm -rf build/docs/html && \
	JAX_ATTENTION_DATA="$$data" $(BIN)/python -m sphinx -W --keep-going -q -b html \
		-d build/docs/doctrees docs build/docs/html
	rm -rf $(SITE) && cp -a build/docs/html $(SITE)

# The tests in headless Chromium (Debian's package, installed where missing), network off: the built
# site (tests/test_site.py: every page, link, anchor, image, the search) and the interactive
# attention views (tests/test_attention_view_browser.py).
test-browser: $(VENV)/.installed-test
	scripts/ensure-chromium
	JAX_ATTENTION_SITE=$(SITE) $(BIN)/python -m pytest -m browser $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) $(OUT) runs .pytest_cache .hypothesis *.egg-info build $(SITE) docs/reference
