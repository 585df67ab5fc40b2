"""What produced a result (library versions, backend, devices, the CPU, the checkout's commit),
and the one JSON writer.

Every record the package writes — a command's ``--json``, a benchmark, a training checkpoint, an
exported model — takes its versions from :func:`versions` and its machine from
:func:`environment`, so that they all carry the same keys, and is written by :func:`write_json`.
The CPU is read once, by :func:`cpu` (the benchmarks' records, the program cache's key) and
:func:`vector_isa` (the class of CPU whose rounding a run's bits follow).
"""

from __future__ import annotations

import functools
import json
import math
import os
import platform
import subprocess
from collections.abc import Mapping
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from types import MappingProxyType

from jax_attention._files import write_text_atomically

__all__ = ["DISTRIBUTIONS", "versions", "git_commit", "cpu", "vector_isa", "environment",
           "json_ready", "write_json", "os_reason", "rescue_path", "write_or_rescue"]

#: The distributions whose versions a record carries, in this order (the keys of :func:`versions`).
DISTRIBUTIONS = ("jax-attention", "jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy")

# The package's own folder (jax_attention/), two levels above this file.
_PACKAGE_DIR = Path(__file__).resolve().parents[1]


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


@functools.cache
def cpu() -> Mapping[str, str]:
    """The CPU: ``"machine"`` (``platform.machine()``, always there), and where Linux's
    ``/proc/cpuinfo`` tells them, its first processor's ``"model name"`` and ``"flags"`` (x86)
    or ``"Features"`` and ``"CPU part"`` (Arm), the flags sorted and space-separated.

    Read once per process; the mapping is read-only, since every caller shares it
    (``dict(cpu())`` for a copy to change or to write as JSON)."""
    found = {"machine": platform.machine()}
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        text = ""
    for line in text.splitlines():
        name, _, value = line.partition(":")
        name = name.strip()
        if name in ("model name", "flags", "Features", "CPU part") and name not in found:
            found[name] = (" ".join(sorted(value.split())) if name in ("flags", "Features")
                           else value.strip())
    return MappingProxyType(found)


def vector_isa() -> str:
    """The widest vector instructions of this CPU that XLA:CPU's kernels use: ``"avx512"``
    (AVX-512F), ``"avx2"`` (AVX2 without AVX-512) or else the machine's architecture.

    XLA:CPU's kernels, and the GEMM and reduction libraries they call, group a float32 sum by
    the vector width, so one program rounds otherwise in its last bits on an AVX2-only CPU (a
    Zen 3 EPYC) than on an AVX-512 one (Sapphire Rapids, Zen 4), and a training run, whose
    rounding grows with its steps, ends elsewhere: a seed's run is the same bit for bit on the
    CPUs of one class (docs/design.md), and the documented figures name their class."""
    found = cpu()
    flags = set(found.get("flags", "").split())
    if "avx512f" in flags:
        return "avx512"
    if "avx2" in flags:
        return "avx2"
    return found["machine"]


def environment() -> dict:
    """:func:`versions`, then ``"backend"`` (JAX's default backend), ``"devices"`` (every device
    JAX sees, as text) and ``"git_commit"`` (:func:`git_commit`), in one flat record."""
    import jax

    return {**versions(), "backend": jax.default_backend(),
            "devices": [str(device) for device in jax.devices()], "git_commit": git_commit()}


def json_ready(record):
    """``(record with every NaN and infinity replaced by None, the paths of those values)``.

    JSON has no NaN or Infinity (Python's ``json`` writes bare ``NaN``, which other readers
    reject). Paths read ``losses[3]`` or ``validation.corpus_bleu``. NumPy scalars become
    Python numbers.
    """
    found: list[str] = []

    def clean(value, path: str):
        if isinstance(value, dict):
            return {key: clean(item, f"{path}.{key}" if path else str(key))
                    for key, item in value.items()}
        if isinstance(value, (list, tuple)):
            return [clean(item, f"{path}[{index}]") for index, item in enumerate(value)]
        if hasattr(value, "item") and getattr(value, "shape", None) == ():  # NumPy/JAX scalar
            value = value.item()
        if isinstance(value, float) and not math.isfinite(value):
            found.append(path)
            return None
        return value

    return clean(record, ""), found


def write_json(path: str | os.PathLike, record: dict) -> Path:
    """Write ``record`` to ``path`` as JSON, indented by 2, with a final newline; returns the path.

    The parent folders are created. The text goes to a temporary file beside ``path`` that then
    replaces it (:func:`jax_attention._files.write_text_atomically`), so that a reader never
    sees half a file and a failed write leaves the file there before. NaN and infinities are
    written as ``null`` and their paths listed under ``"null_for_non_finite"``
    (:func:`json_ready`); other values JSON cannot hold are written as ``float(value)``.
    """
    clean, nonfinite = json_ready(record)
    if nonfinite and isinstance(clean, dict):
        clean["null_for_non_finite"] = nonfinite
    text = json.dumps(clean, indent=2, allow_nan=False, default=_json_number) + "\n"
    return write_text_atomically(path, text)


def _json_number(value):
    number = float(value)
    return number if math.isfinite(number) else None


def os_reason(error: BaseException) -> str:
    """The operating system's reason in an ``OSError`` (``[Errno 28] No space left on device``),
    else the error's text."""
    if isinstance(error, OSError) and error.errno is not None:
        return f"[Errno {error.errno}] {error.strerror or os.strerror(error.errno)}"
    return str(error) or type(error).__name__


def write_or_rescue(write, path: Path, name: str) -> tuple[Path, str | None]:
    """``write(path)``; where that fails with an ``OSError`` (a full disk, a path that became
    read-only), ``write(rescue_path(name))`` instead. Returns ``(what write returned, None)`` or
    ``(what the rescue write returned, the OS reason the first write failed)``."""
    try:
        return write(path), None
    except OSError as error:
        return write(rescue_path(name)), os_reason(error)


def rescue_path(name: str) -> Path:
    """A fresh path for an output that could not be written where asked: ``rescued/<time>-
    <name>`` in this package's user cache (``$XDG_CACHE_HOME/jax-attention``), else in the
    temporary directory — the first place where its parent can be made. The path itself is not
    created.

    Raises:
      OSError: no such place can be made.
    """
    import tempfile
    import time

    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "jax-attention"
    stamp = time.strftime("%Y%m%d-%H%M%S")
    last = None
    for root in (cache, Path(tempfile.gettempdir()) / "jax-attention"):
        try:
            parent = root / "rescued"
            parent.mkdir(parents=True, exist_ok=True)
            probe = Path(tempfile.mkdtemp(prefix=f"{stamp}-{name}-", dir=parent))
            probe.rmdir()  # a unique name, free for the caller's atomic write
            return probe
        except OSError as error:
            last = error
    raise last
