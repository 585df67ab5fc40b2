"""NumPy reference vs JAX for positional encodings (d2l §11.6.3; learned, RoPE, relative bias).

Same inputs on both sides; every backend JAX sees; float64 (x64) to 1e-12 and float32 (full matmul
precision) to 1e-5 relative. Integer results (relative positions, T5 buckets, clipped indices) must
agree entry for entry, and the buckets also with a plain per-element Python transcription of T5.
The NNX modules are tied to the functions by running the reference on the modules' own tables.

JAX runs under ``jax.jit`` here (one compilation per test instead of one per eager operation, which
keeps the file fast; the T5 buckets' cases, :func:`_buckets_together`, share one program per
backend, each case still checked on its own); tests/test_positional.py runs every function with
and without jit. Inputs go to the jitted functions as NumPy arrays of the final dtype
(``jnp.asarray`` with a dtype would compile a conversion per shape).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jax_attention.nn import positional as jax_pos
from reference_numpy import positional as np_pos
from tests.parity._support import assert_matches as _assert_matches


def _assert_equal_ints(got, expected, backend=None):
    assert got.dtype == jnp.int32 and expected.dtype == np.int32
    if backend is not None:
        assert got.devices() == {backend}
    np.testing.assert_array_equal(np.asarray(got), expected)


def _normal(shape, seed=0):
    return np.random.default_rng(seed).normal(size=shape)


def _jit(fn, *static_argnums):
    return jax.jit(fn, static_argnums=static_argnums)


def _jit_module(module, *args, **kwargs):
    """``module(*args, **kwargs)`` under ``nnx.jit``, with ``args`` as static Python values."""
    return nnx.jit(lambda m: m(*args, **kwargs))(module)


# --------------------------------------------------------------------------- sinusoidal, learned


@pytest.mark.parametrize("num_steps, num_hiddens, base", [(1, 1, 10000.0), (60, 32, 10000.0),
                                                          (9, 7, 10000.0), (1000, 6, 10000.0),
                                                          (5, 4, 2.5)])
def test_positional_encoding(backend, dtype, num_steps, num_hiddens, base):
    expected = np_pos.positional_encoding(num_steps, num_hiddens, base)
    got = jax_pos.positional_encoding(num_steps, num_hiddens, base, dtype=dtype)
    _assert_matches(got, expected, dtype, backend)


@pytest.mark.parametrize("shape", [(2, 5, 6), (5, 6), (2, 3, 5, 7)])
def test_add_positional_encoding(backend, dtype, shape):
    X = _normal(shape)
    P = np_pos.positional_encoding(8, shape[-1])
    expected = np_pos.add_positional_encoding(X, P)
    got = _jit(jax_pos.add_positional_encoding)(np.asarray(X, dtype), np.asarray(P, dtype))
    _assert_matches(got, expected, dtype, backend)


@pytest.mark.parametrize("shape", [(2, 5, 6), (2, 3, 5, 7)])
def test_learned_positional_encoding(backend, dtype, shape):
    X, table = _normal(shape, 1), _normal((9, shape[-1]), 2)
    expected = np_pos.learned_positional_encoding(table, X)
    got = _jit(jax_pos.learned_positional_encoding)(np.asarray(table, dtype), np.asarray(X, dtype))
    _assert_matches(got, expected, dtype, backend)


def test_positional_encoding_module(backend, dtype):
    module = jax_pos.PositionalEncoding(6, 0.5, max_len=10, dtype=dtype, rngs=nnx.Rngs(0))
    X = _normal((2, 7, 6), 3)
    got = nnx.jit(lambda m, x: m(x, deterministic=True))(module, np.asarray(X, dtype))
    _assert_matches(got, X + np_pos.positional_encoding(10, 6)[:7], dtype, backend)


def test_learned_embedding_module(backend, dtype):
    module = jax_pos.LearnedPositionalEmbedding(10, 6, param_dtype=dtype, rngs=nnx.Rngs(0))
    X = _normal((2, 7, 6), 4)
    got = nnx.jit(lambda m, x: m(x))(module, np.asarray(X, dtype))
    expected = np_pos.learned_positional_encoding(np.asarray(module.table[...], np.float64), X)
    _assert_matches(got, expected, dtype, backend)


# --------------------------------------------------------------------------- rotary


@pytest.mark.parametrize("positions_shape, head_dim", [((7,), 8), ((2, 3, 4), 2), ((), 6)])
def test_rotary_angles(backend, dtype, positions_shape, head_dim):
    positions = np.random.default_rng(5).integers(-20, 20, size=positions_shape)
    expected = np_pos.rotary_angles(positions, head_dim, 500.0)
    angles = functools.partial(jax_pos.rotary_angles, dtype=dtype)
    got = _jit(angles, 1, 2)(np.asarray(positions, np.int32), head_dim, 500.0)
    _assert_matches(got, expected, dtype, backend)


# (X shape, positions shape or None); positions drawn with an offset as in cached decoding.
ROPE_CASES = [
    ((5, 8), None),
    ((2, 5, 8), None),
    ((2, 3, 5, 4), None),
    ((2, 3, 5, 4), (5,)),
    ((2, 3, 5, 4), (2, 1, 5)),
    ((2, 3, 5, 4), (2, 3, 5)),
    ((3, 2), (3,)),
]


@pytest.mark.parametrize("shape, positions_shape", ROPE_CASES)
def test_rotary_embedding(backend, dtype, shape, positions_shape):
    X = _normal(shape, 6)
    positions = None
    if positions_shape is not None:
        positions = 11 + np.random.default_rng(7).integers(0, 5, size=positions_shape)
    expected = np_pos.rotary_embedding(X, positions, 10000.0)
    got = _jit(jax_pos.rotary_embedding, 2)(
        np.asarray(X, dtype), None if positions is None else np.asarray(positions, np.int32), 10000.0)
    # float32 angles p / base^(2j/H) carry an absolute error of about p * 2^-24 rad.
    _assert_matches(got, expected, dtype, backend, atol32=1e-5)


# --------------------------------------------------------------------------- relative positions

SIZES = [(1, 1, 0), (1, 9, 8), (9, 1, 0), (7, 13, 0), (13, 7, -3), (40, 300, 5), (300, 40, 0)]


@pytest.mark.parametrize("num_queries, num_keys, offset", SIZES)
def test_relative_positions(backend, num_queries, num_keys, offset):
    expected = np_pos.relative_positions(num_queries, num_keys, offset)
    _assert_equal_ints(_jit(jax_pos.relative_positions, 0, 1)(num_queries, num_keys, offset), expected,
                       backend)
    i, j = np.meshgrid(np.arange(num_queries), np.arange(num_keys), indexing="ij")
    np.testing.assert_array_equal(expected, j - (i + offset))


def _t5_bucket_float32(relative_position, num_buckets, max_distance, bidirectional):
    """T5's ``_relative_position_bucket`` for one int, element by element, in float32 as T5 does."""
    bucket = 0
    if bidirectional:
        num_buckets //= 2
        bucket += num_buckets if relative_position > 0 else 0
        n = abs(relative_position)
    else:
        n = max(-relative_position, 0)
    max_exact = num_buckets // 2
    if n < max_exact:
        return bucket + n
    ratio = np.log(np.float32(n) / np.float32(max_exact)) / np.float32(math.log(max_distance / max_exact))
    large = max_exact + int(ratio * np.float32(num_buckets - max_exact))
    return bucket + min(large, num_buckets - 1)


def _t5_bucket_float64(relative_position, num_buckets, max_distance, bidirectional):
    """The same in Python floats (float64): equal to float32 except where the quotient is an
    integer up to rounding, which the default configurations never hit."""
    bucket = 0
    if bidirectional:
        num_buckets //= 2
        bucket += num_buckets if relative_position > 0 else 0
        n = abs(relative_position)
    else:
        n = max(-relative_position, 0)
    max_exact = num_buckets // 2
    if n < max_exact:
        return bucket + n
    ratio = math.log(n / max_exact) / math.log(max_distance / max_exact)
    large = max_exact + int(ratio * (num_buckets - max_exact))
    return bucket + min(large, num_buckets - 1)


# (num_buckets, max_distance, bidirectional): T5's defaults (encoder and decoder), small tables,
# and configurations where float32 log in NumPy and XLA disagree by an ulp at a bucket boundary
# (4 buckets per direction with max_distance 72 or 200; 3 one-way with 36 or 100).
BUCKET_CONFIGS = [
    (32, 128, True), (32, 128, False), (8, 20, True), (5, 9, False), (4, 2, True), (2, 3, False),
    (8, 72, True), (4, 72, False), (8, 200, True), (3, 36, False), (3, 100, False),
]


BUCKET_SIZES = [(1, 1, 0), (7, 13, 0), (13, 7, -3), (40, 300, 5), (300, 40, 0)]


def _t5_offsets(max_distance):
    """Every relative position from well beyond ``-max_distance`` to well beyond it."""
    return np.arange(-3 * max_distance - 5, 3 * max_distance + 6, dtype=np.int32)


@functools.cache
def _buckets_together(device):
    """``relative_position_buckets`` of every case of :func:`test_relative_position_buckets`
    (key: its parameters) and of :func:`test_buckets_match_per_element_t5` (key: the bucket
    configuration), in one jitted program on ``device``."""
    inputs = {}
    for config in BUCKET_CONFIGS:
        inputs[config] = _t5_offsets(config[1])
        for sizes in BUCKET_SIZES:
            inputs[config + sizes] = np_pos.relative_positions(*sizes)

    def run(inputs):
        return {key: jax_pos.relative_position_buckets(positions, *key[:3])
                for key, positions in inputs.items()}

    with jax.default_device(device):
        return jax.jit(run)(inputs)


@pytest.mark.parametrize("num_buckets, max_distance, bidirectional", BUCKET_CONFIGS)
@pytest.mark.parametrize("num_queries, num_keys, offset", BUCKET_SIZES)
def test_relative_position_buckets(backend, num_buckets, max_distance, bidirectional, num_queries, num_keys,
                                   offset):
    positions = np_pos.relative_positions(num_queries, num_keys, offset)
    expected = np_pos.relative_position_buckets(positions, num_buckets, max_distance, bidirectional)
    got = _buckets_together(backend)[num_buckets, max_distance, bidirectional, num_queries, num_keys, offset]
    _assert_equal_ints(got, expected, backend)
    assert expected.min() >= 0 and expected.max() < num_buckets


@pytest.mark.parametrize("num_buckets, max_distance, bidirectional", BUCKET_CONFIGS)
def test_buckets_match_per_element_t5(num_buckets, max_distance, bidirectional):
    offsets = _t5_offsets(max_distance)
    expected = np.array([_t5_bucket_float32(int(r), num_buckets, max_distance, bidirectional)
                         for r in offsets])
    np.testing.assert_array_equal(
        np_pos.relative_position_buckets(offsets, num_buckets, max_distance, bidirectional), expected)
    np.testing.assert_array_equal(
        np.asarray(_buckets_together(jax.devices()[0])[num_buckets, max_distance, bidirectional]),
        expected)
    if (num_buckets, max_distance) in ((32, 128), (8, 20), (5, 9)):
        in_float64 = [_t5_bucket_float64(int(r), num_buckets, max_distance, bidirectional) for r in offsets]
        np.testing.assert_array_equal(expected, in_float64)


def test_buckets_of_t5_defaults_by_hand():
    # Bidirectional, 32 buckets, max_distance 128: 16 per direction, 8 exact, 8 log-spaced (x2 per
    # two buckets: 8-11 -> 8, 12-15 -> 9, 16-22 -> 10, ..., 128+ -> 15); future keys add 16.
    offsets = np.array([0, -1, -7, -8, -11, -12, -16, -23, -32, -64, -127, -128, -10**6, 1, 8, 10**6])
    expected = [0, 1, 7, 8, 8, 9, 10, 11, 12, 14, 15, 15, 15, 17, 24, 31]
    np.testing.assert_array_equal(np_pos.relative_position_buckets(offsets), expected)
    got = jax_pos.relative_position_buckets(jnp.asarray(offsets))
    np.testing.assert_array_equal(np.asarray(got), expected)


@pytest.mark.parametrize("max_distance", [1, 3, 50])
def test_clipped_relative_positions(backend, max_distance):
    positions = np_pos.relative_positions(13, 7, -3)
    expected = np_pos.clipped_relative_positions(positions, max_distance)
    got = _jit(jax_pos.clipped_relative_positions, 1)(positions, max_distance)
    _assert_equal_ints(got, expected, backend)
    np.testing.assert_array_equal(expected, np.clip(positions, -max_distance, max_distance) + max_distance)


def test_relative_position_bias(backend, dtype):
    table = _normal((32, 3), 8)
    indices = np_pos.relative_position_buckets(np_pos.relative_positions(5, 7))
    expected = np_pos.relative_position_bias(table, indices)
    got = _jit(jax_pos.relative_position_bias)(np.asarray(table, dtype), indices)
    _assert_matches(got, expected, dtype, backend)
    for n in range(3):
        np.testing.assert_array_equal(expected[0, n], table[indices, n])


@pytest.mark.parametrize("mode, bidirectional", [("bucket", True), ("bucket", False), ("clip", True)])
@pytest.mark.parametrize("offset", [0, 4])
def test_relative_position_bias_module(backend, dtype, mode, bidirectional, offset):
    module = jax_pos.RelativePositionBias(2, 8, 6, bidirectional=bidirectional, mode=mode, param_dtype=dtype,
                                          rngs=nnx.Rngs(1))
    positions = np_pos.relative_positions(5, 9, offset)
    if mode == "bucket":
        indices = np_pos.relative_position_buckets(positions, 8, 6, bidirectional)
    else:
        indices = np_pos.clipped_relative_positions(positions, 6)
    expected = np_pos.relative_position_bias(np.asarray(module.table[...], np.float64), indices)
    _assert_matches(_jit_module(module, 5, 9, offset), expected, dtype, backend)
