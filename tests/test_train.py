"""Kernel-regression training (d2l §11.2.3): falling loss, reproducibility, learned weights."""

from __future__ import annotations

import re
import time
import sys

import numpy as np
import pytest

from jax_attention.train import train_kernel_regression
from tests.fault_support import assert_one_line, run_command
from tests.shared_runs import STEPS_PER_EPOCH, tiny_settings


@pytest.fixture(scope="module")
def run():
    """The book's run (seed 0, 5 epochs, lr 0.5), shared by the tests that only read it."""
    return train_kernel_regression(seed=0, progress=False, log=None)


def test_loss_falls_every_epoch(run):
    assert len(run.losses) == 5
    assert all(np.isfinite(run.losses))
    assert all(later < earlier for earlier, later in zip(run.losses, run.losses[1:]))


def test_w_is_learned(run):
    assert run.w != run.w_init
    assert 0.0 <= run.w_init < 1.0  # the book's uniform initialisation
    assert run.w > 1.0  # the data favour a narrower window than the plain Gaussian kernel


def test_attention_weights_of_the_test_queries(run):
    assert run.weights.shape == (50, 50)
    assert run.y_hat.shape == (50,)
    assert np.all(run.weights >= 0)
    np.testing.assert_allclose(run.weights.sum(axis=1), 1.0, rtol=1e-5)
    # Each prediction is the weighted mean of the training targets.
    np.testing.assert_allclose(run.weights @ run.data["y_train"], run.y_hat, rtol=1e-5, atol=1e-5)
    # Test inputs and training inputs are both sorted: the heaviest key moves right with the query.
    assert np.all(np.diff(run.weights.argmax(axis=1)) >= 0)


def test_learned_kernel_beats_average_pooling(run):
    mse = run.test_mse
    assert set(mse) == {"average_pooling", "gaussian_kernel", "learned_kernel"}
    assert mse["learned_kernel"] < mse["average_pooling"]
    assert mse["gaussian_kernel"] < mse["average_pooling"]


def test_data_and_arguments_are_reported(run):
    assert {name: a.shape for name, a in run.data.items()} == {
        "x_train": (50,), "y_train": (50,), "x_test": (50,), "y_truth": (50,)
    }
    assert all(isinstance(a, np.ndarray) for a in run.data.values())
    assert (run.seed, run.epochs, run.lr, run.n_train) == (0, 5, 0.5, 50)
    assert run.wall_time_s > 0


def test_same_seed_same_run_bit_for_bit(run):
    again = train_kernel_regression(seed=0, progress=False, log=None)
    assert again.losses == run.losses
    assert again.w == run.w
    np.testing.assert_array_equal(again.weights, run.weights)


def test_different_seed_different_run(run):
    other = train_kernel_regression(seed=1, progress=False, log=None)
    assert other.losses != run.losses
    assert other.w != run.w


def test_logs_one_line_per_epoch(capsys):
    lines = []
    result = train_kernel_regression(seed=2, epochs=3, n_train=10, progress=False, log=lines.append)
    assert lines == [f"epoch {i}, loss {loss:.6f}" for i, loss in enumerate(result.losses, start=1)]
    train_kernel_regression(seed=2, epochs=2, n_train=10, progress=True)  # default log=print
    out = capsys.readouterr().out
    assert "epoch 1, loss" in out and "epoch 2, loss" in out
    assert result.weights.shape == (50, 10)


@pytest.mark.parametrize("epochs", [0, -1, 2.5, True, "5"])
def test_rejects_bad_epochs(epochs):
    with pytest.raises(ValueError, match=r"epochs.*got " + re.escape(repr(epochs))):
        train_kernel_regression(epochs=epochs, progress=False, log=None)


@pytest.mark.parametrize("lr", [0.0, -0.5, float("nan"), float("inf"), "0.5"])
def test_rejects_bad_lr(lr):
    with pytest.raises(ValueError, match=r"lr.*got " + re.escape(repr(lr))):
        train_kernel_regression(lr=lr, progress=False, log=None)


def test_rejects_too_few_training_points():
    with pytest.raises(ValueError, match=r"n_train.*got n_train=1"):
        train_kernel_regression(n_train=1, progress=False, log=None)


# --------------------------------------------------------------------------- runs that cannot work


def test_rejects_n_train_that_does_not_fit_before_any_work(monkeypatch):
    import jax_attention.train.kernel_regression as kernel_regression

    def no_work(*args, **kwargs):
        raise AssertionError("the data were built before the memory check")

    monkeypatch.setattr(kernel_regression, "kernel_regression_data", no_work)
    with pytest.raises(ValueError, match=r"n_train=1000000000 needs about \d+ bytes .* but \d+ "
                                         r"bytes .* are available; at most about n_train=\d+"):
        train_kernel_regression(n_train=10**9, progress=False, log=None)


def test_memory_estimate_and_check():
    from jax_attention.train.kernel_regression import (available_memory_bytes,
                                                       check_kernel_regression_fits,
                                                       kernel_regression_bytes)

    assert kernel_regression_bytes(50) == 48 * 50 * 49 + 32 * 50 * 50
    available, source = available_memory_bytes()
    assert available > 0 and source
    check_kernel_regression_fits(50)  # the book's run fits anywhere
    needed = kernel_regression_bytes(1000)
    check_kernel_regression_fits(1000, available=needed)
    with pytest.raises(ValueError, match=rf"n_train=1000 needs about {needed} bytes .* but "
                                         rf"{needed - 1} bytes \(0.0 GiB, given\) are available; "
                                         r"at most about n_train=999 fits"):
        check_kernel_regression_fits(1000, available=needed - 1)


def test_diverging_lr_stops_with_non_finite_error():
    from jax_attention.train import NonFiniteLossError

    # lr 1e38 makes the first SGD step overflow float32: w = inf after epoch 1.
    with pytest.raises(NonFiniteLossError, match=r"diverged at epoch 1 of 5: w became inf") as info:
        train_kernel_regression(lr=1e38, progress=False, log=None)
    assert (info.value.epoch, info.value.step, info.value.batch) == (1, 1, 1)
    # With seed 1 w stays finite one epoch longer and becomes NaN in the second update.
    with pytest.raises(NonFiniteLossError, match=r"at epoch 2 of 5: w became nan") as info:
        train_kernel_regression(lr=1e38, seed=1, progress=False, log=None)
    assert info.value.epoch == 2


def test_cli_n_train_too_large_is_a_usage_error():
    status, out, err = run_command("train", "kernel-regression", "--n-train", "1000000000",
                                   "--no-progress", timeout=120)
    assert status == 2
    line = assert_one_line(err, "jax-attention train kernel-regression: error: "
                                "n_train=1000000000 needs about ", ") are available")
    assert re.search(r"needs about \d+ bytes .* but \d+ bytes \(", line), line
    assert out == ""


def test_cli_diverging_lr_exits_non_finite():
    from jax_attention.cli import EXIT_NONFINITE

    status, out, err = run_command("train", "kernel-regression", "--lr", "1e38", "--no-progress",
                                   timeout=120)
    assert status == EXIT_NONFINITE == 3
    assert_one_line(err, "jax-attention train kernel-regression: error: kernel regression "
                         "diverged at epoch 1 of 5: w became inf", "lr 1e+38")
    assert "learned w" not in out and "nan" not in out


def test_the_log_says_compiling_at_once_then_what_it_took_and_the_time_left(monkeypatch):
    """Progress from the first second, without a terminal: a line before the first call (which
    compiles), one after it with the compile seconds, then epoch lines with the time left — at
    least every ProgressLog.LINE_EVERY_S (0 here: every epoch)."""
    from jax_attention.train import loop, train_bahdanau

    monkeypatch.setattr(loop.ProgressLog, "LINE_EVERY_S", 0.0)
    lines = []
    train_bahdanau(**tiny_settings("bahdanau", epochs=4, log=lines.append), log_every=100)
    assert lines[0].startswith("compiling the training step")
    compiled = lines[1]
    assert compiled.startswith(("compiled the training step in ",
                                "loaded the training step from the compilation cache in "))
    assert f"the first {STEPS_PER_EPOCH} steps took" in compiled  # the first epoch's
    epochs = [line for line in lines if line.startswith("epoch ")]
    assert [line.split(",")[0] for line in epochs] == ["epoch 1", "epoch 2", "epoch 3", "epoch 4"]
    assert all("left" in line for line in epochs[1:-1]) and "left" not in epochs[-1]


def test_the_time_left_comes_from_the_steps_after_the_first_call():
    from jax_attention.train.progress import time_left

    assert time_left(4, 20, None) == ""
    assert time_left(4, 20, (time.perf_counter() - 2.0, 2)) == ", about 16 s left"
    assert time_left(20, 20, (time.perf_counter() - 2.0, 2)) == ""


def test_the_bar_rate_and_eta_leave_out_the_first_call(monkeypatch):
    """On a terminal, the bar's rate and ETA count the epochs after the first call only: a
    first epoch that compiled for seconds no longer shows a rate far too low."""
    import io

    from jax_attention.train.progress import ProgressLog

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr(sys, "stderr", Terminal())
    with ProgressLog(10, desc="test", progress=True, log=None) as bar:
        assert bar.terminal
        bar.bar.start_t -= 5.0  # the first epoch took 5 s, compilation included
        bar.epoch_done()
        bar.restart_clock()
        bar.bar.start_t -= 0.1  # the next two took 0.1 s
        bar.epoch_done()
        bar.epoch_done()
        meter = bar.bar.format_dict
        rate = (meter["n"] - meter["initial"]) / meter["elapsed"]
        assert meter["initial"] == 1 and rate > 10  # 2 epochs in ~0.1 s, not 3 in ~5.1 s
