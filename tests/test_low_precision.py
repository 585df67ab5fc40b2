"""NaN-free attention in float32, bfloat16 and float16 (reliability).

Every attention function — the masked softmax, additive and scaled dot-product attention and their
weights functions, the chunked attention, multi-head attention, the Transformer's attention,
Nadaraya–Watson pooling, the NNX modules and the NumPy reference's twins — runs in each float dtype
with

* masks combined from three sources, ``valid_lens (B, T)``, a boolean ``mask`` and ``is_causal``,
  that leave two query rows with no key: one through its length 0, one only through the
  combination (the causal mask allows key 0 only, the boolean mask forbids key 0);
* logits of three magnitudes: ordinary (about 1), large (about 1e4) and beyond float16's largest
  finite value 65504 (about 1e5; 6e4 for the masked softmax, whose logits are its float16 input).

Checked: outputs and gradients (``jax.grad``) are finite; fully masked rows have exactly zero
weights and a zero output (docs/design.md, "Masks"); outputs and weights equal a float64
computation on the same (dtype-rounded) inputs to the dtype's tolerance, and so do the gradients.

The inputs are small integers plus one column ``±M``: with ``d = 4`` every dot-product score
``q.k / 2`` is then exact in float32 (``M = 448``: ±100352 plus a few units), so weights spread over
keys whose scores all lie near ±1e5 are computed exactly as in float64 when the scores are formed
in float32 — and are lost when they are rounded to float16 (spacing 64 there, +inf beyond 65504).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jax_attention.nn import attention_pooling as jax_pooling
from jax_attention.nn import efficient as jax_efficient
from jax_attention.nn import masking as jax_masking
from jax_attention.nn import multihead as jax_mh
from jax_attention.nn import scoring as jax_scoring
from jax_attention.models import transformer as jax_transformer
from reference_numpy import attention_pooling as np_pooling
from reference_numpy import masking as np_masking
from reference_numpy import multihead as np_mh
from reference_numpy import scoring as np_scoring
from reference_numpy import transformer as np_transformer

B, T, S, H, V, N = 2, 3, 4, 4, 3, 2  # batch, queries, keys, head size, value size, heads
D = N * H
DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16)
NUMPY_DTYPES = (np.float32, np.float16)  # the reference has no bfloat16 (not a NumPy float)
# Compared with float64 on the same rounded inputs; float16/bfloat16 results are rounded to their
# dtype at the end (relative spacing 2**-11 and 2**-8), float32 ones along the way.
TOL = {jnp.float32: 2e-5, jnp.bfloat16: 2e-2, jnp.float16: 3e-3,
       np.float32: 2e-5, np.float16: 3e-3}
# The column ±M of queries and keys: dot-product scores M**2 / 2 = 0.5, 10082 and 100352.
SCALES = {"ordinary": 1, "large": 142, "beyond_float16": 448}
# The largest additive score weights: |scores| up to 3 w = 0.75, 24576 and 147456.
ADDITIVE_WEIGHTS = {"ordinary": 0.25, "large": 8192, "beyond_float16": 49152}

LENS = np.array([[0, 2, 4], [4, 1, 3]], np.int32)  # (B, T)
MASK = np.ones((B, T, S), bool)
MASK[1, 0, 0] = MASK[0, 1, 1] = MASK[1, 2, 1] = False
CAUSAL = np.tril(np.ones((T, S), bool))


def _keep(lens=True, mask=True, causal=True):
    keep = np.ones((B, T, S), bool)
    if lens:
        keep &= np.arange(S) < LENS[..., None]
    if mask:
        keep &= MASK
    if causal:
        keep &= CAUSAL
    return keep


def test_the_masks_leave_rows_empty_only_in_combination():
    empty = ~_keep().any(-1)
    assert empty.tolist() == [[True, False, False], [True, False, False]]
    # Row (1, 0) is emptied by no single source: only the three together mask every key.
    for alone in (_keep(True, False, False), _keep(False, True, False), _keep(False, False, True)):
        assert alone[1, 0].any()


def _f64(x):
    """``x`` (a JAX or NumPy array, bfloat16 included) in float64, converted in NumPy: exact."""
    return np.asarray(x).astype(np.float64)


def _in(dtype, x):
    """``x`` in ``dtype`` as a NumPy array, rounded as ``jnp.asarray(x, dtype)`` rounds it with
    float64 disabled (to float32 first; NumPy holds bfloat16 through ml_dtypes): no conversion
    program compiles for it."""
    x = np.asarray(x)
    if np.dtype(dtype) != np.float64:
        x = x.astype(np.float32)
    return x.astype(dtype)


def _device(dtype, tree):
    """``tree``'s arrays in ``dtype`` on the device (``jax.device_put``: nothing compiles)."""
    return jax.tree.map(lambda x: jax.device_put(_in(dtype, x)), tree)


def _rounded(tree, dtype):
    """``tree``'s float64 arrays rounded to ``dtype`` and back: the inputs the dtype can hold."""
    return jax.tree.map(lambda x: _f64(_in(dtype, x)), tree)


def _integers(rng, shape, bound):
    return rng.integers(-bound, bound + 1, shape).astype(np.float64)


def _queries_keys(rng, M, heads=1):
    """Queries ``(B, T, heads * H)`` and keys ``(B, S, heads * H)``: small integers, column 0 of
    each head ``±M``, so that ``q.k / sqrt(H)`` is ``±M**2 / 2`` plus a few halves."""
    queries, keys = _integers(rng, (B, T, heads * H), 2), _integers(rng, (B, S, heads * H), 2)
    for head in range(heads):
        queries[..., head * H] = M * rng.choice([-1.0, 1.0], (B, T))
        keys[..., head * H] = M * rng.choice([-1.0, 1.0], (B, S))
    return queries, keys


def _case(kind, scale, seed=0):
    """``(arrays, params)`` in float64: the inputs of ``kind`` at the logit ``scale``."""
    rng = np.random.default_rng(seed)
    if kind == "masked_softmax":
        logits = {"ordinary": 0.5, "large": 1e4, "beyond_float16": 6e4}[scale]
        X = logits * rng.choice([-1.0, 1.0], (B, T, 1)) + _integers(rng, (B, T, S), 3) / 2
        return {"X": X}, {}
    if kind in ("dot", "efficient"):
        queries, keys = _queries_keys(rng, SCALES[scale])
        return {"queries": queries, "keys": keys, "values": _integers(rng, (B, S, V), 3)}, {}
    if kind == "additive":
        # Every feature is tanh(0) = 0 or tanh(±20 or ±40) = ±1 exactly, in float64 too, so the
        # scores big * (q_0 - k_0 + tanh(20 (q_0 - k_0))) + k_1 are exact: weights e**±1 apart
        # among the keys of one row that share k_0, at magnitude 3 big or 1.
        queries = rng.choice([-1.0, 1.0], (B, T, 2))
        keys = rng.choice([-1.0, 1.0], (B, S, 2))
        big = ADDITIVE_WEIGHTS[scale]
        params = {"W_q": np.array([[20.0, 0, 0, 20], [0, 0, 0, 0]]),
                  "W_k": np.array([[0.0, 20, 0, -20], [0, 0, 20, 0]]),
                  "w_v": np.array([[big], [-big], [1.0], [big]])}
        return {"queries": queries, "keys": keys, "values": _integers(rng, (B, S, V), 3)}, params
    if kind in ("multihead", "transformer"):
        queries, keys = _queries_keys(rng, SCALES[scale], heads=N)
        # Identity projections keep the constructed scores; W_v and W_o mix small integers.
        params = {"W_q": np.eye(D), "W_k": np.eye(D), "W_v": _integers(rng, (D, D), 1),
                  "W_o": _integers(rng, (D, D), 1)}
        if kind == "transformer":  # one array for keys and values, as in the Transformer
            # Values from the small columns only: values of size M would make the float16
            # backward lose its accuracy to dP = dO V^T (rounded to float16, then cancelling in
            # dP - rowsum(P dP)) rather than test the logits.
            params["W_v"][::H] = 0
            return {"queries": queries, "keys_values": keys}, params
        return {"queries": queries, "keys": keys, "values": _integers(rng, (B, S, D), 3)}, params
    raise ValueError(kind)


# Each kind: its masks (the Transformer's attention takes no boolean mask), the JAX function and
# the NumPy twin, both ``f(arrays, params) -> (output, weights or None)``.
def _jax_attention(kind, arrays, params):
    lens, mask = jnp.asarray(LENS), jnp.asarray(MASK)
    if kind == "masked_softmax":
        causal = jnp.asarray(CAUSAL)[None]
        weights = jax_masking.masked_softmax(arrays["X"], lens, mask=mask & causal)
        return weights, weights
    if kind == "dot":
        output, weights = jax_scoring.dot_product_attention(
            arrays["queries"], arrays["keys"], arrays["values"], lens, mask=mask, is_causal=True)
        again = jax_scoring.dot_product_attention_weights(
            arrays["queries"], arrays["keys"], lens, mask=mask, is_causal=True)
        return output, (weights, again)
    if kind == "efficient":
        return jax_efficient.dot_product_attention(
            arrays["queries"], arrays["keys"], arrays["values"], lens, mask=mask, is_causal=True,
            query_chunk_size=2, key_chunk_size=2), None
    if kind == "additive":
        output, weights = jax_scoring.additive_attention(
            params, arrays["queries"], arrays["keys"], arrays["values"], lens, mask=mask,
            is_causal=True)
        again = jax_scoring.additive_attention_weights(
            params, arrays["queries"], arrays["keys"], lens, mask=mask, is_causal=True)
        return output, (weights, again)
    if kind == "multihead":
        return jax_mh.multi_head_attention(
            params, arrays["queries"], arrays["keys"], arrays["values"], lens, num_heads=N,
            mask=mask[:, None], is_causal=True)
    if kind == "transformer":
        return jax_transformer.attention(params, arrays["queries"], arrays["keys_values"], lens,
                                         num_heads=N, is_causal=True)
    raise ValueError(kind)


def _numpy_attention(kind, arrays, params):
    if kind == "masked_softmax":
        weights = np_masking.masked_softmax(arrays["X"], LENS, mask=MASK & CAUSAL)
        return weights, weights
    if kind in ("dot", "efficient"):
        return np_scoring.dot_product_attention(arrays["queries"], arrays["keys"],
                                                arrays["values"], LENS, mask=MASK, is_causal=True)
    if kind == "additive":
        return np_scoring.additive_attention(params, arrays["queries"], arrays["keys"],
                                             arrays["values"], LENS, mask=MASK, is_causal=True)
    if kind == "multihead":
        return np_mh.multi_head_attention(params, arrays["queries"], arrays["keys"],
                                          arrays["values"], LENS, num_heads=N,
                                          mask=MASK[:, None], is_causal=True)
    if kind == "transformer":
        return np_transformer.attention(params, arrays["queries"], arrays["keys_values"], LENS,
                                        num_heads=N, is_causal=True)
    raise ValueError(kind)


def _score_magnitude(kind, scale):
    """The largest |score| of ``_case(kind, scale)``."""
    if kind == "masked_softmax":
        return {"ordinary": 0.5, "large": 1e4, "beyond_float16": 6e4}[scale] + 1.5
    if kind == "additive":
        return 3 * ADDITIVE_WEIGHTS[scale] + 1
    return SCALES[scale] ** 2 / 2 + 4


def _empty_rows(kind):
    """``(B, T)``: the query rows with no key to attend."""
    return ~_keep(mask=kind != "transformer").any(-1)


@functools.cache
def _run(kind):
    """Jitted ``(arrays, params, cotangent) -> (output, weights, gradients)``; the gradients are
    those of ``sum(output * cotangent)`` w.r.t. every input and parameter."""

    def run(arrays, params, cotangent):
        def loss(arrays, params):
            output, weights = _jax_attention(kind, arrays, params)
            return jnp.sum(output.astype(cotangent.dtype) * cotangent), (output, weights)

        grads, (output, weights) = jax.grad(loss, argnums=(0, 1), has_aux=True)(arrays, params)
        return output, weights, grads

    return jax.jit(run)


def _evaluate(kind, arrays, params, dtype, cotangent_scale=1.0):
    """Output, weights and gradients of ``kind`` on ``arrays`` and ``params`` cast to ``dtype``."""
    output_shape = {"masked_softmax": (B, T, S), "dot": (B, T, V), "efficient": (B, T, V),
                    "additive": (B, T, V)}.get(kind, (B, T, D))
    cotangent = np.random.default_rng(7).integers(-2, 3, output_shape) * cotangent_scale
    compute = jnp.float64 if dtype == jnp.float64 else jnp.float32
    return _run(kind)(_device(dtype, arrays), _device(dtype, params),
                      jax.device_put(np.asarray(cotangent, compute)))


def _assert_close(actual, expected, tol, what):
    actual, expected = _f64(actual), np.asarray(expected, np.float64)
    assert np.isfinite(actual).all(), f"{what}: not finite: {actual}"
    np.testing.assert_allclose(actual, expected, rtol=tol,
                               atol=tol * max(1.0, np.abs(expected).max()), err_msg=what)


KINDS = ("masked_softmax", "dot", "efficient", "additive", "multihead", "transformer")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.__name__)
@pytest.mark.parametrize("kind", KINDS)
def test_finite_zero_when_fully_masked_and_accurate(kind, dtype):
    tol = TOL[dtype]
    empty = _empty_rows(kind)
    for scale in SCALES:
        arrays, params = _rounded(_case(kind, scale), dtype)
        with jax.enable_x64(True):
            _, _, expected_grads = _evaluate(kind, arrays, params, jnp.float64)
            expected_grads = jax.tree.map(_f64, expected_grads)
        # The loss's cotangent is scaled by a power of two (exactly) so that the largest float64
        # gradient is at most 2**12: a gradient that float16 cannot hold cannot come out finite.
        largest = max(1.0, max(np.abs(g).max() for g in jax.tree.leaves(expected_grads)))
        shrink = 2.0 ** -max(0, math.ceil(math.log2(largest / 2**12)))
        expected_grads = jax.tree.map(lambda g: g * shrink, expected_grads)
        output, weights, grads = _evaluate(kind, arrays, params, dtype, shrink)
        what = f"{kind} {dtype.__name__} {scale}"
        assert output.dtype == dtype, what
        assert all(np.isfinite(_f64(g)).all() for g in jax.tree.leaves(grads)), f"{what}: grads"
        expected_output, expected_weights = _numpy_attention(kind, arrays, params)
        _assert_close(output, expected_output, tol, f"{what}: output")
        assert (_f64(output)[empty] == 0).all(), f"{what}: fully masked rows' output"
        if weights is not None:
            for w in weights if isinstance(weights, tuple) else (weights,):
                assert w.dtype == dtype
                _assert_close(w, expected_weights, tol, f"{what}: weights")
                # (B, T, S) or, with heads, (B, N, T, S): the rows of `empty` in every head.
                w = _f64(w) if w.ndim == 3 else np.moveaxis(_f64(w), 1, 0)
                assert (w[..., empty, :] == 0).all(), f"{what}: fully masked rows' weights"
        # Gradients: those of the float64 computation on the same inputs. Unlike the forward
        # pass they are not exact in float32: they sum products of inputs as large as M (with
        # cancellation), and the chunked attention's backward rebuilds the weights from one
        # float32 log-sum-exp per query, whose rounding is eps * |score|. Hence a tolerance of
        # the dtype's plus float32's eps times the largest score, relative to the largest
        # gradient: a NaN, a lost row or a wrong shift is still an error of order one.
        grad_tol = tol + 2.0**-24 * _score_magnitude(kind, scale)
        largest = max(1.0, max(np.abs(g).max() for g in jax.tree.leaves(expected_grads)))
        for (path, grad), expected in zip(jax.tree_util.tree_leaves_with_path(grads),
                                          jax.tree.leaves(expected_grads), strict=True):
            np.testing.assert_allclose(_f64(grad), expected, rtol=grad_tol,
                                       atol=grad_tol * largest,
                                       err_msg=f"{what}: gradient {jax.tree_util.keystr(path)}")


@pytest.mark.parametrize("dtype", NUMPY_DTYPES, ids=lambda d: d.__name__)
@pytest.mark.parametrize("kind", [k for k in KINDS if k != "efficient"])
def test_numpy_reference_in_low_precision(kind, dtype):
    """The NumPy twins: finite, zero when fully masked, float64's result to the dtype's tolerance,
    and the same as the JAX function in that dtype."""
    tol = TOL[dtype]
    empty = _empty_rows(kind)
    for scale in SCALES:
        arrays, params = _rounded(_case(kind, scale), dtype)
        cast = functools.partial(jax.tree.map, lambda x: np.asarray(x, dtype))
        what = f"NumPy {kind} {np.dtype(dtype).name} {scale}"
        with np.errstate(over="raise", invalid="raise"):
            output, weights = _numpy_attention(kind, cast(arrays), cast(params))
        assert output.dtype == dtype and weights.dtype == dtype, what
        expected_output, expected_weights = _numpy_attention(kind, arrays, params)
        _assert_close(output, expected_output, tol, f"{what}: output")
        _assert_close(weights, expected_weights, tol, f"{what}: weights")
        assert (output[empty] == 0).all(), what
        jax_output, _, _ = _evaluate(kind, arrays, params, jnp.dtype(dtype).type)
        _assert_close(output, _f64(jax_output), 2 * tol, f"{what}: NumPy vs JAX")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.__name__)
def test_per_sequence_lengths_alone(dtype):
    """The plainest masking, ``valid_lens (B,)`` with a zero, at scores beyond float16's range."""
    arrays, _ = _rounded(_case("dot", "beyond_float16"), dtype)
    lens = jax.device_put(np.array([0, 3], np.int32))
    queries, keys, values = _device(dtype, [arrays[name] for name in ("queries", "keys",
                                                                       "values")])

    def loss(queries, keys, values):
        chunked = jax_efficient.dot_product_attention(queries, keys, values, lens,
                                                      query_chunk_size=2, key_chunk_size=2)
        output, weights = jax_scoring.dot_product_attention(queries, keys, values, lens)
        total = jnp.sum(output.astype(jnp.float32)) + jnp.sum(chunked.astype(jnp.float32))
        return total, (output, weights, chunked)

    grads, (output, weights, chunked) = jax.jit(jax.grad(loss, argnums=(0, 1, 2), has_aux=True))(
        queries, keys, values)
    assert all(np.isfinite(_f64(g)).all() for g in grads)
    expected_output, expected_weights = np_scoring.dot_product_attention(
        arrays["queries"], arrays["keys"], arrays["values"], np.asarray(lens))
    _assert_close(output, expected_output, TOL[dtype], "output")
    _assert_close(chunked, expected_output, TOL[dtype], "chunked output")
    _assert_close(weights, expected_weights, TOL[dtype], "weights")
    assert (_f64(output)[0] == 0).all() and (_f64(weights)[0] == 0).all()
    assert (_f64(chunked)[0] == 0).all()
    assert (_f64(grads[0])[0] == 0).all()  # the queries of an empty sequence get no gradient


@functools.partial(jax.jit, static_argnames="dtype")
def _nnx_modules_run(queries, keys, values, lens, mask, dtype):
    """``{name: (output, parameter gradients)}`` of the two modules in ``dtype``, eval mode: built
    and differentiated in one program (eagerly, their initialisation compiles a program per
    operation and dtype)."""
    rngs = nnx.Rngs(params=0, dropout=1)
    modules = {
        "additive": jax_scoring.AdditiveAttention(D, D, 4, 0.5, param_dtype=dtype, rngs=rngs),
        "multihead": jax_mh.MultiHeadAttention(D, N, 0.5, param_dtype=dtype, rngs=rngs),
    }
    results = {}
    for name, module in modules.items():
        module.eval()
        mask_argument = mask[:, None] if name == "multihead" else mask

        def loss(module, mask_argument=mask_argument):
            output = module(queries, keys, values, lens, mask=mask_argument, is_causal=True)
            return jnp.sum(output.astype(jnp.float32)), output

        grads, output = nnx.grad(loss, has_aux=True)(module)
        results[name] = output, nnx.state(grads)
    return results


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.__name__)
def test_nnx_modules(dtype):
    """The modules in ``dtype`` (parameters too), eval mode: finite outputs and parameter
    gradients, zero outputs for fully masked rows. (MultiHeadAttention runs the
    DotProductAttention module on its heads.)"""
    arrays, _ = _rounded(_case("multihead", "beyond_float16"), dtype)
    queries, keys, values = _device(dtype, [arrays[name] for name in ("queries", "keys",
                                                                       "values")])
    lens, mask = jax.device_put(LENS), jax.device_put(MASK)
    empty = _empty_rows("multihead")
    results = _nnx_modules_run(queries, keys, values, lens, mask, dtype)
    assert set(results) == {"additive", "multihead"}
    for name, (output, grads) in results.items():
        assert output.dtype == dtype, name
        assert np.isfinite(_f64(output)).all() and (_f64(output)[empty] == 0).all(), name
        assert all(np.isfinite(_f64(g)).all() for g in jax.tree.leaves(grads)), name


# Eager, op by op, as before: in one compiled program XLA may keep float16 intermediates in
# float32, and the overflowing squared distances this test is about would never overflow. The
# three distances share their shapes, so the eager programs compile once per dtype.
def _nadaraya_watson_and_grad(w, inputs):
    def loss(w, inputs):
        prediction, weights = jax_pooling.nadaraya_watson(*inputs, w)
        return jnp.sum(prediction.astype(jnp.float32)), (prediction, weights)

    return jax.grad(loss, has_aux=True)(w, inputs)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.__name__)
def test_nadaraya_watson_with_distant_keys(dtype):
    """Gaussian-kernel logits ``-(q - k)**2 / 2`` down to -45000 (finite in float16, but the
    squared distances are not): each row still sums to 1 and matches float64."""
    queries = np.linspace(0.0, 1.0, 5)
    for distance in (1.0, 30.0, 300.0):
        keys = distance + np.linspace(0.0, 2.0, 6)
        values = np.sin(keys)
        inputs = _rounded((queries, keys, values), dtype)
        grad, (prediction, weights) = _nadaraya_watson_and_grad(
            jax.device_put(_in(dtype, 1.0)), _device(dtype, list(inputs)))
        expected_prediction, expected_weights = np_pooling.nadaraya_watson(*inputs)
        what = f"nadaraya_watson {dtype.__name__} distance {distance}"
        assert prediction.dtype == weights.dtype == dtype, what
        assert np.isfinite(_f64(grad)), what
        _assert_close(weights, expected_weights, TOL[dtype], what)
        _assert_close(prediction, expected_prediction, TOL[dtype], what)
        if np.dtype(dtype) in (np.float32, np.float16):  # the reference, every input in dtype
            with np.errstate(over="raise", invalid="raise"):
                _, np_weights = np_pooling.nadaraya_watson(
                    *(np.asarray(x, dtype) for x in inputs), np.asarray(1.0, dtype))
            assert np_weights.dtype == dtype, what
            _assert_close(np_weights, expected_weights, TOL[dtype], f"NumPy {what}")


@pytest.mark.parametrize("subscripts, a_shape, b_shape", [
    ("...i,io->...o", (3, 5, 8), (8, 6)),          # a dense layer
    ("bnqd,bnkd->bnqk", (2, 3, 4, 8), (2, 3, 5, 8)),  # attention scores
])
def test_half_product_accumulates_in_float32_forward_and_backward(subscripts, a_shape, b_shape):
    """``precision.product``: bfloat16 operands multiplied as they are, accumulated in float32,
    rounded back; its gradients the same kind of product (not JAX's float32 cotangent times a
    converted operand). float32 operands: ``jnp.einsum`` itself."""
    from jax_attention.nn.precision import product

    rng = np.random.default_rng(0)
    a32 = jnp.asarray(rng.normal(size=a_shape), jnp.float32)
    b32 = jnp.asarray(rng.normal(size=b_shape), jnp.float32)
    a, b = a32.astype(jnp.bfloat16), b32.astype(jnp.bfloat16)

    def rounded(subscripts, a, b):  # the exact product of the rounded operands, rounded once
        return jnp.einsum(subscripts, a.astype(jnp.float64 if jax.config.jax_enable_x64
                                               else jnp.float32),
                          b.astype(jnp.float32)).astype(a.dtype)

    out = jax.jit(product, static_argnums=0)(subscripts, a, b)
    assert out.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(out, np.float32),
                                  np.asarray(rounded(subscripts, a, b), np.float32))

    def loss(f, a, b):
        return jnp.sum(f(subscripts, a, b).astype(jnp.float32) * weights)

    weights = jnp.asarray(rng.normal(size=out.shape), jnp.float32)
    grads = jax.jit(jax.grad(functools.partial(loss, product), argnums=(0, 1)))(a, b)
    expected = jax.grad(functools.partial(loss, rounded), argnums=(0, 1))(a, b)
    for got, want in zip(grads, expected, strict=True):
        assert got.dtype == jnp.bfloat16
        np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32),
                                   rtol=2 ** -7, atol=2 ** -7 * float(jnp.abs(want).max()))
    # The compiled backward multiplies bfloat16 operands: no dot of float32 operands is left.
    text = jax.jit(jax.grad(functools.partial(loss, product), argnums=(0, 1))).lower(
        a, b).as_text()
    dots = [line for line in text.splitlines() if "dot_general" in line]
    # Two: the backward's (the loss is linear in the output, so its forward product is unused).
    assert len(dots) == 2 and all("bf16" in line.split("dot_general")[1] for line in dots)
    assert all("-> tensor<" in line and "xf32>" in line.split("->")[-1] for line in dots)
    # float32: jnp.einsum, the same program.
    np.testing.assert_array_equal(np.asarray(product(subscripts, a32, b32)),
                                  np.asarray(jnp.einsum(subscripts, a32, b32)))
