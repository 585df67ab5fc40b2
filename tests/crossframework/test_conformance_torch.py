"""The conformance kit against PyTorch: every case passes against torch's built-ins and the
book's PyTorch code (jax_attention.interop.torch_models), in float64 and float32, and
``jax-attention conformance --against torch`` exits 0."""

from __future__ import annotations

import json

import pytest

from tests.torch_support import import_torch

torch = import_torch()

from jax_attention.cli import main  # noqa: E402
from jax_attention.conformance import load_cases, run_conformance  # noqa: E402
from tests.conformance_support import assert_conforms, passed  # noqa: E402

SDPA = "torch.nn.functional.scaled_dot_product_attention"
DOT_MIRROR = "torch_models.DotProductAttention"
FLEX = "torch.nn.attention.flex_attention"
MHA = "torch.nn.MultiheadAttention"
MHA_UNWEIGHTED = "torch.nn.MultiheadAttention(need_weights=False)"
MHA_MIRROR = "torch_models.MultiHeadAttention"
MHA_SDPA = "torch.nn.functional.linear + scaled_dot_product_attention"
NO_GQA = "no grouped-query attention"
NOT_APPLICABLE = {
    ("dot_product_attention.bias_and_lens", DOT_MIRROR): "no score bias",
    ("dot_product_attention.scale", DOT_MIRROR): "no scale argument",
    ("dot_product_attention.logit_softcap", SDPA): "no logit soft-capping",
    ("dot_product_attention.logit_softcap", DOT_MIRROR): "no logit soft-capping",
    ("dot_product_attention.grouped_query", DOT_MIRROR): NO_GQA,
    ("dot_product_attention.multi_query", DOT_MIRROR): NO_GQA,
    ("dot_product_attention.unbatched", DOT_MIRROR): "valid lengths only with a batch axis",
    ("multi_head_attention.unbatched", MHA_MIRROR): "batched inputs (B, T, q) only",
    ("multi_head_attention.fully_masked_row", MHA): "pytorch/pytorch#160064",
    ("multi_head_attention.distinct_sizes", MHA): "embed_dim",
    ("multi_head_attention.distinct_sizes", MHA_UNWEIGHTED): "embed_dim",
    **{("multi_head_attention.grouped_query", name): NO_GQA for name in (MHA, MHA_UNWEIGHTED)},
    **{("multi_head_attention.multi_query", name): NO_GQA for name in (MHA, MHA_UNWEIGHTED)},
    **{("multi_head_attention.value_head_size", name): "one head size"
       for name in (MHA, MHA_UNWEIGHTED, MHA_MIRROR)},
    **{("multi_head_attention.local_window_scale", name): "no scale argument"
       for name in (MHA, MHA_UNWEIGHTED, MHA_MIRROR)},
    ("mods.padding_softcap_bias", SDPA): "soft-caps the scores",
    ("mods.sinks", SDPA): "no attention sinks",
}
#: What SDPA takes as its own arguments (scale=, enable_gqa=) or in its attn_mask (windows), and
#: unbatched inputs; the mirror takes windows as its mask. They must run and pass.
SDPA_VARIANTS = {"dot_product_attention.scale", "dot_product_attention.local_window",
                 "dot_product_attention.causal_local_window",
                 "dot_product_attention.grouped_query", "dot_product_attention.multi_query",
                 "dot_product_attention.unbatched",
                 "dot_product_attention.window_fully_masked_row"}
MIRROR_VARIANTS = {"dot_product_attention.local_window",
                   "dot_product_attention.causal_local_window",
                   "dot_product_attention.window_fully_masked_row"}
#: The mirror's MultiHeadAttention has grouped-query heads (num_kv_heads).
MHA_MIRROR_VARIANTS = {"multi_head_attention.grouped_query", "multi_head_attention.multi_query"}


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_torch_passes_every_case(dtype):
    report = run_conformance("torch", dtype=dtype)
    assert_conforms(report, NOT_APPLICABLE)
    labels = {r.implementation for r in report.results}
    assert {"torch.nn.functional.scaled_dot_product_attention", "torch.nn.MultiheadAttention",
            "torch.nn.GRU", "torch.nn.LayerNorm"} <= labels
    # scaled_dot_product_attention, and MultiheadAttention on its path (need_weights=False),
    # give a fully masked row zeros, as ours: they pass there.
    assert "dot_product_attention.fully_masked_row" in passed(report, SDPA)
    assert "multi_head_attention.fully_masked_row" in passed(report, MHA_UNWEIGHTED)
    # Unbatched (T, q) inputs, which MultiheadAttention takes as such, weights (N, T, S).
    assert "multi_head_attention.unbatched" in passed(report, MHA) & passed(report, MHA_UNWEIGHTED)
    assert SDPA_VARIANTS <= passed(report, SDPA)
    assert MIRROR_VARIANTS <= passed(report, DOT_MIRROR)
    assert MHA_MIRROR_VARIANTS <= passed(report, MHA_MIRROR)
    # Every multi-head case — grouped-query, multi-query, value heads of their own size, window
    # and scale — is checked by PyTorch's projections and SDPA (enable_gqa, scale=).
    multi_head = {name for name, case in load_cases().items()
                  if case.function == "multihead.multi_head_attention"}
    assert passed(report, MHA_SDPA) == multi_head
    # FlexAttention expresses every dot-product case, soft-capping (score_mod) included, and
    # every mods case (its mask and score mods written in torch; sinks through its lse), whose
    # lse it returns and is compared on.
    assert passed(report, FLEX) == {name for name, case in load_cases().items() if case.function
                                    in ("scoring.dot_product_attention",
                                        "mods.dot_product_attention")}
    assert all(set(r.outputs) == {"output", "lse"} for r in report.results
               if r.implementation == FLEX and r.function == "mods.dot_product_attention")
    # SDPA takes the mask mods as a boolean mask and the additive score mods as a float one.
    assert passed(report, SDPA) >= {name for name, case in load_cases().items()
                                    if case.function == "mods.dot_product_attention"} - {
        "mods.padding_softcap_bias", "mods.sinks"}
    assert torch.__version__.split("+")[0] in report.environment["versions"]


def test_cli_against_torch_exits_0(tmp_path, capsys):
    record_path = tmp_path / "torch.json"
    assert main(["conformance", "--against", "torch", "--json", str(record_path)]) == 0
    printed = capsys.readouterr().out
    assert "OK:" in printed and " FAIL" not in printed
    assert json.loads(record_path.read_text())["summary"]["ok"] is True
