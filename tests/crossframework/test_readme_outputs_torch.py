"""docs/conformance.md's report of ``jax-attention conformance --against torch`` is what the
command prints here, with PyTorch on one CPU thread and on two (machine lines and the
rounding-level digits of the errors left out: see tests/test_readme_outputs.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.docs_support import ROOT, block_after
from tests.test_readme_outputs import OUTPUTS, comparable

# The command with PyTorch's intra-op threads set first: its kernels may then split and sum
# their work in another order, which moves the last bits of a float64 error and nothing else.
_WITH_THREADS = ("import runpy, sys, torch; torch.set_num_threads(int(sys.argv.pop(1))); "
                 "runpy.run_module('jax_attention', run_name='__main__', alter_sys=True)")


@pytest.mark.parametrize("threads", [1, 2])
def test_the_conformance_report_against_torch_is_what_the_docs_show(threads):
    done = subprocess.run([sys.executable, "-c", _WITH_THREADS, str(threads), "conformance",
                           "--against", "torch"], cwd=ROOT, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr
    assert f"PyTorch on the CPU ({threads} thread" in done.stdout
    expected = block_after(*OUTPUTS["torch"]).text
    assert comparable(done.stdout) == comparable(expected)
