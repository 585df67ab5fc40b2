"""The README's Python examples that use PyTorch run as written."""

from __future__ import annotations

from tests.test_readme import README, readme_python_blocks
from tests.torch_support import import_torch

import_torch()


def test_readme_torch_examples_run(capsys):
    blocks = readme_python_blocks(torch=True)
    assert blocks, "README has no PyTorch example"
    for block in blocks:
        exec(compile(block, str(README), "exec"), {})
    # The interop example prints whether ours and the PyTorch mirror agree, then whether the
    # round trip is bit-exact.
    assert capsys.readouterr().out.split() == ["True", "True"]
