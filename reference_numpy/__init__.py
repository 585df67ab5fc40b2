"""Float64 NumPy forward references for jax-attention, written for clarity, not speed.

Each module mirrors the JAX module of the same name in :mod:`jax_attention` (same function names,
argument order and einsum strings) and is the ground truth the JAX code is tested against.
Parameters are plain dicts of NumPy arrays; there is no training here, and no dropout except
the masks of :mod:`reference_numpy.dropout` (the bits the JAX models draw) and the attention
core's, given such a mask (:mod:`reference_numpy.core`).
"""
