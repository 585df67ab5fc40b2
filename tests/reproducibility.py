"""Same seed, same run: bit for bit on CPU, to float32 rounding elsewhere.

docs/design.md promises bit-identical training on CPU from ``--seed``. On a GPU, XLA runs some
reductions with atomics in no fixed order — the embedding gradients' scatter-add among them — so
two runs of the same seed agree only to rounding (an H200 gave last-bit differences in the
parameters after two epochs); ``XLA_FLAGS=--xla_gpu_deterministic_ops=true`` orders them.
"""

from __future__ import annotations

import functools
import platform
from pathlib import Path

import chex
import jax
import numpy as np


@functools.cache
def vector_isa() -> str:
    """The widest vector instructions of this CPU that XLA:CPU's kernels use: ``"avx512"``
    (AVX-512F), ``"avx2"`` (AVX2, without AVX-512) or else the machine's architecture
    (``platform.machine()``).

    XLA:CPU's kernels and the GEMM and reduction libraries it calls group a float32 sum by the
    vector width, so the same program rounds otherwise in the last bits on an AVX2-only CPU (a
    Zen 3 EPYC) than on an AVX-512 one (Sapphire Rapids, Zen 4), and a training run, whose
    rounding grows with the steps, ends elsewhere. A seed's run is bit for bit the same on CPUs
    of one class: the pinned losses and the seed-by-seed figures are per class
    (tests/test_pinned_losses.py, docs/models.md)."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return platform.machine()
    flags = set()
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "flags":
            flags = set(value.split())
            break
    if "avx512f" in flags:
        return "avx512"
    if "avx2" in flags:
        return "avx2"
    return platform.machine()


def _exact() -> bool:
    return jax.default_backend() == "cpu"


def assert_same_losses(got, expected) -> None:
    """Two runs of the same configuration and seed logged the same losses."""
    if _exact():
        assert list(got) == list(expected)
    else:
        np.testing.assert_allclose(got, expected, rtol=1e-5)


def assert_same_params(got, expected) -> None:
    """Two runs of the same configuration and seed ended with the same parameters."""
    if _exact():
        chex.assert_trees_all_equal(got, expected)
    else:
        chex.assert_trees_all_close(got, expected, rtol=1e-5, atol=1e-6)
