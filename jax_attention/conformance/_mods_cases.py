"""The cases of ``mods.dot_product_attention``: scaled dot-product attention with the mask mods,
score mods and sinks of :mod:`reference_numpy.mods` (FlexAttention's model), named in the config
(:func:`jax_attention.conformance.functions.build_mod`), their arrays as inputs and their learned
tables and sinks as params, each row's log-sum-exp a third output. Private to
:mod:`jax_attention.conformance.cases`, which appends :data:`MODS_BUILDERS` after the book's cases
(so that those never change) and computes the outputs with the reference.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from jax_attention.conformance._draws import Draw, heads, qkv
from jax_attention.conformance.casefile import Case

#: The builders, in the order of the file.
MODS_BUILDERS: list[Callable[[], Case]] = []


def _mods_case(builder: Callable[[], Case]) -> Callable[[], Case]:
    MODS_BUILDERS.append(builder)
    return builder


# Mask mods, score mods and sinks (FlexAttention's model; jax_attention.nn.mods), appended after
# the book's cases so that those stay as they were: scaled dot-product attention with the mods
# named in the config (functions.build_mod), their arrays as inputs and learned tables and sinks
# as params, and the log-sum-exp of each row as a third output. One case per family of mods, each
# mod at least once: B = 2, head size 4, values of the query size (jax.nn and Flax need it).

MODS_FUNCTION = "mods.dot_product_attention"


def _mod(name: str, **numbers) -> dict:
    return {"mod": name, **numbers}


def _ids(*rows) -> np.ndarray:
    """Segment ids (or lengths) as int32 rows."""
    return np.asarray(rows, dtype=np.int32)


@_mods_case
def _mods_segment_ids() -> Case:
    return Case("mods.segment_ids", MODS_FUNCTION,
                {"mask_mod": _mod("segment_ids", padding_id=-1)},
                "packed rows: query t attends key s iff q_segment_ids[b, t] == "
                "kv_segment_ids[b, s] (T = 6, S = 8); id -1 is padding (padding_id): a padded "
                "query attends nothing (zero weights and output, lse -inf), a padded key is "
                "attended by nothing",
                {**qkv(Draw(801), T=6, S=8),
                 "q_segment_ids": _ids([0, 0, 1, 1, 2, -1], [0, 1, 1, 1, -1, -1]),
                 "kv_segment_ids": _ids([0, 0, 0, 1, 1, 2, 2, -1], [0, 0, 1, 1, 1, 1, -1, -1])},
                {}, tags=("fully_masked_row",))


@_mods_case
def _mods_segment_ids_causal() -> Case:
    return Case("mods.segment_ids_causal", MODS_FUNCTION,
                {"mask_mod": _mod("and_masks", mods=[_mod("segment_ids"),
                                                     _mod("causal", offset=0)])},
                "packed causal self-attention: segment ids (B, T) shared by queries and keys "
                "(no kv_segment_ids), AND the causal mask; T = S = 7",
                {**qkv(Draw(802), T=7, S=7),
                 "q_segment_ids": _ids([0, 0, 0, 1, 1, 2, 2], [0, 0, 0, 0, 1, 1, 1])}, {})


@_mods_case
def _mods_prefix_lm() -> Case:
    return Case("mods.prefix_lm", MODS_FUNCTION, {"mask_mod": _mod("prefix_lm")},
                "prefix-LM: causal, but every query attends the first prefix_lens[b] = (2, 4) "
                "keys; T = S = 6",
                {**qkv(Draw(803), T=6, S=6), "prefix_lens": _ids(2, 4)}, {})


@_mods_case
def _mods_chunked_local_causal() -> Case:
    return Case("mods.chunked_local_causal", MODS_FUNCTION,
                {"mask_mod": _mod("and_masks", mods=[_mod("chunked_local", chunk_size=3),
                                                     _mod("causal", offset=0)])},
                "chunked attention (Llama 4): chunks of 3 positions AND causal; T = S = 7",
                qkv(Draw(804), T=7, S=7), {})


@_mods_case
def _mods_causal_lower_right() -> Case:
    return Case("mods.causal_lower_right", MODS_FUNCTION,
                {"mask_mod": _mod("and_masks", mods=[_mod("causal", offset=3),
                                                     _mod("valid_lengths")])},
                "the lower-right causal mask, offset S - T = 3 (T = 3 new queries against S = 6 "
                "cached keys: key s <= t + 3), AND valid lengths per query (B, T)",
                {**qkv(Draw(805), T=3, S=6), "valid_lens": _ids([4, 5, 6], [6, 2, 5])}, {})


@_mods_case
def _mods_window_or_prefix_lm() -> Case:
    return Case("mods.window_or_prefix_lm", MODS_FUNCTION,
                {"mask_mod": _mod("or_masks", mods=[_mod("sliding_window", left=1, right=1),
                                                    _mod("prefix_lm")])},
                "a sliding window (1, 1) OR the prefix-LM mask with prefix_lens (3, 1); T = S = 7",
                {**qkv(Draw(806), T=7, S=7), "prefix_lens": _ids(3, 1)}, {})


@_mods_case
def _mods_padding_softcap_bias() -> Case:
    draw = Draw(807)
    inputs = heads(draw, N=2, N_kv=2, T=4, S=5)
    inputs["queries"] = 3.0 * inputs["queries"]  # scores of a few units: the cap of 2 bites
    return Case("mods.padding_softcap_bias", MODS_FUNCTION,
                {"mask_mod": _mod("padding"),
                 "score_mod": _mod("compose_score_mods", mods=[_mod("softcap", cap=2.0),
                                                               _mod("bias")])},
                "right padding: kv_lens (5, 3) real keys, q_lens (4, 2) real queries (padded "
                "queries attend nothing); scores soft-capped at 2 (queries scaled by 3), then a "
                "bias table (1, N, 1, S) added (broadcast over batch and queries); heads N = 2",
                {**inputs, "kv_lens": _ids(5, 3), "q_lens": _ids(4, 2),
                 "bias": draw.normal(1, 2, 1, 5, scale=0.5)}, {}, tags=("fully_masked_row",))


@_mods_case
def _mods_clipped_relative_bias() -> Case:
    draw = Draw(808)
    return Case("mods.clipped_relative_bias", MODS_FUNCTION,
                {"mask_mod": _mod("dense_mask"), "score_mod": _mod("clipped_relative_bias")},
                "a learned bias per clipped relative position and head (Shaw et al.): "
                "table[clip(s - t, -2, 2) + 2, h], the param clipped_relative_bias (5, N = 2); "
                "a boolean mask (B, 1, T, S) as dense_mask; T = 5, S = 6",
                {**heads(draw, N=2, N_kv=2, T=5, S=6), "mask": draw.mask(2, 1, 5, 6)},
                {"clipped_relative_bias": draw.normal(5, 2)})


@_mods_case
def _mods_alibi() -> Case:
    return Case("mods.alibi", MODS_FUNCTION,
                {"mask_mod": _mod("causal", offset=0), "score_mod": _mod("alibi", num_heads=6)},
                "ALiBi: score + slope[h] (s - t) with the slopes of 6 heads (not a power of two: "
                "those of 4 heads, 2^-2 .. 2^-8, then 2^-1 and 2^-3); grouped-query keys and "
                "values (N_kv = 2); causal, B = 1, T = S = 5",
                heads(Draw(809), N=6, N_kv=2, B=1, T=5, S=5), {})


@_mods_case
def _mods_t5_relative_bias() -> Case:
    draw = Draw(810)
    return Case("mods.t5_relative_bias", MODS_FUNCTION,
                {"score_mod": _mod("t5_relative_bias", bidirectional=True, max_distance=10)},
                "T5's relative attention bias for encoders: table[bucket(s - t), h], the learned "
                "param t5_relative_bias (8 buckets, N = 2), bidirectional buckets (4 per "
                "direction, log-spaced to max_distance 10: T = S = 11 reaches it); no mask; "
                "B = 1",
                heads(draw, N=2, N_kv=2, B=1, T=11, S=11), {"t5_relative_bias": draw.normal(8, 2)})


@_mods_case
def _mods_t5_relative_bias_causal() -> Case:
    draw = Draw(811)
    return Case("mods.t5_relative_bias_causal", MODS_FUNCTION,
                {"mask_mod": _mod("causal", offset=0),
                 "score_mod": _mod("t5_relative_bias", bidirectional=False, max_distance=10)},
                "T5's relative bias for a causal decoder: 6 buckets for the past (future keys "
                "share bucket 0), max_distance 10, one table column shared by every head (6, 1); "
                "causal, B = 1, T = S = 11, no head axis",
                qkv(draw, B=1, T=11, S=11), {"t5_relative_bias": draw.normal(6, 1)})


@_mods_case
def _mods_longformer() -> Case:
    return Case("mods.longformer", MODS_FUNCTION,
                {"mask_mod": _mod("or_masks", mods=[_mod("sliding_window", left=1, right=1),
                                                    _mod("global_tokens", num_global=2)])},
                "Longformer's pattern: a sliding window (1, 1) OR global tokens (the first 2 "
                "positions attend every key and every query attends them); T = S = 6",
                qkv(Draw(813), T=6, S=6), {})


@_mods_case
def _mods_sinks() -> Case:
    draw = Draw(812)
    return Case("mods.sinks", MODS_FUNCTION,
                {"mask_mod": _mod("sliding_window", left=2, right=0), "scale": 0.3},
                "attention sinks (gpt-oss): one learned logit per query head, the param sinks "
                "(N = 4,), joins each row's softmax with a zero value (the weights sum to less "
                "than 1; lse includes it); grouped-query keys (N_kv = 2), a causal window of 3 "
                "keys, scale 0.3; T = 4, S = 6",
                heads(draw, N=4, N_kv=2, T=4, S=6), {"sinks": draw.normal(4)})
