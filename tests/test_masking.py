"""Properties of the JAX masks and masked softmax (d2l §10.7, §11.3.2).

Shapes, jit and no-jit (chex variants), vmap, gradients against finite differences, exact zeros
for masked entries, hypothesis properties against the NumPy reference, bad input, and the
documented behaviour of traced lengths under jit.
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
from jax.test_util import check_grads

from jax_attention.nn import masking as jax_masking
from reference_numpy import masking as np_masking
from tests.hypothesis_support import examples, sizes

DIMS = chex.Dimensions(B=2, N=3, T=4, S=5)


def _scores(shape, dtype=jnp.float32, seed=0):
    return jnp.asarray(np.random.default_rng(seed).normal(scale=2.0, size=shape), dtype)


def _lens(values):
    return jnp.asarray(values, jnp.int32)


def _assert_masked_exactly_zero(weights, keep):
    """Masked entries are exactly 0 (not merely small); every row sums to 1, or 0 if fully masked."""
    weights = np.asarray(weights, np.float64)
    keep = np.broadcast_to(np.asarray(keep), weights.shape)
    assert (weights[~keep] == 0).all()
    sums = weights.sum(axis=-1)
    np.testing.assert_allclose(sums, keep.any(axis=-1).astype(np.float64), rtol=1e-6, atol=1e-6)
    assert (sums[~keep.any(axis=-1)] == 0).all()


def _keep_from_lens(lens, num_queries, num_keys):
    lens = np.asarray(lens)
    if lens.ndim == 1:
        lens = np.repeat(lens[:, None], num_queries, axis=1)
    return np.arange(num_keys) < lens[..., None]


# --------------------------------------------------------------------------- jit and no jit


class MaskingVariantsTest(chex.TestCase):
    """The same results with and without jit; lengths are arguments, hence traced under jit."""

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.named_parameters(
        ("lens_B", (2, 0)),
        ("lens_BT", ((0, 1, 5, 3), (5, 5, 2, 0))),
    )
    def test_masked_softmax_shape_and_zeros(self, lens):
        X, lens = _scores(DIMS["BTS"]), _lens(lens)
        weights = self.variant(jax_masking.masked_softmax)(X, lens)
        chex.assert_shape(weights, DIMS["BTS"])
        chex.assert_type(weights, jnp.float32)
        _assert_masked_exactly_zero(weights, _keep_from_lens(lens, DIMS.T, DIMS.S))

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.named_parameters(("lens_B", (3, 1)), ("lens_BT", ((0, 1, 5, 3), (5, 5, 2, 4))))
    def test_masked_softmax_heads_share_lengths(self, lens):
        X, lens = _scores(DIMS["BNTS"]), _lens(lens)
        weights = self.variant(jax_masking.masked_softmax)(X, lens)
        chex.assert_shape(weights, DIMS["BNTS"])
        keep = _keep_from_lens(lens, DIMS.T, DIMS.S)[:, None]
        _assert_masked_exactly_zero(weights, keep)

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.named_parameters(("TS", "TS"), ("B1S", "B1S"), ("BTS", "BTS"), ("B1TS", "B1TS"))
    def test_masked_softmax_boolean_mask(self, mask_letters):
        shape = DIMS["BNTS"] if "1T" in mask_letters else DIMS["BTS"]
        mask_shape = tuple(1 if c == "1" else DIMS[c][0] for c in mask_letters)
        mask = jnp.asarray(np.random.default_rng(1).random(mask_shape) < 0.5)
        mask = mask.at[(0,) * mask.ndim].set(False)
        X = _scores(shape)
        weights = self.variant(lambda x, m: jax_masking.masked_softmax(x, mask=m))(X, mask)
        chex.assert_shape(weights, shape)
        _assert_masked_exactly_zero(weights, mask)

    @chex.variants(with_jit=True, without_jit=True)
    def test_all_false_mask_gives_zero_rows(self):
        X = _scores(DIMS["BTS"])
        mask = jnp.ones(DIMS["BTS"], bool).at[1, 2].set(False)
        weights = self.variant(lambda x, m: jax_masking.masked_softmax(x, mask=m))(X, mask)
        assert (np.asarray(weights[1, 2]) == 0).all()
        np.testing.assert_allclose(np.asarray(weights[0].sum(-1)), np.ones(DIMS.T), rtol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_sequence_mask(self):
        X = _scores(DIMS["BS"])
        got = self.variant(jax_masking.sequence_mask)(X, _lens((1, 4)))
        chex.assert_equal_shape([got, X])
        expected = np.where(np.arange(DIMS.S) < np.array([[1], [4]]), np.asarray(X), 0)
        np.testing.assert_array_equal(np.asarray(got), expected)

    @chex.variants(with_jit=True, without_jit=True)
    def test_causal_mask_traced_offset(self):
        # The docstring promises a traced offset works under jit (e.g. a decoding step counter).
        got = self.variant(lambda offset: jax_masking.causal_mask(3, 6, offset=offset))(jnp.int32(2))
        chex.assert_shape(got, (3, 6))
        np.testing.assert_array_equal(np.asarray(got), np_masking.causal_mask(3, 6, offset=2))

    @chex.variants(with_jit=True, without_jit=True)
    def test_half_precision_rows_sum_to_one(self):
        # float16/bfloat16 are normalised in float32: the sums hold to the output dtype's rounding.
        for dtype, tol in ((jnp.float16, 2e-3), (jnp.bfloat16, 1.6e-2)):
            X = _scores(DIMS["BTS"], dtype) * 8
            weights = self.variant(jax_masking.masked_softmax)(X, _lens((0, 3)))
            chex.assert_type(weights, dtype)
            sums = np.asarray(weights.astype(jnp.float32)).sum(-1)
            np.testing.assert_allclose(sums[1], np.ones(DIMS.T), atol=tol)
            assert (sums[0] == 0).all() and (np.asarray(weights[1, :, 3:]) == 0).all()


# --------------------------------------------------------------------------- traced lengths


def test_traced_negative_length_masks_the_whole_row():
    # Documented: traced lengths cannot be range-checked; < 0 acts like 0 (a zero row).
    X = _scores(DIMS["BTS"])
    weights = jax.jit(jax_masking.masked_softmax)(X, _lens((-2, 3)))
    assert (np.asarray(weights[0]) == 0).all()
    np.testing.assert_array_equal(
        np.asarray(weights[1]), np.asarray(jax_masking.masked_softmax(X, _lens((0, 3)))[1])
    )


def test_traced_length_above_s_keeps_all_keys():
    X = _scores(DIMS["BTS"])
    got = jax.jit(jax_masking.masked_softmax)(X, _lens(((9, 5, 6, 100), (2, 7, 5, 1))))
    expected = jax.jit(jax_masking.masked_softmax)(X, _lens(((5, 5, 5, 5), (2, 5, 5, 1))))
    np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))


@pytest.mark.parametrize("bad", [(-1, 3), (2, 6)])
def test_closed_over_lengths_are_checked_under_jit(bad):
    # Constants closed over by a jitted function are concrete at trace time, so they are checked.
    lens = _lens(bad)
    with pytest.raises(ValueError, match=r"valid_lens must lie in \[0, S\] = \[0, 5\]"):
        jax.jit(lambda x: jax_masking.masked_softmax(x, lens))(_scores(DIMS["BTS"]))


# --------------------------------------------------------------------------- vmap


@pytest.mark.parametrize("lens_shape", [(3, 2), (3, 2, 4)])
def test_vmap_matches_loop(lens_shape):
    # A leading axis of 3 over (B, T, S) scores; lengths vary along it, so they are batched too.
    X = _scores((3,) + DIMS["BTS"])
    lens = _lens(np.random.default_rng(4).integers(0, DIMS.S + 1, size=lens_shape))
    got = jax.vmap(jax_masking.masked_softmax)(X, lens)
    expected = jnp.stack([jax_masking.masked_softmax(X[i], lens[i]) for i in range(3)])
    chex.assert_trees_all_close(got, expected, rtol=1e-6, atol=1e-7)
    chex.assert_shape(got, (3,) + DIMS["BTS"])


def test_vmap_over_mask():
    X = _scores((3,) + DIMS["TS"])
    mask = jnp.asarray(np.random.default_rng(5).random((3,) + DIMS["TS"]) < 0.5)
    # Without a batch axis per call, valid_lens is unusable; a mask is the per-example way.
    got = jax.vmap(lambda x, m: jax_masking.masked_softmax(x, mask=m))(X, mask)
    expected = jnp.stack([jax_masking.masked_softmax(X[i], mask=mask[i]) for i in range(3)])
    chex.assert_trees_all_close(got, expected, rtol=1e-6, atol=1e-7)


# --------------------------------------------------------------------------- gradients


@pytest.mark.parametrize(
    "lens, mask",
    [
        (None, None),
        ((2, 5), None),
        (((1, 2, 3, 4), (5, 0, 2, 1)), None),  # includes a fully masked row
        (None, "random"),
        ((3, 0), "random"),  # the whole second batch element is masked
    ],
)
def test_gradients_match_finite_differences(x64, lens, mask):
    X = _scores(DIMS["BTS"], jnp.float64)
    lens = None if lens is None else jnp.asarray(lens, jnp.int32)
    if mask is not None:
        mask = jnp.asarray(np.random.default_rng(6).random(DIMS["BTS"]) < 0.6)
    # jit only to compile the finite-difference evaluations once; eager gradients are tested below.
    check_grads(
        jax.jit(lambda x: jax_masking.masked_softmax(x, lens, mask=mask)), (X,), order=1, modes=("rev",)
    )


def test_gradient_of_fully_masked_row_is_zero(x64):
    X = _scores(DIMS["BTS"], jnp.float64)
    grad = jax.grad(lambda x: (jax_masking.masked_softmax(x, _lens((0, 3))) * x).sum())(X)
    assert (np.asarray(grad[0]) == 0).all() and (np.asarray(grad[1, :, 3:]) == 0).all()
    assert np.isfinite(np.asarray(grad)).all() and (np.asarray(grad[1, :, :3]) != 0).any()


# --------------------------------------------------------------------------- NaN, Inf, inputs


def test_nan_and_inf_in_masked_entries_do_not_leak():
    X = _scores(DIMS["BTS"])
    lens = _lens((2, 4))
    # NaN, +Inf and -Inf side by side: each defeats a different shortcut (x * 0, x - max, max).
    dirty = X.at[0, :, 2].set(np.nan).at[0, :, 3].set(np.inf).at[0, :, 4].set(-np.inf).at[1, :, 4].set(np.nan)
    clean_weights = jax_masking.masked_softmax(X, lens)
    dirty_weights = jax_masking.masked_softmax(dirty, lens)
    np.testing.assert_array_equal(np.asarray(dirty_weights), np.asarray(clean_weights))
    grad = jax.grad(lambda x: (jax_masking.masked_softmax(x, lens) ** 2).sum())(dirty)
    assert np.isfinite(np.asarray(grad)).all()
    np.testing.assert_array_equal(
        np.asarray(np_masking.masked_softmax(np.asarray(dirty, np.float64), np.asarray(lens))[0, :, 2:]), 0
    )


def test_masked_softmax_does_not_modify_its_input():
    X_np = np.random.default_rng(7).normal(size=DIMS["BTS"])
    X_np[0, :, 3:] = np.nan
    before = X_np.copy()
    np_masking.masked_softmax(X_np, np.array([3, 5]), mask=np.ones(DIMS["TS"], bool))
    np.testing.assert_array_equal(X_np, before)

    X_jax = jnp.asarray(X_np, jnp.float32)
    before_jax = np.array(X_jax)
    jax_masking.masked_softmax(X_jax, _lens((3, 5)))
    jax.jit(jax_masking.masked_softmax)(X_jax, _lens((3, 5)))
    np.testing.assert_array_equal(np.asarray(X_jax), before_jax)
    assert not X_jax.is_deleted()


def test_sequence_mask_does_not_modify_its_input():
    X = np.arange(10.0).reshape(2, 5)
    before = X.copy()
    got = np_masking.sequence_mask(X, np.array([1, 3]), value=-1.0)
    np.testing.assert_array_equal(X, before)
    assert got.tolist() == [[0.0, -1.0, -1.0, -1.0, -1.0], [5.0, 6.0, 7.0, -1.0, -1.0]]


# --------------------------------------------------------------------------- hand-worked values


def test_hand_worked_masked_softmax():
    e, e2 = math.e, math.e**2
    expected = np.array([[[e / (e + e2), e2 / (e + e2), 0.0, 0.0]]])
    X = np.array([[[1.0, 2.0, 3.0, 4.0]]])
    np.testing.assert_allclose(np_masking.masked_softmax(X, np.array([2])), expected, rtol=1e-14)
    got = jax_masking.masked_softmax(jnp.asarray(X, jnp.float32), _lens((2,)))
    np.testing.assert_allclose(np.asarray(got, np.float64), expected, rtol=1e-6)
    assert (np.asarray(got)[..., 2:] == 0).all()


@pytest.mark.parametrize(
    "lens, keep_counts", [((2, 3), [[2, 2], [3, 3]]), (((1, 3), (2, 4)), [[1, 3], [2, 4]])]
)
def test_d2l_example(lens, keep_counts):
    # d2l §11.3.2: masked_softmax(torch.rand(2, 2, 4), torch.tensor([2, 3])) and the (B, T) variant,
    # with the lengths as plain lists, as one would type them.
    X = np.random.default_rng(8).random((2, 2, 4))
    lens = [list(row) if isinstance(row, tuple) else row for row in lens]
    for weights in (
        np_masking.masked_softmax(X, lens),
        np.asarray(jax_masking.masked_softmax(jnp.asarray(X, jnp.float32), lens)),
        np.asarray(jax_masking.masked_softmax(jnp.asarray(X, jnp.float32), _lens(lens))),
    ):
        counts = (weights != 0).sum(axis=-1)
        assert counts.tolist() == keep_counts
        for b in range(2):
            for t in range(2):
                assert (weights[b, t, keep_counts[b][t] :] == 0).all()
        np.testing.assert_allclose(weights.sum(-1), np.ones((2, 2)), rtol=1e-6)


def test_fully_masked_rows_in_numpy_float64_and_float16():
    for dtype in (np.float64, np.float16):
        X = np.random.default_rng(9).normal(size=(2, 3, 4)).astype(dtype)
        weights = np_masking.masked_softmax(X, np.array([[0, 2, 4], [0, 0, 1]]))
        assert weights.dtype == dtype
        assert (weights[0, 0] == 0).all() and (weights[1, :2] == 0).all()
        np.testing.assert_allclose(weights[0, 1:].sum(-1).astype(np.float64), [1.0, 1.0], rtol=1e-3)
        all_false = np_masking.masked_softmax(X, mask=np.zeros((3, 4), bool))
        assert (all_false == 0).all()


# --------------------------------------------------------------------------- hypothesis


# Every new shape costs a compilation: one per jitted function, but one per primitive when run
# eagerly (about three times slower). Hence a jitted function built once, and small ranges.
_jitted_masked_softmax = jax.jit(jax_masking.masked_softmax)


@st.composite
def _softmax_cases(draw):
    B, T, S = draw(sizes(1, 2)), draw(sizes(1, 2)), draw(sizes(1, 4))
    per_query = draw(st.booleans())
    lens = draw(
        st.lists(st.integers(0, S), min_size=B * T if per_query else B, max_size=B * T if per_query else B)
    )
    lens = np.asarray(lens, np.int32).reshape((B, T) if per_query else (B,))
    seed = draw(st.integers(0, 2**16))
    X = np.random.default_rng(seed).normal(scale=3.0, size=(B, T, S))
    return X, lens


@hypothesis.settings(max_examples=examples(ci=10, dev=25))
@hypothesis.given(_softmax_cases())
def test_masked_softmax_property(case):
    X, lens = case
    expected = np_masking.masked_softmax(X, lens)
    with jax.enable_x64(True):
        got = np.asarray(_jitted_masked_softmax(jnp.asarray(X, jnp.float64), jnp.asarray(lens)))
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
    keep = _keep_from_lens(lens, X.shape[1], X.shape[2])
    _assert_masked_exactly_zero(got, keep)
    assert (expected[~keep] == 0).all()


@hypothesis.settings(max_examples=examples(ci=10, dev=25))
@hypothesis.given(sizes(1, 5), sizes(1, 5), st.integers(-5, 5))
def test_causal_mask_property(num_queries, num_keys, offset):
    got = np.asarray(jax_masking.causal_mask(num_queries, num_keys, offset=offset))
    np.testing.assert_array_equal(got, np_masking.causal_mask(num_queries, num_keys, offset=offset))
    # Row t sees exactly the keys 0..t+offset, clipped to [0, S].
    assert got.sum(-1).tolist() == [min(max(t + offset + 1, 0), num_keys) for t in range(num_queries)]


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "lens, dtype, message",
    [
        (
            (-1, 2),
            "int32",
            r"valid_lens must lie in \[0, S\] = \[0, 5\], got values from -1 to 2 \(shape \(2,\)\)",
        ),
        ((2, 6), "int32", r"valid_lens must lie in \[0, S\] = \[0, 5\], got values from 2 to 6"),
        ((2.0, 3.0), "float32", r"valid_lens must hold integers, got dtype float32 with shape \(2,\)"),
        ((True, False), "bool", r"valid_lens must hold integers, got dtype bool"),
        (
            (1, 2, 3),
            "int32",
            r"valid_lens must have shape \(B,\) = \(2,\) or \(B, T\) = \(2, 4\), got \(3,\)",
        ),
        ((((1,),) * 4,) * 2, "int32", r"valid_lens must have shape .* got \(2, 4, 1\)"),
        ((1, 2, 3, 4), "int32", r"valid_lens must have shape .* got \(4,\)"),
    ],
)
def test_bad_valid_lens(lens, dtype, message):
    for module, xnp in ((jax_masking, jnp), (np_masking, np)):
        X = xnp.asarray(np.zeros(DIMS["BTS"]), xnp.float32)
        with pytest.raises(ValueError, match=message):
            module.masked_softmax(X, xnp.asarray(lens, dtype))


def test_valid_lens_need_a_batch_axis():
    for module, xnp in ((jax_masking, jnp), (np_masking, np)):
        with pytest.raises(
            ValueError,
            match=re.escape("valid_lens needs scores with a batch axis (B, ..., T, S), got shape (4, 5)"),
        ):
            module.masked_softmax(xnp.zeros((4, 5), xnp.float32), xnp.asarray([1, 2, 3, 4], xnp.int32))


@pytest.mark.parametrize("mask_dtype", ["int32", "float32"])
def test_non_boolean_mask_is_a_type_error(mask_dtype):
    for module, xnp in ((jax_masking, jnp), (np_masking, np)):
        with pytest.raises(
            TypeError,
            match=rf"mask must be boolean \(True = attend\), got dtype {mask_dtype} with shape \(4, 5\)",
        ):
            module.masked_softmax(xnp.zeros(DIMS["BTS"], xnp.float32), mask=xnp.ones(DIMS["TS"], mask_dtype))


@pytest.mark.parametrize("mask_shape", [(3, 5), (2, 4, 4), (3, 4, 5), (2, 2, 4, 5)])
def test_mask_not_broadcastable(mask_shape):
    expected = re.escape(
        f"mask must broadcast to the scores' shape (B, ..., T, S) = (2, 4, 5), got shape {mask_shape}"
    )
    for module, xnp in ((jax_masking, jnp), (np_masking, np)):
        with pytest.raises(ValueError, match=expected):
            module.masked_softmax(xnp.zeros(DIMS["BTS"], xnp.float32), mask=xnp.ones(mask_shape, bool))


def test_bad_sequence_mask_lengths():
    for module, xnp in ((jax_masking, jnp), (np_masking, np)):
        X = xnp.zeros(DIMS["BS"], xnp.float32)
        with pytest.raises(
            ValueError, match=r"valid_len must hold integers, got dtype float32 with shape \(2,\)"
        ):
            module.sequence_mask(X, xnp.asarray([1.0, 2.0], xnp.float32))
        with pytest.raises(
            ValueError, match=re.escape("valid_len must broadcast to X.shape[:-1] = (2,), got shape (3,)")
        ):
            module.sequence_mask(X, xnp.asarray([1, 2, 3], xnp.int32))
        with pytest.raises(
            ValueError, match=re.escape("X must have at least one axis (..., S), got shape ()")
        ):
            module.sequence_mask(xnp.zeros((), xnp.float32), xnp.asarray(1, xnp.int32))


# --------------------------------------------------------------------------- issue 16: input checks


@pytest.mark.parametrize("X_shape, lens_shape", [((5,), (1,)), ((2, 5), (2, 1)), ((2, 5), (1, 2)),
                                                 ((2, 4, 5), (2, 1, 4))])
def test_sequence_mask_lengths_that_would_add_axes_name_both_shapes(X_shape, lens_shape):
    # (1,) broadcasts with X.shape[:-1] = () but would grow the result: JAX raised a raw
    # broadcasting error naming no argument, NumPy returned a (1, 5) array.
    for module, xnp in ((jax_masking, jnp), (np_masking, np)):
        with pytest.raises(ValueError) as error:
            module.sequence_mask(xnp.ones(X_shape), xnp.ones(lens_shape, xnp.int32))
        message = str(error.value)
        assert "valid_len must broadcast to X.shape[:-1]" in message
        assert f"got shape {lens_shape}" in message and f"X has shape {X_shape}" in message


def test_sequence_mask_lengths_that_broadcast_keep_the_shape_of_X():
    for module, xnp in ((jax_masking, jnp), (np_masking, np)):
        assert module.sequence_mask(xnp.ones(5), xnp.asarray(2)).shape == (5,)
        assert module.sequence_mask(xnp.ones((2, 3, 5)), xnp.ones(3, xnp.int32)).shape == (2, 3, 5)


@pytest.mark.parametrize("lens_shape", [(3,), (1,), (2, 5), (2, 4, 1), (4, 2)])
def test_masked_softmax_lengths_of_other_shapes_name_valid_lens(lens_shape):
    for module, xnp in ((jax_masking, jnp), (np_masking, np)):
        with pytest.raises(ValueError, match=re.escape(
                f"valid_lens must have shape (B,) = (2,) or (B, T) = (2, 4), got {lens_shape}")):
            module.masked_softmax(xnp.zeros(DIMS["BTS"]), xnp.ones(lens_shape, xnp.int32))


@pytest.mark.parametrize("is_causal, type_name", [
    ("False", "str"), (1, "int"), (0, "int"), (None, "NoneType"), (np.array(True), "ndarray"),
    (jnp.array(False), "Array"),
])
def test_is_causal_must_be_a_python_bool(is_causal, type_name):
    # Truthiness used to decide: "False", 1 and a non-empty array all meant causal.
    for module in (jax_masking, np_masking):
        with pytest.raises(TypeError, match=rf"is_causal must be a Python bool \(True or False\), "
                                            rf"got {type_name}"):
            module.attention_mask(DIMS["BTS"], is_causal=is_causal)


def test_is_causal_accepts_numpy_bools():
    for module in (jax_masking, np_masking):
        np.testing.assert_array_equal(module.attention_mask(DIMS["BTS"], is_causal=np.bool_(True)),
                                      module.attention_mask(DIMS["BTS"], is_causal=True))
        assert module.attention_mask(DIMS["BTS"], is_causal=np.bool_(False)) is None


def test_traced_is_causal_is_refused_with_the_advice_to_make_it_static():
    with pytest.raises(TypeError, match=r"is_causal must be a static Python bool .*traced value.*"
                                        r"static_argnames='is_causal'"):
        jax.jit(lambda c: jax_masking.attention_mask(DIMS["BTS"], is_causal=c))(True)


def test_causal_mask_offset_beyond_int32_is_refused_not_wrapped():
    for offset in (np.int64(2**31), 2**31, np.int64(-(2**31) - 1)):
        with pytest.raises(ValueError, match=r"offset must lie in \[-2147483648, 2147483647\]"):
            jax_masking.causal_mask(2, 3, offset=offset)
    # In range, a NumPy int64 offset is used as it is.
    np.testing.assert_array_equal(jax_masking.causal_mask(2, 3, offset=np.int64(1)),
                                  np_masking.causal_mask(2, 3, offset=np.int64(1)))


@pytest.mark.parametrize("window, error, message", [
    (None, TypeError, "local_window_size must be an int w (= (w, w)) or a pair of ints (left, right), "
                      "got None"),
    (-1, ValueError, "local_window_size must be >= 0 on both sides (left, right), got -1"),
    ((0, -3), ValueError, "local_window_size must be >= 0 on both sides (left, right), got (0, -3)"),
    ("2", TypeError, "local_window_size must be an int w (= (w, w)) or a pair of ints (left, right), "
                     "got str '2'"),
    ((1.0, 2), TypeError, "got tuple (1.0, 2)"),
])
def test_bad_local_windows(window, error, message):
    for masking in (jax_masking, np_masking):
        with pytest.raises(error, match=re.escape(message)):
            masking.local_window_mask(3, 4, window)
    if window is not None:  # attention_mask(local_window_size=None) means no window
        with pytest.raises(error, match=re.escape(message)):
            jax_masking.attention_mask((2, 3, 4), local_window_size=window)


def test_local_window_mask_with_a_traced_offset_under_jit():
    """The offset may be traced (a decoding position); the window stays static."""
    got = jax.jit(lambda offset: jax_masking.local_window_mask(1, 6, (2, 0), offset=offset))(
        jnp.asarray(3, jnp.int32))
    assert np.asarray(got).astype(int).tolist() == [[0, 1, 1, 1, 0, 0]]
