"""The package's one rule for half precision: float16 and bfloat16 are computed in float32.

A float16 score overflows to Inf beyond 65504 (``q . k`` of entries of a few hundred: the weights
are then NaN) and is rounded to a spacing of 8 near 1e4, which moves a weight by a factor up to
``e**4``; a float16 squared distance overflows beyond 256; a half-precision row sum loses the small
terms. So every function of :mod:`jax_attention.nn` that forms scores, exponentials, sums or
rotations from half-precision inputs forms them in float32 and rounds only its results back to the
inputs' dtype. float32 and float64 are computed in their own dtype, unchanged.

Products are the exception, where the hardware allows: :func:`product` multiplies half-precision
operands as they are and accumulates in float32 (a CPU with bfloat16 dot instructions, AVX-512
BF16 or AMX, runs it natively; XLA:CPU turns a product with a half-precision *result* into a
float32 product of converted operands), forward and backward.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

__all__ = ["compute_dtype", "is_half", "product"]


def is_half(dtype) -> bool:
    """Whether the float ``dtype`` has fewer than 32 bits (float16, bfloat16): computed in float32."""
    return jnp.finfo(dtype).bits < 32


def compute_dtype(dtype):
    """The dtype in which inputs of the float ``dtype`` are computed: float32 for float16 and
    bfloat16 (see the module docstring), ``dtype`` itself otherwise."""
    return jnp.dtype(jnp.float32) if is_half(dtype) else jnp.dtype(dtype)


def product(subscripts: str, a, b):
    """``jnp.einsum(subscripts, a, b)`` of two operands; for two half-precision operands of one
    dtype, the product of their values accumulated in float32 and rounded to their dtype.

    Its gradients are such products too (``g`` the output's cotangent, for ``"A,B->C"``:
    ``einsum("C,B->A", g, b)`` and ``einsum("A,C->B", a, g)``), where JAX's own rule would
    multiply a float32 cotangent by a converted operand. So every index of ``A`` must appear in
    ``B`` or ``C`` and every index of ``B`` in ``A`` or ``C`` (a dense layer, an attention
    product), without repeated indices. Other dtypes: ``jnp.einsum``, unchanged.
    """
    if not (is_half(a.dtype) and a.dtype == b.dtype):
        return jnp.einsum(subscripts, a, b)
    return _half_product(subscripts, a, b)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _half_product(subscripts: str, a, b):
    return jnp.einsum(subscripts, a, b, preferred_element_type=jnp.float32).astype(a.dtype)


def _half_product_forward(subscripts: str, a, b):
    return _half_product(subscripts, a, b), (a, b)


def _half_product_backward(subscripts: str, residuals, g):
    a, b = residuals
    inputs, output = subscripts.split("->")
    a_axes, b_axes = inputs.split(",")
    g = g.astype(a.dtype)
    return (_half_product(f"{output},{b_axes}->{a_axes}", g, b),
            _half_product(f"{a_axes},{output}->{b_axes}", a, g))


_half_product.defvjp(_half_product_forward, _half_product_backward)
