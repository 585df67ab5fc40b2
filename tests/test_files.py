"""Writing whole or not at all (:mod:`jax_attention._files`): the result is complete, and a
failure or a Ctrl-C at any point leaves what was there before intact and no temporary behind."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jax_attention._files import (write_directory_atomically, write_file_atomically,
                                  write_text_atomically)

REPO = Path(__file__).resolve().parents[1]


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def _entries(folder: Path) -> list[str]:
    """Every name under ``folder``, hidden ones (a leftover temporary) included."""
    return sorted(str(path.relative_to(folder)) for path in folder.rglob("*"))


def _half_then(error: BaseException):
    """A ``write`` that writes half of its content, then fails with ``error``."""

    def write(temporary: Path) -> None:
        with open(temporary, "w", encoding="utf-8") as file:
            file.write("half of the new ")
            file.flush()
            raise error

    return write


# --------------------------------------------------------------------------- files


def test_a_file_is_written_whole_with_its_folders(tmp_path):
    target = tmp_path / "a" / "b" / "figure.png"
    got = write_file_atomically(str(target), lambda temporary: temporary.write_bytes(b"\x89PNG"))
    assert got == target and isinstance(got, Path)
    assert target.read_bytes() == b"\x89PNG"
    assert _entries(tmp_path) == ["a", "a/b", "a/b/figure.png"]


def test_the_temporary_is_a_fresh_hidden_name_beside_the_target(tmp_path):
    seen = []

    def write(temporary: Path) -> None:
        assert not temporary.exists()
        seen.append(temporary)
        temporary.write_text("new")

    for _ in range(2):
        write_file_atomically(tmp_path / "r.json", write)
    assert [path.parent for path in seen] == [tmp_path, tmp_path] and seen[0] != seen[1]
    assert all(path.name.startswith(".r.json.") and path.name.endswith(".tmp") for path in seen)
    assert _entries(tmp_path) == ["r.json"]


@pytest.mark.parametrize("error", [OSError(errno.ENOSPC, "No space left on device"),
                                   KeyboardInterrupt()], ids=["full-disk", "ctrl-c"])
def test_a_write_stopped_half_way_keeps_the_old_file_and_leaves_no_temporary(tmp_path, error):
    target = tmp_path / "r.json"
    target.write_text("the old, whole content")
    with pytest.raises(type(error)) as raised:
        write_file_atomically(target, _half_then(error))
    assert raised.value is error  # raised as it came: the caller's one-line message stays
    assert target.read_text() == "the old, whole content"
    assert _entries(tmp_path) == ["r.json"]


def test_a_failed_rename_leaves_no_temporary(tmp_path):
    target = tmp_path / "taken"
    (target / "inside").mkdir(parents=True)  # a non-empty directory cannot be replaced by a file
    with pytest.raises(IsADirectoryError):
        write_file_atomically(target, lambda temporary: temporary.write_text("new"))
    assert _entries(tmp_path) == ["taken", "taken/inside"]


def test_text_is_written_whole_with_the_usual_permissions(tmp_path):
    target = tmp_path / "r.json"
    target.write_text("old")
    assert write_text_atomically(target, "é\n{}\n") == target
    assert target.read_bytes() == "é\n{}\n".encode("utf-8")
    assert target.stat().st_mode & 0o777 == 0o666 & ~_umask()
    assert _entries(tmp_path) == ["r.json"]


_FILE_SIZE_LIMIT = """
import resource, signal, sys
from pathlib import Path
from jax_attention._files import write_text_atomically
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
try:
    write_text_atomically(Path(sys.argv[1]), "x" * 100_000)
except OSError as error:
    print(type(error).__name__, error.errno, str(error).count(chr(10)))
"""


def test_a_file_too_large_for_the_disk_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    """A real failed write (``RLIMIT_FSIZE``, in a subprocess): the OS's error, nothing lost."""
    target = tmp_path / "r.json"
    target.write_text("the old, whole content")
    done = subprocess.run([sys.executable, "-c", _FILE_SIZE_LIMIT, str(target)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["OSError", str(errno.EFBIG), "0"]
    assert target.read_text() == "the old, whole content"
    assert _entries(tmp_path) == ["r.json"]


# --------------------------------------------------------------------------- directories


def _fill(files: dict[str, str]):
    def write(temporary: Path) -> None:
        assert temporary.is_dir() and not any(temporary.iterdir())
        for name, text in files.items():
            (temporary / name).write_text(text)

    return write


def test_a_directory_is_written_whole_with_the_usual_permissions(tmp_path):
    target = tmp_path / "runs" / "model"
    got = write_directory_atomically(str(target), _fill({"a.json": "1", "b.npz": "2"}))
    assert got == target and isinstance(got, Path)
    assert _entries(target) == ["a.json", "b.npz"] and (target / "b.npz").read_text() == "2"
    assert target.stat().st_mode & 0o777 == 0o777 & ~_umask()
    assert _entries(tmp_path) == ["runs", "runs/model", "runs/model/a.json", "runs/model/b.npz"]


def test_a_directory_there_is_replaced_and_nothing_of_it_is_left(tmp_path):
    target = tmp_path / "model"
    (target / "sub").mkdir(parents=True)
    (target / "sub" / "old.json").write_text("old")
    write_directory_atomically(target, _fill({"new.json": "new"}))
    assert _entries(tmp_path) == ["model", "model/new.json"]


@pytest.mark.parametrize("error", [OSError(errno.ENOSPC, "No space left on device"),
                                   KeyboardInterrupt()], ids=["full-disk", "ctrl-c"])
def test_a_directory_write_stopped_half_way_keeps_the_old_one(tmp_path, error):
    target = tmp_path / "model"
    target.mkdir()
    (target / "config.json").write_text("old")
    with pytest.raises(type(error)) as raised:
        write_directory_atomically(target, lambda temporary: _half_then(error)(
            temporary / "config.json"))
    assert raised.value is error
    assert _entries(tmp_path) == ["model", "model/config.json"]
    assert (target / "config.json").read_text() == "old"


@pytest.mark.parametrize("error", [OSError(errno.EIO, "Input/output error"), KeyboardInterrupt()],
                         ids=["io-error", "ctrl-c"])
def test_a_swap_stopped_between_its_renames_puts_the_old_directory_back(tmp_path, monkeypatch,
                                                                         error):
    """The old directory is renamed aside, then the new one fails to take its place."""
    target = tmp_path / "model"
    target.mkdir()
    (target / "config.json").write_text("old")
    rename, calls = os.rename, []

    def failing_second_rename(source, destination):
        calls.append((Path(source).name, Path(destination).name))
        if len(calls) == 2:
            raise error
        return rename(source, destination)

    monkeypatch.setattr(os, "rename", failing_second_rename)
    with pytest.raises(type(error)):
        write_directory_atomically(target, _fill({"config.json": "new"}))
    monkeypatch.undo()
    assert calls[1][1] == "model" and calls[1][0].startswith(".model.")  # the swap itself failed
    assert _entries(tmp_path) == ["model", "model/config.json"]
    assert (target / "config.json").read_text() == "old"


def test_a_ctrl_c_just_after_the_swap_keeps_the_new_directory_and_no_old_one(tmp_path,
                                                                            monkeypatch):
    target = tmp_path / "model"
    target.mkdir()
    (target / "config.json").write_text("old")
    rename, calls = os.rename, []

    def interrupted_after_second_rename(source, destination):
        rename(source, destination)
        calls.append(destination)
        if len(calls) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(os, "rename", interrupted_after_second_rename)
    with pytest.raises(KeyboardInterrupt):
        write_directory_atomically(target, _fill({"config.json": "new"}))
    monkeypatch.undo()
    assert _entries(tmp_path) == ["model", "model/config.json"]
    assert (target / "config.json").read_text() == "new"


def test_a_file_where_the_directory_goes_is_not_replaced(tmp_path):
    target = tmp_path / "model"
    target.write_text("the user's")
    with pytest.raises(NotADirectoryError):
        write_directory_atomically(target, _fill({"config.json": "new"}))
    assert target.read_text() == "the user's"
    assert _entries(tmp_path) == ["model"]
