"""The helper process (jax_attention.runtime.helper_process) that draws half of the figures after
training: the work is shared, every task runs once, errors reach the caller after every task has
ended, a worker that died or never started leaves its tasks to this process, and Ctrl-C (SIGINT)
reaches only the main process."""

from __future__ import annotations

import multiprocessing
import os
import signal
from pathlib import Path

import pytest

from jax_attention.runtime.helper_process import HelperProcess, Task


def _write_pid(path: Path) -> None:
    """Writes which process ran it (module level: the worker imports it by name)."""
    Path(path).write_text(str(os.getpid()))


def _fail(path: Path) -> None:
    raise OSError(28, "No space left on device", str(path))


def _die_unless_in(pid: int, path: Path) -> None:
    """Ends the worker abruptly (as the kernel's OOM killer would); in process ``pid`` it writes."""
    if os.getpid() != pid:
        os._exit(3)
    _write_pid(path)


@pytest.fixture
def helper():
    helper = HelperProcess(preload=("jax_attention.viz.plotting",))
    assert helper.start()
    yield helper
    helper.close()


def _pids(paths) -> list[int]:
    return [int(Path(path).read_text()) for path in paths]


def test_every_other_portable_task_runs_in_the_worker_the_rest_here(helper, tmp_path):
    paths = [tmp_path / f"{n}.txt" for n in range(5)]
    tasks = [Task(_write_pid, paths[0]), Task(_write_pid, paths[1], portable=False),
             Task(_write_pid, paths[2]), Task(_write_pid, paths[3]), Task(_write_pid, paths[4])]
    helper.run(tasks)
    pids = _pids(paths)
    here = os.getpid()
    # Portable: 0, 2, 3, 4; every other one from the first (0 and 3) goes to the worker.
    assert pids[1] == pids[2] == pids[4] == here
    assert pids[0] == pids[3] != here


def test_an_error_is_raised_once_every_task_has_ended(helper, tmp_path):
    paths = [tmp_path / f"{n}.txt" for n in range(3)]
    tasks = [Task(_fail, paths[0]), Task(_write_pid, paths[1]), Task(_write_pid, paths[2])]
    with pytest.raises(OSError, match="No space left on device"):
        helper.run(tasks)  # the failing task ran in the worker; its error came back
    assert all(path.is_file() for path in paths[1:])
    with pytest.raises(OSError, match="No space left on device"):  # ... and here
        helper.run([Task(_write_pid, paths[1]), Task(_fail, paths[0], portable=False)])


def test_a_task_whose_worker_died_runs_here(helper, tmp_path):
    path = tmp_path / "late.txt"
    helper.run([Task(_die_unless_in, os.getpid(), path), Task(_write_pid, tmp_path / "b.txt")])
    assert _pids([path]) == [os.getpid()]
    # The broken pool sends nothing more: every later task runs here.
    helper.run([Task(_write_pid, tmp_path / "c.txt")])
    assert _pids([tmp_path / "c.txt"]) == [os.getpid()]


def test_without_a_worker_every_task_runs_here(tmp_path):
    helper = HelperProcess()  # never started (or closed): no process at all
    paths = [tmp_path / f"{n}.txt" for n in range(3)]
    helper.run([Task(_write_pid, path) for path in paths])
    assert set(_pids(paths)) == {os.getpid()}
    helper.close()


def test_sigint_to_the_worker_is_ignored(helper, tmp_path):
    """Ctrl-C in a terminal reaches the whole process group; the worker ignores it (the main
    process answers it) and goes on with its tasks."""
    first = tmp_path / "first.txt"
    helper.run([Task(_write_pid, first)])
    worker = _pids([first])[0]
    assert worker != os.getpid()
    os.kill(worker, signal.SIGINT)
    path = tmp_path / "after.txt"
    helper.run([Task(_write_pid, path)])
    assert _pids([path]) == [worker]


def test_a_worker_that_cannot_start_leaves_every_task_here(tmp_path):
    """A preload that fails to import (the worker's start fails): ``start`` says so, no process is
    left behind, and the tasks run here."""
    helper = HelperProcess(preload=("jax_attention.no_such_module",))
    assert not helper.start()
    assert not multiprocessing.active_children()
    paths = [tmp_path / f"{n}.txt" for n in range(2)]
    helper.run([Task(_write_pid, path) for path in paths])
    assert set(_pids(paths)) == {os.getpid()}
    helper.close()
