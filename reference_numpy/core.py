"""The one core of scaled dot-product attention — d2l §11.3.3 (float64 NumPy reference).

Mirror of :mod:`jax_attention.nn.core` (same names, argument order and einsum strings): scores
``scale * Q K^T`` → score modification (soft cap, bias, score mod) → learned sinks → masked
softmax → dropout → pooling, one function, :func:`attention_core`, which
:func:`reference_numpy.scoring.dot_product_attention` and its weights call. Forward only: the
JAX twin's derivative rule has no NumPy counterpart (its gradients are tested against autodiff
and finite differences). Grouped key/value heads reach it repeated to the query heads
(:func:`reference_numpy.scoring.dot_product_attention`), so it has no ``groups``.

Not part of the user-facing API (``__all__`` is empty): its inputs are those the public
functions checked and masked once.
"""

from __future__ import annotations

import math

import numpy as np

from reference_numpy import mods
from reference_numpy.masking import masked_softmax

__all__: list[str] = []

# The same strings as in jax_attention/nn/core.py.
DOT_SCORES = "...tq,...sq->...ts"
WEIGHTED_SUM = "...ts,...sv->...tv"


def scores_dtype(dtype):
    """float32 for float16 inputs (as the JAX twin: their scores overflow beyond 65504 and round
    coarsely near 1e4), else ``dtype``; only the weights are rounded back to ``dtype``."""
    return np.float32 if np.finfo(dtype).bits < 32 else dtype


def raw_scores(queries, keys, scale):
    """``scale * Q K^T`` ``(B, ..., T, S)`` in the scores' dtype, ``scale`` = ``1 / sqrt(d)``
    by default."""
    compute = scores_dtype(queries.dtype)
    scores = np.einsum(DOT_SCORES, queries.astype(compute), keys.astype(compute))
    return scores / math.sqrt(queries.shape[-1]) if scale is None else scores * scale


def modified_scores(raw, bias, score_mods, sinks):
    """``score_mod(softcap(raw) + bias)``, ``score_mods = (logit_softcap, score_mod)`` (either
    ``None``), evaluated on the whole grid (:func:`reference_numpy.mods.index_grids`); then with
    ``sinks`` one more column: each row's sink logit (per query head, axis -3)
    ``(..., T, S + 1)``."""
    cap, score_mod = score_mods
    grids = mods.index_grids(raw.shape)
    scores = raw if cap is None else cap(raw, *grids)
    if bias is not None:  # checked at the boundary: the scores' rank
        scores = scores + bias.astype(scores.dtype)
    if score_mod is not None:
        scores = score_mod(scores, *grids)
    if sinks is None:
        return scores
    column = sinks.astype(scores.dtype).reshape(sinks.shape + (1, 1))  # (N, 1, 1) or (1, 1)
    return np.concatenate([scores, np.broadcast_to(column, scores.shape[:-1] + (1,))], axis=-1)


def logsumexp_where(scores, keep):
    """``log sum_s exp(scores)`` over the kept keys, ``(B, ..., T)``; ``-inf`` for a row that
    keeps nothing."""
    keep = np.ones(scores.shape, bool) if keep is None else np.broadcast_to(keep, scores.shape)
    logits = np.where(keep, scores, -np.inf)
    shift = logits.max(axis=-1, keepdims=True, initial=-np.inf)
    shift = np.where(np.isfinite(shift), shift, 0)
    total = np.where(keep, np.exp(logits - shift), 0).sum(axis=-1)
    with np.errstate(divide="ignore"):
        return np.where(total > 0, shift[..., 0] + np.log(total), -np.inf).astype(scores.dtype)


def attention_core(queries, keys, values, keep, *, bias=None,
                   variants: mods.Variants = mods.Variants(), drop=None, rate: float = 0.0,
                   return_lse: bool = False):
    """Scaled dot-product attention on checked, masked inputs — the one core.

    Args:
      queries ``(B, ..., T, d)``, keys ``(B, ..., S, d)``, values ``(B, ..., S, v)``.
      keep: a boolean mask broadcastable to the scores (True = attend), or ``None``.
      bias: ``None`` or an array of the scores' rank, added after the soft cap. variants: the
        checked scale, soft cap, score mod and sinks (its masks are in ``keep`` already).
      drop: ``None`` or a boolean mask of the weights' shape: inverted dropout at ``rate``.
      return_lse: also return each row's log-sum-exp (in the scores' dtype).

    Returns:
      ``(output (B, ..., T, v), weights (B, ..., T, S))``, the weights before dropout (in the
      queries' dtype), and with ``return_lse`` the log-sum-exp ``(B, ..., T)``; a row that
      attends nothing gets zero weights and output and ``-inf``.
    """
    scores = modified_scores(raw_scores(queries, keys, variants.scale), bias,
                             (variants.logit_softcap, variants.score_mod), variants.sinks)
    if variants.sinks is not None:  # the sink: a key always attended, of zero value
        keep = None if keep is None else np.concatenate(
            [keep, np.ones(keep.shape[:-1] + (1,), bool)], axis=-1)
    weights = masked_softmax(scores, mask=keep)
    if variants.sinks is not None:
        weights = weights[..., :-1]
    weights = weights.astype(queries.dtype)
    dropped = weights if drop is None else np.where(drop, weights / (1.0 - rate), 0)
    results = (np.einsum(WEIGHTED_SUM, dropped, values), weights)
    return results + (logsumexp_where(scores, keep),) if return_lse else results
