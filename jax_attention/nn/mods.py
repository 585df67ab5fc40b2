"""Masks and score modifications as functions — FlexAttention's model, in JAX.

A **mask mod** says which keys a query may attend, a **score mod** changes a score; both are
functions of the position of the score, with PyTorch FlexAttention's signatures
(``torch.nn.attention.flex_attention``)::

    mask_mod(b, h, q_idx, kv_idx) -> bool           True = attend
    score_mod(score, b, h, q_idx, kv_idx) -> score  after the scale (and the built-in soft cap)

Here the indices are int32 *arrays* that broadcast against the scores ``(B, ..., T, S)`` — ``b``
along the batch axis, ``h`` the query head (axis -3; 0 without a head axis), ``q_idx`` and
``kv_idx`` the query and key positions — rather than the scalars FlexAttention's ``vmap`` hands
over, so a mod written with ``jnp`` operations (``jnp.where``, comparisons, indexing an array by
``b`` and ``q_idx``) is the same text in both libraries. The attention functions evaluate a mod
on the whole ``T x S`` grid (the plain path) or block by block (the memory-efficient kernel,
:mod:`jax_attention.nn.efficient`, which skips the blocks a mask rules out).

Built-in mods are made by the functions below and are :class:`MaskMod` and :class:`ScoreMod`
objects: pytrees whose arrays (lengths, segment ids, a learned bias table) are leaves, so they pass
through ``jit``, ``vmap`` and the kernel's custom derivative, and a learned table gets its
gradient. A mask mod may also say which blocks it rules out (:meth:`MaskMod.block_any`): from
positions for causal, windows, chunks and prefixes, and from each block's lengths and segment
ids at run time. Any plain function with these signatures is accepted too (no block skipping;
in the memory-efficient kernel it must not close over values being differentiated: give those
as ``ScoreMod(fn, *params)``).

Combine masks with :func:`and_masks` and :func:`or_masks`, score mods with
:func:`compose_score_mods`. Mirror of :mod:`reference_numpy.mods` (same names and arguments).

References: PyTorch FlexAttention (He et al., 2024, arXiv:2412.05496); ALiBi (Press et al., ICLR
2022, arXiv:2108.12409); T5's relative position buckets (Raffel et al., JMLR 2020,
arXiv:1910.10683); Gemma 2's soft cap (arXiv:2408.00118).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from jax_attention.nn import positional
from jax_attention._checks import (
    check_local_window_size,
    check_logit_softcap,
    check_scale,
    check_sinks,
)

__all__ = [
    "MaskMod", "ScoreMod", "as_mask_mod", "as_score_mod", "index_grids", "mask_from_mod",
    "and_masks", "or_masks", "compose_score_mods",
    "causal", "sliding_window", "valid_lengths", "padding", "segment_ids", "prefix_lm",
    "chunked_local", "global_tokens", "dense_mask",
    "softcap", "bias", "alibi_slopes", "alibi", "clipped_relative_bias", "t5_relative_bias",
]


def _always(*_):
    return True


@jax.tree_util.register_pytree_node_class
class MaskMod:
    """A mask mod ``(b, h, q_idx, kv_idx) -> bool`` (True = attend) with its arrays as leaves.

    Args:
      fn: ``fn(b, h, q_idx, kv_idx, *params)``, elementwise over broadcast int32 indices.
      params: the arrays (or other pytrees, mods included) ``fn`` reads.
      block_any: ``block_any(q_start, q_size, kv_start, kv_size, *params) -> bool``: False only
        if no query ``q_start <= t < q_start + q_size`` may attend any key of
        ``kv_start <= s < kv_start + kv_size`` (the starts may be traced; the sizes are ints). The
        memory-efficient kernel skips such blocks. ``None``: never skip.
      check: ``check(shape, *params)``: raises ``ValueError`` when the mod's arrays do not fit
        scores of ``shape`` ``(B, ..., T, S)`` (called once, at the attention function's
        boundary: indexing out of range would otherwise clamp silently). ``None``: nothing to
        check.
      name: shown by ``repr``.
    """

    def __init__(self, fn, *params, block_any=None, check=None, name=None):
        self.fn, self.params, self.block_any_fn, self.check_fn = fn, tuple(params), block_any, check
        self.name = name or getattr(fn, "__name__", "mask_mod")

    def check(self, shape):
        """Raises ``ValueError`` if the mod's arrays do not fit scores of ``shape``."""
        if self.check_fn is not None:
            self.check_fn(tuple(shape), *self.params)

    def __call__(self, b, h, q_idx, kv_idx):
        keep = jnp.asarray(self.fn(b, h, q_idx, kv_idx, *self.params))
        if keep.dtype != jnp.bool_:  # known while tracing: one comparison per evaluation
            raise TypeError(f"mask_mod must return booleans (True = attend), got dtype "
                            f"{keep.dtype} from {self.name}")
        return keep

    def block_any(self, q_start, q_size: int, kv_start, kv_size: int):
        """Whether the block may hold a pair to attend (``True`` when unknown)."""
        if self.block_any_fn is None:
            return True
        return self.block_any_fn(q_start, q_size, kv_start, kv_size, *self.params)

    @property
    def skips_blocks(self) -> bool:
        return self.block_any_fn is not None

    def __repr__(self):
        return f"MaskMod({self.name})"

    def tree_flatten(self):
        return self.params, (self.fn, self.block_any_fn, self.check_fn, self.name)

    @classmethod
    def tree_unflatten(cls, aux, params):
        fn, block_any, check, name = aux
        return cls(fn, *params, block_any=block_any, check=check, name=name)


@jax.tree_util.register_pytree_node_class
class ScoreMod:
    """A score mod ``(score, b, h, q_idx, kv_idx) -> score`` with its arrays as leaves.

    Args:
      fn: ``fn(score, b, h, q_idx, kv_idx, *params, **static)``, elementwise over the scores
        and the broadcast int32 indices; float ``params`` (a learned bias table) get gradients on
        every path, the memory-efficient kernel's included.
      params: the arrays ``fn`` reads.
      static: hashable settings (a cap, a distance), part of the mod's identity under ``jit``.
      check: as :class:`MaskMod`'s.
      name: shown by ``repr``.
    """

    def __init__(self, fn, *params, static=(), check=None, name=None):
        self.fn, self.params, self.static, self.check_fn = fn, tuple(params), tuple(static), check
        self.name = name or getattr(fn, "__name__", "score_mod")

    def check(self, shape):
        """Raises ``ValueError`` if the mod's arrays do not fit scores of ``shape``."""
        if self.check_fn is not None:
            self.check_fn(tuple(shape), *self.params)

    def __call__(self, score, b, h, q_idx, kv_idx):
        return self.fn(score, b, h, q_idx, kv_idx, *self.params, **dict(self.static))

    def __repr__(self):
        return f"ScoreMod({self.name})"

    def tree_flatten(self):
        return self.params, (self.fn, self.static, self.check_fn, self.name)

    @classmethod
    def tree_unflatten(cls, aux, params):
        fn, static, check, name = aux
        return cls(fn, *params, static=static, check=check, name=name)


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


def along(values, axis: int, rank: int):
    """1-D ``values`` placed on ``axis`` of an array of ``rank`` axes, size 1 elsewhere: the
    index grids' building block (the memory-efficient kernel's block grids use it too). Not part
    of ``__all__``."""
    shape = [1] * rank
    shape[axis] = values.shape[0]
    return values.reshape(shape)


def index_grids(shape, *, groups: int = 1, q_start=0, kv_start=0, transposed: bool = False):
    """``(b, h, q_idx, kv_idx)``: int32 arrays broadcasting to scores of ``shape``.

    ``shape`` is ``(B, ..., T, S)`` (the head axis, if any, at -3), or with ``groups > 1`` the
    grouped scores ``(B, ..., N_kv, G, T, S)``, whose query head is ``n_kv * G + g``;
    ``transposed``: the block is ``(..., S, T)`` (keys as rows). ``q_start`` and ``kv_start``
    (may be traced) offset the positions: a block of the memory-efficient kernel.
    """
    rank = len(shape)
    q_axis, kv_axis = (-1, -2) if transposed else (-2, -1)
    T, S = shape[q_axis], shape[kv_axis]
    b = along(jnp.arange(shape[0], dtype=jnp.int32), 0, rank)
    if groups > 1:
        kv_heads, group = shape[-4], shape[-3]
        h = (along(jnp.arange(kv_heads, dtype=jnp.int32), -4, rank) * group
             + along(jnp.arange(group, dtype=jnp.int32), -3, rank))
    elif rank >= 4:
        h = along(jnp.arange(shape[-3], dtype=jnp.int32), -3, rank)
    else:
        h = jnp.zeros((1,) * rank, jnp.int32)
    q = along(jnp.arange(T, dtype=jnp.int32), q_axis, rank) + jnp.asarray(q_start, jnp.int32)
    kv = along(jnp.arange(S, dtype=jnp.int32), kv_axis, rank) + jnp.asarray(kv_start, jnp.int32)
    return b, h, q, kv


def mask_from_mod(mask_mod, shape, *, groups: int = 1):
    """The boolean mask of ``mask_mod`` on scores of ``shape`` (:func:`index_grids`), as the mod
    gives it (broadcastable to ``shape``, not broadcast)."""
    keep = as_mask_mod(mask_mod)(*index_grids(shape, groups=groups))
    return keep.reshape((1,) * (len(shape) - keep.ndim) + keep.shape)


# --------------------------------------------------------------------------- combinators


def _and(b, h, q, kv, *mods):
    return functools.reduce(jnp.logical_and, (m(b, h, q, kv) for m in mods))


def _or(b, h, q, kv, *mods):
    return functools.reduce(jnp.logical_or, (m(b, h, q, kv) for m in mods))


def _and_blocks(q0, qn, k0, kn, *mods):
    return functools.reduce(jnp.logical_and, (jnp.asarray(m.block_any(q0, qn, k0, kn))
                                              for m in mods))


def _or_blocks(q0, qn, k0, kn, *mods):
    return functools.reduce(jnp.logical_or, (jnp.asarray(m.block_any(q0, qn, k0, kn))
                                             for m in mods))


def _check_all(shape, *mods):
    for m in mods:
        m.check(shape)


def _mods(kind, mods, convert):
    if not mods:
        raise ValueError(f"{kind} needs at least one mod")
    return tuple(convert(m) for m in mods)


def and_masks(*mask_mods) -> MaskMod:
    """Attend where every mask attends. Skips a block any of them skips."""
    mods = _mods("and_masks", mask_mods, as_mask_mod)
    return MaskMod(_and, *mods, block_any=_and_blocks if any(m.skips_blocks for m in mods)
                   else None, check=_check_all, name=" & ".join(m.name for m in mods))


def or_masks(*mask_mods) -> MaskMod:
    """Attend where any mask attends. Skips a block all of them skip."""
    mods = _mods("or_masks", mask_mods, as_mask_mod)
    return MaskMod(_or, *mods, block_any=_or_blocks if all(m.skips_blocks for m in mods)
                   else None, check=_check_all, name=" | ".join(m.name for m in mods))


def _compose(score, b, h, q, kv, *mods):
    for m in mods:
        score = m(score, b, h, q, kv)
    return score


def compose_score_mods(*score_mods) -> ScoreMod:
    """The score mods applied in turn, the first one first."""
    mods = _mods("compose_score_mods", score_mods, as_score_mod)
    return ScoreMod(_compose, *mods, check=_check_all, name=" then ".join(m.name for m in mods))


# --------------------------------------------------------------------------- masks


def _causal(b, h, q, kv, offset):
    return kv <= q + offset


def _causal_blocks(q0, qn, k0, kn, offset):
    return k0 <= q0 + qn - 1 + offset


def causal(offset=0) -> MaskMod:
    """Query ``t`` attends key ``s`` iff ``s <= t + offset``. ``offset=0`` is the upper-left
    causal mask (``is_causal``, PyTorch's default); ``offset = S - T`` the lower-right one, which
    aligns the last query with the last key (``T`` new queries against ``S`` cached keys)."""
    return MaskMod(_causal, jnp.asarray(offset, jnp.int32), block_any=_causal_blocks,
                   name="causal")


def _window(b, h, q, kv, left, right):
    return (kv >= q - left) & (kv <= q + right)


def _window_blocks(q0, qn, k0, kn, left, right):
    return (k0 + kn - 1 >= q0 - left) & (k0 <= q0 + qn - 1 + right)


def sliding_window(left: int, right: int = 0) -> MaskMod:
    """Query ``t`` attends keys ``t - left <= s <= t + right`` (``jax.nn``'s
    ``local_window_size=(left, right)``; ``right=0``: a causal window of ``left + 1`` keys)."""
    left, right = (_nonnegative_int(n, v) for n, v in (("left", left), ("right", right)))
    return MaskMod(_window, jnp.asarray(left, jnp.int32), jnp.asarray(right, jnp.int32),
                   block_any=_window_blocks, name="sliding_window")


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
    lengths = jnp.asarray(lengths)
    if (not jnp.issubdtype(lengths.dtype, jnp.integer)
            or lengths.ndim not in [1 if s == "(B,)" else 2 for s in shapes]):
        raise ValueError(f"{name} must be integers of shape {' or '.join(shapes)}, got dtype "
                         f"{lengths.dtype} with shape {lengths.shape}")
    return lengths.astype(jnp.int32)


def _fits(name, array, expected, shape):
    """``ValueError`` unless ``array``'s shape is one of ``expected`` (ints, or ``None`` for 1 or
    the scores' size there), naming both shapes."""
    ok = len(array.shape) == len(expected) and all(
        n == want or (want is None and n == 1) for n, want in zip(array.shape, expected))
    if not ok:
        want = tuple(1 if w is None else w for w in expected)
        raise ValueError(f"{name} must have shape {want} for scores (B, ..., T, S) = {shape}, "
                         f"got {array.shape}")


def _check_lengths(shape, lens):
    expected = (shape[0],) if lens.ndim == 1 else (shape[0], shape[-2])
    _fits("valid_lens", lens, expected, shape)


def _rows_of(array, b, q):
    """``array[b]`` for ``(B,)`` or ``array[b, q]`` for ``(B, T)``, broadcast like the indices."""
    return array[b] if array.ndim == 1 else array[b, q]


def _valid(b, h, q, kv, lens):
    return kv < _rows_of(lens, b, q)


def _valid_blocks(q0, qn, k0, kn, lens):
    if lens.ndim == 2:
        lens = lax.dynamic_slice_in_dim(lens, q0, qn, axis=1)
    return k0 < jnp.max(lens)


def valid_lengths(valid_lens) -> MaskMod:
    """d2l's ``valid_lens``: query ``t`` of row ``b`` attends keys ``s < valid_lens[b]`` (``(B,)``)
    or ``s < valid_lens[b, t]`` (``(B, T)``). Skips key blocks beyond every length."""
    return MaskMod(_valid, _lengths("valid_lens", valid_lens), block_any=_valid_blocks,
                   check=_check_lengths, name="valid_lengths")


def _padding(b, h, q, kv, kv_lens, q_lens):
    return (kv < kv_lens[b]) & (q < q_lens[b])


def _padding_blocks(q0, qn, k0, kn, kv_lens, q_lens):
    return (k0 < jnp.max(kv_lens)) & (q0 < jnp.max(q_lens))


def _check_padding(shape, kv_lens, q_lens):
    _fits("kv_lens", kv_lens, (shape[0],), shape)
    _fits("q_lens", q_lens, (shape[0],), shape)


def padding(kv_lens, q_lens=None) -> MaskMod:
    """Right padding: row ``b`` has ``kv_lens[b]`` real keys and ``q_lens[b]`` real queries
    (``(B,)`` each; no query padding by default): a padded query attends nothing."""
    kv_lens = _lengths("kv_lens", kv_lens, ("(B,)",))
    q_lens = (jnp.full(kv_lens.shape, jnp.iinfo(jnp.int32).max, jnp.int32) if q_lens is None
              else _lengths("q_lens", q_lens, ("(B,)",)))
    return MaskMod(_padding, kv_lens, q_lens, block_any=_padding_blocks, check=_check_padding,
                   name="padding")


def _segments(b, h, q, kv, q_ids, kv_ids, pad):
    q_seg, kv_seg = q_ids[b, q], kv_ids[b, kv]
    return (q_seg == kv_seg) & (q_seg != pad)


def _segment_blocks(q0, qn, k0, kn, q_ids, kv_ids, pad):
    # Each row's range of ids in the two blocks; ids that overlap in no row: no pair is equal.
    q_block = lax.dynamic_slice_in_dim(q_ids, q0, qn, axis=1)
    kv_block = lax.dynamic_slice_in_dim(kv_ids, k0, kn, axis=1)
    overlap = ((jnp.min(q_block, axis=1) <= jnp.max(kv_block, axis=1))
               & (jnp.min(kv_block, axis=1) <= jnp.max(q_block, axis=1)))
    return jnp.any(overlap)


def _check_segments(shape, q_ids, kv_ids, pad):
    _fits("q_segment_ids", q_ids, (shape[0], shape[-2]), shape)
    _fits("kv_segment_ids (the queries' by default)", kv_ids, (shape[0], shape[-1]), shape)


def segment_ids(q_segment_ids, kv_segment_ids=None, *, padding_id=None) -> MaskMod:
    """Document masking for packed rows: query ``t`` of row ``b`` attends key ``s`` iff
    ``q_segment_ids[b, t] == kv_segment_ids[b, s]`` (``(B, T)`` and ``(B, S)`` integers; the keys'
    default to the queries', as in self-attention). ``padding_id``: tokens with this id attend
    nothing and are attended by nothing. Skips, at run time, the blocks whose rows share no id
    (packed rows in order: a row of 8 documents costs about an eighth of the full work)."""
    q_ids = _lengths("q_segment_ids", q_segment_ids, ("(B, T)",))
    kv_ids = (q_ids if kv_segment_ids is None
              else _lengths("kv_segment_ids", kv_segment_ids, ("(B, S)",)))
    if kv_ids.shape[0] != q_ids.shape[0]:
        raise ValueError(f"q_segment_ids (B, T) and kv_segment_ids (B, S) must have the same B, "
                         f"got {q_ids.shape} and {kv_ids.shape}")
    pad = jnp.asarray(jnp.iinfo(jnp.int32).min if padding_id is None else padding_id, jnp.int32)
    return MaskMod(_segments, q_ids, kv_ids, pad, block_any=_segment_blocks,
                   check=_check_segments, name="segment_ids")


def _prefix(b, h, q, kv, prefix):
    return (kv <= q) | (kv < prefix[b % prefix.shape[0]])


def _prefix_blocks(q0, qn, k0, kn, prefix):
    return (k0 <= q0 + qn - 1) | (k0 < jnp.max(prefix))


def prefix_lm(prefix_lens) -> MaskMod:
    """Prefix-LM (T5, UniLM): causal, except that every query attends the first
    ``prefix_lens[b]`` keys (``(B,)`` or a scalar): a bidirectional prefix, a causal rest."""
    prefix = jnp.asarray(prefix_lens)
    if not jnp.issubdtype(prefix.dtype, jnp.integer) or prefix.ndim > 1:
        raise ValueError(f"prefix_lens must be an integer scalar or (B,), got dtype "
                         f"{prefix.dtype} with shape {prefix.shape}")
    return MaskMod(_prefix, prefix.reshape(-1).astype(jnp.int32), block_any=_prefix_blocks,
                   check=_check_prefix, name="prefix_lm")


def _check_prefix(shape, prefix):
    _fits("prefix_lens", prefix, (None,) if prefix.shape == (1,) else (shape[0],), shape)


def _chunks(b, h, q, kv, size):
    return q // size == kv // size


def _chunk_blocks(q0, qn, k0, kn, size):
    return (q0 // size <= (k0 + kn - 1) // size) & (k0 // size <= (q0 + qn - 1) // size)


def chunked_local(chunk_size: int) -> MaskMod:
    """Attention within fixed chunks: query ``t`` attends key ``s`` iff both lie in the same
    chunk of ``chunk_size`` positions (Llama 4's chunked attention is this AND :func:`causal`)."""
    size = _positive_int("chunk_size", chunk_size)
    return MaskMod(_chunks, jnp.asarray(size, jnp.int32), block_any=_chunk_blocks,
                   name="chunked_local")


def _global(b, h, q, kv, count):
    return (q < count) | (kv < count)


def _global_blocks(q0, qn, k0, kn, count):
    return (q0 < count) | (k0 < count)


def global_tokens(num_global: int) -> MaskMod:
    """Global tokens (Longformer, BigBird): the first ``num_global`` positions attend every key
    and every query attends them. Alone it opens rows and columns; with a local mask by
    :func:`or_masks` — ``or_masks(sliding_window(w, w), global_tokens(g))`` is Longformer's
    pattern — the kernel still skips the blocks neither reaches."""
    count = _nonnegative_int("num_global", num_global)
    return MaskMod(_global, jnp.asarray(count, jnp.int32), block_any=_global_blocks,
                   name="global_tokens")


def _dense(b, h, q, kv, keep):
    return keep[b % keep.shape[0], h % keep.shape[1], q % keep.shape[2], kv % keep.shape[3]]


def dense_mask(keep) -> MaskMod:
    """A boolean array ``(B | 1, N | 1, T, S)`` (True = attend) as a mask mod: no block
    skipping, the whole mask is read (what a dense mask costs)."""
    keep = jnp.asarray(keep)
    if keep.dtype != jnp.bool_ or keep.ndim != 4:
        raise TypeError(f"keep must be a boolean (B | 1, N | 1, T, S) array, got dtype "
                        f"{keep.dtype} with shape {keep.shape}")
    return MaskMod(_dense, keep, check=_check_keep, name="dense_mask")


def _heads(shape) -> int:
    """``N``, the query heads of scores ``(B, ..., N, T, S)`` (1 without a head axis)."""
    return shape[-3] if len(shape) >= 4 else 1


def _check_grid_array(name, shape, array):
    """``array`` ``(B | 1, N | 1, T | 1, S | 1)`` against scores of ``shape``."""
    full = (shape[0], _heads(shape), shape[-2], shape[-1])
    _fits(name, array, tuple(n if m != 1 else None for n, m in zip(full, array.shape)), shape)


def _check_keep(shape, keep):
    _check_grid_array("keep", shape, keep)


def _check_bias(shape, table):
    _check_grid_array("table", shape, table)


def _check_head_columns(shape, table, *_):
    """A table ``(rows, N | 1)``: one column per query head, or one for all."""
    _fits("table", table, (table.shape[0], None if table.shape[1] == 1 else _heads(shape)),
          shape)


# --------------------------------------------------------------------------- score mods


def _softcap(score, b, h, q, kv, cap):
    return cap * jnp.tanh(score / cap)


def softcap(cap) -> ScoreMod:
    """``cap * tanh(score / cap)``: scores smoothly capped to ``(-cap, cap)`` (Gemma 2's
    ``logit_softcap``). The one soft cap of the package: ``logit_softcap=c`` is this mod."""
    if isinstance(cap, bool) or not isinstance(cap, (int, float)) or not cap > 0:
        raise ValueError(f"cap must be a real number > 0, got {cap!r}")
    return ScoreMod(_softcap, static=(("cap", cap),), name="softcap")


def _bias(score, b, h, q, kv, table):
    return score + table[b % table.shape[0], h % table.shape[1], q % table.shape[2],
                         kv % table.shape[3]].astype(score.dtype)


def bias(table) -> ScoreMod:
    """``score + table[b, h, q, kv]`` for a float ``table`` ``(B | 1, N | 1, T | 1, S | 1)`` (a
    learned or given additive bias; size-1 axes broadcast); ``table`` gets its gradient."""
    table = jnp.asarray(table)
    if not jnp.issubdtype(table.dtype, jnp.floating) or table.ndim != 4:
        raise TypeError(f"table must be a float (B | 1, N | 1, T | 1, S | 1) array, got dtype "
                        f"{table.dtype} with shape {table.shape}")
    return ScoreMod(_bias, table, check=_check_bias, name="bias")


def alibi_slopes(num_heads: int):
    """ALiBi's head slopes (Press et al. 2022): for ``n`` a power of two, the geometric sequence
    ``2**(-8 i / n)``, ``i = 1..n``; otherwise those of the power of two below ``n``, followed by
    every other slope of the power of two above (the paper's code). float32 ``(num_heads,)``."""
    num_heads = _positive_int("num_heads", num_heads)

    def powers(n):
        return [2.0 ** (-8.0 * (i + 1) / n) for i in range(n)]

    below = 2 ** int(math.floor(math.log2(num_heads)))
    slopes = powers(below) + powers(2 * below)[0::2][:num_heads - below]
    return jnp.asarray(slopes)  # float64 under x64, else float32


def _alibi(score, b, h, q, kv, slopes):
    return score + slopes[h].astype(score.dtype) * (kv - q).astype(score.dtype)


def alibi(num_heads: int | None = None, *, slopes=None) -> ScoreMod:
    """ALiBi: ``score + slope[h] * (kv_idx - q_idx)`` — a linear penalty on distance, per head
    (keys before the query get a negative bias). ``slopes``: ``(N,)``, by default
    :func:`alibi_slopes` of ``num_heads``."""
    if slopes is None:
        if num_heads is None:
            raise TypeError("alibi needs num_heads or slopes")
        slopes = alibi_slopes(num_heads)
    return ScoreMod(_alibi, jnp.asarray(slopes), check=_check_slopes, name="alibi")


def _check_slopes(shape, slopes):
    _fits("slopes (one per query head)", slopes, (_heads(shape),), shape)


def _checked_table(table, rows: str):
    table = jnp.asarray(table)
    if not jnp.issubdtype(table.dtype, jnp.floating) or table.ndim != 2:
        raise TypeError(f"table must be a float ({rows}, N | 1) array, got dtype {table.dtype} "
                        f"with shape {table.shape}")
    return table


def _table_bias(score, table, rows, h):
    return score + table[rows, h % table.shape[1]].astype(score.dtype)


def _clipped(score, b, h, q, kv, table):
    rows = positional.clipped_relative_positions(kv - q, (table.shape[0] - 1) // 2)
    return _table_bias(score, table, rows, h)


def clipped_relative_bias(table) -> ScoreMod:
    """A learned bias per relative position and head (Shaw et al. 2018's clipped distances):
    ``score + table[clip(kv - q, -k, k) + k, h]`` for ``table`` ``(2k + 1, N | 1)``, the rows of
    :func:`jax_attention.nn.positional.clipped_relative_positions`."""
    table = _checked_table(table, "2k + 1")
    if table.shape[0] % 2 != 1:
        raise ValueError(f"table must have 2k + 1 rows (an odd number), got shape {table.shape}")
    return ScoreMod(_clipped, table, check=_check_head_columns, name="clipped_relative_bias")


def _t5(score, b, h, q, kv, table, bidirectional, max_distance):
    rows = positional.relative_position_buckets(kv - q, table.shape[0], max_distance,
                                                bidirectional)
    return _table_bias(score, table, rows, h)


def t5_relative_bias(table, *, bidirectional: bool = True, max_distance: int = 128) -> ScoreMod:
    """T5's relative attention bias: ``score + table[bucket(kv - q), h]`` with a learned
    ``table`` ``(num_buckets, N | 1)`` and the buckets of
    :func:`jax_attention.nn.positional.relative_position_buckets` (encoders ``bidirectional``,
    decoders not)."""
    table = _checked_table(table, "num_buckets")
    static = (("bidirectional", bool(bidirectional)),
              ("max_distance", _positive_int("max_distance", max_distance)))
    return ScoreMod(_t5, table, static=static, check=_check_head_columns,
                    name="t5_relative_bias")


# --------------------------------------------------------------------------- the variants


class Variants(NamedTuple):
    """The checked variant arguments of the dot-product functions: ``scale`` (a float or
    ``None``), ``local_window_size`` (``(left, right)`` or ``None``), ``logit_softcap`` (a
    :func:`softcap` mod or ``None``), ``mask_mod``, ``score_mod``
    (:class:`MaskMod`, :class:`ScoreMod` or ``None``) and ``sinks`` (an array or ``None``).
    Not part of the user-facing API (``__all__``)."""

    scale: float | None = None
    local_window_size: tuple[int, int] | None = None
    logit_softcap: ScoreMod | None = None
    mask_mod: MaskMod | None = None
    score_mod: ScoreMod | None = None
    sinks: jax.Array | None = None


def check_variants(shape, scale=None, local_window_size=None, logit_softcap=None,
                   mask_mod=None, score_mod=None, sinks=None) -> Variants:
    """The variant arguments of the dot-product functions, checked once (:class:`Variants`):
    what every path — plain, chunked, the modules — takes, for scores of ``shape``
    ``(B, ..., N, T, S)`` (the mods' arrays are checked against it). Not part of ``__all__``."""
    if (scale is None and local_window_size is None and logit_softcap is None
            and mask_mod is None and score_mod is None and sinks is None):
        return Variants()  # the book's attention: nothing to check
    cap = check_logit_softcap(logit_softcap)
    mask_mod, score_mod = as_mask_mod(mask_mod), as_score_mod(score_mod)
    for mod in (mask_mod, score_mod):
        if mod is not None:
            mod.check(shape)
    return Variants(check_scale(scale), check_local_window_size(local_window_size),
                    None if cap is None else softcap(cap), mask_mod, score_mod,
                    check_sinks(sinks, shape))


def score_mods_of(variants: Variants) -> ScoreMod | None:
    """The soft cap, then the score mod, as one mod (``None`` if neither): what the
    memory-efficient kernel applies to each block (it takes no bias)."""
    given = [m for m in (variants.logit_softcap, variants.score_mod) if m is not None]
    return None if not given else given[0] if len(given) == 1 else compose_score_mods(*given)


def float_params(tree):
    """``(floats, rebuild)``: the float leaves of ``tree`` (a mod) and a function giving the
    tree back from new float leaves — the parameters a score mod's gradient is taken for by the
    memory-efficient kernel's custom derivative. Not part of ``__all__``."""
    leaves, treedef = jax.tree.flatten(tree)
    is_float = [jnp.issubdtype(jnp.result_type(x), jnp.floating) for x in leaves]

    def rebuild(floats):
        floats = iter(floats)
        return jax.tree.unflatten(treedef, [next(floats) if f else x
                                            for x, f in zip(leaves, is_float)])
    return [x for x, f in zip(leaves, is_float) if f], rebuild


def float_cotangents(tree, float_grads):
    """The cotangent of ``tree`` for :func:`jax.custom_vjp`: ``float_grads`` at its float leaves,
    ``None`` (zero) at the others (integers, booleans)."""
    leaves, treedef = jax.tree.flatten(tree)
    grads = iter(float_grads)
    return jax.tree.unflatten(treedef, [next(grads) if jnp.issubdtype(jnp.result_type(x),
                                                                    jnp.floating) else None
                                        for x in leaves])
