"""Same seed, same run: bit for bit on CPU, to float32 rounding elsewhere.

docs/design.md promises bit-identical training on CPU from ``--seed``. On a GPU, XLA runs some
reductions with atomics in no fixed order — the embedding gradients' scatter-add among them — so
two runs of the same seed agree only to rounding (an H200 gave last-bit differences in the
parameters after two epochs); ``XLA_FLAGS=--xla_gpu_deterministic_ops=true`` orders them.
"""

from __future__ import annotations

import chex
import jax
import numpy as np


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
