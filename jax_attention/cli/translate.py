"""``jax-attention translate``: English sentences into French with a trained checkpoint."""

from __future__ import annotations

import argparse
from pathlib import Path

from jax_attention.cli.arguments import (add_compilation_cache_argument, check_output_arguments,
                                         finish_outputs, positive_int, start_compilation_cache)
from jax_attention.cli.registry import register
from jax_attention.models import MODELS

__all__ = ["run_translate"]


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
    parser.add_argument("--model", choices=("auto", *MODELS), default="auto",
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
    add_compilation_cache_argument(parser)
    parser.set_defaults(handler=run_translate)


def _record(result) -> dict:
    """One translation in the JSON record."""
    return {"source": result.source, "translation": result.translation,
            "source_tokens": result.source_tokens, "finished": result.finished,
            "truncated": result.truncated, "unknown_words": result.unknown_words,
            "notes": result.notes, "attention_weights": result.weights.tolist()}


def run_translate(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Handler of ``translate``; see its ``--help``."""
    check_output_arguments(args, parser)
    start_compilation_cache(args, parser)
    from jax_attention.export import load_model

    try:
        model = load_model(args.checkpoint)
    except (FileNotFoundError, ValueError) as error:
        parser.error(f"argument --checkpoint: {error}")
    kind = model.spec.name
    if args.model != "auto" and args.model != kind:
        parser.error(f"argument --model: {args.model!r}, but the checkpoint holds a {kind!r} model")
    try:
        model.spec.check_translation(model.model_config, max_len=args.max_len,
                                     beam_size=args.beam)
    except ValueError as error:
        parser.error(str(error))
    results = model.translate(args.sentences, max_len=args.max_len, beam_size=args.beam)
    if args.out is not None:
        from jax_attention.plotting import translation_heatmap
    plots = {}
    for number, result in enumerate(results, start=1):
        print(f"{result.source} => {result.translation}")
        for note in result.notes:
            print(f"  note: {note}")
        if args.out is not None:
            plots[f"translation_{number}"] = args.out / f"translation_{number}.png"
            translation_heatmap(result, plots[f"translation_{number}"])
    record = {"checkpoint": str(args.checkpoint), "model": kind, "beam": args.beam,
              "translations": [_record(r) for r in results]}
    return finish_outputs(args, "translate", record, plots)
