"""The `jax-attention` command, run in-process."""

from __future__ import annotations

import json
import subprocess
import sys

import matplotlib.image
import pytest

from jax_attention.cli import main
from jax_attention.train import train_kernel_regression

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_train_kernel_regression_writes_plots_and_json(tmp_path, capsys):
    out, record_path = tmp_path / "plots", tmp_path / "runs" / "kr.json"
    status = main(["train", "kernel-regression", "--seed", "3", "--epochs", "4",
                   "--out", str(out), "--json", str(record_path), "--no-progress"])
    assert status == 0
    printed = capsys.readouterr().out
    assert "epoch 1, loss" in printed and "epoch 4, loss" in printed and "epoch 5" not in printed
    assert "learned w" in printed and "average pooling" in printed and "learned kernel" in printed

    plots = {"fit": out / "kernel_regression_fit.png",
             "attention": out / "kernel_regression_attention.png"}
    for path in plots.values():
        assert path.read_bytes()[:8] == PNG_SIGNATURE
        assert matplotlib.image.imread(path).ndim == 3

    record = json.loads(record_path.read_text())
    direct = train_kernel_regression(seed=3, epochs=4, progress=False, log=None)
    assert record["losses"] == direct.losses  # JSON floats round-trip exactly
    assert record["w"] == direct.w and record["w_init"] == direct.w_init
    assert record["test_mse"] == direct.test_mse
    assert (record["seed"], record["epochs"], record["lr"], record["n_train"]) == (3, 4, 0.5, 50)
    assert record["wall_time_s"] > 0
    assert {"jax", "flax", "optax", "backend"} <= set(record)
    assert record["plots"] == {name: str(path) for name, path in plots.items()}
    # The printed summary carries the same numbers.
    assert f"{direct.w:.6f}" in printed and f"{direct.test_mse['learned_kernel']:.6f}" in printed


def test_json_without_plots(tmp_path, capsys):
    record_path = tmp_path / "r.json"
    assert main(["train", "kernel-regression", "--epochs", "1", "--n-train", "8",
                 "--json", str(record_path), "--no-progress"]) == 0
    record = json.loads(record_path.read_text())
    assert record["plots"] == {} and len(record["losses"]) == 1 and record["n_train"] == 8
    assert list(tmp_path.iterdir()) == [record_path]


@pytest.mark.parametrize("argv", [[], ["train"], ["train", "kernel-regression"]])
def test_help_exits_0(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--help"])
    assert exit_info.value.code == 0
    assert "usage: jax-attention" in capsys.readouterr().out


def test_help_lists_the_commands(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    assert "kernel-regression" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["train", "kernel-regression", "--epochs", "0"], "--epochs: expected an integer >= 1, got 0"),
        (["train", "kernel-regression", "--lr", "-1"], "--lr: expected a finite number > 0"),
        (["train", "kernel-regression", "--lr", "fast"], "--lr: expected a number > 0, got 'fast'"),
        (["train", "kernel-regression", "--n-train", "1"], "--n-train: expected an integer >= 2"),
        (["train", "kernel-regression", "--bogus"], "unrecognized arguments: --bogus"),
        (["train", "no-such-model"], "invalid choice: 'no-such-model'"),
        ([], "required: COMMAND"),
    ],
)
def test_bad_arguments_exit_2(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_out_must_be_a_directory(tmp_path, capsys):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "kernel-regression", "--out", str(not_a_dir), "--no-progress"])
    assert exit_info.value.code == 2
    assert "--out" in capsys.readouterr().err


def test_python_dash_m_runs_the_cli():
    completed = subprocess.run([sys.executable, "-m", "jax_attention", "train", "--help"],
                               capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr
    assert "kernel-regression" in completed.stdout
