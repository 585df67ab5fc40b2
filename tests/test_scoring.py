"""Properties of JAX additive and scaled dot-product attention (d2l §11.3) and their NNX modules.

jit and no-jit (chex variants), shapes with the docs/design.md letters, vmap, gradients against
finite differences, fully masked rows in every float dtype, NaN/Inf in masked positions, hypothesis
properties against the NumPy reference, bad input (JAX and NumPy alike), sown weights and dropout.
"""

from __future__ import annotations

import math
import re

import chex
import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized
from flax import nnx
from jax.test_util import check_grads

from jax_attention.nn import core as jax_core
from jax_attention.nn import efficient
from jax_attention.nn import masking as jax_masking
from jax_attention.nn import scoring as jax_scoring
from reference_numpy import scoring as np_scoring
from tests.hypothesis_support import examples, sizes

# H: query/key size for dot product (the per-head size); D: value size and additive key size.
DIMS = chex.Dimensions(B=2, N=2, T=3, S=5, H=4, D=6)
HIDDENS = 7  # additive hidden size h
KINDS = ("dot", "additive")


def _device(array, dtype=None):
    """``array`` as a JAX array of ``dtype``, cast by NumPy: ``jnp.asarray`` would compile a
    conversion program for every new shape and dtype, ``jax.device_put`` compiles nothing."""
    return jax.device_put(np.asarray(array, dtype))


def _normal(shape, dtype=jnp.float32, seed=0):
    return _device(np.random.default_rng(seed).normal(size=shape), dtype)


def _inputs(kind, batch="B", dtype=jnp.float32):
    """(queries, keys, values); additive keys are wider than its queries, which it must allow."""
    key_letters = "SH" if kind == "dot" else "SD"
    return (
        _normal(DIMS[batch + "TH"], dtype, 1),
        _normal(DIMS[batch + key_letters], dtype, 2),
        _normal(DIMS[batch + "SD"], dtype, 3),
    )


def _params(dtype=jnp.float32, seed=4):
    return {
        "W_q": _normal((DIMS.H, HIDDENS), dtype, seed),
        "W_k": _normal((DIMS.D, HIDDENS), dtype, seed + 1),
        "w_v": _normal((HIDDENS, 1), dtype, seed + 2),
    }


def _attention(kind, params=None):
    """The functional attention of ``kind`` as ``f(queries, keys, values, valid_lens, **kw)``."""
    if kind == "dot":
        return jax_scoring.dot_product_attention
    params = _params() if params is None else params
    return lambda *args, **kw: jax_scoring.additive_attention(params, *args, **kw)


def _lens(values):
    return _device(values, np.int32)


def _keep_from_lens(lens, num_queries, num_keys):
    lens = np.asarray(lens)
    if lens.ndim == 1:
        lens = np.repeat(lens[:, None], num_queries, axis=1)
    return np.arange(num_keys) < lens[..., None]


def _assert_weights_valid(weights, keep):
    """Masked weights exactly 0; rows sum to 1, or exactly 0 when fully masked."""
    weights = np.asarray(weights, np.float64)
    keep = np.broadcast_to(np.asarray(keep), weights.shape)
    assert (weights[~keep] == 0).all()
    sums = weights.sum(axis=-1)
    np.testing.assert_allclose(sums, keep.any(axis=-1).astype(np.float64), rtol=1e-6, atol=1e-6)
    assert (sums[~keep.any(axis=-1)] == 0).all()


def _all_finite(tree):
    return all(np.isfinite(np.asarray(leaf).astype(np.float32)).all() for leaf in jax.tree.leaves(tree))


# --------------------------------------------------------------------------- jit and no jit


class ScoringVariantsTest(chex.TestCase):
    """Lengths and masks are arguments, so under jit they are traced like in a training step."""

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.product(kind=KINDS, lens=[(2, 5), ((0, 1, 3), (5, 2, 4))])
    def test_shapes_and_weights(self, kind, lens):
        queries, keys, values = _inputs(kind)
        output, weights = self.variant(_attention(kind))(queries, keys, values, _lens(lens))
        chex.assert_shape(output, DIMS["BTD"])
        chex.assert_shape(weights, DIMS["BTS"])
        chex.assert_type([output, weights], jnp.float32)
        _assert_weights_valid(weights, _keep_from_lens(lens, DIMS.T, DIMS.S))

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.product(kind=KINDS, lens=[(3, 1), ((0, 1, 3), (5, 2, 4))])
    def test_heads(self, kind, lens):
        queries, keys, values = _inputs(kind, batch="BN")
        output, weights = self.variant(_attention(kind))(queries, keys, values, _lens(lens))
        chex.assert_shape(output, DIMS["BNTD"])
        chex.assert_shape(weights, DIMS["BNTS"])
        _assert_weights_valid(weights, _keep_from_lens(lens, DIMS.T, DIMS.S)[:, None])

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.product(kind=KINDS)
    def test_mask_and_causal(self, kind):
        queries, keys, values = _inputs(kind)
        mask = _device(np.random.default_rng(5).random((DIMS.B, 1, DIMS.S)) < 0.7)
        lens = _lens((4, 2))

        def fn(q, k, v, lens, mask):
            return _attention(kind)(q, k, v, lens, mask=mask, is_causal=True)

        output, weights = self.variant(fn)(queries, keys, values, lens, mask)
        chex.assert_equal_shape_prefix([output, weights, queries], 2)
        causal = np.arange(DIMS.S)[None, :] <= np.arange(DIMS.T)[:, None]
        keep = _keep_from_lens(lens, DIMS.T, DIMS.S) & np.asarray(mask) & causal
        _assert_weights_valid(weights, keep)

    # Eager too in half precision: op by op, every intermediate is rounded to the dtype, which a
    # compiled program may keep in float32.
    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.product(kind=KINDS, dtype=[jnp.float32, jnp.bfloat16, jnp.float16])
    def test_fully_masked_rows(self, kind, dtype):
        queries, keys, values = _inputs(kind, dtype=dtype)
        params = _params()
        # Batch element 0 has valid length 0; row 0 of batch element 1 has an all-False mask row.
        lens = _lens((0, 5))
        empty = np.zeros(DIMS["BT"], bool)
        empty[0] = empty[1, 0] = True
        mask = np.ones(DIMS["BTS"], bool)
        mask[1, 0] = False
        mask = _device(mask)

        def fn(q, k, v, p, lens, mask):
            # The gradient of sum(output) w.r.t. queries, keys, values and parameters, from the
            # same forward pass (vjp with cotangent 1 on the output, 0 on the weights).
            (output, weights), vjp = jax.vjp(
                lambda *a: _attention(kind, a[3])(*a[:3], lens, mask=mask), q, k, v, p
            )
            return output, weights, vjp((jnp.ones_like(output), jnp.zeros_like(weights)))

        output, weights, grads = self.variant(fn)(queries, keys, values, params, lens, mask)
        chex.assert_type([output, weights], dtype)
        output, weights = (np.asarray(a).astype(np.float32) for a in (output, weights))
        assert (weights[empty] == 0).all()
        assert (output[empty] == 0).all()
        assert np.isfinite(output).all()
        # The other rows still sum to 1 in the output dtype (normalised in float32, then rounded).
        sums = weights.sum(-1)[~empty]
        np.testing.assert_allclose(sums, np.ones_like(sums), atol=2e-2)
        assert _all_finite(grads)

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.product(kind=KINDS, how=["lens", "mask"])
    def test_nan_and_inf_in_masked_positions_do_not_leak(self, kind, how):
        queries, keys, values = _inputs(kind)
        if how == "lens":
            # Keys/values 2.. of batch 0 are padding; query 2 of batch 0 attends nothing.
            lens, mask = _lens(((2, 2, 0), (5, 3, 4))), None
            dirty_keys, dirty_rows = (0, slice(2, None)), (0, 2)
        else:
            mask = np.ones((DIMS.B, 1, DIMS.S), bool)
            mask[1, 0, 1:3] = False
            mask = np.broadcast_to(mask, DIMS["BTS"]).copy()
            mask[1, 0] = False
            mask = _device(mask)
            lens, dirty_keys, dirty_rows = None, (1, slice(1, 3)), (1, 0)

        def poison(array, index, first, rest):
            # NaN and +-Inf side by side: each breaks a different shortcut (0 * x, x - x, max).
            array = np.array(array)
            size = array[index].shape[-1]
            array[index] = np.where(np.arange(size) < size // 2, first, rest)
            return _device(array)

        dirty = (
            poison(queries, dirty_rows, np.nan, np.inf),
            poison(keys, dirty_keys, np.inf, np.nan),
            poison(values, dirty_keys, -np.inf, np.nan),
        )
        valid_rows = np.ones(DIMS["BT"], bool)
        valid_rows[dirty_rows] = False
        row_weights = _device(np.broadcast_to(valid_rows[..., None], DIMS["BTD"]), np.float32)

        def fn(q, k, v, p, lens, mask):
            # Gradients of the sum of the valid rows' outputs (vjp: one forward pass for both).
            (output, weights), vjp = jax.vjp(
                lambda *a: _attention(kind, a[3])(*a[:3], lens, mask=mask), q, k, v, p
            )
            return (output, weights), vjp((row_weights, jnp.zeros_like(weights)))

        params = _params()
        (clean_out, clean_w), clean_grads = self.variant(fn)(queries, keys, values, params, lens, mask)
        (dirty_out, dirty_w), dirty_grads = self.variant(fn)(*dirty, params, lens, mask)
        np.testing.assert_array_equal(np.asarray(dirty_out)[valid_rows], np.asarray(clean_out)[valid_rows])
        np.testing.assert_array_equal(np.asarray(dirty_w), np.asarray(clean_w))
        assert (np.asarray(dirty_out)[~valid_rows] == 0).all()
        assert _all_finite(dirty_grads)
        chex.assert_trees_all_equal(dirty_grads, clean_grads)

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.product(kind=KINDS)
    def test_identical_keys_give_the_mean_of_valid_values(self, kind):
        # Equal scores for every key: the weights are uniform over the valid keys (d2l §11.3.3's
        # observation), so the output is the plain mean of the valid values.
        queries, keys, values = _inputs(kind)
        keys = _device(np.broadcast_to(np.asarray(keys)[:, :1], keys.shape))
        lens = _lens((2, 5))
        output, weights = self.variant(_attention(kind))(queries, keys, values, lens)
        values, weights = np.asarray(values), np.asarray(weights)
        expected = np.stack([values[0, :2].mean(0), values[1].mean(0)])
        np.testing.assert_allclose(
            np.asarray(output), np.broadcast_to(expected[:, None], DIMS["BTD"]), rtol=1e-5, atol=1e-6
        )
        np.testing.assert_allclose(weights[0, :, :2], 0.5, rtol=1e-6)
        np.testing.assert_allclose(weights[1], 0.2, rtol=1e-6)


# --------------------------------------------------------------------------- traced lengths


@pytest.mark.parametrize("kind", KINDS)
def test_traced_out_of_range_lengths_under_jit(kind):
    # Documented in jax_attention/nn/masking.py: traced lengths are not range-checked and act as if
    # clipped to [0, S]; a closed-over constant is still checked at trace time.
    queries, keys, values = _inputs(kind)
    jitted = jax.jit(_attention(kind))
    output, weights = jitted(queries, keys, values, _lens((-1, 9)))
    expected_output, expected_weights = jitted(queries, keys, values, _lens((0, DIMS.S)))
    assert (np.asarray(output)[0] == 0).all() and (np.asarray(weights)[0] == 0).all()
    np.testing.assert_array_equal(np.asarray(output), np.asarray(expected_output))
    np.testing.assert_array_equal(np.asarray(weights), np.asarray(expected_weights))
    lens = _lens((-1, 3))
    with pytest.raises(
        ValueError, match=r"valid_lens must lie in \[0, S\] = \[0, 5\], got values from -1 to 3"
    ):
        jax.jit(lambda q, k, v: _attention(kind)(q, k, v, lens))(queries, keys, values)


# --------------------------------------------------------------------------- vmap


@pytest.mark.parametrize(
    "kind, lens_shape",
    [("dot", (4, DIMS.B)), ("dot", (4, DIMS.B, DIMS.T)), ("additive", (4, DIMS.B, DIMS.T))],
)
def test_vmap_matches_loop(kind, lens_shape):
    # An extra leading axis of 4 over queries, keys, values and lengths (e.g. several batches).
    queries, keys, values = (_device(np.stack([np.asarray(a) * (i + 1) for i in range(4)]))
                             for a in _inputs(kind))
    lens = np.random.default_rng(6).integers(0, DIMS.S + 1, size=lens_shape).astype(np.int32)
    # Jitted so that the batched program and the loop's compile once each rather than primitive
    # by primitive.
    attention = jax.jit(_attention(kind))
    got = jax.jit(jax.vmap(attention))(queries, keys, values, _device(lens))
    inputs = [np.asarray(a) for a in (queries, keys, values)]
    expected = [attention(*(a[i] for a in inputs), lens[i]) for i in range(4)]
    expected = jax.tree.map(lambda *xs: np.stack(xs), *expected)
    chex.assert_trees_all_close(got, expected, rtol=1e-5, atol=1e-6)
    chex.assert_shape(got[0], (4,) + DIMS["BTD"])


def test_vmap_shared_additive_params_and_mask():
    inputs = [np.stack([a, -a]) for a in map(np.asarray, _inputs("additive"))]
    inputs.append(np.random.default_rng(7).random((2,) + DIMS["BTS"]) < 0.6)  # the masks
    params = _params()

    @jax.jit
    def attention(q, k, v, m):
        return jax_scoring.additive_attention(params, q, k, v, mask=m)

    got = jax.jit(jax.vmap(attention))(*map(_device, inputs))
    expected = jax.tree.map(
        lambda *xs: np.stack(xs), *[attention(*(a[i] for a in inputs)) for i in range(2)]
    )
    chex.assert_trees_all_close(got, expected, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- gradients


MASKINGS = [
    ("no mask", None, None, False),
    ("lens B", (2, 5), None, False),
    ("lens BT with an empty row, mask and causal", ((1, 0, 3), (5, 2, 4)), "random", True),
]


@pytest.mark.parametrize("name, lens, mask, is_causal", MASKINGS, ids=[m[0] for m in MASKINGS])
def test_dot_product_gradients(x64, name, lens, mask, is_causal):
    queries, keys, values = _inputs("dot", dtype=jnp.float64)
    lens = None if lens is None else _lens(lens)
    mask = None if mask is None else _device(np.random.default_rng(8).random(DIMS["BTS"]) < 0.6)

    def f(q, k, v):
        return jax_scoring.dot_product_attention(q, k, v, lens, mask=mask, is_causal=is_causal)

    # jit only to compile the many finite-difference evaluations once; the eager gradients are
    # exercised by the chex variants above.
    check_grads(jax.jit(f), (queries, keys, values), order=1, modes=("rev",))


def _autodiff_dot_product_attention(queries, keys, values, valid_lens=None, *, mask=None,
                                    is_causal=False, bias=None):
    """The same computation as ``dot_product_attention`` without its custom JVP: plain autodiff
    through masking, softmax and the weighted sum."""
    keep, (q, k, v), _ = jax_scoring._prepare(queries, keys, values, valid_lens, mask, is_causal,
                                              same_depth=True)
    scores = jnp.einsum("...tq,...sq->...ts", q / math.sqrt(q.shape[-1]), k)
    if bias is not None:
        bias = jnp.asarray(bias)
        scores = scores + bias.reshape((1,) * (scores.ndim - bias.ndim) + bias.shape)
    weights = jax_masking.softmax_where(scores, keep)
    return jnp.einsum(jax_scoring.WEIGHTED_SUM, weights, v), weights


CUSTOM_JVP_CASES = [
    ("no mask, bias", None, None, False, True),
    ("lens B with an empty sequence", (0, 4), None, False, False),
    ("lens BT with an empty row, mask, causal, bias", ((1, 0, 3), (5, 2, 4)), "random", True, True),
]


@pytest.mark.parametrize("name, lens, mask, is_causal, with_bias", CUSTOM_JVP_CASES,
                         ids=[c[0] for c in CUSTOM_JVP_CASES])
@pytest.mark.parametrize("through", ["output", "weights", "both"])
def test_dot_product_custom_jvp_gradients_match_autodiff(x64, name, lens, mask, is_causal, with_bias,
                                                 through):
    """The transposed custom JVP (FlashAttention's ``rowsum(dO * O)``) gives the gradients plain
    autodiff gives, through the output, the weights or both, with NaN and Inf in padding."""
    queries, keys, values = _inputs("dot", dtype=jnp.float64)
    lens = None if lens is None else _lens(lens)
    if lens is not None and lens.ndim == 1:
        # Padding holds NaN and Inf; it must reach neither outputs nor gradients.
        padded = (np.arange(DIMS.S)[None, :] >= np.asarray(lens)[:, None])[:, :, None]
        keys = _device(np.where(padded, np.nan, keys))
        values = _device(np.where(padded, np.inf, values))
    mask = None if mask is None else _device(np.random.default_rng(8).random(DIMS["BTS"]) < 0.6)
    bias = _normal(DIMS["TS"], jnp.float64, 9) if with_bias else None
    out_cotangent = _normal(DIMS["BTD"], jnp.float64, 10)
    weights_cotangent = _normal(DIMS["BTS"], jnp.float64, 11)

    def loss(attention):
        def f(q, k, v, b):
            output, weights = attention(q, k, v, lens, mask=mask, is_causal=is_causal, bias=b)
            total = jnp.zeros((), jnp.float64)
            if through in ("output", "both"):
                total = total + jnp.sum(output * out_cotangent)
            if through in ("weights", "both"):
                total = total + jnp.sum(weights * weights_cotangent)
            return total
        return jax.grad(f, argnums=(0, 1, 2, 3))

    attentions = (jax_scoring.dot_product_attention, _autodiff_dot_product_attention)
    bias_arg = bias if bias is not None else np.zeros((), np.float64)
    if bias is None:
        # grad needs an argument; a scalar bias would change nothing but must not be passed on.
        def wrap(attention):
            return lambda q, k, v, lens, b=None, **kw: attention(q, k, v, lens, **{**kw, "bias": None})
        attentions = tuple(map(wrap, attentions))
    # Both gradients in one jitted program.
    got, expected = jax.jit(lambda *arrays: tuple(loss(a)(*arrays) for a in attentions))(
        queries, keys, values, bias_arg)
    for g in got:
        assert np.all(np.isfinite(np.asarray(g)))
    chex.assert_trees_all_close(got, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name, lens, mask, is_causal, with_bias", CUSTOM_JVP_CASES,
                         ids=[c[0] for c in CUSTOM_JVP_CASES])
def test_dot_product_forward_mode_matches_autodiff(x64, name, lens, mask, is_causal, with_bias):
    """Forward mode (``jax.jvp``) works through the custom JVP and equals plain autodiff's."""
    queries, keys, values = _inputs("dot", dtype=jnp.float64)
    lens = None if lens is None else _lens(lens)
    mask = None if mask is None else _device(np.random.default_rng(8).random(DIMS["BTS"]) < 0.6)
    bias = _normal(DIMS["TS"], jnp.float64, 9) if with_bias else None
    tangents = tuple(_normal(x.shape, jnp.float64, 20 + i)
                     for i, x in enumerate((queries, keys, values)))

    def jvp(attention, primals):
        return jax.jvp(
            lambda q, k, v: attention(q, k, v, lens, mask=mask, is_causal=is_causal, bias=bias),
            primals, tangents)

    # Both in one jitted program.
    got, expected = jax.jit(lambda *primals: tuple(
        jvp(a, primals) for a in (jax_scoring.dot_product_attention,
                                  _autodiff_dot_product_attention)))(queries, keys, values)
    chex.assert_trees_all_close(got, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name, lens, mask, is_causal", MASKINGS, ids=[m[0] for m in MASKINGS])
def test_dot_product_forward_values_are_the_books_softmax_bit_for_bit(name, lens, mask, is_causal):
    """The custom-JVP path and its ``(B, 1, S)`` length masks change no forward value: float32
    outputs and weights equal ``masked_softmax(Q K^T / sqrt(d))`` pooled, bit for bit — so the
    NNX module (plain autodiff, dropout) and the functional core train and decode alike."""
    queries, keys, values = _inputs("dot", dtype=jnp.float32)
    lens = None if lens is None else _lens(lens)
    mask = None if mask is None else _device(np.random.default_rng(8).random(DIMS["BTS"]) < 0.6)
    keep = jax_masking.attention_mask(DIMS["BTS"], lens, mask=mask, is_causal=is_causal)
    scores = jnp.einsum(jax_core.DOT_SCORES, queries, keys) / math.sqrt(DIMS.H)
    expected_weights = jax_masking.masked_softmax(scores, mask=keep)
    expected = jnp.einsum(jax_scoring.WEIGHTED_SUM, expected_weights, values)
    for run in (jax_scoring.dot_product_attention, jax.jit(jax_scoring.dot_product_attention,
                                                           static_argnames="is_causal")):
        output, weights = run(queries, keys, values, lens, mask=mask, is_causal=is_causal)
        np.testing.assert_array_equal(np.asarray(weights), np.asarray(expected_weights))
        np.testing.assert_array_equal(np.asarray(output), np.asarray(expected))


@pytest.mark.parametrize("name, lens, mask, is_causal", MASKINGS, ids=[m[0] for m in MASKINGS])
def test_additive_gradients(x64, name, lens, mask, is_causal):
    queries, keys, values = _inputs("additive", dtype=jnp.float64)
    lens = None if lens is None else _lens(lens)
    mask = None if mask is None else _device(np.random.default_rng(8).random(DIMS["BTS"]) < 0.6)

    def f(p, q, k, v):
        return jax_scoring.additive_attention(p, q, k, v, lens, mask=mask, is_causal=is_causal)

    check_grads(jax.jit(f), (_params(jnp.float64), queries, keys, values), order=1, modes=("rev",))


# --------------------------------------------------------------------------- NumPy reference


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [np.float64, np.float16])
def test_reference_fully_masked_rows_are_zero(kind, dtype):
    queries, keys, values = (np.asarray(a, dtype) for a in _inputs(kind))
    params = {k: np.asarray(v, dtype) for k, v in _params().items()}
    lens = np.array([[2, 0, 5], [0, 0, 1]], np.int32)
    if kind == "dot":
        output, weights = np_scoring.dot_product_attention(queries, keys, values, lens)
    else:
        output, weights = np_scoring.additive_attention(params, queries, keys, values, lens)
    assert output.dtype == dtype and weights.dtype == dtype
    empty = np.array([[False, True, False], [True, True, False]])
    assert (weights[empty] == 0).all() and (output[empty] == 0).all()
    np.testing.assert_allclose(weights[~empty].sum(-1).astype(np.float64), 1.0, rtol=2e-3)


@pytest.mark.parametrize("kind", KINDS)
def test_reference_nan_and_inf_in_masked_positions_do_not_leak(kind):
    queries, keys, values = (np.asarray(a, np.float64) for a in _inputs(kind))
    params = {k: np.asarray(v, np.float64) for k, v in _params().items()}
    lens = np.array([[2, 2, 0], [5, 3, 4]], np.int32)  # keys 2.. of batch 0 padding, query (0, 2) empty
    dirty_queries, dirty_keys, dirty_values = queries.copy(), keys.copy(), values.copy()
    dirty_queries[0, 2, :2], dirty_queries[0, 2, 2:] = np.nan, np.inf
    dirty_keys[0, 2], dirty_keys[0, 3:] = np.inf, np.nan
    dirty_values[0, 2], dirty_values[0, 3:] = -np.inf, np.nan

    def run(q, k, v):
        if kind == "dot":
            return np_scoring.dot_product_attention(q, k, v, lens)
        return np_scoring.additive_attention(params, q, k, v, lens)

    clean_output, clean_weights = run(queries, keys, values)
    dirty_output, dirty_weights = run(dirty_queries, dirty_keys, dirty_values)
    valid_rows = np.ones(DIMS["BT"], bool)
    valid_rows[0, 2] = False
    np.testing.assert_array_equal(dirty_output[valid_rows], clean_output[valid_rows])
    np.testing.assert_array_equal(dirty_weights, clean_weights)
    assert (dirty_output[0, 2] == 0).all()


# --------------------------------------------------------------------------- hypothesis


# Every new shape costs a compilation: one per jitted function, but one per primitive when run
# eagerly (about three times slower here). Hence jitted functions built once, and small ranges.
_jitted_dot_product_attention = jax.jit(jax_scoring.dot_product_attention)
_jitted_additive_attention = jax.jit(jax_scoring.additive_attention)


@st.composite
def _cases(draw):
    B, T, S = draw(sizes(1, 2)), draw(sizes(1, 2)), draw(sizes(1, 4))
    depth = draw(sizes(1, 2))
    per_query = draw(st.booleans())
    count = B * T if per_query else B
    lens = np.asarray(draw(st.lists(st.integers(0, S), min_size=count, max_size=count)), np.int32)
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    queries = rng.normal(size=(B, T, depth))
    keys, values = rng.normal(size=(B, S, depth)), rng.normal(size=(B, S, 2))
    return queries, keys, values, lens.reshape((B, T) if per_query else (B,))


def _check_property(expected, got, lens, shape):
    for e, g in zip(expected, got):
        np.testing.assert_allclose(np.asarray(g), e, rtol=1e-12, atol=1e-12)
    keep = _keep_from_lens(lens, *shape)
    _assert_weights_valid(got[1], keep)
    assert (expected[1][~keep] == 0).all()
    assert (np.asarray(got[0])[~keep.any(-1)] == 0).all()


@hypothesis.settings(max_examples=examples(ci=10, dev=25))
@hypothesis.given(_cases())
def test_dot_product_property(case):
    queries, keys, values, lens = case
    expected = np_scoring.dot_product_attention(queries, keys, values, lens)
    with jax.enable_x64(True):
        # NumPy arguments: a jitted function converts them without compiling anything.
        got = _jitted_dot_product_attention(queries, keys, values, lens)
        got = [np.asarray(g) for g in got]
    _check_property(expected, got, lens, (queries.shape[1], keys.shape[1]))


@hypothesis.settings(max_examples=examples(ci=10, dev=25))
@hypothesis.given(_cases(), sizes(1, 2), st.integers(0, 2**16))
def test_additive_property(case, hiddens, seed):
    queries, keys, values, lens = case
    keys = np.concatenate([keys, keys], axis=-1)  # a key size different from the query size
    rng = np.random.default_rng(seed)
    params = {
        "W_q": rng.normal(size=(queries.shape[-1], hiddens)),
        "W_k": rng.normal(size=(keys.shape[-1], hiddens)),
        "w_v": rng.normal(size=(hiddens, 1)),
    }
    expected = np_scoring.additive_attention(params, queries, keys, values, lens)
    with jax.enable_x64(True):
        got = _jitted_additive_attention(params, queries, keys, values, lens)
        got = [np.asarray(g) for g in got]
    _check_property(expected, got, lens, (queries.shape[1], keys.shape[1]))


# --------------------------------------------------------------------------- bad input


def _both(kind):
    """The JAX and the NumPy function of ``kind``, each with its own array module."""
    if kind == "dot":
        return [(jax_scoring.dot_product_attention, jnp), (np_scoring.dot_product_attention, np)]
    params = {k: np.asarray(v) for k, v in _params().items()}
    return [
        (
            lambda *a, **kw: jax_scoring.additive_attention(
                {k: _device(v) for k, v in params.items()}, *a, **kw
            ),
            jnp,
        ),
        (lambda *a, **kw: np_scoring.additive_attention(params, *a, **kw), np),
    ]


def _np_inputs(kind):
    return [np.asarray(a) for a in _inputs(kind)]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "lens, dtype, message",
    [
        (
            (-1, 2),
            "int32",
            r"valid_lens must lie in \[0, S\] = \[0, 5\], got values from -1 to 2 \(shape \(2,\)\)",
        ),
        ((1, 6), "int32", r"valid_lens must lie in \[0, S\] = \[0, 5\], got values from 1 to 6"),
        ((1.0, 2.0), "float32", r"valid_lens must hold integers, got dtype float32 with shape \(2,\)"),
        (
            (1, 2, 3),
            "int32",
            r"valid_lens must have shape \(B,\) = \(2,\) or \(B, T\) = \(2, 3\), got \(3,\)",
        ),
        ((((1,),) * 3,) * 2, "int32", r"valid_lens must have shape .* got \(2, 3, 1\)"),
    ],
)
def test_bad_valid_lens(kind, lens, dtype, message):
    for attention, xnp in _both(kind):
        with pytest.raises(ValueError, match=message):
            attention(*(xnp.asarray(a) for a in _np_inputs(kind)), xnp.asarray(lens, dtype))


def test_dot_product_depth_mismatch():
    queries, _, values = _np_inputs("dot")
    keys = np.zeros((DIMS.B, DIMS.S, 3), np.float32)
    message = re.escape(
        "queries and keys must have the same size for dot-product scores, got queries "
        "(2, 3, 4) (size 4) and keys (2, 5, 3) (size 3)"
    )
    for attention, xnp in _both("dot"):
        with pytest.raises(ValueError, match=message):
            attention(xnp.asarray(queries), xnp.asarray(keys), xnp.asarray(values))
    for weights_fn, xnp in (
        (jax_scoring.dot_product_attention_weights, jnp),
        (np_scoring.dot_product_attention_weights, np),
    ):
        with pytest.raises(ValueError, match=message):
            weights_fn(xnp.asarray(queries), xnp.asarray(keys))


@pytest.mark.parametrize("kind", KINDS)
def test_keys_and_values_of_different_lengths(kind):
    queries, keys, _ = _np_inputs(kind)
    values = np.zeros((DIMS.B, DIMS.S + 1, DIMS.D), np.float32)
    message = re.escape(
        f"keys (B, ..., S, k) and values (B, ..., S, v) must have the same batch axes and "
        f"length S, got keys {keys.shape} and values (2, 6, 6)"
    )
    for attention, xnp in _both(kind):
        with pytest.raises(ValueError, match=message):
            attention(xnp.asarray(queries), xnp.asarray(keys), xnp.asarray(values))


@pytest.mark.parametrize("kind", KINDS)
def test_batch_axes_and_rank(kind):
    queries, keys, values = _np_inputs(kind)
    for attention, xnp in _both(kind):
        with pytest.raises(ValueError, match=r"must share their batch axes.*, got queries \(1, 3, 4\)"):
            attention(xnp.asarray(queries[:1]), xnp.asarray(keys), xnp.asarray(values))
        # Dot-product attention takes unbatched (T, d) queries, with unbatched keys and values.
        message = ("queries (3, 4) are unbatched (T, q), so keys must be (S, k) too, got (2, 5, 4)"
                   if kind == "dot" else "queries must have shape (B, ..., len, size), got (3, 4)")
        with pytest.raises(ValueError, match=re.escape(message)):
            attention(xnp.asarray(queries[0]), xnp.asarray(keys), xnp.asarray(values))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("which", [0, 1, 2])
def test_mixed_dtypes_are_a_type_error(kind, which):
    arrays = _np_inputs(kind)
    arrays[which] = arrays[which].astype(np.float16)
    names = ["queries float32", "keys float32", "values float32"]
    names[which] = names[which].replace("float32", "float16")
    message = re.escape("queries, keys and values must share one float dtype, got " + ", ".join(names))
    for attention, xnp in _both(kind):
        with pytest.raises(TypeError, match=message):
            attention(*(xnp.asarray(a) for a in arrays))


@pytest.mark.parametrize("kind", KINDS)
def test_non_numeric_inputs_are_a_type_error(kind):
    queries, keys, values = _np_inputs(kind)
    for attention, xnp in _both(kind):
        with pytest.raises(
            TypeError, match=re.escape("values must be numeric, got dtype bool with shape (2, 5, 6)")
        ):
            attention(xnp.asarray(queries), xnp.asarray(keys), xnp.asarray(values > 0))


@pytest.mark.parametrize("kind", KINDS)
def test_bad_masks(kind):
    arrays = _np_inputs(kind)
    for attention, xnp in _both(kind):
        with pytest.raises(
            TypeError, match=r"mask must be boolean \(True = attend\), got dtype int32 with shape \(3, 5\)"
        ):
            attention(*(xnp.asarray(a) for a in arrays), mask=xnp.ones(DIMS["TS"], xnp.int32))
        with pytest.raises(
            ValueError,
            match=re.escape(
                "mask must broadcast to the scores' shape (B, ..., T, S) = (2, 3, 5), got shape (3, 3, 5)"
            ),
        ):
            attention(*(xnp.asarray(a) for a in arrays), mask=xnp.ones((3, 3, 5), bool))


@pytest.mark.parametrize(
    "change, message",
    [
        (
            {"W_k": np.zeros((5, HIDDENS), np.float32)},
            r"params\['W_k'\] must have shape \(6, 7\), got \(5, 7\) "
            r"\(q = query size, k = key size, h = hidden size; queries ",
        ),
        (
            {"W_q": np.zeros((DIMS.H, 2), np.float32)},
            r"params\['W_k'\] must have shape \(6, 2\), got \(6, 7\) ",
        ),
        (
            {"w_v": np.zeros((1, HIDDENS), np.float32)},
            r"params\['w_v'\] must have shape \(7, 1\), got \(1, 7\) ",
        ),
        (
            {"W_q": np.zeros((DIMS.H,), np.float32)},
            r"params\['W_q'\] must have shape \(4, h\), got \(4,\) ",
        ),
        (
            {"w_v": None},
            r"params has missing keys \['w_v'\]: expected the keys \['W_q', 'W_k', 'w_v'\], "
            r"got \['W_k', 'W_q'\]",
        ),
    ],
)
def test_bad_additive_params(change, message):
    params = {k: np.asarray(v) for k, v in _params().items()}
    params.update(change)
    params = {k: v for k, v in params.items() if v is not None}
    queries, keys, values = _np_inputs("additive")
    for fn, xnp in ((jax_scoring.additive_attention, jnp), (np_scoring.additive_attention, np)):
        with pytest.raises(ValueError, match=message):
            fn(
                {k: xnp.asarray(v) for k, v in params.items()},
                xnp.asarray(queries),
                xnp.asarray(keys),
                xnp.asarray(values),
            )


def test_additive_params_not_a_mapping():
    queries, keys, values = _np_inputs("additive")
    for fn, xnp in ((jax_scoring.additive_attention, jnp), (np_scoring.additive_attention, np)):
        with pytest.raises(
            ValueError,
            match=r"params must be a mapping with the keys \['W_q', 'W_k', 'w_v'\], got list",
        ):
            fn([1, 2, 3], xnp.asarray(queries), xnp.asarray(keys), xnp.asarray(values))


# --------------------------------------------------------------------------- NNX modules


def _module(kind, dropout=0.0, sow_weights=True, seed=0):
    if kind == "dot":
        return jax_scoring.DotProductAttention(dropout, sow_weights=sow_weights, rngs=nnx.Rngs(seed))
    return jax_scoring.AdditiveAttention(
        DIMS.H, DIMS.D, HIDDENS, dropout, sow_weights=sow_weights, rngs=nnx.Rngs(seed)
    )


def _functional(kind, module):
    return _attention(kind, module.params_dict() if kind == "additive" else None)


def _sown(intermediates):
    (weights,) = intermediates["attention_weights"].get_value()
    return weights


@pytest.mark.parametrize("kind", KINDS)
def test_sown_weights_equal_functional_weights(kind):
    module = _module(kind)
    queries, keys, values = _inputs(kind)
    lens = _lens(((1, 2, 0), (5, 4, 3)))
    output, intermediates = nnx.capture(module, nnx.Intermediate)(queries, keys, values, lens)
    expected_output, expected_weights = _functional(kind, module)(queries, keys, values, lens)
    chex.assert_trees_all_equal(_sown(intermediates), expected_weights)
    chex.assert_trees_all_equal(output, expected_output)
    chex.assert_shape(_sown(intermediates), DIMS["BTS"])


@pytest.mark.parametrize("kind", KINDS)
def test_no_weights_sown_unless_asked(kind):
    module = _module(kind, sow_weights=False)
    queries, keys, values = _inputs(kind)
    output, intermediates = nnx.capture(module, nnx.Intermediate)(queries, keys, values)
    assert "attention_weights" not in intermediates
    chex.assert_shape(output, DIMS["BTD"])


@pytest.mark.parametrize("kind", KINDS)
def test_dropout_in_train_mode_and_eval(kind):
    module = _module(kind, dropout=0.5)
    queries, keys, values = _inputs(kind)
    lens = _lens((4, 5))
    capture = nnx.capture(module, nnx.Intermediate)
    expected_output, expected_weights = _functional(kind, module)(queries, keys, values, lens)

    train_output, intermediates = capture(queries, keys, values, lens)
    second_output, _ = capture(queries, keys, values, lens)
    # Weights are sown before dropout; the output uses dropped-out weights, fresh on each call.
    chex.assert_trees_all_equal(_sown(intermediates), expected_weights)
    assert not np.allclose(np.asarray(train_output), np.asarray(expected_output))
    assert not np.allclose(np.asarray(train_output), np.asarray(second_output))
    chex.assert_trees_all_equal(capture(queries, keys, values, lens, deterministic=True)[0], expected_output)

    module.eval()
    eval_outputs = [capture(queries, keys, values, lens)[0] for _ in range(2)]
    chex.assert_trees_all_equal(eval_outputs[0], eval_outputs[1], expected_output)
    module.train()
    assert not np.allclose(np.asarray(capture(queries, keys, values, lens)[0]), np.asarray(expected_output))


@pytest.mark.parametrize("kind", KINDS)
def test_dropout_with_call_time_rngs_is_reproducible(kind):
    module = _module(kind, dropout=0.5, sow_weights=False)
    queries, keys, values = _inputs(kind)
    first = module(queries, keys, values, rngs=nnx.Rngs(dropout=11))
    again = module(queries, keys, values, rngs=nnx.Rngs(dropout=11))
    other = module(queries, keys, values, rngs=nnx.Rngs(dropout=12))
    chex.assert_trees_all_equal(first, again)
    assert not np.allclose(np.asarray(first), np.asarray(other))


def test_additive_module_is_reproducible_from_its_seed():
    first, again, other = (_module("additive", seed=s).params_dict() for s in (3, 3, 4))
    chex.assert_trees_all_equal(first, again)
    assert all(not np.array_equal(np.asarray(first[k]), np.asarray(other[k])) for k in first)
    chex.assert_shape(
        [first["W_q"], first["W_k"], first["w_v"]], [(DIMS.H, HIDDENS), (DIMS.D, HIDDENS), (HIDDENS, 1)]
    )
    chex.assert_type(list(first.values()), jnp.float32)


@pytest.mark.parametrize("kind", KINDS)
def test_module_under_nnx_jit(kind):
    module = _module(kind, sow_weights=False)
    queries, keys, values = _inputs(kind)
    lens = _lens((2, 0))
    got = nnx.jit(lambda m, *args: m(*args))(module, queries, keys, values, lens)
    expected, _ = _functional(kind, module)(queries, keys, values, lens)
    chex.assert_trees_all_close(got, expected, rtol=1e-6, atol=1e-7)
    assert (np.asarray(got[1]) == 0).all()


# --------------------------------------------------------------------------- implementation=


def _uses_chunked_kernel(f, *args):
    """Whether ``f(*args)`` runs the chunked kernel: its online softmax is a ``while`` loop under a
    custom VJP, and the plain path has neither."""
    jaxpr = str(jax.make_jaxpr(f)(*args))
    return "custom_vjp_call" in jaxpr and "while" in jaxpr


@pytest.mark.parametrize("shape, dtype, with_bias, expected", [
    ((4, 8, 512, 64), jnp.float32, False, "chunked"),  # 8M scores, S = 512
    ((1, 4, 1024, 64), jnp.float32, False, "chunked"),  # 4M scores: the threshold
    ((1, 2, 1024, 64), jnp.float32, False, "plain"),  # 2M scores
    ((64, 8, 128, 64), jnp.float32, False, "plain"),  # 8M scores but S = 128 < 512
    ((4, 8, 512, 64), jnp.float32, True, "plain"),  # the chunked kernel takes no bias
    ((4, 8, 512, 64), jnp.bfloat16, False, "plain"),  # half precision keeps the plain rounding
    ((4, 8, 512, 64), jnp.float16, False, "plain"),
])
def test_dispatch_rule(shape, dtype, with_bias, expected):
    """implementation=None follows dot_product_implementation's documented rule (shapes only)."""
    T = shape[2]
    queries = jax.ShapeDtypeStruct(shape, dtype)
    bias = jnp.zeros((T, T), dtype) if with_bias else None
    assert jax_scoring.dot_product_implementation(queries, queries, bias) == expected
    assert jax_scoring.CHUNKED_MIN_SCORES == 1 << 22 and jax_scoring.CHUNKED_MIN_KEYS == 512


@pytest.mark.parametrize("with_bias", [False, True])
def test_dispatch_takes_the_path_the_rule_names(monkeypatch, with_bias):
    """The default dispatch runs the path dot_product_implementation names (thresholds lowered so
    that small arrays cross them), and implementation= forces either."""
    monkeypatch.setattr(jax_scoring, "CHUNKED_MIN_SCORES", DIMS.B * DIMS.T * DIMS.S)
    monkeypatch.setattr(jax_scoring, "CHUNKED_MIN_KEYS", DIMS.S)
    queries, keys, values = _inputs("dot")
    bias = _normal(DIMS["TS"], jnp.float32, 9) if with_bias else None
    rule = jax_scoring.dot_product_implementation(queries, keys, bias)
    assert rule == ("plain" if with_bias else "chunked")

    def run(implementation):
        return lambda q, k, v: jax_scoring.dot_product_attention(q, k, v, bias=bias,
                                                                 implementation=implementation)

    assert _uses_chunked_kernel(run(None), queries, keys, values) == (rule == "chunked")
    assert not _uses_chunked_kernel(run("plain"), queries, keys, values)
    if not with_bias:
        assert _uses_chunked_kernel(run("chunked"), queries, keys, values)
    # Below the thresholds: plain.
    monkeypatch.setattr(jax_scoring, "CHUNKED_MIN_KEYS", DIMS.S + 1)
    assert jax_scoring.dot_product_implementation(queries, keys) == "plain"
    assert not _uses_chunked_kernel(run(None), queries, keys, values)


@pytest.mark.parametrize("name, lens, mask, is_causal", [
    ("lens B with an empty sequence", (0, 4), None, False),
    ("lens BT with an empty row, mask, causal", ((1, 0, 3), (5, 2, 4)), "random", True),
])
def test_chunked_implementation_matches_plain_with_gradients(x64, name, lens, mask, is_causal):
    """implementation="chunked" gives the plain path's output, weights and gradients (through
    both) to float64 rounding, with NaN and Inf in padding; fully masked rows give zeros and
    finite gradients."""
    queries, keys, values = _inputs("dot", dtype=jnp.float64)
    lens = _lens(lens)
    if lens.ndim == 1:
        padded = (np.arange(DIMS.S)[None, :] >= np.asarray(lens)[:, None])[:, :, None]
        keys = _device(np.where(padded, np.nan, keys))
        values = _device(np.where(padded, np.inf, values))
    mask = None if mask is None else _device(np.random.default_rng(8).random(DIMS["BTS"]) < 0.6)
    out_cotangent = _normal(DIMS["BTD"], jnp.float64, 10)
    weights_cotangent = _normal(DIMS["BTS"], jnp.float64, 11)

    def loss(implementation):
        def f(q, k, v):
            output, weights = jax_scoring.dot_product_attention(
                q, k, v, lens, mask=mask, is_causal=is_causal, implementation=implementation)
            loss = jnp.sum(output * out_cotangent) + jnp.sum(weights * weights_cotangent)
            return loss, (output, weights)
        # One program per implementation: the loss, its gradients and the forward's values.
        return jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2), has_aux=True))

    plain, chunked = loss("plain")(queries, keys, values), loss("chunked")(queries, keys, values)
    assert _all_finite(chunked)
    chex.assert_trees_all_close(chunked, plain, rtol=1e-12, atol=1e-12)
    (_, (output, weights)), _ = chunked
    keep = np.broadcast_to(np.asarray(jax.jit(
        lambda: jax_masking.attention_mask(DIMS["BTS"], lens, mask=mask, is_causal=is_causal))()),
        DIMS["BTS"])
    empty = ~keep.any(axis=-1)
    assert empty.any() and (np.asarray(output)[empty] == 0).all()
    _assert_weights_valid(weights, keep)


@pytest.mark.parametrize("implementation", ["fast", "PLAIN", "", 1, True, ("plain",)])
def test_bad_implementation(implementation):
    """A value that is neither None, 'plain' nor 'chunked' is a ValueError naming the argument, in
    JAX and in the NumPy reference alike."""
    queries, keys, values = _inputs("dot")
    for attention in (jax_scoring.dot_product_attention, np_scoring.dot_product_attention):
        with pytest.raises(ValueError, match="implementation must be None, 'plain' or 'chunked'"):
            attention(queries, keys, values, implementation=implementation)


def test_chunked_implementation_takes_no_bias():
    queries, keys, values = _inputs("dot")
    with pytest.raises(ValueError, match="implementation='chunked' takes no bias"):
        jax_scoring.dot_product_attention(queries, keys, values, bias=jnp.zeros(DIMS["TS"]),
                                          implementation="chunked")


# --------------------------------------------------------------------------- issue 16: input checks


def _every_function_with_is_causal():
    """(name, f(is_causal)) for every scoring entry point taking ``is_causal``, in both packages,
    the chunked kernel and the NNX modules included."""
    params = {k: np.asarray(v) for k, v in _params().items()}
    q, k, v = _np_inputs("dot")
    a_q, a_k, a_v = _np_inputs("additive")
    dot = jax_scoring.DotProductAttention()
    additive = jax_scoring.AdditiveAttention(DIMS.H, DIMS.D, HIDDENS, rngs=nnx.Rngs(0))
    return [
        ("dot", lambda c: jax_scoring.dot_product_attention(q, k, v, is_causal=c)),
        ("dot-chunked", lambda c: jax_scoring.dot_product_attention(
            q, k, v, is_causal=c, implementation="chunked")),
        ("efficient", lambda c: efficient.dot_product_attention(q, k, v, is_causal=c)),
        ("dot-weights", lambda c: jax_scoring.dot_product_attention_weights(q, k, is_causal=c)),
        ("additive", lambda c: jax_scoring.additive_attention(params, a_q, a_k, a_v, is_causal=c)),
        ("additive-weights", lambda c: jax_scoring.additive_attention_weights(
            params, a_q, a_k, is_causal=c)),
        ("DotProductAttention", lambda c: dot(q, k, v, is_causal=c)),
        ("AdditiveAttention", lambda c: additive(a_q, a_k, a_v, is_causal=c)),
        ("numpy-dot", lambda c: np_scoring.dot_product_attention(q, k, v, is_causal=c)),
        ("numpy-dot-weights", lambda c: np_scoring.dot_product_attention_weights(
            q, k, is_causal=c)),
        ("numpy-additive", lambda c: np_scoring.additive_attention(
            params, a_q, a_k, a_v, is_causal=c)),
        ("numpy-additive-weights", lambda c: np_scoring.additive_attention_weights(
            params, a_q, a_k, is_causal=c)),
    ]


@pytest.mark.parametrize("is_causal", ["False", 1, np.array(True)], ids=["str", "int", "array"])
def test_is_causal_must_be_a_python_bool_in_every_entry_point(is_causal):
    for name, f in _every_function_with_is_causal():
        with pytest.raises(TypeError, match=rf"is_causal must be a Python bool.*got "
                                            rf"{type(is_causal).__name__}"):
            f(is_causal)
            pytest.fail(f"{name} accepted is_causal={is_causal!r}")


def test_traced_is_causal_is_refused_by_the_chunked_kernel_too():
    queries, keys, values = _np_inputs("dot")
    for implementation in ("plain", "chunked"):
        with pytest.raises(TypeError, match=r"is_causal must be a static Python bool"):
            jax.jit(lambda c, i=implementation: jax_scoring.dot_product_attention(
                queries, keys, values, is_causal=c, implementation=i))(True)
    with pytest.raises(TypeError, match=r"is_causal must be a static Python bool"):
        jax.jit(lambda c: efficient.dot_product_attention(queries, keys, values,
                                                          is_causal=c))(True)


@pytest.mark.parametrize("change, message", [
    (lambda p: p.update(W_o=p["W_q"]), r"params has unexpected keys \['W_o'\]: expected the keys "
                                       r"\['W_q', 'W_k', 'w_v'\]"),
    (lambda p: p.update(W_v=p.pop("w_v")), r"params has unexpected keys \['W_v'\] and missing keys "
                                           r"\['w_v'\]"),
])
def test_additive_params_with_a_misspelled_or_extra_key_are_refused(change, message):
    params = {k: np.asarray(v) for k, v in _params().items()}
    change(params)
    queries, keys, values = _np_inputs("additive")
    for module in (jax_scoring, np_scoring):
        with pytest.raises(ValueError, match=message):
            module.additive_attention(params, queries, keys, values)
        with pytest.raises(ValueError, match=message):
            module.additive_attention_weights(params, queries, keys)


# --------------------------------------------------------------------------- variants
# Grouped-query key/value heads, scale, sliding windows and soft-capping: gradients, jit/vmap,
# the group's gradient, empty windows, bad arguments. (Values against the NumPy reference are in
# tests/parity/test_scoring.py; against jax.nn and torch in tests/crossframework.)

GQA = chex.Dimensions(B=2, N=4, K=2, T=5, S=6, H=4, V=3)


def _gqa_inputs(num_kv_heads=GQA.K, dtype=jnp.float64, seed=40):
    return (_normal((GQA.B, GQA.N, GQA.T, GQA.H), dtype, seed),
            _normal((GQA.B, num_kv_heads, GQA.S, GQA.H), dtype, seed + 1),
            _normal((GQA.B, num_kv_heads, GQA.S, GQA.V), dtype, seed + 2))


VARIANT_CASES = {
    "scale": {"scale": 0.35},
    "softcap": {"logit_softcap": 0.9, "scale": 1.0},
    "window, causal, lens": {"local_window_size": (2, 0), "is_causal": True,
                             "valid_lens": (4, 0)},
    "window, lens BT with empty rows": {"local_window_size": (1, 1),
                                        "valid_lens": ((0, 6, 2, 5, 0), (3, 3, 0, 6, 1))},
}


def _with_lens(arguments):
    arguments = dict(arguments)
    if "valid_lens" in arguments:
        arguments["valid_lens"] = _lens(arguments["valid_lens"])
    return arguments


@pytest.mark.parametrize("implementation", ["plain", "chunked"])
@pytest.mark.parametrize("num_kv_heads", [GQA.N, GQA.K, 1], ids=["MHA", "GQA", "MQA"])
def test_variant_gradients(x64, num_kv_heads, implementation):
    """Reverse-mode gradients of the output against finite differences, every variant: the
    variants' outputs side by side in one function, so that its forward pass, its VJP and the
    finite differences compile once for all of them (a wrong gradient of any variant is a wrong
    cotangent of its part of the output)."""
    arguments = {name: _with_lens(case) for name, case in VARIANT_CASES.items()}

    def f(q, k, v):
        return {name: jax_scoring.dot_product_attention(q, k, v, implementation=implementation,
                                                        **case)[0]
                for name, case in arguments.items()}

    check_grads(jax.jit(f), _gqa_inputs(num_kv_heads), order=1, modes=("rev",))


def test_variant_forward_mode_on_the_plain_path(x64):
    """jax.jvp and jax.hessian through softcap, window and grouped heads (plain path)."""
    arguments = _with_lens({"logit_softcap": 0.7, "local_window_size": (1, 2), "valid_lens": (3, 6)})
    q, k, v = _gqa_inputs()

    def f(q, k, v):
        return jax_scoring.dot_product_attention(q, k, v, implementation="plain", **arguments)[0]

    # jit only to compile the finite differences and the Hessian once each rather than
    # primitive by primitive.
    check_grads(jax.jit(f), (q, k, v), order=1, modes=("fwd",))
    hessian = jax.jit(jax.hessian(lambda k: jnp.sum(f(q, k, v) ** 2)))(k)
    assert hessian.shape == k.shape * 2 and _all_finite(hessian)


@pytest.mark.parametrize("implementation", ["plain", "chunked"])
def test_grouped_heads_equal_repeated_keys_and_values(x64, implementation):
    """GQA = attention with each key/value head repeated for its N / N_kv query heads; the
    gradient of a shared head is the sum of its copies' gradients."""
    q, k, v = _gqa_inputs()
    groups = GQA.N // GQA.K
    arguments = _with_lens({"valid_lens": (5, 2), "is_causal": True})

    def grouped(q, k, v):
        return jax_scoring.dot_product_attention(q, k, v, implementation=implementation, **arguments)

    def repeated(q, k, v):
        return jax_scoring.dot_product_attention(q, jnp.repeat(k, groups, axis=1),
                                                 jnp.repeat(v, groups, axis=1),
                                                 implementation="plain", **arguments)

    def loss(f):
        return lambda q, k, v: jnp.sum(f(q, k, v)[0] * jnp.arange(GQA.V, dtype=q.dtype).reshape(1, 1, 1, -1))

    @jax.jit  # one program for the values and gradients of both
    def both(q, k, v):
        return tuple((f(q, k, v), jax.grad(loss(f), argnums=(0, 1, 2))(q, k, v))
                     for f in (grouped, repeated))

    (values, got), (expected_values, expected) = both(q, k, v)
    for g, e in zip(values, expected_values):
        np.testing.assert_allclose(g, e, rtol=1e-12, atol=1e-12)
    for g, e in zip(got, expected):
        assert g.shape == e.shape
        np.testing.assert_allclose(g, e, rtol=1e-12, atol=1e-12)


def test_grouped_heads_do_not_repeat_keys_and_values():
    """The plain path contracts each key/value head with its group: no (B, N, S, H) copy of the
    keys or values appears in the compiled forward+backward program."""
    q, k, v = _gqa_inputs(dtype=jnp.float32)

    def loss(q, k, v):
        return jnp.sum(jax_scoring.dot_product_attention(q, k, v, implementation="plain")[0])

    jaxpr = str(jax.make_jaxpr(jax.grad(loss, argnums=(1, 2)))(q, k, v))
    for repeated in ((GQA.B, GQA.N, GQA.S, GQA.H), (GQA.B, GQA.N, GQA.S, GQA.V)):
        assert f"f32[{','.join(map(str, repeated))}]" not in jaxpr


@pytest.mark.parametrize("implementation", ["plain", "chunked"])
def test_variants_under_jit_and_vmap(implementation):
    q, k, v = _gqa_inputs(dtype=jnp.float32)
    lens = _lens([4, 1])
    arguments = {"local_window_size": (1, 1), "logit_softcap": 2.0, "scale": 0.5,
                 "implementation": implementation}
    eager = jax_scoring.dot_product_attention(q, k, v, lens, **arguments)
    jitted = jax.jit(lambda q, k, v, lens: jax_scoring.dot_product_attention(
        q, k, v, lens, **arguments))(q, k, v, lens)
    # vmap over the batch: each example unbatched (N, T, H) would be (B', T, H); add B' = 1.
    # (Jitted too, to compile the batched program once rather than primitive by primitive.)
    mapped = jax.jit(jax.vmap(lambda q, k, v, lens: jax_scoring.dot_product_attention(
        q[None], k[None], v[None], lens[None], **arguments)))(q, k, v, lens)
    for e, j, m in zip(eager, jitted, mapped):
        np.testing.assert_allclose(j, e, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(m[:, 0], e, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("implementation", ["plain", "chunked"])
def test_rows_a_window_leaves_empty_are_zero_with_finite_gradients(x64, implementation):
    """Lengths (3, 6) and a window (0, 0): queries 3 and 4 of sequence 0 see no key. Their
    weights and outputs are zero, NaN stored in the padding reaches nothing, and every gradient
    is finite."""
    q, k, v = (np.array(a) for a in _gqa_inputs())
    k[0, :, 3:], v[0, :, 3:] = np.nan, np.inf
    lens = _lens([3, 6])

    def f(q, k, v):
        return jax_scoring.dot_product_attention(q, k, v, lens, local_window_size=(0, 0),
                                                 implementation=implementation)

    # One program for the forward values and the gradients.
    (output, weights), grads = jax.jit(lambda q, k, v: (f(q, k, v), jax.grad(
        lambda q, k, v: jnp.sum(f(q, k, v)[0]), argnums=(0, 1, 2))(q, k, v)))(q, k, v)
    output, weights = np.asarray(output), np.asarray(weights)
    assert _all_finite((output, weights))
    np.testing.assert_array_equal(weights[0, :, 3:], 0.0)
    np.testing.assert_array_equal(output[0, :, 3:], 0.0)
    np.testing.assert_allclose(weights[1].sum(-1), 1.0, rtol=1e-12)
    assert _all_finite(grads)
    np.testing.assert_array_equal(np.asarray(grads[0])[0, :, 3:], 0.0)


def test_softcap_bounds_the_scores_and_scale_multiplies_them(x64):
    q, k, _ = _gqa_inputs()
    q = 50.0 * q  # scores far beyond the cap
    d = GQA.H

    @jax.jit  # one program rather than one per primitive
    def weights_and_expected(q, k):
        uncapped = jnp.einsum("bngtd,bnsd->bngts", q.reshape(GQA.B, GQA.K, 2, GQA.T, d), k)
        uncapped = uncapped.reshape(GQA.B, GQA.N, GQA.T, GQA.S) / math.sqrt(d)
        capped = 3.0 * jnp.tanh(uncapped / 3.0)
        return (jax_scoring.dot_product_attention_weights(q, k, logit_softcap=3.0),
                jax.nn.softmax(capped, axis=-1),
                jax_scoring.dot_product_attention_weights(q / 50.0, k, scale=0.25),
                jax.nn.softmax(uncapped / 50.0 * math.sqrt(d) * 0.25, axis=-1))

    weights, expected, scaled, expected_scaled = map(np.asarray, weights_and_expected(q, k))
    np.testing.assert_allclose(weights, expected, rtol=1e-12, atol=1e-15)
    # The largest weight ratio within a row is at most e^(2c).
    ratio = weights.max(-1) / weights.min(-1)
    assert float(ratio.max()) <= math.exp(6.0) * (1 + 1e-9)
    np.testing.assert_allclose(scaled, expected_scaled, rtol=1e-12)


BAD_VARIANTS = [
    ({"scale": "0.5"}, TypeError, "scale must be a real number (or None for 1 / sqrt(d)), got str"),
    ({"scale": True}, TypeError, "scale must be a real number"),
    ({"scale": float("inf")}, ValueError, "scale must be finite, got inf"),
    ({"scale": np.ones(2)}, TypeError, "got an array of dtype float64 with shape (2,)"),
    ({"logit_softcap": 0.0}, ValueError, "logit_softcap must be a finite number > 0, got 0.0"),
    ({"logit_softcap": -2}, ValueError, "logit_softcap must be a finite number > 0, got -2"),
    ({"logit_softcap": "1"}, TypeError, "logit_softcap must be a positive number (or None)"),
    ({"local_window_size": -1}, ValueError, "local_window_size must be >= 0 on both sides"),
    ({"local_window_size": (1, -2)}, ValueError, "local_window_size must be >= 0 on both sides"),
    ({"local_window_size": (1, 2, 3)}, TypeError,
     "local_window_size must be an int w (= (w, w)) or a pair of ints (left, right), got tuple"),
    ({"local_window_size": 1.5}, TypeError, "local_window_size must be an int w"),
    ({"local_window_size": (True, 1)}, TypeError, "local_window_size must be an int w"),
]


@pytest.mark.parametrize("arguments, error, message", BAD_VARIANTS,
                         ids=[str(a) for a, _, _ in BAD_VARIANTS])
def test_bad_variant_arguments(arguments, error, message):
    """Refused with the same message by every dot-product entry point, NumPy and JAX, plain and
    chunked."""
    q, k, v = (np.asarray(a) for a in _gqa_inputs(dtype=jnp.float32))
    calls = [
        lambda: jax_scoring.dot_product_attention(q, k, v, **arguments),
        lambda: jax_scoring.dot_product_attention(q, k, v, implementation="chunked", **arguments),
        lambda: jax_scoring.dot_product_attention_weights(q, k, **arguments),
        lambda: efficient.dot_product_attention(q, k, v, **arguments),
        lambda: jax_scoring.DotProductAttention()(q, k, v, **arguments),
        lambda: np_scoring.dot_product_attention(q, k, v, **arguments),
        lambda: np_scoring.dot_product_attention_weights(q, k, **arguments),
    ]
    for call in calls:
        with pytest.raises(error, match=re.escape(message)):
            call()


def test_traced_scale_is_refused():
    q, k, v = _gqa_inputs(dtype=jnp.float32)
    with pytest.raises(TypeError, match="scale must be a static number"):
        jax.jit(lambda s: jax_scoring.dot_product_attention(q, k, v, scale=s))(0.5)


@pytest.mark.parametrize("key_heads", [3, 8])
def test_key_heads_must_divide_query_heads(key_heads):
    q = np.ones((2, 4, 5, 4), np.float32)
    k = np.ones((2, key_heads, 6, 4), np.float32)
    message = (f"must share their batch axes (or, for grouped-query attention, (B, ..., N_kv, S, k) "
               f"with N_kv dividing the queries' N heads: (B, ..., N, T, q)), got queries "
               f"(2, 4, 5, 4) and keys (2, {key_heads}, 6, 4)")
    for call in (jax_scoring.dot_product_attention, np_scoring.dot_product_attention,
                 efficient.dot_product_attention):
        with pytest.raises(ValueError, match=re.escape(message)):
            call(q, k, k)
    # Three axes have no head axis: (B, T, d) against (B', S, d) is a batch mismatch.
    with pytest.raises(ValueError, match="must share their batch axes"):
        jax_scoring.dot_product_attention(q[:, 0], k[:1, 0], k[:1, 0])


def test_unbatched_lengths_must_be_scalar_or_per_query():
    q, k = np.ones((5, 4), np.float32), np.ones((6, 4), np.float32)
    message = ("valid_lens of unbatched queries (T, q) = (5, 4) must have shape () or (T,) = (5,), "
               "got (2,)")
    for call in (jax_scoring.dot_product_attention, np_scoring.dot_product_attention):
        with pytest.raises(ValueError, match=re.escape(message)):
            call(q, k, k, np.array([1, 2]))


def test_unbatched_module_sows_weights_without_a_batch_axis():
    q, k, v = (_normal(shape, seed=i) for i, shape in enumerate(((4, 3), (6, 3), (6, 2))))

    @jax.jit  # one program rather than one per primitive
    def sown_and_expected(q, k, v):
        module = jax_scoring.DotProductAttention(sow_weights=True)
        output, intermediates = nnx.capture(module, nnx.Intermediate)(q, k, v, 5, is_causal=True)
        (weights,) = intermediates["attention_weights"].get_value()
        return (output, weights), jax_scoring.dot_product_attention(q, k, v, 5, is_causal=True)

    (output, weights), expected = sown_and_expected(q, k, v)
    assert output.shape == (4, 2) and weights.shape == (4, 6)
    for got, want in zip((output, weights), expected):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


# --------------------------------------------------------------------------- dropout_attention


def _dropout_reference(queries, keys, values, keep, rate, rng):
    """The composition the core computes, written with plain autodiff: the scaled scores, the
    masked softmax, the library's dropout and the weighted sum (no custom derivative)."""
    from jax_attention.nn.dropout import dropout

    scores = jnp.einsum("...tq,...sq->...ts", queries / math.sqrt(queries.shape[-1]), keys)
    weights = jax_masking.softmax_where(scores, keep).astype(queries.dtype)
    return jax_scoring.weighted_sum(dropout(weights, rate, rng), values), weights


def _dropout_case(dtype, seed=0):
    B, N, T, S, H, V = 3, 2, 4, 5, 4, 3
    queries, keys, values = (_normal(shape, dtype, seed + i) for i, shape in
                             enumerate([(B, N, T, H), (B, N, S, H), (B, N, S, V)]))
    # The first sequence attends nothing (fully masked rows), the others a prefix; causal too.
    valid = np.asarray([0, 3, 5])
    keep = _device((np.arange(S)[None, None, None, :] < valid[:, None, None, None])
                   & (np.arange(S)[None, :] <= np.arange(T)[:, None] + 1)[None, None])
    cotangents = (_normal((B, N, T, V), dtype, seed + 7), _normal((B, N, T, S), dtype, seed + 8))
    return (queries, keys, values), keep, cotangents, jax.random.key(seed + 3, impl="rbg")


@pytest.mark.parametrize("jit", [False, True])
def test_dropout_attention_forward_is_the_composition_bit_for_bit(jit):
    (queries, keys, values), keep, _, rng = _dropout_case(jnp.float32)
    fused = jax_scoring.dropout_attention
    if jit:
        fused = jax.jit(fused, static_argnums=4)
    output, weights = fused(queries, keys, values, keep, 0.3, rng)
    expected_output, expected_weights = _dropout_reference(queries, keys, values, keep, 0.3, rng)
    np.testing.assert_array_equal(output, expected_output)
    np.testing.assert_array_equal(weights, expected_weights)
    output, weights = np.asarray(output), np.asarray(weights)
    assert not np.any(output[0]) and not np.any(weights[0])  # the sequence that attends nothing


@pytest.mark.parametrize("dtype, tolerance", [(jnp.float32, 2e-6), (jnp.float64, 1e-13)])
def test_dropout_attention_gradients_match_autodiff_of_the_composition(dtype, tolerance, x64):
    inputs, keep, (d_output, d_weights), rng = _dropout_case(dtype)

    def loss(function):
        def value(*arrays):
            output, weights = function(*arrays, keep, 0.3, rng)
            return jnp.sum(output * d_output) + jnp.sum(weights * d_weights)
        return value

    fused = jax.jit(jax.grad(loss(jax_scoring.dropout_attention), argnums=(0, 1, 2)))(*inputs)
    # jit only to compile the reference's gradient once rather than primitive by primitive.
    expected = jax.jit(jax.grad(loss(_dropout_reference), argnums=(0, 1, 2)))(*inputs)
    for got, want in zip(fused, expected, strict=True):
        assert got.dtype == dtype and np.isfinite(np.asarray(got)).all()
        np.testing.assert_allclose(got, want, rtol=tolerance, atol=tolerance)
    assert not np.any(np.asarray(fused[0])[0])  # no gradient reaches queries that attend nothing


def test_dropout_attention_vmaps_and_keeps_masked_inputs_out_of_the_gradients():
    (queries, keys, values), keep, (d_output, _), rng = _dropout_case(jnp.float32)
    # NaN in keys and values nobody attends (sequence 0 attends nothing; its keys are never read).
    poisoned = np.array(keys), np.array(values)
    poisoned[0][0], poisoned[1][0] = np.nan, np.inf
    # Jitted, the gradient and the batched forward pass compile once each rather than primitive
    # by primitive; the unbatched forward pass stays eager.
    grads = jax.jit(jax.grad(lambda q, k, v: jnp.sum(jax_scoring.dropout_attention(
        q, k, v, keep, 0.3, rng)[0][1:] * d_output[1:]), argnums=(0, 1, 2)))(queries, *poisoned)
    assert all(np.isfinite(np.asarray(g)[1:]).all() for g in grads)
    batched = jax.jit(jax.vmap(lambda q: jax_scoring.dropout_attention(q, keys, values, keep, 0.3,
                                                                       rng)[0]))(
        np.asarray(queries)[None])
    np.testing.assert_array_equal(
        np.asarray(batched)[0],
        jax_scoring.dropout_attention(queries, keys, values, keep, 0.3, rng)[0])


def test_dropout_attention_forward_mode_matches_autodiff_x64(x64):
    """The core's one rule serves forward mode too, dropout on: ``jax.jvp`` equals plain
    autodiff's."""
    inputs, keep, _, rng = _dropout_case(jnp.float64)
    directions = tuple(_normal(x.shape, jnp.float64, 20 + i) for i, x in enumerate(inputs))
    got = jax.jvp(lambda *a: jax_scoring.dropout_attention(*a, keep, 0.3, rng), inputs,
                  directions)
    want = jax.jvp(lambda *a: _dropout_reference(*a, keep, 0.3, rng), inputs, directions)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)


def test_dropout_attention_takes_grouped_heads_and_half_precision():
    """Every path takes what the core takes: grouped key/value heads (each serving its group,
    not repeated) and bfloat16 (scores and softmax in float32)."""
    (queries, keys, values), keep, (d_output, _), rng = _dropout_case(jnp.float32)
    one_kv = tuple(_device(np.asarray(a)[:, :1]) for a in (keys, values))  # N_kv = 1 of N = 2
    repeated = tuple(jnp.repeat(a, 2, axis=1) for a in one_kv)

    def loss(q, k, v):
        return jnp.sum(jax_scoring.dropout_attention(q, k, v, keep, 0.3, rng)[0] * d_output)

    grouped, grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))(queries, *one_kv)
    plain, plain_grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))(queries, *repeated)
    np.testing.assert_allclose(grouped, plain, rtol=1e-6)
    np.testing.assert_allclose(grads[0], plain_grads[0], rtol=1e-5, atol=1e-6)
    for g, p in zip(grads[1:], plain_grads[1:]):  # summed over the group
        np.testing.assert_allclose(g, jnp.sum(p, axis=1, keepdims=True), rtol=1e-5, atol=1e-6)
    half = tuple(_device(a, jnp.bfloat16) for a in (queries, keys, values))
    output, weights = jax_scoring.dropout_attention(*half, keep, 0.3, rng)
    expected = _dropout_reference(*(a.astype(jnp.float32) for a in half), keep, 0.3, rng)
    assert output.dtype == weights.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(output, np.float32), expected[0], rtol=0.05, atol=0.05)


def test_dropout_attention_checks_its_inputs():
    (queries, keys, values), keep, _, rng = _dropout_case(jnp.float32)
    with pytest.raises(ValueError, match="same leading axes"):
        jax_scoring.dropout_attention(queries, *(_device(np.asarray(a)[:1]) for a in
                                                 (keys, values)), keep, 0.3, rng)


# --------------------------------------------------------------------------- projected additive keys


@pytest.mark.parametrize("valid_lens", [None, (0, 5)])
def test_additive_weights_of_projected_keys_are_the_weights_bit_for_bit(valid_lens):
    params = _params()
    queries, keys, _ = _inputs("additive")
    valid_lens = None if valid_lens is None else _lens(valid_lens)
    projected = jax.jit(jax_scoring.additive_key_projection)(params, keys, valid_lens)
    got = jax.jit(jax_scoring.additive_attention_weights_of_projected)(params, queries,
                                                                       projected, valid_lens)
    want = jax.jit(jax_scoring.additive_attention_weights)(params, queries, keys, valid_lens)
    np.testing.assert_array_equal(got, want)

    def loss(function, *arrays):
        return jnp.sum(function(*arrays) ** 2)

    # jit only to compile both gradients in one program rather than primitive by primitive.
    got, want = jax.jit(lambda p, q, k: (jax.grad(lambda p, q, k: loss(
        jax_scoring.additive_attention_weights_of_projected, p, q,
        jax_scoring.additive_key_projection(p, k, valid_lens), valid_lens),
        argnums=(0, 1, 2))(p, q, k), jax.grad(lambda p, q, k: loss(
            jax_scoring.additive_attention_weights, p, q, k, valid_lens),
        argnums=(0, 1, 2))(p, q, k)))(params, queries, keys)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_projected_additive_keys_name_their_bad_shapes():
    params = _params()
    queries, keys, _ = _inputs("additive")
    with pytest.raises(ValueError, match=r"params\['W_k'\] must have shape \(k, h\)"):
        jax_scoring.additive_key_projection(params, keys[..., :-1])
    projected = jax_scoring.additive_key_projection(params, keys)
    with pytest.raises(ValueError, match=r"params\['W_q'\] and params\['w_v'\]"):
        jax_scoring.additive_attention_weights_of_projected(params, queries[..., :-1], projected)
    with pytest.raises(ValueError, match="missing"):
        jax_scoring.additive_key_projection({"W_k": params["W_k"]}, keys)
