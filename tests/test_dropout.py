"""The functional cores' dropout (:mod:`jax_attention.nn.dropout`): the masks' bits against the
NumPy reference, their rates, the independence of sites, positions and keys, reproducibility
from the key, and the checks."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_attention.nn import dropout as jd
from reference_numpy import dropout as nd

IMPLS = ("rbg", "threefry2x32")


def _data(key) -> np.ndarray:
    return np.asarray(jax.random.key_data(key))


def _binomial_bound(n: int, p: float, sigmas: float = 5.0) -> float:
    """``sigmas`` standard deviations of a binomial fraction of ``n`` trials at ``p``."""
    return sigmas * math.sqrt(p * (1 - p) / n)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("shape", [(7,), (64, 10, 32), (3, 4, 5, 6)])
def test_masks_are_the_numpy_reference_bits(impl, shape):
    key = jax.random.key(11, impl=impl)
    expected = nd.keep_mask(_data(key), 0.1, shape)
    np.testing.assert_array_equal(np.asarray(jd.keep_mask(key, 0.1, shape)), expected)
    np.testing.assert_array_equal(np.asarray(jax.jit(jd.keep_mask, static_argnums=(1, 2))(
        key, 0.1, shape)), expected)
    folded = jd.fold(key, 5)
    assert jax.random.key_impl(folded) == jax.random.key_impl(key)
    np.testing.assert_array_equal(_data(folded), nd.fold(_data(key), 5))
    assert int(jd.key_seed(key)) == int(nd.key_seed(_data(key)))


def test_raw_key_data_gives_the_typed_keys_masks():
    key = jax.random.key(2, impl="rbg")
    np.testing.assert_array_equal(jd.keep_mask(jax.random.key_data(key), 0.3, (5, 6)),
                                  jd.keep_mask(key, 0.3, (5, 6)))
    np.testing.assert_array_equal(jd.fold(jax.random.key_data(key), 1),
                                  jax.random.key_data(jd.fold(key, 1)))


@pytest.mark.parametrize("rate", [0.05, 0.1, 0.2, 0.5, 0.9])
def test_the_drop_rate(rate):
    """Over 2**20 elements the dropped fraction is within 5 binomial sigmas of ``rate``, and so
    is each of 64 columns' (no position is favoured)."""
    key = jax.random.key(0, impl="rbg")
    mask = np.asarray(jd.keep_mask(key, rate, (2 ** 14, 64)))
    dropped = 1.0 - mask.mean()
    assert abs(dropped - rate) < _binomial_bound(mask.size, rate)
    columns = 1.0 - mask.mean(axis=0)
    assert np.all(np.abs(columns - rate) < _binomial_bound(mask.shape[0], rate))
    assert keep_threshold_is_exact(rate)


def keep_threshold_is_exact(rate: float) -> bool:
    return abs(jd.keep_threshold(rate) / 2 ** 32 - rate) <= 2 ** -33


def test_sites_positions_and_keys_are_independent():
    """Pairs of bits that must be independent — two folds of a key, two keys, neighbouring
    elements, two steps of the model's stream — are both dropped ``rate**2`` of the time."""
    rate, shape = 0.5, (2 ** 12, 64)
    key = jax.random.key(7, impl="rbg")
    stream = jax.random.key(0, impl="rbg")
    pairs = {
        "folds": (jd.keep_mask(jd.fold(key, 0), rate, shape),
                  jd.keep_mask(jd.fold(key, 1), rate, shape)),
        "keys": (jd.keep_mask(jax.random.key(8, impl="rbg"), rate, shape),
                 jd.keep_mask(jax.random.key(9, impl="rbg"), rate, shape)),
        "steps": (jd.keep_mask(jax.random.fold_in(stream, 0), rate, shape),
                  jd.keep_mask(jax.random.fold_in(stream, 1), rate, shape)),
    }
    mask = np.asarray(jd.keep_mask(key, rate, shape))
    pairs["neighbours"] = (mask[:, :-1], mask[:, 1:])
    pairs["rows"] = (mask[:-1], mask[1:])
    for name, (a, b) in pairs.items():
        a, b = np.asarray(a), np.asarray(b)
        both = np.mean(~a & ~b)
        assert abs(both - rate ** 2) < _binomial_bound(a.size, rate ** 2), name
        assert not np.array_equal(a, b), name


def test_masks_are_reproducible_and_vmap_over_keys():
    def keys():
        return jnp.stack([jax.random.key_data(jax.random.key(i, impl="rbg")) for i in range(4)])

    batched = jax.vmap(lambda k: jd.keep_mask(k, 0.25, (10, 3)))(keys())
    for i in range(4):
        np.testing.assert_array_equal(batched[i], jd.keep_mask(keys()[i], 0.25, (10, 3)))
        np.testing.assert_array_equal(batched[i], jd.keep_mask(jax.random.key(i, impl="rbg"),
                                                               0.25, (10, 3)))


def test_dropout_scales_what_it_keeps_and_has_the_masks_gradient():
    x = jnp.arange(1.0, 61.0, dtype=jnp.float32).reshape(3, 4, 5)
    key = jax.random.key(1, impl="rbg")
    keep = np.asarray(jd.keep_mask(key, 0.2, x.shape))
    out = np.asarray(jd.dropout(x, 0.2, key))
    np.testing.assert_allclose(out, np.where(keep, np.asarray(x) / 0.8, 0.0), rtol=1e-7)
    np.testing.assert_allclose(out, nd.dropout(np.asarray(x), 0.2, _data(key)), rtol=1e-7)
    grad = jax.grad(lambda x: jnp.sum(jd.dropout(x, 0.2, key)))(x)
    np.testing.assert_allclose(np.asarray(grad), keep / np.float32(0.8), rtol=1e-7)
    assert jd.dropout(x, 0.2, None) is x and jd.dropout(x, 0.0, key) is x


def test_bad_keys_and_shapes_are_refused():
    with pytest.raises(TypeError, match="dropout_rng must be a jax.random key"):
        jd.keep_mask(jnp.zeros(2, jnp.int32), 0.1, (3,))
    with pytest.raises(ValueError, match="at most 2\\*\\*32 elements"):
        jd.keep_mask(jax.random.key(0, impl="rbg"), 0.1, (2 ** 17, 2 ** 16))


@pytest.mark.parametrize("shape, padded", [((2, 3, 4), (2, 7, 4)), ((2, 5, 3, 3), (2, 5, 6, 8)),
                                           ((4,), (9,)), ((3, 4), (3, 4))])
def test_a_padded_shape_gives_the_leading_corner_of_its_mask(shape, padded):
    """What lets a batch cut short of its padding train as the full-length one: the mask of
    ``shape`` within ``padded_shape`` is the full mask's corner, in JAX and in NumPy, and so is
    the dropout of the cut array."""
    key = jax.random.key(4, impl="rbg")
    corner = tuple(slice(0, n) for n in shape)
    full = np.asarray(jd.keep_mask(key, 0.3, padded))
    cut = np.asarray(jax.jit(jd.keep_mask, static_argnums=(1, 2, 3))(key, 0.3, shape, padded))
    assert cut.shape == shape
    np.testing.assert_array_equal(cut, full[corner])
    np.testing.assert_array_equal(nd.keep_mask(_data(key), 0.3, shape, padded), full[corner])
    x = jax.random.normal(jax.random.key(5), padded)
    np.testing.assert_array_equal(np.asarray(jd.dropout(x[corner], 0.3, key, padded)),
                                  np.asarray(jd.dropout(x, 0.3, key))[corner])
    np.testing.assert_allclose(nd.dropout(np.asarray(x[corner]), 0.3, _data(key), padded),
                               np.asarray(jd.dropout(x, 0.3, key))[corner], rtol=1e-6)


@pytest.mark.parametrize("module", [jd, nd], ids=["jax", "numpy"])
def test_a_padded_shape_shorter_or_of_another_rank_is_refused(module):
    key = np.asarray([0, 7], np.uint32)
    for padded in [(2, 2), (2, 3, 1), (3,)]:
        with pytest.raises(ValueError, match=r"padded_shape must have the rank of shape and no "
                                             r"shorter axis, got shape \(2, 3\)"):
            module.keep_mask(key, 0.1, (2, 3), padded)
    with pytest.raises(ValueError, match="at most 2\\*\\*32 elements"):
        module.keep_mask(key, 0.1, (2, 3), (2 ** 17, 2 ** 16))
