"""The API reference, generated from the code: which names are public, where each is documented,
which lack documentation, and the pages that document them.

A *public name* is one listed in the ``__all__`` of a public module of ``jax_attention`` or
``reference_numpy`` (a module none of whose path components starts with ``_``). Many names are
listed by more than one module (a package re-exports its modules' names); each is documented once,
at its *home* — the module that defines it — and the other modules' pages link there.

A name is *documented* when its home page documents it with text: a function or a class needs a
docstring of its own (a dataclass's generated ``Name(field, ...)`` does not count), a constant a
Sphinx doc comment (``#: ...`` above its assignment). :func:`undocumented` lists those that are
not; the docs build fails on them (the extension ``jax_attention_docs``) and so does
tests/test_api_reference.py.
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import pkgutil
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

from sphinx.pycode import ModuleAnalyzer

#: The packages the reference covers, in the order of the reference's index.
PACKAGES = ("jax_attention", "reference_numpy")

#: The folder of generated pages, under the docs source folder.
FOLDER = Path("reference") / "api"

#: How the index groups the modules of ``jax_attention``: a room (the package folder) and what it holds.
ROOMS = {
    "jax_attention": "The names most used, re-exported at the top of the package",
    "jax_attention.nn": "The attention maths: one module per book section",
    "jax_attention.models": "The book's models, their configs and the registry of model kinds",
    "jax_attention.data": "The English–French data",
    "jax_attention.train": "The optax trainers",
    "jax_attention.runtime": "Checkpoints, Ctrl-C, devices, compilation cache, export",
    "jax_attention.viz": "Figures",
    "jax_attention.cli": "The jax-attention command",
    "jax_attention.bench": "Benchmarks against the peers",
    "jax_attention.conformance": "The conformance kit",
    "jax_attention.interop": "Converters to and from PyTorch",
    "jax_attention.params": "Parameter pytrees",
    "reference_numpy": "The float64 NumPy references",
}


@dataclass(frozen=True)
class PublicName:
    """One entry of a public module's ``__all__``: where it is listed and where it is documented."""

    module: str
    name: str
    home: str
    kind: str  # "function", "class", "exception", "data" or "module"

    @property
    def target(self) -> str:
        """The dotted path the reference documents it under."""
        return self.home if self.kind == "module" else f"{self.home}.{self.name}"


def public_modules() -> list[str]:
    """Every public module of the packages that has an ``__all__``, in import order."""
    found = []
    for package_name in PACKAGES:
        package = importlib.import_module(package_name)
        names = [package_name] + [info.name for info in pkgutil.walk_packages(package.__path__,
                                                                              package_name + ".")]
        for name in names:
            if any(part.startswith("_") for part in name.split(".")):
                continue
            if getattr(importlib.import_module(name), "__all__", None) is not None:
                found.append(name)
    return found


def _kind(value) -> str:
    if inspect.ismodule(value):
        return "module"
    if inspect.isclass(value):
        return "exception" if issubclass(value, BaseException) else "class"
    if inspect.isroutine(value) or (callable(value) and hasattr(value, "__wrapped__")):
        return "function"  # functions, and what jax.jit or functools.cache wrap them into
    return "data"


@functools.cache
def _assigned(module: str) -> frozenset[str]:
    """The module-level names a module's source assigns (its own constants)."""
    tree = ast.parse(inspect.getsource(importlib.import_module(module)))
    names = set()
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else (
            [node.target] if isinstance(node, ast.AnnAssign) else [])
        names.update(target.id for target in targets if isinstance(target, ast.Name))
    return frozenset(names)


def _home(name: str, value, kind: str, listed_by: list[str], modules: list[str]) -> str:
    if kind == "module":
        return value.__name__
    if kind != "data":
        defining = getattr(value, "__module__", None)
        if defining in modules and name in importlib.import_module(defining).__all__:
            return defining
    else:
        for module in listed_by:  # the entry's own module first
            if name in _assigned(module):
                return module
    # Defined in a private module: documented where the deepest public module lists it.
    return max(sorted(listed_by), key=lambda module: module.count("."))


def public_names() -> list[PublicName]:
    """Every (module, name) pair of the public modules' ``__all__``, with its home."""
    modules = public_modules()
    listed: dict[int, list[str]] = {}
    entries = []
    for module in modules:
        for name in importlib.import_module(module).__all__:
            value = getattr(importlib.import_module(module), name)
            listed.setdefault(id(value) if _kind(value) != "data" else hash((name, id(value))),
                              []).append(module)
            entries.append((module, name, value))
    result = []
    for module, name, value in entries:
        kind = _kind(value)
        listed_by = listed[id(value) if kind != "data" else hash((name, id(value)))]
        listed_by = [module, *(other for other in listed_by if other != module)]
        result.append(PublicName(module, name, _home(name, value, kind, listed_by, modules), kind))
    return result


def _has_docstring(value) -> bool:
    doc = value.__doc__ if isinstance(value.__doc__, str) else ""
    generated = re.match(re.escape(getattr(value, "__name__", "")) + r"\(", doc)
    return bool(doc.strip()) and not generated


def undocumented(names: list[PublicName] | None = None) -> list[str]:
    """The public names documented nowhere, each as ``"home.name: why"``; empty when all are."""
    problems = []
    names = public_names() if names is None else names
    for entry in sorted({entry for entry in names if entry.module == entry.home},
                        key=lambda entry: entry.target):
        value = getattr(importlib.import_module(entry.home), entry.name)
        if entry.kind == "data":
            docs = ModuleAnalyzer.for_module(entry.home).find_attr_docs()
            if not any(line.strip() for line in docs.get(("", entry.name), [])):
                problems.append(f"{entry.target}: no doc comment ('#: ...' above its assignment)")
        elif entry.kind != "module" and not _has_docstring(value):
            problems.append(f"{entry.target}: no docstring")
    return problems


_DIRECTIVE = {"function": "autofunction", "class": "autoclass", "exception": "autoexception",
              "data": "autodata"}


def _directive(entry: PublicName) -> str:
    lines = [f".. {_DIRECTIVE[entry.kind]}:: {entry.target}"]
    if entry.kind in ("class", "exception"):
        lines += ["   :members:", "   :special-members: __call__", "   :show-inheritance:"]
    elif entry.kind == "data":
        value = getattr(importlib.import_module(entry.home), entry.name)
        if len(repr(value)) > 120:
            lines.append("   :no-value:")
    return "\n".join(lines)


def module_page(module: str, names: list[PublicName]) -> str:
    """The MyST page of one module: its docstring, its own names in ``__all__`` order, then links
    to the names it re-exports."""
    own = [entry for entry in names if entry.module == module and entry.home == module]
    other = [entry for entry in names if entry.module == module and entry.home != module]
    text = [f"# {module}", "", "```{eval-rst}", f".. automodule:: {module}", "   :no-members:", ""]
    text += [_directive(entry) + "\n" for entry in own]
    text += ["```", ""]
    if other:
        text += ["## Re-exported here", "", "Documented in the module that defines them:", ""]
        role = {"module": "mod", "function": "func", "class": "class", "exception": "exc",
                "data": "data"}
        text += [f"- {{py:{role[entry.kind]}}}`{entry.name} <{entry.target}>`" for entry in other]
        text.append("")
    return "\n".join(text)


def index_page(modules: list[str], names: list[PublicName]) -> str:
    """The reference's index: the modules by room, with how many names each documents."""
    intro = ("Generated from the docstrings: every name of every public module's `__all__`, of "
             "`jax_attention` and of `reference_numpy`, each documented in the module that defines "
             "it (the others link there). `[source]` beside a name opens its code at its line.")
    text = ["# API reference", "", intro, ""]
    toctree = []
    # A module belongs to the longest room it is in; the top of the package holds only itself.
    rooms = {module: max((room for room in ROOMS if module == room or (
        module.startswith(room + ".") and room != PACKAGES[0])), key=len) for module in modules}
    for room, summary in ROOMS.items():
        members = [module for module in modules if rooms[module] == room]
        if not members:
            continue
        text += [f"## {room}", "", summary + ".", ""]
        for module in members:
            own = sum(1 for entry in names if entry.module == module and entry.home == module)
            other = sum(1 for entry in names if entry.module == module and entry.home != module)
            counts = [f"{own} names"] if own else []
            counts += [f"{other} re-exported from their modules"] if other else []
            text.append(f"- [{module}]({module}.md) — {', '.join(counts)}")
            toctree.append(module)
        text.append("")
    text += ["```{toctree}", ":hidden:", "", *toctree, "```", ""]
    return "\n".join(text)


class _Written:
    """A default value shown as its source reads (``jnp.float32``, not ``<class ...>``)."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _as_written(function, signature: inspect.Signature) -> inspect.Signature:
    """``signature`` with each default as the source of ``function`` writes it (what autodoc's
    ``autodoc_preserve_defaults`` shows for a function); as it is when the source cannot be read."""
    try:
        source = textwrap.dedent(inspect.getsource(function))
    except (OSError, TypeError):
        return signature
    definition = ast.parse(source).body[0]
    arguments = definition.args
    positional = arguments.posonlyargs + arguments.args
    written = dict(zip([a.arg for a in positional[len(positional) - len(arguments.defaults):]],
                       arguments.defaults))
    written.update((a.arg, d) for a, d in zip(arguments.kwonlyargs, arguments.kw_defaults) if d)
    return signature.replace(parameters=[
        parameter.replace(default=_Written(ast.get_source_segment(source, written[parameter.name])))
        if parameter.name in written else parameter
        for parameter in signature.parameters.values()])


def constructor_signature(cls) -> inspect.Signature | None:
    """The signature a class is called with, from its ``__init__`` (``self`` left out), for a class
    whose metaclass takes over the call: a Flax NNX module (``nnx.Module``'s metaclass calls
    ``__init__`` through ``__call__(*args, **kwargs)``, which is all that Sphinx and
    :func:`inspect.signature` see); no parameters for one that defines no ``__init__``. ``None``
    for a class whose metaclass does not take over the call."""
    if type(cls).__call__ is type.__call__:
        return None
    if cls.__init__ is object.__init__:  # an abstract base: called with no arguments
        return inspect.Signature()
    signature = _as_written(cls.__init__, inspect.signature(cls.__init__))
    return signature.replace(parameters=list(signature.parameters.values())[1:])


def show_constructors(names: list[PublicName]) -> list[str]:
    """Give each public class whose metaclass hides its constructor (:func:`constructor_signature`)
    that signature as ``__signature__``, which autodoc and :func:`inspect.signature` read, so that
    its page shows the parameters and defaults it is called with; returns those classes' names."""
    fixed = []
    for entry in names:
        if entry.kind not in ("class", "exception") or entry.module != entry.home:
            continue
        cls = getattr(importlib.import_module(entry.home), entry.name)
        signature = constructor_signature(cls)
        if signature is not None and "__signature__" not in vars(cls):
            cls.__signature__ = signature
            fixed.append(entry.target)
    return fixed


def write_pages(srcdir: Path, names: list[PublicName] | None = None) -> list[Path]:
    """Write the index and one page per module under ``srcdir / FOLDER`` (``names``: those of
    :func:`public_names`, computed when not given); pages whose text is unchanged are left alone
    (so that Sphinx does not re-read them). Returns the pages."""
    folder = srcdir / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    modules = public_modules()
    names = public_names() if names is None else names
    pages = {folder / "index.md": index_page(modules, names)}
    pages.update({folder / f"{module}.md": module_page(module, names) for module in modules})
    for stale in set(folder.glob("*.md")) - set(pages):
        stale.unlink()
    for path, text in pages.items():
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
    return sorted(pages)
