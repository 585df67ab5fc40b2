"""Nadaraya–Watson regression with a learnable kernel width — d2l §11.2.3, trained with optax.

:func:`train_kernel_regression` trains exactly as the book: full batch, leave-one-out keys and
values, summed squared error, SGD with learning rate 0.5, one step per epoch. Randomness comes
only from ``seed``; on CPU the same seed gives bit-identical losses and ``w``.
"""

from __future__ import annotations

import math
import numbers
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jax_attention._checks import check_setting
from jax_attention.nn.attention_pooling import (
    NWKernelRegression,
    average_pooling,
    kernel_regression_data,
    leave_one_out,
    nadaraya_watson,
)
from jax_attention.train.loop import NonFiniteLossError
from jax_attention.train.progress import ProgressLog

__all__ = ["KernelRegressionResult", "train_kernel_regression", "summed_squared_error",
           "kernel_regression_bytes", "available_memory_bytes", "check_kernel_regression_fits"]

#: Test queries of the run (the book's 50, evenly spaced over ``[0, 5)``).
N_TEST = 50
#: Peak host bytes per entry of the ``n_train x (n_train - 1)`` leave-one-out matrices. The index
#: of :func:`~jax_attention.nn.attention_pooling.leave_one_out` is first built as Python ints (about
#: 36 bytes an entry) and converted to int32; then keys, values, the scores, the weights and
#: their gradients are float32 arrays of that shape. Measured on XLA:CPU: 40 to 45 bytes an entry
#: above the interpreter's own memory at n_train = 3000 and 6000; 48 leaves a margin.
BYTES_PER_TRAIN_ENTRY = 48
#: Per entry of the ``n_test x n_train`` test attention: scores, weights (sown), and the
#: average-pooling and Gaussian-kernel baselines, float32.
BYTES_PER_TEST_ENTRY = 32
#: What :func:`available_memory_bytes` assumes when the machine does not say.
FALLBACK_AVAILABLE_BYTES = 8 * 2**30



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


def kernel_regression_bytes(n_train: int, n_test: int = N_TEST) -> int:
    """Estimated peak host memory, in bytes, of :func:`train_kernel_regression` beyond the
    interpreter's own: :data:`BYTES_PER_TRAIN_ENTRY` per entry of the ``n_train x (n_train - 1)``
    leave-one-out attention, :data:`BYTES_PER_TEST_ENTRY` per entry of the ``n_test x n_train``
    test attention."""
    return (BYTES_PER_TRAIN_ENTRY * n_train * (n_train - 1)
            + BYTES_PER_TEST_ENTRY * n_test * n_train)


def _cgroup_available_bytes() -> int | None:
    """What a cgroup v2 memory limit leaves (``memory.max - memory.current``), if one is set:
    containers often have far less than the machine's MemAvailable."""
    base = "/sys/fs/cgroup"
    try:
        with open(os.path.join(base, "memory.max")) as file:
            limit = file.read().strip()
        if limit == "max":
            return None
        with open(os.path.join(base, "memory.current")) as file:
            current = int(file.read().strip())
        return max(int(limit) - current, 0)
    except (OSError, ValueError):
        return None


def available_memory_bytes() -> tuple[int, str]:
    """``(bytes, where that figure comes from)``: the memory a new allocation can get now.

    Linux's ``MemAvailable`` (``/proc/meminfo``: free memory plus what the kernel can reclaim),
    else the free pages of ``os.sysconf``, else :data:`FALLBACK_AVAILABLE_BYTES`; lowered to what
    a cgroup memory limit leaves, where one is set.
    """
    available, source = None, None
    try:
        with open("/proc/meminfo") as file:
            for line in file:
                if line.startswith("MemAvailable:"):
                    available, source = int(line.split()[1]) * 1024, "MemAvailable of /proc/meminfo"
                    break
    except (OSError, ValueError, IndexError):
        pass
    if available is None:
        try:
            available = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
            source = "free pages (os.sysconf)"
        except (AttributeError, ValueError, OSError):
            available, source = FALLBACK_AVAILABLE_BYTES, "a fixed bound: this system does not say"
    limit = _cgroup_available_bytes()
    if limit is not None and limit < available:
        available, source = limit, "the cgroup memory limit less its usage"
    return available, source


def _gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:.1f} GiB"


def check_kernel_regression_fits(n_train: int, n_test: int = N_TEST,
                                 available: int | None = None) -> None:
    """Raise ``ValueError`` before any work when the run would not fit in memory.

    Args:
      n_train, n_test: the run's sizes.
      available: bytes to compare with (default: :func:`available_memory_bytes`).

    Raises:
      ValueError: naming ``n_train``, the bytes needed (:func:`kernel_regression_bytes`), the
        bytes available and the largest ``n_train`` that would fit.
    """
    needed = kernel_regression_bytes(n_train, n_test)
    source = "given"
    if available is None:
        available, source = available_memory_bytes()
    if needed <= available:
        return
    # The largest n with 48 n (n - 1) + 32 n_test n <= available (the positive root, rounded down).
    a, b = BYTES_PER_TRAIN_ENTRY, BYTES_PER_TEST_ENTRY * n_test - BYTES_PER_TRAIN_ENTRY
    largest = int((-b + math.sqrt(b * b + 4 * a * available)) / (2 * a))
    while largest > 2 and kernel_regression_bytes(largest, n_test) > available:
        largest -= 1
    raise ValueError(
        f"n_train={n_train} needs about {needed} bytes ({_gib(needed)}: the n_train x "
        f"(n_train - 1) leave-one-out attention, {BYTES_PER_TRAIN_ENTRY} bytes an entry) but "
        f"{available} bytes ({_gib(available)}, {source}) are available; at most about "
        f"n_train={largest} fits here")


def _mse(predictions, targets) -> float:
    return float(jnp.mean((predictions - targets) ** 2))


def train_kernel_regression(*, seed: int = 0, epochs: int = 5, lr: float = 0.5, n_train: int = 50,
                            progress: bool = True, log: Callable[[str], object] | None = print
                            ) -> KernelRegressionResult:
    """Train Nadaraya–Watson regression with a learnable width ``w`` — d2l §11.2.3.

    The book's recipe: the data of :func:`~jax_attention.nn.attention_pooling.kernel_regression_data`;
    each training input is a query whose keys and values are all the *other* training points
    (:func:`~jax_attention.nn.attention_pooling.leave_one_out`, ``(n_train, n_train - 1)``), since with
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

    Raises:
      ValueError: a bad argument, or an ``n_train`` whose ``n_train x (n_train - 1)`` attention
        would not fit in the memory available (:func:`check_kernel_regression_fits`), checked
        before any work.
      NonFiniteLossError: the loss of an epoch, or ``w`` after its update, is NaN or Inf (a
        learning rate that makes the SGD step overflow float32); ``epoch`` and ``step`` name it.
    """
    check_setting("epochs", epochs, ("int", 1))
    check_setting("lr", lr, ("positive_float",))
    if isinstance(n_train, numbers.Integral) and not isinstance(n_train, bool) and n_train >= 2:
        check_kernel_regression_fits(int(n_train), N_TEST)  # other values: the data's own check
    start = time.perf_counter()
    # Independent streams for the data and the initial w, both derived from the one seed.
    data_rng, params_rng = jax.random.split(jax.random.key(seed))
    data = kernel_regression_data(data_rng, n_train, N_TEST)
    x_train, y_train, x_test, y_truth = (data[k] for k in ("x_train", "y_train", "x_test", "y_truth"))
    keys, values = leave_one_out(x_train), leave_one_out(y_train)

    model = NWKernelRegression(rngs=nnx.Rngs(params=params_rng))
    w_init = float(model.w[...])
    optimizer = nnx.Optimizer(model, optax.sgd(lr), wrt=nnx.Param)

    losses = []
    with ProgressLog(epochs, desc="kernel regression", progress=progress, log=log) as bar:
        for epoch in range(1, epochs + 1):
            loss = float(_kernel_regression_step(model, optimizer, x_train, keys, values, y_train))
            w = float(model.w[...])
            if not (math.isfinite(loss) and math.isfinite(w)):
                what = (f"the loss is {loss}" if not math.isfinite(loss) else
                        f"w became {w} in its SGD update (loss before it {loss:.6f})")
                raise NonFiniteLossError(
                    f"kernel regression diverged at epoch {epoch} of {epochs}: {what}, with "
                    f"lr {lr:g}; a smaller lr keeps it finite", step=epoch, epoch=epoch, batch=1)
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
