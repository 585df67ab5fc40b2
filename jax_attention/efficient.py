"""Memory-efficient exact attention: query and key chunks, online softmax, recomputing backward.

The same scaled dot-product attention as :func:`jax_attention.scoring.dot_product_attention`
(d2l §11.3.3), computed without ever holding the ``T x S`` scores: queries are processed in chunks
of ``query_chunk_size`` rows, and for each query chunk the keys in chunks of ``key_chunk_size``,
keeping per query only a running maximum ``m``, a running normaliser ``l`` and a running weighted
sum of the values (the "online softmax" of Milakov & Gimelshein 2018, used for attention by
Rabe & Staats 2021 and FlashAttention, Dao et al. 2022). The backward pass is a custom VJP that
saves only the output and one log-sum-exp per query and recomputes the scores chunk by chunk
(FlashAttention-2, Dao 2023). Peak memory is ``O((T + S) d + chunk^2)`` instead of ``O(T S)``.

Shape letters: ``B`` batch, ``T`` queries, ``S`` keys/values, ``...`` extra batch axes (heads),
``q`` the query/key size, ``v`` the value size.

Masking is that of :mod:`jax_attention.masking` — ``valid_lens`` ``(B,)`` or ``(B, T)``, a boolean
``mask`` (True = attend) and ``is_causal`` — but each chunk's mask is built from positions and
lengths when the chunk is reached, so no ``T x S`` mask exists unless the caller passes one.
A query that may attend no key gets a zero output and finite (zero) gradients, and NaN or Inf in
masked queries, keys or values never reach valid outputs or gradients, exactly as in
:mod:`jax_attention.scoring`.

References:
  M. Milakov, N. Gimelshein, "Online normalizer calculation for softmax", arXiv:1805.02867 (2018).
  M. N. Rabe, C. Staats, "Self-attention does not need O(n^2) memory", arXiv:2112.05682 (2021).
  T. Dao et al., "FlashAttention: fast and memory-efficient exact attention with IO-awareness",
  NeurIPS 2022, arXiv:2205.14135.
  T. Dao, "FlashAttention-2: faster attention with better parallelism and work partitioning",
  arXiv:2307.08691 (2023).
"""

from __future__ import annotations

import functools
import math
import operator
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from jax_attention._checks import (
    check_attention_inputs,
    check_mask,
    check_static_bool,
    check_valid_lens,
)
from jax_attention.masking import masked_fill_value

__all__ = ["dot_product_attention"]

# The score and pooling strings of jax_attention/scoring.py, and the products of the backward pass
# (scores, gradients of the values, of the weights and of queries/keys) in the same letters. The
# backward pass works on transposed blocks, keys as rows ("...st"): XLA:CPU then runs the products
# for dV and dK as plain row-major matrix products (YNNPACK) instead of Eigen's slower ones that
# contract the rows of their left operand; only dQ's does (measured: forward+backward at
# (4, 8, 512, 64) 98.5 ms against 111.4 ms with "...ts" blocks, the same run).
DOT_SCORES = "...tq,...sq->...ts"
WEIGHTED_SUM = "...ts,...sv->...tv"
KEY_SCORES = "...sq,...tq->...st"
VALUES_GRAD = "...st,...tv->...sv"
WEIGHTS_GRAD = "...sv,...tv->...st"
QUERIES_GRAD = "...st,...sq->...tq"
KEYS_GRAD = "...st,...tq->...sq"


class _Chunking(NamedTuple):
    """Static (hashable) description of one call: lengths, chunk sizes and which masks apply."""

    num_queries: int  # T, before padding
    num_keys: int  # S, before padding
    query_chunk: int  # Cq; divides the padded query length
    key_chunk: int  # Ck; divides the padded key length
    padded_queries: int  # T rounded up to a multiple of Cq
    padded_keys: int  # S rounded up to a multiple of Ck
    is_causal: bool

    @property
    def num_query_chunks(self) -> int:
        return self.padded_queries // self.query_chunk

    @property
    def num_key_chunks(self) -> int:
        return self.padded_keys // self.key_chunk


# The automatic chunk (query_chunk_size=None, key_chunk_size=None): the largest power of two in
# [MIN_AUTO_CHUNK, MAX_AUTO_CHUNK] whose scores block over all batch axes, batch * chunk**2, holds
# at most AUTO_BLOCK_ELEMENTS numbers (2 MiB of float32, one core's L2 on the CI-class Xeon).
# Measured with `bench attention`-style interleaved runs, forward+backward, 2 cores: at
# (B, N, T, H) = (4, 8, 512, 64) chunks of 128 (the rule's) took 103 ms, 64: 133, 256: 126,
# 512: 166 (512 x 1024, the former default: 1.5x slower); at (1, 8, 2048, 64) 256 (the rule's)
# took 379 ms, 128: 399, 512: 439; at (1, 1, 8192, 64) 512 x 512 and 512 x 1024 were within noise.
# Blocks that stay in cache cost less than the T x S temporaries the plain attention writes to
# fresh memory; below 128 the per-step overhead of the loops dominates.
AUTO_BLOCK_ELEMENTS = 1 << 19
MIN_AUTO_CHUNK, MAX_AUTO_CHUNK = 128, 512


def auto_chunk_size(batch: int) -> int:
    """The chunk used for queries and keys when none is given, for ``batch`` = the product of the
    batch axes (``B·N``): see :data:`AUTO_BLOCK_ELEMENTS`."""
    chunk = MIN_AUTO_CHUNK
    while chunk < MAX_AUTO_CHUNK and batch * (2 * chunk) ** 2 <= AUTO_BLOCK_ELEMENTS:
        chunk *= 2
    return chunk


def _chunk_size(requested, length: int, name: str, batch: int = 1) -> int:
    """The chunk actually used for ``length`` rows: at most ``requested`` (``None``: the automatic
    size for ``batch``, see :func:`auto_chunk_size`), and as even as possible.

    ``ceil(length / requested)`` chunks are needed anyway; spreading the rows evenly over them keeps
    the padding (work on rows that are thrown away) below one row per chunk.
    """
    if requested is None:
        requested = auto_chunk_size(batch)
    try:
        if isinstance(requested, bool):
            raise TypeError
        requested = operator.index(requested)
    except TypeError:
        raise TypeError(f"{name} must be a positive int, got {requested!r}") from None
    if requested < 1:
        raise ValueError(f"{name} must be a positive int, got {requested}")
    if length == 0:
        return 1  # nothing to chunk; the caller returns early
    num_chunks = -(-length // requested)
    return -(-length // num_chunks)


def _pad_axis(x, axis: int, new_size: int, value=0):
    """``x`` padded at the end of ``axis`` to ``new_size`` with ``value`` (a no-op if already)."""
    extra = new_size - x.shape[axis]
    if extra == 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, extra)
    return jnp.pad(x, widths, constant_values=value)


def _rows(x, start, size):
    """Rows ``start : start + size`` of the second-to-last axis (a query or key chunk)."""
    return lax.dynamic_slice_in_dim(x, start, size, axis=x.ndim - 2)


def _chunk_keep(cfg: _Chunking, limits, mask, i, j, rank: int):
    """Boolean mask of query chunk ``i`` against key chunk ``j``, or ``None`` when all attend.

    Built from positions, so its size is that of one chunk pair: broadcastable to
    ``(B, ..., Cq, Ck)``, with ``rank`` axes (equal ranks keep strict rank promotion happy).

    Args:
      limits: ``None`` or int32 ``(B, Tp)``: query ``t`` may attend keys ``s < limits[b, t]``
        (the valid lengths clipped to ``[0, S]``; padded queries have 0).
      mask: ``None`` or the caller's boolean mask with ``rank`` axes, its last two axes either 1
        or padded to ``(Tp, Sp)`` with False.
    """
    Cq, Ck = cfg.query_chunk, cfg.key_chunk
    query_pos = i * Cq + jnp.arange(Cq, dtype=jnp.int32)
    key_pos = j * Ck + jnp.arange(Ck, dtype=jnp.int32)
    parts = []
    if limits is not None:
        chunk_limits = lax.dynamic_slice_in_dim(limits, i * Cq, Cq, axis=1)  # (B, Cq)
        below = key_pos[None, None, :] < chunk_limits[:, :, None]  # (B, Cq, Ck)
        parts.append(below.reshape((below.shape[0],) + (1,) * (rank - 3) + (Cq, Ck)))
    elif cfg.padded_keys != cfg.num_keys:
        # Without lengths the padded keys still have to be masked; clipped lengths cover them
        # otherwise.
        parts.append((key_pos < cfg.num_keys).reshape((1,) * (rank - 1) + (Ck,)))
    if cfg.is_causal:
        causal = key_pos[None, :] <= query_pos[:, None]  # scoring's causal_mask(T, S), offset 0
        parts.append(causal.reshape((1,) * (rank - 2) + (Cq, Ck)))
    if mask is not None:
        if mask.shape[-2] != 1:
            mask = lax.dynamic_slice_in_dim(mask, i * Cq, Cq, axis=rank - 2)
        if mask.shape[-1] != 1:
            mask = lax.dynamic_slice_in_dim(mask, j * Ck, Ck, axis=rank - 1)
        parts.append(mask)
    if not parts:
        return None
    return functools.reduce(jnp.logical_and, parts)


def _clean_chunk(keep, q_i, k_j, v_j):
    """Zero the queries of the chunk that attend no key of it, and the keys/values no query attends.

    Their weights are exactly zero already, but ``0 * NaN`` is NaN: NaN or Inf stored in padding
    would otherwise reach valid outputs through ``P V`` and valid gradients through ``dS K`` and
    ``dS^T Q``. This is the per-chunk version of what :func:`jax_attention.scoring._prepare` does
    once for the whole ``T x S`` mask.
    """
    zero = jnp.zeros((), q_i.dtype)
    query_attends = jnp.any(keep, axis=-1, keepdims=True)  # (B, ..., Cq, 1)
    key_attended = jnp.swapaxes(jnp.any(keep, axis=-2, keepdims=True), -1, -2)  # (B, ..., Ck, 1)
    return (jnp.where(query_attends, q_i, zero), jnp.where(key_attended, k_j, zero),
            jnp.where(key_attended, v_j, zero))


def _key_chunk_stop(cfg: _Chunking, limits, i):
    """One past the last key chunk that query chunk ``i`` may attend (the rest are skipped).

    Causal: keys after the chunk's last query. Lengths: keys at or beyond the chunk's longest
    valid length. Skipping is exact: those chunks would add zero to every sum.
    """
    Cq, Ck = cfg.query_chunk, cfg.key_chunk
    stop = jnp.asarray(cfg.num_key_chunks, jnp.int32)
    if cfg.is_causal:
        stop = jnp.minimum(stop, ((i + 1) * Cq + Ck - 1) // Ck)
    if limits is not None:
        longest = jnp.max(lax.dynamic_slice_in_dim(limits, i * Cq, Cq, axis=1))
        stop = jnp.minimum(stop, (longest + Ck - 1) // Ck)
    return stop


def _forward(cfg: _Chunking, queries, keys, values, limits, mask):
    """Online-softmax forward on padded, pre-scaled inputs: ``(output, logsumexp)``.

    Returns the output ``(B, ..., Tp, v)`` and per query ``log(sum_s exp(score_ts))`` over its
    attended keys ``(B, ..., Tp)`` (0 for a query that attends nothing), all the backward pass
    needs to rebuild the weights of any chunk.
    """
    batch_shape, rank = queries.shape[:-2], queries.ndim
    Cq, Ck = cfg.query_chunk, cfg.key_chunk
    dtype = queries.dtype
    fill, zero = masked_fill_value(dtype), jnp.zeros((), dtype)

    def query_chunk(i):
        q_i = _rows(queries, i * Cq, Cq)

        def key_step(j, carry):
            running_max, normaliser, accumulator = carry
            q, k_j, v_j = q_i, _rows(keys, j * Ck, Ck), _rows(values, j * Ck, Ck)
            keep = _chunk_keep(cfg, limits, mask, i, j, rank)
            if keep is not None:
                q, k_j, v_j = _clean_chunk(keep, q, k_j, v_j)
            scores = jnp.einsum(DOT_SCORES, q, k_j)
            if keep is not None:
                scores = jnp.where(keep, scores, fill)
            new_max = jnp.maximum(running_max, jnp.max(scores, axis=-1))
            # Until a row meets a key it may attend, its maximum stays at the (finite) fill value,
            # so every exponent below is finite; masked entries are then zeroed by `where`.
            exps = jnp.exp(scores - new_max[..., None])
            if keep is not None:
                exps = jnp.where(keep, exps, zero)
            rescale = jnp.exp(running_max - new_max)  # earlier chunks were summed at the old max
            normaliser = rescale * normaliser + jnp.sum(exps, axis=-1)
            accumulator = rescale[..., None] * accumulator + jnp.einsum(WEIGHTED_SUM, exps, v_j)
            return new_max, normaliser, accumulator

        init = (jnp.full(batch_shape + (Cq,), fill, dtype), jnp.zeros(batch_shape + (Cq,), dtype),
                jnp.zeros(batch_shape + (Cq, values.shape[-1]), dtype))
        running_max, normaliser, accumulator = lax.fori_loop(
            jnp.zeros((), jnp.int32), _key_chunk_stop(cfg, limits, i), key_step, init)
        # A row that attended nothing has normaliser 0 and accumulator 0: its output is 0.
        attended = normaliser > 0
        output = accumulator / jnp.where(attended, normaliser, jnp.ones((), dtype))[..., None]
        logsumexp = jnp.where(attended, running_max + jnp.log(jnp.where(attended, normaliser,
                                                                          jnp.ones((), dtype))),
                              zero)
        return output, logsumexp

    outputs, logsumexps = lax.map(query_chunk, jnp.arange(cfg.num_query_chunks, dtype=jnp.int32))
    # (num_chunks, B, ..., Cq, v) -> (B, ..., Tp, v): O(T v), not O(T S).
    output = jnp.moveaxis(outputs, 0, -3).reshape(batch_shape + (cfg.padded_queries, -1))
    logsumexp = jnp.moveaxis(logsumexps, 0, -2).reshape(batch_shape + (cfg.padded_queries,))
    return output, logsumexp


def _backward(cfg: _Chunking, residuals, output_grad):
    """FlashAttention-2 backward: recompute each chunk's weights from the saved log-sum-exp.

    With ``P = exp(Q K^T - L)``, ``dP = dO V^T`` and ``D = rowsum(dO * O)`` (which equals
    ``rowsum(P * dP)``): ``dV = P^T dO``, ``dS = P * (dP - D)``, ``dQ = dS K``, ``dK = dS^T Q``.
    Outer loop over key chunks (their ``dK``, ``dV`` are finished in one pass), inner loop over
    query chunks, accumulating ``dQ`` in place. Each block is formed transposed, ``P^T``
    ``(B, ..., Ck, Cq)``, so that ``dV`` and ``dK`` are row-major products (see the einsum strings).
    """
    queries, keys, values, limits, mask, output, logsumexp = residuals
    rank = queries.ndim
    Cq, Ck = cfg.query_chunk, cfg.key_chunk
    dtype = queries.dtype
    fill, zero = masked_fill_value(dtype), jnp.zeros((), dtype)
    output_grad = output_grad.astype(dtype)
    delta = jnp.sum(output_grad * output, axis=-1)  # D, (B, ..., Tp)

    def key_chunk(j, grads):
        dq, dk, dv = grads
        k_j, v_j = _rows(keys, j * Ck, Ck), _rows(values, j * Ck, Ck)

        def query_step(i, carry):
            dq, dk_j, dv_j = carry
            q_i, do_i = _rows(queries, i * Cq, Cq), _rows(output_grad, i * Cq, Cq)
            lse_i = lax.dynamic_slice_in_dim(logsumexp, i * Cq, Cq, axis=rank - 2)
            delta_i = lax.dynamic_slice_in_dim(delta, i * Cq, Cq, axis=rank - 2)
            q, k, v = q_i, k_j, v_j
            keep = _chunk_keep(cfg, limits, mask, i, j, rank)
            if keep is not None:
                q, k, v = _clean_chunk(keep, q, k, v)
                keep = jnp.swapaxes(keep, -1, -2)  # (B, ..., Ck, Cq), as the blocks below
            scores = jnp.einsum(KEY_SCORES, k, q)
            if keep is not None:
                scores = jnp.where(keep, scores, fill)
            weights = jnp.exp(scores - lse_i[..., None, :])
            if keep is not None:
                weights = jnp.where(keep, weights, zero)
            dv_j = dv_j + jnp.einsum(VALUES_GRAD, weights, do_i)
            weights_grad = jnp.einsum(WEIGHTS_GRAD, v, do_i)
            scores_grad = weights * (weights_grad - delta_i[..., None, :])
            if keep is not None:
                # dP of a masked entry can be NaN (a NaN value attended by another query of the
                # chunk); its weight is 0 and so must its score gradient be, as `where` gives in
                # the plain attention's autodiff.
                scores_grad = jnp.where(keep, scores_grad, zero)
            dq_i = _rows(dq, i * Cq, Cq) + jnp.einsum(QUERIES_GRAD, scores_grad, k)
            dq = lax.dynamic_update_slice_in_dim(dq, dq_i, i * Cq, axis=rank - 2)
            dk_j = dk_j + jnp.einsum(KEYS_GRAD, scores_grad, q)
            return dq, dk_j, dv_j

        # Causal: query chunks that end before this key chunk starts attend none of it.
        start = (j * Ck) // Cq if cfg.is_causal else 0
        dq, dk_j, dv_j = lax.fori_loop(
            jnp.asarray(start, jnp.int32), jnp.asarray(cfg.num_query_chunks, jnp.int32),
            query_step, (dq, jnp.zeros_like(k_j), jnp.zeros_like(v_j)))
        dk = lax.dynamic_update_slice_in_dim(dk, dk_j, j * Ck, axis=rank - 2)
        dv = lax.dynamic_update_slice_in_dim(dv, dv_j, j * Ck, axis=rank - 2)
        return dq, dk, dv

    # Key chunks no query attends keep zero gradients: beyond the last query (causal) or beyond
    # every valid length.
    stop = jnp.asarray(cfg.num_key_chunks, jnp.int32)
    if cfg.is_causal:
        stop = jnp.minimum(stop, (cfg.padded_queries + Ck - 1) // Ck)
    if limits is not None:
        stop = jnp.minimum(stop, (jnp.max(limits) + Ck - 1) // Ck)
    dq, dk, dv = lax.fori_loop(
        jnp.zeros((), jnp.int32), stop, key_chunk,
        (jnp.zeros_like(queries), jnp.zeros_like(keys), jnp.zeros_like(values)))
    # Lengths and masks are not differentiable (integers and booleans).
    return dq, dk, dv, None, None


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _chunked_attention(cfg, queries, keys, values, limits, mask):
    return _forward(cfg, queries, keys, values, limits, mask)[0]


def _chunked_attention_fwd(cfg, queries, keys, values, limits, mask):
    output, logsumexp = _forward(cfg, queries, keys, values, limits, mask)
    # O(T + S) residuals: the inputs (kept alive by the caller anyway), the output and one float
    # per query; the weights are recomputed, never stored.
    return output, (queries, keys, values, limits, mask, output, logsumexp)


_chunked_attention.defvjp(_chunked_attention_fwd, _backward)


def dot_product_attention(queries, keys, values, valid_lens=None, *, mask=None, is_causal=False,
                          query_chunk_size=None, key_chunk_size=None):
    """Scaled dot-product attention in chunks, in ``O(T + S)`` memory — d2l §11.3.3, exactly.

    ``softmax(Q K^T / sqrt(q)) V`` with masking, equal (to float rounding) to
    :func:`jax_attention.scoring.dot_product_attention`'s output, but computed chunk by chunk with
    an online softmax: for each query, over the key chunks ``j`` in turn,

        m' = max(m, max_s S_ts),   l' = exp(m - m') l + sum_s exp(S_ts - m'),
        a' = exp(m - m') a + sum_s exp(S_ts - m') V_s,                  output = a / l,

    where ``S = Q K^T / sqrt(q)`` is only ever formed for one ``(query_chunk, key_chunk)`` block.
    The backward pass (custom VJP) recomputes those blocks from the saved output and
    ``log l + m`` per query (FlashAttention-2). Key chunks that causality or ``valid_lens`` leave
    unattended are skipped. float16/bfloat16 inputs are computed in float32 and the output cast
    back; float64 stays float64 (under x64).

    Only the output is returned: the weights would be the ``T x S`` array this function avoids.
    Use :func:`jax_attention.scoring.dot_product_attention_weights` to inspect them. There is no
    score ``bias`` argument (a full bias and its gradient would be ``T x S`` too).

    Masking as in :mod:`jax_attention.masking`: a query that may attend no key gets a zero output
    and zero gradients, and NaN/Inf in masked positions never reach valid outputs or gradients.
    ``valid_lens`` and ``is_causal`` are turned into masks chunk by chunk, never into a ``T x S``
    array. A ``mask`` is sliced chunk by chunk, but a mask with full ``T`` and ``S`` axes is itself
    ``T x S`` booleans (and is copied once, padded, when the chunks do not divide ``T`` or ``S``):
    prefer ``valid_lens``, ``is_causal`` and masks with size-1 axes, e.g. ``(B, 1, 1, S)``.

    Args:
      queries: ``(B, ..., T, q)``.
      keys: ``(B, ..., S, q)``.
      values: ``(B, ..., S, v)``.
      valid_lens: ``None``, ``(B,)`` or ``(B, T)`` integers in ``[0, S]``: the number of keys each
        query may attend (checked when concrete; under jit they act as if clipped to ``[0, S]``).
      mask: boolean, broadcastable to ``(B, ..., T, S)``; True = attend.
      is_causal: query ``t`` may attend only keys ``s <= t`` (scoring's ``causal_mask(T, S)``).
      query_chunk_size: at most this many queries per chunk (``Cq``). Chunks are spread evenly, so
        the ``ceil(T / Cq)`` chunks cover ``T`` with less than one padded row each; ``T`` need
        not be a multiple. ``None``: :func:`auto_chunk_size` of the batch axes' product ``B·...``
        (128 to 512: a ``(B, ..., Cq, Ck)`` block of about 2 MiB of float32, which stays in cache).
      key_chunk_size: at most this many keys per chunk (``Ck``), likewise.

    Returns:
      The output ``(B, ..., T, v)`` in the inputs' dtype; zero for fully masked queries.

    Raises:
      ValueError, TypeError: for the inputs :func:`jax_attention.scoring.dot_product_attention`
        rejects (``TypeError`` for an ``is_causal`` that is not a Python bool, traced included),
        and for chunk sizes that are not positive ints.

    References: Rabe & Staats, arXiv:2112.05682 (2021); Dao et al., FlashAttention,
    arXiv:2205.14135 (2022); Dao, FlashAttention-2, arXiv:2307.08691 (2023).
    """
    queries, keys, values = check_attention_inputs(queries, keys, values, same_depth=True)
    dtype = queries.dtype
    num_queries, num_keys = queries.shape[-2], keys.shape[-2]
    scores_shape = queries.shape[:-1] + (num_keys,)
    rank = queries.ndim
    batch = math.prod(queries.shape[:-2])
    query_chunk = _chunk_size(query_chunk_size, num_queries, "query_chunk_size", batch)
    key_chunk = _chunk_size(key_chunk_size, num_keys, "key_chunk_size", batch)
    lens = None if valid_lens is None else check_valid_lens(valid_lens, queries.shape[0],
                                                            num_queries, num_keys)
    if mask is not None:
        mask = check_mask(mask, scores_shape)
    is_causal = check_static_bool("is_causal", is_causal)
    if num_queries == 0 or num_keys == 0:
        # Nothing to chunk; with no key every query is fully masked (zero output), as in scoring.
        return jnp.zeros(queries.shape[:-1] + values.shape[-1:], dtype)

    cfg = _Chunking(
        num_queries=num_queries, num_keys=num_keys, query_chunk=query_chunk, key_chunk=key_chunk,
        padded_queries=-(-num_queries // query_chunk) * query_chunk,
        padded_keys=-(-num_keys // key_chunk) * key_chunk, is_causal=is_causal)

    limits = None
    if lens is not None:
        # Clipping to [0, S] keeps the padded keys masked and gives traced lengths the documented
        # meaning; padded queries get 0 (attend nothing; their rows are dropped anyway).
        lens = jnp.clip(lens, 0, num_keys)
        if lens.ndim == 1:
            lens = jnp.broadcast_to(lens[:, None], (lens.shape[0], num_queries))
        limits = _pad_axis(lens, 1, cfg.padded_queries)
    if mask is not None:
        mask = mask.reshape((1,) * (rank - mask.ndim) + mask.shape)
        if mask.shape[-2] != 1:
            mask = _pad_axis(mask, rank - 2, cfg.padded_queries, False)
        if mask.shape[-1] != 1:
            mask = _pad_axis(mask, rank - 1, cfg.padded_keys, False)

    # Half precision is computed in float32 (scores, exponentials and sums alike); the casts'
    # transposes bring the gradients back to the inputs' dtype.
    compute_dtype = jnp.float32 if jnp.finfo(dtype).bits < 32 else dtype
    scaled_queries = queries.astype(compute_dtype) / math.sqrt(queries.shape[-1])
    output = _chunked_attention(
        cfg,
        _pad_axis(scaled_queries, rank - 2, cfg.padded_queries),
        _pad_axis(keys.astype(compute_dtype), rank - 2, cfg.padded_keys),
        _pad_axis(values.astype(compute_dtype), rank - 2, cfg.padded_keys),
        limits, mask)
    return output[..., :num_queries, :].astype(dtype)
