"""The check every conformance run must pass, shared by the test modules of the targets."""

from __future__ import annotations

from collections.abc import Mapping

from jax_attention.conformance import load_cases


def assert_conforms(report, expected_not_applicable) -> None:
    """No row fails, every case is covered and has a passing row, and the n/a rows are exactly
    ``expected_not_applicable`` ((case, implementation) pairs), each with its reason — so a known
    difference of a built-in cannot silently spread to other cases.

    ``expected_not_applicable`` may map each pair to a fragment its reason must contain (what the
    built-in lacks: ``"scale"``, ``"soft-capping"``, ...), so that a row is n/a for the reason the
    test expects and not for another one that happens to match first.
    """
    failures = [(r.case, r.implementation, r.note) for r in report.results if r.status == "FAIL"]
    assert failures == []
    cases = load_cases()
    assert report.not_covered == [] and report.num_cases == len(cases)
    assert {r.case for r in report.results if r.status == "PASS"} == set(cases)
    not_applicable = {(r.case, r.implementation): r.note for r in report.results
                      if r.status == "n/a"}
    assert set(not_applicable) == set(expected_not_applicable)
    assert all(not_applicable.values())
    if isinstance(expected_not_applicable, Mapping):
        wrong = {pair: note for pair, note in not_applicable.items()
                 if expected_not_applicable[pair] not in note}
        assert wrong == {}
    assert not report.failed


def passed(report, implementation: str) -> set[str]:
    """The cases that passed through ``implementation``."""
    return {r.case for r in report.results
            if r.implementation == implementation and r.status == "PASS"}
