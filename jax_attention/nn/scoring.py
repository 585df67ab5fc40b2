"""Attention scoring functions — d2l §11.3, in JAX: pure functions first, NNX modules below.

Mirror of :mod:`reference_numpy.scoring` (same names, argument order and einsum strings).
Shape letters: ``B`` batch, ``T`` queries, ``S`` keys/values, ``...`` extra batch axes (heads),
``q``/``k``/``v`` the query, key and value sizes, ``h`` the additive hidden size.

Masking follows :mod:`jax_attention.nn.masking`: ``valid_lens`` (``(B,)`` or ``(B, T)``), a boolean
``mask`` (True = attend) and ``is_causal`` combine; a fully masked query row gets zero weights and a
zero output, with finite gradients. ``is_causal`` must be a Python bool (``TypeError`` for a string,
an int, an array or a traced value). Additive attention's ``params`` must hold exactly
``W_q, W_k, w_v`` (``ValueError`` naming a missing or unexpected key).

Precision: queries, keys and values must share one float dtype, which is the dtype of the
computation and of the results; float16/bfloat16 scores are accumulated in float32 and normalised
there (so that ``q . k`` beyond float16's 65504 stays finite and large logits keep their
differences), and only the weights are rounded to the inputs' dtype. Additive attention casts its
parameters to that dtype.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jax_attention.nn import efficient, mods
from jax_attention.nn.core import WEIGHTED_SUM, attention_core
from jax_attention.nn.dropout import keep_mask
from jax_attention._checks import (
    as_array_like,
    check_attention_inputs,
    check_dropout,
    check_implementation,
    check_param_keys,
    check_param_shapes,
    check_size,
    check_static_bool,
    check_unbatched,
    is_integer_dtype,
    num_kv_groups,
)
from jax_attention.nn.masking import (
    attention_mask,
    group_heads,
    softmax_where,
    ungroup_heads,
    zero_unattended,
)
from jax_attention.nn.precision import compute_dtype, is_half

__all__ = [
    "dot_product_attention_weights",
    "dot_product_attention",
    "additive_attention_weights",
    "additive_attention",
    "DotProductAttention",
    "AdditiveAttention",
]

# The same strings as in reference_numpy/scoring.py, so the two files can be read side by side.
PROJECT_QUERIES = "...tq,qh->...th"
PROJECT_KEYS = "...sk,kh->...sh"
ADDITIVE_SCORES = "...tsh,ho->...tso"


def _prepare(queries, keys, values, valid_lens, mask, is_causal, *, same_depth: bool,
             local_window_size=None, mask_mod=None):
    """Checks the inputs (:func:`~jax_attention._checks.check_attention_inputs`), then
    :func:`_masked`: the one check and the one mask of every public function of this module."""
    arrays = check_attention_inputs(queries, keys, values, same_depth=same_depth,
                                    grouped_heads=same_depth)
    return _masked(arrays, valid_lens, mask, is_causal, local_window_size, mask_mod)


def _masked(arrays, valid_lens, mask, is_causal, local_window_size=None, mask_mod=None):
    """Builds the attention mask of the checked ``[queries, keys(, values)]`` once and zeroes
    what nothing attends.

    Returns ``(keep, arrays, groups)``: the boolean mask broadcastable to the scores (or
    ``None``), ``arrays`` in which the queries that attend no key
    and the keys and values that no query attends are zero
    (:func:`~jax_attention.nn.masking.zero_unattended`; in additive attention this also keeps a
    NaN feature's ``tanh'`` away), and ``groups``, the query heads per key/value head.

    With ``groups == 1`` the scores are ``(B, ..., T, S)``. Grouped-query keys and values
    (``(B, ..., N_kv, S, d)`` for queries ``(B, ..., N, T, d)``, ``groups = N / N_kv > 1``) come
    back as ``(B, ..., N_kv, 1, S, d)``, the queries as ``(B, ..., N_kv, G, T, d)`` and the
    mask as ``(B, ..., N_kv | 1, G | 1, T, S)`` (:func:`~jax_attention.nn.masking.group_heads`):
    ``jnp.einsum`` then contracts each key/value head with its ``G`` query heads without
    repeating it (a size-1 axis is squeezed, not broadcast), and its transpose sums the key and
    value gradients over the group.
    """
    queries, keys = arrays[0], arrays[1]
    shape = queries.shape[:-1] + keys.shape[-2:-1]
    keep = attention_mask(shape, valid_lens, mask=mask, is_causal=is_causal,
                          local_window_size=local_window_size)
    if mask_mod is not None:  # the mod's own mask, ANDed: (B, ..., N, T, S) before any grouping
        mod_keep = mods.mask_from_mod(mask_mod, shape)  # the scores' rank, as attention_mask's
        keep = mod_keep if keep is None else keep & mod_keep
    groups = num_kv_groups(queries.shape, keys.shape)
    if groups > 1:
        arrays = [group_heads(arrays[0], groups)] + [a[..., None, :, :] for a in arrays[1:]]
        keep = None if keep is None else group_heads(keep, groups)
    if keep is None:
        return keep, arrays, groups
    arrays = list(zero_unattended(keep, *arrays, heads="grouped" if groups > 1 else "own"))
    return keep, arrays, groups


def _checked_bias(bias, shape, groups: int = 1):
    """The ``bias`` of the public functions, checked once: ``None``, or an array broadcastable
    to the (ungrouped) scores' ``shape`` ``(B, ..., N, T, S)``, returned at their rank and, with
    ``groups > 1``, split as the grouped scores are — what the core adds."""
    if bias is None:
        return None
    bias = jnp.asarray(as_array_like(bias))
    if not (jnp.issubdtype(bias.dtype, jnp.floating) or is_integer_dtype(bias.dtype)):
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
    # Explicit rank (strict promotion holds; the core casts it to the scores' dtype).
    bias = bias.reshape((1,) * (len(shape) - bias.ndim) + bias.shape)
    return group_heads(bias, groups) if groups > 1 else bias


def _ungrouped_shape(shape):
    """``(..., N_kv, G, T, S) -> (..., N_kv * G, T, S)``, the shape :func:`ungroup_heads` gives."""
    return shape[:-4] + (shape[-4] * shape[-3],) + shape[-2:]


def _plain_attention(q, k, v, keep, bias, groups, variants: mods.Variants, return_lse: bool,
                     drop=None, rate: float = 0.0):
    """The plain path on checked, masked (and grouped) inputs and a checked ``bias``
    (:func:`_checked_bias`): :func:`~jax_attention.nn.core.attention_core`, with dropout when
    ``drop`` (the boolean keep mask of the ungrouped weights) is given: ``(output, weights[,
    lse])`` with the query heads ungrouped. ``v=None``: the weights alone, through the same
    core (values of width 0)."""
    if v is None:
        v = jnp.zeros(k.shape[:-1] + (0,), q.dtype)
    if drop is not None and groups > 1:
        drop = group_heads(drop, groups)
    results = attention_core(q, k, v, keep, bias=bias, groups=groups, variants=variants,
                             drop=drop, rate=rate, return_lse=return_lse)
    if not return_lse:
        return _ungrouped(groups, *results)
    lse, = _ungrouped(groups, results[2][..., None])
    return _ungrouped(groups, *results[:2]) + (lse[..., 0],)


def weighted_sum(weights, values):
    """``weights (B, ..., N, T, S) @ values (B, ..., N_kv, S, v) -> (B, ..., N, T, v)``, with
    ``N_kv`` dividing ``N`` (grouped-query attention: each value head serves its ``N / N_kv``
    query heads, never repeated; ``N_kv = N`` is the plain :data:`WEIGHTED_SUM`). Not part of
    the user-facing API (``__all__``): the Bahdanau decoder pools its context with it
    (``(B, T, S)``, no head axis)."""
    if weights.ndim < 4 or weights.shape[-3] == values.shape[-3]:  # (B, T, S): no head axis
        return jnp.einsum(WEIGHTED_SUM, weights, values)
    groups = weights.shape[-3] // values.shape[-3]
    return ungroup_heads(jnp.einsum(WEIGHTED_SUM, group_heads(weights, groups),
                                    values[..., None, :, :]))


def dropout_attention(queries, keys, values, keep, rate: float, dropout_rng, padded_shape=None):
    """Scaled dot-product attention with inverted dropout on its weights, as the Transformer
    trains it (d2l §11.5): ``(dropout(W) @ V, W)`` with ``W = masked_softmax(Q K^T / sqrt(d))``
    — the core with a dropout mask, forward and reverse mode.

    Not part of the user-facing API (``__all__``): :func:`jax_attention.models.transformer_layers.attend`
    calls it for every attention of the Transformer. Its values are those of
    :func:`dot_product_attention_weights`, :func:`jax_attention.nn.dropout.dropout` and
    :func:`weighted_sum`, bit for bit.

    Args:
      queries: ``(B, ..., N, T, d)``. keys: ``(B, ..., N_kv, S, d)``, ``N_kv`` dividing ``N``
        (grouped-query attention). values: ``(B, ..., N_kv, S, v)``.
      keep: a boolean mask broadcastable to ``(B, ..., N, T, S)`` (True = attend), or ``None``.
        Queries that attend no key get zero weights and outputs.
      rate: the dropout rate, ``0 <= rate < 1`` (a Python float). dropout_rng: its key, or
        ``None``: no dropout (evaluation).
      padded_shape: ``None``, or the weights' shape ``(B, ..., T', S')`` in the batch this one
        was cut from: the dropout mask is that batch's (:func:`jax_attention.nn.dropout.keep_mask`).

    Returns:
      ``(output (B, ..., N, T, v), weights (B, ..., N, T, S))``, the weights before dropout.
    """
    groups = num_kv_groups(queries.shape, keys.shape)
    if groups is None:
        raise ValueError(f"queries (B, ..., N, T, d) and keys (B, ..., N_kv, S, d) must have "
                         f"the same leading axes, N_kv dividing N; got {queries.shape} and "
                         f"{keys.shape}")
    drop = None
    if dropout_rng is not None and rate > 0.0:
        drop = keep_mask(dropout_rng, rate, queries.shape[:-1] + keys.shape[-2:-1], padded_shape)
    if groups > 1:
        queries = group_heads(queries, groups)
        keys, values = keys[..., None, :, :], values[..., None, :, :]
        keep = None if keep is None else group_heads(keep, groups)
    return _plain_attention(queries, keys, values, keep, None, groups, mods.Variants(), False,
                            drop, rate)


def _ungrouped(groups, *arrays):
    """The arrays with the query heads of each group merged back, ``(B, ..., N, T, X)``."""
    if groups == 1:
        return arrays
    return tuple(ungroup_heads(a) for a in arrays)


def dot_product_attention_weights(queries, keys, valid_lens=None, *, mask=None, is_causal=False,
                                  bias=None, scale=None, local_window_size=None,
                                  logit_softcap=None, mask_mod=None, score_mod=None, sinks=None):
    """Scaled dot-product attention weights ``masked_softmax(Q K^T / sqrt(d) + bias)`` — d2l §11.3.3.

    Args:
      queries: ``(B, ..., T, d)``, or unbatched ``(T, d)``.
      keys: ``(B, ..., S, d)``, or ``(B, ..., N_kv, S, d)`` for queries ``(B, ..., N, T, d)``
        with ``N_kv`` dividing ``N`` (grouped-query attention, see
        :func:`dot_product_attention`); unbatched ``(S, d)``.
      valid_lens, mask, is_causal, bias, scale: as in :func:`dot_product_attention`.
      local_window_size, logit_softcap, mask_mod, score_mod, sinks: as there too.

    Returns:
      Weights ``(B, ..., T, S)`` (unbatched: ``(T, S)``); fully masked rows are zero (with
      ``sinks``, each row sums to less than 1: the sink takes the rest).
    """
    unbatched, queries, keys, _, valid_lens = check_unbatched(queries, keys, None, valid_lens)
    shape = _scores_shape(queries, keys)
    variants = mods.check_variants(shape, scale, local_window_size, logit_softcap, mask_mod,
                                   score_mod, sinks)
    keep, (queries, keys), groups = _prepare(queries, keys, None, valid_lens, mask, is_causal,
                                             same_depth=True,
                                             local_window_size=variants.local_window_size,
                                             mask_mod=variants.mask_mod)
    bias = _checked_bias(bias, shape, groups)
    weights = _plain_attention(queries, keys, None, keep, bias, groups, variants, False)[1]
    return weights[0] if unbatched else weights


# implementation=None takes "chunked" from CHUNKED_MIN_SCORES scores (16 MiB of float32) with
# S >= CHUNKED_MIN_KEYS, where it measured 1.5-2x faster (docs/implementation-notes.md, "When
# dot_product_attention takes the chunked kernel"); "plain" below.
CHUNKED_MIN_SCORES = 1 << 22
CHUNKED_MIN_KEYS = 512


def dot_product_implementation(queries, keys, bias=None) -> str:
    """The implementation ``dot_product_attention(..., implementation=None)`` takes for these
    queries ``(B, ..., T, d)``, keys ``(B, ..., S, d)`` and ``bias``: ``"chunked"`` when the
    scores ``(B, ..., T, S)`` hold at least :data:`CHUNKED_MIN_SCORES` numbers, ``S >=``
    :data:`CHUNKED_MIN_KEYS`, there is no ``bias`` (the chunked kernel takes none) and the dtype
    is float32 or float64 (float16/bfloat16 keep the plain path's rounding); else ``"plain"``.
    Only shapes and dtypes decide, so the choice is static under ``jit``; arrays or anything with
    ``shape`` and ``dtype`` (``jax.ShapeDtypeStruct``) will do."""
    queries, keys = (x if hasattr(x, "shape") and hasattr(x, "dtype") else jnp.asarray(x)
                     for x in (queries, keys))
    if (bias is None and jnp.issubdtype(queries.dtype, jnp.floating)
            and not is_half(queries.dtype) and len(keys.shape) >= 2
            and keys.shape[-2] >= CHUNKED_MIN_KEYS
            and math.prod(queries.shape[:-1]) * keys.shape[-2] >= CHUNKED_MIN_SCORES):
        return "chunked"
    return "plain"


def dot_product_attention(queries, keys, values, valid_lens=None, *, mask=None, is_causal=False,
                          bias=None, scale=None, local_window_size=None, logit_softcap=None,
                          implementation=None, mask_mod=None, score_mod=None, sinks=None,
                          return_lse=False, return_residual=None):
    """Scaled dot-product attention — d2l §11.3.3.

    ``softmax(softcap(scale * Q K^T) + bias) V`` with masking (see :mod:`jax_attention.nn.masking`);
    ``scale = 1 / sqrt(d)`` and no soft-capping by default, which is the book's
    ``softmax(Q K^T / sqrt(d)) V``.

    Args:
      queries: ``(B, ..., T, d)``, or unbatched ``(T, d)``.
      keys: ``(B, ..., S, d)``. Grouped-query attention: with a head axis, queries
        ``(B, ..., N, T, d)`` may meet keys ``(B, ..., N_kv, S, d)`` whose ``N_kv`` divides ``N``
        (``N_kv = 1``: multi-query attention); query head ``n`` attends key/value head
        ``n // (N / N_kv)``, as in ``jax.nn`` and PyTorch's ``enable_gqa``. The key/value heads
        are not repeated in memory (their gradients are summed over each group). Unbatched:
        ``(S, d)``.
      values: ``(B, ..., S, v)`` (``(B, ..., N_kv, S, v)`` with grouped keys; unbatched
        ``(S, v)``).
      valid_lens: ``None``, ``(B,)`` or ``(B, T)`` (unbatched: ``()`` or ``(T,)``).
      mask: boolean, broadcastable to ``(B, ..., T, S)``; True = attend.
      is_causal: also apply a causal mask ``(T, S)``.
      bias: added to the scores, broadcastable to ``(B, ..., T, S)``.
      scale: the factor of the dot products, a Python number; ``None``: ``1 / sqrt(d)``.
      local_window_size: a sliding window, ``(left, right)`` or ``w`` for ``(w, w)``: query ``t``
        attends only keys ``t - left <= s <= t + right``
        (:func:`~jax_attention.nn.masking.local_window_mask`), combined with ``valid_lens``,
        ``mask`` and ``is_causal`` by AND, as ``jax.nn.dot_product_attention`` does. A query the
        window leaves without a key gets zero weights and output, like any fully masked row.
      logit_softcap: ``c > 0`` caps the scores smoothly to ``(-c, c)``: ``c * tanh(s / c)``
        (Gemma 2), applied to the scaled dot products before the bias and the masks; ``None``:
        no capping.
      implementation: how the output is computed, equal to float rounding:

        * ``"plain"``: the scores, weights and weighted sum as whole ``T x S`` arrays;
        * ``"chunked"``: :func:`jax_attention.nn.efficient.dot_product_attention` (query and key
          chunks, online softmax, a recomputing backward pass); no ``bias``, and reverse-mode
          derivatives only (``jax.jvp``, ``jax.hessian`` need ``"plain"``);
        * ``None`` (default): :func:`dot_product_implementation` chooses by size — ``"chunked"``
          from :data:`CHUNKED_MIN_SCORES` scores and :data:`CHUNKED_MIN_KEYS` keys on
          (float32/float64, no bias), where it was measured faster, ``"plain"`` below.

        Either way the weights are those of the plain path (:func:`dot_product_attention_weights`);
        with ``"chunked"`` they are computed apart from the output, so under ``jit`` they cost
        nothing when unused (XLA drops them), but an eager call computes them too.
      mask_mod: a mask as a function ``(b, h, q_idx, kv_idx) -> bool`` (FlexAttention's
        signature, on broadcast index arrays; :mod:`jax_attention.nn.mods` has causal, windows,
        lengths, padding, segment ids, prefix-LM, chunks and their AND/OR), ANDed with the masks
        above. The chunked path evaluates it block by block and skips the blocks it rules out.
      score_mod: ``(score, b, h, q_idx, kv_idx) -> score``, applied after the soft cap and the
        bias (:mod:`jax_attention.nn.mods`: ALiBi, T5's relative bias, relative-position tables,
        a bias; :func:`~jax_attention.nn.mods.compose_score_mods`). Its float parameters get
        gradients on both paths when it is a :class:`~jax_attention.nn.mods.ScoreMod`.
      sinks: learned attention sinks, float ``(N,)`` (one logit per query head) or ``()``: each
        row's softmax gets one more term ``exp(sink)`` with a zero value (gpt-oss), so a row may
        attend "nothing"; the weights then sum to less than 1. Differentiable.
      return_lse: also return the log-sum-exp of each row's scores over its attended keys (and
        the sink), ``(B, ..., N, T)`` in float32 for half-precision inputs, else their dtype;
        ``-inf`` for a row that attends nothing. Differentiable (ring attention merges partial
        results with it). ``return_residual``: ``jax.nn``'s name for it.

    Returns:
      ``(output (B, ..., T, v), weights (B, ..., T, S))`` (unbatched: ``(T, v)``, ``(T, S)``;
      grouped: ``N`` heads); fully masked rows give zero output. With ``return_lse``:
      ``(output, weights, lse)``.

    The plain path's values are those of :func:`~jax_attention.nn.masking.masked_softmax` (to the
    rounding of applying ``1 / sqrt(d)`` to the queries, exact when ``sqrt(d)`` is a power of
    two); it is the attention core (:func:`jax_attention.nn.core.attention_core`), whose one
    custom JVP gives forward and reverse mode, its transpose one pass over the ``T x S`` arrays
    (equal to plain autodiff to rounding).

    Example::

        >>> q, k, v = jnp.ones((2, 4, 8)), jnp.ones((2, 3, 8)), jnp.ones((2, 3, 5))
        >>> out, w = dot_product_attention(q, k, v, valid_lens=jnp.array([2, 3]))
        >>> out.shape, w.shape
        ((2, 4, 5), (2, 4, 3))
        >>> w[0, 0].tolist()                    # equal scores: uniform over the 2 valid keys
        [0.5, 0.5, 0.0]
        >>> q, kv = jnp.ones((1, 8, 4, 16)), jnp.ones((1, 2, 4, 16))  # 8 query heads, 2 K/V heads
        >>> dot_product_attention(q, kv, kv, is_causal=True, local_window_size=(1, 0))[1][0, 0]
        Array([[1. , 0. , 0. , 0. ],
               [0.5, 0.5, 0. , 0. ],
               [0. , 0.5, 0.5, 0. ],
               [0. , 0. , 0.5, 0.5]], dtype=float32)
    """
    implementation = check_implementation(implementation)
    return_lse = _check_return_lse(return_lse, return_residual)
    if implementation == "chunked" and bias is not None:
        raise ValueError("implementation='chunked' takes no bias (the bias and its gradient would "
                         "be T x S arrays); use implementation='plain' or None, or a score_mod")
    unbatched, queries, keys, values, valid_lens = check_unbatched(queries, keys, values, valid_lens)
    variants = mods.check_variants(_scores_shape(queries, keys), scale, local_window_size,
                                   logit_softcap, mask_mod, score_mod, sinks)
    checked = check_attention_inputs(queries, keys, values, same_depth=True, grouped_heads=True)
    keep, (q, k, v), groups = _masked(checked, valid_lens, mask, is_causal,
                                      variants.local_window_size, variants.mask_mod)
    if implementation is None:
        implementation = dot_product_implementation(q, k, bias)
    if implementation == "plain":
        bias = _checked_bias(bias, _scores_shape(*checked[:2]), groups)
        results = _plain_attention(q, k, v, keep, bias, groups, variants, return_lse)
    else:  # the chunked kernel builds its masks block by block from the lengths and the mask
        output, lse = efficient.chunked_attention(*checked, valid_lens, mask, is_causal=is_causal,
                                                  variants=variants)
        weights = _plain_attention(q, k, None, keep, None, groups, variants, False)[1]
        results = (output, weights, lse) if return_lse else (output, weights)
    return tuple(r[0] for r in results) if unbatched else results


def _scores_shape(queries, keys):
    """``(B, ..., N, T, S)``: the scores' shape of batched queries and keys."""
    return jnp.shape(queries)[:-1] + jnp.shape(keys)[-2:-1]


def _check_return_lse(return_lse, return_residual) -> bool:
    if return_lse is False and return_residual is None:
        return False
    return_lse = check_static_bool("return_lse", return_lse)
    if return_residual is not None:
        return_lse = return_lse or check_static_bool("return_residual", return_residual)
    return return_lse


#: The keys of additive attention's parameter dict.
ADDITIVE_KEYS = ("W_q", "W_k", "w_v")


def _check_additive_params(params, queries, keys):
    check_param_keys("params", params, ADDITIVE_KEYS)
    W_q, W_k, w_v = (jnp.asarray(params[name]) for name in ADDITIVE_KEYS)
    h = W_q.shape[-1] if W_q.ndim == 2 else "h"
    check_param_shapes("params", params, {"W_q": (queries.shape[-1], h),
                                          "W_k": (keys.shape[-1], h), "w_v": (h, 1)},
                       f" (q = query size, k = key size, h = hidden size; queries "
                       f"{queries.shape}, keys {keys.shape})")
    return (p.astype(queries.dtype) for p in (W_q, W_k, w_v))


def _additive_weights(params, queries, keys, keep):
    W_q, W_k, w_v = _check_additive_params(params, queries, keys)
    return _additive_softmax(W_q, w_v, queries, jnp.einsum(PROJECT_KEYS, keys, W_k), keep)


def additive_key_projection(params, keys, valid_lens=None):
    """``keys W_k``, the keys at or past ``valid_lens`` set to zero first, as
    :func:`additive_attention_weights` zeroes the keys no query attends: the part of additive
    attention that does not depend on the queries.

    Not part of the user-facing API (``__all__``): d2l §11.4's decoder attends the same keys at
    every step, so it projects them once, outside its loop, and passes them to
    :func:`additive_attention_weights_of_projected` — one ``(B, S, k) x (k, h)`` product (and
    its weight gradient) per sequence instead of one per step.

    Args:
      params: ``{"W_q", "W_k": (k, h), "w_v"}``. keys: ``(B, ..., S, k)``.
      valid_lens: ``None`` or ``(B,)`` (the same keys for every query).

    Returns:
      ``(B, ..., S, h)``.
    """
    check_param_keys("params", params, ADDITIVE_KEYS)
    keys, W_k = jnp.asarray(keys), jnp.asarray(params["W_k"])
    if keys.ndim < 2 or W_k.ndim != 2 or W_k.shape[0] != keys.shape[-1]:
        raise ValueError(f"params['W_k'] must have shape (k, h) for keys (B, ..., S, k), got "
                         f"{W_k.shape} and keys {keys.shape}")
    keep = attention_mask(keys.shape[:-2] + (1,) + keys.shape[-2:-1], valid_lens)
    if keep is not None:  # as _prepare: a key no query attends is zero
        _, keys = zero_unattended(keep, None, keys)
    return jnp.einsum(PROJECT_KEYS, keys, W_k.astype(keys.dtype))


def additive_attention_weights_of_projected(params, queries, projected_keys, valid_lens=None):
    """:func:`additive_attention_weights` ``(params, queries, keys, valid_lens)`` from
    ``projected_keys = additive_key_projection(params, keys, valid_lens)``: the same weights, bit
    for bit, without projecting the keys. Not part of the user-facing API (``__all__``).

    Args:
      queries: ``(B, ..., T, q)``. projected_keys: ``(B, ..., S, h)``. valid_lens: ``None`` or
        ``(B,)``, those given to :func:`additive_key_projection`.

    Returns:
      Weights ``(B, ..., T, S)``; fully masked rows are zero.
    """
    check_param_keys("params", params, ADDITIVE_KEYS)
    queries, projected_keys = jnp.asarray(queries), jnp.asarray(projected_keys)
    W_q, w_v = jnp.asarray(params["W_q"]), jnp.asarray(params["w_v"])
    h = projected_keys.shape[-1]
    if W_q.shape != (queries.shape[-1], h) or w_v.shape != (h, 1):
        raise ValueError(f"params['W_q'] and params['w_v'] must have shapes (q, h) and (h, 1) "
                         f"with h = {h} (the projected keys' width), got {W_q.shape} and "
                         f"{w_v.shape} for queries {queries.shape}")
    keep = attention_mask(queries.shape[:-1] + projected_keys.shape[-2:-1], valid_lens)
    if keep is not None:  # as _prepare: a query that attends no key is zero
        queries, = zero_unattended(keep, queries)
    return _additive_softmax(W_q.astype(queries.dtype), w_v.astype(queries.dtype), queries,
                             projected_keys, keep)


def _additive_softmax(W_q, w_v, queries, projected_keys, keep):
    """``masked_softmax(w_v^T tanh(queries W_q + projected_keys))`` in the queries' dtype."""
    projected_queries = jnp.einsum(PROJECT_QUERIES, queries, W_q)
    # float16/bfloat16: features and scores in float32. The features lie in [-1, 1], but their
    # w_v-weighted sums can overflow float16, and so can the backward's dS w_v, which a saturated
    # feature's tanh' = 0 would then turn into 0 * Inf = NaN.
    compute = compute_dtype(queries.dtype)
    # Every query meets every key: (B, ..., T, 1, h) + (B, ..., 1, S, h) -> (B, ..., T, S, h).
    features = jnp.tanh((projected_queries[..., :, None, :]
                         + projected_keys[..., None, :, :]).astype(compute))
    scores = jnp.einsum(ADDITIVE_SCORES, features, w_v.astype(compute))[..., 0]
    return softmax_where(scores, keep).astype(queries.dtype)


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
    keep, (queries, keys), _ = _prepare(queries, keys, None, valid_lens, mask, is_causal,
                                        same_depth=False)
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

    Example::

        >>> params = {"W_q": jnp.ones((2, 4)), "W_k": jnp.ones((3, 4)), "w_v": jnp.ones((4, 1))}
        >>> q, k, v = jnp.ones((2, 1, 2)), jnp.ones((2, 5, 3)), jnp.ones((2, 5, 6))
        >>> out, w = additive_attention(params, q, k, v, valid_lens=jnp.array([2, 5]))
        >>> out.shape, w.shape
        ((2, 1, 6), (2, 1, 5))
        >>> w[0, 0].tolist()
        [0.5, 0.5, 0.0, 0.0, 0.0]
    """
    keep, (queries, keys, values), _ = _prepare(queries, keys, values, valid_lens, mask,
                                                is_causal, same_depth=False)
    weights = _additive_weights(params, queries, keys, keep)
    return jnp.einsum(WEIGHTED_SUM, weights, values), weights


# --------------------------------------------------------------------------- NNX modules


class _Attention(nnx.Module):
    """Shared tail of the scoring modules: sow the weights (additive attention's tail: dropout
    on its weights and the pooling; dot-product attention's core does its own)."""

    def _sown(self, weights):
        if self.sow_weights:
            self.sow(nnx.Intermediate, "attention_weights", weights)

    def _pool(self, weights, values, deterministic, rngs):
        self._sown(weights)
        dropped = self.dropout(weights, deterministic=deterministic, rngs=rngs)
        return jnp.einsum(WEIGHTED_SUM, dropped, values)


class DotProductAttention(_Attention):
    """Scaled dot-product attention with dropout on the weights — d2l §11.3.3.

    Holds no parameters. With ``sow_weights=True`` the weights ``(B, ..., T, S)`` (before dropout)
    are sown as ``nnx.Intermediate`` ``"attention_weights"``; read them with
    ``output, intermediates = nnx.capture(module, nnx.Intermediate)(queries, keys, values)``.

    Args:
      dropout: dropout rate on the attention weights (active unless ``deterministic`` or
        ``module.eval()``).
      sow_weights: sow the weights on every call (use inside ``nnx.capture``).
      rngs: ``nnx.Rngs`` with a ``dropout`` stream; needed when dropout is active.

    Example::

        >>> attention = DotProductAttention(dropout=0.0)
        >>> q, k, v = jnp.ones((2, 1, 4)), jnp.ones((2, 3, 4)), jnp.ones((2, 3, 5))
        >>> attention(q, k, v, jnp.array([1, 3])).shape
        (2, 1, 5)
    """

    def __init__(self, dropout: float = 0.0, *, sow_weights: bool = False, rngs: nnx.Rngs | None = None):
        dropout = check_dropout(dropout)
        # A 'dropout' stream only with dropout: nnx.Dropout forks one from any rngs it gets.
        self.dropout = nnx.Dropout(dropout, rngs=rngs if dropout > 0 else None)
        self.sow_weights = sow_weights

    def __call__(self, queries, keys, values, valid_lens=None, *, mask=None, is_causal=False,
                 bias=None, scale=None, local_window_size=None, logit_softcap=None,
                 mask_mod=None, score_mod=None, sinks=None,
                 deterministic: bool | None = None, rngs: nnx.Rngs | None = None,
                 drop_batch_axis: bool = False):
        """Returns the output ``(B, ..., T, v)``; see :func:`dot_product_attention` for the
        arguments (grouped-query keys and values and unbatched inputs included).

        ``drop_batch_axis=True``: the inputs' batch axis is one the caller added to unbatched
        inputs (:class:`~jax_attention.nn.multihead.MultiHeadAttention` does, for ``(T, q)``
        queries): the output and the sown weights come without it."""
        unbatched, queries, keys, values, valid_lens = check_unbatched(queries, keys, values,
                                                                       valid_lens)
        variants = mods.check_variants(_scores_shape(queries, keys), scale, local_window_size,
                                       logit_softcap, mask_mod, score_mod, sinks)
        keep, (queries, keys, values), groups = _prepare(
            queries, keys, values, valid_lens, mask, is_causal, same_depth=True,
            local_window_size=variants.local_window_size, mask_mod=variants.mask_mod)
        unbatched = unbatched or check_static_bool("drop_batch_axis", drop_batch_axis)
        shape = queries.shape[:-1] + keys.shape[-2:-1]
        if groups > 1:
            shape = _ungrouped_shape(shape)
        # nnx.Dropout's own mask (its stream, its draw), for the core to apply: the dropout of
        # ones; when inactive (deterministic, rate 0) it returns its input itself.
        ones = jnp.ones(shape, jnp.float32)
        kept = self.dropout(ones, deterministic=deterministic, rngs=rngs)
        bias = _checked_bias(bias, shape, groups)
        output, weights = _plain_attention(queries, keys, values, keep, bias, groups, variants,
                                           False, None if kept is ones else kept != 0,
                                           self.dropout.rate)
        self._sown(weights[0] if unbatched else weights)
        return output[0] if unbatched else output


class AdditiveAttention(_Attention):
    """Additive attention with dropout on the weights — d2l §11.3.2.

    Parameters ``W_q (query_size, num_hiddens)``, ``W_k (key_size, num_hiddens)`` and
    ``w_v (num_hiddens, 1)``, Xavier-uniform initialised; :meth:`params_dict` gives them as the
    plain dict :func:`additive_attention` and the NumPy reference take. Weights are sown as in
    :class:`DotProductAttention`.

    Args:
      query_size: ``q``.
      key_size: ``k``.
      num_hiddens: ``h``.
      dropout: dropout rate on the attention weights.
      sow_weights: sow the weights on every call (use inside ``nnx.capture``).
      param_dtype: dtype of the parameters.
      rngs: ``nnx.Rngs`` with a ``params`` stream (and ``dropout`` when dropout is active).

    Example::

        >>> attention = AdditiveAttention(query_size=2, key_size=3, num_hiddens=4, rngs=nnx.Rngs(0))
        >>> q, k, v = jnp.ones((2, 1, 2)), jnp.ones((2, 5, 3)), jnp.ones((2, 5, 6))
        >>> attention(q, k, v, jnp.array([2, 5])).shape
        (2, 1, 6)
        >>> sorted(attention.params_dict())
        ['W_k', 'W_q', 'w_v']
    """

    def __init__(self, query_size: int, key_size: int, num_hiddens: int, dropout: float = 0.0, *,
                 sow_weights: bool = False, param_dtype=jnp.float32, rngs: nnx.Rngs):
        query_size, key_size, num_hiddens = (check_size(name, value) for name, value in (
            ("query_size", query_size), ("key_size", key_size), ("num_hiddens", num_hiddens)))
        dropout = check_dropout(dropout)
        init = nnx.initializers.xavier_uniform()
        self.W_q = nnx.Param(init(rngs.params(), (query_size, num_hiddens), param_dtype))
        self.W_k = nnx.Param(init(rngs.params(), (key_size, num_hiddens), param_dtype))
        self.w_v = nnx.Param(init(rngs.params(), (num_hiddens, 1), param_dtype))
        # A 'dropout' stream only with dropout: nnx.Dropout forks one from any rngs it gets.
        self.dropout = nnx.Dropout(dropout, rngs=rngs if dropout > 0 else None)
        self.sow_weights = sow_weights

    def params_dict(self) -> dict[str, jax.Array]:
        """The parameters as ``{"W_q", "W_k", "w_v"}`` arrays, for the functional core."""
        return {"W_q": self.W_q[...], "W_k": self.W_k[...], "w_v": self.w_v[...]}

    def __call__(self, queries, keys, values, valid_lens=None, *, mask=None, is_causal=False,
                 deterministic: bool | None = None, rngs: nnx.Rngs | None = None):
        """Returns the output ``(B, ..., T, v)``; see :func:`additive_attention`."""
        for name, X, W, size in (("queries", queries, self.W_q, "query_size"),
                                 ("keys", keys, self.W_k, "key_size")):
            if jnp.ndim(X) < 1 or jnp.shape(X)[-1] != W.shape[0]:
                raise ValueError(f"{name} must have shape (B, ..., len, {name[0]}) with {name[0]} = "
                                 f"{W.shape[0]} (the module's {size}), got {jnp.shape(X)}")
        keep, (queries, keys, values), _ = _prepare(queries, keys, values, valid_lens, mask,
                                                    is_causal, same_depth=False)
        weights = _additive_weights(self.params_dict(), queries, keys, keep)
        return self._pool(weights, values, deterministic, rngs)
