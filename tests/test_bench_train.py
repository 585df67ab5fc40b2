"""``bench train``: the record on a tiny model, the losses of both peers, the CLI and its JSON.

Timings of tiny models on a shared machine say nothing about speed: the tests check that both
peers ran the real training code on the same data and weights (without dropout their losses
agree to float32 rounding after the same steps) and that the record holds what the schema
promises. The data settings are the book's (600 pairs, batch 64, 10 steps), so that the CLI test
reuses the fixture's compiled step.
"""

from __future__ import annotations

import json
import math

import pytest

pytest.importorskip("torch")

from jax_attention.bench import train as bench  # noqa: E402
from jax_attention.cli import main  # noqa: E402

TINY = {
    "bahdanau": {"embed_size": 8, "num_hiddens": 8, "num_layers": 1, "dropout": 0.0},
    "transformer": {"num_hiddens": 8, "ffn_num_hiddens": 16, "num_heads": 2, "num_layers": 1,
                    "dropout": 0.0, "max_positions": 16},
}
STEPS = 2


def _positive(x) -> bool:
    return isinstance(x, float) and math.isfinite(x) and x > 0


@pytest.fixture(scope="module", params=bench.MODELS)
def record(request):
    return request.param, bench.bench_train(request.param, steps=STEPS, repeats=5, warmup=0,
                                            sizes=TINY[request.param], gemm_size=64)


def test_record_schema(record):
    model, record = record
    assert record["benchmark"] == "train" and record["model"] == model
    assert record["settings"]["model"] == {**bench.BOOK_MODELS[model], **TINY[model]}
    assert record["settings"]["steps"] == STEPS and record["settings"]["devices"] == 1
    assert record["tokens_per_round"] > 0
    assert _positive(record["flops_per_step"]) and _positive(record["gemm"]["ceiling_gflops"])
    assert _positive(record["ratio_tokens_per_s"])
    for name in ("ours", "torch"):
        peer = record["peers"][name]
        assert len(peer["round_losses"]) >= 5
        for key in ("median_s", "step_ms", "tokens_per_s", "gflops", "gemm_fraction",
                    "final_loss"):
            assert _positive(peer[key]), (name, key, peer[key])
        assert peer["tokens_per_s"] == pytest.approx(record["tokens_per_round"] / peer["median_s"])
    assert record["peers"]["ours"]["steps_trained"] == record["peers"]["torch"]["steps_trained"]
    assert record["peers"]["ours"]["compile_s"] >= 0
    assert record["peers"]["torch"]["threads"] >= 1
    assert record["load_average"]["before"] is None or len(record["load_average"]["before"]) == 3
    assert {"cpu", "jax", "torch"} <= set(record["environment"])
    json.dumps(record)  # JSON-ready


def test_both_peers_train_the_same_model_on_the_same_batches(record):
    """Same initial weights, same batches, no dropout: the losses agree round after round."""
    _, record = record
    ours, torch = (record["peers"][name]["round_losses"] for name in ("ours", "torch"))
    assert len(ours) == len(torch)
    assert ours == pytest.approx(torch, rel=1e-4)
    assert ours[-1] < ours[0]  # it learns
    assert record["final_loss_relative_difference"] < 1e-4


def test_format_train_prints_the_table(record):
    _, record = record
    table = bench.format_train(record)
    assert "ours / torch tokens/s" in table and "GEMM ceiling" in table
    rows = [line.split() for line in table.splitlines()]
    assert [row[0] for row in rows if len(row) == 6 and row[1].isdigit()] == ["ours", "torch"]


def test_bad_arguments():
    with pytest.raises(ValueError, match="model must be one of"):
        bench.bench_train("gpt")
    with pytest.raises(ValueError, match="steps must be an integer >= 1"):
        bench.bench_train("bahdanau", steps=0)


def test_cli_writes_json(tmp_path, capsys, monkeypatch, record):
    model, _ = record
    # The CLI trains the book's model; a tiny one keeps the test short (and reuses the fixture's
    # compiled step).
    monkeypatch.setitem(bench.BOOK_MODELS, model, {**bench.BOOK_MODELS[model], **TINY[model]})
    path = tmp_path / "out" / "train.json"
    status = main(["bench", "train", "--model", model, "--steps", str(STEPS), "--repeats", "5",
                   "--warmup", "0", "--gemm-size", "64", "--torch-threads", "1", "--json",
                   str(path), "--no-progress"])
    assert status == 0
    printed = capsys.readouterr().out
    assert "ours / torch tokens/s" in printed and f"wrote {path}" in printed
    written = json.loads(path.read_text())
    assert written["command"] == "bench train" and written["model"] == model
    assert written["peers"]["torch"]["threads"] == 1
    assert _positive(written["ratio_tokens_per_s"])


def test_cli_rejects_bad_options(capsys):
    with pytest.raises(SystemExit) as error:
        main(["bench", "train", "--model", "gpt"])
    assert error.value.code == 2
    with pytest.raises(SystemExit) as error:
        main(["bench", "train", "--repeats", "3"])
    assert error.value.code == 2
    assert "--repeats" in capsys.readouterr().err
