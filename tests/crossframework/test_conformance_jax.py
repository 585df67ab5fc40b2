"""The conformance kit against JAX: our functional core (jit) and jax.nn's built-ins pass every
case in float64 and float32, on JAX's default platform, with the run's settings reported."""

from __future__ import annotations

import jax
import pytest

from jax_attention.conformance import run_conformance
from tests.conformance_support import assert_conforms, passed

JAX_NN = "jax.nn.dot_product_attention"
UNIFORM = "known difference"  # a fully masked row: jax.nn's weights are uniform, ours zero
NOT_APPLICABLE = {
    ("dot_product_attention.fully_masked_row", JAX_NN): UNIFORM,
    ("dot_product_attention.window_fully_masked_row", JAX_NN): UNIFORM,
    ("dot_product_attention.value_size_6", JAX_NN): "values of the query/key size",
    ("dot_product_attention.logit_softcap", JAX_NN): "no logit soft-capping",
    # The mods' cases with a query that attends nothing (a padding id, padded queries).
    ("mods.segment_ids", JAX_NN): UNIFORM,
    ("mods.padding_softcap_bias", JAX_NN): UNIFORM,
}
#: The variants jax.nn takes as its own arguments (scale=, local_window_size=, grouped K/V heads)
#: or through its mask, and unbatched inputs given a batch of one: they must run and pass.
JAX_NN_VARIANTS = {"dot_product_attention.scale", "dot_product_attention.local_window",
                   "dot_product_attention.causal_local_window",
                   "dot_product_attention.grouped_query", "dot_product_attention.multi_query",
                   "dot_product_attention.unbatched"}
#: The mods' cases jax.nn expresses: every mask mod as its boolean mask, every additive score mod
#: as its bias, and the sinks through its log-sum-exp (return_residual), which is compared too.
JAX_NN_MODS = {"mods.segment_ids_causal", "mods.prefix_lm", "mods.chunked_local_causal",
               "mods.causal_lower_right", "mods.window_or_prefix_lm", "mods.longformer",
               "mods.clipped_relative_bias", "mods.alibi", "mods.t5_relative_bias",
               "mods.t5_relative_bias_causal", "mods.sinks"}


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_jax_passes_every_case(dtype):
    report = run_conformance("jax", dtype=dtype)
    assert_conforms(report, NOT_APPLICABLE)
    ours = [r for r in report.results if r.implementation == "jax_attention (jit)"]
    assert len(ours) == report.num_cases  # our core runs every case, none n/a
    assert JAX_NN_VARIANTS <= passed(report, JAX_NN)
    assert JAX_NN_MODS <= passed(report, JAX_NN)
    assert all(set(r.outputs) == {"output", "lse"} for r in report.results
               if r.implementation == JAX_NN and r.case in JAX_NN_MODS)
    builtin = [r for r in report.results if r.implementation == JAX_NN]
    # It normalises in float32 whatever the inputs: held to the float32 tolerance, and says so.
    assert {(r.tolerance_dtype, r.rtol) for r in builtin} == {("float32", 1e-5)}
    assert all("float32" in r.note for r in builtin if r.status == "PASS")
    environment = report.environment
    assert environment["platform"] == jax.default_backend()
    assert str(jax.devices()[0]) in environment["device"]
    assert "'highest'" in environment["precision"]
    assert ("x64 on" in environment["precision"]) == (dtype == "float64")
