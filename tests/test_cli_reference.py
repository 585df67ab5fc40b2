"""The command-line reference of the docs site (generated from the parsers by
docs/_ext/cli_reference.py) is what ``jax-attention ... --help`` prints, command by command."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.docs_support import DOCS

sys.path.insert(0, str(DOCS / "_ext"))
import cli_reference  # noqa: E402

COMMANDS = cli_reference.commands()


def test_every_command_is_in_the_page():
    page = cli_reference.page()
    assert len(COMMANDS) > 10
    for path in COMMANDS:
        assert f"## {' '.join(('jax-attention', *path))}\n" in page
        assert cli_reference.help_text(path).rstrip("\n") in page


@pytest.mark.parametrize("path", COMMANDS, ids=lambda path: " ".join(path) or "jax-attention")
def test_the_page_shows_what_help_prints(path):
    env = {**os.environ, "COLUMNS": str(cli_reference.COLUMNS)}
    shown = subprocess.run([sys.executable, "-m", "jax_attention", *path, "--help"], env=env,
                           capture_output=True, text=True, check=True, timeout=120)
    assert shown.stdout == cli_reference.help_text(path)
