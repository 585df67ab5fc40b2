"""``jax-attention translate``: English sentences into French with a trained model."""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from jax_attention.runtime import interrupts, provenance
from jax_attention.cli.arguments import (EXIT_WRITE_FAILED, add_compilation_cache_argument,
                                         add_html_argument, check_html_argument,
                                         check_output_arguments, finish_outputs, positive_int,
                                         start_compilation_cache)
from jax_attention.cli.registry import register
from jax_attention.models.registry import MODELS

__all__ = ["run_translate", "find_models", "plot_name"]

#: Where the train commands export their models (``--checkpoint``, default ``runs/<model>``).
RUNS = Path("runs")


@register("translate",
          help="translate English sentences with a trained Bahdanau or Transformer model",
          description="Translate one or more English sentences into French with a model "
                      "exported by 'jax-attention train bahdanau' or 'train transformer' (their "
                      "--checkpoint, default runs/<model>; the kind is read from the model): "
                      "the book's preprocessing, greedy decoding or, with --beam K, beam search "
                      "(Transformer). Without --checkpoint the newest model under runs/ is used "
                      "(with --model, the newest of that kind), and a note on stderr says which. "
                      "Unknown words are read as <unk>; a sentence longer than the model's "
                      "num_steps is cut, with a note; an empty sentence is a usage error. Quote "
                      "each sentence. --out writes a heatmap (PNG) per sentence, --html one "
                      "interactive page of them all.")
def _translate(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("sentences", metavar="SENTENCE", nargs="+",
                        help="an English sentence, e.g. \"i lost .\"")
    parser.add_argument("--checkpoint", metavar="DIR", type=Path, default=None,
                        help="the exported model: the --checkpoint directory of a train command "
                             "(not its --checkpoint-dir of training checkpoints) (default: the "
                             "newest model under runs/, e.g. runs/transformer after 'make run')")
    parser.add_argument("--max-len", metavar="N", type=positive_int, default=None,
                        help="decoding steps (default: the checkpoint's num_steps)")
    parser.add_argument("--model", choices=("auto", *MODELS), default="auto",
                        help="the checkpoint's model; 'auto' reads it from the checkpoint; "
                             "without --checkpoint, picks the newest model of this kind under "
                             "runs/ (default: %(default)s)")
    parser.add_argument("--beam", metavar="K", type=positive_int, default=1,
                        help="beam size: 1 is greedy decoding, K > 1 beam search with length "
                             "normalisation (Transformer only; default: %(default)s)")
    parser.add_argument("--out", metavar="DIR", type=Path, default=None,
                        help="write the attention heatmap of each sentence into DIR, named "
                             "after it (translation_i-lost.png, ...); a name already there gets "
                             "a number (translation_i-lost-2.png), with a note")
    add_html_argument(parser, "the attention weights of every sentence, in order: for a "
                              "Transformer its encoder self-, decoder self- and encoder-decoder "
                              "attention as tabs, every layer and head, the tokens on both axes "
                              "and the weight under the pointer; for Bahdanau the alignment step "
                              "by step (choose an output token, see the source weights that "
                              "produced it)")
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


def _kind_of(directory: Path) -> str | None:
    """The model an export's config.json names (exports without ``"model"`` are Bahdanau
    ones), or ``None`` when it cannot be read."""
    try:
        record = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(record, dict):
        return None
    kind = record.get("model", "bahdanau")
    return kind if isinstance(kind, str) else None


def find_models(root: Path = RUNS, kind: str | None = None) -> list[tuple[Path, str | None]]:
    """The exported models directly under ``root`` (directories holding a ``config.json``),
    newest first (by that file's modification time), as ``(directory, model name or None)``;
    only those of ``kind`` when given."""
    found = []
    try:
        entries = list(root.iterdir())
    except OSError:
        return []
    for entry in entries:
        config = entry / "config.json"
        try:
            if entry.is_dir() and config.is_file():
                found.append((config.stat().st_mtime, entry))
        except OSError:
            continue
    found.sort(key=lambda item: (item[0], str(item[1])), reverse=True)
    models = [(entry, _kind_of(entry)) for _, entry in found]
    return [(entry, name) for entry, name in models if kind is None or name == kind]


def _train_command(kind: str | None) -> str:
    """The command that writes a model of ``kind`` (any kind: the one ``make run`` trains)."""
    if kind is None:
        return "'jax-attention train transformer' (or 'make run')"
    return f"'jax-attention train {kind}'"


def _choose_checkpoint(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Path:
    """``--checkpoint``, or the newest model under runs/ (a note on stderr says which); a usage
    error when there is none or when a directory of training checkpoints is given."""
    kind = None if args.model == "auto" else args.model
    if args.checkpoint is not None:
        directory = args.checkpoint
        if directory.is_dir() and not (directory / "config.json").exists():
            from jax_attention.runtime.checkpointing import step_directories

            steps = step_directories(directory)
            if steps:
                others = [str(path) for path, _ in find_models(kind=kind)]
                instead = (f" ({', '.join(others)} here)" if others else "")
                parser.error(
                    f"argument --checkpoint: {str(directory)!r} holds training checkpoints "
                    f"(steps {', '.join(map(str, steps[-3:]))}: a run's --checkpoint-dir), not "
                    f"an exported model; translate reads the model that run exported: pass "
                    f"the run's --checkpoint directory instead (default runs/<model>){instead}")
            inside = [str(path) for path, _ in find_models(directory, kind)]
            if inside:
                parser.error(f"argument --checkpoint: {str(directory)!r} is not a model but "
                             f"holds models in its folders; pass one of them: "
                             f"{', '.join(inside)}")
        return directory
    models = find_models(kind=kind)
    if not models:
        what = f"{kind} model" if kind else "trained model"
        parser.error(f"no {what} under {RUNS}/ (looked for {RUNS}/*/config.json); train one "
                     f"with {_train_command(kind)}, which writes {RUNS}/{kind or 'transformer'}, "
                     f"or pass --checkpoint DIR")
    directory, name = models[0]
    which = f"the {name} model" if name else "the model"
    of = f"newest {kind} model" if kind else "newest"
    others = ", ".join(str(path) for path, _ in models[1:])
    also = f"; also there: {others}" if others else ""
    print(f"{parser.prog}: note: using {which} in {directory} ({of} under {RUNS}/{also}); "
          f"--checkpoint DIR chooses another", file=sys.stderr)
    return directory


def _check_sentences(sentences: list[str], parser: argparse.ArgumentParser) -> None:
    """An empty (or blank) sentence is a usage error, before any model is loaded."""
    for number, sentence in enumerate(sentences, start=1):
        if not sentence.strip():
            which = f"sentence {number}" if len(sentences) > 1 else "the sentence"
            parser.error(f"argument SENTENCE: {which} is empty; give the words to translate, "
                         f"quoted, e.g. \"i lost .\"")


def _slug(sentence: str, limit: int = 40) -> str:
    """A file-name-safe slug of ``sentence``: lower-case letters and digits joined by ``-``."""
    words = re.findall(r"[a-z0-9]+", sentence.lower().replace("'", "").replace("’", ""))
    slug = ""
    for word in words:
        candidate = f"{slug}-{word}" if slug else word
        if len(candidate) > limit:
            break
        slug = candidate
    return slug or (words[0][:limit] if words else "sentence")


def plot_name(directory: Path, sentence: str, taken: set[str]) -> tuple[str, Path | None]:
    """``(stem, kept)``: ``translation_<slug>`` for ``sentence``, or with ``-2``, ``-3``, ...
    appended when that name is in ``taken`` (the names of this run) or its file is already in
    ``directory``; ``kept`` is the first such earlier file, which is not overwritten, or
    ``None``."""
    base = f"translation_{_slug(sentence)}"
    stem, number, kept = base, 1, None
    while True:
        if stem not in taken:
            if not (directory / f"{stem}.png").exists():
                return stem, kept
            kept = kept or directory / f"{stem}.png"
        number += 1
        stem = f"{base}-{number}"


def run_translate(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Handler of ``translate``; see its ``--help``."""
    check_output_arguments(args, parser)
    check_html_argument(args, parser)
    _check_sentences(args.sentences, parser)
    args.checkpoint = _choose_checkpoint(args, parser)
    start_compilation_cache(args, parser)
    from jax_attention.runtime.export import load_model

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
    interrupts.phase("evaluation")
    results = model.translate(args.sentences, max_len=args.max_len, beam_size=args.beam)
    failures: list[str] = []
    plots = _write_views(args, results, model, failures)
    record = {"checkpoint": str(args.checkpoint), "model": kind, "beam": args.beam,
              "translations": [_record(r) for r in results]}
    finish_outputs(args, "translate", record, plots, failures=failures)
    for failure in failures:
        print(f"{parser.prog}: error: {failure}", file=sys.stderr)
    return EXIT_WRITE_FAILED if failures else 0


def _write_views(args: argparse.Namespace, results: list, model, failures: list[str]) -> dict:
    """Print each translation and write its heatmap (``--out``) and the page of every view
    (``--html``); returns ``{name: path}`` of the files written. A file that cannot be written
    (a full disk) is a line in ``failures``, the translations printed all the same."""
    plots = {}
    if args.out is not None:
        from jax_attention.viz.plotting import translation_heatmap
    for result in results:
        print(f"{result.source} => {result.translation}")
        for note in result.notes:
            print(f"  note: {note}")
        if args.out is not None and not failures:
            stem, kept = plot_name(args.out, result.source, set(plots))
            if kept is not None:
                print(f"  note: {kept} exists (an earlier translation); not overwritten, this "
                      f"heatmap goes to {args.out / f'{stem}.png'}")
            interrupts.phase("plots")
            try:
                translation_heatmap(result, args.out / f"{stem}.png")
                plots[stem] = args.out / f"{stem}.png"
            except OSError as error:
                failures.append(f"could not write the heatmaps into {args.out} "
                                f"({provenance.os_reason(error)})")
    if args.html is not None:
        from jax_attention.viz.attention_view import save_views, translation_view

        interrupts.phase("plots")
        count = f"{len(results)} translation{'s' if len(results) != 1 else ''}"
        try:
            plots["view"] = save_views(args.html, [translation_view(r) for r in results],
                                       title=f"{model.spec.title} attention: {count} "
                                             f"({args.checkpoint})")
        except OSError as error:
            failures.append(f"could not write {args.html} ({provenance.os_reason(error)})")
    return plots
