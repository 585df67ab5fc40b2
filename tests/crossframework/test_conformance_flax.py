"""The conformance kit against Flax: its built-ins (MultiHeadAttention, dot_product_attention,
LayerNorm, GRUCell, Embed, softmax) and our NNX modules pass every case (float64)."""

from __future__ import annotations

from jax_attention.conformance import load_cases, run_conformance
from tests.conformance_support import assert_conforms, passed

DOT = "flax.nnx.dot_product_attention"
WEIGHTS = "flax.nnx.nn.attention.dot_product_attention_weights"
MHA = "flax.nnx.MultiHeadAttention"
MHA_SOWN = "flax.nnx.MultiHeadAttention(sow_weights=True)"
UNIFORM = "known difference"  # a fully masked row: Flax's weights are uniform, ours zero
NOT_APPLICABLE = {
    ("dot_product_attention.value_size_6", DOT): "values of the query/key size",
    **{(case, name): UNIFORM for case in ("dot_product_attention.fully_masked_row",
                                          "dot_product_attention.window_fully_masked_row")
       for name in (DOT, WEIGHTS)},
    **{("dot_product_attention.scale", name): "no scale argument" for name in (DOT, WEIGHTS)},
    **{("dot_product_attention.logit_softcap", name): "no logit soft-capping"
       for name in (DOT, WEIGHTS)},
    **{(case, name): reason for name in (MHA, MHA_SOWN) for case, reason in (
        ("multi_head_attention.fully_masked_row", UNIFORM),
        ("multi_head_attention.distinct_sizes", "in_kv_features"),
        ("multi_head_attention.value_head_size", "one head size"),
        ("multi_head_attention.local_window_scale", "no scale argument"))},
    ("gru.two_layers", "flax.nnx.GRUCell + nnx.RNN"): "b_hn",
    # The mods' cases: a query that attends nothing (both n/a for it first), sinks.
    **{(case, name): UNIFORM for case in ("mods.segment_ids", "mods.padding_softcap_bias")
       for name in (DOT, WEIGHTS)},
    **{("mods.sinks", name): "no attention sinks" for name in (DOT, WEIGHTS)},
}
#: Grouped-query heads (Flax's own: keys and values with N_kv heads, MultiHeadAttention's
#: num_kv_heads), windows through the mask, unbatched inputs (given a batch of one for the
#: functions; MultiHeadAttention takes them as they are).
DOT_VARIANTS = {"dot_product_attention.local_window", "dot_product_attention.causal_local_window",
                "dot_product_attention.grouped_query", "dot_product_attention.multi_query",
                "dot_product_attention.unbatched"}
MHA_VARIANTS = {"multi_head_attention.grouped_query", "multi_head_attention.multi_query",
                "multi_head_attention.unbatched"}
#: The mods' cases Flax's built-ins express: the mask mods as their mask, the additive score
#: mods (ALiBi, clipped and T5 relative biases) as their bias.
DOT_MODS = {"mods.segment_ids_causal", "mods.prefix_lm", "mods.chunked_local_causal",
            "mods.causal_lower_right", "mods.window_or_prefix_lm", "mods.longformer",
            "mods.clipped_relative_bias", "mods.alibi", "mods.t5_relative_bias",
            "mods.t5_relative_bias_causal"}


def test_flax_passes_every_case():
    report = run_conformance("flax", dtype="float64")
    assert_conforms(report, NOT_APPLICABLE)
    labels = {r.implementation for r in report.results}
    assert {"flax.nnx.MultiHeadAttention", "flax.nnx.LayerNorm", "flax.nnx.GRUCell + nnx.RNN",
            "flax.nnx.Embed", "jax_attention NNX TransformerSeq2Seq"} <= labels
    # Our GRU folded into flax.nnx.GRUCell runs, and passes, where b_hn = 0.
    assert any(r.case == "gru.zero_candidate_hidden_bias" and r.status == "PASS"
               and r.implementation == "flax.nnx.GRUCell + nnx.RNN" for r in report.results)
    assert DOT_VARIANTS <= passed(report, DOT) and DOT_VARIANTS <= passed(report, WEIGHTS)
    assert MHA_VARIANTS <= passed(report, MHA) and MHA_VARIANTS <= passed(report, MHA_SOWN)
    assert DOT_MODS <= passed(report, DOT) and DOT_MODS <= passed(report, WEIGHTS)
    # Our DotProductAttention module takes every mods case (mask_mod=, score_mod=, sinks=).
    assert passed(report, "jax_attention NNX DotProductAttention") >= {
        name for name, case in load_cases().items()
        if case.function == "mods.dot_product_attention"}
    # Every NNX module row carries the case's parameters and variants: none is n/a.
    assert all(r.status == "PASS" for r in report.results
               if r.implementation.startswith("jax_attention NNX"))
