"""NumPy reference vs JAX for multi-head attention (d2l §11.5).

Same inputs and parameters on both sides; every backend JAX sees; float64 (x64) to 1e-12 and
float32 (full matmul precision) to 1e-5 relative. The NNX module is tied to the function by running
both on the module's own parameters. (The comparisons with ``flax.nnx.MultiHeadAttention`` and
``jax.nn.dot_product_attention`` are in tests/crossframework/test_flax_jax.py.)

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
