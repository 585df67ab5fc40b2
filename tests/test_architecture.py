"""The package's shape, checked from its source (README.md, "Architecture"; docs/architecture.md).

- no import cycle between the modules of ``jax_attention`` (imports inside functions count);
- no module imports another module's underscore names (``from m import _x`` or ``m._x``);
  private *modules* (``_checks``) are fine, their names are public within the package;
- no ``kind == "<model>"`` branch outside the model registry (``jax_attention.models.registry``);
- no file over ~800 lines, except the mirror and data files named below;
- no function over 60 lines of code (its docstring not counted; nested functions count
  towards the function that holds them);
- the folders are layers (``LAYERS``): a room imports only the rooms below it — the maths
  (``nn``) nothing of models, data, runtime, training, the command or the benchmarks; the models
  nothing of runtime, training, the command or the benchmarks; and so on up;
- every module of :mod:`reference_numpy` mirrors one of ``jax_attention/nn`` or
  ``jax_attention/models`` by name;
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
MAX_FUNCTION_LINES = 60
# Files exempt from the length limit: the torch mirrors of every model (one class per JAX model,
# data-like), and the conformance kit's canonical case table.
LONG_FILES = {"interop/torch_models.py"}
# The registered model names: a comparison with one of them is a branch on a model's kind.
MODEL_NAMES = ("bahdanau", "transformer")
REGISTRY = "jax_attention.models.registry"
REFERENCE = PACKAGE.parent / "reference_numpy"

#: The modules at the package's top, below every room: the validators, the atomic file writes, the
#: parameter-dict paths, and the package itself (whose lazy re-exports are names, not imports).
BASE_MODULES = {"jax_attention", "jax_attention._checks", "jax_attention._files",
                "jax_attention.params"}
#: The rooms (folders) of the package and the rooms each may import, its own aside. Read bottom
#: up: the maths (``nn``), the data pipeline, figures (``viz``) and the PyTorch mirrors
#: (``interop``) stand on the base alone; the models on the maths; the runtime (checkpoints,
#: export, Ctrl-C) on the models; training on the runtime; the command and the benchmarks on top.
LAYERS = {
    "base": set(),
    "nn": {"base"},
    "data": {"base"},
    "viz": {"base"},
    "interop": {"base"},
    "models": {"base", "nn", "data", "viz", "interop"},
    "runtime": {"base", "nn", "data", "models"},
    "conformance": {"base", "nn", "models", "interop"},
    "train": {"base", "nn", "data", "viz", "models", "runtime"},
    "bench": {"base", "nn", "data", "interop", "models", "runtime", "train"},
    "cli": {"base", "nn", "data", "viz", "interop", "models", "runtime", "conformance", "train",
            "bench"},
    "__main__": {"base", "runtime", "cli"},
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _sources() -> dict[str, tuple[Path, ast.Module]]:
    return {_module_name(path): (path, ast.parse(path.read_text(encoding="utf-8")))
            for path in sorted(PACKAGE.rglob("*.py"))}


SOURCES = _sources()


def _resolve(module: str, node: ast.ImportFrom, sources=SOURCES) -> str:
    if not node.level:
        return node.module or ""
    base = module if sources[module][0].name == "__init__.py" else module.rpartition(".")[0]
    for _ in range(node.level - 1):
        base = base.rpartition(".")[0]
    return f"{base}.{node.module}" if node.module else base


def _imports(module: str, tree: ast.Module, sources=SOURCES):
    """``(imported module, imported name or None, node)`` for every import in ``tree``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, None, node
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(module, node, sources)
            for alias in node.names:
                yield source, alias.name, node


def _edges(sources=SOURCES) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {name: set() for name in sources}
    for module, (_, tree) in sources.items():
        for source, name, _ in _imports(module, tree, sources):
            target = f"{source}.{name}" if name and f"{source}.{name}" in sources else source
            # Importing a module runs its parent packages first; those edges are Python's own.
            if target in sources and not module.startswith(target + ".") and target != module:
                edges[module].add(target)
    return edges


def _room(module: str) -> str:
    """The room (``LAYERS``' key) of a module of the package."""
    if module in BASE_MODULES:
        return "base"
    room = module.split(".")[1]
    if room not in LAYERS:
        raise AssertionError(f"{module} is in no room of LAYERS: give it a folder, or add the "
                             "folder to the map with the rooms it may import")
    return room


def layering_violations(sources=SOURCES) -> list[str]:
    """Every import of a module from a room its own room may not import (``LAYERS``)."""
    found = []
    for module, targets in _edges(sources).items():
        for target in sorted(targets):
            room, other = _room(module), _room(target)
            if other != room and other not in LAYERS[room]:
                found.append(f"{module} ({room}) imports {target} ({other})")
    return found


def test_layering():
    assert not layering_violations(), (
        "imports across the layers (tests/test_architecture.py LAYERS):\n"
        + "\n".join(layering_violations()))


def _planted(**modules: str) -> dict[str, tuple[Path, ast.Module]]:
    """A package of ``modules`` (dotted name → source) to plant a violation in."""
    return {name: (Path(name.replace(".", "/") + ".py"), ast.parse(source))
            for name, source in modules.items()}


def test_layering_catches_a_planted_violation():
    """The maths importing a model (inside a function, too) and the models importing training are
    caught; the models importing the maths, the allowed direction, is not."""
    planted = _planted(**{
        "jax_attention.nn.scoring": "def f():\n    from jax_attention.models import transformer\n",
        "jax_attention.models.transformer": "from jax_attention.nn import scoring\n",
        "jax_attention.models.bahdanau": "import jax_attention.train.loop\n",
        "jax_attention.train.loop": "", "jax_attention.train": "",
        "jax_attention.models": "", "jax_attention.nn": ""})
    assert layering_violations(planted) == [
        "jax_attention.nn.scoring (nn) imports jax_attention.models.transformer (models)",
        "jax_attention.models.bahdanau (models) imports jax_attention.train.loop (train)"]


def test_every_folder_is_a_room():
    folders = {path.name for path in PACKAGE.iterdir()
               if path.is_dir() and (path / "__init__.py").exists()}
    assert folders == set(LAYERS) - {"base", "__main__"}


def test_reference_numpy_mirrors_the_maths_and_the_models():
    mirrored = {path.stem for room in ("nn", "models") for path in (PACKAGE / room).glob("*.py")}
    references = {path.stem for path in REFERENCE.glob("*.py")} - {"__init__", "_checks"}
    assert references and references <= mirrored, references - mirrored


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
    assert not found, "branches on a model's name (look it up in jax_attention.models.registry):\n" + \
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


def long_functions(sources=SOURCES) -> list[str]:
    """Every function with more than ``MAX_FUNCTION_LINES`` lines of code."""
    over = []
    for path, tree in sources.values():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = _code_lines(node)
                if lines > MAX_FUNCTION_LINES:
                    over.append(f"{path}:{node.lineno} {node.name}: {lines} lines")
    return over


def test_function_lengths():
    over = long_functions()
    assert not over, f"functions over {MAX_FUNCTION_LINES} lines of code:\n" + "\n".join(over)


def test_function_lengths_catch_a_planted_long_function():
    """One line of code past the limit is caught, the docstring not counted; the limit itself is
    allowed."""
    def body(lines):
        return "".join(f"    x{i} = {i}\n" for i in range(lines))
    planted = _planted(**{
        "jax_attention.nn.long": f'def f():\n    """Doc."""\n{body(MAX_FUNCTION_LINES + 1)}',
        "jax_attention.nn.short": f'def g():\n    """Doc."""\n{body(MAX_FUNCTION_LINES)}'})
    assert long_functions(planted) == [
        f"{Path('jax_attention/nn') / 'long.py'}:1 f: {MAX_FUNCTION_LINES + 1} lines"]


#: The modules that compute attention's softmax and its pooling product: the masked softmax
#: (``softmax_where``, ``logsumexp_where``), the scoring functions and the memory-efficient kernel.
#: Everything else — models, multi-head attention, training — calls them (the conformance targets
#: and the benchmarks' peers call other libraries' attention, which is what they compare).
ATTENTION_CORE = {"jax_attention.nn.core", "jax_attention.nn.masking", "jax_attention.nn.scoring",
                  "jax_attention.nn.efficient"}
#: What computing them looks like in the source: JAX's exponential, softmax or log-sum-exp (a
#: log-softmax over a vocabulary is the models' own, and so is ``math.exp`` of a score), and the
#: pooling product's einsum string (or the constant that names it). The PyTorch mirrors
#: (``interop``) are another framework's models.
_CORE_MATHS = {"jnp.exp", "jax.numpy.exp", "jax.nn.softmax", "nn.softmax",
               "jax.scipy.special.logsumexp", "jax.nn.logsumexp", "lax.exp"}
_POOLING = "...ts,...sv->...tv"


def maths_outside_the_core(sources=SOURCES) -> list[str]:
    """``path:line what`` for each softmax, exponential or pooling product computed outside
    :data:`ATTENTION_CORE`."""
    found = []
    for module, (path, tree) in sources.items():
        if module in ATTENTION_CORE or module.startswith(("jax_attention.conformance",
                                                          "jax_attention.bench",
                                                          "jax_attention.interop")):
            continue
        for node in ast.walk(tree):
            what = None
            if isinstance(node, ast.Attribute) and ast.unparse(node) in _CORE_MATHS:
                what = ast.unparse(node)
            elif isinstance(node, ast.Constant) and node.value == _POOLING:
                what = repr(_POOLING)
            elif isinstance(node, ast.Name) and node.id == "WEIGHTED_SUM":
                what = "WEIGHTED_SUM"
            if what is not None:
                found.append(f"{path}:{node.lineno} {what}")
    return found


def test_the_attention_maths_stays_in_the_core():
    """Only the core computes the softmax and the pooling product (a variant is a mask or a
    score function, not one more softmax)."""
    found = maths_outside_the_core()
    assert not found, "attention maths outside the core:\n" + "\n".join(found)


def test_maths_outside_the_core_is_caught():
    planted = _planted(**{
        "jax_attention.models.leaky": "import jax.numpy as jnp\n"
                                      "def f(s, v):\n    w = jnp.exp(s)\n"
                                      "    return jnp.einsum('...ts,...sv->...tv', w, v)\n",
        "jax_attention.nn.masking": "import jax.numpy as jnp\ndef g(s):\n    return jnp.exp(s)\n"})
    assert maths_outside_the_core(planted) == [
        f"{Path('jax_attention/models') / 'leaky.py'}:3 jnp.exp",
        f"{Path('jax_attention/models') / 'leaky.py'}:4 {_POOLING!r}"]


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
