"""The conformance kit against PyTorch: every case passes against torch's built-ins and the
book's PyTorch code (jax_attention.interop.torch_models), in float64 and float32, and
``jax-attention conformance --against torch`` exits 0."""

from __future__ import annotations

import json

import pytest

from tests.torch_support import import_torch

torch = import_torch()

from jax_attention.cli import main  # noqa: E402
from jax_attention.conformance import run_conformance  # noqa: E402
from tests.conformance_support import assert_conforms  # noqa: E402

NOT_APPLICABLE = [
    ("dot_product_attention.bias_and_lens", "torch_models.DotProductAttention"),
    ("multi_head_attention.fully_masked_row", "torch.nn.MultiheadAttention"),
    ("multi_head_attention.distinct_sizes", "torch.nn.MultiheadAttention"),
    ("multi_head_attention.distinct_sizes", "torch.nn.MultiheadAttention(need_weights=False)"),
]


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_torch_passes_every_case(dtype):
    report = run_conformance("torch", dtype=dtype)
    assert_conforms(report, NOT_APPLICABLE)
    labels = {r.implementation for r in report.results}
    assert {"torch.nn.functional.scaled_dot_product_attention", "torch.nn.MultiheadAttention",
            "torch.nn.GRU", "torch.nn.LayerNorm"} <= labels
    # scaled_dot_product_attention, and MultiheadAttention on its path (need_weights=False),
    # give a fully masked row zeros, as ours: they pass there.
    passed = {(r.case, r.implementation) for r in report.results if r.status == "PASS"}
    assert {("dot_product_attention.fully_masked_row",
             "torch.nn.functional.scaled_dot_product_attention"),
            ("multi_head_attention.fully_masked_row",
             "torch.nn.MultiheadAttention(need_weights=False)")} <= passed
    assert torch.__version__.split("+")[0] in report.environment["versions"]


def test_cli_against_torch_exits_0(tmp_path, capsys):
    record_path = tmp_path / "torch.json"
    assert main(["conformance", "--against", "torch", "--json", str(record_path)]) == 0
    printed = capsys.readouterr().out
    assert "OK:" in printed and " FAIL" not in printed
    assert json.loads(record_path.read_text())["summary"]["ok"] is True
