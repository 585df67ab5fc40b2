"""Decoding under ``jit``: greedy search over a fixed number of steps — d2l §10.7.6 and §10.8.

Model-agnostic: a model supplies a ``step`` function that maps ``(state, tokens (B,))`` to
``(logits (B, V), state, weights (B, S))``; :func:`greedy_search` runs it with ``lax.scan`` for
exactly ``max_len`` steps, so that the whole loop compiles once per shape. The decoder state may be
any pytree of fixed shapes (a GRU state, a key/value cache updated in place), never a list that
grows.

Output conventions (shared by every model of the package):

* ``tokens (B, max_len)``: each row's predictions up to and including its first ``<eos>``, then
  ``<pad>``; a row that never predicts ``<eos>`` fills all ``max_len`` steps;
* ``lengths (B,)``: the number of tokens before ``<eos>`` (the translation's length);
* ``weights (B, max_len, S)``: the attention weights of each step up to and including the
  ``<eos>`` step, zero after it.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable

import jax.numpy as jnp
from jax import lax

__all__ = ["greedy_search"]


def _check_id(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer (a static token id), got {value!r}")
    return int(value)


def greedy_search(step: Callable, state, batch_size: int, *, bos_id: int, eos_id: int,
                  pad_id: int, max_len: int):
    """Greedy decoding of a batch for a fixed ``max_len`` steps; every row stops at its own ``<eos>``.

    At each step every row feeds back its own argmax (the book's ``predict_seq2seq``). Rows that
    have finished keep being computed — the shapes are fixed — but what they produce is replaced
    by ``<pad>`` and zero weights, so nothing is emitted after a row's ``<eos>``.

    Args:
      step: ``step(state, tokens (B,)) -> (logits (B, V), state, weights (B, S))``, traceable.
      state: the decoder's initial state (any pytree of arrays).
      batch_size: ``B``.
      bos_id, eos_id, pad_id: token ids (Python ints, static under ``jit``).
      max_len: the number of steps (>= 1, static).

    Returns:
      ``(tokens (B, max_len) int32, lengths (B,) int32, weights (B, max_len, S))``; see the module
      docstring.
    """
    bos_id, eos_id, pad_id = (_check_id(n, v) for n, v in
                              (("bos_id", bos_id), ("eos_id", eos_id), ("pad_id", pad_id)))
    if isinstance(max_len, bool) or not isinstance(max_len, numbers.Integral) or max_len < 1:
        raise ValueError(f"max_len must be an integer >= 1 (static), got {max_len!r}")

    def body(carry, _):
        state, tokens, done = carry
        logits, state, weights = step(state, tokens)
        predicted = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        emitted = jnp.where(done, jnp.asarray(pad_id, jnp.int32), predicted)
        weights = jnp.where(done[:, None], jnp.zeros((), weights.dtype), weights)
        counts = jnp.logical_and(~done, predicted != eos_id)  # a token of the translation
        done = jnp.logical_or(done, predicted == eos_id)
        return (state, predicted, done), (emitted, weights, counts)

    start = jnp.full((batch_size,), bos_id, dtype=jnp.int32)
    done = jnp.zeros((batch_size,), dtype=bool)
    _, (tokens, weights, counts) = lax.scan(body, (state, start, done), None, length=int(max_len))
    # scan stacks along time first: (max_len, B, ...) -> (B, max_len, ...).
    lengths = jnp.sum(counts.astype(jnp.int32), axis=0)
    return jnp.swapaxes(tokens, 0, 1), lengths, jnp.swapaxes(weights, 0, 1)

