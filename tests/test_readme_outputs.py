"""Every output block the README shows comes from running its command here and comparing, so
that it cannot go stale: the book runs of both models (seed 0: the loss and the four
translations) and the conformance report of the README's own ``my_attention.py``. The report
against PyTorch is checked in tests/crossframework/test_readme_outputs_torch.py.

Lines that describe the machine rather than the command's result (library versions, Python,
NumPy, the CPU threads of PyTorch) are left out of the comparison: they differ between machines
and say nothing about the outputs.
"""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
import sys
from pathlib import Path

import pytest

from jax_attention import data
from jax_attention.cli import main

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


def comparable(block: str) -> list[str]:
    return [line.rstrip() for line in block.strip("\n").splitlines()
            if not line.startswith(MACHINE_LINES)]


def test_every_text_block_is_checked_by_a_test():
    """A new output block in the README needs a test here (or in the torch twin)."""
    checked = ("go . => ", "conformance against torch", "conformance against my_attention")
    blocks = text_blocks()
    assert len(blocks) == 4, [line for line, _ in blocks]
    for line, block in blocks:
        assert any(block.startswith(start) for start in checked), f"README line {line}"


@pytest.mark.parametrize("model", ["bahdanau", "transformer"])
def test_the_book_runs_print_what_the_readme_shows(model, tmp_path):
    text = README.read_text(encoding="utf-8")
    section = text[text.index(f"jax-attention train {model} --out plots/"):]
    loss = re.search(r"With seed 0 the first prints `loss ([0-9.]+)`", section).group(1)
    expected = block_after(f"jax-attention train {model} --out plots/").strip().splitlines()
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        status = main(["train", model, "--data", str(data.find_data()), "--no-progress",
                       "--checkpoint", str(tmp_path / "model")])
    assert status == 0
    printed = out.getvalue().splitlines()
    assert any(line.startswith(f"loss {loss} ") for line in printed), printed
    assert [line for line in printed if " => " in line] == expected


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
