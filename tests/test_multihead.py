"""Properties of JAX multi-head attention (d2l §11.5), self-attention and positions (§11.6).

jit and no-jit (chex variants), shapes with the docs/design.md letters, the book's head split,
vmap, gradients against finite differences, fully masked rows and NaN in padding, hypothesis properties
against the NumPy reference, permutation equivariance of self-attention (and its loss with
sinusoidal positions), a relative position bias in the scores, the NNX module (book example shapes,
sown weights, dropout) and bad input (JAX and NumPy alike).
"""

from __future__ import annotations

import functools
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

from jax_attention.nn import multihead as jax_mh
from jax_attention.nn import positional as jax_pos
from jax_attention.nn.scoring import dot_product_attention_weights
from reference_numpy import multihead as np_mh
from tests.hypothesis_support import examples, sizes

# q, k, v: input sizes of queries, keys and values; D = N * H. The parameter shapes are those of
# tests/parity/test_multihead.py: each new shape costs a compiled random init of the module.
DIMS = chex.Dimensions(B=2, T=3, S=4, N=2, H=4, D=8, q=3, k=5, v=6)


# Test data go to the device with jax.device_put of a NumPy array of the final dtype: jnp.asarray
# compiles a conversion program for every new shape and dtype.
def _normal(shape, dtype=jnp.float32, seed=0, scale=1.0):
    return jax.device_put(np.asarray(scale * np.random.default_rng(seed).normal(size=shape), dtype))


def _params(dtype=jnp.float32, biases=True, seed=10):
    params = {
        "W_q": _normal(DIMS["qD"], dtype, seed, 0.5),
        "W_k": _normal(DIMS["kD"], dtype, seed + 1, 0.5),
        "W_v": _normal(DIMS["vD"], dtype, seed + 2),
        "W_o": _normal(DIMS["DD"], dtype, seed + 3),
    }
    if biases:
        params.update({name: _normal(DIMS["D"], dtype, seed + 4 + i) for i, name in
                       enumerate(("b_q", "b_k", "b_v", "b_o"))})
    return params


def _inputs(dtype=jnp.float32, seed=1):
    return (_normal(DIMS["BTq"], dtype, seed), _normal(DIMS["BSk"], dtype, seed + 1),
            _normal(DIMS["BSv"], dtype, seed + 2))


def _lens(values):
    return jax.device_put(np.asarray(values, np.int32))


def _keep_from_lens(lens, num_queries, num_keys):
    lens = np.asarray(lens)
    if lens.ndim == 1:
        lens = np.repeat(lens[:, None], num_queries, axis=1)
    return np.arange(num_keys) < lens[..., None]  # (B, T, S)


def _assert_weights_valid(weights, keep):
    """Masked weights exactly 0; rows sum to 1, or exactly 0 when fully masked."""
    weights = np.asarray(weights, np.float64)
    keep = np.broadcast_to(np.asarray(keep), weights.shape)
    assert (weights[~keep] == 0).all()
    sums = weights.sum(axis=-1)
    np.testing.assert_allclose(sums, keep.any(axis=-1).astype(np.float64), rtol=1e-6, atol=1e-6)


def _all_finite(tree):
    # In NumPy: an eager jnp.isfinite would compile a program per leaf shape and dtype.
    return all(bool(np.isfinite(np.asarray(leaf, np.float32)).all())
               for leaf in jax.tree.leaves(tree))


def _mha(params, *args, **kwargs):
    return jax_mh.multi_head_attention(params, *args, num_heads=DIMS.N, **kwargs)


# The single-head oracle of the head-split test, compiled once for its two heads.
_jitted_weights = jax.jit(dot_product_attention_weights)


def _hand_weights(params, queries, keys, keep, bias):
    """``softmax(Q_n K_n^T / sqrt(H) + bias)`` over the kept keys, in float64 NumPy by hand."""
    p = {name: np.asarray(value, np.float64) for name, value in params.items()}
    q = (np.asarray(queries, np.float64) @ p["W_q"] + p["b_q"]).reshape(DIMS["BTNH"]).transpose(0, 2, 1, 3)
    k = (np.asarray(keys, np.float64) @ p["W_k"] + p["b_k"]).reshape(DIMS["BSNH"]).transpose(0, 2, 1, 3)
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(DIMS.H) + np.asarray(bias, np.float64)
    scores = np.where(keep, scores, -np.inf)
    exp = np.exp(scores - scores.max(-1, keepdims=True))
    return exp / exp.sum(-1, keepdims=True)


# --------------------------------------------------------------------------- jit and no jit


class MultiHeadVariantsTest(chex.TestCase):
    """Lengths, masks and biases are arguments, so under jit they are traced as in a training step."""

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.parameters([(2, 4)], [((0, 1, 4), (4, 2, 3))])
    def test_shapes_and_weights(self, lens):
        output, weights = self.variant(_mha)(_params(), *_inputs(), _lens(lens))
        chex.assert_shape(output, DIMS["BTD"])
        chex.assert_shape(weights, DIMS["BNTS"])
        chex.assert_type([output, weights], jnp.float32)
        # The lengths hold for every head.
        _assert_weights_valid(weights, _keep_from_lens(lens, DIMS.T, DIMS.S)[:, None])

    @chex.variants(with_jit=True, without_jit=True)
    def test_per_head_mask_causal_and_bias(self):
        params, (queries, keys, values) = _params(), _inputs()
        mask = jax.device_put(np.random.default_rng(2).random(DIMS["BNTS"]) < 0.7)
        bias = _normal((1,) + DIMS["NTS"], seed=3)
        lens = _lens((4, 3))

        def fn(params, q, k, v, lens, mask, bias):
            return _mha(params, q, k, v, lens, mask=mask, is_causal=True, bias=bias)

        output, weights = self.variant(fn)(params, queries, keys, values, lens, mask, bias)
        chex.assert_shape(output, DIMS["BTD"])
        causal = np.arange(DIMS.S)[None, :] <= np.arange(DIMS.T)[:, None]
        keep = _keep_from_lens(lens, DIMS.T, DIMS.S)[:, None] & np.asarray(mask) & causal
        _assert_weights_valid(weights, keep)
        expected = np.nan_to_num(_hand_weights(params, queries, keys, keep, bias))  # empty rows: 0
        np.testing.assert_allclose(np.asarray(weights), expected, rtol=1e-5, atol=1e-6)

    @chex.variants(with_jit=True)
    def test_heads_are_the_books_column_blocks(self):
        # Head n attends with columns n*H .. (n+1)*H - 1 of the projections (d2l's transpose_qkv),
        # and the output is concat(heads) W_o + b_o.
        params, (queries, keys, values) = _params(), _inputs()

        def fn(params, q, k, v):
            heads = jax_mh.project_heads(params, q, k, v, num_heads=DIMS.N)
            return _mha(params, q, k, v), heads

        (output, weights), heads = self.variant(fn)(params, queries, keys, values)
        # In NumPy from here: indexing the JAX arrays would compile a program per slice.
        heads_q, heads_k, heads_v = (np.asarray(h) for h in heads)
        weights = np.asarray(weights)
        projected_q = np.asarray(queries) @ np.asarray(params["W_q"]) + np.asarray(params["b_q"])
        projected_k = np.asarray(keys) @ np.asarray(params["W_k"]) + np.asarray(params["b_k"])
        projected_v = np.asarray(values) @ np.asarray(params["W_v"]) + np.asarray(params["b_v"])
        concat = []
        for n in range(DIMS.N):
            block = slice(n * DIMS.H, (n + 1) * DIMS.H)
            pairs = ((heads_q, projected_q), (heads_k, projected_k), (heads_v, projected_v))
            for heads, projected in pairs:
                np.testing.assert_allclose(heads[:, n], projected[..., block], rtol=1e-5, atol=1e-5)
            single = _jitted_weights(jax.device_put(projected_q[..., block]),
                                     jax.device_put(projected_k[..., block]))
            np.testing.assert_allclose(weights[:, n], np.asarray(single), rtol=1e-5, atol=1e-6)
            concat.append(weights[:, n] @ projected_v[..., block])
        expected = np.concatenate(concat, -1) @ np.asarray(params["W_o"]) + np.asarray(params["b_o"])
        np.testing.assert_allclose(np.asarray(output), expected, rtol=1e-4, atol=1e-4)
        chex.assert_shape([heads_q, heads_k, heads_v], [DIMS["BNTH"], DIMS["BNSH"], DIMS["BNSH"]])

    @chex.variants(with_jit=True, without_jit=True)
    def test_transpose_qkv_and_transpose_output(self):
        X = _normal(DIMS["BTD"], seed=4)

        def fn(X):
            book = jax_mh.transpose_qkv(X, DIMS.N)
            return book, jax_mh.transpose_output(book, DIMS.N)

        book, back = self.variant(fn)(X)
        chex.assert_shape(book, (DIMS.B * DIMS.N, DIMS.T, DIMS.H))
        np.testing.assert_array_equal(np.asarray(back), np.asarray(X))
        X, book = np.asarray(X), np.asarray(book)
        for b in range(DIMS.B):
            for n in range(DIMS.N):
                # The book's layout: row b * N + n holds head n of example b.
                block = slice(n * DIMS.H, (n + 1) * DIMS.H)
                np.testing.assert_array_equal(book[b * DIMS.N + n], X[b, :, block])

    @chex.variants(with_jit=True, without_jit=True)
    def test_fully_masked_rows(self):
        self._check_fully_masked_rows(self.variant, jnp.float32, with_grads=True)

    # Half precision under jit and without gradients only: each dtype compiles everything anew.
    @chex.variants(with_jit=True)
    @parameterized.parameters([jnp.bfloat16], [jnp.float16])
    def test_fully_masked_rows_in_half_precision(self, dtype):
        self._check_fully_masked_rows(self.variant, dtype, with_grads=False)

    @staticmethod
    def _check_fully_masked_rows(variant, dtype, with_grads):
        # Example 0 has valid length 0; query 0 of example 1 has an all-False mask row in every head.
        params, inputs = _params(dtype), _inputs(dtype)
        lens = _lens((0, 4))
        mask = np.ones(DIMS["B1TS"], bool)
        mask[1, 0, 0] = False
        mask = jax.device_put(mask)

        def fn(params, q, k, v, lens, mask):
            if not with_grads:
                return (*_mha(params, q, k, v, lens, mask=mask), ())
            (output, weights), vjp = jax.vjp(lambda *a: _mha(*a, lens, mask=mask), params, q, k, v)
            return output, weights, vjp((jnp.ones_like(output), jnp.zeros_like(weights)))

        output, weights, grads = variant(fn)(params, *inputs, lens, mask)
        chex.assert_type([output, weights], dtype)
        empty = np.zeros(DIMS["BT"], bool)
        empty[0] = empty[1, 0] = True
        # float32 in NumPy (exact for the half types; an eager astype compiles a program).
        assert (np.asarray(weights, np.float32).transpose(0, 2, 1, 3)[empty] == 0).all()
        # Zero weights, so zero heads: the output of an empty row is the output bias b_o.
        np.testing.assert_array_equal(np.asarray(output, np.float32)[empty],
                                      np.broadcast_to(np.asarray(params["b_o"], np.float32),
                                                      (int(empty.sum()), DIMS.D)))
        assert _all_finite((output, grads))

    @chex.variants(with_jit=True, without_jit=True)
    def test_nan_and_inf_in_padding_do_not_leak(self):
        # Keys/values 2.. of example 0 are padding and query 2 of example 0 attends nothing: NaN and
        # Inf there must reach neither the valid outputs nor any gradient (of the parameters too).
        params, (queries, keys, values) = _params(), _inputs()
        lens = _lens(((2, 2, 0), (4, 3, 4)))
        # Set up in NumPy: eager scatters and broadcasts would compile a program each.
        dirty = [np.array(a) for a in (queries, keys, values)]
        dirty[0][0, 2], dirty[1][0, 2:], dirty[2][0, 2:] = np.nan, np.inf, np.nan
        dirty = [jax.device_put(a) for a in dirty]
        valid_rows = np.ones(DIMS["BT"], bool)
        valid_rows[0, 2] = False
        row_weights = jax.device_put(
            np.broadcast_to(valid_rows[..., None], DIMS["BTD"]).astype(np.float32))

        def fn(params, q, k, v, lens):
            (output, weights), vjp = jax.vjp(lambda *a: _mha(*a, lens), params, q, k, v)
            return (output, weights), vjp((row_weights, jnp.zeros_like(weights)))

        (clean_out, clean_w), clean_grads = self.variant(fn)(params, queries, keys, values, lens)
        (dirty_out, dirty_w), dirty_grads = self.variant(fn)(params, *dirty, lens)
        np.testing.assert_array_equal(np.asarray(dirty_out)[valid_rows], np.asarray(clean_out)[valid_rows])
        np.testing.assert_array_equal(np.asarray(dirty_w), np.asarray(clean_w))
        assert _all_finite(dirty_out) and _all_finite(dirty_grads)
        chex.assert_trees_all_equal(dirty_grads[0], clean_grads[0])  # parameter gradients

    @chex.variants(with_jit=True, without_jit=True)
    def test_module_self_attention_equals_the_function(self):
        module = jax_mh.MultiHeadAttention(DIMS.D, DIMS.N, rngs=nnx.Rngs(0))
        graphdef, state = nnx.split(module)
        X = _normal(DIMS["BTD"], seed=5)
        lens = _lens((3, 1))

        def fn(state, X, lens):
            return nnx.merge(graphdef, state)(X, X, X, lens)

        output = self.variant(fn)(state, X, lens)
        expected, _ = jax_mh.multi_head_attention(module.params_dict(), X, X, X, lens, num_heads=DIMS.N)
        chex.assert_shape(output, DIMS["BTD"])
        np.testing.assert_allclose(np.asarray(output), np.asarray(expected), rtol=1e-6, atol=1e-6)


def test_identical_keys_give_the_projected_mean_of_valid_values():
    # A hand-worked value: equal keys give every valid key the same weight in every head, so each
    # head outputs the mean of the valid projected values and the layer (mean(V) W_v + b_v) W_o + b_o.
    params, (queries, keys, values) = _params(), _inputs()
    keys = jax.device_put(np.broadcast_to(np.asarray(keys)[:, :1], keys.shape))
    output, weights = jax.jit(_mha)(params, queries, keys, values, _lens((2, 4)))
    weights = np.asarray(weights)
    p = {name: np.asarray(value, np.float64) for name, value in params.items()}
    means = np.stack([np.asarray(values[0, :2]).mean(0), np.asarray(values[1]).mean(0)])
    expected = (means @ p["W_v"] + p["b_v"]) @ p["W_o"] + p["b_o"]
    np.testing.assert_allclose(np.asarray(output), np.broadcast_to(expected[:, None], DIMS["BTD"]),
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(weights[0, :, :, :2], 0.5, rtol=1e-6)
    np.testing.assert_allclose(weights[1], 0.25, rtol=1e-6)


# --------------------------------------------------------------------------- vmap and gradients


def test_vmap_matches_loop():
    # An extra leading axis of 3 over the inputs and lengths; the parameters are shared. The
    # inputs are NumPy arrays and the loop's calls are jitted (one program for the 3 calls).
    params = _params()
    queries, keys, values = (np.stack([np.asarray(a) * (i + 1) for i in range(3)])
                             for a in _inputs())
    lens = np.random.default_rng(6).integers(0, DIMS.S + 1, size=(3,) + DIMS["BT"]).astype(np.int32)

    def attention(q, k, v, lens):
        return _mha(params, q, k, v, lens, is_causal=True)

    got = jax.jit(jax.vmap(attention))(queries, keys, values, lens)
    loop = jax.jit(attention)
    expected = jax.tree.map(lambda *xs: np.stack(xs),
                            *[loop(queries[i], keys[i], values[i], lens[i]) for i in range(3)])
    chex.assert_trees_all_close(got, expected, rtol=1e-5, atol=1e-5)
    chex.assert_shape(got, [(3,) + DIMS["BTD"], (3,) + DIMS["BNTS"]])


GRADIENT_CASES = [
    ("lens BT with an empty row, per-head mask, causal and a bias",
     ((1, 0, 3), (4, 2, 4)), "random", True, True),
]


@pytest.mark.parametrize("name, lens, mask, is_causal, with_bias", GRADIENT_CASES,
                         ids=[case[0] for case in GRADIENT_CASES])
def test_gradients_match_finite_differences(x64, name, lens, mask, is_causal, with_bias):
    lens = None if lens is None else _lens(lens)
    if mask is not None:
        mask = jax.device_put(np.random.default_rng(8).random(DIMS["BNTS"]) < 0.6)
    bias = _normal((1,) + DIMS["NTS"], jnp.float64, 9) if with_bias else None

    def f(params, q, k, v, bias):
        return _mha(params, q, k, v, lens, mask=mask, is_causal=is_causal, bias=bias)

    # jit only to compile the many finite-difference evaluations once; the eager gradients are
    # exercised by the chex variants above.
    check_grads(jax.jit(f), (_params(jnp.float64), *_inputs(jnp.float64), bias), order=1, modes=("rev",))


# --------------------------------------------------------------------------- hypothesis


# Every new shape costs a compilation: hence one jitted function and small ranges.
_jitted_mha = jax.jit(jax_mh.multi_head_attention, static_argnames=("num_heads", "is_causal"))


@st.composite
def _cases(draw):
    B, T, S = draw(sizes(1, 2)), draw(sizes(1, 3)), draw(sizes(1, 3))
    N, H = draw(sizes(1, 2)), draw(sizes(1, 2))
    widths = [draw(sizes(1, 3)) for _ in range(3)]
    lens = np.asarray(draw(st.lists(st.integers(0, S), min_size=B, max_size=B)), np.int32)
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    params = {"W_q": rng.normal(size=(widths[0], N * H)), "W_k": rng.normal(size=(widths[1], N * H)),
              "W_v": rng.normal(size=(widths[2], N * H)), "W_o": rng.normal(size=(N * H, N * H)),
              "b_o": rng.normal(size=(N * H,))}
    inputs = (rng.normal(size=(B, T, widths[0])), rng.normal(size=(B, S, widths[1])),
              rng.normal(size=(B, S, widths[2])))
    return params, inputs, lens, N, draw(st.booleans())


@hypothesis.settings(max_examples=examples(ci=10, dev=25))
@hypothesis.given(_cases())
def test_property_matches_reference(case):
    params, (queries, keys, values), lens, num_heads, is_causal = case
    expected = np_mh.multi_head_attention(params, queries, keys, values, lens, num_heads=num_heads,
                                          is_causal=is_causal)
    with jax.enable_x64(True):
        got = _jitted_mha({name: jax.device_put(p) for name, p in params.items()},
                          *(jax.device_put(a) for a in (queries, keys, values)),
                          jax.device_put(lens),
                          num_heads=num_heads, is_causal=is_causal)
        got = [np.asarray(g) for g in got]
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-11, atol=1e-11)
    T, S = queries.shape[1], keys.shape[1]
    keep = _keep_from_lens(lens, T, S)[:, None]
    if is_causal:
        keep = keep & (np.arange(S)[None, :] <= np.arange(T)[:, None])
    _assert_weights_valid(got[1], keep)
    empty = ~keep[:, 0].any(-1)  # (B, T): no key in any head, so the output is b_o
    np.testing.assert_array_equal(got[0][empty], np.broadcast_to(params["b_o"], got[0][empty].shape))


# --------------------------------------------------------------------------- self-attention and positions


@functools.cache
def _self_attention_and_positions():
    """A self-attention module (eval) and sinusoidal positions (eval), with a jitted forward."""
    module = jax_mh.MultiHeadAttention(DIMS.D, DIMS.N, 0.5, rngs=nnx.Rngs(3))
    positions = jax_pos.PositionalEncoding(DIMS.D, 0.5, max_len=16)
    module.eval()
    positions.eval()

    @functools.partial(nnx.jit, static_argnames="add_positions")
    def forward(module, positions, X, add_positions):
        X = positions(X) if add_positions else X
        return module(X, X, X)

    return module, positions, forward


@pytest.mark.parametrize("add_positions", [False, True])
def test_self_attention_is_permutation_equivariant_only_without_positions(add_positions):
    module, positions, forward = _self_attention_and_positions()
    X = _normal(DIMS["BTD"], seed=11)
    permutation = np.array([2, 0, 1])  # no fixed point
    output = forward(module, positions, X, add_positions=add_positions)
    permuted = forward(module, positions, X[:, permutation], add_positions=add_positions)
    if not add_positions:
        # Permuting the tokens permutes the output rows the same way (d2l §11.6.2: self-attention
        # alone does not see the order).
        np.testing.assert_allclose(np.asarray(permuted), np.asarray(output)[:, permutation],
                                   rtol=1e-5, atol=1e-5)
    else:
        difference = np.abs(np.asarray(permuted) - np.asarray(output)[:, permutation]).max()
        assert difference > 1e-2, difference


def test_relative_position_bias_changes_the_weights_as_added_scores():
    relative = jax_pos.RelativePositionBias(DIMS.N, 8, 6, rngs=nnx.Rngs(4))
    relative.table[...] = _normal(relative.table.shape, seed=12)  # larger than the 0.02 init
    bias = nnx.jit(lambda relative: relative(DIMS.T, DIMS.S))(relative)  # one program
    chex.assert_shape(bias, (1,) + DIMS["NTS"])
    params, (queries, keys, values) = _params(), _inputs()
    lens = _lens((3, 4))
    attention = jax.jit(functools.partial(_mha, params))
    _, plain = attention(queries, keys, values, lens)
    _, biased = attention(queries, keys, values, lens, bias=bias)
    assert np.abs(np.asarray(biased) - np.asarray(plain)).max() > 1e-2
    keep = _keep_from_lens(lens, DIMS.T, DIMS.S)[:, None]
    np.testing.assert_allclose(np.asarray(biased), _hand_weights(params, queries, keys, keep, bias),
                               rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- NNX module


def test_book_example_shapes():
    # d2l §11.5.3 and §11.6.1: 100 hiddens, 5 heads, a batch of 2 with 4 queries, 6 key-value pairs.
    attention = jax_mh.MultiHeadAttention(100, 5, 0.5, rngs=nnx.Rngs(0))
    attention.eval()
    X, Y = (jax.device_put(np.ones(shape, np.float32)) for shape in ((2, 4, 100), (2, 6, 100)))
    # Both calls in one compiled program.
    cross, self_ = nnx.jit(lambda m, X, Y, lens: (m(X, Y, Y, lens), m(X, X, X, lens)))(
        attention, X, Y, _lens((3, 2)))
    assert cross.shape == self_.shape == (2, 4, 100)
    params = attention.params_dict()
    shapes = {name: p.shape for name, p in params.items()}
    assert shapes == dict.fromkeys(("W_q", "W_k", "W_v", "W_o"), (100, 100))
    bound = np.sqrt(6 / 200)  # Xavier-uniform
    assert all(np.abs(np.asarray(p)).max() <= bound for p in params.values())


def test_module_sizes_sown_weights_and_dropout():
    module = jax_mh.MultiHeadAttention(DIMS.D, DIMS.N, 0.5, True, query_size=DIMS.q, key_size=DIMS.k,
                                       value_size=DIMS.v, sow_weights=True, rngs=nnx.Rngs(1))
    shapes = {name: p.shape for name, p in module.params_dict().items()}
    assert shapes == {"W_q": DIMS["qD"], "W_k": DIMS["kD"], "W_v": DIMS["vD"], "W_o": DIMS["DD"],
                      "b_q": DIMS["D"], "b_k": DIMS["D"], "b_v": DIMS["D"], "b_o": DIMS["D"]}
    assert all((np.asarray(module.params_dict()[f"b_{n}"]) == 0).all() for n in "qkvo")
    assert set(nnx.state(module, nnx.Param).keys()) == set(shapes)

    inputs, lens = _inputs(), _lens((2, 3))
    capture = nnx.capture(module, nnx.Intermediate)  # Flax deprecates sow outside nnx.capture
    module.eval()
    output, intermediates = capture(*inputs, lens)
    (weights,) = intermediates["attention"]["attention_weights"].get_value()
    expected_output, expected_weights = jax_mh.multi_head_attention(module.params_dict(), *inputs, lens,
                                                                    num_heads=DIMS.N)
    np.testing.assert_array_equal(np.asarray(weights), np.asarray(expected_weights))
    np.testing.assert_allclose(np.asarray(output), np.asarray(expected_output), rtol=1e-6, atol=1e-6)

    # Training mode: dropout on the weights changes the output, from the dropout stream; the sown
    # weights are those before dropout. "rbg" dropout keys, as in training: their masks compile
    # far faster than threefry's.
    module.train()
    key = functools.partial(jax.random.key, impl="rbg")
    first, intermediates = capture(*inputs, lens, rngs=nnx.Rngs(dropout=key(1)))
    np.testing.assert_array_equal(np.asarray(intermediates["attention"]["attention_weights"].get_value()[0]),
                                  np.asarray(weights))
    again, _ = capture(*inputs, lens, rngs=nnx.Rngs(dropout=key(1)))
    other, _ = capture(*inputs, lens, rngs=nnx.Rngs(dropout=key(2)))
    np.testing.assert_array_equal(np.asarray(first), np.asarray(again))
    assert np.abs(np.asarray(first) - np.asarray(output)).max() > 1e-3
    assert np.abs(np.asarray(first) - np.asarray(other)).max() > 1e-3
    # deterministic=True overrides training mode.
    deterministic, _ = capture(*inputs, lens, deterministic=True)
    np.testing.assert_array_equal(np.asarray(deterministic), np.asarray(output))


# --------------------------------------------------------------------------- bad input


def _both(function):
    """``(jax_mh.<function>, jnp)`` and ``(np_mh.<function>, np)``."""
    return [(getattr(jax_mh, function), jnp), (getattr(np_mh, function), np)]


def _call_both(xnp, *, params=None, inputs=None, **kwargs):
    params = {name: xnp.asarray(p) for name, p in (_params() if params is None else params).items()}
    inputs = [xnp.asarray(a) for a in (_inputs() if inputs is None else inputs)]
    function = jax_mh.multi_head_attention if xnp is jnp else np_mh.multi_head_attention
    kwargs.setdefault("num_heads", DIMS.N)
    return function(params, *inputs, **kwargs)


@pytest.mark.parametrize("num_heads, message", [
    (3, "num_hiddens must be divisible by num_heads, got num_hiddens=8 and num_heads=3"),
    (0, "num_heads must be an integer >= 1, got 0"),
    (True, "num_heads must be an integer >= 1, got True"),
    (2.0, "num_heads must be an integer >= 1, got 2.0"),
])
def test_bad_num_heads(num_heads, message):
    for xnp in (jnp, np):
        with pytest.raises(ValueError, match=re.escape(message)):
            _call_both(xnp, num_heads=num_heads)
    for split_heads, xnp in _both("split_heads"):
        with pytest.raises(ValueError, match=re.escape(message)):
            split_heads(xnp.zeros(DIMS["BTD"]), num_heads)
    with pytest.raises(ValueError, match=re.escape(message)):
        jax_mh.MultiHeadAttention(DIMS.D, num_heads, rngs=nnx.Rngs(0))


@pytest.mark.parametrize("change, message", [
    (lambda p: p.pop("W_o"), "params has missing keys ['W_o']: expected the keys "
                             "['W_q', 'W_k', 'W_v', 'W_o'] and optionally ['b_q', 'b_k', 'b_v', 'b_o']"),
    (lambda p: p.update(W_k=np.zeros((3, 8))), "params['W_k'] must have shape (5, 8), got (3, 8)"),
    (lambda p: p.update(W_v=np.zeros((6, 5))), "params['W_v'] must have a width N_kv * H_v "
                                                "divisible by num_kv_heads = 2, got shape (6, 5)"),
    # A value head size of 3 (W_v (6, 2 * 3)) needs W_o (2 * 3, E).
    (lambda p: p.update(W_v=np.zeros((6, 6))), "params['W_o'] must have shape (6, 8), got (8, 8)"),
    # 2 heads of H = 4: W_k's width 6 is no whole number of key/value heads.
    (lambda p: p.update(W_k=np.zeros((5, 6))), "params['W_k'] must have shape (5, 8), got (5, 6)"),
    (lambda p: p.update(b_o=np.zeros((8, 1))), "params['b_o'] must have shape (8,), got (8, 1)"),
])
def test_bad_params(change, message):
    params = {name: np.asarray(p) for name, p in _params().items()}
    change(params)
    for xnp in (jnp, np):
        with pytest.raises(ValueError, match=re.escape(message)):
            _call_both(xnp, params=params)


def test_bad_inputs():
    queries, keys, values = (np.asarray(a) for a in _inputs())
    cases = [
        ((queries[0], keys, values), ValueError,
         "queries (3, 3) are unbatched (T, q), so keys must be (S, k) too, got (2, 4, 5)"),
        ((queries[0, 0], keys, values), ValueError, "queries must have shape (B, len, size), got (3,)"),
        ((queries, keys, values[:, :3]), ValueError,
         "must share B and keys and values S, got queries (2, 3, 3), keys (2, 4, 5), values (2, 3, 6)"),
        ((queries[:1], keys, values), ValueError, "must share B"),
        ((queries, keys.astype(np.float16), values), TypeError,
         "queries, keys and values must share one float dtype"),
        ((queries.astype(bool), keys, values), TypeError, "queries must be numeric, got dtype bool"),
    ]
    for inputs, error, message in cases:
        for xnp in (jnp, np):
            with pytest.raises(error, match=re.escape(message)):
                _call_both(xnp, inputs=inputs)


@pytest.mark.parametrize("kwargs, error, message", [
    ({"mask": np.ones(DIMS["BTS"], bool)}, ValueError,
     "mask must have shape (T, S) or (B, N, T, S) (1 for broadcast axes); add the head axis explicitly"),
    ({"bias": np.zeros(DIMS["BTS"])}, ValueError, "bias must have shape (T, S) or (B, N, T, S)"),
    ({"bias": np.zeros((1, 2, 3, 5))}, ValueError,
     "bias must broadcast to the scores' shape (B, ..., T, S) = (2, 2, 3, 4), got shape (1, 2, 3, 5)"),
    ({"mask": np.ones(DIMS["TS"])}, TypeError, "mask"),
    ({"valid_lens": np.array([1, 5])}, ValueError, "valid_lens must lie in [0, S] = [0, 4]"),
])
def test_bad_masks_and_biases(kwargs, error, message):
    for xnp in (jnp, np):
        kwargs = {name: xnp.asarray(value) for name, value in kwargs.items()}
        with pytest.raises(error, match=re.escape(message)):
            _call_both(xnp, **kwargs)


def test_bad_head_layouts():
    for transpose_output, xnp in _both("transpose_output"):
        message = "X must have shape (B * N, T, H) with N = 3, got (4, 3, 2)"
        with pytest.raises(ValueError, match=re.escape(message)):
            transpose_output(xnp.zeros((4, 3, 2)), 3)
        with pytest.raises(ValueError, match="num_heads must be an integer >= 1, got 0"):
            transpose_output(xnp.zeros((4, 3, 2)), 0)
    for merge_heads, xnp in _both("merge_heads"):
        with pytest.raises(ValueError, match=re.escape("X must have shape (B, N, T, H), got (4, 3, 2)")):
            merge_heads(xnp.zeros((4, 3, 2)))
    for split_heads, xnp in _both("split_heads"):
        with pytest.raises(ValueError, match=re.escape("X must have shape (B, T, D), got (3, 8)")):
            split_heads(xnp.zeros((3, 8)), 2)


# --------------------------------------------------------------------------- issue 16: input checks


@pytest.mark.parametrize("change, message", [
    # A misspelled optional bias used to be dropped silently: the output had no b_o.
    (lambda p: p.update(B_o=p.pop("b_o")), "params has unexpected keys ['B_o']: expected the keys "
                                           "['W_q', 'W_k', 'W_v', 'W_o'] and optionally "
                                           "['b_q', 'b_k', 'b_v', 'b_o']"),
    (lambda p: p.update(W_x=p["W_q"]), "params has unexpected keys ['W_x']"),
    (lambda p: p.update(w_q=p.pop("W_q")), "params has unexpected keys ['w_q'] and missing keys "
                                           "['W_q']"),
])
def test_misspelled_or_extra_param_keys_are_named(change, message):
    params = {name: np.asarray(p) for name, p in _params().items()}
    change(params)
    for xnp in (jnp, np):
        with pytest.raises(ValueError, match=re.escape(message)):
            _call_both(xnp, params=params)
    heads = np.zeros((DIMS.B, DIMS.N, DIMS.T, DIMS.H), np.float32)
    for (project_heads, xnp), (combine_heads, _) in zip(_both("project_heads"),
                                                         _both("combine_heads")):
        with pytest.raises(ValueError, match=re.escape(message)):
            project_heads(params, *(xnp.asarray(a) for a in _inputs()), num_heads=DIMS.N)
        # combine_heads needs only W_o (W_q, W_k, W_v may be there), but refuses the same keys.
        unexpected = message.split(":")[0].split(" and missing")[0]
        with pytest.raises(ValueError, match=re.escape(unexpected)):
            combine_heads(params, xnp.asarray(heads))


def test_params_without_biases_or_with_some_are_accepted():
    params = {name: np.asarray(p) for name, p in _params().items()}
    del params["b_q"], params["b_v"]
    for xnp in (jnp, np):
        output, _ = _call_both(xnp, params=params)
        chex.assert_shape(output, DIMS["BTD"])


@pytest.mark.parametrize("is_causal", ["False", 1, np.array(True)], ids=["str", "int", "array"])
def test_is_causal_must_be_a_python_bool(is_causal):
    message = rf"is_causal must be a Python bool \(True or False\), got {type(is_causal).__name__}"
    for xnp in (jnp, np):
        with pytest.raises(TypeError, match=message):
            _call_both(xnp, is_causal=is_causal)
    module = jax_mh.MultiHeadAttention(DIMS.D, DIMS.N, query_size=DIMS.q, key_size=DIMS.k,
                                       value_size=DIMS.v, rngs=nnx.Rngs(0))
    with pytest.raises(TypeError, match=message):
        module(*_inputs(), is_causal=is_causal)
    with pytest.raises(TypeError, match=r"is_causal must be a static Python bool"):
        jax.jit(lambda c: _call_both(jnp, is_causal=c))(True)


# --------------------------------------------------------------------------- variants
# Grouped-query / multi-query heads, a separate value head size, scale, windows, soft-capping and
# unbatched inputs. (Values against the NumPy reference: tests/parity/test_multihead.py.)

GQA_HEADS = 4  # H = 2 with D = 8


def _repeated_kv(params, num_kv_heads, value_head_size):
    """The same layer with every key/value head's columns repeated for its N / N_kv query heads:
    plain multi-head attention with N key/value heads."""
    groups, head = GQA_HEADS // num_kv_heads, DIMS.D // GQA_HEADS

    def repeat(array, size):  # (..., N_kv * size) -> (..., N * size), head-major as split_heads
        split = array.reshape(array.shape[:-1] + (num_kv_heads, size))
        return jnp.repeat(split, groups, axis=-2).reshape(array.shape[:-1] + (-1,))

    repeated = dict(params)
    for name, size in (("W_k", head), ("b_k", head), ("W_v", value_head_size),
                       ("b_v", value_head_size)):
        repeated[name] = repeat(params[name], size)
    return repeated


@functools.partial(jax.jit, static_argnames=("num_kv_heads", "value_head_size"))
def _grouped_and_repeated(params, inputs, valid_lens, *, num_kv_heads, value_head_size):
    """``(outputs and weights, gradients of sum(output ** 2))`` of the GQA layer and of the layer
    with repeated key/value weights: one compiled program per head layout."""
    def grouped(params):
        return jax_mh.multi_head_attention(params, *inputs, valid_lens, num_heads=GQA_HEADS,
                                           is_causal=True, local_window_size=(1, 0))

    def repeated(params):
        return grouped(_repeated_kv(params, num_kv_heads, value_head_size))

    def loss(attention):
        return lambda params: jnp.sum(attention(params)[0] ** 2)

    return ((grouped(params), repeated(params)),
            (jax.grad(loss(grouped))(params), jax.grad(loss(repeated))(params)))


@pytest.mark.parametrize("num_kv_heads, value_head_size", [(2, 2), (1, 2), (2, 3), (4, 5)])
def test_gqa_layer_equals_the_layer_with_repeated_key_value_weights(x64, num_kv_heads,
                                                                    value_head_size):
    """A GQA module equals plain multi-head attention whose W_k, W_v (and biases) repeat each
    key/value head for its group — outputs, weights and the gradients of the shared heads (the
    sum over the copies). Under jit; the chex variants above run the layer eagerly."""
    module = jax_mh.MultiHeadAttention(DIMS.D, GQA_HEADS, bias=True, query_size=DIMS.q,
                                       key_size=DIMS.k, value_size=DIMS.v,
                                       num_kv_heads=num_kv_heads, value_head_size=value_head_size,
                                       param_dtype=jnp.float64, rngs=nnx.Rngs(3))
    params = module.params_dict()
    params = {name: p + 0.1 * _normal(p.shape, jnp.float64, i) if name.startswith("b_") else p
              for i, (name, p) in enumerate(params.items())}  # biases nonzero
    (grouped, repeated), (got, expected) = _grouped_and_repeated(
        params, _inputs(jnp.float64), _lens([3, 1]), num_kv_heads=num_kv_heads,
        value_head_size=value_head_size)
    for g, e in zip(grouped, repeated):
        np.testing.assert_allclose(g, e, rtol=1e-12, atol=1e-12)
    for name in params:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-10, atol=1e-12,
                                   err_msg=name)


def test_gqa_module_calls_the_function_on_its_parameters(x64):
    module = jax_mh.MultiHeadAttention(DIMS.D, GQA_HEADS, query_size=DIMS.q, key_size=DIMS.k,
                                       value_size=DIMS.v, num_kv_heads=1, value_head_size=3,
                                       param_dtype=jnp.float64, rngs=nnx.Rngs(1))
    inputs = _inputs(jnp.float64)
    lens = _lens([[1, 4, 2], [3, 0, 4]])
    arguments = {"scale": 0.3, "logit_softcap": 2.0}
    # Both sides compiled; the module and the function run eagerly in the chex variants and in
    # test_gqa_under_jit_and_vmap and test_unbatched_module_sows_weights_without_a_batch_axis.
    call = nnx.jit(lambda module, q, k, v, lens: module(q, k, v, lens, **arguments))
    expected, _ = jax.jit(lambda params, q, k, v, lens: jax_mh.multi_head_attention(
        params, q, k, v, lens, num_heads=GQA_HEADS, num_kv_heads=1, **arguments))(
        module.params_dict(), *inputs, lens)
    np.testing.assert_array_equal(call(module, *inputs, lens), expected)
    unbatched = call(module, *(np.asarray(x)[1] for x in inputs), np.asarray(lens)[1])
    np.testing.assert_allclose(unbatched, np.asarray(expected)[1], rtol=1e-12, atol=1e-12)


def test_gqa_gradients_match_finite_differences(x64):
    module = jax_mh.MultiHeadAttention(DIMS.D, GQA_HEADS, bias=True, query_size=DIMS.q,
                                       key_size=DIMS.k, value_size=DIMS.v, num_kv_heads=2,
                                       value_head_size=3, param_dtype=jnp.float64,
                                       rngs=nnx.Rngs(2))
    inputs = _inputs(jnp.float64)

    def f(params, queries):
        return jax_mh.multi_head_attention(params, queries, *inputs[1:], _lens([2, 4]),
                                           num_heads=GQA_HEADS, logit_softcap=1.5,
                                           local_window_size=(1, 2))[0]

    check_grads(jax.jit(f), (module.params_dict(), inputs[0]), order=1, modes=("rev",))


def test_gqa_under_jit_and_vmap():
    params = jax_mh.MultiHeadAttention(DIMS.D, GQA_HEADS, query_size=DIMS.q, key_size=DIMS.k,
                                       value_size=DIMS.v, num_kv_heads=2,
                                       rngs=nnx.Rngs(0)).params_dict()
    inputs, lens = _inputs(), _lens([3, 2])

    def f(q, k, v, lens):
        return jax_mh.multi_head_attention(params, q, k, v, lens, num_heads=GQA_HEADS,
                                           num_kv_heads=2, local_window_size=1)

    eager = f(*inputs, lens)
    jitted = jax.jit(f)(*inputs, lens)
    # Unbatched inside: (T, q), lengths (). vmap under jit: one program instead of one per
    # batched operation.
    mapped = jax.jit(jax.vmap(f))(*inputs, lens)
    for e, j, m in zip(eager, jitted, mapped):
        np.testing.assert_allclose(j, e, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(m, e, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kwargs, message", [
    ({"num_kv_heads": 3}, "num_kv_heads must divide num_heads = 4, got 3"),
    ({"num_kv_heads": 0}, "num_kv_heads must be an integer >= 1, got 0"),
    ({"num_kv_heads": True}, "num_kv_heads must be an integer >= 1, got True"),
    ({"value_head_size": 0}, "value_head_size must be an integer >= 1, got 0"),
])
def test_bad_module_head_settings(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        jax_mh.MultiHeadAttention(DIMS.D, GQA_HEADS, rngs=nnx.Rngs(0), **kwargs)


def test_num_kv_heads_must_fit_the_parameters():
    params = {name: np.asarray(p) for name, p in _params().items()}  # W_k (k, 8): N_kv = 2 of H 4
    inputs = [np.asarray(a) for a in _inputs()]
    for mh in (jax_mh, np_mh):
        with pytest.raises(ValueError, match=re.escape(
                "num_kv_heads must divide num_heads = 2, got 3")):
            mh.multi_head_attention(params, *inputs, num_heads=2, num_kv_heads=3)
        with pytest.raises(ValueError, match=re.escape(
                "params['W_k'] must have shape (5, 4), got (5, 8)")):
            mh.multi_head_attention(params, *inputs, num_heads=2, num_kv_heads=1)


def test_unbatched_module_sows_weights_without_a_batch_axis():
    """Unbatched (T, q) inputs: the module's output (T, D) and its sown weights (N, T, S) are
    those of the function, without the batch axis added inside."""
    module = jax_mh.MultiHeadAttention(DIMS.D, GQA_HEADS, num_kv_heads=2, sow_weights=True,
                                       rngs=nnx.Rngs(0))
    X = _normal((DIMS.T, DIMS.D), seed=5)
    output, intermediates = nnx.capture(module, nnx.Intermediate)(X, X, X, is_causal=True)
    (weights,) = intermediates["attention"]["attention_weights"].get_value()
    expected, expected_weights = jax_mh.multi_head_attention(module.params_dict(), X, X, X,
                                                             num_heads=GQA_HEADS, is_causal=True)
    assert output.shape == (DIMS.T, DIMS.D) and weights.shape == (GQA_HEADS, DIMS.T, DIMS.T)
    np.testing.assert_allclose(output, expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(weights, expected_weights, rtol=1e-6, atol=1e-6)
