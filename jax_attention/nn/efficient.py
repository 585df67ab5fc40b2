"""Memory-efficient exact attention: query and key chunks, online softmax, recomputing backward.

The same scaled dot-product attention as :func:`jax_attention.nn.scoring.dot_product_attention`
(d2l §11.3.3), computed without ever holding the ``T x S`` scores: queries are processed in chunks
of ``query_chunk_size`` rows, and for each query chunk the keys in chunks of ``key_chunk_size``,
keeping per query only a running maximum ``m``, a running normaliser ``l`` and a running weighted
sum of the values (the "online softmax" of Milakov & Gimelshein 2018, used for attention by
Rabe & Staats 2021 and FlashAttention, Dao et al. 2022). The backward pass is a custom VJP that
saves only the output and one log-sum-exp per query and recomputes the scores chunk by chunk
(FlashAttention-2, Dao 2023). Peak memory is ``O((T + S) d + chunk^2)`` instead of ``O(T S)``.

Shape letters: ``B`` batch, ``T`` queries, ``S`` keys/values, ``...`` extra batch axes (heads),
``N`` query heads, ``N_kv`` key/value heads, ``G = N / N_kv`` query heads per key/value head,
``q`` the query/key size, ``v`` the value size. Unbatched inputs — queries ``(T, q)``, keys
``(S, q)``, values ``(S, v)`` — are given a batch axis of 1 and get it removed from the output.

Scores: ``s = (Q K^T) * scale`` (``scale`` defaults to ``1 / sqrt(q)``, applied to the queries),
then the score mods — with ``logit_softcap = c``, ``c * tanh(s / c)`` (Gemma 2), then the
``score_mod`` (:mod:`jax_attention.nn.mods`) — then the masks. Both passes form a block's scores
with one function, :func:`_block_scores`.

Masking is that of :mod:`jax_attention.nn.masking` — ``valid_lens`` ``(B,)`` or ``(B, T)``, a boolean
``mask`` (True = attend), ``is_causal`` and a sliding window ``local_window_size = (left, right)``
(query ``t`` may attend keys ``t - left <= s <= t + right``, ``jax.nn``'s rule), all ANDed — but
each chunk's mask is built from positions and lengths when the chunk is reached, so no ``T x S``
mask exists unless the caller passes one; a ``mask_mod`` is evaluated on each block's positions.
Key chunks that causality, the window or the lengths leave unattended by every query of a query
chunk are skipped (their blocks would add exactly zero), in the forward pass and in the backward
pass alike: a window of ``w`` keys costs ``O(T w)``, not ``O(T S)``; so are the blocks a mask
mod rules out (:meth:`jax_attention.nn.mods.MaskMod.block_any`: segment ids and lengths from
each block's range at run time). A query that may attend no key gets a zero output and finite (zero) gradients, and NaN
or Inf in masked queries, keys or values never reach valid outputs or gradients, exactly as in
:mod:`jax_attention.nn.scoring`.

Grouped-query attention (GQA, Ainslie et al. 2023; multi-query attention, Shazeer 2019, is
``N_kv = 1``): keys and values may have ``N_kv`` heads (axis -3) dividing the queries' ``N``; query
head ``n`` uses key/value head ``n // G`` (``jax.nn``'s and PyTorch's ``enable_gqa`` convention).
The queries are carried as ``(B, ..., N_kv, G, T, q)``; each block takes the ``G`` query heads of
a key/value head as one block of ``G * Cq`` query rows against that head's ``Ck`` keys (the key
and value gradients sum over all of them), so the keys and values are never repeated ``G`` times.

References:
  M. Milakov, N. Gimelshein, "Online normalizer calculation for softmax", arXiv:1805.02867 (2018).
  M. N. Rabe, C. Staats, "Self-attention does not need O(n^2) memory", arXiv:2112.05682 (2021).
  T. Dao et al., "FlashAttention: fast and memory-efficient exact attention with IO-awareness",
  NeurIPS 2022, arXiv:2205.14135.
  T. Dao, "FlashAttention-2: faster attention with better parallelism and work partitioning",
  arXiv:2307.08691 (2023).
  N. Shazeer, "Fast transformer decoding: one write-head is all you need", arXiv:1911.02150 (2019).
  J. Ainslie et al., "GQA: training generalized multi-query transformer models from multi-head
  checkpoints", EMNLP 2023, arXiv:2305.13245.
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
    check_unbatched,
    check_valid_lens,
    num_kv_groups,
)
from jax_attention.nn import mods
from jax_attention.nn.masking import (
    group_heads,
    masked_fill_value,
    ungroup_heads,
    zero_unattended,
)
from jax_attention.nn.precision import compute_dtype

__all__ = ["dot_product_attention"]

# The score and pooling strings of jax_attention/nn/scoring.py, and the products of the backward pass
# (scores, gradients of the values, of the weights and of queries/keys) in the same letters. The
# backward pass works on transposed blocks, keys as rows ("...st"), which XLA:CPU runs faster
# (docs/implementation-notes.md, "Transposed backward blocks").
DOT_SCORES = "...tq,...sq->...ts"
WEIGHTED_SUM = "...ts,...sv->...tv"
KEY_SCORES = "...sq,...tq->...st"
VALUES_GRAD = "...st,...tv->...sv"
WEIGHTS_GRAD = "...sv,...tv->...st"
QUERIES_GRAD = "...st,...sq->...tq"
KEYS_GRAD = "...st,...tq->...sq"

# Grouped-query attention uses the same strings: the G query heads that share a key/value head
# are one block of G * Cq query rows, (B, ..., N_kv, G * Cq, q) against (B, ..., N_kv, Ck, q)
# (see _merge_group_rows; measured against the alternatives in docs/implementation-notes.md).


class Chunking(NamedTuple):
    """The static (hashable) plan of one call: lengths, chunk sizes and which masks apply — what
    the loop bounds (:func:`key_chunk_range`, :func:`query_chunk_range`,
    :func:`backward_key_chunk_stop`) and the block masks are computed from. Made by
    :func:`chunking`."""

    num_queries: int  # T, before padding
    num_keys: int  # S, before padding
    query_chunk: int  # Cq; divides the padded query length
    key_chunk: int  # Ck; divides the padded key length
    padded_queries: int  # T rounded up to a multiple of Cq
    padded_keys: int  # S rounded up to a multiple of Ck
    is_causal: bool
    window: tuple[int, int] | None = None  # (left, right): keys t - left <= s <= t + right
    grouped: bool = False  # queries (B, ..., N_kv, G, T, q) against keys (B, ..., N_kv, S, q)

    @property
    def num_query_chunks(self) -> int:
        return self.padded_queries // self.query_chunk

    @property
    def num_key_chunks(self) -> int:
        return self.padded_keys // self.key_chunk


def chunking(num_queries: int, num_keys: int, query_chunk: int, key_chunk: int, *,
             is_causal: bool = False, window: tuple[int, int] | None = None,
             grouped: bool = False) -> Chunking:
    """The static plan of one call: ``T`` and ``S`` padded up to multiples of the chunks ``Cq``
    and ``Ck`` (as :func:`dot_product_attention` chooses them), and what masks the chunks."""
    return Chunking(
        num_queries=num_queries, num_keys=num_keys, query_chunk=query_chunk, key_chunk=key_chunk,
        padded_queries=-(-num_queries // query_chunk) * query_chunk,
        padded_keys=-(-num_keys // key_chunk) * key_chunk, is_causal=is_causal, window=window,
        grouped=grouped)


# The automatic chunk (query_chunk_size=None, key_chunk_size=None): the largest power of two in
# [MIN_AUTO_CHUNK, MAX_AUTO_CHUNK] whose scores block over all batch axes, batch * chunk**2, holds
# at most AUTO_BLOCK_ELEMENTS numbers (2 MiB of float32, one core's L2), so that blocks stay in
# cache; below 128 the loops' overhead dominates (docs/implementation-notes.md, "Chunk size").
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


def _set_rows(x, rows, start):
    """``x`` with rows ``start : start + len(rows)`` of its second-to-last axis set to ``rows``."""
    return lax.dynamic_update_slice_in_dim(x, rows, start, axis=x.ndim - 2)


# --------------------------------------------------------------------------- which blocks run
# Pure integer arithmetic on chunk indices (Python ints or int32 scalars, traced included): the
# loop bounds of the forward and backward passes. Each is exact and conservative: a skipped block
# has no (query, key) pair the masks keep, so it would add exactly zero to every sum. Bounds use
# the padded query positions (a padded query row is dropped, but it must see in the backward pass
# the same keys as in the forward pass, whose log-sum-exp it reuses).


def key_chunk_range(cfg: Chunking, i, longest=None):
    """``(start, stop)``: the key chunks ``start <= j < stop`` query chunk ``i`` visits in the
    forward pass, as int32 scalars.

    Causal: none after the chunk's last query. Window ``(left, right)``: none wholly before
    ``first query - left`` or after ``last query + right``. ``longest``: the largest valid length
    among the chunk's queries (``None``: no lengths): none at or beyond it. ``start >= stop``
    means no key chunk (the chunk's queries attend nothing).
    """
    Cq, Ck = cfg.query_chunk, cfg.key_chunk
    start = jnp.zeros((), jnp.int32)
    stop = jnp.asarray(cfg.num_key_chunks, jnp.int32)
    if cfg.is_causal:
        stop = jnp.minimum(stop, ((i + 1) * Cq + Ck - 1) // Ck)
    if cfg.window is not None:
        left, right = cfg.window
        start = jnp.maximum(i * Cq - left, 0) // Ck
        stop = jnp.minimum(stop, ((i + 1) * Cq - 1 + right) // Ck + 1)
    if longest is not None:
        stop = jnp.minimum(stop, (longest + Ck - 1) // Ck)
    return start.astype(jnp.int32), stop.astype(jnp.int32)


def query_chunk_range(cfg: Chunking, j):
    """``(start, stop)``: the query chunks ``start <= i < stop`` the backward pass visits for key
    chunk ``j``, as int32 scalars: the same blocks as :func:`key_chunk_range` without lengths
    (causal: no query chunk that ends before the key chunk starts; window: none wholly before
    ``first key - right`` or after ``last key + left``)."""
    Cq, Ck = cfg.query_chunk, cfg.key_chunk
    start = jnp.zeros((), jnp.int32)
    stop = jnp.asarray(cfg.num_query_chunks, jnp.int32)
    if cfg.is_causal:
        start = jnp.asarray((j * Ck) // Cq, jnp.int32)
    if cfg.window is not None:
        left, right = cfg.window
        start = jnp.maximum(start, jnp.maximum(j * Ck - right, 0) // Cq)
        stop = jnp.minimum(stop, ((j + 1) * Ck - 1 + left) // Cq + 1)
    return start.astype(jnp.int32), stop.astype(jnp.int32)


def backward_key_chunk_stop(cfg: Chunking, longest=None):
    """One past the last key chunk the backward pass's outer loop visits (it starts at 0: the
    first query sees the first key whatever the window): key chunks beyond the last query
    (causal), beyond ``last query + right`` (window) or beyond ``longest``, the largest valid
    length (``None``: no lengths), have no query and keep zero gradients."""
    Ck = cfg.key_chunk
    stop = jnp.asarray(cfg.num_key_chunks, jnp.int32)
    if cfg.is_causal:
        stop = jnp.minimum(stop, (cfg.padded_queries + Ck - 1) // Ck)
    if cfg.window is not None:
        stop = jnp.minimum(stop, (cfg.padded_queries - 1 + cfg.window[1]) // Ck + 1)
    if longest is not None:
        stop = jnp.minimum(stop, (longest + Ck - 1) // Ck)
    return stop.astype(jnp.int32)


# --------------------------------------------------------------------------- one block


def _chunk_keep(cfg: Chunking, limits, mask, i, j, rank: int):
    """Boolean mask of query chunk ``i`` against key chunk ``j``, or ``None`` when all attend.

    Built from positions, so its size is that of one chunk pair: broadcastable to
    ``(B, ..., Cq, Ck)`` (grouped: ``(B, ..., N_kv, G, Cq, Ck)``, before
    :func:`_merge_group_mask`), with ``rank`` axes (equal ranks keep strict rank promotion happy).

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
    if cfg.window is not None:
        left, right = cfg.window  # masking.local_window_mask(T, S, (left, right)), offset 0
        window = ((key_pos[None, :] >= query_pos[:, None] - left)
                  & (key_pos[None, :] <= query_pos[:, None] + right))
        parts.append(window.reshape((1,) * (rank - 2) + (Cq, Ck)))
    if mask is not None:
        if mask.shape[-2] != 1:
            mask = lax.dynamic_slice_in_dim(mask, i * Cq, Cq, axis=rank - 2)
        if mask.shape[-1] != 1:
            mask = lax.dynamic_slice_in_dim(mask, j * Ck, Ck, axis=rank - 1)
        parts.append(mask)
    if not parts:
        return None
    return functools.reduce(jnp.logical_and, parts)


def _merge_group_rows(x):
    """``(..., G, C, X) -> (..., G * C, X)``: a grouped chunk as one block of rows."""
    return x.reshape(x.shape[:-3] + (-1, x.shape[-1]))


def _merge_group_queries(x):
    """``(..., G, C) -> (..., G * C)``: per-query numbers of a grouped chunk."""
    return x.reshape(x.shape[:-2] + (-1,))


def _merge_group_mask(keep, groups: int, query_chunk: int):
    """``(..., G | 1, Cq | 1, Ck | 1) -> (..., G * Cq, Ck | 1)``: a grouped block mask for the
    merged rows of :func:`_merge_group_rows` (broadcast first: chunk-sized, never ``T x S``)."""
    keep = jnp.broadcast_to(keep, keep.shape[:-3] + (groups, query_chunk, keep.shape[-1]))
    return keep.reshape(keep.shape[:-3] + (groups * query_chunk, keep.shape[-1]))


def _block_grids(cfg: Chunking, shape, i, j, *, transposed: bool = False):
    """``(b, h, q_idx, kv_idx)`` of a block of scores of ``shape`` — ``(B, ..., R, Ck)``, or
    ``(B, ..., Ck, R)`` ``transposed`` — for the mods (:func:`jax_attention.nn.mods.index_grids`'
    meaning). ``R`` is the query chunk's ``Cq`` rows, or grouped the ``G * Cq`` merged rows of a
    key/value head, row ``r`` being query ``i * Cq + r % Cq`` of head ``n_kv * G + r // Cq``."""
    rank, Cq, Ck = len(shape), cfg.query_chunk, cfg.key_chunk
    row_axis, key_axis = (-1, -2) if transposed else (-2, -1)
    rows = jnp.arange(shape[row_axis], dtype=jnp.int32)
    b = mods.along(jnp.arange(shape[0], dtype=jnp.int32), 0, rank)
    q = mods.along(i * Cq + rows % Cq, row_axis, rank)
    kv = mods.along(j * Ck + jnp.arange(Ck, dtype=jnp.int32), key_axis, rank)
    if cfg.grouped:
        groups = shape[row_axis] // Cq
        h = (mods.along(jnp.arange(shape[-3], dtype=jnp.int32), -3, rank) * groups
             + mods.along(rows // Cq, row_axis, rank))
    elif rank >= 4:
        h = mods.along(jnp.arange(shape[-3], dtype=jnp.int32), -3, rank)
    else:
        h = jnp.zeros((1,) * rank, jnp.int32)
    return b, h, q, kv


def _block_keep(cfg: Chunking, limits, mask, mask_mod, i, j, block_shape):
    """The mask of one block in merged rows ``(B, ..., R, Ck)`` (see :func:`_block_grids`), or
    ``None``: the lengths, causality, window and dense mask of :func:`_chunk_keep`, ANDed with
    the mask mod evaluated on the block's positions."""
    keep = _chunk_keep(cfg, limits, mask, i, j, len(block_shape) + cfg.grouped)
    if keep is not None and cfg.grouped:
        keep = _merge_group_mask(keep, block_shape[-2] // cfg.query_chunk, cfg.query_chunk)
    if mask_mod is None:
        return keep
    mod_keep = mask_mod(*_block_grids(cfg, block_shape, i, j))
    return mod_keep if keep is None else keep & mod_keep


def _block_any(cfg: Chunking, mask_mod, i, j):
    """Whether block ``(i, j)`` may hold a pair the mask mod keeps (run-time: lengths and
    segment ids are read from the block's range); only called when the mod can skip."""
    return jnp.asarray(mask_mod.block_any(i * cfg.query_chunk, cfg.query_chunk,
                                          j * cfg.key_chunk, cfg.key_chunk), bool)


def _skipping(cfg: Chunking, mask_mod, i, j, step, carry):
    """``step(carry)`` for block ``(i, j)``, or ``carry`` unchanged when the mask mod rules the
    block out (``lax.cond``; under ``vmap`` of a batched mod both run and one is selected)."""
    if mask_mod is None or not mask_mod.skips_blocks:
        return step(carry)
    return lax.cond(_block_any(cfg, mask_mod, i, j), step, lambda c: c, carry)


# --------------------------------------------------------------------------- the passes


def _forward(cfg: Chunking, queries, keys, values, limits, mask, mods_, sinks):
    """Online-softmax forward on padded, pre-scaled inputs: ``(output, logsumexp)``.

    Returns the output ``(B, ..., Tp, v)`` and per query ``log(sum_s exp(score_ts))`` over its
    attended keys and the sink ``(B, ..., Tp)`` (``-inf`` for a query that attends nothing),
    all the backward pass needs to rebuild the weights of any block. Grouped: queries, output
    and log-sum-exp have the group axis ``(B, ..., N_kv, G, Tp, .)``. ``mods_`` is
    ``(score_mod, mask_mod)``; ``sinks`` ``None`` or the sink logit per row of a block.
    """
    batch_shape = queries.shape[:-2]
    Cq, dtype = cfg.query_chunk, queries.dtype
    fill = masked_fill_value(dtype)
    # The rows of one query chunk: Cq, or grouped the G * Cq rows of a key/value head's G heads.
    rows_shape = batch_shape[:-1] + (batch_shape[-1] * Cq,) if cfg.grouped else batch_shape + (Cq,)
    if sinks is not None:  # (N,) or grouped (N_kv, G) to the layout of a chunk's rows
        sink_rows = jnp.broadcast_to(sinks[..., None], sinks.shape + (Cq,)).astype(dtype)
        if cfg.grouped:
            sink_rows = sink_rows.reshape(sinks.shape[:-1] + (-1,))

    def query_chunk(i):
        q_i = _rows(queries, i * Cq, Cq)
        if cfg.grouped:
            q_i = _merge_group_rows(q_i)
        if sinks is None:
            init = (jnp.full(rows_shape, fill, dtype), jnp.zeros(rows_shape, dtype))
        else:  # a sink is a key of logit `sink` and value 0, met before the others
            init = (jnp.broadcast_to(sink_rows, rows_shape), jnp.ones(rows_shape, dtype))
        init += (jnp.zeros(rows_shape + (values.shape[-1],), dtype),)
        longest = (None if limits is None
                   else jnp.max(lax.dynamic_slice_in_dim(limits, i * Cq, Cq, axis=1)))
        start, stop = key_chunk_range(cfg, i, longest)

        def key_step(j, carry):
            return _skipping(cfg, mods_[1], i, j, functools.partial(
                _block_forward, cfg, limits, mask, mods_, q_i, keys, values, i, j), carry)

        running_max, normaliser, accumulator = lax.fori_loop(start, stop, key_step, init)
        # A row that attended nothing has normaliser 0 and accumulator 0: its output is 0.
        attended = normaliser > 0
        output = accumulator / jnp.where(attended, normaliser, jnp.ones((), dtype))[..., None]
        logsumexp = jnp.where(attended, running_max + jnp.log(jnp.where(attended, normaliser,
                                                                          jnp.ones((), dtype))),
                              -jnp.inf)
        # Grouped: (..., G * Cq, .) back to (..., G, Cq, .).
        return output.reshape(batch_shape + (Cq, -1)), logsumexp.reshape(batch_shape + (Cq,))

    outputs, logsumexps = lax.map(query_chunk, jnp.arange(cfg.num_query_chunks, dtype=jnp.int32))
    # (num_chunks, B, ..., Cq, v) -> (B, ..., Tp, v): O(T v), not O(T S).
    output = jnp.moveaxis(outputs, 0, -3).reshape(batch_shape + (cfg.padded_queries, -1))
    logsumexp = jnp.moveaxis(logsumexps, 0, -2).reshape(batch_shape + (cfg.padded_queries,))
    return output, logsumexp


def _block_forward(cfg: Chunking, limits, mask, mods_, q_i, keys, values, i, j, carry):
    """One block of the forward pass: the online-softmax ``carry`` ``(m, l, a)`` of query rows
    ``q_i`` updated with key chunk ``j`` — the block's scores, score mod and mask
    (:func:`_block_scores`), then ``m' = max(m, max_s S)``, ``l' = exp(m - m') l + sum_s
    exp(S - m')``, ``a' = exp(m - m') a + exp(S - m') V``."""
    running_max, normaliser, accumulator = carry
    Ck, zero = cfg.key_chunk, jnp.zeros((), q_i.dtype)
    k_j, v_j = _rows(keys, j * Ck, Ck), _rows(values, j * Ck, Ck)
    scores, keep, v_j = _block_scores(cfg, limits, mask, mods_, q_i, k_j, v_j, i, j)
    new_max = jnp.maximum(running_max, jnp.max(scores, axis=-1))
    # Until a row meets a key it may attend, its maximum stays at the (finite) fill value, so
    # every exponent below is finite; masked entries are then zeroed by `where`.
    exps = jnp.exp(scores - new_max[..., None])
    if keep is not None:
        exps = jnp.where(keep, exps, zero)
    rescale = jnp.exp(running_max - new_max)  # earlier chunks were summed at the old max
    normaliser = rescale * normaliser + jnp.sum(exps, axis=-1)
    accumulator = rescale[..., None] * accumulator + jnp.einsum(WEIGHTED_SUM, exps, v_j)
    return new_max, normaliser, accumulator


def _block_scores(cfg: Chunking, limits, mask, mods_, q, k, v, i, j, *, transposed=False):
    """The block function both passes share: ``(scores, keep, v)`` of query rows ``q`` against
    key chunk ``k`` — ``S = q k^T`` (queries pre-scaled), the score mod, then the mask (masked
    scores get the fill value); ``q``, ``k``, ``v`` with what nothing attends zeroed
    (:func:`~jax_attention.nn.masking.zero_unattended`). ``transposed``: ``S^T`` and its mask
    ``(B, ..., Ck, R)``, keys as rows, as the backward pass wants them; then also returns the
    score mod's VJP (``None`` without a mod) and the zeroed ``q``, ``k``:
    ``(scores, keep, v, mod_vjp, q, k)``."""
    score_mod, mask_mod = mods_
    block_shape = q.shape[:-1] + k.shape[-2:-1]
    keep = _block_keep(cfg, limits, mask, mask_mod, i, j, block_shape)
    if keep is not None:
        q, k, v = zero_unattended(keep, q, k, v)
        if transposed:
            keep = jnp.swapaxes(keep, -1, -2)
    raw = jnp.einsum(KEY_SCORES, k, q) if transposed else jnp.einsum(DOT_SCORES, q, k)
    mod_vjp = None
    if score_mod is not None:
        grids = _block_grids(cfg, raw.shape, i, j, transposed=transposed)
        if transposed:  # the backward pass: the mod's VJP too, for the scores and its parameters
            floats, rebuild = mods.float_params(score_mod)
            raw, mod_vjp = jax.vjp(lambda s, p: rebuild(p)(s, *grids), raw, floats)
        else:
            raw = score_mod(raw, *grids)
    scores = raw if keep is None else jnp.where(keep, raw, masked_fill_value(raw.dtype))
    return (scores, keep, v, mod_vjp, q, k) if transposed else (scores, keep, v)


def _block_backward(cfg: Chunking, limits, mask, mods_, i, j, blocks, carry):
    """What block ``(i, j)`` adds to the gradients ``carry = (dQ_i, dK_j, dV_j, d_params)``
    (``d_params``: the score mod's float parameters), from ``blocks = (q_i, k_j, v_j, do_i,
    lse_i, delta_i)``: the query rows, the key chunk, the rows' output gradient, saved
    log-sum-exp and ``D``. Grouped: the ``G * Cq`` merged rows of a key/value head.

    The block is formed transposed, ``P^T`` ``(B, ..., Ck, R)``, so that ``dV = P^T dO`` and
    ``dK = dS^T Q`` are row-major products (see the einsum strings)."""
    q_i, k_j, v_j, do_i, lse_i, delta_i = blocks
    dq, dk, dv, d_params = carry
    scores, keep, v, mod_vjp, q, k = _block_scores(cfg, limits, mask, mods_, q_i, k_j, v_j, i,
                                                   j, transposed=True)
    zero = jnp.zeros((), q.dtype)
    weights = jnp.exp(scores - lse_i[..., None, :])
    if keep is not None:
        weights = jnp.where(keep, weights, zero)
    weights_grad = jnp.einsum(WEIGHTS_GRAD, v, do_i)
    scores_grad = weights * (weights_grad - delta_i[..., None, :])
    if keep is not None:
        # dP of a masked entry can be NaN (a NaN value attended by another query of the chunk);
        # its weight is 0 and so must its score gradient be, as `where` gives in the plain
        # attention's autodiff.
        scores_grad = jnp.where(keep, scores_grad, zero)
    if mod_vjp is not None:
        scores_grad, params_grad = mod_vjp(scores_grad)
        d_params = [a + b for a, b in zip(d_params, params_grad)]
    return (dq + jnp.einsum(QUERIES_GRAD, scores_grad, k), dk + jnp.einsum(KEYS_GRAD, scores_grad, q),
            dv + jnp.einsum(VALUES_GRAD, weights, do_i), d_params)


def _backward(cfg: Chunking, residuals, cotangents):
    """FlashAttention-2 backward: recompute each block's weights from the saved log-sum-exp.

    With ``P = exp(S - L)``, ``dP = dO V^T`` and ``D = rowsum(dO * O) - dL`` (``rowsum(dO * O)``
    equals ``rowsum(P * dP)``; ``dL`` is the log-sum-exp's own cotangent): ``dV = P^T dO``,
    ``dS = P * (dP - D)``, ``dQ = dS K``, ``dK = dS^T Q``; a score mod's VJP takes ``dS`` to the
    raw scores and its parameters (:func:`_block_backward`). A sink's gradient is
    ``-sum_t exp(sink - L_t) D_t``. Outer loop over key chunks (their ``dK``, ``dV`` are
    finished in one pass), inner loop over query chunks, accumulating ``dQ`` in place; both
    loops skip the blocks the forward pass skipped.
    """
    queries, keys, values, limits, mask, mods_, sinks, output, logsumexp = residuals
    output_grad, lse_grad = cotangents
    Cq, Ck = cfg.query_chunk, cfg.key_chunk
    output_grad = output_grad.astype(queries.dtype)
    delta = jnp.sum(output_grad * output, axis=-1) - lse_grad.astype(queries.dtype)  # D
    logsumexp = jnp.where(jnp.isfinite(logsumexp), logsumexp, 0)  # rows that attend nothing
    floats, _ = mods.float_params(mods_[0])

    def key_chunk(j, grads):
        dq, dk, dv, d_params = grads
        k_j, v_j = _rows(keys, j * Ck, Ck), _rows(values, j * Ck, Ck)

        def query_step(i, carry):
            dq, dk_j, dv_j, d_params = carry
            blocks = (_rows(queries, i * Cq, Cq), k_j, v_j, _rows(output_grad, i * Cq, Cq),
                      lax.dynamic_slice_in_dim(logsumexp, i * Cq, Cq, axis=logsumexp.ndim - 1),
                      lax.dynamic_slice_in_dim(delta, i * Cq, Cq, axis=delta.ndim - 1))
            if cfg.grouped:  # the G query heads of a key/value head as one block of G * Cq rows
                blocks = (_merge_group_rows(blocks[0]), k_j, v_j, _merge_group_rows(blocks[3]),
                          _merge_group_queries(blocks[4]), _merge_group_queries(blocks[5]))
            dq_i = jnp.zeros_like(blocks[0])
            dq_i, dk_j, dv_j, d_params = _skipping(
                cfg, mods_[1], i, j, functools.partial(_block_backward, cfg, limits, mask, mods_,
                                                       i, j, blocks),
                (dq_i, dk_j, dv_j, d_params))
            if cfg.grouped:
                dq_i = dq_i.reshape(dq_i.shape[:-2] + (-1, Cq) + dq_i.shape[-1:])
            return _set_rows(dq, _rows(dq, i * Cq, Cq) + dq_i, i * Cq), dk_j, dv_j, d_params

        start, stop = query_chunk_range(cfg, j)
        dq, dk_j, dv_j, d_params = lax.fori_loop(
            start, stop, query_step, (dq, jnp.zeros_like(k_j), jnp.zeros_like(v_j), d_params))
        return dq, _set_rows(dk, dk_j, j * Ck), _set_rows(dv, dv_j, j * Ck), d_params

    stop = backward_key_chunk_stop(cfg, None if limits is None else jnp.max(limits))
    dq, dk, dv, d_params = lax.fori_loop(
        jnp.zeros((), jnp.int32), stop, key_chunk,
        (jnp.zeros_like(queries), jnp.zeros_like(keys), jnp.zeros_like(values),
         [jnp.zeros_like(p) for p in floats]))
    d_mods = (None if mods_[0] is None else mods.float_cotangents(mods_[0], d_params), None)
    d_sinks = None if sinks is None else _sinks_grad(sinks, logsumexp, delta)
    # Lengths and masks are not differentiable (integers and booleans).
    return dq, dk, dv, None, None, d_mods, d_sinks


def _sinks_grad(sinks, logsumexp, delta):
    """``-sum exp(sink - L) D`` over every row a sink serves, in the sinks' layout."""
    lead = logsumexp.ndim - sinks.ndim - 1  # the batch axes before the sinks' (head) axes
    total = -jnp.exp(sinks.reshape((1,) * lead + sinks.shape + (1,)) - logsumexp) * delta
    return jnp.sum(total, axis=tuple(range(lead)) + (-1,))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _chunked_attention(cfg, queries, keys, values, limits, mask, mods_, sinks):
    return _forward(cfg, queries, keys, values, limits, mask, mods_, sinks)


def _chunked_attention_fwd(cfg, queries, keys, values, limits, mask, mods_, sinks):
    output, logsumexp = _forward(cfg, queries, keys, values, limits, mask, mods_, sinks)
    # O(T + S) residuals: the inputs (kept alive by the caller anyway), the output and one float
    # per query; the weights are recomputed, never stored.
    return (output, logsumexp), (queries, keys, values, limits, mask, mods_, sinks, output,
                                 logsumexp)


_chunked_attention.defvjp(_chunked_attention_fwd, _backward)


def dot_product_attention(queries, keys, values, valid_lens=None, *, mask=None, is_causal=False,
                          scale=None, local_window_size=None, logit_softcap=None,
                          query_chunk_size=None, key_chunk_size=None, mask_mod=None,
                          score_mod=None, sinks=None, return_lse=False):
    """Scaled dot-product attention in chunks, in ``O(T + S)`` memory — d2l §11.3.3, exactly.

    ``softmax(Q K^T * scale) V`` with masking, equal (to float rounding) to
    :func:`jax_attention.nn.scoring.dot_product_attention`'s output with the same arguments, but
    computed chunk by chunk with an online softmax: for each query, over the key chunks ``j`` in
    turn,

        m' = max(m, max_s S_ts),   l' = exp(m - m') l + sum_s exp(S_ts - m'),
        a' = exp(m - m') a + sum_s exp(S_ts - m') V_s,                  output = a / l,

    where ``S = Q K^T * scale`` — soft-capped to ``c * tanh(S / c)`` with ``logit_softcap = c``,
    then masked — is only ever formed for one ``(query_chunk, key_chunk)`` block. The backward
    pass (custom VJP) recomputes those blocks from the saved output and ``log l + m`` per query
    (FlashAttention-2). Key chunks that causality, the window or ``valid_lens`` leave unattended
    by a whole query chunk are skipped, forward and backward (a window of ``w`` keys costs
    ``O(T w)``). float16/bfloat16 inputs are computed in float32 and the output cast back;
    float64 stays float64 (under x64).

    Only the output is returned: the weights would be the ``T x S`` array this function avoids.
    Use :func:`jax_attention.nn.scoring.dot_product_attention_weights` to inspect them. There is no
    score ``bias`` argument (a full bias and its gradient would be ``T x S`` too).

    Masking as in :mod:`jax_attention.nn.masking`: ``valid_lens``, ``mask``, ``is_causal`` and
    ``local_window_size`` combine by AND; a query that may attend no key (a window over padding,
    say) gets a zero output and zero gradients, and NaN/Inf in masked positions never reach valid
    outputs or gradients. ``valid_lens``, ``is_causal`` and the window are turned into masks chunk
    by chunk from positions, never into a ``T x S`` array. A ``mask`` is sliced chunk by chunk,
    but a mask with full ``T`` and ``S`` axes is itself ``T x S`` booleans (and is copied once,
    padded, when the chunks do not divide ``T`` or ``S``): prefer ``valid_lens``, ``is_causal``,
    ``local_window_size`` and masks with size-1 axes, e.g. ``(B, 1, 1, S)``.

    Grouped-query attention: keys and values may have ``N_kv`` heads dividing the queries' ``N``
    (head axis -3, rank >= 4); query head ``n`` attends with key/value head ``n // G``,
    ``G = N / N_kv`` (``N_kv = 1``: multi-query attention). The keys and values are not repeated:
    the queries are viewed as ``(B, ..., N_kv, G, T, q)`` and each block multiplies the ``G * Cq``
    query rows of a key/value head's group with that head's key chunk.

    Args:
      queries: ``(B, ..., N, T, q)``, ``(B, ..., T, q)``, or unbatched ``(T, q)``.
      keys: ``(B, ..., N_kv, S, q)`` (``N_kv`` dividing ``N``), ``(B, ..., S, q)``, or ``(S, q)``.
      values: ``(B, ..., N_kv, S, v)``, ``(B, ..., S, v)``, or ``(S, v)``, as the keys.
      valid_lens: ``None``, ``(B,)`` or ``(B, T)`` integers in ``[0, S]`` (unbatched: ``()`` or
        ``(T,)``): the number of keys each query may attend (checked when concrete; under jit
        they act as if clipped to ``[0, S]``).
      mask: boolean, broadcastable to ``(B, ..., N, T, S)`` (the queries' heads); True = attend.
      is_causal: query ``t`` may attend only keys ``s <= t`` (scoring's ``causal_mask(T, S)``).
      scale: the factor of the scores ``Q K^T``, a static real number; ``None``: ``1 / sqrt(q)``.
        It is applied to the queries (a ``T x q`` pass, not a ``T x S`` one).
      local_window_size: ``None``, an int ``w`` or ``(left, right)`` integers ``>= 0``: query ``t``
        may attend only keys ``t - left <= s <= t + right`` (``jax.nn``'s rule; ``w`` means
        ``(w, w)``; ``(w, 0)`` with ``is_causal`` is a causal sliding window of ``w + 1`` keys).
      logit_softcap: ``None`` or ``c > 0``: the scores (after ``scale``, before the masks) become
        ``c * tanh(s / c)``, as in Gemma 2.
      query_chunk_size: at most this many queries per chunk (``Cq``). Chunks are spread evenly, so
        the ``ceil(T / Cq)`` chunks cover ``T`` with less than one padded row each; ``T`` need
        not be a multiple. ``None``: :func:`auto_chunk_size` of the batch axes' product ``B·...``
        (128 to 512: a ``(B, ..., Cq, Ck)`` block of about 2 MiB of float32, which stays in cache).
      key_chunk_size: at most this many keys per chunk (``Ck``), likewise.
      mask_mod, score_mod, sinks, return_lse: as in
        :func:`jax_attention.nn.scoring.dot_product_attention` (:mod:`jax_attention.nn.mods`).
        Each block evaluates the mods on its own positions; a block the mask mod rules out
        (:meth:`~jax_attention.nn.mods.MaskMod.block_any`: positions, and each block's lengths
        and segment ids at run time) is skipped in both passes, so a row of 8 packed documents
        (:func:`~jax_attention.nn.mods.segment_ids`) costs about an eighth of the full work. A
        plain-function mod is evaluated but skips nothing, and must not close over values being
        differentiated (give those as :class:`~jax_attention.nn.mods.ScoreMod` parameters).

    Returns:
      The output ``(B, ..., N, T, v)`` (unbatched: ``(T, v)``) in the inputs' dtype; zero for
      fully masked queries. With ``return_lse``: ``(output, lse)``, ``lse`` ``(B, ..., N, T)``.

    Raises:
      ValueError, TypeError: for the inputs :func:`jax_attention.nn.scoring.dot_product_attention`
        rejects (``TypeError`` for an ``is_causal`` that is not a Python bool, traced included;
        ``ValueError`` naming both shapes when ``N_kv`` does not divide ``N``; the checks of
        ``scale``, ``local_window_size`` and ``logit_softcap`` are
        :mod:`jax_attention._checks`'), and for chunk sizes that are not positive ints.

    References: Rabe & Staats, arXiv:2112.05682 (2021); Dao et al., FlashAttention,
    arXiv:2205.14135 (2022); Dao, FlashAttention-2, arXiv:2307.08691 (2023); Ainslie et al., GQA,
    arXiv:2305.13245 (2023).
    """
    unbatched, queries, keys, values, valid_lens = check_unbatched(queries, keys, values,
                                                                   valid_lens)
    queries, keys, values = check_attention_inputs(queries, keys, values, same_depth=True,
                                                   grouped_heads=True)
    if valid_lens is not None:
        valid_lens = check_valid_lens(valid_lens, queries.shape[0], queries.shape[-2],
                                      keys.shape[-2])
    if mask is not None:
        mask = check_mask(mask, queries.shape[:-1] + keys.shape[-2:-1])
    variants = mods.check_variants(queries.shape[:-1] + keys.shape[-2:-1], scale,
                                   local_window_size, logit_softcap, mask_mod, score_mod, sinks)
    output, lse = chunked_attention(
        queries, keys, values, valid_lens, mask,
        is_causal=check_static_bool("is_causal", is_causal), variants=variants,
        query_chunk_size=query_chunk_size, key_chunk_size=key_chunk_size)
    results = (output, lse) if check_static_bool("return_lse", return_lse) else (output,)
    results = tuple(r[0] for r in results) if unbatched else results
    return results if len(results) > 1 else results[0]


def chunked_attention(queries, keys, values, valid_lens, mask, *, is_causal: bool,
                      variants: mods.Variants, query_chunk_size=None, key_chunk_size=None):
    """:func:`dot_product_attention` on batched inputs its caller has checked — what
    ``jax_attention.nn.scoring.dot_product_attention(..., implementation="chunked")`` calls, so
    that its inputs are checked once. Not part of the user-facing API (``__all__``).

    Args:
      queries, keys, values: float arrays of one dtype, ``(B, ..., N, T, q)``,
        ``(B, ..., N_kv, S, q)``, ``(B, ..., N_kv, S, v)`` (or without heads).
      valid_lens: ``None`` or checked integer lengths ``(B,)`` or ``(B, T)``.
      mask: ``None`` or a checked boolean mask broadcastable to ``(B, ..., N, T, S)``.
      is_causal: a checked bool. variants: the checked variants
        (:func:`jax_attention.nn.mods.check_variants`). query_chunk_size, key_chunk_size: as in
        :func:`dot_product_attention`.

    Returns:
      ``(output, lse)``: the output ``(B, ..., N, T, v)`` in the inputs' dtype and the
      log-sum-exp ``(B, ..., N, T)`` in the compute dtype (float32 for half precision).
    """
    dtype, rank = queries.dtype, queries.ndim
    num_queries, num_keys = queries.shape[-2], keys.shape[-2]
    batch = math.prod(queries.shape[:-2])
    query_chunk = _chunk_size(query_chunk_size, num_queries, "query_chunk_size", batch)
    key_chunk = _chunk_size(key_chunk_size, num_keys, "key_chunk_size", batch)
    compute, sinks = compute_dtype(dtype), variants.sinks
    if num_queries == 0 or num_keys == 0:
        # Nothing to chunk; with no key every query is fully masked (zero output), as in scoring.
        lse = jnp.full(queries.shape[:-1], -jnp.inf, compute)
        if sinks is not None:  # ... but for its sink
            lse = jnp.broadcast_to(sinks.astype(compute)[..., None], lse.shape)
        return jnp.zeros(queries.shape[:-1] + values.shape[-1:], dtype), lse
    groups = num_kv_groups(queries.shape, keys.shape)
    cfg = chunking(num_queries, num_keys, query_chunk, key_chunk, is_causal=is_causal,
                   window=variants.local_window_size, grouped=groups > 1)
    # Half precision is computed in float32 (scores, exponentials and sums alike); the casts'
    # transposes bring the gradients back to the inputs' dtype.
    if variants.scale is None:
        scaled_queries = queries.astype(compute) / math.sqrt(queries.shape[-1])
    else:
        scaled_queries = queries.astype(compute) * jnp.asarray(variants.scale, compute)
    if cfg.grouped:
        scaled_queries = group_heads(scaled_queries, groups)  # (B, ..., N_kv, G, T, q)
        if sinks is not None:  # (N_kv, G), as the grouped queries' heads
            sinks = jnp.broadcast_to(sinks, queries.shape[-3:-2]).reshape(-1, groups)
    output, lse = _chunked_attention(
        cfg,
        _pad_axis(scaled_queries, scaled_queries.ndim - 2, cfg.padded_queries),
        _pad_axis(keys.astype(compute), rank - 2, cfg.padded_keys),
        _pad_axis(values.astype(compute), rank - 2, cfg.padded_keys),
        _padded_limits(cfg, valid_lens), _padded_mask(cfg, mask, rank, groups),
        (mods.score_mods_of(variants), variants.mask_mod),
        None if sinks is None else sinks.astype(compute))
    if cfg.grouped:
        output, lse = ungroup_heads(output), ungroup_heads(lse[..., None])[..., 0]
    return output[..., :num_queries, :].astype(dtype), lse[..., :num_queries]


def _padded_limits(cfg: Chunking, valid_lens):
    """``None``, or int32 ``(B, Tp)``: query ``t`` may attend keys ``s < limits[b, t]``.

    Clipping to ``[0, S]`` keeps the padded keys masked and gives traced lengths the documented
    meaning; padded queries get 0 (attend nothing; their rows are dropped anyway)."""
    if valid_lens is None:
        return None
    lens = jnp.clip(jnp.asarray(valid_lens).astype(jnp.int32), 0, cfg.num_keys)
    if lens.ndim == 1:
        lens = jnp.broadcast_to(lens[:, None], (lens.shape[0], cfg.num_queries))
    return _pad_axis(lens, 1, cfg.padded_queries)


def _padded_mask(cfg: Chunking, mask, rank: int, groups: int):
    """``None``, or the mask with ``rank`` axes (grouped: the group axis split out), its query and
    key axes padded to ``(Tp, Sp)`` with False where they are not broadcast."""
    if mask is None:
        return None
    mask = jnp.asarray(mask)
    mask = mask.reshape((1,) * (rank - mask.ndim) + mask.shape)
    if cfg.grouped:
        mask = group_heads(mask, groups)  # (B|1, ..., N_kv|1, G|1, T|1, S|1)
    if mask.shape[-2] != 1:
        mask = _pad_axis(mask, mask.ndim - 2, cfg.padded_queries, False)
    if mask.shape[-1] != 1:
        mask = _pad_axis(mask, mask.ndim - 1, cfg.padded_keys, False)
    return mask
