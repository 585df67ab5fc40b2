"""Training loops (optax + Flax NNX) for the models of the attention chapter.

:func:`train_kernel_regression` — d2l §11.2.3, Nadaraya–Watson regression with a learnable kernel
width ``w``, trained exactly as in the book: full batch, leave-one-out keys and values, summed
squared error, SGD with learning rate 0.5, one step per epoch.

:func:`train_bahdanau` — d2l §11.4.3, seq2seq with Bahdanau attention on English–French, the
book's ``train_seq2seq``: teacher forcing, masked cross-entropy, Adam, gradients clipped to global
norm 1; :func:`save_checkpoint` and :func:`load_checkpoint` store the result.

Randomness comes only from ``seed``; on CPU the same seed gives bit-identical losses and ``w``.

Long runs of the seq2seq models (``checkpoint_dir=``): training checkpoints every ``N`` steps
(:mod:`jax_attention.checkpointing`, Orbax), resumption bit for bit (``resume=True``), a checkpoint
and :class:`TrainingInterrupted` on SIGINT, and :class:`NonFiniteLossError` — or a skipped step —
when a loss, gradient or update is NaN or Inf, decided inside the compiled steps.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import numbers
import os
import shutil
import signal
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax import lax
from tqdm import tqdm

from jax_attention import distributed
from jax_attention.attention_pooling import (
    NWKernelRegression,
    average_pooling,
    kernel_regression_data,
    leave_one_out,
    nadaraya_watson,
)
from jax_attention.bahdanau import masked_cross_entropy
from jax_attention.checkpointing import DEFAULT_KEEP

__all__ = ["KernelRegressionResult", "train_kernel_regression", "BOOK_PAIRS", "BahdanauResult",
           "train_bahdanau", "evaluate_translations", "Checkpoint", "save_checkpoint",
           "load_checkpoint", "TransformerResult", "train_transformer", "evaluate_held_out",
           "NonFiniteLossError", "TrainingInterrupted"]


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


def _check_epochs_lr(epochs, lr):
    if isinstance(epochs, bool) or not isinstance(epochs, numbers.Integral) or epochs < 1:
        raise ValueError(f"epochs must be an integer >= 1, got {epochs!r}")
    if isinstance(lr, bool) or not isinstance(lr, numbers.Real) or not (math.isfinite(lr) and lr > 0):
        raise ValueError(f"lr must be a finite number > 0, got {lr!r}")


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
    _check_epochs_lr(epochs, lr)
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
    # Updated by hand, not by iterating over it: tqdm's iterator syncs its count only when it
    # redraws, so a bar redrawn after a log line would show a stale epoch.
    with tqdm(total=epochs, desc="kernel regression", unit="epoch",
              disable=None if progress else True, leave=False) as bar:
        for epoch in range(1, epochs + 1):
            loss = float(_kernel_regression_step(model, optimizer, x_train, keys, values, y_train))
            losses.append(loss)
            bar.set_postfix(loss=f"{loss:.4f}", refresh=False)
            bar.update(1)
            if log is not None:
                line = f"epoch {epoch}, loss {loss:.6f}"
                if bar.disable:
                    log(line)
                else:
                    with tqdm.external_write_mode():
                        log(line)

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


# --------------------------------------------------------------------------- Bahdanau seq2seq

#: The book's test sentences and references (d2l §10.7.6 and §11.4.3).
BOOK_PAIRS = (
    ("go .", "va !"),
    ("i lost .", "j'ai perdu ."),
    ("he's calm .", "il est calme ."),
    ("i'm home .", "je suis chez moi ."),
)

CHECKPOINT_FORMAT = "jax-attention.bahdanau-checkpoint/1"
_CHECKPOINT_FILES = ("config.json", "params.npz", "src_vocab.json", "tgt_vocab.json")
_MODEL_KEYS = ("src_vocab_size", "tgt_vocab_size", "embed_size", "num_hiddens", "num_layers",
               "dropout", "num_steps")
TRANSFORMER_CHECKPOINT_FORMAT = "jax-attention.transformer-checkpoint/1"
_TRANSFORMER_MODEL_KEYS = ("src_vocab_size", "tgt_vocab_size", "num_hiddens", "ffn_num_hiddens",
                           "num_heads", "num_layers", "dropout", "num_steps", "max_positions")
# The model kind (config["model"]; absent = "bahdanau", as written before the Transformer) ->
# (format tag, the config keys that size the model).
_CHECKPOINT_KINDS = {"bahdanau": (CHECKPOINT_FORMAT, _MODEL_KEYS),
                     "transformer": (TRANSFORMER_CHECKPOINT_FORMAT, _TRANSFORMER_MODEL_KEYS)}


def _checkpoint_kind(config: dict) -> str:
    kind = config.get("model", "bahdanau")
    if kind not in _CHECKPOINT_KINDS:
        raise ValueError(f"config['model'] must be one of {sorted(_CHECKPOINT_KINDS)}, got {kind!r}")
    return kind


def _expected_param_shapes(kind: str, config: dict) -> dict:
    if kind == "transformer":
        from jax_attention import transformer

        return transformer.flatten_params(transformer.param_shapes(*(config[key] for key in (
            "src_vocab_size", "tgt_vocab_size", "num_hiddens", "ffn_num_hiddens",
            "num_layers"))))
    from jax_attention.bahdanau import flatten_params, param_shapes

    return flatten_params(param_shapes(*(config[key] for key in (
        "src_vocab_size", "tgt_vocab_size", "embed_size", "num_hiddens", "num_layers"))))


@dataclass(frozen=True, eq=False)  # eq would compare arrays elementwise
class BahdanauResult:
    """What :func:`train_bahdanau` trained and measured.

    Attributes:
      losses: the book's loss of each epoch: ``sum`` of the per-sequence losses (masked
        cross-entropy summed over steps, divided by ``num_steps``) over the epoch's batches,
        divided by the number of target tokens — the cross-entropy per token divided by
        ``num_steps``, which is what the book prints (``loss 0.020``).
      cross_entropy: the cross-entropy per target token of each epoch (``losses * num_steps``).
      tokens_per_sec: target tokens per second of each epoch (the first includes compilation).
      model: the trained :class:`~jax_attention.bahdanau.BahdanauSeq2Seq`, in eval mode.
      params: its parameters as the nested dict of NumPy arrays.
      src_vocab, tgt_vocab: the vocabularies of the data.
      config: the model's sizes and the training settings (JSON-ready; stored in checkpoints).
      translations: ``(reference, Translation)`` for each of the book's sentences.
      bleu: the BLEU (``k = 2``) of each translation against its reference.
      wall_time_s: seconds for the whole run (data, compilation, training, translation).
      checkpoint: where the checkpoint was written, or ``None``.
      skipped_steps: steps skipped for a non-finite loss, gradient or update
        (``skip_nonfinite``); 0 otherwise.
      resumed_from_step: the training checkpoint's step this run resumed from, or ``None``.
      checkpoint_dir: the directory of the training checkpoints, or ``None``.
    """

    losses: list[float]
    cross_entropy: list[float]
    tokens_per_sec: list[float]
    model: object
    params: dict
    src_vocab: object
    tgt_vocab: object
    config: dict
    translations: list
    bleu: list[float]
    wall_time_s: float
    checkpoint: Path | None
    skipped_steps: int = 0
    resumed_from_step: int | None = None
    checkpoint_dir: Path | None = None

    def figures(self) -> dict:
        """The results as JSON-ready Python values (no arrays)."""
        return {
            "final_loss": self.losses[-1],
            "final_cross_entropy": self.cross_entropy[-1],
            "tokens_per_sec": self.tokens_per_sec[-1],
            "losses": list(self.losses),
            "cross_entropy": list(self.cross_entropy),
            "tokens_per_sec_per_epoch": list(self.tokens_per_sec),
            "translations": [
                {"source": t.source, "translation": t.translation, "reference": reference,
                 "bleu": score}
                for (reference, t), score in zip(self.translations, self.bleu)
            ],
            "num_bleu_1": sum(score == 1.0 for score in self.bleu),
            "config": self.config,
            "wall_time_s": self.wall_time_s,
            "checkpoint": None if self.checkpoint is None else str(self.checkpoint),
            "skipped_steps": self.skipped_steps,
            "resumed_from_step": self.resumed_from_step,
            "checkpoint_dir": None if self.checkpoint_dir is None else str(self.checkpoint_dir),
        }


def _loss_and_grads(model, src, src_valid_len, dec_input, tgt, tgt_valid_len):
    """``sum`` of the per-sequence teacher-forced losses over the batch, and its gradient.

    The book differentiates ``l.sum()`` (not the mean) over the batch, which matters because the
    gradient is clipped to norm 1 before Adam.
    """

    def loss_fn(model):
        logits = model(src, src_valid_len, dec_input)
        return jnp.sum(masked_cross_entropy(logits, tgt, tgt_valid_len))

    return nnx.value_and_grad(loss_fn)(model)


def _apply_gradients(model, optimizer: nnx.Optimizer, grads) -> None:
    """``optimizer.update(model, grads)`` (clipping, then Adam), in place."""
    # optax's Adam computes its bias correction as `decay ** count`, a Python float to the power
    # of an int32 count, which strict dtype promotion (the tests' setting) rejects; our own code
    # above stays strict.
    with jax.numpy_dtype_promotion("standard"):
        optimizer.update(model, grads)


def _update(model, optimizer: nnx.Optimizer, src, src_valid_len, dec_input, tgt, tgt_valid_len):
    """One teacher-forced Adam step on ``sum`` of the per-sequence losses; returns that sum."""
    loss, grads = _loss_and_grads(model, src, src_valid_len, dec_input, tgt, tgt_valid_len)
    _apply_gradients(model, optimizer, grads)
    return loss


def _pure_step(graphdef, state, batch):
    """:func:`_update` as a pure function of the split ``(model, optimizer)`` state.

    ``batch = (src, src_valid_len, dec_input, tgt, tgt_valid_len)``. The state holds the
    parameters, Adam's moments and step count, and the model's dropout stream (key and count), so
    that a step advances the dropout stream exactly as a call of the model does.
    """
    model, optimizer = nnx.merge(graphdef, state)
    loss = _update(model, optimizer, *batch)
    return nnx.state((model, optimizer)), loss


def _all_finite(tree) -> jax.Array:
    """A boolean scalar: no floating-point leaf of ``tree`` holds NaN or Inf."""
    finite = [jnp.all(jnp.isfinite(leaf)) for leaf in jax.tree.leaves(tree)
              if jnp.issubdtype(leaf.dtype, jnp.inexact)]
    return functools.reduce(jnp.logical_and, finite, jnp.asarray(True))


def _guarded_step(graphdef, state, batch, halted, skip_nonfinite):
    """:func:`_pure_step` that refuses a non-finite update, decided on the device (no host sync).

    A step is *rejected* when its loss, a gradient or an updated parameter is NaN or Inf (a huge
    learning rate can turn finite gradients into infinite parameters). A rejected step leaves the
    parameters and the optimizer's state as they were, so the state never holds NaN:

    - ``skip_nonfinite`` False (stop): the first rejected step sets ``halted``, and every later
      step of the same compiled call is rejected too (dropout stream included), so the state that
      comes back is the one before the bad step — the last good state, for the host to report.
    - ``skip_nonfinite`` True (skip): only the bad step is rejected; the dropout stream still
      advances, so that every later step draws the key it draws in a run without the bad step.

    A step that is not rejected computes exactly what :func:`_pure_step` computes.

    Args:
      batch: ``(src, src_valid_len, dec_input, tgt, tgt_valid_len)``.
      halted: a boolean scalar, True once a step of this call was rejected.
      skip_nonfinite: a boolean scalar (traced: both modes share one compilation).

    Returns:
      ``(state, loss, halted)``: ``loss`` is the step's summed loss, or NaN for a rejected step.
    """

    def is_variable(x):
        return isinstance(x, nnx.Variable)

    # The values before the step: the merged model and optimizer share `state`'s Variables, which
    # the update rebinds in place.
    before = [variable.get_value() for variable in jax.tree.leaves(state, is_leaf=is_variable)]
    model, optimizer = nnx.merge(graphdef, state)
    loss, grads = _loss_and_grads(model, *batch)
    _apply_gradients(model, optimizer, grads)
    ok = jnp.isfinite(loss) & _all_finite(grads) & _all_finite(nnx.state(model, nnx.Param))
    accept = ok & (skip_nonfinite | ~halted)

    def choose(variable, old):
        new = variable.get_value()
        # Skip mode moves the dropout stream on even past a rejected step.
        take = (accept | skip_nonfinite) if isinstance(variable, nnx.RngState) else accept
        if jnp.issubdtype(new.dtype, jax.dtypes.prng_key):  # `where` takes the raw key data
            chosen = jnp.where(take, jax.random.key_data(new), jax.random.key_data(old))
            return variable.replace(jax.random.wrap_key_data(chosen,
                                                             impl=jax.random.key_impl(new)))
        return variable.replace(jnp.where(take, new, old))

    after, treedef = jax.tree.flatten(nnx.state((model, optimizer)), is_leaf=is_variable)
    state = jax.tree.unflatten(treedef, [choose(v, old) for v, old in zip(after, before,
                                                                          strict=True)])
    return state, jnp.where(accept, loss, jnp.nan), halted | ~ok


# Module level, with the graph definition static: every run with the same model structure and
# optimizer (same shapes) reuses one compilation. The state is donated: it is replaced by the
# returned one, and XLA may update the parameters and moments in place.
_jit_step = jax.jit(_pure_step, static_argnums=0, donate_argnums=1)


@functools.partial(jax.jit, static_argnums=(0, 3), donate_argnums=1)
def _train_steps(graphdef, state, batches, bos_id: int, skip_nonfinite=False):
    """Several training steps in one compiled call: ``lax.scan`` of :func:`_guarded_step`.

    ``batches = (src, src_valid_len, tgt, tgt_valid_len)``, each stacked along a leading steps
    axis (``(K, B, T)`` and ``(K, B)``). Step ``k`` trains on batch ``k``, in order, with the
    dropout key that the ``k``-th call of the model would draw: the same updates as ``K`` calls
    of :func:`_bahdanau_step`, without ``K`` dispatches from Python and ``K`` round trips of the
    whole state. The decoder inputs (``<bos>`` + target) are built here, on the device.

    A step whose loss, gradient or update is not finite is rejected (:func:`_guarded_step`): with
    ``skip_nonfinite`` False it and every later step of the call leave the state unchanged;
    with ``skip_nonfinite`` True only that step does (a traced boolean: one compilation serves
    both). Its loss comes back as NaN, so the host finds it in the losses it reads anyway.
    Scanning the ``K`` steps in several calls (``K1`` then ``K - K1`` batches) gives the same
    state and losses, bit for bit on CPU.

    Returns:
      ``(state, losses (K,))``: the state after the ``K`` steps and each step's summed loss (NaN
      for a rejected step).
    """
    from jax_attention.bahdanau import teacher_forcing_inputs

    def body(carry, batch):
        state, halted = carry
        src, src_valid_len, tgt, tgt_valid_len = batch
        dec_input = teacher_forcing_inputs(tgt, bos_id)
        state, loss, halted = _guarded_step(
            graphdef, state, (src, src_valid_len, dec_input, tgt, tgt_valid_len), halted,
            skip_nonfinite)
        return (state, halted), loss

    (state, _), losses = lax.scan(body, (state, jnp.asarray(False)), batches)
    return state, losses


def _bahdanau_step(model, optimizer: nnx.Optimizer, src, src_valid_len, dec_input, tgt,
                   tgt_valid_len):
    """One training step of a seq2seq model in place (:func:`_update`, compiled); returns the loss.

    Splits the model and optimizer, runs the compiled pure step and writes the new state back:
    the step of :func:`_train_steps`, one batch at a time.
    """
    graphdef, state = nnx.split((model, optimizer))
    state, loss = _jit_step(graphdef, state, (src, src_valid_len, dec_input, tgt, tgt_valid_len))
    nnx.update((model, optimizer), state)
    return loss


@functools.lru_cache(maxsize=None)
def _clipped_adam(lr: float) -> optax.GradientTransformation:
    """``clip_by_global_norm(1)`` then ``adam(lr)``; one object per ``lr``.

    The optimizer's transformation is part of the compiled step's static structure: a fresh one
    per run would recompile the step on every call of :func:`train_bahdanau` in a process.
    """
    return optax.chain(optax.clip_by_global_norm(1.0), optax.adam(lr))


def _check_positive_int(name, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


def _pad_batch(batch, batch_size: int, src_pad: int, tgt_pad: int):
    """The last, smaller batch filled up to ``batch_size`` with rows of target valid length 0.

    Their masked loss is exactly 0, and so are their gradients, so the step computes the book's
    loss and gradient of the smaller batch — with one compiled shape instead of two.
    """
    src, src_valid_len, tgt, tgt_valid_len = batch
    missing = batch_size - src.shape[0]
    if missing == 0:
        return batch
    return (np.concatenate([src, np.full((missing, src.shape[1]), src_pad, src.dtype)]),
            np.concatenate([src_valid_len, np.ones(missing, src_valid_len.dtype)]),
            np.concatenate([tgt, np.full((missing, tgt.shape[1]), tgt_pad, tgt.dtype)]),
            np.concatenate([tgt_valid_len, np.zeros(missing, tgt_valid_len.dtype)]))


def evaluate_translations(params, src_vocab, tgt_vocab, num_steps: int, pairs=BOOK_PAIRS, *,
                          k: int = 2, translate: Callable | None = None):
    """Translate each ``(source, reference)`` of ``pairs`` and score it with BLEU (``k``).

    ``translate(params, sentences, src_vocab, tgt_vocab, num_steps)`` defaults to
    :func:`jax_attention.bahdanau.translate`.

    Returns:
      ``(translations, scores)``: ``[(reference, Translation)]`` and the BLEU of each.
    """
    from jax_attention.metrics import bleu

    if translate is None:
        from jax_attention.bahdanau import translate

    pairs = list(pairs)
    results = translate(params, [source for source, _ in pairs], src_vocab, tgt_vocab, num_steps)
    scores = [bleu(t.translation, reference, k) for (_, reference), t in zip(pairs, results)]
    return [(reference, t) for (_, reference), t in zip(pairs, results)], scores


def _epoch_batches(nmt, epoch: int):
    """The batches of ``epoch`` (0-based), padded (:func:`_pad_batch`) and stacked along a steps axis.

    Returns:
      ``((src, src_valid_len, tgt, tgt_valid_len), num_tokens)``: ``int32`` arrays ``(K, B, T)``
      and ``(K, B)`` for the epoch's ``K`` batches, in :meth:`~jax_attention.data.
      TranslationData.batches` order, and the number of target tokens (the valid lengths' sum).
    """
    src_pad, tgt_pad = nmt.src_vocab["<pad>"], nmt.tgt_vocab["<pad>"]
    padded = [_pad_batch(batch, nmt.batch_size, src_pad, tgt_pad) for batch in nmt.batches(epoch)]
    stacked = tuple(np.stack(arrays) for arrays in zip(*padded))
    return stacked, int(stacked[3].sum())


class NonFiniteLossError(FloatingPointError):
    """Training stopped at a step whose loss, gradient or parameter update was NaN or Inf.

    The model holds the state before that step; no checkpoint is written of it, so the newest
    training checkpoint (if any) is the last good one. Resuming with ``skip_nonfinite=True``
    (``--skip-nonfinite``) skips such steps instead.

    Attributes:
      step: the bad step's number, counted from 1 over the whole run.
      epoch, batch: its epoch and its batch within the epoch, counted from 1.
      checkpoint: the newest training checkpoint's directory, or ``None``.
    """

    def __init__(self, message: str, *, step: int, epoch: int, batch: int,
                 checkpoint: Path | None):
        super().__init__(message)
        self.step, self.epoch, self.batch, self.checkpoint = step, epoch, batch, checkpoint


class TrainingInterrupted(KeyboardInterrupt):
    """SIGINT (Ctrl-C) stopped training after a completed step, and the state was saved.

    A subclass of :class:`KeyboardInterrupt`, so that code that handles Ctrl-C handles it too; the
    CLI prints its message and exits with status 130 (128 + SIGINT, the shell's convention).

    Attributes:
      step: the steps done, which is the step of the checkpoint.
      checkpoint: the training checkpoint's directory.
    """

    def __init__(self, message: str, *, step: int, checkpoint: Path):
        super().__init__(message)
        self.step, self.checkpoint = step, checkpoint


@dataclass
class _Progress:
    """Where a seq2seq training run stands, besides its NNX state: what a resumed run needs to
    return what the uninterrupted run returns (stored as a training checkpoint's JSON record).

    ``step`` counts the steps done; the epoch in progress is ``step // steps_per_epoch`` and its
    next batch ``step % steps_per_epoch``. ``epoch_loss_sum`` sums that epoch's batch losses so
    far in float64, in batch order (JSON keeps a float exactly), so that its loss comes out the
    same bit for bit whether or not the run stopped within it.
    """

    step: int = 0
    losses: list = field(default_factory=list)
    tokens_per_sec: list = field(default_factory=list)
    epoch_loss_sum: float = 0.0
    epoch_tokens: int = 0
    epoch_seconds: float = 0.0
    skipped_steps: int = 0

    def add(self, losses: np.ndarray, tokens: np.ndarray) -> None:
        """Count steps with these summed ``losses`` (NaN: rejected) and target ``tokens``."""
        for loss, count in zip(losses, tokens):
            if np.isfinite(loss):
                self.epoch_loss_sum += float(loss)
                self.epoch_tokens += int(count)
            else:
                self.skipped_steps += 1
        self.step += len(losses)

    def end_epoch(self) -> None:
        """Record the finished epoch's loss per target token and tokens/s."""
        tokens = self.epoch_tokens
        self.losses.append(self.epoch_loss_sum / tokens if tokens else math.nan)
        self.tokens_per_sec.append(tokens / self.epoch_seconds if self.epoch_seconds else 0.0)
        self.epoch_loss_sum, self.epoch_tokens, self.epoch_seconds = 0.0, 0, 0.0

    def record(self, steps_per_epoch: int) -> dict:
        """The JSON-ready record of a training checkpoint."""
        return {**asdict(self), "epoch": self.step // steps_per_epoch,
                "batch": self.step % steps_per_epoch, "steps_per_epoch": steps_per_epoch}

    @classmethod
    def from_record(cls, record: dict, steps_per_epoch: int, where: str) -> _Progress:
        """The inverse of :meth:`record`, checked against this run's ``steps_per_epoch``."""
        from jax_attention.checkpointing import CheckpointMismatchError

        missing = [name for name in cls.__dataclass_fields__ if name not in record]
        if missing:
            raise CheckpointMismatchError(f"cannot resume from {where}: its progress record "
                                          f"lacks {missing} (another format?)")
        if record.get("steps_per_epoch") != steps_per_epoch:
            raise CheckpointMismatchError(
                f"cannot resume from {where}: it has {record.get('steps_per_epoch')!r} steps per "
                f"epoch, this run {steps_per_epoch} (different data?)")
        return cls(**{name: record[name] for name in cls.__dataclass_fields__})


@contextlib.contextmanager
def _sigint_requests(enabled: bool):
    """Turn the first SIGINT (Ctrl-C) into a request, checked between compiled calls.

    Yields an event that the first SIGINT sets. That handler then puts the previous one back, so
    that a second Ctrl-C interrupts at once (a half-written checkpoint is never a checkpoint:
    Orbax renames a step's directory only when it is complete). Nothing is installed when not
    ``enabled``, off the main thread (Python runs signal handlers there only), or when SIGINT is
    ignored (``nohup``, a background job): the previous behaviour stays.
    """
    requested = threading.Event()
    previous = signal.getsignal(signal.SIGINT)
    if (not enabled or threading.current_thread() is not threading.main_thread()
            or previous in (signal.SIG_IGN, None)):
        yield requested
        return

    def handler(signum, frame):
        requested.set()
        signal.signal(signal.SIGINT, previous)

    signal.signal(signal.SIGINT, handler)
    try:
        yield requested
    finally:
        signal.signal(signal.SIGINT, previous)


def _long_run_options(checkpoint_dir, checkpoint_every, keep, resume, skip_nonfinite) -> dict:
    """The training-checkpoint and non-finite arguments, checked, as :func:`_train_epochs`'s
    keyword arguments."""
    if checkpoint_every is not None:
        _check_positive_int("checkpoint_every", checkpoint_every)
    _check_positive_int("keep", keep)
    for name, value in (("resume", resume), ("skip_nonfinite", skip_nonfinite)):
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be True or False, got {value!r}")
    if checkpoint_dir is None and checkpoint_every is not None:
        raise ValueError(f"checkpoint_every = {checkpoint_every!r} needs a checkpoint_dir, "
                         "got None")
    if checkpoint_dir is None and resume:
        raise ValueError("resume = True needs a checkpoint_dir, got None")
    return {"checkpoint_dir": checkpoint_dir, "checkpoint_every": checkpoint_every, "keep": keep,
            "resume": resume, "skip_nonfinite": skip_nonfinite}


@dataclass(frozen=True)
class _EpochsResult:
    losses: list
    tokens_per_sec: list
    skipped_steps: int
    resumed_from_step: int | None


def _training_mesh(devices, batch_size: int, checkpoint_dir, *, model: int = 1):
    """The device mesh of a training run (:func:`jax_attention.distributed.make_mesh`), after
    starting the multi-process runtime when the environment asks for it; checks that the batch
    splits over the ``data`` axis.

    Raises:
      ValueError: see :func:`~jax_attention.distributed.make_mesh` and
        :func:`~jax_attention.distributed.check_batch_size`; ``checkpoint_dir`` in a
        multi-process run, whose training checkpoints would need every process to write its
        part of one Orbax checkpoint together (not implemented).
    """
    distributed.initialize_from_env()  # before anything starts JAX's backends
    if checkpoint_dir is not None and jax.process_count() > 1:
        raise ValueError(f"checkpoint_dir (--checkpoint-dir) is not supported in a multi-process "
                         f"run ({jax.process_count()} processes); train without it, or in one "
                         f"process")
    mesh = distributed.make_mesh(devices, model=model)
    distributed.check_batch_size(batch_size, mesh)
    return mesh


def _train_epochs(model, optimizer: nnx.Optimizer, nmt, *, epochs: int, desc: str, progress: bool,
                  log, log_every: int, config: dict, checkpoint_dir=None,
                  checkpoint_every: int | None = None, keep: int = DEFAULT_KEEP,
                  resume: bool = False, skip_nonfinite: bool = False, mesh=None) -> _EpochsResult:
    """The teacher-forced epochs shared by the seq2seq models (any ``model(src, src_valid_len,
    dec_input) -> logits``), with training checkpoints; returns the per-epoch loss per target
    token, tokens/sec, the skipped steps and the step resumed from.

    The model and optimizer are split once; the steps run in compiled calls of
    :func:`_train_steps` over stacked batches, one device sync (their losses) per call. The steps
    are those of :func:`_bahdanau_step` batch after batch — same batches, order, dropout keys and
    updates — without a Python dispatch, an NNX split/merge of the whole state and a host round
    trip per step, which took a large part of the step time of these small models. Without
    training checkpoints each epoch is one call; with ``checkpoint_every = N`` a call also ends
    at every multiple of ``N`` steps (counted over the run), where a checkpoint is saved — which
    changes no result: scanning an epoch in pieces is bit-identical on CPU. The model and
    optimizer get the trained state back at the end, in a ``finally`` block.

    With ``checkpoint_dir``, a training checkpoint (:class:`jax_attention.checkpointing.
    TrainingCheckpoints`) is written every ``checkpoint_every`` steps (``None``: at the end of
    every epoch), at the end, and on SIGINT (then :class:`TrainingInterrupted` is raised); with
    ``resume`` the run continues from the newest one (or starts afresh when there is none).

    A step whose loss, gradient or update is not finite stops training with
    :class:`NonFiniteLossError` (``skip_nonfinite=False``), or is skipped and counted: its loss
    and target tokens are left out of its epoch's loss (an epoch whose every step was skipped
    has loss NaN).

    ``mesh`` (:func:`jax_attention.distributed.make_mesh`; ``None``: this process's first device)
    places the state (replicated, or split over a ``model`` axis) and splits every batch over
    its ``data`` axis; the compiled step is the same, XLA's partitioner splits the work.
    """
    mesh = distributed.make_mesh(1) if mesh is None else mesh
    bos_id = nmt.tgt_vocab["<bos>"]
    steps_per_epoch = nmt.num_batches
    total = epochs * steps_per_epoch
    graphdef, state = nnx.split((model, optimizer))
    done = _Progress()
    resumed_from = None
    checkpoints = None
    pending = []  # lines to log once the bar is up

    def position(step: int) -> str:
        """Where step ``step + 1`` is, in words."""
        if step == total:
            return f"all {total} steps done"
        epoch, batch = divmod(step, steps_per_epoch)
        return f"epoch {epoch + 1}, batch {batch + 1} of {steps_per_epoch}"

    try:
        if checkpoint_dir is not None:
            from jax_attention.checkpointing import TrainingCheckpoints

            checkpoints = TrainingCheckpoints(checkpoint_dir, config=config, keep=keep)
            if resume:
                restored = checkpoints.restore(state)
                if restored is None:
                    pending.append(f"no training checkpoint in {checkpoints.directory} yet; "
                                   "starting from step 0")
                else:
                    state, record = restored
                    done = _Progress.from_record(
                        record, steps_per_epoch,
                        f"training checkpoint {record['step']} in {checkpoints.directory}")
                    resumed_from = done.step
                    pending.append(f"resumed from training checkpoint {done.step} in "
                                   f"{checkpoints.directory} (next: {position(done.step)})")
            elif checkpoints.steps:
                raise FileExistsError(
                    f"{checkpoints.directory} holds training checkpoints already (steps "
                    f"{checkpoints.steps}); resume that run (resume=True, --resume) or choose "
                    "another directory")
        if done.step > total:
            raise ValueError(f"epochs = {epochs} ({total} steps) is fewer than the "
                             f"{done.step} steps of the checkpoint resumed from; pass at least "
                             f"{-(-done.step // steps_per_epoch)}")
        saved = done.step if resumed_from is not None else None
        # After the restore, which fills a state of one device's arrays.
        state = distributed.place_state(state, mesh)
        with _sigint_requests(checkpoints is not None) as stop_requested, \
                tqdm(total=epochs, initial=len(done.losses), desc=desc, unit="epoch",
                     disable=None if progress else True, leave=False) as bar:

            def emit(line: str) -> None:
                if log is None:
                    return
                if bar.disable:
                    log(line)
                else:
                    with tqdm.external_write_mode():
                        log(line)

            for line in pending:
                emit(line)
            loaded_epoch = None
            while done.step < total:
                start = time.perf_counter()
                epoch, batch = divmod(done.step, steps_per_epoch)
                if loaded_epoch != epoch:
                    batches, _ = _epoch_batches(nmt, epoch)
                    batch_tokens = batches[3].sum(axis=1)
                    loaded_epoch = epoch
                # The call runs to the end of the epoch or to the next checkpoint boundary.
                end = steps_per_epoch
                if checkpoint_every is not None:
                    boundary = (done.step // checkpoint_every + 1) * checkpoint_every
                    end = min(end, boundary - epoch * steps_per_epoch)
                chunk = batches if (batch, end) == (0, steps_per_epoch) else tuple(
                    array[batch:end] for array in batches)
                chunk = distributed.shard_batches(chunk, mesh)  # each device its rows
                state, losses = _train_steps(graphdef, state, chunk, bos_id, skip_nonfinite)
                losses = distributed.to_host(losses)  # the call's one device sync
                done.epoch_seconds += time.perf_counter() - start
                rejected = ~np.isfinite(losses)
                if rejected.any() and not skip_nonfinite:
                    # The state is the one before the bad step (_guarded_step); nothing saved.
                    first = int(np.argmax(rejected))
                    done.add(losses[:first], batch_tokens[batch:batch + first])
                    latest = checkpoints.steps[-1] if checkpoints and checkpoints.steps else None
                    kept = (f"the last training checkpoint is step {latest} in "
                            f"{checkpoints.directory}" if latest is not None
                            else "no training checkpoint was written")
                    raise NonFiniteLossError(
                        f"non-finite loss, gradient or parameter update (NaN or Inf) at step "
                        f"{done.step + 1} ({position(done.step)}); training stopped, {kept}. "
                        "A lower learning rate may avoid it; --skip-nonfinite (skip_nonfinite="
                        "True) skips such steps", step=done.step + 1,
                        epoch=epoch + 1, batch=batch + first + 1,
                        checkpoint=None if latest is None else checkpoints.step_path(latest))
                if rejected.any():
                    numbers = [done.step + 1 + int(k) for k in np.flatnonzero(rejected)]
                    emit(f"skipped {len(numbers)} step(s) with a non-finite loss, gradient or "
                         f"update: step {', '.join(map(str, numbers[:5]))}"
                         + (", ..." if len(numbers) > 5 else ""))
                done.add(losses, batch_tokens[batch:end])
                if done.step % steps_per_epoch == 0:
                    done.end_epoch()
                    bar.set_postfix(loss=f"{done.losses[-1]:.4f}",
                                    tok_s=f"{done.tokens_per_sec[-1]:.0f}", refresh=False)
                    bar.update(1)
                    finished = len(done.losses)
                    if finished % log_every == 0 or finished == epochs:
                        emit(f"epoch {finished}, loss {done.losses[-1]:.4f}, "
                             f"{done.tokens_per_sec[-1]:.1f} tokens/sec")
                if checkpoints is not None:
                    due = (done.step == total or stop_requested.is_set()
                           or (done.step % checkpoint_every == 0 if checkpoint_every is not None
                               else done.step % steps_per_epoch == 0))
                    if due and saved != done.step:
                        checkpoints.save(done.step, distributed.to_local(state),
                                         done.record(steps_per_epoch))
                        saved = done.step
                if stop_requested.is_set() and done.step < total:
                    raise TrainingInterrupted(
                        f"interrupted (SIGINT) after step {done.step} (next: "
                        f"{position(done.step)});"
                        f" saved training checkpoint {done.step} in {checkpoints.directory}; "
                        "resume with --resume (resume=True)", step=done.step,
                        checkpoint=checkpoints.step_path(done.step))
    finally:
        nnx.update((model, optimizer), distributed.to_local(state))
        if checkpoints is not None:
            checkpoints.close()
    return _EpochsResult(losses=done.losses, tokens_per_sec=done.tokens_per_sec,
                         skipped_steps=done.skipped_steps, resumed_from_step=resumed_from)


def _bahdanau_setup(*, embed_size: int, num_hiddens: int, num_layers: int, dropout: float,
                    batch_size: int, num_steps: int, lr: float, num_examples: int, seed: int,
                    data=None):
    """The data, the model (in training mode) and the optimizer of :func:`train_bahdanau`, before
    its first step: ``(nmt, model, optimizer)``."""
    from jax_attention.bahdanau import BahdanauSeq2Seq
    from jax_attention.data import load_data_nmt

    nmt = load_data_nmt(batch_size, num_steps, num_examples, data=data, seed=seed)
    # Dropout masks come from an "rbg" key (XLA's RngBitGenerator): on CPU the threefry
    # generator's kernels for the masks' shapes roughly double the step's compilation time. Both
    # are deterministic on a given backend.
    params_rng, dropout_rng = jax.random.key(seed), jax.random.key(seed, impl="rbg")
    model = BahdanauSeq2Seq(len(nmt.src_vocab), len(nmt.tgt_vocab), embed_size, num_hiddens,
                            num_layers, dropout,
                            rngs=nnx.Rngs(params=params_rng, dropout=dropout_rng))
    model.train()
    return nmt, model, nnx.Optimizer(model, _clipped_adam(float(lr)), wrt=nnx.Param)


def _result_fields(trained, model, params: dict, src_vocab, tgt_vocab, config: dict,
                   translations, scores, *, start: float, checkpoint, checkpoint_dir) -> dict:
    """The fields of :class:`BahdanauResult` shared by the seq2seq trainers, after writing the
    trained model to ``checkpoint`` (process 0 alone in a multi-process run).

    Args:
      trained: what :func:`_train_epochs` returned. model: the trained model, in eval mode;
      params: its parameters (NumPy). start: the run's ``time.perf_counter()`` at its start.
    """
    written = None
    if checkpoint is not None and distributed.is_main_process():
        written = save_checkpoint(checkpoint, params, src_vocab, tgt_vocab, config)
    return {
        "losses": trained.losses,
        "cross_entropy": [loss * config["num_steps"] for loss in trained.losses],
        "tokens_per_sec": trained.tokens_per_sec,
        "model": model, "params": params, "src_vocab": src_vocab, "tgt_vocab": tgt_vocab,
        "config": config, "translations": translations, "bleu": scores,
        "wall_time_s": time.perf_counter() - start,
        "checkpoint": written,
        "skipped_steps": trained.skipped_steps,
        "resumed_from_step": trained.resumed_from_step,
        "checkpoint_dir": None if checkpoint_dir is None else Path(checkpoint_dir),
    }


def train_bahdanau(*, embed_size: int = 32, num_hiddens: int = 32, num_layers: int = 2,
                   dropout: float = 0.1, batch_size: int = 64, num_steps: int = 10,
                   lr: float = 0.005, epochs: int = 250, num_examples: int = 600, seed: int = 0,
                   data: str | os.PathLike | None = None, checkpoint: str | os.PathLike | None = None,
                   progress: bool = True, log: Callable[[str], object] | None = print,
                   log_every: int = 10, checkpoint_dir: str | os.PathLike | None = None,
                   checkpoint_every: int | None = None, keep: int = DEFAULT_KEEP,
                   resume: bool = False, skip_nonfinite: bool = False,
                   devices: int | None = None) -> BahdanauResult:
    """Train seq2seq with Bahdanau attention on English–French — d2l §11.4.3 (``train_seq2seq``).

    The book's recipe and defaults: the first ``num_examples`` pairs (:func:`jax_attention.data.
    load_data_nmt`), shuffled mini-batches; decoder inputs ``<bos>`` + target[:-1] (teacher
    forcing); the per-sequence masked cross-entropy (:func:`~jax_attention.bahdanau.
    masked_cross_entropy`) summed over the batch; its gradient clipped to global norm 1, then
    Adam (``lr``). Dropout is on during training and off for the final translations.

    Deterministic from ``seed``: it seeds the batch order (the data's ``seed``), the parameters
    (``jax.random.key(seed)``) and the dropout masks (``jax.random.key(seed, impl="rbg")``); on
    CPU the same seed gives the same losses bit for bit. The last, smaller batch of an epoch is
    filled up with rows of target length 0, which add exactly nothing to the loss and gradient.

    Args:
      embed_size, num_hiddens, num_layers, dropout: the model (book: 32, 32, 2, 0.1).
      batch_size, num_steps, lr, epochs, num_examples: the data and the training (book: 64, 10,
        0.005, 250, 600).
      seed: seeds everything (>= 0).
      data: where the English–French data is (``--data``); ``None`` looks in the usual places.
      checkpoint: a directory to write the trained model into (:func:`save_checkpoint`), or ``None``.
      progress: show a progress bar over the epochs (stderr, only on a terminal).
      log: called with ``"epoch {e}, loss {loss:.4f}, {tokens/sec:.1f} tokens/sec"`` every
        ``log_every`` epochs (and after the last), or ``None``.
      log_every: the logging period in epochs.
      checkpoint_dir: a directory for training checkpoints (:mod:`jax_attention.checkpointing`:
        parameters, Adam's state, the dropout stream, the step, the data-order position and the
        loss history, written atomically with Orbax), or ``None`` for none. Not the exported
        model of ``checkpoint``.
      checkpoint_every: write a training checkpoint every this many steps (batches), counted
        over the run; ``None``: at the end of every epoch. One is also written at the end and
        on SIGINT (Ctrl-C), after which :class:`TrainingInterrupted` is raised.
      keep: how many of the newest training checkpoints to keep (>= 1).
      resume: continue from the newest readable training checkpoint in ``checkpoint_dir`` (start
        afresh when there is none). The run then returns what the uninterrupted run returns,
        bit for bit on CPU (the tokens/sec aside). Refused (:class:`~jax_attention.
        checkpointing.CheckpointMismatchError`) when the checkpoint's configuration differs
        from this one; only ``epochs`` may grow.
      skip_nonfinite: a step whose loss, gradient or parameter update is NaN or Inf is skipped
        (no update; counted in ``skipped_steps``) instead of stopping training with
        :class:`NonFiniteLossError`.
      devices: train on this many devices (``--devices``; ``None``: all), data parallel: the
        state replicated, each batch split over them (``batch_size`` must divide by
        ``devices``); the same losses and parameters as on one device up to float32 rounding.
        In a multi-process run (:func:`jax_attention.distributed.initialize_from_env`) the
        count is over every process's devices; process 0 alone logs and writes ``checkpoint``.

    Returns:
      A :class:`BahdanauResult`, with the book's four sentences translated and scored.

    Raises:
      NonFiniteLossError: a step was not finite (and ``skip_nonfinite`` is False).
      TrainingInterrupted: SIGINT, with ``checkpoint_dir`` (without it Ctrl-C raises a plain
        :class:`KeyboardInterrupt`, as before).
      FileExistsError: ``checkpoint_dir`` holds training checkpoints and ``resume`` is False.
    """
    for name, value in (("embed_size", embed_size), ("num_hiddens", num_hiddens),
                        ("num_layers", num_layers), ("batch_size", batch_size),
                        ("num_steps", num_steps), ("num_examples", num_examples),
                        ("log_every", log_every)):
        _check_positive_int(name, value)
    _check_epochs_lr(epochs, lr)
    if isinstance(dropout, bool) or not isinstance(dropout, numbers.Real) or not 0 <= dropout < 1:
        raise ValueError(f"dropout must be a number with 0 <= dropout < 1, got {dropout!r}")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
    long_run = _long_run_options(checkpoint_dir, checkpoint_every, keep, resume,
                                 skip_nonfinite)
    mesh = _training_mesh(devices, batch_size, checkpoint_dir)
    if not distributed.is_main_process():
        progress, log = False, None

    start = time.perf_counter()
    nmt, model, optimizer = _bahdanau_setup(
        embed_size=embed_size, num_hiddens=num_hiddens, num_layers=num_layers, dropout=dropout,
        batch_size=batch_size, num_steps=num_steps, lr=lr, num_examples=num_examples, seed=seed,
        data=data)
    src_vocab, tgt_vocab = nmt.src_vocab, nmt.tgt_vocab
    config = {
        "model": "bahdanau",
        "src_vocab_size": len(src_vocab), "tgt_vocab_size": len(tgt_vocab),
        "embed_size": embed_size, "num_hiddens": num_hiddens, "num_layers": num_layers,
        "dropout": float(dropout), "num_steps": num_steps,
        "training": {"batch_size": batch_size, "lr": float(lr), "epochs": epochs,
                     "num_examples": num_examples, "seed": seed, "clip_global_norm": 1.0,
                     "optimizer": "adam", "loss": "d2l MaskedSoftmaxCELoss, summed over the batch"},
    }

    trained = _train_epochs(model, optimizer, nmt, epochs=epochs, desc="bahdanau",
                            progress=progress, log=log, log_every=log_every, config=config,
                            mesh=mesh, **long_run)

    model.eval()
    params = jax.tree.map(np.asarray, model.params_dict())
    translations, scores = evaluate_translations(params, src_vocab, tgt_vocab, num_steps)
    return BahdanauResult(**_result_fields(
        trained, model, params, src_vocab, tgt_vocab, config, translations, scores, start=start,
        checkpoint=checkpoint, checkpoint_dir=checkpoint_dir))


# --------------------------------------------------------------------------- checkpoints


@dataclass(frozen=True, eq=False)
class Checkpoint:
    """A loaded checkpoint (:func:`load_checkpoint`).

    Attributes:
      params: the nested parameter dict, JAX arrays.
      src_vocab, tgt_vocab: :class:`jax_attention.data.Vocab`.
      config: the model's sizes (``num_steps`` included), the training settings and versions.
      path: the directory it was read from.
    """

    params: dict
    src_vocab: object
    tgt_vocab: object
    config: dict
    path: Path


def _versions() -> dict:
    import flax

    from jax_attention import __version__

    return {"jax-attention": __version__, "jax": jax.__version__, "flax": flax.__version__,
            "optax": optax.__version__, "numpy": np.__version__}


def save_checkpoint(directory: str | os.PathLike, params: dict, src_vocab, tgt_vocab,
                    config: dict) -> Path:
    """Write a checkpoint directory, atomically: ``params.npz``, the vocabularies, ``config.json``.

    ``params.npz`` holds the flattened parameter dict, keyed by paths such as
    ``encoder/gru/layer_0/W_x``; ``src_vocab.json`` and ``tgt_vocab.json`` are
    :meth:`~jax_attention.data.Vocab.to_json`; ``config.json`` holds ``config`` (the model sizes,
    ``num_steps`` included, and any training settings) with the format tag and the versions.
    Everything is written into a temporary sibling directory that is then renamed onto
    ``directory``, so that an interrupted save never leaves a half-written checkpoint there. An
    existing checkpoint at ``directory`` is replaced; any other non-empty directory is refused.

    Returns:
      ``directory`` as a :class:`~pathlib.Path`.

    Raises:
      FileExistsError: ``directory`` exists and is a file, or a non-empty directory that is not a
        checkpoint.
      ValueError: ``config`` lacks a model size.
    """
    from jax_attention.bahdanau import flatten_params

    directory = Path(directory)
    kind = _checkpoint_kind(config)
    checkpoint_format, model_keys = _CHECKPOINT_KINDS[kind]
    missing = [key for key in model_keys if key not in config]
    if missing:
        raise ValueError(f"config must hold the model sizes {list(model_keys)}; missing {missing}")
    if directory.exists():
        if not directory.is_dir():
            raise FileExistsError(f"checkpoint {str(directory)!r} exists and is not a directory")
        if any(directory.iterdir()) and not (directory / "config.json").is_file():
            raise FileExistsError(f"checkpoint {str(directory)!r} is a non-empty directory that "
                                  "holds no checkpoint; refusing to overwrite it")
    directory.parent.mkdir(parents=True, exist_ok=True)
    temporary = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", suffix=".tmp",
                                      dir=directory.parent))
    try:
        # mkdtemp makes the folder private (0700); a checkpoint gets the usual permissions.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o777 & ~umask)
        flat = {path: np.asarray(value) for path, value in flatten_params(params).items()}
        with open(temporary / "params.npz", "wb") as stream:
            np.savez(stream, **flat)
        (temporary / "src_vocab.json").write_text(src_vocab.to_json(), encoding="utf-8")
        (temporary / "tgt_vocab.json").write_text(tgt_vocab.to_json(), encoding="utf-8")
        record = {"format": checkpoint_format, **config, "versions": _versions()}
        (temporary / "config.json").write_text(json.dumps(record, indent=2) + "\n",
                                               encoding="utf-8")
        if directory.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", suffix=".old",
                                        dir=directory.parent))
            os.rename(directory, old / directory.name)
            os.rename(temporary, directory)
            shutil.rmtree(old)
        else:
            os.rename(temporary, directory)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    return directory


def load_checkpoint(directory: str | os.PathLike) -> Checkpoint:
    """Read and validate a checkpoint written by :func:`save_checkpoint`.

    Checks that every file is there and readable, the format tag, the model sizes, that the
    vocabularies have the sizes of the config and hold ``<pad> <bos> <eos>``, and that the
    parameters have exactly the expected names, shapes and a float dtype, with finite values.

    Raises:
      FileNotFoundError: ``directory`` or one of its files is missing.
      ValueError: a file is corrupt or does not match the others; the message names the file.
    """
    from jax_attention.bahdanau import unflatten_params
    from jax_attention.data import RESERVED_TOKENS, Vocab

    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"checkpoint {str(directory)!r} is not a directory; train one "
                                "with 'jax-attention train bahdanau --checkpoint DIR'")
    missing = [name for name in _CHECKPOINT_FILES if not (directory / name).is_file()]
    if missing:
        raise FileNotFoundError(f"checkpoint {str(directory)!r} lacks {', '.join(missing)} "
                                f"(expected {', '.join(_CHECKPOINT_FILES)})")

    def bad(name: str, why: str) -> ValueError:
        return ValueError(f"checkpoint {str(directory)!r}: {name} {why}")

    try:
        config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise bad("config.json", f"is not valid JSON ({error})") from None
    formats = {tag: kind for kind, (tag, _) in _CHECKPOINT_KINDS.items()}
    if not isinstance(config, dict) or config.get("format") not in formats:
        raise bad("config.json", f"is not a Bahdanau checkpoint config (format "
                                 f"{CHECKPOINT_FORMAT!r} expected) nor a Transformer one "
                                 f"({TRANSFORMER_CHECKPOINT_FORMAT!r})")
    kind = formats[config["format"]]
    config.setdefault("model", kind)
    if config["model"] != kind:
        raise bad("config.json", f"says model {config['model']!r} but has the format of {kind!r}")
    for key in _CHECKPOINT_KINDS[kind][1]:
        value = config.get(key)
        if key == "dropout":
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 1
        else:
            ok = isinstance(value, int) and not isinstance(value, bool) and value >= 1
        if not ok:
            raise bad("config.json", f"has an invalid {key!r}: {value!r}")

    vocabs = {}
    for side in ("src", "tgt"):
        name = f"{side}_vocab.json"
        try:
            vocab = Vocab.from_json((directory / name).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, ValueError, KeyError,
                TypeError) as error:
            raise bad(name, f"is not a vocabulary written by Vocab.to_json ({error})") from None
        if len(vocab) != config[f"{side}_vocab_size"]:
            raise bad(name, f"has {len(vocab)} tokens but config.json says "
                            f"{side}_vocab_size = {config[f'{side}_vocab_size']}")
        absent = [token for token in RESERVED_TOKENS if token not in vocab]
        if absent:
            raise bad(name, f"lacks the reserved tokens {absent}")
        vocabs[side] = vocab

    if kind == "transformer" and config["num_hiddens"] % config["num_heads"]:
        raise bad("config.json", f"has num_hiddens = {config['num_hiddens']} not divisible by "
                                 f"num_heads = {config['num_heads']}")
    expected = _expected_param_shapes(kind, config)
    try:
        # Our own file handle: np.load(path) leaks its handle when the archive is corrupt.
        with open(directory / "params.npz", "rb") as stream, \
                np.load(stream, allow_pickle=False) as stored:
            flat = {name: stored[name] for name in stored.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError) as error:
        raise bad("params.npz", f"cannot be read ({type(error).__name__}: {error})") from None
    if set(flat) != set(expected):
        raise bad("params.npz", f"holds the wrong parameters: missing "
                                f"{sorted(set(expected) - set(flat))}, unexpected "
                                f"{sorted(set(flat) - set(expected))}")
    for name, shape in expected.items():
        array = flat[name]
        if array.shape != tuple(shape) or not np.issubdtype(array.dtype, np.floating):
            raise bad("params.npz", f"parameter {name!r} has shape {array.shape} and dtype "
                                    f"{array.dtype}, expected shape {tuple(shape)} of floats")
        if not np.all(np.isfinite(array)):
            raise bad("params.npz", f"parameter {name!r} holds NaN or Inf")
    params = unflatten_params({name: jnp.asarray(array) for name, array in flat.items()})
    return Checkpoint(params=params, src_vocab=vocabs["src"], tgt_vocab=vocabs["tgt"],
                      config=config, path=directory)


# --------------------------------------------------------------------------- Transformer


@dataclass(frozen=True, eq=False)  # eq would compare arrays elementwise
class TransformerResult(BahdanauResult):
    """What :func:`train_transformer` trained and measured: the fields of :class:`BahdanauResult`
    (``model`` a :class:`~jax_attention.transformer.TransformerSeq2Seq`, ``translations`` of
    :class:`~jax_attention.transformer.TransformerTranslation`) and

    Attributes:
      validation: ``None``, or the held-out evaluation (:func:`evaluate_held_out`):
        ``{"num_pairs", "corpus_bleu" (k = 4), "mean_sentence_bleu" (k = 4), "examples"}``.
    """

    validation: dict | None = None

    def figures(self) -> dict:
        """The results as JSON-ready Python values (no arrays)."""
        return {**super().figures(), "validation": self.validation}


def _ids_to_sentence(ids, vocab, stop_ids) -> str:
    words = []
    for i in ids:
        if int(i) in stop_ids:
            break
        words.append(vocab.to_tokens(int(i)))
    return " ".join(words)


def evaluate_held_out(params, split, src_vocab, tgt_vocab, *, num_heads: int, num_steps: int,
                      max_positions: int, batch_size: int = 256, num_examples_shown: int = 5
                      ) -> dict:
    """Greedy translations of held-out pairs, in batches, scored with corpus and sentence BLEU (k = 4).

    The references are the held-out targets as the model would have seen them (``num_steps``
    tokens at most, ``<eos>`` removed, words outside the training vocabulary as ``<unk>``).

    Args:
      split: a :class:`jax_attention.data.TranslationArrays` (``TranslationData.val``).

    Returns:
      ``{"num_pairs", "corpus_bleu", "mean_sentence_bleu", "examples": [{"source", "translation",
      "reference", "bleu"}, ...]}``.
    """
    from jax_attention.metrics import bleu, corpus_bleu
    from jax_attention.transformer import greedy_decode

    bos_id, eos_id, pad_id = tgt_vocab["<bos>"], tgt_vocab["<eos>"], tgt_vocab["<pad>"]
    src_stop = {src_vocab["<eos>"], src_vocab["<pad>"]}
    predictions, references, sources = [], [], []
    n = len(split)
    for start in range(0, n, batch_size):
        src = split.src[start:start + batch_size]
        src_valid_len = split.src_valid_len[start:start + batch_size]
        rows = src.shape[0]
        if rows < batch_size and n > batch_size:  # one compiled shape for every batch
            src = np.concatenate([src, np.full((batch_size - rows, src.shape[1]),
                                               src_vocab["<pad>"], src.dtype)])
            src_valid_len = np.concatenate([src_valid_len, np.ones(batch_size - rows,
                                                                   src_valid_len.dtype)])
        tokens, lengths, _ = jax.device_get(greedy_decode(
            params, src, src_valid_len, num_heads=num_heads, bos_id=bos_id, eos_id=eos_id,
            pad_id=pad_id, max_len=num_steps, max_positions=max_positions))
        for row in range(rows):
            predictions.append(" ".join(tgt_vocab.to_tokens(
                [int(i) for i in tokens[row, :int(lengths[row])]])))
            index = start + row
            references.append(_ids_to_sentence(split.tgt[index], tgt_vocab, {eos_id, pad_id}))
            sources.append(_ids_to_sentence(split.src[index], src_vocab, src_stop))
    scores = [bleu(p, r, 4) for p, r in zip(predictions, references)]
    return {
        "num_pairs": n,
        "corpus_bleu": corpus_bleu(predictions, references, 4) if n else 0.0,
        "mean_sentence_bleu": float(np.mean(scores)) if n else 0.0,
        "examples": [{"source": s_, "translation": p, "reference": r, "bleu": b}
                     for s_, p, r, b in list(zip(sources, predictions, references, scores))
                     [:num_examples_shown]],
    }


def train_transformer(*, num_hiddens: int = 32, ffn_num_hiddens: int = 64, num_heads: int = 4,
                      num_layers: int = 2, dropout: float = 0.1, batch_size: int = 64,
                      num_steps: int = 10, lr: float = 0.005, epochs: int = 200,
                      num_examples: int = 600, val_fraction: float = 0.0, seed: int = 0,
                      max_positions: int = 1000, data: str | os.PathLike | None = None,
                      checkpoint: str | os.PathLike | None = None, progress: bool = True,
                      log: Callable[[str], object] | None = print,
                      log_every: int = 10, checkpoint_dir: str | os.PathLike | None = None,
                      checkpoint_every: int | None = None, keep: int = DEFAULT_KEEP,
                      resume: bool = False, skip_nonfinite: bool = False,
                      devices: int | None = None, model_parallel: int = 1) -> TransformerResult:
    """Train the Transformer on English–French — d2l §11.7.6, the book's ``train_seq2seq``.

    The recipe of :func:`train_bahdanau` (teacher forcing, the book's masked cross-entropy summed
    over the batch, gradients clipped to global norm 1, Adam) with the book's Transformer
    settings: ``D = 32``, 2 blocks, 4 heads, FFN 64, dropout 0.1, batch 64, ``num_steps`` 10,
    lr 0.005, 200 epochs, 600 pairs. Dropout acts after the positional encoding, on the attention
    weights and in every AddNorm during training; the decoder's self-attention is causal always.

    With ``val_fraction > 0`` the last pairs are held out (:func:`~jax_attention.data.
    load_data_nmt`) and translated greedily after training (:func:`evaluate_held_out`).

    ``checkpoint_dir``, ``checkpoint_every``, ``keep``, ``resume`` and ``skip_nonfinite``: training
    checkpoints, resumption and non-finite steps, as for :func:`train_bahdanau`; ``devices``
    too. ``model_parallel = M`` makes the mesh ``devices / M`` (data) by ``M`` (model): each
    attention's heads and each FFN's width are split over ``M`` devices (tensor parallelism,
    :data:`jax_attention.distributed.TENSOR_PARALLEL_SPECS`; ``num_heads`` and
    ``ffn_num_hiddens`` must divide by ``M``).

    Returns:
      A :class:`TransformerResult`, with the book's four sentences translated and scored.
    """
    from jax_attention import transformer
    from jax_attention.data import load_data_nmt
    from jax_attention.multihead import _check_num_heads

    for name, value in (("num_hiddens", num_hiddens), ("ffn_num_hiddens", ffn_num_hiddens),
                        ("num_heads", num_heads), ("num_layers", num_layers),
                        ("batch_size", batch_size), ("num_steps", num_steps),
                        ("num_examples", num_examples), ("log_every", log_every),
                        ("max_positions", max_positions)):
        _check_positive_int(name, value)
    _check_num_heads(num_hiddens, num_heads)
    _check_epochs_lr(epochs, lr)
    if isinstance(dropout, bool) or not isinstance(dropout, numbers.Real) or not 0 <= dropout < 1:
        raise ValueError(f"dropout must be a number with 0 <= dropout < 1, got {dropout!r}")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
    if num_steps > max_positions:
        raise ValueError(f"num_steps = {num_steps} exceeds max_positions = {max_positions}")
    long_run = _long_run_options(checkpoint_dir, checkpoint_every, keep, resume,
                                 skip_nonfinite)
    mesh = _training_mesh(devices, batch_size, checkpoint_dir, model=model_parallel)
    distributed.check_tensor_parallel(num_heads, ffn_num_hiddens, mesh)
    if not distributed.is_main_process():
        progress, log = False, None

    start = time.perf_counter()
    nmt = load_data_nmt(batch_size, num_steps, num_examples, data=data, seed=seed,
                        val_fraction=val_fraction)
    src_vocab, tgt_vocab = nmt.src_vocab, nmt.tgt_vocab
    params_rng, dropout_rng = jax.random.key(seed), jax.random.key(seed, impl="rbg")
    model = transformer.TransformerSeq2Seq(
        len(src_vocab), len(tgt_vocab), num_hiddens, ffn_num_hiddens, num_heads, num_layers,
        dropout, max_positions=max_positions,
        rngs=nnx.Rngs(params=params_rng, dropout=dropout_rng))
    model.train()
    optimizer = nnx.Optimizer(model, _clipped_adam(float(lr)), wrt=nnx.Param)
    config = {
        "model": "transformer",
        "src_vocab_size": len(src_vocab), "tgt_vocab_size": len(tgt_vocab),
        "num_hiddens": num_hiddens, "ffn_num_hiddens": ffn_num_hiddens, "num_heads": num_heads,
        "num_layers": num_layers, "dropout": float(dropout), "num_steps": num_steps,
        "max_positions": max_positions,
        "training": {"batch_size": batch_size, "lr": float(lr), "epochs": epochs,
                     "num_examples": num_examples, "val_fraction": float(val_fraction),
                     "seed": seed, "clip_global_norm": 1.0, "optimizer": "adam",
                     "loss": "d2l MaskedSoftmaxCELoss, summed over the batch"},
    }

    trained = _train_epochs(model, optimizer, nmt, epochs=epochs, desc="transformer",
                            progress=progress, log=log, log_every=log_every, config=config,
                            mesh=mesh, **long_run)

    model.eval()
    params = jax.tree.map(np.asarray, model.params_dict())

    def translate(params, sentences, src_vocab, tgt_vocab, num_steps):
        return transformer.translate(params, sentences, src_vocab, tgt_vocab, num_steps,
                                     num_heads=num_heads, max_positions=max_positions)

    translations, scores = evaluate_translations(params, src_vocab, tgt_vocab, num_steps,
                                                 translate=translate)
    validation = None
    if len(nmt.val):
        validation = evaluate_held_out(params, nmt.val, src_vocab, tgt_vocab,
                                       num_heads=num_heads, num_steps=num_steps,
                                       max_positions=max_positions)
    return TransformerResult(**_result_fields(
        trained, model, params, src_vocab, tgt_vocab, config, translations, scores, start=start,
        checkpoint=checkpoint, checkpoint_dir=checkpoint_dir), validation=validation)
