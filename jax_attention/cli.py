"""The ``jax-attention`` command: train the chapter's models, plot, benchmark, check conformance.

Subcommands are registered under a space-separated path: :func:`register_group` for a word that
only groups others (``train``, later ``plot``), :func:`register` for a command that runs. A later
command needs only a new registration, for example::

    @register("train bahdanau", help="seq2seq with Bahdanau attention — d2l §11.4")
    def _train_bahdanau(parser):
        parser.add_argument("--epochs", type=positive_int, default=30)
        add_output_arguments(parser)
        parser.set_defaults(handler=run_train_bahdanau)

    register_group("plot", help="draw the chapter's figures")

    @register("plot masks", help="...")
    ...

A handler takes ``(args, parser)`` — ``parser`` being its own subcommand's — and returns the exit
status; bad user input goes through ``parser.error`` (exit status 2). The training and plotting
modules are imported inside the handlers, so building the parser does not load Matplotlib or
compile anything.

Also runnable as ``python -m jax_attention``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["main", "build_parser", "register", "register_group", "int_at_least", "positive_int",
           "positive_float", "add_output_arguments"]

PROG = "jax-attention"

Configure = Callable[[argparse.ArgumentParser], None]


@dataclass(frozen=True)
class _Command:
    help: str
    configure: Configure | None = None  # None for a pure group such as "train"
    description: str | None = None


# Path ("train", "train kernel-regression", ...) -> command, in registration order.
_COMMANDS: dict[tuple[str, ...], _Command] = {}


def register(path: str, *, help: str, description: str | None = None):
    """Decorator registering ``configure(parser)`` as the subcommand ``path`` (e.g. ``"plot masks"``).

    ``configure`` adds the arguments and ``parser.set_defaults(handler=...)``. Every prefix of
    ``path`` must already be registered as a group (see :func:`register_group`).
    """
    words = tuple(path.split())
    if not words:
        raise ValueError(f"path must name a command, got {path!r}")
    if words[:-1] and words[:-1] not in _COMMANDS:
        raise ValueError(f"register the group {' '.join(words[:-1])!r} before {path!r}")
    if words in _COMMANDS:
        raise ValueError(f"the command {path!r} is already registered")

    def decorator(configure: Configure) -> Configure:
        _COMMANDS[words] = _Command(help=help, configure=configure, description=description)
        return configure

    return decorator


def register_group(path: str, *, help: str, description: str | None = None) -> None:
    """Register a command group (``"train"``, ``"plot"``): a word whose subcommands follow it."""
    words = tuple(path.split())
    if words in _COMMANDS:
        raise ValueError(f"the command {path!r} is already registered")
    _COMMANDS[words] = _Command(help=help, description=description)


def build_parser() -> argparse.ArgumentParser:
    """The full ``jax-attention`` parser, built from the registered commands."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="The attention mechanisms of Dive into Deep Learning (d2l.ai, chapter 11) in "
                    "JAX/Flax NNX, with a NumPy reference that proves them right.",
        epilog=f"Run '{PROG} COMMAND --help' for the options of a command.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    _add_children(parser, ())
    return parser


def _add_children(parser: argparse.ArgumentParser, prefix: tuple[str, ...]) -> None:
    children = [(words, command) for words, command in _COMMANDS.items()
                if len(words) == len(prefix) + 1 and words[:-1] == prefix]
    if not children:
        return
    subparsers = parser.add_subparsers(
        title="commands", metavar="COMMAND", dest="command_" + "_".join(prefix), required=True
    )
    for words, command in children:
        child = subparsers.add_parser(
            words[-1], help=command.help, description=command.description or command.help,
        )
        if command.configure is not None:
            command.configure(child)
        # The deepest parser's default wins, so the handler gets the parser of its own command.
        child.set_defaults(command_parser=child)
        _add_children(child, words)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("jax-attention")
    except PackageNotFoundError:
        return "unknown"


# --------------------------------------------------------------------------- argument types


def int_at_least(minimum: int) -> Callable[[str], int]:
    """argparse type: an integer >= ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {value}")
        return value

    return parse


positive_int = int_at_least(1)


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text!r}")
    return value


def add_output_arguments(parser: argparse.ArgumentParser) -> None:
    """``--out DIR``, ``--json FILE`` and ``--no-progress``, shared by every long-running command."""
    parser.add_argument("--out", metavar="DIR", type=Path, default=None,
                        help="write the plots (PNG) into DIR (created if missing)")
    parser.add_argument("--json", metavar="FILE", type=Path, default=None,
                        help="write the run's figures (losses, parameters, metrics, versions) "
                             "to FILE as JSON")
    parser.add_argument("--no-progress", dest="progress", action="store_false",
                        help="do not show a progress bar")


def _check_output_arguments(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Fail before the work starts, not after, when an output path cannot be used."""
    if args.out is not None and args.out.exists() and not args.out.is_dir():
        parser.error(f"argument --out: {str(args.out)!r} exists and is not a directory")
    if args.json is not None and args.json.is_dir():
        parser.error(f"argument --json: {str(args.json)!r} is a directory, expected a file path")


def _environment() -> dict:
    """Versions and backend, so that a JSON result says what produced it."""
    import flax
    import jax
    import optax

    return {
        "jax": jax.__version__,
        "flax": flax.__version__,
        "optax": optax.__version__,
        "backend": jax.default_backend(),
        "devices": [str(device) for device in jax.devices()],
    }


def _write_json(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n")


# --------------------------------------------------------------------------- train

register_group("train", help="train a model of the chapter and report its figures")


@register("train kernel-regression",
          help="Nadaraya–Watson regression with a learnable kernel width (d2l §11.2.3)",
          description="Train Nadaraya–Watson kernel regression with a learnable inverse width w, "
                      "as in d2l §11.2.3: leave-one-out keys and values, summed squared error, "
                      "full-batch SGD. Prints the loss of each epoch, the learned w and the test "
                      "MSE of average pooling, the Gaussian kernel (w = 1) and the learned kernel.")
def _train_kernel_regression(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--epochs", metavar="N", type=positive_int, default=5,
                        help="full-batch SGD steps (default: %(default)s, as the book)")
    parser.add_argument("--seed", metavar="N", type=int_at_least(0), default=0,
                        help="seeds the data and the initial w; the same seed gives the same "
                             "losses bit for bit on CPU (default: %(default)s)")
    parser.add_argument("--lr", metavar="LR", type=positive_float, default=0.5,
                        help="learning rate (default: %(default)s)")
    parser.add_argument("--n-train", metavar="N", type=int_at_least(2), default=50,
                        help="number of training points (default: %(default)s)")
    add_output_arguments(parser)
    parser.set_defaults(handler=run_train_kernel_regression)


def run_train_kernel_regression(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Handler of ``train kernel-regression``; see its ``--help``."""
    _check_output_arguments(args, parser)
    from jax_attention.train import train_kernel_regression

    result = train_kernel_regression(seed=args.seed, epochs=args.epochs, lr=args.lr,
                                     n_train=args.n_train, progress=args.progress)
    mse = result.test_mse
    print(f"learned w = {result.w:.6f} (initial {result.w_init:.6f})")
    print("test MSE:")
    print(f"  average pooling         {mse['average_pooling']:.6f}")
    print(f"  Gaussian kernel (w = 1) {mse['gaussian_kernel']:.6f}")
    print(f"  learned kernel          {mse['learned_kernel']:.6f}")
    print(f"wall time {result.wall_time_s:.2f} s")

    plots = {}
    if args.out is not None:
        from jax_attention.plotting import plot_kernel_regression, show_heatmaps

        data = result.data
        plots["fit"] = args.out / "kernel_regression_fit.png"
        plot_kernel_regression(data["x_train"], data["y_train"], data["x_test"], data["y_truth"],
                               result.y_hat, path=plots["fit"],
                               title=f"learned kernel, w = {result.w:.2f}")
        plots["attention"] = args.out / "kernel_regression_attention.png"
        show_heatmaps(result.weights[None, None], xlabel="Sorted training inputs",
                      ylabel="Sorted testing inputs", path=plots["attention"])
        for path in plots.values():
            print(f"wrote {path}")
    if args.json is not None:
        record = {"command": "train kernel-regression", **result.figures(), **_environment(),
                  "plots": {name: str(path) for name, path in plots.items()}}
        _write_json(args.json, record)
        print(f"wrote {args.json}")
    return 0


# --------------------------------------------------------------------------- entry point


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
