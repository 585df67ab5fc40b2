"""The conformance case file: the :class:`Case` record and its ``.npz`` reader and writer.

:func:`write_cases` stores cases in one ``.npz`` archive (a zip of ``.npy`` arrays plus a UTF-8
JSON ``__index__``, written with a fixed timestamp so that the same cases give the same bytes);
:func:`load_cases` reads one back, with ``allow_pickle=False`` and every part of the index
checked, so that a damaged or foreign file raises :class:`CaseFileError` with the reason. The
format is described in :mod:`jax_attention.conformance`; the cases themselves are built in
:mod:`jax_attention.conformance.cases`, which re-exports the names here.
"""

from __future__ import annotations

import copy
import io
import json
import zipfile
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from jax_attention.params import flatten_params, unflatten_params

__all__ = [
    "DEFAULT_CASES_PATH",
    "DEFAULT_TOLERANCES",
    "FORMAT",
    "FORMAT_VERSION",
    "TAGS",
    "Case",
    "CaseFileError",
    "load_cases",
    "write_cases",
]

#: The ``"format"`` of the ``__index__`` JSON: what marks a ``.npz`` file as a case file.
FORMAT = "jax-attention-conformance"
#: The ``"version"`` of the ``__index__`` JSON; :func:`load_cases` reads this version only.
FORMAT_VERSION = 1

#: The tolerance of a case unless it states its own, elementwise
#: ``|got - expected| <= atol + rtol * |expected|``. float64 is tight (the observed errors are
#: 1e-16 to 1e-13: a handful of float64 roundings); float32 allows float32 rounding through a
#: model, with an ``atol`` for entries near zero (a weight of 1e-9 is not a relative question).
DEFAULT_TOLERANCES = {
    "float64": {"rtol": 1e-9, "atol": 1e-12},
    "float32": {"rtol": 1e-5, "atol": 1e-6},
}

#: The case file shipped in the package, ``jax_attention/conformance/cases.npz`` (rebuilt by
#: ``jax-attention conformance --regenerate``); read when no other file is given.
DEFAULT_CASES_PATH = Path(__file__).with_name("cases.npz")

#: Tags a case may carry, ``{tag: what it says of the case's data}`` (each claim is checked when
#: the cases are built). They let a reader pick out the edge cases, and targets use them to mark
#: documented differences ("n/a": a built-in's uniform weights on a fully masked row).
TAGS = {
    "fully_masked_row": "some query may attend no key (valid length 0): its weights are all zero "
                        "and its output zero (or b_o)",
    "nan_in_padding": "NaN and Inf stored in masked positions",
    "large_scores": "scores in the hundreds, beyond where exp overflows (float32 past 88.7, "
                    "float64 past 709.8): a softmax must subtract the row's maximum",
}

# Fixed zip timestamp (the earliest zip allows), so that regenerating unchanged cases rewrites
# the same bytes and `git diff` stays quiet.
_ZIP_DATE = (1980, 1, 1, 0, 0, 0)


@dataclass
class Case:
    """One canonical case.

    Attributes:
      name: unique, ``"<function>.<variant>"``, e.g. ``"dot_product_attention.causal"``
        (``"mods.<variant>"`` for ``mods.dot_product_attention``, e.g. ``"mods.alibi"``).
      function: ``"<component>.<function>"``, a key of
        :data:`~jax_attention.conformance.functions.FUNCTIONS`.
      config: keyword arguments that are not arrays (``num_heads``, ``is_causal``, ``bos_id``...).
      description: one line for people.
      inputs: ``{name: array}``; float arrays are float64, ids and lengths int32, masks bool.
      params: nested dict of float64 arrays (``{}`` for functions without parameters).
      outputs: ``{name: array}`` computed by :mod:`reference_numpy` in float64.
      tolerances: ``{"float64": {"rtol", "atol"}, "float32": {...}}``.
      tags: names from :data:`TAGS`.
    """

    name: str
    function: str
    config: dict
    description: str
    inputs: dict[str, np.ndarray]
    params: dict
    outputs: dict[str, np.ndarray] = field(default_factory=dict)
    tolerances: dict = field(default_factory=lambda: copy.deepcopy(DEFAULT_TOLERANCES))
    tags: tuple[str, ...] = ()

    @property
    def component(self) -> str:
        """The component of :attr:`function`, e.g. ``"scoring"``."""
        return self.function.split(".")[0]

    def index_entry(self) -> dict:
        """The case's entry of the ``__index__`` JSON."""
        return {"name": self.name, "component": self.component, "function": self.function,
                "config": self.config, "description": self.description,
                "tolerances": self.tolerances, "tags": list(self.tags),
                "inputs": list(self.inputs), "params": list(flatten_params(self.params)),
                "outputs": list(self.outputs)}


def _write_array(archive: zipfile.ZipFile, key: str, array: np.ndarray) -> None:
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, array, allow_pickle=False)
    info = zipfile.ZipInfo(key + ".npy", date_time=_ZIP_DATE)
    info.compress_type = zipfile.ZIP_DEFLATED
    archive.writestr(info, buffer.getvalue())


def write_cases(path: str | Path, cases: Mapping[str, Case]) -> Path:
    """Write ``cases`` to ``path`` as a compressed ``.npz`` (:func:`load_cases` reads it back).

    The archive is an ordinary ``numpy.savez_compressed`` file (``np.load`` reads it), written
    with a fixed timestamp so that the same cases give the same bytes.

    Returns:
      ``path`` as a :class:`~pathlib.Path`.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    index = {"format": FORMAT, "version": FORMAT_VERSION,
             "regenerate": "jax-attention conformance --regenerate",
             "tags": TAGS, "cases": [case.index_entry() for case in cases.values()]}
    tmp = path.with_name(path.name + ".tmp")
    with zipfile.ZipFile(tmp, "w") as archive:
        # UTF-8 bytes as uint8: every .npy reader handles uint8, not all handle NumPy's '<U'.
        text = json.dumps(index, indent=1, ensure_ascii=False).encode("utf-8")
        _write_array(archive, "__index__", np.frombuffer(text, dtype=np.uint8))
        for case in cases.values():
            for kind, arrays in (("input", case.inputs), ("param", flatten_params(case.params)),
                                 ("output", case.outputs)):
                for name, array in arrays.items():
                    _write_array(archive, f"{case.name}/{kind}/{name}", np.asarray(array))
    tmp.replace(path)  # never leave a half-written file where the cases are read
    return path


class CaseFileError(ValueError):
    """A file that is not a conformance case file, or cannot be read as one.

    Attributes:
      path: the file.
      reason: why, in a few words (``"not a zip archive"``, ``"no __index__ entry"``, ...).
    """

    def __init__(self, path: str | Path, reason: str):
        super().__init__(f"{path} is not a conformance case file ({reason})")
        self.path, self.reason = Path(path), reason


# The first bytes of what people pass by mistake, to say what the file is instead.
_PICKLE_MAGIC = (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05")
_NPY_MAGIC = b"\x93NUMPY"


def _not_a_zip_reason(head: bytes) -> str:
    if not head:
        return "the file is empty"
    if head.startswith(_PICKLE_MAGIC):
        return "it is a Python pickle; pickles are never loaded from a user's file"
    if head.startswith(_NPY_MAGIC):
        return "it is a single .npy array, not an .npz archive"
    if head.startswith(b"PK"):
        return "a damaged or truncated zip archive"
    return "not a zip archive, as an .npz file is"


def _is_str_list(value) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def _check_entry(number: int, entry) -> str | None:
    """Why the ``number``-th case entry of ``__index__`` is malformed, or ``None``."""
    if not isinstance(entry, Mapping):
        return f"case entry {number} of __index__ is {type(entry).__name__}, expected an object"
    name = entry.get("name")
    where = f"case {name!r}" if isinstance(name, str) else f"case entry {number} of __index__"
    if not isinstance(name, str) or not isinstance(entry.get("function"), str):
        return f"{where} has no name or function"
    if not isinstance(entry.get("config"), Mapping):
        return f"{where} has no config object"
    for key in ("inputs", "params", "outputs", "tags"):
        if not _is_str_list(entry.get(key)):
            return f"{where}: {key} is not a list of names"
    tolerances = entry.get("tolerances")
    for dtype in DEFAULT_TOLERANCES:
        tolerance = tolerances.get(dtype) if isinstance(tolerances, Mapping) else None
        if not (isinstance(tolerance, Mapping)
                and all(isinstance(tolerance.get(key), (int, float))
                        and not isinstance(tolerance.get(key), bool) for key in ("rtol", "atol"))):
            return f"{where} has no {dtype} rtol and atol"
    return None


def load_cases(path: str | Path | None = None) -> dict[str, Case]:
    """Read the cases from ``path`` (default: the file shipped in this package).

    Nothing in the file is unpickled (``allow_pickle=False``): a case file holds numbers, masks
    and a JSON index, and an arbitrary user file must not be able to run code.

    Raises:
      FileNotFoundError: no such file.
      CaseFileError: (a ``ValueError``) the file is not a conformance case file — not a zip
        archive, a pickle, a truncated archive, no or a malformed ``__index__``, an unsupported
        format version, a missing or unreadable array — with the reason.
    """
    path = DEFAULT_CASES_PATH if path is None else Path(path)
    try:
        with open(path, "rb") as file:
            head = file.read(8)
            is_zip = zipfile.is_zipfile(file)
    except FileNotFoundError:
        raise
    except OSError as error:
        raise CaseFileError(path, f"cannot read it: {error.strerror or error}") from None
    if not is_zip:
        raise CaseFileError(path, _not_a_zip_reason(head))
    try:
        return _read_cases(path)
    except CaseFileError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError, EOFError, OSError,
            zipfile.BadZipFile, zlib.error) as error:
        # A damaged member, an object array (which would need pickle), a missing array...
        detail = " ".join(str(error).split()) or type(error).__name__
        if isinstance(error, KeyError) and error.args:
            detail = str(error.args[0])
        raise CaseFileError(path, f"{type(error).__name__}: {detail}"[:300]) from None


def _read_cases(path: Path) -> dict[str, Case]:
    with np.load(path, allow_pickle=False) as archive:
        if "__index__" not in archive.files:
            raise CaseFileError(path, "no __index__ entry")
        try:
            index = json.loads(archive["__index__"].tobytes().decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise CaseFileError(path, f"its __index__ is not UTF-8 JSON: {error}") from None
        if not isinstance(index, Mapping):
            raise CaseFileError(path, "its __index__ is not a JSON object")
        if index.get("format") != FORMAT or index.get("version") != FORMAT_VERSION:
            raise CaseFileError(path, f"expected format {FORMAT!r} version {FORMAT_VERSION}, "
                                      f"got {index.get('format')!r} version "
                                      f"{index.get('version')!r}")
        entries = index.get("cases")
        if not isinstance(entries, list):
            raise CaseFileError(path, "its __index__ has no list of cases")
        members = set(archive.files)
        cases = {}
        for number, entry in enumerate(entries):
            problem = _check_entry(number, entry)
            if problem:
                raise CaseFileError(path, problem)
            name = entry["name"]

            def read(kind, names, name=name):
                missing = [n for n in names if f"{name}/{kind}/{n}" not in members]
                if missing:
                    raise CaseFileError(path, f"case {name!r} has no array "
                                              f"{name}/{kind}/{missing[0]}")
                return {n: archive[f"{name}/{kind}/{n}"] for n in names}

            cases[name] = Case(
                name=name, function=entry["function"], config=dict(entry["config"]),
                description=str(entry.get("description", "")),
                inputs=read("input", entry["inputs"]),
                params=unflatten_params(read("param", entry["params"])),
                outputs=read("output", entry["outputs"]), tolerances=entry["tolerances"],
                tags=tuple(entry["tags"]))
    return cases
