"""The package's shape, checked from its source (the README's "Architecture" section).

- no import cycle between the modules of ``jax_attention`` (imports inside functions count);
- no module imports another module's underscore names (``from m import _x`` or ``m._x``);
  private *modules* (``_checks``) are fine, their names are public within the package;
- no ``kind == "<model>"`` branch outside the model registry (``jax_attention.models``);
- no file over ~800 lines, except the mirror and data files named below;
- no function over ~80 lines of code (its docstring not counted; nested functions count
  towards the function that holds them);
- the repository is self-contained: every file of the repository that a test names
  (``tests/...``, ``docs/design.md``, ``README.md``) is in it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "jax_attention"
MAX_FILE_LINES = 800
MAX_FUNCTION_LINES = 80
# Files exempt from the length limit: the torch mirrors of every model (one class per JAX model,
# data-like), and the conformance kit's canonical case table.
LONG_FILES = {"interop/torch_models.py"}
# The registered model names: a comparison with one of them is a branch on a model's kind.
MODEL_NAMES = ("bahdanau", "transformer")
REGISTRY = "jax_attention.models"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _sources() -> dict[str, tuple[Path, ast.Module]]:
    return {_module_name(path): (path, ast.parse(path.read_text(encoding="utf-8")))
            for path in sorted(PACKAGE.rglob("*.py"))}


SOURCES = _sources()


def _is_package(name: str) -> bool:
    return SOURCES[name][0].name == "__init__.py"


def _resolve(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module if _is_package(module) else module.rpartition(".")[0]
    for _ in range(node.level - 1):
        base = base.rpartition(".")[0]
    return f"{base}.{node.module}" if node.module else base


def _imports(module: str, tree: ast.Module):
    """``(imported module, imported name or None, node)`` for every import in ``tree``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, None, node
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(module, node)
            for alias in node.names:
                yield source, alias.name, node


def _edges() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {name: set() for name in SOURCES}
    for module, (_, tree) in SOURCES.items():
        for source, name, _ in _imports(module, tree):
            target = f"{source}.{name}" if name and f"{source}.{name}" in SOURCES else source
            # Importing a module runs its parent packages first; those edges are Python's own.
            if target in SOURCES and not module.startswith(target + ".") and target != module:
                edges[module].add(target)
    return edges


def test_no_import_cycle():
    edges = _edges()
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_no_private_names_across_modules():
    found = []
    for module, (path, tree) in SOURCES.items():
        module_aliases = {}
        for source, name, node in _imports(module, tree):
            if name is None:
                continue
            is_module = f"{source}.{name}" in SOURCES  # a private module is fine
            if (name.startswith("_") and not name.startswith("__") and source != module
                    and not is_module):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: "
                             f"from {source} import {name}")
            if f"{source}.{name}" in SOURCES:
                module_aliases[name] = f"{source}.{name}"
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    module_aliases[alias.asname or alias.name.split(".")[0]] = alias.name
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                    and not node.attr.startswith("__") and isinstance(node.value, ast.Name)
                    and node.value.id in module_aliases
                    and module_aliases[node.value.id].startswith("jax_attention")):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: "
                             f"{node.value.id}.{node.attr}")
    assert not found, "underscore names used across modules:\n" + "\n".join(found)


def _is_model_name(node) -> bool:
    if isinstance(node, ast.Constant):
        return node.value in MODEL_NAMES
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_is_model_name(element) for element in node.elts)
    return False


def test_no_branch_on_a_model_name_outside_the_registry():
    found = []
    for module, (path, tree) in SOURCES.items():
        if module == REGISTRY:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare) and any(
                    _is_model_name(operand) for operand in [node.left, *node.comparators]):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    assert not found, "branches on a model's name (look it up in jax_attention.models):\n" + \
        "\n".join(found)


def test_file_lengths():
    long = {str(path.relative_to(PACKAGE)): len(path.read_text(encoding="utf-8").splitlines())
            for path, _ in SOURCES.values()}
    over = {name: n for name, n in long.items()
            if n > MAX_FILE_LINES and name not in LONG_FILES}
    assert not over, f"files over {MAX_FILE_LINES} lines: {over}"


def _code_lines(node) -> int:
    body = node.body
    first = body[0]
    if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
            and isinstance(first.value.value, str)):
        if len(body) == 1:
            return 1
        first = body[1]
    return node.end_lineno - first.lineno + 1


def test_function_lengths():
    over = []
    for path, tree in SOURCES.values():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = _code_lines(node)
                if lines > MAX_FUNCTION_LINES:
                    over.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} "
                                f"{node.name}: {lines} lines")
    assert not over, f"functions over {MAX_FUNCTION_LINES} lines of code:\n" + "\n".join(over)


@pytest.mark.parametrize("module", ["jax_attention.cli", "jax_attention.conformance.runner"])
def test_checker_sees_real_modules(module):
    """The checks above walk the real package (guards against an empty walk)."""
    assert module in SOURCES or f"{module}.__init__" in SOURCES or any(
        name.startswith(module) for name in SOURCES)


#: A path into the repository in a test's text: under one of its top-level folders (``*`` a glob),
#: or a bare Markdown file name (``README.md``), which lives at the top.
_REPOSITORY_PATH = re.compile(
    r"(?<![\w./<-])((?:tests|docs|jax_attention|reference_numpy|scripts|\.ci)/[\w./*-]*[\w*])")
_TOP_MARKDOWN = re.compile(r"(?<![\w./-])([A-Z][\w-]*\.md)\b")


def test_every_file_a_test_names_is_in_the_repository():
    root = PACKAGE.parent
    missing = []
    for test_file in sorted((root / "tests").rglob("*.py")):
        text = test_file.read_text(encoding="utf-8")
        for name in (*_REPOSITORY_PATH.findall(text), *_TOP_MARKDOWN.findall(text)):
            if not any(root.glob(name)):
                missing.append(f"{test_file.relative_to(root)}: {name}")
    assert not missing, missing
