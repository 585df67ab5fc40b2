"""The README's Python examples run as written (those that need PyTorch: in
tests/crossframework/test_readme_torch.py)."""

from __future__ import annotations

import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def readme_python_blocks(*, torch: bool) -> list[str]:
    """The README's ```python blocks that import PyTorch (``torch=True``) or do not."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    return [block for block in blocks
            if bool(re.search(r"^import torch$", block, flags=re.M)) == torch]


def test_readme_python_examples_run(capsys):
    blocks = readme_python_blocks(torch=False)
    assert blocks, "README has no Python example"
    for block in blocks:
        exec(compile(block, str(README), "exec"), {})
    printed = capsys.readouterr().out
    assert "[0.         0.         0.        ]" in printed
