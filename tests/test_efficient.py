"""Memory-efficient (chunked, online-softmax) attention against plain attention and the reference.

The ground truth is :func:`reference_numpy.scoring.dot_product_attention` (float64) and, for
gradients, autodiff through :func:`jax_attention.scoring.dot_product_attention`. Each case runs the
efficient and the plain attention in one jitted function (one compilation per case), with chunk
sizes that do not divide the lengths, ``T != S``, every kind of mask, fully masked rows and NaN in
padding; then jit/vmap, half precision, bad input, and a walk over the jaxprs of the forward and
backward passes that finds no ``T x S`` intermediate.
"""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.core import ClosedJaxpr, subjaxprs

from jax_attention import efficient
from jax_attention import scoring as jax_scoring
from reference_numpy import scoring as np_scoring

DIMS = chex.Dimensions(B=2, N=2, H=8, V=5)


def _normal(shape, dtype=jnp.float32, seed=0):
    return jnp.asarray(np.random.default_rng(seed).normal(size=shape), dtype)


def _plain(queries, keys, values, valid_lens=None, **kw):
    return jax_scoring.dot_product_attention(queries, keys, values, valid_lens, **kw)[0]


def _output_and_grads(attention, queries, keys, values, lens, mask, cotangent, **kw):
    """The output and the gradients of ``sum(cotangent * output)`` w.r.t. queries, keys, values."""
    output, vjp = jax.vjp(lambda q, k, v: attention(q, k, v, lens, mask=mask, **kw),
                          queries, keys, values)
    return output, vjp(cotangent)


@functools.partial(jax.jit, static_argnames=("is_causal", "chunks"))
def _both(queries, keys, values, lens, mask, cotangent, *, is_causal, chunks):
    """(efficient, plain), each ``(output, grads)``: one compilation per case."""
    efficient_attention = functools.partial(efficient.dot_product_attention,
                                            query_chunk_size=chunks[0], key_chunk_size=chunks[1])
    return tuple(
        _output_and_grads(f, queries, keys, values, lens, mask, cotangent, is_causal=is_causal)
        for f in (efficient_attention, _plain)
    )


# name: (batch letters, T, S, chunks (Cq, Ck), lens kind, mask kind, is_causal). Each case is a
# compilation (about 2 s here), so each covers one code path of the chunk masks: none at all,
# padding only, lengths with skipped key chunks, a mask sliced along S only, along T and S, causal.
CASES = {
    "divisible": ("BN", 16, 16, (8, 4), None, None, False),
    "ragged_no_heads": ("B", 37, 29, (8, 7), None, None, False),
    "lens_B_skipping": ("BN", 37, 29, (8, 7), "B", None, False),
    "lens_BT_key_mask_causal_S_gt_T": ("BN", 13, 29, (4, 6), "BT", "keys", True),
    "everything": ("BN", 37, 29, (8, 7), "BT", "full", True),
}


def _case_inputs(case, dtype=jnp.float32):
    batch, T, S, chunks, lens_kind, mask_kind, is_causal = CASES[case]
    rng = np.random.default_rng(7)
    shape = tuple(DIMS[batch])
    queries = _normal(shape + (T, DIMS.H), dtype, 1)
    keys = _normal(shape + (S, DIMS.H), dtype, 2)
    values = _normal(shape + (S, DIMS.V), dtype, 3)
    lens = None
    if lens_kind == "B":
        lens = jnp.asarray([9, 3], jnp.int32)  # every key chunk past the third is skipped
    elif lens_kind == "BT":
        lens = jnp.asarray(rng.integers(0, S + 1, size=(DIMS.B, T)), jnp.int32)  # some 0
    mask = None
    if mask_kind == "full":
        mask = jnp.asarray(rng.random(shape[:1] + (1,) * (len(shape) - 1) + (T, S)) < 0.7)
    elif mask_kind == "keys":
        mask = jnp.asarray(rng.random(shape[:1] + (1,) * len(shape) + (S,)) < 0.7)
    cotangent = _normal(shape + (T, DIMS.V), dtype, 4)
    return (queries, keys, values, lens, mask, cotangent), dict(is_causal=is_causal, chunks=chunks)


def _reference(queries, keys, values, lens, mask, is_causal):
    arrays = [np.asarray(a, np.float64) for a in (queries, keys, values)]
    return np_scoring.dot_product_attention(
        *arrays, None if lens is None else np.asarray(lens),
        mask=None if mask is None else np.asarray(mask), is_causal=is_causal)[0]


def _max_abs(a, b):
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)), initial=0.0))


# --------------------------------------------------------------------------- equality


@pytest.mark.parametrize("case", sorted(CASES))
def test_float32_equals_plain_attention_and_reference(case):
    args, static = _case_inputs(case)
    (output, grads), (plain_output, plain_grads) = _both(*args, **static)
    chex.assert_type([output, *grads], jnp.float32)
    chex.assert_equal_shape([output, plain_output])
    np.testing.assert_allclose(output, plain_output, rtol=1e-5, atol=2e-6)
    reference = _reference(*args[:5], static["is_causal"])
    np.testing.assert_allclose(output, reference, rtol=1e-5, atol=2e-6)
    for grad, plain_grad in zip(grads, plain_grads):
        np.testing.assert_allclose(grad, plain_grad, rtol=1e-5, atol=1e-5)
    lens = args[3]
    if lens is not None and lens.ndim == 2:
        # Queries with length 0 attend nothing: exactly zero output and query gradient.
        empty = np.broadcast_to(np.asarray(lens == 0)[:, None], output.shape[:-1])
        assert empty.any()
        assert (np.asarray(output)[empty] == 0).all() and (np.asarray(grads[0])[empty] == 0).all()


def test_float64_equals_reference(x64):
    args, static = _case_inputs("everything", jnp.float64)
    (output, grads), (_, plain_grads) = _both(*args, **static)
    chex.assert_type([output, *grads], jnp.float64)
    reference = _reference(*args[:5], static["is_causal"])
    assert _max_abs(output, reference) < 1e-12
    for grad, plain_grad in zip(grads, plain_grads):
        assert _max_abs(grad, plain_grad) < 1e-12


def test_vmap_with_per_example_lengths():
    """Under vmap the lengths, hence the number of key chunks visited, differ per example."""
    E, B, T, S = 3, 2, 10, 9
    queries, keys, values = (_normal((E, B, L, DIMS.H), jnp.float32, s)
                             for s, L in ((1, T), (2, S), (3, S)))
    lens = jnp.asarray(np.random.default_rng(0).integers(0, S + 1, size=(E, B, T)), jnp.int32)
    cotangent = _normal((E, B, T, DIMS.H), jnp.float32, 4)

    def per_example(q, k, v, lens, ct):
        attention = functools.partial(efficient.dot_product_attention, query_chunk_size=4,
                                      key_chunk_size=4)
        return (_output_and_grads(attention, q, k, v, lens, None, ct, is_causal=True),
                _output_and_grads(_plain, q, k, v, lens, None, ct, is_causal=True))

    (output, grads), (plain_output, plain_grads) = jax.jit(jax.vmap(per_example))(
        queries, keys, values, lens, cotangent)
    chex.assert_shape(output, (E, B, T, DIMS.H))
    np.testing.assert_allclose(output, plain_output, rtol=1e-5, atol=2e-6)
    for grad, plain_grad in zip(grads, plain_grads):
        np.testing.assert_allclose(grad, plain_grad, rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------- masked rows, NaN


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_half_precision_fully_masked_rows_are_zero_with_finite_gradients(dtype):
    """float32 is covered by the cases above (lengths 0 in ``lens_BT``)."""
    T, S = 9, 7
    queries, keys, values = (_normal((DIMS.B, L, DIMS.H), dtype, s)
                             for s, L in ((1, T), (2, S), (3, S)))
    # Batch element 0 has length 0; query 4 of batch element 1 has an all-False mask row.
    lens = jnp.asarray([0, 5], jnp.int32)
    mask = jnp.ones((DIMS.B, T, S), bool).at[1, 4].set(False)
    empty = np.zeros((DIMS.B, T), bool)
    empty[0] = empty[1, 4] = True
    cotangent = _normal((DIMS.B, T, DIMS.H), dtype, 4)
    attention = functools.partial(efficient.dot_product_attention, query_chunk_size=4,
                                  key_chunk_size=3)
    output, grads = jax.jit(functools.partial(_output_and_grads, attention))(
        queries, keys, values, lens, mask, cotangent)
    chex.assert_type([output, *grads], dtype)
    output, grads = np.asarray(output, np.float32), [np.asarray(g, np.float32) for g in grads]
    assert (output[empty] == 0).all()
    assert np.isfinite(output).all() and all(np.isfinite(g).all() for g in grads)
    assert (grads[0][empty] == 0).all()  # a query that attends nothing gets no gradient
    # Computed in float32 and rounded once: within the dtype's rounding of the exact result.
    atol = {jnp.bfloat16: 3e-2, jnp.float16: 4e-3}[dtype]
    np.testing.assert_allclose(output, _reference(queries, keys, values, lens, mask, False),
                               atol=atol)


def test_nan_and_inf_in_masked_positions_do_not_leak():
    T, S = 11, 10
    queries, keys, values = (_normal((DIMS.B, DIMS.N, L, DIMS.H), jnp.float32, s)
                             for s, L in ((1, T), (2, S), (3, S)))
    # Batch element 0, by lengths: keys 4.. are padding for every query, query 2 attends nothing.
    # Batch element 1, by the mask: keys 3..5 are masked for every query, query 7 attends nothing.
    lens = jnp.asarray(np.r_[[[4] * T], [[S] * T]], jnp.int32).at[0, 2].set(0)
    mask = jnp.ones((DIMS.B, 1, T, S), bool).at[1, :, :, 3:6].set(False).at[1, :, 7].set(False)
    dirty_keys = [(0, slice(None), slice(4, None)), (1, slice(None), slice(3, 6))]
    dirty_rows = [(0, slice(None), 2), (1, slice(None), 7)]

    def poison(array, indices, first, rest):
        # NaN and +-Inf side by side: each breaks a different shortcut (0 * x, x - x, max).
        for index in indices:
            size = array[index].shape[-1]
            array = array.at[index].set(jnp.where(jnp.arange(size) < size // 2, first, rest)
                                        .astype(array.dtype))
        return array

    dirty = (poison(queries, dirty_rows, np.nan, np.inf), poison(keys, dirty_keys, np.inf, np.nan),
             poison(values, dirty_keys, -np.inf, np.nan))
    cotangent = _normal((DIMS.B, DIMS.N, T, DIMS.H), jnp.float32, 4)
    static = dict(is_causal=False, chunks=(4, 3))
    (clean_output, clean_grads), _ = _both(queries, keys, values, lens, mask, cotangent, **static)
    (dirty_output, dirty_grads), _ = _both(*dirty, lens, mask, cotangent, **static)
    assert np.isfinite(np.asarray(dirty_output)).all()
    assert all(np.isfinite(np.asarray(g)).all() for g in dirty_grads)
    # Masked entries are zeroed inside each chunk in both runs, so valid results agree bit for bit.
    chex.assert_trees_all_equal(dirty_output, clean_output)
    chex.assert_trees_all_equal(dirty_grads, clean_grads)
    for rows in dirty_rows:
        assert (np.asarray(dirty_output)[rows] == 0).all()


# --------------------------------------------------------------------------- memory


def _all_shapes(closed_jaxpr):
    """Shapes of every variable in a jaxpr and in all its sub-jaxprs (scan, while, cond, pjit,
    custom_vjp bodies), inputs and constants included."""
    shapes = []
    stack = [closed_jaxpr.jaxpr]
    while stack:
        jaxpr = stack.pop()
        variables = list(jaxpr.invars) + list(jaxpr.constvars)
        for eqn in jaxpr.eqns:
            variables += eqn.outvars
        shapes += [tuple(v.aval.shape) for v in variables if hasattr(v.aval, "shape")]
        stack += list(subjaxprs(jaxpr))
    return shapes


def _quadratic(shapes, length):
    """Shapes with two axes of at least ``length`` or at least ``length**2 / 4`` elements."""
    return [s for s in shapes if sum(d >= length for d in s) >= 2
            or int(np.prod(s, dtype=np.int64)) >= length ** 2 // 4]


def test_no_quadratic_intermediate_in_forward_or_backward():
    T = S = 1024
    queries, keys, values = (_normal((1, 1, T, 16), jnp.float32, s) for s in (1, 2, 3))
    lens = jnp.asarray(np.random.default_rng(0).integers(0, S + 1, size=(1, T)), jnp.int32)
    key_mask = jnp.asarray(np.random.default_rng(1).random((1, 1, 1, S)) < 0.9)
    cotangent = _normal((1, 1, T, 16), jnp.float32, 4)

    def forward(attention, q, k, v):
        return attention(q, k, v, lens, mask=key_mask, is_causal=True)

    def loss(attention, q, k, v):
        return jnp.sum(forward(attention, q, k, v) * cotangent)

    chunked = functools.partial(efficient.dot_product_attention, query_chunk_size=128,
                                key_chunk_size=128)
    jaxprs = [jax.make_jaxpr(functools.partial(forward, chunked))(queries, keys, values),
              jax.make_jaxpr(jax.grad(functools.partial(loss, chunked), (0, 1, 2)))(
                  queries, keys, values)]
    assert all(isinstance(j, ClosedJaxpr) for j in jaxprs)
    for jaxpr in jaxprs:
        shapes = _all_shapes(jaxpr)
        assert (1, 1, 128, 128) in shapes  # the walk reaches the chunk bodies
        assert not _quadratic(shapes, T), _quadratic(shapes, T)
    # The same walk over the plain attention's backward pass does find its T x S scores.
    plain = jax.make_jaxpr(jax.grad(functools.partial(loss, _plain), (0, 1, 2)))(
        queries, keys, values)
    assert (1, 1, T, S) in _quadratic(_all_shapes(plain), T)


# --------------------------------------------------------------------------- bad input


BAD_INPUTS = {
    "keys_batch": (dict(keys=(3, 4, 8)), ValueError),
    "values_length": (dict(values=(2, 5, 5)), ValueError),
    "key_size": (dict(keys=(2, 4, 7)), ValueError),
    "rank": (dict(queries=(3, 8)), ValueError),
    "dtypes": (dict(values_dtype=jnp.bfloat16), TypeError),
    "lens_shape": (dict(valid_lens=np.array([1, 2, 3], np.int32)), ValueError),
    "lens_range": (dict(valid_lens=np.array([1, 5], np.int32)), ValueError),
    "lens_float": (dict(valid_lens=np.array([1.0, 2.0], np.float32)), ValueError),
    "mask_dtype": (dict(mask=np.ones((2, 3, 4), np.int32)), TypeError),
    "mask_shape": (dict(mask=np.ones((2, 3, 5), bool)), ValueError),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_raises_what_plain_attention_raises(case):
    """The checks are scoring's and masking's own, so the messages are the same too."""
    changes, error = BAD_INPUTS[case]
    shapes = {"queries": (2, 3, 8), "keys": (2, 4, 8), "values": (2, 4, 5)}
    shapes.update({name: changes[name] for name in shapes if name in changes})
    arrays = {name: np.ones(shape, np.float32) for name, shape in shapes.items()}
    arrays["values"] = jnp.asarray(arrays["values"], changes.get("values_dtype", jnp.float32))
    kwargs = {name: changes[name] for name in ("valid_lens", "mask") if name in changes}
    with pytest.raises(error) as plain_error:
        _plain(**arrays, **kwargs)
    with pytest.raises(error) as efficient_error:
        efficient.dot_product_attention(**arrays, **kwargs)
    assert str(efficient_error.value) == str(plain_error.value)


@pytest.mark.parametrize("chunk, error", [(0, ValueError), (-3, ValueError), (2.5, TypeError)])
@pytest.mark.parametrize("name", ["query_chunk_size", "key_chunk_size"])
def test_bad_chunk_size(name, chunk, error):
    queries = np.ones((1, 3, 4), np.float32)
    with pytest.raises(error, match=name):
        efficient.dot_product_attention(queries, queries, queries, **{name: chunk})
