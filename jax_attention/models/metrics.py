"""BLEU, the translation metric of d2l §10.7.6 (sentence level) and Papineni et al. (corpus level).

Pure Python: sentences are strings of space-separated tokens, as the translation pipeline
(:mod:`jax_attention.data.nmt`) writes them. Neither function raises on degenerate sentences (empty,
shorter than the n-gram order, odd spacing): a score is always a float in ``[0, 1]``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

from jax_attention._checks import check_int

__all__ = ["bleu", "corpus_bleu"]


def _tokens(name: str, sequence) -> list[str]:
    if not isinstance(sequence, str):
        raise TypeError(f"{name} must be a str of space-separated tokens, got "
                        f"{type(sequence).__name__}")
    # Whitespace runs, not the book's split(' '): 'a  b' or ' a b ' would otherwise hold empty
    # tokens that count as words and as matches.
    return sequence.split()


def _ngrams(tokens: list[str], n: int) -> Counter:
    return Counter(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))


def bleu(pred_seq: str, label_seq: str, k: int) -> float:
    r"""Sentence BLEU as the book defines it (d2l §10.7.6, eq. 10.7.1).

    .. math::

        \mathrm{BLEU} = \exp\Big(\min\Big(0, 1 - \frac{\mathrm{len}_{label}}
            {\mathrm{len}_{pred}}\Big)\Big) \prod_{n=1}^{k'} p_n^{1/2^n},
        \qquad k' = \min(k, \mathrm{len}_{pred}),

    where :math:`p_n` is the number of n-grams of the prediction matched in the label (each label
    n-gram matches at most once) over the number of n-grams of the prediction. A match of a long
    n-gram is harder, so it is rewarded more: for a fixed :math:`p_n < 1`, :math:`p_n^{1/2^n}`
    grows with :math:`n`. Predictions shorter than the label are penalised by the first factor.

    Differences from the book's code, all for inputs on which it raises or miscounts:

    * Tokens are split at runs of whitespace (``str.split()``), not at single spaces, so doubled,
      leading or trailing spaces do not create empty tokens.
    * Orders longer than the prediction are skipped (:math:`k' = \min(k, \mathrm{len}_{pred})`),
      as in the book's newer (1.0) edition; the 0.17 edition loops to ``k`` and divides by zero
      when the prediction has fewer than ``k`` tokens. On predictions of ``k`` tokens or more (all
      the book's examples: ``go .``, ``i lost .``, ``he's calm .``, ``i'm home .`` with ``k = 2``)
      both editions agree.
    * An empty prediction or an empty label scores 0.0.

    Args:
      pred_seq: the predicted sentence, space-separated tokens.
      label_seq: the reference sentence.
      k: the longest n-gram order, an integer >= 1.

    Returns:
      A float in ``[0, 1]``; 1.0 exactly when the two token sequences are equal.
    """
    check_int("k", k, 1)
    pred_tokens, label_tokens = _tokens("pred_seq", pred_seq), _tokens("label_seq", label_seq)
    len_pred, len_label = len(pred_tokens), len(label_tokens)
    if len_pred == 0 or len_label == 0:
        return 0.0
    score = math.exp(min(0.0, 1 - len_label / len_pred))
    for n in range(1, min(k, len_pred) + 1):
        label_subs = _ngrams(label_tokens, n)
        num_matches = 0
        for i in range(len_pred - n + 1):
            gram = tuple(pred_tokens[i:i + n])
            if label_subs[gram] > 0:
                num_matches += 1
                label_subs[gram] -= 1
        score *= math.pow(num_matches / (len_pred - n + 1), math.pow(0.5, n))
    return score


def corpus_bleu(predictions: Sequence[str], references: Sequence[str], k: int = 4) -> float:
    r"""Corpus BLEU of Papineni et al. (2002), one reference per prediction, uniform weights.

    Clipped n-gram counts are summed over the whole corpus before dividing:

    .. math::

        p_n = \frac{\sum_s \sum_{g \in \mathrm{ngrams}_n(\mathrm{pred}_s)}
                     \min(c_{\mathrm{pred}_s}(g), c_{\mathrm{ref}_s}(g))}
                    {\sum_s |\mathrm{ngrams}_n(\mathrm{pred}_s)|},
        \qquad
        \mathrm{BP} = \begin{cases} 1 & c > r \\ e^{1 - r / c} & c \le r \end{cases},
        \qquad
        \mathrm{BLEU} = \mathrm{BP} \cdot \exp\Big(\sum_{n=1}^{k} \tfrac{1}{k} \log p_n\Big),

    with :math:`c` and :math:`r` the total numbers of prediction and reference tokens. This is
    the metric of the literature (sacreBLEU's with ``tokenize='none'`` and ``smooth_method='none'``,
    up to its 0-100 scale). The book's :func:`bleu` is a per-sentence variant, with weights
    :math:`1/2^n` instead of :math:`1/k` and the orders capped at the prediction's length, so the
    two differ even on a corpus of one sentence.

    Degenerate cases give 0.0 rather than an error or NaN: an empty corpus, an empty prediction
    side (:math:`c = 0`), and any :math:`p_n = 0`, including an order that no prediction is long
    enough to have (:math:`0/0`, as NLTK without smoothing). Tokens are split at whitespace runs,
    as in :func:`bleu`.

    Args:
      predictions: the predicted sentences.
      references: one reference sentence for each prediction.
      k: the longest n-gram order (default 4, BLEU-4), an integer >= 1.

    Returns:
      A float in ``[0, 1]``.

    Raises:
      ValueError: ``k`` is not an integer >= 1, or the two lists differ in length.
    """
    check_int("k", k, 1)
    if isinstance(predictions, str) or isinstance(references, str):
        raise TypeError("predictions and references must be sequences of sentences, not a str")
    predictions, references = list(predictions), list(references)
    if len(predictions) != len(references):
        raise ValueError(f"predictions and references must have the same length, got "
                         f"{len(predictions)} predictions and {len(references)} references")
    matches, totals = [0] * k, [0] * k
    pred_length = ref_length = 0
    for s, (prediction, reference) in enumerate(zip(predictions, references)):
        pred_tokens = _tokens(f"predictions[{s}]", prediction)
        ref_tokens = _tokens(f"references[{s}]", reference)
        pred_length += len(pred_tokens)
        ref_length += len(ref_tokens)
        for n in range(1, k + 1):
            pred_grams, ref_grams = _ngrams(pred_tokens, n), _ngrams(ref_tokens, n)
            matches[n - 1] += sum(min(count, ref_grams[gram]) for gram, count in pred_grams.items())
            totals[n - 1] += max(0, len(pred_tokens) - n + 1)
    if pred_length == 0 or any(match == 0 for match in matches):
        return 0.0  # also covers totals[n] == 0, since then matches[n] == 0
    log_precision = sum(math.log(match / total) for match, total in zip(matches, totals)) / k
    brevity_penalty = 1.0 if pred_length > ref_length else math.exp(1 - ref_length / pred_length)
    return min(1.0, brevity_penalty * math.exp(log_precision))
