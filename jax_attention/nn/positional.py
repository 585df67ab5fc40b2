"""Positional encodings — d2l §11.6.3, plus learned, rotary and relative ones, in JAX.

Mirror of :mod:`reference_numpy.positional`: the same functions, names and argument order, then
the NNX modules :class:`PositionalEncoding`, :class:`LearnedPositionalEmbedding` and
:class:`RelativePositionBias`. Shape letters: ``B`` batch, ``T`` query length, ``S`` key length,
``N`` heads, ``H`` per-head size, ``D`` model width (``num_hiddens``); ``...`` any extra batch axes.

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

Precision: everything that depends only on static sizes — the sinusoidal table, the frequencies
``1 / base^(2j/H)``, T5's bucket of each distance — is computed on the host in float64 (float32 for
T5's log, as T5 does) with NumPy and rounded once to the requested dtype, so a float32 table is
correct to half an ulp at every position (computing ``i / base^(2j/D)`` in float32 on the device
would lose ``i * 2^-24`` radians, ``6e-5`` at ``i = 1000``). RoPE's angles depend on positions
that may be traced, so they are computed on the device, in float32 for half-precision inputs.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jax_attention._checks import (
    as_array_like,
    check_dropout,
    check_int,
    check_values_fit,
    check_values_in,
    clip_values,
    is_integer_dtype,
)
from jax_attention.nn.precision import compute_dtype

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
    "Constant",
    "PositionalEncoding",
    "LearnedPositionalEmbedding",
    "RelativePositionBias",
]

# The same string as in reference_numpy/positional.py: a (T, S) index matrix looked up in a
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
    pair of RoPE alike; computed on the host in float64, as in the NumPy reference.
    """
    return 1.0 / base ** (np.arange(0, width, 2, dtype=np.float64) / width)


# --------------------------------------------------------------------------- sinusoidal


def positional_encoding(num_steps: int, num_hiddens: int, base: float = 10000.0, *, dtype=jnp.float32):
    """The sinusoidal position table of the Transformer — d2l §11.6.3.

    ``P[i, 2j] = sin(i / base^(2j/D))`` and ``P[i, 2j + 1] = cos(i / base^(2j/D))`` with
    ``D = num_hiddens``. Each (sin, cos) pair turns at its own frequency, from one radian per
    position (``j = 0``) down to ``1 / base`` radians; for any offset ``delta``,
    ``P[i + delta]`` is a fixed rotation of ``P[i]`` in every pair (the book's "relative positional
    information"). An odd ``D`` is allowed: the last column is then a sine column without its
    cosine (the book's code fails there).

    The table depends only on static sizes: it is computed in float64 on the host and rounded
    once to ``dtype`` (a constant under ``jit``).

    Args:
      num_steps: ``T >= 1``, the number of positions (rows).
      num_hiddens: ``D >= 1``, the encoding width (columns).
      base: the wavelength scale, ``> 0`` (10000 in the paper and the book).
      dtype: float dtype of the result.

    Returns:
      ``P`` of shape ``(T, D)`` and dtype ``dtype``.

    Example::

        >>> P = positional_encoding(4, 6)
        >>> P.shape
        (4, 6)
        >>> P[0].tolist()                       # position 0: sin 0 = 0, cos 0 = 1
        [0.0, 1.0, 0.0, 1.0, 0.0, 1.0]
    """
    num_steps = check_int("num_steps", num_steps, 1)
    num_hiddens = check_int("num_hiddens", num_hiddens, 1)
    base = _check_base(base)
    if not jnp.issubdtype(dtype, jnp.floating):
        raise TypeError(f"dtype must be a float dtype, got {dtype}")
    positions = np.arange(num_steps, dtype=np.float64)
    angles = positions[:, None] * _inverse_frequencies(num_hiddens, base)[None, :]
    P = np.empty((num_steps, num_hiddens), dtype=np.float64)
    P[:, 0::2] = np.sin(angles)
    P[:, 1::2] = np.cos(angles[:, : num_hiddens // 2])
    return jnp.asarray(P, dtype=dtype)


def _check_table(name: str, X, table, what: str):
    """Checks ``X (..., T, D)`` against a position table ``(max_len, D)``; returns both as arrays."""
    X, table = jnp.asarray(as_array_like(X)), jnp.asarray(as_array_like(table))
    if X.ndim < 2:
        raise ValueError(f"X must have shape (B, T, D), got {X.shape}")
    if not jnp.issubdtype(X.dtype, jnp.floating):
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

    The sum is in ``X``'s dtype (``P`` is cast to it).

    Args:
      X: float ``(B, T, D)`` (any leading axes ``(..., T, D)``).
      P: ``(max_len, D)`` with ``max_len >= T``, e.g. :func:`positional_encoding`.

    Returns:
      ``(B, T, D)`` in ``X``'s dtype.
    """
    X, P = _check_table("P", X, P, "position table")
    T = X.shape[-2]
    return X + P[:T].astype(X.dtype).reshape((1,) * (X.ndim - 2) + (T, X.shape[-1]))


def learned_positional_encoding(table, X):
    """``X + table[:T]`` with a trained ``table`` (BERT, GPT-2 style absolute positions).

    The same sum as :func:`add_positional_encoding`; the table is a parameter rather than a fixed
    function of the position, so it cannot be used for positions beyond ``max_len``. The sum is in
    ``X``'s dtype; gradients reach both ``X`` and ``table``.

    Args:
      table: ``(max_len, D)`` learned position embeddings.
      X: float ``(B, T, D)`` (any leading axes) with ``T <= max_len``.

    Returns:
      ``(B, T, D)`` in ``X``'s dtype.
    """
    X, table = _check_table("table", X, table, "learned position table")
    T = X.shape[-2]
    return X + table[:T].astype(X.dtype).reshape((1,) * (X.ndim - 2) + (T, X.shape[-1]))


# --------------------------------------------------------------------------- rotary (RoPE)


def _check_positions_dtype(positions):
    """Integer positions; concrete 64-bit ones must fit the int32 that JAX converts them to while
    ``jax_enable_x64`` is off, where larger values would wrap around silently."""
    shape, dtype = jnp.shape(positions), jnp.result_type(positions)
    if not is_integer_dtype(dtype):
        raise TypeError(f"positions must hold integers, got dtype {dtype} with shape {shape}")
    check_values_fit("positions", positions,
                     "JAX converts 64-bit integers to 32 bits while jax_enable_x64 is off")


def rotary_angles(positions, head_dim: int, base: float = 10000.0, *, dtype=jnp.float32):
    """RoPE's rotation angles ``theta[..., j] = positions[...] / base^(2j/H)``.

    These are exactly the angles of the sinusoidal table for ``D = H``:
    ``positional_encoding(T, H)[i, 2j] = sin(theta_ij)`` and ``[i, 2j + 1] = cos(theta_ij)``.
    The frequencies are computed on the host in float64 and rounded to ``dtype``; the product with
    the (possibly traced) positions is taken in ``dtype``.

    Args:
      positions: integer array of any shape ``(...)``. With ``jax_enable_x64`` off, concrete
        NumPy/Python positions outside int32's range raise ``ValueError`` (naming the largest
        value) instead of wrapping around in the conversion to int32; traced positions cannot be
        checked.
      head_dim: ``H``, even and ``>= 2``.
      base: the wavelength scale, ``> 0``.
      dtype: float dtype of the angles.

    Returns:
      angles ``(..., H / 2)`` of dtype ``dtype``.
    """
    head_dim = check_int("head_dim", head_dim, 2)
    if head_dim % 2:
        raise ValueError(f"head_dim must be even (features are rotated in pairs), got {head_dim}")
    base = _check_base(base)
    positions = as_array_like(positions)
    _check_positions_dtype(positions)
    positions = jnp.asarray(positions)
    frequencies = jnp.asarray(_inverse_frequencies(head_dim, base), dtype=dtype)
    return positions.astype(dtype)[..., None] * frequencies.reshape((1,) * positions.ndim + (head_dim // 2,))


def _check_positions(positions, X):
    """``positions`` (default ``arange(T)``) broadcast to ``X.shape[:-1] = (..., T)``."""
    if positions is None:
        positions = jnp.arange(X.shape[-2], dtype=jnp.int32)
    positions = as_array_like(positions)
    _check_positions_dtype(positions)
    shape = jnp.shape(positions)
    try:
        if np.broadcast_shapes(shape, X.shape[:-1]) != X.shape[:-1]:
            raise ValueError
    except ValueError:
        raise ValueError(
            f"positions must broadcast to X.shape[:-1] = (..., T) = {X.shape[:-1]}, got shape {shape}"
        ) from None
    positions = jnp.asarray(positions)
    # Equal ranks first: strict rank promotion refuses implicit broadcasts.
    positions = positions.reshape((1,) * (X.ndim - 1 - positions.ndim) + positions.shape)
    return jnp.broadcast_to(positions, X.shape[:-1])


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

    Precision: angles, sines and the rotation are computed in ``X``'s dtype, or in float32 when
    ``X`` is float16/bfloat16 (a bfloat16 angle is off by up to 0.5 rad at position 100), and the
    result is cast back to ``X``'s dtype.

    Args:
      X: float ``(..., T, H)`` with ``H`` even, e.g. queries ``(B, N, T, H)``.
      positions: ``None`` for ``0 .. T-1``, or an integer array broadcastable to ``(..., T)`` —
        e.g. ``offset + arange(T)`` when decoding against a cache of earlier keys. May be traced.
        With ``jax_enable_x64`` off, concrete NumPy/Python positions outside int32's range raise
        ``ValueError`` (they would wrap around in the conversion to int32); traced ones cannot
        be checked, so compute them within int32.
      base: the wavelength scale, ``> 0``.

    Returns:
      ``(..., T, H)`` in ``X``'s dtype.

    Example::

        >>> X = jnp.ones((2, 3, 4))                           # (B, T, H)
        >>> out = rotary_embedding(X)
        >>> out.shape
        (2, 3, 4)
        >>> out[:, 0].tolist() == X[:, 0].tolist()            # position 0 is not rotated
        True
        >>> np.asarray(jnp.linalg.norm(out, axis=-1)[0]).round(3)     # rotations keep the norms
        array([2., 2., 2.], dtype=float32)
    """
    X = jnp.asarray(as_array_like(X))
    if X.ndim < 2:
        raise ValueError(f"X must have shape (..., T, H), got {X.shape}")
    if not jnp.issubdtype(X.dtype, jnp.floating):
        raise TypeError(f"X must be a float array, got dtype {X.dtype} with shape {X.shape}")
    H = X.shape[-1]
    if H % 2:
        raise ValueError(
            f"X must have an even last axis H (features are rotated in pairs), got shape {X.shape}"
        )
    compute = compute_dtype(X.dtype)  # half precision rotates in float32
    angles = rotary_angles(_check_positions(positions, X), H, base, dtype=compute)  # (..., T, H/2)
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    pairs = X.astype(compute).reshape(X.shape[:-1] + (H // 2, 2))
    x_even, x_odd = pairs[..., 0], pairs[..., 1]
    rotated = jnp.stack([x_even * cos - x_odd * sin, x_even * sin + x_odd * cos], axis=-1)
    return rotated.reshape(X.shape).astype(X.dtype)


# --------------------------------------------------------------------------- relative positions


def relative_positions(num_queries: int, num_keys: int, offset=0):
    """The ``(T, S)`` matrix of offsets ``j - (i + offset)``: key position minus query position.

    Query ``i`` sits at position ``i + offset`` (``offset = S - T`` when ``T`` new queries attend a
    cache of ``S`` keys, as in :func:`jax_attention.nn.masking.causal_mask`). Negative entries are
    keys in the past, positive ones keys in the future.

    Args:
      num_queries: ``T >= 0``.
      num_keys: ``S >= 0`` (an empty sequence gives an empty matrix).
      offset: position of query 0 relative to key 0 (an int, or a traced int under jit). It
        is used as int32: a concrete NumPy/Python offset outside int32's range raises
        ``ValueError`` rather than wrapping around (a traced one cannot be checked).

    Returns:
      int32 ``(T, S)``.
    """
    num_queries = check_int("num_queries", num_queries, 0)
    num_keys = check_int("num_keys", num_keys, 0)
    offset = as_array_like(offset)
    if jnp.shape(offset) != () or not is_integer_dtype(jnp.result_type(offset)):
        raise TypeError(
            f"offset must be an integer scalar, got dtype {jnp.result_type(offset)} "
            f"with shape {jnp.shape(offset)}"
        )
    check_values_fit("offset", offset, "relative positions are int32", jnp.int32)
    queries = jnp.arange(num_queries, dtype=jnp.int32)[:, None] + jnp.asarray(offset).astype(jnp.int32)
    return jnp.arange(num_keys, dtype=jnp.int32)[None, :] - queries


def _check_relative_positions(relative_positions) -> jax.Array:
    relative_positions = as_array_like(relative_positions)
    shape, dtype = jnp.shape(relative_positions), jnp.result_type(relative_positions)
    if not is_integer_dtype(dtype):
        raise TypeError(f"relative_positions must hold integers, got dtype {dtype} with shape {shape}")
    return jnp.asarray(relative_positions).astype(jnp.int32)


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

    Why a host table rather than ``jnp.log`` on the device: float32 ``log`` differs between NumPy
    and XLA (and between XLA backends) by an ulp now and then, which moves a distance across a
    bucket boundary whenever the quotient is an integer (it happens for e.g. 4 buckets per
    direction and ``max_distance = 72``). One table, built with NumPy by the same code as in the
    reference, makes the two packages agree entry for entry on every backend; under ``jit`` it is
    a small constant and the lookup a gather.
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
    :func:`_distance_buckets`), so NumPy and JAX agree on every entry; ``relative_positions`` may
    be traced.

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
    zero = jnp.zeros((), jnp.int32)
    if bidirectional:
        direction = jnp.where(relative_positions > 0, jnp.asarray(per_direction, jnp.int32), zero)
        distance = jnp.abs(relative_positions)
    else:
        direction = jnp.zeros(relative_positions.shape, dtype=jnp.int32)
        distance = jnp.maximum(-relative_positions, zero)
    table = jnp.asarray(_distance_buckets(per_direction, max_distance))
    return direction + table[jnp.minimum(distance, jnp.asarray(max_distance + 1, jnp.int32))]


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
    k = jnp.asarray(max_distance, jnp.int32)
    return jnp.clip(relative_positions, -k, k) + k


def relative_position_bias(table, indices):
    """Per-head attention bias from a table of learned scalars: ``table[indices]``, heads first.

    Added to the attention scores ``(B, N, T, S)`` before the softmax (T5 adds it in place of any
    absolute encoding). Indices are range-checked whenever they are concrete (``ValueError``);
    traced indices outside the table are clipped to ``[0, num_buckets - 1]`` — the package's rule
    (:mod:`jax_attention.nn.masking`), so that ``-1`` never wraps around to the last row.

    Args:
      table: ``(num_buckets, N)``, one scalar per bucket and head.
      indices: integer ``(T, S)`` in ``[0, num_buckets)``, from :func:`relative_position_buckets`
        or :func:`clipped_relative_positions`.

    Returns:
      ``(1, N, T, S)`` in the table's dtype.
    """
    table = jnp.asarray(as_array_like(table))
    indices = as_array_like(indices)
    shape, dtype = jnp.shape(indices), jnp.result_type(indices)
    if table.ndim != 2:
        raise ValueError(f"table must have shape (num_buckets, N), got {table.shape}")
    if len(shape) != 2:
        raise ValueError(f"indices must have shape (T, S), got {shape}")
    if not is_integer_dtype(dtype):
        raise TypeError(f"indices must hold integers, got dtype {dtype} with shape {shape}")
    rows = table.shape[0]
    check_values_in("indices", indices, 0, rows - 1,
                    f"[0, num_buckets) = [0, {rows}) for table of shape {table.shape}")
    return jnp.einsum(BIAS_HEADS_FIRST, table[clip_values(indices, 0, rows - 1)])[None]


# --------------------------------------------------------------------------- NNX modules


class Constant(nnx.Variable):
    """A fixed array held by a module, like PyTorch's registered buffers.

    Not an :class:`nnx.Param`: ``nnx.grad`` and ``nnx.Optimizer(..., wrt=nnx.Param)`` leave it
    alone and ``nnx.state(module, nnx.Param)`` does not list it. It is still part of the module's
    state (``nnx.state(module, Constant)``), so it moves with the module through ``nnx.jit`` and
    checkpoints.
    """


class PositionalEncoding(nnx.Module):
    """Adds the sinusoidal table, then dropout — d2l §11.6.3 ``PositionalEncoding``.

    ``dropout(X + P[:T])`` with ``P = positional_encoding(max_len, num_hiddens)`` computed once in
    ``__init__`` and held as a :class:`Constant` (not a trainable parameter). Raises ``ValueError``
    for sequences longer than ``max_len``.

    Args:
      num_hiddens: ``D``.
      dropout: dropout rate (active unless ``deterministic`` or ``module.eval()``).
      max_len: number of rows of the table.
      base: the wavelength scale.
      dtype: dtype of the table (it is cast to the inputs' dtype when added).
      rngs: ``nnx.Rngs`` with a ``dropout`` stream; needed when dropout is active.

    Example::

        >>> encoding = PositionalEncoding(num_hiddens=6, dropout=0.0, max_len=10)
        >>> encoding(jnp.zeros((2, 4, 6))).shape
        (2, 4, 6)
        >>> encoding(jnp.zeros((1, 1, 6)))[0, 0].tolist()
        [0.0, 1.0, 0.0, 1.0, 0.0, 1.0]
    """

    def __init__(self, num_hiddens: int, dropout: float, max_len: int = 1000, *, base: float = 10000.0,
                 dtype=jnp.float32, rngs: nnx.Rngs | None = None):
        self.P = Constant(positional_encoding(max_len, num_hiddens, base, dtype=dtype))
        dropout = check_dropout(dropout)
        # A 'dropout' stream only with dropout: nnx.Dropout forks one from any rngs it gets.
        self.dropout = nnx.Dropout(dropout, rngs=rngs if dropout > 0 else None)

    def __call__(self, X, *, deterministic: bool | None = None, rngs: nnx.Rngs | None = None):
        """``X (B, T, D)`` with ``T <= max_len`` → ``(B, T, D)``."""
        return self.dropout(add_positional_encoding(X, self.P[...]), deterministic=deterministic, rngs=rngs)


class LearnedPositionalEmbedding(nnx.Module):
    """Adds a learned table of absolute positions, then dropout (BERT, GPT-2).

    ``dropout(X + table[:T])`` with ``table`` an ``(max_len, num_hiddens)`` :class:`nnx.Param`
    initialised from ``N(0, 0.02^2)`` (GPT-2's choice). Raises ``ValueError`` for sequences longer
    than ``max_len``; see :func:`learned_positional_encoding`.

    Args:
      max_len: number of positions.
      num_hiddens: ``D``.
      dropout: dropout rate.
      param_dtype: dtype of the table.
      rngs: ``nnx.Rngs`` with a ``params`` stream (and ``dropout`` when dropout is active).
    """

    def __init__(self, max_len: int, num_hiddens: int, dropout: float = 0.0, *, param_dtype=jnp.float32,
                 rngs: nnx.Rngs):
        max_len = check_int("max_len", max_len, 1)
        num_hiddens = check_int("num_hiddens", num_hiddens, 1)
        init = nnx.initializers.normal(stddev=0.02)
        self.table = nnx.Param(init(rngs.params(), (max_len, num_hiddens), param_dtype))
        dropout = check_dropout(dropout)
        # A 'dropout' stream only with dropout: nnx.Dropout forks one from any rngs it gets.
        self.dropout = nnx.Dropout(dropout, rngs=rngs if dropout > 0 else None)

    def __call__(self, X, *, deterministic: bool | None = None, rngs: nnx.Rngs | None = None):
        """``X (B, T, D)`` with ``T <= max_len`` → ``(B, T, D)``."""
        return self.dropout(learned_positional_encoding(self.table[...], X),
                            deterministic=deterministic, rngs=rngs)


class RelativePositionBias(nnx.Module):
    """A learned per-head bias of the relative position ``j - i``, for the attention scores.

    ``mode="bucket"``: T5's log-spaced buckets (:func:`relative_position_buckets`), a table of
    ``num_buckets`` rows. ``mode="clip"``: Shaw et al.'s clipping
    (:func:`clipped_relative_positions`), a table of ``2 * max_distance + 1`` rows; ``num_buckets``
    and ``bidirectional`` are then unused. The table ``(rows, num_heads)`` is an :class:`nnx.Param`
    initialised from ``N(0, 0.02^2)``. Calling the module gives the bias ``(1, N, T, S)`` to add to
    scores ``(B, N, T, S)``.

    Args:
      num_heads: ``N``.
      num_buckets: number of buckets (``mode="bucket"``).
      max_distance: distance from which offsets share a row.
      bidirectional: split the buckets between past and future keys (``False`` for causal
        decoders).
      mode: ``"bucket"`` or ``"clip"``.
      param_dtype: dtype of the table.
      rngs: ``nnx.Rngs`` with a ``params`` stream.

    Example::

        >>> bias = RelativePositionBias(2, num_buckets=8, max_distance=16, rngs=nnx.Rngs(0))
        >>> bias(3, 5).shape                                  # add to scores (B, 2, 3, 5)
        (1, 2, 3, 5)
        >>> clip = RelativePositionBias(2, max_distance=1, mode="clip", rngs=nnx.Rngs(0))
        >>> clip.indices(2, 3).tolist()
        [[1, 2, 2], [0, 1, 2]]
    """

    def __init__(self, num_heads: int, num_buckets: int = 32, max_distance: int = 128, *,
                 bidirectional: bool = True, mode: str = "bucket", param_dtype=jnp.float32, rngs: nnx.Rngs):
        num_heads = check_int("num_heads", num_heads, 1)
        if mode == "bucket":
            _check_bucket_arguments(num_buckets, max_distance, bidirectional)
            rows = num_buckets
        elif mode == "clip":
            rows = 2 * check_int("max_distance", max_distance, 1) + 1
        else:
            raise ValueError(f'mode must be "bucket" or "clip", got {mode!r}')
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.bidirectional = bidirectional
        self.mode = mode
        init = nnx.initializers.normal(stddev=0.02)
        self.table = nnx.Param(init(rngs.params(), (rows, num_heads), param_dtype))

    def indices(self, num_queries: int, num_keys: int, offset=0) -> jax.Array:
        """The table row of each (query, key) pair, int32 ``(T, S)``."""
        positions = relative_positions(num_queries, num_keys, offset)
        if self.mode == "bucket":
            return relative_position_buckets(positions, self.num_buckets, self.max_distance,
                                             self.bidirectional)
        return clipped_relative_positions(positions, self.max_distance)

    def __call__(self, num_queries: int, num_keys: int, offset=0):
        """The bias ``(1, N, T, S)`` for ``T`` queries starting at position ``offset`` and ``S`` keys."""
        return relative_position_bias(self.table[...], self.indices(num_queries, num_keys, offset))
