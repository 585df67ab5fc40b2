"""Attention scoring functions — d2l §11.3 (float64 NumPy reference).

Mirror of :mod:`jax_attention.nn.scoring` (same names, argument order and einsum strings).
Shape letters: ``B`` batch, ``T`` queries, ``S`` keys/values, ``...`` extra batch axes (heads),
``q``/``k``/``v`` the query, key and value sizes, ``h`` the additive hidden size.

``is_causal`` must be a Python bool (``TypeError`` otherwise); additive attention's ``params`` must
hold exactly ``W_q, W_k, w_v`` (``ValueError`` naming a missing or unexpected key).
"""

from __future__ import annotations


import numpy as np

from reference_numpy import mods
from reference_numpy.core import WEIGHTED_SUM, attention_core, scores_dtype
from reference_numpy._checks import (
    check_attention_inputs,
    check_implementation,
    check_param_keys,
    check_param_shapes,
    check_static_bool,
    check_unbatched,
    is_integer_dtype,
    num_kv_groups,
)
from reference_numpy.masking import attention_mask, combine_masks, masked_softmax

__all__ = [
    "dot_product_attention_weights",
    "dot_product_attention",
    "additive_attention_weights",
    "additive_attention",
]

# The same strings as in jax_attention/nn/scoring.py, so the two files can be read side by side.
PROJECT_QUERIES = "...tq,qh->...th"
PROJECT_KEYS = "...sk,kh->...sh"
ADDITIVE_SCORES = "...tsh,ho->...tso"


def _prepare(queries, keys, values, valid_lens, mask, is_causal, *, same_depth: bool,
             local_window_size=None, mask_mod=None):
    """Checks the inputs, builds the attention mask once and zeroes what nothing attends.

    Returns ``(keep, arrays)``: the boolean mask broadcastable to ``(B, ..., T, S)`` (or ``None``)
    and the checked ``[queries, keys(, values)]`` in which the queries that attend no key and the
    keys and values that no query attends are zero. Their weights are exactly zero already, but
    ``0 * NaN`` and ``0 * Inf`` are NaN: NaN or Inf stored in padding would otherwise reach valid
    outputs through the weighted sum, and valid gradients through the backward pass of the score
    einsum (and, in additive attention, through ``tanh'`` of a NaN feature).

    Grouped-query keys and values (``(B, ..., N_kv, S, d)`` for queries ``(B, ..., N, T, d)``)
    are repeated here to ``N`` heads, ``G = N / N_kv`` consecutive query heads per key/value
    head: the definition, written plainly (the JAX twin contracts each key/value head with its
    group instead of repeating it). A ``mask_mod`` is evaluated on the whole ``(B, ..., N, T, S)``
    grid (:func:`reference_numpy.mods.mask_from_mod`) and ANDed with the other masks.
    """
    arrays = check_attention_inputs(queries, keys, values, same_depth=same_depth,
                                    grouped_heads=same_depth)
    groups = num_kv_groups(arrays[0].shape, arrays[1].shape)
    if groups > 1:
        arrays = [arrays[0]] + [np.repeat(a, groups, axis=-3) for a in arrays[1:]]
    queries, keys = arrays[0], arrays[1]
    shape = queries.shape[:-1] + keys.shape[-2:-1]
    keep = attention_mask(shape, valid_lens, mask=mask, is_causal=is_causal,
                          local_window_size=local_window_size)
    if mask_mod is not None:
        keep = combine_masks(keep, mods.mask_from_mod(mask_mod, shape))
    if keep is None:
        return keep, arrays
    query_attends = np.any(keep, axis=-1, keepdims=True)  # (B, ..., T, 1)
    key_attended = np.swapaxes(np.any(keep, axis=-2, keepdims=True), -1, -2)  # (B, ..., S, 1)
    zero = np.zeros((), queries.dtype)
    arrays = [np.where(query_attends, arrays[0], zero)] + [
        np.where(key_attended, a, zero) for a in arrays[1:]
    ]
    return keep, arrays


def _checked_bias(bias, shape):
    """The ``bias`` of the public functions, checked once: ``None``, or an array broadcastable
    to the scores' ``shape`` ``(B, ..., T, S)``, returned at their rank (what the core adds)."""
    if bias is None:
        return None
    bias = np.asarray(bias)
    if not (np.issubdtype(bias.dtype, np.floating) or is_integer_dtype(bias.dtype)):
        # A boolean here is most likely a mask passed as a bias; it would add 0 or 1 to the scores.
        raise TypeError(f"bias must hold real numbers added to the scores (a boolean mask goes in "
                        f"mask=), got dtype {bias.dtype} with shape {bias.shape}")
    try:
        if np.broadcast_shapes(bias.shape, shape) != shape:
            raise ValueError
    except ValueError:
        raise ValueError(
            f"bias must broadcast to the scores' shape (B, ..., T, S) = {shape}, "
            f"got shape {bias.shape}"
        ) from None
    return bias.reshape((1,) * (len(shape) - bias.ndim) + bias.shape)


def _check_return_lse(return_lse, return_residual) -> bool:
    return_lse = check_static_bool("return_lse", return_lse)
    if return_residual is not None:
        return_lse = return_lse or check_static_bool("return_residual", return_residual)
    return return_lse


def dot_product_attention_weights(queries, keys, valid_lens=None, *, mask=None, is_causal=False,
                                  bias=None, scale=None, local_window_size=None,
                                  logit_softcap=None, mask_mod=None, score_mod=None, sinks=None):
    """Scaled dot-product attention weights ``masked_softmax(Q K^T / sqrt(d) + bias)`` — d2l §11.3.3.

    Args:
      queries: ``(B, ..., T, d)``, or unbatched ``(T, d)``.
      keys: ``(B, ..., S, d)``, or ``(B, ..., N_kv, S, d)`` for queries ``(B, ..., N, T, d)``
        with ``N_kv`` dividing ``N`` (grouped-query attention); unbatched ``(S, d)``.
      valid_lens, mask, is_causal, bias, scale: as in :func:`dot_product_attention`.
      local_window_size, logit_softcap, mask_mod, score_mod, sinks: as there too.

    Returns:
      Weights ``(B, ..., T, S)`` (unbatched: ``(T, S)``); fully masked rows are zero (with
      ``sinks``, each row sums to less than 1: the sink takes the rest).
    """
    unbatched, queries, keys, _, valid_lens = check_unbatched(queries, keys, None, valid_lens)
    variants = mods.check_variants(np.shape(queries)[:-1] + np.shape(keys)[-2:-1], scale,
                                   local_window_size, logit_softcap,
                                   mask_mod, score_mod, sinks)
    keep, (queries, keys) = _prepare(queries, keys, None, valid_lens, mask, is_causal,
                                     same_depth=True, local_window_size=variants.local_window_size,
                                     mask_mod=variants.mask_mod)
    bias = _checked_bias(bias, queries.shape[:-1] + keys.shape[-2:-1])
    values = np.zeros(keys.shape[:-1] + (0,), queries.dtype)  # the weights alone
    weights = attention_core(queries, keys, values, keep, bias=bias, variants=variants)[1]
    return weights[0] if unbatched else weights


def dot_product_attention(queries, keys, values, valid_lens=None, *, mask=None, is_causal=False,
                          bias=None, scale=None, local_window_size=None, logit_softcap=None,
                          implementation=None, mask_mod=None, score_mod=None, sinks=None,
                          return_lse=False, return_residual=None):
    """Scaled dot-product attention — d2l §11.3.3.

    ``softmax(score_mod(softcap(scale * Q K^T) + bias)) V`` with masking (see
    :mod:`reference_numpy.masking`); ``scale = 1 / sqrt(d)``, no soft-capping and no mods by
    default.

    Args:
      queries: ``(B, ..., T, d)``, or unbatched ``(T, d)``.
      keys: ``(B, ..., S, d)``; grouped-query attention: ``(B, ..., N_kv, S, d)`` for queries
        ``(B, ..., N, T, d)`` with ``N_kv`` dividing ``N``, query head ``n`` attending key/value
        head ``n // (N / N_kv)``; unbatched ``(S, d)``.
      values: ``(B, ..., S, v)``, with the keys' heads; unbatched ``(S, v)``.
      valid_lens: ``None``, ``(B,)`` or ``(B, T)`` (unbatched: ``()`` or ``(T,)``).
      mask: boolean, broadcastable to ``(B, ..., T, S)``; True = attend.
      is_causal: also apply a causal mask ``(T, S)``.
      bias: added to the scores, broadcastable to ``(B, ..., T, S)``.
      scale: the factor of the dot products; ``None``: ``1 / sqrt(d)``.
      local_window_size: ``(left, right)`` or ``w`` = ``(w, w)``: query ``t`` attends only keys
        ``t - left <= s <= t + right`` (:func:`~reference_numpy.masking.local_window_mask`).
      logit_softcap: ``c > 0``: the scaled dot products become ``c * tanh(s / c)`` before the
        bias and the masks; ``None``: no capping.
      implementation: ``None``, ``"plain"`` or ``"chunked"``, checked and otherwise ignored: the
        reference has one path (the whole ``T x S`` scores), against which both of
        :func:`jax_attention.nn.scoring.dot_product_attention`'s are tested.
      mask_mod: ``(b, h, q_idx, kv_idx) -> bool`` (:mod:`reference_numpy.mods`), evaluated on
        the grid of the scores ``(B, ..., N, T, S)`` (``h`` the query head) and ANDed with the
        masks above.
      score_mod: ``(score, b, h, q_idx, kv_idx) -> score``, applied after the soft cap and the
        bias.
      sinks: float ``(N,)`` (one per query head) or ``()``: every row's softmax gets one more
        key, of logit ``sink`` and zero value; the weights then sum to less than 1.
      return_lse: also return the log-sum-exp of each row's scores over its attended keys (and
        the sink), ``(B, ..., N, T)``; ``-inf`` for a row that attends nothing.
        ``return_residual``: ``jax.nn``'s name for it.

    Returns:
      ``(output (B, ..., T, v), weights (B, ..., T, S))`` (unbatched: ``(T, v)``, ``(T, S)``);
      fully masked rows give zero output. With ``return_lse``: ``(output, weights, lse)``.
    """
    check_implementation(implementation)
    return_lse = _check_return_lse(return_lse, return_residual)
    unbatched, queries, keys, values, valid_lens = check_unbatched(queries, keys, values, valid_lens)
    variants = mods.check_variants(np.shape(queries)[:-1] + np.shape(keys)[-2:-1], scale,
                                   local_window_size, logit_softcap,
                                   mask_mod, score_mod, sinks)
    keep, (queries, keys, values) = _prepare(queries, keys, values, valid_lens, mask, is_causal,
                                             same_depth=True,
                                             local_window_size=variants.local_window_size,
                                             mask_mod=variants.mask_mod)
    bias = _checked_bias(bias, queries.shape[:-1] + keys.shape[-2:-1])
    results = attention_core(queries, keys, values, keep, bias=bias, variants=variants,
                             return_lse=return_lse)
    return tuple(r[0] for r in results) if unbatched else results


#: The keys of additive attention's parameter dict.
ADDITIVE_KEYS = ("W_q", "W_k", "w_v")


def _check_additive_params(params, queries, keys):
    check_param_keys("params", params, ADDITIVE_KEYS)
    W_q, W_k, w_v = (np.asarray(params[name]) for name in ADDITIVE_KEYS)
    h = W_q.shape[-1] if W_q.ndim == 2 else "h"
    check_param_shapes("params", params, {"W_q": (queries.shape[-1], h),
                                          "W_k": (keys.shape[-1], h), "w_v": (h, 1)},
                       f" (q = query size, k = key size, h = hidden size; queries "
                       f"{queries.shape}, keys {keys.shape})")
    return W_q, W_k, w_v


def _additive_weights(params, queries, keys, keep):
    W_q, W_k, w_v = _check_additive_params(params, queries, keys)
    projected_queries = np.einsum(PROJECT_QUERIES, queries, W_q)
    projected_keys = np.einsum(PROJECT_KEYS, keys, W_k)
    # Every query meets every key: (B, ..., T, 1, h) + (B, ..., 1, S, h) -> (B, ..., T, S, h).
    pre_activations = projected_queries[..., :, None, :] + projected_keys[..., None, :, :]
    # float16: features and scores in float32, as in the JAX twin (w_v-weighted sums of features
    # in [-1, 1] can overflow float16).
    compute = scores_dtype(pre_activations.dtype)
    features = np.tanh(pre_activations.astype(compute))
    scores = np.einsum(ADDITIVE_SCORES, features, w_v.astype(compute))[..., 0]
    return masked_softmax(scores, mask=keep).astype(pre_activations.dtype)


def additive_attention_weights(params, queries, keys, valid_lens=None, *, mask=None, is_causal=False):
    """Additive attention weights ``masked_softmax(w_v^T tanh(W_q q + W_k k))`` — d2l §11.3.2.

    Args:
      params: ``{"W_q": (q, h), "W_k": (k, h), "w_v": (h, 1)}`` (dense kernels stored ``(in, out)``).
      queries: ``(B, ..., T, q)``.
      keys: ``(B, ..., S, k)``.
      valid_lens: ``None``, ``(B,)`` or ``(B, T)``.
      mask: boolean, broadcastable to ``(B, ..., T, S)``; True = attend.
      is_causal: also apply a causal mask ``(T, S)``.

    Returns:
      Weights ``(B, ..., T, S)``; fully masked rows are zero.
    """
    keep, (queries, keys) = _prepare(queries, keys, None, valid_lens, mask, is_causal, same_depth=False)
    return _additive_weights(params, queries, keys, keep)


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
    keep, (queries, keys, values) = _prepare(queries, keys, values, valid_lens, mask, is_causal,
                                             same_depth=False)
    weights = _additive_weights(params, queries, keys, keep)
    return np.einsum(WEIGHTED_SUM, weights, values), weights
