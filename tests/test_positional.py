"""Positional encodings in JAX (d2l §11.6.3; learned, RoPE, relative bias): variants, vmap, gradients,
the properties the encodings exist for, the NNX modules, bad input (JAX and NumPy alike), plots.

Shapes are few and small on purpose: JAX compiles once per shape. Inputs reach the device by
``jax.device_put`` of NumPy arrays (``jnp.asarray`` with a dtype compiles a conversion per shape),
and the tests that are not about eager execution run their JAX computations in one jitted program
each instead of one program per operation; the chex variants keep the eager (without_jit) runs.
"""

from __future__ import annotations

import chex
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import matplotlib.image
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from jax.test_util import check_grads
from matplotlib.figure import Figure

from jax_attention.nn import positional as jax_pos
from jax_attention.viz.plotting import DPI, plot_positional_columns, plot_positional_heatmap
from reference_numpy import positional as np_pos
from tests.hypothesis_support import examples

DIMS = chex.Dimensions(B=2, N=3, T=5, S=7, H=6, D=8, L=16)  # L: max_len of the tables
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _normal(shape, dtype=jnp.float32, seed=0):
    return jax.device_put(np.asarray(np.random.default_rng(seed).normal(size=shape), dtype))


@jax.jit  # positions traced: one program per dtype for every (i, j)
def _rope_score(q, k, i, j):
    """``<rope(q, i), rope(k, j)>`` for single vectors ``q, k (H,)`` at positions ``i, j``."""
    rotated_q = jax_pos.rotary_embedding(q[None], jnp.asarray([i], jnp.int32))[0]
    rotated_k = jax_pos.rotary_embedding(k[None], jnp.asarray([j], jnp.int32))[0]
    return jnp.dot(rotated_q, rotated_k)


class VariantsTest(chex.TestCase):
    """Every function with and without jit gives the same, correctly shaped result."""

    @chex.variants(with_jit=True, without_jit=True)
    def test_add_and_learned_encodings(self):
        X, table = _normal(DIMS["BTD"]), _normal(DIMS["LD"], seed=1)
        P = jax_pos.positional_encoding(DIMS.L, DIMS.D)
        added = self.variant(jax_pos.add_positional_encoding)(X, P)
        learned = self.variant(jax_pos.learned_positional_encoding)(table, X)
        chex.assert_shape([added, learned], DIMS["BTD"])
        chex.assert_type([added, learned], jnp.float32)
        np.testing.assert_allclose(added, np.asarray(X) + np.asarray(P)[: DIMS.T], rtol=1e-6)
        np.testing.assert_allclose(learned, np.asarray(X) + np.asarray(table)[: DIMS.T], rtol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_positional_encoding(self):
        P = self.variant(lambda: jax_pos.positional_encoding(DIMS.L, DIMS.D))()
        chex.assert_shape(P, DIMS["LD"])
        np.testing.assert_allclose(P, np_pos.positional_encoding(DIMS.L, DIMS.D), rtol=1e-6, atol=1e-7)

    @chex.variants(with_jit=True, without_jit=True)
    def test_rotary_embedding(self):
        X = _normal(DIMS["BNTH"])
        positions = jnp.arange(DIMS.T, dtype=jnp.int32) + 3
        rotated = self.variant(jax_pos.rotary_embedding)(X, positions)
        chex.assert_shape(rotated, DIMS["BNTH"])
        chex.assert_type(rotated, jnp.float32)
        expected = np_pos.rotary_embedding(np.asarray(X, np.float64), np.asarray(positions))
        np.testing.assert_allclose(rotated, expected, rtol=1e-5, atol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_relative_positions_with_traced_offset(self):
        positions = self.variant(lambda offset: jax_pos.relative_positions(DIMS.T, DIMS.S, offset))(2)
        chex.assert_shape(positions, DIMS["TS"])
        chex.assert_type(positions, jnp.int32)
        np.testing.assert_array_equal(positions, np_pos.relative_positions(DIMS.T, DIMS.S, 2))

    @chex.variants(with_jit=True, without_jit=True)
    def test_buckets_clipping_and_bias(self):
        positions = jnp.asarray(np_pos.relative_positions(DIMS.T, DIMS.S, -1))
        buckets = self.variant(jax_pos.relative_position_buckets)(positions)
        clipped = self.variant(lambda p: jax_pos.clipped_relative_positions(p, 2))(positions)
        chex.assert_shape([buckets, clipped], DIMS["TS"])
        chex.assert_type([buckets, clipped], jnp.int32)
        np.testing.assert_array_equal(buckets, np_pos.relative_position_buckets(np.asarray(positions)))
        np.testing.assert_array_equal(clipped, np_pos.clipped_relative_positions(np.asarray(positions), 2))
        table = _normal((32, DIMS.N))
        bias = self.variant(jax_pos.relative_position_bias)(table, buckets)
        chex.assert_shape(bias, (1,) + DIMS["NTS"])
        np.testing.assert_array_equal(bias[0], np.moveaxis(np.asarray(table)[np.asarray(buckets)], -1, 0))


# --------------------------------------------------------------------------- sinusoidal


def test_hand_worked_values():
    X = _normal((1, 4))
    P, rotated = jax.jit(lambda X: (jax_pos.positional_encoding(3, 6), jax_pos.rotary_embedding(X)))(X)
    P = np.asarray(P)
    np.testing.assert_array_equal(P[0], [0, 1, 0, 1, 0, 1])
    np.testing.assert_allclose(P[1, :2], [np.sin(1.0), np.cos(1.0)], rtol=1e-7)
    # Pair j turns at 1 / 10000^(2j/6): j = 1 -> 10000^(-1/3).
    np.testing.assert_allclose(P[2, 2:4], [np.sin(2 * 10000 ** (-1 / 3)), np.cos(2 * 10000 ** (-1 / 3))],
                               rtol=1e-6)
    reference = np_pos.positional_encoding(3, 6)
    np.testing.assert_array_equal(reference[0], [0, 1, 0, 1, 0, 1])
    assert reference[1, 0] == np.sin(1.0) and reference[1, 1] == np.cos(1.0)
    # RoPE at position 0 is the identity.
    np.testing.assert_array_equal(rotated, X)
    X64 = np.asarray(X, np.float64)
    np.testing.assert_array_equal(np_pos.rotary_embedding(X64), X64)


@pytest.mark.parametrize("num_hiddens", [1, 7, 33])
def test_odd_width_matches_the_formula(num_hiddens):
    P = np_pos.positional_encoding(11, num_hiddens, 100.0)
    for i in range(11):
        for column in range(num_hiddens):
            angle = i / 100.0 ** ((column - column % 2) / num_hiddens)
            expected = np.sin(angle) if column % 2 == 0 else np.cos(angle)
            assert P[i, column] == pytest.approx(expected, abs=1e-15)
    np.testing.assert_allclose(jax_pos.positional_encoding(11, num_hiddens, 100.0), P, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("num_hiddens", [32, 7])
def test_rows_are_distinct_below_max_len(num_hiddens):
    for P in (np_pos.positional_encoding(1000, num_hiddens),
              np.asarray(jax_pos.positional_encoding(1000, num_hiddens), np.float64)):
        squared = (P**2).sum(-1)
        distances = squared[:, None] + squared[None, :] - 2 * P @ P.T
        np.fill_diagonal(distances, np.inf)
        assert distances.min() > 1e-4


@pytest.mark.parametrize("num_hiddens", [32, 9])
def test_offset_is_a_fixed_rotation_of_each_pair(num_hiddens):
    # [sin(a + b), cos(a + b)] = [[cos b, sin b], [-sin b, cos b]] [sin a, cos a]: the same matrix
    # for every position i, so P[i + delta] is a linear function of P[i] (Vaswani et al., §3.5).
    P = np_pos.positional_encoding(200, num_hiddens)
    frequencies = 1 / 10000 ** (np.arange(0, num_hiddens - 1, 2) / num_hiddens)
    for j, omega in enumerate(frequencies):
        columns = slice(2 * j, 2 * j + 2)
        for delta in (1, 5, 37):
            rotation = np.array([[np.cos(delta * omega), np.sin(delta * omega)],
                                 [-np.sin(delta * omega), np.cos(delta * omega)]])
            for i in (0, 3, 50, 150):
                np.testing.assert_allclose(P[i + delta, columns], rotation @ P[i, columns], atol=1e-12)
            # And from the data alone: the least-squares map P[i] -> P[i + delta] over all i is
            # that rotation, with no residual.
            fitted, residual, *_ = np.linalg.lstsq(P[:-delta, columns], P[delta:, columns], rcond=None)
            np.testing.assert_allclose(fitted.T, rotation, atol=1e-9)


# --------------------------------------------------------------------------- RoPE


@pytest.mark.parametrize("dtype, tol", [(jnp.float32, 1e-5), (jnp.float64, 1e-12)])
def test_rope_scores_depend_only_on_the_offset(dtype, tol):
    with jax.enable_x64(dtype == jnp.float64):
        q, k = _normal((DIMS.H,), dtype, 1), _normal((DIMS.H,), dtype, 2)
        for i, j in [(0, 0), (2, 7), (9, 3)]:
            score = _rope_score(q, k, i, j)
            for shift in (1, 10, 100):
                np.testing.assert_allclose(_rope_score(q, k, i + shift, j + shift), score, rtol=tol, atol=tol)
        # And the score is <q, R(j - i) k>, not the plain dot product.
        assert abs(float(_rope_score(q, k, 0, 3)) - float(np.dot(q, k))) > 1e-3


@pytest.mark.parametrize("dtype, tol", [(jnp.float32, 1e-5), (jnp.float64, 1e-12)])
def test_rope_preserves_norms(dtype, tol):
    with jax.enable_x64(dtype == jnp.float64):
        X = _normal(DIMS["BNTH"], dtype)
        positions = np.random.default_rng(3).integers(-500, 500, size=DIMS["BNT"]).astype(np.int32)
        rotated = jax.jit(jax_pos.rotary_embedding)(X, positions)
        # The norms in NumPy (in the dtype), on the device's results.
        rotated, X = np.asarray(rotated), np.asarray(X)
        np.testing.assert_allclose(np.linalg.norm(rotated, axis=-1), np.linalg.norm(X, axis=-1), rtol=tol)
        # Pairwise too: each (2j, 2j + 1) pair is rotated on its own.
        pairs = lambda a: np.linalg.norm(a.reshape(a.shape[:-1] + (DIMS.H // 2, 2)), axis=-1)  # noqa: E731
        np.testing.assert_allclose(pairs(rotated), pairs(X), rtol=tol, atol=tol)


def test_rope_uses_the_sinusoidal_table():
    # cos/sin of RoPE's angles are the (2j + 1, 2j) columns of the sinusoidal table with D = H.
    P = np_pos.positional_encoding(DIMS.T, DIMS.H)
    angles = np_pos.rotary_angles(np.arange(DIMS.T), DIMS.H)
    np.testing.assert_allclose(np.sin(angles), P[:, 0::2], atol=1e-15)
    np.testing.assert_allclose(np.cos(angles), P[:, 1::2], atol=1e-15)
    # Interleaved layout: rotating e_0 at position p gives (cos, sin) of angle p in features 0, 1.
    e0 = np.zeros((DIMS.T, DIMS.H))
    e0[:, 0] = 1
    rotated = np_pos.rotary_embedding(e0)
    np.testing.assert_allclose(rotated[:, :2], np.stack([P[:, 1], P[:, 0]], -1), atol=1e-15)
    np.testing.assert_allclose(rotated[:, 2:], 0, atol=1e-15)


def test_rope_offset_positions_equal_slicing_a_longer_sequence():
    # Cached decoding: T new queries at positions offset .. offset + T - 1.
    X = _normal((DIMS.B, 9, DIMS.H))
    full, part = jax.jit(lambda X: (jax_pos.rotary_embedding(X),
                                    jax_pos.rotary_embedding(X[:, 4:], jnp.arange(4, 9, dtype=jnp.int32))))(X)
    np.testing.assert_allclose(part, full[:, 4:], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_rope_half_precision_keeps_dtype(dtype):
    X = np.asarray(_normal(DIMS["BTH"])).astype(dtype)  # NumPy holds bfloat16 (ml_dtypes)
    positions = np.arange(DIMS.T, dtype=np.int32) + 100
    rotated = jax.jit(jax_pos.rotary_embedding)(X, positions)
    assert rotated.dtype == dtype
    expected = np_pos.rotary_embedding(X.astype(np.float64), positions)
    np.testing.assert_allclose(np.asarray(rotated, np.float64), expected, atol=2e-2)


def test_vmap_equals_loop():
    X = _normal((3,) + DIMS["BTD"])
    tables = _normal((3,) + DIMS["LD"], seed=1)
    positions = np.random.default_rng(2).integers(0, 50, size=(3, DIMS.T)).astype(np.int32)

    @jax.jit  # the vmapped calls and the loop in one program
    def vmapped_and_looped(X, tables, positions):
        P = jax_pos.positional_encoding(DIMS.L, DIMS.D)
        vmapped = (jax.vmap(jax_pos.rotary_embedding)(X, positions),
                   jax.vmap(jax_pos.add_positional_encoding, in_axes=(0, None))(X, P),
                   jax.vmap(jax_pos.learned_positional_encoding)(tables, X))
        looped = [(jax_pos.rotary_embedding(X[i], positions[i]),
                   jax_pos.add_positional_encoding(X[i], P),
                   jax_pos.learned_positional_encoding(tables[i], X[i])) for i in range(3)]
        return vmapped, looped

    (rotated, added, learned), looped = vmapped_and_looped(X, tables, positions)
    for i in range(3):
        np.testing.assert_allclose(rotated[i], looped[i][0], rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(added[i], looped[i][1], rtol=1e-6)
        np.testing.assert_allclose(learned[i], looped[i][2], rtol=1e-6)


def test_gradients_match_finite_differences(x64):
    X = _normal(DIMS["BTH"], jnp.float64)
    positions = np.arange(DIMS.T, dtype=np.int32) + 7
    # Jitted functions: check_grads's evaluations (and their jvp/vjp) reuse compiled programs.
    check_grads(jax.jit(lambda x: jax_pos.rotary_embedding(x, positions)), (X,), order=1,
                modes=("fwd", "rev"))
    table = _normal((DIMS.L, DIMS.H), jnp.float64, 1)
    check_grads(jax.jit(jax_pos.learned_positional_encoding), (table, X), order=1, modes=("fwd", "rev"))
    # The gradient of a sum reaches exactly the first T rows of the table.
    grad = jax.jit(jax.grad(lambda t: jnp.sum(jax_pos.learned_positional_encoding(t, X))))(table)
    np.testing.assert_array_equal(grad[: DIMS.T], DIMS.B)
    np.testing.assert_array_equal(grad[DIMS.T:], 0)


# --------------------------------------------------------------------------- relative positions


@settings(max_examples=examples(ci=15, dev=150))
@given(
    per_direction_log2=st.integers(1, 5),
    extra_distance=st.integers(1, 200),
    bidirectional=st.booleans(),
    offset=st.integers(-300, 300),
)
def test_bucket_bias_depends_only_on_the_offset(per_direction_log2, extra_distance, bidirectional, offset):
    num_buckets = 2 ** (per_direction_log2 + int(bidirectional))
    max_distance = 2 ** per_direction_log2 // 2 + extra_distance
    positions = np_pos.relative_positions(DIMS.T, DIMS.S, offset)
    buckets = np_pos.relative_position_buckets(positions, num_buckets, max_distance, bidirectional)
    # Equal j - i, equal bucket: the matrix is constant along every diagonal (Toeplitz).
    np.testing.assert_array_equal(buckets[1:, 1:], buckets[:-1, :-1])
    assert buckets.min() >= 0 and buckets.max() < num_buckets
    # Monotone in the distance within each direction.
    past = np_pos.relative_position_buckets(-np.arange(400), num_buckets, max_distance, bidirectional)
    per_direction = num_buckets // 2 if bidirectional else num_buckets
    assert np.all(np.diff(past) >= 0) and past[0] == 0 and past[-1] == per_direction - 1


def test_relative_bias_module_shape_offset_and_gradient():
    module = jax_pos.RelativePositionBias(DIMS.N, 8, 6, rngs=nnx.Rngs(0))
    assert module.table[...].shape == (8, DIMS.N)
    scores = _normal((DIMS.B,) + DIMS["NTS"])

    @nnx.jit  # the module's calls, its gradient and its indices in one program
    def run(module, scores):
        grads = nnx.grad(
            lambda m: jnp.sum(jax.nn.softmax(scores + m(DIMS.T, DIMS.S), axis=-1) * scores))(module)
        return (module(DIMS.T, DIMS.S), module(DIMS.T, DIMS.S, 2), module(DIMS.T + 2, DIMS.S),
                grads, module.indices(DIMS.T, DIMS.S))

    bias, shifted, longer, grads, indices = run(module, scores)
    chex.assert_shape(bias, (1,) + DIMS["NTS"])
    # Depends only on j - i: constant along diagonals, and the offset shifts the whole matrix.
    bias = np.asarray(bias)
    np.testing.assert_array_equal(bias[..., 1:, 1:], bias[..., :-1, :-1])
    np.testing.assert_array_equal(shifted, np.asarray(longer)[..., 2:, :])
    # Gradients reach the rows in use, and only those.
    grad = np.asarray(grads["table"][...])
    used = np.unique(np.asarray(indices))
    assert np.all(np.abs(grad[used]).sum(-1) > 0)
    np.testing.assert_array_equal(np.delete(grad, used, axis=0), 0)


def test_relative_bias_module_clip_mode_and_jit():
    module = jax_pos.RelativePositionBias(2, max_distance=3, mode="clip", rngs=nnx.Rngs(0))
    assert module.table[...].shape == (7, 2)
    indices = module.indices(4, 6)
    np.testing.assert_array_equal(indices, np.clip(np.arange(6)[None] - np.arange(4)[:, None], -3, 3) + 3)
    jitted = nnx.jit(lambda m, offset: m(4, 6, offset))
    np.testing.assert_array_equal(jitted(module, 1), module(4, 6, 1))
    np.testing.assert_array_equal(jitted(module, 0), module(4, 6))


# --------------------------------------------------------------------------- NNX modules


def test_positional_encoding_module():
    module = jax_pos.PositionalEncoding(DIMS.D, 0.5, max_len=DIMS.L, rngs=nnx.Rngs(0))
    X = _normal(DIMS["BTD"])
    P = jax_pos.positional_encoding(DIMS.L, DIMS.D)
    # The table is a constant, not a trainable parameter.
    assert len(nnx.state(module, nnx.Param)) == 0 and not jax.tree.leaves(nnx.state(module, nnx.Param))
    (table,) = jax.tree.leaves(nnx.state(module, jax_pos.Constant))
    np.testing.assert_array_equal(table, P)


    @nnx.jit  # the gradient and both calls (in this order: the dropout draws after) in one program
    def run(module, X):
        grads = nnx.grad(lambda m: jnp.sum(m(X, deterministic=True)))(module)
        return grads, module(X, deterministic=True), module(X)

    grads, deterministic, trained = run(module, X)
    assert not jax.tree.leaves(grads)
    # Eval mode (or deterministic=True) is X + P exactly; training mode drops and rescales.
    expected = np.asarray(X) + np.asarray(P)[: DIMS.T]
    np.testing.assert_array_equal(deterministic, expected)
    trained = np.asarray(trained)
    kept = trained != 0
    assert 0 < kept.mean() < 1
    np.testing.assert_allclose(trained[kept], 2 * expected[kept], rtol=1e-6)
    module.eval()
    np.testing.assert_array_equal(module(X), expected)
    with pytest.raises(ValueError, match=r"sequence of length T = 17 is longer than max_len = 16"):
        module(_normal((DIMS.B, 17, DIMS.D)))
    # Odd widths work too.
    odd = jax_pos.PositionalEncoding(7, 0.0, max_len=10)
    np.testing.assert_array_equal(odd(jnp.zeros((1, 10, 7), jnp.float32)),
                                  jax_pos.positional_encoding(10, 7)[None])


def test_learned_embedding_module():
    module = jax_pos.LearnedPositionalEmbedding(DIMS.L, DIMS.D, rngs=nnx.Rngs(0))
    table = np.asarray(module.table[...])
    assert table.shape == DIMS["LD"] and 0.01 < table.std() < 0.03
    (param,) = jax.tree.leaves(nnx.state(module, nnx.Param))
    np.testing.assert_array_equal(param, table)
    X = _normal(DIMS["BTD"])
    output, grads = nnx.jit(lambda m, X: (m(X), nnx.grad(lambda m: jnp.sum(m(X) ** 2))(m)))(module, X)
    np.testing.assert_array_equal(output, np.asarray(X) + table[: DIMS.T])
    grad = np.asarray(grads["table"][...])
    assert np.all(grad[: DIMS.T] != 0) and np.all(grad[DIMS.T:] == 0)
    with pytest.raises(ValueError, match=r"sequence of length T = 17 is longer than max_len = 16"):
        module(_normal((DIMS.B, 17, DIMS.D)))


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("module", [jax_pos, np_pos], ids=["jax", "numpy"])
def test_bad_input_raises_naming_the_argument(module):
    with pytest.raises(ValueError, match=r"X must have an even last axis H.*\(2, 3, 5\)"):
        module.rotary_embedding(np.ones((2, 3, 5)))
    with pytest.raises(ValueError, match=r"head_dim must be even.*got 5"):
        module.rotary_angles(np.arange(3), 5)
    with pytest.raises(TypeError, match=r"positions must hold integers.*float"):
        module.rotary_embedding(np.ones((3, 4)), np.arange(3.0))
    with pytest.raises(ValueError, match=r"positions must broadcast to X.shape\[:-1\].*\(2, 3\).*\(4,\)"):
        module.rotary_embedding(np.ones((2, 3, 4)), np.arange(4))
    with pytest.raises(ValueError, match=r"sequence of length T = 6 is longer than max_len = 5"):
        module.add_positional_encoding(np.ones((2, 6, 4)), np.ones((5, 4)))
    with pytest.raises(ValueError, match=r"sequence of length T = 6 is longer than max_len = 5"):
        module.learned_positional_encoding(np.ones((5, 4)), np.ones((2, 6, 4)))
    with pytest.raises(ValueError, match=r"X has width D = 3 but .* P has 4 columns.*\(2, 5, 3\).*\(5, 4\)"):
        module.add_positional_encoding(np.ones((2, 5, 3)), np.ones((5, 4)))
    with pytest.raises(ValueError, match=r"X has width D = 3 but .* table has 4 columns"):
        module.learned_positional_encoding(np.ones((5, 4)), np.ones((2, 5, 3)))
    with pytest.raises(ValueError, match=r"num_steps must be an integer >= 1, got 0"):
        module.positional_encoding(0, 4)
    with pytest.raises(ValueError, match=r"num_hiddens must be an integer >= 1, got 0"):
        module.positional_encoding(4, 0)
    with pytest.raises(ValueError, match=r"base must be a finite number > 0, got -1"):
        module.positional_encoding(4, 4, -1.0)
    with pytest.raises(ValueError, match=r"num_hiddens must be an integer >= 1, got 4.0"):
        module.positional_encoding(4, 4.0)
    rp = np.arange(-3, 4)
    with pytest.raises(ValueError, match=r"num_buckets must be even when bidirectional.*got 7"):
        module.relative_position_buckets(rp, 7, 10)
    with pytest.raises(ValueError, match=r"num_buckets must be an integer >= 4, got 2"):
        module.relative_position_buckets(rp, 2, 10)
    with pytest.raises(ValueError, match=r"num_buckets must be an integer >= 2, got 1"):
        module.relative_position_buckets(rp, 1, 10, bidirectional=False)
    with pytest.raises(ValueError, match=r"max_distance must be an integer >= 9, got 8"):
        module.relative_position_buckets(rp, 32, 8)  # 8 exact buckets per direction: 8 is no log range
    with pytest.raises(TypeError, match=r"relative_positions must hold integers"):
        module.relative_position_buckets(rp.astype(float))
    with pytest.raises(ValueError, match=r"max_distance must be an integer >= 1, got 0"):
        module.clipped_relative_positions(rp, 0)
    with pytest.raises(ValueError, match=r"indices must lie in \[0, num_buckets\) = \[0, 4\).*from 0 to 4"):
        module.relative_position_bias(np.ones((4, 2)), np.arange(5).reshape(1, 5))
    with pytest.raises(ValueError, match=r"indices must have shape \(T, S\), got \(5,\)"):
        module.relative_position_bias(np.ones((4, 2)), np.arange(5))
    with pytest.raises(TypeError, match=r"offset must be an integer scalar"):
        module.relative_positions(3, 4, 1.5)


def test_bad_module_arguments():
    with pytest.raises(ValueError, match=r"mode must be \"bucket\" or \"clip\", got 'nearest'"):
        jax_pos.RelativePositionBias(2, mode="nearest", rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"num_buckets must be even when bidirectional.*got 31"):
        jax_pos.RelativePositionBias(2, 31, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"num_hiddens must be an integer >= 1, got 0"):
        jax_pos.PositionalEncoding(0, 0.1)


# --------------------------------------------------------------------------- plots


def _png_shape(path):
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    return matplotlib.image.imread(path).shape


def test_plot_positional_columns(tmp_path):
    P = jax_pos.positional_encoding(60, 32)
    path = tmp_path / "columns.png"
    fig = plot_positional_columns(P, path=path)
    assert isinstance(fig, Figure)
    assert _png_shape(path)[:2] == (round(2.5 * DPI), round(6 * DPI))
    (ax,) = fig.axes
    assert ax.get_xlabel() == "Row (position)"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["Col 6", "Col 7", "Col 8", "Col 9"]
    for line, column in zip(ax.get_lines(), range(6, 10)):
        np.testing.assert_array_equal(line.get_xdata(), np.arange(60))
        np.testing.assert_allclose(line.get_ydata(), np.asarray(P)[:, column], rtol=1e-6)
    with pytest.raises(ValueError, match=r"columns must .* \[0, 32\).*\(60, 32\).*\[40\]"):
        plot_positional_columns(P, columns=[40])
    with pytest.raises(ValueError, match=r"P must have shape \(T, D\).*\(1, 60, 32\)"):
        plot_positional_columns(P[None])


def test_plot_positional_heatmap(tmp_path):
    path = tmp_path / "heatmap.png"
    fig = plot_positional_heatmap(jax_pos.positional_encoding(60, 32), path=path)
    assert _png_shape(path)[:2] == (round(4 * DPI), round(3.5 * DPI))
    heatmap, _ = fig.axes
    assert heatmap.get_xlabel() == "Column (encoding dimension)"
    assert heatmap.get_ylabel() == "Row (position)"
    assert heatmap.images[0].get_cmap().name == "Blues"
    assert heatmap.images[0].get_array().shape == (60, 32)


# ------------------------------------------------------------------- issue 16: int32 positions

BEYOND_INT32 = 2**31 + 5


@pytest.mark.parametrize("positions", [np.array([0, BEYOND_INT32], np.int64), [0, BEYOND_INT32],
                                       np.array([-(2**31) - 1], np.int64)],
                         ids=["int64", "list", "negative"])
def test_rope_positions_beyond_int32_are_refused_without_x64(positions):
    # With x64 off, JAX converted them to int32 and wrapped around: a wrong rotation, no error.
    assert not jax.config.jax_enable_x64
    largest = int(np.max(positions))
    message = (rf"positions must lie in \[-2147483648, 2147483647\] \(JAX converts 64-bit "
               rf".*x64 is off\), got values from -?\d+ to {largest}")
    with pytest.raises(ValueError, match=message):
        jax_pos.rotary_angles(positions, DIMS.H)
    with pytest.raises(ValueError, match=message):
        jax_pos.rotary_embedding(np.ones((len(positions), DIMS.H), np.float32), positions)


def test_rope_positions_beyond_int32_are_exact_with_x64_and_in_numpy():
    positions = np.array([3, BEYOND_INT32], np.int64)
    expected = np_pos.rotary_angles(positions, DIMS.H)
    assert expected[1, 0] == BEYOND_INT32  # NumPy has no such wrap: theta_0 = p / base^0 = p
    with jax.enable_x64(True):
        np.testing.assert_allclose(jax_pos.rotary_angles(positions, DIMS.H, dtype=jnp.float64),
                                   expected, rtol=1e-12)


def test_rope_positions_within_int32_and_traced_positions_are_unchanged():
    positions = np.array([0, 2**31 - 1], np.int64)
    np.testing.assert_allclose(jax_pos.rotary_angles(positions, DIMS.H),
                               np_pos.rotary_angles(positions, DIMS.H), rtol=1e-6)
    # Traced positions cannot be checked (documented); they are used as they are.
    traced = jax.jit(lambda p: jax_pos.rotary_angles(p, DIMS.H))(jnp.arange(3))
    np.testing.assert_allclose(traced, np_pos.rotary_angles(np.arange(3), DIMS.H), rtol=1e-6)


def test_relative_positions_offset_beyond_int32_is_refused():
    for offset in (np.int64(2**31), 2**31):
        with pytest.raises(ValueError, match=r"offset must lie in \[-2147483648, 2147483647\].*"
                                             r"got values from 2147483648 to 2147483648"):
            jax_pos.relative_positions(2, 3, offset)
