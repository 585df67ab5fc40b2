"""The lock of a training checkpoint directory opened for writing: one run per directory.

:class:`jax_attention.runtime.checkpointing.TrainingCheckpoints` takes it before anything else — before
Orbax's start-up, which removes temporary directories and so would destroy another run's save in
progress. The lock is ``DIR/.lock`` (:data:`LOCK_FILE`), locked with ``flock`` (released by the
kernel when its holder exits, even by SIGKILL) and holding the holder's PID, host name and start
time (JSON); a second opener gets :class:`CheckpointDirectoryBusy` naming them. A lock file whose
holder is gone is taken over. Where the file system has no ``flock`` (``ENOLCK``, ``EOPNOTSUPP``),
the lock file is created exclusively instead, and one left by a process of this host that no
longer runs is taken over. :meth:`DirectoryLock.release` removes the file and unlocks; a lock
that is never released is released when it is collected or at exit, and a forked child never
releases its parent's lock.
"""

from __future__ import annotations

import contextlib
import datetime
import errno as errno_codes
import json
import os
import socket
import time
import weakref
from pathlib import Path

__all__ = ["LOCK_FILE", "DirectoryLock", "CheckpointDirectoryBusy"]

#: The name of the lock file inside a checkpoint directory opened for writing (``DIR/.lock``,
#: holding its holder's PID, host and start time as JSON); a dot name, so Orbax never takes it
#: for a step.
LOCK_FILE = ".lock"


class CheckpointDirectoryBusy(RuntimeError):
    """Another training run holds the checkpoint directory's lock; ``pid``, ``host`` and
    ``since`` say which (``None`` where its lock file does not say)."""

    def __init__(self, message: str, *, pid: int | None = None, host: str | None = None,
                 since: str | None = None):
        super().__init__(message)
        self.pid, self.host, self.since = pid, host, since


def _now() -> str:
    """This moment, local time with its offset, to the second (a lock holder's "since")."""
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


class DirectoryLock:
    """The lock of a checkpoint directory opened for writing: ``DIR/.lock``, ``flock``-ed, or
    created exclusively where ``flock`` is unsupported (see the module docstring). Taken on
    construction, held until :meth:`release`.

    Args:
      directory: the checkpoint directory (it exists).

    Raises:
      CheckpointDirectoryBusy: another run holds it.
      OSError: the lock file cannot be created or written (read-only file system, ...).
    """

    # Errors of flock() on a file system that does not support it.
    _UNSUPPORTED = frozenset({errno_codes.ENOLCK, errno_codes.EOPNOTSUPP, errno_codes.ENOSYS,
                              errno_codes.EINVAL,
                              getattr(errno_codes, "ENOTSUP", errno_codes.EOPNOTSUPP)})
    _BUSY = frozenset({errno_codes.EAGAIN, errno_codes.EWOULDBLOCK, errno_codes.EACCES})
    # An exclusive lock file that says nothing yet: being written if younger than this.
    _UNWRITTEN_GRACE_S = 60.0

    def __init__(self, directory: Path):
        self.directory = directory
        self.path = directory / LOCK_FILE
        self._release = None  # weakref.finalize: run by release(), or when collected, or at exit
        self._acquire()

    # -- acquiring

    def _open(self) -> tuple[int, bool] | None:
        """The lock file opened read-write (created if missing) and whether this call created it;
        ``None`` when it vanished meanwhile (its holder released it)."""
        flags = os.O_RDWR | getattr(os, "O_CLOEXEC", 0)
        try:
            return os.open(self.path, flags | os.O_CREAT | os.O_EXCL, 0o644), True
        except FileExistsError:
            pass
        try:
            return os.open(self.path, flags), False
        except FileNotFoundError:
            return None

    def _acquire(self) -> None:
        try:
            import fcntl
        except ImportError:  # no flock on this platform
            fcntl = None
        for _ in range(20):
            opened = self._open()
            if opened is None:
                continue
            fd, created = opened
            try:
                if fcntl is None:
                    raise OSError(errno_codes.ENOSYS, "flock is not available")
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as error:
                if error.errno in self._UNSUPPORTED:
                    if self._acquire_exclusive(fd, created):
                        return
                    continue
                os.close(fd)
                if error.errno in self._BUSY:
                    raise self._busy() from None
                raise
            except BaseException:
                os.close(fd)
                raise
            # The holder before us removes the file when it releases it: a lock on a file that is
            # no longer the lock file is no lock.
            try:
                current = os.stat(self.path)
            except FileNotFoundError:
                current = None
            if current is None or not os.path.samestat(os.fstat(fd), current):
                os.close(fd)
                continue
            self._release = weakref.finalize(self, _unlock, str(self.path), os.getpid(), fd, None)
            with contextlib.suppress(OSError):  # the lock holds without its description
                self._write(fd)
            return
        raise self._busy()

    def _acquire_exclusive(self, fd: int, created: bool) -> bool:
        """Without ``flock``: the file is ours when this process created it; one left by a
        process of this host that has ended is taken over (False: try again)."""
        if created:
            try:
                record = self._write(fd)
            except BaseException:
                os.close(fd)
                with contextlib.suppress(OSError):
                    os.unlink(self.path)
                raise
            os.close(fd)
            self._release = weakref.finalize(self, _unlock, str(self.path), os.getpid(), None,
                                             record)
            return True
        os.close(fd)
        text, info, age = self._read()
        if self._alive(info, age):
            raise self._busy(text, info)
        # Stale: move it out of the way (one taker wins the rename), check that it is the
        # stale file read above and not a lock just taken by another taker, and start again.
        stale = self.path.with_name(f"{LOCK_FILE}.stale-{os.getpid()}")
        try:
            os.rename(self.path, stale)
        except FileNotFoundError:
            return False
        try:
            moved = stale.read_text(errors="replace")
        except OSError:
            moved = text
        if moved != text:
            with contextlib.suppress(OSError):
                os.rename(stale, self.path)
            raise self._busy()
        with contextlib.suppress(OSError):
            os.unlink(stale)
        return False

    @staticmethod
    def _write(fd: int) -> str:
        text = json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                           "since": _now()}) + "\n"
        os.ftruncate(fd, 0)
        os.pwrite(fd, text.encode(), 0)
        os.fsync(fd)
        return text

    def _read(self) -> tuple[str, dict | None, float]:
        """The lock file's text, its holder (``None`` when it does not say) and its age (s)."""
        try:
            text = self.path.read_text(errors="replace")
            age = time.time() - self.path.stat().st_mtime
        except OSError:
            return "", None, 0.0
        try:
            info = json.loads(text)
        except ValueError:
            return text, None, age
        if not isinstance(info, dict) or not isinstance(info.get("pid"), int):
            return text, None, age
        return text, info, age

    @classmethod
    def _alive(cls, info: dict | None, age: float) -> bool:
        """Whether the holder named in a lock file may still run (exclusive-file mode)."""
        if info is None:
            return age < cls._UNWRITTEN_GRACE_S
        if info.get("host") != socket.gethostname():
            return True  # cannot tell from here
        pid = info["pid"]
        if pid == os.getpid():
            return True
        if pid <= 0:
            return age < cls._UNWRITTEN_GRACE_S
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def _busy(self, text: str | None = None, info: dict | None = None
              ) -> CheckpointDirectoryBusy:
        if text is None:
            # The holder writes its description right after locking: give it a moment.
            for _ in range(20):
                text, info, _ = self._read()
                if info is not None:
                    break
                time.sleep(0.025)
        info = info or {}
        pid, host, since = info.get("pid"), info.get("host"), info.get("since")
        return CheckpointDirectoryBusy(
            f"{self.directory} is in use by another training run (PID "
            f"{pid if pid is not None else 'unknown'} on {host or 'an unknown host'}, since "
            f"{since or 'an unknown time'}); wait for it to end or choose another "
            "--checkpoint-dir", pid=pid, host=host, since=since)

    # -- releasing

    def release(self) -> None:
        """Remove the lock file (while still holding it) and unlock; again: nothing."""
        if self._release is not None:
            self._release()


def _unlock(path: str, holder: int, fd: int | None, record: str | None) -> None:
    """Release a :class:`DirectoryLock` taken by process ``holder``: the ``flock``-ed file
    ``fd``, or the exclusive lock file that says ``record``; the lock file is removed if it is
    still the one taken. In a forked child (another PID) only its copy of ``fd`` is closed: the
    lock stays with the parent."""
    if os.getpid() != holder:
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
        return
    if fd is not None:
        with contextlib.suppress(OSError):
            if os.path.samestat(os.fstat(fd), os.stat(path)):
                os.unlink(path)
        os.close(fd)
    if record is not None:
        with contextlib.suppress(OSError), open(path, errors="replace") as file:
            if file.read() == record:
                os.unlink(path)
