"""Comparison helpers shared by the NumPy-vs-JAX parity tests."""

from __future__ import annotations

import functools

import jax
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


def call(function, *args, **kwargs):
    """``function(*args, **kwargs)`` as an entry of a group for :func:`together`: its NumPy
    arrays become inputs of the group's program, every other argument (``None``, flags, sizes,
    names) is static."""
    return function, args, kwargs


def together(group, key, backend, dtype=None):
    """The result of the call ``key`` of ``group(dtype)`` (a dict ``key -> call(...)``),
    computed with the group's other calls in one jitted program, once per backend and dtype:
    the parametrised cases of a group of tests compile one program instead of one each, and
    each case still checks its own result. A case that fails to trace fails its whole group."""
    return _run_group(group, backend, dtype)[key]


@functools.cache
def _run_group(group, backend, dtype):
    calls = group(dtype)
    leaves, treedef = jax.tree.flatten(calls)
    is_input = [isinstance(leaf, np.ndarray) for leaf in leaves]

    def run(inputs):
        inputs = iter(inputs)
        calls = jax.tree.unflatten(treedef, [next(inputs) if i else leaf
                                             for leaf, i in zip(leaves, is_input)])
        return {key: function(*args, **kwargs) for key, (function, args, kwargs) in calls.items()}

    # The default device is the backend under test (its fixture), where the results are.
    return jax.jit(run)([leaf for leaf, i in zip(leaves, is_input) if i])
