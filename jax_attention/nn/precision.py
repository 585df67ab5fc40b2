"""The package's one rule for half precision: float16 and bfloat16 are computed in float32.

A float16 score overflows to Inf beyond 65504 (``q . k`` of entries of a few hundred: the weights
are then NaN) and is rounded to a spacing of 8 near 1e4, which moves a weight by a factor up to
``e**4``; a float16 squared distance overflows beyond 256; a half-precision row sum loses the small
terms. So every function of :mod:`jax_attention.nn` that forms scores, exponentials, sums or
rotations from half-precision inputs forms them in float32 and rounds only its results back to the
inputs' dtype. float32 and float64 are computed in their own dtype, unchanged.
"""

from __future__ import annotations

import jax.numpy as jnp

__all__ = ["compute_dtype", "is_half"]


def is_half(dtype) -> bool:
    """Whether the float ``dtype`` has fewer than 32 bits (float16, bfloat16): computed in float32."""
    return jnp.finfo(dtype).bits < 32


def compute_dtype(dtype):
    """The dtype in which inputs of the float ``dtype`` are computed: float32 for float16 and
    bfloat16 (see the module docstring), ``dtype`` itself otherwise."""
    return jnp.dtype(jnp.float32) if is_half(dtype) else jnp.dtype(dtype)
