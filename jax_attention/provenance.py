"""What produced a result (library versions, backend, devices, the checkout's commit), and the
one JSON writer.

Every record the package writes — a command's ``--json``, a benchmark, a training checkpoint, an
exported model — takes its versions from :func:`versions` and its machine from
:func:`environment`, so that they all carry the same keys, and is written by :func:`write_json`.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

__all__ = ["DISTRIBUTIONS", "versions", "git_commit", "environment", "write_json"]

#: The distributions whose versions a record carries, in this order (the keys of :func:`versions`).
DISTRIBUTIONS = ("jax-attention", "jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy")

_PACKAGE_DIR = Path(__file__).resolve().parent


def _distribution_version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def versions() -> dict[str, str | None]:
    """``{distribution: version}`` for :data:`DISTRIBUTIONS`; ``None`` for one not installed.

    Read from the installed metadata, so that nothing (Orbax, say) is imported for it; this
    package's own version is ``jax_attention.__version__``, which holds in a bare checkout too.
    """
    from jax_attention import __version__

    return {name: __version__ if name == "jax-attention" else _distribution_version(name)
            for name in DISTRIBUTIONS}


def git_commit() -> str | None:
    """The commit of the git checkout this package is imported from; ``None`` when it is not
    imported from one (an installed wheel) or git cannot tell (no git, no repository)."""
    try:
        found = subprocess.run(["git", "rev-parse", "--show-toplevel", "HEAD"], cwd=_PACKAGE_DIR,
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = found.stdout.split()
    if found.returncode != 0 or len(lines) != 2:
        return None
    top, commit = lines
    # A package installed inside some other repository (a virtual environment in a checkout)
    # does not take that repository's commit.
    return commit if Path(top).resolve() / _PACKAGE_DIR.name == _PACKAGE_DIR else None


def environment() -> dict:
    """:func:`versions`, then ``"backend"`` (JAX's default backend), ``"devices"`` (every device
    JAX sees, as text) and ``"git_commit"`` (:func:`git_commit`), in one flat record."""
    import jax

    return {**versions(), "backend": jax.default_backend(),
            "devices": [str(device) for device in jax.devices()], "git_commit": git_commit()}


def write_json(path: str | os.PathLike, record: dict) -> Path:
    """Write ``record`` to ``path`` as JSON, indented by 2, with a final newline; returns the path.

    The parent folders are created. The text goes to a temporary file beside ``path`` that then
    replaces it (``os.replace``), so that a reader never sees half a file. Values JSON cannot
    hold are written as ``float(value)`` (NumPy and JAX scalars).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(record, indent=2, default=float) + "\n"
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(temporary, "x", encoding="utf-8") as file:  # the umask's permissions, as open()
            file.write(text)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return path
