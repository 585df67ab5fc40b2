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
import contextlib
import os
import shlex
import sys
import warnings
from collections.abc import Sequence

from jax_attention import __version__
# The command families register their commands when imported, in this order (``--help``'s).

from jax_attention.runtime import interrupts
from jax_attention.cli import train, plot, translate, conformance, bench, data  # noqa: F401, I001
from jax_attention.cli.arguments import (EXIT_BUSY, EXIT_INTERRUPTED, EXIT_NONFINITE,
                                         EXIT_WRITE_FAILED, LONG_RUNS_EPILOG, PROG,
                                         add_device_arguments, add_long_run_arguments,
                                         add_output_arguments, check_output_arguments,
                                         dropout_rate, int_at_least, positive_float,
                                         positive_int)
from jax_attention.cli.bench import (run_bench_attention, run_bench_decode, run_bench_memory,
                                     run_bench_profile, run_bench_train)
from jax_attention.cli.conformance import run_conformance_command
from jax_attention.cli.data import run_data
from jax_attention.cli.plot import run_plot_attention, run_plot_positional_encoding
from jax_attention.cli.registry import Configure, children, register, register_group
from jax_attention.cli.train import (run_train_bahdanau, run_train_kernel_regression,
                                     run_train_transformer)
from jax_attention.cli.translate import run_translate

__all__ = ["main", "build_parser", "register", "register_group", "int_at_least", "positive_int",
           "positive_float", "dropout_rate", "add_output_arguments", "check_output_arguments",
           "add_long_run_arguments", "add_device_arguments", "EXIT_NONFINITE",
           "EXIT_INTERRUPTED", "EXIT_WRITE_FAILED", "EXIT_BUSY", "LONG_RUNS_EPILOG", "PROG",
           "Configure",
           "run_train_kernel_regression", "run_train_bahdanau", "run_train_transformer",
           "run_translate", "run_plot_positional_encoding", "run_plot_attention",
           "run_conformance_command", "run_data", "run_bench_attention", "run_bench_memory",
           "run_bench_train", "run_bench_decode", "run_bench_profile"]



class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose errors after parsing are one line.

    A mistake in the command line itself gets argparse's usage and the error (status 2); a
    problem a handler finds in a parsed argument (a path that cannot be written, a checkpoint
    that does not fit) is the one line ``PROG COMMAND: error: ...`` (status 2): the usage of a
    command with forty options would bury it.
    """

    parsed = False

    def error(self, message: str):
        if not self.parsed:
            super().error(message)
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    """The full ``jax-attention`` parser, built from the registered commands."""
    parser = _Parser(
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
    Ctrl-C is handled by :func:`jax_attention.runtime.interrupts.handle_sigint` while the command runs:
    a training command stops at its next safe point (status 130, one line saying what was kept
    and how to resume), any other command at once. Warnings are printed as one line each
    (``jax-attention: warning: ...``).
    """
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:  # a group registered before any of its commands
        args.command_parser.error("this command has no subcommands yet")
    args.command_parser.parsed = True
    acknowledge = getattr(args, "graceful_interrupt", None)
    resume = getattr(args, "resume_argument", None)
    resume_command = None
    if resume is not None:
        resume_command = shlex.join([PROG, *argv, *([] if resume in argv else [resume])])
    try:
        with interrupts.handle_sigint(
                PROG, graceful=acknowledge is not None,
                acknowledgement=acknowledge(args) if acknowledge else "",
                resume_command=resume_command), _one_line_warnings():
            try:
                # Handlers report errors through their own subcommand's parser, for a precise
                # usage line.
                status = handler(args, args.command_parser)
                if interrupts.requested():
                    raise interrupts.Interrupted("interrupted (Ctrl-C) as the command ended; "
                                                 "it had finished, its outputs are written")
            except KeyboardInterrupt as stop:
                # A stop at a safe point (training: TrainingInterrupted), or Ctrl-C where the
                # handler is not installed (off the main thread). Said while the handler is in
                # force, so that a second Ctrl-C now cannot print a second, other line.
                interrupts.finish()
                line = str(stop) or "interrupted (Ctrl-C)"
                if getattr(stop, "checkpoint", None) is not None and resume_command is not None:
                    line += f"; resume with: {resume_command}"
                print(f"{PROG}: {line}", file=sys.stderr)
                status = EXIT_INTERRUPTED
        return status
    except BrokenPipeError:
        # Output piped into a reader that quit early (`| head`): not a failure of the command.
        # Point stdout at devnull so that the interpreter's final flush does not raise again
        # (the recipe of Python's `signal` documentation).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


@contextlib.contextmanager
def _one_line_warnings():
    """Warnings printed as ``jax-attention: warning: message`` on stderr while a command runs,
    not Python's two lines with a file name and a line of source. (The format is replaced, not
    ``warnings.showwarning``: code that records warnings still records them.)"""
    previous = warnings.formatwarning

    def one_line(message, category, filename, lineno, line=None):
        return f"{PROG}: warning: {str(message).replace(chr(10), ' ')}\n"

    warnings.formatwarning = one_line
    try:
        yield
    finally:
        warnings.formatwarning = previous
