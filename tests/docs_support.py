"""The project's documentation as the tests read it: README.md and every Markdown page under
docs/, their fenced blocks, and the text around them. One place for every test that reads them.

Every page is held to the same rules, whichever page the text lives on:

- a ``python`` block runs as written (tests/test_readme.py; those that import PyTorch,
  tests/crossframework/test_readme_torch.py);
- a ``text`` block is a command's output, compared with what the command prints here by a test
  that names the page and the phrase before the block (tests/test_readme_outputs.py, and
  tests/crossframework/test_readme_outputs_torch.py for the report against PyTorch); a block no
  test reads fails tests/test_readme_outputs.py;
- an ``sh`` block holds commands: every ``jax-attention`` command in it parses with the
  command's own parser (tests/test_readme.py);
- a block without a language is a picture in words (a diagram, a tree);
- a ``{toctree}`` block is the site's table of contents (the docs build checks its entries);
- a block of any other language fails tests/test_readme.py: nothing checks it.

The tutorials and guides kept as MyST notebooks (:func:`notebooks`: pages whose front matter names
a Jupyter kernel) are not such pages: their code cells run in tests/test_tutorials.py and in the
docs build, which shows what they print. The pages the docs build generates (the folders of
:data:`GENERATED`) and its own files (``docs/_*``) are not read here either.

A test names the page that holds the text it checks (``"docs/models.md"``), so that text moved
to another page, or lost, fails the test rather than leaving it checking nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"

#: The languages a fenced block may have, and what checks it (see the module docstring).
LANGUAGES = {"python": "runs", "text": "is compared with its command's output",
             "sh": "its jax-attention commands parse", "": "a picture in words",
             "{toctree}": "the site's table of contents"}

#: The folders under docs/ the docs build writes (generated pages), not sources of these tests.
GENERATED = ("reference",)

# A fence opens at the start of a line, with its language, and closes at the start of a line.
_FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", flags=re.M | re.S)


#: The front matter of a MyST notebook of this project (jupytext's MyST format, the Python 3 kernel),
#: for the tests that write one.
NOTEBOOK_FRONT_MATTER = """---
jupytext:
  text_representation:
    extension: .md
    format_name: myst
kernelspec:
  display_name: Python 3
  language: python
  name: python3
---
"""


def is_notebook(path: Path) -> bool:
    """Whether a Markdown file is a MyST notebook (jupytext front matter naming a kernel)."""
    text = path.read_text(encoding="utf-8")
    return text.startswith("---\n") and "\nkernelspec:" in text.partition("\n---\n")[0]


def _source_pages() -> list[Path]:
    return sorted(path for path in DOCS.rglob("*.md")
                  if not any(part.startswith("_") or part in GENERATED
                             for part in path.relative_to(DOCS).parts[:-1]))


def notebooks() -> list[Path]:
    """The MyST notebooks under docs/ (tutorials, their translations, guides)."""
    return [path for path in _source_pages() if is_notebook(path)]


def documentation_files() -> list[Path]:
    """README.md and every Markdown page under docs/ (its folders included) but the notebooks
    and the generated pages."""
    return [README, *(path for path in _source_pages() if not is_notebook(path))]


def pages() -> list[str]:
    """The documentation files as paths from the repository's root (``"docs/models.md"``)."""
    return [path.relative_to(ROOT).as_posix() for path in documentation_files()]


def read(page: str) -> str:
    """The text of ``page`` (a path from the repository's root, such as ``"README.md"``)."""
    return (ROOT / page).read_text(encoding="utf-8")


@dataclass(frozen=True)
class Block:
    """A fenced block: its page, the line of its opening fence (1-based), language and text."""

    page: str
    line: int
    language: str
    text: str

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    def compile(self):
        """The block as code whose tracebacks name the page and its line numbers."""
        return compile("\n" * self.line + self.text, str(ROOT / self.page), "exec")


def blocks(page: str | None = None, language: str | None = None) -> list[Block]:
    """The fenced blocks of ``page`` (default: of every documentation file), in order; only
    those of ``language`` if given."""
    found = []
    for name in pages() if page is None else [page]:
        text = read(name)
        for match in _FENCE.finditer(text):
            block = Block(name, text.count("\n", 0, match.start()) + 1, match.group(1).strip(),
                          match.group(2))
            if language is None or block.language == language:
                found.append(block)
    return found


def python_blocks(*, torch: bool, page: str | None = None) -> list[Block]:
    """The ``python`` blocks that import PyTorch (``torch=True``) or do not."""
    return [block for block in blocks(page, "python")
            if bool(re.search(r"^import torch$", block.text, flags=re.M)) == torch]


def block_after(page: str, phrase: str, language: str = "text") -> Block:
    """The first block of ``language`` after the first ``phrase`` in ``page``."""
    text = read(page)
    start = text.index(phrase)  # ValueError: the page no longer says it
    line = text.count("\n", 0, start) + 1
    following = [block for block in blocks(page, language) if block.line > line]
    assert following, f"{page}: no {language} block after {phrase!r}"
    return following[0]
