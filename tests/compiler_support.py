"""The compiler the suite's processes use: XLA's backend at optimisation level 0 in `make test`,
XLA's defaults where a test pins bits or where execution, not compilation, is the cost.

The suite compiles about 6,000 small programs and runs each a few times; most of its time is
XLA's backend compiling them, and a good part of that is LLVM optimising code that then runs for
microseconds. :data:`FAST_FLAGS` compile them faster (the figures: docs/design.md, Tests):
``--xla_backend_optimization_level=0`` (LLVM at -O0), ``--xla_llvm_disable_expensive_passes``
(what ``jax_disable_most_optimizations`` adds to it), XLA:CPU's fast-compile preset (the one
the training step compiles with, :data:`jax_attention.runtime.compilation.CPU_COMPILER_OPTIONS`)
and ``--xla_cpu_use_fusion_emitters=false`` (XLA:CPU's former elemental emitters for its fusions
instead of the MLIR fusion emitters, which take most of the compile time of a small program);
XLA's own HLO passes — fusion, algebraic simplification, layout — run as always.

What it does not keep is the last bits: LLVM at -O0 emits other instruction sequences for the same
floating-point operations (contracted multiply-adds, vectorised transcendental functions), so a
training run's losses move in their last bits — correct to float32 rounding, but not the bits of
the default compiler. So:

- ``JAX_ATTENTION_TEST_COMPILER`` (:data:`VARIABLE`) chooses: ``fast`` (the default: the flags
  above are added to ``XLA_FLAGS``) or ``default`` (XLA's defaults, what a user's process gets).
  `make test-slow` sets ``default``: the book's whole runs execute for far longer than they
  compile, and the documentation's outputs (docs/models.md) and the pins are the default
  compiler's bits.
- A test that pins bits of the default compiler runs its computation in a subprocess with
  :func:`default_compiler_env` (tests/test_pinned_losses.py), so that `make test` checks the pins
  too.
- An ``XLA_FLAGS`` that sets the optimisation level itself is left as it is, and so is a machine
  with an accelerator's JAX plugin (CUDA, ROCm, TPU) unless ``JAX_PLATFORMS=cpu``: there the
  suite is about the accelerator's compiler, which the flags would change too.

Every comparison between two computations of one process (or of processes with the same flags:
the subprocesses inherit ``XLA_FLAGS``, and the session's compilation cache keys include it) is
unaffected: both sides are compiled alike, so the suite's bit-for-bit resume and equivalence
checks hold under either compiler.
"""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import Mapping

__all__ = ["FAST_FLAGS", "VARIABLE", "apply", "default_compiler_env", "with_suite_flags"]

VARIABLE = "JAX_ATTENTION_TEST_COMPILER"
FAST_FLAGS = ("--xla_backend_optimization_level=0", "--xla_llvm_disable_expensive_passes=true",
              "--xla_cpu_opt_preset=CPU_OPT_PRESET_FAST_COMPILE",
              "--xla_cpu_use_fusion_emitters=false")
_CHOICES = ("fast", "default")


def _choice(environ: Mapping[str, str]) -> str:
    choice = environ.get(VARIABLE, "fast")
    if choice not in _CHOICES:
        raise ValueError(f"{VARIABLE} must be one of {_CHOICES}, got {choice!r}")
    return choice


def _accelerator_plugin() -> bool:
    """Whether a JAX plugin of an accelerator (``jax-cuda12-plugin``, ``libtpu``, ...) is
    installed: read from the installed distributions, without starting JAX."""
    names = {(dist.metadata["Name"] or "").lower().replace("_", "-")
             for dist in importlib.metadata.distributions()}
    return any(name.startswith(("jax-cuda", "jax-rocm", "libtpu")) for name in names)


def apply(environ=os.environ) -> None:
    """Add :data:`FAST_FLAGS` to ``environ['XLA_FLAGS']`` unless ``default`` is chosen, the
    flags set the level already or an accelerator may be used. Call before JAX creates its
    backends (tests/conftest.py, at its top): XLA reads ``XLA_FLAGS`` once, when the first
    backend starts."""
    flags = environ.get("XLA_FLAGS", "")
    if _choice(environ) != "fast" or "xla_backend_optimization_level" in flags:
        return
    if environ.get("JAX_PLATFORMS", "") != "cpu" and _accelerator_plugin():
        return
    environ["XLA_FLAGS"] = " ".join((flags,) + FAST_FLAGS).strip()


def with_suite_flags(flags: str, environ: Mapping[str, str] = os.environ) -> str:
    """``flags`` for a subprocess that sets ``XLA_FLAGS`` of its own (the distributed tests'
    device count), with the suite's compiler flag where this process has it."""
    own = environ.get("XLA_FLAGS", "").split()
    return " ".join((flags,) + FAST_FLAGS) if all(f in own for f in FAST_FLAGS) else flags


def default_compiler_env(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """A copy of ``environ`` in which a subprocess compiles with XLA's defaults."""
    env = dict(environ)
    flags = [flag for flag in env.get("XLA_FLAGS", "").split() if flag not in FAST_FLAGS]
    env["XLA_FLAGS"] = " ".join(flags)
    env[VARIABLE] = "default"
    return env
