"""Attention pooling by similarity: Nadaraya–Watson kernel regression — d2l §11.2, in JAX.

Mirror of :mod:`reference_numpy.attention_pooling` (same names, argument order and einsum strings),
plus the book's synthetic data and the NNX module with a learnable kernel width.
Shape letters: ``Q`` queries, ``K`` keys (training inputs), ``v`` an optional value size,
``...`` any batch axes.

Keys and values are either shared by all queries — ``keys (..., K)`` — or given per query —
``keys (..., Q, K)``, as in the book's leave-one-out training where query ``i`` never sees its own
training point. ``values`` has the keys' shape, or that shape plus a trailing value axis ``v``.
The computation runs in the queries' float dtype.
"""

from __future__ import annotations

import numbers

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jax_attention._checks import is_integer_dtype
from jax_attention.nn.masking import masked_softmax
from jax_attention.nn.precision import compute_dtype

__all__ = [
    "leave_one_out",
    "average_pooling",
    "nadaraya_watson_weights",
    "nadaraya_watson",
    "kernel_regression_data",
    "NWKernelRegression",
]

# The same strings as in reference_numpy/attention_pooling.py.
POOL_SCALARS = "...qk,...qk->...q"
POOL_VECTORS = "...qk,...qkv->...qv"


def leave_one_out(x):
    """Row ``i`` holds every entry of ``x`` but the ``i``-th: ``(n,) -> (n, n - 1)`` — d2l §11.2.

    Args:
      x: ``(n,)``, or ``(n, ...)`` for vector entries.

    Returns:
      ``(n, n - 1, ...)``.
    """
    x = jnp.asarray(x)
    if x.ndim < 1 or x.shape[0] < 2:
        raise ValueError(f"x must have shape (n, ...) with n >= 2, got {x.shape}")
    n = x.shape[0]
    others = np.array([[j for j in range(n) if j != i] for i in range(n)], dtype=np.int32)
    # Static NumPy indices: a gather that works under jit, unlike boolean masking.
    return x[others]


def _per_query(queries, keys, values):
    """Checks shapes; returns keys ``(..., Q, K)`` and values ``(..., Q, K[, v])`` per query."""
    queries, keys, values = (jnp.asarray(a) for a in (queries, keys, values))
    for name, a in (("queries", queries), ("keys", keys), ("values", values)):
        if not (jnp.issubdtype(a.dtype, jnp.floating) or is_integer_dtype(a.dtype)):
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
        keys = jnp.broadcast_to(jnp.expand_dims(keys, batch_axes), queries.shape + keys.shape[batch_axes:])
        values = jnp.broadcast_to(
            jnp.expand_dims(values, batch_axes), queries.shape + values.shape[batch_axes:]
        )
    return queries, keys, values


def _check_width(w, shape):
    """The kernel's inverse width ``w``, broadcastable to the distances ``(..., Q, K)``."""
    w = jnp.asarray(w)
    if not (jnp.issubdtype(w.dtype, jnp.floating) or is_integer_dtype(w.dtype)):
        raise TypeError(f"w must hold real numbers, got dtype {w.dtype} with shape {w.shape}")
    try:
        if np.broadcast_shapes(w.shape, shape) != tuple(shape):
            raise ValueError
    except ValueError:
        raise ValueError(f"w must be a scalar or broadcast to the distances (..., Q, K) = "
                         f"{tuple(shape)}, got shape {w.shape}") from None
    return w


def _float_dtype(x):
    return x.dtype if jnp.issubdtype(x.dtype, jnp.floating) else jnp.result_type(float)


def _pool(weights, values):
    return jnp.einsum(POOL_SCALARS if values.ndim == weights.ndim else POOL_VECTORS, weights, values)


def average_pooling(queries, keys, values):
    """The simplest estimator: every query gets the mean of the values — d2l §11.2.

    Args:
      queries: ``(..., Q)``.
      keys: ``(..., K)`` or ``(..., Q, K)``; only their number matters.
      values: the keys' shape, optionally with a trailing ``v``.

    Returns:
      ``(prediction (..., Q[, v]), weights (..., Q, K))`` with every weight ``1 / K``; with no key
      (``K = 0``) the prediction is zero, as for a fully masked row.

    Example::

        >>> values = jnp.array([1.0, 2.0, 3.0, 6.0])
        >>> prediction, weights = average_pooling(jnp.arange(3.0), jnp.arange(4.0), values)
        >>> prediction.tolist(), weights.shape
        ([3.0, 3.0, 3.0], (3, 4))
    """
    queries, keys, values = _per_query(queries, keys, values)
    # No key (K = 0): nothing to average, the zero output of a fully masked row.
    weights = jnp.full(keys.shape, 1.0 / max(keys.shape[-1], 1), dtype=_float_dtype(values))
    return _pool(weights, values.astype(weights.dtype)), weights


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

    Example::

        >>> weights = nadaraya_watson_weights(jnp.array([0.0, 1.0]), jnp.array([0.0, 1.0, 2.0]))
        >>> weights.shape
        (2, 3)
        >>> np.asarray(weights[1]).round(3)             # the nearest key weighs most
        array([0.274, 0.452, 0.274], dtype=float32)
    """
    queries, keys, _ = _per_query(queries, keys, keys)
    dtype = _float_dtype(queries)
    # float16/bfloat16: the logits are formed in float32 (a float16 squared distance overflows
    # beyond 256, which made every weight of a row 0); only the weights are rounded back.
    compute = compute_dtype(dtype)
    queries, keys = queries.astype(compute), keys.astype(compute)
    w = _check_width(w, keys.shape).astype(compute)
    distances = (queries[..., None] - keys) * w.reshape((1,) * (keys.ndim - w.ndim) + w.shape)
    return masked_softmax(-(distances**2) / 2).astype(dtype)


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

    Example::

        >>> keys = jnp.array([0.0, 1.0, 2.0])
        >>> prediction, weights = nadaraya_watson(jnp.array([1.0]), keys, 2 * keys, w=2.0)
        >>> prediction.shape, weights.shape
        ((1,), (1, 3))
        >>> np.asarray(prediction).round(3)
        array([2.], dtype=float32)
    """
    queries, keys, values = _per_query(queries, keys, values)
    weights = nadaraya_watson_weights(queries, keys, w)
    return _pool(weights, values.astype(weights.dtype)), weights


def target_function(x):
    """The book's regression target ``f(x) = 2 sin(x) + x^0.8`` — d2l §11.2."""
    return 2 * jnp.sin(x) + x**0.8


def kernel_regression_data(rngs, n_train: int = 50, n_test: int = 50, noise: float = 0.5):
    """The book's synthetic data set — d2l §11.2.

    ``n_train`` sorted inputs drawn uniformly from ``[0, 5)`` with targets
    ``f(x) + N(0, noise^2)``, and ``n_test`` evenly spaced test inputs ``0, 0.1, ..., 4.9`` (for the
    default 50) with their noise-free targets.

    Args:
      rngs: a PRNG key; the same key always gives the same data.
      n_train: number of training points.
      n_test: number of test points, spread over ``[0, 5)``.
      noise: standard deviation of the target noise.

    Returns:
      A dict of float32 arrays: ``x_train (n_train,)``, ``y_train (n_train,)``,
      ``x_test (n_test,)``, ``y_truth (n_test,)``.
    """
    for name, value in (("n_train", n_train), ("n_test", n_test)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise ValueError(f"{name} must be an integer, got {value!r}")
    if n_train < 2 or n_test < 1:
        raise ValueError(f"need n_train >= 2 and n_test >= 1, got n_train={n_train}, n_test={n_test}")
    inputs_rng, noise_rng = jax.random.split(rngs)
    x_train = jnp.sort(jax.random.uniform(inputs_rng, (n_train,), dtype=jnp.float32) * 5)
    y_train = target_function(x_train) + noise * jax.random.normal(noise_rng, (n_train,), jnp.float32)
    x_test = jnp.arange(n_test, dtype=jnp.float32) * (5.0 / n_test)
    return {"x_train": x_train, "y_train": y_train, "x_test": x_test, "y_truth": target_function(x_test)}


# --------------------------------------------------------------------------- NNX module


class NWKernelRegression(nnx.Module):
    """Nadaraya–Watson regression with a learnable kernel width ``w`` — d2l §11.2.3.

    ``f(q) = sum_k softmax_k(-((q - k) * w)^2 / 2) v_k``; ``w`` is a scalar ``nnx.Param``
    initialised uniformly in ``[0, 1)`` as in the book. With ``sow_weights=True`` the weights
    ``(..., Q, K)`` are sown as ``nnx.Intermediate`` ``"attention_weights"`` (read them with
    ``nnx.capture(model, nnx.Intermediate)``).

    Args:
      sow_weights: sow the attention weights on every call.
      param_dtype: dtype of ``w``.
      rngs: ``nnx.Rngs`` with a ``params`` stream.

    Example::

        >>> model = NWKernelRegression(rngs=nnx.Rngs(0))
        >>> x = jnp.linspace(0.0, 1.0, 5)
        >>> model(x, x, jnp.sin(x)).shape                     # queries, keys, values
        (5,)
    """

    def __init__(self, *, sow_weights: bool = False, param_dtype=jnp.float32, rngs: nnx.Rngs):
        self.w = nnx.Param(jax.random.uniform(rngs.params(), (), param_dtype))
        self.sow_weights = sow_weights

    def __call__(self, queries, keys, values):
        """Predictions ``(..., Q[, v])``; see :func:`nadaraya_watson` for the shapes."""
        prediction, weights = nadaraya_watson(queries, keys, values, self.w[...])
        if self.sow_weights:
            self.sow(nnx.Intermediate, "attention_weights", weights)
        return prediction
