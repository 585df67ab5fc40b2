"""Positional encodings — d2l §11.6.3, plus learned, rotary and relative ones (float64 NumPy reference).

Mirror of :mod:`jax_attention.nn.positional`: the same functions, names and argument order.
Shape letters: ``B`` batch, ``T`` query length, ``S`` key length, ``N`` heads, ``H`` per-head
size, ``D`` model width (``num_hiddens``); ``...`` any extra batch axes.

Four ways to tell attention where a token is:

* absolute sinusoidal (d2l §11.6.3, Vaswani et al. 2017): :func:`positional_encoding` and
  :func:`add_positional_encoding`, a fixed table added to the inputs;
* absolute learned (BERT, GPT-2): :func:`learned_positional_encoding`, a trained table added;
* rotary, RoPE (Su et al. 2021): :func:`rotary_embedding` rotates queries and keys so that their
  dot product depends only on the offset ``j - i``;
* relative bias (Shaw et al. 2018; Raffel et al. 2020, T5): a learned scalar per head and per
  (clipped or bucketed) offset ``j - i``, added to the attention scores —
  :func:`relative_positions`, :func:`relative_position_buckets`,
  :func:`clipped_relative_positions`, :func:`relative_position_bias`.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from reference_numpy._checks import check_int, check_values_in

__all__ = [
    "positional_encoding",
    "add_positional_encoding",
    "learned_positional_encoding",
    "rotary_angles",
    "rotary_embedding",
    "relative_positions",
    "relative_position_buckets",
    "clipped_relative_positions",
    "relative_position_bias",
]

# The same string as in jax_attention/nn/positional.py: a (T, S) index matrix looked up in a
# (buckets, N) table gives (T, S, N); attention wants heads first.
BIAS_HEADS_FIRST = "tsn->nts"


# --------------------------------------------------------------------------- argument checks


def _check_base(base) -> float:
    base = float(base)
    if not (math.isfinite(base) and base > 0):
        raise ValueError(f"base must be a finite number > 0, got {base}")
    return base


def _inverse_frequencies(width: int, base: float) -> np.ndarray:
    """``1 / base^(2j / width)`` for ``j = 0 .. ceil(width / 2) - 1``, float64 ``(ceil(width / 2),)``.

    The frequency of the ``j``-th (sin, cos) pair of the sinusoidal table and the ``j``-th rotated
    pair of RoPE alike; always computed on the host in float64 (the JAX package too).
    """
    return 1.0 / base ** (np.arange(0, width, 2, dtype=np.float64) / width)


# --------------------------------------------------------------------------- sinusoidal


def positional_encoding(num_steps: int, num_hiddens: int, base: float = 10000.0):
    """The sinusoidal position table of the Transformer — d2l §11.6.3.

    ``P[i, 2j] = sin(i / base^(2j/D))`` and ``P[i, 2j + 1] = cos(i / base^(2j/D))`` with
    ``D = num_hiddens``. Each (sin, cos) pair turns at its own frequency, from one radian per
    position (``j = 0``) down to ``1 / base`` radians; for any offset ``delta``,
    ``P[i + delta]`` is a fixed rotation of ``P[i]`` in every pair (the book's "relative positional
    information"). An odd ``D`` is allowed: the last column is then a sine column without its
    cosine (the book's code fails there).

    Args:
      num_steps: ``T >= 1``, the number of positions (rows).
      num_hiddens: ``D >= 1``, the encoding width (columns).
      base: the wavelength scale, ``> 0`` (10000 in the paper and the book).

    Returns:
      float64 ``P`` of shape ``(T, D)``.
    """
    num_steps = check_int("num_steps", num_steps, 1)
    num_hiddens = check_int("num_hiddens", num_hiddens, 1)
    base = _check_base(base)
    positions = np.arange(num_steps, dtype=np.float64)
    angles = positions[:, None] * _inverse_frequencies(num_hiddens, base)[None, :]
    P = np.empty((num_steps, num_hiddens), dtype=np.float64)
    P[:, 0::2] = np.sin(angles)
    P[:, 1::2] = np.cos(angles[:, : num_hiddens // 2])
    return P


def _check_table(name: str, X, table, what: str):
    """Checks ``X (..., T, D)`` against a position table ``(max_len, D)``; returns both as arrays."""
    X, table = np.asarray(X), np.asarray(table)
    if X.ndim < 2:
        raise ValueError(f"X must have shape (B, T, D), got {X.shape}")
    if not np.issubdtype(X.dtype, np.floating):
        raise TypeError(f"X must be a float array, got dtype {X.dtype} with shape {X.shape}")
    if table.ndim != 2:
        raise ValueError(f"{name} must have shape (max_len, D), got {table.shape}")
    T, D = X.shape[-2:]
    if D != table.shape[1]:
        raise ValueError(
            f"X has width D = {D} but the {what} {name} has {table.shape[1]} columns: "
            f"X has shape {X.shape}, {name} has shape {table.shape}"
        )
    if T > table.shape[0]:
        raise ValueError(
            f"sequence of length T = {T} is longer than max_len = {table.shape[0]}: "
            f"X has shape {X.shape}, {name} has shape {table.shape}"
        )
    return X, table


def add_positional_encoding(X, P):
    """``X + P[:T]``: add the first ``T`` rows of a position table to every sequence — d2l §11.6.3.

    Args:
      X: float ``(B, T, D)`` (any leading axes ``(..., T, D)``).
      P: ``(max_len, D)`` with ``max_len >= T``, e.g. :func:`positional_encoding`.

    Returns:
      ``(B, T, D)``.
    """
    X, P = _check_table("P", X, P, "position table")
    T = X.shape[-2]
    return X + P[:T].reshape((1,) * (X.ndim - 2) + (T, X.shape[-1]))


def learned_positional_encoding(table, X):
    """``X + table[:T]`` with a trained ``table`` (BERT, GPT-2 style absolute positions).

    The same sum as :func:`add_positional_encoding`; the table is a parameter rather than a fixed
    function of the position, so it cannot be used for positions beyond ``max_len``.

    Args:
      table: ``(max_len, D)`` learned position embeddings.
      X: float ``(B, T, D)`` (any leading axes) with ``T <= max_len``.

    Returns:
      ``(B, T, D)``.
    """
    X, table = _check_table("table", X, table, "learned position table")
    T = X.shape[-2]
    return X + table[:T].reshape((1,) * (X.ndim - 2) + (T, X.shape[-1]))


# --------------------------------------------------------------------------- rotary (RoPE)


def rotary_angles(positions, head_dim: int, base: float = 10000.0):
    """RoPE's rotation angles ``theta[..., j] = positions[...] / base^(2j/H)``.

    These are exactly the angles of the sinusoidal table for ``D = H``:
    ``positional_encoding(T, H)[i, 2j] = sin(theta_ij)`` and ``[i, 2j + 1] = cos(theta_ij)``.

    Args:
      positions: integer array of any shape ``(...)``.
      head_dim: ``H``, even and ``>= 2``.
      base: the wavelength scale, ``> 0``.

    Returns:
      float64 angles ``(..., H / 2)``.
    """
    head_dim = check_int("head_dim", head_dim, 2)
    if head_dim % 2:
        raise ValueError(f"head_dim must be even (features are rotated in pairs), got {head_dim}")
    base = _check_base(base)
    positions = np.asarray(positions)
    if positions.dtype == np.bool_ or not np.issubdtype(positions.dtype, np.integer):
        raise TypeError(
            f"positions must hold integers, got dtype {positions.dtype} with shape {positions.shape}"
        )
    return positions.astype(np.float64)[..., None] * _inverse_frequencies(head_dim, base)


def _check_positions(positions, X):
    """``positions`` (default ``arange(T)``) broadcast to ``X.shape[:-1] = (..., T)``."""
    if positions is None:
        positions = np.arange(X.shape[-2])
    positions = np.asarray(positions)
    if positions.dtype == np.bool_ or not np.issubdtype(positions.dtype, np.integer):
        raise TypeError(
            f"positions must hold integers, got dtype {positions.dtype} with shape {positions.shape}"
        )
    try:
        if np.broadcast_shapes(positions.shape, X.shape[:-1]) != X.shape[:-1]:
            raise ValueError
    except ValueError:
        raise ValueError(
            f"positions must broadcast to X.shape[:-1] = (..., T) = {X.shape[:-1]}, "
            f"got shape {positions.shape}"
        ) from None
    return np.broadcast_to(positions, X.shape[:-1])


def rotary_embedding(X, positions=None, base: float = 10000.0):
    """Rotary position embedding, RoPE (Su et al. 2021, RoFormer), for queries or keys.

    Each interleaved pair of features ``(x[2j], x[2j + 1])`` of the vector at position ``p`` is
    rotated by the angle ``theta_j = p / base^(2j/H)``::

        out[2j]     = x[2j] cos(theta_j) - x[2j + 1] sin(theta_j)
        out[2j + 1] = x[2j] sin(theta_j) + x[2j + 1] cos(theta_j)

    Rotations preserve norms and ``<R(i) q, R(j) k> = <q, R(j - i) k>``, so scores between rotated
    queries and keys depend on the positions only through ``j - i``. Apply it to the queries and
    the keys (not the values) before the dot product. ``cos(theta_j)`` and ``sin(theta_j)`` are
    the entries ``(p, 2j + 1)`` and ``(p, 2j)`` of :func:`positional_encoding` with ``D = H``.

    Layout: this is the *interleaved* pairing of RoFormer and GPT-J (features 0 and 1 form a pair,
    2 and 3, ...), not the half-split layout of GPT-NeoX and LLaMA's Hugging Face port, which
    pairs feature ``j`` with ``j + H/2``; the two agree up to a fixed permutation of the features.

    Args:
      X: float ``(..., T, H)`` with ``H`` even, e.g. queries ``(B, N, T, H)``.
      positions: ``None`` for ``0 .. T-1``, or an integer array broadcastable to ``(..., T)`` —
        e.g. ``offset + arange(T)`` when decoding against a cache of earlier keys.
      base: the wavelength scale, ``> 0``.

    Returns:
      float64 ``(..., T, H)``.
    """
    X = np.asarray(X)
    if X.ndim < 2:
        raise ValueError(f"X must have shape (..., T, H), got {X.shape}")
    if not np.issubdtype(X.dtype, np.floating):
        raise TypeError(f"X must be a float array, got dtype {X.dtype} with shape {X.shape}")
    H = X.shape[-1]
    if H % 2:
        raise ValueError(
            f"X must have an even last axis H (features are rotated in pairs), got shape {X.shape}"
        )
    angles = rotary_angles(_check_positions(positions, X), H, base)  # (..., T, H/2)
    cos, sin = np.cos(angles), np.sin(angles)
    pairs = X.astype(np.float64).reshape(X.shape[:-1] + (H // 2, 2))
    x_even, x_odd = pairs[..., 0], pairs[..., 1]
    rotated = np.stack([x_even * cos - x_odd * sin, x_even * sin + x_odd * cos], axis=-1)
    return rotated.reshape(X.shape)


# --------------------------------------------------------------------------- relative positions


def relative_positions(num_queries: int, num_keys: int, offset: int = 0):
    """The ``(T, S)`` matrix of offsets ``j - (i + offset)``: key position minus query position.

    Query ``i`` sits at position ``i + offset`` (``offset = S - T`` when ``T`` new queries attend a
    cache of ``S`` keys, as in :func:`reference_numpy.masking.causal_mask`). Negative entries are
    keys in the past, positive ones keys in the future.

    Args:
      num_queries: ``T >= 0``.
      num_keys: ``S >= 0`` (an empty sequence gives an empty matrix).
      offset: position of query 0 relative to key 0.

    Returns:
      int32 ``(T, S)``.
    """
    num_queries = check_int("num_queries", num_queries, 0)
    num_keys = check_int("num_keys", num_keys, 0)
    if isinstance(offset, bool) or not isinstance(offset, (int, np.integer)):
        raise TypeError(f"offset must be an integer scalar, got {type(offset).__name__} {offset!r}")
    queries = np.arange(num_queries, dtype=np.int64)[:, None] + offset
    return (np.arange(num_keys, dtype=np.int64)[None, :] - queries).astype(np.int32)


def _check_relative_positions(relative_positions):
    relative_positions = np.asarray(relative_positions)
    dtype = relative_positions.dtype
    if dtype == np.bool_ or not np.issubdtype(dtype, np.integer):
        raise TypeError(
            f"relative_positions must hold integers, got dtype {dtype} "
            f"with shape {relative_positions.shape}"
        )
    return relative_positions.astype(np.int32)


def _check_bucket_arguments(num_buckets, max_distance, bidirectional: bool):
    """Validates T5's arguments; returns ``(buckets per direction, max_distance)``."""
    num_buckets = check_int("num_buckets", num_buckets, 4 if bidirectional else 2)
    if bidirectional and num_buckets % 2:
        raise ValueError(
            f"num_buckets must be even when bidirectional (half for each direction), got {num_buckets}"
        )
    per_direction = num_buckets // 2 if bidirectional else num_buckets
    max_exact = per_direction // 2
    max_distance = check_int("max_distance", max_distance, max_exact + 1)
    return per_direction, max_distance


@functools.lru_cache(maxsize=64)
def _distance_buckets(per_direction: int, max_distance: int) -> np.ndarray:
    """T5's bucket of each distance ``n = 0 .. max_distance + 1``, int32 ``(max_distance + 2,)``.

    ``n < max_exact = per_direction // 2``: bucket ``n``. Otherwise
    ``max_exact + floor(log(n / max_exact) / log(max_distance / max_exact) * (per_direction - max_exact))``,
    capped at ``per_direction - 1``, evaluated in float32 as T5 does (the denominator is the
    float64 ``math.log`` rounded to float32). Every distance beyond ``max_distance`` lands in the
    last bucket, so the table stops at ``max_distance + 1`` and larger distances are clipped to it.

    Why a table: float32 ``log`` differs between NumPy and XLA (and between XLA backends) by an
    ulp now and then, which moves a distance across a bucket boundary whenever the quotient is an
    integer; one host table, built with NumPy by the same code in both packages, makes the two
    agree entry for entry on every backend.
    """
    max_exact = per_direction // 2
    distances = np.arange(max_distance + 2, dtype=np.int32)
    large = np.maximum(distances, max_exact).astype(np.float32)
    log_ratio = np.log(large / np.float32(max_exact)) / np.float32(math.log(max_distance / max_exact))
    if_large = max_exact + (log_ratio * np.float32(per_direction - max_exact)).astype(np.int32)
    buckets = np.where(distances < max_exact, distances, np.minimum(if_large, per_direction - 1))
    buckets = buckets.astype(np.int32)
    buckets.setflags(write=False)
    return buckets


def relative_position_buckets(relative_positions, num_buckets: int = 32, max_distance: int = 128,
                              bidirectional: bool = True):
    """T5's bucket of each relative position ``j - i`` (Raffel et al. 2020; mesh-tensorflow).

    With ``bidirectional``, half of the ``num_buckets`` are for keys at or before the query
    (``j - i <= 0``) and half for keys after it (``j - i > 0``); otherwise every bucket is for the
    past and keys in the future share bucket 0 (the causal decoder never sees them). Within one
    direction, with ``n = |j - i|`` and ``max_exact = buckets_per_direction // 2``: distances
    ``n < max_exact`` get a bucket each; larger ones share log-spaced buckets up to
    ``max_distance``, and every distance ``>= max_distance`` falls in the last bucket.

    Integer-exact: the log is taken once per distance in float32 on the host (see
    :func:`_distance_buckets`), so NumPy and JAX agree on every entry.

    Args:
      relative_positions: integer array of any shape, e.g. :func:`relative_positions` ``(T, S)``.
      num_buckets: total buckets; ``>= 2``, or even and ``>= 4`` when ``bidirectional``.
      max_distance: distance from which all positions share the last bucket; larger than
        ``max_exact``.
      bidirectional: split the buckets between past and future keys (encoders); ``False`` for a
        causal decoder.

    Returns:
      int32 buckets in ``[0, num_buckets)``, of the shape of ``relative_positions``.
    """
    relative_positions = _check_relative_positions(relative_positions)
    per_direction, max_distance = _check_bucket_arguments(num_buckets, max_distance, bidirectional)
    if bidirectional:
        direction = np.where(relative_positions > 0, per_direction, 0).astype(np.int32)
        distance = np.abs(relative_positions)
    else:
        direction = np.zeros(relative_positions.shape, dtype=np.int32)
        distance = np.maximum(-relative_positions, 0)
    table = _distance_buckets(per_direction, max_distance)
    return direction + table[np.minimum(distance, max_distance + 1)]


def clipped_relative_positions(relative_positions, max_distance: int):
    """Shaw et al. (2018)'s clipping: ``clip(j - i, -k, k) + k`` with ``k = max_distance``.

    Offsets beyond ``k`` in either direction share the outermost index, so a table of
    ``2k + 1`` rows covers every offset.

    Args:
      relative_positions: integer array of any shape, e.g. :func:`relative_positions` ``(T, S)``.
      max_distance: ``k >= 1``.

    Returns:
      int32 indices in ``[0, 2k]``, of the shape of ``relative_positions``.
    """
    relative_positions = _check_relative_positions(relative_positions)
    max_distance = check_int("max_distance", max_distance, 1)
    return (np.clip(relative_positions, -max_distance, max_distance) + max_distance).astype(np.int32)


def relative_position_bias(table, indices):
    """Per-head attention bias from a table of learned scalars: ``table[indices]``, heads first.

    Added to the attention scores ``(B, N, T, S)`` before the softmax (T5 adds it in place of any
    absolute encoding).

    Args:
      table: ``(num_buckets, N)``, one scalar per bucket and head.
      indices: integer ``(T, S)`` in ``[0, num_buckets)``, from :func:`relative_position_buckets`
        or :func:`clipped_relative_positions`.

    Returns:
      ``(1, N, T, S)``.
    """
    table = np.asarray(table)
    indices = np.asarray(indices)
    if table.ndim != 2:
        raise ValueError(f"table must have shape (num_buckets, N), got {table.shape}")
    if indices.ndim != 2:
        raise ValueError(f"indices must have shape (T, S), got {indices.shape}")
    if indices.dtype == np.bool_ or not np.issubdtype(indices.dtype, np.integer):
        raise TypeError(f"indices must hold integers, got dtype {indices.dtype} with shape {indices.shape}")
    rows = table.shape[0]
    check_values_in("indices", indices, 0, rows - 1,
                    f"[0, num_buckets) = [0, {rows}) for table of shape {table.shape}")
    return np.einsum(BIAS_HEADS_FIRST, table[indices])[None]
