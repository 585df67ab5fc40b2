"""Locating, downloading, opening and checking the English–French archive of d2l §10.5.

The book's translation data is the Tatoeba English–French file ``fra-eng/fra.txt``, in d2l's
``fra-eng.zip``. This module finds it (:func:`find_data`: ``--data``, ``$JAX_ATTENTION_DATA``,
``shared/data`` beside the checkout, the user cache), downloads d2l's archive when allowed
(:func:`download_fra_eng`: pooch's :func:`pooch.retrieve`, SHA-1 checked, written atomically,
with this package's progress line and one-line errors; :func:`ensure_data` is what the commands
call: the download unless ``--no-download`` or ``$JAX_ATTENTION_NO_DOWNLOAD`` forbids it), and
reads its raw text (:func:`read_fra_eng`,
:func:`read_text`) from a zip, a folder or the text file itself, never failing on the file's
contents (invalid UTF-8 and stray carriage returns are kept for the tokeniser to skip).

A damaged archive stops the read: a file meant to be a zip that cannot be read as one, or whose
member fails its CRC-32, raises :class:`DamagedArchiveError` instead of being read as text or
silently giving corrupted sentences; a ``fra-eng.zip`` that is none of the known archives
(:data:`KNOWN_ARCHIVE_SHA1S`) is used with one :class:`UnknownArchiveWarning`.

Preprocessing, tokenising, vocabularies and batches are :mod:`jax_attention.data.nmt`'s, which
re-exports every public name of this module but :func:`read_text`. Like it, this module imports
neither JAX nor Flax.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import io
import logging
import numbers
import os
import re
import shutil
import struct
import sys
import time
import urllib.parse
import urllib.request
import warnings
import zipfile
import zlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

__all__ = [
    "ARCHIVE_NAME",
    "DATA_SHA1",
    "DATA_URL",
    "DamagedArchiveError",
    "DownloadError",
    "ENV_VAR",
    "KNOWN_ARCHIVE_SHA1S",
    "NO_DOWNLOAD_VAR",
    "SHA1_VAR",
    "URL_VAR",
    "UnknownArchiveWarning",
    "cache_dir",
    "checkout_candidates",
    "download_forbidden",
    "download_fra_eng",
    "ensure_data",
    "find_data",
    "read_fra_eng",
    "read_text",
]

# --------------------------------------------------------------------------- locating the data

#: The file name of the archive (d2l's, in the user cache and beside the checkout).
ARCHIVE_NAME = "fra-eng.zip"
#: d2l's published archive (``d2l.DATA_HUB['fra-eng']``), where the archive is downloaded from.
DATA_URL = "http://d2l-data.s3-accelerate.amazonaws.com/fra-eng.zip"
#: The SHA-1 (hex) the book pins for :data:`DATA_URL`'s archive: a download is kept only if it
#: matches (unless :data:`SHA1_VAR` names another), and it is one of :data:`KNOWN_ARCHIVE_SHA1S`.
DATA_SHA1 = "94646ad1522d915e7b0f9296181140edcf86a4f5"
#: The SHA-1s of the ``fra-eng.zip`` archives known to hold the book's data; reading any other
#: ``fra-eng.zip`` gives one :class:`UnknownArchiveWarning` (it is still used if its CRCs pass).
#:
#: The copy in ``shared/data`` (c71a455b...) is not d2l's file byte for byte: it holds only
#: ``fra-eng/_about.txt`` and ``fra-eng/fra.txt`` (no folder entry, no ``__MACOSX`` metadata, no
#: extra fields, no comment), written by Info-ZIP 3.0 on Unix at maximum compression, members
#: dated 2019-04-08 01:35, i.e. an archive rebuilt from the extracted files (shared/data/README.md:
#: "repacked without macOS metadata"). Its data is the book's: ``fra.txt`` is the manythings.org
#: export of 2019-04-07 (``_about.txt``), 11,669,748 bytes, CRC-32 c7f777df, SHA-1 c43f99dc...,
#: 167,130 lines, and it reproduces what the book prints from its file: the first lines, 184
#: and 201 words in the vocabularies of the first 600 pairs (tests/test_data.py), and, with the
#: book's own preprocess_nmt, tokenize_nmt and Vocab(min_freq=2), 10,012 source words for the
#: whole file (the book's len(src_vocab)). d2l's archive itself could not be fetched to compare
#: the bytes of fra.txt (no network where this was checked), so the pin records this copy as it
#: is: any change to it (another repack, another edition of the Tatoeba export) is "unknown"
#: again and warned about.
KNOWN_ARCHIVE_SHA1S = {
    DATA_SHA1: "d2l's published fra-eng.zip (d2l.DATA_HUB['fra-eng'])",
    "c71a455baa82c44d779bffd1c4041b024fef0057": (
        "shared/data/fra-eng.zip: d2l's fra-eng/fra.txt (SHA-1 "
        "c43f99dce27311d3afd4d3e0716848194cfcc103) repacked without macOS metadata"),
}
#: The environment variable that points at the data (a zip, a folder or ``fra.txt``).
ENV_VAR = "JAX_ATTENTION_DATA"
#: Set to anything but ``""``/``0``/``false``/``no``, it forbids every download of the archive
#: (the tests set it: they never touch the internet); the commands' ``--no-download`` does the same.
NO_DOWNLOAD_VAR = "JAX_ATTENTION_NO_DOWNLOAD"
#: For testing mirrors only: the URL and the SHA-1 to download instead of :data:`DATA_URL` and
#: :data:`DATA_SHA1` (both read at the time of the download).
URL_VAR = "JAX_ATTENTION_DATA_URL"
#: For testing mirrors only: the environment variable holding the SHA-1 (hex) a download must
#: match instead of :data:`DATA_SHA1` (read at the time of the download; goes with :data:`URL_VAR`).
SHA1_VAR = "JAX_ATTENTION_DATA_SHA1"
#: Seconds to wait for the server to answer (and for each read) before giving up.
DOWNLOAD_TIMEOUT = 30
# Where the text lies inside an archive or a folder, most specific first: d2l's archive holds
# ``fra-eng/fra.txt``; the manythings.org original holds ``fra.txt`` at its root.
_MEMBERS = ("fra-eng/fra.txt", "fra.txt")

_HOW_TO_SUPPLY = (
    f"Supply the English–French file with '--data PATH' or {ENV_VAR}=PATH, where PATH is "
    f"{ARCHIVE_NAME} (holding fra-eng/fra.txt), a folder holding fra-eng/fra.txt or fra.txt, or "
    f"fra.txt itself; or allow the download of d2l's archive ({DATA_URL})."
)
# The same, when the download failed or is forbidden: only the ways by hand.
_HOW_TO_SUPPLY_BY_HAND = (
    f"Supply the file with '--data PATH' or {ENV_VAR}=PATH, where PATH is {ARCHIVE_NAME} "
    f"(d2l's, {DATA_URL}, fetched some other way; or a folder holding fra-eng/fra.txt, or "
    f"fra.txt itself)."
)


def _data_url() -> str:
    # DATA_URL read at call time: tests patch it (or set URL_VAR for a subprocess).
    return os.environ.get(URL_VAR) or DATA_URL


def _data_sha1() -> str:
    return (os.environ.get(SHA1_VAR) or DATA_SHA1).lower()


def download_forbidden() -> bool:
    """Whether ``$JAX_ATTENTION_NO_DOWNLOAD`` forbids the download (set, and not ``""``, ``0``,
    ``false`` or ``no``)."""
    value = os.environ.get(NO_DOWNLOAD_VAR, "").strip().lower()
    return value not in ("", "0", "false", "no")


class DownloadError(OSError):
    """The archive could not be downloaded: the server is unreachable or answered with an error,
    or the transfer ended before the ``Content-Length`` it announced. Nothing is left behind.

    The message, one line: ``cannot download <url>: <reason>`` or ``truncated download of <url>:
    received <n> of the <m> bytes of its Content-Length``. Attributes: ``url``, ``reason``.
    """

    def __init__(self, url: str, message: str, reason: str = ""):
        self.url = url
        self.reason = reason
        super().__init__(" ".join(message.split()))

    def __reduce__(self):
        return type(self), (self.url, str(self), self.reason)


def checkout_candidates() -> list[Path]:
    """``shared/data/fra-eng.zip`` beside the checkout, then beside the working directory.

    The first is found from this file (``<checkout>/jax_attention/data/archive.py`` →
    ``<checkout>/..``),
    which holds for an editable install; the second from the working directory, which holds when
    the tests run from a fresh clone (CI) with ``shared/`` copied beside it but the package
    installed elsewhere. Duplicates are dropped.
    """
    candidates = [
        Path(__file__).resolve().parents[3] / "shared" / "data" / ARCHIVE_NAME,
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


class DamagedArchiveError(ValueError):
    """A file meant to be a zip cannot be read as one, or a member fails its CRC-32.

    The message, one line: ``damaged or truncated archive '<path>' (<reason>); replace it ...``,
    where the reason is the error of :mod:`zipfile` or :mod:`zlib`, e.g. ``BadZipFile: Bad CRC-32
    for file 'fra-eng/fra.txt'``. Attributes: ``path`` (a :class:`~pathlib.Path`), ``reason``.
    """

    def __init__(self, path: str | os.PathLike, reason: str):
        self.path = Path(path)
        self.reason = " ".join(str(reason).split())  # one line, whatever the library said
        super().__init__(
            f"damaged or truncated archive {str(self.path)!r} ({self.reason}); replace it with a "
            f"good copy of {ARCHIVE_NAME} (d2l's: {DATA_URL})"
        )

    def __reduce__(self):  # picklable, e.g. across processes
        return type(self), (self.path, self.reason)


class UnknownArchiveWarning(UserWarning):
    """A ``fra-eng.zip`` whose SHA-1 is none of :data:`KNOWN_ARCHIVE_SHA1S` (used all the same).

    Given once per process and file. The message, one line: ``'<path>' has SHA-1 <sha1>, not
    one of the known fra-eng.zip archives (<sha1>, <sha1>); its CRC-32 checks pass and it is
    used``.
    """


# The local file header's signature, which every zip written by a zip tool begins with.
_ZIP_MAGIC = b"PK\x03\x04"
# What zipfile and zlib raise on a damaged archive: a truncated file or central directory
# (BadZipFile, or OSError from a seek before the start), a damaged deflate stream (zlib.error, or
# EOFError when it ends early), a CRC-32 mismatch (BadZipFile "Bad CRC-32"), a damaged header
# (BadZipFile, struct.error, NotImplementedError for an unknown compression method, RuntimeError
# for an encryption flag, UnicodeDecodeError for a name flagged UTF-8 that is not), a method byte
# turned into bzip2's (OSError) or LZMA's (LZMAError, where Python has lzma, as zipfile).
_ARCHIVE_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError, OSError, NotImplementedError,
                   RuntimeError, struct.error, UnicodeDecodeError)
try:
    from lzma import LZMAError
except ImportError:  # Python built without lzma: zipfile cannot read LZMA members at all
    pass
else:
    _ARCHIVE_ERRORS += (LZMAError,)
# _member's answer for a file meant to be a zip that cannot be opened as one: the lookup accepts
# it (the user's file is not silently replaced by another), the read raises DamagedArchiveError.
_UNREADABLE_ARCHIVE = "<unreadable archive>"


def _is_archive(location: Path) -> bool:
    """Whether the file ``location`` is meant to be a zip: its name ends in ``.zip``, it begins
    with the zip signature, or :func:`zipfile.is_zipfile` finds an end of central directory."""
    if location.suffix.lower() == ".zip":
        return True
    try:
        with open(location, "rb") as file:
            if file.read(len(_ZIP_MAGIC)) == _ZIP_MAGIC:
                return True
    except OSError:
        return False  # unreadable: the read will say why
    return zipfile.is_zipfile(location)


def _archive_member(names: Iterable[str]) -> str | None:
    names = set(names)
    return next((member for member in _MEMBERS if member in names), None)


def _member(location: Path) -> str | None:
    """The member of ``location`` holding the text, ``""`` when it is the text file itself.

    ``None`` when ``location`` is a zip or a folder without ``fra-eng/fra.txt`` or ``fra.txt``,
    or does not exist; :data:`_UNREADABLE_ARCHIVE` for a file meant to be a zip
    (:func:`_is_archive`) that cannot be opened as one.
    """
    if location.is_dir():
        for member in _MEMBERS:
            if (location / member).is_file():
                return member
        return None
    if not location.is_file():
        return None
    if _is_archive(location):
        try:
            with zipfile.ZipFile(location) as archive:
                return _archive_member(archive.namelist())
        except _ARCHIVE_ERRORS:
            return _UNREADABLE_ARCHIVE
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
    5. only with ``download=True`` and unless ``$JAX_ATTENTION_NO_DOWNLOAD`` forbids it: d2l's
       published archive (``$JAX_ATTENTION_DATA_URL``, for testing mirrors, else
       :data:`DATA_URL`), downloaded into the cache and checked against its SHA-1
       (``$JAX_ATTENTION_DATA_SHA1``, else :data:`DATA_SHA1`; :func:`download_fra_eng`).

    ``path`` and the environment variable are choices of the user: when one is given but does not
    hold the data, that is an error, not a reason to look elsewhere.

    Each place may be a zip holding ``fra-eng/fra.txt`` (or ``fra.txt`` at its root), a folder
    holding ``fra-eng/fra.txt`` or ``fra.txt``, or the ``fra.txt`` file itself.

    Raises:
      FileNotFoundError: nothing found; the message lists every place looked at and says how to
        supply the file. With ``download=True``: the download failed (one line: why, and how to
        supply the file by hand).
      ValueError: the download's SHA-1 does not match (the download is deleted).
    """
    return _find_data(path, download=download, not_downloaded="download=False")


def ensure_data(path: str | os.PathLike | None = None, *, no_download: bool = False) -> Path:
    """What the commands call before any work: :func:`find_data`, downloading d2l's archive into
    the user cache when it is found nowhere, unless ``no_download`` (``--no-download``) or
    ``$JAX_ATTENTION_NO_DOWNLOAD`` forbids it.

    Raises:
      FileNotFoundError: nothing found and the download forbidden or failed; the first line of
        the message says why and how to supply the file.
      ValueError: the download's SHA-1 does not match (the download is deleted).
    """
    return _find_data(path, download=not no_download,
                      not_downloaded="--no-download" if no_download else None)


def _find_data(path, *, download: bool, not_downloaded: str | None) -> Path:
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

    url = _data_url()
    if download and download_forbidden():
        download, not_downloaded = False, f"{NO_DOWNLOAD_VAR}={os.environ[NO_DOWNLOAD_VAR]}"
    if download:
        try:
            return download_fra_eng(url, _data_sha1())
        except ValueError as error:  # SHA-1 mismatch: the download is gone
            raise ValueError(f"{error}. {_HOW_TO_SUPPLY_BY_HAND}") from error
        except OSError as error:  # no network, HTTP error, truncated, unwritable cache
            reason = " ".join(str(error).split())
            raise FileNotFoundError(
                f"the English–French data (fra-eng/fra.txt) is not here and its download "
                f"failed ({reason}). {_HOW_TO_SUPPLY_BY_HAND}") from error
    looked.append(f"{url} (not downloaded: {not_downloaded})")
    places = "\n".join(f"  - {place}" for place in looked)
    if not_downloaded == "download=False":  # the library's caller chose: all the ways
        raise FileNotFoundError(
            f"the English–French data (fra-eng/fra.txt) was not found. Looked at:\n{places}\n"
            f"{_HOW_TO_SUPPLY}"
        )
    raise FileNotFoundError(  # the user forbade the download: the first line says it all
        f"the English–French data (fra-eng/fra.txt) was not found and {not_downloaded} forbids "
        f"its download. {_HOW_TO_SUPPLY_BY_HAND} Looked at:\n{places}"
    )


def download_fra_eng(url: str | None = None, sha1: str | None = None, *,
                     directory: str | os.PathLike | None = None,
                     progress: bool | None = None) -> Path:
    """Download ``url`` into ``directory/fra-eng.zip`` (default :func:`cache_dir`), SHA-1 checked.

    pooch's :func:`pooch.retrieve` does it: the bytes go to a temporary file in the same folder,
    renamed onto the target only once the transfer is complete and the checksum matches, deleted
    otherwise (an error, Ctrl-C), so that an interrupted, truncated or corrupt download never sits
    where the lookup would take it for the data. A command stopped by Ctrl-C ends at once, with no
    clean-up (:mod:`jax_attention.runtime.interrupts`), so its temporary file stays: a download
    into the user cache first deletes the temporary files of downloads that stopped there
    (:func:`_remove_stopped_downloads`). A ``fra-eng.zip`` already there with the expected SHA-1
    is kept, not downloaded again.

    Args:
      url: ``http(s)://`` (pooch's :class:`~pooch.HTTPDownloader`) or any other URL ``urllib``
        opens, ``file://`` included; default ``$JAX_ATTENTION_DATA_URL``, else :data:`DATA_URL`.
      sha1: the expected SHA-1 of the downloaded bytes, hexadecimal; default
        ``$JAX_ATTENTION_DATA_SHA1``, else :data:`DATA_SHA1`.
      directory: where to put ``fra-eng.zip``; created if missing.
      progress: a progress bar on stderr (tqdm); ``None``: only when stderr is a terminal,
        otherwise one line ``downloading <url> (<n> MiB) into <directory>``.

    Returns:
      The path of the downloaded archive.

    Raises:
      ValueError: the SHA-1 does not match; nothing is left behind.
      DownloadError: the server is unreachable, answered with an error or sent fewer bytes than
        its Content-Length, or the bytes could not be written (an OSError); nothing is left behind.
      OSError: the folder could not be created or written to.
    """
    import pooch  # only a download needs it (and requests, which it imports)

    url = _data_url() if url is None else url
    sha1 = _data_sha1() if sha1 is None else sha1.lower()
    if directory is None:
        directory = cache_dir()
        _remove_stopped_downloads(directory)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    download = _Download(url, directory, progress)
    with _without_pooch_notes(pooch.get_logger(), url):
        try:
            pooch.retrieve(url, known_hash=f"sha1:{sha1}", fname=ARCHIVE_NAME, path=directory,
                           downloader=download)
        except ValueError as error:
            if download.sha1 in (None, sha1):  # not pooch's checksum check
                raise
            raise ValueError(f"SHA-1 mismatch for {url}: got {download.sha1}, expected {sha1}; "
                             "the download was deleted") from error
    return directory / ARCHIVE_NAME


def _remove_stopped_downloads(directory: Path) -> None:
    """Delete pooch's temporary files in the user cache (named as :mod:`tempfile` names them:
    ``tmp`` and 8 letters, digits or underscores) that no download has written to for a while
    (twice :data:`DOWNLOAD_TIMEOUT`: a download under way writes more often, or fails): what a
    command stopped by Ctrl-C in its download left there. Only the user cache, this package's own
    folder; a folder given by the caller is left as it is."""
    if not directory.is_dir():
        return
    for path in directory.iterdir():
        with contextlib.suppress(OSError):  # gone meanwhile, or not ours to delete
            if (re.fullmatch(r"tmp[a-z0-9_]{8}", path.name) and path.is_file()
                    and time.time() - path.stat().st_mtime > 2 * DOWNLOAD_TIMEOUT):
                path.unlink()


@contextlib.contextmanager
def _without_pooch_notes(logger: logging.Logger, url: str) -> Iterator[None]:
    """Drop pooch's notes about ``url`` while it downloads, and nothing else.

    pooch logs ``Downloading data from '<url>' to file '<path>'.`` (INFO) to stderr through a
    handler of its own, whatever the process's logging set-up; the download shows its own line or
    bar instead. A filter on pooch's logger drops the records below WARNING that name ``url``
    until the way out, where it is removed; the logger's level and handlers are not touched.
    """
    def keep(record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        return record.levelno >= logging.WARNING or url not in map(str, args)

    logger.addFilter(keep)
    try:
        yield
    finally:
        logger.removeFilter(keep)


class _Download:
    """One download, as pooch sees it: the ``downloader`` it calls (``(url, output_file,
    pooch)``: ``output_file`` is its temporary file), and, for pooch's HTTPDownloader, the
    file-like object it writes to and the progress-bar object it reports to.

    ``http(s)://`` goes through pooch's HTTPDownloader (requests), any other URL through
    ``urllib``. :meth:`write` hashes and counts the bytes on their way to the file and moves the
    progress. pooch sets :attr:`total` (the Content-Length, 0 if none) once the server has
    answered, which starts a tqdm bar on stderr, or prints one line (``progress``, as for
    :func:`download_fra_eng`); pooch's own ``update`` (whole chunks, the last one over-counted)
    and ``reset`` are ignored. A failed transfer becomes one :class:`DownloadError` of one line,
    so that the only ValueError out of :func:`pooch.retrieve` is its checksum's; :attr:`sha1` is
    that of the bytes received, once they are all there.
    """

    def __init__(self, url: str, directory: Path, progress: bool | None):
        if progress is None:
            progress = sys.stderr is not None and sys.stderr.isatty()
        self.url, self.directory, self.progress = url, directory, progress
        self.sha1: str | None = None
        self._total: int | None = None
        self._bar = self._file = self._response = None
        self._digest, self._written = hashlib.sha1(), 0

    def __call__(self, url: str, output_file: str, pooch) -> None:
        try:
            with open(output_file, "wb") as self._file:
                if urllib.parse.urlsplit(url).scheme.lower() in ("http", "https"):
                    from pooch import HTTPDownloader

                    # "identity": the archive's own bytes, to compare with the Content-Length.
                    # The hook hands over requests' response, which pooch never closes.
                    HTTPDownloader(progressbar=self, chunk_size=1 << 16, timeout=DOWNLOAD_TIMEOUT,
                                   headers={"Accept-Encoding": "identity"},
                                   hooks={"response": self._opened})(url, self, pooch)
                else:
                    with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT) as source:
                        length = source.headers.get("Content-Length", "")
                        self.total = int(length) if length.isdigit() else 0
                        shutil.copyfileobj(source, self, 1 << 16)
        except (OSError, http.client.HTTPException, ValueError) as error:
            raise _download_error(url, error, self._written, self._total) from error
        finally:
            self.close()
            if self._response is not None:  # its connection, left open by an error or Ctrl-C
                self._response.close()
        if self._total and self._written < self._total:  # a server that closed early, unnoticed
            raise _truncated(url, self._written, self._total)
        self.sha1 = self._digest.hexdigest()

    def _opened(self, response, *args, **kwargs) -> None:
        self._response = response  # requests' response hook: the last one is the final answer

    def write(self, chunk: bytes) -> int:
        self._digest.update(chunk)
        self._written += len(chunk)
        if self._bar is not None:
            self._bar.update(len(chunk))
        return self._file.write(chunk)

    def flush(self) -> None:
        self._file.flush()

    @property
    def total(self) -> int | None:
        return self._total

    @total.setter
    def total(self, size: int) -> None:
        self._total = size
        if self.progress:
            from tqdm import tqdm

            self._bar = tqdm(total=size or None, unit="B", unit_scale=True, unit_divisor=1024,
                             desc=f"downloading {ARCHIVE_NAME}", file=sys.stderr, leave=True)
        elif sys.stderr is not None:
            mib = f"{size / (1 << 20):.1f} MiB" if size else "size unknown"
            print(f"downloading {self.url} ({mib}) into {self.directory}", file=sys.stderr,
                  flush=True)

    def update(self, *ignored) -> None:
        """pooch's ``update`` and ``reset`` of the progress: ignored (see the class)."""

    reset = update

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def _download_error(url: str, error: BaseException, written: int,
                    expected: int | None) -> DownloadError:
    """The one-line :class:`DownloadError` for ``error``, which ended the transfer of ``url``
    after ``written`` bytes of the ``expected`` (its Content-Length; 0 or ``None``: unknown)."""
    causes = _causes(error)
    for cause in causes:
        if isinstance(cause, http.client.IncompleteRead):  # the server closed the connection
            # urllib3's counts all the bytes read (the last of them never reached the file);
            # http.client's holds the bytes of the last read.
            partial = cause.partial
            received = partial if isinstance(partial, int) else written + len(partial)
            return _truncated(url, received, expected or received + (cause.expected or 0))
    response = getattr(error, "response", None)  # requests' HTTPError: the server's answer
    if response is not None:
        return DownloadError(url, f"cannot download {url}: HTTP {response.status_code} "
                                  f"{response.reason}", str(response.reason))
    reason = _os_reason(causes)
    after = f" after {written} bytes" if written else ""
    return DownloadError(url, f"cannot download {url}: {reason}{after}", reason)


def _truncated(url: str, received: int, expected: int) -> DownloadError:
    return DownloadError(
        url, f"truncated download of {url}: received {received} of the {expected} bytes of its "
             f"Content-Length; nothing was kept", "truncated")


def _causes(error: BaseException) -> list[BaseException]:
    """``error`` and the exceptions behind it (cause, context, ``reason``, exceptions among its
    arguments), breadth first: requests wraps urllib3's, which wraps the socket's."""
    found: list[BaseException] = []
    queue = [error]
    while queue:
        current = queue.pop(0)
        if not any(current is seen for seen in found):
            found.append(current)
            queue += [inner for inner in (current.__cause__, current.__context__,
                                          getattr(current, "reason", None), *current.args)
                      if isinstance(inner, BaseException)]
    return found


def _os_reason(causes: list[BaseException]) -> str:
    """The system's words of the first of ``causes`` that has them (``Connection refused``), else
    those of the innermost OSError (``timed out``), else of the first cause."""
    system_errors = [cause for cause in causes if isinstance(cause, OSError)]
    reason = next((cause.strerror for cause in system_errors if cause.strerror), None)
    last = system_errors[-1] if system_errors else causes[0]
    return reason or " ".join(str(last).split()) or type(last).__name__


# --------------------------------------------------------------------------- reading the text

# How the file is decoded. "utf-8-sig" drops the byte-order mark a Windows editor may put first
# (plain UTF-8 otherwise). "surrogateescape" turns each byte that is not valid UTF-8 into one lone
# surrogate (U+DC80..U+DCFF), which valid UTF-8 never decodes to: such lines are then found and
# skipped exactly (by jax_attention.data.nmt's tokenize) instead of failing the whole read with a
# UnicodeDecodeError. UTF-8 never uses the byte of "\n" inside a character, so a bad byte cannot
# join two lines. newline="\n" splits at line feeds only: a lone carriage return stays inside its
# line, where it is found and skipped, instead of splitting the line in two as universal newlines
# would (which would turn "Go.<TAB>Va\r !" into a wrong pair and a stray line).
_TEXT_OPTIONS = {"encoding": "utf-8-sig", "errors": "surrogateescape", "newline": "\n"}


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
    :func:`jax_attention.data.nmt.tokenize` skips and counts the lines holding either. An archive is
    checked as :func:`read_text` says.
    """
    return read_text(find_data(path, download=download), stacklevel=3)


def read_text(location: str | os.PathLike, num_pairs: int | None = None, *,
              is_pair: Callable[[str], bool] | None = None, stacklevel: int = 2) -> str:
    """The raw text at ``location``, up to and including the line of the ``num_pairs``-th pair.

    Streams the text, so that the book's 600 examples do not preprocess all 167,130 lines; it is
    decoded as :func:`read_fra_eng` says. An archive's member is read to its end all the same,
    for its CRC-32 (:class:`DamagedArchiveError`), unless the archive's SHA-1 is a known one (a
    stronger check of the same bytes); a ``fra-eng.zip`` of unknown SHA-1 gives one
    :class:`UnknownArchiveWarning` per process and file.

    Args:
      location: a zip, a folder or the text file, as :func:`find_data` returns it.
      num_pairs: stop after the line of this pair (>= 1); ``None``: read the whole text.
      is_pair: whether a line (without its line end) counts towards ``num_pairs``; ``None``:
        every line does. :func:`jax_attention.data.nmt.load_data_nmt` passes the test its tokeniser
        uses, so that the two agree on what a pair is.
      stacklevel: the warning's, as for :func:`warnings.warn`: 2 points at this function's caller.

    Raises:
      FileNotFoundError: ``location`` does not exist, or holds neither ``fra-eng/fra.txt`` nor
        ``fra.txt``.
      DamagedArchiveError: a damaged or truncated archive (a ValueError).
    """
    if num_pairs is not None and (isinstance(num_pairs, bool)
                                  or not isinstance(num_pairs, numbers.Integral) or num_pairs < 1):
        raise ValueError(f"num_pairs must be an integer >= 1 or None, got {num_pairs!r}")
    location = Path(location)
    member = _member(location)
    if member is None:
        raise FileNotFoundError(f"{str(location)!r} holds neither fra-eng/fra.txt nor fra.txt")
    if location.is_dir() or member == "":
        with open(location / member if member else location, **_TEXT_OPTIONS) as stream:
            return _first_pairs(stream, num_pairs, is_pair)
    text = _read_archive(location, num_pairs, is_pair)
    _check_known_archive(location, stacklevel=stacklevel + 1)
    return text


def _first_pairs(stream: io.TextIOBase, num_pairs: int | None,
                 is_pair: Callable[[str], bool] | None) -> str:
    """The lines of ``stream`` up to the ``num_pairs``-th pair (``None``: all), joined."""
    lines, pairs = [], 0
    for line in _lines(stream):
        lines.append(line)
        if num_pairs is not None:
            pairs += is_pair is None or bool(is_pair(line.removesuffix("\n")))
            if pairs == num_pairs:
                break
    return "".join(lines)


def _read_archive(location: Path, num_pairs: int | None,
                  is_pair: Callable[[str], bool] | None) -> str:
    """:func:`_first_pairs` of the text member of the zip ``location``, its CRC-32 checked.

    zipfile checks a member's CRC-32 only once the member has been read to its end, so the rest
    is read (and dropped) after the pairs needed: ~50 ms for fra.txt, skipped for an archive whose
    SHA-1 is a known one (a stronger check of the same bytes). Any error of zipfile or zlib
    (:data:`_ARCHIVE_ERRORS`) becomes a :class:`DamagedArchiveError`; an archive that opens but
    holds no fra.txt is a FileNotFoundError, as for :func:`find_data`.
    """
    with open(location, "rb") as file:  # not found, no permission: an OSError, not damage
        try:
            archive = zipfile.ZipFile(file)
        except _ARCHIVE_ERRORS as error:
            raise DamagedArchiveError(location, f"{type(error).__name__}: {error}") from error
        with archive:
            member = _archive_member(archive.namelist())
            if member is None:
                raise FileNotFoundError(
                    f"{str(location)!r} holds neither fra-eng/fra.txt nor fra.txt")
            try:
                with io.TextIOWrapper(archive.open(member), **_TEXT_OPTIONS) as stream:
                    text = _first_pairs(stream, num_pairs, is_pair)
                    if _archive_sha1(location) not in _known_archive_sha1s():
                        # To the end, past the text buffered: zipfile compares the CRC-32 there.
                        while stream.buffer.read(1 << 20):
                            pass
            except _ARCHIVE_ERRORS as error:
                raise DamagedArchiveError(location,
                                          f"{type(error).__name__}: {error}") from error
    return text


# SHA-1 of an archive by (path, size, modification time, inode): hashed once per process unless
# the file changes. And the (path, SHA-1) pairs already warned about (UnknownArchiveWarning).
_ARCHIVE_SHA1S: dict[tuple, str] = {}
_WARNED_ARCHIVES: set[tuple[str, str]] = set()


def _archive_sha1(location: Path) -> str:
    stat = location.stat()
    key = (str(location.resolve()), stat.st_size, stat.st_mtime_ns, stat.st_ino)
    if key not in _ARCHIVE_SHA1S:
        digest = hashlib.sha1()
        with open(location, "rb") as file:
            while chunk := file.read(1 << 20):
                digest.update(chunk)
        _ARCHIVE_SHA1S[key] = digest.hexdigest()
    return _ARCHIVE_SHA1S[key]


def _known_archive_sha1s() -> set[str]:
    # DATA_SHA1 read at call time: tests stand in another archive for d2l's by patching it (or
    # by naming a mirror's SHA-1 in $JAX_ATTENTION_DATA_SHA1).
    return {DATA_SHA1.lower(), _data_sha1(), *KNOWN_ARCHIVE_SHA1S}


def _check_known_archive(location: Path, stacklevel: int) -> None:
    """One :class:`UnknownArchiveWarning` per process for a ``fra-eng.zip`` of unknown SHA-1.

    ``stacklevel`` is given to :func:`warnings.warn` (1: this function).
    """
    if location.name != ARCHIVE_NAME:
        return
    sha1 = _archive_sha1(location)
    known = _known_archive_sha1s()
    key = (str(location.resolve()), sha1)
    if sha1 in known or key in _WARNED_ARCHIVES:
        return
    _WARNED_ARCHIVES.add(key)
    warnings.warn(
        f"{str(location)!r} has SHA-1 {sha1}, not one of the known {ARCHIVE_NAME} archives "
        f"({', '.join(sorted(known))}); its CRC-32 checks pass and it is used",
        UnknownArchiveWarning, stacklevel=stacklevel)

