"""Randomness (reliability): dropout masks across calls, modes and seeds; missing keys; typed keys.

For every module that draws dropout masks — the Bahdanau and Transformer seq2seq models,
multi-head, dot-product and additive attention, the positional encoding:

* two successive training-mode calls draw different masks from the same ``nnx.Rngs`` stream;
* the same seeds give the same sequence of masks, other seeds other masks;
* evaluation mode (``module.eval()``) and ``deterministic=True`` are identical call after call,
  and equal to the model without dropout;
* a module that needs a dropout key and has none raises an error that names what is missing.

The whole suite runs with JAX's key-reuse checker on (``tests/conftest.py``), so every test that
draws dropout masks also checks that no key is drawn from twice, in the library and in the tests;
the last tests here check that the checker is on and that no legacy ``uint32`` key is left.

Dropout keys are ``"rbg"`` keys, as in training: threefry's mask kernels take seconds to compile
on CPU.
"""

from __future__ import annotations

import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jax_attention.models import bahdanau, transformer

from jax_attention.nn import multihead, positional, scoring

B, T, D, V = 2, 4, 8, 8  # batch, steps, width, vocabulary
RATE = 0.5


def _rngs(params=0, dropout=1):
    return nnx.Rngs(params=params, dropout=jax.random.key(dropout, impl="rbg"))


def _inputs():
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, V, (B, T)), jnp.int32)
    lens = jnp.asarray([T, 2], jnp.int32)
    X = jnp.asarray(rng.normal(size=(B, T, D)), jnp.float32)
    return tokens, lens, X


# name -> (build(dropout, rngs) -> module, arguments of its call)
MODULES = {
    "bahdanau": (lambda rate, rngs: bahdanau.BahdanauSeq2Seq(V, V, D, D, 2, rate, rngs=rngs),
                 lambda tokens, lens, X: (tokens, lens, tokens)),
    "transformer": (lambda rate, rngs: transformer.TransformerSeq2Seq(V, V, D, 16, 2, 1, rate,
                                                                      rngs=rngs),
                    lambda tokens, lens, X: (tokens, lens, tokens)),
    "multihead": (lambda rate, rngs: multihead.MultiHeadAttention(D, 2, rate, rngs=rngs),
                  lambda tokens, lens, X: (X, X, X, lens)),
    "dot_product": (lambda rate, rngs: scoring.DotProductAttention(rate, rngs=rngs),
                    lambda tokens, lens, X: (X, X, X, lens)),
    "additive": (lambda rate, rngs: scoring.AdditiveAttention(D, D, 4, rate, rngs=rngs),
                 lambda tokens, lens, X: (X, X, X, lens)),
    "positional_encoding": (lambda rate, rngs: positional.PositionalEncoding(D, rate, rngs=rngs),
                            lambda tokens, lens, X: (X,)),
}
# The modules whose call takes `deterministic=` and `rngs=` (flax's nnx.Dropout inside); the
# seq2seq models follow their mode only and draw from the stream they were built with.
NNX_DROPOUT = ("multihead", "dot_product", "additive", "positional_encoding")


@nnx.jit
def _call(module, *args):
    return module(*args)


def _build(name, rate=RATE, rngs=None):
    build, arguments = MODULES[name]
    return build(rate, _rngs() if rngs is None else rngs), arguments(*_inputs())


@pytest.mark.parametrize("name", MODULES)
def test_training_calls_draw_new_masks_and_seeds_reproduce_them(name):
    module, args = _build(name)
    first, second = _call(module, *args), _call(module, *args)
    assert not np.allclose(first, second), "the same mask twice"
    # The same seeds: the same parameters and the same masks, call after call.
    twin, _ = _build(name)
    np.testing.assert_array_equal(_call(twin, *args), first)
    np.testing.assert_array_equal(_call(twin, *args), second)
    # Another dropout seed (same parameters): other masks.
    other, _ = _build(name, rngs=_rngs(dropout=2))
    assert not np.allclose(_call(other, *args), first)


@pytest.mark.parametrize("name", MODULES)
def test_evaluation_is_deterministic_and_equals_no_dropout(name):
    module, args = _build(name)
    without_dropout, _ = _build(name, rate=0.0)  # the same parameters (same params seed)
    expected = _call(without_dropout, *args)
    module.eval()
    first, second = _call(module, *args), _call(module, *args)
    np.testing.assert_array_equal(first, second)
    np.testing.assert_allclose(first, expected, rtol=1e-6, atol=1e-6)
    module.train()
    assert not np.allclose(_call(module, *args), expected)  # training mode drops again
    if name in NNX_DROPOUT:  # deterministic=True wins over training mode, call after call
        deterministic = nnx.jit(lambda module, *args: module(*args, deterministic=True))
        np.testing.assert_array_equal(deterministic(module, *args), first)
        np.testing.assert_array_equal(deterministic(module, *args), first)


@pytest.mark.parametrize("name", MODULES)
def test_a_missing_dropout_stream_is_named(name):
    build, _ = MODULES[name]
    # nnx.Rngs(params=...) alone has no 'dropout' stream (a bare seed, nnx.Rngs(0), serves both).
    with pytest.raises((KeyError, AttributeError), match="No RngStream named 'dropout'"):
        build(RATE, nnx.Rngs(params=0))
    # Without dropout no stream is needed, in training mode too (nnx.Dropout alone would fork
    # one from any rngs it gets, whatever its rate).
    module, args = _build(name, rate=0.0, rngs=nnx.Rngs(params=0))
    assert np.isfinite(_call(module, *args)).all()


@pytest.mark.parametrize("name", ["dot_product", "positional_encoding"])
def test_a_missing_dropout_key_at_call_time_is_named(name):
    """The parameter-free modules may be built without ``rngs`` and given them per call."""
    module = MODULES[name][0](RATE, None)
    args = MODULES[name][1](*_inputs())
    with pytest.raises(ValueError, match=r"`deterministic` is False, but no `rngs` argument"):
        module(*args)
    with pytest.raises(KeyError, match="No RngStream named 'dropout'"):
        module(*args, rngs=nnx.Rngs(params=1))
    # Given at call time, the keys work, and evaluation needs none.
    assert np.isfinite(module(*args, rngs=nnx.Rngs(dropout=jax.random.key(3, impl="rbg")))).all()
    module.eval()
    assert np.isfinite(module(*args)).all()


def test_the_key_reuse_checker_is_on():
    assert jax.config.jax_debug_key_reuse
    key = jax.random.key(0)
    jax.random.normal(key)
    with pytest.raises(jax.errors.KeyReuseError):
        jax.random.normal(key)
    # Splitting or folding in, the library's way to get several keys, is not a reuse.
    key = jax.random.key(1)
    first, second = jax.random.split(key)
    jax.random.normal(first), jax.random.normal(second)
    base = jax.random.key(2)
    jax.random.normal(jax.random.fold_in(base, 0)), jax.random.normal(jax.random.fold_in(base, 1))


def test_every_key_is_a_typed_key():
    """No legacy ``uint32`` key in the package, the reference, the tests or the scripts: the
    checker only tracks typed keys (``jax.random.key``)."""
    root = Path(__file__).resolve().parents[1]
    legacy = re.compile(r"\bPRNG" + r"Key\(")  # split, so that this file does not match itself
    found = [f"{path.relative_to(root)}:{number}"
             for folder in ("jax_attention", "reference_numpy", "tests", "scripts")
             for path in sorted((root / folder).rglob("*.py"))
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if legacy.search(line)]
    assert not found, f"legacy PRNG keys (use jax.random.key): {found}"
