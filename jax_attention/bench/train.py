"""``bench train``: our compiled training against the book's PyTorch training of the same model.

Both peers start from the same weights (our initialisation, copied into the PyTorch mirror with
:func:`jax_attention.interop.to_torch`), train on the same batches of the book's data
(:func:`jax_attention.data.load_data_nmt`, the book's settings), with the book's recipe: the
per-sequence masked cross-entropy summed over the batch, gradients clipped to global norm 1,
Adam.

* ``ours``: the code path of ``jax-attention train`` — the batches stacked on the host
  (:func:`jax_attention.train._epoch_batches`'s padding), one compiled call of
  :func:`jax_attention.train._train_steps` for the ``steps`` steps, the losses brought back to
  the host.
* ``torch``: the book's ``train_seq2seq`` loop, eager, one
  :func:`jax_attention.interop.torch_models.train_step` per batch (``loss.sum()``, backward,
  ``grad_clipping``, ``Adam.step``), on the unpadded batches as the book's ``DataLoader`` gives
  them.

Each timed round trains both peers ``steps`` more steps on the same ``steps`` batches, the peers
alternating (:func:`~jax_attention.bench.common.time_interleaved`). Compilation is excluded from
the rounds and reported on its own. The record holds the target tokens per second and step time
(medians), the model FLOPs of one step (XLA's cost analysis of our step as lowered: forward,
backward, clipping and Adam — the same model for both peers), the fraction of a float32 GEMM
ceiling measured in the same run, both peers' losses after the timed steps (they should track;
with dropout they differ by the dropout masks, which the two frameworks draw differently) and
the ratio ours/torch.

PyTorch's thread count: under a shared, loaded machine PyTorch's OpenMP threads can spin against
other processes and run many times slower than with one thread, which would flatter us. By
default (``torch_threads=None``) each candidate (1 and PyTorch's default) trains one untimed
round and the faster is kept; the record says which and what each took.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import numpy as np

from jax_attention.bench.common import (environment, format_environment, gemm_ceiling,
                                        load_average, summarize, time_interleaved)

__all__ = ["MODELS", "BOOK_MODELS", "bench_train", "format_train"]

MODELS = ("bahdanau", "transformer")

#: The book's model settings (d2l §11.4.3 and §11.7.6).
BOOK_MODELS = {
    "bahdanau": {"embed_size": 32, "num_hiddens": 32, "num_layers": 2, "dropout": 0.1},
    "transformer": {"num_hiddens": 32, "ffn_num_hiddens": 64, "num_heads": 4, "num_layers": 2,
                    "dropout": 0.1, "max_positions": 1000},
}


def _our_model(kind: str, sizes: dict, src_vocab_size: int, tgt_vocab_size: int, seed: int):
    """Our model in training mode, seeded as ``jax_attention.train`` seeds it."""
    import jax
    from flax import nnx

    rngs = nnx.Rngs(params=jax.random.key(seed), dropout=jax.random.key(seed, impl="rbg"))
    if kind == "bahdanau":
        from jax_attention.bahdanau import BahdanauSeq2Seq

        model = BahdanauSeq2Seq(src_vocab_size, tgt_vocab_size, sizes["embed_size"],
                                sizes["num_hiddens"], sizes["num_layers"], sizes["dropout"],
                                rngs=rngs)
    else:
        from jax_attention.transformer import TransformerSeq2Seq

        model = TransformerSeq2Seq(src_vocab_size, tgt_vocab_size, sizes["num_hiddens"],
                                   sizes["ffn_num_hiddens"], sizes["num_heads"],
                                   sizes["num_layers"], sizes["dropout"],
                                   max_positions=sizes["max_positions"], rngs=rngs)
    model.train()
    return model


def _torch_model(kind: str, sizes: dict, src_vocab_size: int, tgt_vocab_size: int, params):
    """The PyTorch mirror with our initial weights, in training mode."""
    from jax_attention.interop import to_torch
    from jax_attention.interop import torch_models as tm

    if kind == "bahdanau":
        model = tm.BahdanauSeq2Seq(src_vocab_size, tgt_vocab_size, sizes["embed_size"],
                                   sizes["num_hiddens"], sizes["num_layers"], sizes["dropout"])
    else:
        model = tm.TransformerSeq2Seq(src_vocab_size, tgt_vocab_size, sizes["num_hiddens"],
                                      sizes["ffn_num_hiddens"], sizes["num_heads"],
                                      sizes["num_layers"], sizes["dropout"],
                                      max_len=sizes["max_positions"])
    model.load_state_dict(to_torch(params, kind))
    model.train()
    return model


def _step_batches(nmt, steps: int):
    """The first ``steps`` batches of training, epoch after epoch, as the book's loop sees them
    (the last batch of an epoch smaller) and padded as ours trains on them."""
    from jax_attention.train import _pad_batch

    src_pad, tgt_pad = nmt.src_vocab["<pad>"], nmt.tgt_vocab["<pad>"]
    plain, padded, epoch = [], [], 0
    while len(plain) < steps:
        for batch in nmt.batches(epoch):
            if len(plain) == steps:
                break
            plain.append(batch)
            padded.append(_pad_batch(batch, nmt.batch_size, src_pad, tgt_pad))
        epoch += 1
    return plain, padded


def _flops_per_step(graphdef, state, batch) -> float:
    """XLA's cost analysis of one training step (forward, backward, clipping, Adam) as lowered.

    The program as written, before XLA's optimisations (compiling it only to count would cost
    seconds; the optimised program's count differs by a few percent, mostly the random bits of
    dropout).
    """
    import jax

    from jax_attention.train import _pure_step

    analysis = jax.jit(_pure_step, static_argnums=0).lower(graphdef, state, batch).cost_analysis()
    if isinstance(analysis, (list, tuple)):  # older JAX: one dict per device
        analysis = analysis[0]
    return float(analysis.get("flops", 0.0))


def _torch_threads_context(torch, threads: int):
    class _Threads:
        def __enter__(self):
            self.before = torch.get_num_threads()
            torch.set_num_threads(threads)

        def __exit__(self, *exc):
            torch.set_num_threads(self.before)

    return _Threads()


def bench_train(model: str = "bahdanau", *, steps: int = 20, repeats: int = 7, warmup: int = 1,
                seed: int = 0, sizes: dict | None = None, batch_size: int = 64,
                num_steps: int = 10, num_examples: int = 600, lr: float = 0.005,
                torch_threads: int | None = None, gemm_size: int = 2048, data=None,
                log: Callable[[str], object] | None = None) -> dict:
    """Time ``steps`` training steps of ours and of the PyTorch mirror, interleaved.

    Args:
      model: ``"bahdanau"`` or ``"transformer"``.
      steps: training steps per timed round (batches taken epoch after epoch, from the first).
      repeats: timed rounds (>= 5); medians are reported.
      warmup: untimed rounds after the compiling call.
      seed: seeds the data order, our initial weights and both peers' dropout.
      sizes: model settings overriding :data:`BOOK_MODELS` (e.g. a tiny model for tests;
        ``dropout=0`` makes the two peers' losses comparable step for step).
      batch_size, num_steps, num_examples, lr: the data and the optimizer (the book's defaults).
      torch_threads: PyTorch's intra-op threads; ``None`` picks the faster of 1 and its default
        (see the module docstring).
      gemm_size: ``n`` of the ``n x n x n`` float32 GEMM that sets the ceiling.
      data: where the English–French data is (``None``: the usual places).
      log: called with progress lines, or ``None``.

    Returns:
      A JSON-ready dict; see :func:`format_train` for the table it prints as.
    """
    import jax
    import torch
    from flax import nnx

    from jax_attention.bahdanau import teacher_forcing_inputs
    from jax_attention.data import load_data_nmt
    from jax_attention.interop import torch_models as tm
    from jax_attention.train import _clipped_adam, _train_steps

    if model not in MODELS:
        raise ValueError(f"model must be one of {MODELS}, got {model!r}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an integer >= 1, got {steps!r}")
    say = log or (lambda line: None)
    settings = {**BOOK_MODELS[model], **(sizes or {})}
    load_before = load_average()
    environment_record = environment()

    nmt = load_data_nmt(batch_size, num_steps, num_examples, data=data, seed=seed)
    V_src, V_tgt = len(nmt.src_vocab), len(nmt.tgt_vocab)
    bos_id = nmt.tgt_vocab["<bos>"]
    plain, padded = _step_batches(nmt, steps)
    tokens = int(sum(int(batch[3].sum()) for batch in plain))

    ours_model = _our_model(model, settings, V_src, V_tgt, seed)
    optimizer = nnx.Optimizer(ours_model, _clipped_adam(float(lr)), wrt=nnx.Param)
    initial = jax.tree.map(np.asarray, ours_model.params_dict())
    torch.manual_seed(seed)
    torch_model = _torch_model(model, settings, V_src, V_tgt, initial)
    torch_optimizer = torch.optim.Adam(torch_model.parameters(), lr=lr)
    torch_batches = [tuple(torch.from_numpy(np.ascontiguousarray(a)) for a in batch)
                     for batch in plain]

    graphdef, state = nnx.split((ours_model, optimizer))
    say(f"{model}: cost analysis of one step")
    first = padded[0]
    flops = _flops_per_step(graphdef, state, (first[0], first[1],
                                              np.asarray(teacher_forcing_inputs(first[2], bos_id)),
                                              first[2], first[3]))
    ours_losses: list[float] = []
    torch_losses: list[float] = []
    trained = {"ours": 0, "torch": 0}

    def ours() -> None:
        nonlocal state
        # As train._train_epochs: stack on the host, one compiled call, one sync on the losses.
        batches = tuple(np.stack(arrays) for arrays in zip(*padded))
        state, losses = _train_steps(graphdef, state, batches, bos_id)
        ours_losses.append(float(sum(float(loss) for loss in np.asarray(losses))) / tokens)
        trained["ours"] += steps

    def torch_round() -> None:
        total = 0.0
        for src, src_valid_len, tgt, tgt_valid_len in torch_batches:
            total += tm.train_step(torch_model, torch_optimizer, src, src_valid_len, tgt,
                                   tgt_valid_len, bos_id)
        torch_losses.append(total / tokens)
        trained["torch"] += steps

    say(f"{model}: compiling our {steps} steps")
    start = time.perf_counter()
    ours()
    first_call_s = time.perf_counter() - start

    probes = {}
    if torch_threads is None:
        candidates = sorted({1, torch.get_num_threads()})
        for threads in candidates:
            with _torch_threads_context(torch, threads):
                start = time.perf_counter()
                torch_round()
                probes[threads] = time.perf_counter() - start
        torch_threads = min(probes, key=probes.get)
        say(f"{model}: torch threads {torch_threads} (probe rounds: "
            + ", ".join(f"{t}: {s:.3f} s" for t, s in probes.items()) + ")")
    else:
        with _torch_threads_context(torch, torch_threads):
            torch_round()
    # The same number of steps for both before the timed rounds: catch ours up on the probes.
    while trained["ours"] < trained["torch"]:
        ours()
    while trained["torch"] < trained["ours"]:
        with _torch_threads_context(torch, torch_threads):
            torch_round()

    say(f"{model}: {warmup} warm-up and {repeats} timed rounds of {steps} steps")
    with _torch_threads_context(torch, torch_threads):
        samples = time_interleaved({"ours": ours, "torch": torch_round}, repeats=repeats,
                                   warmup=warmup)
    nnx.update((ours_model, optimizer), state)
    say(f"{model}: GEMM ceiling")
    gemm = gemm_ceiling(gemm_size)
    ceiling = gemm["ceiling_gflops"] * 1e9

    peers = {}
    for name, losses in (("ours", ours_losses), ("torch", torch_losses)):
        summary = summarize(samples[name])
        step_s = summary["median_s"] / steps
        peers[name] = {
            **summary,
            "step_ms": step_s * 1e3,
            "tokens_per_s": tokens / summary["median_s"],
            "gflops": flops / step_s / 1e9,
            "gemm_fraction": flops / step_s / ceiling,
            "final_loss": losses[-1],
            "round_losses": list(losses),
            "steps_trained": trained[name],
        }
    median_ours = statistics.median(samples["ours"])
    peers["ours"]["first_call_s"] = first_call_s
    peers["ours"]["compile_s"] = max(first_call_s - median_ours, 0.0)
    peers["torch"]["threads"] = torch_threads
    peers["torch"]["thread_probe_s"] = {str(t): s for t, s in probes.items()}
    final_ours, final_torch = peers["ours"]["final_loss"], peers["torch"]["final_loss"]
    return {
        "benchmark": "train",
        "model": model,
        "settings": {"model": settings, "batch_size": batch_size, "num_steps": num_steps,
                     "num_examples": num_examples, "lr": lr, "seed": seed, "steps": steps,
                     "repeats": repeats, "warmup": warmup, "clip_global_norm": 1.0,
                     "optimizer": "adam", "devices": 1},
        "tokens_per_round": tokens,
        "tokens_per_step": tokens / steps,
        "flops_per_step": flops,
        "flops_source": "XLA cost analysis of one step of ours as lowered (forward, backward, "
                        "clipping, Adam)",
        "gemm": gemm,
        "peers": peers,
        "ratio_tokens_per_s": peers["ours"]["tokens_per_s"] / peers["torch"]["tokens_per_s"],
        "final_loss_relative_difference": abs(final_ours - final_torch) / abs(final_torch),
        "load_average": {"before": load_before, "after": load_average()},
        "environment": environment_record,
    }


def format_train(record: dict) -> str:
    """The record as a small table: one row per peer, then the ratio and the settings."""
    settings = record["settings"]
    lines = [
        format_environment(record["environment"]),
        f"bench train --model {record['model']}: {settings['steps']} steps per round, "
        f"{record['tokens_per_round']} target tokens, {settings['repeats']} rounds "
        f"(medians), batch {settings['batch_size']}, num_steps {settings['num_steps']}, "
        f"{settings['num_examples']} pairs",
        f"model FLOPs per step {record['flops_per_step'] / 1e6:.1f} M "
        f"({record['flops_source']}); GEMM ceiling {record['gemm']['ceiling_gflops']:.1f} "
        f"GFLOP/s (n = {record['gemm']['n']})",
        f"{'peer':<8}{'tokens/s':>12}{'step ms':>10}{'GFLOP/s':>10}{'% GEMM':>9}"
        f"{'final loss':>12}",
    ]
    for name, peer in record["peers"].items():
        lines.append(f"{name:<8}{peer['tokens_per_s']:>12.0f}{peer['step_ms']:>10.2f}"
                     f"{peer['gflops']:>10.2f}{100 * peer['gemm_fraction']:>8.2f}%"
                     f"{peer['final_loss']:>12.5f}")
    ours, torch = record["peers"]["ours"], record["peers"]["torch"]
    load = record["load_average"]
    lines += [
        f"ours / torch tokens/s: {record['ratio_tokens_per_s']:.2f}x; our compilation "
        f"{ours['compile_s']:.2f} s (excluded); torch threads {torch['threads']}",
        f"final losses differ by {100 * record['final_loss_relative_difference']:.2f}% "
        f"(after {ours['steps_trained']} steps each)",
        f"load average (1, 5, 15 min) before {load['before']}, after {load['after']}",
    ]
    return "\n".join(lines)
