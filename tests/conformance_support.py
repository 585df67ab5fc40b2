"""The check every conformance run must pass, shared by the test modules of the targets."""

from __future__ import annotations

from jax_attention.conformance import load_cases


def assert_conforms(report, expected_not_applicable) -> None:
    """No row fails, every case is covered and has a passing row, and the n/a rows are exactly
    ``expected_not_applicable`` ((case, implementation) pairs), each with its reason — so a known
    difference of a built-in cannot silently spread to other cases."""
    failures = [(r.case, r.implementation, r.note) for r in report.results if r.status == "FAIL"]
    assert failures == []
    cases = load_cases()
    assert report.not_covered == [] and report.num_cases == len(cases)
    assert {r.case for r in report.results if r.status == "PASS"} == set(cases)
    not_applicable = {(r.case, r.implementation) for r in report.results if r.status == "n/a"}
    assert not_applicable == set(expected_not_applicable)
    assert all(r.note for r in report.results if r.status == "n/a")
    assert not report.failed
