"""Masks and score modifications as functions — FlexAttention's model (float64 NumPy reference).

Mirror of :mod:`jax_attention.nn.mods`: the same names, arguments and meaning. A **mask mod**
says which keys a query may attend, a **score mod** changes a score::

    mask_mod(b, h, q_idx, kv_idx) -> bool           True = attend
    score_mod(score, b, h, q_idx, kv_idx) -> score  after the scale (and the built-in soft cap)

The indices are int32 arrays that broadcast against the scores ``(B, ..., T, S)``
(:func:`index_grids`): ``b`` along the batch axis, ``h`` the query head (axis -3; 0 without a
head axis), ``q_idx`` and ``kv_idx`` the query and key positions. The reference evaluates a mod
on the whole ``T x S`` grid, once: :class:`MaskMod` and :class:`ScoreMod` are plain classes
holding the function and its arrays (no pytrees, no block skipping — ``block_any`` is kept so
that the signatures mirror, and only ever answered, never used to skip).

Combine masks with :func:`and_masks` and :func:`or_masks`, score mods with
:func:`compose_score_mods`.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numpy as np

from reference_numpy import positional
from reference_numpy._checks import check_local_window_size, check_logit_softcap, check_scale

__all__ = [
    "MaskMod", "ScoreMod", "as_mask_mod", "as_score_mod", "index_grids", "mask_from_mod",
    "and_masks", "or_masks", "compose_score_mods",
    "causal", "sliding_window", "valid_lengths", "padding", "segment_ids", "prefix_lm",
    "chunked_local", "global_tokens", "dense_mask",
    "softcap", "bias", "alibi_slopes", "alibi", "clipped_relative_bias", "t5_relative_bias",
]

INT32 = np.iinfo(np.int32)


class MaskMod:
    """A mask mod ``(b, h, q_idx, kv_idx) -> bool`` (True = attend) with the arrays it reads.

    Args:
      fn: ``fn(b, h, q_idx, kv_idx, *params)``, elementwise over broadcast int32 indices.
      params: the arrays (or mods) ``fn`` reads.
      block_any: ``block_any(q_start, q_size, kv_start, kv_size, *params) -> bool`` or ``None``;
        kept for the mirror's sake (the JAX kernel skips blocks with it, the reference has none).
      name: shown by ``repr``.
    """

    def __init__(self, fn, *params, block_any=None, name=None):
        self.fn, self.params, self.block_any_fn = fn, tuple(params), block_any
        self.name = name or getattr(fn, "__name__", "mask_mod")

    def __call__(self, b, h, q_idx, kv_idx):
        keep = np.asarray(self.fn(b, h, q_idx, kv_idx, *self.params))
        if keep.dtype != np.bool_:
            raise TypeError(f"mask_mod must return booleans (True = attend), got dtype "
                            f"{keep.dtype} from {self.name}")
        return keep

    def block_any(self, q_start, q_size: int, kv_start, kv_size: int):
        """Whether the block may hold a pair to attend (``True`` when unknown)."""
        if self.block_any_fn is None:
            return True
        return self.block_any_fn(q_start, q_size, kv_start, kv_size, *self.params)

    def __repr__(self):
        return f"MaskMod({self.name})"


class ScoreMod:
    """A score mod ``(score, b, h, q_idx, kv_idx) -> score`` with the arrays it reads.

    Args:
      fn: ``fn(score, b, h, q_idx, kv_idx, *params, **static)``, elementwise over the scores and
        the broadcast int32 indices.
      params: the arrays ``fn`` reads.
      static: ``(name, value)`` pairs of settings (a cap, a distance), given as keywords.
      name: shown by ``repr``.
    """

    def __init__(self, fn, *params, static=(), name=None):
        self.fn, self.params, self.static = fn, tuple(params), tuple(static)
        self.name = name or getattr(fn, "__name__", "score_mod")

    def __call__(self, score, b, h, q_idx, kv_idx):
        return self.fn(score, b, h, q_idx, kv_idx, *self.params, **dict(self.static))

    def __repr__(self):
        return f"ScoreMod({self.name})"


def as_mask_mod(mask_mod) -> MaskMod | None:
    """``None``, a :class:`MaskMod`, or a plain callable wrapped as one (``TypeError`` else)."""
    if mask_mod is None or isinstance(mask_mod, MaskMod):
        return mask_mod
    if not callable(mask_mod):
        raise TypeError(f"mask_mod must be a function (b, h, q_idx, kv_idx) -> bool, got "
                        f"{type(mask_mod).__name__}")
    return MaskMod(lambda b, h, q, kv: mask_mod(b, h, q, kv),
                   name=getattr(mask_mod, "__name__", None))


def as_score_mod(score_mod) -> ScoreMod | None:
    """``None``, a :class:`ScoreMod`, or a plain callable wrapped as one (``TypeError`` else)."""
    if score_mod is None or isinstance(score_mod, ScoreMod):
        return score_mod
    if not callable(score_mod):
        raise TypeError(f"score_mod must be a function (score, b, h, q_idx, kv_idx) -> score, got "
                        f"{type(score_mod).__name__}")
    return ScoreMod(lambda s, b, h, q, kv: score_mod(s, b, h, q, kv),
                    name=getattr(score_mod, "__name__", None))


def _along(values, axis: int, rank: int):
    """1-D ``values`` placed on ``axis`` of an array of ``rank`` axes, size 1 elsewhere."""
    shape = [1] * rank
    shape[axis] = values.shape[0]
    return values.reshape(shape)


def index_grids(shape, *, groups: int = 1, q_start=0, kv_start=0, transposed: bool = False):
    """``(b, h, q_idx, kv_idx)``: int32 arrays broadcasting to scores of ``shape``.

    ``shape`` is ``(B, ..., T, S)`` (the head axis, if any, at -3), or with ``groups > 1`` the
    grouped scores ``(B, ..., N_kv, G, T, S)``, whose query head is ``n_kv * G + g``;
    ``transposed``: ``(..., S, T)`` (keys as rows). ``q_start`` and ``kv_start`` offset the
    positions (a block of the JAX kernel; the reference itself always starts at 0).
    """
    rank = len(shape)
    q_axis, kv_axis = (-1, -2) if transposed else (-2, -1)
    T, S = shape[q_axis], shape[kv_axis]
    b = _along(np.arange(shape[0], dtype=np.int32), 0, rank)
    if groups > 1:
        kv_heads, group = shape[-4], shape[-3]
        h = (_along(np.arange(kv_heads, dtype=np.int32), -4, rank) * np.int32(group)
             + _along(np.arange(group, dtype=np.int32), -3, rank))
    elif rank >= 4:
        h = _along(np.arange(shape[-3], dtype=np.int32), -3, rank)
    else:
        h = np.zeros((1,) * rank, np.int32)
    q = _along(np.arange(T, dtype=np.int32), q_axis, rank) + np.int32(q_start)
    kv = _along(np.arange(S, dtype=np.int32), kv_axis, rank) + np.int32(kv_start)
    return b, h, q, kv


def mask_from_mod(mask_mod, shape, *, groups: int = 1):
    """The boolean mask of ``mask_mod`` on scores of ``shape`` (:func:`index_grids`), as the mod
    gives it (broadcastable to ``shape``, not broadcast)."""
    keep = as_mask_mod(mask_mod)(*index_grids(shape, groups=groups))
    return keep.reshape((1,) * (len(shape) - keep.ndim) + keep.shape)


# --------------------------------------------------------------------------- combinators


def _and(b, h, q, kv, *mods):
    return functools.reduce(np.logical_and, (m(b, h, q, kv) for m in mods))


def _or(b, h, q, kv, *mods):
    return functools.reduce(np.logical_or, (m(b, h, q, kv) for m in mods))


def _mods(kind, mods, convert):
    if not mods:
        raise ValueError(f"{kind} needs at least one mod")
    return tuple(convert(m) for m in mods)


def and_masks(*mask_mods) -> MaskMod:
    """Attend where every mask attends."""
    mods = _mods("and_masks", mask_mods, as_mask_mod)
    return MaskMod(_and, *mods, name=" & ".join(m.name for m in mods))


def or_masks(*mask_mods) -> MaskMod:
    """Attend where any mask attends."""
    mods = _mods("or_masks", mask_mods, as_mask_mod)
    return MaskMod(_or, *mods, name=" | ".join(m.name for m in mods))


def _compose(score, b, h, q, kv, *mods):
    for m in mods:
        score = m(score, b, h, q, kv)
    return score


def compose_score_mods(*score_mods) -> ScoreMod:
    """The score mods applied in turn, the first one first."""
    mods = _mods("compose_score_mods", score_mods, as_score_mod)
    return ScoreMod(_compose, *mods, name=" then ".join(m.name for m in mods))


# --------------------------------------------------------------------------- masks


def causal(offset=0) -> MaskMod:
    """Query ``t`` attends key ``s`` iff ``s <= t + offset``: ``offset=0`` upper-left (as
    ``is_causal``), ``offset = S - T`` lower-right (the last query meets the last key)."""
    return MaskMod(lambda b, h, q, kv, offset: kv <= q + offset, np.int32(offset), name="causal")


def sliding_window(left: int, right: int = 0) -> MaskMod:
    """Query ``t`` attends keys ``t - left <= s <= t + right`` (``local_window_size=(left,
    right)``; ``right=0``: a causal window of ``left + 1`` keys)."""
    left, right = (_nonnegative_int(n, v) for n, v in (("left", left), ("right", right)))
    return MaskMod(lambda b, h, q, kv, left, right: (kv >= q - left) & (kv <= q + right),
                   np.int32(left), np.int32(right), name="sliding_window")


def _nonnegative_int(name, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int >= 0, got {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value}")
    return value


def _positive_int(name, value) -> int:
    if _nonnegative_int(name, value) == 0:
        raise ValueError(f"{name} must be an int >= 1, got 0")
    return value


def _lengths(name, lengths, shapes=("(B,)", "(B, T)")):
    """Integer lengths or ids with one of the ``shapes`` (by rank), as int32."""
    lengths = np.asarray(lengths)
    if (not np.issubdtype(lengths.dtype, np.integer)
            or lengths.ndim not in [1 if s == "(B,)" else 2 for s in shapes]):
        raise ValueError(f"{name} must be integers of shape {' or '.join(shapes)}, got dtype "
                         f"{lengths.dtype} with shape {lengths.shape}")
    return lengths.astype(np.int32)


def _valid(b, h, q, kv, lens):
    """``kv < lens[b]`` for ``(B,)`` lengths, ``kv < lens[b, q]`` for ``(B, T)``."""
    return kv < (lens[b] if lens.ndim == 1 else lens[b, q])


def valid_lengths(valid_lens) -> MaskMod:
    """d2l's ``valid_lens``: query ``t`` of row ``b`` attends keys ``s < valid_lens[b]`` (``(B,)``)
    or ``s < valid_lens[b, t]`` (``(B, T)``)."""
    return MaskMod(_valid, _lengths("valid_lens", valid_lens), name="valid_lengths")


def padding(kv_lens, q_lens=None) -> MaskMod:
    """Right padding: row ``b`` has ``kv_lens[b]`` real keys and ``q_lens[b]`` real queries
    (``(B,)`` each; no query padding by default): a padded query attends nothing."""
    kv_lens = _lengths("kv_lens", kv_lens, ("(B,)",))
    q_lens = (np.full(kv_lens.shape, INT32.max, np.int32) if q_lens is None
              else _lengths("q_lens", q_lens, ("(B,)",)))
    return MaskMod(lambda b, h, q, kv, kv_lens, q_lens: (kv < kv_lens[b]) & (q < q_lens[b]),
                   kv_lens, q_lens, name="padding")


def _segments(b, h, q, kv, q_ids, kv_ids, pad):
    q_seg, kv_seg = q_ids[b, q], kv_ids[b, kv]
    return (q_seg == kv_seg) & (q_seg != pad)


def segment_ids(q_segment_ids, kv_segment_ids=None, *, padding_id=None) -> MaskMod:
    """Document masking for packed rows: query ``t`` of row ``b`` attends key ``s`` iff
    ``q_segment_ids[b, t] == kv_segment_ids[b, s]`` (``(B, T)`` and ``(B, S)`` integers; the keys'
    default to the queries'). ``padding_id``: tokens with this id attend nothing and are attended
    by nothing."""
    q_ids = _lengths("q_segment_ids", q_segment_ids, ("(B, T)",))
    kv_ids = (q_ids if kv_segment_ids is None
              else _lengths("kv_segment_ids", kv_segment_ids, ("(B, S)",)))
    if kv_ids.shape[0] != q_ids.shape[0]:
        raise ValueError(f"q_segment_ids (B, T) and kv_segment_ids (B, S) must have the same B, "
                         f"got {q_ids.shape} and {kv_ids.shape}")
    pad = np.int32(INT32.min if padding_id is None else padding_id)
    return MaskMod(_segments, q_ids, kv_ids, pad, name="segment_ids")


def prefix_lm(prefix_lens) -> MaskMod:
    """Prefix-LM: causal, except that every query attends the first ``prefix_lens[b]`` keys
    (``(B,)`` or a scalar): a bidirectional prefix, a causal rest."""
    prefix = np.asarray(prefix_lens)
    if not np.issubdtype(prefix.dtype, np.integer) or prefix.ndim > 1:
        raise ValueError(f"prefix_lens must be an integer scalar or (B,), got dtype "
                         f"{prefix.dtype} with shape {prefix.shape}")
    return MaskMod(lambda b, h, q, kv, prefix: (kv <= q) | (kv < prefix[b % prefix.shape[0]]),
                   prefix.reshape(-1).astype(np.int32), name="prefix_lm")


def chunked_local(chunk_size: int) -> MaskMod:
    """Attention within fixed chunks: query ``t`` attends key ``s`` iff both lie in the same
    chunk of ``chunk_size`` positions (Llama 4's chunked attention is this AND :func:`causal`)."""
    size = _positive_int("chunk_size", chunk_size)
    return MaskMod(lambda b, h, q, kv, size: q // size == kv // size, np.int32(size),
                   name="chunked_local")


def global_tokens(num_global: int) -> MaskMod:
    """Global tokens (Longformer, BigBird): the first ``num_global`` positions attend every key
    and every query attends them; Longformer is ``or_masks(sliding_window(w, w),
    global_tokens(g))``."""
    count = _nonnegative_int("num_global", num_global)
    return MaskMod(lambda b, h, q, kv, count: (q < count) | (kv < count), np.int32(count),
                   name="global_tokens")


def _dense(b, h, q, kv, keep):
    return keep[b % keep.shape[0], h % keep.shape[1], q % keep.shape[2], kv % keep.shape[3]]


def dense_mask(keep) -> MaskMod:
    """A boolean array ``(B | 1, N | 1, T, S)`` (True = attend) as a mask mod."""
    keep = np.asarray(keep)
    if keep.dtype != np.bool_ or keep.ndim != 4:
        raise TypeError(f"keep must be a boolean (B | 1, N | 1, T, S) array, got dtype "
                        f"{keep.dtype} with shape {keep.shape}")
    return MaskMod(_dense, keep, name="dense_mask")


# --------------------------------------------------------------------------- score mods


def _softcap(score, b, h, q, kv, cap):
    return cap * np.tanh(score / cap)


def softcap(cap) -> ScoreMod:
    """``cap * tanh(score / cap)``: scores smoothly capped to ``(-cap, cap)`` (Gemma 2's
    ``logit_softcap``, which is this mod)."""
    if isinstance(cap, bool) or not isinstance(cap, (int, float)) or not cap > 0:
        raise ValueError(f"cap must be a real number > 0, got {cap!r}")
    return ScoreMod(_softcap, static=(("cap", cap),), name="softcap")


def _bias(score, b, h, q, kv, table):
    return score + table[b % table.shape[0], h % table.shape[1], q % table.shape[2],
                         kv % table.shape[3]].astype(score.dtype)


def bias(table) -> ScoreMod:
    """``score + table[b, h, q, kv]`` for a float ``table`` ``(B | 1, N | 1, T | 1, S | 1)``
    (size-1 axes broadcast)."""
    table = np.asarray(table)
    if not np.issubdtype(table.dtype, np.floating) or table.ndim != 4:
        raise TypeError(f"table must be a float (B | 1, N | 1, T | 1, S | 1) array, got dtype "
                        f"{table.dtype} with shape {table.shape}")
    return ScoreMod(_bias, table, name="bias")


def alibi_slopes(num_heads: int):
    """ALiBi's head slopes (Press et al. 2022): for ``n`` a power of two, ``2**(-8 i / n)``,
    ``i = 1..n``; otherwise those of the power of two below ``n``, followed by every other slope
    of the power of two above. float64 ``(num_heads,)`` (the JAX twin's are float32)."""
    num_heads = _positive_int("num_heads", num_heads)

    def powers(n):
        return [2.0 ** (-8.0 * (i + 1) / n) for i in range(n)]

    below = 2 ** int(math.floor(math.log2(num_heads)))
    return np.asarray(powers(below) + powers(2 * below)[0::2][:num_heads - below], np.float64)


def _alibi(score, b, h, q, kv, slopes):
    return score + slopes[h].astype(score.dtype) * (kv - q).astype(score.dtype)


def alibi(num_heads: int | None = None, *, slopes=None) -> ScoreMod:
    """ALiBi: ``score + slope[h] * (kv_idx - q_idx)`` per head. ``slopes``: ``(N,)``, by default
    :func:`alibi_slopes` of ``num_heads``."""
    if slopes is None:
        if num_heads is None:
            raise TypeError("alibi needs num_heads or slopes")
        slopes = alibi_slopes(num_heads)
    return ScoreMod(_alibi, np.asarray(slopes), name="alibi")


def _checked_table(table, rows: str):
    table = np.asarray(table)
    if not np.issubdtype(table.dtype, np.floating) or table.ndim != 2:
        raise TypeError(f"table must be a float ({rows}, N | 1) array, got dtype {table.dtype} "
                        f"with shape {table.shape}")
    return table


def _table_bias(score, table, rows, h):
    return score + table[rows, h % table.shape[1]].astype(score.dtype)


def _clipped(score, b, h, q, kv, table):
    rows = positional.clipped_relative_positions(kv - q, (table.shape[0] - 1) // 2)
    return _table_bias(score, table, rows, h)


def clipped_relative_bias(table) -> ScoreMod:
    """``score + table[clip(kv - q, -k, k) + k, h]`` for ``table`` ``(2k + 1, N | 1)``, the rows
    of :func:`reference_numpy.positional.clipped_relative_positions`."""
    table = _checked_table(table, "2k + 1")
    if table.shape[0] % 2 != 1:
        raise ValueError(f"table must have 2k + 1 rows (an odd number), got shape {table.shape}")
    return ScoreMod(_clipped, table, name="clipped_relative_bias")


def _t5(score, b, h, q, kv, table, bidirectional, max_distance):
    rows = positional.relative_position_buckets(kv - q, table.shape[0], max_distance,
                                                bidirectional)
    return _table_bias(score, table, rows, h)


def t5_relative_bias(table, *, bidirectional: bool = True, max_distance: int = 128) -> ScoreMod:
    """T5's relative attention bias: ``score + table[bucket(kv - q), h]`` with ``table``
    ``(num_buckets, N | 1)`` and the buckets of
    :func:`reference_numpy.positional.relative_position_buckets`."""
    table = _checked_table(table, "num_buckets")
    static = (("bidirectional", bool(bidirectional)),
              ("max_distance", _positive_int("max_distance", max_distance)))
    return ScoreMod(_t5, table, static=static, name="t5_relative_bias")


# --------------------------------------------------------------------------- the variants


class Variants(NamedTuple):
    """The checked variant arguments of the dot-product functions (as the JAX twin's): ``scale``,
    ``local_window_size``, ``logit_softcap`` (a :func:`softcap` mod), ``mask_mod``,
    ``score_mod`` and ``sinks``, each ``None`` when not given. Not part of ``__all__``."""

    scale: float | None = None
    local_window_size: tuple[int, int] | None = None
    logit_softcap: ScoreMod | None = None
    mask_mod: MaskMod | None = None
    score_mod: ScoreMod | None = None
    sinks: np.ndarray | None = None


def _check_sinks(sinks, scores_shape):
    """Float ``()`` or ``(N,)`` for scores ``(B, ..., N, T, S)`` (``()`` without a head axis)."""
    if sinks is None:
        return None
    sinks = np.asarray(sinks)
    if not np.issubdtype(sinks.dtype, np.floating):
        raise TypeError(f"sinks must be float logits, got dtype {sinks.dtype} with shape "
                        f"{sinks.shape}")
    heads = tuple(scores_shape[-3:-2]) if len(scores_shape) >= 4 else ()
    if sinks.shape not in ((), heads):
        raise ValueError(f"sinks must have shape () or (N,) = {heads} (one logit per query head) "
                         f"for scores (B, ..., N, T, S) = {tuple(scores_shape)}, got {sinks.shape}")
    return sinks


def check_variants(shape, scale=None, local_window_size=None, logit_softcap=None,
                   mask_mod=None, score_mod=None, sinks=None) -> Variants:
    """The variant arguments of the dot-product functions for scores of ``shape``
    ``(B, ..., N, T, S)``, checked once (:class:`Variants`). Not part of ``__all__``."""
    cap = check_logit_softcap(logit_softcap)
    return Variants(check_scale(scale), check_local_window_size(local_window_size),
                    None if cap is None else softcap(cap), as_mask_mod(mask_mod),
                    as_score_mod(score_mod), _check_sinks(sinks, shape))
