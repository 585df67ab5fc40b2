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


# --------------------------------------------------------------------------- plot

register_group("plot", help="draw the chapter's figures (PNG)")


def _add_plot_arguments(parser: argparse.ArgumentParser, seed_help: str) -> None:
    """``--out DIR`` (required), ``--json FILE`` and ``--seed``, shared by the ``plot`` commands."""
    parser.add_argument("--out", metavar="DIR", type=Path, required=True,
                        help="write the plots (PNG) into DIR (created if missing)")
    parser.add_argument("--json", metavar="FILE", type=Path, default=None,
                        help="write the paths written, the shapes and the seed to FILE as JSON")
    parser.add_argument("--seed", metavar="N", type=int_at_least(0), default=0, help=seed_help)


def _finish_plot(args: argparse.Namespace, command: str, plots: dict[str, Path], record: dict) -> int:
    for path in plots.values():
        print(f"wrote {path}")
    if args.json is not None:
        _write_json(args.json, {"command": command, "seed": args.seed, **record, **_environment(),
                                "plots": {name: str(path) for name, path in plots.items()}})
        print(f"wrote {args.json}")
    return 0


@register("plot positional-encoding",
          help="the sinusoidal position table: some columns over the positions, and its heatmap "
               "(d2l §11.6.3)",
          description="Draw the book's two figures of the sinusoidal positional encoding "
                      "(d2l §11.6.3): columns 6 to 9 of the table over 60 positions with encoding "
                      "dimension 32, and the whole table as a heatmap (encoding dimension across, "
                      "position down). Writes positional_encoding_columns.png and "
                      "positional_encoding_heatmap.png into --out.")
def _plot_positional_encoding(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--num-steps", metavar="T", type=positive_int, default=60,
                        help="positions, the rows of the table (default: %(default)s)")
    parser.add_argument("--encoding-dim", metavar="D", type=positive_int, default=32,
                        help="encoding dimension, the columns of the table (default: %(default)s)")
    parser.add_argument("--columns", metavar="C", type=int_at_least(0), nargs="+", default=[6, 7, 8, 9],
                        help="the columns drawn in the first figure (default: 6 7 8 9)")
    _add_plot_arguments(parser, "recorded in the JSON only: the table is deterministic "
                                "(default: %(default)s)")
    parser.set_defaults(handler=run_plot_positional_encoding)


def run_plot_positional_encoding(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Handler of ``plot positional-encoding``; see its ``--help``."""
    _check_output_arguments(args, parser)
    bad = [c for c in args.columns if c >= args.encoding_dim]
    if bad:
        parser.error(f"argument --columns: columns must be < --encoding-dim = {args.encoding_dim}, "
                     f"got {bad}")
    from jax_attention.plotting import plot_positional_columns, plot_positional_heatmap
    from jax_attention.positional import positional_encoding

    P = positional_encoding(args.num_steps, args.encoding_dim)
    plots = {"columns": args.out / "positional_encoding_columns.png",
             "heatmap": args.out / "positional_encoding_heatmap.png"}
    plot_positional_columns(P, args.columns, path=plots["columns"])
    plot_positional_heatmap(P, path=plots["heatmap"])
    record = {"num_steps": args.num_steps, "encoding_dim": args.encoding_dim,
              "columns": args.columns, "shapes": {"P": list(P.shape)}}
    return _finish_plot(args, "plot positional-encoding", plots, record)


@register("plot attention",
          help="per-head attention weights of a multi-head self-attention on a sample batch "
               "(d2l §11.5, §11.6)",
          description="Build a multi-head attention with random (Xavier) weights, run it as "
                      "self-attention on a random batch X of shape (batch, queries, num-hiddens) "
                      "with the given valid lengths, and draw the weights of every head: one row "
                      "of heatmaps per example of the batch, one column per head. The defaults are "
                      "the book's example (d2l §11.5.3 and §11.6.1): 100 hiddens, 5 heads, a batch "
                      "of 2 with 4 tokens and valid lengths 3 and 2. Writes "
                      "multihead_attention.png into --out.")
def _plot_attention(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--num-hiddens", metavar="D", type=positive_int, default=100,
                        help="model width D (default: %(default)s)")
    parser.add_argument("--num-heads", metavar="N", type=positive_int, default=5,
                        help="heads; must divide --num-hiddens (default: %(default)s)")
    parser.add_argument("--batch-size", metavar="B", type=positive_int, default=2,
                        help="examples in the batch (default: %(default)s)")
    parser.add_argument("--num-queries", metavar="T", type=positive_int, default=4,
                        help="tokens per example (default: %(default)s)")
    parser.add_argument("--valid-lens", metavar="L", type=int_at_least(0), nargs="+", default=[3, 2],
                        help="valid length of each example, or one for all, each <= --num-queries "
                             "(default: 3 2)")
    _add_plot_arguments(parser, "seeds the batch X and the initial weights (default: %(default)s)")
    parser.set_defaults(handler=run_plot_attention)


def run_plot_attention(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Handler of ``plot attention``; see its ``--help``."""
    _check_output_arguments(args, parser)
    if args.num_hiddens % args.num_heads:
        parser.error(f"argument --num-heads: must divide --num-hiddens = {args.num_hiddens}, "
                     f"got {args.num_heads}")
    valid_lens = args.valid_lens
    if len(valid_lens) == 1:
        valid_lens = valid_lens * args.batch_size
    if len(valid_lens) != args.batch_size:
        parser.error(f"argument --valid-lens: expected one length or --batch-size = {args.batch_size} "
                     f"lengths, got {len(valid_lens)}: {args.valid_lens}")
    if max(valid_lens) > args.num_queries:
        parser.error(f"argument --valid-lens: lengths must be <= --num-queries = {args.num_queries}, "
                     f"got {args.valid_lens}")
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from jax_attention.multihead import MultiHeadAttention
    from jax_attention.plotting import show_heatmaps

    shape = (args.batch_size, args.num_queries, args.num_hiddens)
    X = jnp.asarray(np.random.default_rng(args.seed).normal(size=shape), jnp.float32)
    model = MultiHeadAttention(args.num_hiddens, args.num_heads, 0.5, sow_weights=True,
                               rngs=nnx.Rngs(args.seed))
    model.eval()  # the weights are sown before dropout; eval keeps the output deterministic too
    output, intermediates = nnx.capture(model, nnx.Intermediate)(
        X, X, X, jnp.asarray(valid_lens, jnp.int32))
    (weights,) = intermediates["attention"]["attention_weights"].get_value()  # (B, N, T, S)
    plots = {"attention": args.out / "multihead_attention.png"}
    show_heatmaps(weights, xlabel="Key positions", ylabel="Query positions",
                  titles=[f"Head {n}" for n in range(1, args.num_heads + 1)], figsize=(2, 2),
                  path=plots["attention"])
    record = {"num_hiddens": args.num_hiddens, "num_heads": args.num_heads,
              "batch_size": args.batch_size, "num_queries": args.num_queries,
              "valid_lens": valid_lens,
              "shapes": {"X": list(X.shape), "output": list(output.shape),
                         "weights": list(weights.shape)}}
    return _finish_plot(args, "plot attention", plots, record)


# --------------------------------------------------------------------------- Bahdanau: train, translate


def _dropout_rate(text: str) -> float:
    """argparse type: a number ``0 <= p < 1``."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text!r}") from None
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text!r}")
    return value


def _check_checkpoint_argument(path: Path, parser: argparse.ArgumentParser) -> None:
    """Fail before training, not after, when the checkpoint cannot be written there."""
    if path.exists() and not path.is_dir():
        parser.error(f"argument --checkpoint: {str(path)!r} exists and is not a directory")
    if path.is_dir() and any(path.iterdir()) and not (path / "config.json").is_file():
        parser.error(f"argument --checkpoint: {str(path)!r} is a non-empty directory that holds "
                     "no checkpoint; choose another")


# Exit statuses of the train commands besides 0 (done) and argparse's 2 (bad usage, a checkpoint
# that cannot be resumed): see the epilog of _add_long_run_arguments.
EXIT_NONFINITE = 3
EXIT_INTERRUPTED = 130  # 128 + SIGINT: what a shell reports for a program stopped by Ctrl-C

_LONG_RUNS_EPILOG = (
    "Long runs: with --checkpoint-dir DIR, training checkpoints (parameters, optimizer state, "
    "dropout stream, step, data position and loss history; Orbax, written atomically) are saved "
    "every --checkpoint-every steps (default: every epoch), at the end and on Ctrl-C; the newest "
    "--keep are kept. --resume continues the run from the newest readable one (a damaged one is "
    "reported, moved aside and the one before it used) and returns what the uninterrupted run "
    "would have, bit for bit on CPU; a checkpoint of another configuration is refused (only "
    "--epochs may grow). A NaN or Inf loss, gradient or update stops training (no checkpoint of "
    "that state is written) unless --skip-nonfinite skips the step. Exit status: 0 done, 2 bad "
    f"arguments or a checkpoint that cannot be resumed, {EXIT_NONFINITE} stopped on a non-finite "
    f"step, {EXIT_INTERRUPTED} interrupted by Ctrl-C (SIGINT; checkpoint saved with "
    "--checkpoint-dir).")


def _add_long_run_arguments(parser: argparse.ArgumentParser) -> None:
    """``--checkpoint-dir``, ``--checkpoint-every``, ``--keep``, ``--resume``, ``--skip-nonfinite``:
    training checkpoints, resumption and non-finite steps, shared by the seq2seq train commands."""
    from jax_attention.checkpointing import DEFAULT_KEEP

    group = parser.add_argument_group(
        "long runs", "training checkpoints, resumption, Ctrl-C and non-finite steps")
    group.add_argument("--checkpoint-dir", metavar="DIR", type=Path, default=None,
                       help="write training checkpoints into DIR (one subdirectory per step); "
                            "not the trained model of --checkpoint")
    group.add_argument("--checkpoint-every", metavar="N", type=positive_int, default=None,
                       help="save a training checkpoint every N steps (batches), counted over "
                            "the run (default: at the end of every epoch); needs "
                            "--checkpoint-dir")
    group.add_argument("--keep", metavar="K", type=positive_int, default=DEFAULT_KEEP,
                       help="keep the newest K training checkpoints (default: %(default)s)")
    group.add_argument("--resume", action="store_true",
                       help="continue from the newest readable training checkpoint in "
                            "--checkpoint-dir (start afresh when there is none); the settings "
                            "must be the run's own, --epochs may grow")
    group.add_argument("--skip-nonfinite", action="store_true",
                       help="skip a step whose loss, gradient or update is NaN or Inf (and count "
                            "it) instead of stopping with exit status "
                            f"{EXIT_NONFINITE}")
    parser.epilog = _LONG_RUNS_EPILOG


def _add_device_arguments(parser: argparse.ArgumentParser, *, tensor_parallel: bool) -> None:
    """``--devices`` (and ``--model-parallel``): the device mesh of a train command."""
    group = parser.add_argument_group(
        "devices", "data parallelism over devices and processes (jax.sharding); a multi-process "
                   "run starts when JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and "
                   "JAX_PROCESS_ID are set (see the README, 'Many devices and hosts')")
    group.add_argument("--devices", metavar="N", type=positive_int, default=None,
                       help="train on N devices: the state replicated, each batch split over "
                            "them; --batch-size must divide by N (default: every device JAX "
                            "sees)")
    if tensor_parallel:
        group.add_argument("--model-parallel", metavar="M", type=positive_int, default=1,
                           help="split each attention's heads and each FFN's width over M of "
                                "the devices (tensor parallelism; the mesh is N/M x M); "
                                "--num-heads and --ffn-num-hiddens must divide by M (default: "
                                "%(default)s)")


def _check_long_run_arguments(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Fail before training when the training-checkpoint arguments cannot work together."""
    if args.checkpoint_dir is None:
        if args.checkpoint_every is not None:
            parser.error("argument --checkpoint-every: needs --checkpoint-dir")
        if args.resume:
            parser.error("argument --resume: needs --checkpoint-dir")
        return
    if args.checkpoint_dir.exists() and not args.checkpoint_dir.is_dir():
        parser.error(f"argument --checkpoint-dir: {str(args.checkpoint_dir)!r} exists and is not "
                     "a directory")
    if args.checkpoint_dir.absolute() == args.checkpoint.absolute():
        parser.error("argument --checkpoint-dir: must differ from --checkpoint (the trained "
                     "model is written there)")


def _long_run_kwargs(args: argparse.Namespace) -> dict:
    """The long-run and device arguments as the train functions' keyword arguments."""
    devices = {"devices": args.devices}
    if hasattr(args, "model_parallel"):
        devices["model_parallel"] = args.model_parallel
    return {"checkpoint_dir": args.checkpoint_dir, "checkpoint_every": args.checkpoint_every,
            "keep": args.keep, "resume": args.resume, "skip_nonfinite": args.skip_nonfinite,
            **devices}


def _run_training(train: Callable, options: dict, parser: argparse.ArgumentParser):
    """``train(**options)`` -> ``(result, None)``, or ``(None, exit status)`` when it stopped.

    A non-finite step: its message on stderr, status 3. Ctrl-C: the message (where the
    checkpoint went, or that none was saved: no ``--checkpoint-dir``, or a Ctrl-C before or after
    the training steps) on stderr, status 130. A ``ValueError`` (e.g. a configuration that
    cannot resume the checkpoint), a directory of another run's checkpoints (``FileExistsError``)
    or no readable checkpoint (``FileNotFoundError``): a usage error, status 2.
    """
    from jax_attention.train import NonFiniteLossError, TrainingInterrupted

    try:
        return train(**options), None
    except NonFiniteLossError as error:
        print(f"{parser.prog}: error: {error}", file=sys.stderr)
        return None, EXIT_NONFINITE
    except TrainingInterrupted as stop:
        print(f"{parser.prog}: {stop}", file=sys.stderr)
        return None, EXIT_INTERRUPTED
    except KeyboardInterrupt:  # without --checkpoint-dir, or outside the training steps
        hint = ("" if options.get("checkpoint_dir") is not None
                else " (--checkpoint-dir DIR keeps training checkpoints)")
        print(f"{parser.prog}: interrupted (SIGINT); no checkpoint saved{hint}", file=sys.stderr)
        return None, EXIT_INTERRUPTED
    except (ValueError, FileExistsError, FileNotFoundError) as error:
        parser.error(str(error))


def _main_process() -> bool:
    from jax_attention.distributed import is_main_process

    return is_main_process()


def _print_long_run_summary(result) -> None:
    if result.resumed_from_step is not None:
        print(f"resumed from training checkpoint {result.resumed_from_step} in "
              f"{result.checkpoint_dir}")
    if result.skipped_steps:
        print(f"skipped {result.skipped_steps} step(s) with a non-finite loss, gradient or update")


def _attention_heatmap(translation, path: Path) -> None:
    """The book's heatmap of one translation's attention weights, with the tokens as tick labels:
    the source tokens read (keys) across, the predicted tokens and ``<eos>`` (queries) down."""
    from jax_attention.plotting import save_figure, show_heatmaps

    steps, keys = translation.weights.shape
    queries = translation.tokens + (["<eos>"] if translation.finished else [])
    fig = show_heatmaps(translation.weights[None, None], xlabel="Source tokens (keys)",
                        ylabel="Translation (queries)",
                        figsize=(max(2.5, 0.45 * keys + 1.2), max(2.5, 0.35 * steps + 1.2)))
    axes = fig.axes[0]
    axes.set_xticks(range(keys), labels=translation.source_tokens, rotation=90)
    axes.set_yticks(range(steps), labels=queries)
    save_figure(fig, path)


@register("train bahdanau",
          help="seq2seq with Bahdanau attention on English–French (d2l §11.4)",
          description="Train the book's seq2seq model with Bahdanau (additive) attention on the "
                      "first --num-examples English–French pairs (d2l §11.4.3): GRU encoder and "
                      "attention decoder, teacher forcing, masked cross-entropy, Adam with "
                      "gradients clipped to norm 1. The defaults are the book's. Prints the loss "
                      "and tokens/sec, translates the book's four sentences with their BLEU, and "
                      "writes a checkpoint that 'jax-attention translate' reads.")
def _train_bahdanau(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--embed-size", metavar="E", type=positive_int, default=32,
                        help="embedding size (default: %(default)s)")
    parser.add_argument("--num-hiddens", metavar="H", type=positive_int, default=32,
                        help="GRU and attention hidden size (default: %(default)s)")
    parser.add_argument("--num-layers", metavar="L", type=positive_int, default=2,
                        help="GRU layers in the encoder and the decoder (default: %(default)s)")
    parser.add_argument("--dropout", metavar="P", type=_dropout_rate, default=0.1,
                        help="dropout between GRU layers and on the attention weights "
                             "(default: %(default)s)")
    parser.add_argument("--batch-size", metavar="N", type=positive_int, default=64,
                        help="examples per batch (default: %(default)s)")
    parser.add_argument("--num-steps", metavar="T", type=positive_int, default=10,
                        help="tokens per sequence, padded or cut (default: %(default)s)")
    parser.add_argument("--lr", metavar="LR", type=positive_float, default=0.005,
                        help="Adam learning rate (default: %(default)s)")
    parser.add_argument("--epochs", metavar="N", type=positive_int, default=250,
                        help="passes over the data (default: %(default)s)")
    parser.add_argument("--num-examples", metavar="N", type=positive_int, default=600,
                        help="English–French pairs used (default: %(default)s)")
    parser.add_argument("--seed", metavar="N", type=int_at_least(0), default=0,
                        help="seeds the batch order, the parameters and dropout; the same seed "
                             "gives the same losses bit for bit on CPU (default: %(default)s)")
    parser.add_argument("--data", metavar="PATH", type=Path, default=None,
                        help="the English–French data: fra-eng.zip, a folder or fra.txt "
                             "(default: $JAX_ATTENTION_DATA, then ../shared/data/fra-eng.zip "
                             "beside the checkout, then the user cache)")
    parser.add_argument("--checkpoint", metavar="DIR", type=Path, default=Path("runs/bahdanau"),
                        help="write the trained model here (default: %(default)s)")
    parser.add_argument("--log-every", metavar="N", type=positive_int, default=10,
                        help="print the loss every N epochs (default: %(default)s)")
    add_output_arguments(parser)
    _add_long_run_arguments(parser)
    _add_device_arguments(parser, tensor_parallel=False)
    parser.set_defaults(handler=run_train_bahdanau)


def run_train_bahdanau(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Handler of ``train bahdanau``; see its ``--help``."""
    _check_output_arguments(args, parser)
    _check_checkpoint_argument(args.checkpoint, parser)
    _check_long_run_arguments(args, parser)
    from jax_attention.data import find_data
    from jax_attention.train import train_bahdanau

    try:
        find_data(args.data)  # before compiling anything: a missing file is a usage error
    except FileNotFoundError as error:
        parser.error(str(error))
    result, status = _run_training(train_bahdanau, dict(
        embed_size=args.embed_size, num_hiddens=args.num_hiddens, num_layers=args.num_layers,
        dropout=args.dropout, batch_size=args.batch_size, num_steps=args.num_steps, lr=args.lr,
        epochs=args.epochs, num_examples=args.num_examples, seed=args.seed, data=args.data,
        checkpoint=args.checkpoint, progress=args.progress, log_every=args.log_every,
        **_long_run_kwargs(args)), parser)
    if status is not None:
        return status
    if not _main_process():
        return 0  # process 0 of a multi-process run reports and writes the files
    environment = _environment()
    # The book's summary line: its loss is the cross-entropy per token divided by num_steps.
    print(f"loss {result.losses[-1]:.3f} (cross-entropy per token "
          f"{result.cross_entropy[-1]:.3f}), {result.tokens_per_sec[-1]:.1f} tokens/sec on "
          f"{environment['backend']}")
    for (reference, translation), score in zip(result.translations, result.bleu):
        print(f"{translation.source} => {translation.translation}, bleu {score:.3f}")
    _print_long_run_summary(result)
    print(f"wall time {result.wall_time_s:.2f} s")
    print(f"wrote checkpoint {result.checkpoint}")

    plots = {}
    if args.out is not None:
        from jax_attention.plotting import plot_curve

        plots["loss"] = args.out / "bahdanau_loss.png"
        plot_curve(result.losses, ylabel="loss", path=plots["loss"],
                   title="Bahdanau seq2seq, training loss")
        # The book's figure: the weights of the last sentence, keys cut to its source tokens.
        plots["attention"] = args.out / "bahdanau_attention.png"
        _attention_heatmap(result.translations[-1][1], plots["attention"])
        for path in plots.values():
            print(f"wrote {path}")
    if args.json is not None:
        record = {"command": "train bahdanau", **result.figures(), **environment,
                  "plots": {name: str(path) for name, path in plots.items()}}
        _write_json(args.json, record)
        print(f"wrote {args.json}")
    return 0


# --------------------------------------------------------------------------- Transformer: train


def _layer_head_heatmaps(weights, path: Path, *, xlabel: str, ylabel: str, xticks, yticks) -> None:
    """``(L, N, T, S)`` weights as a grid: one row per layer (block), one column per head."""
    from jax_attention.plotting import save_figure, show_heatmaps

    L, N, T, S = weights.shape
    fig = show_heatmaps(weights, xlabel=xlabel, ylabel=ylabel,
                        titles=[f"Head {n}" for n in range(1, N + 1)],
                        figsize=(max(2.0, 0.4 * S + 1.0), max(2.0, 0.35 * T + 1.0)))
    for layer, axes in enumerate(fig.axes[:L * N]):
        axes.set_xticks(range(S), labels=xticks, rotation=90)
        axes.set_yticks(range(T), labels=yticks)
        if axes.get_subplotspec().is_first_col():
            axes.set_ylabel(f"Layer {layer // N + 1}\n{ylabel}")
    save_figure(fig, path)


@register("train transformer",
          help="the Transformer encoder–decoder on English–French (d2l §11.7)",
          description="Train the book's Transformer (d2l §11.7.6) on the first --num-examples "
                      "English–French pairs: embeddings scaled by sqrt(D) plus sinusoidal "
                      "positions, multi-head self-attention, causal decoder self-attention, "
                      "encoder–decoder attention, position-wise FFN, add & norm; teacher "
                      "forcing, masked cross-entropy, Adam with gradients clipped to norm 1. "
                      "The defaults are the book's. Prints the loss and tokens/sec, translates "
                      "the book's four sentences with their BLEU, optionally scores held-out "
                      "pairs (--val-fraction), and writes a checkpoint that 'jax-attention "
                      "translate' reads.")
def _train_transformer(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--num-hiddens", metavar="D", type=positive_int, default=32,
                        help="model width (default: %(default)s)")
    parser.add_argument("--ffn-num-hiddens", metavar="F", type=positive_int, default=64,
                        help="hidden width of the position-wise FFN (default: %(default)s)")
    parser.add_argument("--num-heads", metavar="N", type=positive_int, default=4,
                        help="attention heads; must divide --num-hiddens (default: %(default)s)")
    parser.add_argument("--num-layers", metavar="L", type=positive_int, default=2,
                        help="encoder and decoder blocks (default: %(default)s)")
    parser.add_argument("--dropout", metavar="P", type=_dropout_rate, default=0.1,
                        help="dropout after the positional encoding, on the attention weights "
                             "and in add & norm (default: %(default)s)")
    parser.add_argument("--batch-size", metavar="N", type=positive_int, default=64,
                        help="examples per batch (default: %(default)s)")
    parser.add_argument("--num-steps", metavar="T", type=positive_int, default=10,
                        help="tokens per sequence, padded or cut (default: %(default)s)")
    parser.add_argument("--lr", metavar="LR", type=positive_float, default=0.005,
                        help="Adam learning rate (default: %(default)s)")
    parser.add_argument("--epochs", metavar="N", type=positive_int, default=200,
                        help="passes over the data (default: %(default)s)")
    parser.add_argument("--num-examples", metavar="N", type=positive_int, default=600,
                        help="English–French pairs used (default: %(default)s)")
    parser.add_argument("--val-fraction", metavar="P", type=_dropout_rate, default=0.0,
                        help="hold out this fraction of the pairs and report their corpus BLEU "
                             "(k = 4) and mean sentence BLEU, greedy decoding (default: "
                             "%(default)s)")
    parser.add_argument("--seed", metavar="N", type=int_at_least(0), default=0,
                        help="seeds the batch order, the parameters and dropout; the same seed "
                             "gives the same losses bit for bit on CPU (default: %(default)s)")
    parser.add_argument("--data", metavar="PATH", type=Path, default=None,
                        help="the English–French data: fra-eng.zip, a folder or fra.txt "
                             "(default: $JAX_ATTENTION_DATA, then ../shared/data/fra-eng.zip "
                             "beside the checkout, then the user cache)")
    parser.add_argument("--checkpoint", metavar="DIR", type=Path, default=Path("runs/transformer"),
                        help="write the trained model here (default: %(default)s)")
    parser.add_argument("--log-every", metavar="N", type=positive_int, default=10,
                        help="print the loss every N epochs (default: %(default)s)")
    add_output_arguments(parser)
    _add_long_run_arguments(parser)
    _add_device_arguments(parser, tensor_parallel=True)
    parser.set_defaults(handler=run_train_transformer)


def run_train_transformer(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Handler of ``train transformer``; see its ``--help``."""
    _check_output_arguments(args, parser)
    _check_checkpoint_argument(args.checkpoint, parser)
    _check_long_run_arguments(args, parser)
    if args.num_hiddens % args.num_heads:
        parser.error(f"argument --num-heads: {args.num_heads} does not divide --num-hiddens = "
                     f"{args.num_hiddens}")
    from jax_attention.data import find_data
    from jax_attention.train import train_transformer

    try:
        find_data(args.data)
    except FileNotFoundError as error:
        parser.error(str(error))
    # A ValueError (e.g. a --val-fraction that leaves no training pair) is a usage error.
    result, status = _run_training(train_transformer, dict(
        num_hiddens=args.num_hiddens, ffn_num_hiddens=args.ffn_num_hiddens,
        num_heads=args.num_heads, num_layers=args.num_layers, dropout=args.dropout,
        batch_size=args.batch_size, num_steps=args.num_steps, lr=args.lr, epochs=args.epochs,
        num_examples=args.num_examples, val_fraction=args.val_fraction, seed=args.seed,
        data=args.data, checkpoint=args.checkpoint, progress=args.progress,
        log_every=args.log_every, **_long_run_kwargs(args)), parser)
    if status is not None:
        return status
    if not _main_process():
        return 0  # process 0 of a multi-process run reports and writes the files
    environment = _environment()
    print(f"loss {result.losses[-1]:.3f} (cross-entropy per token "
          f"{result.cross_entropy[-1]:.3f}), {result.tokens_per_sec[-1]:.1f} tokens/sec on "
          f"{environment['backend']}")
    for (reference, translation), score in zip(result.translations, result.bleu):
        print(f"{translation.source} => {translation.translation}, bleu {score:.3f}")
    if result.validation is not None:
        v = result.validation
        print(f"held-out: {v['num_pairs']} pairs, corpus BLEU (k = 4) {v['corpus_bleu']:.3f}, "
              f"mean sentence BLEU {v['mean_sentence_bleu']:.3f}")
    _print_long_run_summary(result)
    print(f"wall time {result.wall_time_s:.2f} s")
    print(f"wrote checkpoint {result.checkpoint}")

    plots = {}
    if args.out is not None:
        from jax_attention.plotting import plot_curve

        plots["loss"] = args.out / "transformer_loss.png"
        plot_curve(result.losses, ylabel="loss", path=plots["loss"],
                   title="Transformer, training loss")
        # The book's figures: the last sentence's weights, every layer (row) and head (column).
        t = result.translations[-1][1]
        queries = t.tokens + (["<eos>"] if t.finished else [])
        inputs = ["<bos>"] + queries[:-1]
        plots["encoder_self"] = args.out / "transformer_encoder_self_attention.png"
        _layer_head_heatmaps(t.encoder_self, plots["encoder_self"], xlabel="Key positions",
                             ylabel="Query positions", xticks=t.source_tokens,
                             yticks=t.source_tokens)
        plots["decoder_self"] = args.out / "transformer_decoder_self_attention.png"
        _layer_head_heatmaps(t.decoder_self, plots["decoder_self"], xlabel="Key positions",
                             ylabel="Query positions", xticks=inputs, yticks=inputs)
        plots["encoder_decoder"] = args.out / "transformer_encoder_decoder_attention.png"
        _layer_head_heatmaps(t.encoder_decoder, plots["encoder_decoder"],
                             xlabel="Source tokens (keys)", ylabel="Decoder inputs (queries)",
                             xticks=t.source_tokens, yticks=inputs)
        for path in plots.values():
            print(f"wrote {path}")
    if args.json is not None:
        record = {"command": "train transformer", **result.figures(), **environment,
                  "plots": {name: str(path) for name, path in plots.items()}}
        _write_json(args.json, record)
        print(f"wrote {args.json}")
    return 0


@register("translate",
          help="translate English sentences with a trained Bahdanau or Transformer checkpoint",
          description="Translate one or more English sentences into French with a checkpoint "
                      "written by 'jax-attention train bahdanau' or 'train transformer' (the "
                      "kind is read from the checkpoint): the book's preprocessing, greedy "
                      "decoding or, with --beam K, beam search (Transformer). Unknown words are read as <unk>; a sentence longer than "
                      "the model's num_steps is cut, with a note. Quote each sentence.")
def _translate(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("sentences", metavar="SENTENCE", nargs="+",
                        help="an English sentence, e.g. \"i lost .\"")
    parser.add_argument("--checkpoint", metavar="DIR", type=Path, default=Path("runs/bahdanau"),
                        help="the checkpoint directory (default: %(default)s)")
    parser.add_argument("--max-len", metavar="N", type=positive_int, default=None,
                        help="decoding steps (default: the checkpoint's num_steps)")
    parser.add_argument("--model", choices=("auto", "bahdanau", "transformer"), default="auto",
                        help="the checkpoint's model; 'auto' reads it from the checkpoint "
                             "(default: %(default)s)")
    parser.add_argument("--beam", metavar="K", type=positive_int, default=1,
                        help="beam size: 1 is greedy decoding, K > 1 beam search with length "
                             "normalisation (Transformer only; default: %(default)s)")
    parser.add_argument("--out", metavar="DIR", type=Path, default=None,
                        help="write the attention heatmap of each sentence into DIR "
                             "(translation_1.png, ...)")
    parser.add_argument("--json", metavar="FILE", type=Path, default=None,
                        help="write the translations, notes and attention weights to FILE as JSON")
    parser.set_defaults(handler=run_translate)


def run_translate(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Handler of ``translate``; see its ``--help``."""
    _check_output_arguments(args, parser)
    from jax_attention.bahdanau import translate
    from jax_attention.train import load_checkpoint

    try:
        checkpoint = load_checkpoint(args.checkpoint)
    except (FileNotFoundError, ValueError) as error:
        parser.error(f"argument --checkpoint: {error}")
    kind = checkpoint.config.get("model", "bahdanau")
    if args.model != "auto" and args.model != kind:
        parser.error(f"argument --model: {args.model!r}, but the checkpoint holds a {kind!r} model")
    if kind == "transformer":
        from jax_attention import transformer

        config = checkpoint.config
        if args.max_len is not None and args.max_len > config["max_positions"]:
            parser.error(f"argument --max-len: {args.max_len} exceeds the model's max_positions "
                         f"= {config['max_positions']}")
        if args.beam > config["tgt_vocab_size"]:
            parser.error(f"argument --beam: {args.beam} exceeds the target vocabulary size "
                         f"{config['tgt_vocab_size']}")
        results = transformer.translate(
            checkpoint.params, args.sentences, checkpoint.src_vocab, checkpoint.tgt_vocab,
            config["num_steps"], num_heads=config["num_heads"], max_len=args.max_len,
            beam_size=args.beam, max_positions=config["max_positions"])
    else:
        if args.beam != 1:
            parser.error("argument --beam: beam search is implemented for the Transformer only; "
                         "use --beam 1 with a Bahdanau checkpoint")
        results = translate(checkpoint.params, args.sentences, checkpoint.src_vocab,
                            checkpoint.tgt_vocab, checkpoint.config["num_steps"],
                            max_len=args.max_len)
    plots = {}
    for number, result in enumerate(results, start=1):
        print(f"{result.source} => {result.translation}")
        for note in result.notes:
            print(f"  note: {note}")
        if args.out is not None:
            plots[f"translation_{number}"] = args.out / f"translation_{number}.png"
            _attention_heatmap(result, plots[f"translation_{number}"])
    for path in plots.values():
        print(f"wrote {path}")
    if args.json is not None:
        record = {"command": "translate", "checkpoint": str(args.checkpoint), "model": kind,
                  "beam": args.beam,
                  "translations": [{"source": r.source, "translation": r.translation,
                                    "source_tokens": r.source_tokens, "finished": r.finished,
                                    "truncated": r.truncated, "unknown_words": r.unknown_words,
                                    "notes": r.notes, "attention_weights": r.weights.tolist()}
                                   for r in results],
                  **_environment(),
                  "plots": {name: str(path) for name, path in plots.items()}}
        _write_json(args.json, record)
        print(f"wrote {args.json}")
    return 0


# --------------------------------------------------------------------------- conformance


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
                      "callable} checks your own (see the README, 'Check your own "
                      "implementation'). Exits with status 1 when a row fails.")
def _conformance(parser: argparse.ArgumentParser) -> None:
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
    if args.json is not None and args.json.is_dir():
        parser.error(f"argument --json: {str(args.json)!r} is a directory, expected a file path")
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
    from jax_attention.conformance import run_conformance

    try:
        report = run_conformance(args.against, dtype=args.dtype, platform=args.platform,
                                 precision=args.precision, cases_path=args.cases, only=args.only)
    except (ValueError, RuntimeError) as error:  # unusable --against, --platform or --cases
        parser.error(str(error))
    print(report.format())
    if args.json is not None:
        _write_json(args.json, report.to_dict())
        print(f"wrote {args.json}")
    return 1 if report.failed else 0


# --------------------------------------------------------------------------- bench


register_group("bench", help="benchmarks against named peers, in one run on this machine (JSON)")


# --------------------------------------------------------------------------- bench attention, memory


def _bench_shape(text: str) -> tuple[int, int, int, int]:
    """argparse type: ``B,N,T,H`` — batch, heads, sequence length (T = S), head size."""
    try:
        shape = tuple(int(part) for part in text.split(","))
    except ValueError:
        shape = ()
    if len(shape) != 4 or min(shape) < 1:
        raise argparse.ArgumentTypeError(
            f"expected B,N,T,H: four positive integers such as 8,8,128,64, got {text!r}")
    return shape


@register("bench attention",
          help="dot-product attention, forward and forward+backward, against jax.nn, Flax, "
               "torch SDPA and the NumPy reference",
          description="Time our scaled dot-product attention (jax_attention.scoring) and the "
                      "memory-efficient one (jax_attention.efficient), forward and "
                      "forward+backward, against jax.nn.dot_product_attention, "
                      "flax.nnx.dot_product_attention, torch.nn.functional."
                      "scaled_dot_product_attention and the float64 NumPy reference (forward "
                      "only), interleaved in one run, with and without a padding mask (~25%% of "
                      "the keys). Prints the environment and a table: median ms, effective "
                      "GFLOP/s (4·B·N·T·S·H forward, 3× with backward), %% of a float32 GEMM "
                      "ceiling measured in the same run, time ratios to jax.nn and torch, and "
                      "the largest error against float64.")
def _bench_attention(parser: argparse.ArgumentParser) -> None:
    from jax_attention.bench.attention import DEFAULT_SHAPES, DTYPES, MASKS, PEERS

    parser.add_argument("--shapes", metavar="B,N,T,H", type=_bench_shape, nargs="+",
                        default=list(DEFAULT_SHAPES),
                        help="batch, heads, sequence length (T = S), head size (default: "
                             + " ".join(",".join(map(str, s)) for s in DEFAULT_SHAPES) + ")")
    parser.add_argument("--peers", metavar="PEER", nargs="+", choices=PEERS, default=list(PEERS),
                        help=f"the implementations to run, among {', '.join(PEERS)} (default: all)")
    parser.add_argument("--mask", choices=("both",) + MASKS, default="both",
                        help="without a mask, with a padding mask (valid key lengths, ~25%% "
                             "padding) or both (default: %(default)s)")
    parser.add_argument("--no-mask", dest="mask", action="store_const", const="none",
                        help="same as --mask none")
    parser.add_argument("--dtype", choices=DTYPES, default="float32",
                        help="dtype of every peer but NumPy, which is float64 "
                             "(default: %(default)s)")
    parser.add_argument("--repeats", metavar="N", type=int_at_least(5), default=7,
                        help="timed rounds; medians are reported (>= 5, default: %(default)s)")
    parser.add_argument("--warmup", metavar="N", type=int_at_least(0), default=1,
                        help="untimed rounds after the compiling calls (default: %(default)s)")
    parser.add_argument("--budget", metavar="SECONDS", type=positive_float, default=60.0,
                        help="a peer whose rounds at a shape would take longer is measured for "
                             "its error only and reported as skipped (default: %(default)s)")
    parser.add_argument("--gemm-size", metavar="N", type=positive_int, default=2048,
                        help="n of the n³ float32 GEMM that sets the ceiling (default: %(default)s)")
    parser.add_argument("--query-chunk-size", metavar="N", type=positive_int, default=None,
                        help="query chunk of ours_efficient (default: the library's)")
    parser.add_argument("--key-chunk-size", metavar="N", type=positive_int, default=None,
                        help="key chunk of ours_efficient (default: the library's)")
    parser.add_argument("--seed", metavar="N", type=int_at_least(0), default=0,
                        help="seeds the inputs and the padding (default: %(default)s)")
    parser.add_argument("--json", metavar="FILE", type=Path, default=None,
                        help="write every figure, the settings and the environment to FILE")
    parser.add_argument("--no-progress", dest="progress", action="store_false",
                        help="do not print a line per case on stderr")
    parser.set_defaults(handler=run_bench_attention)


def run_bench_attention(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Handler of ``bench attention``; see its ``--help``."""
    if args.json is not None and args.json.is_dir():
        parser.error(f"argument --json: {str(args.json)!r} is a directory, expected a file path")
    from jax_attention.bench.attention import MASKS, bench_attention, format_attention
    from jax_attention.bench.common import write_json

    chunks = {name: value for name, value in (("query_chunk_size", args.query_chunk_size),
                                              ("key_chunk_size", args.key_chunk_size))
              if value is not None}
    record = bench_attention(args.shapes, peers=args.peers,
                             masks=MASKS if args.mask == "both" else (args.mask,),
                             dtype=args.dtype, repeats=args.repeats, warmup=args.warmup,
                             budget_s=args.budget, gemm_size=args.gemm_size, seed=args.seed,
                             efficient_chunks=chunks, log=_bench_progress(args))
    print(format_attention(record))
    if args.json is not None:
        print(f"wrote {write_json(args.json, record)}")
    return 0


@register("bench memory",
          help="peak RSS of plain and memory-efficient attention, forward+backward, per length",
          description="For each sequence length N and each of plain (jax_attention.scoring) and "
                      "memory-efficient (jax_attention.efficient) attention, run one jitted "
                      "forward+backward at (B, heads, T = S, H) = (1, 1, N, 64) in a fresh "
                      "process and report its peak resident set size, next to a baseline "
                      "process that only imports and allocates the inputs. Plain attention is "
                      "skipped where 3·itemsize·N² bytes would exceed --cap-gib.")
def _bench_memory(parser: argparse.ArgumentParser) -> None:
    from jax_attention.bench.memory import DEFAULT_CAP_BYTES, DEFAULT_SIZES, VARIANTS

    parser.add_argument("--sizes", metavar="N", type=positive_int, nargs="+",
                        default=list(DEFAULT_SIZES),
                        help="sequence lengths T = S (default: "
                             + " ".join(map(str, DEFAULT_SIZES)) + ")")
    parser.add_argument("--variants", metavar="VARIANT", nargs="+", choices=VARIANTS,
                        default=list(VARIANTS),
                        help=f"among {', '.join(VARIANTS)} (default: both)")
    parser.add_argument("--head-size", metavar="H", type=positive_int, default=64,
                        help="per-head size (default: %(default)s)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                        help="(default: %(default)s)")
    parser.add_argument("--cap-gib", metavar="GIB", type=positive_float,
                        default=DEFAULT_CAP_BYTES / 2**30,
                        help="skip plain attention where 3·itemsize·N² bytes exceed this "
                             "(default: %(default)s)")
    parser.add_argument("--timeout", metavar="SECONDS", type=positive_float, default=3600.0,
                        help="per child process; a slower one is reported as failed "
                             "(default: %(default)s)")
    parser.add_argument("--seed", metavar="N", type=int_at_least(0), default=0,
                        help="seeds the inputs (default: %(default)s)")
    parser.add_argument("--json", metavar="FILE", type=Path, default=None,
                        help="write every figure, the settings and the environment to FILE")
    parser.add_argument("--no-progress", dest="progress", action="store_false",
                        help="do not print a line per child process on stderr")
    parser.set_defaults(handler=run_bench_memory)


def run_bench_memory(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Handler of ``bench memory``; see its ``--help``."""
    if args.json is not None and args.json.is_dir():
        parser.error(f"argument --json: {str(args.json)!r} is a directory, expected a file path")
    from jax_attention.bench.common import write_json
    from jax_attention.bench.memory import bench_memory, format_memory

    record = bench_memory(args.sizes, variants=args.variants, head_size=args.head_size,
                          dtype=args.dtype, cap_bytes=int(args.cap_gib * 2**30),
                          timeout_s=args.timeout, seed=args.seed, log=_bench_progress(args))
    print(format_memory(record))
    if args.json is not None:
        print(f"wrote {write_json(args.json, record)}")
    return 0


# --------------------------------------------------------------------------- bench train, decode


def _bench_progress(args: argparse.Namespace):
    """Progress lines on stderr, so that stdout holds only the table; none with --no-progress."""
    return (lambda line: print(line, file=sys.stderr, flush=True)) if args.progress else None


def _add_bench_common(parser: argparse.ArgumentParser, *, repeats: int) -> None:
    parser.add_argument("--repeats", metavar="N", type=int_at_least(5), default=repeats,
                        help="timed rounds, interleaved; medians are reported (>= 5, default: "
                             "%(default)s)")
    parser.add_argument("--warmup", metavar="N", type=int_at_least(0), default=1,
                        help="untimed rounds after the first (compiling) call (default: "
                             "%(default)s)")
    parser.add_argument("--seed", metavar="N", type=int_at_least(0), default=0,
                        help="seeds the batch order, the weights and dropout (default: "
                             "%(default)s)")
    parser.add_argument("--data", metavar="PATH", type=Path, default=None,
                        help="the English–French data (default: as 'train bahdanau')")
    parser.add_argument("--json", metavar="FILE", type=Path, default=None,
                        help="write every figure, the settings and the environment to FILE")
    parser.add_argument("--no-progress", dest="progress", action="store_false",
                        help="do not print progress lines on stderr")


def _check_bench_paths(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    if args.json is not None and args.json.is_dir():
        parser.error(f"argument --json: {str(args.json)!r} is a directory, expected a file path")
    from jax_attention.data import find_data

    try:
        find_data(args.data)
    except FileNotFoundError as error:
        parser.error(str(error))


@register("bench train",
          help="tokens/s of our compiled training vs the book's PyTorch training of the same "
               "model, same data, weights and batches",
          description="Train the book's model (--model bahdanau: d2l §11.4; transformer: §11.7) "
                      "with the book's settings, ours (the compiled training step of 'jax-"
                      "attention train', several steps per call) and the PyTorch mirror trained "
                      "the book's way (eager, one step per batch: loss.sum(), backward, gradient "
                      "clipping, Adam), from the same initial weights on the same batches, "
                      "interleaved. Prints target tokens/s and step time (medians), the model "
                      "FLOPs per step (XLA's cost analysis), the fraction of a float32 GEMM "
                      "ceiling measured in the same run, both peers' losses after the timed "
                      "steps and the ratio ours/torch. PyTorch runs with the faster of 1 thread "
                      "and its default unless --torch-threads is given. With --devices 1,2,4 it "
                      "measures how our training scales over devices instead: one fresh process "
                      "per device count, each training on a mesh of that many devices (state "
                      "replicated, each batch split over them) with XLA_FLAGS=--xla_force_host_"
                      "platform_device_count=N, so that a CPU gets N host devices (which share "
                      "its cores); it prints step time, tokens/s and the speed-up per count.")
def _bench_train(parser: argparse.ArgumentParser) -> None:
    from jax_attention.bench.train import MODELS

    parser.add_argument("--model", choices=MODELS, default="bahdanau",
                        help="the model to train (default: %(default)s)")
    parser.add_argument("--steps", metavar="N", type=positive_int, default=20,
                        help="training steps per timed round, batches in training order "
                             "(default: %(default)s, two epochs of the 600 pairs)")
    parser.add_argument("--torch-threads", metavar="N", type=positive_int, default=None,
                        help="PyTorch's intra-op threads (default: the faster of 1 and "
                             "PyTorch's default, measured on an untimed round)")
    parser.add_argument("--gemm-size", metavar="N", type=positive_int, default=2048,
                        help="n of the n³ float32 GEMM that sets the ceiling (default: "
                             "%(default)s)")
    parser.add_argument("--devices", metavar="N,N,...", type=_device_counts, default=None,
                        help="time our training on each of these device counts instead, one "
                             "fresh process each (forced host devices on CPU; on a machine "
                             "with accelerators JAX_PLATFORMS=cpu asks for host devices); no "
                             "PyTorch peer or GEMM ceiling then")
    _add_bench_common(parser, repeats=7)
    parser.set_defaults(handler=run_bench_train)


def _device_counts(text: str) -> list[int]:
    """argparse type: ``1,2,4`` — device counts, each >= 1."""
    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(
            f"expected device counts such as 1,2,4 (integers >= 1), got {text!r}")
    return counts


def run_bench_train(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Handler of ``bench train``; see its ``--help``."""
    _check_bench_paths(args, parser)
    from jax_attention.bench.common import write_json
    from jax_attention.bench.train import (bench_train, bench_train_devices, format_train,
                                           format_train_devices)

    if args.devices is not None:
        if args.torch_threads is not None:
            parser.error("argument --torch-threads: not with --devices (no PyTorch peer runs)")
        try:
            record = bench_train_devices(args.model, args.devices, steps=args.steps,
                                         repeats=args.repeats, warmup=args.warmup,
                                         seed=args.seed, data=args.data,
                                         log=_bench_progress(args))
        except ValueError as error:  # a device count that does not divide the batch
            parser.error(f"argument --devices: {error}")
        print(format_train_devices(record))
        if args.json is not None:
            print(f"wrote {write_json(args.json, {'command': 'bench train', **record})}")
        return 0
    record = bench_train(args.model, steps=args.steps, repeats=args.repeats, warmup=args.warmup,
                         seed=args.seed, torch_threads=args.torch_threads,
                         gemm_size=args.gemm_size, data=args.data, log=_bench_progress(args))
    print(format_train(record))
    if args.json is not None:
        print(f"wrote {write_json(args.json, {'command': 'bench train', **record})}")
    return 0


def _checkpoint_or_default(path: Path | None, default: Path) -> Path | None:
    """``path``, or ``default`` when it holds a checkpoint (the train commands write there)."""
    if path is not None:
        return path
    return default if (default / "config.json").is_file() else None


@register("bench decode",
          help="sentences/s of greedy translation of the 600 training sources: batched and "
               "compiled (with and without the key/value cache) vs one sentence at a time",
          description="Translate the book's training sources greedily with the trained models: "
                      "every source in one batch, one compiled call (Transformer: with the "
                      "key/value cache, and recomputing the prefix at every step), against the "
                      "book's predict_seq2seq loop, one sentence and one token at a time (our "
                      "functions un-jitted, and the PyTorch mirror), on an evenly spaced subset. "
                      "Then both batched Transformer decoders at --long-steps output steps. "
                      "Weights: the given checkpoints, else runs/transformer and runs/bahdanau "
                      "when they hold one (the train commands' default), else a model trained "
                      "here with the book's settings.")
def _bench_decode(parser: argparse.ArgumentParser) -> None:
    from jax_attention.bench.decode import MODELS

    parser.add_argument("--models", metavar="MODEL", nargs="+", choices=MODELS,
                        default=list(MODELS), help="among transformer, bahdanau (default: both)")
    parser.add_argument("--transformer-checkpoint", metavar="DIR", type=Path, default=None,
                        help="a 'train transformer' checkpoint (default: runs/transformer if "
                             "there is one, else train here)")
    parser.add_argument("--bahdanau-checkpoint", metavar="DIR", type=Path, default=None,
                        help="a 'train bahdanau' checkpoint (default: runs/bahdanau if there "
                             "is one, else train here)")
    parser.add_argument("--epochs", metavar="N", type=positive_int, default=None,
                        help="epochs of a model trained here (default: the book's)")
    parser.add_argument("--long-steps", metavar="N", type=positive_int, default=50,
                        help="output steps of the cache vs recompute comparison (default: "
                             "%(default)s)")
    parser.add_argument("--eager-sentences", metavar="N", type=positive_int, default=30,
                        help="sources translated by the one-at-a-time loops, evenly spaced "
                             "(default: %(default)s)")
    parser.add_argument("--torch-threads", metavar="N", type=positive_int, default=1,
                        help="PyTorch's threads for its loop (default: %(default)s)")
    _add_bench_common(parser, repeats=5)
    parser.set_defaults(handler=run_bench_decode)


def run_bench_decode(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Handler of ``bench decode``; see its ``--help``."""
    _check_bench_paths(args, parser)
    from jax_attention.bench.common import write_json
    from jax_attention.bench.decode import bench_decode, format_decode

    checkpoints = {
        "transformer": _checkpoint_or_default(args.transformer_checkpoint,
                                              Path("runs/transformer")),
        "bahdanau": _checkpoint_or_default(args.bahdanau_checkpoint, Path("runs/bahdanau")),
    }
    try:
        record = bench_decode(args.models, checkpoints=checkpoints, epochs=args.epochs,
                              seed=args.seed, data=args.data, long_steps=args.long_steps,
                              eager_sentences=args.eager_sentences, repeats=args.repeats,
                              warmup=args.warmup, torch_threads=args.torch_threads,
                              log=_bench_progress(args))
    except (FileNotFoundError, ValueError) as error:  # an unusable checkpoint
        parser.error(str(error))
    print(format_decode(record))
    if args.json is not None:
        print(f"wrote {write_json(args.json, {'command': 'bench decode', **record})}")
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
