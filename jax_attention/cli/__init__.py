"""The ``jax-attention`` command: train the chapter's models, plot, benchmark, check conformance.

Subcommands are registered under a space-separated path (:mod:`jax_attention.cli.registry`):
:func:`register_group` for a word that only groups others (``train``, ``plot``, ``bench``),
:func:`register` for a command that runs. Each command family is a module of this package that
registers its commands when imported — :mod:`~jax_attention.cli.train`,
:mod:`~jax_attention.cli.plot`, :mod:`~jax_attention.cli.translate`,
:mod:`~jax_attention.cli.conformance`, :mod:`~jax_attention.cli.bench` — and the arguments they
share are in :mod:`jax_attention.cli.arguments`. A later command needs only a new registration,
for example::

    @register("plot masks", help="...")
    def _plot_masks(parser):
        parser.add_argument("--num-steps", type=positive_int, default=10)
        add_output_arguments(parser)
        parser.set_defaults(handler=run_plot_masks)

A handler takes ``(args, parser)`` — ``parser`` being its own subcommand's — and returns the
exit status; bad user input goes through ``parser.error`` (exit status 2). The training and
plotting modules are imported inside the handlers, so building the parser does not load
Matplotlib or compile anything.

Also runnable as ``python -m jax_attention``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from jax_attention import __version__
# The command families register their commands when imported, in this order (``--help``'s).
from jax_attention.cli import train, plot, translate, conformance, bench  # noqa: F401, I001
from jax_attention.cli.arguments import (EXIT_INTERRUPTED, EXIT_NONFINITE, LONG_RUNS_EPILOG,
                                         add_device_arguments, add_long_run_arguments,
                                         add_output_arguments, check_output_arguments,
                                         dropout_rate, int_at_least, positive_float,
                                         positive_int)
from jax_attention.cli.bench import (run_bench_attention, run_bench_decode, run_bench_memory,
                                     run_bench_train)
from jax_attention.cli.conformance import run_conformance_command
from jax_attention.cli.plot import run_plot_attention, run_plot_positional_encoding
from jax_attention.cli.registry import Configure, children, register, register_group
from jax_attention.cli.train import (run_train_bahdanau, run_train_kernel_regression,
                                     run_train_transformer)
from jax_attention.cli.translate import run_translate

__all__ = ["main", "build_parser", "register", "register_group", "int_at_least", "positive_int",
           "positive_float", "dropout_rate", "add_output_arguments", "check_output_arguments",
           "add_long_run_arguments", "add_device_arguments", "EXIT_NONFINITE",
           "EXIT_INTERRUPTED", "LONG_RUNS_EPILOG", "PROG", "Configure",
           "run_train_kernel_regression", "run_train_bahdanau", "run_train_transformer",
           "run_translate", "run_plot_positional_encoding", "run_plot_attention",
           "run_conformance_command", "run_bench_attention", "run_bench_memory",
           "run_bench_train", "run_bench_decode"]

PROG = "jax-attention"


def build_parser() -> argparse.ArgumentParser:
    """The full ``jax-attention`` parser, built from the registered commands."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="The attention mechanisms of Dive into Deep Learning (d2l.ai, chapter 11) in "
                    "JAX/Flax NNX, with a NumPy reference that proves them right.",
        epilog=f"Run '{PROG} COMMAND --help' for the options of a command.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    _add_children(parser, ())
    return parser


def _add_children(parser: argparse.ArgumentParser, prefix: tuple[str, ...]) -> None:
    commands = children(prefix)
    if not commands:
        return
    subparsers = parser.add_subparsers(
        title="commands", metavar="COMMAND", dest="command_" + "_".join(prefix), required=True
    )
    for words, command in commands:
        child = subparsers.add_parser(
            words[-1], help=command.help, description=command.description or command.help,
        )
        if command.configure is not None:
            command.configure(child)
        # The deepest parser's default wins, so the handler gets the parser of its own command.
        child.set_defaults(command_parser=child)
        _add_children(child, words)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command in ``argv`` (default ``sys.argv[1:]``); returns the exit status.

    ``--help`` and argument errors raise ``SystemExit`` (status 0 and 2) as argparse does.
    """
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else list(argv))
    handler = getattr(args, "handler", None)
    if handler is None:  # a group registered before any of its commands
        args.command_parser.error("this command has no subcommands yet")
    try:
        # Handlers report errors through their own subcommand's parser, for a precise usage line.
        return handler(args, args.command_parser)
    except BrokenPipeError:
        # Output piped into a reader that quit early (`| head`): not a failure of the command.
        # Point stdout at devnull so that the interpreter's final flush does not raise again
        # (the recipe of Python's `signal` documentation).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
