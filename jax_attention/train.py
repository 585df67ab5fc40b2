"""Training loops (optax + Flax NNX) for the models of the attention chapter.

:func:`train_kernel_regression` — d2l §11.2.3, Nadaraya–Watson regression with a learnable kernel
width ``w``, trained exactly as in the book: full batch, leave-one-out keys and values, summed
squared error, SGD with learning rate 0.5, one step per epoch.

:func:`train_bahdanau` — d2l §11.4.3, seq2seq with Bahdanau attention on English–French, the
book's ``train_seq2seq``: teacher forcing, masked cross-entropy, Adam, gradients clipped to global
norm 1; :func:`save_checkpoint` and :func:`load_checkpoint` store the result.

Randomness comes only from ``seed``; on CPU the same seed gives bit-identical losses and ``w``.
"""

from __future__ import annotations

import functools
import json
import math
import numbers
import os
import shutil
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax import lax
from tqdm import tqdm

from jax_attention.attention_pooling import (
    NWKernelRegression,
    average_pooling,
    kernel_regression_data,
    leave_one_out,
    nadaraya_watson,
)
from jax_attention.bahdanau import masked_cross_entropy

__all__ = ["KernelRegressionResult", "train_kernel_regression", "BOOK_PAIRS", "BahdanauResult",
           "train_bahdanau", "evaluate_translations", "Checkpoint", "save_checkpoint",
           "load_checkpoint", "TransformerResult", "train_transformer", "evaluate_held_out"]


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
        }


def _update(model, optimizer: nnx.Optimizer, src, src_valid_len, dec_input, tgt, tgt_valid_len):
    """One teacher-forced Adam step on ``sum`` of the per-sequence losses; returns that sum.

    The book differentiates ``l.sum()`` (not the mean) over the batch, which matters because the
    gradient is clipped to norm 1 before Adam.
    """

    def loss_fn(model):
        logits = model(src, src_valid_len, dec_input)
        return jnp.sum(masked_cross_entropy(logits, tgt, tgt_valid_len))

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    # optax's Adam computes its bias correction as `decay ** count`, a Python float to the power
    # of an int32 count, which strict dtype promotion (the tests' setting) rejects; our own code
    # above stays strict.
    with jax.numpy_dtype_promotion("standard"):
        optimizer.update(model, grads)
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


# Module level, with the graph definition static: every run with the same model structure and
# optimizer (same shapes) reuses one compilation. The state is donated: it is replaced by the
# returned one, and XLA may update the parameters and moments in place.
_jit_step = jax.jit(_pure_step, static_argnums=0, donate_argnums=1)


@functools.partial(jax.jit, static_argnums=(0, 3), donate_argnums=1)
def _train_steps(graphdef, state, batches, bos_id: int):
    """Several training steps in one compiled call: ``lax.scan`` of :func:`_pure_step`.

    ``batches = (src, src_valid_len, tgt, tgt_valid_len)``, each stacked along a leading steps
    axis (``(K, B, T)`` and ``(K, B)``). Step ``k`` trains on batch ``k``, in order, with the
    dropout key that the ``k``-th call of the model would draw: the same updates as ``K`` calls
    of :func:`_bahdanau_step`, without ``K`` dispatches from Python and ``K`` round trips of the
    whole state. The decoder inputs (``<bos>`` + target) are built here, on the device.

    Returns:
      ``(state, losses (K,))``: the state after the ``K`` steps and each step's summed loss.
    """
    from jax_attention.bahdanau import teacher_forcing_inputs

    def body(state, batch):
        src, src_valid_len, tgt, tgt_valid_len = batch
        dec_input = teacher_forcing_inputs(tgt, bos_id)
        return _pure_step(graphdef, state, (src, src_valid_len, dec_input, tgt, tgt_valid_len))

    return lax.scan(body, state, batches)


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


def _train_epochs(model, optimizer: nnx.Optimizer, nmt, *, epochs: int, desc: str, progress: bool,
                  log, log_every: int):
    """The teacher-forced epochs shared by the seq2seq models (any ``model(src, src_valid_len,
    dec_input) -> logits``); returns the per-epoch loss per target token and tokens/sec.

    The model and optimizer are split once; each epoch is one compiled call (:func:`_train_steps`)
    over its stacked batches, with one device sync (its losses) per epoch. The steps are those of
    :func:`_bahdanau_step` batch after batch — same batches, order, dropout keys and updates —
    without a Python dispatch, an NNX split/merge of the whole state and a host round trip per
    step, which took a large part of the step time of these small models (the most for the
    Transformer, whose state has the most leaves). The model and optimizer get the trained state
    back at the end, in a ``finally`` block.
    """
    bos_id = nmt.tgt_vocab["<bos>"]
    graphdef, state = nnx.split((model, optimizer))
    losses, tokens_per_sec = [], []
    try:
        with tqdm(total=epochs, desc=desc, unit="epoch",
                  disable=None if progress else True, leave=False) as bar:
            for epoch in range(1, epochs + 1):
                epoch_start = time.perf_counter()
                batches, num_tokens = _epoch_batches(nmt, epoch - 1)
                state, batch_losses = _train_steps(graphdef, state, batches, bos_id)
                # The epoch's one device sync; summed on the host in float64, in batch order.
                total = float(sum(float(loss) for loss in np.asarray(batch_losses)))
                elapsed = time.perf_counter() - epoch_start
                losses.append(total / num_tokens)
                tokens_per_sec.append(num_tokens / elapsed)
                bar.set_postfix(loss=f"{losses[-1]:.4f}", tok_s=f"{tokens_per_sec[-1]:.0f}",
                                refresh=False)
                bar.update(1)
                if log is not None and (epoch % log_every == 0 or epoch == epochs):
                    line = (f"epoch {epoch}, loss {losses[-1]:.4f}, "
                            f"{tokens_per_sec[-1]:.1f} tokens/sec")
                    if bar.disable:
                        log(line)
                    else:
                        with tqdm.external_write_mode():
                            log(line)
    finally:
        nnx.update((model, optimizer), state)
    return losses, tokens_per_sec


def train_bahdanau(*, embed_size: int = 32, num_hiddens: int = 32, num_layers: int = 2,
                   dropout: float = 0.1, batch_size: int = 64, num_steps: int = 10,
                   lr: float = 0.005, epochs: int = 250, num_examples: int = 600, seed: int = 0,
                   data: str | os.PathLike | None = None, checkpoint: str | os.PathLike | None = None,
                   progress: bool = True, log: Callable[[str], object] | None = print,
                   log_every: int = 10) -> BahdanauResult:
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

    Returns:
      A :class:`BahdanauResult`, with the book's four sentences translated and scored.
    """
    from jax_attention.bahdanau import BahdanauSeq2Seq
    from jax_attention.data import load_data_nmt

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

    start = time.perf_counter()
    nmt = load_data_nmt(batch_size, num_steps, num_examples, data=data, seed=seed)
    src_vocab, tgt_vocab = nmt.src_vocab, nmt.tgt_vocab
    # Dropout masks come from an "rbg" key (XLA's RngBitGenerator): on CPU the threefry
    # generator's kernels for the masks' shapes roughly double the step's compilation time. Both
    # are deterministic on a given backend.
    params_rng, dropout_rng = jax.random.key(seed), jax.random.key(seed, impl="rbg")
    model = BahdanauSeq2Seq(len(src_vocab), len(tgt_vocab), embed_size, num_hiddens, num_layers,
                            dropout, rngs=nnx.Rngs(params=params_rng, dropout=dropout_rng))
    model.train()
    optimizer = nnx.Optimizer(model, _clipped_adam(float(lr)), wrt=nnx.Param)

    losses, tokens_per_sec = _train_epochs(model, optimizer, nmt, epochs=epochs, desc="bahdanau",
                                           progress=progress, log=log, log_every=log_every)

    model.eval()
    params = jax.tree.map(np.asarray, model.params_dict())
    config = {
        "model": "bahdanau",
        "src_vocab_size": len(src_vocab), "tgt_vocab_size": len(tgt_vocab),
        "embed_size": embed_size, "num_hiddens": num_hiddens, "num_layers": num_layers,
        "dropout": float(dropout), "num_steps": num_steps,
        "training": {"batch_size": batch_size, "lr": float(lr), "epochs": epochs,
                     "num_examples": num_examples, "seed": seed, "clip_global_norm": 1.0,
                     "optimizer": "adam", "loss": "d2l MaskedSoftmaxCELoss, summed over the batch"},
    }
    translations, scores = evaluate_translations(params, src_vocab, tgt_vocab, num_steps)
    written = None
    if checkpoint is not None:
        written = save_checkpoint(checkpoint, params, src_vocab, tgt_vocab, config)
    return BahdanauResult(
        losses=losses,
        cross_entropy=[loss * num_steps for loss in losses],
        tokens_per_sec=tokens_per_sec,
        model=model,
        params=params,
        src_vocab=src_vocab,
        tgt_vocab=tgt_vocab,
        config=config,
        translations=translations,
        bleu=scores,
        wall_time_s=time.perf_counter() - start,
        checkpoint=written,
    )


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
                      log_every: int = 10) -> TransformerResult:
    """Train the Transformer on English–French — d2l §11.7.6, the book's ``train_seq2seq``.

    The recipe of :func:`train_bahdanau` (teacher forcing, the book's masked cross-entropy summed
    over the batch, gradients clipped to global norm 1, Adam) with the book's Transformer
    settings: ``D = 32``, 2 blocks, 4 heads, FFN 64, dropout 0.1, batch 64, ``num_steps`` 10,
    lr 0.005, 200 epochs, 600 pairs. Dropout acts after the positional encoding, on the attention
    weights and in every AddNorm during training; the decoder's self-attention is causal always.

    With ``val_fraction > 0`` the last pairs are held out (:func:`~jax_attention.data.
    load_data_nmt`) and translated greedily after training (:func:`evaluate_held_out`).

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

    losses, tokens_per_sec = _train_epochs(model, optimizer, nmt, epochs=epochs, desc="transformer",
                                           progress=progress, log=log, log_every=log_every)

    model.eval()
    params = jax.tree.map(np.asarray, model.params_dict())
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
    written = None
    if checkpoint is not None:
        written = save_checkpoint(checkpoint, params, src_vocab, tgt_vocab, config)
    return TransformerResult(
        losses=losses,
        cross_entropy=[loss * num_steps for loss in losses],
        tokens_per_sec=tokens_per_sec,
        model=model,
        params=params,
        src_vocab=src_vocab,
        tgt_vocab=tgt_vocab,
        config=config,
        translations=translations,
        bleu=scores,
        wall_time_s=time.perf_counter() - start,
        checkpoint=written,
        validation=validation,
    )
