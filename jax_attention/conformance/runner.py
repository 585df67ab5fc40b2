"""Run the cases against a target and report: comparison, results, the table and the JSON record.

A *target* (``numpy``, ``jax``, ``flax``, ``torch`` or a user module; see
:mod:`jax_attention.conformance.targets`) offers, for each function of the index, one or more
:class:`~jax_attention.conformance.target.Implementation` — ours, or a framework's built-in.
Every case of that function is run through each of them and each output compared with the
float64 reference: the row passes when ``|got - expected| <= atol + rtol * |expected|`` holds
for every entry of every output returned, with the case's tolerance for the run's dtype.

An implementation may declare a case *not applicable* ("n/a", with the reason) where its
documented semantics differ from ours — e.g. ``jax.nn.dot_product_attention`` gives a fully masked
row uniform weights, ours gives zeros — or where it cannot express the case (sizes it does not
accept). Your own implementation says so by raising ``NotImplementedError("why")`` for the case
(it has no argument for a mask, the causal flag, a variant...): that row is n/a with the message,
where any other exception fails the row. n/a is neither a pass nor a failure; the reason is
printed with the table. A run passes when no row fails and at least one row passed: every row n/a
(or no row at all) checked nothing, and fails.
"""

from __future__ import annotations

import hashlib
import math
import platform as platform_module
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from jax_attention.conformance.cases import DEFAULT_CASES_PATH, Case, load_cases
from jax_attention.conformance.functions import FUNCTIONS
from jax_attention.conformance.target import Implementation, Target, exit_call, one_line
from jax_attention.conformance.targets import make_target

__all__ = [
    "DTYPES",
    "PRECISIONS",
    "Implementation",
    "Target",
    "OutputError",
    "Result",
    "Report",
    "cast_case",
    "compare",
    "run_conformance",
]

#: The dtypes a run can cast the cases to (``dtype=`` of :func:`run_conformance`, ``--dtype``).
DTYPES = ("float64", "float32")
#: JAX's default matmul precisions a run can set (``precision=``, ``--precision``).
PRECISIONS = ("highest", "high", "default")
#: A row's status: within the tolerance, not, or not applicable (a reason instead of errors).
PASS, FAIL, NOT_APPLICABLE = "PASS", "FAIL", "n/a"


@dataclass(frozen=True)
class OutputError:
    """How far one output is from the reference."""

    max_abs_err: float
    max_rel_err: float
    passed: bool
    note: str = ""


@dataclass
class Result:
    """One row of the table: one case through one implementation."""

    case: str
    function: str
    implementation: str
    status: str
    rtol: float
    atol: float
    tolerance_dtype: str
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    outputs: dict[str, OutputError] = field(default_factory=dict)
    note: str = ""
    #: ``"called sys.exit(0)"`` when the implementation called ``sys.exit`` (the row fails).
    exit_call: str | None = None

    @property
    def component(self) -> str:
        """The component of :attr:`function`, e.g. ``"scoring"``."""
        return self.function.split(".")[0]

    def to_dict(self) -> dict:
        """The row as the JSON record writes it (non-finite errors as ``null``)."""
        return {"case": self.case, "component": self.component, "function": self.function,
                "implementation": self.implementation, "status": self.status,
                "max_abs_err": _json_float(self.max_abs_err),
                "max_rel_err": _json_float(self.max_rel_err),
                "rtol": self.rtol, "atol": self.atol, "tolerance_dtype": self.tolerance_dtype,
                "outputs": {name: {"max_abs_err": _json_float(e.max_abs_err),
                                   "max_rel_err": _json_float(e.max_rel_err),
                                   "passed": e.passed, "note": e.note}
                            for name, e in self.outputs.items()},
                "note": self.note}


def _json_float(value: float | None) -> float | None:
    """JSON has no NaN or Infinity; a non-finite error is written as null (the note says why)."""
    return None if value is None or not math.isfinite(value) else float(value)


# --------------------------------------------------------------------------- comparison


def cast_case(case: Case, dtype: str) -> tuple[dict, dict]:
    """The case's inputs and parameters with every float array cast to ``dtype`` (fresh copies,
    so an implementation that writes into its arguments cannot spoil the next one)."""

    def cast(value):
        if isinstance(value, Mapping):
            return {name: cast(v) for name, v in value.items()}
        value = np.asarray(value)
        return value.astype(dtype) if value.dtype.kind == "f" else value.copy()

    return cast(case.inputs), cast(case.params)


def _to_numpy(value) -> np.ndarray:
    """Framework arrays (JAX, PyTorch with or without grad) and array-likes as NumPy arrays."""
    if hasattr(value, "detach"):  # torch.Tensor, without importing torch here
        value = value.detach().cpu().numpy()
    return np.asarray(value)


def compare(got, expected: np.ndarray, rtol: float, atol: float) -> OutputError:
    """Max absolute and relative error of ``got`` against ``expected`` and whether
    ``|got - expected| <= atol + rtol * |expected|`` holds everywhere.

    The relative error is taken over the entries where ``expected != 0``; NaN in ``got`` fails
    (the reference holds none) and makes both errors NaN. An infinity the reference holds (the
    log-sum-exp ``-inf`` of a row that attends nothing) is matched by the same infinity only.
    """
    got = _to_numpy(got)
    if got.shape != expected.shape:
        return OutputError(math.nan, math.nan, False,
                           f"shape {tuple(got.shape)}, expected {tuple(expected.shape)}")
    if not (np.issubdtype(got.dtype, np.number) or got.dtype == np.bool_):
        return OutputError(math.nan, math.nan, False, f"dtype {got.dtype} is not numeric")
    got64, expected64 = got.astype(np.float64), expected.astype(np.float64)
    with np.errstate(invalid="ignore"):
        # Equal entries differ by 0, equal infinities included (inf - inf would be NaN).
        diff = np.where(got64 == expected64, 0.0, np.abs(got64 - expected64))
    if diff.size == 0:
        return OutputError(0.0, 0.0, True)
    nonzero = expected64 != 0
    max_abs = float(np.max(diff))
    with np.errstate(invalid="ignore"):
        max_rel = (float(np.max(diff[nonzero] / np.abs(expected64[nonzero]))) if nonzero.any()
                   else 0.0)
    # NaN compares False: a failure; where the reference is infinite, only the same infinity.
    with np.errstate(invalid="ignore"):
        within = np.where(np.isfinite(expected64), diff <= atol + rtol * np.abs(expected64),
                          got64 == expected64)
    note = "" if (np.isfinite(got64) | (got64 == expected64)).all() else "non-finite values"
    return OutputError(max_abs, max_rel, bool(within.all()), note)


def _not_implemented_note(error: NotImplementedError) -> str:
    """The n/a note of a row whose implementation raised ``NotImplementedError``: its message on
    one line, ``"raised NotImplementedError: <message>"`` (``"... (no message)"`` without one)."""
    message = one_line(error)
    return f"raised NotImplementedError: {message}" if message else (
        "raised NotImplementedError (no message)")


def _run_one(case: Case, implementation: Implementation, inputs: dict, params: dict, dtype: str,
             check_dtype: bool) -> Result:
    tolerance_dtype = implementation.tolerance_dtype or dtype
    tolerance = case.tolerances[tolerance_dtype]
    result = Result(case.name, case.function, implementation.label, FAIL, tolerance["rtol"],
                    tolerance["atol"], tolerance_dtype)
    notes = [implementation.note] if implementation.note else []
    reason = implementation.not_applicable(case)
    if reason:
        result.status, result.note = NOT_APPLICABLE, reason
        return result
    # Everything that runs the implementation's code — the call, and turning what it returned
    # into arrays (an object's __array__, a ragged list) — fails only this row. KeyboardInterrupt
    # is not caught: Ctrl-C, or user code raising it, stops the run.
    try:
        got = implementation.run(case, inputs, params)
        if isinstance(got, Mapping):
            got = {name: _to_numpy(value) for name, value in got.items()}
    except SystemExit as stop:  # sys.exit() in the implementation: a failure, not the end
        result.note = "; ".join(notes + [exit_call(stop)])
        result.exit_call = exit_call(stop)
        return result
    except NotImplementedError as error:  # "I cannot express this case": n/a, with its words
        result.status, result.note = NOT_APPLICABLE, _not_implemented_note(error)
        return result
    except Exception as error:  # the row fails, with the error; the other rows still run
        result.note = "; ".join(notes + [f"raised {type(error).__name__}: {one_line(error)}"])
        return result
    if not isinstance(got, Mapping):
        result.note = "; ".join(notes + [f"returned {type(got).__name__}, expected a dict of "
                                         f"outputs {list(case.outputs)}"])
        return result
    unexpected = [name for name in got if name not in case.outputs]
    missing = [name for name in case.outputs if name not in got]
    if unexpected or not got:
        result.note = "; ".join(notes + [f"unexpected outputs {unexpected}, expected names from "
                                         f"{list(case.outputs)}" if unexpected else
                                         "returned no output"])
        return result
    for name, value in got.items():
        error = compare(value, case.outputs[name], tolerance["rtol"], tolerance["atol"])
        returned_dtype = value.dtype
        if check_dtype and case.outputs[name].dtype.kind == "f" and returned_dtype != dtype:
            error = OutputError(error.max_abs_err, error.max_rel_err, False,
                                f"returned {returned_dtype}, expected {dtype}")
        result.outputs[name] = error
        if error.note:
            notes.append(f"{name}: {error.note}")
    if missing:
        notes.append(f"compared {', '.join(got)}; {', '.join(missing)} not returned")
    result.max_abs_err = max(e.max_abs_err for e in result.outputs.values())
    result.max_rel_err = max(e.max_rel_err for e in result.outputs.values())
    if any(math.isnan(e.max_abs_err) for e in result.outputs.values()):
        result.max_abs_err = result.max_rel_err = math.nan
    result.status = PASS if all(e.passed for e in result.outputs.values()) else FAIL
    result.note = "; ".join(notes)
    return result


# --------------------------------------------------------------------------- the report


@dataclass
class Report:
    """All results of one run, with what produced them."""

    target: str
    description: str
    dtype: str
    environment: dict
    results: list[Result]
    not_covered: list[str]
    not_covered_functions: list[str]
    unknown: list[str]
    cases_file: str
    cases_sha256: str
    num_cases: int

    @property
    def counts(self) -> dict[str, int]:
        """``{"PASS": n, "FAIL": n, "n/a": n}``: the rows of each status."""
        return {status: sum(r.status == status for r in self.results)
                for status in (PASS, FAIL, NOT_APPLICABLE)}

    @property
    def failed(self) -> bool:
        """True when a row failed or nothing at all was checked."""
        return self.counts[FAIL] > 0 or self.counts[PASS] == 0

    @property
    def exit_calls(self) -> list[str]:
        """``"<implementation> called sys.exit(0) in 3 rows"`` for each implementation whose
        code called ``sys.exit`` (those rows failed), in the order of the rows."""
        rows: dict[tuple[str, str], int] = {}
        for r in self.results:
            if r.exit_call is not None:
                rows[r.implementation, r.exit_call] = rows.get((r.implementation, r.exit_call),
                                                               0) + 1
        return [f"{label} {what} in {count} row{'' if count == 1 else 's'}"
                for (label, what), count in rows.items()]

    def verdict(self) -> str:
        """Why the run failed, in a few words, or ``""`` when it passed. Only true statements:
        rows that were checked and all failed are not "no case was checked"."""
        counts = self.counts
        if not self.failed:
            return ""
        if not self.results:
            if self.num_cases == 0:
                return "no case was checked: no case to run"
            return "no case was checked: no implementation given for any case"
        if counts[PASS] == 0 and counts[FAIL] == 0:
            return "no case was checked: every row is n/a"
        if counts[PASS] == 0:
            return ("every checked row failed" if counts[FAIL] > 1
                    else "the one checked row failed")
        return f"{counts[FAIL]} of {counts[PASS] + counts[FAIL]} checked rows failed"

    def to_dict(self) -> dict:
        """The JSON record: the environment, every row, the summary."""
        counts = self.counts
        return {"command": "conformance", "against": self.target, "description": self.description,
                "dtype": self.dtype, "environment": self.environment,
                "cases_file": self.cases_file, "cases_sha256": self.cases_sha256,
                "num_cases": self.num_cases,
                "summary": {"passed": counts[PASS], "failed": counts[FAIL],
                            "not_applicable": counts[NOT_APPLICABLE],
                            "not_covered": len(self.not_covered), "ok": not self.failed},
                "results": [r.to_dict() for r in self.results],
                "not_covered": self.not_covered,
                "not_covered_functions": self.not_covered_functions,
                "unknown_functions": self.unknown}

    def format(self) -> str:
        """The header, the table and its footnotes, and the summary line."""
        lines = [f"conformance against {self.target}: {self.description}"]
        for key, value in self.environment.items():
            lines.append(f"  {key + ':':<11}{value}")
        shipped = Path(self.cases_file).resolve() == DEFAULT_CASES_PATH.resolve()
        source = "jax_attention/conformance/cases.npz" if shipped else self.cases_file
        lines.append(f"  {'cases:':<11}{self.num_cases} from {source} "
                     f"(sha256 {self.cases_sha256[:12]})")
        lines.append(f"  {'tolerance:':<11}|got - expected| <= atol + rtol * |expected|, every "
                     f"entry of every output, expected = float64 reference_numpy")
        lines.append("")
        footnotes: dict[str, int] = {}
        rows = []
        for r in self.results:
            status = r.status
            if r.note:
                number = footnotes.setdefault(r.note, len(footnotes) + 1)
                status = f"{status} [{number}]"
            tolerance = (f"rtol {_format_tolerance(r.rtol)} atol {_format_tolerance(r.atol)}"
                         if r.rtol or r.atol else "exact")
            if r.tolerance_dtype != self.dtype:
                tolerance += f" ({r.tolerance_dtype})"
            rows.append((r.case, r.function, r.implementation, _format_error(r.max_abs_err),
                         _format_error(r.max_rel_err), tolerance, status))
        header = ("case", "component.function", "implementation", "max abs err", "max rel err",
                  "tolerance", "status")
        widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
        right = {3, 4}  # numbers right-aligned
        for row in [header, *rows]:
            lines.append("  ".join(cell.rjust(w) if i in right else cell.ljust(w)
                                   for i, (cell, w) in enumerate(zip(row, widths))).rstrip())
        if footnotes:
            lines.append("")
            lines.extend(f"[{number}] {note}" for note, number in footnotes.items())
        if self.not_covered:
            functions = self.not_covered_functions
            lines.append("")
            lines.append(f"not covered: {len(self.not_covered)} cases of {len(functions)} "
                         f"functions with no implementation given ({', '.join(functions)})")
        if self.unknown:
            lines.append("not covered: IMPLEMENTATIONS names unknown to the index: "
                         + ", ".join(self.unknown) + f" (known: {', '.join(FUNCTIONS)})")
        counts = self.counts
        lines.append("")
        verdict = "FAILED" if self.failed else "OK"
        lines.append(f"{verdict}: {counts[PASS]} passed, {counts[FAIL]} failed, "
                     f"{counts[NOT_APPLICABLE]} n/a, {len(self.not_covered)} not covered "
                     f"({len(self.results)} row{'' if len(self.results) == 1 else 's'}, "
                     f"{self.dtype})"
                     + ("" if counts[PASS] else f"; {self.verdict()}"))
        return "\n".join(lines)


def _format_tolerance(value: float) -> str:
    """``1e-09`` as ``1e-9``: tolerances are round powers of ten, printed short."""
    mantissa, exponent = f"{value:.0e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def _format_error(value: float | None) -> str:
    if value is None:
        return "-"
    if math.isnan(value):
        return "nan"
    return "0" if value == 0 else f"{value:.1e}"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run_conformance(against: str, *, dtype: str = "float64", platform: str | None = None,
                    precision: str = "highest", cases_path: str | Path | None = None,
                    only: str | None = None) -> Report:
    """Run every case against a target and return the :class:`Report`.

    Args:
      against: ``"numpy"``, ``"jax"``, ``"flax"``, ``"torch"``, an importable module name or a
        ``.py`` file defining ``IMPLEMENTATIONS`` (see :mod:`jax_attention.conformance`).
      dtype: ``"float64"`` or ``"float32"``: the cases' floats are cast to it (JAX runs with x64
        on for float64).
      platform: the JAX platform (``"cpu"``, ``"gpu"``, ``"tpu"``) for the JAX-based targets;
        default JAX's default backend.
      precision: JAX's default matmul precision for the run (``"highest"`` by default: GPUs
        otherwise use TF32 for float32 matmuls).
      cases_path: the ``.npz`` file (default: the one shipped in the package).
      only: run only the cases whose name or function contains this text.

    Raises:
      ValueError: unknown dtype or precision, a user module without ``IMPLEMENTATIONS``.
      RuntimeError: the platform or framework is not available.
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    path = Path(cases_path) if cases_path is not None else DEFAULT_CASES_PATH
    cases = load_cases(path)
    if only:
        cases = {name: case for name, case in cases.items()
                 if only in name or only in case.function}
    target = make_target(against, dtype=dtype, platform=platform, precision=precision)
    environment = {"dtype": dtype, **target.environment,
                   "python": platform_module.python_version(), "numpy": np.__version__}
    results, not_covered = [], []
    with target.context():
        for case in cases.values():
            implementations = target.implementations.get(case.function, [])
            if not implementations:
                not_covered.append(case.name)
                continue
            for implementation in implementations:
                inputs, params = cast_case(case, dtype)
                results.append(_run_one(case, implementation, inputs, params, dtype,
                                        target.check_dtype))
    return Report(target=target.name, description=target.description, dtype=dtype,
                  environment=environment, results=results, not_covered=not_covered,
                  not_covered_functions=list(dict.fromkeys(cases[name].function
                                                           for name in not_covered)),
                  unknown=list(target.unknown), cases_file=str(path), cases_sha256=_sha256(path),
                  num_cases=len(cases))
