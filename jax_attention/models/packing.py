"""Packed batches for the Transformer: several sentence pairs in one row, told apart by segment
ids, each token at its position in its own sentence — Flax's WMT example's
``inputs_segmentation`` / ``inputs_position`` (and the targets'), T5X's and MaxText's packing.

A packed batch holds the same sentences as the unpacked one in fewer, longer rows: source row
``b`` holds sentences ``1, 2, ...`` at consecutive positions, with segment ids ``1, 2, ...`` and
``0`` for the padding after them; target row ``b`` holds the same sentences' targets with the
same ids. Attention stays within a segment: the encoder's self-attention, the decoder's causal
self-attention and the encoder–decoder attention (target segment ``i`` attends source segment
``i`` of its row); the positional encoding is each token's position in its own sentence. So a
sentence's outputs, loss and gradient are those of the unpacked batch, to rounding (the tests
check it in float64, dropout off); only dropout draws other masks.

:class:`Segments` is what :func:`jax_attention.models.transformer.transformer`,
:func:`~jax_attention.models.transformer.teacher_forcing_loss` and
:class:`~jax_attention.models.transformer.TransformerSeq2Seq` take as ``segments=``;
:func:`jax_attention.data.packing.pack_pairs` packs the sentences of a batch.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from jax_attention._checks import check_int, check_values_in, is_integer_dtype
from jax_attention.models.translation import token_cross_entropy
from jax_attention.nn import mods
from jax_attention.nn.masking import causal_mask

__all__ = ["Segments", "segments", "segment_positions", "packed_teacher_forcing_inputs",
           "packed_cross_entropy", "segment_losses"]


class Segments(NamedTuple):
    """A packed batch's segment ids and positions, checked (:func:`segments` builds it).

    Attributes:
      src: ``(B, S)`` int32 segment ids of the source rows, ``0`` = padding.
      tgt: ``(B, T)`` int32 segment ids of the target rows, the same ids for a pair.
      src_positions, tgt_positions: ``(B, S)``, ``(B, T)`` int32, each token's position in
        its own sentence (:func:`segment_positions`).
    """

    src: jax.Array
    tgt: jax.Array
    src_positions: jax.Array
    tgt_positions: jax.Array


def segment_positions(segment_ids):
    """``(B, L)`` int32: each token's position in its own segment (``t`` minus the start of the
    run of equal ids it belongs to; padding counts on from its own start, and is masked)."""
    ids = jnp.asarray(segment_ids)
    t = lax.broadcasted_iota(jnp.int32, ids.shape, ids.ndim - 1)
    starts = jnp.concatenate([jnp.ones(ids.shape[:-1] + (1,), bool),
                              ids[..., 1:] != ids[..., :-1]], axis=-1)
    return t - lax.cummax(jnp.where(starts, t, 0), axis=ids.ndim - 1)


def _ids(name: str, ids, shape):
    ids = jnp.asarray(ids)
    if ids.shape != tuple(shape) or not is_integer_dtype(ids.dtype):
        raise ValueError(f"{name} must be integer ids of the shape of its tokens {tuple(shape)}, "
                         f"got dtype {ids.dtype} with shape {ids.shape}")
    return ids.astype(jnp.int32)


def segments(src_segment_ids, tgt_segment_ids, src_positions=None, tgt_positions=None, *,
             src_shape=None, tgt_shape=None, max_positions: int | None = None) -> Segments:
    """The checked :class:`Segments` of a packed batch: ``src_segment_ids (B, S)``,
    ``tgt_segment_ids (B, T)`` (integers, ``0`` = padding), and positions (``None``: each
    token's position in its segment, :func:`segment_positions`). ``src_shape``, ``tgt_shape``:
    the tokens' shapes the ids must have (``None``: their own); ``max_positions``: the
    positional table's rows, which concrete positions must stay below. ``ValueError`` naming
    the argument otherwise."""
    src = _ids("src_segment_ids", src_segment_ids, src_shape or jnp.shape(src_segment_ids))
    tgt = _ids("tgt_segment_ids", tgt_segment_ids, tgt_shape or jnp.shape(tgt_segment_ids))
    if src.shape[0] != tgt.shape[0]:
        raise ValueError(f"src_segment_ids (B, S) and tgt_segment_ids (B, T) must have the same "
                         f"B, got {src.shape} and {tgt.shape}")
    positions = []
    for name, given, ids in (("src_positions", src_positions, src),
                             ("tgt_positions", tgt_positions, tgt)):
        found = segment_positions(ids) if given is None else _ids(name, given, ids.shape)
        if max_positions is not None and given is not None:
            check_values_in(name, found, 0, max_positions - 1, f"[0, {max_positions})")
        positions.append(found)
    return Segments(src, tgt, *positions)


def packed_masks(segments_: Segments):
    """``(encoder (B, 1, S, S), decoder (B, 1, T, T), encoder–decoder (B, 1, T, S))``: attend
    within a segment (:func:`jax_attention.nn.mods.segment_ids`, padding ``0`` attending and
    attended by nothing), the decoder's causally. Not in ``__all__``."""
    src, tgt = segments_.src, segments_.tgt
    B, S, T = src.shape + tgt.shape[1:]

    def keep(q, kv, shape):
        return mods.mask_from_mod(mods.segment_ids(q, kv, padding_id=0), shape)

    return (keep(src, src, (B, 1, S, S)), keep(tgt, tgt, (B, 1, T, T)) & causal_mask(T)[None, None],
            keep(tgt, src, (B, 1, T, S)))


def packed_teacher_forcing_inputs(tgt, tgt_segment_ids, bos_id: int):
    """The decoder inputs of packed target rows ``(B, T)``: ``<bos>`` where a segment starts,
    else the previous token of the row (each sentence's own teacher forcing)."""
    tgt = jnp.asarray(tgt)
    ids = jnp.asarray(tgt_segment_ids)
    previous = jnp.concatenate([jnp.zeros(tgt.shape[:-1] + (1,), tgt.dtype), tgt[..., :-1]], -1)
    return jnp.where(segment_positions(ids) == 0, jnp.asarray(bos_id, tgt.dtype), previous)


def packed_cross_entropy(logits, labels, tgt_segment_ids, *, num_steps: int):
    """Each packed row's loss ``(B,)``: the sum of its sentences' book losses (cross-entropy
    summed over a sentence's tokens, divided by ``num_steps``, the length the unpacked batch
    pads to): the unpacked batch's summed loss is the packed rows' sum, to rounding."""
    keep = jnp.asarray(tgt_segment_ids) != 0
    divisor = check_int("num_steps", num_steps, 1)
    return jnp.sum(token_cross_entropy(logits, labels, keep), axis=-1) / divisor


def segment_losses(logits, labels, tgt_segment_ids, num_segments: int, *, num_steps: int):
    """Each sentence's book loss ``(B, num_segments)`` in a packed batch, sentence ``i`` of row
    ``b`` at ``[b, i - 1]`` (0 where a row holds fewer)."""
    ids = jnp.asarray(tgt_segment_ids)
    losses = token_cross_entropy(logits, labels, ids != 0) / check_int("num_steps", num_steps, 1)
    numbers = jnp.arange(1, num_segments + 1, dtype=ids.dtype).reshape((1,) * ids.ndim + (-1,))
    one_hot = ids[..., None] == numbers  # (B, T, num_segments)
    return jnp.sum(jnp.where(one_hot, losses[..., None], jnp.zeros((), losses.dtype)), axis=-2)
