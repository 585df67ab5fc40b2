"""The canonical cases: built from fixed seeds, computed by :mod:`reference_numpy` in float64.

:func:`generate_cases` builds every case (inputs and parameters from ``np.random.default_rng``
with one fixed seed per case, outputs from the NumPy reference); :func:`save_cases` writes them to
one ``.npz`` file and :func:`load_cases` reads them back. :class:`Case`, the file's reader and
writer and :class:`CaseFileError` live in :mod:`jax_attention.conformance.casefile` and are
re-exported here; the file format is described in :mod:`jax_attention.conformance`.

Shapes are small (a few thousand numbers for the largest model) so that the file stays well under
300 KB and a run takes seconds; the edge cases are what matter: valid lengths ``(B,)`` and
``(B, T)``, boolean masks, causal masks, score biases, fully masked rows (all-zero weights, the
documented choice), NaN and Inf in padding, scores in the hundreds (beyond where exp overflows
in float32 and float64: the softmax must subtract the row's maximum), distinct query/key/value
sizes, multi-layer GRUs with and without the hidden bias of the candidate gate; and the variants
of scaled dot-product and multi-head attention: a ``scale``, sliding windows
(``local_window_size``, with and without the causal mask, one leaving a row with no key), logit
soft-capping, grouped-query and multi-query heads, value heads of their own size, unbatched
inputs. Appended after them (the cases never change once shipped: new ones come last), those of
``mods.dot_product_attention``: every mask and score mod, their combinators, sinks (_mods_cases).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from jax_attention.conformance._draws import (Draw, attention_params, bahdanau_params,
                                              decoder_block_params, encoder_block_params,
                                              ffn_params, gqa_params, gru_params, heads, lens,
                                              mha_params, norm_params, qkv, transformer_params)
from jax_attention.conformance._mods_cases import MODS_FUNCTION, MODS_BUILDERS
from jax_attention.conformance.casefile import (
    DEFAULT_CASES_PATH,
    DEFAULT_TOLERANCES,
    FORMAT,
    FORMAT_VERSION,
    TAGS,
    Case,
    CaseFileError,
    load_cases,
    write_cases,
)
from jax_attention.conformance.functions import FUNCTIONS, call
from jax_attention.params import flatten_params, unflatten_params

__all__ = [
    "Case",
    "CaseFileError",
    "FORMAT",
    "FORMAT_VERSION",
    "DEFAULT_TOLERANCES",
    "DEFAULT_CASES_PATH",
    "TAGS",
    "generate_cases",
    "save_cases",
    "load_cases",
    "flatten_params",
    "unflatten_params",
]

#: Integer outputs (bucket ids) must agree exactly in every dtype.
EXACT = {"float64": {"rtol": 0.0, "atol": 0.0}, "float32": {"rtol": 0.0, "atol": 0.0}}


# --------------------------------------------------------------------------- the cases
# Each builder returns a Case without outputs; generate_cases() computes them with the reference.
# Sizes: B batch, T queries, S keys, all different so that a swapped axis cannot pass.

_BUILDERS: list[Callable[[], Case]] = []


def _case(builder: Callable[[], Case]) -> Callable[[], Case]:
    _BUILDERS.append(builder)
    return builder


# masking (d2l §10.7, §11.3.2)

@_case
def _sequence_mask() -> Case:
    draw = Draw(101)
    return Case("sequence_mask.fill", "masking.sequence_mask", {"value": -1.0},
                "rows past their valid length (0, 2 and all 5 kept) filled with -1",
                {"X": draw.normal(3, 5), "valid_len": lens(0, 2, 5)}, {})


@_case
def _masked_softmax_lens_b() -> Case:
    draw = Draw(102)
    return Case("masked_softmax.valid_lens_B", "masking.masked_softmax", {},
                "the book's example: one valid length per sequence, shared by its queries",
                {"X": draw.normal(2, 2, 4), "valid_lens": lens(2, 3)}, {})


@_case
def _masked_softmax_lens_bt() -> Case:
    draw = Draw(103)
    return Case("masked_softmax.valid_lens_BT", "masking.masked_softmax", {},
                "one valid length per query (B, T)",
                {"X": draw.normal(2, 3, 5), "valid_lens": lens([1, 3, 5], [2, 4, 1])}, {})


@_case
def _masked_softmax_mask() -> Case:
    draw = Draw(104)
    return Case("masked_softmax.bool_mask", "masking.masked_softmax", {},
                "a boolean mask (B, T, S), True = attend",
                {"X": draw.normal(2, 3, 5), "mask": draw.mask(2, 3, 5)}, {})


@_case
def _masked_softmax_empty_row() -> Case:
    draw = Draw(105)
    return Case("masked_softmax.fully_masked_row", "masking.masked_softmax", {},
                "valid lengths (B, T) with zeros: those rows get all-zero weights",
                {"X": draw.normal(2, 3, 4), "valid_lens": lens([0, 2, 4], [3, 0, 1])}, {},
                tags=("fully_masked_row",))


@_case
def _masked_softmax_nan() -> Case:
    draw = Draw(106)
    X = draw.normal(2, 3, 5)
    X[0, :, 3:] = np.nan
    X[1, :, 2] = np.inf
    X[1, :, 3] = -np.inf
    X[1, :, 4] = np.nan
    return Case("masked_softmax.nan_in_padding", "masking.masked_softmax", {},
                "NaN, +Inf and -Inf in masked scores must not reach the valid weights",
                {"X": X, "valid_lens": lens(3, 2)}, {}, tags=("nan_in_padding",))


# Scores far beyond where exp overflows (float32 past 88.7, float64 past 709.8): a softmax that
# does not subtract the row's maximum gives inf / inf = NaN (or 0 / 0 for rows far below zero),
# in both dtypes. Each case has rows whose every score lies beyond 709.8 or below -745 (checked
# by _check_tags); within a row the scores differ by units, so the weights are spread, not
# one-hot. The dot-product and multi-head cases use heads of size 16 (scale 1/4) and data whose
# scores are exact in float32 (integers and multiples of 1/16), so that a float32 run measures
# the softmax, not the rounding of a score of 900 (an ulp of 6e-5, which would move a weight by
# as much); a built-in that scales queries and keys by sqrt(scale) each scales them by 1/2.

@_case
def _masked_softmax_large() -> Case:
    draw = Draw(107)
    offsets = np.array([[800.0, -800.0, 300.0], [150.0, 1500.0, -400.0]])
    return Case("masked_softmax.large_scores", "masking.masked_softmax", {},
                "scores around 800, -800, 300, 150, 1500 and -400 (one row each), a few units "
                "apart: exp overflows in float32 and float64 unless the row's maximum is "
                "subtracted; valid lengths (B, T)",
                {"X": offsets[..., None] + draw.normal(2, 3, 5, scale=2.0),
                 "valid_lens": lens([5, 3, 4], [2, 5, 1])}, {}, tags=("large_scores",))


# attention pooling (d2l §11.2)

@_case
def _nadaraya_watson_shared() -> Case:
    draw = Draw(201)
    keys = np.sort(draw.rng.uniform(0, 5, size=8))
    return Case("nadaraya_watson.shared_keys", "attention_pooling.nadaraya_watson", {},
                "Gaussian kernel, w = 1: every query sees the same keys (Q,) vs (K,)",
                {"queries": np.linspace(0, 5, 6), "keys": keys,
                 "values": 2 * np.sin(keys) + keys ** 0.8 + draw.normal(8, scale=0.5)},
                {"w": np.asarray(1.0)})


@_case
def _nadaraya_watson_loo() -> Case:
    draw = Draw(202)
    x = np.sort(draw.rng.uniform(0, 5, size=6))
    y = 2 * np.sin(x) + x ** 0.8 + draw.normal(6, scale=0.5)
    others = np.array([[j for j in range(6) if j != i] for i in range(6)])
    return Case("nadaraya_watson.leave_one_out", "attention_pooling.nadaraya_watson", {},
                "the book's training set-up: keys and values per query (Q, K), learned w = 2.7",
                {"queries": x, "keys": x[others], "values": y[others]}, {"w": np.asarray(2.7)})


# scoring (d2l §11.3): B = 2, T = 3, S = 5, query/key size 4; values of size 4 (jax.nn and Flax
# need the query size there), once of size 6

@_case
def _dot_plain() -> Case:
    return Case("dot_product_attention.plain", "scoring.dot_product_attention", {},
                "no mask", qkv(Draw(301)), {})


@_case
def _dot_value_size() -> Case:
    return Case("dot_product_attention.value_size_6", "scoring.dot_product_attention", {},
                "values of size 6, queries and keys of size 4; valid lengths (B,)",
                {**qkv(Draw(308), value_size=6), "valid_lens": lens(3, 5)}, {})


@_case
def _dot_lens_b() -> Case:
    return Case("dot_product_attention.valid_lens_B", "scoring.dot_product_attention", {},
                "valid lengths (B,) = (2, 5)", {**qkv(Draw(302)), "valid_lens": lens(2, 5)}, {})


@_case
def _dot_lens_bt() -> Case:
    return Case("dot_product_attention.valid_lens_BT", "scoring.dot_product_attention", {},
                "valid lengths per query (B, T), none zero",
                {**qkv(Draw(303)), "valid_lens": lens([1, 2, 3], [5, 4, 1])}, {})


@_case
def _dot_mask() -> Case:
    draw = Draw(304)
    return Case("dot_product_attention.bool_mask", "scoring.dot_product_attention", {},
                "a boolean mask (B, T, S), every row keeping a key",
                {**qkv(draw), "mask": draw.mask(2, 3, 5)}, {})


@_case
def _dot_causal() -> Case:
    return Case("dot_product_attention.causal", "scoring.dot_product_attention",
                {"is_causal": True}, "causal mask with T = 3 < S = 5 (key s <= query t)",
                qkv(Draw(305)), {})


@_case
def _dot_bias() -> Case:
    draw = Draw(306)
    return Case("dot_product_attention.bias_and_lens", "scoring.dot_product_attention", {},
                "a score bias (B, T, S) added before the softmax, with valid lengths (B,)",
                {**qkv(draw), "valid_lens": lens(4, 2), "bias": draw.normal(2, 3, 5)}, {})


@_case
def _dot_empty_row() -> Case:
    return Case("dot_product_attention.fully_masked_row", "scoring.dot_product_attention", {},
                "valid lengths (B, T) with a zero: that query's weights and output are zero",
                {**qkv(Draw(307)), "valid_lens": lens([2, 0, 5], [1, 3, 4])}, {},
                tags=("fully_masked_row",))


@_case
def _dot_large() -> Case:
    draw = Draw(309)
    d = 16
    # Keys: a shared integer base plus perturbations of a few 1/16; queries: integer multiples of
    # the base, of either sign, plus integer noise. Scores (1/4 q.k) of about 900, -860, 380,
    # 1060, 220 and -550 per row, differing by units between keys; all exact in float32.
    base = draw.rng.integers(8, 17, size=d).astype(np.float64)
    keys = base + draw.rng.integers(-2, 3, size=(2, 5, d)) / 16
    factors = np.array([[1.0, -1.0, 0.4], [1.2, 0.2, -0.6]])
    queries = (np.round(factors[..., None] * base * 1.5)
               + draw.rng.integers(-2, 3, size=(2, 3, d))).astype(np.float64)
    return Case("dot_product_attention.large_scores", "scoring.dot_product_attention", {},
                "scores of about 900, -860, 380, 1060, 220 and -550 (head size 16), a few units "
                "apart, exact in float32: exp overflows unless the row's maximum is subtracted; "
                "valid lengths (B,) = (4, 5)",
                {"queries": queries, "keys": keys, "values": draw.normal(2, 5, d),
                 "valid_lens": lens(4, 5)}, {}, tags=("large_scores",))


# The variants of scaled dot-product attention: scale, sliding windows, soft-capping,
# grouped-query (and multi-query) heads, unbatched inputs. Windows are stored as [left, right]
# (JSON has no tuples; the functions take a list as well).

@_case
def _dot_scale() -> Case:
    return Case("dot_product_attention.scale", "scoring.dot_product_attention", {"scale": 0.3},
                "scale = 0.3 instead of 1 / sqrt(d) = 0.5; valid lengths (B,)",
                {**qkv(Draw(321)), "valid_lens": lens(4, 5)}, {})


@_case
def _dot_window() -> Case:
    return Case("dot_product_attention.local_window", "scoring.dot_product_attention",
                {"local_window_size": [1, 2]},
                "sliding window (left, right) = (1, 2): query t attends keys t-1 .. t+2; T = 5, "
                "S = 6, valid lengths (B,) = (6, 4)",
                {**qkv(Draw(322), T=5, S=6), "valid_lens": lens(6, 4)}, {})


@_case
def _dot_causal_window() -> Case:
    return Case("dot_product_attention.causal_local_window", "scoring.dot_product_attention",
                {"is_causal": True, "local_window_size": [2, 1]},
                "causal with window (2, 1): keys t-2 .. t (the causal mask makes the right side "
                "moot); valid lengths per query (B, T)",
                {**qkv(Draw(323), T=5, S=6),
                 "valid_lens": lens([1, 2, 3, 4, 5], [5, 1, 2, 3, 6])}, {})


@_case
def _dot_softcap() -> Case:
    draw = Draw(324)
    inputs = qkv(draw)
    inputs["queries"] = 3.0 * inputs["queries"]  # scores of a few units: the cap of 2 bites
    return Case("dot_product_attention.logit_softcap", "scoring.dot_product_attention",
                {"logit_softcap": 2.0},
                "scores s -> 2 tanh(s / 2) (queries scaled by 3, so the cap matters), then a "
                "score bias (B, T, S), valid lengths (B,)",
                {**inputs, "valid_lens": lens(5, 3), "bias": draw.normal(2, 3, 5, scale=0.5)}, {})


@_case
def _dot_gqa() -> Case:
    draw = Draw(325)
    return Case("dot_product_attention.grouped_query", "scoring.dot_product_attention",
                {"is_causal": True},
                "grouped-query: queries (B, N=4, T, d), keys and values (B, N_kv=2, S, d), "
                "query head n uses key/value head n // 2; causal, valid lengths (B,), a score "
                "bias per head (B, N, T, S)",
                {**heads(draw, N=4, N_kv=2), "valid_lens": lens(2, 4),
                 "bias": draw.normal(2, 4, 3, 5, scale=0.5)}, {})


@_case
def _dot_mqa() -> Case:
    draw = Draw(326)
    return Case("dot_product_attention.multi_query", "scoring.dot_product_attention", {},
                "multi-query: queries (B, N=3, T, d), one key/value head (B, 1, S, d); valid "
                "lengths per query (B, T) and a boolean mask per head (B, N, T, S)",
                {**heads(draw, N=3, N_kv=1), "valid_lens": lens([2, 5, 4], [5, 3, 1]),
                 "mask": draw.mask(2, 3, 3, 5)}, {})


@_case
def _dot_unbatched() -> Case:
    draw = Draw(327)
    return Case("dot_product_attention.unbatched", "scoring.dot_product_attention",
                {"is_causal": True},
                "unbatched queries (T, d) = (4, 4), keys (6, 4), values (6, 4); one valid length "
                "() = 5 for every query; causal",
                {"queries": draw.normal(4, 4), "keys": draw.normal(6, 4),
                 "values": draw.normal(6, 4), "valid_lens": np.asarray(5, np.int32)}, {})


@_case
def _dot_window_empty_row() -> Case:
    return Case("dot_product_attention.window_fully_masked_row", "scoring.dot_product_attention",
                {"local_window_size": [1, 0]},
                "window (1, 0) with valid lengths (B,) = (2, 5): query 3 of sequence 0 may "
                "attend keys 2 and 3, both padding, so its weights and output are zero",
                {**qkv(Draw(328), T=4), "valid_lens": lens(2, 5)}, {},
                tags=("fully_masked_row",))


@_case
def _additive_lens() -> Case:
    draw = Draw(311)
    return Case("additive_attention.valid_lens_B", "scoring.additive_attention", {},
                "query size 3, key size 4, hidden 5; valid lengths (B,)",
                {**qkv(draw, query_size=3, value_size=6), "valid_lens": lens(2, 5)},
                {"W_q": draw.dense(3, 5), "W_k": draw.dense(4, 5), "w_v": draw.dense(5, 1)})


@_case
def _additive_empty() -> Case:
    draw = Draw(312)
    return Case("additive_attention.fully_masked_row", "scoring.additive_attention", {},
                "valid lengths (B,) = (0, 3): sequence 0 attends nothing",
                {**qkv(draw, query_size=3, value_size=6), "valid_lens": lens(0, 3)},
                {"W_q": draw.dense(3, 5), "W_k": draw.dense(4, 5), "w_v": draw.dense(5, 1)},
                tags=("fully_masked_row",))


# multi-head attention (d2l §11.5): B = 2, T = 3, S = 4, N = 2 heads, D = 8 (H = 4).
# Query size = D and one key/value size, the sizes the built-ins accept; one case with three
# different sizes.

@_case
def _mha_biases() -> Case:
    draw = Draw(401)
    return Case("multi_head_attention.biases", "multihead.multi_head_attention", {"num_heads": 2},
                "2 heads, projection biases, key/value size 6, no mask",
                qkv(draw, query_size=8, key_size=6, value_size=6, S=4), mha_params(draw))


@_case
def _mha_lens() -> Case:
    draw = Draw(402)
    return Case("multi_head_attention.valid_lens_B", "multihead.multi_head_attention",
                {"num_heads": 2}, "no biases (the book's bias=False), valid lengths (B,)",
                {**qkv(draw, query_size=8, key_size=6, value_size=6, S=4),
                 "valid_lens": lens(2, 4)}, mha_params(draw, biases=False))


@_case
def _mha_lens_bt() -> Case:
    draw = Draw(403)
    return Case("multi_head_attention.valid_lens_BT", "multihead.multi_head_attention",
                {"num_heads": 2}, "biases, valid lengths per query (B, T), none zero",
                {**qkv(draw, query_size=8, key_size=6, value_size=6, S=4),
                 "valid_lens": lens([1, 4, 2], [3, 3, 1])}, mha_params(draw))


@_case
def _mha_causal() -> Case:
    draw = Draw(404)
    X = draw.normal(2, 4, 8)
    return Case("multi_head_attention.causal_self", "multihead.multi_head_attention",
                {"num_heads": 2, "is_causal": True},
                "causal self-attention (X, X, X) with biases and valid lengths (B,)",
                {"queries": X, "keys": X, "values": X, "valid_lens": lens(4, 3)},
                mha_params(draw, key_size=8, value_size=8))


@_case
def _mha_empty() -> Case:
    draw = Draw(405)
    return Case("multi_head_attention.fully_masked_row", "multihead.multi_head_attention",
                {"num_heads": 2}, "valid lengths (B, T) with a zero: that query's output is b_o",
                {**qkv(draw, query_size=8, key_size=6, value_size=6, S=4),
                 "valid_lens": lens([2, 0, 4], [1, 3, 3])}, mha_params(draw),
                tags=("fully_masked_row",))


@_case
def _mha_sizes() -> Case:
    draw = Draw(406)
    return Case("multi_head_attention.distinct_sizes", "multihead.multi_head_attention",
                {"num_heads": 4}, "4 heads of size 2, query/key/value sizes 3, 5, 6 all different",
                {**qkv(draw, query_size=3, key_size=5, value_size=6, S=4),
                 "valid_lens": lens(3, 4)},
                mha_params(draw, query_size=3, key_size=5, value_size=6))


@_case
def _mha_large() -> Case:
    draw = Draw(407)
    rng = draw.rng
    N, H, D, k = 2, 16, 32, 6
    # Projected keys: a large integer bias b_k plus keys of a few 1/16 through an integer W_k;
    # projected queries: W_q a signed permutation, queries chosen so that each head's query is an
    # integer multiple (either sign) of that head's b_k plus integer noise. Scores exact in
    # float32, from -1100 to 1010, a few units apart within a row.
    b_k = rng.integers(8, 17, size=D).astype(np.float64)
    W_q = np.zeros((D, D))
    W_q[np.arange(D), rng.permutation(D)] = rng.choice([-1.0, 1.0], size=D)
    b_q = rng.integers(-1, 2, size=D).astype(np.float64)
    factors = np.array([[[1.5, 1.2], [-1.4, 0.3], [0.6, -1.6]],
                        [[1.3, -0.5], [0.35, 1.5], [-1.0, -1.2]]])  # (B, T, N)
    target = np.repeat(factors, H, axis=-1) * b_k + rng.integers(-1, 2, size=(2, 3, D))
    queries = np.round(target - b_q) @ W_q.T  # so that queries W_q + b_q = round(target)
    params = {"W_q": W_q, "W_k": rng.integers(-1, 2, size=(k, D)).astype(np.float64),
              "W_v": draw.dense(k, D), "W_o": draw.dense(D, D), "b_q": b_q, "b_k": b_k,
              "b_v": draw.normal(D, scale=0.3), "b_o": draw.normal(D, scale=0.3)}
    return Case("multi_head_attention.large_scores", "multihead.multi_head_attention",
                {"num_heads": N},
                "2 heads of size 16, biases, query size 32, key/value size 6: scores of -1100 .. "
                "1010 (a large key bias b_k), a few units apart, exact in float32: exp overflows "
                "unless the row's maximum is subtracted; valid lengths (B,) = (3, 4)",
                {"queries": queries, "keys": rng.integers(-2, 3, size=(2, 4, k)) / 16,
                 "values": draw.normal(2, 4, k), "valid_lens": lens(3, 4)}, params,
                tags=("large_scores",))


# Grouped-query heads (W_k (k, N_kv H), W_v (v, N_kv H_v)), a value head size H_v other than
# the key head size H (W_o (N H_v, E)), a sliding window and a scale.

@_case
def _mha_gqa() -> Case:
    draw = Draw(411)
    return Case("multi_head_attention.grouped_query", "multihead.multi_head_attention",
                {"num_heads": 4, "num_kv_heads": 2},
                "grouped-query: 4 query heads of size 2, 2 key/value heads (W_k, W_v (6, 4)), "
                "biases, valid lengths (B,)",
                {**qkv(draw, query_size=8, key_size=6, value_size=6, S=4),
                 "valid_lens": lens(3, 4)}, gqa_params(draw, N=4, N_kv=2, H=2, H_v=2))


@_case
def _mha_mqa() -> Case:
    draw = Draw(412)
    X = draw.normal(2, 4, 8)
    return Case("multi_head_attention.multi_query", "multihead.multi_head_attention",
                {"num_heads": 2, "num_kv_heads": 1, "is_causal": True},
                "multi-query causal self-attention (X, X, X): 2 query heads of size 4 share one "
                "key/value head (W_k, W_v (8, 4)); no biases",
                {"queries": X, "keys": X, "values": X},
                gqa_params(draw, N=2, N_kv=1, H=4, H_v=4, key_size=8, value_size=8,
                            biases=False))


@_case
def _mha_value_head() -> Case:
    draw = Draw(413)
    return Case("multi_head_attention.value_head_size", "multihead.multi_head_attention",
                {"num_heads": 2},
                "value heads of size 3, query/key heads of size 4: W_v (6, 6), W_o (6, 8); "
                "biases, valid lengths per query (B, T)",
                {**qkv(draw, query_size=8, key_size=6, value_size=6, S=4),
                 "valid_lens": lens([2, 4, 1], [3, 1, 4])},
                gqa_params(draw, N=2, N_kv=2, H=4, H_v=3))


@_case
def _mha_window_scale() -> Case:
    draw = Draw(414)
    X = draw.normal(2, 5, 8)
    return Case("multi_head_attention.local_window_scale", "multihead.multi_head_attention",
                {"num_heads": 2, "local_window_size": [1, 1], "scale": 0.25},
                "self-attention with a sliding window (1, 1) and scale 0.25 (not 1 / sqrt(4)); "
                "biases, valid lengths (B,)",
                {"queries": X, "keys": X, "values": X, "valid_lens": lens(5, 3)},
                mha_params(draw, key_size=8, value_size=8))


@_case
def _mha_unbatched() -> Case:
    draw = Draw(415)
    return Case("multi_head_attention.unbatched", "multihead.multi_head_attention",
                {"num_heads": 2},
                "unbatched queries (T, q) = (4, 8), keys and values (5, 6); valid lengths per "
                "query (T,); output (T, E), weights (N, T, S)",
                {"queries": draw.normal(4, 8), "keys": draw.normal(5, 6),
                 "values": draw.normal(5, 6), "valid_lens": lens(2, 5, 3, 1)},
                mha_params(draw))


# positional encodings (d2l §11.6.3; RoPE; T5 relative buckets)

@_case
def _positional_table() -> Case:
    return Case("positional_encoding.table", "positional.positional_encoding",
                {"num_steps": 9, "num_hiddens": 6}, "the sinusoidal table P (9, 6)", {}, {})


@_case
def _rotary_default() -> Case:
    return Case("rotary_embedding.default_positions", "positional.rotary_embedding", {},
                "queries (B, N, T, H) = (2, 2, 5, 4) at positions 0..4",
                {"X": Draw(501).normal(2, 2, 5, 4)}, {})


@_case
def _rotary_offset() -> Case:
    return Case("rotary_embedding.offset_positions", "positional.rotary_embedding",
                {"base": 500.0}, "(2, 5, 6) at positions 7..11 (decoding past a cache), base 500",
                {"X": Draw(502).normal(2, 5, 6), "positions": np.arange(7, 12, dtype=np.int32)},
                {})


def _offsets() -> np.ndarray:
    # -70 .. 69: beyond max_distance on both sides, and every small offset.
    return np.arange(-70, 70, dtype=np.int32).reshape(10, 14)


@_case
def _buckets_bidirectional() -> Case:
    return Case("relative_position_buckets.bidirectional", "positional.relative_position_buckets",
                {"num_buckets": 16, "max_distance": 40, "bidirectional": True},
                "T5 buckets for encoders: 8 per direction, offsets -70..69",
                {"relative_positions": _offsets()}, {}, tolerances=copy.deepcopy(EXACT))


@_case
def _buckets_causal() -> Case:
    return Case("relative_position_buckets.causal", "positional.relative_position_buckets",
                {"num_buckets": 10, "max_distance": 24, "bidirectional": False},
                "T5 buckets for causal decoders: future keys share bucket 0",
                {"relative_positions": _offsets()}, {}, tolerances=copy.deepcopy(EXACT))


@_case
def _relative_bias() -> Case:
    from reference_numpy.positional import relative_position_buckets, relative_positions

    indices = relative_position_buckets(relative_positions(4, 6, offset=1), 8, 12)
    return Case("relative_position_bias.buckets", "positional.relative_position_bias", {},
                "a (8 buckets, 2 heads) table looked up at T5 buckets (4, 6) -> (1, N, T, S)",
                {"indices": indices.astype(np.int32)}, {"table": Draw(503).normal(8, 2)})


# Bahdanau seq2seq (d2l §10.7, §11.4): V_src 11, V_tgt 13, E 5, h 6, L 2; B 2, S 4, T 3

@_case
def _gru_full() -> Case:
    draw = Draw(601)
    return Case("gru.two_layers", "bahdanau.gru", {},
                "2-layer GRU (PyTorch's equations) with every bias and a given initial state",
                {"inputs": draw.normal(2, 4, 5), "state": draw.normal(2, 2, 6, scale=0.5)},
                gru_params(draw, 5, 6, 2))


@_case
def _gru_no_bhn() -> Case:
    draw = Draw(602)
    params = gru_params(draw, 5, 6, 2)
    for layer in params.values():
        layer["b_h"][12:] = 0.0  # the candidate gate's hidden bias b_hn (see the description)
    return Case("gru.zero_candidate_hidden_bias", "bahdanau.gru", {},
                "2-layer GRU from a zero state with b_h[n] = 0, which flax.nnx.GRUCell can hold",
                {"inputs": draw.normal(2, 4, 5)}, params)


@_case
def _bahdanau_encoder() -> Case:
    draw = Draw(603)
    params = bahdanau_params(draw, 11, 13, 5, 6, 2)["encoder"]
    return Case("encoder.tokens", "bahdanau.encoder", {},
                "embedding (11, 5) and a 2-layer GRU over source ids (2, 4)",
                {"src": draw.tokens(11, 2, 4)}, params)


@_case
def _bahdanau_seq2seq() -> Case:
    draw = Draw(604)
    return Case("seq2seq.logits", "bahdanau.seq2seq", {},
                "teacher-forced logits (B, T, V) and attention weights (B, T, S); source valid "
                "lengths (4, 2)",
                {"src": draw.tokens(11, 2, 4), "src_valid_len": lens(4, 2),
                 "dec_input": draw.tokens(13, 2, 3)}, bahdanau_params(draw, 11, 13, 5, 6, 2))


@_case
def _bahdanau_loss() -> Case:
    draw = Draw(605)
    return Case("seq2seq.teacher_forcing_loss", "bahdanau.teacher_forcing_loss", {"bos_id": 2},
                "the book's masked cross-entropy per sequence (B,), target valid lengths (3, 1); "
                "one GRU layer (the two-layer model is checked by seq2seq.logits)",
                {"src": draw.tokens(11, 2, 4), "src_valid_len": lens(3, 4),
                 "tgt": draw.tokens(13, 2, 3), "tgt_valid_len": lens(3, 1)},
                bahdanau_params(draw, 11, 13, 5, 6, 1))


# Transformer (d2l §11.7): V_src 11, V_tgt 13, D 8, F 16, N 2, L 2; B 2, S 5, T 4

@_case
def _ffn() -> Case:
    draw = Draw(701)
    return Case("position_wise_ffn.relu", "transformer.position_wise_ffn", {},
                "relu(X W_1 + b_1) W_2 + b_2 on (2, 4, 8), hidden 16",
                {"X": draw.normal(2, 4, 8)}, ffn_params(draw, 8, 16))


@_case
def _layer_norm() -> Case:
    draw = Draw(702)
    return Case("layer_norm.offset_rows", "transformer.layer_norm", {},
                "rows with mean 5 and spread 3 (the variance must not be E[x^2] - E[x]^2 in "
                "float32), eps 1e-5",
                {"X": draw.normal(2, 4, 8, scale=3.0, loc=5.0)}, norm_params(draw, 8))


@_case
def _add_norm() -> Case:
    draw = Draw(703)
    return Case("add_norm.residual", "transformer.add_norm", {}, "LayerNorm(Y + X) on (2, 4, 8)",
                {"X": draw.normal(2, 4, 8), "Y": draw.normal(2, 4, 8)}, norm_params(draw, 8))


@_case
def _encoder_block() -> Case:
    draw = Draw(704)
    return Case("encoder_block.valid_lens", "transformer.encoder_block", {"num_heads": 2},
                "self-attention + FFN, each with add & norm; valid lengths (5, 3)",
                {"X": draw.normal(2, 5, 8), "src_valid_len": lens(5, 3)},
                encoder_block_params(draw, 8, 16))


@_case
def _decoder_block() -> Case:
    draw = Draw(705)
    return Case("decoder_block.teacher_forced", "transformer.decoder_block", {"num_heads": 2},
                "causal self-attention, encoder-decoder attention (valid lengths (5, 3)), FFN",
                {"X": draw.normal(2, 4, 8), "enc_outputs": draw.normal(2, 5, 8),
                 "src_valid_len": lens(5, 3)}, decoder_block_params(draw, 8, 16))


@_case
def _transformer_logits() -> Case:
    draw = Draw(706)
    return Case("transformer.logits", "transformer.transformer", {"num_heads": 2},
                "2 encoder and 2 decoder blocks: logits (B, T, V) and every layer's weights",
                {"src": draw.tokens(11, 2, 5), "src_valid_len": lens(5, 2),
                 "dec_input": draw.tokens(13, 2, 4)}, transformer_params(draw, 11, 13, 8, 16, 2))


@_case
def _transformer_loss() -> Case:
    draw = Draw(707)
    return Case("transformer.teacher_forcing_loss", "transformer.teacher_forcing_loss",
                {"num_heads": 2, "bos_id": 2},
                "masked cross-entropy per sequence (B,), target valid lengths (4, 2); one block "
                "each (the two-block model is checked by transformer.logits)",
                {"src": draw.tokens(11, 2, 5), "src_valid_len": lens(3, 5),
                 "tgt": draw.tokens(13, 2, 4), "tgt_valid_len": lens(4, 2)},
                transformer_params(draw, 11, 13, 8, 16, 1))


# --------------------------------------------------------------------------- generate, save, load


def _check_tags(case: Case) -> None:
    """A tag is a claim about the data; make sure it holds, so n/a rows are never unjustified
    (and a mods case with a row that attends nothing must say so: built-ins differ there)."""
    if "fully_masked_row" in case.tags:
        weights = case.outputs["weights"]
        if not (weights == 0).all(axis=-1).any():
            raise AssertionError(f"case {case.name}: tagged fully_masked_row but no row of "
                                 "weights is all zero")
    elif case.function == MODS_FUNCTION and (case.outputs["weights"] == 0).all(axis=-1).any():
        raise AssertionError(f"case {case.name}: a row attends nothing, untagged")
    if "nan_in_padding" in case.tags and np.isfinite(case.inputs["X"]).all():
        raise AssertionError(f"case {case.name}: tagged nan_in_padding but X is finite")
    if "large_scores" in case.tags:
        scores = _scores(case)
        beyond = (scores > _EXP_LIMIT_FLOAT64).all(axis=-1) | (scores < _EXP_FLOOR_FLOAT64).all(
            axis=-1)
        if not beyond.any() or not all(np.isfinite(value).all()
                                       for value in case.outputs.values()):
            raise AssertionError(f"case {case.name}: tagged large_scores but no row of scores "
                                 "lies wholly beyond exp's float64 range, or an output is not "
                                 "finite")


#: exp overflows past this in float64 (float32: past 88.72).
_EXP_LIMIT_FLOAT64 = float(np.log(np.finfo(np.float64).max))
#: exp underflows to 0 below this in float64 (the smallest subnormal).
_EXP_FLOOR_FLOAT64 = float(np.log(np.finfo(np.float64).smallest_subnormal))


def _scores(case: Case) -> np.ndarray:
    """The scores the softmax of a masked-softmax, dot-product or multi-head case sees
    (before masking), as the reference computes them: ``X``, ``q k^T / sqrt(d)`` per head."""
    from reference_numpy.multihead import project_heads

    inputs = case.inputs
    if case.function == "masking.masked_softmax":
        return inputs["X"]
    queries, keys = inputs["queries"], inputs["keys"]
    if case.function == "multihead.multi_head_attention":
        queries, keys, _ = project_heads(case.params, queries, keys, inputs["values"],
                                         num_heads=case.config["num_heads"],
                                         num_kv_heads=case.config.get("num_kv_heads"))
    scale = case.config.get("scale") or queries.shape[-1] ** -0.5
    return queries @ np.swapaxes(keys, -1, -2) * scale


#: Inputs and parameters are multiples of this (with magnitudes below 2^11), so they are exact
#: in float32 too: ``--dtype float32`` casts them without rounding, and a float32 run measures
#: the arithmetic alone. (It also lets the zip compress them: their low mantissa bytes are zero.)
GRID = 2.0 ** -12


def _on_grid(array: np.ndarray, where: str) -> np.ndarray:
    if array.dtype.kind != "f":
        return array
    rounded = np.round(array / GRID) * GRID  # NaN and Inf stay as they are
    finite = rounded[np.isfinite(rounded)]
    if finite.size and np.abs(finite).max() >= 2.0 ** 11:
        raise AssertionError(f"{where}: magnitudes up to {np.abs(finite).max()} are not exact in "
                             "float32 on the grid")
    return rounded


def generate_cases() -> dict[str, Case]:
    """Every canonical case, outputs computed by :mod:`reference_numpy` in float64.

    Deterministic: fixed seeds, NumPy's ``default_rng``, inputs and parameters rounded to
    :data:`GRID` (exact in float32), float64 reference arithmetic.

    Returns:
      ``{case name: Case}`` in the order of the book's chapter.
    """
    cases: dict[str, Case] = {}
    for builder in _BUILDERS + MODS_BUILDERS:  # the mods' cases after the book's: appended
        case = builder()
        if case.name in cases:
            raise AssertionError(f"two cases are named {case.name!r}")
        if case.function not in FUNCTIONS:
            raise AssertionError(f"case {case.name}: unknown function {case.function!r}")
        case.inputs = {name: _on_grid(value, f"{case.name}/input/{name}")
                       for name, value in case.inputs.items()}
        case.params = unflatten_params({path: _on_grid(value, f"{case.name}/param/{path}")
                                        for path, value in flatten_params(case.params).items()})
        outputs = call("reference_numpy", case.function, case.inputs, case.params, case.config)
        case.outputs = {name: np.asarray(value) for name, value in outputs.items()}
        for name, value in case.outputs.items():
            if value.dtype.kind == "f" and value.dtype != np.float64:
                raise AssertionError(f"case {case.name}: output {name} is {value.dtype}, "
                                     "expected float64")
        _check_tags(case)
        cases[case.name] = case
    return cases


def save_cases(path: str | Path, cases: Mapping[str, Case] | None = None) -> Path:
    """Write ``cases`` (default: :func:`generate_cases`) to ``path`` as a compressed ``.npz``.

    The archive is an ordinary ``numpy.savez_compressed`` file (``np.load`` reads it), written
    with a fixed timestamp so that the same cases give the same bytes
    (:func:`~jax_attention.conformance.casefile.write_cases`).

    Returns:
      ``path`` as a :class:`~pathlib.Path`.
    """
    return write_cases(path, generate_cases() if cases is None else cases)
