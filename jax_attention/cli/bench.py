"""``jax-attention bench attention | memory | train | decode``: benchmarks against named peers, in
one run on this machine (see :mod:`jax_attention.bench`); ``bench profile``: where the training
step's time goes, kernel by kernel."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from jax_attention.cli.arguments import (add_data_argument, check_data_argument,
                                         check_json_argument, int_at_least,
                                         positive_float, positive_int, seed,
                                         write_json_report)
from jax_attention.cli.registry import register, register_group

__all__ = ["run_bench_attention", "run_bench_memory", "run_bench_train", "run_bench_decode",
           "run_bench_profile"]

register_group("bench", help="benchmarks against named peers, in one run on this machine (JSON)")


def _add_json_and_progress(parser: argparse.ArgumentParser, progress_help: str) -> None:
    """``--json FILE`` and ``--no-progress``, shared by the ``bench`` commands."""
    parser.add_argument("--json", metavar="FILE", type=Path, default=None,
                        help="write every figure, the settings and the environment to FILE")
    parser.add_argument("--no-progress", dest="progress", action="store_false",
                        help=progress_help)


def _finish(args: argparse.Namespace, table: str, record: dict) -> int:
    """Print a benchmark's table, write its ``record`` to ``--json`` when given; status 0."""
    print(table)
    if args.json is not None:
        write_json_report(args.json, record)
    return 0


def _bench_progress(args: argparse.Namespace):
    """Progress lines on stderr, so that stdout holds only the table; none with --no-progress."""
    return (lambda line: print(line, file=sys.stderr, flush=True)) if args.progress else None


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


def _local_window(text: str) -> tuple[int, int] | None:
    """argparse type: ``none`` (no window), ``W`` (= ``W,W``) or ``LEFT,RIGHT``, integers
    ``>= 0``: query ``t`` attends keys ``t - LEFT <= s <= t + RIGHT``."""
    if text.strip().lower() == "none":
        return None
    try:
        sides = tuple(int(part) for part in text.split(","))
    except ValueError:
        sides = ()
    if len(sides) == 1:
        sides = sides * 2
    if len(sides) != 2 or min(sides) < 0:
        raise argparse.ArgumentTypeError(
            f"expected none, W or LEFT,RIGHT (integers >= 0) such as 512 or 256,0, got {text!r}")
    return sides


@register("bench attention",
          help="dot-product attention, forward and forward+backward, against jax.nn, Flax, "
               "torch SDPA and the NumPy reference",
          description="Time our scaled dot-product attention (jax_attention.nn.scoring) and the "
                      "memory-efficient one (jax_attention.nn.efficient), forward and "
                      "forward+backward, against jax.nn.dot_product_attention, "
                      "flax.nnx.dot_product_attention, torch.nn.functional."
                      "scaled_dot_product_attention and the float64 NumPy reference (forward "
                      "only), interleaved in one run, with and without a padding mask (~25% of "
                      "the keys), and with each sliding window of --local-window-size. Prints "
                      "the environment and a table: median ms, effective GFLOP/s "
                      "(4·B·N·T·S·H forward, 3× with backward: the dense count, whatever the "
                      "mask or the window skips), % of a float32 GEMM "
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
                             "padding), both (default), 'documents' (8 documents per row, by "
                             "segment ids) or 'chunks' (attention within chunks of 512)")
    parser.add_argument("--no-mask", dest="mask", action="store_const", const="none",
                        help="same as --mask none")
    parser.add_argument("--local-window-size", metavar="W", type=_local_window, nargs="+",
                        default=[None],
                        help="sliding windows: every (shape, mask) case runs once per W, each "
                             "none (no window), an int w (= w,w) or left,right: query t attends "
                             "keys t-left..t+right (jax.nn's rule), e.g. --local-window-size "
                             "none 512 to time a window against the same without one; GFLOP/s "
                             "stays the dense count, the JSON adds window_flops "
                             "(default: none)")
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
    parser.add_argument("--seed", metavar="N", type=seed, default=0,
                        help="seeds the inputs and the padding (default: %(default)s)")
    _add_json_and_progress(parser, "do not print a line per case on stderr")
    parser.set_defaults(handler=run_bench_attention)


def run_bench_attention(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Handler of ``bench attention``; see its ``--help``."""
    check_json_argument(args, parser)
    from jax_attention.bench.attention import DEFAULT_MASKS, bench_attention, format_attention

    chunks = {name: value for name, value in (("query_chunk_size", args.query_chunk_size),
                                              ("key_chunk_size", args.key_chunk_size))
              if value is not None}
    record = bench_attention(args.shapes, peers=args.peers,
                             masks=DEFAULT_MASKS if args.mask == "both" else (args.mask,),
                             dtype=args.dtype, repeats=args.repeats, warmup=args.warmup,
                             budget_s=args.budget, gemm_size=args.gemm_size, seed=args.seed,
                             efficient_chunks=chunks,
                             local_window_sizes=args.local_window_size,
                             log=_bench_progress(args))
    return _finish(args, format_attention(record), record)


@register("bench memory",
          help="peak RSS of plain and memory-efficient attention, forward+backward, per length",
          description="For each sequence length N and each of plain (jax_attention.nn.scoring) and "
                      "memory-efficient (jax_attention.nn.efficient) attention, run one jitted "
                      "forward+backward at (B, heads, T = S, H) = (1, 1, N, 64) in a fresh "
                      "process and report its peak resident set size, next to a baseline "
                      "process that only imports and allocates the inputs. Plain attention is "
                      "skipped where 3·itemsize·N² bytes would exceed --cap-gib. Exit "
                      "status: 0 when at least one run was measured; 1 when nothing was "
                      "(every run skipped or failed: the table, --json and one line on stderr "
                      "say why); 2 a usage error.")
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
                        help="dtype of the queries, keys and values, and so of the scores and "
                             "weights attention holds; sets the itemsize of the --cap-gib "
                             "estimate (default: %(default)s)")
    parser.add_argument("--cap-gib", metavar="GIB", type=positive_float,
                        default=DEFAULT_CAP_BYTES / 2**30,
                        help="skip plain attention where 3·itemsize·N² bytes exceed this "
                             "(default: %(default)s)")
    parser.add_argument("--timeout", metavar="SECONDS", type=positive_float, default=3600.0,
                        help="per child process; a slower one is reported as failed "
                             "(default: %(default)s)")
    parser.add_argument("--seed", metavar="N", type=seed, default=0,
                        help="seeds the inputs (default: %(default)s)")
    _add_json_and_progress(parser, "do not print a line per child process on stderr")
    parser.set_defaults(handler=run_bench_memory)


def run_bench_memory(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Handler of ``bench memory``; see its ``--help``."""
    check_json_argument(args, parser)
    from jax_attention.bench.memory import bench_memory, format_memory, nothing_measured

    record = bench_memory(args.sizes, variants=args.variants, head_size=args.head_size,
                          dtype=args.dtype, cap_bytes=int(args.cap_gib * 2**30),
                          timeout_s=args.timeout, seed=args.seed, log=_bench_progress(args))
    status = _finish(args, format_memory(record), record)
    why = nothing_measured(record)
    if why is not None:
        # The table and the JSON record say what happened to each run; the status says that
        # the benchmark has no figure to give.
        hint = ("; --cap-gib raises the cap"
                if any(r["status"] == "skipped" for r in record["results"]) else "")
        print(f"{parser.prog}: error: nothing was measured: {why}{hint}", file=sys.stderr)
        return 1
    return status


# --------------------------------------------------------------------------- bench train, decode


def _add_bench_common(parser: argparse.ArgumentParser, *, repeats: int) -> None:
    parser.add_argument("--repeats", metavar="N", type=int_at_least(5), default=repeats,
                        help="timed rounds, interleaved; medians are reported (>= 5, default: "
                             "%(default)s)")
    parser.add_argument("--warmup", metavar="N", type=int_at_least(0), default=1,
                        help="untimed rounds after the first (compiling) call (default: "
                             "%(default)s)")
    _add_training_run(parser)


def _add_training_run(parser: argparse.ArgumentParser) -> None:
    """``--seed``, the data and ``--json``/``--no-progress``: what every benchmark that trains
    on the book's data takes."""
    parser.add_argument("--seed", metavar="N", type=seed, default=0,
                        help="seeds the batch order, the weights and dropout (default: "
                             "%(default)s)")
    add_data_argument(parser)
    _add_json_and_progress(parser, "do not print progress lines on stderr")


def _check_bench_paths(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    check_json_argument(args, parser)
    check_data_argument(args, parser)


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
                      "steps and the ratio ours/torch. ours trains as 'jax-attention train' "
                      "does, each batch cut to the training pairs' longest sentences; "
                      "ours-full trains the same batches at the book's full length (--num-steps "
                      "positions), the work of the book's loop: the ratio as shipped (ours/"
                      "torch) and the ratio of the same work (ours-full over the faster PyTorch "
                      "peer). --size small or base trains larger "
                      "models on more data (the same for every peer; --num-hiddens and the other "
                      "size flags change one setting), and --size book,small,base runs each size "
                      "in turn and sets them side by side in one scaling table; --peers "
                      "ours,torch,torch-compile adds the "
                      "PyTorch loop compiled by torch.compile (inductor), its compilation in an "
                      "untimed round and reported, and the ratio ours/torch-compile. PyTorch "
                      "runs with the faster of 1 thread "
                      "and its default unless --torch-threads is given. With --devices 1,2,4 it "
                      "measures how our training scales over devices instead: one fresh process "
                      "per device count, each training on a mesh of that many devices (state "
                      "replicated, each batch split over them) with XLA_FLAGS=--xla_force_host_"
                      "platform_device_count=N, so that a CPU gets N host devices (which share "
                      "its cores); it prints step time, tokens/s and the speed-up per count. "
                      "With --whole-run it times whole processes instead: 'jax-attention train "
                      "MODEL' (compilation, training, translations, plots, export) against the "
                      "book's PyTorch training of the same model (python -m jax_attention.bench."
                      "book_run), each a fresh process, one after the other, --rounds times, "
                      "and reports process wall, CPU time, compile time, steady tokens/s and "
                      "the BLEU of the book's four sentences of both, and their ratios.")
def _bench_train(parser: argparse.ArgumentParser) -> None:
    from jax_attention.bench.train import DEFAULT_PEERS, MODELS, PEERS
    from jax_attention.bench.whole_run import CACHES

    parser.add_argument("--model", "--models", dest="model", metavar="MODEL", choices=MODELS,
                        default=None,
                        help=f"the model to train, one of {', '.join(MODELS)} (default: "
                             "bahdanau; transformer with --whole-run, the project's main job); "
                             "--models is the same option, as spelled by 'bench decode'")
    parser.add_argument("--steps", metavar="N", type=positive_int, default=20,
                        help="training steps per timed round, batches in training order "
                             "(default: %(default)s, two epochs at --size book)")
    parser.add_argument("--torch-threads", metavar="N", type=positive_int, default=None,
                        help="PyTorch's intra-op threads (default: the faster of 1 and "
                             "PyTorch's default, taking turns on two untimed rounds each)")
    parser.add_argument("--gemm-size", metavar="N", type=positive_int, default=2048,
                        help="n of the n³ float32 GEMM that sets the ceiling (default: "
                             "%(default)s)")
    parser.add_argument("--peers", metavar="PEER[,PEER...]", type=_train_peers,
                        default=DEFAULT_PEERS,
                        help=f"the peers to time, among {', '.join(PEERS)}; ours and torch "
                             "always run, ours-full trains at full length, ours-bf16 with "
                             "--dtype bfloat16, ours-xla-defaults compiles ours with XLA's "
                             "default options, torch-compile adds "
                             "the book's PyTorch loop compiled "
                             "by torch.compile (inductor: the loss, its backward and the "
                             "update), compiled in an untimed round (its compilation time "
                             "reported) and reported as skipped, with the reason, when "
                             f"inductor fails (default: {','.join(DEFAULT_PEERS)})")
    parser.add_argument("--devices", metavar="N[,N...]", type=_device_counts, default=None,
                        help="time our training on N devices ('train --devices N'), or on each "
                             "of several device counts (1,2,4) to see the scaling, instead: "
                             "one fresh process per count (forced host devices on CPU; on a "
                             "machine with accelerators JAX_PLATFORMS=cpu asks for host "
                             "devices); no PyTorch peer or GEMM ceiling then")
    whole = parser.add_argument_group(
        "whole runs", "--whole-run: the whole training command against the book's PyTorch "
                      "training, each a fresh process (--steps, --repeats, --warmup, "
                      "--gemm-size, --peers, --devices and the sizes but --num-examples do not "
                      "apply; --torch-threads sets the book "
                      "run's threads, default: the faster of 1 and PyTorch's default over its "
                      "first four epochs)")
    whole.add_argument("--whole-run", action="store_true",
                       help="time 'jax-attention train MODEL' against the book's PyTorch "
                            "training of MODEL, from process start to exit")
    whole.add_argument("--rounds", metavar="N", type=positive_int, default=3,
                       help="runs of each peer, alternating; medians are reported (default: "
                            "%(default)s)")
    whole.add_argument("--epochs", metavar="N", type=positive_int, default=None,
                       help="epochs of both runs (default: the book's, 200 or 250)")
    whole.add_argument("--whole-run-cache", choices=CACHES, default="cold",
                       help="our compilation cache: cold (off: a first run), warm (a temporary "
                            "cache filled by one untimed run: a second run) or both, two peers "
                            "(default: %(default)s; the user's own cache is never touched)")
    _add_train_sizes(parser)
    _add_bench_common(parser, repeats=7)
    parser.set_defaults(handler=run_bench_train)


def _add_train_sizes(parser: argparse.ArgumentParser) -> None:
    """``bench train --size`` and the flags that change one of its settings."""
    from jax_attention.bench.train_sizes import SIZE_NAMES, describe_size

    sizes = parser.add_argument_group(
        "sizes", "the model and the data every peer trains (the same for each): a named size, "
                 "and single settings changed (with --whole-run only --num-examples applies)")
    sizes.add_argument("--size", metavar="SIZE[,SIZE...]", type=_size_names, default=("book",),
                       help="the named size (default: book), or several, such as book,small,base: "
                            "one run each, in turn, and a table of the sizes side by side (the "
                            "scaling table). The sizes: " + "; ".join(
                           f"{name}: {describe_size(name)}" for name in SIZE_NAMES)
                       + " (layers: the encoder's + the decoder's)")
    for flag, what in (("--embed-size", "the Bahdanau model's embedding size"),
                       ("--num-hiddens", "the model's width (the GRU's hidden size)"),
                       ("--ffn-num-hiddens", "the Transformer's FFN width"),
                       ("--num-heads", "the Transformer's attention heads"),
                       ("--num-layers", "blocks (GRU layers) in the encoder and the decoder "
                                        "each"),
                       ("--batch-size", "examples per batch"),
                       ("--num-steps", "tokens per sequence, padded or cut")):
        sizes.add_argument(flag, metavar="N", type=positive_int, default=None,
                           help=f"{what} (default: the size's)")
    sizes.add_argument("--num-examples", metavar="N", type=positive_int, default=None,
                       help="English–French pairs (default: the size's; with --whole-run, "
                            "of both runs, the book's 600)")


_NOT_WITH_WHOLE_RUN = ("steps", "repeats", "warmup", "gemm_size", "devices", "peers", "size",
                       "embed_size", "num_hiddens", "ffn_num_hiddens", "num_heads",
                       "num_layers", "batch_size", "num_steps")
_ONLY_WITH_WHOLE_RUN = ("rounds", "epochs", "whole_run_cache")


def _check_whole_run_arguments(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Refuse the options of the other mode (a value other than its default means it was
    given): --steps ... --devices with --whole-run, --rounds ... without it."""
    names = _NOT_WITH_WHOLE_RUN if args.whole_run else _ONLY_WITH_WHOLE_RUN
    for name in names:
        if getattr(args, name) != parser.get_default(name):
            flag = "--" + name.replace("_", "-")
            parser.error(f"argument {flag}: {'not with' if args.whole_run else 'only with'} "
                         f"--whole-run")


def _train_peers(text: str) -> tuple[str, ...]:
    """argparse type: ``ours,torch,torch-compile`` — the peers of ``bench train``, ours and
    torch among them."""
    from jax_attention.bench.train import PEERS

    peers = tuple(part.strip() for part in text.split(","))
    if not set(peers) <= set(PEERS) or not {"ours", "torch"} <= set(peers):
        raise argparse.ArgumentTypeError(
            f"expected peers among {', '.join(PEERS)}, ours and torch among them, such as "
            f"ours,torch,torch-compile, got {text!r}")
    return tuple(name for name in PEERS if name in peers)


def _size_names(text: str) -> tuple[str, ...]:
    """argparse type: ``book`` or ``book,small,base`` — named sizes, each once."""
    from jax_attention.bench.train_sizes import SIZE_NAMES

    names = tuple(part.strip() for part in text.split(","))
    if not set(names) <= set(SIZE_NAMES) or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(
            f"expected named sizes among {', '.join(SIZE_NAMES)}, each once, such as book or "
            f"book,small,base, got {text!r}")
    return names


def _train_sizes(args: argparse.Namespace, parser: argparse.ArgumentParser) -> dict:
    """The settings of :func:`~jax_attention.bench.train.bench_train` that change the sizes of
    ``--size`` (``sizes``, the model's; ``batch_size``, ``num_steps``, ``num_examples``), checked
    for the model at every size: a usage error naming the flag otherwise."""
    from jax_attention.bench.train_scaling import check_size_names
    from jax_attention.bench.train_sizes import BOOK_MODELS, DATA_OVERRIDES, MODEL_OVERRIDES

    sizes = {name: getattr(args, name) for name in MODEL_OVERRIDES
             if getattr(args, name) is not None}
    for name in sizes:
        if name not in BOOK_MODELS[args.model]:
            parser.error(f"argument --{name.replace('_', '-')}: the {args.model} model has no "
                         f"{name} (its settings: {', '.join(BOOK_MODELS[args.model])})")
    arguments = {"sizes": sizes, **{name: getattr(args, name) for name in DATA_OVERRIDES}}
    try:
        check_size_names(args.model, args.size)
    except ValueError as error:  # a size the model lacks
        parser.error(f"argument --size: {error}")
    try:
        check_size_names(args.model, args.size, **arguments)
    except ValueError as error:  # heads not dividing the width at one of the sizes
        parser.error(f"the {args.model} model's settings {error}")
    return arguments


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
    _check_whole_run_arguments(args, parser)
    if args.whole_run:
        return _run_whole_run(args)
    from jax_attention.bench.train import bench_train, format_train
    from jax_attention.bench.train_devices import bench_train_devices, format_train_devices

    args.model = args.model or "bahdanau"
    sizes = _train_sizes(args, parser)
    size_names = args.size
    if args.devices is not None:
        for name in ("torch_threads", "peers"):
            if getattr(args, name) != parser.get_default(name):
                parser.error(f"argument --{name.replace('_', '-')}: not with --devices (no "
                             "PyTorch peer runs)")
        if len(size_names) > 1:
            parser.error("argument --size: one size with --devices")
        try:
            record = bench_train_devices(args.model, args.devices, steps=args.steps,
                                         repeats=args.repeats, warmup=args.warmup,
                                         seed=args.seed, data=args.data,
                                         log=_bench_progress(args), size=size_names[0], **sizes)
        except ValueError as error:  # a device count that does not divide the batch
            parser.error(f"argument --devices: {error}")
        return _finish(args, format_train_devices(record), {"command": "bench train", **record})
    settings = dict(peers=args.peers, steps=args.steps, repeats=args.repeats, warmup=args.warmup,
                    seed=args.seed, torch_threads=args.torch_threads, gemm_size=args.gemm_size,
                    data=args.data, log=_bench_progress(args), **sizes)
    if len(size_names) > 1:
        from jax_attention.bench.train_scaling import bench_train_scaling, format_train_scaling

        record = bench_train_scaling(args.model, size_names, **settings)
        return _finish(args, format_train_scaling(record), {"command": "bench train", **record})
    record = bench_train(args.model, size=size_names[0], **settings)
    return _finish(args, format_train(record), {"command": "bench train", **record})


def _run_whole_run(args: argparse.Namespace) -> int:
    """``bench train --whole-run``: :func:`jax_attention.bench.whole_run.bench_whole_run`."""
    from jax_attention.bench.whole_run import bench_whole_run, format_whole_run

    record = bench_whole_run(args.model or "transformer", rounds=args.rounds, epochs=args.epochs,
                             num_examples=args.num_examples, seed=args.seed,
                             cache=args.whole_run_cache, torch_threads=args.torch_threads,
                             data=args.data, log=_bench_progress(args))
    return _finish(args, format_whole_run(record), {"command": "bench train --whole-run",
                                                    **record})


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

    parser.add_argument("--models", "--model", dest="models", metavar="MODEL", nargs="+",
                        choices=MODELS, default=list(MODELS),
                        help=f"one or more of {', '.join(MODELS)} (default: all); --model is "
                             "the same option, as spelled by 'bench train'")
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
    return _finish(args, format_decode(record), {"command": "bench decode", **record})


@register("bench profile",
          help="where the compiled training step's time goes: XLA:CPU's kernels, one by one",
          description="Build the book's model (--model) and batches as 'bench train' does, "
                      "compile the training step of 'jax-attention train' for --steps steps, "
                      "run it --calls times under jax.profiler and read XLA's trace back: each "
                      "kernel (a fusion, a library GEMM, a copy) is mapped to its HLO "
                      "instruction, output shape and the JAX operation it came from. Prints, per "
                      "training step, the wall time (without the profiler), the kernels and "
                      "their time by phase (forward, backward, update: clipping, Adam, the "
                      "non-finite check), by kind and by output shape, and the slowest kernels. "
                      "The profiler adds a little to each kernel: compare shares, not times.")
def _bench_profile(parser: argparse.ArgumentParser) -> None:
    from jax_attention.bench.train import MODELS

    parser.add_argument("--model", choices=MODELS, default="transformer",
                        help="the model (default: %(default)s)")
    parser.add_argument("--steps", metavar="N", type=positive_int, default=10,
                        help="training steps per compiled call (default: %(default)s, an "
                             "epoch of the book's data)")
    parser.add_argument("--calls", metavar="N", type=positive_int, default=10,
                        help="profiled calls, and timed calls without the profiler (default: "
                             "%(default)s)")
    parser.add_argument("--top", metavar="N", type=positive_int, default=15,
                        help="the slowest kernels and output shapes listed (default: "
                             "%(default)s)")
    _add_training_run(parser)
    parser.set_defaults(handler=run_bench_profile)


def run_bench_profile(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Handler of ``bench profile``; see its ``--help``."""
    _check_bench_paths(args, parser)
    from jax_attention.bench.step_profile import format_step_profile, profile_train_step

    record = profile_train_step(args.model, steps=args.steps, calls=args.calls, seed=args.seed,
                                data=args.data, top=args.top, log=_bench_progress(args))
    return _finish(args, format_step_profile(record), {"command": "bench profile", **record})
