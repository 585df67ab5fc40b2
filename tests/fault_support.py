"""What the fault tests share: places that cannot be written or that fill up, and the command run
as a real subprocess with bounded waits.

Unwritable and full places are made the strongest way this machine allows, and a test that needs
one is skipped *with the reason* where none can be made:

- :func:`read_only_dir`: a read-only tmpfs mount (root with ``CAP_SYS_ADMIN``), else a directory
  with mode ``0o555`` (a non-root user), else an immutable directory (``chattr +i``; root without
  mount rights);
- :func:`full_dir`: a tmpfs mount of a few hundred KiB (root with ``CAP_SYS_ADMIN``) — a real
  ``ENOSPC``; :data:`FILE_SIZE_LIMIT` gives a subprocess a small ``RLIMIT_FSIZE`` instead, whose
  writes fail with ``EFBIG`` (any user, any machine).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

__all__ = ["read_only_dir", "full_dir", "fill", "run_command", "start_command", "finish",
           "assert_one_line", "MAIN", "command_env", "tree_snapshot", "send_sigint", "wait_for"]

# `python -m jax_attention`, with Python's SIGINT handler put back first: a test runner started
# in the background passes on an ignored SIGINT, which the command (like Python) leaves ignored.
MAIN = ("import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "runpy.run_module('jax_attention', run_name='__main__', alter_sys=True)")


def _mount_tmpfs(target: Path, options: str) -> bool:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(target)],
                          capture_output=True)
    return done.returncode == 0


def _unmount(target: Path) -> None:
    subprocess.run(["umount", "-l", str(target)], capture_output=True)


@contextlib.contextmanager
def read_only_dir(parent: Path, *, contents: dict[str, bytes] | None = None) -> Iterator[Path]:
    """A directory under ``parent`` in which nothing can be created, holding ``contents``
    (``{name: bytes}``) written before it was made read-only."""
    target = parent / "read-only"
    target.mkdir()
    staging = Path(tempfile.mkdtemp(dir=parent))
    for name, data in (contents or {}).items():
        (staging / name).write_bytes(data)
    if _mount_tmpfs(target, "size=1m"):
        try:
            for item in staging.iterdir():
                shutil.copy(item, target / item.name)
            subprocess.run(["mount", "-o", "remount,ro", str(target)], check=True,
                           capture_output=True)
            yield target
        finally:
            _unmount(target)
        return
    for item in staging.iterdir():
        shutil.copy(item, target / item.name)
    if os.geteuid() != 0:
        target.chmod(0o555)
        try:
            yield target
        finally:
            target.chmod(0o755)
        return
    if shutil.which("chattr") and subprocess.run(["chattr", "+i", str(target)],
                                                 capture_output=True).returncode == 0:
        try:
            yield target
        finally:
            subprocess.run(["chattr", "-i", str(target)], capture_output=True)
        return
    pytest.skip("this machine can make no read-only directory: root without mount rights or "
                "chattr")


@contextlib.contextmanager
def full_dir(parent: Path, size_kib: int = 256) -> Iterator[Path]:
    """A directory under ``parent`` on a filesystem of ``size_kib`` KiB (a tmpfs mount): writes
    beyond it fail with ``ENOSPC``. Fill it further with :func:`fill`."""
    target = parent / "full"
    target.mkdir()
    if not _mount_tmpfs(target, f"size={size_kib}k"):
        pytest.skip("a full filesystem needs a tmpfs mount (root with CAP_SYS_ADMIN); the "
                    "RLIMIT_FSIZE tests cover write failures elsewhere")
    try:
        yield target
    finally:
        _unmount(target)


def fill(directory: Path, leave_bytes: int = 0) -> None:
    """Fill ``directory``'s filesystem until at most ``leave_bytes`` are free."""
    free = shutil.disk_usage(directory).free - leave_bytes
    if free > 0:
        with open(directory / ".filler", "wb") as file:
            with contextlib.suppress(OSError):
                file.write(b"\0" * free)


def command_env(**extra: str) -> dict[str, str]:
    """The environment of a command subprocess: the tests' numerics, no progress bar, no user
    compilation cache unless ``extra`` names one."""
    env = {**os.environ, "JAX_DEFAULT_MATMUL_PRECISION": "highest",
           "XLA_PYTHON_CLIENT_PREALLOCATE": "false", "JAX_ATTENTION_COMPILATION_CACHE": "0"}
    env.update(extra)
    return env


def start_command(*argv: str, env: dict[str, str] | None = None, cwd: Path | None = None,
                  limit_file_size: int | None = None) -> subprocess.Popen:
    """``jax-attention *argv`` as a subprocess (stdout and stderr piped, text).

    ``limit_file_size``: an ``RLIMIT_FSIZE`` in bytes for the child (``SIGXFSZ`` ignored, so a
    write past it fails with ``EFBIG`` like a full disk).
    """
    code = MAIN
    if limit_file_size is not None:
        code = (f"import resource, signal; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
                f"resource.setrlimit(resource.RLIMIT_FSIZE, ({limit_file_size}, "
                f"{limit_file_size})); " + MAIN)
    return subprocess.Popen([sys.executable, "-c", code, *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env or command_env(), cwd=cwd)


def finish(process: subprocess.Popen, timeout: float = 300) -> tuple[int, str, str]:
    """Wait (bounded) for ``process``: ``(exit status, stdout, stderr)``; killed on timeout."""
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        pytest.fail(f"the command did not end within {timeout} s; stderr:\n{err}")
    return process.returncode, out, err


def run_command(*argv: str, timeout: float = 300, **options) -> tuple[int, str, str]:
    """``jax-attention *argv`` in a subprocess to its end: ``(exit status, stdout, stderr)``."""
    return finish(start_command(*argv, **options), timeout)


def assert_one_line(stderr: str, *fragments: str, status: int | None = None,
                    returncode: int | None = None) -> str:
    """``stderr`` holds no traceback and exactly one line of the command's own (``jax-attention:
    ...`` or ``jax-attention train bahdanau: error: ...``; warnings and notes not counted)
    containing every fragment, and the exit status is ``status``; returns that line."""
    assert "Traceback" not in stderr, stderr
    if returncode is not None and status is not None:
        assert returncode == status, stderr
    # "jax-attention: ..." or argparse's "jax-attention train bahdanau: error: ...".
    lines = [line for line in stderr.splitlines()
             if re.match(r"jax-attention( [\w-]+)*: (?!warning: |note: )", line)]
    assert len(lines) == 1, stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def tree_snapshot(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root`` with its bytes (``None`` for a directory): what a test compares
    to show that nothing of the user's changed."""
    snapshot = {}
    for path in sorted(root.rglob("*")):
        relative = str(path.relative_to(root))
        snapshot[relative] = None if path.is_dir() else path.read_bytes()
    return snapshot


def send_sigint(process: subprocess.Popen) -> None:
    """Ctrl-C: SIGINT to the process."""
    process.send_signal(signal.SIGINT)


def wait_for(predicate, process: subprocess.Popen, timeout: float = 240, what: str = "it"):
    """Poll ``predicate()`` until true; fail when ``process`` ends first or after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if process.poll() is not None:
            pytest.fail(f"the command exited ({process.returncode}) before {what}: "
                        f"{process.communicate()[1]}")
        time.sleep(0.005)
    process.kill()
    pytest.fail(f"no {what} after {timeout} s")
