"""Memory-efficient (chunked, online-softmax) attention against plain attention and the reference.

The ground truth is :func:`reference_numpy.scoring.dot_product_attention` (float64) and, for
gradients, autodiff through :func:`jax_attention.nn.scoring.dot_product_attention`. Each case runs the
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

from jax_attention.nn import efficient
from jax_attention.nn import scoring as jax_scoring
from reference_numpy import scoring as np_scoring

DIMS = chex.Dimensions(B=2, N=2, H=8, V=5)


def _device(array, dtype=None):
    """``array`` as a JAX array of ``dtype``, cast by NumPy: ``jnp.asarray`` would compile a
    conversion program for every new shape and dtype, ``jax.device_put`` compiles nothing."""
    return jax.device_put(np.asarray(array, dtype))


def _normal(shape, dtype=jnp.float32, seed=0):
    return _device(np.random.default_rng(seed).normal(size=shape), dtype)


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
        lens = _device([9, 3], jnp.int32)  # every key chunk past the third is skipped
    elif lens_kind == "BT":
        lens = _device(rng.integers(0, S + 1, size=(DIMS.B, T)), jnp.int32)  # some 0
    mask = None
    if mask_kind == "full":
        mask = _device(rng.random(shape[:1] + (1,) * (len(shape) - 1) + (T, S)) < 0.7)
    elif mask_kind == "keys":
        mask = _device(rng.random(shape[:1] + (1,) * len(shape) + (S,)) < 0.7)
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
        empty = np.broadcast_to((np.asarray(lens) == 0)[:, None], output.shape[:-1])
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
    lens = _device(np.random.default_rng(0).integers(0, S + 1, size=(E, B, T)), jnp.int32)
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
    lens = _device([0, 5], jnp.int32)
    mask = np.ones((DIMS.B, T, S), bool)
    mask[1, 4] = False
    mask = _device(mask)
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
    lens = np.r_[[[4] * T], [[S] * T]].astype(np.int32)
    lens[0, 2] = 0
    mask = np.ones((DIMS.B, 1, T, S), bool)
    mask[1, :, :, 3:6] = mask[1, :, 7] = False
    lens, mask = _device(lens), _device(mask)
    dirty_keys = [(0, slice(None), slice(4, None)), (1, slice(None), slice(3, 6))]
    dirty_rows = [(0, slice(None), 2), (1, slice(None), 7)]

    def poison(array, indices, first, rest):
        # NaN and +-Inf side by side: each breaks a different shortcut (0 * x, x - x, max).
        array = np.array(array)
        for index in indices:
            size = array[index].shape[-1]
            array[index] = np.where(np.arange(size) < size // 2, first, rest)
        return _device(array)

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
    lens = _device(np.random.default_rng(0).integers(0, S + 1, size=(1, T)), jnp.int32)
    key_mask = _device(np.random.default_rng(1).random((1, 1, 1, S)) < 0.9)
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
    "rank": (dict(queries=(8,)), ValueError),
    "dtypes": (dict(values_dtype=jnp.bfloat16), TypeError),
    "lens_shape": (dict(valid_lens=np.array([1, 2, 3], np.int32)), ValueError),
    "lens_range": (dict(valid_lens=np.array([1, 5], np.int32)), ValueError),
    "lens_float": (dict(valid_lens=np.array([1.0, 2.0], np.float32)), ValueError),
    "mask_dtype": (dict(mask=np.ones((2, 3, 4), np.int32)), TypeError),
    "mask_shape": (dict(mask=np.ones((2, 3, 5), bool)), ValueError),
    "kv_heads_do_not_divide": (dict(queries=(2, 6, 3, 8), keys=(2, 4, 4, 8), values=(2, 4, 4, 5)),
                               ValueError),
    "unbatched_queries_batched_keys": (dict(queries=(3, 8)), ValueError),
    "unbatched_lens_shape": (dict(queries=(3, 8), keys=(4, 8), values=(4, 5),
                                  valid_lens=np.array([1, 2], np.int32)), ValueError),
    "window": (dict(local_window_size=(1, -1)), ValueError),
    "scale": (dict(scale="1"), TypeError),
    "softcap": (dict(logit_softcap=0), ValueError),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_raises_what_plain_attention_raises(case):
    """The checks are scoring's and masking's own, so the messages are the same too."""
    changes, error = BAD_INPUTS[case]
    shapes = {"queries": (2, 3, 8), "keys": (2, 4, 8), "values": (2, 4, 5)}
    shapes.update({name: changes[name] for name in shapes if name in changes})
    arrays = {name: np.ones(shape, np.float32) for name, shape in shapes.items()}
    arrays["values"] = _device(arrays["values"], changes.get("values_dtype", jnp.float32))
    kwargs = {name: changes[name] for name in ("valid_lens", "mask", "local_window_size", "scale",
                                               "logit_softcap") if name in changes}
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


# --------------------------------------------------------------------------- variants
# scale, logit_softcap, local_window_size, grouped-query heads and unbatched inputs, against a
# float64 reference written here (repeated K/V heads, a T x S mask built from index arithmetic)
# and, for gradients, jax.grad through a plain float64 implementation written the same way.


def _window_keep(T, S, window, is_causal):
    """``(T, S)`` boolean: the window's and causality's rule from index arithmetic."""
    t, s = np.arange(T)[:, None], np.arange(S)[None, :]
    keep = np.ones((T, S), bool)
    if window is not None:
        left, right = (window, window) if isinstance(window, int) else window
        keep &= (s >= t - left) & (s <= t + right)
    if is_causal:
        keep &= s <= t
    return keep


def _full_keep(xp, shape, lens, mask, is_causal, window):
    """The combined mask broadcast to the scores' ``shape`` (B, ..., T, S), as ``xp`` arrays."""
    T, S = shape[-2:]
    keep = xp.broadcast_to(xp.asarray(_window_keep(T, S, window, is_causal)), shape)
    if lens is not None:
        lens = xp.asarray(lens)
        lens = xp.broadcast_to(lens[:, None] if lens.ndim == 1 else lens, (shape[0], T))
        below = xp.arange(S, dtype=lens.dtype)[None, None, :] < lens[:, :, None]  # (B, T, S)
        keep = keep & below.reshape((shape[0],) + (1,) * (len(shape) - 3) + (T, S))
    if mask is not None:
        mask = xp.asarray(mask)
        keep = keep & mask.reshape((1,) * (len(shape) - mask.ndim) + mask.shape)
    return keep


def _repeat_heads(xp, queries, keys, values):
    """Keys and values repeated to the queries' heads (query head n uses n // G)."""
    if keys.ndim >= 4 and keys.shape[-3] != queries.shape[-3]:
        groups = queries.shape[-3] // keys.shape[-3]
        keys, values = (xp.repeat(a, groups, axis=-3) for a in (keys, values))
    return keys, values


def _attention64(xp, queries, keys, values, lens=None, mask=None, *, is_causal=False,
                 window=None, softcap=None, scale=None):
    """Plain attention with ``xp`` = numpy (the float64 reference) or jax.numpy (differentiable;
    masked entries handled with ``where`` so that fully masked rows have finite gradients)."""
    keys, values = _repeat_heads(xp, queries, keys, values)
    scale = 1 / np.sqrt(queries.shape[-1]) if scale is None else scale
    scores = xp.einsum("...tq,...sq->...ts", queries, keys) * scale
    if softcap is not None:
        scores = softcap * xp.tanh(scores / softcap)
    keep = _full_keep(xp, scores.shape, lens, mask, is_causal, window)
    scores = xp.where(keep, scores, xp.finfo(scores.dtype).min)
    shift = xp.max(scores, axis=-1, keepdims=True)
    if xp is jnp:
        shift = jax.lax.stop_gradient(shift)
    exps = xp.where(keep, xp.exp(scores - shift), 0.0)
    total = xp.sum(exps, axis=-1, keepdims=True)
    weights = exps / xp.where(total == 0, 1.0, total)
    return xp.einsum("...ts,...sv->...tv", weights, values)


# name: (N, N_kv, T, S, chunks, lens kind, mask kind, is_causal, window, softcap, scale).
# Chunks never divide T or S; every case is one compilation per dtype.
VARIANTS = {
    "gqa": (6, 2, 21, 19, (8, 5), None, None, False, None, None, None),
    "mqa_causal": (4, 1, 21, 19, (8, 5), None, None, True, None, None, None),
    "window_symmetric": (2, 2, 37, 29, (8, 7), None, None, False, 3, None, None),
    "window_causal_lens_B": (2, 2, 37, 29, (8, 7), "B", None, True, (5, 0), None, None),
    "window_right_only_S_gt_T": (2, 2, 13, 29, (4, 6), None, None, False, (0, 9), None, None),
    "softcap_scale": (2, 2, 21, 19, (8, 5), None, None, False, None, 1.5, 2.0),
    "scale": (2, 2, 21, 19, (8, 5), None, None, False, None, None, 0.3),
    "gqa_window_key_mask": (4, 2, 37, 29, (8, 7), "B", "keys", False, (4, 1), None, None),
    "everything": (6, 2, 37, 29, (8, 7), "BT", "full", True, (6, 3), 2.0, 0.5),
}


def _variant_inputs(case, dtype):
    N, N_kv, T, S, chunks, lens_kind, mask_kind, is_causal, window, softcap, scale = VARIANTS[case]
    rng = np.random.default_rng(11)
    queries = _normal((DIMS.B, N, T, DIMS.H), dtype, 1)
    keys = _normal((DIMS.B, N_kv, S, DIMS.H), dtype, 2)
    values = _normal((DIMS.B, N_kv, S, DIMS.V), dtype, 3)
    lens = None
    if lens_kind == "B":
        lens = _device([S - 4, 3], jnp.int32)
    elif lens_kind == "BT":
        lens = _device(rng.integers(0, S + 1, size=(DIMS.B, T)), jnp.int32)
    mask = None
    if mask_kind == "full":  # per query head, so the grouping of the mask is exercised
        mask = _device(rng.random((DIMS.B, N, T, S)) < 0.8)
    elif mask_kind == "keys":
        mask = _device(rng.random((DIMS.B, 1, 1, S)) < 0.7)
    cotangent = _normal((DIMS.B, N, T, DIMS.V), dtype, 4)
    kwargs = dict(is_causal=is_causal, local_window_size=window, logit_softcap=softcap,
                  scale=scale)
    return (queries, keys, values, lens, mask, cotangent), kwargs, chunks


@functools.partial(jax.jit, static_argnames=("kwargs", "chunks"))
def _variant_efficient_and_plain64(queries, keys, values, lens, mask, cotangent, *, kwargs,
                                   chunks):
    """Output and (q, k, v) gradients of the efficient attention and of :func:`_attention64`."""
    kwargs = dict(kwargs)
    efficient_attention = functools.partial(
        efficient.dot_product_attention, query_chunk_size=chunks[0], key_chunk_size=chunks[1],
        **kwargs)
    plain = functools.partial(_attention64, jnp, is_causal=kwargs["is_causal"],
                              window=kwargs["local_window_size"],
                              softcap=kwargs["logit_softcap"], scale=kwargs["scale"])
    return tuple(_output_and_grads(f, queries, keys, values, lens, mask, cotangent)
                 for f in (efficient_attention, lambda q, k, v, lens, mask: plain(q, k, v, lens,
                                                                                  mask)))


@functools.partial(jax.jit, static_argnames=("kwargs", "chunks"))
def _variant_efficient_and_library_plain(queries, keys, values, lens, mask, cotangent, *, kwargs,
                                         chunks):
    """Output and (q, k, v) gradients of the efficient attention and of the library's plain path
    given the same arguments: one compilation per case."""
    kwargs = dict(kwargs)
    efficient_attention = functools.partial(
        efficient.dot_product_attention, query_chunk_size=chunks[0], key_chunk_size=chunks[1])
    plain = functools.partial(_plain, implementation="plain")
    return tuple(_output_and_grads(f, queries, keys, values, lens, mask, cotangent, **kwargs)
                 for f in (efficient_attention, plain))


def _numpy_reference(args, kwargs):
    queries, keys, values = (np.asarray(a, np.float64) for a in args[:3])
    lens, mask = (None if a is None else np.asarray(a) for a in args[3:5])
    return _attention64(np, queries, keys, values, lens, mask, is_causal=kwargs["is_causal"],
                        window=kwargs["local_window_size"], softcap=kwargs["logit_softcap"],
                        scale=kwargs["scale"])


def _hashable(kwargs):
    return tuple(sorted(kwargs.items()))


@pytest.mark.parametrize("case", sorted(VARIANTS))
def test_variants_float64_equal_reference_and_autodiff(case, x64):
    args, kwargs, chunks = _variant_inputs(case, jnp.float64)
    (output, grads), (plain_output, plain_grads) = _variant_efficient_and_plain64(
        *args, kwargs=_hashable(kwargs), chunks=chunks)
    chex.assert_type([output, *grads], jnp.float64)
    chex.assert_shape(output, args[0].shape[:-1] + (DIMS.V,))
    chex.assert_equal_shape([grads[1], args[1]])  # dK/dV keep the N_kv heads
    reference = _numpy_reference(args, kwargs)
    assert _max_abs(output, reference) < 1e-12
    assert _max_abs(output, plain_output) < 1e-12
    for grad, plain_grad in zip(grads, plain_grads):
        assert np.isfinite(np.asarray(grad)).all()
        assert _max_abs(grad, plain_grad) < 1e-12
    assert _max_abs(grads[0], 0) > 0.1  # the gradients are not trivially zero


@pytest.mark.parametrize("case", sorted(VARIANTS))
def test_variants_float32_equal_reference_and_plain_attention(case):
    args, kwargs, chunks = _variant_inputs(case, jnp.float32)
    (output, grads), (plain_output, plain_grads) = _variant_efficient_and_library_plain(
        *args, kwargs=_hashable(kwargs), chunks=chunks)
    chex.assert_type([output, *grads], jnp.float32)
    np.testing.assert_allclose(output, _numpy_reference(args, kwargs), rtol=1e-5, atol=2e-6)
    # The library's plain path, given the same arguments, agrees to float32 rounding.
    np.testing.assert_allclose(output, plain_output, rtol=1e-5, atol=2e-6)
    for grad, plain_grad in zip(grads, plain_grads):
        np.testing.assert_allclose(grad, plain_grad, rtol=1e-5, atol=1e-5)


def test_everything_equals_numpy_reference_module(x64):
    """The package's own float64 reference (reference_numpy) with the same arguments."""
    args, kwargs, chunks = _variant_inputs("everything", jnp.float64)
    output = efficient.dot_product_attention(*args[:3], args[3], mask=args[4], **kwargs,
                                             query_chunk_size=chunks[0], key_chunk_size=chunks[1])
    reference = np_scoring.dot_product_attention(
        *(np.asarray(a, np.float64) for a in args[:3]), np.asarray(args[3]),
        mask=np.asarray(args[4]), **kwargs)[0]
    assert _max_abs(output, reference) < 1e-12


def test_default_scale_is_one_over_sqrt_d_and_softcap_bounds_the_scores(x64):
    queries, keys, values = (np.random.default_rng(s).normal(size=(1, 2, 9, 4)) for s in (1, 2, 3))
    # Jitted: a program per call rather than one per primitive.
    chunked = jax.jit(functools.partial(efficient.dot_product_attention, query_chunk_size=4,
                                        key_chunk_size=4), static_argnames=("scale", "logit_softcap"))
    chex.assert_trees_all_close(chunked(queries, keys, values),
                                chunked(queries, keys, values, scale=0.5), rtol=0, atol=1e-15)
    # A tiny cap flattens every score to about 0: the output is nearly the mean of the values.
    flat = chunked(10 * queries, keys, values, logit_softcap=1e-6)
    np.testing.assert_allclose(flat, np.broadcast_to(values.mean(-2, keepdims=True), flat.shape),
                               atol=1e-5)


def test_window_rows_left_empty_by_lengths_are_zero_with_finite_gradients_and_no_nan_leak():
    """Window (1, 0) and lengths: query t sees keys t - 1 and t, so queries t >= len + 1 see
    nothing. NaN/Inf in the padded keys/values and in those queries change nothing valid."""
    T = S = 13
    queries = _normal((DIMS.B, 4, T, DIMS.H), jnp.float32, 1)
    keys = _normal((DIMS.B, 2, S, DIMS.H), jnp.float32, 2)  # grouped, G = 2
    values = _normal((DIMS.B, 2, S, DIMS.V), jnp.float32, 3)
    lens = _device([5, 9], jnp.int32)
    empty = np.arange(T)[None, :] >= np.asarray(lens)[:, None] + 1  # (B, T)
    cotangent = _normal((DIMS.B, 4, T, DIMS.V), jnp.float32, 4)
    attention = functools.partial(efficient.dot_product_attention, local_window_size=(1, 0),
                                  query_chunk_size=4, key_chunk_size=3)
    run = jax.jit(lambda q, k, v: _output_and_grads(attention, q, k, v, lens, None, cotangent))
    output, grads = run(queries, keys, values)
    padded = np.arange(S)[None, :] >= np.asarray(lens)[:, None]  # (B, S)
    dirty_keys = _device(np.where(padded[:, None, :, None], np.nan, keys))
    dirty_values = _device(np.where(padded[:, None, :, None], np.inf, values))
    dirty_queries = _device(np.where(empty[:, None, :, None], np.nan, queries))
    dirty_output, dirty_grads = run(dirty_queries, dirty_keys, dirty_values)
    assert empty.any()
    empty_rows = np.broadcast_to(empty[:, None, :], output.shape[:-1])
    for out, gr in ((output, grads), (dirty_output, dirty_grads)):
        assert np.isfinite(np.asarray(out)).all()
        assert all(np.isfinite(np.asarray(g)).all() for g in gr)
        assert (np.asarray(out)[empty_rows] == 0).all()
        assert (np.asarray(gr[0])[empty_rows] == 0).all()
    chex.assert_trees_all_equal(dirty_output, output)
    chex.assert_trees_all_equal(dirty_grads, grads)
    np.testing.assert_allclose(output, _numpy_reference(
        (queries, keys, values, lens, None),
        dict(is_causal=False, local_window_size=(1, 0), logit_softcap=None, scale=None)),
        rtol=1e-5, atol=2e-6)


def test_vmap_and_jit_grouped_windowed():
    """vmap over an extra leading axis, with per-example lengths (per-example loop bounds)."""
    E, T, S = 3, 10, 9
    queries = _normal((E, DIMS.B, 4, T, DIMS.H), jnp.float32, 1)
    keys = _normal((E, DIMS.B, 1, S, DIMS.H), jnp.float32, 2)
    values = _normal((E, DIMS.B, 1, S, DIMS.V), jnp.float32, 3)
    lens = _device(np.random.default_rng(0).integers(0, S + 1, size=(E, DIMS.B)), jnp.int32)
    cotangent = _normal((E, DIMS.B, 4, T, DIMS.V), jnp.float32, 4)
    kwargs = dict(is_causal=True, local_window_size=(3, 0), logit_softcap=3.0)
    attention = functools.partial(efficient.dot_product_attention, query_chunk_size=4,
                                  key_chunk_size=3, **kwargs)

    def per_example(q, k, v, lens, ct):
        return _output_and_grads(attention, q, k, v, lens, None, ct)

    output, grads = jax.jit(jax.vmap(per_example))(queries, keys, values, lens, cotangent)
    chex.assert_shape(output, (E, DIMS.B, 4, T, DIMS.V))
    output, grads = np.asarray(output), [np.asarray(g) for g in grads]
    inputs = [np.asarray(a) for a in (queries, keys, values, lens, cotangent)]
    for e in range(E):
        expected, expected_grads = jax.jit(per_example)(*(a[e] for a in inputs))
        np.testing.assert_allclose(output[e], expected, rtol=1e-6, atol=1e-6)
        for grad, expected_grad in zip(grads, expected_grads):
            np.testing.assert_allclose(grad[e], expected_grad, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(expected, _attention64(
            np, *(np.asarray(a[e], np.float64) for a in inputs[:3]),
            inputs[3][e], is_causal=True, window=(3, 0), softcap=3.0), rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("lens_shape", [None, (), (7,)])
def test_unbatched_inputs_equal_a_batch_of_one(lens_shape):
    T, S = 7, 6
    queries, keys, values = (_normal(shape, jnp.float32, s)
                             for s, shape in ((1, (T, DIMS.H)), (2, (S, DIMS.H)), (3, (S, DIMS.V))))
    lens = None if lens_shape is None else _device(
        np.random.default_rng(0).integers(1, S + 1, size=lens_shape), jnp.int32)
    kwargs = dict(is_causal=True, local_window_size=2, query_chunk_size=3, key_chunk_size=4)
    # Jitted to compile each program once rather than primitive by primitive.
    attention = jax.jit(functools.partial(efficient.dot_product_attention, **kwargs))
    output = attention(queries, keys, values, lens)
    chex.assert_shape(output, (T, DIMS.V))
    batched = attention(*(np.asarray(a)[None] for a in (queries, keys, values)),
                        None if lens is None else np.asarray(lens)[None])
    chex.assert_trees_all_equal(output, np.asarray(batched)[0])
    grads = jax.jit(jax.grad(lambda q, k, v: jnp.sum(attention(q, k, v, lens) ** 2), (0, 1, 2)))(
        queries, keys, values)
    chex.assert_equal_shape([grads[0], queries])
    chex.assert_equal_shape([grads[2], values])
    reference_lens = None if lens is None else np.broadcast_to(np.asarray(lens), (T,))[None]
    arrays = (np.asarray(a, np.float64)[None] for a in (queries, keys, values))
    reference = _attention64(np, *arrays, reference_lens, is_causal=True, window=2)
    np.testing.assert_allclose(output, reference[0], rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_half_precision_variants_compute_in_float32(dtype):
    T, S = 11, 9
    queries = _normal((DIMS.B, 4, T, DIMS.H), dtype, 1)
    keys = _normal((DIMS.B, 2, S, DIMS.H), dtype, 2)
    values = _normal((DIMS.B, 2, S, DIMS.V), dtype, 3)
    lens = _device([9, 4], jnp.int32)
    kwargs = dict(is_causal=True, local_window_size=(4, 0), logit_softcap=2.0, scale=0.5)
    cotangent = _normal((DIMS.B, 4, T, DIMS.V), dtype, 4)
    attention = functools.partial(efficient.dot_product_attention, query_chunk_size=4,
                                  key_chunk_size=4, **kwargs)
    output, grads = jax.jit(functools.partial(_output_and_grads, attention))(
        queries, keys, values, lens, None, cotangent)
    chex.assert_type([output, *grads], dtype)
    assert all(np.isfinite(np.asarray(g, np.float32)).all() for g in grads)
    reference = _attention64(np, *(np.asarray(a, np.float64) for a in (queries, keys, values)),
                             np.asarray(lens), is_causal=True, window=(4, 0), softcap=2.0,
                             scale=0.5)
    atol = {jnp.bfloat16: 3e-2, jnp.float16: 4e-3}[dtype]
    np.testing.assert_allclose(np.asarray(output, np.float32), reference, atol=atol)


def test_grouped_heads_use_head_n_over_g():
    """Query head n attends key/value head n // G: each output head equals ungrouped attention
    against that key/value head alone."""
    queries = _normal((1, 6, 5, DIMS.H), jnp.float32, 1)
    keys, values = _normal((1, 3, 4, DIMS.H), jnp.float32, 2), _normal((1, 3, 4, 2), jnp.float32, 3)
    # Jitted: two programs (six heads, one head) rather than one per primitive.
    attention = jax.jit(efficient.dot_product_attention)
    output = np.asarray(attention(queries, keys, values))
    queries, keys, values = (np.asarray(a) for a in (queries, keys, values))
    for n in range(6):
        single = attention(queries[:, n:n + 1], keys[:, n // 2:n // 2 + 1],
                           values[:, n // 2:n // 2 + 1])
        np.testing.assert_allclose(output[:, n:n + 1], single, rtol=1e-6, atol=1e-7)


# --------------------------------------------------------------------------- variants: bad input


@pytest.mark.parametrize("queries_shape, keys_shape", [
    ((2, 6, 5, 8), (2, 4, 5, 8)),  # 6 % 4 != 0
    ((2, 3, 5, 8), (2, 6, 5, 8)),  # more K/V heads than query heads
    ((2, 6, 5, 8), (3, 2, 5, 8)),  # the batch differs, not only the heads
])
def test_grouped_heads_that_do_not_divide_raise_naming_both_shapes(queries_shape, keys_shape):
    queries, keys = np.ones(queries_shape, np.float32), np.ones(keys_shape, np.float32)
    values = np.ones(keys_shape[:-1] + (3,), np.float32)
    with pytest.raises(ValueError) as error:
        efficient.dot_product_attention(queries, keys, values)
    assert str(queries_shape) in str(error.value) and str(keys_shape) in str(error.value)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(local_window_size=-1), ValueError, "local_window_size"),
    (dict(local_window_size=(2, -1)), ValueError, "local_window_size"),
    (dict(local_window_size=(1, 2, 3)), TypeError, "local_window_size"),
    (dict(local_window_size=1.5), TypeError, "local_window_size"),
    (dict(local_window_size=True), TypeError, "local_window_size"),
    (dict(scale=float("nan")), ValueError, "scale"),
    (dict(scale="0.5"), TypeError, "scale"),
    (dict(scale=True), TypeError, "scale"),
    (dict(scale=np.ones(2)), TypeError, "scale"),
    (dict(logit_softcap=0.0), ValueError, "logit_softcap"),
    (dict(logit_softcap=-2.0), ValueError, "logit_softcap"),
    (dict(logit_softcap=float("inf")), ValueError, "logit_softcap"),
    (dict(logit_softcap="1"), TypeError, "logit_softcap"),
])
def test_bad_variant_arguments(kwargs, error, match):
    queries = np.ones((1, 3, 4), np.float32)
    with pytest.raises(error, match=match):
        efficient.dot_product_attention(queries, queries, queries, **kwargs)


def test_traced_scale_is_refused():
    queries = jnp.ones((1, 3, 4))
    with pytest.raises(TypeError, match="scale"):
        jax.jit(lambda s: efficient.dot_product_attention(queries, queries, queries, scale=s))(
            0.5)


# --------------------------------------------------------------------------- skipping


def _blocks_with_pairs(cfg):
    """``(num_query_chunks, num_key_chunks)`` booleans: the blocks holding a (query, key) pair the
    window and causality keep, over padded positions (brute force, the loops' ground truth)."""
    keep = _window_keep(cfg.padded_queries, cfg.padded_keys, cfg.window, cfg.is_causal)
    return keep.reshape(cfg.num_query_chunks, cfg.query_chunk, cfg.num_key_chunks,
                        cfg.key_chunk).any(axis=(1, 3))


def _ranges_as_blocks(cfg):
    """The blocks the forward loops and the backward loops visit, from the range helpers."""
    forward = np.zeros((cfg.num_query_chunks, cfg.num_key_chunks), bool)
    for i in range(cfg.num_query_chunks):
        start, stop = (int(x) for x in efficient.key_chunk_range(cfg, i))
        forward[i, start:stop] = True
    backward = np.zeros_like(forward)
    for j in range(int(efficient.backward_key_chunk_stop(cfg))):
        start, stop = (int(x) for x in efficient.query_chunk_range(cfg, j))
        backward[start:stop, j] = True
    return forward, backward


@pytest.mark.parametrize("seed", range(40))
def test_chunk_ranges_are_exactly_the_blocks_the_masks_keep(seed):
    """Neither loop skips a block with a kept pair (exactness) nor visits one without (for the
    window and causality, the bounds are tight)."""
    rng = np.random.default_rng(seed)
    T, S = (int(x) for x in rng.integers(1, 60, size=2))
    window = None if seed % 5 == 0 else tuple(int(x) for x in rng.integers(0, 20, size=2))
    cfg = efficient.chunking(T, S, int(rng.integers(1, 12)), int(rng.integers(1, 12)),
                             is_causal=bool(seed % 2), window=window)
    expected = _blocks_with_pairs(cfg)
    forward, backward = _ranges_as_blocks(cfg)
    np.testing.assert_array_equal(forward, expected)
    np.testing.assert_array_equal(backward, expected)


def test_window_visits_a_band_of_key_chunks():
    """(1, 1, 16384) with 512-chunks: a window of 512 visits at most 3 of the 32 key chunks per
    query chunk (2 with (512, 0) and causality) — 90 of 1024 blocks, against 528 causal alone."""
    full = efficient.chunking(16384, 16384, 512, 512)
    window = efficient.chunking(16384, 16384, 512, 512, window=(512, 512))
    causal = efficient.chunking(16384, 16384, 512, 512, is_causal=True)
    causal_window = efficient.chunking(16384, 16384, 512, 512, is_causal=True, window=(512, 0))
    counts = {}
    for name, cfg in (("full", full), ("window", window), ("causal", causal),
                      ("causal_window", causal_window)):
        forward, backward = _ranges_as_blocks(cfg)
        np.testing.assert_array_equal(forward, backward)
        counts[name] = int(forward.sum())
    assert counts == {"full": 1024, "window": 32 * 3 - 2, "causal": 32 * 33 // 2,
                      "causal_window": 32 * 2 - 1}
    # Lengths lower the stop further: a query chunk whose longest length is 700 stops at 2.
    assert [int(x) for x in efficient.key_chunk_range(window, 5, longest=700)] == [4, 2]
    assert [int(x) for x in efficient.key_chunk_range(full, 5, longest=700)] == [0, 2]
    assert int(efficient.backward_key_chunk_stop(window, longest=1025)) == 3


def test_kernel_runs_exactly_the_blocks_of_the_range_helpers(monkeypatch):
    """Count the (query chunk, key chunk) blocks the compiled loops execute, forward and
    backward, through a host callback in the per-block mask builder."""
    executed = []

    def counting_chunk_keep(cfg, limits, mask, i, j, rank):
        jax.debug.callback(lambda i, j: executed.append((int(i), int(j))), i, j)
        return original(cfg, limits, mask, i, j, rank)

    original = efficient._chunk_keep
    monkeypatch.setattr(efficient, "_chunk_keep", counting_chunk_keep)
    T, S, C = 64, 72, 8
    queries = _normal((1, 2, T, DIMS.H), jnp.float32, 1)
    keys, values = (_normal((1, 1, S, DIMS.H), jnp.float32, s) for s in (2, 3))
    attention = functools.partial(efficient.dot_product_attention, is_causal=True,
                                  local_window_size=(10, 0), query_chunk_size=C, key_chunk_size=C)
    output, vjp = jax.vjp(attention, queries, keys, values)
    jax.block_until_ready(output)
    forward_blocks, executed[:] = sorted(executed), []
    jax.block_until_ready(vjp(jnp.ones_like(output)))
    backward_blocks = sorted(executed)
    cfg = efficient.chunking(T, S, C, C, is_causal=True, window=(10, 0), grouped=True)
    expected = sorted(zip(*np.nonzero(_blocks_with_pairs(cfg))))
    expected = [(int(i), int(j)) for i, j in expected]
    assert forward_blocks == expected
    assert backward_blocks == expected
    # Keys t - 10 ... t: query chunk i visits key chunks i - 2 ... i, 21 of the 8 x 9 = 72 blocks.
    assert len(expected) == 1 + 2 + 6 * 3
    np.testing.assert_allclose(output, _attention64(
        np, *(np.asarray(a, np.float64) for a in (queries, keys, values)), is_causal=True,
        window=(10, 0)), rtol=1e-5, atol=2e-6)


def test_grouped_windowed_passes_hold_no_quadratic_or_repeated_array():
    """GQA with a window: no T x S array and no keys/values repeated to the query heads."""
    N, T, S, d = 4, 256, 1024, 16
    queries = _normal((1, N, T, d), jnp.float32, 1)
    keys, values = (_normal((1, 1, S, d), jnp.float32, s) for s in (2, 3))

    def loss(q, k, v):
        return jnp.sum(efficient.dot_product_attention(
            q, k, v, is_causal=True, local_window_size=(64, 0), logit_softcap=5.0,
            query_chunk_size=64, key_chunk_size=64) ** 2)

    for jaxpr in (jax.make_jaxpr(loss)(queries, keys, values),
                  jax.make_jaxpr(jax.grad(loss, (0, 1, 2)))(queries, keys, values)):
        shapes = _all_shapes(jaxpr)
        # Grouped blocks: the N query heads of the one key/value head as N * 64 query rows.
        assert (1, 1, N * 64, 64) in shapes or (1, 1, 64, N * 64) in shapes
        assert not [s for s in shapes if int(np.prod(s, dtype=np.int64)) >= T * S // 4], shapes
        assert not [s for s in shapes if len(s) >= 2 and s[-2] == S
                    and int(np.prod(s, dtype=np.int64)) > S * d]
