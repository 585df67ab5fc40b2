"""NumPy reference vs JAX for additive and scaled dot-product attention (d2l §11.3).

Same inputs and parameters on both sides; every backend JAX sees; float64 to 1e-12 and float32
(full matmul precision) to 1e-5 relative. The NNX modules are tied to the functions by running
them on the modules' own parameters.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jax_attention import scoring as jax_scoring
from reference_numpy import scoring as np_scoring
from tests.parity._support import assert_matches as _assert_matches

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


def _to_jax(lens, mask):
    return (None if lens is None else jnp.asarray(lens)), (None if mask is None else jnp.asarray(mask))


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


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("lens_kind, mask_kind, is_causal", MASKINGS, ids=MASKING_IDS)
def test_dot_product_attention(backend, dtype, lens_kind, mask_kind, is_causal, implementation):
    queries, keys, values = _dot_inputs((B,))
    lens, mask = _masking(lens_kind, mask_kind)
    expected = np_scoring.dot_product_attention(queries, keys, values, lens, mask=mask,
                                                is_causal=is_causal, implementation=implementation)
    jax_lens, jax_mask = _to_jax(lens, mask)
    got = jax_scoring.dot_product_attention(
        *(jnp.asarray(a, dtype) for a in (queries, keys, values)),
        jax_lens,
        mask=jax_mask,
        is_causal=is_causal,
        implementation=implementation,
    )
    for g, e in zip(got, expected):
        _assert_matches(g, e, dtype, backend)


@pytest.mark.parametrize("lens_kind, mask_kind, is_causal", MASKINGS[:4], ids=MASKING_IDS[:4])
def test_dot_product_attention_weights(backend, dtype, lens_kind, mask_kind, is_causal):
    queries, keys, _ = _dot_inputs((B,))
    lens, mask = _masking(lens_kind, mask_kind)
    expected = np_scoring.dot_product_attention_weights(queries, keys, lens, mask=mask, is_causal=is_causal)
    jax_lens, jax_mask = _to_jax(lens, mask)
    got = jax_scoring.dot_product_attention_weights(
        jnp.asarray(queries, dtype), jnp.asarray(keys, dtype), jax_lens, mask=jax_mask, is_causal=is_causal
    )
    _assert_matches(got, expected, dtype, backend)


@pytest.mark.parametrize(
    "lens_kind, mask_kind, is_causal",
    [("B", None, False), ("BT", None, False), ("B", "B1S", True), ("BT", "TS", False)],
)
@pytest.mark.parametrize("implementation", IMPLEMENTATIONS[:2])
def test_dot_product_attention_heads(backend, dtype, lens_kind, mask_kind, is_causal,
                                     implementation):
    queries, keys, values = _dot_inputs((B, N))
    lens, mask = _masking(lens_kind, mask_kind, heads=True)
    expected = np_scoring.dot_product_attention(queries, keys, values, lens, mask=mask, is_causal=is_causal)
    jax_lens, jax_mask = _to_jax(lens, mask)
    got = jax_scoring.dot_product_attention(
        *(jnp.asarray(a, dtype) for a in (queries, keys, values)),
        jax_lens,
        mask=jax_mask,
        is_causal=is_causal,
        implementation=implementation,
    )
    for g, e in zip(got, expected):
        _assert_matches(g, e, dtype, backend)


@pytest.mark.parametrize("num_queries, num_keys", [(6, 3)])  # T > S; MASKINGS has T < S
@pytest.mark.parametrize("implementation", IMPLEMENTATIONS[:2])
def test_dot_product_attention_causal_rectangular(backend, dtype, num_queries, num_keys,
                                                  implementation):
    queries, keys, values = _dot_inputs((B,), num_queries, num_keys)
    expected = np_scoring.dot_product_attention(queries, keys, values, is_causal=True)
    got = jax_scoring.dot_product_attention(
        *(jnp.asarray(a, dtype) for a in (queries, keys, values)), is_causal=True,
        implementation=implementation,
    )
    for g, e in zip(got, expected):
        _assert_matches(g, e, dtype, backend)


# --------------------------------------------------------------------------- additive


@pytest.mark.parametrize("lens_kind, mask_kind, is_causal", MASKINGS, ids=MASKING_IDS)
def test_additive_attention(backend, dtype, lens_kind, mask_kind, is_causal):
    params = _additive_params()
    queries, keys, values = _additive_inputs((B,))
    lens, mask = _masking(lens_kind, mask_kind)
    expected = np_scoring.additive_attention(
        params, queries, keys, values, lens, mask=mask, is_causal=is_causal
    )
    jax_lens, jax_mask = _to_jax(lens, mask)
    got = jax_scoring.additive_attention(
        {name: jnp.asarray(p, dtype) for name, p in params.items()},
        *(jnp.asarray(a, dtype) for a in (queries, keys, values)),
        jax_lens,
        mask=jax_mask,
        is_causal=is_causal,
    )
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
    got = jax_scoring.additive_attention_weights(
        {name: jnp.asarray(p, dtype) for name, p in params.items()},
        jnp.asarray(queries, dtype),
        jnp.asarray(keys, dtype),
        jax_lens,
        mask=jax_mask,
        is_causal=is_causal,
    )
    _assert_matches(got, expected, dtype, backend)


@pytest.mark.parametrize(
    "lens_kind, mask_kind, is_causal", [("B", None, False), ("BT", None, False), ("BT", "B1S", True)]
)
def test_additive_attention_heads(backend, dtype, lens_kind, mask_kind, is_causal):
    params = _additive_params()
    queries, keys, values = _additive_inputs((B, N))
    lens, mask = _masking(lens_kind, mask_kind, heads=True)
    expected = np_scoring.additive_attention(
        params, queries, keys, values, lens, mask=mask, is_causal=is_causal
    )
    jax_lens, jax_mask = _to_jax(lens, mask)
    got = jax_scoring.additive_attention(
        {name: jnp.asarray(p, dtype) for name, p in params.items()},
        *(jnp.asarray(a, dtype) for a in (queries, keys, values)),
        jax_lens,
        mask=jax_mask,
        is_causal=is_causal,
    )
    for g, e in zip(got, expected):
        _assert_matches(g, e, dtype, backend)


# --------------------------------------------------------------------------- NNX modules


@pytest.mark.parametrize("lens_kind", [None, "BT"])
def test_additive_module_matches_function_and_reference(backend, dtype, lens_kind):
    module = jax_scoring.AdditiveAttention(QUERY_SIZE, KEY_SIZE, HIDDENS, param_dtype=dtype, rngs=nnx.Rngs(0))
    queries, keys, values = _additive_inputs((B,))
    lens, _ = _masking(lens_kind, None)
    jax_inputs = [jnp.asarray(a, dtype) for a in (queries, keys, values)]
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
    jax_inputs = [jnp.asarray(a, dtype) for a in (queries, keys, values)]

    got = module(*jax_inputs, jnp.asarray(lens), is_causal=is_causal, deterministic=deterministic)
    functional, _ = jax_scoring.dot_product_attention(*jax_inputs, jnp.asarray(lens), is_causal=is_causal)
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


def _variant_arguments(variant: dict, xnp, dtype=None):
    arguments = dict(variant)
    if "valid_lens" in arguments:
        arguments["valid_lens"] = xnp.asarray(_lens((B,) if variant["valid_lens"] == "B" else (B, T)))
    if arguments.pop("mask", False):
        arguments["mask"] = xnp.asarray(np.random.default_rng(3).random((B, 1, T, S)) < 0.7)
    return arguments


@pytest.mark.parametrize("implementation", ["plain", "chunked"])
@pytest.mark.parametrize("num_kv_heads", [NUM_QUERY_HEADS, 2, 1], ids=["MHA", "GQA", "MQA"])
@pytest.mark.parametrize("variant", list(VARIANTS), ids=list(VARIANTS))
def test_dot_product_attention_variants(backend, dtype, variant, num_kv_heads, implementation):
    queries = _normal((B, NUM_QUERY_HEADS, T, DEPTH), 30)
    keys = _normal((B, num_kv_heads, S, DEPTH), 31)
    values = _normal((B, num_kv_heads, S, VALUE_SIZE), 32)
    expected = np_scoring.dot_product_attention(queries, keys, values,
                                                **_variant_arguments(VARIANTS[variant], np))
    got = jax_scoring.dot_product_attention(
        *(jnp.asarray(a, dtype) for a in (queries, keys, values)),
        implementation=implementation, **_variant_arguments(VARIANTS[variant], jnp))
    for g, e in zip(got, expected):
        _assert_matches(g, e, dtype, backend)
    weights = jax_scoring.dot_product_attention_weights(
        *(jnp.asarray(a, dtype) for a in (queries, keys)), **_variant_arguments(VARIANTS[variant], jnp))
    _assert_matches(weights, expected[1], dtype, backend)


@pytest.mark.parametrize("implementation", ["plain", "chunked"])
@pytest.mark.parametrize("lens", [None, 3, (1, 0, 5, 2)], ids=["no lens", "lens ()", "lens (T,)"])
def test_dot_product_attention_unbatched(backend, dtype, lens, implementation):
    """Unbatched (T, d), (S, d), (S, v) give the batched result without its batch axis."""
    queries, keys, values = (a[0] for a in _dot_inputs((B,)))
    arguments = {"local_window_size": (2, 1), "mask": np.random.default_rng(4).random((T, S)) < 0.8}
    np_lens = None if lens is None else np.asarray(lens, np.int32)
    expected = np_scoring.dot_product_attention(queries, keys, values, np_lens, **arguments)
    batched = np_scoring.dot_product_attention(
        queries[None], keys[None], values[None], None if lens is None else np_lens[None], **arguments)
    for e, b in zip(expected, batched):
        np.testing.assert_array_equal(e, b[0])
    got = jax_scoring.dot_product_attention(
        *(jnp.asarray(a, dtype) for a in (queries, keys, values)),
        None if lens is None else jnp.asarray(np_lens), implementation=implementation,
        **{**arguments, "mask": jnp.asarray(arguments["mask"])})
    for g, e in zip(got, expected):
        _assert_matches(g, e, dtype, backend)


def test_dot_product_module_variants(backend, dtype):
    """The NNX module (dropout off) takes the same variants as the function."""
    queries = _normal((B, NUM_QUERY_HEADS, T, DEPTH), 33)
    keys, values = _normal((B, 2, S, DEPTH), 34), _normal((B, 2, S, VALUE_SIZE), 35)
    variant = VARIANTS["everything"]
    expected, _ = np_scoring.dot_product_attention(queries, keys, values,
                                                   **_variant_arguments(variant, np))
    got = jax_scoring.DotProductAttention()(*(jnp.asarray(a, dtype) for a in (queries, keys, values)),
                                            **_variant_arguments(variant, jnp))
    _assert_matches(got, expected, dtype, backend)
