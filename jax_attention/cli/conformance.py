"""``jax-attention conformance``: an implementation against the canonical cases."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from jax_attention.cli.arguments import EXIT_INTERRUPTED, check_json_argument, write_json_report
from jax_attention.cli.registry import register

__all__ = ["run_conformance_command"]


@register("conformance",
          help="check an implementation against the canonical cases (float64 NumPy reference)",
          description="Run every canonical case — inputs, parameters and the float64 outputs of "
                      "reference_numpy, stored in jax_attention/conformance/cases.npz — against "
                      "an implementation and print one row per case: max absolute and relative "
                      "error, the tolerance, PASS, FAIL or n/a (a known difference of a "
                      "built-in, or a case it cannot express, with the reason). --against numpy "
                      "recomputes the reference, "
                      "jax runs our functional core and jax.nn, flax Flax's built-ins and our "
                      "NNX modules, torch PyTorch's built-ins and the book's PyTorch code; a "
                      "module name or .py file defining IMPLEMENTATIONS = {'<function>': "
                      "callable} checks your own (see docs/conformance.md, 'Check your own "
                      "implementation'). Exits with status 1 when a row fails.")
def _conformance(parser: argparse.ArgumentParser) -> None:
    parser.epilog = (
        "Exit status: 0 every checked row passed; 1 the check ran and a row failed, or no case "
        "was checked (a function of your module that calls sys.exit fails its rows, and stderr "
        "names it); 2 a usage error, including a module that cannot be loaded (a syntax error, "
        "an exception or sys.exit while it is imported: one line with the file and line, or "
        "the exception) and a --cases file that is not a case file (never unpickled); "
        f"{EXIT_INTERRUPTED} interrupted (Ctrl-C, or KeyboardInterrupt raised by your code).")
    parser.add_argument("--against", metavar="TARGET", default=None,
                        help="numpy, jax, flax, torch, or your module (a.dotted.name or "
                             "path/to/file.py) defining IMPLEMENTATIONS")
    parser.add_argument("--dtype", choices=("float64", "float32"), default="float64",
                        help="cast the cases' floats to this dtype; float64 switches JAX's x64 "
                             "mode on (default: %(default)s)")
    parser.add_argument("--platform", choices=("cpu", "gpu", "tpu"), default=None,
                        help="JAX platform of the jax, flax and user targets (default: JAX's "
                             "default backend)")
    parser.add_argument("--precision", choices=("highest", "high", "default"), default="highest",
                        help="JAX's default matmul precision during the run (default: "
                             "%(default)s; 'default' lets GPUs use TF32 for float32)")
    parser.add_argument("--cases", metavar="PATH", type=Path, default=None,
                        help="the case file to read, or with --regenerate to write (default: "
                             "the one shipped in the package)")
    parser.add_argument("--only", metavar="TEXT", default=None,
                        help="run only the cases whose name or function contains TEXT")
    parser.add_argument("--json", metavar="FILE", type=Path, default=None,
                        help="write every row, the summary and the environment to FILE as JSON")
    parser.add_argument("--regenerate", action="store_true",
                        help="rebuild the cases from reference_numpy (fixed seeds) and write "
                             "them to --cases, instead of running them")
    parser.set_defaults(handler=run_conformance_command)


def run_conformance_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Handler of ``conformance``; see its ``--help``."""
    check_json_argument(args, parser)
    if args.regenerate:
        if args.against is not None:
            parser.error("argument --regenerate: writes the cases and runs nothing; drop "
                         f"--against {args.against}")
        from jax_attention.conformance import DEFAULT_CASES_PATH, generate_cases, save_cases

        cases = generate_cases()
        path = save_cases(args.cases if args.cases is not None else DEFAULT_CASES_PATH, cases)
        print(f"wrote {len(cases)} cases to {path} ({path.stat().st_size / 1024:.0f} KiB)")
        return 0
    if args.against is None:
        parser.error("argument --against: required (numpy, jax, flax, torch, or your module "
                     "defining IMPLEMENTATIONS), unless --regenerate")
    if args.cases is not None and not args.cases.is_file():
        parser.error(f"argument --cases: no such file: {str(args.cases)!r}")
    from jax_attention.conformance import CaseFileError, run_conformance

    try:
        report = run_conformance(args.against, dtype=args.dtype, platform=args.platform,
                                 precision=args.precision, cases_path=args.cases, only=args.only)
    except KeyboardInterrupt as stop:  # Ctrl-C, or raised by the user's code: not a failure
        print(f"{parser.prog}: {str(stop) or 'interrupted (KeyboardInterrupt)'}; no report",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    except CaseFileError as error:
        parser.error(f"--cases {error.path} is not a conformance case file ({error.reason})"
                     if args.cases is not None else str(error))
    except (ValueError, RuntimeError) as error:  # unusable --against, --platform or --cases
        parser.error(str(error))
    print(report.format())
    if args.json is not None:
        write_json_report(args.json, report.to_dict())
    if report.exit_calls:
        # The table has the rows; stderr says, once, that the module tried to end the process.
        print(f"{parser.prog}: error: {report.target}: {'; '.join(report.exit_calls)}; those "
              f"rows failed (a function of IMPLEMENTATIONS must return its outputs, not end the "
              f"process)", file=sys.stderr)
    return 1 if report.failed else 0
