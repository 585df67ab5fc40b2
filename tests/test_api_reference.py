"""The API reference of the docs site covers every public name, with text: every name of every
public module's ``__all__`` (``jax_attention``, its modules, ``reference_numpy``) has a docstring or
a doc comment, and the generated pages document it at its home and link it from the others.

The docs build fails on the same problems (docs/_ext/jax_attention_docs.py); this test says so
without building the site.
"""

from __future__ import annotations

import re
import sys

import pytest

from tests.docs_support import DOCS

sys.path.insert(0, str(DOCS / "_ext"))
import api_reference  # noqa: E402


@pytest.fixture(scope="module")
def names():
    return api_reference.public_names()


def test_every_public_name_is_documented(names):
    problems = api_reference.undocumented(names)
    assert not problems, "public names missing from the API reference:\n" + "\n".join(problems)


def test_the_packages_and_their_rooms_are_covered(names):
    modules = {entry.module for entry in names}
    assert {"jax_attention", "jax_attention.nn.masking", "jax_attention.nn.multihead",
            "jax_attention.models.transformer", "reference_numpy.masking",
            "reference_numpy.transformer"} <= modules
    assert len(names) > 500
    top = {entry.name for entry in names if entry.module == "jax_attention"}
    import jax_attention
    assert top == set(jax_attention.__all__)


def test_each_name_is_on_its_pages(names, tmp_path):
    """Every name is documented on its home's page (an autodoc directive) and linked from the page
    of every other module that lists it."""
    pages = {path.stem: path.read_text(encoding="utf-8")
             for path in api_reference.write_pages(tmp_path)}
    assert "index" in pages
    missing = []
    for entry in names:
        page = pages[entry.module]
        if entry.kind == "module":
            found = f"<{entry.target}>`" in page
        elif entry.module == entry.home:
            found = re.search(rf"^\.\. auto\w+:: {re.escape(entry.target)}$", page, flags=re.M)
        else:
            found = f"`{entry.name} <{entry.target}>`" in page
        if not found:
            missing.append(f"{entry.module}: {entry.name}")
    assert not missing, missing
    linked = set(re.findall(r"\]\(([\w.]+)\.md\)", pages["index"]))
    assert linked == set(pages) - {"index"}


def test_a_name_without_a_docstring_is_reported(monkeypatch):
    """What the build and the test above would say of a public function whose docstring is gone."""
    from jax_attention.nn import masking

    monkeypatch.setattr(masking.masked_softmax, "__doc__", None)
    assert "jax_attention.nn.masking.masked_softmax: no docstring" in api_reference.undocumented()


def test_every_module_shows_the_parameters_it_is_called_with(names):
    """A Flax NNX module's metaclass calls ``__init__`` through ``__call__(*args, **kwargs)``:
    the reference gives each such class its constructor's signature instead (parameters,
    defaults, keyword-only options), and leaves the other classes alone."""
    import importlib
    import inspect

    from flax import nnx

    classes = {getattr(importlib.import_module(entry.home), entry.name) for entry in names
               if entry.kind == "class" and entry.module == entry.home}
    modules = {cls for cls in classes if issubclass(cls, nnx.Module)}
    assert len(modules) >= 20
    assert all(inspect.signature(cls).parameters.keys() >= {"args", "kwargs"} for cls in modules)
    fixed = api_reference.show_constructors(names)
    try:
        assert {f"{cls.__module__}.{cls.__name__}" for cls in modules} <= set(fixed)
        for cls in modules:
            parameters = inspect.signature(cls).parameters
            assert not {"self", "args", "kwargs"} & parameters.keys(), (cls, parameters)
        from jax_attention.nn.multihead import MultiHeadAttention

        signature = inspect.signature(MultiHeadAttention).parameters
        assert repr(signature["dropout"].default) == "0.0"
        assert repr(signature["param_dtype"].default) == "jnp.float32"  # as the source writes it
        assert signature["sow_weights"].kind is inspect.Parameter.KEYWORD_ONLY
        assert all(api_reference.constructor_signature(cls) is None for cls in classes - modules
                   if type(cls).__call__ is type.__call__)
    finally:
        for cls in modules:
            if "__signature__" in vars(cls):
                del cls.__signature__


def test_the_index_counts_the_names_of_each_module(names, tmp_path):
    index = {path.stem: path for path in api_reference.write_pages(tmp_path)}["index"]
    text = index.read_text(encoding="utf-8")
    top = re.search(r"^- \[jax_attention\]\(jax_attention\.md\) — (.*)$", text, flags=re.M)
    import jax_attention
    assert top.group(1) == f"{len(jax_attention.__all__)} re-exported from their modules"
    assert re.search(r"^- \[jax_attention\.nn\.masking\]\(jax_attention\.nn\.masking\.md\) — "
                     r"\d+ names$", text, flags=re.M)
