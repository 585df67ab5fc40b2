"""What every seq2seq model of the package shares around its decoder — d2l §10.7.3, §10.7.6.

Host and JAX code that knows nothing of a model's insides:

* training: :func:`teacher_forcing_inputs` (``<bos>`` then the target shifted right) and
  :func:`masked_cross_entropy` (the book's ``MaskedSoftmaxCELoss``);
* translation: :func:`translate` encodes sentences as in training, runs a model's batched
  decoder once and turns each row into a :class:`Translation` (tokens, attention weights, notes
  on truncated sources and unknown words); a model supplies a *decoder* returning
  :class:`Decoded`;
* evaluation: :func:`evaluate_held_out` translates a held-out split in fixed-size batches and
  scores it with BLEU;
* :func:`special_id`: the id of ``<bos>``, ``<eos>`` or ``<pad>`` in a target vocabulary.

``jax_attention.models.bahdanau.translate`` and ``jax_attention.models.transformer.translate`` are thin
wrappers over :func:`translate`, each with its model's decoder.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from jax_attention._checks import (
    check_int,
    check_lengths,
    check_size,
    check_values_in,
    clip_values,
    is_integer_dtype,
)
from jax_attention.data.nmt import encode_source, preprocess
from jax_attention.models.metrics import bleu, corpus_bleu
from jax_attention.nn.precision import compute_dtype

__all__ = [
    "special_id",
    "teacher_forcing_inputs",
    "masked_cross_entropy",
    "Decoded",
    "Translation",
    "translate",
    "evaluate_held_out",
]


def special_id(vocab, token: str) -> int:
    """The id of the special ``token`` (``"<bos>"``, ``"<eos>"``, ``"<pad>"``) in ``vocab``.

    Raises:
      ValueError: ``vocab`` does not hold ``token``.
    """
    if token not in vocab:
        raise ValueError(f"the target vocabulary must hold {token!r}, got {vocab!r}")
    return vocab[token]


# --------------------------------------------------------------------------- training


def teacher_forcing_inputs(tgt, bos_id: int):
    """The decoder inputs of teacher forcing: ``<bos>`` then ``tgt[:, :-1]`` (d2l ``train_seq2seq``).

    Args:
      tgt: ``(B, T)`` integer target token ids (``T = 0`` gives ``(B, 0)``).
      bos_id: the id of ``<bos>``, an integer scalar ``>= 0`` (may be traced).

    Returns:
      ``(B, T)`` of ``tgt``'s dtype.
    """
    tgt = jnp.asarray(tgt)
    if tgt.ndim != 2 or not is_integer_dtype(tgt.dtype):
        raise ValueError(f"tgt must be integer token ids of shape (B, T), got dtype {tgt.dtype} "
                         f"with shape {tgt.shape}")
    if jnp.shape(bos_id) != () or not is_integer_dtype(jnp.result_type(bos_id)):
        raise ValueError(f"bos_id must be an integer scalar (a token id), got {bos_id!r}")
    check_values_in("bos_id", bos_id, 0, np.iinfo(np.int32).max, "[0, V)")
    if tgt.shape[1] == 0:
        return tgt
    bos = jnp.full((tgt.shape[0], 1), bos_id, dtype=tgt.dtype)
    return jnp.concatenate([bos, tgt[:, :-1]], axis=1)


def masked_cross_entropy(logits, labels, valid_len, *, num_steps: int | None = None):
    """The book's ``MaskedSoftmaxCELoss`` (d2l §10.7.3): per-sequence masked cross-entropy.

    ``loss[b] = sum_{t < valid_len[b]} -log softmax(logits[b, t])[labels[b, t]] / num_steps``:
    with ``num_steps = T`` (the default) the mean over all ``T`` steps of the cross-entropy with
    padded steps counted as zero. The book trains on ``loss.sum()`` over the batch and reports
    ``sum(loss) / sum(valid_len)``, which is the cross-entropy per target token divided by ``T``.

    A batch cut to its longest sentence (``T`` below the length the book pads to) gives the
    book's loss of the full-length batch when ``num_steps`` is that length: the padded steps
    it leaves out count as zero.

    Args:
      logits: float ``(B, T, V)``.
      labels: integer ``(B, T)`` ids in ``[0, V)``.
      valid_len: integer ``(B,)`` in ``[0, T]``.
      num_steps: the divisor, an integer ``>= max(T, 1)``; ``None``: ``T``.

    Values follow the package's rule (:mod:`jax_attention._checks`): out-of-range labels and
    lengths raise ``ValueError`` when concrete; under ``jit`` labels are clipped to
    ``[0, V - 1]`` (never NaN from an out-of-bounds gather) and lengths act as clipped to
    ``[0, T]``.

    A loss is an accumulation: half-precision logits (bfloat16 training) are taken to float32
    first, and the loss is float32 (:func:`jax_attention.nn.precision.compute_dtype`).

    Returns:
      ``(B,)``; zeros when ``T = 0`` (no step to count).
    """
    logits = jnp.asarray(logits)
    if logits.ndim != 3 or not jnp.issubdtype(logits.dtype, jnp.floating):
        raise ValueError(f"logits must be a float array of shape (B, T, V), got dtype "
                         f"{logits.dtype} with shape {logits.shape}")
    B, T, V = logits.shape
    labels = jnp.asarray(labels)
    if labels.shape != (B, T) or not is_integer_dtype(labels.dtype):
        raise ValueError(f"labels must be integer token ids of shape (B, T) = {(B, T)} for "
                         f"logits {logits.shape}, got dtype {labels.dtype} with shape {labels.shape}")
    check_values_in("labels", labels, 0, V - 1, f"[0, V) = [0, {V})")
    valid_len = check_lengths("valid_len", valid_len, B, T, "T")
    divisor = T if num_steps is None else check_int("num_steps", num_steps, max(T, 1))
    if T == 0:
        return jnp.zeros((B,), compute_dtype(logits.dtype))
    keep = jnp.arange(labels.shape[1], dtype=jnp.int32).reshape(1, -1) < valid_len.reshape(-1, 1)
    masked = token_cross_entropy(logits, labels, keep)
    return jnp.mean(masked, axis=1) if divisor == T else jnp.sum(masked, axis=1) / divisor


def token_cross_entropy(logits, labels, keep):
    """``-log softmax(logits)[labels]`` ``(B, T)`` where ``keep`` ``(B, T)`` holds, 0 elsewhere,
    in float32 for half-precision logits; checked ``logits (B, T, V)`` and ``labels (B, T)``
    (clipped to ``[0, V - 1]``, never an out-of-bounds gather). The per-token loss of
    :func:`masked_cross_entropy` and of packed rows
    (:func:`jax_attention.models.packing.packed_cross_entropy`). Not in ``__all__``."""
    labels = clip_values(labels, 0, logits.shape[-1] - 1)
    log_probs = jax.nn.log_softmax(logits.astype(compute_dtype(logits.dtype)), axis=-1)
    picked = jnp.take_along_axis(log_probs, labels[..., None], axis=-1)[..., 0]  # (B, T)
    return jnp.where(keep, -picked, jnp.zeros((), picked.dtype))


# --------------------------------------------------------------------------- translation


@dataclass(frozen=True)
class Decoded:
    """What a model's decoder gives :func:`translate`: one batch, on the host.

    Attributes:
      tokens: ``(B, max_len)`` integer ids, each row's prediction up to and including its
        ``<eos>``, then ``<pad>`` (:mod:`jax_attention.models.decoding`'s conventions).
      lengths: ``(B,)`` the number of tokens before ``<eos>`` (``max_len`` without one).
      row_weights: ``row_weights(row, steps, valid) -> {field: array}``: the attention weights
        of batch row ``row`` cut to its ``steps`` decoding steps and ``valid`` source tokens, as
        :class:`Translation` fields: ``"weights"`` ``(steps, valid)`` always, and whatever else
        the model records (the Transformer: ``"encoder_self"``, ``"decoder_self"``,
        ``"encoder_decoder"``).
      scores: ``(B,)`` each row's beam score, or ``None`` (greedy decoding).
    """

    tokens: np.ndarray
    lengths: np.ndarray
    row_weights: Callable[[int, int, int], dict]
    scores: np.ndarray | None = None


@dataclass(frozen=True, eq=False)  # eq would compare arrays elementwise
class Translation:
    """The translation of one sentence (:func:`translate`), for every model.

    Attributes:
      source: the sentence as given.
      source_tokens: what the model read: the preprocessed words (unknown ones as ``<unk>``),
        ``<eos>``, cut to ``num_steps``.
      tokens: the predicted words, without ``<eos>``.
      translation: ``" ".join(tokens)``.
      weights: ``(steps, len(source_tokens))`` NumPy attention weights, one row per decoding step
        and one column per source token read; ``steps = len(tokens) + 1`` (the ``<eos>`` step
        included) when ``finished``, else ``len(tokens)``. Bahdanau: the additive attention's
        weights; Transformer: the last block's encoder–decoder weights averaged over the heads.
      finished: whether ``<eos>`` was predicted within ``max_len`` steps.
      truncated: whether the source was longer than ``num_steps`` (with its ``<eos>``).
      unknown_words: source words not in the vocabulary (read as ``<unk>``).
      notes: human-readable remarks on the above (empty when all is well).
      encoder_self: Transformer only (else ``None``): ``(L, N, S', S')`` the encoder
        self-attention weights of every block and head, ``S'`` the source tokens read.
      decoder_self: Transformer only: ``(L, N, steps, steps)`` the decoder self-attention weights.
      encoder_decoder: Transformer only: ``(L, N, steps, S')`` the encoder–decoder weights.
      score: the beam's length-normalised log-probability (``None`` for greedy decoding).
    """

    source: str
    source_tokens: list[str]
    tokens: list[str]
    translation: str
    weights: np.ndarray
    finished: bool
    truncated: bool
    unknown_words: list[str]
    notes: list[str]
    encoder_self: np.ndarray | None = None
    decoder_self: np.ndarray | None = None
    encoder_decoder: np.ndarray | None = None
    score: float | None = None

    @property
    def output_tokens(self) -> list[str]:
        """What each decoding step predicted, one per row of ``weights``: ``tokens``, then
        ``"<eos>"`` when ``finished``."""
        return self.tokens + (["<eos>"] if self.finished else [])

    @property
    def decoder_inputs(self) -> list[str]:
        """What each decoding step read, one per row of ``weights``: ``"<bos>"``, then the
        tokens the decoder predicted before it."""
        return ["<bos>"] + self.output_tokens[:-1]


def _sentence_list(sentences) -> list[str]:
    sentences = [sentences] if isinstance(sentences, str) else list(sentences)
    for sentence in sentences:
        if not isinstance(sentence, str):
            raise TypeError(f"sentences must be strings, got {sentence!r} ({type(sentence).__name__})")
    return sentences


def _check_decoded(decoded: Decoded, batch: int, max_len: int) -> tuple[np.ndarray, np.ndarray]:
    tokens, lengths = np.asarray(decoded.tokens), np.asarray(decoded.lengths)
    if tokens.shape != (batch, max_len) or lengths.shape != (batch,):
        raise ValueError(f"the decoder must return tokens (B, max_len) = ({batch}, {max_len}) and "
                         f"lengths (B,) = ({batch},), got {tokens.shape} and {lengths.shape}")
    return tokens, lengths


def _notes(words: list[str], unknown: list[str], num_steps: int, max_len: int,
           finished: bool) -> list[str]:
    notes = []
    if len(words) + 1 > num_steps:
        notes.append(f"source truncated: {len(words)} words and <eos> exceed num_steps = "
                     f"{num_steps}; the model read only the first {num_steps} tokens"
                     + ("" if len(words) > num_steps else " (no <eos>)"))
    if unknown:
        notes.append("unknown words read as <unk>: " + ", ".join(unknown))
    if not finished:
        notes.append(f"no <eos> within max_len = {max_len} steps; the translation may be cut")
    return notes


def _row_translation(decoded: Decoded, row: int, sentence: str, src_row, valid: int, src_vocab,
                     tgt_vocab, num_steps: int, max_len: int, eos_id: int) -> Translation:
    """Row ``row`` of a decoded batch as a :class:`Translation`."""
    words = preprocess(sentence).split()
    length = int(decoded.lengths[row])
    # Finished iff <eos> was predicted within max_len: it is the token right after the
    # translation's `length` tokens (lengths count the tokens before <eos>).
    finished = length < max_len and int(decoded.tokens[row, length]) == eos_id
    steps = length + 1 if finished else length
    predicted = tgt_vocab.to_tokens([int(i) for i in decoded.tokens[row, :length]])
    unknown = [word for word in words[:num_steps] if word not in src_vocab]
    weights = {name: np.asarray(value) for name, value in
               decoded.row_weights(row, steps, valid).items()}
    return Translation(
        source=sentence,
        source_tokens=src_vocab.to_tokens([int(i) for i in src_row[:valid]]),
        tokens=predicted,
        translation=" ".join(predicted),
        finished=finished,
        truncated=len(words) + 1 > num_steps,
        unknown_words=unknown,
        notes=_notes(words, unknown, num_steps, max_len, finished),
        score=None if decoded.scores is None else float(decoded.scores[row]),
        **weights,
    )


def translate(decode: Callable, sentences: str | Sequence[str], src_vocab, tgt_vocab,
              num_steps: int, *, max_len: int | None = None):
    """Translate sentences with a model's decoder, all in one batch — d2l §10.7.6 ``predict_seq2seq``.

    Each sentence is encoded as in training (:func:`jax_attention.data.nmt.encode_source`): the
    book's preprocessing, unknown words as ``<unk>``, ``<eos>`` appended, cut or padded to
    ``num_steps``. An empty sentence is just ``<eos>``. A sentence longer than ``num_steps`` (with
    its ``<eos>``) is truncated — the model cannot read more — and its :class:`Translation` says so
    in ``truncated`` and ``notes``; unknown words are listed likewise. A translation is
    ``finished`` when ``<eos>`` was predicted within ``max_len`` steps.

    Args:
      decode: the model's decoder, ``decode(src (B, S) int32, src_valid_len (B,) int32, *,
        bos_id, eos_id, pad_id, max_len) -> Decoded``, called once for the whole batch.
      sentences: one sentence (``str``) or a sequence of them.
      src_vocab, tgt_vocab: the vocabularies of the training data.
      num_steps: ``S``, the source length the model was trained with.
      max_len: decoding steps (default ``num_steps``, as the book).

    Returns:
      A :class:`Translation` for a ``str``, else a list of them (in order).
    """
    single = isinstance(sentences, str)
    sentences = _sentence_list(sentences)
    num_steps = check_size("num_steps", num_steps)
    max_len = num_steps if max_len is None else check_size("max_len", max_len)
    if not sentences:
        return []
    bos_id, eos_id, pad_id = (special_id(tgt_vocab, t) for t in ("<bos>", "<eos>", "<pad>"))
    encoded = [encode_source(sentence, src_vocab, num_steps) for sentence in sentences]
    src = np.stack([ids for ids, _ in encoded]).astype(np.int32)
    src_valid_len = np.asarray([valid for _, valid in encoded], dtype=np.int32)
    decoded = decode(src, src_valid_len, bos_id=bos_id, eos_id=eos_id, pad_id=pad_id,
                     max_len=max_len)
    _check_decoded(decoded, len(sentences), max_len)
    results = [_row_translation(decoded, row, sentence, src[row], int(src_valid_len[row]),
                                src_vocab, tgt_vocab, num_steps, max_len, eos_id)
               for row, sentence in enumerate(sentences)]
    return results[0] if single else results


# --------------------------------------------------------------------------- evaluation


def _ids_to_sentence(ids, vocab, stop_ids) -> str:
    words = []
    for i in ids:
        if int(i) in stop_ids:
            break
        words.append(vocab.to_tokens(int(i)))
    return " ".join(words)


def _padded_batch(split, start: int, batch_size: int, pad_id: int):
    """Rows ``start:start + batch_size`` of ``split``, padded to ``batch_size`` rows when the
    split has more than one batch (one compiled shape for every batch)."""
    src = split.src[start:start + batch_size]
    src_valid_len = split.src_valid_len[start:start + batch_size]
    rows = src.shape[0]
    if rows < batch_size and len(split) > batch_size:
        src = np.concatenate([src, np.full((batch_size - rows, src.shape[1]), pad_id, src.dtype)])
        src_valid_len = np.concatenate([src_valid_len,
                                        np.ones(batch_size - rows, src_valid_len.dtype)])
    return src, src_valid_len, rows


def evaluate_held_out(decode: Callable, split, src_vocab, tgt_vocab, *, max_len: int,
                      batch_size: int = 256, num_examples_shown: int = 5) -> dict:
    """Greedy translations of held-out pairs, in batches, scored with corpus and sentence BLEU (k = 4).

    The references are the held-out targets as the model would have seen them (``num_steps``
    tokens at most, ``<eos>`` removed, words outside the training vocabulary as ``<unk>``).

    Args:
      decode: the model's batched greedy decoder with its parameters bound, ``decode(src,
        src_valid_len, *, bos_id, eos_id, pad_id, max_len) -> (tokens (B, max_len), lengths
        (B,), ...)`` (e.g. ``functools.partial(transformer.greedy_decode, params, num_heads=4)``).
      split: a :class:`jax_attention.data.nmt.TranslationArrays` (``TranslationData.val``).
      src_vocab, tgt_vocab: the vocabularies of the training data.
      max_len: decoding steps (the training ``num_steps``).
      batch_size: rows decoded at once; every batch is padded to it (one compilation).
      num_examples_shown: how many ``examples`` to return.

    Returns:
      ``{"num_pairs", "corpus_bleu", "mean_sentence_bleu", "examples": [{"source", "translation",
      "reference", "bleu"}, ...]}``.
    """
    bos_id, eos_id, pad_id = (special_id(tgt_vocab, t) for t in ("<bos>", "<eos>", "<pad>"))
    src_stop = {src_vocab["<eos>"], src_vocab["<pad>"]}
    predictions, references, sources = [], [], []
    n = len(split)
    for start in range(0, n, batch_size):
        src, src_valid_len, rows = _padded_batch(split, start, batch_size, src_vocab["<pad>"])
        tokens, lengths = jax.device_get(decode(src, src_valid_len, bos_id=bos_id, eos_id=eos_id,
                                                pad_id=pad_id, max_len=max_len)[:2])
        for row in range(rows):
            predictions.append(" ".join(tgt_vocab.to_tokens(
                [int(i) for i in tokens[row, :int(lengths[row])]])))
            references.append(_ids_to_sentence(split.tgt[start + row], tgt_vocab, {eos_id, pad_id}))
            sources.append(_ids_to_sentence(split.src[start + row], src_vocab, src_stop))
    scores = [bleu(p, r, 4) for p, r in zip(predictions, references)]
    return {
        "num_pairs": n,
        "corpus_bleu": corpus_bleu(predictions, references, 4) if n else 0.0,
        "mean_sentence_bleu": float(np.mean(scores)) if n else 0.0,
        "examples": [{"source": s_, "translation": p, "reference": r, "bleu": b}
                     for s_, p, r, b in list(zip(sources, predictions, references, scores))
                     [:num_examples_shown]],
    }
