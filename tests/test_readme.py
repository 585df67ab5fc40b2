"""The documentation — README.md and every page under docs/ (tests/docs_support.py) — as a
reader finds it: its Python examples run as written (those that need PyTorch: in
tests/crossframework/test_readme_torch.py), its commands parse, every block is of a kind a test
checks, every file, module, link and page it names is there, and the layers it shows are those
tests/test_architecture.py enforces. Its output blocks are checked in
tests/test_readme_outputs.py."""

from __future__ import annotations

import ast
import re
import shlex
from pathlib import Path

import pytest

from tests.docs_support import DOCS, LANGUAGES, ROOT, blocks, pages, python_blocks, read

#: What each page's Python examples print (the zero row of a fully masked softmax); a page whose
#: examples print and is not listed here fails, so that nothing printed goes unchecked.
PRINTED = {
    "README.md": "[0.         0.         0.        ]",
    "docs/library.md": "[0.         0.         0.        ]",
}
EXAMPLE_PAGES = sorted({block.page for block in python_blocks(torch=False)})
#: The README stays a ten-minute read; everything else has a page under docs/.
README_MAX_LINES = 300


def test_the_documentation_has_python_examples():
    assert {"README.md", "docs/library.md", "docs/masking.md"} <= set(EXAMPLE_PAGES), EXAMPLE_PAGES


@pytest.mark.parametrize("page", EXAMPLE_PAGES)
def test_python_examples_run(page, capsys):
    for block in python_blocks(torch=False, page=page):
        exec(block.compile(), {})
    printed = capsys.readouterr().out
    if page in PRINTED:
        assert PRINTED[page] in printed
    else:
        assert printed == "", f"{page}'s examples print {printed!r}: check it in PRINTED"


def test_every_block_is_of_a_kind_a_test_checks():
    """A block in another language (``console``, ``bash``, ``pycon``) would be neither run nor
    compared: tests/docs_support.py says what each kind is held to."""
    unchecked = [f"{block.where} ```{block.language}" for block in blocks()
                 if block.language not in LANGUAGES]
    assert not unchecked, unchecked


def _jax_attention_commands() -> list[tuple[str, list[str]]]:
    """``(where, argv)`` of every ``jax-attention`` command of the ``sh`` blocks (after
    ``.venv/bin/`` or variable assignments; ``\\`` continues a line, ``#`` starts a comment)."""
    commands = []
    for block in blocks(language="sh"):
        for offset, line in enumerate(block.text.replace("\\\n", " \n").splitlines(), 1):
            words = shlex.split(line, comments=True)
            starts = [i for i, word in enumerate(words)
                      if word == "jax-attention" or word.endswith("/jax-attention")]
            if starts:
                argv = [word for word in words[starts[0] + 1:] if word != "&"]
                commands.append((f"{block.page}:{block.line + offset}", argv))
    return commands


def test_every_command_shown_parses():
    """The commands the documentation shows are the command's: each parses with its parser (a
    renamed or removed option fails here). Parsing does no work: handlers are not called."""
    from jax_attention.cli import build_parser

    commands = _jax_attention_commands()
    assert len(commands) >= 20, commands
    failed = []
    for where, argv in commands:
        try:
            build_parser().parse_args(argv)
        except SystemExit as exit_:
            failed.append(f"{where}: jax-attention {shlex.join(argv)} (exit {exit_.code})")
    assert not failed, failed


def test_readme_keeps_the_two_commands_and_stays_short():
    """The README opens with the two commands of a fresh clone, targets of the Makefile, and
    stays a ten-minute read."""
    assert len(read("README.md").splitlines()) <= README_MAX_LINES
    first = blocks("README.md", "sh")[0].text.splitlines()
    assert [line.partition("#")[0].strip() for line in first] == ["make run", "make test"]
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert re.search(r"^run: ", makefile, flags=re.M) and re.search(r"^test: ", makefile,
                                                                      flags=re.M)


#: The stems of files the text names that are not in the repository on purpose: those "Adding a
#: model" (docs/architecture.md) tells you to write for a model ``foo``, and the file you write
#: to check your own code (docs/conformance.md).
PLACEHOLDER_STEMS = {"foo", "test_foo", "my_attention"}
#: A path into the repository: under one of its top-level folders (a ``<stem>`` placeholder
#: ends it and is not checked); a bare file name of Python source (``registry.py``).
_PATH = re.compile(r"(?<![\w./<-])((?:jax_attention|reference_numpy|tests|scripts|docs|\.ci)/"
                   r"[\w./*-]*[\w*/])(?![<\w])")
_BARE_FILE = re.compile(r"(?<![\w./<-])(\w+\.py)\b")
_MODULE = re.compile(r"(?<![\w./])((?:jax_attention|reference_numpy)(?:\.\w+)+)")


def _top_level_names(path) -> set[str]:
    """Names a module defines or imports at its top, and those of its ``__all__`` and lazy
    re-exports (``_EXPORTS``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(target.id for target in targets if isinstance(target, ast.Name))
            if any(isinstance(t, ast.Name) and t.id in ("__all__", "_EXPORTS") for t in targets):
                names.update(ast.literal_eval(node.value))  # a list of names, or a dict of them
    return names


def _resolves(dotted: str) -> bool:
    """``jax_attention.nn.multihead`` names a module (file or package) of the tree, and
    ``jax_attention.runtime.export.load_model`` a name defined at the top of one."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:end])
        module = next((path for path in (base.with_suffix(".py"), base / "__init__.py")
                       if path.is_file()), None)
        if module is not None:
            rest = parts[end:]
            if not rest:
                return True
            # A name of the module; what follows it (an attribute of a class) is not checked.
            return rest[0] in _top_level_names(module)
    return False


def test_every_file_and_module_named_is_in_the_tree():
    """The text names files and modules as the tree has them (``jax_attention/models/registry.py``,
    ``jax_attention.nn.multihead``): no file that is gone, no module of an older layout."""
    sources = {path.name for folder in ("jax_attention", "reference_numpy", "tests", "scripts")
               for path in (ROOT / folder).rglob("*.py")}
    missing = []
    for page in pages():
        text = read(page)
        for path in _PATH.findall(text):
            if Path(path).stem not in PLACEHOLDER_STEMS and not any(ROOT.glob(path.rstrip("/"))):
                missing.append(f"{page}: {path}")
        for name in _BARE_FILE.findall(text):
            if Path(name).stem not in PLACEHOLDER_STEMS and name not in sources:
                missing.append(f"{page}: {name}")
        for dotted in _MODULE.findall(text):
            if not _resolves(dotted):
                missing.append(f"{page}: {dotted}")
    assert not missing, missing


def _slug(heading: str) -> str:
    """A heading's anchor, as Python-Markdown's ``toc`` (MkDocs) and GitHub make it for the
    headings here: lower case, punctuation but ``-`` and ``_`` dropped, spaces to ``-``."""
    text = re.sub(r"[^\w\s-]", "", heading.replace("`", "")).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def _anchors(page: str) -> set[str]:
    text = re.sub(r"^```.*?^```", "", read(page), flags=re.M | re.S)  # no headings in blocks
    return {_slug(heading) for heading in re.findall(r"^#+ (.+)$", text, flags=re.M)}


def test_every_link_between_pages_resolves():
    """Relative links point at files of the repository and at headings of their page."""
    broken = []
    for page in pages():
        text = re.sub(r"^```.*?^```", "", read(page), flags=re.M | re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+://", target):
                continue
            path, _, anchor = target.partition("#")
            linked = (ROOT / page).parent / path if path else ROOT / page
            if not linked.exists():
                broken.append(f"{page}: {target}")
            elif anchor and anchor not in _anchors(linked.relative_to(ROOT).as_posix()):
                broken.append(f"{page}: {target} (no such heading)")
    assert not broken, broken


def test_every_docs_page_is_linked_from_the_readme():
    """Every page at the top of docs/ (the site's home, docs/index.md, among them); the pages in
    its folders are reached through the site's tables of contents, which the docs build checks
    (a page in none fails it)."""
    readme = read("README.md")
    linked = {target.partition("#")[0] for target in re.findall(r"\]\(([^)\s]+)\)", readme)}
    unlinked = [page.relative_to(ROOT).as_posix() for page in sorted(DOCS.glob("*.md"))
                if page.relative_to(ROOT).as_posix() not in linked]
    assert not unlinked, unlinked


def test_the_layers_shown_are_those_enforced():
    """docs/architecture.md's table of rooms and what each imports is tests/test_architecture.py's
    ``LAYERS``, room for room."""
    from tests.test_architecture import LAYERS

    text = read("docs/architecture.md")
    table = text[text.index("| room | imports"):].split("\n\n")[0].splitlines()[2:]
    shown = {}
    for row in table:
        room, imports, _ = (cell.strip().strip("`") for cell in row.strip("|").split("|"))
        shown[room.removesuffix(".py")] = set() if imports == "nothing" else {
            name.strip().strip("`") for name in imports.split(",")}
    assert shown == LAYERS

