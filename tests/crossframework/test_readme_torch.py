"""The documentation's Python examples that use PyTorch (README.md and the pages under docs/:
tests/docs_support.py) run as written."""

from __future__ import annotations

from tests.docs_support import python_blocks
from tests.torch_support import import_torch

import_torch()


def test_torch_examples_run(capsys):
    blocks = python_blocks(torch=True)
    assert blocks, "the documentation has no PyTorch example"
    for block in blocks:
        exec(block.compile(), {})
    # The interop example prints whether ours and the PyTorch mirror agree, then whether the
    # round trip is bit-exact.
    assert capsys.readouterr().out.split() == ["True", "True"]
