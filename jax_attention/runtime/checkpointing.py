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
  settings, seed, the data's fingerprint), the library versions and a SHA-256 of the state's
  arrays.

Checkpoint ``N`` (the step directory ``DIR/N``) is the state after ``N`` steps. Orbax writes each
step into a temporary directory (``DIR/N.orbax-checkpoint-tmp``) and renames it when complete, so
a process killed while saving leaves no half-written step (the temporary directory is removed the
next time the directory is opened for writing); only the newest ``keep`` steps are kept. Saves
are synchronous: :meth:`TrainingCheckpoints.save` returns once the step is on disk. A save that
cannot be written (disk full, read-only or unwritable directory, file-size limit) raises
:class:`CheckpointWriteError` — an ``OSError`` with a one-line message and the OS's ``errno`` —
after removing its temporary directory; the steps written before stay intact and readable.

Restoring takes the newest step that reads back intact; an unreadable one (a truncated or
overwritten file, a bad JSON, a checksum that does not match) is reported with a
:class:`CorruptCheckpointWarning` naming the step and why, moved aside to ``DIR/N.corrupt`` (see
:attr:`TrainingCheckpoints.set_aside`) and the step before it is tried. A readable checkpoint of
another configuration — different settings, or a state whose array paths, shapes or dtypes differ
from this run's — is refused with a :class:`CheckpointMismatchError` that names every difference;
nothing is ever loaded in part.

**Only this project's checkpoints are touched.** Orbax takes every directory named by an integer
for a step: it would read it, and delete it when it falls out of the newest ``keep``. A step
directory of ours is recognised by what is written into it (Orbax's ``_CHECKPOINT_METADATA`` and
``commit_success.txt``, our ``state`` and ``progress`` items); one that was damaged still has
them and is handled as above. Any other entry named by an integer (``DIR/3/notes.txt``, a file
``DIR/7``) is the user's: opening the directory for writing refuses it with a
:class:`ForeignEntryError` naming the entries, and nothing is renamed or deleted; a read-only
opening ignores such entries (:attr:`TrainingCheckpoints.steps` leaves them out,
:attr:`TrainingCheckpoints.foreign_entries` lists them).

**One run per directory.** Opening a directory for writing takes its lock first
(:class:`jax_attention.runtime.directory_lock.DirectoryLock`: ``DIR/.lock``, holding the holder's PID,
host and start time) — before Orbax's start-up, which removes temporary directories and so would
destroy another run's save in progress; a second opener gets :class:`CheckpointDirectoryBusy`
naming the holder, and a lock left by a process that has ended is taken over.
:meth:`TrainingCheckpoints.close` releases it; read-only openings neither take nor heed it. A
directory that cannot be created or written (read-only file system, a path under a file, no
permission) fails at once with a one-line :class:`CheckpointDirectoryError`.

**Quiet.** Every Orbax call of this module runs inside
:func:`jax_attention.runtime.orbax_quiet.quiet_orbax`, which keeps the failure reports Orbax and
TensorStore print on their own (log records, "Event loop is closed" tracebacks: dozens to hundreds
of lines for one damaged checkpoint) off stderr for the duration of the call; what this module
raises or warns says what went wrong, in one line.
"""

from __future__ import annotations

import copy
import hashlib
import os
import re
import shutil
import stat
import time
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jax_attention.params import flatten_params, unflatten_params
from jax_attention.models.configs import DEFAULT_KEEP
from jax_attention._checks import check_int
from jax_attention.runtime.directory_lock import LOCK_FILE, CheckpointDirectoryBusy, DirectoryLock
from jax_attention.runtime.orbax_quiet import quiet_orbax
from jax_attention.runtime.provenance import os_reason, versions

__all__ = ["TRAINING_CHECKPOINT_FORMAT", "DEFAULT_KEEP", "LOCK_FILE", "TrainingCheckpoints",
           "read_training_checkpoint", "CheckpointMismatchError", "CorruptCheckpointWarning",
           "CheckpointWriteError", "CheckpointDirectoryError", "CheckpointDirectoryBusy",
           "ForeignEntryError", "state_arrays", "config_differences", "step_directories"]

#: The ``"format"`` of a training checkpoint's progress record (the JSON saved beside its arrays,
#: with the step, the configuration and the arrays' checksum): written with each save, and a step
#: whose record holds another value is unreadable (reported, moved aside) rather than resumed.
#: The ``/1`` is the layout's version.
TRAINING_CHECKPOINT_FORMAT = "jax-attention.training-checkpoint/1"
# Settings that may change between a run and its resumption without changing its results: the
# number of epochs (a run can be extended; each epoch's batches depend only on the seed and the
# epoch's index).
_RESUMABLE_CHANGES = (("training", "epochs"),)
# Settings added to a run's configuration after checkpoints without them were written, with the
# value that reproduces what those runs did: absent on one side and this value on the other is
# no difference.
_ADDED_SETTINGS = {("training", "val_fraction"): 0.0, ("training", "trim_padding"): False,
                   ("training", "dtype"): "float32", ("training", "pack"): False,
                   ("training", "pack_length"): 0}
# Sections added likewise, that no single value stands for (``data``: the training data's
# fingerprint): absent from the checkpoint is no difference, whatever this run holds; present in
# both, they are compared setting by setting as usual.
_ADDED_SECTIONS = frozenset({("data",)})
# What Orbax and this module write into every step directory; a damaged step keeps at least one.
_STEP_MARKERS = frozenset({"_CHECKPOINT_METADATA", "commit_success.txt", "state", "progress"})
# Orbax's temporary directory of a step being written: `N.orbax-checkpoint-tmp[-<time>]`.
_TMP_SUFFIX = ".orbax-checkpoint-tmp"
_SET_ASIDE_NAME = re.compile(r"(\d+)\.corrupt(\d*)")


class CheckpointMismatchError(ValueError):
    """A readable checkpoint that belongs to another configuration; the message lists the
    differences (settings, and array paths missing, unexpected or of another shape or dtype)."""


class CorruptCheckpointWarning(UserWarning):
    """The newest checkpoint could not be read back; an older one is used."""


class CheckpointWriteError(OSError):
    """A training checkpoint could not be written (no space left, read-only file system, no
    permission, file too large, ...). Its temporary directory is removed and the checkpoints
    written before are intact. ``errno`` is the OS's error number (``None`` when unknown);
    ``step`` the step that was not written."""

    def __init__(self, message: str, *, errno: int | None = None, step: int | None = None):
        super().__init__(message)
        self.errno, self.step = errno, step


class CheckpointDirectoryError(OSError):
    """A checkpoint directory that cannot be created or written (read-only file system, a path
    under a file, no permission); ``errno`` is the OS's error number."""

    def __init__(self, message: str, *, errno: int | None = None):
        super().__init__(message)
        self.errno = errno


class ForeignEntryError(FileExistsError):
    """The checkpoint directory holds entries named like steps that are not training checkpoints
    (the user's); ``entries`` lists their names. Nothing was changed."""

    def __init__(self, message: str, *, entries: list[str]):
        super().__init__(message)
        self.entries = entries


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
    (the number of epochs) are left out, and so are the settings and sections added since older
    checkpoints were written where the checkpoint has none (``training.val_fraction`` at 0.0, the
    ``data`` fingerprint), so that those checkpoints still resume.
    """
    lines = []
    for key in sorted(set(stored) | set(current), key=str):
        name = f"{prefix}{key}"
        path = tuple(name.split("."))
        if path in _RESUMABLE_CHANGES:
            continue
        old, new = stored.get(key, "<absent>"), current.get(key, "<absent>")
        added = _ADDED_SETTINGS.get(path, "<none>")
        if "<absent>" in (old, new) and added in (old, new):
            continue
        if old == "<absent>" and path in _ADDED_SECTIONS:
            continue
        if isinstance(old, dict) and isinstance(new, dict):
            lines.extend(config_differences(old, new, f"{name}."))
        elif old != new:
            lines.append(f"{name}: {old!r} in the checkpoint, {new!r} in this run")
    return lines


# --------------------------------------------------------------------------- errors

def _reason(error: BaseException) -> str:
    """``"Type: message"`` of an Orbax or TensorStore error, without the TensorStore spec (a few
    hundred characters of JSON) that TensorStore appends to its messages."""
    text = re.sub(r"\s*\[(tensorstore_spec|source locations)='.*?'\]", "", str(error),
                  flags=re.DOTALL)
    return f"{type(error).__name__}: {text}"


def _errors_in(error: BaseException):
    """``error`` and the errors it was raised from or while handling, outermost first."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def _os_error(error: BaseException) -> tuple[int | None, str] | None:
    """The OS error behind a failed Orbax write, as ``(errno, "[Errno 28] No space left on
    device")``, or ``None`` when it is not one.

    Orbax raises the ``OSError`` of its own Python file writes (the JSON items, the step and
    temporary directories); TensorStore (the arrays) raises ``ValueError("RESOURCE_EXHAUSTED:
    ... No space left on device [os_error_code='28'] ...")``. Either may be wrapped, so the
    whole chain is searched.
    """
    for cause in _errors_in(error):
        if isinstance(cause, OSError) and cause.errno is not None:
            return cause.errno, os_reason(cause)
        match = (re.search(r"os_error_code='(\d+)'", str(cause))
                 or re.search(r"\[Errno (\d+)\]", str(cause)))
        if match:
            number = int(match.group(1))
            return number, os_reason(OSError(number, os.strerror(number)))
    for cause in _errors_in(error):
        if isinstance(cause, OSError):
            return None, str(cause)
    return None


# --------------------------------------------------------------------------- the directory

def _is_step_directory(path: Path) -> bool:
    """Whether ``path`` is a step directory written by this module — complete or damaged: a
    directory (not a link) holding at least one of the entries Orbax and this module write."""
    try:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            return False
        return not _STEP_MARKERS.isdisjoint(os.listdir(path))
    except OSError:
        return False


def step_directories(directory: str | os.PathLike) -> list[int]:
    """The steps of the training checkpoints in ``directory`` (a ``--checkpoint-dir``), complete
    or damaged, oldest first, read from the folder alone (no Orbax): what tells a directory of
    training checkpoints from an exported model or anything else."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return sorted(int(name) for name in names
                  if _looks_like_a_step(name) and _is_step_directory(Path(directory) / name))


def _looks_like_a_step(name: str) -> bool:
    return name.isdigit()


def _entry_name(path: Path) -> str:
    """``3/`` for a directory, ``7`` for anything else."""
    try:
        return path.name + ("/" if stat.S_ISDIR(os.lstat(path).st_mode) else "")
    except OSError:
        return path.name


def _step_order(name: str):
    digits = re.match(r"\d+", name)
    return (int(digits.group()) if digits else -1, name)


class TrainingCheckpoints:
    """The training checkpoints of one run in one directory (Orbax ``CheckpointManager``).

    Use as a context manager, or call :meth:`close`.

    Args:
      directory: where the step directories go (created if missing, unless ``read_only``).
      config: the run's configuration (JSON-ready): stored with every checkpoint and compared on
        :meth:`restore`; ``None`` only with ``read_only``.
      keep: how many of the newest checkpoints to keep (>= 1).
      read_only: only :meth:`read` (nothing is written, created, locked or cleaned up; safe
        while the training process is still writing there).

    Raises:
      CheckpointDirectoryBusy: another training run has the directory open for writing.
      ForeignEntryError: the directory holds entries named like steps (``3/``, ``7``) that are
        not training checkpoints; nothing was changed.
      CheckpointDirectoryError: the directory cannot be created or written (an ``OSError``).
      FileExistsError: ``directory`` is a file. FileNotFoundError: ``read_only`` and it does not
        exist.
    """

    def __init__(self, directory: str | os.PathLike, *, config: dict | None,
                 keep: int = DEFAULT_KEEP, read_only: bool = False):
        import orbax.checkpoint as ocp

        check_int("keep", keep, 1)
        if config is None and not read_only:
            raise ValueError("config is required unless read_only")
        self._lock: DirectoryLock | None = None
        self._manager = None
        self._closed = False
        self.directory = Path(directory).absolute()
        if self.directory.exists() and not self.directory.is_dir():
            raise FileExistsError(f"checkpoint directory {str(self.directory)!r} exists and is "
                                  "not a directory")
        if read_only and not self.directory.is_dir():
            raise FileNotFoundError(f"checkpoint directory {str(self.directory)!r} does not exist")
        self.config = copy.deepcopy(config)
        self.read_only = read_only
        self._ocp = ocp
        if not read_only:
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
                # Before Orbax's start-up, which removes the temporary directories it finds: one
                # may be another run's save in progress.
                self._lock = DirectoryLock(self.directory)
            except OSError as error:
                raise self._directory_error(error) from None
        try:
            if not read_only:
                foreign = self.foreign_entries
                if foreign:
                    raise self._foreign_entry_error(foreign, "nothing was changed")
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
            try:
                with quiet_orbax():
                    self._manager = ocp.CheckpointManager(self.directory, options=options,
                                                          item_names=("state", "progress"))
            except OSError as error:
                raise self._directory_error(error) from None
        except BaseException:
            self._release()
            raise

    def _foreign_entry_error(self, foreign: list[str], untouched: str) -> ForeignEntryError:
        return ForeignEntryError(
            f"{self.directory} holds entries named like training checkpoints that are not "
            f"training checkpoints ({', '.join(foreign)}); {untouched}: move them elsewhere or "
            "choose another --checkpoint-dir", entries=foreign)

    def _directory_error(self, error: OSError) -> CheckpointDirectoryError:
        reason = _os_error(error)
        number, text = reason if reason is not None else (None, str(error))
        return CheckpointDirectoryError(
            f"cannot use {self.directory} as a training checkpoint directory: {text}",
            errno=number)

    def __enter__(self) -> TrainingCheckpoints:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        """Wait for pending work, release the manager and the directory's lock (removing
        ``DIR/.lock``). Calling it again does nothing; afterwards :attr:`steps` and :meth:`read`
        still answer, :meth:`save` and :meth:`restore` refuse (the lock is released)."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._manager is not None:
                with quiet_orbax():
                    self._manager.wait_until_finished()
                    self._manager.close()
        finally:
            self._release()

    def _release(self) -> None:
        lock, self._lock = self._lock, None
        if lock is not None:
            lock.release()

    def _check_writable(self) -> None:
        if self.read_only:
            raise ValueError(f"{str(self.directory)!r} was opened read only")
        if self._closed:
            raise ValueError(f"the training checkpoints in {str(self.directory)!r} were closed "
                             "(their lock released); open them again to write")

    @property
    def steps(self) -> list[int]:
        """The steps on disk, oldest first (entries named like steps that are not training
        checkpoints left out: see :attr:`foreign_entries`)."""
        steps = self._manager.all_steps()  # Orbax's list, kept up to date in memory
        return sorted(step for step in steps if _is_step_directory(self.step_path(step)))

    @property
    def foreign_entries(self) -> list[str]:
        """The entries of the directory named like steps (an integer) that are not training
        checkpoints: ``3/`` for a directory, ``7`` for a file. Never touched; a directory
        holding any cannot be opened for writing (:class:`ForeignEntryError`)."""
        try:
            names = os.listdir(self.directory)
        except OSError:
            return []
        return [_entry_name(self.directory / name) for name in sorted(names, key=_step_order)
                if _looks_like_a_step(name) and not _is_step_directory(self.directory / name)]

    @property
    def set_aside(self) -> list[str]:
        """The damaged checkpoints moved aside (by this opening or an earlier one), by step:
        ``["3.corrupt", "3.corrupt2", "5.corrupt"]``."""
        try:
            names = os.listdir(self.directory)
        except OSError:
            return []
        return sorted((name for name in names if _SET_ASIDE_NAME.fullmatch(name)),
                      key=lambda name: tuple(int(part or 1) for part in
                                             _SET_ASIDE_NAME.fullmatch(name).groups()))

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
          CheckpointWriteError: it could not be written (no space left, read-only file system,
            ...; an ``OSError``); nothing of it is left, the earlier steps are intact.
        """
        self._check_writable()
        manager = self._manager
        arrays = state_arrays(state)
        bad = [path for path, array in arrays.items()
               if np.issubdtype(array.dtype, np.inexact) and not np.all(np.isfinite(array))]
        if bad:
            raise ValueError(f"refusing to write checkpoint {step}: NaN or Inf in {', '.join(bad)}")
        if step in manager.all_steps():
            raise ValueError(f"checkpoint {step} exists already in {str(self.directory)!r}")
        record = {"format": TRAINING_CHECKPOINT_FORMAT, "step": step, **progress,
                  "config": self.config, "checksum": _checksum(arrays), "versions": versions()}
        ocp = self._ocp
        before = self.steps
        self._remove_temporary(step)  # a save of this step that failed earlier
        try:
            with quiet_orbax():
                manager.save(step, force=True, args=ocp.args.Composite(
                    state=ocp.args.StandardSave(unflatten_params(arrays)),
                    progress=ocp.args.JsonSave(record)))
                manager.wait_until_finished()
        except BaseException as error:
            # Whatever stopped it (a full disk, Ctrl-C), no partial step is left behind.
            self._remove_temporary(step)
            reason = _os_error(error) if isinstance(error, Exception) else None
            if reason is None:
                raise
            number, text = reason
            intact = (f"the checkpoints already there (steps {before}) are intact" if before
                      else "no checkpoint was there before")
            raise CheckpointWriteError(
                f"could not write training checkpoint {step} in {self.directory}: {text}; "
                f"{intact}", errno=number, step=step) from None
        return self.step_path(step)

    def _remove_temporary(self, step: int) -> None:
        """Remove the temporary directories of a save of ``step`` (ours: the lock is held)."""
        for _ in range(50):
            leftovers = [path for path in self.directory.glob(f"{step}{_TMP_SUFFIX}*")
                         if path.name.startswith(f"{step}.")]
            if not leftovers:
                return
            for path in leftovers:
                shutil.rmtree(path, ignore_errors=True)
            # A TensorStore write still in flight may recreate a file in it: look again.
            time.sleep(0.01)

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
        manager = self._manager
        try:
            with quiet_orbax():
                restored = manager.restore(step, args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(), progress=ocp.args.JsonRestore()))
            progress = restored.progress
            arrays = {path: np.asarray(array)
                      for path, array in flatten_params(restored.state).items()}
        except (OSError, ValueError, KeyError, TypeError) as error:  # Orbax's and TensorStore's
            raise _Unreadable(_reason(error)) from None
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

    def _move_aside(self, step: int) -> Path:
        source = self.step_path(step)
        target = source.with_name(f"{step}.corrupt")
        number = 1
        while target.exists():
            number += 1
            target = source.with_name(f"{step}.corrupt{number}")
        os.rename(source, target)
        manager = self._manager
        with quiet_orbax():
            manager.reload()  # so that step can be written again
            # An entry named like a step that appeared since the directory was opened is now
            # Orbax's to delete: refuse to go on rather than let it.
            unknown = sorted(set(manager.all_steps()) - set(self.steps))
        if unknown:
            foreign = [_entry_name(self.step_path(number)) for number in unknown]
            raise self._foreign_entry_error(foreign, "nothing of them was changed")
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
          FileNotFoundError: there are checkpoints, but none can be read back (all were moved
            aside: :attr:`set_aside`).
        """
        if self.read_only:
            raise ValueError(f"{str(self.directory)!r} was opened read only; restoring may move "
                             "a damaged checkpoint aside")
        self._check_writable()
        expected = state_arrays(target_state)
        problems = []
        for step in reversed(self.steps):
            try:
                arrays, progress = self._read(step)
            except _Unreadable as error:
                moved = self._move_aside(step)
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
