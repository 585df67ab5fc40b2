"""``jax-attention bench memory``: peak memory of plain and memory-efficient attention.

For each sequence length ``N`` (``T = S = N``, one batch, one head, ``H = 64``) and each variant —
``plain`` (:func:`jax_attention.nn.scoring.dot_product_attention` with ``implementation="plain"``,
which holds the ``N x N`` scores; its default dispatch takes the chunked kernel at these sizes)
and ``efficient`` (:func:`jax_attention.nn.efficient.dot_product_attention`, chunked) — a fresh
Python process (``python -m jax_attention.bench.memory --child ...``) runs one jitted
forward+backward (:func:`jax_attention.bench.attention.forward_backward`) and reports its peak
resident set size (:func:`peak_rss_bytes`: Linux's ``VmHWM``, since its ``ru_maxrss`` starts at
the spawning parent's peak; ``ru_maxrss`` is recorded too). A fresh process per measurement is
needed because the peak RSS of a process never goes down: measured in one process, every size
would report the largest so far. A ``baseline`` child at each ``N`` only imports the same modules and allocates the same
inputs, so ``peak - baseline`` is what the attention itself took (compilation included: XLA's
compiler runs in the same process; the child also reports its peak before running, after
compiling, and XLA's own estimate of the temporary buffers).

The children run on JAX's CPU backend (``JAX_PLATFORMS=cpu``): RSS is host memory.

Plain attention is skipped, and recorded as skipped with the reason, where its estimated
``3 · itemsize · N²`` bytes (scores, weights and their gradient) exceed ``cap_bytes``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from jax_attention.bench.attention import SOURCES, format_sources
from jax_attention.bench.common import (environment, format_environment, format_table, load_average,
                                        source_fingerprint)

__all__ = ["VARIANTS", "DEFAULT_SIZES", "DEFAULT_CAP_BYTES", "plain_estimate_bytes", "peak_rss_bytes",
           "ru_maxrss_bytes", "run_child", "bench_memory", "format_memory", "nothing_measured",
           "child_main"]

#: The attention implementations measured: ``"plain"`` (whole ``N x N`` scores) and
#: ``"efficient"`` (chunked); the default ``variants`` of :func:`bench_memory` and the choices of
#: ``bench memory --variants``.
VARIANTS = ("plain", "efficient")
#: The default sequence lengths ``N`` (``T = S = N``), each measured in fresh child processes.
DEFAULT_SIZES = (4096, 8192, 16384, 32768, 65536)
#: The default ``cap_bytes``, 8 GiB: plain attention is skipped (and recorded as skipped) at the
#: sizes where :func:`plain_estimate_bytes` exceeds it; ``bench memory --cap-gib`` sets it.
DEFAULT_CAP_BYTES = 8 * 2**30
_CHILD_VARIANTS = VARIANTS + ("baseline",)
_ITEMSIZE = {"float32": 4, "bfloat16": 2}


def plain_estimate_bytes(n: int, *, batch: int = 1, heads: int = 1, dtype: str = "float32") -> int:
    """``3 · itemsize · B · N_heads · N²``: the scores, the weights and the weights' gradient that
    plain attention's forward+backward holds at once. A lower bound, so the cap errs towards
    running: on XLA:CPU the measured peak RSS has been 1.3 to 2.8 times this, depending on how the
    backward pass of :mod:`jax_attention.nn.scoring` was written."""
    return 3 * _ITEMSIZE[dtype] * batch * heads * n * n


def ru_maxrss_bytes() -> int:
    """``getrusage(RUSAGE_SELF).ru_maxrss`` in bytes (KiB on Linux, bytes on macOS).

    On Linux it is not this program's own peak: ``exec`` keeps the high-water mark of the process
    image it replaces, so a child spawned by a parent holding 354 MiB (jax and PyTorch loaded)
    reports at least 354 MiB. Recorded for reference; :func:`peak_rss_bytes` is the measure.
    """
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def peak_rss_bytes() -> int:
    """This process's peak resident set size in bytes: ``VmHWM`` of ``/proc/self/status``, the
    high-water mark of this program's own memory, where Linux has it; ``ru_maxrss`` elsewhere."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return ru_maxrss_bytes()
    match = re.search(r"^VmHWM:\s*(\d+)\s*kB", status, re.MULTILINE)
    return int(match.group(1)) * 1024 if match else ru_maxrss_bytes()


# --------------------------------------------------------------------------- the child


def _child(variant: str, n: int, head_size: int, dtype_name: str, seed: int) -> dict:
    """One measurement in this (fresh) process; returns the JSON-able figures."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jax_attention.nn import efficient, scoring
    from jax_attention.bench.attention import forward_backward

    dtype = jnp.dtype(dtype_name)
    rng = np.random.default_rng(seed)
    # (B, N_heads, T, H) = (1, 1, N, H); the cotangent is the fourth input.
    q, k, v, cotangent = (jax.block_until_ready(jnp.asarray(
        rng.standard_normal((1, 1, n, head_size), dtype=np.float32), dtype)) for _ in range(4))
    record = {"variant": variant, "n": n, "head_size": head_size, "dtype": dtype_name,
              "peak_rss_after_inputs_bytes": peak_rss_bytes()}
    if variant == "baseline":
        record["peak_rss_bytes"] = record["peak_rss_after_inputs_bytes"]
        record["ru_maxrss_bytes"] = ru_maxrss_bytes()
        return record

    def attend(q, k, v, lens):
        if variant == "plain":
            return scoring.dot_product_attention(q, k, v, lens, implementation="plain")[0]
        return efficient.dot_product_attention(q, k, v, lens)

    start = time.perf_counter()
    compiled = jax.jit(forward_backward(attend)).lower(q, k, v, None, cotangent).compile()
    record["compile_s"] = time.perf_counter() - start
    record["peak_rss_after_compile_bytes"] = peak_rss_bytes()
    try:
        analysis = compiled.memory_analysis()
        record["xla_temp_bytes"] = int(analysis.temp_size_in_bytes)
    except (AttributeError, NotImplementedError, TypeError):
        record["xla_temp_bytes"] = None  # not every backend reports it
    start = time.perf_counter()
    grads = jax.block_until_ready(compiled(q, k, v, None, cotangent))
    record["run_s"] = time.perf_counter() - start
    record["peak_rss_bytes"] = peak_rss_bytes()
    record["ru_maxrss_bytes"] = ru_maxrss_bytes()
    # A finite result shows the run did the work rather than failing quietly.
    record["grads_finite"] = bool(all(np.isfinite(np.asarray(g, np.float32)).all() for g in grads))
    return record


def child_main(argv: Sequence[str] | None = None) -> int:
    """``python -m jax_attention.bench.memory --child --variant V --n N``: prints one JSON line."""
    parser = argparse.ArgumentParser(prog="python -m jax_attention.bench.memory",
                                     description="one measurement of `jax-attention bench memory`")
    parser.add_argument("--child", action="store_true", required=True,
                        help="run one measurement in this process (what the benchmark spawns)")
    parser.add_argument("--variant", choices=_CHILD_VARIANTS, required=True)
    parser.add_argument("--n", type=int, required=True, help="sequence length T = S")
    parser.add_argument("--head-size", type=int, default=64)
    parser.add_argument("--dtype", choices=tuple(_ITEMSIZE), default="float32")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.n < 1 or args.head_size < 1:
        parser.error(f"--n and --head-size must be positive, got {args.n} and {args.head_size}")
    print(json.dumps(_child(args.variant, args.n, args.head_size, args.dtype, args.seed)))
    return 0


def run_child(variant: str, n: int, *, head_size: int = 64, dtype: str = "float32", seed: int = 0,
              timeout_s: float | None = None) -> dict:
    """Run one child process and return its record; a failed child (out of memory, timeout)
    gives ``{"status": "failed", "reason": ...}`` instead of raising, so one size cannot lose
    the others' figures."""
    if variant not in _CHILD_VARIANTS:
        raise ValueError(f"variant must be one of {', '.join(_CHILD_VARIANTS)}, got {variant!r}")
    command = [sys.executable, "-m", "jax_attention.bench.memory", "--child", "--variant", variant,
               "--n", str(n), "--head-size", str(head_size), "--dtype", dtype, "--seed", str(seed)]
    start = time.perf_counter()
    try:
        # Peak RSS is host memory: the children run on the CPU backend even where JAX sees an
        # accelerator (whose memory RSS would not show, and whose runtime alone takes ~600 MiB).
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s,
                              env={**os.environ, "JAX_PLATFORMS": "cpu"})
    except subprocess.TimeoutExpired:
        return {"status": "failed", "reason": f"timed out after {timeout_s:g} s"}
    wall = time.perf_counter() - start
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return {"status": "failed",
                "reason": f"child exited with status {done.returncode}: " + " | ".join(tail)}
    return {"status": "ok", **json.loads(lines[-1]), "wall_s": wall}


# --------------------------------------------------------------------------- the benchmark


def bench_memory(sizes: Sequence[int] = DEFAULT_SIZES, *, variants: Sequence[str] = VARIANTS,
                 head_size: int = 64, dtype: str = "float32", cap_bytes: int = DEFAULT_CAP_BYTES,
                 timeout_s: float | None = 3600.0, seed: int = 0,
                 log: Callable[[str], None] | None = None) -> dict:
    """Peak RSS of one forward+backward per (size, variant), each in a fresh process.

    Args:
      sizes: sequence lengths ``N`` (``T = S = N``; batch and heads 1).
      variants: a subset of :data:`VARIANTS`.
      head_size: ``H``.
      dtype: ``"float32"`` or ``"bfloat16"``.
      cap_bytes: plain attention is skipped where :func:`plain_estimate_bytes` exceeds this.
      timeout_s: per child; a child that runs longer is recorded as failed.
      seed: seeds the inputs.
      log: called with a line before each child; ``None`` for silence.

    Returns:
      ``{"command", "environment", "settings", "results": [...], "sources",
      "sources_changed_during_run", "loadavg_after"}``; a result
      per (size, variant) with ``status`` (``ok``, ``skipped`` or ``failed``), the child's
      figures, the baseline's peak RSS at that size and ``attention_bytes = peak - baseline``.
    """
    sizes = list(sizes)
    if not sizes or any(not isinstance(n, int) or n < 1 for n in sizes):
        raise ValueError(f"sizes must be positive integers, got {sizes}")
    variants = list(dict.fromkeys(variants))
    if not variants or any(v not in VARIANTS for v in variants):
        raise ValueError(
            f"variants must be a non-empty subset of {', '.join(VARIANTS)}, got {variants}")
    if dtype not in _ITEMSIZE:
        raise ValueError(f"dtype must be one of {', '.join(_ITEMSIZE)}, got {dtype!r}")
    if head_size < 1 or not cap_bytes > 0:
        raise ValueError(f"need head_size >= 1 and cap_bytes > 0, got {head_size} and {cap_bytes}")
    log = log or (lambda line: None)
    env = environment()  # at the start, like its load average
    # Each child imports the code afresh: an edit during the run would split the figures.
    sources = source_fingerprint(*SOURCES)
    results = []
    for n in sizes:
        plan = {}
        for variant in variants:
            estimate = plain_estimate_bytes(n, dtype=dtype) if variant == "plain" else None
            if estimate is not None and estimate > cap_bytes:
                plan[variant] = {"status": "skipped", "reason": (
                    f"plain attention would hold at least {_size(estimate)} "
                    f"(3·{_ITEMSIZE[dtype]}·N² bytes) > cap {_size(cap_bytes)}")}
            else:
                plan[variant] = None
        baseline = None
        if any(entry is None for entry in plan.values()):
            log(f"N = {n}: baseline ...")
            baseline = run_child("baseline", n, head_size=head_size, dtype=dtype, seed=seed,
                                 timeout_s=timeout_s)
        for variant, entry in plan.items():
            if entry is None:
                log(f"N = {n}: {variant} forward+backward ...")
                entry = run_child(variant, n, head_size=head_size, dtype=dtype, seed=seed,
                                  timeout_s=timeout_s)
            entry = {"n": n, "variant": variant, **entry,
                     "plain_estimate_bytes": plain_estimate_bytes(n, dtype=dtype)}
            if entry["status"] == "ok" and baseline and baseline["status"] == "ok":
                entry["baseline_peak_rss_bytes"] = baseline["peak_rss_bytes"]
                entry["attention_bytes"] = entry["peak_rss_bytes"] - baseline["peak_rss_bytes"]
            results.append(entry)
    return {"command": "bench memory", "environment": env,
            "settings": {"sizes": sizes, "variants": variants, "batch": 1, "heads": 1,
                         "head_size": head_size, "dtype": dtype, "cap_bytes": cap_bytes,
                         "timeout_s": timeout_s, "seed": seed,
                         "measure": "ru_maxrss of a fresh process running one jitted "
                                    "forward+backward (compilation included); baseline: a "
                                    "process that only imports and allocates the inputs"},
            "results": results, "sources": sources,
            "sources_changed_during_run":
                source_fingerprint(*SOURCES)["modules"] != sources["modules"],
            "loadavg_after": load_average()}


def nothing_measured(record: dict) -> str | None:
    """Why :func:`bench_memory`'s ``record`` holds no measurement, on one line, or ``None`` when
    at least one (size, variant) was measured.

    Nothing is measured when every run was skipped (plain attention over the cap, the only
    variant asked for) or failed (a child out of memory, killed or past its timeout).
    """
    results = record["results"]
    if any(r["status"] == "ok" for r in results):
        return None
    statuses = {r["status"] for r in results}
    what = ("every run was skipped" if statuses == {"skipped"} else
            "every run failed" if statuses == {"failed"} else "every run was skipped or failed")
    details = [f"{r['variant']} at N = {r['n']} {r['status']}: {r.get('reason', 'no reason given')}"
               for r in results]
    return f"{what} ({'; '.join(' '.join(d.split()) for d in details)})"


def _size(nbytes: float) -> str:
    return f"{nbytes / 2**30:.1f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"


def _mib(value):
    return None if value is None else f"{value / 2**20:.0f}"


def format_memory(record: dict) -> str:
    """The environment header and one table row per (size, variant)."""
    settings = record["settings"]
    lines = [format_environment(record["environment"]),
             f"(B, heads, T = S, H) = (1, 1, N, {settings['head_size']}), {settings['dtype']}, "
             f"one jitted forward+backward per fresh process; MiB = 2^20 bytes",
             f"load average at the end: {record.get('loadavg_after')}",
             format_sources(record, imported_once=False), ""]
    headers = ["variant", "N", "peak RSS MiB", "baseline MiB", "attention MiB",
               "after compile MiB", "XLA temp MiB", "plain est. MiB", "compile s", "run s", "status"]
    rows = []
    for r in record["results"]:
        rows.append([r["variant"], r["n"], _mib(r.get("peak_rss_bytes")),
                     _mib(r.get("baseline_peak_rss_bytes")), _mib(r.get("attention_bytes")),
                     _mib(r.get("peak_rss_after_compile_bytes")), _mib(r.get("xla_temp_bytes")),
                     _mib(r["plain_estimate_bytes"]),
                     None if "compile_s" not in r else f"{r['compile_s']:.1f}",
                     None if "run_s" not in r else f"{r['run_s']:.1f}",
                     r["status"]])
    lines.append(format_table(headers, rows))
    notes = [f"  {r['variant']} at N = {r['n']}: {r['status']}, {r['reason']}"
             for r in record["results"] if r["status"] != "ok"]
    if notes:
        lines += ["", "not measured:"] + notes
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(child_main())
