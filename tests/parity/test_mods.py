"""NumPy reference vs JAX for mask mods, score mods, attention sinks and the log-sum-exp.

Every built-in mod of :mod:`jax_attention.nn.mods` and :mod:`reference_numpy.mods` (the same
names and arguments), their combinations, plain-function mods and sinks, through
``dot_product_attention`` (``return_lse=True``) on three JAX paths — the plain one, the chunked
one (``implementation="chunked"``, whose weights are the plain path's) and the memory-efficient
kernel with small chunks (``query_chunk_size=2, key_chunk_size=3``: ``T = 5`` and ``S = 7`` are
not multiples, and the mask mods' block skipping is exercised) — and through
``dot_product_attention_weights``, against the one float64 NumPy path. Every backend JAX sees;
float64 to 1e-12 and float32 (full matmul precision) to 1e-5 relative.

A case is a function ``(mods module, array module, arrays) -> keyword arguments``, run with
:mod:`reference_numpy.mods` and NumPy arrays on one side and with :mod:`jax_attention.nn.mods`
on traced arrays on the other: the JAX mods are built inside the jitted program, their arrays
being its inputs. Queries have ``N = 4`` heads and, in most cases, keys and values ``N_kv = 2``
(grouped-query attention, so ``h`` must be the query head); some cases use ``N_kv = N``, no head
axis, or self-attention (``T = S``). The cases of a path compile as three programs per dtype —
masks, score mods, sinks (:func:`tests.parity._support.together`) — and
``implementation="chunked"`` (the kernel of the memory-efficient path again, with its default
chunks) runs a few of them. The mods modules' argument checks are compared too.
"""

from __future__ import annotations

import functools
import re

import jax.numpy as jnp
import numpy as np
import pytest

from jax_attention.nn import efficient as jax_efficient
from jax_attention.nn import mods as jax_mods
from jax_attention.nn import multihead as jax_mh
from jax_attention.nn import scoring as jax_scoring
from reference_numpy import mods as np_mods
from reference_numpy import multihead as np_mh
from reference_numpy import scoring as np_scoring
from tests.parity._support import assert_matches, call, together

B, N, N_KV, T, S = 2, 4, 2, 5, 7
DEPTH, VALUE_SIZE = 4, 3
Q_CHUNK, K_CHUNK = 2, 3


def _arrays() -> dict:
    """Every array a case may read, NumPy float64 or int32 or bool."""
    rng = np.random.default_rng(0)
    normal = rng.normal
    return {
        # queries, keys and values of the layouts (LAYOUTS)
        "q_heads": 2.0 * normal(size=(B, N, T, DEPTH)),
        "q_self": 2.0 * normal(size=(B, N, S, DEPTH)),
        "q_flat": 2.0 * normal(size=(B, T, DEPTH)),
        "k_gqa": normal(size=(B, N_KV, S, DEPTH)), "v_gqa": normal(size=(B, N_KV, S, VALUE_SIZE)),
        "k_mha": normal(size=(B, N, S, DEPTH)), "v_mha": normal(size=(B, N, S, VALUE_SIZE)),
        "k_flat": normal(size=(B, S, DEPTH)), "v_flat": normal(size=(B, S, VALUE_SIZE)),
        # lengths and ids (0 and S present: empty and full rows)
        "lens": np.array([0, 5], np.int32),
        "lens_bt": np.array([[3, 0, 7, 1, 4], [7, 2, 5, 6, 0]], np.int32),
        "kv_lens": np.array([4, 7], np.int32),
        "q_lens": np.array([2, 5], np.int32),
        "q_ids": np.array([[0, 0, 1, 1, 2], [1, 1, 1, 2, 3]], np.int32),
        "kv_ids": np.array([[0, 1, 1, 1, 2, 2, 0], [1, 2, 2, 2, 2, 0, 0]], np.int32),
        "self_ids": np.array([[1, 1, 1, 2, 2, 3, 3], [1, 2, 2, 2, 2, 0, 0]], np.int32),
        "prefix": np.array([2, 4], np.int32),
        "prefix_scalar": np.array(3, np.int32),
        "keep": rng.random((B, 1, T, S)) < 0.7,
        "keep_heads": rng.random((1, N, T, S)) < 0.6,
        # score mods' tables and the sinks
        "bias_table": normal(size=(B, N, T, S)),
        "bias_broadcast": normal(size=(1, N, 1, S)),
        "slopes": rng.uniform(0.1, 1.0, size=(N,)),
        "clipped": normal(size=(5, N)),
        "clipped_shared": normal(size=(5, 1)),
        "t5_bidirectional": normal(size=(8, N)),
        "t5_causal": normal(size=(6, N)),
        "sinks": normal(size=(N,)),
        "sink": np.array(0.7),
    }


ARRAYS = _arrays()

#: (queries, keys, values) of each layout: grouped heads, one key/value head per query head,
#: no head axis, and grouped self-attention (T = S).
LAYOUTS = {
    "gqa": ("q_heads", "k_gqa", "v_gqa"),
    "mha": ("q_heads", "k_mha", "v_mha"),
    "flat": ("q_flat", "k_flat", "v_flat"),
    "self": ("q_self", "k_gqa", "v_gqa"),
}


def _plain_mask(b, h, q, kv):
    """A mask mod as a plain function, the same text for NumPy and JAX arrays."""
    return (q + kv + h + b) % 3 != 0


# name -> (layout, case): case(m, xp, a) gives the keyword arguments of the attention functions,
# m the mods module, xp the array module, a the arrays (NumPy, or traced JAX).
MASK_CASES = {
    "causal_lower_right": ("gqa", lambda m, xp, a: dict(mask_mod=m.causal(offset=S - T))),
    "causal_and_window": ("gqa", lambda m, xp, a: dict(
        mask_mod=m.and_masks(m.causal(), m.sliding_window(3)))),
    "valid_lengths_B": ("gqa", lambda m, xp, a: dict(mask_mod=m.valid_lengths(a["lens"]))),
    "valid_lengths_BT_clipped_shared": ("flat", lambda m, xp, a: dict(
        mask_mod=m.valid_lengths(a["lens_bt"]),
        score_mod=m.clipped_relative_bias(a["clipped_shared"]))),
    "padding_kv_and_q": ("gqa", lambda m, xp, a: dict(
        mask_mod=m.padding(a["kv_lens"], a["q_lens"]))),
    "padding_kv_and_plain_function": ("gqa", lambda m, xp, a: dict(
        mask_mod=m.and_masks(m.padding(a["kv_lens"]), _plain_mask))),
    "segments_and_causal_self": ("self", lambda m, xp, a: dict(
        mask_mod=m.and_masks(m.segment_ids(a["self_ids"]), m.causal()))),
    "segments_distinct_padding_id": ("gqa", lambda m, xp, a: dict(
        mask_mod=m.segment_ids(a["q_ids"], a["kv_ids"], padding_id=0))),
    "prefix_lm": ("gqa", lambda m, xp, a: dict(mask_mod=m.prefix_lm(a["prefix"]))),
    "chunked_local_and_causal_self": ("self", lambda m, xp, a: dict(
        mask_mod=m.and_masks(m.chunked_local(4), m.causal()))),
    "window_or_chunks": ("mha", lambda m, xp, a: dict(
        mask_mod=m.or_masks(m.sliding_window(1, 2), m.chunked_local(3)))),
    "longformer_global_tokens": ("gqa", lambda m, xp, a: dict(
        mask_mod=m.or_masks(m.sliding_window(1, 1), m.global_tokens(2)))),
    "dense_masks": ("gqa", lambda m, xp, a: dict(
        mask_mod=m.and_masks(m.dense_mask(a["keep"]), m.dense_mask(a["keep_heads"])))),
    "with_the_mask_arguments": ("gqa", lambda m, xp, a: dict(
        valid_lens=a["lens_bt"], is_causal=True, local_window_size=(2, 1),
        mask_mod=m.chunked_local(4))),
}
SCORE_CASES = {
    "logit_softcap_then_alibi": ("gqa", lambda m, xp, a: dict(
        logit_softcap=1.5, score_mod=m.alibi(N), scale=0.8)),
    "biases": ("gqa", lambda m, xp, a: dict(
        score_mod=m.compose_score_mods(m.bias(a["bias_table"]), m.bias(a["bias_broadcast"])),
        mask_mod=m.causal(offset=1))),
    "clipped_relative_bias": ("gqa", lambda m, xp, a: dict(
        score_mod=m.clipped_relative_bias(a["clipped"]))),
    "t5_bidirectional": ("gqa", lambda m, xp, a: dict(
        score_mod=m.t5_relative_bias(a["t5_bidirectional"], max_distance=6))),
    "t5_causal": ("gqa", lambda m, xp, a: dict(
        score_mod=m.t5_relative_bias(a["t5_causal"], bidirectional=False, max_distance=5),
        mask_mod=m.causal(offset=S - T))),
    "alibi_then_softcap": ("gqa", lambda m, xp, a: dict(
        score_mod=m.compose_score_mods(m.alibi(N), m.softcap(3.0)))),
    "slopes_then_plain_function": ("mha", lambda m, xp, a: dict(
        score_mod=m.compose_score_mods(
            m.alibi(slopes=a["slopes"]),
            lambda s, b, h, q, kv: xp.where(kv > q, s * 0.5, s - 1.0)),
        mask_mod=m.causal(offset=S - T))),
}
SINK_CASES = {
    "sinks": ("gqa", lambda m, xp, a: dict(sinks=a["sinks"])),
    "sink_scalar_window": ("gqa", lambda m, xp, a: dict(
        sinks=a["sink"], mask_mod=m.sliding_window(2))),
    "sink_scalar_prefix_lm_flat": ("flat", lambda m, xp, a: dict(
        sinks=a["sink"], mask_mod=m.prefix_lm(a["prefix_scalar"]))),
    "sinks_padding": ("gqa", lambda m, xp, a: dict(
        sinks=a["sinks"], mask_mod=m.padding(a["kv_lens"], a["q_lens"]))),
    "sinks_empty_rows_alibi": ("mha", lambda m, xp, a: dict(
        sinks=a["sinks"], valid_lens=a["lens"], score_mod=m.alibi(N))),
    "sinks_segments_t5_self": ("self", lambda m, xp, a: dict(
        sinks=a["sinks"], mask_mod=m.and_masks(m.segment_ids(a["self_ids"], padding_id=0),
                                               m.causal()),
        score_mod=m.t5_relative_bias(a["t5_bidirectional"], max_distance=6))),
}
SECTIONS = {"masks": MASK_CASES, "scores": SCORE_CASES, "sinks": SINK_CASES}
CASES = {**MASK_CASES, **SCORE_CASES, **SINK_CASES}
# implementation="chunked" runs the memory-efficient kernel too (its default chunks: one block
# here): a few cases check that scoring hands every variant over to it.
CHUNKED_CASES = ["padding_kv_and_q", "with_the_mask_arguments", "logit_softcap_then_alibi",
                 "sink_scalar_prefix_lm_flat", "sinks_segments_t5_self"]
WEIGHTS_CASES = ["segments_distinct_padding_id", "dense_masks", "logit_softcap_then_alibi",
                 "sinks_padding", "sink_scalar_prefix_lm_flat"]
PATHS = {"plain": list(CASES), "chunked": CHUNKED_CASES, "efficient": list(CASES)}


def _cast(dtype, arrays: dict) -> dict:
    """The arrays with the floats in ``dtype`` (integers and booleans as they are)."""
    return {name: np.asarray(a, dtype) if np.issubdtype(a.dtype, np.floating) else a
            for name, a in arrays.items()}


def _inputs_of(case: str, arrays: dict):
    return [arrays[name] for name in LAYOUTS[CASES[case][0]]]


def _jax_attention(arrays, *, case: str, path: str):
    """One case on one JAX path, its mods built here from the (traced) arrays:
    ``(output, weights, lse)``, ``(output, lse)`` for the memory-efficient kernel, or the
    weights."""
    queries, keys, values = _inputs_of(case, arrays)
    kwargs = CASES[case][1](jax_mods, jnp, arrays)
    if path == "weights":
        return jax_scoring.dot_product_attention_weights(queries, keys, **kwargs)
    if path == "efficient":
        return jax_efficient.dot_product_attention(
            queries, keys, values, query_chunk_size=Q_CHUNK, key_chunk_size=K_CHUNK,
            return_lse=True, **kwargs)
    # The chunked path asks by jax.nn's name for the log-sum-exp, the plain one by ours.
    flag = {"return_residual" if path == "chunked" else "return_lse": True}
    return jax_scoring.dot_product_attention(queries, keys, values, implementation=path,
                                             **flag, **kwargs)


@functools.cache
def _reference(case: str):
    """``(output, weights, lse)`` of the float64 NumPy reference."""
    queries, keys, values = _inputs_of(case, ARRAYS)
    kwargs = CASES[case][1](np_mods, np, ARRAYS)
    return np_scoring.dot_product_attention(queries, keys, values, return_lse=True, **kwargs)


def _group_of(path: str, cases):
    """The group (:func:`tests.parity._support.together`) of ``cases`` on ``path``: programs of
    about ten cases rather than one of them all, so that an xdist worker that runs some of the
    tests compiles fewer programs than all."""
    def calls(dtype):
        arrays = _cast(dtype, ARRAYS)
        return {case: call(_jax_attention, arrays, case=case, path=path) for case in cases}
    return calls


def _extra_calls(dtype):
    """The weights function's calls and multi-head attention's."""
    arrays = _cast(dtype, ARRAYS)
    calls = {case: call(_jax_attention, arrays, case=case, path="weights")
             for case in WEIGHTS_CASES}
    calls["multi-head"] = call(_jax_multi_head, _cast(dtype, _mh_inputs()))
    return calls


GROUPS = {(path, section): _group_of(path, list(cases))
          for path in ("plain", "efficient") for section, cases in SECTIONS.items()}
GROUPS["chunked"] = _group_of("chunked", CHUNKED_CASES)
GROUPS["extra"] = _extra_calls


def _group(case: str, path: str):
    if path == "chunked":
        return GROUPS["chunked"]
    return GROUPS[path, next(name for name, cases in SECTIONS.items() if case in cases)]


PATH_CASES = [(case, path) for path, cases in PATHS.items() for case in cases]


@pytest.mark.parametrize("case, path", PATH_CASES, ids=[f"{p}-{c}" for c, p in PATH_CASES])
def test_attention(backend, dtype, case, path):
    expected = _reference(case)
    got = together(_group(case, path), case, backend, dtype)
    if path == "efficient":  # no weights
        expected = (expected[0], expected[2])
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert_matches(g, e, dtype, backend)


@pytest.mark.parametrize("case", WEIGHTS_CASES)
def test_attention_weights(backend, dtype, case):
    queries, keys, _ = _inputs_of(case, ARRAYS)
    kwargs = CASES[case][1](np_mods, np, ARRAYS)
    expected = np_scoring.dot_product_attention_weights(queries, keys, **kwargs)
    np.testing.assert_array_equal(expected, _reference(case)[1])
    assert_matches(together(GROUPS["extra"], case, backend, dtype), expected, dtype,
                   backend)


def test_reference_lse_and_sinks_by_definition():
    """The reference's own log-sum-exp and sink, written out for one row: ``lse = log(sum_s
    exp(score_s) + exp(sink))`` over the attended keys, and the weights ``exp(score - lse)``."""
    queries, keys, values = (ARRAYS[n] for n in LAYOUTS["mha"])
    lens = ARRAYS["lens"]
    output, weights, lse = np_scoring.dot_product_attention(
        queries, keys, values, lens, sinks=ARRAYS["sinks"], return_lse=True)
    scores = np.einsum("...tq,...sq->...ts", queries, keys) / np.sqrt(DEPTH)
    b, h, t = 1, 2, 3
    row = scores[b, h, t, :lens[b]]
    expected = np.log(np.exp(row).sum() + np.exp(ARRAYS["sinks"][h]))
    np.testing.assert_allclose(lse[b, h, t], expected, rtol=1e-14)
    np.testing.assert_allclose(weights[b, h, t, :lens[b]], np.exp(row - expected), rtol=1e-13)
    np.testing.assert_array_equal(weights[0], 0)  # row 0 attends nothing: the sink takes all
    np.testing.assert_array_equal(output[0], 0)
    np.testing.assert_array_equal(lse[0], np.broadcast_to(ARRAYS["sinks"][:, None], (N, T)))


# --------------------------------------------------------------------------- multi-head


D_MODEL = 8


def _mh_params():
    rng = np.random.default_rng(3)
    head = D_MODEL // N
    return {"W_q": rng.normal(size=(D_MODEL, D_MODEL)) / np.sqrt(D_MODEL),
            "W_k": rng.normal(size=(D_MODEL, N_KV * head)) / np.sqrt(D_MODEL),
            "W_v": rng.normal(size=(D_MODEL, N_KV * head)),
            "W_o": rng.normal(size=(D_MODEL, D_MODEL)), "b_o": rng.normal(size=(D_MODEL,))}


def _mh_inputs():
    rng = np.random.default_rng(4)
    return {"X": rng.normal(size=(B, S, D_MODEL)), **_mh_params(),
            "q_lens": ARRAYS["q_lens"], "kv_lens": ARRAYS["kv_lens"],
            "table": ARRAYS["clipped"], "sinks": ARRAYS["sinks"]}


def _multi_head(module, m, inputs):
    params = {name: inputs[name] for name in ("W_q", "W_k", "W_v", "W_o", "b_o")}
    return module.multi_head_attention(
        params, inputs["X"], inputs["X"], inputs["X"], num_heads=N, num_kv_heads=N_KV,
        mask_mod=m.and_masks(m.padding(inputs["kv_lens"], inputs["q_lens"]), m.causal()),
        score_mod=m.clipped_relative_bias(inputs["table"]), sinks=inputs["sinks"])


def _jax_multi_head(inputs):
    return _multi_head(jax_mh, jax_mods, inputs)


def test_multi_head_attention_mods_and_sinks(backend, dtype):
    """Grouped multi-head attention with a mask mod, a score mod and sinks: the mods see the
    heads ``(B, N, T, S)``."""
    expected = _multi_head(np_mh, np_mods, _mh_inputs())
    got = together(GROUPS["extra"], "multi-head", backend, dtype)
    for g, e in zip(got, expected):
        assert_matches(g, e, dtype, backend)


# --------------------------------------------------------------------------- argument checks


def _bad_arguments(m, xp):
    """Calls that both mods modules refuse, with the exception and a word of its message."""
    ints, floats = xp.zeros((B, T), xp.int32), xp.zeros((B, 1, T, S), xp.float32)
    return [
        (lambda: m.sliding_window(-1), ValueError, "left"),
        (lambda: m.sliding_window(1, 1.5), TypeError, "right"),
        (lambda: m.chunked_local(0), ValueError, "chunk_size"),
        (lambda: m.valid_lengths(floats[0, 0]), ValueError, "valid_lens"),
        (lambda: m.padding(ints), ValueError, "kv_lens"),
        (lambda: m.segment_ids(ints, xp.zeros((B + 1, S), xp.int32)), ValueError, "same B"),
        (lambda: m.prefix_lm(floats), ValueError, "prefix_lens"),
        (lambda: m.dense_mask(ints), TypeError, "keep"),
        (lambda: m.softcap(0.0), ValueError, "cap"),
        (lambda: m.bias(ints), TypeError, "table"),
        (lambda: m.alibi(), TypeError, "num_heads"),
        (lambda: m.alibi_slopes(0), ValueError, "num_heads"),
        (lambda: m.clipped_relative_bias(xp.zeros((4, N), xp.float32)), ValueError, "2k + 1"),
        (lambda: m.t5_relative_bias(floats[0, 0], max_distance=0), ValueError, "max_distance"),
        (lambda: m.and_masks(), ValueError, "at least one"),
        (lambda: m.as_mask_mod(3), TypeError, "mask_mod"),
        (lambda: m.as_score_mod("alibi"), TypeError, "score_mod"),
        (lambda: m.mask_from_mod(lambda b, h, q, kv: q - kv, (B, N, T, S)), TypeError,
         "booleans"),
    ]


@pytest.mark.parametrize("index", range(len(_bad_arguments(np_mods, np))))
def test_the_same_arguments_are_refused(index):
    for m, xp in ((np_mods, np), (jax_mods, jnp)):
        function, error, word = _bad_arguments(m, xp)[index]
        with pytest.raises(error, match=re.escape(word)):
            function()


@pytest.mark.parametrize("sinks, error", [(np.zeros((N + 1,)), ValueError),
                                          (np.zeros((N,), np.int32), TypeError)])
def test_the_same_sinks_are_refused(sinks, error):
    queries, keys, values = (ARRAYS[name].astype(np.float32) for name in LAYOUTS["gqa"])
    for scoring in (np_scoring, jax_scoring):
        with pytest.raises(error, match="sinks"):
            scoring.dot_product_attention(queries, keys, values, sinks=sinks)
