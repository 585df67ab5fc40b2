"""Nadaraya–Watson regression with a learnable kernel width — d2l §11.2.3, trained with optax.

:func:`train_kernel_regression` trains exactly as the book: full batch, leave-one-out keys and
values, summed squared error, SGD with learning rate 0.5, one step per epoch. Randomness comes
only from ``seed``; on CPU the same seed gives bit-identical losses and ``w``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jax_attention._checks import check_setting
from jax_attention.attention_pooling import (
    NWKernelRegression,
    average_pooling,
    kernel_regression_data,
    leave_one_out,
    nadaraya_watson,
)
from jax_attention.train.loop import ProgressLog

__all__ = ["KernelRegressionResult", "train_kernel_regression", "summed_squared_error"]



@dataclass(frozen=True, eq=False)  # eq would compare arrays elementwise
class KernelRegressionResult:
    """What :func:`train_kernel_regression` learned and measured.

    Attributes:
      losses: the training loss (summed squared error over the training set) of each epoch,
        computed before that epoch's update, as the book prints it.
      w: the learned inverse kernel width.
      w_init: ``w`` before training.
      data: NumPy float32 arrays ``x_train (n_train,)``, ``y_train (n_train,)``,
        ``x_test (n_test,)``, ``y_truth (n_test,)``.
      y_hat: ``(n_test,)`` predictions of the trained model on ``x_test``.
      weights: ``(n_test, n_train)`` its attention weights; each row sums to 1.
      test_mse: mean squared error against ``y_truth`` of ``"average_pooling"``,
        ``"gaussian_kernel"`` (non-parametric, ``w = 1``) and ``"learned_kernel"``.
      seed, epochs, lr, n_train: the arguments of the run.
      wall_time_s: seconds for the whole run, compilation included.
    """

    losses: list[float]
    w: float
    w_init: float
    data: dict[str, np.ndarray]
    y_hat: np.ndarray
    weights: np.ndarray
    test_mse: dict[str, float]
    seed: int
    epochs: int
    lr: float
    n_train: int
    wall_time_s: float

    def figures(self) -> dict:
        """The scalar results as JSON-ready Python values (no arrays)."""
        return {
            "losses": list(self.losses),
            "w": self.w,
            "w_init": self.w_init,
            "test_mse": dict(self.test_mse),
            "seed": self.seed,
            "epochs": self.epochs,
            "lr": self.lr,
            "n_train": self.n_train,
            "n_test": int(self.data["x_test"].shape[0]),
            "wall_time_s": self.wall_time_s,
        }


def summed_squared_error(predictions, targets):
    """``sum_i (predictions_i - targets_i)^2``: the book's ``MSELoss(reduction='none')(...).sum()``.

    Args:
      predictions: ``(n,)``.
      targets: ``(n,)``.

    Returns:
      A scalar.
    """
    return jnp.sum((predictions - targets) ** 2)


@nnx.jit
def _kernel_regression_step(model: NWKernelRegression, optimizer: nnx.Optimizer,
                            queries, keys, values, targets):
    """One full-batch SGD step; returns the loss before the update.

    Module level, so that every call of :func:`train_kernel_regression` (same shapes) reuses one
    compiled step instead of tracing a new closure.
    """

    def loss_fn(model):
        return summed_squared_error(model(queries, keys, values), targets)

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss


def _mse(predictions, targets) -> float:
    return float(jnp.mean((predictions - targets) ** 2))


def train_kernel_regression(*, seed: int = 0, epochs: int = 5, lr: float = 0.5, n_train: int = 50,
                            progress: bool = True, log: Callable[[str], object] | None = print
                            ) -> KernelRegressionResult:
    """Train Nadaraya–Watson regression with a learnable width ``w`` — d2l §11.2.3.

    The book's recipe: the data of :func:`~jax_attention.attention_pooling.kernel_regression_data`;
    each training input is a query whose keys and values are all the *other* training points
    (:func:`~jax_attention.attention_pooling.leave_one_out`, ``(n_train, n_train - 1)``), since with
    its own point among the keys the best ``w`` would be infinite (predict every target by itself).
    The loss is the summed squared error over the training set; ``optax.sgd(lr)`` takes one
    full-batch step per epoch. Afterwards every test query attends all training points.

    Args:
      seed: seeds the data and the initial ``w`` (two streams split from ``jax.random.key(seed)``).
      epochs: number of SGD steps (>= 1).
      lr: learning rate (> 0).
      n_train: number of training points (>= 2).
      progress: show a progress bar over the epochs, on stderr when it is a terminal (tqdm's
        ``disable=None``: no bar in logs and CI).
      log: called with ``"epoch {epoch}, loss {loss:.6f}"`` after each epoch, or ``None`` for
        silence. While the bar is shown the call runs in tqdm's external-write mode, so that
        printed lines do not garble the bar.

    Returns:
      A :class:`KernelRegressionResult`.
    """
    check_setting("epochs", epochs, ("int", 1))
    check_setting("lr", lr, ("positive_float",))
    start = time.perf_counter()
    # Independent streams for the data and the initial w, both derived from the one seed.
    data_rng, params_rng = jax.random.split(jax.random.key(seed))
    data = kernel_regression_data(data_rng, n_train)
    x_train, y_train, x_test, y_truth = (data[k] for k in ("x_train", "y_train", "x_test", "y_truth"))
    keys, values = leave_one_out(x_train), leave_one_out(y_train)

    model = NWKernelRegression(rngs=nnx.Rngs(params=params_rng))
    w_init = float(model.w[...])
    optimizer = nnx.Optimizer(model, optax.sgd(lr), wrt=nnx.Param)

    losses = []
    with ProgressLog(epochs, desc="kernel regression", progress=progress, log=log) as bar:
        for epoch in range(1, epochs + 1):
            loss = float(_kernel_regression_step(model, optimizer, x_train, keys, values, y_train))
            losses.append(loss)
            bar.epoch_done(loss=f"{loss:.4f}")
            bar.emit(f"epoch {epoch}, loss {loss:.6f}")

    # A view of the trained model that sows its weights; the training model itself stays lean.
    probe = nnx.with_attributes(model, sow_weights=True)
    y_hat, intermediates = nnx.capture(probe, nnx.Intermediate)(x_test, x_train, y_train)
    (weights,) = intermediates["attention_weights"].get_value()  # one call, one sown value
    y_average, _ = average_pooling(x_test, x_train, y_train)
    y_gaussian, _ = nadaraya_watson(x_test, x_train, y_train, w=1.0)
    test_mse = {
        "average_pooling": _mse(y_average, y_truth),
        "gaussian_kernel": _mse(y_gaussian, y_truth),
        "learned_kernel": _mse(y_hat, y_truth),
    }
    return KernelRegressionResult(
        losses=losses,
        w=float(model.w[...]),
        w_init=w_init,
        data={name: np.asarray(array) for name, array in data.items()},
        y_hat=np.asarray(y_hat),
        weights=np.asarray(weights),
        test_mse=test_mse,
        seed=seed,
        epochs=epochs,
        lr=float(lr),
        n_train=n_train,
        wall_time_s=time.perf_counter() - start,
    )
