"""What every benchmark shares: interleaved timing, medians, the machine and the GEMM ceiling."""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from jax_attention.runtime import provenance

__all__ = ["environment", "format_environment", "format_table", "load_average", "time_interleaved",
           "summarize", "gemm_ceiling", "source_fingerprint", "write_json"]


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (``None`` where the OS has none): on a shared machine
    they say how much the neighbours took from a run."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def environment() -> dict:
    """The machine, the thread settings and :func:`jax_attention.runtime.provenance.environment` (library
    versions, JAX's backend and devices, the commit), for the JSON of every run."""
    shared = provenance.environment()
    record = {
        "cpu": provenance.cpu().get("model name") or platform.processor() or platform.machine(),
        # The class of CPU whose rounding the runs' bits follow (docs/design.md).
        "vector_isa": provenance.vector_isa(),
        "cpu_count": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "python": platform.python_version(),
        **shared,
        # The names that benchmark records used before the shared ones, for their readers.
        "jax_backend": shared["backend"],
        "jax_devices": shared["devices"],
        "loadavg": load_average(),
        "env": {name: os.environ[name] for name in (
            "XLA_FLAGS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
            "JAX_PLATFORMS") if name in os.environ},
    }
    try:
        import torch
    except ImportError:
        record["torch"] = None
    else:
        record["torch"] = torch.__version__
        record["torch_threads"] = torch.get_num_threads()
    return record


def format_environment(record: Mapping) -> str:
    """:func:`environment`'s record as the header lines a benchmark prints before its table."""
    lines = [f"cpu: {record['cpu']} ({record['cpu_count']} logical, {record['affinity']} usable); "
             f"load average {record.get('loadavg')}",
             f"python {record['python']}, numpy {record['numpy']}, jax {record['jax']} "
             f"({record['jax_backend']}: {', '.join(record['jax_devices'])})"]
    if record.get("torch") is not None:
        lines.append(f"torch {record['torch']}, torch.get_num_threads() = {record['torch_threads']}")
    else:
        lines.append("torch: not installed")
    env = record.get("env") or {}
    lines.append("thread/XLA variables: " + (", ".join(f"{k}={v}" for k, v in env.items()) or
                                             "none set (libraries use their defaults)"))
    return "\n".join(lines)


def format_table(headers: list[str], rows: list[list[object]]) -> str:
    """A plain-text table, columns right-aligned except the first; ``None`` prints as ``-``."""
    cells = [[str(h) for h in headers]] + [["-" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = []
    for number, row in enumerate(cells):
        lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                               for i, (c, w) in enumerate(zip(row, widths))))
        if number == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def time_interleaved(functions: Mapping[str, Callable[[], object]], *, repeats: int = 7,
                     warmup: int = 2, shuffle_seed: int | None = None) -> dict[str, list[float]]:
    """Seconds per call of each function, the functions called in turn within each round.

    Each function must finish its work before returning (``jax.block_until_ready``). ``warmup``
    untimed rounds first (compilation, caches), then ``repeats`` timed rounds. With
    ``shuffle_seed``, each timed round calls the functions in a new random order: a runtime that
    leaves its threads spinning after a call (PyTorch's OpenMP pool) slows whichever function
    comes next, and shuffling spreads that cost over all of them instead of one.
    """
    if repeats < 5:
        raise ValueError(f"repeats must be >= 5 for a median worth reporting, got {repeats}")
    for _ in range(warmup):
        for function in functions.values():
            function()
    samples: dict[str, list[float]] = {name: [] for name in functions}
    order = list(functions)
    rng = None if shuffle_seed is None else np.random.default_rng(shuffle_seed)
    for _ in range(repeats):
        if rng is not None:
            order = [order[i] for i in rng.permutation(len(order))]
        for name in order:
            start = time.perf_counter()
            functions[name]()
            samples[name].append(time.perf_counter() - start)
    return samples


def summarize(samples: list[float]) -> dict:
    """``{"median_s", "min_s", "max_s", "repeats"}`` of one function's timings."""
    return {"median_s": statistics.median(samples), "min_s": min(samples),
            "max_s": max(samples), "repeats": len(samples)}


def gemm_ceiling(n: int = 2048, *, repeats: int = 5) -> dict:
    """float32 ``n x n x n`` matrix-multiply GFLOP/s of NumPy's BLAS, XLA's dot and (if
    installed) PyTorch, measured now; ``"ceiling_gflops"`` is the best of them. Also XLA's dot of
    bfloat16 operands accumulated in float32 (``"xla-bfloat16"``, the products of bfloat16
    training, :func:`jax_attention.nn.precision.product`): ``"bfloat16_ceiling_gflops"``."""
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    a_jax, b_jax = jnp.asarray(a), jnp.asarray(b)
    dot = jax.jit(jnp.dot)
    half_dot = jax.jit(lambda a, b: jax.lax.dot(a, b, preferred_element_type=jnp.float32))
    a_half, b_half = a_jax.astype(jnp.bfloat16), b_jax.astype(jnp.bfloat16)
    functions = {"numpy": lambda: a @ b, "xla": lambda: dot(a_jax, b_jax).block_until_ready(),
                 "xla-bfloat16": lambda: half_dot(a_half, b_half).block_until_ready()}
    try:
        import torch
    except ImportError:
        pass
    else:
        a_torch, b_torch = torch.from_numpy(a), torch.from_numpy(b)
        functions["torch"] = lambda: a_torch @ b_torch
    samples = time_interleaved(functions, repeats=repeats, warmup=1)
    flops = 2.0 * n ** 3
    gflops = {name: flops / statistics.median(times) / 1e9 for name, times in samples.items()}
    half = gflops.pop("xla-bfloat16")
    return {"n": n, "dtype": "float32", "gflops": gflops, "ceiling_gflops": max(gflops.values()),
            "bfloat16_gflops": half, "bfloat16_ceiling_gflops": max(half, *gflops.values())}


def source_fingerprint(*modules: str) -> dict:
    """Which code a run measured: the git commit of the checkout (``None`` outside one), whether
    the named modules differ from it, and a SHA-256 prefix of each module's file.

    Taken at the start and the end of a run, it shows whether the code under test was edited
    while the run imported it (fresh child processes import it again).
    """
    import hashlib
    import importlib.util
    import subprocess

    files = {}
    for name in modules:
        spec = importlib.util.find_spec(name)
        origin = None if spec is None else spec.origin
        files[name] = (None if origin is None or not Path(origin).is_file() else
                       hashlib.sha256(Path(origin).read_bytes()).hexdigest()[:16])
    record: dict = {"modules": files, "git_commit": None, "modified": None}
    here = Path(__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True,
                                text=True, timeout=10)
        if commit.returncode == 0:
            record["git_commit"] = commit.stdout.strip()
            paths = [importlib.util.find_spec(name).origin for name in modules
                     if files[name] is not None]
            status = subprocess.run(["git", "status", "--porcelain", "--", *paths], cwd=here,
                                    capture_output=True, text=True, timeout=10)
            if status.returncode == 0:
                record["modified"] = [line[3:] for line in status.stdout.splitlines()]
    except (OSError, subprocess.SubprocessError):
        pass  # no git: the hashes still identify the code
    return record


#: One JSON writer for the package (indented, atomic); the name benchmarks have always used.
write_json = provenance.write_json
