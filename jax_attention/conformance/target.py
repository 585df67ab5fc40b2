"""What a conformance target is: the implementations it offers and how to run them.

A *target* (``numpy``, ``jax``, ``flax``, ``torch`` or a user module; built by
:func:`jax_attention.conformance.targets.make_target`) offers, for each function of the index,
one or more :class:`Implementation` — ours, or a framework's built-in.
:mod:`jax_attention.conformance.runner` runs every case of a function through each of them.
Kept apart from the runner so that the targets and the runner need not import each other.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from jax_attention.conformance.cases import Case

__all__ = ["Implementation", "Target", "exit_call", "one_line"]


def _never(case: Case) -> None:
    return None


def exit_call(stop: SystemExit) -> str:
    """``"called sys.exit(0)"``: what a ``SystemExit`` raised by user code did, in words."""
    return "called sys.exit()" if stop.code is None else f"called sys.exit({stop.code!r})"


def one_line(text) -> str:
    """``text`` on one line (an exception's message may span several)."""
    return " ".join(str(text).split())


@dataclass(frozen=True)
class Implementation:
    """One implementation of one function, as a target runs it.

    Attributes:
      label: what the table shows, e.g. ``"torch.nn.MultiheadAttention"``.
      run: ``run(case, inputs, params) -> {output name: array-like}`` with ``inputs`` and
        ``params`` already cast to the run's dtype (NumPy); may return a subset of the
        function's outputs (a built-in that does not return the weights).
      not_applicable: ``not_applicable(case) -> reason or None``.
      tolerance_dtype: compare with this dtype's tolerance instead of the run's (a built-in that
        computes in float32 by design, whatever the inputs).
      note: printed with every row of this implementation (e.g. why the tolerance differs).
    """

    label: str
    run: Callable[[Case, dict, dict], Mapping[str, Any]]
    not_applicable: Callable[[Case], str | None] = _never
    tolerance_dtype: str | None = None
    note: str = ""


@dataclass
class Target:
    """What ``--against`` names: implementations by function name, and how to run them.

    Attributes:
      name: ``"numpy"``, ``"jax"``, ``"flax"``, ``"torch"`` or the user module's name.
      description: one line for the header.
      implementations: ``{function name: [Implementation, ...]}``.
      environment: platform, device, versions — printed and written to the JSON record.
      context: entered around the whole run (x64, default device, matmul precision).
      check_dtype: float outputs must come back in the run's dtype (frameworks that could
        silently compute in another precision); off for the NumPy reference and user modules.
      unknown: names in a user module's ``IMPLEMENTATIONS`` that the index does not know.
    """

    name: str
    description: str
    implementations: dict[str, list[Implementation]]
    environment: dict = field(default_factory=dict)
    context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    check_dtype: bool = True
    unknown: list[str] = field(default_factory=list)
