"""The dropout masks of :mod:`jax_attention.nn.dropout` in NumPy: the same bits, computed plainly.

Keys are their ``uint32`` data here (``jax.random.key_data(key)``); everything else mirrors the
JAX module name for name: :func:`hash32` (``lowbias32``), :func:`key_seed`, :func:`fold`,
:func:`keep_threshold`, :func:`keep_mask`, :func:`dropout`. Arithmetic is ``uint32`` with
wrap-around, as in XLA.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["GOLDEN", "hash32", "key_seed", "fold", "keep_threshold", "keep_mask", "dropout"]

#: ``2**32 / phi``, odd (the golden-ratio constant of :mod:`jax_attention.nn.dropout`, the same
#: value): the start of :func:`key_seed` and the multiplier that spreads consecutive indices and
#: positions over the 32-bit range in :func:`fold` and :func:`keep_mask`.
GOLDEN = 0x9E3779B9
_MULTIPLIERS = (0x7FEB352D, 0x846CA68B)


def hash32(x) -> np.ndarray:
    """``lowbias32`` of each ``uint32`` element."""
    x = np.asarray(x, dtype=np.uint32)
    with np.errstate(over="ignore"):
        x = x ^ (x >> np.uint32(16))
        x = x * np.uint32(_MULTIPLIERS[0])
        x = x ^ (x >> np.uint32(15))
        x = x * np.uint32(_MULTIPLIERS[1])
        return x ^ (x >> np.uint32(16))


def key_seed(key_data) -> np.uint32:
    """The key's words mixed into one ``uint32``: ``seed = hash32(seed ^ word)`` for each word."""
    seed = np.uint32(GOLDEN)
    for word in np.asarray(key_data, dtype=np.uint32).reshape(-1):
        seed = hash32(seed ^ word)
    return np.uint32(seed)


def fold(key_data, index: int) -> np.ndarray:
    """The key data of part ``index``: word ``j`` becomes
    ``hash32(word ^ hash32(salt + j * GOLDEN))`` with ``salt = hash32(index * GOLDEN + 1)``."""
    data = np.asarray(key_data, dtype=np.uint32)
    with np.errstate(over="ignore"):
        salt = hash32(np.uint32(index % 2 ** 32) * np.uint32(GOLDEN) + np.uint32(1))
        positions = np.broadcast_to(np.arange(data.shape[-1], dtype=np.uint32), data.shape)
        return hash32(data ^ hash32(salt + positions * np.uint32(GOLDEN)))


def keep_threshold(rate: float) -> int:
    """``round(rate * 2**32)``: hashes below it drop their element."""
    return min(int(round(rate * 2.0 ** 32)), 2 ** 32 - 1)


def keep_mask(key_data, rate: float, shape, padded_shape=None) -> np.ndarray:
    """``hash32(hash32(i ^ seed) + seed * GOLDEN) >= keep_threshold(rate)`` for the row-major
    index ``i`` of each element; with ``padded_shape``, the leading corner of that shape's mask."""
    shape = tuple(int(n) for n in shape)
    padded = shape if padded_shape is None else tuple(int(n) for n in padded_shape)
    if len(padded) != len(shape) or any(p < n for p, n in zip(padded, shape, strict=True)):
        raise ValueError(f"padded_shape must have the rank of shape and no shorter axis, got "
                         f"shape {shape} and padded_shape {padded}")
    if math.prod(padded) > 2 ** 32:
        raise ValueError(f"a dropout mask holds at most 2**32 elements, got shape {padded}")
    seed = key_seed(key_data)
    index = np.arange(math.prod(padded), dtype=np.uint64).astype(np.uint32).reshape(padded)
    index = index[tuple(slice(0, n) for n in shape)]
    with np.errstate(over="ignore"):
        bits = hash32(hash32(index ^ seed) + seed * np.uint32(GOLDEN))
    return bits >= np.uint32(keep_threshold(rate))


def dropout(x, rate: float, key_data, padded_shape=None) -> np.ndarray:
    """Inverted dropout: ``x / (1 - rate)`` where kept, 0 elsewhere; ``x`` without a key."""
    x = np.asarray(x)
    if key_data is None or rate == 0.0:
        return x
    return np.where(keep_mask(key_data, rate, x.shape, padded_shape), x / (1.0 - rate),
                    0.0).astype(x.dtype)
