"""Comparison helpers shared by the NumPy-vs-JAX parity tests."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np


def tolerances(dtype, atol32: float = 1e-6) -> dict:
    """float64 must agree to 1e-12; float32 to 1e-5 relative (``atol32`` near zero)."""
    return {"rtol": 1e-12, "atol": 1e-12} if dtype == jnp.float64 else {"rtol": 1e-5, "atol": atol32}


def assert_matches(got, expected, dtype, backend, atol32: float = 1e-6) -> None:
    """``got`` (JAX) equals the float64 reference ``expected`` within :func:`tolerances`.

    The dtype and device checks make sure the comparison is not silently of something else: a
    float32 result under x64, or an array computed on the CPU while the GPU is under test.
    """
    assert got.dtype == dtype
    assert got.devices() == {backend}
    assert got.shape == expected.shape
    np.testing.assert_allclose(np.asarray(got, np.float64), expected, **tolerances(dtype, atol32))
