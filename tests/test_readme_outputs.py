"""Every output block the documentation shows (README.md and the pages under docs/:
tests/docs_support.py) comes from running its command here and comparing, so that it cannot go
stale: the book runs of both models (docs/models.md; seed 0: the loss and the four translations;
the session's shared book runs, which the pinned losses read too) and the conformance report of
the example ``my_attention.py`` (docs/conformance.md). The report against PyTorch
(docs/conformance.md) is checked in tests/crossframework/test_readme_outputs_torch.py. An output
block that none of these reads fails :func:`test_every_text_block_is_checked_by_a_test`.

Lines that describe the machine rather than the command's result (library versions, Python,
NumPy, the CPU threads of PyTorch) are left out of the comparison: they differ between machines
and say nothing about the outputs. So are the rounding-level digits of a conformance row's errors
(a float64 error of 1e-16 moves with the CPU, the BLAS kernel it picks and the threads): a row is
compared by its case, function, implementation, tolerance and status — the status is the
command's verdict that every entry is within the tolerance — and its two errors only as finite,
non-negative numbers below what the tolerance allows at most (:func:`comparable`).
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.docs_support import block_after, blocks, read
from tests.shared_runs import (FIGURE_CLASSES, book_run_output, book_run_output_block,
                               book_run_seed_counts)

#: Machine facts in a conformance header (left out of the comparison; see the module docstring).
MACHINE_LINES = ("  versions:", "  python:", "  numpy:", "  platform:  PyTorch on the CPU")
#: Every output block of the documentation, as the test that checks it finds it: its page and
#: the phrase before it (:func:`tests.docs_support.block_after`).
OUTPUTS = {
    "bahdanau": book_run_output_block("bahdanau"),
    "transformer": book_run_output_block("transformer"),
    "my_attention": ("docs/conformance.md", "Saved as `my_attention.py`"),
    "torch": ("docs/conformance.md", "<details><summary>Against PyTorch"),  # the torch twin
}


#: A conformance report's row: case, function, implementation, the two errors, tolerance, status.
# The implementation's name may hold spaces ("torch.nn.functional.linear + scaled_dot_product_
# attention"): the errors are the first columns that are a number or "-".
_ROW = re.compile(r"(?P<what>\S+ +\S+ +\S.*?) +(?P<abs>-|\d\S*) +(?P<rel>-|\d\S*) +"
                  r"(?P<tolerance>rtol (?P<rtol>\S+) atol (?P<atol>\S+)) +(?P<status>\S.*)")


def comparable(block: str) -> list[str]:
    """``block``'s lines without the machine lines, each conformance row as ``what | tolerance |
    status``: its errors checked here instead, as finite and non-negative (``-`` for ``n/a``),
    and (a ``PASS``) as small as its tolerance allows — the absolute error at most ``atol +
    rtol`` times the largest reference entry, which the cases keep below 100."""
    lines = []
    for line in block.strip("\n").splitlines():
        if line.startswith(MACHINE_LINES):
            continue
        row = _ROW.fullmatch(line.rstrip())
        if row is None:
            lines.append(line.rstrip())
            continue
        if row["status"].startswith("n/a"):  # not run: no errors
            assert (row["abs"], row["rel"]) == ("-", "-"), line
        else:
            errors = float(row["abs"]), float(row["rel"])
            assert all(0 <= error < float("inf") for error in errors), line
            if row["status"].startswith("PASS"):
                assert errors[0] <= float(row["atol"]) + 100 * float(row["rtol"]), line
        lines.append(f"{' '.join(row['what'].split())} | {row['tolerance']} | {row['status']}")
    return lines


def test_every_text_block_is_checked_by_a_test():
    """A new output block in the README or a docs page needs a test here (or in the torch
    twin): every block is one that a test of :data:`OUTPUTS` reads."""
    checked = ("go . => ", "conformance against torch", "conformance against my_attention")
    found = blocks(language="text")
    assert len(found) == 4, [block.where for block in found]
    for block in found:
        assert any(block.text.startswith(start) for start in checked), block.where
    read_by_tests = {block_after(*where).where for where in OUTPUTS.values()}
    assert read_by_tests == {block.where for block in found}


@pytest.mark.slow  # the whole book run: 200 or 250 epochs
@pytest.mark.parametrize("model", ["bahdanau", "transformer"])
def test_the_book_runs_print_what_the_readme_shows(model, book_run):
    """The session's book run of ``model`` (docs/models.md's command, seed 0;
    :meth:`tests.shared_runs.SharedRuns.book`) prints the loss and sentences docs/models.md
    shows (its output block, or on an AVX2-only CPU the lines its AVX2 sentence gives)."""
    loss, expected = book_run_output(model)  # this CPU's class's (AVX-512 or AVX2)
    printed = book_run(model).stdout.splitlines()
    assert any(line.startswith(f"loss {loss} ") for line in printed), printed
    assert [line for line in printed if " => " in line] == expected


@pytest.mark.parametrize("model", ["bahdanau", "transformer"])
def test_the_figures_over_seeds_add_up(model):
    """docs/models.md's "Over seeds 0–5 ... N of these 24 (seed by seed: ...)": six figures that
    sum to N (each seed's figure is checked by the model's test module in the slow set: seed 0 on the
    shared book run, seeds 1–5 on their own, tests/test_bahdanau.py and
    tests/test_transformer.py)."""
    for isa in FIGURE_CLASSES:
        total, counts = book_run_seed_counts(model, isa)
        assert len(counts) == 6 and sum(counts) == total and all(0 <= c <= 4 for c in counts)
    # Each class's output: the main block, or its third line and loss replaced (AVX2).
    main_loss, main_lines = book_run_output(model, "avx512")
    avx2_loss, avx2_lines = book_run_output(model, "avx2")
    assert main_lines[:2] + main_lines[3:] == avx2_lines[:2] + avx2_lines[3:]
    assert re.fullmatch(r"0\.0\d\d", main_loss) and re.fullmatch(r"0\.0\d\d", avx2_loss)


def test_the_conformance_report_of_my_attention_is_what_the_docs_show(tmp_path):
    page, phrase = OUTPUTS["my_attention"]
    text = read(page)
    example = text[:text.index(phrase)]
    module = re.findall(r"```python\n(.*?)```", example, flags=re.S)[-1]
    (tmp_path / "my_attention.py").write_text(module, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "jax_attention", "conformance", "--against", "my_attention.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    expected = block_after(page, phrase).text
    # The module's path is printed as found; the page's reader ran it from its own folder.
    assert comparable(done.stdout.replace(f"{tmp_path}/", "")) == comparable(expected)
