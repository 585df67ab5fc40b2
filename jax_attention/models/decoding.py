"""Decoding under ``jit``: greedy and beam search over a fixed number of steps — d2l §10.7.6 and §10.8.

Model-agnostic: a model supplies a ``step`` function that maps ``(state, tokens (B,))`` to
``(logits (B, V), state, weights (B, S))``; :func:`greedy_search` and :func:`beam_search` run it
with ``lax.scan`` for exactly ``max_len`` steps, so that the whole loop compiles once per shape.
The decoder state may be any pytree of fixed shapes (a GRU state, a key/value cache updated in
place), never a list that grows.

Output conventions (shared by every model of the package):

* ``tokens (B, max_len)``: each row's predictions up to and including its first ``<eos>``, then
  ``<pad>``; a row that never predicts ``<eos>`` fills all ``max_len`` steps;
* ``lengths (B,)``: the number of tokens before ``<eos>`` (the translation's length);
* ``weights (B, max_len, S)``: the attention weights of each step up to and including the
  ``<eos>`` step, zero after it.

:func:`beam_search` keeps the same conventions per hypothesis, with a beam axis ``k`` after the
batch axis: ``tokens (B, k, max_len)``, ``lengths (B, k)``, plus ``scores (B, k)``, best first.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax

from jax_attention._checks import check_id, check_int, check_max_len
from jax_attention.nn.precision import compute_dtype

__all__ = ["greedy_search", "beam_search"]


def _check_logits(logits_shape, rows: int, rows_text: str, ids: dict) -> int:
    """The step's logits must be ``(rows, V)``, and the special ids must lie in ``[0, V)``.

    Static checks, run while the step is traced: an id ``>= V`` would be fed to the model as an
    input (``<bos>``, ``<pad>`` of finished beams) that the embedding can only clip, or, for
    ``<eos>``, could never be predicted. Returns ``V``.
    """
    if len(logits_shape) != 2 or logits_shape[0] != rows:
        raise ValueError(f"step must return logits of shape {rows_text} = ({rows}, V), got "
                         f"{tuple(logits_shape)}")
    V = logits_shape[1]
    for name, value in ids.items():
        if value >= V:
            raise ValueError(f"{name} must be a token id in [0, V) = [0, {V}) (V from the step's "
                             f"logits of shape {tuple(logits_shape)}), got {value}")
    return V


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
      bos_id, eos_id, pad_id: token ids in ``[0, V)`` (Python ints, static under ``jit``).
      max_len: the number of steps (>= 1, static).

    Returns:
      ``(tokens (B, max_len) int32, lengths (B,) int32, weights (B, max_len, S))``; see the module
      docstring. ``B = 0`` gives empty arrays.
    """
    bos_id, eos_id, pad_id = (check_id(n, v) for n, v in
                              (("bos_id", bos_id), ("eos_id", eos_id), ("pad_id", pad_id)))
    max_len = check_max_len(max_len)
    batch_size = check_int("batch_size", batch_size, 0)

    def body(carry, _):
        state, tokens, done = carry
        logits, state, weights = step(state, tokens)
        _check_logits(jnp.shape(logits), batch_size, "(B, V)",
                      {"bos_id": bos_id, "eos_id": eos_id, "pad_id": pad_id})
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


def _score_dtype(dtype):
    """Log-probabilities in float32 at least: the package's half-precision rule
    (:func:`~jax_attention.nn.precision.compute_dtype`; float64 logits stay float64), and
    float32 for logits that are not floats."""
    return compute_dtype(dtype) if jnp.issubdtype(dtype, jnp.floating) else jnp.dtype(jnp.float32)


def _check_beam_arguments(state, batch_size, *, beam_size, bos_id, eos_id, pad_id, max_len,
                          length_penalty):
    """:func:`beam_search`'s static arguments checked, and every leaf of ``state`` checked for a
    leading batch axis ``B``: ``(bos_id, eos_id, pad_id, max_len, k, B, alpha)`` as Python
    numbers. The vocabulary-dependent checks wait for the step's logits (:func:`_check_logits`).
    """
    bos_id, eos_id, pad_id = (check_id(n, v) for n, v in
                              (("bos_id", bos_id), ("eos_id", eos_id), ("pad_id", pad_id)))
    max_len = check_max_len(max_len)
    k = check_int("beam_size", beam_size, 1, static=True)
    if (isinstance(length_penalty, bool) or not isinstance(length_penalty, numbers.Real)
            or not length_penalty >= 0 or length_penalty == float("inf")):
        raise ValueError(f"length_penalty must be a finite number >= 0 (static), got "
                         f"{length_penalty!r}")
    B, alpha = check_int("batch_size", batch_size, 1), float(length_penalty)

    for path, leaf in jax.tree_util.tree_leaves_with_path(state):
        shape = jnp.shape(leaf)
        if len(shape) == 0 or shape[0] != B:
            raise ValueError(f"state leaf {jax.tree_util.keystr(path) or '(root)'} must have a "
                             f"leading batch axis of size B = {B} (shape (B, ...)), got {shape}")
    return bos_id, eos_id, pad_id, max_len, k, B, alpha


def _beam_candidates(logits, done, pad, finished_scores):
    """Stage 1 of a beam search step: each beam's ``k`` best next tokens and their
    log-probabilities, ``(candidates (B, k, k) int32, candidate_scores (B, k, k))``.

    ``logits (B, k, V)`` in the score dtype; the tokens are ordered by ``logits`` as ``argmax``
    orders them (so that ``k = 1`` is greedy search). A finished beam (``done (B, k)``) proposes
    ``pad`` at zero cost and ``k - 1`` impossible candidates (``finished_scores (1, 1, k)``).
    """
    k = done.shape[-1]
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    _, candidates = lax.top_k(logits, k)  # (B, k, k)
    candidate_scores = jnp.take_along_axis(log_probs, candidates, axis=-1)
    candidates = jnp.where(done[..., None], pad, candidates.astype(jnp.int32))
    candidate_scores = jnp.where(done[..., None], finished_scores, candidate_scores)
    return candidates, candidate_scores


def _rank_beams(history, lengths, log_p, *, max_len: int, alpha: float):
    """The final beams ranked by the length-normalised score ``log_p / L ** alpha``, best first:
    ``(tokens (B, k, max_len), lengths (B, k), scores (B, k))`` from ``history (B, k, max_len)``,
    ``lengths (B, k)`` and the cumulative log-probabilities ``log_p (B, k)``."""
    dtype, k = log_p.dtype, log_p.shape[-1]
    # L: the generated tokens including <eos> (max_len when there was none).
    L = jnp.minimum(lengths + 1, max_len).astype(dtype)
    scores = log_p / L ** jnp.asarray(alpha, dtype)
    scores, order = lax.top_k(scores, k)
    return (jnp.take_along_axis(history, order[..., None], axis=1),
            jnp.take_along_axis(lengths, order, axis=-1), scores)


def beam_search(step: Callable, state, batch_size: int, *, beam_size: int, bos_id: int,
                eos_id: int, pad_id: int, max_len: int, length_penalty: float = 0.75):
    """Beam search for a fixed ``max_len`` steps, ``k = beam_size`` beams per row — d2l §10.8.3.

    Every example keeps ``k`` hypotheses (beams). At each step each beam ``j`` with cumulative
    log-probability ``log P(y_1..y_t)`` proposes its extensions ``y_{t+1}``, scored

        log P(y_1..y_{t+1}) = log P(y_1..y_t) + log p(y_{t+1} | y_1..y_t, c),

    with ``log p = jax.nn.log_softmax(logits)`` computed in float32 at least; among the ``k x V``
    candidates of an example the ``k`` of highest cumulative log-probability survive (ties: the
    lower beam, then the lower token id). Details:

    * at step 0 only beam 0 is live (the others start at ``-inf``), so the ``k`` beams do not
      duplicate one another;
    * a beam that has emitted ``<eos>`` is finished: it stays in the beam set with its
      log-probability frozen and extends only with ``<pad>`` at zero cost (one candidate), so finished hypotheses
      compete with live ones to the end;
    * after ``max_len`` steps the ``k`` final hypotheses are ranked by the book's length-normalised
      score

        score = log P(y_1..y_L) / L^alpha,   alpha = length_penalty,

      where ``L`` counts the tokens the model generated *including* ``<eos>`` (so ``L >= 1``, and
      an empty translation, ``<eos>`` alone, has ``L = 1``); a beam that never emitted ``<eos>``
      has ``L = max_len``. Equivalently ``L = min(lengths + 1, max_len)``. ``length_penalty = 0``
      ranks by the plain log-probability.

    With ``beam_size = 1`` the result equals :func:`greedy_search`'s tokens and lengths: each beam
    first keeps its ``k`` best tokens by ``logits`` (the order ``argmax`` uses), then the ``k x k``
    survivors compete on cumulative log-probability — the same set as the top ``k`` of all
    ``k x V`` candidates, since a beam contributes at most ``k`` of those.

    The state: any pytree whose every leaf has a leading batch axis of size ``B``. Each leaf is
    repeated ``k`` times along axis 0 (row ``b * k + j`` is beam ``j`` of example ``b``), so the
    step sees ``B * k`` rows, and after every step each leaf is reordered along axis 0 by the
    surviving beams' parents (``jnp.take`` with flat indices ``b * k + parent``). Anything the step
    needs per example (encoder outputs, source valid lengths) must therefore either live in the
    state or be repeated ``k`` times by the caller. Finished beams keep being computed (fed
    ``<pad>``); what they produce is ignored. The step's attention weights are ignored.

    Args:
      step: ``step(state, tokens (B*k,)) -> (logits (B*k, V), state, weights)``, traceable.
      state: the decoder's initial state for ``B`` examples (leaves ``(B, ...)``).
      batch_size: ``B``.
      beam_size: ``k``, an integer in ``[1, V]`` (static).
      bos_id, eos_id, pad_id: token ids in ``[0, V)`` (Python ints, static under ``jit``).
      max_len: the number of steps (>= 1, static).
      length_penalty: ``alpha >= 0`` (static); the book's example uses 0.75.

    Returns:
      ``(tokens (B, k, max_len) int32, lengths (B, k) int32, scores (B, k))``, the beams of each
      example sorted by ``scores`` (the length-normalised score above), best first. ``tokens``
      follow the module's conventions (``<eos>`` then ``<pad>``; ``lengths`` counts the tokens
      before ``<eos>``); the log-probability of a beam is ``scores * L ** alpha``. If fewer than
      ``k`` hypotheses have a finite log-probability (logits of ``-inf``), the rest score ``-inf``
      and their tokens are meaningless.
    """
    bos_id, eos_id, pad_id, max_len, k, B, alpha = _check_beam_arguments(
        state, batch_size, beam_size=beam_size, bos_id=bos_id, eos_id=eos_id, pad_id=pad_id,
        max_len=max_len, length_penalty=length_penalty)
    state = jax.tree.map(lambda leaf: jnp.repeat(jnp.asarray(leaf), k, axis=0), state)
    start = jnp.full((B * k,), bos_id, dtype=jnp.int32)

    logits_shape = jax.eval_shape(step, state, start)[0]
    V = _check_logits(logits_shape.shape, B * k, "(B * k, V)",
                      {"bos_id": bos_id, "eos_id": eos_id, "pad_id": pad_id})
    if k > V:
        raise ValueError(f"beam_size must be <= the vocabulary size V = {V}, got {k}")
    dtype = _score_dtype(logits_shape.dtype)
    neg_inf = jnp.asarray(-jnp.inf, dtype)
    zero = jnp.zeros((), dtype)
    pad = jnp.asarray(pad_id, jnp.int32)
    # A finished beam's candidates: <pad> at zero cost, then k - 1 impossible ones.
    finished_scores = jnp.where(jnp.arange(k) == 0, zero, neg_inf).reshape(1, 1, k)
    example = (jnp.arange(B, dtype=jnp.int32) * k).reshape(B, 1)

    def body(carry, t):
        state, inputs, log_p, done, lengths, history = carry
        logits, state, _ = step(state, inputs)
        candidates, candidate_scores = _beam_candidates(
            logits.astype(dtype).reshape(B, k, V), done, pad, finished_scores)
        # Stage 2: the k best of the k x k, on cumulative log-probability.
        total = (log_p[..., None] + candidate_scores).reshape(B, k * k)
        log_p, best = lax.top_k(total, k)  # (B, k)
        parent = (best // k).astype(jnp.int32)
        tokens = jnp.take_along_axis(candidates.reshape(B, k * k), best, axis=-1)
        was_done = jnp.take_along_axis(done, parent, axis=-1)
        lengths = (jnp.take_along_axis(lengths, parent, axis=-1)
                   + jnp.logical_and(~was_done, tokens != eos_id).astype(jnp.int32))
        done = jnp.logical_or(was_done, tokens == eos_id)
        history = jnp.take_along_axis(history, parent[..., None], axis=1)
        history = lax.dynamic_update_index_in_dim(history, tokens, t, axis=2)
        rows = (example + parent).reshape(B * k)
        state = jax.tree.map(lambda leaf: jnp.take(leaf, rows, axis=0), state)
        return (state, tokens.reshape(B * k), log_p, done, lengths, history), None

    log_p = jnp.broadcast_to(jnp.where(jnp.arange(k) == 0, zero, neg_inf), (B, k))
    carry = (state, start, log_p, jnp.zeros((B, k), bool), jnp.zeros((B, k), jnp.int32),
             jnp.full((B, k, max_len), pad_id, dtype=jnp.int32))
    (_, _, log_p, done, lengths, history), _ = lax.scan(
        body, carry, jnp.arange(max_len, dtype=jnp.int32))

    return _rank_beams(history, lengths, log_p, max_len=max_len, alpha=alpha)
