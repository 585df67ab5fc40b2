"""Attention scoring functions — d2l §11.3 (float64 NumPy reference).

Mirror of :mod:`jax_attention.scoring` (same names, argument order and einsum strings).
Shape letters: ``B`` batch, ``T`` queries, ``S`` keys/values, ``...`` extra batch axes (heads),
``q``/``k``/``v`` the query, key and value sizes, ``h`` the additive hidden size.
"""

from __future__ import annotations

import math

import numpy as np

from reference_numpy.masking import attention_mask, masked_softmax

__all__ = [
    "dot_product_attention_weights",
    "dot_product_attention",
    "additive_attention_weights",
    "additive_attention",
]

# The same strings as in jax_attention/scoring.py, so the two files can be read side by side.
DOT_SCORES = "...tq,...sq->...ts"
WEIGHTED_SUM = "...ts,...sv->...tv"
PROJECT_QUERIES = "...tq,qh->...th"
PROJECT_KEYS = "...sk,kh->...sh"
ADDITIVE_SCORES = "...tsh,ho->...tso"


def _check_inputs(queries, keys, values=None, *, same_depth: bool):
    """Shape and dtype checks shared by both scoring functions; returns float arrays."""
    arrays = {"queries": queries, "keys": keys}
    if values is not None:
        arrays["values"] = values
    arrays = {name: np.asarray(a) for name, a in arrays.items()}
    for name, a in arrays.items():
        if a.ndim < 3:
            raise ValueError(f"{name} must have shape (B, ..., len, size), got {a.shape}")
        if not (np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.integer)):
            raise TypeError(f"{name} must be numeric, got dtype {a.dtype} with shape {a.shape}")
    q, k = arrays["queries"], arrays["keys"]
    if k.ndim != q.ndim or k.shape[:-2] != q.shape[:-2]:
        raise ValueError(
            f"queries (B, ..., T, q) and keys (B, ..., S, k) must share their batch axes, "
            f"got queries {q.shape} and keys {k.shape}"
        )
    if same_depth and q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"queries and keys must have the same size for dot-product scores, got queries "
            f"{q.shape} (size {q.shape[-1]}) and keys {k.shape} (size {k.shape[-1]})"
        )
    if values is not None:
        v = arrays["values"]
        if v.ndim != k.ndim or v.shape[:-1] != k.shape[:-1]:
            raise ValueError(
                f"keys (B, ..., S, k) and values (B, ..., S, v) must have the same batch axes and "
                f"length S, got keys {k.shape} and values {v.shape}"
            )
    return [a if np.issubdtype(a.dtype, np.floating) else a.astype(np.float64) for a in arrays.values()]


def dot_product_attention_weights(queries, keys, valid_lens=None, *, mask=None, is_causal=False):
    """Scaled dot-product attention weights ``masked_softmax(Q K^T / sqrt(d))`` — d2l §11.3.3.

    Args:
      queries: ``(B, ..., T, d)``.
      keys: ``(B, ..., S, d)``.
      valid_lens: ``None``, ``(B,)`` or ``(B, T)``: the number of keys each query may attend.
      mask: boolean, broadcastable to ``(B, ..., T, S)``; True = attend.
      is_causal: also apply :func:`~reference_numpy.masking.causal_mask` ``(T, S)``.

    Returns:
      Weights ``(B, ..., T, S)``; fully masked rows are zero.
    """
    queries, keys = _check_inputs(queries, keys, same_depth=True)
    scores = np.einsum(DOT_SCORES, queries, keys) / math.sqrt(queries.shape[-1])
    keep = attention_mask(scores.shape, valid_lens, mask=mask, is_causal=is_causal)
    return masked_softmax(scores, mask=keep)


def dot_product_attention(queries, keys, values, valid_lens=None, *, mask=None, is_causal=False):
    """Scaled dot-product attention — d2l §11.3.3.

    ``softmax(Q K^T / sqrt(d)) V`` with masking (see :mod:`reference_numpy.masking`).

    Args:
      queries: ``(B, ..., T, d)``.
      keys: ``(B, ..., S, d)``.
      values: ``(B, ..., S, v)``.
      valid_lens: ``None``, ``(B,)`` or ``(B, T)``.
      mask: boolean, broadcastable to ``(B, ..., T, S)``; True = attend.
      is_causal: also apply a causal mask ``(T, S)``.

    Returns:
      ``(output (B, ..., T, v), weights (B, ..., T, S))``; fully masked rows give zero output.
    """
    queries, keys, values = _check_inputs(queries, keys, values, same_depth=True)
    weights = dot_product_attention_weights(queries, keys, valid_lens, mask=mask, is_causal=is_causal)
    return np.einsum(WEIGHTED_SUM, weights, values), weights


def _check_additive_params(params, queries, keys):
    try:
        W_q, W_k, w_v = (np.asarray(params[name]) for name in ("W_q", "W_k", "w_v"))
    except (KeyError, TypeError):
        raise ValueError(
            f"params must be a mapping with 'W_q', 'W_k' and 'w_v', got {type(params).__name__} "
            f"with {sorted(params) if hasattr(params, 'keys') else params!r}"
        ) from None
    h = W_q.shape[-1] if W_q.ndim == 2 else None
    expected = {"W_q": (queries.shape[-1], h), "W_k": (keys.shape[-1], h), "w_v": (h, 1)}
    for name, array in (("W_q", W_q), ("W_k", W_k), ("w_v", w_v)):
        if array.shape != expected[name]:
            raise ValueError(
                f"params[{name!r}] must have shape {expected[name]} (q = query size, k = key size, "
                f"h = hidden size), got {array.shape}"
            )
    return W_q, W_k, w_v


def additive_attention_weights(params, queries, keys, valid_lens=None, *, mask=None, is_causal=False):
    """Additive attention weights ``masked_softmax(w_v^T tanh(W_q q + W_k k))`` — d2l §11.3.2.

    Args:
      params: ``{"W_q": (q, h), "W_k": (k, h), "w_v": (h, 1)}``.
      queries: ``(B, ..., T, q)``.
      keys: ``(B, ..., S, k)``.
      valid_lens: ``None``, ``(B,)`` or ``(B, T)``.
      mask: boolean, broadcastable to ``(B, ..., T, S)``; True = attend.
      is_causal: also apply a causal mask ``(T, S)``.

    Returns:
      Weights ``(B, ..., T, S)``; fully masked rows are zero.
    """
    queries, keys = _check_inputs(queries, keys, same_depth=False)
    W_q, W_k, w_v = _check_additive_params(params, queries, keys)
    projected_queries = np.einsum(PROJECT_QUERIES, queries, W_q)
    projected_keys = np.einsum(PROJECT_KEYS, keys, W_k)
    # Every query meets every key: (B, ..., T, 1, h) + (B, ..., 1, S, h) -> (B, ..., T, S, h).
    features = np.tanh(projected_queries[..., :, None, :] + projected_keys[..., None, :, :])
    scores = np.einsum(ADDITIVE_SCORES, features, w_v)[..., 0]
    keep = attention_mask(scores.shape, valid_lens, mask=mask, is_causal=is_causal)
    return masked_softmax(scores, mask=keep)


def additive_attention(params, queries, keys, values, valid_lens=None, *, mask=None, is_causal=False):
    """Additive attention — d2l §11.3.2; queries and keys may have different sizes.

    Args:
      params: ``{"W_q": (q, h), "W_k": (k, h), "w_v": (h, 1)}``.
      queries: ``(B, ..., T, q)``.
      keys: ``(B, ..., S, k)``.
      values: ``(B, ..., S, v)``.
      valid_lens: ``None``, ``(B,)`` or ``(B, T)``.
      mask: boolean, broadcastable to ``(B, ..., T, S)``; True = attend.
      is_causal: also apply a causal mask ``(T, S)``.

    Returns:
      ``(output (B, ..., T, v), weights (B, ..., T, S))``; fully masked rows give zero output.
    """
    queries, keys, values = _check_inputs(queries, keys, values, same_depth=False)
    weights = additive_attention_weights(params, queries, keys, valid_lens, mask=mask, is_causal=is_causal)
    return np.einsum(WEIGHTED_SUM, weights, values), weights
