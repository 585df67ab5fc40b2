"""BLEU (d2l §10.7.6) and corpus BLEU (Papineni et al.): the book's examples, hand-worked values,
degenerate inputs, and properties over random sentences."""

from __future__ import annotations

import collections
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jax_attention.models.metrics import bleu, corpus_bleu
from tests.hypothesis_support import examples


def book_bleu(pred_seq, label_seq, k, *, edition="1.0"):
    """The book's code, verbatim but for the loop bound: 0.17 loops to ``k``, 1.0 to
    ``min(k, len_pred)``."""
    pred_tokens, label_tokens = pred_seq.split(' '), label_seq.split(' ')
    len_pred, len_label = len(pred_tokens), len(label_tokens)
    score = math.exp(min(0, 1 - len_label / len_pred))
    last = k if edition == "0.17" else min(k, len_pred)
    for n in range(1, last + 1):
        num_matches, label_subs = 0, collections.defaultdict(int)
        for i in range(len_label - n + 1):
            label_subs[' '.join(label_tokens[i: i + n])] += 1
        for i in range(len_pred - n + 1):
            if label_subs[' '.join(pred_tokens[i: i + n])] > 0:
                num_matches += 1
                label_subs[' '.join(pred_tokens[i: i + n])] -= 1
        score *= math.pow(num_matches / (len_pred - n + 1), math.pow(0.5, n))
    return score


# The book's translations (d2l §10.7.6, k = 2): English, prediction, French reference, its BLEU.
BOOK_EXAMPLES = [
    ("go .", "va !", "va !", 1.0),
    ("i lost .", "j'ai perdu .", "j'ai perdu .", 1.0),
    ("he's calm .", "il est riche .", "il est calme .", 0.658),
    ("i'm home .", "je suis en retard ?", "je suis chez moi .", 0.447),
]


@pytest.mark.parametrize("english, prediction, reference, printed", BOOK_EXAMPLES)
def test_the_book_examples(english, prediction, reference, printed):
    score = bleu(prediction, reference, k=2)
    assert round(score, 3) == printed
    # All are at least k tokens long, where both editions of the book agree.
    assert score == book_bleu(prediction, reference, 2, edition="0.17")
    assert score == book_bleu(prediction, reference, 2, edition="1.0")


def test_no_match_and_perfect_match():
    assert bleu("go .", "va !", 2) == 0.0
    for k in (1, 2, 3, 4):
        assert bleu("il est calme .", "il est calme .", k) == 1.0


def test_hand_worked_values():
    # "il a perdu ." vs "j'ai perdu .": 4 tokens against 3, no brevity penalty (exp(min(0, 1/4)));
    # unigrams: perdu, . match -> 2/4; bigrams: "perdu ." matches -> 1/3.
    assert bleu("il a perdu .", "j'ai perdu .", 2) == pytest.approx(
        (2 / 4) ** 0.5 * (1 / 3) ** 0.25, rel=1e-12)
    # Brevity: 2 tokens against 3 -> exp(1 - 3/2); both orders match fully.
    assert bleu("perdu .", "j'ai perdu .", 2) == pytest.approx(math.exp(-0.5), rel=1e-12)
    # Each label n-gram is matched once: "the" three times against one "the" -> 1/3.
    assert bleu("the the the", "the cat", 1) == pytest.approx((1 / 3) ** 0.5, rel=1e-12)


def test_orders_longer_than_the_prediction_are_skipped():
    # The book's 0.17 code divides by zero here; its 1.0 edition (followed) skips orders 2..4.
    with pytest.raises(ZeroDivisionError):
        book_bleu("va", "va !", 4, edition="0.17")
    assert bleu("va", "va !", 4) == pytest.approx(math.exp(1 - 2 / 1), rel=1e-12)
    assert bleu("va", "va !", 4) == book_bleu("va", "va !", 4, edition="1.0")
    assert bleu("va !", "va !", 10) == 1.0


@pytest.mark.parametrize("prediction, label", [
    ("", "va !"), ("va !", ""), ("", ""), ("   ", "va !"), ("va !", " \t "),
])
def test_empty_sentences_score_zero(prediction, label):
    for k in (1, 4):
        assert bleu(prediction, label, k) == 0.0


def test_whitespace_runs_are_one_separator():
    assert bleu("va  !", " va ! ", 2) == 1.0
    assert (bleu("il  est\triche .", "il est calme .", 2)
            == bleu("il est riche .", "il est calme .", 2))
    # The book's split(' ') would count the empty tokens: a different (and wrong) score.
    assert book_bleu("va  !", "va !", 2) != 1.0


@pytest.mark.parametrize("k", [0, -1, 1.5, True, "2", None])
def test_bad_order(k):
    with pytest.raises(ValueError, match=rf"k must be an integer >= 1, got {k!r}"):
        bleu("va !", "va !", k)
    with pytest.raises(ValueError, match="k must be an integer >= 1"):
        corpus_bleu(["va !"], ["va !"], k)


def test_sentences_must_be_strings():
    with pytest.raises(TypeError, match="pred_seq must be a str"):
        bleu(["va", "!"], "va !", 2)
    with pytest.raises(TypeError, match=r"references\[1\] must be a str"):
        corpus_bleu(["a", "b"], ["a", None])
    with pytest.raises(TypeError, match="not a str"):
        corpus_bleu("va !", "va !")


WORDS = st.sampled_from(["a", "b", "c", "d", "va", "!", "."])
SENTENCES = st.tuples(st.lists(WORDS, max_size=8), st.sampled_from([" ", "  ", "\t", " \n "]),
                      st.booleans()).map(
    lambda parts: (" " if parts[2] else "") + parts[1].join(parts[0]))


@settings(max_examples=examples(ci=100, dev=1000))
@given(prediction=SENTENCES, label=SENTENCES, k=st.integers(1, 6))
def test_bleu_properties(prediction, label, k):
    score = bleu(prediction, label, k)
    assert 0.0 <= score <= 1.0
    if prediction.split():
        assert bleu(prediction, prediction, k) == 1.0
    if prediction.split() and label.split():
        # On single-spaced sentences the result is the book's (1.0 edition) bit for bit.
        assert score == book_bleu(" ".join(prediction.split()), " ".join(label.split()), k)
    else:
        assert score == 0.0


@settings(max_examples=examples(ci=100, dev=1000))
@given(pairs=st.lists(st.tuples(SENTENCES, SENTENCES), max_size=5), k=st.integers(1, 4))
def test_corpus_bleu_properties(pairs, k):
    predictions = [prediction for prediction, _ in pairs]
    references = [reference for _, reference in pairs]
    assert 0.0 <= corpus_bleu(predictions, references, k) <= 1.0
    long_enough = [p for p in predictions if len(p.split()) >= k]
    if long_enough:
        assert corpus_bleu(long_enough, long_enough, k) == 1.0


# --------------------------------------------------------------------------- corpus BLEU


def test_corpus_bleu_hand_worked():
    # k = 2. Unigrams: a, b of "a b c" and x, y of "x y" match -> p1 = 4/5; bigrams: "a b" and
    # "x y" -> p2 = 2/3; c = r = 5 -> BP = 1. BLEU = (4/5 * 2/3)^(1/2).
    assert corpus_bleu(["a b c", "x y"], ["a b d", "x y"], k=2) == pytest.approx(
        math.sqrt(4 / 5 * 2 / 3), rel=1e-12)
    # Brevity: c = 2 < r = 4 -> BP = exp(1 - 4/2); all n-grams match.
    assert corpus_bleu(["a b"], ["a b c d"], k=2) == pytest.approx(math.exp(-1), rel=1e-12)
    # Clipping: four "the" against one -> p1 = 1/4; c = 4 > r = 2, no penalty.
    assert corpus_bleu(["the the the the"], ["the cat"], k=1) == pytest.approx(0.25, rel=1e-12)
    # Counts are pooled, not sentence scores averaged: "x" alone has no bigram, yet the corpus
    # does (p1 = 3/3, p2 = 1/1, c = r = 3).
    assert corpus_bleu(["a b", "x"], ["a b", "x"], k=2) == 1.0


def test_corpus_bleu_differs_from_the_book_sentence_bleu():
    # Uniform weights 1/k instead of 1/2^n: on "il est riche ." (p1 = 3/4, p2 = 1/3).
    corpus = corpus_bleu(["il est riche ."], ["il est calme ."], k=2)
    assert corpus == pytest.approx(math.sqrt(3 / 4 * 1 / 3), rel=1e-12)
    assert corpus != pytest.approx(bleu("il est riche .", "il est calme .", 2))


def test_corpus_bleu_perfect_and_degenerate():
    sentences = ["il est calme .", "je suis chez moi .", "va !", "j'ai perdu ."]
    assert corpus_bleu(sentences, sentences, k=2) == 1.0
    assert corpus_bleu(sentences, list(sentences), k=4) == 1.0  # "va !" alone lacks 3-grams
    assert corpus_bleu([], []) == 0.0
    assert corpus_bleu(["", " "], ["a b", "c"]) == 0.0
    assert corpus_bleu(["a b c"], ["x y z"], k=1) == 0.0
    assert corpus_bleu(["va !"], ["va !"], k=4) == 0.0  # no 3- or 4-gram anywhere: p3 = 0/0


def test_corpus_bleu_length_mismatch():
    with pytest.raises(ValueError, match="same length, got 2 predictions and 1 references"):
        corpus_bleu(["a", "b"], ["a"])
