"""The suite's hypothesis profiles, and sizes drawn from a small fixed set in CI.

``HYPOTHESIS_PROFILE`` chooses (tests/conftest.py loads it before any test module):

- ``ci`` (the default, what ``make test`` and CI run): derandomised, so every run on every machine
  draws the same examples; at most the ``ci`` count of :func:`examples` per test; no example
  database; and each size of :func:`sizes` one of its two ends, so that a jitted function
  compiles a few programs instead of one per drawn shape (a compilation costs far more than the
  check it serves).
- ``dev``: random examples, the larger ``dev`` count, sizes over their whole range — for a
  local search: ``HYPOTHESIS_PROFILE=dev make test PYTEST_ARGS="-k property"``.
"""

from __future__ import annotations

import os

import hypothesis.strategies as st
from hypothesis import settings

__all__ = ["PROFILE", "examples", "sizes"]

PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
if PROFILE not in ("ci", "dev"):
    raise ValueError(f"HYPOTHESIS_PROFILE must be 'ci' or 'dev', got {PROFILE!r}")

settings.register_profile("ci", derandomize=True, database=None, deadline=None,
                          max_examples=10, print_blob=True)
settings.register_profile("dev", deadline=None, max_examples=100)
settings.load_profile(PROFILE)


def examples(*, ci: int, dev: int) -> int:
    """A test's ``max_examples`` under the loaded profile."""
    return ci if PROFILE == "ci" else dev


def sizes(low: int, high: int) -> st.SearchStrategy[int]:
    """An array size in ``[low, high]``: both ends only under ``ci``, any under ``dev``."""
    if PROFILE == "ci":
        return st.sampled_from(sorted({low, high}))
    return st.integers(low, high)
