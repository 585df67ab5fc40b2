"""``jax-attention train kernel-regression | bahdanau | transformer``.

The seq2seq commands are one per model of the registry (:data:`jax_attention.models.registry.MODELS`), their
flags built from the fields of the configs (:mod:`jax_attention.models.configs`); the run, the report
and the outputs are written once below.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib
import json
import sys
from collections.abc import Callable
from pathlib import Path

from jax_attention.runtime import interrupts, provenance
from jax_attention.cli.arguments import (EXIT_BUSY, EXIT_NONFINITE, EXIT_WRITE_FAILED,
                                         add_compilation_cache_argument, add_data_argument,
                                         add_device_arguments,
                                         add_long_run_arguments, add_output_arguments,
                                         check_checkpoint_argument, check_data_argument,
                                         check_long_run_arguments, check_output_arguments,
                                         dropout_rate, finish_outputs, int_at_least, int_in_range,
                                         positive_float, positive_int, seed,
                                         start_compilation_cache)
from jax_attention.cli.registry import register, register_group
from jax_attention.models.configs import DeviceConfig, LongRunConfig, TrainConfig
from jax_attention.models.registry import MODELS

__all__ = ["config_flags", "run_train_kernel_regression", "run_train_seq2seq",
           "run_train_bahdanau", "run_train_transformer"]

register_group("train", help="train a model of the chapter and report its figures")


# --------------------------------------------------------------------------- kernel regression


@register("train kernel-regression",
          help="Nadaraya–Watson regression with a learnable kernel width (d2l §11.2.3)",
          description="Train Nadaraya–Watson kernel regression with a learnable inverse width w, "
                      "as in d2l §11.2.3: leave-one-out keys and values, summed squared error, "
                      "full-batch SGD. Prints the loss of each epoch, the learned w and the test "
                      "MSE of average pooling, the Gaussian kernel (w = 1) and the learned kernel.")
def _train_kernel_regression(parser: argparse.ArgumentParser) -> None:
    parser.epilog = (f"Exit status: 0 trained; 2 a usage error, including an --n-train whose "
                     f"n_train x (n_train - 1) attention would not fit in the memory available "
                     f"(checked before any work); {EXIT_NONFINITE} the loss or w became NaN or "
                     f"Inf (an --lr that diverges), naming the epoch.")
    parser.add_argument("--epochs", metavar="N", type=positive_int, default=5,
                        help="full-batch SGD steps (default: %(default)s, as the book)")
    parser.add_argument("--seed", metavar="N", type=seed, default=0,
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
    check_output_arguments(args, parser)
    from jax_attention.train import NonFiniteLossError, train_kernel_regression

    try:
        result = train_kernel_regression(seed=args.seed, epochs=args.epochs, lr=args.lr,
                                         n_train=args.n_train, progress=args.progress)
    except NonFiniteLossError as error:  # a diverging lr: no figures to report
        print(f"{parser.prog}: error: {error}", file=sys.stderr)
        return EXIT_NONFINITE
    except ValueError as error:  # e.g. an --n-train whose attention would not fit in memory
        parser.error(str(error))
    mse = result.test_mse
    print(f"learned w = {result.w:.6f} (initial {result.w_init:.6f})")
    print("test MSE:")
    print(f"  average pooling         {mse['average_pooling']:.6f}")
    print(f"  Gaussian kernel (w = 1) {mse['gaussian_kernel']:.6f}")
    print(f"  learned kernel          {mse['learned_kernel']:.6f}")
    print(f"wall time {result.wall_time_s:.2f} s")

    plots = {}
    if args.out is not None:
        from jax_attention.viz.plotting import plot_kernel_regression, show_heatmaps

        data = result.data
        plots["fit"] = args.out / "kernel_regression_fit.png"
        plot_kernel_regression(data["x_train"], data["y_train"], data["x_test"], data["y_truth"],
                               result.y_hat, path=plots["fit"],
                               title=f"learned kernel, w = {result.w:.2f}")
        plots["attention"] = args.out / "kernel_regression_attention.png"
        show_heatmaps(result.weights[None, None], xlabel="Sorted training inputs",
                      ylabel="Sorted testing inputs", path=plots["attention"], figsize=(3.5, 3.5),
                      suptitle=f"Nadaraya\u2013Watson attention weights,\nlearned Gaussian "
                               f"kernel (w = {result.w:.2f})")
    return finish_outputs(args, "train kernel-regression", result.figures(), plots)


# --------------------------------------------------------------------------- seq2seq models
# One command per registered model (jax_attention.models.registry.MODELS); its flags are the fields of
# the model's config and of TrainConfig (jax_attention.models.configs: help, metavar and check in each
# field's metadata), then the run's own options and the long-run and device groups.

# "int_or_none": the flag takes an int; its absence leaves the field's default None.
_ARGUMENT_TYPES = {"int": int_at_least, "int_or_none": int_at_least, "int_range": int_in_range,
                   "rate": lambda: dropout_rate, "positive_float": lambda: positive_float}


def config_flags(config_class, defaults=None) -> list[tuple[str, dict]]:
    """``(flag, add_argument keywords)`` for each field of a config dataclass that is a flag,
    in field order: ``--embed-size E`` for ``embed_size``, typed and checked by the field's rule,
    its help with the default (``defaults`` overrides the dataclass's)."""
    flags = []
    for field in dataclasses.fields(config_class):
        if not field.metadata.get("flag"):
            continue
        kind, *arguments = field.metadata["check"]
        options = {"dest": field.name, "default": (defaults or {}).get(field.name, field.default),
                   "help": f"{field.metadata['help']} (default: %(default)s)"}
        if kind == "bool":  # --name / --no-name
            options["action"] = argparse.BooleanOptionalAction
        elif kind == "choice":
            options.update(metavar=field.metadata["metavar"], choices=arguments[0],
                           help=f"{field.metadata['help']}: %(choices)s (default: %(default)s)")
        else:
            options.update(metavar=field.metadata["metavar"],
                           type=_ARGUMENT_TYPES[kind](*arguments))
        flags.append((f"--{field.name.replace('_', '-')}", options))
    return flags


def _configure_seq2seq(spec, parser: argparse.ArgumentParser) -> None:
    for config_class, defaults in ((spec.config_class, None),
                                   (TrainConfig, {"epochs": spec.default_epochs})):
        for flag, options in config_flags(config_class, defaults):
            parser.add_argument(flag, **options)
    add_data_argument(parser)
    parser.add_argument("--checkpoint", metavar="DIR", type=Path,
                        default=Path(f"runs/{spec.name}"),
                        help="write the trained model here (default: %(default)s)")
    parser.add_argument("--log-every", metavar="N", type=positive_int, default=10,
                        help="print the loss every N epochs (default: %(default)s)")
    add_output_arguments(parser)
    add_compilation_cache_argument(parser)
    add_long_run_arguments(parser)
    add_device_arguments(parser, tensor_parallel=spec.tensor_parallel)
    parser.set_defaults(handler=functools.partial(run_train_seq2seq, spec),
                        graceful_interrupt=_acknowledge_interrupt, resume_argument="--resume")


for _spec in MODELS.values():
    register(f"train {_spec.name}", help=_spec.summary, description=_spec.description)(
        functools.partial(_configure_seq2seq, _spec))
del _spec


def _from_args(config_class, args: argparse.Namespace, parser: argparse.ArgumentParser):
    """The config of ``config_class`` from the parsed flags named as its fields; an invalid
    combination (e.g. heads that do not divide the width) is a usage error."""
    names = [field.name for field in dataclasses.fields(config_class)]
    try:
        return config_class(**{name: getattr(args, name) for name in names
                               if hasattr(args, name)})
    except ValueError as error:
        parser.error(str(error))


def run_train_seq2seq(spec, args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Handler of ``train MODEL`` for every registered model; see its ``--help``.

    With ``--out``, a helper process (:class:`~jax_attention.runtime.helper_process.
    HelperProcess`) starts while the steps run and draws about half of the figures after
    training, beside this process."""
    helper = None
    if args.out is not None:  # (multiprocessing's import: ~30 ms a run without plots)
        from jax_attention.runtime.helper_process import HelperProcess

        helper = HelperProcess(preload=_PLOTTING_MODULES)
    try:
        return _train_and_report(spec, args, parser, helper)
    finally:
        if helper is not None:
            helper.close()


def _train_and_report(spec, args: argparse.Namespace, parser: argparse.ArgumentParser,
                      helper) -> int:
    check_output_arguments(args, parser)
    check_checkpoint_argument(args.checkpoint, parser)
    check_long_run_arguments(args, parser)
    configs = [_from_args(config_class, args, parser) for config_class in
               (spec.config_class, TrainConfig, LongRunConfig, DeviceConfig)]
    from jax_attention.train import train_seq2seq

    check_data_argument(args, parser)
    cache = start_compilation_cache(args, parser)
    previous = _previous_model(args.checkpoint)  # read before the export replaces it
    # A ValueError (e.g. a --val-fraction that leaves no training pair) is a usage error.
    result, status = _run_training(functools.partial(train_seq2seq, spec, *configs), {
        "data": args.data, "checkpoint": args.checkpoint, "progress": args.progress,
        "log_every": args.log_every,
        "warm_up": None if helper is None else functools.partial(_prepare_plots, helper)},
        parser)
    if status is not None:
        return status
    from jax_attention.runtime.distributed import is_main_process

    if not is_main_process():
        return 0  # process 0 of a multi-process run reports and writes the files
    environment = provenance.environment()
    _print_seq2seq_summary(result, environment["backend"], cache, previous=previous,
                           destination=args.checkpoint)
    if interrupts.requested():
        raise interrupts.Interrupted(
            f"interrupted (Ctrl-C) after the run; the trained model is in {result.checkpoint}; "
            "plots and --json not written")
    failures = [] if result.export_error is None else [result.export_error]
    plots = {}
    if args.out is not None:
        plots, failure = _write_plots(spec, result, args.out, helper)
        failures += [] if failure is None else [failure]
    figures = {**result.figures(), "compilation_cache": None if cache is None else str(cache)}
    finish_outputs(args, f"train {spec.name}", figures, plots, environment, failures=failures)
    if args.out is None:
        print("no plots written (--out DIR writes them)")
    for failure in failures:
        print(f"{parser.prog}: error: {failure}", file=sys.stderr)
    return EXIT_WRITE_FAILED if failures else 0


#: What the figures need: imported here and in the helper process while the steps run.
_PLOTTING_MODULES = ("jax_attention.viz.plotting", "jax_attention.viz.attention_view")


def _prepare_plots(helper) -> None:
    """``train_seq2seq(warm_up=...)``: the plotting modules imported (Matplotlib's import was
    ~0.4 s of the run after training) and the helper process started, both while training runs
    on the other core."""
    for name in _PLOTTING_MODULES:
        importlib.import_module(name)
    helper.start()


def _write_plots(spec, result, out: Path, helper) -> tuple[dict, str | None]:
    """The loss curve and the model's attention figures of the last book sentence (keys cut to
    its source tokens) and its view, written into ``out``, about half of them by ``helper``:
    ``(the plots written, None or the line that says why some are missing)``."""
    from jax_attention.runtime.helper_process import Task
    from jax_attention.viz.plotting import plot_curve

    interrupts.phase("plots")
    tasks = []

    def collect(drawings) -> None:
        tasks.extend(Task(draw, portable=portable) for draw, portable in drawings)

    loss = out / f"{spec.name}_loss.png"
    plots = {"loss": loss, **spec.attention_plots(result.translations[-1][1], out, run=collect)}
    # Last: the figures that the helper draws are every other portable one, from the first.
    tasks.append(Task(plot_curve, list(result.losses), ylabel="loss", path=loss,
                      title=f"{spec.title}, training loss"))
    try:
        helper.run(tasks)
    except OSError as error:
        return ({name: path for name, path in plots.items() if path.is_file()},
                f"could not write the plots into {out} ({provenance.os_reason(error)})")
    return plots, None


#: Handler of ``train bahdanau``: :func:`run_train_seq2seq` bound to the registry's Bahdanau
#: (GRU encoder-decoder with additive attention) spec; called as ``(args, parser)``, returns the
#: exit status.
run_train_bahdanau = functools.partial(run_train_seq2seq, MODELS["bahdanau"])
#: Handler of ``train transformer``: :func:`run_train_seq2seq` bound to the registry's Transformer
#: spec; called as ``(args, parser)``, returns the exit status.
run_train_transformer = functools.partial(run_train_seq2seq, MODELS["transformer"])


def _acknowledge_interrupt(args: argparse.Namespace) -> str:
    """What the first Ctrl-C of a training run says (:mod:`jax_attention.runtime.interrupts`)."""
    if args.checkpoint_dir is None:
        return ("stopping after the current training steps (without --checkpoint-dir nothing "
                "of the training is kept)")
    return "stopping after the current training steps and saving a training checkpoint"


def _run_training(train: Callable, options: dict, parser: argparse.ArgumentParser):
    """``train(**options)`` -> ``(result, None)``, or ``(None, exit status)`` when it stopped.

    A non-finite step: its message on stderr, status 3. A training checkpoint that could not be
    written (a full disk): its one line, status 4. Another run using ``--checkpoint-dir``: status
    5. A ``ValueError`` (e.g. a configuration that cannot resume the checkpoint, damaged data),
    a directory of another run's checkpoints or of other files (``FileExistsError``), no
    readable checkpoint (``FileNotFoundError``) or a checkpoint directory that cannot be
    created: a usage error, status 2. Ctrl-C
    (:class:`~jax_attention.train.TrainingInterrupted`) is left to :func:`jax_attention.cli.main`.
    """
    from jax_attention.runtime.checkpointing import (CheckpointDirectoryBusy, CheckpointDirectoryError,
                                             CheckpointWriteError)
    from jax_attention.train import NonFiniteLossError

    try:
        return train(**options), None
    except NonFiniteLossError as error:
        print(f"{parser.prog}: error: {error}", file=sys.stderr)
        return None, EXIT_NONFINITE
    except CheckpointWriteError as error:
        print(f"{parser.prog}: error: {error}", file=sys.stderr)
        return None, EXIT_WRITE_FAILED
    except CheckpointDirectoryBusy as error:
        print(f"{parser.prog}: error: {error}", file=sys.stderr)
        return None, EXIT_BUSY
    except (ValueError, FileExistsError, FileNotFoundError, CheckpointDirectoryError) as error:
        parser.error(str(error))


def _previous_model(directory: Path) -> dict | None:
    """What the export at ``directory`` holds before a run replaces it: ``{"model", "epochs",
    "num_examples"}`` from its ``config.json`` (values ``None`` where not recorded), or ``None``
    when there is no export there."""
    config = directory / "config.json"
    if not config.is_file():
        return None
    try:
        record = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        record = None
    if not isinstance(record, dict):
        return {"model": None, "epochs": None, "num_examples": None}
    training = record.get("training") if isinstance(record.get("training"), dict) else {}

    def number(value):
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    model = record.get("model", "bahdanau")
    return {"model": model if isinstance(model, str) else None,
            "epochs": number(training.get("epochs")),
            "num_examples": number(training.get("num_examples"))}


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'s' if count != 1 else ''}"


def _export_lines(result, previous: dict | None, destination: Path) -> list[str]:
    """The summary's last lines: where the model went, what it replaced, and a note when the
    replaced model came from a longer run (more epochs, or more pairs) than this one."""
    if result.checkpoint is None:
        return []
    if result.export_error is not None or previous is None \
            or Path(result.checkpoint) != Path(destination):
        return [f"wrote checkpoint {result.checkpoint}"]
    training = result.train_config
    epochs = None if training is None else training.epochs
    examples = None if training is None else training.num_examples
    this = f"trained {_plural(epochs, 'epoch')}" if epochs is not None else "trained"
    if previous["epochs"] is not None:
        before = f"the one before had {previous['epochs']}"
    else:
        before = "the one before did not record its epochs"
    kind = f"the {previous['model']} model" if previous["model"] else "the model"
    lines = [f"replaced {kind} in {destination} ({this}; {before})"]
    longer = []
    if previous["epochs"] is not None and epochs is not None and previous["epochs"] > epochs:
        longer.append(f"{previous['epochs']} epochs, this run {epochs}")
    if (previous["num_examples"] is not None and examples is not None
            and previous["num_examples"] > examples):
        longer.append(f"{previous['num_examples']} pairs, this run {examples}")
    if longer:
        lines.append(f"note: the model replaced came from a longer run ({'; '.join(longer)}); "
                     "to keep a longer run's model, give shorter runs another --checkpoint DIR")
    return lines


def _print_seq2seq_summary(result, backend: str, cache, *, previous: dict | None = None,
                           destination: Path | None = None) -> None:
    # The book's summary line: its loss is the cross-entropy per token divided by num_steps.
    print(f"loss {result.losses[-1]:.3f} (cross-entropy per token "
          f"{result.cross_entropy[-1]:.3f}), {result.tokens_per_sec[-1]:.1f} tokens/sec on "
          f"{backend}")
    for (reference, translation), score in zip(result.translations, result.bleu):
        print(f"{translation.source} => {translation.translation}, bleu {score:.3f}")
    validation = getattr(result, "validation", None)
    if validation is not None:
        print(f"held-out: {validation['num_pairs']} pairs, corpus BLEU (k = 4) "
              f"{validation['corpus_bleu']:.3f}, mean sentence BLEU "
              f"{validation['mean_sentence_bleu']:.3f}")
    if result.resumed_from_step is not None:
        print(f"resumed from training checkpoint {result.resumed_from_step} in "
              f"{result.checkpoint_dir}")
    if result.skipped_steps:
        print(f"skipped {result.skipped_steps} step(s) with a non-finite loss, gradient or update")
    hits = result.timing["compile_cache_hits"]
    where = ("no compilation cache" if cache is None else
             f"{hits} program{'s' if hits != 1 else ''} loaded from the compilation cache {cache}")
    background = result.timing["background_compile_s"]
    overlapped = f", and {background:.2f} s while training" if background else ""
    print(f"wall time {result.wall_time_s:.2f} s, of which compilation "
          f"{result.timing['compile_s']:.2f} s{overlapped} ({where})")
    if result.steady_tokens_per_sec is not None:
        print(f"steady {result.steady_tokens_per_sec:.1f} tokens/sec (the epochs after the "
              "first, which compiles)")
    if destination is None:
        print(f"wrote checkpoint {result.checkpoint}")
        return
    for line in _export_lines(result, previous, destination):
        print(line)
