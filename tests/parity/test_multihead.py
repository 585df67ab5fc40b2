"""NumPy reference vs JAX for multi-head attention (d2l §11.5).

Same inputs and parameters on both sides; every backend JAX sees; float64 (x64) to 1e-12 and
float32 (full matmul precision) to 1e-5 relative. The NNX module is tied to the function by running
both on the module's own parameters. (The comparisons with ``flax.nnx.MultiHeadAttention`` and
``jax.nn.dot_product_attention`` are in tests/crossframework/test_flax_jax.py.)

JAX runs under ``jax.jit`` here (one compilation per test instead of one per eager operation),
except for the head split and merge (pure data movement) and the variants (grouped-query heads,
scale, windows, soft-capping, unbatched inputs, the GQA module): their 56 cases of one set of
sizes share the eager programs of the operations, cheaper than one compiled program per case.
tests/test_multihead.py runs the functions with and without jit. Inputs reach the device by
``jax.device_put`` of NumPy arrays of the final dtype (``jnp.asarray`` with a dtype compiles a
conversion per shape).
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
from jax_attention.nn import positional as jax_pos
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
    return [jax.device_put(np.asarray(a, dtype)) for a in arrays]


def _to_params(dtype, params):
    return {name: jax.device_put(np.asarray(p, dtype)) for name, p in params.items()}


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
    got = jax_mh.multi_head_attention(
        _to_params(dtype, params), *_to(dtype, queries, keys, values),
        None if lens is None else jax.device_put(lens), num_heads=N,
        mask=None if mask is None else jax.device_put(mask), is_causal=is_causal,
        bias=None if bias is None else jax.device_put(np.asarray(bias, dtype)),
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
                                          jax.device_put(lens), num_heads=num_heads)
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
                                          *(jax.device_put(a) for a in (queries, keys, values)),
                                          num_heads=N)
    for g, e in zip(got, expected):
        _assert_matches(g, e, jnp.float64, backend)


def test_head_split_and_merge(backend, dtype):
    X = _normal((B, T, D), 4)
    heads = _normal((B, N, T, H), 5)
    book_heads = _normal((B * N, T, H), 6)
    pairs = [
        (jax_mh.split_heads(*_to(dtype, X), N), np_mh.split_heads(X, N)),
        (jax_mh.merge_heads(*_to(dtype, heads)), np_mh.merge_heads(heads)),
        (jax_mh.transpose_qkv(*_to(dtype, X), N), np_mh.transpose_qkv(X, N)),
        (jax_mh.transpose_output(*_to(dtype, book_heads), N), np_mh.transpose_output(book_heads, N)),
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
    _assert_matches(jax.jit(jax_mh.combine_heads)(_to_params(dtype, params), *_to(dtype, heads)),
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
        module, *jax_inputs, jax.device_put(lens))
    params = module.params_dict()
    names = {"W_q", "W_k", "W_v", "W_o"} | ({"b_q", "b_k", "b_v", "b_o"} if bias else set())
    assert set(params) == names and all(p.dtype == dtype for p in params.values())
    functional, _ = _jitted("multi_head_attention")(params, *jax_inputs, jax.device_put(lens),
                                                    num_heads=N, is_causal=True)
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
    got = nnx.jit(lambda m, x, lens: m(x, x, x, lens))(module, *_to(dtype, X), jax.device_put(lens))
    reference_params = {name: np.asarray(p, np.float64) for name, p in module.params_dict().items()}
    expected, _ = np_mh.multi_head_attention(reference_params, X, X, X, lens, num_heads=N)
    _assert_matches(got, expected, dtype, backend)
    assert got.shape == (B, T, D)


def test_relative_position_bias_as_score_bias(backend, x64, highest_precision):
    dtype = jnp.float64
    relative = jax_pos.RelativePositionBias(N, 8, 6, param_dtype=dtype, rngs=nnx.Rngs(2))
    relative.table[...] = _to(dtype, _normal(relative.table.shape, 15))[0]
    bias = nnx.jit(lambda relative: relative(T, S))(relative)  # (1, N, T, S)
    params, (queries, keys, values) = _params(), _inputs()
    expected = np_mh.multi_head_attention(params, queries, keys, values, num_heads=N,
                                          bias=np.asarray(bias, np.float64))
    got = _jitted("multi_head_attention")(_to_params(dtype, params), *_to(dtype, queries, keys, values),
                                          num_heads=N, bias=bias)
    for g, e in zip(got, expected):
        _assert_matches(g, e, dtype, backend)


# --------------------------------------------------------------------------- variants
# Grouped-query heads (W_k, W_v of N_kv heads), a value head size other than H, scale, windows,
# soft-capping and unbatched inputs.

GQA_HEADS = 4  # H = D / 4 = 2


def _gqa_params(num_kv_heads, value_head_size=D // GQA_HEADS, biases=True, seed=8):
    """``W_k (k, N_kv H)``, ``W_v (v, N_kv H_v)``, ``W_o (N H_v, OUT)`` for N = GQA_HEADS."""
    head = D // GQA_HEADS
    rng = np.random.default_rng(seed)
    widths = {"q": D, "k": num_kv_heads * head, "v": num_kv_heads * value_head_size}
    params = {"W_q": rng.normal(size=(QUERY_SIZE, widths["q"])) / np.sqrt(QUERY_SIZE),
              "W_k": rng.normal(size=(KEY_SIZE, widths["k"])) / np.sqrt(KEY_SIZE),
              "W_v": rng.normal(size=(VALUE_SIZE, widths["v"])),
              "W_o": rng.normal(size=(GQA_HEADS * value_head_size, OUT))}
    if biases:
        params.update({f"b_{n}": rng.normal(size=(widths[n],)) for n in "qkv"})
        params["b_o"] = rng.normal(size=(OUT,))
    return params


MHA_VARIANTS = {
    "plain": {},
    "scale, softcap": {"scale": 0.4, "logit_softcap": 1.2},
    "window, lens BT": {"local_window_size": (1, 1), "valid_lens": "BT"},
    "causal window, lens B, mask, bias": {"local_window_size": (1, 0), "is_causal": True,
                                          "valid_lens": "B", "mask": True, "bias": True},
}


def _mha_arguments(variant, module):
    """The variant's arguments; its arrays NumPy's (``module=np``) or on the device (``jax``)."""
    to = np.asarray if module is np else jax.device_put
    arguments = dict(variant)
    if "valid_lens" in arguments:
        arguments["valid_lens"] = to(_lens((B,) if variant["valid_lens"] == "B" else (B, T)))
    if arguments.pop("mask", False):
        arguments["mask"] = to(np.random.default_rng(5).random((B, 1, T, S)) < 0.7)
    if arguments.pop("bias", False):
        arguments["bias"] = to(_normal((1, GQA_HEADS, T, S), 6))
    return arguments


@pytest.mark.parametrize("value_head_size", [2, 3], ids=["H_v = H", "H_v = 3"])
@pytest.mark.parametrize("num_kv_heads", [GQA_HEADS, 2, 1], ids=["MHA", "GQA", "MQA"])
@pytest.mark.parametrize("variant", list(MHA_VARIANTS), ids=list(MHA_VARIANTS))
def test_multi_head_attention_variants(backend, dtype, variant, num_kv_heads, value_head_size):
    params = _gqa_params(num_kv_heads, value_head_size)
    inputs = _inputs()
    expected = np_mh.multi_head_attention(params, *inputs, num_heads=GQA_HEADS,
                                          num_kv_heads=num_kv_heads,
                                          **_mha_arguments(MHA_VARIANTS[variant], np))
    got = jax_mh.multi_head_attention(_to_params(dtype, params), *_to(dtype, *inputs),
                                      num_heads=GQA_HEADS, num_kv_heads=num_kv_heads,
                                      **_mha_arguments(MHA_VARIANTS[variant], jax))
    for g, e in zip(got, expected):
        _assert_matches(g, e, dtype, backend)
    # num_kv_heads=None reads N_kv from W_k's width.
    inferred = np_mh.multi_head_attention(params, *inputs, num_heads=GQA_HEADS,
                                          **_mha_arguments(MHA_VARIANTS[variant], np))
    for i, e in zip(inferred, expected):
        np.testing.assert_array_equal(i, e)


@pytest.mark.parametrize("lens", [None, 2, (0, 5, 3)], ids=["no lens", "lens ()", "lens (T,)"])
def test_multi_head_attention_unbatched(backend, dtype, lens):
    """Unbatched (T, q), (S, k), (S, v) give the batched result without its batch axis."""
    params = _gqa_params(2)
    inputs = [a[1] for a in _inputs()]
    mask = np.random.default_rng(6).random((GQA_HEADS, T, S)) < 0.8  # (N, T, S) unbatched
    np_lens = None if lens is None else np.asarray(lens, np.int32)
    expected = np_mh.multi_head_attention(params, *inputs, np_lens, num_heads=GQA_HEADS, mask=mask,
                                          is_causal=True)
    batched = np_mh.multi_head_attention(params, *(a[None] for a in inputs),
                                         None if lens is None else np_lens[None],
                                         num_heads=GQA_HEADS, mask=mask[None], is_causal=True)
    assert expected[0].shape == (T, OUT) and expected[1].shape == (GQA_HEADS, T, S)
    for e, b in zip(expected, batched):
        np.testing.assert_array_equal(e, b[0])
    got = jax_mh.multi_head_attention(_to_params(dtype, params), *_to(dtype, *inputs),
                                      None if lens is None else jax.device_put(np_lens),
                                      num_heads=GQA_HEADS, mask=jax.device_put(mask), is_causal=True)
    for g, e in zip(got, expected):
        _assert_matches(g, e, dtype, backend)


@pytest.mark.parametrize("num_kv_heads, value_head_size", [(2, 3), (1, 2)])
def test_module_variants_match_reference(backend, x64, highest_precision, num_kv_heads,
                                         value_head_size):
    """The NNX module's parameter shapes follow num_kv_heads and value_head_size, and it computes
    the reference function on them."""
    module = jax_mh.MultiHeadAttention(D, GQA_HEADS, bias=True, query_size=QUERY_SIZE,
                                       key_size=KEY_SIZE, value_size=VALUE_SIZE,
                                       num_kv_heads=num_kv_heads, value_head_size=value_head_size,
                                       param_dtype=jnp.float64, rngs=nnx.Rngs(0))
    params = {name: np.asarray(p) for name, p in module.params_dict().items()}
    head = D // GQA_HEADS
    assert {name: p.shape for name, p in params.items()} == {
        "W_q": (QUERY_SIZE, D), "W_k": (KEY_SIZE, num_kv_heads * head),
        "W_v": (VALUE_SIZE, num_kv_heads * value_head_size), "W_o": (GQA_HEADS * value_head_size, D),
        "b_q": (D,), "b_k": (num_kv_heads * head,), "b_v": (num_kv_heads * value_head_size,),
        "b_o": (D,)}
    inputs = _inputs()
    arguments = _mha_arguments(MHA_VARIANTS["causal window, lens B, mask, bias"], np)
    expected, _ = np_mh.multi_head_attention(params, *inputs, num_heads=GQA_HEADS, **arguments)
    got = module(*_to(jnp.float64, *inputs),
                 **_mha_arguments(MHA_VARIANTS["causal window, lens B, mask, bias"], jax))
    _assert_matches(got, expected, jnp.float64, backend)
