"""Training checkpoints under faults, at the library level (:class:`TrainingCheckpoints` with a
tiny state, no training): entries of the user's in the checkpoint directory, a full or read-only
file system, the noise Orbax and TensorStore print, and two runs on one directory (the lock).

The subprocesses (``python -c``) import this module for :func:`tiny_state` and the damage
helpers, so that they build the same state as the tests in-process.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import optax
import pytest
from flax import nnx

from jax_attention.runtime import checkpointing
from jax_attention.runtime.checkpointing import (LOCK_FILE, CheckpointDirectoryBusy,
                                         CheckpointDirectoryError, CheckpointMismatchError,
                                         CheckpointWriteError, CorruptCheckpointWarning,
                                         ForeignEntryError, TrainingCheckpoints,
                                         read_training_checkpoint)
from tests.fault_support import fill, finish, full_dir, read_only_dir, tree_snapshot, wait_for

REPO = Path(__file__).resolve().parents[1]
CONFIG = {"model": "tiny", "training": {"lr": 0.001, "epochs": 1, "seed": 0}}


class Tiny(nnx.Module):
    """Two dense layers and a dropout stream: parameters, Adam's moments and counts, a PRNG key."""

    def __init__(self, width: int, rngs: nnx.Rngs):
        self.first = nnx.Linear(width, width, rngs=rngs)
        self.second = nnx.Linear(width, 2, rngs=rngs)
        self.dropout = nnx.Dropout(0.1, rngs=rngs)


def tiny_state(seed: int = 0, width: int = 8):
    """The split ``(model, optimizer)`` state of a :class:`Tiny` model (16 arrays)."""
    model = Tiny(width, nnx.Rngs(seed, dropout=seed + 1))
    optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)
    return nnx.split((model, optimizer))[1]


def damage_data_file(step_dir: Path) -> None:
    """Truncate the step's compressed arrays to half (TensorStore: OUT_OF_RANGE / DATA_LOSS)."""
    target = sorted((step_dir / "state" / "d").iterdir())[0]
    os.truncate(target, target.stat().st_size // 2)


def damage_progress(step_dir: Path) -> None:
    """Overwrite the step's progress record with a cut JSON."""
    (step_dir / "progress" / "metadata").write_text('{"format": "jax-attention.training-che')


def _saved(directory: Path, steps=(1, 2), **options) -> Path:
    with TrainingCheckpoints(directory, config=CONFIG, **options) as checkpoints:
        for step in steps:
            checkpoints.save(step, tiny_state(step), {"epoch": 0})
    return directory


def _same_arrays(got: dict, expected: dict) -> None:
    assert list(got) == list(expected)
    for path in expected:
        np.testing.assert_array_equal(got[path], expected[path], err_msg=path)


def _python(code: str, *args: str, **options) -> subprocess.Popen:
    """``python -c code *args`` in the repository (so that ``tests`` imports), on the CPU."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    return subprocess.Popen([sys.executable, "-c", code, *args], cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **options)


def _run(code: str, *args: str, timeout: float = 240) -> tuple[int, str, str]:
    return finish(_python(code, *args), timeout)


# --------------------------------------------------------------------------- the user's entries


def test_entries_named_like_steps_that_are_not_checkpoints_are_refused_untouched(tmp_path):
    directory = _saved(tmp_path / "run", steps=(1,))
    (directory / "3").mkdir()
    (directory / "3" / "a.txt").write_text("the user's")
    (directory / "5").write_text("a file of the user's")
    before = tree_snapshot(directory)
    with pytest.raises(ForeignEntryError) as refused:
        TrainingCheckpoints(directory, config=CONFIG)
    message = str(refused.value)
    assert message == (
        f"{directory} holds entries named like training checkpoints that are not training "
        "checkpoints (3/, 5); nothing was changed: move them elsewhere or choose another "
        "--checkpoint-dir")
    assert isinstance(refused.value, FileExistsError) and refused.value.entries == ["3/", "5"]
    assert tree_snapshot(directory) == before  # nothing renamed, deleted or locked
    # Moved out: the directory opens, and step 1 is still there.
    (directory / "5").rename(tmp_path / "5")
    (directory / "3").rename(tmp_path / "3")
    with TrainingCheckpoints(directory, config=CONFIG) as checkpoints:
        assert checkpoints.steps == [1] and checkpoints.restore(tiny_state())[1]["step"] == 1


def test_read_only_openings_ignore_the_users_entries(tmp_path):
    directory = _saved(tmp_path / "run")
    (directory / "3").mkdir()
    (directory / "3" / "a.txt").write_text("the user's")
    (directory / "7").write_text("a file of the user's")
    before = tree_snapshot(directory)
    with TrainingCheckpoints(directory, config=None, read_only=True) as checkpoints:
        assert checkpoints.steps == [1, 2]
        assert checkpoints.foreign_entries == ["3/", "7"]
        assert checkpoints.read()[1]["step"] == 2
        with pytest.raises(FileNotFoundError, match=r"no training checkpoint 3 in .*\(steps: "
                                                    r"\[1, 2\]\)"):
            checkpoints.read(3)
    assert read_training_checkpoint(directory, 1)[1]["step"] == 1
    assert tree_snapshot(directory) == before


def test_an_entry_made_while_the_directory_is_open_is_never_cleaned_up(tmp_path):
    """Orbax deletes the steps past the newest ``keep``; a ``0/`` of the user's made after the
    directory was opened is not one of them."""
    directory = tmp_path / "run"
    with TrainingCheckpoints(directory, config=CONFIG, keep=1) as checkpoints:
        checkpoints.save(1, tiny_state(), {})
        (directory / "0").mkdir()
        (directory / "0" / "notes.txt").write_text("the user's")
        for step in (2, 3):
            checkpoints.save(step, tiny_state(), {})
        assert checkpoints.steps == [3]
    assert (directory / "0" / "notes.txt").read_text() == "the user's"
    assert sorted(path.name for path in directory.iterdir()) == ["0", "3"]


def test_an_entry_made_while_open_stops_a_restore_that_would_hand_it_to_orbax(tmp_path):
    directory = _saved(tmp_path / "run")
    damage_data_file(directory / "2")
    with TrainingCheckpoints(directory, config=CONFIG) as checkpoints:
        (directory / "0").mkdir()
        (directory / "0" / "notes.txt").write_text("the user's")
        with pytest.raises(ForeignEntryError, match=r"\(0/\); nothing of them was changed"):
            checkpoints.restore(tiny_state())
        assert checkpoints.set_aside == ["2.corrupt"]
    assert (directory / "0" / "notes.txt").read_text() == "the user's"


@pytest.mark.parametrize("damage", ["data", "progress", "every file emptied", "no metadata"])
def test_a_damaged_step_is_still_a_checkpoint_and_set_aside(tmp_path, damage):
    directory = _saved(tmp_path / "run")
    newest = directory / "2"
    if damage == "data":
        damage_data_file(newest)
    elif damage == "progress":
        damage_progress(newest)
    elif damage == "every file emptied":
        for path in newest.rglob("*"):
            if path.is_file():
                os.truncate(path, 0)
    else:
        (newest / "_CHECKPOINT_METADATA").unlink()
        damage_progress(newest)
    with TrainingCheckpoints(directory, config=CONFIG) as checkpoints:
        assert checkpoints.foreign_entries == [] and checkpoints.steps == [1, 2]
        with pytest.warns(CorruptCheckpointWarning, match=r"training checkpoint 2 .* moved it to "
                                                          r"2\.corrupt"):
            _, progress = checkpoints.restore(tiny_state())
        assert progress["step"] == 1
        assert checkpoints.set_aside == ["2.corrupt"] and checkpoints.steps == [1]
        checkpoints.save(2, tiny_state(2), {})  # the step can be written again
    assert sorted(path.name for path in directory.iterdir()) == ["1", "2", "2.corrupt"]


def test_when_every_step_is_damaged_set_aside_names_them(tmp_path):
    directory = _saved(tmp_path / "run", steps=(2, 4))
    for step in (2, 4):
        damage_progress(directory / str(step))
    (directory / "4.corrupt").mkdir()  # set aside by an earlier run
    with TrainingCheckpoints(directory, config=CONFIG) as checkpoints:
        with pytest.warns(CorruptCheckpointWarning), \
                pytest.raises(FileNotFoundError, match="no readable training checkpoint"):
            checkpoints.restore(tiny_state())
        assert checkpoints.set_aside == ["2.corrupt", "4.corrupt", "4.corrupt2"]
        assert checkpoints.steps == []


# --------------------------------------------------------------------------- full, read-only


def test_a_full_disk_fails_the_save_in_one_line_and_keeps_the_earlier_step(tmp_path):
    with full_dir(tmp_path) as full:
        directory = full / "run"
        with TrainingCheckpoints(directory, config=CONFIG) as checkpoints:
            checkpoints.save(1, tiny_state(1), {"epoch": 0})
            expected = checkpoints.read(1)[0]
            fill(full)
            with pytest.raises(CheckpointWriteError) as failed:
                checkpoints.save(2, tiny_state(2), {"epoch": 0})
            assert str(failed.value) == (
                f"could not write training checkpoint 2 in {directory}: [Errno 28] No space left "
                "on device; the checkpoints already there (steps [1]) are intact")
            assert isinstance(failed.value, OSError) and failed.value.errno == errno.ENOSPC
            assert failed.value.step == 2
            # No partial step, nor its temporary directory; step 1 reads back as it was.
            assert sorted(path.name for path in directory.iterdir()) == [".lock", "1"]
            assert checkpoints.steps == [1]
            _same_arrays(checkpoints.read(1)[0], expected)
            # Space again: the step is written.
            (full / ".filler").unlink()
            checkpoints.save(2, tiny_state(2), {"epoch": 0})
            assert checkpoints.steps == [1, 2]
        _same_arrays(read_training_checkpoint(directory, 1)[0], expected)


def test_the_first_save_on_a_full_disk_says_there_was_none_before(tmp_path):
    with full_dir(tmp_path) as full:
        directory = full / "run"
        with TrainingCheckpoints(directory, config=CONFIG) as checkpoints:
            fill(full)
            with pytest.raises(CheckpointWriteError, match=r"^could not write training checkpoint "
                               r"1 in .*: \[Errno 28\] No space left on device; no checkpoint was "
                               r"there before$"):
                checkpoints.save(1, tiny_state(), {})
        assert sorted(path.name for path in directory.iterdir()) == []


# The arrays of the wide state are written by TensorStore, whose error is a ValueError
# ("OUT_OF_RANGE: ... File too large [os_error_code='27']"), not an OSError: a file-size limit
# between the largest JSON file (about 5 KB) and its array data (about 60 KB) fails them there.
_FILE_SIZE_LIMIT = """
import json, os, resource, signal, sys
from tests.test_checkpoint_faults import tiny_state, CONFIG
from jax_attention.runtime.checkpointing import TrainingCheckpoints, CheckpointWriteError
directory = sys.argv[1]
with TrainingCheckpoints(directory, config=CONFIG) as checkpoints:
    checkpoints.save(1, tiny_state(1, width=128), {})
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (16384, hard))
    try:
        checkpoints.save(2, tiny_state(2, width=128), {})
    except CheckpointWriteError as error:
        causes, cause = [], error.__context__
        while cause is not None:
            causes.append(type(cause).__name__)
            cause = cause.__cause__ or cause.__context__
        failure = {"message": str(error), "errno": error.errno, "causes": causes}
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    failure["entries"] = sorted(os.listdir(directory))
    failure["steps"] = checkpoints.steps
    failure["step 1"] = checkpoints.read(1)[1]["step"]
print(json.dumps(failure))
"""


def test_a_file_size_limit_fails_the_save_through_tensorstore_quietly(tmp_path):
    directory = tmp_path / "run"
    status, out, err = _run(_FILE_SIZE_LIMIT, str(directory))
    assert status == 0, err
    assert err == ""  # none of Orbax's logged errors, no "Event loop is closed"
    failure = json.loads(out)
    assert failure["message"] == (
        f"could not write training checkpoint 2 in {directory}: [Errno 27] File too large; the "
        "checkpoints already there (steps [1]) are intact")
    assert failure["errno"] == errno.EFBIG and "ValueError" in failure["causes"]
    assert failure["entries"] == [".lock", "1"] and failure["steps"] == [1]
    assert failure["step 1"] == 1


def test_an_unwritable_directory_is_one_clean_error(tmp_path):
    with read_only_dir(tmp_path) as read_only:
        for directory in (read_only, read_only / "run"):
            with pytest.raises(CheckpointDirectoryError) as refused:
                TrainingCheckpoints(directory, config=CONFIG)
            assert isinstance(refused.value, OSError)
            message = str(refused.value)
            assert message.startswith(f"cannot use {directory} as a training checkpoint "
                                      "directory: [Errno ")
            assert "\n" not in message and refused.value.errno is not None
            assert refused.value.__cause__ is None and refused.value.__suppress_context__
        assert list(read_only.iterdir()) == []
    (tmp_path / "a-file").write_text("")
    with pytest.raises(CheckpointDirectoryError, match=r"^cannot use .*/a-file/run as a training "
                                                       r"checkpoint directory: \[Errno 20\] Not a "
                                                       r"directory$"):
        TrainingCheckpoints(tmp_path / "a-file" / "run", config=CONFIG)


def test_write_errors_are_found_behind_orbax_and_tensorstore():
    """The OS error of a failed write, wherever Orbax or TensorStore put it."""
    find = checkpointing._os_error
    assert find(OSError(errno.ENOSPC, "No space left on device")) == (
        28, "[Errno 28] No space left on device")
    tensorstore = ValueError('RESOURCE_EXHAUSTED: Error writing "model.bias/0" ...: No space left '
                             "on device [os_error_code='28'] [tensorstore_spec='{}']")
    assert find(tensorstore) == (28, "[Errno 28] No space left on device")
    try:
        try:
            raise PermissionError(errno.EACCES, "Permission denied", "/x")
        except PermissionError as error:
            raise RuntimeError("the commit failed") from error
    except RuntimeError as wrapped:
        assert find(wrapped) == (13, "[Errno 13] Permission denied")
    assert find(ValueError("Checkpoint for step 3 already exists.")) is None


# --------------------------------------------------------------------------- stderr


_RESTORE = """
import sys, warnings
from pathlib import Path
# One line per warning, so that the test can tell a warning from anything else on stderr.
warnings.formatwarning = lambda message, category, *_, **__: f"{category.__name__}: {message}\\n"
from tests.test_checkpoint_faults import tiny_state, damage_data_file, CONFIG
from jax_attention.runtime.checkpointing import TrainingCheckpoints
directory, damaged = Path(sys.argv[1]), [step for step in sys.argv[2].split(",") if step]
with TrainingCheckpoints(directory, config=CONFIG) as checkpoints:
    for step in (1, 2):
        checkpoints.save(step, tiny_state(step), {})
for step in damaged:
    damage_data_file(directory / step)
with TrainingCheckpoints(directory, config=CONFIG) as checkpoints:
    try:
        print("restored", checkpoints.restore(tiny_state())[1]["step"])
    except FileNotFoundError:
        print("none readable", checkpoints.set_aside)
    print("read", TrainingCheckpoints(directory, config=None, read_only=True).steps)
import gc, time
time.sleep(0.2)  # TensorStore's reads still in flight call back now, or when collected
gc.collect()
"""


@pytest.mark.parametrize(("damaged", "result", "warned"), [
    ("", "restored 2", []),
    ("2", "restored 1", [2]),
    ("1,2", "none readable ['1.corrupt', '2.corrupt']", [2, 1]),
])
def test_restoring_prints_nothing_but_our_warnings(tmp_path, damaged, result, warned):
    """Orbax closes its event loop when a read fails; TensorStore's reads still in flight then
    reported "RuntimeError: Event loop is closed" (dozens of traceback lines each) and asyncio
    "Task exception was never retrieved". Only the warnings are left."""
    status, out, err = _run(_RESTORE, str(tmp_path / "run"), damaged)
    assert status == 0, err
    assert out.splitlines()[0] == result
    assert "Traceback" not in err and "Event loop is closed" not in err
    lines = err.splitlines()
    assert len(lines) == len(warned), err
    for line, step in zip(lines, warned):
        assert line.startswith(f"CorruptCheckpointWarning: training checkpoint {step} in ")
        assert "tensorstore_spec" not in line


def test_the_quieting_is_undone_after_each_call(tmp_path):
    """Orbax's records are dropped and the event loops made quiet only during its calls."""
    import asyncio
    import logging

    absl, root = logging.getLogger("absl"), logging.getLogger()
    filters = (list(absl.filters), list(root.filters))
    policy = asyncio.get_event_loop_policy()
    directory = _saved(tmp_path / "run")
    damage_data_file(directory / "2")
    with TrainingCheckpoints(directory, config=CONFIG) as checkpoints, \
            pytest.warns(CorruptCheckpointWarning):
        checkpoints.restore(tiny_state())
    assert (list(absl.filters), list(root.filters)) == filters
    assert asyncio.get_event_loop_policy() is policy and "new_event_loop" not in vars(policy)
    loop = asyncio.new_event_loop()
    loop.close()
    with pytest.raises(RuntimeError, match="Event loop is closed"):
        loop.call_soon_threadsafe(print)


# --------------------------------------------------------------------------- the lock


def _lock_holder(directory: Path) -> dict | None:
    try:
        return json.loads((directory / LOCK_FILE).read_text())
    except (OSError, ValueError):
        return None


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def _busy_message(directory: Path, pid: int) -> str:
    return (f"{directory} is in use by another training run (PID {pid} on "
            f"{socket.gethostname()}, since ")


def test_a_second_opening_in_the_same_process_is_busy(tmp_path):
    directory = tmp_path / "run"
    with TrainingCheckpoints(directory, config=CONFIG) as checkpoints:
        holder = _lock_holder(directory)
        assert holder["pid"] == os.getpid() and holder["host"] == socket.gethostname()
        with pytest.raises(CheckpointDirectoryBusy) as busy:
            TrainingCheckpoints(directory, config=CONFIG)
        message = str(busy.value)
        assert message == (f"{directory} is in use by another training run (PID {os.getpid()} "
                           f"on {socket.gethostname()}, since {holder['since']}); wait for it to "
                           "end or choose another --checkpoint-dir")
        assert isinstance(busy.value, RuntimeError) and busy.value.pid == os.getpid()
        # Reading is not writing: read-only openings neither take nor heed the lock.
        checkpoints.save(1, tiny_state(), {})
        assert read_training_checkpoint(directory)[1]["step"] == 1
        assert checkpoints.steps == [1]  # the lock file is no step
    assert not (directory / LOCK_FILE).exists()
    with TrainingCheckpoints(directory, config=CONFIG) as checkpoints:  # released by close()
        assert checkpoints.steps == [1]


_HOLD = """
import sys, time
from jax_attention.runtime.checkpointing import TrainingCheckpoints
with TrainingCheckpoints(sys.argv[1], config={}):
    time.sleep(300)
"""


def test_another_process_holding_the_directory_makes_it_busy_until_killed(tmp_path):
    directory = tmp_path / "run"
    holder = _python(_HOLD, str(directory))
    try:
        wait_for(lambda: (_lock_holder(directory) or {}).get("pid") == holder.pid, holder,
                 timeout=120, what="the holder's lock")
        # Its save in progress (a temporary directory) must survive the second opening: Orbax's
        # start-up would remove it, and the lock is taken before.
        in_progress = directory / "4.orbax-checkpoint-tmp"
        in_progress.mkdir()
        (in_progress / "item").write_text("being written")
        with pytest.raises(CheckpointDirectoryBusy) as busy:
            TrainingCheckpoints(directory, config=CONFIG)
        assert str(busy.value).startswith(_busy_message(directory, holder.pid))
        assert str(busy.value).endswith("); wait for it to end or choose another "
                                        "--checkpoint-dir")
        assert busy.value.pid == holder.pid and busy.value.host == socket.gethostname()
        assert (in_progress / "item").read_text() == "being written"
        # SIGKILL: the kernel releases the flock; the lock file stays, naming a dead process.
        holder.send_signal(signal.SIGKILL)
        holder.communicate(timeout=60)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.communicate()
    assert _lock_holder(directory)["pid"] == holder.pid
    with TrainingCheckpoints(directory, config=CONFIG) as checkpoints:
        assert _lock_holder(directory)["pid"] == os.getpid()  # taken over
        checkpoints.save(1, tiny_state(), {})
        assert not in_progress.exists()  # the killed run's partial save: cleaned up now
    assert sorted(path.name for path in directory.iterdir()) == ["1"]


def test_a_stale_lock_file_is_taken_over(tmp_path):
    directory = tmp_path / "run"
    directory.mkdir()
    (directory / LOCK_FILE).write_text(json.dumps({"pid": _dead_pid(), "host": "elsewhere",
                                                   "since": "2020-01-01T00:00:00+00:00"}))
    with TrainingCheckpoints(directory, config=CONFIG):
        assert _lock_holder(directory)["pid"] == os.getpid()
    assert not (directory / LOCK_FILE).exists()


def _no_flock(monkeypatch):
    import fcntl

    def flock(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", flock)


def test_without_flock_an_exclusive_lock_file_does_it(tmp_path, monkeypatch):
    _no_flock(monkeypatch)
    directory = tmp_path / "run"
    with TrainingCheckpoints(directory, config=CONFIG):
        assert _lock_holder(directory)["pid"] == os.getpid()
        with pytest.raises(CheckpointDirectoryBusy) as busy:
            TrainingCheckpoints(directory, config=CONFIG)
        assert str(busy.value).startswith(_busy_message(directory, os.getpid()))
    assert not (directory / LOCK_FILE).exists()


@pytest.mark.parametrize("holder", ["dead", "alive", "other host", "unwritten", "unwritten long"])
def test_without_flock_only_a_dead_holder_of_this_host_is_taken_over(tmp_path, monkeypatch,
                                                                     holder):
    _no_flock(monkeypatch)
    directory = tmp_path / "run"
    directory.mkdir()
    lock = directory / LOCK_FILE
    pid = {"dead": _dead_pid(), "other host": _dead_pid()}.get(holder, os.getppid())
    host = "elsewhere.example" if holder == "other host" else socket.gethostname()
    if holder.startswith("unwritten"):
        lock.write_text("")
        if holder == "unwritten long":  # a holder killed between creating and writing it
            os.utime(lock, (time.time() - 3600, time.time() - 3600))
    else:
        lock.write_text(json.dumps({"pid": pid, "host": host, "since": "2020-01-01"}))
    if holder in ("dead", "unwritten long"):
        with TrainingCheckpoints(directory, config=CONFIG):
            assert _lock_holder(directory)["pid"] == os.getpid()
        assert not lock.exists()
    else:
        before = lock.read_text()
        with pytest.raises(CheckpointDirectoryBusy) as busy:
            TrainingCheckpoints(directory, config=CONFIG)
        if holder == "unwritten":
            assert "(PID unknown on an unknown host, since an unknown time)" in str(busy.value)
        else:
            assert f"(PID {pid} on {host}, since 2020-01-01)" in str(busy.value)
        assert lock.read_text() == before


def test_the_lock_file_is_no_step_and_survives_the_clean_up(tmp_path):
    directory = tmp_path / "run"
    with TrainingCheckpoints(directory, config=CONFIG, keep=1) as checkpoints:
        for step in (1, 2, 3):
            checkpoints.save(step, tiny_state(), {})
            assert (directory / LOCK_FILE).is_file()
        assert checkpoints.steps == [3]
        assert sorted(path.name for path in directory.iterdir()) == [LOCK_FILE, "3"]


def test_a_save_stopped_by_ctrl_c_leaves_no_temporary_directory(tmp_path, monkeypatch):
    directory = _saved(tmp_path / "run", steps=(1,))
    with TrainingCheckpoints(directory, config=CONFIG) as checkpoints:
        def interrupted(step, **_):
            (directory / f"{step}.orbax-checkpoint-tmp" / "state").mkdir(parents=True)
            raise KeyboardInterrupt

        monkeypatch.setattr(checkpoints._manager, "save", interrupted)
        with pytest.raises(KeyboardInterrupt):
            checkpoints.save(2, tiny_state(), {})
        assert sorted(path.name for path in directory.iterdir()) == [LOCK_FILE, "1"]


def test_a_closed_directory_is_no_longer_written(tmp_path):
    checkpoints = TrainingCheckpoints(tmp_path / "run", config=CONFIG)
    checkpoints.save(1, tiny_state(), {})
    checkpoints.close()
    checkpoints.close()  # again: nothing
    assert checkpoints.steps == [1] and checkpoints.read(1)[1]["step"] == 1
    for write in (lambda: checkpoints.save(2, tiny_state(), {}),
                  lambda: checkpoints.restore(tiny_state())):
        with pytest.raises(ValueError, match=r"were closed \(their lock released\)"):
            write()
    assert sorted(path.name for path in (tmp_path / "run").iterdir()) == ["1"]


# --------------------------------------------------------------------------- the configuration

DATA = {"format": "jax-attention.data-fingerprint/1", "pairs": 600, "sha256": "a" * 64}


def test_a_checkpoint_without_the_data_section_is_no_difference():
    """Runs record the training data's fingerprint (``data``) since it was added; a checkpoint
    written before has none and still resumes, whatever this run's data."""
    old = {"model": "tiny", "training": {"lr": 0.001, "epochs": 1}}
    new = {**old, "data": DATA}
    assert checkpointing.config_differences(old, new) == []
    assert checkpointing.config_differences(new, new) == []


def test_the_data_sections_are_compared_when_both_have_one():
    old = {"model": "tiny", "data": DATA}
    new = {"model": "tiny", "data": {**DATA, "sha256": "b" * 64, "pairs": 500}}
    assert checkpointing.config_differences(old, new) == [
        "data.pairs: 600 in the checkpoint, 500 in this run",
        f"data.sha256: {'a' * 64!r} in the checkpoint, {'b' * 64!r} in this run"]
    # A checkpoint that has it, resumed by a run that records none: that is a difference.
    assert checkpointing.config_differences(old, {"model": "tiny"}) == [
        f"data: {DATA!r} in the checkpoint, '<absent>' in this run"]


def test_resuming_checks_the_data_only_where_the_checkpoint_recorded_it(tmp_path):
    directory = _saved(tmp_path / "before", steps=(1,))  # CONFIG: no data section
    with TrainingCheckpoints(directory, config={**CONFIG, "data": DATA}) as checkpoints:
        assert checkpoints.restore(tiny_state())[1]["step"] == 1
        checkpoints.save(2, tiny_state(2), {})  # now with the data section
    other = {**CONFIG, "data": {**DATA, "sha256": "b" * 64}}
    with TrainingCheckpoints(directory, config=other) as checkpoints, \
            pytest.raises(CheckpointMismatchError, match=r"data\.sha256: 'a+' in the checkpoint, "
                                                         r"'b+' in this run"):
        checkpoints.restore(tiny_state())
