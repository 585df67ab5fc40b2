"""Writing a file or a directory whole or not at all (a private module: its names are public
within ``jax_attention``, not to users).

Everything the package writes for the user — figures, JSON records, exported models — is first
written under a temporary name beside its target (the same folder, so the same file system) and
then renamed onto it. A reader therefore sees the old content or the new one, never half of
one, and a write that fails (a full disk, a path that became read-only) or is stopped (Ctrl-C)
leaves the old content in place and no temporary behind. Temporaries are hidden names ending in
``.tmp`` (``.<name>.<random>.tmp``), so that a leftover of a killed process is easy to tell.

This is the package's base layer: it imports nothing of the package, so that every room (the
figures of ``viz/`` as well as ``runtime/``) can use it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path

__all__ = ["write_file_atomically", "write_text_atomically", "write_directory_atomically"]


def write_file_atomically(path: str | os.PathLike, write: Callable[[Path], object]) -> Path:
    """Write the file ``path`` whole or not at all; returns ``path`` as a :class:`~pathlib.Path`.

    The parent folders are created. ``write`` is called with a fresh temporary path beside
    ``path`` and writes the whole content there (``lambda temporary: fig.savefig(temporary)``);
    the temporary then replaces ``path`` in one rename (``os.replace``), so that a reader never
    sees half a file. Whatever stops it (an ``OSError``, Ctrl-C) removes the temporary and
    leaves the file that was at ``path`` untouched; the error is raised as it came.

    Args:
      path: the file to write; an existing file there is replaced.
      write: ``write(temporary)`` writes the content to the path ``temporary`` (which does not
        exist yet); what it returns is ignored.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        write(temporary)
        os.replace(temporary, path)
    except BaseException:
        # Never let the clean-up's own error (a read-only folder) hide the one that matters.
        with contextlib.suppress(OSError):
            temporary.unlink(missing_ok=True)
        raise
    return path


def write_text_atomically(path: str | os.PathLike, text: str, encoding: str = "utf-8") -> Path:
    """Write ``text`` to the file ``path`` whole or not at all (:func:`write_file_atomically`);
    returns ``path`` as a :class:`~pathlib.Path`.

    The file gets the permissions of any new file (``0o666`` less the umask), as ``open`` gives.
    """

    def write(temporary: Path) -> None:
        with open(temporary, "x", encoding=encoding) as file:
            file.write(text)

    return write_file_atomically(path, write)


def write_directory_atomically(directory: str | os.PathLike,
                               write: Callable[[Path], object]) -> Path:
    """Write the directory ``directory`` whole or not at all; returns it as a
    :class:`~pathlib.Path`.

    The parent folders are created. ``write`` is called with a fresh empty temporary directory
    beside ``directory`` (with the usual permissions, ``0o777`` less the umask) and fills it;
    the temporary is then renamed onto ``directory``. A directory already there is first
    renamed aside (into a private temporary folder beside it, since a rename cannot replace a
    non-empty directory) and removed once the new one is in place. Whatever stops it (an
    ``OSError``, Ctrl-C) removes the temporary and puts the old directory back where it was;
    the error is raised as it came.

    The caller decides whether what is at ``directory`` may be replaced: this replaces any
    directory there. A file there is not replaced (the rename fails with ``NotADirectoryError``,
    nothing changed).

    Args:
      directory: the directory to write.
      write: ``write(temporary)`` writes the content into the existing empty directory
        ``temporary``; what it returns is ignored.
    """
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    temporary = _private_directory_beside(directory, ".tmp")
    try:
        umask = os.umask(0)  # the only way to read the umask; set back at once
        os.umask(umask)
        os.chmod(temporary, 0o777 & ~umask)  # mkdtemp made it private (0700)
        write(temporary)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    _rename_onto(temporary, directory)
    return directory


def _private_directory_beside(target: Path, suffix: str) -> Path:
    """A new empty directory ``.<target's name>.<random><suffix>`` beside ``target``."""
    return Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=suffix, dir=target.parent))


def _rename_onto(temporary: Path, directory: Path) -> None:
    """Rename the directory ``temporary`` onto ``directory``, replacing the directory there.

    The old one is renamed aside first, then removed once the new one is in place (a failure to
    remove it does not undo the write: its hidden ``.old`` folder is left). On any failure or
    interruption before the new one is in place, ``temporary`` is removed and the old one is
    put back.
    """
    aside = None
    try:
        if directory.is_dir():
            aside = _private_directory_beside(directory, ".old")
            os.rename(directory, aside / directory.name)
        os.rename(temporary, directory)
    except BaseException:
        if os.path.lexists(temporary):  # the new directory is not in place: undo
            shutil.rmtree(temporary, ignore_errors=True)
            if aside is not None:
                _put_back(aside, directory)
        elif aside is not None:  # stopped just after the rename: the new one stays
            shutil.rmtree(aside, ignore_errors=True)
        raise
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)


def _put_back(aside: Path, directory: Path) -> None:
    """Move the old directory kept in ``aside`` back to ``directory`` and remove ``aside``; where
    that cannot be done, ``aside`` is left as it is, the old directory in it."""
    with contextlib.suppress(OSError):
        old = aside / directory.name
        if os.path.lexists(old) and not os.path.lexists(directory):
            os.rename(old, directory)
        aside.rmdir()  # fails (and keeps it) unless it is empty now
