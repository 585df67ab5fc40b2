"""The English–French data pipeline of d2l §10.5 (machine translation), in NumPy only.

The book trains its seq2seq and attention models on the Tatoeba English–French pairs
(``fra-eng/fra.txt``: one ``english<TAB>french`` pair a line). This module finds that file
(:func:`find_data`), reads it (:func:`read_fra_eng`), preprocesses (:func:`preprocess`) and
tokenises it (:func:`tokenize`) as the book does, builds the vocabularies (:class:`Vocab`) and the
padded index arrays (:func:`build_array`), and serves shuffled mini-batches
(:func:`load_data_nmt`, :class:`TranslationData`). :func:`encode_source` encodes a user sentence
for translation.

Malformed lines never stop the loader: a line that is not valid UTF-8, holds a carriage return
other than a CRLF line ending, has no tab, or has an empty English or French side is skipped and
counted (:data:`SKIP_REASONS`, :attr:`TranslationData.skipped`, :class:`MalformedLinesWarning`).

It imports neither JAX nor Flax: the arrays are NumPy ``int32``, so that the pipeline can be used
(and tested) without an accelerator, and callers move batches to devices themselves.

Shape letters: ``N`` examples, ``T`` = ``num_steps`` time steps.
"""

from __future__ import annotations

import hashlib
import io
import json
import numbers
import os
import re
import tempfile
import urllib.request
import warnings
import zipfile
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

__all__ = [
    "DATA_URL",
    "DATA_SHA1",
    "ENV_VAR",
    "MalformedLinesWarning",
    "RESERVED_TOKENS",
    "SKIP_REASONS",
    "TranslationArrays",
    "TranslationData",
    "Vocab",
    "build_array",
    "cache_dir",
    "checkout_candidates",
    "describe_skipped",
    "download_fra_eng",
    "encode_source",
    "find_data",
    "load_data_nmt",
    "preprocess",
    "read_fra_eng",
    "tokenize",
    "truncate_pad",
]

# --------------------------------------------------------------------------- locating the data

ARCHIVE_NAME = "fra-eng.zip"
#: d2l's published archive (``d2l.DATA_HUB['fra-eng']``) and the SHA-1 the book pins for it.
DATA_URL = "http://d2l-data.s3-accelerate.amazonaws.com/fra-eng.zip"
DATA_SHA1 = "94646ad1522d915e7b0f9296181140edcf86a4f5"
#: The environment variable that points at the data (a zip, a folder or ``fra.txt``).
ENV_VAR = "JAX_ATTENTION_DATA"
# Where the text lies inside an archive or a folder, most specific first: d2l's archive holds
# ``fra-eng/fra.txt``; the manythings.org original holds ``fra.txt`` at its root.
_MEMBERS = ("fra-eng/fra.txt", "fra.txt")

_HOW_TO_SUPPLY = (
    f"Supply the English–French file with '--data PATH' or {ENV_VAR}=PATH, where PATH is "
    f"{ARCHIVE_NAME} (holding fra-eng/fra.txt), a folder holding fra-eng/fra.txt or fra.txt, or "
    f"fra.txt itself; or allow the download of d2l's archive ({DATA_URL})."
)


def checkout_candidates() -> list[Path]:
    """``shared/data/fra-eng.zip`` beside the checkout, then beside the working directory.

    The first is found from this file (``<checkout>/jax_attention/data.py`` → ``<checkout>/..``),
    which holds for an editable install; the second from the working directory, which holds when
    the tests run from a fresh clone (CI) with ``shared/`` copied beside it but the package
    installed elsewhere. Duplicates are dropped.
    """
    candidates = [
        Path(__file__).resolve().parents[1].parent / "shared" / "data" / ARCHIVE_NAME,
        Path.cwd().parent / "shared" / "data" / ARCHIVE_NAME,
    ]
    unique: list[Path] = []
    for candidate in candidates:
        if candidate not in unique:
            unique.append(candidate)
    return unique


def cache_dir() -> Path:
    """The user cache of this package: ``$XDG_CACHE_HOME/jax-attention``, else ``~/.cache/...``."""
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "jax-attention"


def _member(location: Path) -> str | None:
    """The member of ``location`` holding the text, ``""`` when it is the text file itself.

    ``None`` when ``location`` is a zip or a folder without ``fra-eng/fra.txt`` or ``fra.txt``,
    or does not exist.
    """
    if location.is_dir():
        for member in _MEMBERS:
            if (location / member).is_file():
                return member
        return None
    if not location.is_file():
        return None
    if zipfile.is_zipfile(location):
        try:
            with zipfile.ZipFile(location) as archive:
                names = set(archive.namelist())
        except (OSError, zipfile.BadZipFile):
            return None
        return next((member for member in _MEMBERS if member in names), None)
    return ""  # any other file is taken to be fra.txt itself


def _check_given(location: Path, origin: str) -> Path:
    """``location`` if it holds the data, else a FileNotFoundError naming ``origin``.

    A place the user named explicitly is never skipped in favour of another: reading some other
    copy than the one asked for would be a silent surprise.
    """
    if not location.exists():
        raise FileNotFoundError(f"{origin}: {str(location)!r} does not exist. {_HOW_TO_SUPPLY}")
    if _member(location) is None:
        raise FileNotFoundError(
            f"{origin}: {str(location)!r} holds neither fra-eng/fra.txt nor fra.txt. "
            f"{_HOW_TO_SUPPLY}"
        )
    return location


def find_data(path: str | os.PathLike | None = None, *, download: bool = False) -> Path:
    """Locate the English–French data; returns a zip, a folder or the ``fra.txt`` file.

    Lookup order (the first that holds the data wins):

    1. ``path`` (the CLI's ``--data PATH``);
    2. the environment variable ``JAX_ATTENTION_DATA``;
    3. ``shared/data/fra-eng.zip`` beside the checkout (:func:`checkout_candidates`);
    4. the user cache, ``<cache_dir()>/fra-eng.zip`` (:func:`cache_dir`);
    5. only with ``download=True``: d2l's published archive, downloaded into the cache and
       checked against its SHA-1 (:func:`download_fra_eng`).

    ``path`` and the environment variable are choices of the user: when one is given but does not
    hold the data, that is an error, not a reason to look elsewhere.

    Each place may be a zip holding ``fra-eng/fra.txt`` (or ``fra.txt`` at its root), a folder
    holding ``fra-eng/fra.txt`` or ``fra.txt``, or the ``fra.txt`` file itself.

    Raises:
      FileNotFoundError: nothing found; the message lists every place looked at and says how to
        supply the file.
      ValueError: the download's SHA-1 does not match (the download is deleted).
    """
    if path is not None:
        return _check_given(Path(path).expanduser(), "argument path (--data)")
    from_env = os.environ.get(ENV_VAR)
    if from_env:
        return _check_given(Path(from_env).expanduser(), f"environment variable {ENV_VAR}")

    looked: list[str] = ["argument path / --data PATH (not given)",
                         f"environment variable {ENV_VAR} (not set)"]
    for candidate in [*checkout_candidates(), cache_dir() / ARCHIVE_NAME]:
        if _member(candidate) is not None:
            return candidate
        state = "exists but holds no fra-eng/fra.txt" if candidate.exists() else "not found"
        looked.append(f"{candidate} ({state})")

    if download:
        try:
            return download_fra_eng(DATA_URL, DATA_SHA1)  # read at call time: tests patch them
        except OSError as error:  # no network, HTTP error, unwritable cache
            looked.append(f"{DATA_URL} (download failed: {error})")
    else:
        looked.append(f"{DATA_URL} (not downloaded: download=False)")
    places = "\n".join(f"  - {place}" for place in looked)
    raise FileNotFoundError(
        f"the English–French data (fra-eng/fra.txt) was not found. Looked at:\n{places}\n"
        f"{_HOW_TO_SUPPLY}"
    )


def download_fra_eng(url: str = DATA_URL, sha1: str = DATA_SHA1, *,
                     directory: str | os.PathLike | None = None) -> Path:
    """Download ``url`` into ``directory/fra-eng.zip`` (default :func:`cache_dir`), SHA-1 checked.

    The bytes go to a temporary file in the same folder, which is renamed onto the target only
    once the checksum matches, so that an interrupted or corrupt download never sits where the
    lookup would take it for the data.

    Args:
      url: where to download from (any URL ``urllib`` opens, ``file://`` included).
      sha1: the expected SHA-1 of the downloaded bytes, hexadecimal.
      directory: where to put ``fra-eng.zip``; created if missing.

    Returns:
      The path of the downloaded archive.

    Raises:
      ValueError: the SHA-1 does not match; nothing is left behind.
      OSError: the download or the write failed (``urllib.error.URLError`` is an ``OSError``).
    """
    directory = cache_dir() if directory is None else Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / ARCHIVE_NAME
    digest = hashlib.sha1()
    handle, temporary = tempfile.mkstemp(prefix=ARCHIVE_NAME + ".", suffix=".part", dir=directory)
    try:
        with os.fdopen(handle, "wb") as out, urllib.request.urlopen(url, timeout=60) as response:
            while chunk := response.read(1 << 20):
                digest.update(chunk)
                out.write(chunk)
        if digest.hexdigest() != sha1.lower():
            raise ValueError(
                f"SHA-1 mismatch for {url}: got {digest.hexdigest()}, expected {sha1.lower()}; "
                "the download was deleted"
            )
        os.replace(temporary, target)  # atomic within one file system
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return target


# How the file is decoded. "utf-8-sig" drops the byte-order mark a Windows editor may put first
# (plain UTF-8 otherwise). "surrogateescape" turns each byte that is not valid UTF-8 into one lone
# surrogate (U+DC80..U+DCFF), which valid UTF-8 never decodes to: such lines are then found and
# skipped exactly (:func:`_line_problem`) instead of failing the whole read with a
# UnicodeDecodeError. UTF-8 never uses the byte of "\n" inside a character, so a bad byte cannot
# join two lines. newline="\n" splits at line feeds only: a lone carriage return stays inside its
# line, where it is found and skipped, instead of splitting the line in two as universal newlines
# would (which would turn "Go.<TAB>Va\r !" into a wrong pair and a stray line).
_TEXT_OPTIONS = {"encoding": "utf-8-sig", "errors": "surrogateescape", "newline": "\n"}


@contextmanager
def _open_text(location: Path) -> Iterator[io.TextIOBase]:
    """The text of ``location`` (a zip, a folder or fra.txt) as a stream (:data:`_TEXT_OPTIONS`)."""
    member = _member(location)
    if member is None:
        raise FileNotFoundError(f"{str(location)!r} holds neither fra-eng/fra.txt nor fra.txt")
    if member == "":
        with open(location, **_TEXT_OPTIONS) as stream:
            yield stream
    elif location.is_dir():
        with open(location / member, **_TEXT_OPTIONS) as stream:
            yield stream
    else:
        with zipfile.ZipFile(location) as archive, \
                io.TextIOWrapper(archive.open(member), **_TEXT_OPTIONS) as stream:
            yield stream


def _lines(stream: io.TextIOBase) -> Iterator[str]:
    """The lines of ``stream``; a CRLF ending (or a last line's final CR) reads as ``\\n``."""
    for line in stream:
        if line.endswith("\r\n"):
            line = line[:-2] + "\n"
        elif line.endswith("\r"):  # the last line of a CRLF file that lost its final LF
            line = line[:-1]
        yield line


def read_fra_eng(path: str | os.PathLike | None = None, *, download: bool = False) -> str:
    """The raw text of ``fra.txt`` (d2l's ``read_data_nmt``), located by :func:`find_data`.

    The text is read as UTF-8, never failing on the file's contents: CRLF line endings read as
    ``\\n`` (as the book's ``open(..., 'r')``), a leading byte-order mark is dropped, a carriage
    return elsewhere is kept, and each byte that is not valid UTF-8 becomes a lone surrogate
    (Python's ``surrogateescape``: ``text.encode("utf-8", "surrogateescape")`` gives the bytes
    back).
    :func:`tokenize` skips and counts the lines holding either.
    """
    return _read_first_pairs(path, None, download)


def _read_first_pairs(path, num_examples: int | None, download: bool) -> str:
    """The raw text up to and including the line of the ``num_examples``-th pair.

    Streams the file, so that the book's 600 examples do not decompress and preprocess all
    167,130 lines. A pair is a line that :func:`tokenize` keeps (:func:`_line_problem`).
    """
    with _open_text(find_data(path, download=download)) as stream:
        lines, pairs = [], 0
        for line in _lines(stream):
            lines.append(line)
            if num_examples is not None:
                pairs += _line_problem(line.removesuffix("\n")) is None
                if pairs == num_examples:
                    break
        return "".join(lines)


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
# The lone surrogates that surrogateescape decodes invalid bytes to (see _TEXT_OPTIONS).
_ESCAPED_BYTE = re.compile("[\udc80-\udcff]")


class MalformedLinesWarning(UserWarning):
    """:func:`load_data_nmt` skipped malformed lines of the corpus (counts in the message)."""


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
    """

    src_vocab: Vocab
    tgt_vocab: Vocab
    train: TranslationArrays
    val: TranslationArrays
    num_steps: int
    batch_size: int
    seed: int = 0
    skipped: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SKIP_REASONS, 0))

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
    :class:`MalformedLinesWarning` gives the counts.

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
    """
    _check_count("batch_size", batch_size, 1)
    _check_count("num_steps", num_steps, 1)
    _check_count("num_examples", num_examples, 1, allow_none=True)
    _check_count("seed", seed, 0)
    if isinstance(val_fraction, bool) or not isinstance(val_fraction, numbers.Real) \
            or not 0 <= val_fraction < 1:
        raise ValueError(f"val_fraction must be a number with 0 <= val_fraction < 1, got {val_fraction!r}")

    location = find_data(data, download=download)
    text = preprocess(_read_first_pairs(location, num_examples, download))
    source, target, skipped = tokenize(text, num_examples, return_skipped=True)
    n = len(source)
    if n == 0:
        raise ValueError(f"{str(location)!r} holds no English–French pair (a line 'english<TAB>"
                         f"french'): {describe_skipped(skipped)}")
    if any(skipped.values()):
        warnings.warn(f"{str(location)!r}: {describe_skipped(skipped)}", MalformedLinesWarning,
                      stacklevel=2)
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
                           batch_size=int(batch_size), seed=int(seed), skipped=skipped)
