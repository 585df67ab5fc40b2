"""``--against numpy``: :mod:`reference_numpy` recomputed on the stored inputs.

In float64 this reproduces the stored outputs (to the last bit on the machine that wrote them),
so a pass proves the case file is current with the reference code.
"""

from __future__ import annotations

from jax_attention.conformance.cases import Case
from jax_attention.conformance.functions import FUNCTIONS, call
from jax_attention.conformance.target import Implementation, Target


def _reference(function: str) -> Implementation:
    def run(case: Case, inputs: dict, params: dict) -> dict:
        return call("reference_numpy", function, inputs, params, case.config)

    return Implementation("reference_numpy", run)


def make_numpy_target(dtype: str) -> Target:
    """``--against numpy``: :mod:`reference_numpy` for every function."""
    # check_dtype off: the reference computes some outputs in float64 whatever the inputs (the
    # positional tables, by design).
    return Target("numpy", "the float64 NumPy reference (reference_numpy), recomputed",
                  {function: [_reference(function)] for function in FUNCTIONS},
                  {"platform": "NumPy on the host CPU"}, check_dtype=False)
