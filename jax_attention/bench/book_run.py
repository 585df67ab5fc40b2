"""``python -m jax_attention.bench.book_run``: the book's PyTorch training of one model, whole.

What d2l's code does for the Transformer (§11.7.6) or the Bahdanau model (§11.4.3), in this
process: the data (``load_data_nmt``), the model with the book's initialisation
(``net.apply(xavier_init_weights)``), the book's ``train_seq2seq`` loop — eager, one step per
batch: ``loss.sum()``, backward, ``grad_clipping(net, 1)``, ``Adam.step``
(:func:`jax_attention.interop.torch_models.train_step`) — then ``predict_seq2seq`` on the book's
four sentences and their BLEU (k = 2). The model is the PyTorch mirror of ours
(:mod:`jax_attention.interop.torch_models`, the registry's ``torch_mirror``); the data are our
pipeline's (:func:`jax_attention.data.nmt.load_data_nmt`: the pairs, vocabularies and batches of
``jax-attention train``); the settings are the registry's, i.e. the book's (the model config's
defaults, the training config's, the model's default epochs), unless ``--epochs``,
``--num-examples`` or ``--seed`` change them.

It is the PyTorch peer of ``jax-attention bench train --whole-run``
(:mod:`jax_attention.bench.whole_run`), which starts it in a fresh process and times it from
start to exit. It prints one JSON record (and writes it to ``--json``): the loss and target
tokens/s of every epoch, the steady tokens/s (the median of the epochs after the first, as
``jax-attention train`` reports it, counting only the epochs that ran with the thread count
chosen), the translations and their BLEU, the seconds of each phase and PyTorch's threads.

Unlike the book's notebook, it draws no animated loss curve and saves no model; it imports JAX
(this package's modules do), which the book's code does not.

PyTorch's threads: ``--torch-threads auto`` (the default) lets 1 and PyTorch's default take
turns on the first four epochs and trains the rest with the faster
(:class:`~jax_attention.bench.torch_support.ThreadChoice`): on a quiet machine that is the book's
default, on a loaded one the count that is not slowed down by spinning OpenMP threads.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from jax_attention._checks import check_int
from jax_attention.models.registry import MODELS, get_model

__all__ = ["PEER", "book_run", "main"]

#: What this peer is, in one line (the records say it).
PEER = ("the book's train_seq2seq loop: PyTorch eager, one step per batch (loss.sum(), backward, "
        "grad_clipping to 1, Adam), on the d2l-style mirror in interop.torch_models with the "
        "book's Xavier initialisation, then the book's predict_seq2seq; a fresh process")


def _configs(kind: str, *, epochs: int | None, num_examples: int | None, seed: int):
    """The registry's (book's) model and training configs with the given changes."""
    spec = get_model(kind)
    changes = {name: value for name, value in (("epochs", epochs), ("num_examples", num_examples))
               if value is not None}
    return spec, spec.model_config(), spec.train_config(**changes, seed=seed)


def _train(net, nmt, train_config, choice, bos_id: int) -> dict:
    """The book's loop, timed per epoch: ``{"losses", "epoch_s", "threads_per_epoch"}``."""
    import torch

    from jax_attention.interop import torch_models

    optimizer = torch.optim.Adam(net.parameters(), lr=train_config.lr)
    tokens = int(nmt.train.tgt_valid_len.sum())
    losses, epoch_s, threads_per_epoch = [], [], []

    def epoch_of(epoch: int) -> float:
        total = 0.0
        for batch in nmt.batches(epoch):  # what the book's DataLoader hands over: tensors
            src, src_valid_len, tgt, tgt_valid_len = (torch.from_numpy(a) for a in batch)
            total += torch_models.train_step(net, optimizer, src, src_valid_len, tgt,
                                             tgt_valid_len, bos_id,
                                             train_config.clip_global_norm)
        return total / tokens

    net.train()
    for epoch in range(train_config.epochs):
        loss, seconds, threads = choice.timed(lambda: epoch_of(epoch))
        losses.append(loss)
        epoch_s.append(seconds)
        threads_per_epoch.append(threads)
    return {"losses": losses, "epoch_s": epoch_s, "threads_per_epoch": threads_per_epoch,
            "tokens_per_epoch": tokens}


def _steady(rates: list[float], threads_per_epoch: list[int], threads: int) -> float:
    """The median tokens/s of the epochs after the first that ran with the chosen ``threads``
    (``jax-attention train``'s steady figure, less the probes of the other thread count); the
    first epoch too when it is the only one that did."""
    chosen = [rate for rate, used in zip(rates, threads_per_epoch) if used == threads]
    later = [rate for epoch, (rate, used) in enumerate(zip(rates, threads_per_epoch))
             if epoch > 0 and used == threads]
    return statistics.median(later or chosen)


def _translate(net, nmt, num_steps: int) -> list[dict]:
    """The book's four sentences, greedy (``predict_seq2seq``), with their BLEU (k = 2)."""
    from jax_attention.data.nmt import encode_source
    from jax_attention.interop import torch_models
    from jax_attention.models.metrics import bleu
    from jax_attention.train.seq2seq import BOOK_PAIRS

    ids = {name: nmt.tgt_vocab[token] for name, token in (("bos_id", "<bos>"),
                                                          ("eos_id", "<eos>"))}
    results = []
    for source, reference in BOOK_PAIRS:
        src, valid_len = encode_source(source, nmt.src_vocab, num_steps)
        predicted = torch_models.predict_seq2seq(net, src, valid_len, max_len=num_steps, **ids)
        translation = " ".join(nmt.tgt_vocab.to_tokens(predicted))
        results.append({"source": source, "translation": translation, "reference": reference,
                        "bleu": bleu(translation, reference, k=2)})
    return results


def book_run(kind: str, *, epochs: int | None = None, num_examples: int | None = None,
             seed: int = 0, torch_threads: int | None = None, data=None) -> dict:
    """Train model ``kind`` the book's way with the PyTorch mirror, translate, score; the record.

    Args:
      kind: a registered model (``"transformer"``, ``"bahdanau"``).
      epochs, num_examples: change the book's settings (``None``: the registry's defaults).
      seed: seeds the batch order (as ours), the initial weights and dropout.
      torch_threads: PyTorch's intra-op threads, or ``None`` to choose on the first epochs.
      data: where the English–French data is (``None``: the usual places).

    Returns:
      A JSON-ready dict (see the module docstring).
    """
    import torch

    from jax_attention.bench.torch_support import ThreadChoice
    from jax_attention.data.nmt import load_data_nmt
    from jax_attention.interop.torch_models import xavier_init_weights

    start = time.perf_counter()
    spec, model_config, train_config = _configs(kind, epochs=epochs, num_examples=num_examples,
                                                seed=seed)
    choice = ThreadChoice(torch_threads)
    nmt = load_data_nmt(train_config.batch_size, model_config.num_steps,
                        train_config.num_examples, data=data, seed=train_config.seed)
    model_config = dataclasses.replace(model_config, src_vocab_size=len(nmt.src_vocab),
                                       tgt_vocab_size=len(nmt.tgt_vocab))
    torch.manual_seed(train_config.seed)
    net = spec.torch_mirror(model_config)
    net.apply(xavier_init_weights)
    setup_s = time.perf_counter() - start

    trained = _train(net, nmt, train_config, choice, nmt.tgt_vocab["<bos>"])
    training_s = time.perf_counter() - start - setup_s
    translations = _translate(net, nmt, model_config.num_steps)
    evaluation_s = time.perf_counter() - start - setup_s - training_s

    tokens = trained["tokens_per_epoch"]
    rates = [tokens / seconds for seconds in trained["epoch_s"]]
    steady = _steady(rates, trained["threads_per_epoch"], choice.threads)
    return {
        "peer": PEER,
        "model": spec.name,
        "config": {**model_config.record(), "training": train_config.record()},
        "losses": trained["losses"],
        "tokens_per_epoch": tokens,
        "tokens_per_sec_per_epoch": rates,
        "steady_tokens_per_sec": steady,
        "compile_s": None,  # eager: nothing is compiled
        "translations": translations,
        "num_bleu_1": sum(t["bleu"] == 1.0 for t in translations),
        "wall_time_s": time.perf_counter() - start,
        "timing": {"setup_s": setup_s, "training_s": training_s, "evaluation_s": evaluation_s},
        "torch_threads": choice.threads,
        "torch_threads_per_epoch": trained["threads_per_epoch"],
        "torch_thread_probe_s": {str(t): s for t, s in choice.probe_seconds.items()},
        "torch": torch.__version__,
    }


def _int_at_least(minimum: int, *, auto: bool = False):
    """argparse type: an integer >= ``minimum`` (or, with ``auto``, the word ``auto``: ``None``)."""
    def parse(text: str) -> int | None:
        if auto and text == "auto":
            return None
        try:
            return check_int("value", int(text), minimum)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected {'auto or ' if auto else ''}an integer >= {minimum}, got {text!r}"
            ) from None
    return parse


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m jax_attention.bench.book_run --model M [--epochs N] [--num-examples N]
    [--seed S] [--torch-threads auto|N] [--data PATH] [--json FILE]``: one JSON line."""
    parser = argparse.ArgumentParser(
        prog="python -m jax_attention.bench.book_run",
        description="The book's PyTorch training of one model (the mirror, the book's loop and "
                    "settings), translation of its four sentences and their BLEU; prints one "
                    "JSON record. The PyTorch peer of 'jax-attention bench train --whole-run'.")
    parser.add_argument("--model", choices=tuple(MODELS), required=True)
    parser.add_argument("--epochs", metavar="N", type=_int_at_least(1), default=None,
                        help="(default: the book's, the model's registry entry)")
    parser.add_argument("--num-examples", metavar="N", type=_int_at_least(1), default=None,
                        help="English–French pairs used (default: the book's 600)")
    parser.add_argument("--seed", metavar="N", type=_int_at_least(0), default=0,
                        help="seeds the batch order, the weights and dropout (default: 0)")
    parser.add_argument("--torch-threads", metavar="auto|N", type=_int_at_least(1, auto=True),
                        default=None,
                        help="PyTorch's intra-op threads (default: auto, the faster of 1 and "
                             "PyTorch's default over the first four epochs)")
    parser.add_argument("--data", metavar="PATH", type=Path, default=None,
                        help="the English–French data (default: as 'jax-attention train')")
    parser.add_argument("--json", metavar="FILE", type=Path, default=None,
                        help="also write the record to FILE")
    args = parser.parse_args(argv)
    record = book_run(args.model, epochs=args.epochs, num_examples=args.num_examples,
                      seed=args.seed, torch_threads=args.torch_threads, data=args.data)
    text = json.dumps(record)
    if args.json is not None:
        args.json.write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
