"""Dropout for the functional cores: masks from a keyed counter-based hash, one fused pass.

The seq2seq models draw a dropout mask at every site of every training step (the book's
Transformer: 18 sites a step). ``jax.random.bernoulli`` with a ``fold_in`` per site made the
random numbers a large share of a training step on XLA:CPU (a quarter of the book Transformer's
step, a tenth of its compiled program). Here a mask is an integer hash of each element's index,
keyed by the key's data: a few integer operations per element that XLA fuses into the ``where``
that applies the mask, and a fold that costs a handful of scalar operations.

* :func:`key_seed`: the key's data mixed into one ``uint32`` seed.
* :func:`fold`: a new key of the same implementation for part ``index`` of a computation — the
  role of ``jax.random.fold_in``, without its Threefry rounds.
* :func:`keep_mask`: ``True`` with probability ``1 - rate``: element ``i`` (row-major index) is
  kept when ``hash2(i, seed) >= round(rate * 2**32)``, so the rate is exact to ``2**-32``.
* :func:`dropout`: inverted dropout with that mask.

A mask may be the leading corner of a larger one (``padded_shape``): a training batch cut to its
longest sentence then draws, at every element, the bit the full-length batch would draw there.

The hash is Chris Wellons' ``lowbias32`` (two multiply–xorshift rounds; full avalanche, low bias),
applied twice with the seed mixed in before each round, so that different seeds give unrelated
masks; within one mask, distinct indices give distinct hash values. It is not a cryptographic
generator and not ``jax.random``'s stream: the same key gives other masks than
``jax.random.bernoulli`` would. The masks are a pure function of the key's data, the rate and the
shape — on every backend, and whatever the sharding (the index is the element's global index),
so a batch split over devices draws the bits of one device. ``reference_numpy.dropout`` computes
the same bits in NumPy. ``tests/test_dropout.py`` checks the rates, the independence of sites and
positions, and the bits against NumPy.

One mask covers at most ``2**32`` elements (larger shapes raise).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

__all__ = ["GOLDEN", "hash32", "key_seed", "fold", "keep_threshold", "keep_mask", "dropout"]

#: ``2**32 / phi``, odd: spreads consecutive integers over the 32-bit range.
GOLDEN = 0x9E3779B9
_MULTIPLIERS = (0x7FEB352D, 0x846CA68B)


def _u32(value: int) -> np.ndarray:
    return np.uint32(value % 2 ** 32)


def hash32(x):
    """``lowbias32``: a bijection of ``uint32`` with full avalanche (elementwise).

    Written with ``lax`` operations: the training step hashes at every dropout site, and
    ``jax.numpy``'s per-call overhead made tracing them a noticeable part of compiling it.
    """
    x = jnp.asarray(x, jnp.uint32)
    x = lax.bitwise_xor(x, lax.shift_right_logical(x, _u32(16)))
    x = lax.mul(x, _u32(_MULTIPLIERS[0]))
    x = lax.bitwise_xor(x, lax.shift_right_logical(x, _u32(15)))
    x = lax.mul(x, _u32(_MULTIPLIERS[1]))
    return lax.bitwise_xor(x, lax.shift_right_logical(x, _u32(16)))


def _is_typed_key(key) -> bool:
    return hasattr(key, "dtype") and jnp.issubdtype(key.dtype, jax.dtypes.prng_key)


def _key_data(key) -> jax.Array:
    """The key's ``uint32`` data (a typed key's, or ``key`` itself when it is raw data)."""
    data = jax.random.key_data(key) if _is_typed_key(key) else jnp.asarray(key)
    if data.dtype != jnp.uint32:
        raise TypeError(f"dropout_rng must be a jax.random key or its uint32 data, got dtype "
                        f"{data.dtype}")
    return data


def key_seed(key) -> jax.Array:
    """The key's data mixed into one ``uint32`` scalar (each word through :func:`hash32`)."""
    words = _key_data(key).reshape(-1)
    seed = _u32(GOLDEN)
    for i in range(words.shape[0]):
        seed = hash32(lax.bitwise_xor(seed, words[i]))
    return seed


def fold(key, index: int):
    """The key of part ``index`` of a computation: ``key``'s words each mixed with ``index``.

    Same implementation and shape as ``key``; different ``index`` values give unrelated keys (for
    this module's masks). Accepts a typed key (returns one) or raw ``uint32`` key data.
    """
    data = _key_data(key)
    # The salt of each word position, hash32(hash32(index * GOLDEN + 1) + j * GOLDEN), is a
    # constant: computed here in NumPy (reference_numpy.dropout.fold computes the same).
    with np.errstate(over="ignore"):
        salt = _numpy_hash32(np.uint32(index % 2 ** 32) * _u32(GOLDEN) + _u32(1))
        positions = np.arange(data.shape[-1], dtype=np.uint32)
        salts = _numpy_hash32(salt + positions * _u32(GOLDEN))
    folded = hash32(lax.bitwise_xor(data, jnp.asarray(salts).reshape(
        (1,) * (data.ndim - 1) + salts.shape)))
    if _is_typed_key(key):
        return jax.random.wrap_key_data(folded, impl=jax.random.key_impl(key))
    return folded


def _numpy_hash32(x) -> np.ndarray:
    """:func:`hash32` of a constant, in NumPy."""
    x = np.asarray(x, dtype=np.uint32)
    with np.errstate(over="ignore"):
        x = x ^ (x >> np.uint32(16))
        x = x * _u32(_MULTIPLIERS[0])
        x = x ^ (x >> np.uint32(15))
        x = x * _u32(_MULTIPLIERS[1])
        return x ^ (x >> np.uint32(16))


def keep_threshold(rate: float) -> int:
    """The ``uint32`` threshold below which a hash drops its element: ``round(rate * 2**32)``."""
    return min(int(round(rate * 2.0 ** 32)), 2 ** 32 - 1)


def _padded_shape(shape, padded_shape) -> tuple[int, ...]:
    """``padded_shape`` checked against ``shape`` (the same rank, no axis shorter), or ``shape``
    itself when ``None``; both as tuples of ints."""
    shape = tuple(int(n) for n in shape)
    if padded_shape is None:
        return shape
    padded = tuple(int(n) for n in padded_shape)
    if len(padded) != len(shape) or any(p < n for p, n in zip(padded, shape, strict=True)):
        raise ValueError(f"padded_shape must have the rank of shape and no shorter axis, got "
                         f"shape {shape} and padded_shape {padded}")
    return padded


def keep_mask(key, rate: float, shape, padded_shape=None) -> jax.Array:
    """A boolean mask of ``shape``: each element ``True`` with probability ``1 - rate``.

    Args:
      key: a ``jax.random`` key (any implementation) or its ``uint32`` data.
      rate: the drop probability, ``0 <= rate < 1`` (a Python float: static).
      shape: the mask's shape.
      padded_shape: ``None``, or the shape of a larger array whose leading corner the mask
        covers (the same rank, no axis shorter; at most ``2**32`` elements): the mask is then
        ``keep_mask(key, rate, padded_shape)[:shape[0], :shape[1], ...]``, computed for the
        corner only. A batch cut short of its padding draws the masks of the full-length batch
        this way (:func:`jax_attention.models.transformer.transformer`'s ``num_steps``).
    """
    shape = tuple(int(n) for n in shape)
    padded = _padded_shape(shape, padded_shape)
    size = math.prod(padded)
    if size > 2 ** 32:
        raise ValueError(f"a dropout mask holds at most 2**32 elements, got shape {padded} "
                         f"({size} elements)")
    seed = key_seed(key)
    index = lax.broadcasted_iota(jnp.uint32, shape, len(shape) - 1) if shape else _u32(0)
    stride = padded[-1] if shape else 1
    for axis in reversed(range(len(shape) - 1)):  # the row-major index in padded, in uint32
        index = lax.add(index, lax.mul(lax.broadcasted_iota(jnp.uint32, shape, axis),
                                       _u32(stride)))
        stride *= padded[axis]
    seed = lax.broadcast(seed, shape)
    bits = hash32(lax.add(hash32(lax.bitwise_xor(index, seed)), lax.mul(seed, _u32(GOLDEN))))
    return lax.ge(bits, lax.full(shape, keep_threshold(rate), jnp.uint32))


def dropout(x, rate: float, dropout_rng, padded_shape=None):
    """Inverted dropout (``nn.Dropout``): zero with probability ``rate``, scale the rest by
    ``1 / (1 - rate)``; ``x`` unchanged without a key (``None``: evaluation) or at rate 0.
    ``padded_shape``: the mask of that larger array's leading corner (:func:`keep_mask`)."""
    if dropout_rng is None or rate == 0.0:
        return x
    keep = keep_mask(dropout_rng, rate, jnp.shape(x), padded_shape)
    return jnp.where(keep, x / (1.0 - rate), jnp.zeros((), x.dtype))
