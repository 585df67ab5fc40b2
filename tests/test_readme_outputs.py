"""Every output block the README shows comes from running its command here and comparing, so
that it cannot go stale: the book runs of both models (seed 0: the loss and the four
translations; the session's shared book runs, which the pinned losses read too) and the
conformance report of the README's own ``my_attention.py``. The report
against PyTorch is checked in tests/crossframework/test_readme_outputs_torch.py.

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
from pathlib import Path

import pytest

from tests.shared_runs import readme_section, readme_seed_counts

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
#: Machine facts in a conformance header (left out of the comparison; see the module docstring).
MACHINE_LINES = ("  versions:", "  python:", "  numpy:", "  platform:  PyTorch on the CPU")


def text_blocks() -> list[tuple[int, str]]:
    """``(line number, text)`` of every ```text block of the README."""
    text = README.read_text(encoding="utf-8")
    return [(text.count("\n", 0, match.start()) + 1, match.group(1))
            for match in re.finditer(r"```text\n(.*?)```", text, flags=re.S)]


def block_after(phrase: str) -> str:
    """The first ```text block after ``phrase`` in the README."""
    text = README.read_text(encoding="utf-8")
    start = text.index(phrase)
    return re.search(r"```text\n(.*?)```", text[start:], flags=re.S).group(1)


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
    """A new output block in the README needs a test here (or in the torch twin)."""
    checked = ("go . => ", "conformance against torch", "conformance against my_attention")
    blocks = text_blocks()
    assert len(blocks) == 4, [line for line, _ in blocks]
    for line, block in blocks:
        assert any(block.startswith(start) for start in checked), f"README line {line}"


@pytest.mark.slow  # the whole book run: 200 or 250 epochs
@pytest.mark.parametrize("model", ["bahdanau", "transformer"])
def test_the_book_runs_print_what_the_readme_shows(model, book_run):
    """The session's book run of ``model`` (the README's command, seed 0;
    :meth:`tests.shared_runs.SharedRuns.book`) prints the README's loss and sentences."""
    loss = re.search(r"With seed 0 the first prints `loss ([0-9.]+)`",
                     readme_section(model)).group(1)
    expected = block_after(f"jax-attention train {model} --out plots/").strip().splitlines()
    printed = book_run(model).stdout.splitlines()
    assert any(line.startswith(f"loss {loss} ") for line in printed), printed
    assert [line for line in printed if " => " in line] == expected


@pytest.mark.parametrize("model", ["bahdanau", "transformer"])
def test_the_readme_figures_over_seeds_add_up(model):
    """The README's "Over seeds 0–5 ... N of these 24 (seed by seed: ...)": six figures that sum
    to N (each seed's figure is checked by the model's test module in the slow set: seed 0 on the
    shared book run, seeds 1–5 on their own, tests/test_bahdanau.py and
    tests/test_transformer.py)."""
    total, counts = readme_seed_counts(model)
    assert len(counts) == 6 and sum(counts) == total and all(0 <= c <= 4 for c in counts)


def test_the_conformance_report_of_my_attention_is_what_the_readme_shows(tmp_path):
    text = README.read_text(encoding="utf-8")
    example = text[:text.index("Saved as `my_attention.py`")]
    module = re.findall(r"```python\n(.*?)```", example, flags=re.S)[-1]
    (tmp_path / "my_attention.py").write_text(module, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "jax_attention", "conformance", "--against", "my_attention.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    expected = block_after("Saved as `my_attention.py`")
    # The module's path is printed as found; the README's reader ran it from its own folder.
    assert comparable(done.stdout.replace(f"{tmp_path}/", "")) == comparable(expected)
