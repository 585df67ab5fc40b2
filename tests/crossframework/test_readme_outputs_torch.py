"""The README's report of ``jax-attention conformance --against torch`` is what the command
prints here (machine lines left out: see tests/test_readme_outputs.py)."""

from __future__ import annotations

import subprocess
import sys

from tests.test_readme_outputs import ROOT, block_after, comparable


def test_the_conformance_report_against_torch_is_what_the_readme_shows():
    done = subprocess.run([sys.executable, "-m", "jax_attention", "conformance", "--against",
                           "torch"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    expected = block_after("<details><summary>Against PyTorch")
    assert comparable(done.stdout) == comparable(expected)
