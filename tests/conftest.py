"""Shared test set-up: strict promotion, key-reuse checks, backends, float64, matmul precision.

Strict dtype and rank promotion (as in Equinox's test suite) make any implicit broadcast or
dtype promotion inside the library an error, so the code under test states every cast.
"""

from __future__ import annotations

import jax
import pytest

jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_numpy_dtype_promotion", "strict")
# Every comparison in the suite is at float32 or float64 tolerance; GPUs would otherwise multiply
# float32 matrices in TF32 (about 1e-3 relative). The `highest_precision` fixture below states it
# again where a test is about precision.
jax.config.update("jax_default_matmul_precision", "highest")
# Every PRNG key in the suite and the library is a typed key (`jax.random.key`, never the legacy
# uint32 `PRNGKey`), which lets JAX track its use: drawing twice from one key (two dropout masks
# from the same key, say) raises `jax.errors.KeyReuseError` instead of silently repeating or
# correlating the draws. tests/test_randomness.py checks that no legacy key is left.
jax.config.update("jax_debug_key_reuse", True)

PLATFORMS = ("cpu", "gpu", "tpu")


@pytest.fixture(params=PLATFORMS)
def backend(request):
    """Each platform JAX sees (cpu always); the others are skipped with the reason."""
    try:
        device = jax.devices(request.param)[0]
    except RuntimeError as error:
        pytest.skip(f"no {request.param} backend on this machine: {error}")
    with jax.default_device(device):
        yield device


@pytest.fixture
def x64():
    """Run the test with 64-bit JAX types, to compare against the float64 NumPy reference."""
    with jax.enable_x64(True):
        yield


@pytest.fixture
def highest_precision():
    """Full-precision matmuls (GPUs otherwise default to TF32) for equivalence tests."""
    with jax.default_matmul_precision("highest"):
        yield
