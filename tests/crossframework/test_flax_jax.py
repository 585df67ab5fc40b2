"""Ours against the built-ins of Flax and JAX: ``nnx.MultiHeadAttention``, ``jax.nn.dot_product_attention``.

Our multi-head attention against ``flax.nnx.MultiHeadAttention`` (our ``(in, out)`` kernels copied
into its ``(in, N, H)`` and ``(N, H, out)`` ones by reshape), and our per-head attention against
``jax.nn.dot_product_attention`` (heads transposed to its ``(B, T, N, H)`` layout) with its
``mask``, ``is_causal``, ``bias``, ``query_seq_lengths`` and ``key_value_seq_lengths``
(jax 0.10: ``dot_product_attention(query, key, value, bias=None, mask=None, *, scale=None,
is_causal=False, query_seq_lengths=None, key_value_seq_lengths=None, local_window_size=None,
implementation=None, return_residual=False)``, lengths int32 ``(B,)``).

Both built-ins normalise their weights in float32 whatever the input dtype, so the comparisons are
in float32 (full matmul precision), to 1e-5. They give a query with no key to attend uniform
weights (a large negative logit everywhere, as the book's ``-1e6``); we give it zeros
(docs/masking.md).
The equality tests therefore keep a valid key in every row, and the difference is pinned
separately. ``jax.nn``'s ``query_seq_lengths`` zeroes the outputs of padded queries, which is
what our fully masked rows give, so padded queries agree.
"""

from __future__ import annotations

import functools
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jax_attention.nn import multihead as jax_mh
from jax_attention.nn.scoring import dot_product_attention
from reference_numpy import multihead as np_mh
from tests.parity._support import assert_matches

B, N, T, S = 2, 2, 3, 5
QUERY_SIZE, KEY_SIZE = 3, 5  # different, so that a swapped kernel cannot pass
D, OUT = 8, 5  # num_hiddens (H = 4) and the output size of W_o, different from D on purpose
H = D // N


def _normal(shape, seed):
    return np.random.default_rng(seed).normal(size=shape)


def _params(biases=True, seed=7):
    """Our multi-head parameters; keys and values share one size (Flax's ``in_kv_features``)."""
    rng = np.random.default_rng(seed)
    params = {
        "W_q": rng.normal(size=(QUERY_SIZE, D)) / np.sqrt(QUERY_SIZE),
        "W_k": rng.normal(size=(KEY_SIZE, D)) / np.sqrt(KEY_SIZE),
        "W_v": rng.normal(size=(KEY_SIZE, D)),
        "W_o": rng.normal(size=(D, OUT)),
    }
    if biases:
        params.update({name: rng.normal(size=(size,)) for name, size in
                       (("b_q", D), ("b_k", D), ("b_v", D), ("b_o", OUT))})
    return params


def _inputs():
    return _normal((B, T, QUERY_SIZE), 10), _normal((B, S, KEY_SIZE), 11), _normal((B, S, KEY_SIZE), 12)


def _to(dtype, *arrays):
    return [jnp.asarray(a, dtype) for a in arrays]


def _to_params(dtype, params):
    return {name: jnp.asarray(p, dtype) for name, p in params.items()}


@functools.cache
def _jitted(name):
    """``jax_attention.nn.multihead.<name>`` under jit, its shape-defining Python arguments static."""
    function = getattr(jax_mh, name)
    static = [arg for arg in ("num_heads", "is_causal") if arg in inspect.signature(function).parameters]
    return jax.jit(function, static_argnames=static)


def _flax_copy(params, num_heads, dtype, use_bias):
    """A ``flax.nnx.MultiHeadAttention`` holding our parameters.

    Flax keeps the heads as an axis of its kernels, ``(in, N, H)`` and ``(N, H, out)``; head ``n``
    is our columns ``n*H .. (n+1)*H - 1``, so a reshape (no transpose) converts. Flax takes one
    input size for keys and values (``in_kv_features``) and needs ``decode`` stated (its default
    ``None`` raises); with dropout 0 it needs no ``deterministic``.
    """
    query_size, num_hiddens = params["W_q"].shape
    head_size = num_hiddens // num_heads
    flax_mha = nnx.MultiHeadAttention(
        num_heads, query_size, num_hiddens, params["W_o"].shape[1], in_kv_features=params["W_k"].shape[0],
        use_bias=use_bias, decode=False, param_dtype=dtype, rngs=nnx.Rngs(0),
        kernel_init=nnx.initializers.zeros)  # overwritten below; zeros skip compiling a random init
    for layer, name in ((flax_mha.query, "q"), (flax_mha.key, "k"), (flax_mha.value, "v")):
        layer.kernel[...] = jnp.asarray(params[f"W_{name}"], dtype).reshape(-1, num_heads, head_size)
        if use_bias:
            layer.bias[...] = jnp.asarray(params[f"b_{name}"], dtype).reshape(num_heads, head_size)
    flax_mha.out.kernel[...] = jnp.asarray(params["W_o"], dtype).reshape(num_heads, head_size, -1)
    if use_bias:
        flax_mha.out.bias[...] = jnp.asarray(params["b_o"], dtype)
    return flax_mha


def _builtin_promotion():
    """Standard dtype promotion for the built-ins only (jax.nn.dot_product_attention promotes its
    logits with float32 explicitly, which strict promotion refuses for other dtypes)."""
    return jax.numpy_dtype_promotion("standard")


@pytest.fixture
def float32(backend, highest_precision):
    """The built-ins are compared in float32 only: jax.nn.dot_product_attention (which Flax calls)
    normalises its weights in float32 even for float64 inputs."""
    return jnp.float32


def _no_empty_rows(mask):
    """jax.nn and Flax give a fully masked row uniform weights; we give zeros (docs/masking.md).
    Rows with a valid key are where the two must agree, so key 0 stays visible in these comparisons."""
    mask = mask.copy()
    mask[..., 0] = True
    return mask


def _to_btnh(x):
    """``(B, N, T, H) <-> (B, T, N, H)``: our heads-first layout and jax.nn's."""
    return jnp.transpose(x, (0, 2, 1, 3))


# --------------------------------------------------------------------------- flax.nnx.MultiHeadAttention


@pytest.mark.parametrize("use_bias, mask_shape, is_causal", [
    (True, None, False), (False, None, False), (True, (B, 1, T, S), False), (True, (B, N, T, S), False),
    (True, None, True), (False, (1, N, T, S), True),
])
def test_matches_flax_multi_head_attention(backend, float32, use_bias, mask_shape, is_causal):
    dtype = float32
    params = _params(use_bias)
    queries, keys, values = _inputs()
    flax_mha = _flax_copy(params, N, dtype, use_bias)
    mask = None
    if mask_shape is not None:
        mask = _no_empty_rows(np.random.default_rng(4).random(mask_shape) < 0.6)
    jax_inputs = _to(dtype, queries, keys, values)
    jax_mask = None if mask is None else jnp.asarray(mask)
    with _builtin_promotion():
        expected = nnx.jit(lambda m, *a: m(*a, mask=jax_mask, is_causal=is_causal))(flax_mha, *jax_inputs)
    got, _ = _jitted("multi_head_attention")(_to_params(dtype, params), *jax_inputs, num_heads=N,
                                             mask=jax_mask, is_causal=is_causal)
    assert_matches(got, np.asarray(expected, np.float64), dtype, backend)
    # And both against the float64 reference.
    reference, _ = np_mh.multi_head_attention(params, queries, keys, values, num_heads=N, mask=mask,
                                              is_causal=is_causal)
    assert_matches(expected, reference, dtype, backend)


def test_flax_differs_only_on_fully_masked_rows(backend, float32):
    # The documented difference: a query that may attend nothing gets zero weights here, so its
    # output is b_o; Flax (the book's -1e6 trick, in effect) averages all values uniformly.
    params = _params()
    jax_inputs = _to(jnp.float32, *_inputs())
    mask = np.ones((B, 1, T, S), bool)
    mask[1, 0, 2] = False  # batch 1, query 2: nothing to attend
    with _builtin_promotion():
        flax_out = nnx.jit(lambda m, *a: m(*a, mask=jnp.asarray(mask)))(
            _flax_copy(params, N, jnp.float32, True), *jax_inputs)
    ours, weights = _jitted("multi_head_attention")(_to_params(jnp.float32, params), *jax_inputs,
                                                    num_heads=N, mask=jnp.asarray(mask))
    valid = np.ones((B, T), bool)
    valid[1, 2] = False
    np.testing.assert_allclose(np.asarray(ours)[valid], np.asarray(flax_out)[valid], rtol=1e-5, atol=1e-5)
    assert (np.asarray(weights)[1, :, 2] == 0).all()
    np.testing.assert_allclose(np.asarray(ours)[1, 2], params["b_o"], rtol=1e-6)
    assert np.abs(np.asarray(flax_out)[1, 2] - params["b_o"]).max() > 0.1


# --------------------------------------------------------------------------- jax.nn.dot_product_attention


@pytest.mark.parametrize("with_mask, is_causal, with_bias", [(True, False, False), (False, True, False),
                                                            (False, False, True), (True, True, True)])
def test_per_head_attention_matches_jax_nn(backend, float32, with_mask, is_causal, with_bias):
    dtype = float32
    # Our projected heads (B, N, T, H), transposed to jax.nn's (B, T, N, H), give the same per-head
    # outputs through jax.nn.dot_product_attention as through our scaled dot-product attention.
    params, (queries, keys, values) = _params(), _inputs()
    heads = _jitted("project_heads")(_to_params(dtype, params), *_to(dtype, queries, keys, values),
                                     num_heads=N)
    mask = None
    if with_mask:
        mask = jnp.asarray(_no_empty_rows(np.random.default_rng(5).random((B, 1, T, S)) < 0.6))
    bias = jnp.asarray(_normal((1, N, T, S), 16), dtype) if with_bias else None

    def ours(q, k, v):
        return dot_product_attention(q, k, v, mask=mask, is_causal=is_causal, bias=bias)[0]

    def theirs(q, k, v):
        out = jax.nn.dot_product_attention(_to_btnh(q), _to_btnh(k), _to_btnh(v), bias, mask,
                                           is_causal=is_causal)
        return _to_btnh(out)  # back to (B, N, T, H)

    got = jax.jit(ours)(*heads)
    with _builtin_promotion():
        expected = jax.jit(theirs)(*heads)
    assert_matches(got, np.asarray(expected, np.float64), dtype, backend)
    # The full layer: combining jax.nn's heads with W_o gives our multi-head output.
    output, _ = _jitted("multi_head_attention")(_to_params(dtype, params), *_to(dtype, queries, keys, values),
                                                num_heads=N, mask=mask, is_causal=is_causal, bias=bias)
    combined = jax.jit(jax_mh.combine_heads)(_to_params(dtype, params), expected)
    assert_matches(output, np.asarray(combined, np.float64), dtype, backend)


@functools.cache
def _seq_lengths_case(with_mask: bool, is_causal: bool):
    """``(ours, theirs)``, each ``(q, k, v, query_lens, key_lens, cotangent) -> (output, grads)``
    on heads ``(B, N, T, H)``, jitted once: ours with the key lengths as ``valid_lens`` and the
    query lengths as a ``(B, 1, T, 1)`` mask, jax.nn with its sequence-length arguments."""
    mask = None
    if with_mask:
        mask = jnp.asarray(_no_empty_rows(np.random.default_rng(6).random((B, 1, T, S)) < 0.6))

    def ours(q, k, v, query_lens, key_lens):
        keep = (jnp.arange(T, dtype=jnp.int32)[None, :] < query_lens[:, None])[:, None, :, None]
        keep = keep if mask is None else jnp.logical_and(keep, mask)
        return dot_product_attention(q, k, v, key_lens, mask=keep, is_causal=is_causal)[0]

    def theirs(q, k, v, query_lens, key_lens):
        out = jax.nn.dot_product_attention(_to_btnh(q), _to_btnh(k), _to_btnh(v), mask=mask,
                                           is_causal=is_causal, query_seq_lengths=query_lens,
                                           key_value_seq_lengths=key_lens)
        return _to_btnh(out)

    def with_vjp(attend):
        def run(q, k, v, query_lens, key_lens, cotangent):
            output, vjp = jax.vjp(lambda q, k, v: attend(q, k, v, query_lens, key_lens), q, k, v)
            return output, vjp(cotangent)

        return jax.jit(run)

    return with_vjp(ours), with_vjp(theirs)


@pytest.mark.parametrize("with_mask, is_causal", [(False, False), (True, True)])
def test_dot_product_attention_matches_jax_nn_sequence_lengths(backend, float32, with_mask, is_causal):
    dtype = float32
    q, k, v = (jnp.asarray(_normal(shape, seed), dtype) for shape, seed in
               (((B, N, T, H), 20), ((B, N, S, H), 21), ((B, N, S, H), 22)))
    cotangent = jnp.asarray(_normal((B, N, T, H), 23), dtype)
    # Batch 0: one padded query and two padded keys; batch 1: nothing padded. Every valid query
    # keeps key 0 (a key length of 0 is the documented difference, below).
    lens = np.asarray([2, T], np.int32), np.asarray([3, S], np.int32)  # queries, keys
    ours, theirs = _seq_lengths_case(with_mask, is_causal)
    got, got_grads = ours(q, k, v, *lens, cotangent)
    with _builtin_promotion():
        expected, expected_grads = theirs(q, k, v, *lens, cotangent)
    assert_matches(got, np.asarray(expected, np.float64), dtype, backend)
    for g, e in zip(got_grads, expected_grads):
        assert_matches(g, np.asarray(e, np.float64), dtype, backend)
    # Padded queries: zero in both (jax.nn multiplies them out; ours has nothing to attend).
    assert (np.asarray(got)[0, :, 2] == 0).all() and (np.asarray(expected)[0, :, 2] == 0).all()


def test_jax_nn_differs_on_queries_with_no_key(backend, float32):
    # key_value_seq_lengths = 0 with a valid query: jax.nn averages all values (uniform weights),
    # ours gives zero; the other batch is the same.
    q, k, v = (jnp.asarray(_normal(shape, seed), jnp.float32) for shape, seed in
               (((B, N, T, H), 24), ((B, N, S, H), 25), ((B, N, S, H), 26)))
    cotangent = jnp.zeros((B, N, T, H), jnp.float32)
    lens = np.asarray([T, T], np.int32), np.asarray([0, S], np.int32)  # queries, keys
    ours, theirs = _seq_lengths_case(False, False)
    got, _ = ours(q, k, v, *lens, cotangent)
    with _builtin_promotion():
        expected, _ = theirs(q, k, v, *lens, cotangent)
    got, expected = np.asarray(got), np.asarray(expected)
    np.testing.assert_allclose(got[1], expected[1], rtol=1e-5, atol=1e-6)
    assert (got[0] == 0).all()
    uniform = np.broadcast_to(np.asarray(v)[0].mean(axis=1, keepdims=True), (N, T, H))
    np.testing.assert_allclose(expected[0], uniform, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- variants vs jax.nn
# Grouped-query key/value heads, scale= and local_window_size= as jax.nn.dot_product_attention
# takes them (K/V heads dividing N; the window (left, right) around each query), with our
# valid lengths as its key_value_seq_lengths.

GQA_N = 4

JAX_NN_VARIANTS = {
    "GQA": {"kv_heads": 2},
    "MQA, causal": {"kv_heads": 1, "is_causal": True},
    "scale": {"kv_heads": GQA_N, "scale": 0.3},
    "window (1, 2)": {"kv_heads": 2, "local_window_size": (1, 2)},
    "window 1, causal, lengths": {"kv_heads": 1, "local_window_size": 1, "is_causal": True,
                                  "lengths": True},
    "everything but a cap": {"kv_heads": 2, "scale": 1.3, "local_window_size": (2, 0),
                             "is_causal": True, "lengths": True, "mask": True},
}


@pytest.mark.parametrize("variant", list(JAX_NN_VARIANTS), ids=list(JAX_NN_VARIANTS))
@pytest.mark.parametrize("implementation", ["plain", "chunked"])
def test_variants_match_jax_nn_dot_product_attention(backend, float32, variant, implementation):
    dtype = float32
    case = dict(JAX_NN_VARIANTS[variant])
    kv_heads, with_lengths, with_mask = (case.pop("kv_heads"), case.pop("lengths", False),
                                         case.pop("mask", False))
    q = jnp.asarray(_normal((B, GQA_N, T, H), 20), dtype)
    k = jnp.asarray(_normal((B, kv_heads, S, H), 21), dtype)
    v = jnp.asarray(_normal((B, kv_heads, S, H), 22), dtype)
    lengths = jnp.asarray([S, 2], jnp.int32) if with_lengths else None  # every row keeps key 0
    mask = (jnp.asarray(_no_empty_rows(np.random.default_rng(7).random((B, 1, T, S)) < 0.6))
            if with_mask else None)
    got, weights = jax.jit(lambda q, k, v: dot_product_attention(
        q, k, v, lengths, mask=mask, implementation=implementation, **case))(q, k, v)
    with _builtin_promotion():
        expected = jax.jit(lambda q, k, v: _to_btnh(jax.nn.dot_product_attention(
            _to_btnh(q), _to_btnh(k), _to_btnh(v), None, mask, key_value_seq_lengths=lengths,
            **case)))(q, k, v)
    assert got.shape == (B, GQA_N, T, H) and weights.shape == (B, GQA_N, T, S)
    assert_matches(got, np.asarray(expected, np.float64), dtype, backend)
