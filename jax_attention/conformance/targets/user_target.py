"""``--against my_package.my_module`` or ``--against path/to/file.py``: your own implementations.

The module defines ``IMPLEMENTATIONS = {"<function>": callable}`` with function names from the
index (``"scoring.dot_product_attention"``, ...; see
:data:`~jax_attention.conformance.functions.FUNCTIONS`).
Each callable is called as ``callable(inputs, params, config)`` for every case of its function
and returns ``{output name: array-like}``; the contract is in :mod:`jax_attention.conformance`.
Functions of the index that the module leaves out, and names in ``IMPLEMENTATIONS`` the index
does not know, are reported as not covered.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import traceback
from collections.abc import Mapping
from pathlib import Path

from jax_attention.conformance.cases import Case
from jax_attention.conformance.functions import FUNCTIONS
from jax_attention.conformance.target import Implementation, Target, exit_call, one_line
from jax_attention.conformance.targets._common import jax_setup


def _where(error: BaseException) -> str:
    """``" (raised at FILE, line N)"``: the innermost frame of ``error``'s traceback, if any."""
    frames = traceback.extract_tb(error.__traceback__)
    return f" (raised at {frames[-1].filename}, line {frames[-1].lineno})" if frames else ""


def _load_error(against: str, error: BaseException) -> ValueError:
    """The one-line ``ValueError`` for a module that could not be loaded."""
    if isinstance(error, SystemExit):
        what = f"it {exit_call(error)} while being imported"
    elif isinstance(error, SyntaxError):  # IndentationError, TabError too
        what = (f"{error.filename or against}, line {error.lineno}: {type(error).__name__}: "
                f"{one_line(error.msg)}")
    else:
        what = f"{type(error).__name__}: {one_line(error)}{_where(error)}"
    return ValueError(f"cannot load {against}: {what}")


def _import(against: str):
    """The module named by a dotted name, or loaded from a ``.py`` file.

    Raises:
      ValueError: no such file or module, or the module failed while being imported — a syntax
        error (with the file and line), an exception (its type and message) or ``sys.exit``.
      KeyboardInterrupt: raised by the module's code (Ctrl-C, or the module itself): passed on,
        never reported as the module's failure.
    """
    path = Path(against)
    if against.endswith(".py") or path.is_file():
        if not path.is_file():
            raise ValueError(f"no such file: {against}")
        name = f"_conformance_user_{path.stem}"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses and pickling look modules up by name
        try:
            spec.loader.exec_module(module)
        except BaseException as error:
            del sys.modules[name]
            if isinstance(error, (KeyboardInterrupt, GeneratorExit)):
                raise
            raise _load_error(against, error) from None
        return module, path.stem
    try:
        return importlib.import_module(against), against
    except ModuleNotFoundError as error:
        if error.name is not None and not (against == error.name
                                           or against.startswith(error.name + ".")):
            # The module was found; something it imports was not.
            raise _load_error(against, error) from None
        raise ValueError(f"cannot import {against!r} ({error}); --against takes numpy, jax, "
                         "flax, torch, an importable module or a .py file") from None
    except (KeyboardInterrupt, GeneratorExit):
        raise
    except BaseException as error:
        raise _load_error(against, error) from None


def _wrap(prefix: str, implementation) -> Implementation:
    def run(case: Case, inputs: dict, params: dict):
        return implementation(inputs, params, dict(case.config))

    name = getattr(implementation, "__qualname__", None) or type(implementation).__name__
    return Implementation(f"{prefix}.{name}", run)


def make_user_target(against: str, dtype: str, platform: str | None, precision: str) -> Target:
    """The target of a user module (a dotted name or a ``.py`` path) and its
    ``IMPLEMENTATIONS``.

    A callable may raise ``NotImplementedError("why")`` for a case it cannot express: the runner
    reports that row n/a with the message (any other exception fails the row).

    Raises:
      ValueError: the module cannot be loaded, or defines no ``IMPLEMENTATIONS`` mapping of
        callables.
    """
    module, label = _import(against)
    given = getattr(module, "IMPLEMENTATIONS", None)
    if not isinstance(given, Mapping):
        raise ValueError(f"{label} must define IMPLEMENTATIONS = {{'<function>': callable}} "
                         f"(functions: {', '.join(FUNCTIONS)}); got "
                         f"{type(given).__name__ if given is not None else 'nothing'}")
    not_callable = [name for name, value in given.items() if not callable(value)]
    if not_callable:
        raise ValueError(f"IMPLEMENTATIONS of {label}: {not_callable} are not callable")
    # Your code may use JAX: it runs on the chosen platform, with x64 on for float64 and the
    # chosen matmul precision, as our JAX targets do.
    _, context, environment = jax_setup(dtype, platform, precision)
    return Target(
        label, f"IMPLEMENTATIONS of {label} "
               f"({len(given)} function{'' if len(given) == 1 else 's'})",
        {name: [_wrap(label, value)] for name, value in given.items() if name in FUNCTIONS},
        {"module": getattr(module, "__file__", None) or label, **environment}, context,
        check_dtype=False, unknown=[name for name in given if name not in FUNCTIONS])
