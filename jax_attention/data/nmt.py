"""The English–French data pipeline of d2l §10.5 (machine translation), in NumPy only.

The book trains its seq2seq and attention models on the Tatoeba English–French pairs
(``fra-eng/fra.txt``: one ``english<TAB>french`` pair a line). :mod:`jax_attention.data.archive` finds
that file (:func:`find_data`), downloads d2l's archive (:func:`download_fra_eng`) and reads its raw
text (:func:`read_fra_eng`), checking the archive; its public names are re-exported here. This
module preprocesses (:func:`preprocess`) and tokenises the text (:func:`tokenize`) as the book
does, builds the vocabularies (:class:`Vocab`) and the padded index arrays (:func:`build_array`),
and serves shuffled mini-batches (:func:`load_data_nmt`, :class:`TranslationData`).
:func:`encode_source` encodes a user sentence for translation.

Malformed lines never stop the loader: a line that is not valid UTF-8, holds a carriage return
other than a CRLF line ending, has no tab, or has an empty English or French side is skipped and
counted (:data:`SKIP_REASONS`, :attr:`TranslationData.skipped`, :class:`MalformedLinesWarning`).
A damaged archive does (:class:`DamagedArchiveError`); a ``fra-eng.zip`` that is none of the known
archives (:data:`KNOWN_ARCHIVE_SHA1S`) is used with one :class:`UnknownArchiveWarning`.
:attr:`TranslationData.fingerprint` identifies the pairs a run trained on.

It imports neither JAX nor Flax: the arrays are NumPy ``int32``, so that the pipeline can be used
(and tested) without an accelerator, and callers move batches to devices themselves.

Shape letters: ``N`` examples, ``T`` = ``num_steps`` time steps.
"""

from __future__ import annotations

import hashlib
import json
import numbers
import os
import re
import warnings
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

# Locating, downloading and reading the archive, re-exported: the pipeline's users (the CLI, the
# trainers, the tests) import them from here. They read DATA_URL and DATA_SHA1 in
# jax_attention.data.archive, so that is where to patch them (and checkout_candidates).
from jax_attention.data.archive import (
    ARCHIVE_NAME,
    DATA_SHA1,
    DATA_URL,
    ENV_VAR,
    KNOWN_ARCHIVE_SHA1S,
    NO_DOWNLOAD_VAR,
    SHA1_VAR,
    URL_VAR,
    DamagedArchiveError,
    DownloadError,
    UnknownArchiveWarning,
    cache_dir,
    checkout_candidates,
    download_forbidden,
    download_fra_eng,
    ensure_data,
    find_data,
    read_fra_eng,
    read_text,
)

__all__ = [
    "ARCHIVE_NAME",
    "DATA_URL",
    "DATA_SHA1",
    "DamagedArchiveError",
    "DownloadError",
    "ENV_VAR",
    "FewerPairsWarning",
    "KNOWN_ARCHIVE_SHA1S",
    "MalformedLinesWarning",
    "NO_DOWNLOAD_VAR",
    "RESERVED_TOKENS",
    "SHA1_VAR",
    "SKIP_REASONS",
    "TranslationArrays",
    "TranslationData",
    "URL_VAR",
    "UnknownArchiveWarning",
    "Vocab",
    "build_array",
    "cache_dir",
    "checkout_candidates",
    "describe_skipped",
    "download_forbidden",
    "download_fra_eng",
    "ensure_data",
    "encode_source",
    "find_data",
    "load_data_nmt",
    "preprocess",
    "read_fra_eng",
    "tokenize",
    "truncate_pad",
]

# --------------------------------------------------------------------------- preprocessing

# A punctuation mark preceded by a character other than a space (the text's first character has
# no predecessor, so the look-behind leaves it alone, as the book's ``i > 0``).
_NO_SPACE_BEFORE = re.compile(r"(?<=[^ ])([,.!?])")


def preprocess(text: str) -> str:
    """The book's ``preprocess_nmt`` (d2l §10.5.1).

    Replaces the narrow and the ordinary no-break spaces (``\\u202f``, ``\\xa0``) by spaces, lower-
    cases, and inserts a space before each of ``, . ! ?`` whose preceding character is not a space
    (the preceding character of the text as it is before insertion, and none for the first
    character). Other spaces, such as the thin space ``\\u2009`` of a few French lines, are kept as
    the book keeps them.

    Each output character depends only on its input character and the one before, so the result
    for the first lines of a text is the first lines of the result for the whole text.

    Args:
      text: any text, typically the whole of ``fra.txt``.

    Returns:
      The preprocessed text.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    text = text.replace("\u202f", " ").replace("\xa0", " ").lower()
    # A regular expression instead of the book's per-character list: the same result, ~50x faster
    # on the 11 MB file (tests compare the two).
    return _NO_SPACE_BEFORE.sub(r" \1", text)


def _check_count(name: str, value, minimum: int, *, allow_none: bool = False) -> None:
    if allow_none and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        expected = f"an integer >= {minimum}" + (" or None" if allow_none else "")
        raise ValueError(f"{name} must be {expected}, got {value!r}")


#: Why a line is not a pair, in the order they are checked (a line is counted under the first that
#: applies): bytes that are not valid UTF-8, a carriage return that does not end the line (CRLF
#: endings are read as plain ones), no tab, an empty (or whitespace-only) first or second column.
SKIP_REASONS = ("invalid_utf8", "stray_cr", "no_tab", "empty_side")

_SKIP_DESCRIPTIONS = {
    "invalid_utf8": "not valid UTF-8",
    "stray_cr": "with a stray carriage return",
    "no_tab": "without a tab",
    "empty_side": "with an empty English or French side",
}
# The lone surrogates that surrogateescape decodes invalid bytes to (see read_fra_eng).
_ESCAPED_BYTE = re.compile("[\udc80-\udcff]")


class MalformedLinesWarning(UserWarning):
    """:func:`load_data_nmt` skipped malformed lines of the corpus (counts in the message)."""


class FewerPairsWarning(UserWarning):
    """:func:`load_data_nmt` was asked for more pairs than the file holds and uses them all.

    The message, one line: ``num_examples=<N> asked for, but '<path>' has <M> pairs; using
    <M>``. The count used is :attr:`TranslationData.num_pairs`.
    """


def _line_problem(line: str) -> str | None:
    """The :data:`SKIP_REASONS` entry of ``line`` (without its ``\\n``), ``None`` for a pair.

    The same answer before and after :func:`preprocess` (which changes no tab, carriage return,
    surrogate or whitespace-only column), so the raw reader and :func:`tokenize` agree on what a
    pair is.
    """
    if _ESCAPED_BYTE.search(line):
        return "invalid_utf8"
    if "\r" in line:
        return "stray_cr"
    parts = line.split("\t")
    if len(parts) < 2:
        return "no_tab"
    # str.split() with no argument splits at every Unicode space, the no-break ones included.
    if not parts[0].split() or not parts[1].split():
        return "empty_side"
    return None


def _is_pair(line: str) -> bool:
    """Whether ``line`` (without its ``\\n``) is a pair that :func:`tokenize` keeps."""
    return _line_problem(line) is None


def describe_skipped(skipped: dict[str, int]) -> str:
    """``skipped`` (counts keyed by :data:`SKIP_REASONS`) in words, e.g. for a warning."""
    total = sum(skipped.values())
    parts = [f"{count} {_SKIP_DESCRIPTIONS[reason]}" for reason, count in skipped.items() if count]
    return f"{total} malformed line{'s' * (total != 1)} skipped ({', '.join(parts) or 'none'})"


def tokenize(text: str, num_examples: int | None = None, *, return_skipped: bool = False):
    """Word tokens of each pair: the book's ``tokenize_nmt`` (d2l §10.5.2).

    Each line is split at tabs; a line with two columns is a pair (source, target). The file has
    exactly two columns, but later Tatoeba exports add attribution columns, so from a line with
    more than two only the first two are taken (the book would drop such lines). Tokens are the
    space-separated words; unlike the book's ``split(' ')``, empty tokens (from doubled, leading
    or trailing spaces) are dropped.

    Malformed lines are skipped and counted, never raised on (:data:`SKIP_REASONS`): lines holding
    bytes that were not valid UTF-8 (lone surrogates, see :func:`read_fra_eng`) or a carriage
    return, lines without a tab (blank lines included), and lines whose first or second column is
    empty or whitespace only (a pair with nothing to translate or nothing to learn). The empty
    string after the final newline is not a line.

    Args:
      text: preprocessed text (:func:`preprocess`).
      num_examples: keep the first ``num_examples`` pairs (``None``: all). The book's
        ``if num_examples and i > num_examples: break`` keeps ``num_examples + 1`` lines (an
        off-by-one); here the count is exact, and skipped lines do not count.
      return_skipped: also return the counts of the skipped lines.

    Returns:
      ``(source, target)``: two lists of the same length, each item a list of tokens; with
      ``return_skipped``, ``(source, target, skipped)`` where ``skipped`` maps each of
      :data:`SKIP_REASONS` to the number of lines skipped for it (among the lines read before
      the ``num_examples``-th pair).
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    _check_count("num_examples", num_examples, 1, allow_none=True)
    source, target = [], []
    skipped = dict.fromkeys(SKIP_REASONS, 0)
    lines = text.split("\n")
    if lines[-1] == "":  # after the final newline (or the whole of an empty text): not a line
        lines.pop()
    for line in lines:
        if num_examples is not None and len(source) == num_examples:
            break
        problem = _line_problem(line)
        if problem is not None:
            skipped[problem] += 1
            continue
        parts = line.split("\t")
        # Only the first two columns: newer Tatoeba exports append attribution columns, which
        # the book's `len(parts) == 2` would make it drop; this file has exactly two everywhere.
        source.append([token for token in parts[0].split(" ") if token])
        target.append([token for token in parts[1].split(" ") if token])
    if return_skipped:
        return source, target, skipped
    return source, target


# --------------------------------------------------------------------------- vocabulary

#: The reserved tokens of the translation vocabularies, after ``<unk>`` (index 0).
RESERVED_TOKENS = ("<pad>", "<bos>", "<eos>")
_UNK = "<unk>"


def _flatten(tokens) -> list[str]:
    """A flat token list from a flat list or a list of token lists."""
    flat = []
    for item in tokens:
        if isinstance(item, str):
            flat.append(item)
        elif isinstance(item, (list, tuple)):
            for token in item:
                if not isinstance(token, str):
                    raise TypeError(f"tokens must be strings, got {token!r} "
                                    f"({type(token).__name__})")
                flat.append(token)
        else:
            raise TypeError(
                f"tokens must be a list of strings or of lists of strings, got an item {item!r} "
                f"({type(item).__name__})"
            )
    return flat


class Vocab:
    """Token ↔ index map: the book's ``Vocab`` (d2l §8.2, 0.17 edition).

    Index 0 is ``<unk>``, then ``reserved_tokens`` in order, then every other token whose count is
    at least ``min_freq``, most frequent first; equal counts keep the order of first appearance
    (the book's stable sort of a ``Counter``), so the vocabulary is deterministic.

    ``vocab[token]`` and ``vocab[list_of_tokens]`` give indices (unknown tokens give ``vocab.unk``);
    ``vocab.to_tokens(index_or_indices)`` goes back.

    Args:
      tokens: a flat list of tokens or a list of token lists (one per sentence); ``None`` = empty.
      min_freq: tokens seen fewer times are left out (they map to ``<unk>``).
      reserved_tokens: tokens that always get the indices after ``<unk>``, whatever their counts.
    """

    def __init__(self, tokens: Sequence | None = None, min_freq: int = 0,
                 reserved_tokens: Iterable[str] = ()):
        _check_count("min_freq", min_freq, 0)
        reserved = list(reserved_tokens)
        for token in reserved:
            if not isinstance(token, str):
                raise TypeError(f"reserved_tokens must be strings, got {token!r}")
        if _UNK in reserved or len(set(reserved)) != len(reserved):
            raise ValueError(
                f"reserved_tokens must be distinct and must not contain {_UNK!r} (always index 0), "
                f"got {reserved!r}"
            )
        counter = Counter(_flatten(tokens if tokens is not None else []))
        # sorted() is stable and a Counter iterates in first-appearance order: ties keep that order.
        self.token_freqs: list[tuple[str, int]] = sorted(counter.items(), key=lambda item: item[1],
                                                         reverse=True)
        self.min_freq = int(min_freq)
        self.reserved_tokens: tuple[str, ...] = tuple(reserved)
        self.idx_to_token: list[str] = [_UNK, *reserved]
        self.token_to_idx: dict[str, int] = {token: i for i, token in enumerate(self.idx_to_token)}
        for token, freq in self.token_freqs:
            if freq < min_freq:
                break
            if token not in self.token_to_idx:
                self.token_to_idx[token] = len(self.idx_to_token)
                self.idx_to_token.append(token)

    def __len__(self) -> int:
        return len(self.idx_to_token)

    @property
    def unk(self) -> int:
        """The index of ``<unk>``: 0."""
        return 0

    def __getitem__(self, tokens):
        """The index of a token, or the list of indices of a list (or tuple) of tokens."""
        if isinstance(tokens, (list, tuple)):
            return [self.__getitem__(token) for token in tokens]
        return self.token_to_idx.get(tokens, self.unk)

    def __contains__(self, token) -> bool:
        return token in self.token_to_idx

    def to_tokens(self, indices):
        """The token of an index, or the list of tokens of a sequence (list, tuple, array) of them.

        Raises:
          ValueError: an index outside ``[0, len(vocab))`` (negative indices are not wrapped).
        """
        if isinstance(indices, np.ndarray):
            if indices.ndim > 0:
                return [self.to_tokens(index) for index in indices]
            indices = indices.item()
        if isinstance(indices, (list, tuple)):
            return [self.to_tokens(index) for index in indices]
        if isinstance(indices, bool) or not isinstance(indices, numbers.Integral):
            raise TypeError(f"indices must be integers, got {indices!r} ({type(indices).__name__})")
        if not 0 <= indices < len(self.idx_to_token):
            raise ValueError(
                f"index {int(indices)} is outside the vocabulary, expected 0 <= index < "
                f"{len(self.idx_to_token)}"
            )
        return self.idx_to_token[int(indices)]

    def __eq__(self, other) -> bool:
        if not isinstance(other, Vocab):
            return NotImplemented
        return (self.idx_to_token == other.idx_to_token and self.token_freqs == other.token_freqs
                and self.min_freq == other.min_freq
                and self.reserved_tokens == other.reserved_tokens)

    __hash__ = None  # mutable lists inside

    def __repr__(self) -> str:
        return (f"Vocab(size={len(self)}, min_freq={self.min_freq}, "
                f"reserved_tokens={list(self.reserved_tokens)})")

    def to_json(self) -> str:
        """The vocabulary as JSON text (for checkpoints); :meth:`from_json` reads it back equal."""
        return json.dumps({
            "format": "jax-attention.Vocab/1",
            "idx_to_token": self.idx_to_token,
            "token_freqs": [[token, freq] for token, freq in self.token_freqs],
            "min_freq": self.min_freq,
            "reserved_tokens": list(self.reserved_tokens),
        }, ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str | bytes | dict) -> Vocab:
        """The vocabulary written by :meth:`to_json` (its text, or that text already parsed)."""
        record = json.loads(text) if isinstance(text, (str, bytes)) else text
        if not isinstance(record, dict) or record.get("format") != "jax-attention.Vocab/1":
            raise ValueError("text is not a vocabulary written by Vocab.to_json "
                             "(format 'jax-attention.Vocab/1' expected)")
        vocab = cls.__new__(cls)
        vocab.idx_to_token = list(record["idx_to_token"])
        vocab.token_to_idx = {token: i for i, token in enumerate(vocab.idx_to_token)}
        vocab.token_freqs = [(token, int(freq)) for token, freq in record["token_freqs"]]
        vocab.min_freq = int(record["min_freq"])
        vocab.reserved_tokens = tuple(record["reserved_tokens"])
        if vocab.idx_to_token[:1] != [_UNK] or len(vocab.token_to_idx) != len(vocab.idx_to_token):
            raise ValueError(f"text holds no valid vocabulary: index 0 must be {_UNK!r} and tokens "
                             "must be distinct")
        return vocab


# --------------------------------------------------------------------------- arrays


def truncate_pad(line: Sequence, num_steps: int, padding_token) -> list:
    """``line`` cut to ``num_steps`` items or padded to it with ``padding_token`` (d2l §10.5.4)."""
    _check_count("num_steps", num_steps, 1)
    line = list(line)
    if len(line) > num_steps:
        return line[:num_steps]
    return line + [padding_token] * (num_steps - len(line))


def _special(vocab: Vocab, token: str) -> int:
    if token not in vocab:
        raise ValueError(f"vocab must hold {token!r} (build it with reserved_tokens="
                         f"{list(RESERVED_TOKENS)!r}), got {vocab!r}")
    return vocab[token]


def build_array(lines: Sequence[Sequence[str]], vocab: Vocab, num_steps: int
                ) -> tuple[np.ndarray, np.ndarray]:
    """Index arrays of token lines: the book's ``build_array_nmt`` (d2l §10.5.4).

    Each line is mapped to indices, ``<eos>`` is appended, and the result is truncated or padded
    with ``<pad>`` to ``num_steps`` (a line of ``num_steps`` words or more loses its ``<eos>``, as
    in the book). The valid length counts the entries that are not ``<pad>``.

    Args:
      lines: ``N`` token lists.
      vocab: a vocabulary holding ``<pad>`` and ``<eos>``.
      num_steps: ``T``, the length of every row.

    Returns:
      ``(array, valid_len)``: ``int32 (N, T)`` and ``int32 (N,)``.
    """
    _check_count("num_steps", num_steps, 1)
    pad, eos = _special(vocab, "<pad>"), _special(vocab, "<eos>")
    rows = [truncate_pad(vocab[list(line)] + [eos], num_steps, pad) for line in lines]
    array = np.asarray(rows, dtype=np.int32).reshape(len(rows), num_steps)
    valid_len = (array != pad).sum(axis=1, dtype=np.int32)
    return array, valid_len


def encode_source(sentence: str, src_vocab: Vocab, num_steps: int) -> tuple[np.ndarray, int]:
    """A user's source sentence as the model's input: the book's ``predict_seq2seq`` encoding.

    The sentence gets the training preprocessing (:func:`preprocess`), is split into words at any
    whitespace (a typed sentence may hold tabs or newlines), unknown words become ``<unk>``,
    ``<eos>`` is appended, and the row is truncated or padded to ``num_steps``. An empty sentence
    gives just ``<eos>``. The book takes the valid length before truncation (so it can exceed
    ``num_steps``); here it counts the entries kept, as :func:`build_array` does.

    Args:
      sentence: the source-language sentence.
      src_vocab: the source vocabulary of the training data.
      num_steps: ``T``.

    Returns:
      ``(ids, valid_len)``: ``int32 (T,)`` and an ``int`` in ``[1, T]``.
    """
    if not isinstance(sentence, str):
        raise TypeError(f"sentence must be a str, got {type(sentence).__name__}")
    array, valid_len = build_array([preprocess(sentence).split()], src_vocab, num_steps)
    return array[0], int(valid_len[0])


# --------------------------------------------------------------------------- the data set


@dataclass(frozen=True, eq=False)  # eq would compare arrays elementwise
class TranslationArrays:
    """One split of the translation data: NumPy ``int32`` arrays.

    Attributes:
      src: ``(N, T)`` source indices. src_valid_len: ``(N,)`` its non-pad lengths.
      tgt: ``(N, T)`` target indices. tgt_valid_len: ``(N,)`` its non-pad lengths.
    """

    src: np.ndarray
    src_valid_len: np.ndarray
    tgt: np.ndarray
    tgt_valid_len: np.ndarray

    def __len__(self) -> int:
        return int(self.src.shape[0])


@dataclass(frozen=True, eq=False)
class TranslationData:
    """The output of :func:`load_data_nmt`: vocabularies, the training and validation splits.

    Attributes:
      src_vocab, tgt_vocab: the vocabularies (built from the training pairs only).
      train, val: the splits; ``val`` is empty (``N = 0``) when ``val_fraction = 0``.
      num_steps: ``T``. batch_size: the size of the batches of :meth:`batches`.
      seed: seeds the shuffling of :meth:`batches`.
      skipped: the malformed lines skipped while reading, counted by reason (every key of
        :data:`SKIP_REASONS`, zeros included); all zero for the book's file.
      pairs_sha256: the SHA-256 of the pairs used (both splits, in order), see
        :attr:`fingerprint`; ``""`` when not computed (a :class:`TranslationData` built by hand).
    """

    src_vocab: Vocab
    tgt_vocab: Vocab
    train: TranslationArrays
    val: TranslationArrays
    num_steps: int
    batch_size: int
    seed: int = 0
    skipped: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SKIP_REASONS, 0))
    pairs_sha256: str = ""

    @property
    def num_pairs(self) -> int:
        """The pairs used, both splits: ``num_examples``, or fewer when the file holds fewer."""
        return len(self.train) + len(self.val)

    @property
    def fingerprint(self) -> dict:
        """What identifies the data trained on, as a small JSON-ready dict (a new one each time).

        ``{"format", "num_pairs", "num_val", "sha256", "src_vocab_size", "tgt_vocab_size"}``:
        ``sha256`` is the SHA-256 (hex) of the pairs used, in order, after preprocessing and
        tokenising: of the UTF-8 of ``"\\n".join(" ".join(src) + "\\t" + " ".join(tgt))``
        over the ``(src, tgt)`` token lists of :func:`tokenize` (tokens never hold a space, tab or
        newline, so this text gives the pairs back). Other data, another ``num_examples`` or
        another split gives another fingerprint; the same data gives the same one in any process
        and on any machine. It does not depend on ``num_steps``, ``batch_size`` or ``seed``.
        """
        return {
            "format": "jax-attention.data-fingerprint/1",
            "num_pairs": self.num_pairs,
            "num_val": len(self.val),
            "sha256": self.pairs_sha256,
            "src_vocab_size": len(self.src_vocab),
            "tgt_vocab_size": len(self.tgt_vocab),
        }

    @property
    def num_batches(self) -> int:
        """Batches per epoch: ``ceil(len(train) / batch_size)`` (the last one may be smaller)."""
        return -(-len(self.train) // self.batch_size)

    def batches(self, epoch: int = 0
                ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
        """The training split in shuffled mini-batches, every example once.

        The order is a permutation drawn by ``np.random.default_rng((seed, epoch))``: the same
        ``(seed, epoch)`` gives the same batches on every machine, and each epoch a new order. As
        the book's ``DataLoader(shuffle=True)``, the last batch is kept even when it is smaller
        than ``batch_size`` (``len(train) % batch_size`` examples).

        Yields:
          ``(src (B, T), src_valid_len (B,), tgt (B, T), tgt_valid_len (B,))``, ``int32``.
        """
        _check_count("epoch", epoch, 0)
        order = np.random.default_rng((self.seed, int(epoch))).permutation(len(self.train))
        for start in range(0, len(order), self.batch_size):
            index = order[start:start + self.batch_size]
            yield (self.train.src[index], self.train.src_valid_len[index],
                   self.train.tgt[index], self.train.tgt_valid_len[index])


def load_data_nmt(batch_size: int, num_steps: int, num_examples: int | None = 600, *,
                  data: str | os.PathLike | None = None, seed: int = 0, val_fraction: float = 0.0,
                  download: bool = False) -> TranslationData:
    """The book's ``load_data_nmt`` (d2l §10.5.5), with an optional held-out split.

    Reads the file (:func:`find_data`), preprocesses and tokenises the first ``num_examples``
    pairs, holds out the last ``val_fraction`` of them, builds the source and target vocabularies
    from the training pairs (``min_freq=2``, reserved ``<pad> <bos> <eos>`` after ``<unk>``; words
    only in the held-out pairs are therefore ``<unk>`` there), and the index arrays of both splits
    (:func:`build_array`). Only the lines needed are read and preprocessed; the result is the same
    as preprocessing the whole file.

    Malformed lines (:data:`SKIP_REASONS`) are skipped, do not count towards ``num_examples``, and
    are counted in :attr:`TranslationData.skipped`; when there are any, one
    :class:`MalformedLinesWarning` gives the counts. When the file holds fewer pairs than
    ``num_examples``, all are used and one :class:`FewerPairsWarning` says so
    (:attr:`TranslationData.num_pairs`). An archive is read with its CRC-32 checked
    (:class:`DamagedArchiveError`); a ``fra-eng.zip`` of unknown SHA-1 gives one
    :class:`UnknownArchiveWarning` per process.

    Args:
      batch_size: examples per batch (>= 1).
      num_steps: ``T``, the padded length (>= 1).
      num_examples: the number of pairs to use (>= 1; ``None``: all 167,130).
      data: where the data is (``--data``); ``None`` looks in the usual places.
      seed: seeds the shuffling of :meth:`TranslationData.batches` (>= 0).
      val_fraction: the fraction of the pairs held out for validation, ``0 <= val_fraction < 1``;
        the held-out count is ``round(n * val_fraction)``, at least 1 when ``val_fraction > 0``.
      download: allow the download of d2l's archive when no local copy is found.

    Returns:
      A :class:`TranslationData`.

    Raises:
      ValueError: a bad argument, or a file without a single pair (the message gives the counts
        of the lines skipped).
      DamagedArchiveError: a damaged or truncated archive (a ValueError).
    """
    _check_count("batch_size", batch_size, 1)
    _check_count("num_steps", num_steps, 1)
    _check_count("num_examples", num_examples, 1, allow_none=True)
    _check_count("seed", seed, 0)
    if isinstance(val_fraction, bool) or not isinstance(val_fraction, numbers.Real) \
            or not 0 <= val_fraction < 1:
        raise ValueError(f"val_fraction must be a number with 0 <= val_fraction < 1, got {val_fraction!r}")

    location = find_data(data, download=download)
    # Only the lines needed, up to the num_examples-th pair as tokenize counts them.
    text = preprocess(read_text(location, num_examples, is_pair=_is_pair, stacklevel=3))
    source, target, skipped = tokenize(text, num_examples, return_skipped=True)
    n = len(source)
    if n == 0:
        raise ValueError(f"{str(location)!r} holds no English–French pair (a line 'english<TAB>"
                         f"french'): {describe_skipped(skipped)}")
    if any(skipped.values()):
        warnings.warn(f"{str(location)!r}: {describe_skipped(skipped)}", MalformedLinesWarning,
                      stacklevel=2)
    if num_examples is not None and n < num_examples:
        warnings.warn(f"num_examples={num_examples} asked for, but {str(location)!r} has {n} "
                      f"pair{'s' * (n != 1)}; using {n}", FewerPairsWarning, stacklevel=2)
    n_val = max(1, round(n * val_fraction)) if val_fraction > 0 else 0
    if n - n_val < 1:
        raise ValueError(f"val_fraction={val_fraction!r} leaves no training pair out of {n}")
    n_train = n - n_val

    src_vocab = Vocab(source[:n_train], min_freq=2, reserved_tokens=RESERVED_TOKENS)
    tgt_vocab = Vocab(target[:n_train], min_freq=2, reserved_tokens=RESERVED_TOKENS)

    def arrays(start: int, stop: int) -> TranslationArrays:
        src, src_valid_len = build_array(source[start:stop], src_vocab, num_steps)
        tgt, tgt_valid_len = build_array(target[start:stop], tgt_vocab, num_steps)
        return TranslationArrays(src, src_valid_len, tgt, tgt_valid_len)

    return TranslationData(src_vocab=src_vocab, tgt_vocab=tgt_vocab, train=arrays(0, n_train),
                           val=arrays(n_train, n), num_steps=int(num_steps),
                           batch_size=int(batch_size), seed=int(seed), skipped=skipped,
                           pairs_sha256=_pairs_sha256(text, source, target, skipped))


def _pairs_sha256(text: str, source: list, target: list, skipped: dict[str, int]) -> str:
    """:attr:`TranslationData.fingerprint`'s SHA-256 of the pairs ``source``, ``target``.

    ``text`` is the preprocessed text they were tokenised from (:func:`tokenize`). In general the
    text to hash is built pair by pair. When every line of ``text`` is a pair of two columns, as
    in the book's file, it is ``text`` itself but for the spaces that tokenising drops (doubled,
    or at the start or end of a column): those few lines are rebuilt and the rest is hashed as it
    is, several times faster than building the whole text anew (tests compare the two ways and
    check that the book's file takes this path). UTF-8 never uses the bytes of a space, tab or
    newline inside a character, so the search is done on the encoded bytes, with NumPy.
    """
    n = len(source)
    body = text.removesuffix("\n").encode("utf-8", "surrogatepass")
    byte = np.frombuffer(body, dtype=np.uint8)
    tab, newline = byte == ord("\t"), byte == ord("\n")
    newlines = np.flatnonzero(newline)
    if any(skipped.values()) or len(newlines) + 1 != n or np.count_nonzero(tab) != n:
        canonical = "\n".join(" ".join(src) + "\t" + " ".join(tgt)
                              for src, tgt in zip(source, target))
        return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()
    space = byte == ord(" ")
    column_end = tab | newline
    # Byte pairs (i, i + 1) holding a space that tokenising drops: a space before a space or a
    # column end, a space after a column end; plus a space first or last. Their lines by the
    # position i + 1 (the line of the dropped space in all three cases).
    dropped = np.flatnonzero(space[:-1] & (space[1:] | column_end[1:])
                             | column_end[:-1] & space[1:])
    lines = set(np.searchsorted(newlines, dropped + 1).tolist())
    if body.startswith(b" "):
        lines.add(0)
    if body.endswith(b" "):
        lines.add(len(newlines))
    digest, view, done = hashlib.sha256(), memoryview(body), 0
    for line in sorted(lines):
        start = int(newlines[line - 1]) + 1 if line > 0 else 0
        end = int(newlines[line]) if line < len(newlines) else len(body)
        digest.update(view[done:start])
        digest.update(b"\t".join(b" ".join(token for token in column.split(b" ") if token)
                                 for column in body[start:end].split(b"\t")))
        done = end
    digest.update(view[done:])
    return digest.hexdigest()
