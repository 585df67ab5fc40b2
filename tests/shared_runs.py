"""The trained models the suite shares: one tiny run per registered model kind and one book run
per model, each trained once per test session and handed to every test that needs it.

Every training run of the suite that is not about a setting of its own uses :data:`TINY`, one
configuration per model kind, so that the compiled training steps, decoders and evaluation are
the same programs everywhere: a test in the worker that compiled them reuses them from memory,
and every other process of the session (the other xdist workers, the commands the tests start
as subprocesses) loads them from the session's compilation cache (tests/conftest.py).

- :func:`tiny_run` (fixture ``tiny_run``): ``jax-attention train KIND`` of :data:`TINY` with
  training checkpoints every :data:`EVERY` steps, the export, the ``--json`` report and the
  plots; the uninterrupted reference that the fault tests' runs must end as.
- :func:`book_run` (fixture ``book_run``): ``jax-attention train KIND`` at the book's settings
  (seed 0), as docs/models.md runs it: its printed lines and its report, for that page's output
  blocks, the pinned losses and the book's quality; a whole run (200 or 250 epochs), so only the
  ``slow`` set asks for one.

Each is made by the first process of the session that asks for it, under a file lock beside the
workers' temporary directories (``filelock``, as pytest-xdist's documentation does it); the
others wait and read it. A shared run is read-only to the tests: a test that changes files
copies them first (:meth:`SharedRun.copy`), and each process checks at its end that no file of
a shared run changed.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import filelock

from jax_attention.runtime.provenance import vector_isa
from tests.docs_support import block_after, read

__all__ = ["TINY", "EPOCHS", "STEPS_PER_EPOCH", "EVERY", "TOTAL_STEPS", "tiny_flags",
           "tiny_settings", "run_flags", "SharedRun", "SharedRuns", "shared_directory",
           "BOOK_RUNS_PAGE", "book_run_text", "FIGURE_CLASSES", "book_run_seed_counts",
           "book_run_output_block", "book_run_output", "run_main",
           "run_main_counting_compilations"]

#: The documentation page that shows the book's runs of both models, their output and their
#: figures over seeds (tests/docs_support.py reads it).
BOOK_RUNS_PAGE = "docs/models.md"

#: The model sizes of the tiny runs, as command-line flags, per registered model kind.
_MODEL_FLAGS = {
    "bahdanau": ("--embed-size", "8", "--num-hiddens", "8", "--num-layers", "1"),
    "transformer": ("--num-hiddens", "8", "--ffn-num-hiddens", "16", "--num-heads", "2",
                    "--num-layers", "1"),
}
#: The data and training of every tiny run: 80 pairs of which 16 held out, batches of 16 (4
#: steps an epoch), 6 tokens, seed 1; dropout at the models' default (0.1).
_TRAINING_FLAGS = ("--num-examples", "80", "--val-fraction", "0.2", "--batch-size", "16",
                   "--num-steps", "6", "--seed", "1")
EPOCHS, STEPS_PER_EPOCH, EVERY = 3, 4, 2
TOTAL_STEPS = EPOCHS * STEPS_PER_EPOCH

#: ``{kind: flags}``: every tiny run's model and training flags (without ``--epochs``).
TINY = {kind: (*flags, *_TRAINING_FLAGS) for kind, flags in _MODEL_FLAGS.items()}


def tiny_flags(kind: str, *, epochs: int = EPOCHS) -> list[str]:
    """``train KIND``'s flags of the tiny run of ``kind``: sizes, data, ``--epochs``, no bar."""
    return [*TINY[kind], "--epochs", str(epochs), "--no-progress"]


def tiny_settings(kind: str, **overrides) -> dict:
    """The tiny run of ``kind`` as keyword arguments of ``train_bahdanau`` /
    ``train_transformer`` (the config fields the flags set; no bar, no log), with
    ``overrides``."""
    flags = TINY[kind]
    settings = {}
    for flag, value in zip(flags[::2], flags[1::2]):
        name = flag[2:].replace("-", "_")
        settings[name] = float(value) if "." in value else int(value)
    return {**settings, "epochs": EPOCHS, "progress": False, "log": None, **overrides}


def run_flags(kind: str, root: Path, *, epochs: int = EPOCHS, plots: bool = True) -> list[str]:
    """The whole tiny run's flags with its outputs under ``root``: training checkpoints every
    :data:`EVERY` steps in ``root/train``, the export in ``root/model``, the report
    ``root/run.json`` and (``plots``) the plots in ``root/plots`` (Matplotlib's start and the
    heatmaps are seconds of a subprocess: a run whose test does not look at them leaves them
    out)."""
    return [*tiny_flags(kind, epochs=epochs), "--checkpoint-dir", str(root / "train"),
            "--checkpoint-every", str(EVERY), "--checkpoint", str(root / "model"),
            "--json", str(root / "run.json"), *(["--out", str(root / "plots")] if plots else [])]


@dataclass(frozen=True)
class SharedRun:
    """A finished run in ``root``: ``train`` (training checkpoints, tiny runs only), ``model``
    (the export), ``run.json`` (the report), ``plots``; what it printed."""

    kind: str
    root: Path
    stdout: str
    stderr: str

    @property
    def train(self) -> Path:
        return self.root / "train"

    @property
    def model(self) -> Path:
        return self.root / "model"

    @property
    def plots(self) -> Path:
        return self.root / "plots"

    @property
    def record(self) -> dict:
        """The ``--json`` report, parsed afresh (a test may change its copy)."""
        return json.loads((self.root / "run.json").read_text(encoding="utf-8"))

    def copy(self, destination: Path) -> Path:
        """The run's files copied into ``destination`` (created): a place a test may change."""
        shutil.copytree(self.root, destination, dirs_exist_ok=True)
        return destination


def _digest(root: Path) -> str:
    """One SHA-256 over every path under ``root`` and its bytes."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        digest.update(str(path.relative_to(root)).encode())
        if path.is_file():
            digest.update(path.read_bytes())
    return digest.hexdigest()


class SharedRuns:
    """The session's shared runs, made on first use under a lock (see the module docstring)."""

    def __init__(self, directory: Path, data_path: Path):
        self.directory = directory
        self.data_path = data_path
        self._runs: dict[str, tuple[SharedRun, str]] = {}

    def tiny(self, kind: str) -> SharedRun:
        return self._get(f"tiny-{kind}", kind, lambda root: [
            "train", kind, "--data", str(self.data_path), *run_flags(kind, root)])

    def book(self, kind: str) -> SharedRun:
        # docs/models.md's command (`jax-attention train KIND`, the book's settings, seed 0) with
        # the report its pinned losses are read from; the plots are the tiny runs' concern.
        return self._get(f"book-{kind}", kind, lambda root: [
            "train", kind, "--data", str(self.data_path), "--no-progress", "--checkpoint",
            str(root / "model"), "--json", str(root / "run.json")])

    def _get(self, name: str, kind: str, argv) -> SharedRun:
        if name not in self._runs:
            root = self.directory / name
            marker = self.directory / f"{name}.json"
            with filelock.FileLock(self.directory / f"{name}.lock"):
                if not marker.exists():
                    shutil.rmtree(root, ignore_errors=True)
                    root.mkdir(parents=True)
                    status, out, err = run_main(argv(root))
                    marker.write_text(json.dumps({"status": status, "stdout": out, "stderr": err,
                                                  "digest": _digest(root)}), encoding="utf-8")
                made = json.loads(marker.read_text(encoding="utf-8"))
            assert made["status"] == 0, f"the shared run {name} failed:\n{made['stderr']}"
            self._runs[name] = (SharedRun(kind, root, made["stdout"], made["stderr"]),
                                made["digest"])
        return self._runs[name][0]

    def check_unchanged(self) -> list[str]:
        """The shared runs this process used whose files a test changed."""
        return [run.root.name for run, digest in self._runs.values()
                if _digest(run.root) != digest]


def run_main_counting_compilations(argv: list[str]) -> tuple[int, str, str, int]:
    """:func:`run_main`, with the number of XLA programs it compiled: ``(status, stdout, stderr,
    compiled)`` (a command that refuses its arguments before any work compiles none)."""
    import jax

    compiled = []

    def count(event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            compiled.append(duration)

    jax.monitoring.register_event_duration_secs_listener(count)
    try:
        status, out, err = run_main(argv)
    finally:
        jax.monitoring.unregister_event_duration_listener(count)
    return status, out, err, len(compiled)


def run_main(argv: list[str]) -> tuple[int, str, str]:
    """``jax-attention *argv`` in this process: ``(status, stdout, stderr)``; argparse's exits
    included."""
    from jax_attention.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main(argv)
        except SystemExit as exit_:
            status = exit_.code
    return status, out.getvalue(), err.getvalue()


def shared_directory(tmp_path_factory) -> Path:
    """The session's directory for shared runs: beside the xdist workers' own temporary
    directories (their parent), or the session's own without xdist."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def book_run_text(kind: str) -> str:
    """:data:`BOOK_RUNS_PAGE` from its book command ``jax-attention train KIND --out plots/`` to
    the next heading: the command's output block and what the page says of its run."""
    text = read(BOOK_RUNS_PAGE)
    start = text.index(f"jax-attention train {kind} --out plots/")
    end = text.find("\n## ", start)
    return text[start:] if end < 0 else text[start:end]


#: The classes of CPU :data:`BOOK_RUNS_PAGE` gives the book runs' figures for
#: (:func:`jax_attention.runtime.provenance.vector_isa`): its main figures are an AVX-512 CPU's,
#: and a sentence after each gives an AVX2-only CPU's, where the same runs round otherwise.
FIGURE_CLASSES = ("avx512", "avx2")


def _figure_class(isa: str | None) -> str:
    """The class whose figures a CPU of class ``isa`` (default: this one's) is held to: its own,
    or the main (AVX-512) figures for a class the page does not give."""
    isa = vector_isa() if isa is None else isa
    return isa if isa in FIGURE_CLASSES else FIGURE_CLASSES[0]


def book_run_seed_counts(kind: str, isa: str | None = None) -> tuple[int, list[int]]:
    """What :data:`BOOK_RUNS_PAGE` says the book's run of ``kind`` gets over seeds 0–5 on a CPU
    of class ``isa`` (default: this one's, :func:`_figure_class`): ``(total, [exact sentences of
    seed 0, 1, ...])``, from its sentence "Over seeds 0–5 the run gets N of these 24 sentences
    exactly (seed by seed: a, b, ...)" after ``jax-attention train KIND --out``, or for AVX2
    "... gets N of the 24 sentences (seed by seed on AVX2: a, b, ...)"."""
    if _figure_class(isa) == "avx2":
        pattern = (r"gets\s+(\d+)\s+of\s+the\s+24\s+sentences\s+\(seed\s+by\s+seed\s+on\s+AVX2:\s+"
                   r"([\d, ]+)\)")
    else:
        pattern = (r"Over seeds 0–5 the run gets (\d+) of these 24 sentences exactly "
                   r"\(seed by seed: ([\d, ]+)\)")
    match = re.search(pattern, book_run_text(kind))
    assert match is not None, f"{BOOK_RUNS_PAGE} gives no seed-by-seed figures for {kind}"
    return int(match.group(1)), [int(count) for count in match.group(2).split(", ")]


def book_run_output_block(kind: str) -> tuple[str, str]:
    """Where :data:`BOOK_RUNS_PAGE` shows what the book's run of ``kind`` prints: ``(page, the
    phrase the text block follows)``, as :func:`tests.docs_support.block_after` takes them."""
    return BOOK_RUNS_PAGE, f"jax-attention train {kind} --out plots/"


def book_run_output(kind: str, isa: str | None = None) -> tuple[str, list[str]]:
    """What :data:`BOOK_RUNS_PAGE` says the book's run of ``kind`` prints with seed 0 on a CPU of
    class ``isa`` (default: this one's): ``(the loss as printed, the translation lines)``: its
    output block after "With seed 0 the first prints `loss X`", or on AVX2 that block with the
    third line and the loss its AVX2 sentence gives ("prints `loss X` and `LINE` as its third
    line")."""
    text = book_run_text(kind)
    loss = re.search(r"With seed 0 the first prints `loss ([0-9.]+)`", text).group(1)
    lines = block_after(*book_run_output_block(kind)).text.strip().splitlines()
    if _figure_class(isa) == "avx2":
        after = text[text.index("AVX2 and no"):]
        match = re.search(r"prints\s+`loss ([0-9.]+)`\s+and\s+`([^`]+)`\s+as\s+its\s+third\s+"
                          r"line", after)
        assert match is not None, f"{BOOK_RUNS_PAGE} gives no AVX2 output for {kind}"
        loss, lines[2] = match.group(1), match.group(2)
    return loss, lines
