"""The one core of scaled dot-product attention — d2l §11.3.3, in JAX.

Scores ``scale * Q K^T`` → score modification (soft cap, bias, score mod) → learned sinks →
masked softmax → dropout → pooling, as one function, :func:`attention_core`, with one derivative
rule (a custom JVP: forward mode, and its transpose is the backward pass). Every dot-product path
calls it: :func:`jax_attention.nn.scoring.dot_product_attention` (``implementation="plain"``) and
its weights, the NNX module :class:`~jax_attention.nn.scoring.DotProductAttention` (dropout
included), multi-head attention, and the Transformer's attention in training and in evaluation
(:func:`jax_attention.nn.scoring.dropout_attention`). A variant is a mask or a score function
(:mod:`jax_attention.nn.mods`), never another path. The memory-efficient kernel
(:mod:`jax_attention.nn.efficient`) computes the same attention block by block, with the online
softmax and a recomputing backward pass: it cannot hold the core's ``T x S`` arrays.

Mirror of :mod:`reference_numpy.core` (same names, argument order and einsum strings). Not part
of the user-facing API (``__all__`` is empty): its inputs are those the public functions checked
and masked once; it checks nothing.

Shapes: queries ``(B, ..., T, d)``, keys ``(B, ..., S, d)``, values ``(B, ..., S, v)``;
grouped-query attention as :func:`jax_attention.nn.scoring` groups it — queries
``(B, ..., N_kv, G, T, d)``, keys and values ``(B, ..., N_kv, 1, S, .)`` (``groups = G``), the
results then with the same ``(N_kv, G)`` axes.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from jax_attention.nn import mods
from jax_attention.nn.masking import logsumexp_where, softmax_where
from jax_attention.nn.precision import compute_dtype, is_half

__all__: list[str] = []

# The same strings as in reference_numpy/core.py.
DOT_SCORES = "...tq,...sq->...ts"
WEIGHTED_SUM = "...ts,...sv->...tv"
#: The scores and the pooled values transposed, as the core's JVP forms two of its tangents.
KEY_SCORES = "...sq,...tq->...st"
POOLED_TRANSPOSED = "...sv,...ts->...vt"


def scaled(x, scale, d: int):
    """``x * scale``, or ``x / sqrt(d)`` for the default ``scale=None``."""
    return x * scale if scale is not None else x / math.sqrt(d)


def raw_scores(queries, keys, scale, transposed: bool = False):
    """``scale * Q K^T`` ``(B, ..., T, S)``, or with ``transposed`` ``scale * K Q^T``
    ``(B, ..., S, T)``, ``scale`` = ``1 / sqrt(d)`` by default.

    float32 and float64 scale the ``T x d`` queries rather than the ``T x S`` scores (faster on
    XLA:CPU: docs/implementation-notes.md; exact when ``sqrt(d)`` is a power of two, within one
    rounding otherwise). float16/bfloat16 form the scores in float32
    (:mod:`jax_attention.nn.precision`) and scale them there, adding no rounding to their dtype.
    Linear in each argument: the core's JVP forms its tangents with it."""
    d, half = queries.shape[-1], is_half(queries.dtype)
    if not half:
        queries = scaled(queries, scale, d)
    spec, a, b = (KEY_SCORES, keys, queries) if transposed else (DOT_SCORES, queries, keys)
    scores = jnp.einsum(spec, a, b, preferred_element_type=compute_dtype(a.dtype) if half else None)
    return scaled(scores, scale, d) if half else scores


def modified_scores(raw, bias, score_mods, sinks, groups: int):
    """``score_mod(softcap(raw) + bias)``, ``score_mods = (logit_softcap, score_mod)`` (either
    ``None``; their index grids those of the ungrouped heads), then with ``sinks`` one more
    column: each row's sink logit ``(..., T, S + 1)``."""
    cap, score_mod = score_mods
    grids = (None if cap is None and score_mod is None
             else mods.index_grids(raw.shape, groups=groups))
    scores = raw if cap is None else cap(raw, *grids)
    if bias is not None:  # checked at the boundary: the scores' rank, grouped as they are
        scores = scores + bias.astype(scores.dtype)
    if score_mod is not None:
        scores = score_mod(scores, *grids)
    if sinks is None:
        return scores
    heads = sinks.shape + (1, 1)  # (N, 1, 1) or (1, 1)
    if groups > 1 and sinks.ndim:
        heads = (sinks.shape[0] // groups, groups, 1, 1)
    column = jnp.broadcast_to(sinks.reshape(heads).astype(scores.dtype), scores.shape[:-1] + (1,))
    return jnp.concatenate([scores, column], axis=-1)


def _sink_key(values, *masks):
    """The values and masks with the sink's key appended: a zero value, attended, never dropped
    (``None`` masks stay ``None``)."""
    values = jnp.concatenate(
        [values, jnp.zeros(values.shape[:-2] + (1,) + values.shape[-1:], values.dtype)], -2)
    return (values,) + tuple(None if m is None else jnp.concatenate(
        [m, jnp.ones(m.shape[:-1] + (1,), bool)], axis=-1) for m in masks)


def _swap(x):
    """``x`` with its last two axes swapped, the array before the swap kept as it is (an
    optimization barrier: XLA would fold the transpose into the product that writes ``x``)."""
    return jnp.swapaxes(lax.optimization_barrier(x), -1, -2)


class _Static(NamedTuple):
    """The core's static arguments: query heads per key/value head, the scores' ``scale``
    (``None``: ``1 / sqrt(d)``), the dropout rate and whether the log-sum-exp is returned."""
    groups: int = 1
    scale: float | None = None
    rate: float = 0.0
    return_lse: bool = False


def _pooled(static: _Static, scores, keep, values, drop, sinks):
    """Masked softmax, dropout and pooling of the modified scores: ``(results, P, dropped,
    values)`` — ``results = (output, weights[, lse])`` as the core returns them, ``P`` the full
    weights in the scores' (compute) dtype, before their rounding to the values' dtype (the
    same array for float32 and float64), the dropped weights and the values, both with the
    sink's column and key."""
    if sinks is not None:
        values, keep, drop = _sink_key(values, keep, drop)
    P = softmax_where(scores, keep)
    weights = P.astype(values.dtype)
    dropped = weights if drop is None else jnp.where(  # as jax_attention.nn.dropout.dropout
        drop, weights / (1.0 - static.rate), jnp.zeros((), weights.dtype))
    results = (jnp.einsum(WEIGHTED_SUM, dropped, values),
               weights if sinks is None else weights[..., :-1])
    if static.return_lse:
        results += (logsumexp_where(scores, keep),)
    return results, P, dropped, values


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _core(static: _Static, queries, keys, values, keep, drop, bias, score_mods, sinks):
    """The one core of dot-product attention, on checked, masked (and grouped) inputs:
    scores ``scale * Q K^T`` → soft cap, bias, score mod (``score_mods``) → the sinks' column →
    masked softmax (``keep``) → dropout (``drop``, a boolean mask, at ``static.rate``) → pooling.
    Returns ``(output, weights[, lse])``, the weights before dropout.

    Its one derivative rule (:func:`_core_jvp`) serves forward and reverse mode."""
    raw = raw_scores(queries, keys, static.scale)
    scores = modified_scores(raw, bias, score_mods, sinks, static.groups)
    return _pooled(static, scores, keep, values, drop, sinks)[0]


@_core.defjvp
def _core_jvp(static: _Static, primals, tangents):
    """The core's JVP, written so that its transpose (the backward pass) is one pass over the
    ``T x S`` arrays and row-major products (faster on XLA:CPU's library GEMM:
    docs/implementation-notes.md).

    With ``P`` the weights, ``D`` the dropout and ``r = rowsum(P * dS)``: ``dW = P * dS - P r``
    and ``dO = D(dW) V + D(P) dV``; reverse mode then gets ``dS = P * (dP - rowsum(P * dP))``
    from the saved weights. Without dropout, in float32 and float64, ``dW V`` is written
    ``(P * dS) V - r O``, so that the transpose takes ``rowsum(P * dP)`` as ``rowsum(dO * O)``
    (FlashAttention), a pass over ``T x v`` arrays instead of ``T x S``; with dropout (the form
    the Transformer's pinned training losses were measured with) and for half-precision inputs
    (whose rounded output would break the identity by ``2^-8`` of its terms) ``D(dW) V``.

    The scores' tangent ``dQ K^T + Q dK^T`` is formed as ``dQ K^T + (dK Q^T)^T`` and the
    values' term as ``(dV^T D(P)^T)^T``, so that their transposes ``dS^T Q`` and
    ``(dO^T D(P))^T`` are products of row-major operands. The score mods and the sinks' column
    are differentiated by :func:`jax.jvp` of their own functions. Masked entries and fully
    masked rows have ``P = 0``, hence zero tangents."""
    queries, keys, values, keep, drop, bias, score_mods, sinks = primals
    d_queries, d_keys, d_values, _, _, d_bias, d_mods, d_sinks = tangents  # masks: float0
    scale = static.scale
    d_raw = (raw_scores(d_queries, keys, scale)
             + _swap(raw_scores(queries, d_keys, scale, transposed=True)))
    scores, d_scores = jax.jvp(
        functools.partial(modified_scores, groups=static.groups),
        (raw_scores(queries, keys, scale), bias, score_mods, sinks),
        (d_raw, d_bias, d_mods, d_sinks))
    results, P, dropped, values = _pooled(static, scores, keep, values, drop, sinks)
    if sinks is not None:
        d_values, _, drop = _sink_key(d_values, None, drop)
    # In P's dtype, float32 for half-precision inputs (their weights unrounded; float32 and
    # float64 cast nothing): the products' transposes, the gradients of the weights and of the
    # values, are float32 products too.
    dtype = P.dtype
    P_dS = P * d_scores.astype(dtype)
    r = jnp.sum(P_dS, axis=-1, keepdims=True)
    d_weights = P_dS - P * r
    if drop is None and dtype == values.dtype:  # O = P V exactly (no rounding of P to a half
        # dtype): dW V = (P * dS) V - r O, and reverse mode's rowsum(P * dP) is rowsum(dO * O).
        d_output = jnp.einsum(WEIGHTED_SUM, P_dS, values) - r * results[0]
    else:  # D(dW) V: with dropout the form the Transformer's pinned training was measured with
        d_dropped = d_weights if drop is None else jnp.where(
            drop, d_weights / (1.0 - static.rate), jnp.zeros((), dtype))
        d_output = jnp.einsum(WEIGHTED_SUM, d_dropped, values.astype(dtype))
    d_output = d_output + _swap(jnp.einsum(POOLED_TRANSPOSED, d_values.astype(dtype),
                                           dropped.astype(dtype)))
    d_weights = d_weights.astype(values.dtype)
    tangents = (d_output.astype(values.dtype),
                d_weights if sinks is None else d_weights[..., :-1])
    if static.return_lse:
        tangents += (r[..., 0],)
    return results, tangents


def attention_core(queries, keys, values, keep, *, bias=None, groups: int = 1,
                   variants: mods.Variants = mods.Variants(), drop=None, rate: float = 0.0,
                   return_lse: bool = False):
    """Scaled dot-product attention on checked, masked (and grouped) inputs — the one core.

    Args:
      queries ``(B, ..., T, d)``, keys ``(B, ..., S, d)``, values ``(B, ..., S, v)`` (grouped:
        see the module's docstring; ``groups`` the query heads per key/value head).
      keep: a boolean mask broadcastable to the scores (True = attend), or ``None``.
      bias: ``None`` or an array of the scores' rank (grouped as they are), added after the
        soft cap. variants: the checked scale, soft cap, score mod and sinks
        (:func:`jax_attention.nn.mods.check_variants`; its masks are in ``keep`` already).
      drop: ``None`` (no dropout) or a boolean mask of the weights' shape: inverted dropout at
        ``rate`` (a Python float) on the weights, as :func:`jax_attention.nn.dropout.dropout`.
      return_lse: also return each row's log-sum-exp (in the scores' compute dtype).

    Returns:
      ``(output (B, ..., T, v), weights (B, ..., T, S))``, the weights before dropout (in the
      values' dtype), and with ``return_lse`` the log-sum-exp ``(B, ..., T)``. A row that
      attends nothing gets zero weights and output, ``-inf`` log-sum-exp and zero tangents.
    """
    return _core(_Static(groups, variants.scale, rate, return_lse), queries, keys, values, keep,
                 drop, bias, (variants.logit_softcap, variants.score_mod), variants.sinks)
