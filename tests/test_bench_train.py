"""``bench train``: the record on a tiny model, the losses of both peers, the CLI and its JSON.

Timings of tiny models on a shared machine say nothing about speed: the tests check that both
peers ran the real training code on the same data and weights (without dropout their losses
agree to float32 rounding after the same steps) and that the record holds what the schema
promises. The data settings are the book's (600 pairs, batch 64, 10 steps), so that the CLI test
reuses the fixture's compiled step. The named sizes (``--size small``, ``base``) are checked by
building their models, not by training them (the scaling table, ``--size book,small``, trains a
tiny model at each, 600 pairs); the ``torch-compile`` peer trains a tiny model
(marked ``slow``: inductor's first compilation of even a tiny step takes 1–2 minutes on the
project's 2-core machine) and its failure is simulated.
"""

from __future__ import annotations

import json
import logging
import math
import os

import pytest

pytest.importorskip("torch")

import numpy as np  # noqa: E402

from jax_attention.bench import torch_support  # noqa: E402
from jax_attention.bench import train as bench  # noqa: E402
from jax_attention.bench import train_sizes  # noqa: E402
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
    assert _positive(record["gemm"]["bfloat16_gflops"])
    assert record["bfloat16_speedup"] is None  # no ours-bf16 peer
    assert _positive(record["ratio_tokens_per_s"])
    for name in ("ours", "ours-full", "torch"):
        peer = record["peers"][name]
        assert len(peer["round_losses"]) >= 5
        for key in ("median_s", "step_ms", "tokens_per_s", "gflops", "gemm_fraction",
                    "final_loss"):
            assert _positive(peer[key]), (name, key, peer[key])
        assert peer["tokens_per_s"] == pytest.approx(record["tokens_per_round"] / peer["median_s"])
    assert record["peers"]["ours"]["steps_trained"] == record["peers"]["torch"]["steps_trained"]
    assert record["peers"]["ours"]["compile_s"] >= 0
    assert record["peers"]["ours-full"]["compile_s"] >= 0
    # ours trains on batches cut to the longest sentences (the sources too where the model
    # allows), ours-full at the book's length: fewer model FLOPs for the same tokens.
    cut = {"bahdanau": [10, 8], "transformer": [5, 8]}[model]
    assert record["peers"]["ours"]["settings"]["lengths"] == cut
    assert record["peers"]["ours-full"]["settings"]["lengths"] == [10, 10]
    assert (record["peers"]["ours"]["flops_per_step"]
            < record["peers"]["ours-full"]["flops_per_step"] == record["flops_per_step"]
            == record["peers"]["torch"]["flops_per_step"])
    ratios = record["ratios_tokens_per_s"]
    assert record["ratio_as_shipped"] == ratios["torch"] == record["ratio_tokens_per_s"]
    assert record["same_work_peer"] == "torch"
    assert record["ratio_same_work"] == pytest.approx(ratios["torch"] / ratios["ours-full"])
    assert record["peers"]["torch"]["threads"] >= 1
    # Each peer named, with its settings: the same sizes, dtype and parameter count for both.
    assert record["size"] == record["settings"]["size"] == "book"
    assert (record["settings"]["peers"] == ["ours", "ours-full", "torch"]
            == list(record["peers"]))
    assert set(record["ratios_tokens_per_s"]) == {"ours-full", "torch"}
    settings = {name: peer["settings"] for name, peer in record["peers"].items()}
    for name, peer in record["peers"].items():
        assert peer["status"] == "ok" and peer["description"] == bench.PEERS[name]
        assert settings[name]["model"] == record["settings"]["model"]
        assert (settings[name]["batch_size"], settings[name]["num_steps"],
                settings[name]["num_examples"]) == (64, 10, 600)
        assert settings[name]["dtype"] == "float32" and settings[name]["size"] == "book"
    assert settings["torch"]["threads"] == record["peers"]["torch"]["threads"]
    assert settings["ours"]["parameters"] == settings["torch"]["parameters"] > 0
    assert record["load_average"]["before"] is None or len(record["load_average"]["before"]) == 3
    assert {"cpu", "jax", "torch"} <= set(record["environment"])
    json.dumps(record)  # JSON-ready


def test_both_peers_train_the_same_model_on_the_same_batches(record):
    """Same initial weights, same batches, no dropout: the losses agree round after round (ours
    on the batches cut to the longest sentences too: the loss keeps the book's divisor)."""
    _, record = record
    ours, full, torch = (record["peers"][name]["round_losses"]
                         for name in ("ours", "ours-full", "torch"))
    assert len(ours) == len(full) == len(torch)
    assert ours == pytest.approx(torch, rel=1e-4)
    assert full == pytest.approx(torch, rel=1e-4)
    assert ours[-1] < ours[0]  # it learns
    assert record["final_loss_relative_difference"] < 1e-4


def test_format_train_prints_the_table(record):
    _, record = record
    table = bench.format_train(record)
    assert "/ torch tokens/s" in table and "GEMM ceiling" in table
    assert "(as shipped)" in table and "ours-full / torch tokens/s" in table
    rows = [line.split() for line in table.splitlines()]
    assert [row[0] for row in rows if len(row) == 6 and row[1].isdigit()] == [
        "ours", "ours-full", "torch"]


def test_the_bfloat16_peer_trains_the_same_model_in_bfloat16():
    """``--peers ours,ours-bf16,torch``: ours-bf16 is ours with ``train --dtype bfloat16`` (the
    same weights and batches, the products in bfloat16): its losses track ours to bfloat16's
    precision, its share of the GEMM ceiling is of the bfloat16 one, and the record gives its
    speed-up over ours."""
    record = bench.bench_train("transformer", peers=("ours", "ours-bf16", "torch"), steps=STEPS,
                               repeats=5, warmup=0, sizes=TINY["transformer"], gemm_size=64,
                               torch_threads=1)
    ours, half = record["peers"]["ours"], record["peers"]["ours-bf16"]
    assert half["settings"]["dtype"] == "bfloat16" and ours["settings"]["dtype"] == "float32"
    assert half["settings"]["lengths"] == ours["settings"]["lengths"]
    assert half["flops_per_step"] == ours["flops_per_step"]
    assert half["gemm_fraction"] == pytest.approx(
        half["gflops"] / record["gemm"]["bfloat16_ceiling_gflops"])
    assert half["round_losses"] == pytest.approx(ours["round_losses"], rel=1e-2)
    assert half["round_losses"] != ours["round_losses"]
    assert record["bfloat16_speedup"] == pytest.approx(half["tokens_per_s"] / ours["tokens_per_s"])
    assert "ours-bf16 / ours tokens/s" in bench.format_train(record)


def test_the_same_work_ratio_is_against_the_faster_pytorch_peer():
    """``ratio_same_work`` divides ours-full by whichever PyTorch peer was faster, the one it
    names (here torch.compile), not always the eager loop."""
    def peer(tokens_per_s):
        return {"status": "ok", "tokens_per_s": tokens_per_s, "final_loss": 1.0}

    peers = {"ours": peer(400.0), "ours-full": peer(200.0), "torch": peer(100.0),
             "torch-compile": peer(160.0)}
    record = bench._train_record("transformer", {"size": "base", "steps": 10}, peers,
                                 tokens=1000, flops=1.0, gemm={}, load_before=None,
                                 environment_record={})
    assert record["same_work_peer"] == "torch-compile"
    assert record["ratio_same_work"] == pytest.approx(200.0 / 160.0)
    assert record["ratio_as_shipped"] == pytest.approx(400.0 / 100.0)


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
    assert "(as shipped)" in printed and f"wrote {path}" in printed
    written = json.loads(path.read_text())
    assert written["command"] == "bench train" and written["model"] == model
    assert written["peers"]["torch"]["threads"] == 1
    assert _positive(written["ratio_tokens_per_s"])


@pytest.mark.parametrize("argv, message", [
    (["--model", "gpt"], "--model"),
    (["--repeats", "3"], "--repeats"),
    (["--size", "huge"], "--size"),
    (["--model", "bahdanau", "--num-heads", "2"], "--num-heads: the bahdanau model has no "
                                                  "num_heads"),
    (["--model", "transformer", "--num-heads", "3"], "num_hiddens must be divisible by "
                                                     "num_heads"),
    (["--peers", "ours,torch-compile"], "--peers"),
    (["--peers", "ours,torch,jax"], "--peers"),
    (["--whole-run", "--size", "base"], "--size: not with --whole-run"),
    (["--size", "book,book"], "each once"),
    (["--size", "book,huge"], "--size"),
    (["--size", "book,small", "--devices", "1"], "--size: one size with --devices"),
    (["--whole-run", "--peers", "ours,torch,torch-compile"], "--peers: not with --whole-run"),
    (["--devices", "1", "--peers", "ours,torch,torch-compile"], "--peers: not with --devices"),
])
def test_cli_rejects_bad_options(capsys, argv, message):
    with pytest.raises(SystemExit) as error:
        main(["bench", "train", *argv, "--no-progress"])
    assert error.value.code == 2
    assert message in capsys.readouterr().err


# --------------------------------------------------------------------------- the named sizes


def _parameter_counts(model: str, run: dict, vocab=(40, 50)) -> tuple[int, int, dict, dict]:
    """Ours and the PyTorch mirror built as bench_train builds them, at ``run``'s settings:
    ``(ours' count, torch's count, ours' shapes, the registry's shapes)``."""
    import jax

    from jax_attention.models import registry

    ours = bench.our_model(model, run["model"], *vocab, 0, run["num_steps"])
    params = jax.tree.map(np.asarray, ours.params_dict())
    config = bench.model_config(model, run["model"], *vocab, run["num_steps"])
    mirror = torch_support.torch_model(model, config, params)
    shapes = jax.tree.map(np.shape, params)
    expected = jax.tree.map(tuple, registry.get_model(model).param_shapes(config),
                            is_leaf=lambda x: isinstance(x, (tuple, list)))
    return (sum(int(np.size(a)) for a in jax.tree.leaves(params)),
            sum(p.numel() for p in mirror.parameters()), shapes, expected)


@pytest.mark.parametrize("model", bench.MODELS)
def test_named_sizes_reach_both_peers(model):
    """Each size's settings build ours and the mirror alike: the shapes the registry gives for the
    size, the same parameter count in both frameworks, growing with the size."""
    counts = []
    for size in bench.SIZE_NAMES:
        run = train_sizes.train_sizes(model, size)
        assert run["model"] == {**bench.BOOK_MODELS[model], **bench.SIZES[size]["models"][model]}
        ours, torch, shapes, expected = _parameter_counts(model, run)
        assert shapes == expected, size
        assert ours == torch, (size, ours, torch)
        counts.append(ours)
    assert counts == sorted(counts) and len(set(counts)) == len(counts)


def test_the_named_sizes():
    """The sizes the issue states, in one place; book is the book's (the configs' defaults)."""
    from jax_attention.models.configs import TrainConfig

    assert bench.SIZE_NAMES == ("book", "small", "base")
    assert bench.SIZES["book"]["data"] == {"batch_size": TrainConfig().batch_size,
                                           "num_steps": 10,
                                           "num_examples": TrainConfig().num_examples}
    assert bench.SIZES["base"]["data"] == {"batch_size": 128, "num_steps": 20,
                                           "num_examples": 5000}
    assert bench.SIZES["small"]["data"] == {"batch_size": 128, "num_steps": 20,
                                            "num_examples": 2000}
    base = train_sizes.train_sizes("transformer", "base")["model"]
    small = train_sizes.train_sizes("transformer", "small")["model"]
    assert (base["num_hiddens"], base["ffn_num_hiddens"], base["num_heads"],
            base["num_layers"]) == (256, 1024, 8, 4)
    assert (small["num_hiddens"], small["ffn_num_hiddens"], small["num_heads"],
            small["num_layers"]) == (128, 512, 4, 2)
    run = train_sizes.train_sizes("transformer", "base", {"num_heads": 4}, batch_size=32)
    assert run["model"]["num_heads"] == 4 and run["batch_size"] == 32
    assert run["num_examples"] == 5000
    with pytest.raises(ValueError, match="the bahdanau model has no num_heads"):
        train_sizes.train_sizes("bahdanau", "base", {"num_heads": 2})
    with pytest.raises(ValueError, match="size must be one of"):
        bench.bench_train("bahdanau", size="huge")
    with pytest.raises(ValueError, match="peers must include ours and torch"):
        bench.bench_train("bahdanau", peers=("ours",))


def test_help_states_the_sizes(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for size in bench.SIZE_NAMES:
        assert f"{size}: {train_sizes.describe_size(size)}" in text
    assert "transformer: hidden 256, FFN 1024, heads 8, layers 4+4" in text
    assert "batch 128, num_steps 20, 5000 pairs" in text
    assert "--peers" in text and "torch-compile" in text


def test_cli_size_and_overrides_reach_both_peers(tmp_path, capsys):
    """``--size small`` with single settings changed (a tiny model, fewer pairs): the data's and
    the model's settings in the JSON, the same for both peers."""
    path = tmp_path / "train.json"
    status = main(["bench", "train", "--model", "transformer", "--size", "small",
                   "--num-hiddens", "8", "--ffn-num-hiddens", "16", "--num-layers", "1",
                   "--num-examples", "600", "--steps", "2", "--repeats", "5", "--warmup", "0",
                   "--gemm-size", "64", "--torch-threads", "1", "--json", str(path),
                   "--no-progress"])
    assert status == 0
    table = capsys.readouterr().out
    assert "bench train --model transformer --size small:" in table
    assert "batch 128, num_steps 20, 600 pairs" in table
    written = json.loads(path.read_text())
    expected = {**bench.BOOK_MODELS["transformer"], "num_hiddens": 8, "ffn_num_hiddens": 16,
                "num_heads": 4, "num_layers": 1}
    assert written["size"] == "small" and written["settings"]["model"] == expected
    ours, torch = (written["peers"][name]["settings"] for name in ("ours", "torch"))
    for settings in (ours, torch):
        assert settings["model"] == expected and settings["size"] == "small"
        assert (settings["batch_size"], settings["num_steps"], settings["num_examples"]) == \
            (128, 20, 600)
    assert ours["parameters"] == torch["parameters"]
    assert torch["threads"] == 1


def test_cli_scaling_table_runs_every_size(tmp_path, capsys):
    """``--size book,small``: one run per size, in that order, with the same peers and the same
    single settings changed at each (a tiny model, 600 pairs), set side by side in one table;
    the JSON keeps each size's whole record and the table's rows are its figures."""
    path = tmp_path / "scaling.json"
    status = main(["bench", "train", "--model", "transformer", "--size", "book,small",
                   "--num-hiddens", "8", "--ffn-num-hiddens", "16", "--num-heads", "2",
                   "--num-layers", "1", "--num-examples", "600", "--steps", "2", "--repeats", "5",
                   "--warmup", "0", "--gemm-size", "64", "--torch-threads", "1", "--json",
                   str(path), "--no-progress"])
    assert status == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("bench train --model transformer --size book,small:")
               for line in lines)
    header = next(line for line in lines if line.startswith("size "))
    for peer in ("ours", "ours-full", "torch"):
        assert f"{peer} tok/s (%)" in header
    written = json.loads(path.read_text())
    assert written["command"] == "bench train" and written["benchmark"] == "train-scaling"
    assert written["sizes"] == ["book", "small"]
    expected = {**bench.BOOK_MODELS["transformer"], "num_hiddens": 8, "ffn_num_hiddens": 16,
                "num_heads": 2, "num_layers": 1}
    for size, data, run, row in zip(("book", "small"), ((64, 10), (128, 20)), written["runs"],
                                    written["rows"], strict=True):
        assert run["benchmark"] == "train" and run["size"] == row["size"] == size
        assert (run["settings"]["batch_size"], run["settings"]["num_steps"],
                run["settings"]["num_examples"]) == (*data, 600)
        for name in ("ours", "ours-full", "torch"):
            settings = run["peers"][name]["settings"]
            assert settings["model"] == expected and settings["size"] == size
            assert row["peers"][name]["tokens_per_s"] == run["peers"][name]["tokens_per_s"]
            assert _positive(row["peers"][name]["gemm_fraction"])
        assert row["parameters"] == run["peers"]["torch"]["settings"]["parameters"]
        assert row["ratio_as_shipped"] == run["ratio_as_shipped"] > 0
        assert row["ratio_same_work"] == run["ratio_same_work"] > 0
        assert row["ours_compile_s"] == run["peers"]["ours"]["compile_s"]
        assert row["torch_compile_compile_s"] is None  # not asked for
        # The size's line of the table shows its figures.
        line = next(line for line in lines if line.startswith(f"{size} "))
        assert f"{row['parameters']:,}" in line
        assert f"{run['ratio_as_shipped']:.2f}x" in line
        assert f"{run['peers']['ours']['tokens_per_s']:,.0f}" in line


def test_scaling_checks_the_sizes_before_running():
    from jax_attention.bench import train_scaling

    with pytest.raises(ValueError, match="at least one"):
        train_scaling.bench_train_scaling("transformer", ())
    with pytest.raises(ValueError, match="size must be one of"):
        train_scaling.bench_train_scaling("transformer", ("book", "huge"))
    with pytest.raises(ValueError, match="more than once"):
        train_scaling.check_size_names("bahdanau", ("base", "book", "base"))
    assert train_scaling.check_size_names("bahdanau", ["base", "book"]) == ("base", "book")
    # A changed setting is checked at every size before the first runs: three heads divide
    # none of the widths, and a setting the model lacks is refused.
    with pytest.raises(ValueError, match="at size 'book': num_hiddens must be divisible"):
        train_scaling.bench_train_scaling("transformer", ("book", "small"),
                                          sizes={"num_heads": 3})
    with pytest.raises(ValueError, match="at size 'base': num_hiddens must be divisible"):
        train_scaling.check_size_names("transformer", ("book", "base"), {"num_hiddens": 36})
    with pytest.raises(ValueError, match="has no ffn_num_hiddens"):
        train_scaling.check_size_names("bahdanau", ("book",), {"ffn_num_hiddens": 8})
    with pytest.raises(ValueError, match="num_examples"):
        train_scaling.check_size_names("bahdanau", ("book", "base"), num_examples=0)


# --------------------------------------------------------------------------- torch-compile


class _NoCompiler(RuntimeError):
    pass


def _failing_compile(function, **options):
    """What ``torch.compile`` gives without a C++ compiler: a function that fails when called."""
    def compiled(*args, **kwargs):
        raise _NoCompiler("InvalidCxxCompiler: No working C++ compiler found in\n"
                          "torch._inductor.config.cpp.cxx: (None, 'g++')")
    return compiled


def test_torch_compile_failure_skips_the_peer(tmp_path, capsys, monkeypatch):
    """An inductor that cannot compile: the peer is skipped with one line, the others run and the
    command succeeds."""
    import torch

    monkeypatch.setattr(torch, "compile", _failing_compile)
    monkeypatch.setitem(bench.BOOK_MODELS, "bahdanau",
                        {**bench.BOOK_MODELS["bahdanau"], **TINY["bahdanau"]})
    path = tmp_path / "train.json"
    status = main(["bench", "train", "--model", "bahdanau", "--peers", "ours,torch,torch-compile",
                   "--steps", str(STEPS), "--repeats", "5", "--warmup", "0", "--gemm-size", "64",
                   "--torch-threads", "1", "--json", str(path), "--no-progress"])
    assert status == 0
    table = capsys.readouterr().out
    skipped = [line for line in table.splitlines() if "skipped" in line]
    assert skipped == ["torch-compile skipped: torch.compile failed: _NoCompiler: "
                       "InvalidCxxCompiler: No working C++ compiler found in"]
    assert "(as shipped)" in table and "ours / torch-compile" not in table
    written = json.loads(path.read_text())
    peer = written["peers"]["torch-compile"]
    assert peer["status"] == "skipped" and "\n" not in peer["reason"]
    assert peer["settings"]["parameters"] == written["peers"]["ours"]["settings"]["parameters"]
    assert written["settings"]["peers"] == ["ours", "torch", "torch-compile"]
    assert set(written["ratios_tokens_per_s"]) == {"torch"}
    assert _positive(written["peers"]["torch"]["tokens_per_s"])


def test_failure_line():
    assert torch_support.failure_line(ValueError("first\n\nsecond")) == "ValueError: first"
    assert torch_support.failure_line(ValueError()) == "ValueError"
    assert len(torch_support.failure_line(ValueError("x" * 500), limit=50)) == 50


@pytest.mark.slow  # inductor's first compilation of even a tiny step: 1-2 minutes on 2 cores
# Warnings PyTorch raises while it compiles (the suite turns warnings into errors, which
# TorchDynamo would report as its own failure).
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf:UserWarning")
def test_torch_compile_peer_trains_and_reports_its_compilation():
    notices = _Records()
    dynamo = logging.getLogger("torch._dynamo.variables.ctx_manager")
    dynamo.addHandler(notices)
    try:
        record = bench.bench_train("transformer", peers=("ours", "torch", "torch-compile"),
                                   steps=STEPS, repeats=5, warmup=0,
                                   sizes=TINY["transformer"], gemm_size=64, torch_threads=1)
    finally:
        dynamo.removeHandler(notices)
    peer = record["peers"]["torch-compile"]
    assert peer["status"] == "ok", peer.get("reason")
    assert _positive(peer["first_call_s"]) and peer["compile_s"] >= 0
    assert peer["settings"]["compile"]["backend"] == "inductor"
    assert peer["settings"]["parameters"] == record["peers"]["ours"]["settings"]["parameters"]
    assert peer["settings"]["threads"] == 1
    assert _positive(record["ratios_tokens_per_s"]["torch-compile"])
    # The same training as the eager loop: no dropout, the same losses to rounding.
    assert peer["round_losses"] == pytest.approx(record["peers"]["torch"]["round_losses"],
                                                 rel=1e-4)
    assert peer["steps_trained"] == record["peers"]["ours"]["steps_trained"]
    table = bench.format_train(record)
    assert "ours / torch-compile tokens/s" in table
    rows = [line.split() for line in table.splitlines()]
    assert [row[0] for row in rows if len(row) == 6 and row[1].isdigit()] == \
        ["ours", "torch", "torch-compile"]
    # TorchDynamo's notice that it drops Adam.step's profiler region is not printed (its
    # logger's level is raised while the peer compiles).
    assert not [line for line in notices.lines if "will be ignored" in line]


class _Records(logging.Handler):
    """The messages of the records it is given."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def test_the_xla_defaults_peer_is_ours_compiled_without_the_cpu_options():
    """``--peers ours,ours-xla-defaults,torch``: the same step on the same batches, compiled with
    XLA's defaults instead of the library's CPU options (each peer's settings name them): the
    losses agree to float32 rounding, and the record gives its compilation time as ours."""
    from jax_attention.runtime.compilation import CPU_COMPILER_OPTIONS
    from jax_attention.train.loop import train_steps

    record = bench.bench_train("transformer", peers=("ours", "ours-xla-defaults", "torch"),
                               steps=STEPS, repeats=5, warmup=0, sizes=TINY["transformer"],
                               gemm_size=64, torch_threads=1)
    ours, plain = record["peers"]["ours"], record["peers"]["ours-xla-defaults"]
    # What the suite's XLA_FLAGS set themselves (tests/compiler_support.py) is left to them; the
    # rest of the CPU options remain, with their values. (Under `make test`'s flags that is none:
    # both peers then compile alike, and tests/test_compilation.py checks that the options reach
    # XLA; at XLA's defaults, JAX_ATTENTION_TEST_COMPILER=default, ours has them all.)
    options = ours["settings"]["compiler_options"]
    assert options == train_steps.options()
    flags = os.environ.get("XLA_FLAGS", "")
    assert options == {name: value for name, value in CPU_COMPILER_OPTIONS.items()
                       if f"--{name}=" not in flags}
    assert plain["settings"]["compiler_options"] == {}
    assert plain["settings"]["lengths"] == ours["settings"]["lengths"]
    assert plain["flops_per_step"] == ours["flops_per_step"]
    assert plain["round_losses"] == pytest.approx(ours["round_losses"], rel=1e-5)
    assert plain["compile_s"] >= 0 and ours["compile_s"] >= 0
    assert "ours-xla-defaults" in record["ratios_tokens_per_s"]
    assert "ours / ours-xla-defaults tokens/s" in bench.format_train(record)
