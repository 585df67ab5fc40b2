"""The mods' cases in FlexAttention's own idiom, for ``--against torch``: a mask mod and a score
mod written with torch operations — functions of ``(b, h, q_idx, kv_idx)`` that index the case's
tensors (FlexAttention hands the indices over as scalars) — built from the config's description
of the mods (:func:`jax_attention.conformance.functions.build_mod`) without our code: ALiBi's
slopes and T5's buckets as the papers' and Hugging Face's code write them.
"""

from __future__ import annotations

import functools
import math


def _torch_alibi_slopes(torch, num_heads: int, dtype):
    """ALiBi's slopes (Press et al. 2022): a power of two ``n`` gets ``2^(-8 i / n)``; another
    ``n`` those of the power of two below, then every other slope of the power of two above."""
    def powers(n):
        return 2.0 ** (-8.0 * torch.arange(1, n + 1, dtype=torch.float64) / n)

    below = 1 << (num_heads.bit_length() - 1)
    return torch.cat([powers(below), powers(2 * below)[0::2][:num_heads - below]]).to(dtype)


def _torch_t5_bucket(torch, rel, num_buckets: int, max_distance: int, bidirectional: bool):
    """T5's bucket of ``rel = kv_idx - q_idx``, as Hugging Face's ``_relative_position_bucket``
    writes it."""
    bucket = torch.zeros_like(rel)
    if bidirectional:
        num_buckets //= 2
        bucket = bucket + (rel > 0).to(rel.dtype) * num_buckets
        n = torch.abs(rel)
    else:
        n = torch.clamp(-rel, min=0)
    max_exact = num_buckets // 2
    large = max_exact + (torch.log(torch.clamp(n, min=1).double() / max_exact)
                         / math.log(max_distance / max_exact)
                         * (num_buckets - max_exact)).to(rel.dtype)
    large = torch.clamp(large, max=num_buckets - 1)
    return bucket + torch.where(n < max_exact, n, large)


def flex_mask_mod(torch, spec: dict, i: dict, shape):
    """The mask mod ``spec`` describes, ``(b, h, q_idx, kv_idx) -> bool``, on the inputs ``i``
    (tensors); ``shape`` is ``(B, N, T, S)``."""
    name = spec["mod"]
    if name in ("and_masks", "or_masks"):
        parts = [flex_mask_mod(torch, part, i, shape) for part in spec["mods"]]
        combine = torch.logical_and if name == "and_masks" else torch.logical_or
        return lambda b, h, q, kv: functools.reduce(combine, (m(b, h, q, kv) for m in parts))
    if name == "causal":
        offset = spec.get("offset", 0)
        return lambda b, h, q, kv: kv <= q + offset
    if name == "sliding_window":
        left, right = spec["left"], spec.get("right", 0)
        return lambda b, h, q, kv: (kv >= q - left) & (kv <= q + right)
    if name == "valid_lengths":
        lens = i["valid_lens"]
        if lens.dim() == 1:
            return lambda b, h, q, kv: kv < lens[b]
        return lambda b, h, q, kv: kv < lens[b, q]
    if name == "padding":
        kv_lens, q_lens = i["kv_lens"], i.get("q_lens")
        if q_lens is None:
            return lambda b, h, q, kv: kv < kv_lens[b]
        return lambda b, h, q, kv: (kv < kv_lens[b]) & (q < q_lens[b])
    if name == "segment_ids":
        q_ids = i["q_segment_ids"]
        kv_ids = i.get("kv_segment_ids", q_ids)
        if "padding_id" not in spec:
            return lambda b, h, q, kv: q_ids[b, q] == kv_ids[b, kv]
        pad = spec["padding_id"]
        return lambda b, h, q, kv: (q_ids[b, q] == kv_ids[b, kv]) & (q_ids[b, q] != pad)
    if name == "prefix_lm":
        prefix = i["prefix_lens"]
        return lambda b, h, q, kv: (kv <= q) | (kv < prefix[b])
    if name == "chunked_local":
        size = spec["chunk_size"]
        return lambda b, h, q, kv: q // size == kv // size
    if name == "global_tokens":
        count = spec["num_global"]
        return lambda b, h, q, kv: (q < count) | (kv < count)
    if name == "dense_mask":
        keep = i["mask"].reshape((1,) * (4 - i["mask"].dim()) + tuple(i["mask"].shape))
        keep = keep.expand(shape).contiguous()
        return lambda b, h, q, kv: keep[b, h, q, kv]
    raise ValueError(f"unknown mask mod {name!r}")


def flex_score_mod(torch, spec: dict, i: dict, p: dict, shape):
    """The score mod ``spec`` describes, ``(score, b, h, q_idx, kv_idx) -> score``, on the
    inputs ``i`` and params ``p`` (tensors in the run's dtype)."""
    name = spec["mod"]
    if name == "compose_score_mods":
        parts = [flex_score_mod(torch, part, i, p, shape) for part in spec["mods"]]

        def composed(score, b, h, q, kv):
            for mod in parts:
                score = mod(score, b, h, q, kv)
            return score

        return composed
    if name == "softcap":
        cap = spec["cap"]
        return lambda score, b, h, q, kv: cap * torch.tanh(score / cap)
    if name == "bias":
        table = i["bias"].reshape((1,) * (4 - i["bias"].dim()) + tuple(i["bias"].shape))
        table = table.expand(shape).contiguous()
        return lambda score, b, h, q, kv: score + table[b, h, q, kv]
    if name == "alibi":
        slopes = _torch_alibi_slopes(torch, spec["num_heads"], i["queries"].dtype)
        return lambda score, b, h, q, kv: score + slopes[h] * (kv - q).to(score.dtype)
    if name == "clipped_relative_bias":
        table = p["clipped_relative_bias"]
        k = (table.shape[0] - 1) // 2
        return lambda score, b, h, q, kv: score + table[
            torch.clamp(kv - q, -k, k) + k, h % table.shape[1]]
    if name == "t5_relative_bias":
        table = p["t5_relative_bias"]
        num_buckets, max_distance = table.shape[0], spec["max_distance"]
        bidirectional = spec["bidirectional"]
        return lambda score, b, h, q, kv: score + table[
            _torch_t5_bucket(torch, kv - q, num_buckets, max_distance, bidirectional),
            h % table.shape[1]]
    raise ValueError(f"unknown score mod {name!r}")
