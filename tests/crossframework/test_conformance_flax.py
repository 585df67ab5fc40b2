"""The conformance kit against Flax: its built-ins (MultiHeadAttention, dot_product_attention,
LayerNorm, GRUCell, Embed, softmax) and our NNX modules pass every case (float64)."""

from __future__ import annotations

from jax_attention.conformance import run_conformance
from tests.conformance_support import assert_conforms

NOT_APPLICABLE = [
    ("dot_product_attention.value_size_6", "flax.nnx.dot_product_attention"),
    ("dot_product_attention.fully_masked_row", "flax.nnx.dot_product_attention"),
    ("dot_product_attention.fully_masked_row",
     "flax.nnx.nn.attention.dot_product_attention_weights"),
    ("multi_head_attention.fully_masked_row", "flax.nnx.MultiHeadAttention"),
    ("multi_head_attention.fully_masked_row", "flax.nnx.MultiHeadAttention(sow_weights=True)"),
    ("multi_head_attention.distinct_sizes", "flax.nnx.MultiHeadAttention"),
    ("multi_head_attention.distinct_sizes", "flax.nnx.MultiHeadAttention(sow_weights=True)"),
    ("gru.two_layers", "flax.nnx.GRUCell + nnx.RNN"),
]


def test_flax_passes_every_case():
    report = run_conformance("flax", dtype="float64")
    assert_conforms(report, NOT_APPLICABLE)
    labels = {r.implementation for r in report.results}
    assert {"flax.nnx.MultiHeadAttention", "flax.nnx.LayerNorm", "flax.nnx.GRUCell + nnx.RNN",
            "flax.nnx.Embed", "jax_attention NNX TransformerSeq2Seq"} <= labels
    # Our GRU folded into flax.nnx.GRUCell runs, and passes, where b_hn = 0.
    assert any(r.case == "gru.zero_candidate_hidden_bias" and r.status == "PASS"
               and r.implementation == "flax.nnx.GRUCell + nnx.RNN" for r in report.results)
    # Every NNX module row carries the case's parameters: none is n/a.
    assert all(r.status == "PASS" for r in report.results
               if r.implementation.startswith("jax_attention NNX"))
