"""What the ``jax-attention`` commands share: argument types, output paths and their checks, the
long-run and device argument groups, the exit statuses, and the reporting of written files.

A check takes ``(args, parser)`` and fails through ``parser.error`` (exit status 2) before any
work starts, not after.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path

from jax_attention.runtime import interrupts, provenance

__all__ = ["int_at_least", "int_in_range", "seed", "positive_int", "positive_float", "dropout_rate",
           "add_output_arguments", "check_output_arguments", "check_json_argument",
           "check_checkpoint_argument", "add_data_argument", "check_data_argument",
           "check_writable", "add_html_argument", "check_html_argument",
           "writable_problem", "EXIT_NONFINITE", "EXIT_WRITE_FAILED", "EXIT_BUSY", "PROG",
           "EXIT_INTERRUPTED", "LONG_RUNS_EPILOG", "add_long_run_arguments",
           "add_device_arguments", "check_long_run_arguments",
           "add_compilation_cache_argument", "start_compilation_cache",
           "write_json_report", "finish_outputs"]

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

    parse.__doc__ = (f"argparse type: ``text`` as an integer >= {minimum}; anything else raises "
                     f"``argparse.ArgumentTypeError`` (a usage error, exit status 2).")
    return parse


#: argparse type of sizes and counts (``--num-steps``, ``--num-hiddens``, ...): an integer ``>= 1``.
positive_int = int_at_least(1)


def int_in_range(minimum: int, maximum: int) -> Callable[[str], int]:
    """argparse type: an integer in ``[minimum, maximum]``."""
    at_least = int_at_least(minimum)

    def parse(text: str) -> int:
        value = at_least(text)
        if value > maximum:
            raise argparse.ArgumentTypeError(f"expected an integer in [{minimum}, {maximum}], "
                                             f"got {value}")
        return value

    parse.__doc__ = (f"argparse type: ``text`` as an integer in ``[{minimum}, {maximum}]``; anything "
                     f"else raises ``argparse.ArgumentTypeError`` (a usage error, exit status 2).")
    return parse


def _seed_type() -> Callable[[str], int]:
    from jax_attention.models.configs import MAX_SEED

    return int_in_range(0, MAX_SEED)


#: argparse type of ``--seed``: ``0 <= N < 2**63`` (JAX's keys take a signed 64-bit seed).
seed = _seed_type()


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text!r}")
    return value


def dropout_rate(text: str) -> float:
    """argparse type: a number ``0 <= p < 1`` (a dropout rate, a held-out fraction)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text!r}") from None
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text!r}")
    return value


# --------------------------------------------------------------------------- compilation cache


def add_compilation_cache_argument(parser: argparse.ArgumentParser) -> None:
    """``--no-compilation-cache``: the commands that compile keep their programs in the user
    cache (:mod:`jax_attention.runtime.compilation`) unless told not to."""
    parser.add_argument("--no-compilation-cache", dest="compilation_cache", action="store_false",
                        help="compile every program afresh instead of loading the ones an "
                             "earlier run compiled from the cache (default: the cache in "
                             "$XDG_CACHE_HOME/jax-attention/compilation or ~/.cache/...; "
                             "JAX_ATTENTION_COMPILATION_CACHE=0 turns it off too)")


def start_compilation_cache(args: argparse.Namespace, parser: argparse.ArgumentParser):
    """Turn the compilation cache on as ``args`` say, before anything compiles; returns its
    directory or ``None``. A cache that cannot be written is one warning line, not an error."""
    from jax_attention.runtime.compilation import enable_compilation_cache

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        directory = enable_compilation_cache(args.compilation_cache)
    for warning in caught:
        print(f"{parser.prog}: warning: {warning.message}", file=sys.stderr)
    return directory


# --------------------------------------------------------------------------- output paths


def add_output_arguments(parser: argparse.ArgumentParser) -> None:
    """``--out DIR``, ``--json FILE`` and ``--no-progress``, shared by the long-running commands."""
    parser.add_argument("--out", metavar="DIR", type=Path, default=None,
                        help="write the plots (PNG; for a seq2seq model also the interactive "
                             "view of its attention, HTML) into DIR (created if missing)")
    parser.add_argument("--json", metavar="FILE", type=Path, default=None,
                        help="write the run's figures (losses, parameters, metrics, versions) "
                             "to FILE as JSON")
    parser.add_argument("--no-progress", dest="progress", action="store_false",
                        help="do not show a progress bar")


def writable_problem(path: Path, *, directory: bool) -> str | None:
    """Why ``path`` (a directory when ``directory``, else a file) cannot be created or written,
    in words, or ``None`` when it can.

    The nearest existing folder on its way is tried for real: a temporary file is made in it and
    removed (permissions, a read-only filesystem, a full disk's inodes). Nothing else is created.
    """
    if path.exists():
        if directory and not path.is_dir():
            return f"{str(path)!r} exists and is not a directory"
        if not directory and path.is_dir():
            return f"{str(path)!r} is a directory, expected a file path"
        folder = path if directory else path.parent
    else:
        folder = path.parent
        while not folder.exists() and folder != folder.parent:
            folder = folder.parent
        if not folder.is_dir():
            return f"{str(path)!r} cannot be created: {str(folder)!r} is a file"
    try:
        handle, probe = tempfile.mkstemp(prefix=".jax-attention-write-test-", dir=folder)
    except OSError as error:
        return (f"{str(path)!r} cannot be written: {provenance.os_reason(error)} "
                f"(in {str(folder)!r})")
    os.close(handle)
    os.unlink(probe)
    return None


def check_writable(path: Path | None, argument: str, parser: argparse.ArgumentParser, *,
                   directory: bool) -> None:
    """Fail before the work starts, not after, when ``path`` (the value of ``argument``) cannot
    be created and written (:func:`writable_problem`); ``None`` passes."""
    if path is None:
        return
    problem = writable_problem(path, directory=directory)
    if problem is not None:
        parser.error(f"argument {argument}: {problem}")


def add_html_argument(parser: argparse.ArgumentParser, what: str) -> None:
    """``--html FILE``: the interactive attention view (:mod:`jax_attention.viz.attention_view`)
    of what the command computes, ``what`` saying what the page shows."""
    parser.add_argument("--html", metavar="FILE", type=Path, default=None,
                        help="write one interactive page (self-contained HTML, works offline) to "
                             f"FILE: {what}")


def check_html_argument(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Fail before the work starts when ``--html`` names a directory or a file that cannot be
    written, or the file of ``--json``."""
    check_writable(args.html, "--html", parser, directory=False)
    if args.html is not None and args.json is not None \
            and args.html.absolute() == args.json.absolute():
        parser.error("argument --html: must differ from --json (both would be written there)")


def check_json_argument(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Fail when ``--json`` names a directory or a file that cannot be written."""
    check_writable(args.json, "--json", parser, directory=False)


def check_output_arguments(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Fail before the work starts, not after, when ``--out`` or ``--json`` cannot be written."""
    check_writable(args.out, "--out", parser, directory=True)
    check_json_argument(args, parser)


def check_checkpoint_argument(path: Path, parser: argparse.ArgumentParser) -> None:
    """Fail before training, not after, when the trained model cannot be written to ``path``."""
    check_writable(path, "--checkpoint", parser, directory=True)
    if path.is_dir() and any(path.iterdir()) and not (path / "config.json").is_file():
        parser.error(f"argument --checkpoint: {str(path)!r} is a non-empty directory that holds "
                     "no checkpoint; choose another")


def add_data_argument(parser: argparse.ArgumentParser) -> None:
    """``--data PATH`` and ``--no-download``, for every command that reads the English–French
    data; :func:`check_data_argument` acts on them."""
    parser.add_argument("--data", metavar="PATH", type=Path, default=None,
                        help="the English–French data: fra-eng.zip, a folder or fra.txt "
                             "(default: $JAX_ATTENTION_DATA, then ../shared/data/fra-eng.zip "
                             "beside the checkout, then the user cache, then d2l's fra-eng.zip "
                             "downloaded into the user cache, SHA-1 checked)")
    parser.add_argument("--no-download", action="store_true",
                        help="never download d2l's fra-eng.zip when the data is found nowhere "
                             "(as JAX_ATTENTION_NO_DOWNLOAD=1): fail with how to supply it")


def check_data_argument(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Path:
    """Make sure of the English–French data of ``--data`` (or the default places) before
    compiling anything: when it is found nowhere, download d2l's archive into the user cache here
    (with its progress on stderr), unless ``--no-download`` or ``$JAX_ATTENTION_NO_DOWNLOAD``
    forbids it; returns where the data is. Data that cannot be found or downloaded is a usage
    error (exit status 2, one line that says why and how to supply the file)."""
    from jax_attention.data.nmt import ensure_data

    try:
        return ensure_data(args.data, no_download=getattr(args, "no_download", False))
    except (OSError, ValueError) as error:  # not found, download failed, SHA-1 mismatch
        parser.error(str(error))


# --------------------------------------------------------------------------- long runs, devices

# Exit statuses besides 0 (done), 1 (a check that failed: conformance, a benchmark that measured
# nothing) and argparse's 2 (bad arguments or inputs: a path that cannot be written, damaged
# data, a checkpoint that cannot be resumed). docs/long-runs.md lists them.
#: Exit status of a training run stopped by a NaN or infinite loss, gradient or update (without
#: ``--skip-nonfinite``); no checkpoint of that state is written.
EXIT_NONFINITE = 3
#: Exit status when an output (the ``--json`` report, a plot, a checkpoint) could not be written, a
#: full disk say; the error line says what was kept and where (:func:`finish_outputs`).
EXIT_WRITE_FAILED = 4
#: Exit status when the training-checkpoint directory (``--checkpoint-dir``) is locked by another
#: run (:mod:`jax_attention.runtime.directory_lock`).
EXIT_BUSY = 5
#: Exit status of a command stopped by Ctrl-C: 130 (128 + SIGINT), as a shell reports it; the
#: value of :data:`jax_attention.runtime.interrupts.EXIT_INTERRUPTED`.
EXIT_INTERRUPTED = interrupts.EXIT_INTERRUPTED
#: The program name: the console script ``jax-attention``, used as the parser's ``prog`` and as
#: the prefix of its error and warning lines.
PROG = "jax-attention"

#: The ``--help`` epilog of the seq2seq ``train`` commands (set by :func:`add_long_run_arguments`):
#: checkpoints, resumption, Ctrl-C, non-finite steps and the exit statuses, in one paragraph.
LONG_RUNS_EPILOG = (
    "Long runs: with --checkpoint-dir DIR, training checkpoints (parameters, optimizer state, "
    "dropout stream, step, data position and loss history; Orbax, written atomically) are saved "
    "every --checkpoint-every steps (default: every epoch), at the end and on Ctrl-C; the newest "
    "--keep are kept; one run at a time may use DIR (a lock). --resume continues the run from "
    "the newest readable one (a damaged one is reported, moved aside and the one before it "
    "used) and returns what the uninterrupted run would have, bit for bit on CPU; a checkpoint "
    "of another configuration or other data is refused (only --epochs may grow). A NaN or Inf "
    "loss, gradient or update stops training (no checkpoint of that state is written) unless "
    "--skip-nonfinite skips the step. Ctrl-C stops after the current steps (saving a checkpoint "
    "with --checkpoint-dir; after the last step the model is still exported); a second Ctrl-C "
    "stops at once. Exit status: 0 done, 2 bad arguments or inputs (an output path that cannot "
    "be written, damaged data, a checkpoint that cannot be resumed), "
    f"{EXIT_NONFINITE} stopped on a non-finite step, {EXIT_WRITE_FAILED} an output could not be "
    f"written (the result kept elsewhere, as the message says), {EXIT_BUSY} another run uses "
    f"--checkpoint-dir, {EXIT_INTERRUPTED} interrupted by Ctrl-C.")


def add_long_run_arguments(parser: argparse.ArgumentParser) -> None:
    """``--checkpoint-dir``, ``--checkpoint-every``, ``--keep``, ``--resume``, ``--skip-nonfinite``:
    training checkpoints, resumption and non-finite steps, shared by the seq2seq train commands;
    sets the parser's epilog to :data:`LONG_RUNS_EPILOG`."""
    from jax_attention.runtime.checkpointing import DEFAULT_KEEP

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
    parser.epilog = LONG_RUNS_EPILOG


def add_device_arguments(parser: argparse.ArgumentParser, *, tensor_parallel: bool) -> None:
    """``--devices`` (and, with ``tensor_parallel``, ``--model-parallel``): the device mesh of a
    train command."""
    group = parser.add_argument_group(
        "devices", "data parallelism over devices and processes (jax.sharding); a multi-process "
                   "run starts when JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and "
                   "JAX_PROCESS_ID are set (see docs/devices.md)")
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


def check_long_run_arguments(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Fail before training when the training-checkpoint arguments cannot work together."""
    if args.checkpoint_dir is None:
        if args.checkpoint_every is not None:
            parser.error("argument --checkpoint-every: needs --checkpoint-dir")
        if args.resume:
            parser.error("argument --resume: needs --checkpoint-dir")
        return
    check_writable(args.checkpoint_dir, "--checkpoint-dir", parser, directory=True)
    if args.checkpoint_dir.absolute() == args.checkpoint.absolute():
        parser.error("argument --checkpoint-dir: must differ from --checkpoint (the trained "
                     "model is written there)")


def write_json_report(path: Path, record: dict) -> Path:
    """Write ``record`` to ``path`` (:func:`jax_attention.runtime.provenance.write_json`) and say so, with
    a note when values that JSON cannot hold (NaN, infinities) were written as ``null``; returns
    the path. Raises ``OSError`` when it cannot be written."""
    written = provenance.write_json(path, record)
    nonfinite = provenance.json_ready(record)[1]
    note = (f" ({len(nonfinite)} NaN or infinite value{'s' if len(nonfinite) != 1 else ''} "
            f"written as null, listed under \"null_for_non_finite\")" if nonfinite else "")
    print(f"wrote {written}{note}")
    return written


def finish_outputs(args: argparse.Namespace, command: str, record: Mapping,
                   plots: Mapping[str, Path], environment: Mapping | None = None, *,
                   failures: list[str] | None = None) -> int:
    """Say which plots were written, then write ``--json`` (when given) as ``{"command": ...,
    **record, **environment, "plots": {name: path}}``; returns the exit status: 0, or
    :data:`EXIT_WRITE_FAILED` when the JSON could not be written where asked (then it is written
    to :func:`jax_attention.runtime.provenance.rescue_path` and the error line printed says where).

    ``environment`` defaults to :func:`jax_attention.runtime.provenance.environment`. ``failures``: a
    list to which the line is appended instead of printed (the caller prints it).
    """
    for path in plots.values():
        print(f"wrote {path}")
    if args.json is None:
        return 0
    interrupts.phase("report")
    environment = provenance.environment() if environment is None else environment
    report = {"command": command, **record, **environment,
              "plots": {name: str(path) for name, path in plots.items()}}
    written, reason = provenance.write_or_rescue(
        lambda path: write_json_report(path, report), args.json, args.json.name)
    if reason is None:
        return 0
    line = f"could not write {args.json} ({reason}); wrote the report to {written} instead"
    if failures is None:
        print(f"{PROG}: error: {line}", file=sys.stderr)
    else:
        failures.append(line)
    return EXIT_WRITE_FAILED
