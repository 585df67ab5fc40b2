"""Long runs under faults, through the command: a second run on one checkpoint directory, other
data on resume, a full or foreign-filled checkpoint directory, damaged checkpoints, too many
pairs or too large a batch — each one line, a documented exit status, no traceback, and nothing
of the user's changed (:mod:`jax_attention.runtime.checkpointing` has the library-level tests).
"""

from __future__ import annotations

import json
import signal
import socket
import zipfile
from pathlib import Path

import pytest

from jax_attention.data import nmt as data
from jax_attention.cli import EXIT_BUSY, EXIT_WRITE_FAILED
from tests.fault_support import (assert_one_line, finish, full_dir, run_command, start_command,
                                 tree_snapshot, wait_for)
from tests.shared_runs import EPOCHS, STEPS_PER_EPOCH, run_flags

KIND = "bahdanau"


def _train(root: Path, *extra: str, data_path: Path | None = None, epochs: int = EPOCHS):
    """The session's tiny run (tests/shared_runs.py) into ``root``, without plots."""
    return ["train", KIND, "--data", str(data_path or data.find_data()),
            *run_flags(KIND, root, epochs=epochs, plots=False), *extra]


def _steps(directory: Path) -> list[int]:
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


def _fra_txt(tmp_path: Path, *, change: bool = False, lines: int | None = None) -> Path:
    """The book's fra.txt, optionally with one word of its first pair changed or cut to
    ``lines`` lines, as a plain file."""
    with zipfile.ZipFile(data.find_data()) as archive:
        text = archive.read("fra-eng/fra.txt").decode("utf-8")
    rows = text.split("\n")
    if change:
        rows[0] = rows[0].replace("Va", "Allez", 1)
    if lines is not None:
        rows = rows[:lines]
    path = tmp_path / ("changed" if change else f"first-{lines}") / "fra.txt"
    path.parent.mkdir()
    path.write_text("\n".join(rows), encoding="utf-8")
    return path


def test_a_second_run_on_one_checkpoint_directory_is_refused_then_takes_over_a_dead_ones_lock(
        tmp_path):
    first = start_command(*_train(tmp_path, epochs=400))
    wait_for(lambda: (tmp_path / "train").is_dir() and _steps(tmp_path / "train"), first,
             what="a first training checkpoint")
    status, _, err = run_command(*_train(tmp_path, "--resume", epochs=400))
    line = assert_one_line(err, f"{tmp_path / 'train'} is in use by another training run",
                           f"PID {first.pid} on {socket.gethostname()}")
    assert status == EXIT_BUSY, err
    assert line.startswith("jax-attention train bahdanau: error: ")
    first.send_signal(signal.SIGKILL)  # its lock dies with it
    finish(first)
    epochs = _steps(tmp_path / "train")[-1] // STEPS_PER_EPOCH + 1  # one more epoch
    status, out, err = run_command(*_train(tmp_path, "--resume", epochs=epochs))
    assert status == 0, err
    assert "resumed from training checkpoint" in out


@pytest.fixture
def finished_run(tiny_run, tmp_path) -> Path:
    """A copy of the session's finished tiny run (:data:`EPOCHS` epochs, training checkpoints
    every 2 steps), which the test may change."""
    return tiny_run(KIND).copy(tmp_path / "run")


def test_resuming_on_other_data_is_refused_naming_the_data(finished_run, tmp_path):
    root = finished_run
    before = tree_snapshot(root)
    status, _, err = run_command(*_train(root, "--resume", epochs=EPOCHS + 1,
                                         data_path=_fra_txt(tmp_path, change=True)))
    assert status == 2, err
    assert "Traceback" not in err
    assert "belongs to another configuration" in err and "data.sha256" in err, err
    assert tree_snapshot(root) == before


def test_more_examples_than_the_file_holds_is_one_warning_and_the_real_count_recorded(tmp_path):
    # The file holds the tiny run's pairs (its first --num-examples lines): the run trains on
    # them, as the tiny run does, with its compiled programs.
    argv = _train(tmp_path, epochs=1)
    lines = int(argv[argv.index("--num-examples") + 1])
    argv[argv.index("--data") + 1] = str(_fra_txt(tmp_path, lines=lines))
    argv[argv.index("--num-examples") + 1] = "600"
    status, _, err = run_command(*argv)
    assert status == 0, err
    warnings = [line for line in err.splitlines() if line.startswith("jax-attention: warning")]
    assert len(warnings) == 1 and "num_examples=600 asked for" in warnings[0], err
    assert f"using {lines}" in warnings[0]
    record = json.loads((tmp_path / "run.json").read_text())
    assert record["config"]["data"]["num_pairs"] == lines


def test_a_batch_larger_than_the_data_is_a_usage_error_not_an_allocation(tmp_path):
    argv = _train(tmp_path)
    argv[argv.index("--batch-size") + 1] = "1000000000"
    status, _, err = run_command(*argv)
    assert status == 2, err
    assert_one_line(err, "batch_size = 1000000000 (--batch-size) is larger than the 64 "
                         "training pairs")


def test_a_full_checkpoint_directory_stops_with_one_line_and_status_4(tmp_path):
    with full_dir(tmp_path, size_kib=16) as full:
        argv = _train(tmp_path)
        argv[argv.index("--checkpoint-dir") + 1] = str(full / "train")
        status, _, err = run_command(*argv)
        assert status == EXIT_WRITE_FAILED, err
        assert_one_line(err, "could not write training checkpoint", str(full / "train"),
                        "No space left on device")
        assert not (full / "train").is_dir() or not _steps(full / "train")


def test_a_folder_of_the_users_named_like_a_step_is_never_touched(finished_run):
    root = finished_run
    (root / "train" / "3").mkdir()
    (root / "train" / "3" / "a.txt").write_text("mine\n")
    before = tree_snapshot(root)
    for extra in ((), ("--resume",)):
        status, _, err = run_command(*_train(root, *extra, epochs=EPOCHS + 1))
        assert status == 2, err
        assert_one_line(err, "3/", "not training checkpoints", "nothing was changed")
        assert tree_snapshot(root) == before


def _damage(step_dir: Path) -> None:
    for path in step_dir.rglob("*"):
        if path.is_file() and path.stat().st_size > 0 and "state" in path.parts:
            path.write_bytes(b"\0" * path.stat().st_size)


def test_damaged_checkpoints_are_reported_in_one_line_each_without_orbax_noise(finished_run):
    root = finished_run
    steps = _steps(root / "train")
    for step in steps:
        _damage(root / "train" / str(step))
    status, _, err = run_command(*_train(root, "--resume", epochs=EPOCHS + 1))
    assert status == 2, err
    assert "Traceback" not in err and "Event loop is closed" not in err, err
    assert "no readable training checkpoint" in err
    warnings = [line for line in err.splitlines() if line.startswith("jax-attention: warning")]
    assert len(warnings) == len(steps), err
    assert len(err.strip().splitlines()) == len(steps) + 1, err
    # Now only the damaged steps, set aside, are there: the run says so and starts afresh.
    status, out, err = run_command(*_train(root, "--resume", epochs=1))
    assert status == 0, err
    assert "only damaged ones, set aside earlier" in out, out
    assert f"{steps[-1]}.corrupt" in out


@pytest.mark.parametrize("damage", ["truncated", "flipped"])
def test_a_damaged_data_archive_is_one_usage_error_naming_it(tmp_path, damage):
    archive = tmp_path / "fra-eng.zip"
    payload = bytearray(data.find_data().read_bytes())
    if damage == "truncated":
        payload = payload[: len(payload) // 2]
    else:  # a byte in fra.txt's compressed data
        payload[len(payload) // 3] ^= 0xFF
    archive.write_bytes(bytes(payload))
    before = tree_snapshot(tmp_path)
    status, _, err = run_command(*_train(tmp_path, data_path=archive))
    assert status == 2, err
    assert_one_line(err, "damaged or truncated archive", str(archive))
    assert tree_snapshot(tmp_path) == before
