"""NumPy reference vs JAX for sequence masks and masked softmax (d2l §10.7, §11.3.2).

Every test runs on each backend JAX sees, in float64 (to 1e-12: the two must compute the same
thing) and in float32 under full matmul precision (to 1e-5 relative: float32 rounding only).
The masks of static sizes (causal, local window) run in one jitted program per group of
parametrised cases and backend (:func:`tests.parity._support.together`; each case still checks
its own result): eagerly, every size compiled a program per operation. The other tests run eagerly (their cases
share a few sizes, hence the eager operations' programs, cheaper here than a jitted program for a
group); their inputs reach the device by ``jax.device_put`` of NumPy arrays of the final dtype.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_attention.nn import masking as jax_masking
from reference_numpy import masking as np_masking
from tests.parity._support import assert_matches as _assert_matches
from tests.parity._support import together

B, N, T, S = 3, 2, 4, 5


def _scores(shape, seed=0):
    # Spread of a few units, as attention scores have; large enough that the softmax is not flat.
    return np.random.default_rng(seed).normal(scale=2.0, size=shape)


def _lens(shape, seed=1):
    """Random lengths in [0, S], with 0 and S always present so empty and full rows are covered."""
    lens = np.random.default_rng(seed).integers(0, S + 1, size=shape)
    lens.flat[0], lens.flat[-1] = 0, S
    return lens.astype(np.int32)


def _on_device(x, dtype=None):
    """``x`` on the default device (the backend under test), converted in NumPy: ``jnp.asarray``
    with a dtype would compile a conversion per shape."""
    return jax.device_put(np.asarray(x, dtype))


def _random_mask(shape, seed=2):
    return np.random.default_rng(seed).random(shape) < 0.6


# --------------------------------------------------------------------------- masks


@pytest.mark.parametrize(
    "x_shape, lens_shape",
    [((B, S), (B,)), ((B, T, S), (B, T)), ((B, T, S), (B, 1)), ((B, N, T, S), (B, N, T))],
)
@pytest.mark.parametrize("value", [0.0, -1.5])
def test_sequence_mask(backend, dtype, x_shape, lens_shape, value):
    X, lens = _scores(x_shape), _lens(lens_shape)
    expected = np_masking.sequence_mask(X, lens, value)
    got = jax_masking.sequence_mask(_on_device(X, dtype), _on_device(lens), value)
    _assert_matches(got, expected, dtype, backend)


@pytest.mark.parametrize("lens_shape", [(B,), (B, T)])
def test_valid_lens_mask(backend, lens_shape):
    lens = _lens(lens_shape)
    expected = np_masking.valid_lens_mask(lens, T, S)
    got = jax_masking.valid_lens_mask(_on_device(lens), T, S)
    assert got.dtype == jnp.bool_ and got.devices() == {backend}
    np.testing.assert_array_equal(np.asarray(got), expected)
    assert expected.shape == (B, T, S)


def test_valid_lens_mask_none(backend):
    assert np_masking.valid_lens_mask(None, T, S) is None
    assert jax_masking.valid_lens_mask(None, T, S) is None


CAUSAL_CASES = [(4, None, 0), (4, 4, 0), (3, 5, 0), (5, 3, 0), (3, 5, 2), (4, 4, -1), (2, 6, 4), (1, 7, 6)]


def _causal_group(dtype):
    return {repr(case): (jax_masking.causal_mask, case[:2], {"offset": case[2]})  # None: no sort
            for case in CAUSAL_CASES}


@pytest.mark.parametrize("num_queries, num_keys, offset", CAUSAL_CASES)
def test_causal_mask(backend, num_queries, num_keys, offset):
    expected = np_masking.causal_mask(num_queries, num_keys, offset=offset)
    got = together(_causal_group, repr((num_queries, num_keys, offset)), backend)
    assert got.dtype == jnp.bool_ and got.devices() == {backend}
    np.testing.assert_array_equal(np.asarray(got), expected)


def test_causal_mask_offset_aligns_last_query_with_last_key(backend):
    # The cache case from the docstring: the last of T new queries sees all S cached keys.
    got = np.asarray(jax_masking.causal_mask(3, 6, offset=3))
    np.testing.assert_array_equal(got, np_masking.causal_mask(3, 6, offset=3))
    assert got[-1].all() and got.sum(axis=-1).tolist() == [4, 5, 6]


WINDOW_CASES = [
    (4, None, 1, 0), (4, 4, (2, 0), 0), (3, 5, (0, 3), 0), (5, 3, (1, 1), 0), (3, 6, (2, 1), 3),
    (6, 6, (0, 0), 0), (2, 7, [4, 2], -1), (5, 5, 10, 0)]


def _window_group(dtype):
    # Keyed by the case's index (a list window is no dict key); the window passed as it is (a
    # list stays a list: static, not an input, since only NumPy arrays are inputs).
    return {i: (functools.partial(jax_masking.local_window_mask, local_window_size=case[2],
                                  offset=case[3]), case[:2], {}) for i, case in enumerate(WINDOW_CASES)}


@pytest.mark.parametrize("num_queries, num_keys, window, offset", WINDOW_CASES)
def test_local_window_mask(backend, num_queries, num_keys, window, offset):
    expected = np_masking.local_window_mask(num_queries, num_keys, window, offset=offset)
    case = WINDOW_CASES.index((num_queries, num_keys, window, offset))
    got = together(_window_group, case, backend)
    assert got.dtype == jnp.bool_ and got.devices() == {backend}
    np.testing.assert_array_equal(np.asarray(got), expected)
    # The definition: t + offset - left <= s <= t + offset + right.
    left, right = (window, window) if isinstance(window, int) else window
    t = np.arange(num_queries)[:, None] + offset
    s = np.arange(num_queries if num_keys is None else num_keys)[None, :]
    np.testing.assert_array_equal(expected, (s >= t - left) & (s <= t + right))


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("with_mask", [False, True])
@pytest.mark.parametrize("lens_shape", [None, (B,), (B, T)])
@pytest.mark.parametrize("window", [None, (1, 0)])
def test_attention_mask(backend, lens_shape, with_mask, is_causal, window):
    shape = (B, N, T, S)
    lens = None if lens_shape is None else _lens(lens_shape)
    mask = _random_mask((B, 1, T, S)) if with_mask else None
    expected = np_masking.attention_mask(shape, lens, mask=mask, is_causal=is_causal,
                                         local_window_size=window)
    got = jax_masking.attention_mask(
        shape,
        None if lens is None else _on_device(lens),
        mask=None if mask is None else _on_device(mask),
        is_causal=is_causal,
        local_window_size=window,
    )
    if window is not None:  # the window is one more AND
        without = np_masking.attention_mask(shape, lens, mask=mask, is_causal=is_causal)
        window_part = np_masking.local_window_mask(T, S, window)
        np.testing.assert_array_equal(
            np.broadcast_to(expected, shape),
            np.broadcast_to(window_part if without is None else without & window_part, shape))
    if expected is None:
        assert got is None
        return
    assert got.dtype == jnp.bool_
    np.testing.assert_array_equal(np.broadcast_to(np.asarray(got), shape), np.broadcast_to(expected, shape))


def test_combine_masks(backend):
    a, b = _random_mask((B, T, S), seed=3), _random_mask((1, T, S), seed=4)
    np.testing.assert_array_equal(
        np.asarray(jax_masking.combine_masks(_on_device(a), None, _on_device(b))),
        np_masking.combine_masks(a, None, b),
    )
    assert jax_masking.combine_masks(None, None) is None and np_masking.combine_masks(None) is None


# --------------------------------------------------------------------------- masked softmax


def _masked_softmax(X, lens, dtype, mask=None):
    """``masked_softmax`` run eagerly (the cases share a few sizes, hence the eager operations'
    programs: here cheaper than one jitted program for all of them) on X in ``dtype``."""
    return jax_masking.masked_softmax(_on_device(X, dtype), None if lens is None else _on_device(lens),
                                      mask=None if mask is None else _on_device(mask))


VALID_LENS_SHAPES = [None, (B,), (B, T)]
BOOLEAN_MASK_SHAPES = [(T, S), (S,), (B, 1, S), (1, T, S), (B, T, 1), (B, T, S)]
HEADS_LENS_SHAPES = [(B,), (B, T)]
HEADS_MASK_SHAPES = [None, (B, 1, 1, S), (B, N, T, S), (T, S)]


def _valid_lens_case(lens_shape):
    return _scores((B, T, S)), None if lens_shape is None else _lens(lens_shape)


def _boolean_mask_case(mask_shape, with_lens):
    X, mask = _scores((B, T, S)), _random_mask(mask_shape)
    mask.flat[0] = False  # at least one masked entry in every broadcast case
    return X, _lens((B,)) if with_lens else None, mask


def _heads_case(lens_shape, mask_shape):
    X, lens = _scores((B, N, T, S)), _lens(lens_shape)
    return X, lens, None if mask_shape is None else _random_mask(mask_shape)


def _large_scores_case():
    # Scores far beyond exp's range: both must shift by the row maximum rather than overflow.
    return _scores((B, T, S)) * 200.0, _lens((B, T))


@pytest.mark.parametrize("lens_shape", VALID_LENS_SHAPES)
def test_masked_softmax_valid_lens(backend, dtype, lens_shape):
    X, lens = _valid_lens_case(lens_shape)
    expected = np_masking.masked_softmax(X, lens)
    got = _masked_softmax(X, lens, dtype)
    _assert_matches(got, expected, dtype, backend)


@pytest.mark.parametrize("mask_shape", BOOLEAN_MASK_SHAPES)
@pytest.mark.parametrize("with_lens", [False, True])
def test_masked_softmax_boolean_mask(backend, dtype, mask_shape, with_lens):
    X, lens, mask = _boolean_mask_case(mask_shape, with_lens)
    expected = np_masking.masked_softmax(X, lens, mask=mask)
    got = _masked_softmax(X, lens, dtype, mask)
    _assert_matches(got, expected, dtype, backend)


@pytest.mark.parametrize("lens_shape", HEADS_LENS_SHAPES)
@pytest.mark.parametrize("mask_shape", HEADS_MASK_SHAPES)
def test_masked_softmax_heads(backend, dtype, lens_shape, mask_shape):
    X, lens, mask = _heads_case(lens_shape, mask_shape)
    expected = np_masking.masked_softmax(X, lens, mask=mask)
    got = _masked_softmax(X, lens, dtype, mask)
    _assert_matches(got, expected, dtype, backend)
    if mask is None:
        # Lengths index the batch axis and apply to every head alike.
        np.testing.assert_array_equal(np.asarray(got)[:, 0] == 0, np.asarray(got)[:, 1] == 0)


def test_masked_softmax_large_scores(backend, dtype):
    X, lens = _large_scores_case()
    expected = np_masking.masked_softmax(X, lens)
    got = _masked_softmax(X, lens, dtype)
    assert np.isfinite(expected).all()
    _assert_matches(got, expected, dtype, backend)


def test_masked_softmax_integer_scores(backend, x64):
    # Integer scores are promoted to the default float dtype in both implementations.
    X = np.random.default_rng(5).integers(-3, 4, size=(B, T, S))
    lens = _lens((B,))
    expected = np_masking.masked_softmax(X, lens)
    got = jax_masking.masked_softmax(_on_device(X, np.int64), _on_device(lens))
    _assert_matches(got, expected, jnp.float64, backend)
