"""Greedy decoding under jit (jax_attention.models.decoding, bahdanau.greedy_decode) and translation.

A scripted step function pins the conventions (each row stops at its own <eos>, <pad> after it,
fixed shapes, zero weights after <eos>); the Bahdanau decoder is checked for one compilation per
shape, for attention rows that sum to 1 over the valid source positions and 0 beyond, and
:func:`translate` for empty, over-long and unknown-word sources.

The searches run under ``jax.jit`` (one program each instead of one per eager operation).
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_attention.models import bahdanau
from jax_attention.data.nmt import RESERVED_TOKENS, Vocab
from jax_attention.models.decoding import greedy_search

UNK, PAD, BOS, EOS = 0, 1, 2, 3
V, S = 9, 4


def _scripted_step(script):
    """A step whose argmax at step t in row b is ``script[b][t]``; it also checks its inputs.

    The state is the step counter; the weights are one-hot on the source position t % S.
    """
    script = jnp.asarray(script, jnp.int32)  # (B, max_len)

    def step(state, tokens):
        t = state
        logits = jax.nn.one_hot(script[:, t], V, dtype=jnp.float32)
        weights = jax.nn.one_hot(jnp.full((script.shape[0],), t % S), S, dtype=jnp.float32)
        return logits, t + 1, weights

    return step


def test_rows_stop_at_their_own_eos_and_emit_only_pad_after():
    script = [[5, 6, EOS, 7, 8, 5],     # stops at step 2
              [EOS, 5, 6, 7, 8, 5],     # empty translation
              [5, 6, 7, 8, 5, 6],       # never stops: fills max_len
              [5, 6, 7, 8, 5, EOS]]     # stops at the last step
    tokens, lengths, weights = jax.jit(
        lambda: greedy_search(_scripted_step(script), jnp.zeros((), jnp.int32), 4, bos_id=BOS,
                              eos_id=EOS, pad_id=PAD, max_len=6))()
    np.testing.assert_array_equal(tokens, [[5, 6, EOS, PAD, PAD, PAD],
                                           [EOS, PAD, PAD, PAD, PAD, PAD],
                                           [5, 6, 7, 8, 5, 6],
                                           [5, 6, 7, 8, 5, EOS]])
    np.testing.assert_array_equal(lengths, [2, 0, 6, 5])
    assert tokens.dtype == jnp.int32 and lengths.dtype == jnp.int32
    assert weights.shape == (4, 6, S)
    # Weights up to and including the <eos> step, zero after it.
    np.testing.assert_array_equal(weights.sum(axis=-1), [[1, 1, 1, 0, 0, 0],
                                                         [1, 0, 0, 0, 0, 0],
                                                         [1, 1, 1, 1, 1, 1],
                                                         [1, 1, 1, 1, 1, 1]])


def test_each_row_feeds_back_its_own_prediction():
    seen = []

    def step(state, tokens):
        seen.append(tokens)
        # Predict the input token + 1: the sequence counts up from <bos> in every row.
        return jax.nn.one_hot(tokens + 1, V, dtype=jnp.float32), state, jnp.ones((2, S)) / S

    tokens, lengths, _ = jax.jit(lambda: greedy_search(step, jnp.zeros(()), 2, bos_id=4,
                                                       eos_id=8, pad_id=PAD, max_len=6))()
    np.testing.assert_array_equal(tokens, [[5, 6, 7, 8, PAD, PAD]] * 2)
    np.testing.assert_array_equal(lengths, [3, 3])
    assert len(seen) == 1  # traced once by lax.scan, not unrolled in Python


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"max_len": 0}, "max_len must be an integer >= 1"),
    ({"max_len": 2.5}, "max_len must be an integer >= 1"),
    ({"eos_id": -1}, r"eos_id must be an integer >= 0 \(static\), got -1"),
    ({"bos_id": True}, r"bos_id must be an integer >= 0 \(static\), got True"),
])
def test_greedy_search_bad_arguments(kwargs, message):
    arguments = {"bos_id": BOS, "eos_id": EOS, "pad_id": PAD, "max_len": 3, **kwargs}
    with pytest.raises(ValueError, match=message):
        greedy_search(_scripted_step([[EOS] * 3]), jnp.zeros((), jnp.int32), 1, **arguments)


# --------------------------------------------------------------------------- the Bahdanau decoder


@pytest.fixture(scope="module")
def vocabs():
    src = Vocab([["go", "."], ["go", "."], ["i", "lost", "."], ["i", "lost", "."]], min_freq=2,
                reserved_tokens=RESERVED_TOKENS)
    tgt = Vocab([["va", "!"], ["va", "!"], ["j'ai", "perdu", "."], ["j'ai", "perdu", "."]],
                min_freq=2, reserved_tokens=RESERVED_TOKENS)
    return src, tgt


@pytest.fixture(scope="module")
def params(vocabs):
    src, tgt = vocabs
    params = bahdanau.init_params(jax.random.key(0), len(src), len(tgt), 4, 6, 2)
    # Favour <eos> so that some rows of random inputs stop early (in NumPy: nothing to compile).
    bias = np.array(params["decoder"]["dense"]["b"])
    bias[EOS] += 1.0
    params["decoder"]["dense"]["b"] = jax.device_put(bias)
    return params


def test_compiles_once_for_inputs_of_one_shape(params, monkeypatch):
    # An unusual shape, so that no earlier test has filled the cache for it.
    B_, S_, max_len = 5, 7, 9
    traced = chex.assert_max_traces(bahdanau.greedy_search, n=1)
    monkeypatch.setattr(bahdanau, "greedy_search", traced)
    # greedy_decode checks its inputs eagerly, then calls the compiled _greedy_decode.
    before = bahdanau._greedy_decode._cache_size()
    rng = np.random.default_rng(0)
    results = []
    for _ in range(3):
        src = rng.integers(0, 8, size=(B_, S_)).astype(np.int32)
        src_valid_len = rng.integers(1, S_ + 1, size=B_).astype(np.int32)
        results.append(bahdanau.greedy_decode(params, src, src_valid_len, bos_id=BOS, eos_id=EOS,
                                              pad_id=PAD, max_len=max_len))
    assert bahdanau._greedy_decode._cache_size() == before + 1
    for tokens, lengths, weights in results:
        chex.assert_shape([tokens, lengths, weights], [(B_, max_len), (B_,), (B_, max_len, S_)])
    assert any(not np.array_equal(results[0][2], other[2]) for other in results[1:])


def test_attention_rows_sum_to_one_over_valid_positions(params):
    rng = np.random.default_rng(1)
    src = rng.integers(0, 8, size=(6, S)).astype(np.int32)
    src_valid_len = np.asarray([1, 2, 3, 4, 4, 2], np.int32)
    tokens, lengths, weights = jax.device_get(bahdanau.greedy_decode(
        params, src, src_valid_len, bos_id=BOS, eos_id=EOS, pad_id=PAD, max_len=5))
    for row in range(6):
        steps = min(int(lengths[row]) + 1, 5)  # the <eos> step included
        np.testing.assert_allclose(weights[row, :steps, :src_valid_len[row]].sum(axis=-1), 1.0,
                                   rtol=1e-6)
        assert np.all(weights[row, :, src_valid_len[row]:] == 0)
        assert np.all(weights[row, steps:] == 0)
        assert np.all(tokens[row, steps:] == PAD)
        assert np.sum(tokens[row] == EOS) == (1 if lengths[row] < 5 else 0)


def test_translate_empty_long_and_unknown_sources(params, vocabs):
    src_vocab, tgt_vocab = vocabs
    num_steps = 4
    empty, long, unknown, plain = bahdanau.translate(
        params, ["", "go go go go go go .", "go zorglub .", "i lost ."], src_vocab, tgt_vocab,
        num_steps)
    assert empty.source_tokens == ["<eos>"] and not empty.truncated and not empty.unknown_words
    assert empty.weights.shape[1] == 1
    assert long.truncated and long.source_tokens == ["go"] * 4
    assert any("truncated" in note and "num_steps = 4" in note for note in long.notes)
    assert unknown.unknown_words == ["zorglub"]
    assert unknown.source_tokens == ["go", "<unk>", ".", "<eos>"]
    assert any("zorglub" in note for note in unknown.notes)
    assert not plain.truncated and not plain.unknown_words
    for result in (empty, long, unknown, plain):
        assert result.translation == " ".join(result.tokens)
        assert "<eos>" not in result.tokens
        steps = len(result.tokens) + 1 if result.finished else len(result.tokens)
        assert result.weights.shape == (steps, len(result.source_tokens))
        np.testing.assert_allclose(result.weights.sum(axis=-1), 1.0, rtol=1e-6)
        assert result.finished == (len(result.tokens) < num_steps)


def test_translate_one_sentence_max_len_and_the_model(params, vocabs):
    src_vocab, tgt_vocab = vocabs
    one = bahdanau.translate(params, "i lost .", src_vocab, tgt_vocab, 4)
    assert isinstance(one, bahdanau.Translation)
    batch = bahdanau.translate(params, ["i lost ."], src_vocab, tgt_vocab, 4)
    assert batch[0].tokens == one.tokens
    short = bahdanau.translate(params, "i lost .", src_vocab, tgt_vocab, 4, max_len=1)
    assert len(short.tokens) <= 1
    assert bahdanau.translate(params, [], src_vocab, tgt_vocab, 4) == []


def test_translate_bad_arguments(params, vocabs):
    src_vocab, tgt_vocab = vocabs
    with pytest.raises(TypeError, match="sentences must be strings"):
        bahdanau.translate(params, ["go .", 3], src_vocab, tgt_vocab, 4)
    with pytest.raises(ValueError, match="max_len must be an integer >= 1"):
        bahdanau.translate(params, "go .", src_vocab, tgt_vocab, 4, max_len=0)
    with pytest.raises(ValueError, match="must hold '<bos>'"):
        bahdanau.translate(params, "go .", src_vocab, Vocab([["a"]]), 4)
