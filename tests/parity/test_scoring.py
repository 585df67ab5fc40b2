"""NumPy reference vs JAX for additive and scaled dot-product attention (d2l §11.3).

Same inputs and parameters on both sides; every backend JAX sees; float64 to 1e-12 and float32
(full matmul precision) to 1e-5 relative. The NNX modules are tied to the functions by running
them on the modules' own parameters.

The dot-product functions' tests compute their JAX side under ``jax.jit``, all the cases of a
group of tests in one program per backend and dtype (:func:`tests.parity._support.together`;
each case still asserts its own result): eagerly, the chunked implementation's loops compile anew at every call (about
0.25 s each), and one program holding a group's cases compiles faster than one program per case.
The additive tests and the NNX modules' (but the one of the variants) run eagerly: their cases
share one set of sizes, hence the eager programs of the operations, cheaper than compiled programs
here. Their inputs reach the device as NumPy arrays of the final dtype (``jnp.asarray`` with a
dtype compiles a conversion per shape).
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx

from jax_attention.nn import scoring as jax_scoring
from reference_numpy import scoring as np_scoring
from tests.parity._support import assert_matches as _assert_matches
from tests.parity._support import call, together

B, N, T, S = 3, 2, 4, 5
QUERY_SIZE, KEY_SIZE, HIDDENS, VALUE_SIZE = 3, 6, 7, 2  # additive: q != k on purpose
DEPTH = 4  # dot-product: shared query/key size


def _normal(shape, seed):
    return np.random.default_rng(seed).normal(size=shape)


def _lens(shape, seed=1):
    """Random lengths in [0, S] with 0 and S always present: empty and full rows are covered."""
    lens = np.random.default_rng(seed).integers(0, S + 1, size=shape)
    lens.flat[0], lens.flat[-1] = 0, S
    return lens.astype(np.int32)


def _additive_params(seed=7):
    rng = np.random.default_rng(seed)
    return {
        "W_q": rng.normal(size=(QUERY_SIZE, HIDDENS)),
        "W_k": rng.normal(size=(KEY_SIZE, HIDDENS)),
        "w_v": rng.normal(size=(HIDDENS, 1)),
    }


# (valid_lens shape, mask shape, is_causal) relative to scores (B, ..., T, S); None = not given.
MASKINGS = [
    (None, None, False),
    ("B", None, False),
    ("BT", None, False),
    (None, "TS", False),
    (None, "B1S", False),
    (None, "BTS", False),
    (None, None, True),
    ("B", None, True),
    ("BT", "B1S", False),
    ("B", "TS", True),
]
MASKING_IDS = [f"lens={l}-mask={m}-causal={c}" for l, m, c in MASKINGS]


def _masking(lens_kind, mask_kind, heads=False):
    """NumPy ``valid_lens`` and ``mask`` for one row of MASKINGS (heads: scores (B, N, T, S))."""
    lens = {None: None, "B": _lens((B,)), "BT": _lens((B, T))}[lens_kind]
    mask_shapes = {"TS": (T, S), "B1S": (B, 1, S), "BTS": (B, T, S)}
    mask = None
    if mask_kind is not None:
        shape = mask_shapes[mask_kind]
        if heads and len(shape) == 3:
            shape = (shape[0], 1) + shape[1:]
        mask = np.random.default_rng(2).random(shape) < 0.7
    return lens, mask


def _to(dtype, *arrays):
    """The arrays on the device in ``dtype``, cast by NumPy (``jnp.asarray`` with a dtype compiles
    a conversion for every shape)."""
    return [jax.device_put(np.asarray(a, dtype)) for a in arrays]


def _to_jax(lens, mask):
    return tuple(None if a is None else jax.device_put(a) for a in (lens, mask))


def _cast(dtype, *arrays):
    return [np.asarray(a, dtype) for a in arrays]


def _dot_inputs(batch_axes, num_queries=T, num_keys=S):
    return (
        _normal(batch_axes + (num_queries, DEPTH), 10),
        _normal(batch_axes + (num_keys, DEPTH), 11),
        _normal(batch_axes + (num_keys, VALUE_SIZE), 12),
    )


def _additive_inputs(batch_axes, num_queries=T, num_keys=S):
    return (
        _normal(batch_axes + (num_queries, QUERY_SIZE), 20),
        _normal(batch_axes + (num_keys, KEY_SIZE), 21),
        _normal(batch_axes + (num_keys, VALUE_SIZE), 22),
    )


# --------------------------------------------------------------------------- dot product


# Both implementations of jax_scoring.dot_product_attention against the one NumPy path (which
# takes and ignores the argument); None is the default dispatch (plain at these sizes).
IMPLEMENTATIONS = ["plain", "chunked", None]
HEADS_MASKINGS = [("B", None, False), ("BT", None, False), ("B", "B1S", True), ("BT", "TS", False)]
RECTANGULAR = [(6, 3)]  # T > S; MASKINGS has T < S


def _dot_product_calls(dtype):
    """The JAX calls of the four tests below, keyed by test and case."""
    calls = {}
    for lens_kind, mask_kind, is_causal in MASKINGS:
        lens, mask = _masking(lens_kind, mask_kind)
        for implementation in IMPLEMENTATIONS:
            calls[f"attention {lens_kind} {mask_kind} {is_causal} {implementation}"] = call(
                jax_scoring.dot_product_attention, *_cast(dtype, *_dot_inputs((B,))), lens,
                mask=mask, is_causal=is_causal, implementation=implementation)
    for lens_kind, mask_kind, is_causal in MASKINGS[:4]:
        lens, mask = _masking(lens_kind, mask_kind)
        calls[f"weights {lens_kind} {mask_kind} {is_causal}"] = call(
            jax_scoring.dot_product_attention_weights, *_cast(dtype, *_dot_inputs((B,))[:2]),
            lens, mask=mask, is_causal=is_causal)
    for lens_kind, mask_kind, is_causal in HEADS_MASKINGS:
        lens, mask = _masking(lens_kind, mask_kind, heads=True)
        for implementation in IMPLEMENTATIONS[:2]:
            calls[f"heads {lens_kind} {mask_kind} {is_causal} {implementation}"] = call(
                jax_scoring.dot_product_attention, *_cast(dtype, *_dot_inputs((B, N))), lens,
                mask=mask, is_causal=is_causal, implementation=implementation)
    for num_queries, num_keys in RECTANGULAR:
        for implementation in IMPLEMENTATIONS[:2]:
            calls[f"rectangular {num_queries} {num_keys} {implementation}"] = call(
                jax_scoring.dot_product_attention,
                *_cast(dtype, *_dot_inputs((B,), num_queries, num_keys)), is_causal=True,
                implementation=implementation)
    return calls


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("lens_kind, mask_kind, is_causal", MASKINGS, ids=MASKING_IDS)
def test_dot_product_attention(backend, dtype, lens_kind, mask_kind, is_causal, implementation):
    queries, keys, values = _dot_inputs((B,))
    lens, mask = _masking(lens_kind, mask_kind)
    expected = np_scoring.dot_product_attention(queries, keys, values, lens, mask=mask,
                                                is_causal=is_causal, implementation=implementation)
    got = together(_dot_product_calls,
                    f"attention {lens_kind} {mask_kind} {is_causal} {implementation}", backend, dtype)
    for g, e in zip(got, expected):
        _assert_matches(g, e, dtype, backend)


@pytest.mark.parametrize("lens_kind, mask_kind, is_causal", MASKINGS[:4], ids=MASKING_IDS[:4])
def test_dot_product_attention_weights(backend, dtype, lens_kind, mask_kind, is_causal):
    queries, keys, _ = _dot_inputs((B,))
    lens, mask = _masking(lens_kind, mask_kind)
    expected = np_scoring.dot_product_attention_weights(queries, keys, lens, mask=mask, is_causal=is_causal)
    got = together(_dot_product_calls, f"weights {lens_kind} {mask_kind} {is_causal}", backend,
                    dtype)
    _assert_matches(got, expected, dtype, backend)


@pytest.mark.parametrize("lens_kind, mask_kind, is_causal", HEADS_MASKINGS)
@pytest.mark.parametrize("implementation", IMPLEMENTATIONS[:2])
def test_dot_product_attention_heads(backend, dtype, lens_kind, mask_kind, is_causal,
                                     implementation):
    queries, keys, values = _dot_inputs((B, N))
    lens, mask = _masking(lens_kind, mask_kind, heads=True)
    expected = np_scoring.dot_product_attention(queries, keys, values, lens, mask=mask, is_causal=is_causal)
    got = together(_dot_product_calls,
                    f"heads {lens_kind} {mask_kind} {is_causal} {implementation}", backend, dtype)
    for g, e in zip(got, expected):
        _assert_matches(g, e, dtype, backend)


@pytest.mark.parametrize("num_queries, num_keys", RECTANGULAR)
@pytest.mark.parametrize("implementation", IMPLEMENTATIONS[:2])
def test_dot_product_attention_causal_rectangular(backend, dtype, num_queries, num_keys,
                                                  implementation):
    queries, keys, values = _dot_inputs((B,), num_queries, num_keys)
    expected = np_scoring.dot_product_attention(queries, keys, values, is_causal=True)
    got = together(_dot_product_calls, f"rectangular {num_queries} {num_keys} {implementation}",
                    backend, dtype)
    for g, e in zip(got, expected):
        _assert_matches(g, e, dtype, backend)


# --------------------------------------------------------------------------- additive

ADDITIVE_HEADS_MASKINGS = [("B", None, False), ("BT", None, False), ("BT", "B1S", True)]


def _to_params(dtype, params):
    return {name: jax.device_put(np.asarray(p, dtype)) for name, p in params.items()}


@pytest.mark.parametrize("lens_kind, mask_kind, is_causal", MASKINGS, ids=MASKING_IDS)
def test_additive_attention(backend, dtype, lens_kind, mask_kind, is_causal):
    params = _additive_params()
    queries, keys, values = _additive_inputs((B,))
    lens, mask = _masking(lens_kind, mask_kind)
    expected = np_scoring.additive_attention(
        params, queries, keys, values, lens, mask=mask, is_causal=is_causal
    )
    jax_lens, jax_mask = _to_jax(lens, mask)
    got = jax_scoring.additive_attention(_to_params(dtype, params),
                                         *_to(dtype, queries, keys, values), jax_lens,
                                         mask=jax_mask, is_causal=is_causal)
    for g, e in zip(got, expected):
        _assert_matches(g, e, dtype, backend)


@pytest.mark.parametrize("lens_kind, mask_kind, is_causal", MASKINGS[:4], ids=MASKING_IDS[:4])
def test_additive_attention_weights(backend, dtype, lens_kind, mask_kind, is_causal):
    params = _additive_params()
    queries, keys, _ = _additive_inputs((B,))
    lens, mask = _masking(lens_kind, mask_kind)
    expected = np_scoring.additive_attention_weights(
        params, queries, keys, lens, mask=mask, is_causal=is_causal
    )
    jax_lens, jax_mask = _to_jax(lens, mask)
    got = jax_scoring.additive_attention_weights(_to_params(dtype, params),
                                                 *_to(dtype, queries, keys), jax_lens,
                                                 mask=jax_mask, is_causal=is_causal)
    _assert_matches(got, expected, dtype, backend)


@pytest.mark.parametrize("lens_kind, mask_kind, is_causal", ADDITIVE_HEADS_MASKINGS)
def test_additive_attention_heads(backend, dtype, lens_kind, mask_kind, is_causal):
    params = _additive_params()
    queries, keys, values = _additive_inputs((B, N))
    lens, mask = _masking(lens_kind, mask_kind, heads=True)
    expected = np_scoring.additive_attention(
        params, queries, keys, values, lens, mask=mask, is_causal=is_causal
    )
    jax_lens, jax_mask = _to_jax(lens, mask)
    got = jax_scoring.additive_attention(_to_params(dtype, params),
                                         *_to(dtype, queries, keys, values), jax_lens,
                                         mask=jax_mask, is_causal=is_causal)
    for g, e in zip(got, expected):
        _assert_matches(g, e, dtype, backend)


# --------------------------------------------------------------------------- NNX modules


@pytest.mark.parametrize("lens_kind", [None, "BT"])
def test_additive_module_matches_function_and_reference(backend, dtype, lens_kind):
    module = jax_scoring.AdditiveAttention(QUERY_SIZE, KEY_SIZE, HIDDENS, param_dtype=dtype, rngs=nnx.Rngs(0))
    queries, keys, values = _additive_inputs((B,))
    lens, _ = _masking(lens_kind, None)
    jax_inputs = _to(dtype, queries, keys, values)
    jax_lens = _to_jax(lens, None)[0]

    got = module(*jax_inputs, jax_lens)
    params = module.params_dict()
    assert {name: p.dtype for name, p in params.items()} == {"W_q": dtype, "W_k": dtype, "w_v": dtype}
    functional, _ = jax_scoring.additive_attention(params, *jax_inputs, jax_lens)
    # The module only owns the parameters; it must run the very same computation.
    np.testing.assert_array_equal(np.asarray(got), np.asarray(functional))

    reference_params = {k: np.asarray(v, np.float64) for k, v in params.items()}
    expected, _ = np_scoring.additive_attention(reference_params, queries, keys, values, lens)
    _assert_matches(got, expected, dtype, backend)


@pytest.mark.parametrize("dropout, deterministic", [(0.0, None), (0.3, True)])
@pytest.mark.parametrize("is_causal", [False, True])
def test_dot_product_module_matches_function_and_reference(backend, dtype, dropout, deterministic, is_causal):
    module = jax_scoring.DotProductAttention(dropout, rngs=nnx.Rngs(0))
    queries, keys, values = _dot_inputs((B,))
    lens = _lens((B, T))
    jax_inputs = _to(dtype, queries, keys, values)

    got = module(*jax_inputs, jax.device_put(lens), is_causal=is_causal, deterministic=deterministic)
    functional, _ = jax_scoring.dot_product_attention(*jax_inputs, jax.device_put(lens), is_causal=is_causal)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(functional))
    expected, _ = np_scoring.dot_product_attention(queries, keys, values, lens, is_causal=is_causal)
    _assert_matches(got, expected, dtype, backend)


# --------------------------------------------------------------------------- variants
# Grouped-query heads, scale, sliding windows, soft-capping and unbatched inputs: the JAX paths
# against the reference, which repeats the key/value heads and builds every mask in full.

NUM_QUERY_HEADS = 4

# name -> keyword arguments; lengths "B"/"BT" from _lens (0 and S present: empty rows), "mask"
# a random (B, 1, T, S) mask.
VARIANTS = {
    "scale": {"scale": 0.3},
    "softcap": {"logit_softcap": 0.8},
    "window": {"local_window_size": (1, 2)},
    "window int, causal": {"local_window_size": 1, "is_causal": True},
    "window (0, 0), lens BT": {"local_window_size": (0, 0), "valid_lens": "BT"},
    "window (2, 0), lens B, mask": {"local_window_size": [2, 0], "valid_lens": "B", "mask": True},
    "everything": {"scale": 1.7, "logit_softcap": 1.5, "local_window_size": (1, 3),
                   "is_causal": True, "valid_lens": "BT", "mask": True},
}


def _variant_arguments(variant: dict, module):
    """The variant's arguments; its arrays NumPy's (``module=np``) or on the device (``jax``)."""
    to = np.asarray if module is np else jax.device_put
    arguments = dict(variant)
    if "valid_lens" in arguments:
        arguments["valid_lens"] = to(_lens((B,) if variant["valid_lens"] == "B" else (B, T)))
    if arguments.pop("mask", False):
        arguments["mask"] = to(np.random.default_rng(3).random((B, 1, T, S)) < 0.7)
    return arguments


KV_HEADS = [NUM_QUERY_HEADS, 2, 1]
UNBATCHED_LENS = [None, 3, (1, 0, 5, 2)]


def _variant_inputs(num_kv_heads):
    return (_normal((B, NUM_QUERY_HEADS, T, DEPTH), 30), _normal((B, num_kv_heads, S, DEPTH), 31),
            _normal((B, num_kv_heads, S, VALUE_SIZE), 32))


def _unbatched_case(lens):
    """Unbatched inputs, ``valid_lens`` (or None) and the other arguments of one case."""
    inputs = [a[0] for a in _dot_inputs((B,))]
    arguments = {"local_window_size": (2, 1), "mask": np.random.default_rng(4).random((T, S)) < 0.8}
    return inputs, None if lens is None else np.asarray(lens, np.int32), arguments


def _module_variant_inputs():
    return (_normal((B, NUM_QUERY_HEADS, T, DEPTH), 33), _normal((B, 2, S, DEPTH), 34),
            _normal((B, 2, S, VALUE_SIZE), 35))


def _dot_product_module(*args, **kwargs):
    return jax_scoring.DotProductAttention()(*args, **kwargs)


def _variant_calls(dtype):
    """The JAX calls of the three tests below, keyed by test and case."""
    calls = {}
    for variant, keywords in VARIANTS.items():
        for num_kv_heads in KV_HEADS:
            inputs = _cast(dtype, *_variant_inputs(num_kv_heads))
            arguments = _variant_arguments(keywords, np)
            for implementation in ("plain", "chunked"):
                calls[f"variant {variant} {num_kv_heads} {implementation}"] = call(
                    jax_scoring.dot_product_attention, *inputs, implementation=implementation,
                    **arguments)
            calls[f"variant weights {variant} {num_kv_heads}"] = call(
                jax_scoring.dot_product_attention_weights, *inputs[:2], **arguments)
    for lens in UNBATCHED_LENS:
        inputs, np_lens, arguments = _unbatched_case(lens)
        for implementation in ("plain", "chunked"):
            calls[f"unbatched {lens} {implementation}"] = call(
                jax_scoring.dot_product_attention, *_cast(dtype, *inputs), np_lens,
                implementation=implementation, **arguments)
    calls["module"] = call(_dot_product_module, *_cast(dtype, *_module_variant_inputs()),
                            **_variant_arguments(VARIANTS["everything"], np))
    return calls


@pytest.mark.parametrize("implementation", ["plain", "chunked"])
@pytest.mark.parametrize("num_kv_heads", KV_HEADS, ids=["MHA", "GQA", "MQA"])
@pytest.mark.parametrize("variant", list(VARIANTS), ids=list(VARIANTS))
def test_dot_product_attention_variants(backend, dtype, variant, num_kv_heads, implementation):
    expected = np_scoring.dot_product_attention(*_variant_inputs(num_kv_heads),
                                                **_variant_arguments(VARIANTS[variant], np))
    got = together(_variant_calls, f"variant {variant} {num_kv_heads} {implementation}", backend,
                    dtype)
    for g, e in zip(got, expected):
        _assert_matches(g, e, dtype, backend)
    weights = together(_variant_calls, f"variant weights {variant} {num_kv_heads}", backend, dtype)
    _assert_matches(weights, expected[1], dtype, backend)


@pytest.mark.parametrize("implementation", ["plain", "chunked"])
@pytest.mark.parametrize("lens", UNBATCHED_LENS, ids=["no lens", "lens ()", "lens (T,)"])
def test_dot_product_attention_unbatched(backend, dtype, lens, implementation):
    """Unbatched (T, d), (S, d), (S, v) give the batched result without its batch axis."""
    (queries, keys, values), np_lens, arguments = _unbatched_case(lens)
    expected = np_scoring.dot_product_attention(queries, keys, values, np_lens, **arguments)
    batched = np_scoring.dot_product_attention(
        queries[None], keys[None], values[None], None if lens is None else np_lens[None], **arguments)
    for e, b in zip(expected, batched):
        np.testing.assert_array_equal(e, b[0])
    got = together(_variant_calls, f"unbatched {lens} {implementation}", backend, dtype)
    for g, e in zip(got, expected):
        _assert_matches(g, e, dtype, backend)


def test_dot_product_module_variants(backend, dtype):
    """The NNX module (dropout off) takes the same variants as the function."""
    expected, _ = np_scoring.dot_product_attention(*_module_variant_inputs(),
                                                   **_variant_arguments(VARIANTS["everything"], np))
    _assert_matches(together(_variant_calls, "module", backend, dtype), expected, dtype, backend)
