"""Beam search under jit (jax_attention.models.decoding.beam_search) — d2l §10.8.3.

Steps driven by fixed tables of log-probabilities (depending on the previous token, or on the whole
history kept in the state) are checked against a brute-force search over every sequence and against
a plain-Python beam search; beam_size=1 must equal greedy search, on tables and on a Bahdanau model
whose beams are rescored by teacher forcing.

Every search runs under ``jax.jit`` (one program per table shape and static setting instead of
one per eager operation), on tables put on the device by ``jax.device_put``; the argument checks
run eagerly, as they raise before anything is traced.
"""

from __future__ import annotations

import functools
import itertools
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_attention.models import bahdanau
from jax_attention.models.decoding import beam_search, greedy_search

UNK, PAD, BOS, EOS = 0, 1, 2, 3
A, B_, C = UNK, 4, 5  # the content tokens of the hand-built table
V = 6


# --------------------------------------------------------------------------- references in Python


def _log_softmax(row) -> list[float]:
    row = [float(x) for x in row]
    top = max(row)
    total = top + math.log(sum(math.exp(x - top) for x in row))
    return [x - total for x in row]


def _table_log_probs(table):
    """``log_probs(prefix)`` for a step whose logits are ``table[previous token]``."""
    return lambda prefix: _log_softmax(table[prefix[-1]])


def _finish(log_p: float, sequence: list[int], max_len: int, alpha: float):
    """``(score, tokens padded to max_len, length)`` by the docstring's rule."""
    finished = EOS in sequence
    length = sequence.index(EOS) if finished else len(sequence)
    L = length + 1 if finished else max_len
    return log_p / L ** alpha, sequence + [PAD] * (max_len - len(sequence)), length


def brute_force(log_probs, max_len: int, alpha: float):
    """The best complete hypothesis over all sequences: ``(score, tokens, length)``."""
    best = None
    for n in range(1, max_len + 1):
        for sequence in itertools.product(range(V), repeat=n):
            if EOS in sequence[:-1] or (n < max_len and sequence[-1] != EOS):
                continue
            log_p, prefix = 0.0, [BOS]
            for token in sequence:
                log_p += log_probs(prefix)[token]
                prefix.append(token)
            candidate = _finish(log_p, list(sequence), max_len, alpha)
            if best is None or candidate[0] > best[0]:
                best = candidate
    return best


def python_beam_search(log_probs, k: int, max_len: int, alpha: float):
    """The docstring's algorithm, one example, lists of floats: ``[(score, tokens, length)]``."""
    beams = [(0.0, [], False)]  # beams 1..k-1 start at -inf: absent
    for _ in range(max_len):
        candidates = []
        for log_p, sequence, done in beams:
            if done:
                candidates.append((log_p, sequence + [PAD], True))
                continue
            for token, lp in enumerate(log_probs([BOS] + sequence)):
                candidates.append((log_p + lp, sequence + [token], token == EOS))
        beams = sorted(candidates, key=lambda c: -c[0])[:k]  # stable: lower beam, lower token
    finished = [_finish(log_p, sequence, max_len, alpha) for log_p, sequence, _ in beams]
    return sorted(finished, key=lambda c: -c[0])


# --------------------------------------------------------------------------- steps


def _table_step(tables):
    """Logits ``tables[row, previous token]``; the state is each beam's example id ``(B,)``."""
    tables = jnp.asarray(tables, jnp.float32)

    def step(rows, tokens):
        return tables[rows, tokens], rows, jnp.zeros((tokens.shape[0], 2), jnp.float32)

    return step


@functools.partial(jax.jit, static_argnames=("beam_size", "max_len", "length_penalty"))
def _beam_on_tables(tables, *, beam_size, max_len, length_penalty):
    batch = tables.shape[0]
    return beam_search(
        _table_step(tables), jnp.arange(batch, dtype=jnp.int32), batch, beam_size=beam_size,
        bos_id=BOS, eos_id=EOS, pad_id=PAD, max_len=max_len, length_penalty=length_penalty)


@functools.partial(jax.jit, static_argnames="max_len")
def _greedy_on_tables(tables, *, max_len):
    batch = tables.shape[0]
    return greedy_search(_table_step(tables), jnp.arange(batch, dtype=jnp.int32), batch,
                         bos_id=BOS, eos_id=EOS, pad_id=PAD, max_len=max_len)


def _tables(tables):
    return jax.device_put(np.asarray(tables, np.float32))


def _run(tables, *, beam_size, max_len, length_penalty=0.75):
    return jax.device_get(_beam_on_tables(_tables(tables), beam_size=beam_size, max_len=max_len,
                                          length_penalty=length_penalty))


def _greedy(tables, *, max_len):
    return jax.device_get(_greedy_on_tables(_tables(tables), max_len=max_len))


def _hand_built_table():
    """Greedy takes A (0.37) then <eos> (0.6): 0.222. Better: B <eos> = 0.33 * 0.9 = 0.297 (best
    log-probability) and C C C C = 0.3 * 0.95^3 = 0.257 (best per token, L = 4, no <eos>)."""
    eps = 1e-4
    probs = np.full((V, V), eps)
    probs[BOS, [A, B_, C]] = [0.37, 0.33, 0.3]
    probs[A, [EOS, A, B_, C]] = [0.6, 0.2, 0.1, 0.1]
    probs[B_, [EOS, A, C]] = [0.9, 0.05, 0.05]
    probs[C, [C, EOS]] = [0.95, 0.05]
    probs[PAD] = probs[EOS] = 1.0
    return np.log(probs)


# --------------------------------------------------------------------------- tests


def test_hand_built_greedy_is_suboptimal_and_the_beam_finds_the_best():
    table = _hand_built_table()
    log_probs = _table_log_probs(table)
    max_len = 4
    greedy_tokens, greedy_lengths, _ = _greedy(table[None], max_len=max_len)
    np.testing.assert_array_equal(greedy_tokens, [[A, EOS, PAD, PAD]])

    # Plain log-probability: B <eos>, found with k = 2 although greedy misses it.
    best = brute_force(log_probs, max_len, 0.0)
    assert best[1] == [B_, EOS, PAD, PAD] and best[2] == 1
    tokens, lengths, scores = _run(table[None], beam_size=2, max_len=max_len, length_penalty=0.0)
    np.testing.assert_array_equal(tokens[0, 0], best[1])
    assert lengths[0, 0] == best[2]
    np.testing.assert_allclose(scores[0, 0], math.log(0.33 * 0.9), rtol=2e-3)  # up to eps
    np.testing.assert_allclose(scores[0, 0], best[0], rtol=1e-6)
    # The runner-up is greedy's sequence: finished beams stay in the set, score frozen.
    np.testing.assert_array_equal(tokens[0, 1], [A, EOS, PAD, PAD])

    # Length-normalised (alpha = 0.75): C C C C (no <eos>, L = max_len) wins; k = 3 keeps C.
    best = brute_force(log_probs, max_len, 0.75)
    assert best[1] == [C, C, C, C] and best[2] == 4
    tokens, lengths, scores = _run(table[None], beam_size=3, max_len=max_len, length_penalty=0.75)
    np.testing.assert_array_equal(tokens[0, 0], best[1])
    assert lengths[0, 0] == 4
    np.testing.assert_allclose(scores[0, 0], best[0], rtol=1e-6)
    np.testing.assert_allclose(scores[0, 1], math.log(0.33 * 0.9) / 2 ** 0.75, rtol=2e-3)
    assert np.all(np.diff(scores[0]) <= 0)


@pytest.mark.parametrize(("beam_size", "length_penalty", "seed"),
                         [(2, 0.0, 0), (3, 0.75, 1), (4, 1.0, 2), (V, 0.5, 3)])
def test_matches_python_beam_search_on_random_tables(beam_size, length_penalty, seed):
    rng = np.random.default_rng(seed)
    tables = 2.0 * rng.standard_normal((3, V, V))
    tables[:, :, EOS] += 0.5  # some beams finish early
    max_len = 5
    tokens, lengths, scores = _run(tables, beam_size=beam_size, max_len=max_len,
                                   length_penalty=length_penalty)
    chex.assert_shape([tokens, lengths, scores],
                      [(3, beam_size, max_len), (3, beam_size), (3, beam_size)])
    assert tokens.dtype == np.int32 and lengths.dtype == np.int32 and scores.dtype == np.float32
    for row in range(3):
        expected = python_beam_search(_table_log_probs(tables[row]), beam_size, max_len,
                                      length_penalty)
        np.testing.assert_array_equal(tokens[row], [e[1] for e in expected])
        np.testing.assert_array_equal(lengths[row], [e[2] for e in expected])
        np.testing.assert_allclose(scores[row], [e[0] for e in expected], rtol=1e-5)
        # No hypothesis beats the brute-force optimum over all sequences.
        optimum = brute_force(_table_log_probs(tables[row]), max_len, length_penalty)
        assert scores[row, 0] <= optimum[0] + 1e-5


def test_beam_size_one_equals_greedy_search():
    rng = np.random.default_rng(4)
    tables = 2.0 * rng.standard_normal((5, V, V))
    tables[:, :, EOS] += 1.0
    tables[0, :, :] = 0.0  # all ties: both must take the lowest id
    greedy_tokens, greedy_lengths, _ = _greedy(tables, max_len=7)
    tokens, lengths, _ = _run(tables, beam_size=1, max_len=7)
    np.testing.assert_array_equal(tokens[:, 0], greedy_tokens)
    np.testing.assert_array_equal(lengths[:, 0], greedy_lengths)
    assert len({int(n) for n in greedy_lengths}) > 1  # rows stop at different steps


def test_rows_of_a_batch_are_independent():
    rng = np.random.default_rng(5)
    tables = 2.0 * rng.standard_normal((2, V, V))
    tables[1, :, EOS] += 1.5
    together = _run(tables, beam_size=3, max_len=6)
    for row in range(2):
        alone = _run(tables[row:row + 1], beam_size=3, max_len=6)
        for joint, single in zip(together, alone):
            np.testing.assert_array_equal(joint[row], single[0])


def test_finished_beams_emit_only_pad():
    rng = np.random.default_rng(6)
    tables = 2.0 * rng.standard_normal((8, V, V))
    tables[:, :, EOS] += 1.0
    max_len = 6
    tokens, lengths, scores = _run(tables, beam_size=4, max_len=max_len, length_penalty=0.0)
    assert np.all(np.isfinite(scores))
    finished = 0
    for sequence, length in zip(tokens.reshape(-1, max_len), lengths.reshape(-1)):
        if EOS in sequence:
            finished += 1
            stop = list(sequence).index(EOS)
            assert length == stop
            assert np.all(sequence[stop + 1:] == PAD)
        else:
            assert length == max_len
    assert 0 < finished < tokens.shape[0] * tokens.shape[1]


def test_state_leaves_are_reordered_with_their_beams():
    """The state records each beam's history; logits depend on all of it (sum of the tokens)."""
    rng = np.random.default_rng(7)
    batch, max_len, M = 2, 5, 3
    tables = 1.5 * rng.standard_normal((batch, V, V))
    bumps = 1.5 * rng.standard_normal((batch, M, V))

    def step(state, tokens):
        rows, t = state["row"], state["t"]
        history = state["history"].at[jnp.arange(tokens.shape[0]), t].set(tokens)
        context = jnp.sum(history, axis=1) % M  # history starts at zeros
        logits = (jnp.asarray(tables, jnp.float32)[rows, history[jnp.arange(tokens.shape[0]), t]]
                  + jnp.asarray(bumps, jnp.float32)[rows, context])
        state = {"row": rows, "t": t + 1, "history": history}
        return logits, state, jnp.zeros((tokens.shape[0], 1))

    state = {"row": np.arange(batch, dtype=np.int32), "t": np.zeros((batch,), np.int32),
             "history": np.zeros((batch, max_len), np.int32)}
    tokens, lengths, scores = jax.jit(lambda s: beam_search(
        step, s, batch, beam_size=3, bos_id=BOS, eos_id=EOS, pad_id=PAD, max_len=max_len,
        length_penalty=0.0))(state)
    for row in range(batch):
        def log_probs(prefix, row=row):
            return _log_softmax(tables[row][prefix[-1]] + bumps[row][sum(prefix) % M])

        expected = python_beam_search(log_probs, 3, max_len, 0.0)
        np.testing.assert_array_equal(tokens[row], [e[1] for e in expected])
        np.testing.assert_allclose(scores[row], [e[0] for e in expected], rtol=1e-5)


def test_compiles_once_for_inputs_of_one_shape():
    traced = chex.assert_max_traces(beam_search, n=1)

    @jax.jit
    def run(tables):
        return traced(_table_step(tables), jnp.arange(3, dtype=jnp.int32), 3, beam_size=2,
                      bos_id=BOS, eos_id=EOS, pad_id=PAD, max_len=6)

    rng = np.random.default_rng(8)
    results = [run(_tables(rng.standard_normal((3, V, V)))) for _ in range(3)]
    assert run._cache_size() == 1
    assert any(not np.array_equal(results[0][0], other[0]) for other in results[1:])


def test_low_precision_logits_score_in_float32():
    table = jax.device_put(np.asarray(_hand_built_table(), jnp.bfloat16))

    @jax.jit
    def search(table):
        def step(rows, tokens):
            return table[tokens], rows, jnp.zeros((tokens.shape[0], 1), jnp.bfloat16)

        return beam_search(step, jnp.zeros((1,), jnp.int32), 1, beam_size=2, bos_id=BOS,
                           eos_id=EOS, pad_id=PAD, max_len=4, length_penalty=0.0)

    tokens, _, scores = search(table)
    assert scores.dtype == jnp.float32
    np.testing.assert_array_equal(tokens[0, 0], [B_, EOS, PAD, PAD])


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"beam_size": 0}, "beam_size must be an integer >= 1"),
    ({"beam_size": 2.0}, "beam_size must be an integer >= 1"),
    ({"beam_size": True}, "beam_size must be an integer >= 1"),
    ({"beam_size": V + 1}, r"beam_size must be <= the vocabulary size V = 6"),
    ({"max_len": 0}, "max_len must be an integer >= 1"),
    ({"eos_id": -1}, "eos_id must be an integer >= 0 \\(static\\), got -1"),
    ({"pad_id": 1.0}, "pad_id must be an integer >= 0 \\(static\\), got 1.0"),
    ({"length_penalty": -0.5}, "length_penalty must be a finite number >= 0"),
    ({"length_penalty": None}, "length_penalty must be a finite number >= 0"),
    ({"batch_size": 0}, "batch_size must be an integer >= 1"),
    ({"state": jnp.zeros((3,), jnp.int32)}, r"state leaf .* leading batch axis of size B = 2"),
    ({"state": {"x": jnp.zeros((), jnp.int32)}}, r"state leaf \['x'\] must have a leading"),
])
def test_bad_arguments(kwargs, message):
    arguments = {"state": jnp.zeros((2,), jnp.int32), "batch_size": 2, "beam_size": 2,
                 "bos_id": BOS, "eos_id": EOS, "pad_id": PAD, "max_len": 3, **kwargs}
    tables = jnp.zeros((2, V, V), jnp.float32)

    def step(state, tokens):
        return tables[0, tokens], state, jnp.zeros((tokens.shape[0], 1))

    with pytest.raises(ValueError, match=message):
        beam_search(step, arguments.pop("state"), arguments.pop("batch_size"), **arguments)


def test_logits_of_the_wrong_shape():
    def step(state, tokens):
        return jnp.zeros((1, V)), state, jnp.zeros((1, 1))

    with pytest.raises(ValueError, match=r"logits of shape \(B \* k, V\) = \(4, V\)"):
        beam_search(step, jnp.zeros((2,)), 2, beam_size=2, bos_id=BOS, eos_id=EOS, pad_id=PAD,
                    max_len=3)


# --------------------------------------------------------------------------- the Bahdanau model


@functools.partial(jax.jit, static_argnames=("beam_size", "max_len", "length_penalty"))
def _bahdanau_beam(params, src, src_valid_len, *, beam_size, max_len, length_penalty):
    """A Bahdanau step for beam search: the decoder state ``(L, B, h)`` is kept batch-first, and the
    encoder outputs and valid lengths travel in the state so that they follow the beams."""
    enc_outputs, hidden = bahdanau.encoder(params["encoder"], src)
    state = {"hidden": jnp.swapaxes(hidden, 0, 1), "enc_outputs": enc_outputs,
             "src_valid_len": jnp.asarray(src_valid_len, jnp.int32)}

    def step(state, tokens):
        logits, hidden, weights = bahdanau.decoder_step(
            params["decoder"], tokens, jnp.swapaxes(state["hidden"], 0, 1), state["enc_outputs"],
            state["src_valid_len"])
        return logits, {**state, "hidden": jnp.swapaxes(hidden, 0, 1)}, weights

    return beam_search(step, state, src.shape[0], beam_size=beam_size, bos_id=BOS, eos_id=EOS,
                       pad_id=PAD, max_len=max_len, length_penalty=length_penalty)


@jax.jit
def _teacher_forced_log_probs(params, src, src_valid_len, tokens):
    dec_input = bahdanau.teacher_forcing_inputs(tokens, BOS)
    logits = bahdanau.seq2seq(params, src, src_valid_len, dec_input)[0]
    return jax.nn.log_softmax(logits, axis=-1)


def _rescore(params, src, src_valid_len, tokens, lengths, max_len):
    """Teacher-forced log P of each hypothesis ``(B, k)``, ``<eos>`` included when emitted."""
    batch, k, _ = tokens.shape
    flat = np.asarray(tokens).reshape(batch * k, max_len)
    log_probs = np.asarray(_teacher_forced_log_probs(params, np.repeat(src, k, axis=0),
                                                     np.repeat(src_valid_len, k, axis=0), flat),
                           np.float64)
    picked = np.take_along_axis(log_probs, flat[..., None], axis=-1)[..., 0]
    L = np.minimum(np.asarray(lengths).reshape(-1) + 1, max_len)
    keep = np.arange(max_len)[None, :] < L[:, None]
    return np.where(keep, picked, 0.0).sum(axis=1).reshape(batch, k)


@pytest.fixture(scope="module")
def bahdanau_case():
    # Random parameters and sources whose greedy translations stop at steps 0 to 6 (never).
    params = bahdanau.init_params(jax.random.key(0), 8, 9, 4, 6, 2)
    rng = np.random.default_rng(9)
    src = rng.integers(0, 8, size=(8, 5)).astype(np.int32)
    src_valid_len = rng.integers(1, 6, size=8).astype(np.int32)
    return params, src, src_valid_len


def test_bahdanau_beam_size_one_equals_greedy_decode(bahdanau_case):
    params, src, src_valid_len = bahdanau_case
    greedy_tokens, greedy_lengths, _ = bahdanau.greedy_decode(
        params, src, src_valid_len, bos_id=BOS, eos_id=EOS, pad_id=PAD, max_len=6)
    tokens, lengths, _ = _bahdanau_beam(params, src, src_valid_len, beam_size=1, max_len=6,
                                        length_penalty=0.75)
    np.testing.assert_array_equal(tokens[:, 0], greedy_tokens)
    np.testing.assert_array_equal(lengths[:, 0], greedy_lengths)
    assert {0, 6} <= {int(n) for n in greedy_lengths}  # empty and unfinished rows included


def test_bahdanau_beam_scores_are_the_model_log_probabilities(bahdanau_case):
    params, src, src_valid_len = bahdanau_case
    max_len, k, alpha = 6, 4, 0.75
    tokens, lengths, scores = jax.device_get(_bahdanau_beam(
        params, src, src_valid_len, beam_size=k, max_len=max_len, length_penalty=alpha))
    log_p = _rescore(params, src, src_valid_len, tokens, lengths, max_len)
    L = np.minimum(lengths + 1, max_len)
    np.testing.assert_allclose(scores * L ** alpha, log_p, rtol=1e-5, atol=1e-5)
    assert np.all(np.diff(scores, axis=1) <= 0)
    # Distinct hypotheses per example.
    for row in tokens:
        assert len({tuple(beam) for beam in row}) == k


def test_bahdanau_wider_beam_is_no_worse_than_greedy_here(bahdanau_case):
    """Beam search is not monotone in k in general (the greedy prefix can be pruned), so this pins
    the behaviour on these rows rather than a theorem: log P of the best beam >= greedy's."""
    params, src, src_valid_len = bahdanau_case
    max_len = 6
    greedy_tokens, greedy_lengths, _ = bahdanau.greedy_decode(
        params, src, src_valid_len, bos_id=BOS, eos_id=EOS, pad_id=PAD, max_len=max_len)
    tokens, lengths, scores = _bahdanau_beam(params, src, src_valid_len, beam_size=4,
                                             max_len=max_len, length_penalty=0.0)
    greedy_log_p = _rescore(params, src, src_valid_len, np.asarray(greedy_tokens)[:, None],
                            np.asarray(greedy_lengths)[:, None], max_len)[:, 0]
    assert np.all(np.asarray(scores)[:, 0] >= greedy_log_p - 1e-5)
    assert np.any(np.asarray(scores)[:, 0] > greedy_log_p + 1e-3)  # the beam helps somewhere
