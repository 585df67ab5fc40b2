"""NumPy reference vs JAX for multi-head attention (d2l §11.5), and JAX vs Flax/JAX built-ins.

Same inputs and parameters on both sides; every backend JAX sees; float64 (x64) to 1e-12 and
float32 (full matmul precision) to 1e-5 relative. The NNX module is tied to the function by running
both on the module's own parameters. Then our multi-head attention against
``flax.nnx.MultiHeadAttention`` (our ``(in, out)`` kernels copied into its ``(in, N, H)`` and
``(N, H, out)`` ones by reshape) and our per-head attention against ``jax.nn.dot_product_attention``
(heads transposed to its ``(B, T, N, H)`` layout), with masks, ``is_causal`` and a score bias.

JAX runs under ``jax.jit`` here (one compilation per test instead of one per eager operation);
tests/test_multihead.py runs the functions with and without jit.
"""

from __future__ import annotations

import functools
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jax_attention import multihead as jax_mh
from jax_attention import positional as jax_pos
from reference_numpy import multihead as np_mh
from tests.parity._support import assert_matches as _assert_matches

B, N, T, S = 2, 2, 3, 5
QUERY_SIZE, KEY_SIZE, VALUE_SIZE = 3, 5, 6  # all different, so a swapped kernel cannot pass
D, OUT = 8, 5  # num_hiddens (H = 4) and the output size of W_o, different from D on purpose
H = D // N


def _normal(shape, seed):
    return np.random.default_rng(seed).normal(size=shape)


def _params(biases=True, query_size=QUERY_SIZE, key_size=KEY_SIZE, value_size=VALUE_SIZE, out=OUT,
            seed=7):
    rng = np.random.default_rng(seed)
    params = {
        "W_q": rng.normal(size=(query_size, D)) / np.sqrt(query_size),
        "W_k": rng.normal(size=(key_size, D)) / np.sqrt(key_size),
        "W_v": rng.normal(size=(value_size, D)),
        "W_o": rng.normal(size=(D, out)),
    }
    if biases:
        params.update({name: rng.normal(size=(size,)) for name, size in
                       (("b_q", D), ("b_k", D), ("b_v", D), ("b_o", out))})
    return params


def _inputs(query_size=QUERY_SIZE, key_size=KEY_SIZE, value_size=VALUE_SIZE, num_queries=T,
            num_keys=S):
    return (_normal((B, num_queries, query_size), 10), _normal((B, num_keys, key_size), 11),
            _normal((B, num_keys, value_size), 12))


def _to(dtype, *arrays):
    return [jnp.asarray(a, dtype) for a in arrays]


def _to_params(dtype, params):
    return {name: jnp.asarray(p, dtype) for name, p in params.items()}


def _lens(shape, seed=1):
    """Random lengths in [0, S] with 0 and S always present: empty and full rows are covered."""
    lens = np.random.default_rng(seed).integers(0, S + 1, size=shape)
    lens.flat[0], lens.flat[-1] = 0, S
    return lens.astype(np.int32)


@functools.cache
def _jitted(name):
    """``jax_mh.<name>`` under jit, its shape-defining Python arguments static."""
    function = getattr(jax_mh, name)
    static = [arg for arg in ("num_heads", "is_causal") if arg in inspect.signature(function).parameters]
    return jax.jit(function, static_argnames=static)


# (valid_lens, mask, is_causal, bias): shapes relative to the scores (B, N, T, S); None = not given.
CASES = [
    (None, None, False, None),
    ("B", None, False, None),
    ("BT", "TS", False, None),
    (None, "B1TS", True, None),
    (None, "BNTS", False, "TS"),  # a different mask for every head
    (None, None, False, "1NTS"),
    ("BT", "BNTS", True, "BNTS"),
]
CASE_IDS = ["-".join(f"{k}={v}" for k, v in zip(("lens", "mask", "causal", "bias"), case)) for case in CASES]
SHAPES = {"TS": (T, S), "B1TS": (B, 1, T, S), "BNTS": (B, N, T, S), "1NTS": (1, N, T, S)}


def _case(lens_kind, mask_kind, bias_kind):
    lens = {None: None, "B": _lens((B,)), "BT": _lens((B, T))}[lens_kind]
    mask = None if mask_kind is None else np.random.default_rng(2).random(SHAPES[mask_kind]) < 0.7
    bias = None if bias_kind is None else _normal(SHAPES[bias_kind], 3)
    return lens, mask, bias


# --------------------------------------------------------------------------- functions


@pytest.mark.parametrize("lens_kind, mask_kind, is_causal, bias_kind", CASES, ids=CASE_IDS)
def test_multi_head_attention(backend, dtype, lens_kind, mask_kind, is_causal, bias_kind):
    params, (queries, keys, values) = _params(), _inputs()
    lens, mask, bias = _case(lens_kind, mask_kind, bias_kind)
    expected = np_mh.multi_head_attention(params, queries, keys, values, lens, num_heads=N, mask=mask,
                                          is_causal=is_causal, bias=bias)
    got = _jitted("multi_head_attention")(
        _to_params(dtype, params), *_to(dtype, queries, keys, values),
        None if lens is None else jnp.asarray(lens), num_heads=N,
        mask=None if mask is None else jnp.asarray(mask), is_causal=is_causal,
        bias=None if bias is None else jnp.asarray(bias, dtype),
    )
    for g, e in zip(got, expected):
        _assert_matches(g, e, dtype, backend)
    assert got[0].shape == (B, T, OUT) and got[1].shape == (B, N, T, S)


@pytest.mark.parametrize("num_heads", [4])
def test_without_biases_and_other_head_counts(backend, dtype, num_heads):
    params, (queries, keys, values) = _params(biases=False), _inputs()
    lens = _lens((B, T))
    expected = np_mh.multi_head_attention(params, queries, keys, values, lens, num_heads=num_heads)
    got = _jitted("multi_head_attention")(_to_params(dtype, params), *_to(dtype, queries, keys, values),
                                          jnp.asarray(lens), num_heads=num_heads)
    for g, e in zip(got, expected):
        _assert_matches(g, e, dtype, backend)
    assert got[1].shape == (B, num_heads, T, S)


def test_integer_inputs_are_cast_to_float(backend, x64):
    # Integer queries, keys and values compute in the default float dtype, as in scoring; the
    # parameters are not truncated to integers.
    params = _params()
    queries, keys, values = (np.rint(3 * a).astype(np.int32) for a in _inputs())
    expected = np_mh.multi_head_attention(params, queries, keys, values, num_heads=N)
    got = _jitted("multi_head_attention")(_to_params(jnp.float64, params),
                                          *(jnp.asarray(a) for a in (queries, keys, values)), num_heads=N)
    for g, e in zip(got, expected):
        _assert_matches(g, e, jnp.float64, backend)


def test_head_split_and_merge(backend, dtype):
    X = _normal((B, T, D), 4)
    heads = _normal((B, N, T, H), 5)
    book_heads = _normal((B * N, T, H), 6)
    pairs = [
        (jax_mh.split_heads(jnp.asarray(X, dtype), N), np_mh.split_heads(X, N)),
        (jax_mh.merge_heads(jnp.asarray(heads, dtype)), np_mh.merge_heads(heads)),
        (jax_mh.transpose_qkv(jnp.asarray(X, dtype), N), np_mh.transpose_qkv(X, N)),
        (jax_mh.transpose_output(jnp.asarray(book_heads, dtype), N), np_mh.transpose_output(book_heads, N)),
    ]
    for got, expected in pairs:
        assert got.dtype == dtype and got.devices() == {backend}
        # Pure data movement: bit for bit.
        np.testing.assert_array_equal(np.asarray(got, np.float64), np.asarray(expected, dtype))
    assert pairs[0][1].shape == (B, N, T, H) and pairs[2][1].shape == (B * N, T, H)


def test_project_and_combine_heads(backend, dtype):
    params, (queries, keys, values) = _params(), _inputs()
    expected = np_mh.project_heads(params, queries, keys, values, num_heads=N)
    got = jax.jit(jax_mh.project_heads, static_argnames="num_heads")(
        _to_params(dtype, params), *_to(dtype, queries, keys, values), num_heads=N)
    for g, e in zip(got, expected):
        _assert_matches(g, e, dtype, backend)
    assert [g.shape for g in got] == [(B, N, T, H), (B, N, S, H), (B, N, S, H)]
    heads = _normal((B, N, T, H), 13)
    _assert_matches(jax.jit(jax_mh.combine_heads)(_to_params(dtype, params), jnp.asarray(heads, dtype)),
                    np_mh.combine_heads(params, heads), dtype, backend)


# --------------------------------------------------------------------------- NNX module


# float64 only, the tight comparison: each new parameter shape and dtype costs a compiled random
# init. The float32 module is tied to the function in tests/test_multihead.py, and the function to
# the reference in float32 above.
@pytest.mark.parametrize("bias, dropout, deterministic", [(True, 0.3, True), (False, 0.0, None)])
def test_module_matches_function_and_reference(backend, x64, highest_precision, bias, dropout, deterministic):
    dtype = jnp.float64
    module = jax_mh.MultiHeadAttention(D, N, dropout, bias, query_size=QUERY_SIZE, key_size=KEY_SIZE,
                                       value_size=VALUE_SIZE, param_dtype=dtype, rngs=nnx.Rngs(0))
    queries, keys, values = _inputs()
    lens = _lens((B,))
    jax_inputs = _to(dtype, queries, keys, values)
    got = nnx.jit(lambda m, *a: m(*a, is_causal=True, deterministic=deterministic))(
        module, *jax_inputs, jnp.asarray(lens))
    params = module.params_dict()
    names = {"W_q", "W_k", "W_v", "W_o"} | ({"b_q", "b_k", "b_v", "b_o"} if bias else set())
    assert set(params) == names and all(p.dtype == dtype for p in params.values())
    functional, _ = _jitted("multi_head_attention")(params, *jax_inputs, jnp.asarray(lens), num_heads=N,
                                                    is_causal=True)
    # The module only owns the parameters; it must run the very same computation.
    np.testing.assert_array_equal(np.asarray(got), np.asarray(functional))
    reference_params = {name: np.asarray(p, np.float64) for name, p in params.items()}
    expected, _ = np_mh.multi_head_attention(reference_params, queries, keys, values, lens, num_heads=N,
                                             is_causal=True)
    _assert_matches(got, expected, dtype, backend)


def test_module_self_attention(backend, dtype):
    module = jax_mh.MultiHeadAttention(D, N, param_dtype=dtype, rngs=nnx.Rngs(1))
    X = _normal((B, T, D), 14)
    lens = np.array([T, 1], np.int32)  # self-attention: S = T
    got = nnx.jit(lambda m, x, lens: m(x, x, x, lens))(module, jnp.asarray(X, dtype), jnp.asarray(lens))
    reference_params = {name: np.asarray(p, np.float64) for name, p in module.params_dict().items()}
    expected, _ = np_mh.multi_head_attention(reference_params, X, X, X, lens, num_heads=N)
    _assert_matches(got, expected, dtype, backend)
    assert got.shape == (B, T, D)


def test_relative_position_bias_as_score_bias(backend, x64, highest_precision):
    dtype = jnp.float64
    relative = jax_pos.RelativePositionBias(N, 8, 6, param_dtype=dtype, rngs=nnx.Rngs(2))
    relative.table[...] = jnp.asarray(_normal(relative.table.shape, 15), dtype)
    bias = relative(T, S)  # (1, N, T, S)
    params, (queries, keys, values) = _params(), _inputs()
    expected = np_mh.multi_head_attention(params, queries, keys, values, num_heads=N,
                                          bias=np.asarray(bias, np.float64))
    got = _jitted("multi_head_attention")(_to_params(dtype, params), *_to(dtype, queries, keys, values),
                                          num_heads=N, bias=bias)
    for g, e in zip(got, expected):
        _assert_matches(g, e, dtype, backend)


# --------------------------------------------------------------------------- Flax and jax.nn built-ins


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
    """jax.nn and Flax give a fully masked row uniform weights; we give zeros (README). Rows with
    a valid key are where the two must agree, so key 0 stays visible in these comparisons."""
    mask = mask.copy()
    mask[..., 0] = True
    return mask


@pytest.mark.parametrize("use_bias, mask_shape, is_causal", [
    (True, None, False), (False, None, False), (True, (B, 1, T, S), False), (True, (B, N, T, S), False),
    (True, None, True), (False, (1, N, T, S), True),
])
def test_matches_flax_multi_head_attention(backend, float32, use_bias, mask_shape, is_causal):
    dtype = float32
    params = _params(use_bias, key_size=KEY_SIZE, value_size=KEY_SIZE)
    queries, keys, values = _inputs(value_size=KEY_SIZE)
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
    _assert_matches(got, np.asarray(expected, np.float64), dtype, backend)
    # And both against the float64 reference.
    reference, _ = np_mh.multi_head_attention(params, queries, keys, values, num_heads=N, mask=mask,
                                              is_causal=is_causal)
    _assert_matches(expected, reference, dtype, backend)


def test_flax_differs_only_on_fully_masked_rows(backend, float32):
    # The documented difference: a query that may attend nothing gets zero weights here, so its
    # output is b_o; Flax (the book's -1e6 trick, in effect) averages all values uniformly.
    params = _params(key_size=KEY_SIZE, value_size=KEY_SIZE)
    jax_inputs = _to(jnp.float32, *_inputs(value_size=KEY_SIZE))
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
        from jax_attention.scoring import dot_product_attention

        return dot_product_attention(q, k, v, mask=mask, is_causal=is_causal, bias=bias)[0]

    def theirs(q, k, v):
        to_btnh = functools.partial(jnp.transpose, axes=(0, 2, 1, 3))
        out = jax.nn.dot_product_attention(to_btnh(q), to_btnh(k), to_btnh(v), bias, mask,
                                           is_causal=is_causal)
        return to_btnh(out)  # back to (B, N, T, H)

    got = jax.jit(ours)(*heads)
    with _builtin_promotion():
        expected = jax.jit(theirs)(*heads)
    _assert_matches(got, np.asarray(expected, np.float64), dtype, backend)
    # The full layer: combining jax.nn's heads with W_o gives our multi-head output.
    output, _ = _jitted("multi_head_attention")(_to_params(dtype, params), *_to(dtype, queries, keys, values),
                                                num_heads=N, mask=mask, is_causal=is_causal, bias=bias)
    combined = jax.jit(jax_mh.combine_heads)(_to_params(dtype, params), expected)
    _assert_matches(output, np.asarray(combined, np.float64), dtype, backend)
