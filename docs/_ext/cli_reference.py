"""The command-line reference, generated from the parsers: every ``jax-attention`` command and the
text its ``--help`` prints, at a fixed width so that the page and the terminal agree.

tests/test_cli_reference.py runs each ``jax-attention ... --help`` in a real process with the same
width and compares what it prints with :func:`help_text`.
"""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path
from unittest import mock

#: The terminal width the reference's help texts are formatted for (argparse reads ``COLUMNS``).
COLUMNS = 100

#: The generated page, under the docs source folder.
PAGE = Path("reference") / "cli.md"


def commands() -> list[tuple[str, ...]]:
    """Every command path, the command itself first (``()``), then in ``--help`` order."""
    from jax_attention.cli import build_parser  # noqa: F401  (registers the commands)
    from jax_attention.cli.registry import COMMANDS

    return [(), *COMMANDS]


def help_text(path: tuple[str, ...]) -> str:
    """What ``jax-attention PATH --help`` prints, formatted ``COLUMNS`` wide."""
    from jax_attention.cli import build_parser

    out = io.StringIO()
    with mock.patch.dict(os.environ, {"COLUMNS": str(COLUMNS)}), \
            contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        build_parser().parse_args([*path, "--help"])
    return out.getvalue()


def page() -> str:
    """The MyST page: one section per command with its help text."""
    from jax_attention.cli.arguments import PROG

    intro = (f"Every `{PROG}` command and what its `--help` prints, generated from the command's "
             "own parsers when the site is built (and compared with the real `--help` by the "
             "tests). Exit statuses and what a run keeps on Ctrl-C: [Long runs](../long-runs.md).")
    text = ["# Command-line reference", "", intro, ""]
    for path in commands():
        title = " ".join((PROG, *path))
        text += [f"## {title}", "", "```text", help_text(path).rstrip("\n"), "```", ""]
    return "\n".join(text)


def write_page(srcdir: Path) -> Path:
    """Write the page under ``srcdir`` unless its text is unchanged; returns its path."""
    path = srcdir / PAGE
    path.parent.mkdir(parents=True, exist_ok=True)
    text = page()
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")
    return path
