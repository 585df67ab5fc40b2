"""Attention pooling by similarity: Nadaraya–Watson kernel regression — d2l §11.2 (NumPy reference).

Mirror of :mod:`jax_attention.nn.attention_pooling` (same names, argument order and einsum strings).
Shape letters: ``Q`` queries, ``K`` keys (training inputs), ``v`` an optional value size,
``...`` any batch axes.

Keys and values are either shared by all queries — ``keys (..., K)`` — or given per query —
``keys (..., Q, K)``, as in the book's leave-one-out training where query ``i`` never sees its own
training point. ``values`` has the keys' shape, or that shape plus a trailing value axis ``v``.
"""

from __future__ import annotations

import numpy as np

from reference_numpy._checks import is_integer_dtype
from reference_numpy.masking import masked_softmax

__all__ = ["leave_one_out", "average_pooling", "nadaraya_watson_weights", "nadaraya_watson"]

# The same strings as in jax_attention/nn/attention_pooling.py.
POOL_SCALARS = "...qk,...qk->...q"
POOL_VECTORS = "...qk,...qkv->...qv"


def leave_one_out(x):
    """Row ``i`` holds every entry of ``x`` but the ``i``-th: ``(n,) -> (n, n - 1)`` — d2l §11.2.

    Args:
      x: ``(n,)``, or ``(n, ...)`` for vector entries.

    Returns:
      ``(n, n - 1, ...)``.
    """
    x = np.asarray(x)
    if x.ndim < 1 or x.shape[0] < 2:
        raise ValueError(f"x must have shape (n, ...) with n >= 2, got {x.shape}")
    n = x.shape[0]
    others = np.array([[j for j in range(n) if j != i] for i in range(n)], dtype=np.int32)
    return x[others]


def _per_query(queries, keys, values):
    """Checks shapes; returns keys ``(..., Q, K)`` and values ``(..., Q, K[, v])`` per query."""
    queries, keys, values = (np.asarray(a) for a in (queries, keys, values))
    for name, a in (("queries", queries), ("keys", keys), ("values", values)):
        if not (np.issubdtype(a.dtype, np.floating) or is_integer_dtype(a.dtype)):
            raise TypeError(f"{name} must hold real numbers, got dtype {a.dtype} with shape {a.shape}")
    if queries.ndim < 1:
        raise ValueError(f"queries must have shape (..., Q), got {queries.shape}")
    if keys.ndim == queries.ndim and keys.shape[:-1] == queries.shape[:-1]:
        shared = True
    elif keys.ndim == queries.ndim + 1 and keys.shape[:-1] == queries.shape:
        shared = False
    else:
        raise ValueError(
            f"keys must have shape (..., K) (shared) or (..., Q, K) (per query) for queries "
            f"(..., Q) = {queries.shape}, got {keys.shape}"
        )
    if values.shape[: keys.ndim] != keys.shape or values.ndim > keys.ndim + 1:
        raise ValueError(
            f"values must have the keys' shape {keys.shape} or {keys.shape + ('v',)}, got {values.shape}"
        )
    if shared:
        batch_axes = queries.ndim - 1
        keys = np.broadcast_to(np.expand_dims(keys, batch_axes), queries.shape + keys.shape[batch_axes:])
        values = np.broadcast_to(
            np.expand_dims(values, batch_axes), queries.shape + values.shape[batch_axes:]
        )
    return queries, keys, values


def _check_width(w, shape):
    """The kernel's inverse width ``w``, broadcastable to the distances ``(..., Q, K)``."""
    w = np.asarray(w)
    if not (np.issubdtype(w.dtype, np.floating) or is_integer_dtype(w.dtype)):
        raise TypeError(f"w must hold real numbers, got dtype {w.dtype} with shape {w.shape}")
    try:
        if np.broadcast_shapes(w.shape, shape) != tuple(shape):
            raise ValueError
    except ValueError:
        raise ValueError(f"w must be a scalar or broadcast to the distances (..., Q, K) = "
                         f"{tuple(shape)}, got shape {w.shape}") from None
    return w


def _pool(weights, values):
    return np.einsum(POOL_SCALARS if values.ndim == weights.ndim else POOL_VECTORS, weights, values)


def average_pooling(queries, keys, values):
    """The simplest estimator: every query gets the mean of the values — d2l §11.2.

    Args:
      queries: ``(..., Q)``.
      keys: ``(..., K)`` or ``(..., Q, K)``; only their number matters.
      values: the keys' shape, optionally with a trailing ``v``.

    Returns:
      ``(prediction (..., Q[, v]), weights (..., Q, K))`` with every weight ``1 / K``; with no key
      (``K = 0``) the prediction is zero, as for a fully masked row.
    """
    queries, keys, values = _per_query(queries, keys, values)
    dtype = np.result_type(queries.dtype, keys.dtype, values.dtype, np.float64)
    # No key (K = 0): nothing to average, the zero output of a fully masked row.
    weights = np.full(keys.shape, 1.0 / max(keys.shape[-1], 1), dtype=dtype)
    return _pool(weights, values), weights


def nadaraya_watson_weights(queries, keys, w=1.0):
    """Gaussian-kernel weights ``softmax_k(-((q - k) * w)^2 / 2)`` — d2l §11.2.

    ``w = 1`` is the plain Gaussian kernel; a learnable ``w`` narrows (``w > 1``) or widens the
    window, as in the book's parametric regression.

    Args:
      queries: ``(..., Q)``.
      keys: ``(..., K)`` shared or ``(..., Q, K)`` per query.
      w: inverse kernel width, a scalar or an array broadcastable to ``(..., Q, K)``.

    Returns:
      Weights ``(..., Q, K)``; each row sums to 1.
    """
    queries, keys, _ = _per_query(queries, keys, keys)
    w = _check_width(w, keys.shape)
    dtype = np.result_type(queries, keys, w)
    # float16 (as the JAX twin): the logits are formed in float32, since a float16 squared
    # distance overflows beyond 256; only the weights are rounded back.
    half = np.issubdtype(dtype, np.floating) and np.finfo(dtype).bits < 32
    if half:
        queries, keys, w = (a.astype(np.float32) for a in (queries, keys, w))
    distances = (queries[..., None] - keys) * w.reshape((1,) * (keys.ndim - w.ndim) + w.shape)
    weights = masked_softmax(-(distances**2) / 2)
    return weights.astype(dtype) if half else weights


def nadaraya_watson(queries, keys, values, w=1.0):
    """Nadaraya–Watson kernel regression ``f(q) = sum_k softmax_k(-((q - k) w)^2 / 2) y_k``.

    Args:
      queries: ``(..., Q)``.
      keys: ``(..., K)`` shared or ``(..., Q, K)`` per query.
      values: the keys' shape, optionally with a trailing ``v``.
      w: inverse kernel width (see :func:`nadaraya_watson_weights`).

    Returns:
      ``(prediction (..., Q[, v]), weights (..., Q, K))``; with no key (``K = 0``) the prediction
      is zero, as for a fully masked row.

    Raises:
      ValueError: keys or values of a shape that does not match the queries', or ``w`` that does
        not broadcast to ``(..., Q, K)``.
      TypeError: inputs that are not real numbers.
    """
    queries, keys, values = _per_query(queries, keys, values)
    weights = nadaraya_watson_weights(queries, keys, w)
    return _pool(weights, values), weights
