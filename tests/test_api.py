"""The Python API a notebook user reaches for: top-level names, load_model, translate(beam=)."""

from __future__ import annotations

import importlib
import inspect

import pytest

import jax_attention

NEW_NAMES = {"load_model": "runtime.export", "show_heatmaps": "viz.plotting",
             "BahdanauSeq2Seq": "models.bahdanau", "TransformerSeq2Seq": "models.transformer",
             "train_bahdanau": "train.seq2seq", "train_transformer": "train.seq2seq",
             "train_seq2seq": "train.seq2seq"}


@pytest.mark.parametrize("name", sorted(NEW_NAMES))
def test_trainers_models_and_load_model_are_top_level(name):
    assert name in jax_attention.__all__ and name in dir(jax_attention)
    module = importlib.import_module(f"jax_attention.{NEW_NAMES[name]}")
    assert getattr(jax_attention, name) is getattr(module, name)


def test_every_top_level_name_is_the_library_object_of_its_module():
    """Each name of ``__all__`` (once) is the object its defining module of the library has under
    that name: no stale alias, no re-exported third-party object. (That each has a usage example
    is the test below.)"""
    assert len(set(jax_attention.__all__)) == len(jax_attention.__all__)
    for name in jax_attention.__all__:
        obj = getattr(jax_attention, name)
        assert obj.__module__.startswith("jax_attention"), (name, obj.__module__)
        assert getattr(importlib.import_module(obj.__module__), name) is obj, name


@pytest.fixture(scope="module")
def transformer_export(tiny_run):
    """The session's tiny Transformer export (2 heads, not the default 4)."""
    return tiny_run("transformer").model


def test_load_model_reads_kind_heads_and_sizes_and_translates(transformer_export):
    model = jax_attention.load_model(transformer_export)
    assert model.kind == "transformer"
    assert model.model_config.num_heads == 2  # not the default 4: read from the export
    results = model.translate(["i lost .", "go ."], beam=2)
    assert [r.source for r in results] == ["i lost .", "go ."]
    assert all(r.score is not None for r in results)  # beam search ran
    one = model.translate("go .")
    assert one.encoder_decoder.shape[1] == 2  # heads
    assert model.translate(["go ."], beam=2)[0].translation == results[1].translation
    assert model.translate(["go ."], beam_size=2, beam=2)[0].translation == results[1].translation
    with pytest.raises(ValueError, match="beam and beam_size"):
        model.translate(["go ."], beam=2, beam_size=3)


# Examples that need what a test run does not have (a trained export, a figure written to disk):
# their `>>>` lines are checked to be there, not run.
NOT_RUN = {"load_model", "show_heatmaps", "BahdanauSeq2Seq", "translation_view"}


@pytest.mark.parametrize("name", sorted(jax_attention.__all__))
def test_every_top_level_name_has_a_usage_example_that_runs(name):
    obj = getattr(jax_attention, name)
    assert ">>>" in inspect.getdoc(obj), f"{name}'s docstring has no usage example"
    if name in NOT_RUN:
        return
    import doctest

    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    module = importlib.import_module(f"jax_attention.{jax_attention._EXPORTS[name]}")
    globs = {**vars(module), "jax": jax, "jnp": jnp, "np": np, "nnx": nnx, name: obj}
    tests = doctest.DocTestFinder(recurse=False).find(obj, name, globs=globs)
    assert tests and any(t.examples for t in tests)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in tests:
        runner.run(test)
    assert runner.summarize(verbose=False).failed == 0
