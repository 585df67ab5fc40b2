"""The teacher-forced training loop of the seq2seq models, in reusable pieces.

- the step: :func:`loss_and_grads`, :func:`pure_step` (a pure function of the split
  ``(model, optimizer)`` state), :func:`guarded_step` (refuses a non-finite update on the device),
  :func:`train_steps` (steps in one compiled ``lax.scan``), :func:`train_step` (one, in place);
- the data of an epoch, from :mod:`jax_attention.data.batches` (re-exported here):
  :func:`pad_batch`, :func:`padded_lengths` (cutting the padding the book trains on),
  :func:`epoch_batches`, or packed (``train --pack``: :func:`~jax_attention.data.batches.
  packed_epoch_batches`);
- run control: :class:`Schedule` (where a step is, where a compiled call ends, when a training
  checkpoint is due), :class:`Progress` (the bookkeeping a resumed run needs),
  :func:`sigint_requests`, :func:`training_mesh`, :func:`nonfinite_error`,
  :func:`open_checkpoints` (start or resume training checkpoints), the bar and log lines
  (:class:`~jax_attention.train.progress.ProgressLog`);
- :func:`train_epochs`: the whole loop, for any registered seq2seq model.

The loop is the book's ``train_seq2seq`` (d2l §9.7): teacher forcing, the per-sequence masked
cross-entropy summed over the batch, gradients clipped to global norm 1, Adam. On CPU the same
seed gives the same losses bit for bit, whether the run was interrupted and resumed or not.
"""

from __future__ import annotations

import contextlib
import functools
import math
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax import lax

from jax_attention.runtime import compilation, distributed, interrupts, program_cache
from jax_attention.runtime.compilation import CPU_COMPILER_OPTIONS, BackendJit, CompileTimer
from jax_attention.train.progress import ProgressLog, report_compiled, time_left
from jax_attention.data.batches import (epoch_batches, packed_epoch_batches, pad_batch,
                                        padded_lengths)
from jax_attention.models import packing
from jax_attention.models.configs import LongRunConfig, step_program
from jax_attention.models.translation import masked_cross_entropy, teacher_forcing_inputs

__all__ = ["NonFiniteLossError", "TrainingInterrupted", "clipped_adam", "loss_and_grads",
           "pure_step", "guarded_step", "jit_step", "train_steps", "leaf_shardings", "train_step",
           "pad_batch", "padded_lengths", "epoch_batches", "Schedule", "Progress", "ProgressLog",
           "EpochsResult", "sigint_requests", "training_mesh", "nonfinite_error",
           "open_checkpoints", "train_epochs"]


class NonFiniteLossError(FloatingPointError):
    """A training step's loss, gradient or parameter update was NaN or Inf; training stopped.

    The model keeps the state before that step (the last good state); no checkpoint of the bad
    state is written. The CLI prints the message and exits with status 3.

    Attributes:
      step: the 1-based step that was not finite.
      epoch, batch: where it is (1-based).
      checkpoint: the newest training checkpoint's directory, or ``None``.
    """

    def __init__(self, message: str, *, step: int, epoch: int, batch: int,
                 checkpoint: Path | None = None):
        super().__init__(message)
        self.step, self.epoch, self.batch, self.checkpoint = step, epoch, batch, checkpoint


class TrainingInterrupted(KeyboardInterrupt):
    """SIGINT (Ctrl-C) stopped training at a safe point: after a completed compiled call of steps
    (the state saved, when the run keeps training checkpoints), or before the first one.

    A subclass of :class:`KeyboardInterrupt`, so that code that handles Ctrl-C handles it too; the
    CLI prints its message and exits with status 130 (128 + SIGINT, the shell's convention).

    Attributes:
      step: the steps done.
      checkpoint: the newest training checkpoint's directory (saved at the stop, or earlier),
        or ``None`` when there is none.
    """

    def __init__(self, message: str, *, step: int, checkpoint: Path | None):
        super().__init__(message)
        self.step, self.checkpoint = step, checkpoint


# --------------------------------------------------------------------------- the step


@functools.lru_cache(maxsize=None)
def clipped_adam(lr: float, clip_global_norm: float = 1.0) -> optax.GradientTransformation:
    """``clip_by_global_norm(clip_global_norm)`` then ``adam(lr)``; one object per setting.

    The optimizer's transformation is part of the compiled step's static structure: a fresh one
    per run would recompile the step on every training run in a process.
    """
    return optax.chain(optax.clip_by_global_norm(clip_global_norm), optax.adam(lr))


def loss_and_grads(model, src, src_valid_len, dec_input, tgt, tgt_valid_len, *,
                   num_steps: int | None = None):
    """``sum`` of the per-sequence teacher-forced losses over the batch, and its gradient.

    The book differentiates ``l.sum()`` (not the mean) over the batch, which matters because the
    gradient is clipped to norm 1 before Adam. ``num_steps``: the book's length of a batch cut
    shorter (:func:`padded_lengths`), the loss's divisor and its dropout masks' length.

    A packed batch (:func:`~jax_attention.data.batches.packed_epoch_batches`) has segment ids
    ``(B, S)`` and ``(B, T)`` in place of the valid lengths: each sentence's loss is then
    divided by ``num_steps`` (required), its rows drawing their own dropout masks."""
    if jnp.ndim(tgt_valid_len) == 2:
        segments = packing.segments(src_valid_len, tgt_valid_len)

        def loss_fn(model):
            logits = model(src, None, dec_input, segments=segments)
            return jnp.sum(packing.packed_cross_entropy(logits, tgt, segments.tgt,
                                                        num_steps=num_steps))
        return nnx.value_and_grad(loss_fn)(model)

    def loss_fn(model):
        logits = model(src, src_valid_len, dec_input, num_steps=num_steps)
        return jnp.sum(masked_cross_entropy(logits, tgt, tgt_valid_len, num_steps=num_steps))

    return nnx.value_and_grad(loss_fn)(model)


def _apply_gradients(model, optimizer: nnx.Optimizer, grads) -> None:
    """``optimizer.update(model, grads)`` (clipping, then Adam), in place."""
    # optax's Adam takes `decay ** count` (a Python float to the power of an int32 count), which
    # strict dtype promotion (the tests' setting) rejects; our own code above stays strict.
    with jax.numpy_dtype_promotion("standard"):
        optimizer.update(model, grads)


def pure_step(graphdef, state, batch, num_steps: int | None = None):
    """One teacher-forced Adam step as a pure function of the split ``(model, optimizer)`` state.

    ``batch = (src, src_valid_len, dec_input, tgt, tgt_valid_len)``; ``num_steps``: the loss's
    divisor (:func:`loss_and_grads`). The state holds the parameters, Adam's moments and step
    count, and the model's dropout stream (key and count), so that a step advances the dropout
    stream exactly as a call of the model does.

    Returns:
      ``(state, loss)``: the new state and the batch's summed loss.
    """
    model, optimizer = nnx.merge(graphdef, state)
    loss, grads = loss_and_grads(model, *batch, num_steps=num_steps)
    _apply_gradients(model, optimizer, grads)
    return nnx.state((model, optimizer)), loss


def _all_finite(tree) -> jax.Array:
    """A boolean scalar: no floating-point leaf of ``tree`` holds NaN or Inf."""
    leaves = [leaf.ravel() for leaf in jax.tree.leaves(tree)
              if jnp.issubdtype(leaf.dtype, jnp.inexact)]
    if not leaves:
        return jnp.asarray(True)
    # One reduction over all leaves (XLA fuses the concatenation into it), not one per leaf:
    # each leaf's reduction was a kernel of its own for XLA:CPU to compile.
    dtype = jnp.result_type(*leaves)
    return jnp.all(jnp.isfinite(jnp.concatenate([leaf.astype(dtype) for leaf in leaves])))


def guarded_step(graphdef, state, batch, halted, skip_nonfinite, num_steps: int | None = None):
    """:func:`pure_step` that refuses a non-finite update, decided on the device (no host sync).

    A step is *rejected* when its loss, a gradient or an updated parameter is NaN or Inf (a huge
    learning rate can turn finite gradients into infinite parameters); the gradients are judged
    by their global norm, so a norm beyond float32's range (~1.8e19) rejects the step too. A
    rejected step leaves the parameters and the optimizer's state as they were, so the state
    never holds NaN:

    - ``skip_nonfinite`` False (stop): the first rejected step sets ``halted``, and every later
      step of the same compiled call is rejected too (dropout stream included), so the state that
      comes back is the one before the bad step — the last good state, for the host to report.
    - ``skip_nonfinite`` True (skip): only the bad step is rejected; the dropout stream still
      advances, so that every later step draws the key it draws in a run without the bad step.

    A step that is not rejected computes exactly what :func:`pure_step` computes.

    Args:
      batch: ``(src, src_valid_len, dec_input, tgt, tgt_valid_len)``.
      halted: a boolean scalar, True once a step of this call was rejected.
      skip_nonfinite: a boolean scalar (traced: both modes share one compilation).
      num_steps: the loss's divisor (:func:`loss_and_grads`).

    Returns:
      ``(state, loss, halted)``: ``loss`` is the step's summed loss, or NaN for a rejected step.
    """

    def is_variable(x):
        return isinstance(x, nnx.Variable)

    # The values before the step: the merged model and optimizer share `state`'s Variables, which
    # the update rebinds in place.
    before = [variable.get_value() for variable in jax.tree.leaves(state, is_leaf=is_variable)]
    model, optimizer = nnx.merge(graphdef, state)
    loss, grads = loss_and_grads(model, *batch, num_steps=num_steps)
    _apply_gradients(model, optimizer, grads)
    # The gradients are finite when their global norm is (the norm the clipping computes: XLA
    # shares it); a norm that overflows float32 counts as not finite too (~1.8e19: the clipped
    # update would be zero).
    ok = (jnp.isfinite(loss) & jnp.isfinite(optax.tree.norm(grads))
          & _all_finite(nnx.state(model, nnx.Param)))
    accept = ok & (skip_nonfinite | ~halted)
    # Skip mode moves the dropout stream on even past a rejected step.
    advance = accept | skip_nonfinite

    after, treedef = jax.tree.flatten(nnx.state((model, optimizer)), is_leaf=is_variable)
    is_rng = [isinstance(variable, nnx.RngState) for variable in after]

    new = [variable.get_value() for variable in after]

    def choose(take, rng: bool):
        """The new values of the leaves that are (``rng``) or are not the dropout stream where
        ``take``, else their old values."""
        def part(values):
            return [value for value, r in zip(values, is_rng, strict=True) if r == rng]
        return iter(lax.cond(take, lambda: part(new), lambda: part(before)))

    # One conditional per decision chooses the new or the old values of all its leaves, not a
    # `where` per leaf: XLA copied the computation of the decision (a chain over every leaf's
    # flag) into each such `where`, which made the step's program three times larger and its
    # compilation seconds longer. A conditional computes its predicate once.
    chosen = {True: choose(advance, True), False: choose(accept, False)}
    state = jax.tree.unflatten(treedef, [variable.replace(next(chosen[rng]))
                                         for variable, rng in zip(after, is_rng, strict=True)])
    return state, jnp.where(accept, loss, jnp.nan), halted | ~ok


#: :func:`pure_step` compiled, the graph definition static: every run with the same model
#: structure and optimizer (same shapes) reuses one compilation. The state is donated: it is
#: replaced by the returned one, and XLA may update the parameters and moments in place.
jit_step = jax.jit(pure_step, static_argnums=(0, 3), donate_argnums=1)


@functools.partial(BackendJit, cpu_options=CPU_COMPILER_OPTIONS, static_argnums=(0, 3, 5, 6),
                   donate_argnums=1)
def train_steps(graphdef, state, batches, bos_id: int, skip_nonfinite=False, shardings=None,
                num_steps: int | None = None):
    """Several training steps in one compiled call: ``lax.scan`` of :func:`guarded_step`.

    ``batches = (src, src_valid_len, tgt, tgt_valid_len)``, each stacked along a leading steps
    axis (``(K, B, T)`` and ``(K, B)``). Step ``k`` trains on batch ``k``, in order, with the
    dropout key that the ``k``-th call of the model would draw: the same updates as ``K`` calls
    of :func:`train_step`, without ``K`` dispatches from Python and ``K`` round trips of the
    whole state. The decoder inputs (``<bos>`` + target) are built here, on the device.

    A step whose loss, gradient or update is not finite is rejected (:func:`guarded_step`): with
    ``skip_nonfinite`` False it and every later step of the call leave the state unchanged;
    with ``skip_nonfinite`` True only that step does (a traced boolean: one compilation serves
    both). Its loss comes back as NaN, so the host finds it in the losses it reads anyway.
    Scanning the ``K`` steps in several calls (``K1`` then ``K - K1`` batches) gives the same
    state and losses, bit for bit on CPU.

    ``shardings`` (static; :func:`leaf_shardings`): on a mesh, the placement of each of the
    state's leaves (in ``jax.tree.leaves`` order), which every step's new state keeps — without
    it, XLA's sharding propagation through the step's conditionals split leaves that were
    placed replicated. ``None`` on one device.

    ``num_steps`` (static): the book's length of batches cut shorter (:func:`padded_lengths`).
    Compiled by :class:`~jax_attention.runtime.compilation.BackendJit` (fast-compile on a CPU).

    Returns:
      ``(state, losses (K,))``: the state after the ``K`` steps and each step's summed loss (NaN
      for a rejected step).
    """

    def keep_placement(state):
        if shardings is None:
            return state
        leaves, treedef = jax.tree.flatten(state)
        return jax.tree.unflatten(treedef, [
            lax.with_sharding_constraint(leaf, sharding)
            for leaf, sharding in zip(leaves, shardings, strict=True)])

    def body(carry, batch):
        state, halted = carry
        src, src_valid_len, tgt, tgt_valid_len = batch
        dec_input = (teacher_forcing_inputs(tgt, bos_id) if tgt_valid_len.ndim == 1  # packed:
                     else packing.packed_teacher_forcing_inputs(tgt, tgt_valid_len, bos_id))
        state, loss, halted = guarded_step(
            graphdef, state, (src, src_valid_len, dec_input, tgt, tgt_valid_len), halted,
            skip_nonfinite, num_steps)
        return (keep_placement(state), halted), loss

    (state, _), losses = lax.scan(body, (state, jnp.asarray(False)), batches)
    return keep_placement(state), losses


def leaf_shardings(state) -> tuple | None:
    """The ``shardings`` argument of :func:`train_steps` for a placed ``state``: each leaf's
    sharding, in ``jax.tree.leaves`` order, or ``None`` when it lives on one device (the
    one-device program stays the one it was)."""
    leaves = jax.tree.leaves(state)
    if all(len(leaf.sharding.device_set) == 1 for leaf in leaves):
        return None
    return tuple(leaf.sharding for leaf in leaves)


def train_step(model, optimizer: nnx.Optimizer, src, src_valid_len, dec_input, tgt,
               tgt_valid_len):
    """One training step of a seq2seq model in place (:func:`jit_step`); returns the loss.

    Splits the model and optimizer, runs the compiled pure step and writes the new state back:
    the step of :func:`train_steps`, one batch at a time.
    """
    graphdef, state = nnx.split((model, optimizer))
    state, loss = jit_step(graphdef, state, (src, src_valid_len, dec_input, tgt, tgt_valid_len))
    nnx.update((model, optimizer), state)
    return loss


# --------------------------------------------------------------------------- run control


@dataclass(frozen=True)
class Schedule:
    """The steps of a run: ``epochs`` epochs of ``steps_per_epoch`` steps, compiled calls that
    end at every epoch and at every multiple of ``checkpoint_every`` steps (counted over the run).
    """

    epochs: int
    steps_per_epoch: int
    checkpoint_every: int | None = None

    @property
    def total(self) -> int:
        return self.epochs * self.steps_per_epoch

    def position(self, step: int) -> str:
        """Where step ``step + 1`` is, in words."""
        if step == self.total:
            return f"all {self.total} steps done"
        epoch, batch = divmod(step, self.steps_per_epoch)
        return f"epoch {epoch + 1}, batch {batch + 1} of {self.steps_per_epoch}"

    def call_end(self, step: int) -> int:
        """The batch (exclusive, within ``step``'s epoch) where the compiled call from ``step``
        ends: the end of the epoch or the next checkpoint boundary."""
        epoch = step // self.steps_per_epoch
        end = self.steps_per_epoch
        if self.checkpoint_every is not None:
            boundary = (step // self.checkpoint_every + 1) * self.checkpoint_every
            end = min(end, boundary - epoch * self.steps_per_epoch)
        return end

    def checkpoint_due(self, step: int, *, stopping: bool = False) -> bool:
        """Whether a training checkpoint is due after ``step`` steps: at the end, on a stop
        request, every ``checkpoint_every`` steps (default: at the end of every epoch)."""
        every = self.checkpoint_every or self.steps_per_epoch
        return step == self.total or stopping or step % every == 0


@dataclass
class Progress:
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
    def from_record(cls, record: dict, steps_per_epoch: int, where: str) -> Progress:
        """The inverse of :meth:`record`, checked against this run's ``steps_per_epoch``."""
        from jax_attention.runtime.checkpointing import CheckpointMismatchError

        missing = [name for name in cls.__dataclass_fields__ if name not in record]
        if missing:
            raise CheckpointMismatchError(f"cannot resume from {where}: its progress record "
                                          f"lacks {missing} (another format?)")
        if record.get("steps_per_epoch") != steps_per_epoch:
            raise CheckpointMismatchError(
                f"cannot resume from {where}: it has {record.get('steps_per_epoch')!r} steps per "
                f"epoch, this run {steps_per_epoch} (different data?)")
        return cls(**{name: record[name] for name in cls.__dataclass_fields__})


@dataclass(frozen=True)
class EpochsResult:
    """What :func:`train_epochs` returns: per-epoch losses per target token and tokens/s, the
    skipped steps and the training checkpoint's step the run resumed from (or ``None``), and
    the steady rate: the median tokens/s of the epochs after the first one this call trained in
    (which compiles; ``None`` without such epochs)."""

    losses: list
    tokens_per_sec: list
    skipped_steps: int
    resumed_from_step: int | None
    steady_tokens_per_sec: float | None = None


@contextlib.contextmanager
def sigint_requests(enabled: bool):
    """Turn the first SIGINT (Ctrl-C) into a request, checked between compiled calls.

    Under the command line's handler (:func:`jax_attention.runtime.interrupts.handle_sigint`) yields its
    request, whatever ``enabled``: the command stops at the next safe point and a second Ctrl-C
    stops the process. Otherwise yields an event that the first SIGINT sets when ``enabled``;
    that handler then puts the previous one back, so that a second Ctrl-C interrupts at once (a
    half-written checkpoint is never a checkpoint: Orbax renames a step's directory only when it
    is complete). Nothing is installed when not ``enabled``, off the main thread (Python runs
    signal handlers there only), or when SIGINT is ignored (``nohup``, a background job): the
    previous behaviour stays.
    """
    shared = interrupts.request_event()
    if shared is not None:
        yield shared
        return
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


def training_mesh(devices, batch_size: int, checkpoint_dir, *, model: int = 1):
    """The device mesh of a training run (:func:`jax_attention.runtime.distributed.make_mesh`), after
    starting the multi-process runtime when the environment asks for it; checks that the batch
    splits over the ``data`` axis.

    Raises:
      ValueError: see :func:`~jax_attention.runtime.distributed.make_mesh` and
        :func:`~jax_attention.runtime.distributed.check_batch_size`; ``checkpoint_dir`` in a
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


def nonfinite_error(done: Progress, schedule: Schedule, checkpoints) -> NonFiniteLossError:
    """The error for a rejected step right after the ``done.step`` good ones (stop mode)."""
    latest = checkpoints.steps[-1] if checkpoints and checkpoints.steps else None
    kept = (f"the last training checkpoint is step {latest} in {checkpoints.directory}"
            if latest is not None else "no training checkpoint was written")
    epoch, batch = divmod(done.step, schedule.steps_per_epoch)
    return NonFiniteLossError(
        f"non-finite loss, gradient or parameter update (NaN or Inf) at step {done.step + 1} "
        f"({schedule.position(done.step)}); training stopped, {kept}. A lower learning rate may "
        "avoid it; --skip-nonfinite (skip_nonfinite=True) skips such steps",
        step=done.step + 1, epoch=epoch + 1, batch=batch + 1,
        checkpoint=None if latest is None else checkpoints.step_path(latest))


def open_checkpoints(long_run: LongRunConfig, config: dict, state, schedule: Schedule):
    """Start (or, with ``long_run.resume``, resume) a run's training checkpoints.

    Returns:
      ``(checkpoints, state, done, resumed_from, lines)``: the
      :class:`~jax_attention.runtime.checkpointing.TrainingCheckpoints` (``None`` without a
      ``checkpoint_dir``), the state (restored when resumed), the :class:`Progress`, the step
      resumed from (or ``None``) and the lines to log.

    Raises:
      FileExistsError: the directory holds checkpoints and ``resume`` is False.
      ValueError: the checkpoint resumed from is past this run's end (fewer ``epochs``).
    """
    done, lines = Progress(), []
    if long_run.checkpoint_dir is None:
        return None, state, done, None, lines
    from jax_attention.runtime.checkpointing import TrainingCheckpoints

    checkpoints = TrainingCheckpoints(long_run.checkpoint_dir, config=config, keep=long_run.keep)
    try:
        if not long_run.resume and checkpoints.steps:
            raise FileExistsError(
                f"{checkpoints.directory} holds training checkpoints already (steps "
                f"{checkpoints.steps}); resume that run (resume=True, --resume) or choose "
                "another directory")
        restored = checkpoints.restore(state) if long_run.resume else None
        if restored is None:
            if long_run.resume:
                damaged = checkpoints.set_aside
                what = (f"only damaged ones, set aside earlier ({', '.join(damaged)})" if damaged
                        else "none yet")
                lines.append(f"no readable training checkpoint in {checkpoints.directory}: "
                             f"{what}; starting from step 0")
            return checkpoints, state, done, None, lines
        state, record = restored
        where = f"training checkpoint {record['step']} in {checkpoints.directory}"
        done = Progress.from_record(record, schedule.steps_per_epoch, where)
        if done.step > schedule.total:
            raise ValueError(f"epochs = {schedule.epochs} ({schedule.total} steps) is fewer than "
                             f"the {done.step} steps of the checkpoint resumed from; pass at "
                             f"least {-(-done.step // schedule.steps_per_epoch)}")
    except BaseException:
        checkpoints.close()
        raise
    lines.append(f"resumed from training checkpoint {done.step} in {checkpoints.directory} "
                 f"(next: {schedule.position(done.step)})")
    return checkpoints, state, done, done.step, lines


def _report_rejected(losses: np.ndarray, done: Progress, tokens: np.ndarray, schedule: Schedule,
                     checkpoints, skip_nonfinite: bool, bar: ProgressLog) -> None:
    """Stop (raise) on a rejected step, or log the skipped ones; before ``done.add``."""
    rejected = ~np.isfinite(losses)
    if not rejected.any():
        return
    if not skip_nonfinite:
        # The state is the one before the bad step (guarded_step); nothing saved.
        first = int(np.argmax(rejected))
        done.add(losses[:first], tokens[:first])
        raise nonfinite_error(done, schedule, checkpoints)
    numbers = [done.step + 1 + int(k) for k in np.flatnonzero(rejected)]
    bar.emit(f"skipped {len(numbers)} step(s) with a non-finite loss, gradient or update: step "
             f"{', '.join(map(str, numbers[:5]))}" + (", ..." if len(numbers) > 5 else ""))


def _after_call(done: Progress, schedule: Schedule, bar: ProgressLog, log_every: int,
                left: str) -> None:
    """Close the epoch when the call ended one: its loss, the bar, the log line (every
    ``log_every`` epochs, after the last, and without a bar at least every
    :attr:`ProgressLog.LINE_EVERY_S`); ``left``: the estimate of the time left, or ``""``."""
    if done.step % schedule.steps_per_epoch:
        return
    done.end_epoch()
    bar.epoch_done(loss=f"{done.losses[-1]:.4f}", tok_s=f"{done.tokens_per_sec[-1]:.0f}")
    finished = len(done.losses)
    if (finished % log_every == 0 or finished == schedule.epochs
            or (not bar.terminal and bar.quiet_for() >= bar.LINE_EVERY_S)):
        bar.emit(f"epoch {finished}, loss {done.losses[-1]:.4f}, "
                 f"{done.tokens_per_sec[-1]:.1f} tokens/sec{left}")


def _note_saved(checkpoints, saved: int | None) -> None:
    """Tell the command line's Ctrl-C handler what a stop at once leaves on disk."""
    if checkpoints is None:
        interrupts.set_note("no training checkpoint is kept without --checkpoint-dir")
    elif saved is None:
        interrupts.set_note(f"no training checkpoint in {checkpoints.directory} yet")
    else:
        interrupts.set_note(f"training checkpoint {saved} in {checkpoints.directory} is the "
                            "newest", resumable=True)


def _interrupted(done: Progress, schedule: Schedule, checkpoints, saved: int | None,
                 started: int) -> TrainingInterrupted:
    """The stop after a Ctrl-C request, ``done.step`` steps done (``started`` before this run)."""
    if done.step == started:
        where = "before the first training step of this run"
    else:
        where = (f"after step {done.step} of {schedule.total} (next: "
                 f"{schedule.position(done.step)})")
    if checkpoints is None:
        kept = ("nothing saved: without --checkpoint-dir (checkpoint_dir=) no training "
                "checkpoint is kept")
    elif saved is None:
        kept = f"no training checkpoint in {checkpoints.directory} yet"
    elif saved == done.step and done.step != started:
        kept = f"saved training checkpoint {saved} in {checkpoints.directory}"
    else:
        kept = f"training checkpoint {saved} in {checkpoints.directory} is the newest"
    return TrainingInterrupted(
        f"interrupted (Ctrl-C) {where}; {kept}", step=done.step,
        checkpoint=None if saved is None else checkpoints.step_path(saved))


class _EpochData:
    """The stacked batches (:func:`epoch_batches`) of the epoch being trained, loaded once, when
    the first call within that epoch starts, and cut into the piece each compiled call trains on.
    """

    def __init__(self, nmt, schedule: Schedule, mesh, lengths: tuple[int, int] | None,
                 row_length: int | None = None):
        self._nmt, self._schedule, self._mesh, self._lengths = nmt, schedule, mesh, lengths
        self._row_length = row_length
        self._epoch = self._batches = self._tokens = None

    def call(self, step: int, end: int) -> tuple[tuple, np.ndarray]:
        """The batches of the steps ``step .. end - 1`` (within one epoch), stacked ``(steps,
        ...)`` and split over the mesh's ``data`` axis (each device its rows), and their target
        tokens ``(steps,)``."""
        epoch, batch = divmod(step, self._schedule.steps_per_epoch)
        if self._epoch != epoch and self._row_length is not None:
            # The epoch's own rows (not the run's so far): a resumed run packs it alike.
            self._batches, _ = packed_epoch_batches(self._nmt, epoch, self._row_length)
            self._epoch = epoch
            self._tokens = (self._batches[3] != 0).sum(axis=(1, 2))
        elif self._epoch != epoch:
            self._batches, _ = epoch_batches(self._nmt, epoch, self._lengths)
            self._tokens, self._epoch = self._batches[3].sum(axis=1), epoch
        chunk = self._batches if (batch, end) == (0, self._schedule.steps_per_epoch) else tuple(
            array[batch:end] for array in self._batches)
        return distributed.shard_batches(chunk, self._mesh), self._tokens[batch:end]


def _compiled_call(steps, graphdef, state, chunk, bos_id: int, skip_nonfinite: bool, shardings,
                   num_steps: int | None, *, first: bool):
    """One call of ``steps`` (:func:`train_steps`, or its :class:`StoredJit`) on ``chunk``, its
    losses brought to the host (the call's one device sync): ``(state, losses (steps,), timer)``,
    the timer a CompileTimer for the ``first`` call, else None (a timer costs ~0.6 ms a call)."""
    interrupts.phase("compile" if first else "steps")
    with CompileTimer(this_thread=True) if first else contextlib.nullcontext() as compiling:
        state, losses = steps(graphdef, state, chunk, bos_id, skip_nonfinite, shardings, num_steps)
        losses = distributed.to_host(losses)  # the call's one device sync
    return state, losses, compiling


def _save_if_due(checkpoints, done: Progress, schedule: Schedule, state, saved: int | None,
                 stopping: bool) -> int | None:
    """Save a training checkpoint of ``state`` at ``done.step`` when one is due there (and not
    saved yet); returns the step of the newest checkpoint saved (``saved`` when none was due)."""
    if (checkpoints is None or saved == done.step
            or not schedule.checkpoint_due(done.step, stopping=stopping)):
        return saved
    interrupts.phase("save")
    checkpoints.save(done.step, distributed.to_local(state), done.record(schedule.steps_per_epoch))
    _note_saved(checkpoints, done.step)
    return done.step


def _epochs_result(done: Progress, resumed_from: int | None, steps_per_epoch: int
                   ) -> EpochsResult:
    """What :func:`train_epochs` returns, from the run's final :class:`Progress`."""
    # The steady rate: the epochs after the first one this call trained in (which compiles,
    # and which a resumed run may have begun in another process).
    steady = done.tokens_per_sec[(resumed_from or 0) // steps_per_epoch + 1:]
    return EpochsResult(losses=done.losses, tokens_per_sec=done.tokens_per_sec,
                        skipped_steps=done.skipped_steps, resumed_from_step=resumed_from,
                        steady_tokens_per_sec=float(np.median(steady)) if steady else None)


def train_epochs(model, optimizer: nnx.Optimizer, nmt, *, epochs: int, desc: str, progress: bool,
                 log, log_every: int, config: dict, long_run: LongRunConfig | None = None,
                 mesh=None, after_first_call: Callable[[], object] | None = None,
                 lengths: tuple[int, int] | None = None,
                 row_length: int | None = None) -> EpochsResult:
    """The teacher-forced epochs of any seq2seq model (``model(src, src_valid_len, dec_input)
    -> logits``), with training checkpoints; the per-epoch loss per target token, tokens/sec,
    the skipped steps and the step resumed from.

    The model and optimizer are split once; the steps run in compiled calls of
    :func:`train_steps` over stacked batches, one device sync (their losses) per call: the steps
    of :func:`train_step` batch after batch (same batches, order, dropout keys and updates)
    without a dispatch, an NNX split/merge and a host round trip per step. Each epoch is one
    call; with ``checkpoint_every = N`` a call also ends at every multiple of ``N`` steps, where
    a checkpoint is saved (scanning an epoch in pieces is bit-identical on CPU). The model and
    optimizer get the trained state back at the end, in a ``finally`` block. ``config``: the
    run's record, naming all the model and optimizer are built from: it keys the checkpoints
    and, with :func:`~jax_attention.runtime.compilation.stored_programs` on, the traced step.

    ``long_run`` (:class:`~jax_attention.models.configs.LongRunConfig`): with a ``checkpoint_dir``, a
    training checkpoint is written every ``checkpoint_every`` steps (``None``: every epoch), at
    the end, and on SIGINT (then :class:`TrainingInterrupted` is raised); ``resume`` continues
    from the newest one. A non-finite step stops training with :class:`NonFiniteLossError`, or
    with ``skip_nonfinite`` is skipped and counted (left out of its epoch's loss).

    ``mesh`` (:func:`jax_attention.runtime.distributed.make_mesh`; ``None``: one device) places the
    state and splits every batch over its ``data`` axis; the compiled step is the same.

    ``after_first_call`` is called once, when the first compiled call has returned (its
    compilation done): a moment to start other work on the cores the steps leave idle.
    ``lengths = (S, T)`` (:func:`padded_lengths`) cuts every batch's sources and targets to
    ``S`` and ``T`` steps, the loss still divided by ``num_steps``; ``None``: the book's length.
    ``row_length`` packs each batch's sentence pairs into rows of that many tokens instead
    (:func:`~jax_attention.data.batches.packed_epoch_batches`; the model takes segment ids).
    """
    long_run = LongRunConfig() if long_run is None else long_run
    mesh = distributed.make_mesh(1) if mesh is None else mesh
    bos_id = nmt.tgt_vocab["<bos>"]
    schedule = Schedule(epochs, nmt.num_batches, long_run.checkpoint_every)
    graphdef, state = nnx.split((model, optimizer))
    cache = compilation.stored_programs() if config and mesh.size == 1 else None  # one device
    steps = train_steps if cache is None else program_cache.StoredJit(
        train_steps, cache, step_program(config), described=(0,))  # the config names the graph
    checkpoints = None
    try:
        checkpoints, state, done, resumed_from, lines = open_checkpoints(
            long_run, config, state, schedule)
        saved = done.step if resumed_from is not None else None
        state = distributed.place_state(state, mesh)  # after the restore (one device's arrays)
        shardings = leaf_shardings(state)
        data = _EpochData(nmt, schedule, mesh, lengths, row_length)
        num_steps = None if lengths is None and row_length is None else nmt.num_steps
        with sigint_requests(checkpoints is not None) as stop_requested, \
                ProgressLog(epochs, desc=desc, progress=progress, log=log,
                            initial=len(done.losses)) as bar:
            for line in lines:
                bar.emit(line)
            started, clock = done.step, None
            _note_saved(checkpoints, saved)
            if done.step < schedule.total:
                bar.emit("compiling the training step (seconds, once per run; the compilation "
                         "cache keeps it for the next run) ...")
            while done.step < schedule.total:
                if stop_requested.is_set():  # before this call: nothing new to save
                    raise _interrupted(done, schedule, checkpoints, saved, started)
                start = time.perf_counter()
                batch, end = done.step % schedule.steps_per_epoch, schedule.call_end(done.step)
                chunk, tokens = data.call(done.step, end)
                state, losses, compiling = _compiled_call(
                    steps, graphdef, state, chunk, bos_id, long_run.skip_nonfinite, shardings,
                    num_steps, first=clock is None)
                done.epoch_seconds += time.perf_counter() - start
                if clock is None:
                    report_compiled(bar, compiling, end - batch, time.perf_counter() - start)
                stopping = stop_requested.is_set()
                if after_first_call is not None and not stopping:
                    after_first_call()
                    after_first_call = None
                _report_rejected(losses, done, tokens, schedule, checkpoints,
                                 long_run.skip_nonfinite, bar)
                done.add(losses, tokens)
                _after_call(done, schedule, bar, log_every, time_left(done.step, schedule.total, clock))
                if clock is None:
                    clock = (time.perf_counter(), done.step)
                    bar.restart_clock()
                saved = _save_if_due(checkpoints, done, schedule, state, saved, stopping)
                if stopping and done.step < schedule.total:
                    raise _interrupted(done, schedule, checkpoints, saved, started)
    finally:
        nnx.update((model, optimizer), distributed.to_local(state))
        if checkpoints is not None:
            checkpoints.close()
    return _epochs_result(done, resumed_from, schedule.steps_per_epoch)
