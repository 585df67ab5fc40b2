"""Comparison helpers shared by the cross-framework tests (PyTorch, Flax, jax.nn vs ours).

Nothing here imports PyTorch: tensors are recognised by their ``detach`` method, so the module
serves the torch-free tests too.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def tolerances(dtype, scale: float = 1.0) -> dict:
    """float64: 1e-10 relative and absolute; float32: 1e-5, the absolute part relative to the
    array's ``scale`` (its largest magnitude): an entry near zero that is a sum of large terms
    (a gradient, say) carries their float32 rounding, not its own."""
    if np.dtype(dtype) == np.float64:
        return {"rtol": 1e-10, "atol": 1e-10}
    return {"rtol": 1e-5, "atol": 1e-5 * max(1.0, scale)}


def as_numpy(x) -> np.ndarray:
    """A tensor (any device, with or without grad), a JAX array or a NumPy array, as NumPy."""
    if hasattr(x, "detach"):
        return x.detach().cpu().numpy()
    return np.asarray(x)


def assert_close(got, expected, dtype, *, what: str = "") -> None:
    """``got`` and ``expected`` have the dtype under test and one shape, and agree to :func:`tolerances`."""
    got, expected = as_numpy(got), as_numpy(expected)
    assert got.dtype == np.dtype(dtype), (what, got.dtype, dtype)
    assert expected.dtype == np.dtype(dtype), (what, expected.dtype, dtype)
    assert got.shape == expected.shape, (what, got.shape, expected.shape)
    scale = float(np.abs(expected).max()) if expected.size else 1.0
    np.testing.assert_allclose(got, expected, err_msg=what, **tolerances(dtype, scale))


def assert_tree_close(got: dict, expected: dict, dtype, *, what: str = "") -> None:
    """Nested dicts with the same paths whose leaves agree (:func:`assert_close`), path by path."""
    def by_path(tree):
        return {jax.tree_util.keystr(path): leaf for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}

    got_paths, expected_paths = by_path(got), by_path(expected)
    assert sorted(got_paths) == sorted(expected_paths), what
    for path in got_paths:
        assert_close(got_paths[path], expected_paths[path], dtype, what=f"{what}{path}")


def to_jax(tree, dtype):
    """Every leaf of a nested dict as a JAX array of ``dtype`` (x64 must be on for float64)."""
    return jax.tree.map(lambda leaf: jnp.asarray(leaf, dtype), tree)


def normal(shape, seed: int, dtype=np.float64) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=shape).astype(dtype)


def lengths(values) -> np.ndarray:
    return np.asarray(values, np.int32)
