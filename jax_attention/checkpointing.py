"""Training checkpoints, written with Orbax: resume a killed or interrupted run where it stopped.

A *training* checkpoint is not the exported model of :func:`jax_attention.train.save_checkpoint`
(``params.npz`` + vocabularies, what ``jax-attention translate`` reads). It holds the whole
training position, so that a run resumed from it continues exactly as the uninterrupted run
would have — bit for bit on CPU:

- ``state``: the split NNX state of ``(model, optimizer)``: the parameters, Adam's moments and
  step count, the optimizer's step and the model's dropout stream (key and count), as a tree of
  arrays keyed by ``model/...`` and ``optimizer/...`` paths. PRNG keys are stored as their raw
  ``key_data``; restoring wraps them again with the implementation of the run's own keys.
- ``progress`` (JSON): the step (training steps done), the data-order position (epoch and batch
  within it, both 0-based), the per-epoch history the run returns, the partial sums of the epoch
  in progress, the count of skipped steps, the run's configuration (model sizes, training
  settings, seed), the library versions and a SHA-256 of the state's arrays.

Checkpoint ``N`` (the step directory ``DIR/N``) is the state after ``N`` steps. Orbax writes each
step into a temporary directory and renames it when complete, so a process killed while saving
leaves no half-written step (the temporary directory is removed the next time the directory is
opened); only the newest ``keep`` steps are kept. Saves are synchronous: :meth:`
TrainingCheckpoints.save` returns once the step is on disk.

Restoring takes the newest step that reads back intact; an unreadable one (a truncated or
overwritten file, a bad JSON, a checksum that does not match) is reported with a
:class:`CorruptCheckpointWarning` naming the step and why, moved aside to ``DIR/N.corrupt`` and
the step before it is tried. A readable checkpoint of another configuration — different settings,
or a state whose array paths, shapes or dtypes differ from this run's — is refused with a
:class:`CheckpointMismatchError` that names every difference; nothing is ever loaded in part.
"""

from __future__ import annotations

import copy
import hashlib
import os
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jax_attention.params import flatten_params, unflatten_params
from jax_attention.configs import DEFAULT_KEEP
from jax_attention._checks import check_int
from jax_attention.provenance import versions

__all__ = ["TRAINING_CHECKPOINT_FORMAT", "DEFAULT_KEEP", "TrainingCheckpoints",
           "read_training_checkpoint", "CheckpointMismatchError", "CorruptCheckpointWarning",
           "state_arrays", "config_differences"]

TRAINING_CHECKPOINT_FORMAT = "jax-attention.training-checkpoint/1"
# Settings that may change between a run and its resumption without changing its results: the
# number of epochs (a run can be extended; each epoch's batches depend only on the seed and the
# epoch's index).
_RESUMABLE_CHANGES = (("training", "epochs"),)
# Settings added to a run's configuration after checkpoints without them were written, with the
# value that reproduces what those runs did: absent on one side and this value on the other is
# no difference.
_ADDED_SETTINGS = {("training", "val_fraction"): 0.0}


class CheckpointMismatchError(ValueError):
    """A readable checkpoint that belongs to another configuration; the message lists the
    differences (settings, and array paths missing, unexpected or of another shape or dtype)."""


class CorruptCheckpointWarning(UserWarning):
    """The newest checkpoint could not be read back; an older one is used."""


class _Unreadable(Exception):
    """A step that cannot be read back intact; the message says why."""


def _is_key(array) -> bool:
    return jnp.issubdtype(array.dtype, jax.dtypes.prng_key)


def _path_name(path) -> str:
    return "/".join(str(getattr(entry, "key", getattr(entry, "idx", entry))) for entry in path)


def state_arrays(state) -> dict[str, np.ndarray]:
    """The split ``(model, optimizer)`` NNX state as ``{path: NumPy array}``, in a fixed order.

    Paths are ``model/<the model's path>`` and ``optimizer/<the optimizer's path>`` joined by
    ``/`` (``model/encoder/embedding``, ``optimizer/opt_state/1/0/mu/encoder/embedding``); PRNG
    keys become their ``key_data`` (``uint32``).

    Args:
      state: the second result of ``nnx.split((model, optimizer))``, or a state of that
        structure.
    """
    pure = nnx.to_pure_dict(state)
    leaves, _ = jax.tree_util.tree_flatten_with_path({"model": pure[0], "optimizer": pure[1]})
    return {_path_name(path): np.asarray(jax.random.key_data(leaf) if _is_key(leaf) else leaf)
            for path, leaf in leaves}


def _checksum(arrays: dict[str, np.ndarray]) -> str:
    """SHA-256 over every array's path, dtype, shape and bytes, in sorted path order."""
    digest = hashlib.sha256()
    for path in sorted(arrays):
        array = np.ascontiguousarray(arrays[path])
        digest.update(f"{path}:{array.dtype.str}:{array.shape};".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def _structure_differences(stored: dict[str, np.ndarray], expected: dict[str, np.ndarray]
                           ) -> list[str]:
    """What keeps ``stored`` from filling a state shaped like ``expected``: one line per issue."""
    lines = []
    missing = [path for path in expected if path not in stored]
    unexpected = [path for path in stored if path not in expected]
    if missing:
        lines.append(f"missing from the checkpoint: {', '.join(missing)}")
    if unexpected:
        lines.append(f"unexpected in the checkpoint: {', '.join(unexpected)}")
    for path, want in expected.items():
        got = stored.get(path)
        if got is not None and (got.shape != want.shape or got.dtype != want.dtype):
            lines.append(f"{path}: {got.dtype}{list(got.shape)} in the checkpoint, "
                         f"{want.dtype}{list(want.shape)} in this run")
    return lines


def config_differences(stored: dict, current: dict, prefix: str = "") -> list[str]:
    """The settings of ``stored`` and ``current`` that differ, one line each
    (``"training.lr: 0.005 in the checkpoint, 0.01 in this run"``).

    Nested dicts are compared key by key (``training.lr``); the settings a resumed run may change
    (the number of epochs) are left out.
    """
    lines = []
    for key in sorted(set(stored) | set(current), key=str):
        name = f"{prefix}{key}"
        if tuple(name.split(".")) in _RESUMABLE_CHANGES:
            continue
        old, new = stored.get(key, "<absent>"), current.get(key, "<absent>")
        added = _ADDED_SETTINGS.get(tuple(name.split(".")), "<none>")
        if "<absent>" in (old, new) and added in (old, new):
            continue
        if isinstance(old, dict) and isinstance(new, dict):
            lines.extend(config_differences(old, new, f"{name}."))
        elif old != new:
            lines.append(f"{name}: {old!r} in the checkpoint, {new!r} in this run")
    return lines


class TrainingCheckpoints:
    """The training checkpoints of one run in one directory (Orbax ``CheckpointManager``).

    Use as a context manager, or call :meth:`close`.

    Args:
      directory: where the step directories go (created if missing, unless ``read_only``).
      config: the run's configuration (JSON-ready): stored with every checkpoint and compared on
        :meth:`restore`; ``None`` only with ``read_only``.
      keep: how many of the newest checkpoints to keep (>= 1).
      read_only: only :meth:`read` (nothing is written, created or cleaned up; safe while the
        training process is still writing there).
    """

    def __init__(self, directory: str | os.PathLike, *, config: dict | None,
                 keep: int = DEFAULT_KEEP, read_only: bool = False):
        import orbax.checkpoint as ocp

        check_int("keep", keep, 1)
        if config is None and not read_only:
            raise ValueError("config is required unless read_only")
        self.directory = Path(directory).absolute()
        if self.directory.exists() and not self.directory.is_dir():
            raise FileExistsError(f"checkpoint directory {str(self.directory)!r} exists and is "
                                  "not a directory")
        if read_only and not self.directory.is_dir():
            raise FileNotFoundError(f"checkpoint directory {str(self.directory)!r} does not exist")
        self.config = copy.deepcopy(config)
        self.read_only = read_only
        self._ocp = ocp
        options = ocp.CheckpointManagerOptions(
            preservation_policy=ocp.checkpoint_managers.LatestN(keep),
            # The caller decides when to save (every N steps, on SIGINT); a save returns once
            # the step is complete on disk, so that an exit right after it loses nothing.
            enable_async_checkpointing=False,
            # A save cut short by a kill leaves a temporary directory; it is never a step.
            cleanup_tmp_directories=not read_only,
            create=not read_only,
            # Not Orbax's read_only option, which logs warnings on every use: :meth:`save`
            # checks ``read_only`` itself.
        )
        self._manager = ocp.CheckpointManager(self.directory, options=options,
                                              item_names=("state", "progress"))

    def __enter__(self) -> TrainingCheckpoints:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        """Wait for pending work and release the manager."""
        self._manager.wait_until_finished()
        self._manager.close()

    @property
    def steps(self) -> list[int]:
        """The steps on disk, oldest first."""
        return sorted(self._manager.all_steps())

    def step_path(self, step: int) -> Path:
        """The directory of checkpoint ``step``."""
        return self.directory / str(step)

    def save(self, step: int, state, progress: dict) -> Path:
        """Write checkpoint ``step``: ``state`` and ``progress`` (a JSON-ready dict).

        Returns:
          The step's directory.

        Raises:
          ValueError: a floating-point array of ``state`` holds NaN or Inf (a checkpoint is
            only ever written of a good state), or checkpoint ``step`` exists already.
        """
        if self.read_only:
            raise ValueError(f"{str(self.directory)!r} was opened read only")
        arrays = state_arrays(state)
        bad = [path for path, array in arrays.items()
               if np.issubdtype(array.dtype, np.inexact) and not np.all(np.isfinite(array))]
        if bad:
            raise ValueError(f"refusing to write checkpoint {step}: NaN or Inf in {', '.join(bad)}")
        if step in self._manager.all_steps():
            raise ValueError(f"checkpoint {step} exists already in {str(self.directory)!r}")
        record = {"format": TRAINING_CHECKPOINT_FORMAT, "step": step, **progress,
                  "config": self.config, "checksum": _checksum(arrays), "versions": versions()}
        ocp = self._ocp
        self._manager.save(step, force=True, args=ocp.args.Composite(
            state=ocp.args.StandardSave(unflatten_params(arrays)),
            progress=ocp.args.JsonSave(record)))
        self._manager.wait_until_finished()
        return self.step_path(step)

    def read(self, step: int | None = None) -> tuple[dict[str, np.ndarray], dict]:
        """Checkpoint ``step`` (default: the newest) as ``(arrays, progress)``, checked.

        ``arrays`` is ``{path: NumPy array}`` as :func:`state_arrays` names them; ``progress`` is
        the JSON record (see the module docstring).

        Raises:
          FileNotFoundError: there is no such step.
          ValueError: it cannot be read back intact; the message says why.
        """
        steps = self.steps
        if step is None and steps:
            step = steps[-1]
        if step not in steps:
            raise FileNotFoundError(f"no training checkpoint {step} in {str(self.directory)!r} "
                                    f"(steps: {steps})")
        try:
            return self._read(step)
        except _Unreadable as error:
            raise ValueError(f"training checkpoint {step} in {str(self.directory)!r} cannot be "
                             f"read back: {error}") from None

    def _read(self, step: int) -> tuple[dict[str, np.ndarray], dict]:
        """Checkpoint ``step`` as ``(arrays, progress)``; :class:`_Unreadable` when damaged."""
        ocp = self._ocp
        try:
            restored = self._manager.restore(step, args=ocp.args.Composite(
                state=ocp.args.StandardRestore(), progress=ocp.args.JsonRestore()))
            progress = restored.progress
            arrays = {path: np.asarray(array)
                      for path, array in flatten_params(restored.state).items()}
        except (OSError, ValueError, KeyError, TypeError) as error:  # Orbax's and TensorStore's
            raise _Unreadable(f"{type(error).__name__}: {error}") from None
        if not isinstance(progress, dict) or progress.get("format") != TRAINING_CHECKPOINT_FORMAT:
            raise _Unreadable(f"its progress record is not a {TRAINING_CHECKPOINT_FORMAT!r} one")
        for key, kind in (("step", int), ("config", dict), ("checksum", str)):
            if not isinstance(progress.get(key), kind):
                raise _Unreadable(f"its progress record lacks {key!r}")
        if progress["step"] != step:
            raise _Unreadable(f"its progress record says step {progress['step']}")
        if _checksum(arrays) != progress["checksum"]:
            raise _Unreadable("its arrays do not match the checksum written with them")
        return arrays, progress

    def _set_aside(self, step: int) -> Path:
        source = self.step_path(step)
        target = source.with_name(f"{step}.corrupt")
        number = 1
        while target.exists():
            number += 1
            target = source.with_name(f"{step}.corrupt{number}")
        os.rename(source, target)
        self._manager.reload()
        return target

    def restore(self, target_state):
        """The newest intact checkpoint, as ``(state, progress)``; ``None`` when there is none.

        A damaged newest checkpoint is reported (:class:`CorruptCheckpointWarning`, naming the
        step and the reason), moved aside to ``DIR/N.corrupt`` — so that training can write step
        ``N`` again — and the one before it is tried.

        Args:
          target_state: a state of this run's structure (``nnx.split((model, optimizer))[1]``):
            the restored arrays take its paths, shapes, dtypes and PRNG implementations.

        Returns:
          ``(state, progress)``: a new state of ``target_state``'s structure holding the
          checkpoint's arrays, and the progress record (see the module docstring).

        Raises:
          CheckpointMismatchError: the checkpoint was written with another configuration, or its
            arrays do not fit ``target_state``; the message lists every difference.
          FileNotFoundError: there are checkpoints, but none can be read back.
        """
        if self.read_only:
            raise ValueError(f"{str(self.directory)!r} was opened read only; restoring may move "
                             "a damaged checkpoint aside")
        expected = state_arrays(target_state)
        problems = []
        for step in reversed(self.steps):
            try:
                arrays, progress = self._read(step)
            except _Unreadable as error:
                moved = self._set_aside(step)
                problems.append(f"step {step}: {error}")
                warnings.warn(f"training checkpoint {step} in {str(self.directory)!r} cannot be "
                              f"read back ({error}); moved it to {moved.name} and trying the one "
                              "before it", CorruptCheckpointWarning, stacklevel=2)
                continue
            differences = config_differences(progress["config"], self.config)
            structure = _structure_differences(arrays, expected)
            if differences or structure:
                raise CheckpointMismatchError(
                    f"cannot resume from training checkpoint {step} in {str(self.directory)!r}: "
                    "it belongs to another configuration:\n  "
                    + "\n  ".join(differences + structure))
            return self._fill(target_state, arrays), progress
        if problems:
            raise FileNotFoundError(f"no readable training checkpoint in {str(self.directory)!r}: "
                                    + "; ".join(problems))
        return None

    @staticmethod
    def _fill(target_state, arrays: dict[str, np.ndarray]):
        """A copy of ``target_state`` holding ``arrays`` (paths checked by the caller)."""
        pure = nnx.to_pure_dict(target_state)

        def leaf(path, like):
            array = arrays[_path_name(path)]
            if _is_key(like):
                return jax.random.wrap_key_data(array, impl=jax.random.key_impl(like))
            return jnp.asarray(array)

        restored = jax.tree_util.tree_map_with_path(leaf, {"model": pure[0],
                                                           "optimizer": pure[1]})
        state = jax.tree.map(lambda x: x, target_state)  # a new State, same structure
        nnx.replace_by_pure_dict(state, {0: restored["model"], 1: restored["optimizer"]})
        return state


def read_training_checkpoint(directory: str | os.PathLike, step: int | None = None
                             ) -> tuple[dict[str, np.ndarray], dict]:
    """The arrays and progress record of training checkpoint ``step`` (default: the newest) in
    ``directory``, read only and checked: :meth:`TrainingCheckpoints.read`."""
    with TrainingCheckpoints(directory, config=None, read_only=True) as checkpoints:
        return checkpoints.read(step)
