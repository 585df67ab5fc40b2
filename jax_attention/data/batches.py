"""The training batches of an epoch, on the host — padded (:func:`epoch_batches`, cut to the
longest sentences by :func:`padded_lengths`) or packed (:func:`packed_epoch_batches`).

Packing: a batch of ``B`` sentence pairs, padded to ``(B, S)`` sources and ``(B, T)`` targets,
becomes ``R <= B`` rows of ``L`` tokens: each row holds whole pairs one after another (the
source of pair ``i`` of a row in the source row, its target in the target row, both with
segment id ``i``, ``1``-based), then padding with id ``0``
(:mod:`jax_attention.models.packing` is the model's side). The rows are filled first-fit
decreasing (the pairs by target length, then source length, longest first; each into the first
row where both of its sentences fit), which leaves few rows half empty. NumPy, before the arrays
reach the device.
"""

from __future__ import annotations

import numpy as np

__all__ = ["pad_batch", "padded_lengths", "epoch_batches", "first_fit_decreasing", "pack_batch",
           "pack_length", "pack_batches", "packed_epoch_batches"]


def pad_batch(batch, batch_size: int, src_pad: int, tgt_pad: int):
    """The last, smaller batch filled up to ``batch_size`` with rows of target valid length 0.

    Their masked loss is exactly 0, and so are their gradients, so the step computes the book's
    loss and gradient of the smaller batch — with one compiled shape instead of two.
    """
    src, src_valid_len, tgt, tgt_valid_len = batch
    missing = batch_size - src.shape[0]
    if missing == 0:
        return batch
    return (np.concatenate([src, np.full((missing, src.shape[1]), src_pad, src.dtype)]),
            np.concatenate([src_valid_len, np.ones(missing, src_valid_len.dtype)]),
            np.concatenate([tgt, np.full((missing, tgt.shape[1]), tgt_pad, tgt.dtype)]),
            np.concatenate([tgt_valid_len, np.zeros(missing, tgt_valid_len.dtype)]))


def padded_lengths(nmt, *, trim_source: bool = True) -> tuple[int, int]:
    """The lengths ``(S, T)`` to cut the training batches to: the training split's longest source
    and target sentence (``<eos>`` included, at least 1), rather than the book's ``num_steps``.

    Every epoch holds every sentence: one length pair (one compiled program) serves the run.
    Where the padding is masked (a causal decoder's later steps, a source masked by its valid
    lengths) cutting it, the loss still divided by ``num_steps`` (:func:`loss_and_grads`), keeps
    the losses and gradients to rounding; dropout draws other masks for other shapes.
    ``trim_source`` False keeps the sources whole (Bahdanau's encoder state runs over them).
    """
    train = nmt.train
    source = max(int(train.src_valid_len.max(initial=0)), 1) if trim_source else nmt.num_steps
    return source, max(int(train.tgt_valid_len.max(initial=0)), 1)


def epoch_batches(nmt, epoch: int, lengths: tuple[int, int] | None = None):
    """The batches of ``epoch`` (0-based), padded (:func:`pad_batch`), stacked along a steps axis,
    cut to ``lengths = (S, T)`` source and target steps (:func:`padded_lengths`; ``None``: not).

    Returns:
      ``((src, src_valid_len, tgt, tgt_valid_len), num_tokens)``: ``int32`` arrays ``(K, B, S)``,
      ``(K, B)``, ``(K, B, T)`` and ``(K, B)`` for the epoch's ``K`` batches, in
      :meth:`~jax_attention.data.nmt.TranslationData.batches` order, and the number of target
      tokens (the valid lengths' sum).
    """
    src_pad, tgt_pad = nmt.src_vocab["<pad>"], nmt.tgt_vocab["<pad>"]
    padded = [pad_batch(batch, nmt.batch_size, src_pad, tgt_pad) for batch in nmt.batches(epoch)]
    src, src_valid_len, tgt, tgt_valid_len = (np.stack(arrays) for arrays in zip(*padded))
    if lengths is not None:
        if src_valid_len.max() > lengths[0] or tgt_valid_len.max() > lengths[1]:
            raise ValueError(f"lengths = {lengths} would cut a sentence: epoch {epoch} has sources"
                             f" of {src_valid_len.max()}, targets of {tgt_valid_len.max()} tokens")
        src, tgt = src[..., :lengths[0]], tgt[..., :lengths[1]]
    return (src, src_valid_len, tgt, tgt_valid_len), int(tgt_valid_len.sum())


def first_fit_decreasing(src_lengths, tgt_lengths, src_row_length: int, tgt_row_length: int):
    """The rows of a packing: a list of lists of pair indices, each row's pairs in the order
    they were placed. ``ValueError`` if a sentence is longer than its row."""
    src_lengths, tgt_lengths = np.asarray(src_lengths), np.asarray(tgt_lengths)
    for name, lengths, row in (("source", src_lengths, src_row_length),
                               ("target", tgt_lengths, tgt_row_length)):
        if lengths.size and lengths.max() > row:
            raise ValueError(f"a {name} sentence of {int(lengths.max())} tokens does not fit a "
                             f"packed row of {row}: the row length must be at least the longest "
                             f"{name} sentence")
    order = np.lexsort((-src_lengths, -tgt_lengths))  # longest target first, then source
    rows: list[list[int]] = []
    free: list[list[int]] = []  # per row: [source room, target room]
    for i in order:
        s, t = int(src_lengths[i]), int(tgt_lengths[i])
        for row, room in zip(rows, free):
            if room[0] >= s and room[1] >= t:
                row.append(int(i))
                room[0] -= s
                room[1] -= t
                break
        else:
            rows.append([int(i)])
            free.append([src_row_length - s, tgt_row_length - t])
    return rows


def pack_batch(src, src_valid_len, tgt, tgt_valid_len, rows, src_row_length: int,
               tgt_row_length: int, *, num_rows: int | None = None, pad_id: int = 0,
               tgt_pad_id: int | None = None):
    """The packed arrays of one batch: ``(src (R, S'), src_segment_ids, tgt (R, T'),
    tgt_segment_ids)``, int32, for ``rows`` (:func:`first_fit_decreasing`); ``num_rows``: ``R``
    (``None``: ``len(rows)``; more rows are all padding). Padding tokens are ``pad_id`` in the
    sources and ``tgt_pad_id`` (default ``pad_id``) in the targets, segment id ``0``."""
    R = len(rows) if num_rows is None else num_rows
    if R < len(rows):
        raise ValueError(f"num_rows = {R} is fewer than the {len(rows)} rows of the packing")
    tgt_pad_id = pad_id if tgt_pad_id is None else tgt_pad_id
    out_src = np.full((R, src_row_length), pad_id, np.int32)
    out_tgt = np.full((R, tgt_row_length), tgt_pad_id, np.int32)
    seg_src = np.zeros((R, src_row_length), np.int32)
    seg_tgt = np.zeros((R, tgt_row_length), np.int32)
    for r, members in enumerate(rows):
        s_at = t_at = 0
        for segment, i in enumerate(members, 1):
            s, t = int(src_valid_len[i]), int(tgt_valid_len[i])
            out_src[r, s_at:s_at + s], seg_src[r, s_at:s_at + s] = src[i, :s], segment
            out_tgt[r, t_at:t_at + t], seg_tgt[r, t_at:t_at + t] = tgt[i, :t], segment
            s_at, t_at = s_at + s, t_at + t
    return out_src, seg_src, out_tgt, seg_tgt


def pack_length(nmt, requested: int = 0) -> int:
    """The packed rows' length: ``requested``, or for ``0`` twice the training pairs' longest
    sentence (source or target, ``<eos>`` included), rounded up to a multiple of 8 — a row then
    holds at least two of the longest pairs. ``ValueError`` if ``requested`` is shorter than
    the longest sentence (it could not hold it)."""
    longest = max(padded_lengths(nmt))
    if requested == 0:
        return -(-2 * longest // 8) * 8
    if requested < longest:
        raise ValueError(f"pack_length = {requested} is shorter than the longest training "
                         f"sentence ({longest} tokens, <eos> included): a packed row must hold it")
    return requested


def pack_batches(nmt, batches, row_length: int) -> list:
    """``batches`` (``(src, src_valid_len, tgt, tgt_valid_len)`` each, as
    :meth:`~jax_attention.data.nmt.TranslationData.batches` gives them: no filler pairs) packed
    (:func:`first_fit_decreasing`, :func:`pack_batch`) into rows of ``row_length`` tokens, all
    with the same ``R`` rows: the most any of them needs, rounded up to a multiple of 8 (so
    that a run's batches share one shape, one compiled program, as a rule)."""
    src_pad, tgt_pad = nmt.src_vocab["<pad>"], nmt.tgt_vocab["<pad>"]
    packings = [first_fit_decreasing(b[1], b[3], row_length, row_length) for b in batches]
    rows = -(-max(len(p) for p in packings) // 8) * 8
    return [pack_batch(*batch, packing, row_length, row_length, num_rows=rows, pad_id=src_pad,
                       tgt_pad_id=tgt_pad) for batch, packing in zip(batches, packings)]


def packed_epoch_batches(nmt, epoch: int, row_length: int):
    """The batches of ``epoch`` packed into rows of ``row_length`` tokens (:func:`pack_batches`),
    stacked along a steps axis: ``((src, src_segment_ids, tgt, tgt_segment_ids), num_tokens)``,
    ``int32`` arrays ``(K, R, row_length)``, the same sentences as :func:`epoch_batches` (the
    last, smaller batch's own)."""
    batches = list(nmt.batches(epoch))
    packed = pack_batches(nmt, batches, row_length)
    return tuple(np.stack(a) for a in zip(*packed)), int(sum(int(b[3].sum()) for b in batches))
