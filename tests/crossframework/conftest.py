"""Fixtures of the cross-framework tests."""

from __future__ import annotations

import jax.numpy as jnp
import pytest


@pytest.fixture(params=["float64", "float32"])
def dtype(request):
    """The dtype under test, in both frameworks, with full-precision matmuls; float64 switches
    JAX's x64 on for the duration of the test."""
    request.getfixturevalue("highest_precision")
    if request.param == "float64":
        request.getfixturevalue("x64")
        return jnp.float64
    return jnp.float32
