"""``bench train``: our compiled training against the book's PyTorch training of the same model.

The peers start from the same weights (our initialisation, copied into the PyTorch mirror with
:func:`jax_attention.interop.to_torch`), train on the same batches of the book's data
(:func:`jax_attention.data.nmt.load_data_nmt`, the book's settings), with the book's recipe: the
per-sequence masked cross-entropy summed over the batch, gradients clipped to global norm 1,
Adam.

* ``ours``: the code path of ``jax-attention train`` — the batches stacked on the host
  (:func:`jax_attention.train.loop.epoch_batches`'s padding, cut to the training pairs' longest
  sentences, :func:`jax_attention.train.loop.padded_lengths`), one compiled call of
  :func:`jax_attention.train.loop.train_steps` for the ``steps`` steps (the loss divided by
  ``num_steps``), the losses brought back to the host.
* ``ours-full`` (a default peer): the same on the batches at the full ``num_steps`` length, the
  work of the book's loop (``train --no-trim-padding``). ``ratio_as_shipped`` is ours / torch,
  ``ratio_same_work`` ours-full / the faster PyTorch peer.
* ``torch``: the book's ``train_seq2seq`` loop, eager, one
  :func:`jax_attention.interop.torch_models.train_step` per batch (``loss.sum()``, backward,
  ``grad_clipping``, ``Adam.step``), on the unpadded batches as the book's ``DataLoader`` gives
  them (:class:`~jax_attention.bench.torch_support.TorchRounds`).
* ``torch-compile`` (only when ``peers`` asks for it): the same loop with ``torch.compile``
  (inductor) of the loss — the module's forward, its backward by AOTAutograd — and of the
  update, clipping and Adam (:class:`~jax_attention.bench.torch_support.CompiledTorchRounds`),
  compiled in a first, untimed round with a fresh inductor cache; that round's time less a
  steady round's is its reported compilation. When ``torch.compile`` fails (no C++ compiler)
  the peer is reported as skipped, with the reason in one line, and the others run.

The sizes: ``size`` names one of :data:`SIZES` (:mod:`jax_attention.bench.train_sizes`, the one
place they are defined): ``book`` (the default: the book's model, 600 pairs, batch 64, 10
tokens), ``small`` and ``base`` (larger models, 2,000 and 5,000 pairs, batch 128, 20 tokens);
``sizes``, ``batch_size``, ``num_steps`` and ``num_examples`` override single settings. Every peer
is built from the same resolved settings; the record gives each peer's (``peers[name]
["settings"]``: sizes, dtype, threads, parameter count).

Each timed round trains every peer ``steps`` more steps on the same ``steps`` batches, the peers
alternating (:func:`~jax_attention.bench.common.time_interleaved`). Compilation is excluded from
the rounds and reported on its own. The record holds the target tokens per second and step time
(medians), the model FLOPs of one step (XLA's cost analysis of our step as lowered: forward,
backward, clipping and Adam — the same model for both peers), the fraction of a float32 GEMM
ceiling measured in the same run, both peers' losses after the timed steps (they should track;
with dropout they differ by the dropout masks, which the two frameworks draw differently) and
the ratios of ours to each peer (``ratio_tokens_per_s``: ours/torch; ``ratios_tokens_per_s``:
every peer that ran).

``bench train --devices 1,2,4`` measures how our training scales over devices instead
(:mod:`jax_attention.bench.train_devices`), and ``bench train --size book,small,base`` runs this
benchmark at each size in turn and sets the sizes side by side
(:mod:`jax_attention.bench.train_scaling`).

PyTorch's threads (:class:`~jax_attention.bench.torch_support.ThreadChoice`: on a loaded machine
its OpenMP threads can spin many times slower than one thread, which would flatter us): by default
the faster of 1 and its default over two untimed rounds each; the record says which and why.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Sequence

import numpy as np

from jax_attention.models import registry as registry
from jax_attention._checks import check_int
from jax_attention.bench.common import (environment, format_environment, gemm_ceiling,
                                        load_average, summarize, time_interleaved)
from jax_attention.bench.torch_support import (CompiledTorchRounds, ThreadChoice, TorchRounds,
                                               failure_line, torch_batches, torch_model,
                                               torch_num_threads)
from jax_attention.bench.train_sizes import BOOK_MODELS, SIZE_NAMES, SIZES, train_sizes
from jax_attention.runtime import distributed

__all__ = ["MODELS", "BOOK_MODELS", "SIZES", "SIZE_NAMES", "PEERS", "DEFAULT_PEERS",
           "bench_train", "format_train",
           "our_training", "stack_batches", "OurRounds", "training_batches", "shipped_lengths",
           "check_model_and_steps", "bench_settings"]

#: The models :func:`bench_train` can train: the names of
#: :data:`jax_attention.models.registry.MODELS`, in its order (the choices of ``bench train
#: --model``).
MODELS = tuple(registry.MODELS)

#: The peers :func:`bench_train` can time (``bench train --peers``), in the order they run, and
#: what each is (the record's ``description``).
PEERS = {
    "ours": "the compiled training step of 'jax-attention train': the round's steps in one "
            "jitted call (lax.scan), on the batches padded to batch_size rows and cut to the "
            "training pairs' longest sentences (the loss still divided by num_steps)",
    "ours-full": "the same compiled step on the batches at the book's full length (num_steps "
                 "positions): the work of the book's loop",
    "ours-packed": "ours with 'train --pack': each batch's sentence pairs packed into as few rows "
                   "of the default row length as fit them, told apart by segment ids (the "
                   "Transformer only)",
    "ours-bf16": "ours with 'train --dtype bfloat16': bfloat16 products and activations from "
                 "float32 parameters, Adam moments and accumulations",
    "ours-xla-defaults": "ours compiled with XLA's default options, without the library's own "
                         "for the CPU (jax_attention.runtime.compilation.CPU_COMPILER_OPTIONS)",
    "torch": "the book's train_seq2seq loop on the PyTorch mirror, eager: one train_step per "
             "batch (loss.sum(), backward, grad_clipping, Adam.step), on the unpadded batches",
    "torch-compile": "the same loop with torch.compile (inductor, its defaults) of the loss "
                     "(the module's forward; backward by AOTAutograd) and of the update "
                     "(clipping, Adam.step), compiled in an untimed round in a fresh inductor "
                     "cache",
}
#: The peers of a plain ``bench train``.
DEFAULT_PEERS = ("ours", "ours-full", "torch")
#: The peers that run our compiled step (each compiles in its first round).
_OUR_PEERS = ("ours", "ours-full", "ours-packed", "ours-bf16", "ours-xla-defaults")


def model_config(kind: str, sizes: dict, src_vocab_size: int, tgt_vocab_size: int,
                 num_steps: int | None = None):
    """The registry config of ``kind`` with these ``sizes`` and vocabularies."""
    spec = registry.get_model(kind)
    steps = {} if num_steps is None else {"num_steps": num_steps}
    return spec.model_config(**sizes, **steps, src_vocab_size=src_vocab_size,
                             tgt_vocab_size=tgt_vocab_size)


def our_model(kind: str, sizes: dict, src_vocab_size: int, tgt_vocab_size: int, seed: int,
              num_steps: int | None = None, dtype=None):
    """Our model in training mode, seeded as :func:`jax_attention.train.seq2seq.setup` seeds it
    (``dtype``: its computation's, as ``train --dtype`` sets it; the parameters are the same)."""
    import jax
    from flax import nnx

    rngs = nnx.Rngs(params=jax.random.key(seed), dropout=jax.random.key(seed, impl="rbg"))
    model = registry.get_model(kind).build(
        model_config(kind, sizes, src_vocab_size, tgt_vocab_size, num_steps), rngs, dtype=dtype)
    model.train()
    return model


def check_model_and_steps(model: str, steps: int) -> None:
    """``ValueError`` unless ``model`` is one of :data:`MODELS` and ``steps`` an integer >= 1."""
    if model not in MODELS:
        raise ValueError(f"model must be one of {MODELS}, got {model!r}")
    check_int("steps", steps, 1)


def _step_batches(nmt, steps: int):
    """The first ``steps`` batches of training, epoch after epoch, as the book's loop sees them
    (the last batch of an epoch smaller) and padded as ours trains on them."""
    from jax_attention.train.loop import pad_batch

    src_pad, tgt_pad = nmt.src_vocab["<pad>"], nmt.tgt_vocab["<pad>"]
    plain, padded, epoch = [], [], 0
    while len(plain) < steps:
        for batch in nmt.batches(epoch):
            if len(plain) == steps:
                break
            plain.append(batch)
            padded.append(pad_batch(batch, nmt.batch_size, src_pad, tgt_pad))
        epoch += 1
    return plain, padded


def shipped_lengths(model: str, nmt) -> tuple[int, int] | None:
    """The lengths ``jax-attention train MODEL`` cuts ``nmt``'s batches to with its default
    settings (:func:`jax_attention.train.seq2seq.training_lengths`): what ``ours`` trains on."""
    from jax_attention.train.seq2seq import training_lengths

    spec = registry.get_model(model)
    return training_lengths(spec, nmt, spec.train_config())


def training_batches(batch_size: int, num_steps: int, num_examples: int, data, seed: int,
                      steps: int):
    """The book's data and one round's batches: ``(nmt, plain, padded, tokens)`` with the
    batches of :func:`_step_batches` and ``tokens`` the target tokens of the round."""
    from jax_attention.data.nmt import load_data_nmt

    nmt = load_data_nmt(batch_size, num_steps, num_examples, data=data, seed=seed)
    plain, padded = _step_batches(nmt, steps)
    tokens = int(sum(int(batch[3].sum()) for batch in plain))
    return nmt, plain, padded, tokens


def our_training(kind: str, sizes: dict, nmt, seed: int, lr: float, dtype=None):
    """Our model for the vocabularies of ``nmt`` (:func:`our_model`: training mode, seeded as
    ``jax-attention train`` seeds it), its optimizer (Adam with the gradients clipped to global
    norm 1, :func:`jax_attention.train.loop.clipped_adam`) and the two split for the compiled
    steps: ``(model, optimizer, graphdef, state)``."""
    from flax import nnx

    from jax_attention.train.loop import clipped_adam

    model = our_model(kind, sizes, len(nmt.src_vocab), len(nmt.tgt_vocab), seed, nmt.num_steps,
                      dtype)
    optimizer = nnx.Optimizer(model, clipped_adam(float(lr)), wrt=nnx.Param)
    graphdef, state = nnx.split((model, optimizer))
    return model, optimizer, graphdef, state


def stack_batches(padded) -> tuple:
    """Padded batches ``[(src, src_valid_len, tgt, tgt_valid_len), ...]`` stacked as one compiled
    call of :func:`jax_attention.train.loop.train_steps` takes them: four arrays, each with a
    leading axis of the steps."""
    return tuple(np.stack(arrays) for arrays in zip(*padded))


class OurRounds:
    """Rounds of our training on the same batches, the code path of ``jax-attention train``
    (:func:`jax_attention.train.loop.train_epochs`): each call stacks the round's ``padded``
    batches on the host (:func:`stack_batches`; with a ``mesh``, split over its ``data`` axis, the
    state replicated), cut to ``lengths`` as ``train`` cuts them, trains them in one compiled call
    of :func:`~jax_attention.train.loop.train_steps` (loss divisor ``num_steps``), syncs once.

    Attributes:
      graphdef, state: the split model and optimizer; ``state`` as the rounds so far left it.
      padded: the batches trained on (cut); num_steps: the loss's divisor (``None``: theirs).
      losses: each round's summed loss per target token (``tokens`` a round).
      steps_trained: the steps of the rounds so far.
    """

    def __init__(self, graphdef, state, padded: list, bos_id: int, tokens: int, mesh=None, *,
                 lengths: tuple[int, int] | None = None, num_steps: int | None = None,
                 xla_defaults: bool = False):
        from jax_attention.train.loop import train_steps

        if lengths is not None:  # as jax-attention train cuts them (epoch_batches)
            padded = [(src[:, :lengths[0]], src_valid_len, tgt[:, :lengths[1]], tgt_valid_len)
                      for src, src_valid_len, tgt, tgt_valid_len in padded]
        self.graphdef, self.padded, self.num_steps = graphdef, padded, num_steps
        self.lengths = lengths
        self.state = state if mesh is None else distributed.replicate(state, mesh)
        self.losses: list[float] = []
        self.steps_trained = 0
        #: The XLA options the step compiles with (``xla_defaults``: none of the library's).
        self.compiler_options = {} if xla_defaults else train_steps.options()
        self._train_steps = train_steps.jitted(xla_defaults=True) if xla_defaults else train_steps
        self._bos_id = bos_id
        self._tokens, self._mesh = tokens, mesh

    def __call__(self) -> None:
        batches = stack_batches(self.padded)
        if self._mesh is not None:
            batches = distributed.shard_batches(batches, self._mesh)
        self.state, losses = self._train_steps(self.graphdef, self.state, batches, self._bos_id,
                                               False, None, self.num_steps)
        self.losses.append(sum(float(loss) for loss in distributed.to_host(losses))
                           / self._tokens)
        self.steps_trained += len(self.padded)


def _check_peers(peers: Sequence[str]) -> tuple[str, ...]:
    """``peers`` in the order they run (:data:`PEERS`'); ``ours`` and ``torch`` are required."""
    chosen = set(peers)
    if not chosen <= set(PEERS) or not {"ours", "torch"} <= chosen:
        raise ValueError(f"peers must include ours and torch, among {', '.join(PEERS)}; got "
                         f"{list(peers)!r}")
    return tuple(name for name in PEERS if name in chosen)


def _torch_rounds(kind: str, run: dict, nmt, initial: dict, plain: list, *, peers: Sequence[str],
                  tokens: int, seed: int, lr: float) -> dict:
    """The PyTorch peers among ``peers``: each its own mirror of our model (``run``'s settings),
    started from our initial weights, on the unpadded batches ``plain``."""
    import torch

    config = model_config(kind, run["model"], len(nmt.src_vocab), len(nmt.tgt_vocab),
                          run["num_steps"])
    batches = torch_batches(plain)
    classes = {"torch": TorchRounds, "torch-compile": CompiledTorchRounds}
    rounds = {}
    for name in (peer for peer in peers if peer in classes):
        torch.manual_seed(seed)
        rounds[name] = classes[name](torch_model(kind, config, initial), batches,
                                     bos_id=nmt.tgt_vocab["<bos>"], tokens=tokens, lr=lr)
    return rounds


def bench_settings(model: dict, batch_size: int, num_steps: int, num_examples: int, lr: float,
              seed: int, steps: int, repeats: int, warmup: int, *, devices,
              size: str = "book") -> dict:
    """The ``settings`` of a training benchmark's record."""
    return {"size": size, "model": model, "batch_size": batch_size, "num_steps": num_steps,
            "num_examples": num_examples, "lr": lr, "seed": seed, "steps": steps,
            "repeats": repeats, "warmup": warmup, "clip_global_norm": 1.0, "optimizer": "adam",
            "devices": devices}


def _flops_per_step(graphdef, state, padded_batch, bos_id: int, num_steps: int | None = None
                    ) -> float:
    """XLA's cost analysis of one training step (forward, backward, clipping, Adam; loss divisor
    ``num_steps``) as lowered, on one padded batch ``(src, src_valid_len, tgt, tgt_valid_len)``:
    before XLA's optimisations (whose count differs by a few percent, mostly dropout's bits).
    """
    import jax

    from jax_attention.models.bahdanau import teacher_forcing_inputs
    from jax_attention.train.loop import pure_step

    from jax_attention.models.packing import packed_teacher_forcing_inputs

    src, src_valid_len, tgt, tgt_valid_len = padded_batch
    dec_input = (teacher_forcing_inputs(tgt, bos_id) if np.ndim(tgt_valid_len) == 1  # packed:
                 else packed_teacher_forcing_inputs(tgt, tgt_valid_len, bos_id))
    batch = (src, src_valid_len, np.asarray(dec_input), tgt, tgt_valid_len)
    lowered = jax.jit(pure_step, static_argnums=(0, 3)).lower(graphdef, state, batch, num_steps)
    analysis = lowered.cost_analysis()
    if isinstance(analysis, (list, tuple)):  # older JAX: one dict per device
        analysis = analysis[0]
    if not analysis:  # some backends (XLA:GPU in JAX 0.11) give no analysis before compiling
        analysis = lowered.compile().cost_analysis() or {}
        if isinstance(analysis, (list, tuple)):
            analysis = analysis[0] if analysis else {}
    return float(analysis.get("flops", 0.0))


def _warm_up_compiled(model: str, rounds: dict, first_calls: dict, skipped: dict, say) -> None:
    """Compile the ``torch-compile`` peer in its first round (its seconds into ``first_calls``);
    when ``torch.compile`` fails (no C++ compiler for inductor, an unsupported Python), drop it
    from ``rounds`` and say why in ``skipped``, in one line."""
    say(f"{model}: torch.compile of the PyTorch step (inductor), in its first round")
    try:
        first_calls["torch-compile"] = rounds["torch-compile"].warm_up()
    except Exception as error:  # whatever torch.compile raised: the other peers go on
        skipped["torch-compile"] = f"torch.compile failed: {failure_line(error)}"
        del rounds["torch-compile"]
        say(f"{model}: torch-compile skipped ({skipped['torch-compile']})")


def _timed_rounds(model: str, rounds: dict, *, torch_threads: int | None, repeats: int,
                  warmup: int, steps: int, say) -> tuple[dict, dict, int, dict, dict]:
    """Compile ours, settle PyTorch's threads (on the eager ``torch`` peer), compile the
    ``torch-compile`` peer with those threads, even out the steps trained, then time the rounds
    of every peer of ``rounds`` (``{"ours": OurRounds, "torch": TorchRounds, ...}``), interleaved.

    Returns:
      ``(samples, first_calls, torch_threads, probes, skipped)``: the timings by peer, the
      seconds of each compiling call (ours, torch-compile), the threads PyTorch ran with, where
      it was probed the fastest round of each candidate thread count (seconds), and the peers
      that could not run, with the reason (they are gone from ``rounds``).
    """
    first_calls, skipped = {}, {}
    for name in (name for name in _OUR_PEERS if name in rounds):
        say(f"{model}: compiling {name}'s {steps} steps")
        start = time.perf_counter()
        rounds[name]()
        first_calls[name] = time.perf_counter() - start

    choice = ThreadChoice(torch_threads)
    choice.timed(rounds["torch"])  # a fixed count's warm-up round, or the first probe
    while choice.probing:
        choice.timed(rounds["torch"])
    torch_threads, probes = choice.threads, choice.probe_seconds
    if probes:
        say(f"{model}: torch threads {torch_threads} (fastest probe round of each: "
            + ", ".join(f"{t}: {s:.3f} s" for t, s in probes.items()) + ")")
    with torch_num_threads(torch_threads):
        if "torch-compile" in rounds:
            _warm_up_compiled(model, rounds, first_calls, skipped, say)
        # The same number of steps for all before the timed rounds: catch up on the probes.
        target = max(peer.steps_trained for peer in rounds.values())
        for peer in rounds.values():
            while peer.steps_trained < target:
                peer()
        say(f"{model}: {warmup} warm-up and {repeats} timed rounds of {steps} steps")
        samples = time_interleaved(rounds, repeats=repeats, warmup=warmup)
    return samples, first_calls, torch_threads, probes, skipped


def _peer_settings(run: dict, rounds: dict, initial: dict, torch_threads: int) -> dict:
    """What each peer trained with: the model's and the data's sizes, the dtype, the threads
    and the model's parameter count; ``rounds`` holds every peer asked for."""
    import jax

    common = {"size": run["size"], "model": run["model"], "batch_size": run["batch_size"],
              "num_steps": run["num_steps"], "num_examples": run["num_examples"],
              "dtype": "float32"}
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    platform = jax.default_backend()
    settings = {}
    for name in (name for name in _OUR_PEERS if name in rounds):
        first = rounds[name].padded[0]  # lengths: [sources, targets]
        settings[name] = {**common, "platform": platform,
                          "dtype": "bfloat16" if name == "ours-bf16" else "float32",
                          "lengths": [int(first[0].shape[1]), int(first[2].shape[1])],
                          "rows": int(first[0].shape[0]),
                          "target_padding_fraction": _padding_fraction(rounds[name].padded),
                          "compiler_options": rounds[name].compiler_options,
                          "threads": cores if platform == "cpu" else None,
                          "threads_note": "XLA's own thread pool (on CPU one thread per usable "
                                          "core)",
                          "parameters": int(sum(np.size(a) for a in jax.tree.leaves(initial)))}
    for name, peer in rounds.items():
        if name not in _OUR_PEERS:
            settings[name] = {**common, "platform": "cpu", "threads": torch_threads,
                              "parameters": int(sum(p.numel() for p in peer.net.parameters()))}
    if "torch-compile" in rounds:
        settings["torch-compile"]["compile"] = {
            "backend": "inductor", "mode": "default", "dynamic": "automatic",
            "cache": rounds["torch-compile"].cache}
    return settings


def _padding_fraction(batches) -> float:
    """The share of the target positions of ``batches`` (padded, cut or packed) that hold no
    token: what the step computes on padding."""
    total = sum(batch[2].size for batch in batches)
    real = sum(int(np.sum(batch[3] != 0)) if np.ndim(batch[3]) == 2 else int(np.sum(batch[3]))
               for batch in batches)
    return 1.0 - real / total


def _train_peers(samples: dict, rounds: dict, settings: dict, *, steps: int, tokens: int,
                 flops: dict, ceilings: dict, first_calls: dict, probes: dict,
                 skipped: dict) -> dict:
    """Each peer's record (``settings``: :func:`_peer_settings`): what it is, its settings, the
    timings, tokens/s, its model FLOPs per step (``flops`` by peer: the cut batches' for
    ``ours``, the full-length ones' for the others), GFLOP/s and share of the GEMM ceiling (in
    FLOP/s of its dtype: ``ceilings``) and its losses; the compiled peers' compilation time,
    PyTorch's thread probes; a skipped peer's reason."""
    peers = {}
    for name in settings:
        peer = {"status": "skipped" if name in skipped else "ok", "description": PEERS[name],
                "settings": settings[name]}
        if name in skipped:
            peers[name] = {**peer, "reason": skipped[name]}
            continue
        summary = summarize(samples[name])
        step_s = summary["median_s"] / steps
        peers[name] = {
            **peer, **summary,
            "step_ms": step_s * 1e3,
            "tokens_per_s": tokens / summary["median_s"],
            "flops_per_step": flops[name],
            "gflops": flops[name] / step_s / 1e9,
            "gemm_fraction": flops[name] / step_s / ceilings[settings[name]["dtype"]],
            "final_loss": rounds[name].losses[-1],
            "round_losses": list(rounds[name].losses),
            "steps_trained": rounds[name].steps_trained,
        }
        if name in first_calls:
            peers[name]["first_call_s"] = first_calls[name]
            peers[name]["compile_s"] = max(
                first_calls[name] - statistics.median(samples[name]), 0.0)
        if name not in _OUR_PEERS:
            peers[name]["threads"] = settings[name]["threads"]
    peers["torch"]["thread_probe_s"] = {str(t): s for t, s in probes.items()}
    return peers


def _our_rounds(model: str, run: dict, nmt, peers, split, padded, plain, tokens: int, *,
                seed: int, lr: float) -> dict:
    """:class:`OurRounds` of each of our peers among ``peers`` (``ours`` always), each on its
    own copy of the split model and optimizer ``split`` (each call donates the state it
    trains)."""
    import jax
    import jax.numpy as jnp

    graphdef, state = split
    bos_id = nmt.tgt_vocab["<bos>"]
    rounds = {"ours": OurRounds(graphdef, state, padded, bos_id, tokens, num_steps=nmt.num_steps,
                                lengths=shipped_lengths(model, nmt))}
    if "ours-full" in peers:  # its own copy: each call donates the state it trains
        rounds["ours-full"] = OurRounds(graphdef, jax.tree.map(jnp.copy, state), padded, bos_id,
                                        tokens)
    if "ours-packed" in peers:  # the round's sentences packed, as train --pack packs them
        if not registry.get_model(model).packs:
            raise ValueError(f"peer ours-packed: the {model} model cannot take packed batches")
        from jax_attention.data.batches import pack_batches, pack_length

        packed = pack_batches(nmt, plain, pack_length(nmt))
        rounds["ours-packed"] = OurRounds(graphdef, jax.tree.map(jnp.copy, state), packed,
                                          bos_id, tokens, num_steps=nmt.num_steps)
    if "ours-bf16" in peers:  # the same weights, computed in bfloat16
        *_, graphdef16, state16 = our_training(model, run["model"], nmt, seed, lr, jnp.bfloat16)
        rounds["ours-bf16"] = OurRounds(graphdef16, state16, padded, bos_id, tokens,
                                        num_steps=nmt.num_steps, lengths=rounds["ours"].lengths)
    if "ours-xla-defaults" in peers:  # ours, compiled with XLA's defaults
        rounds["ours-xla-defaults"] = OurRounds(
            graphdef, jax.tree.map(jnp.copy, state), padded, bos_id, tokens,
            num_steps=nmt.num_steps, lengths=rounds["ours"].lengths, xla_defaults=True)
    return rounds


def bench_train(model: str = "bahdanau", *, size: str = "book",
                peers: Sequence[str] = DEFAULT_PEERS, steps: int = 20, repeats: int = 7,
                warmup: int = 1, seed: int = 0, sizes: dict | None = None,
                batch_size: int | None = None, num_steps: int | None = None,
                num_examples: int | None = None, lr: float = 0.005,
                torch_threads: int | None = None, gemm_size: int = 2048, data=None,
                log: Callable[[str], object] | None = None) -> dict:
    """Time ``steps`` training steps of ours and of the PyTorch mirror (eager, and compiled by
    ``torch.compile`` when ``peers`` asks), interleaved.

    Args:
      model: ``"bahdanau"`` or ``"transformer"``.
      size: a named size of :data:`SIZES` (the model's and the data's settings; ``"book"``).
      peers: among :data:`PEERS`; ``ours`` and ``torch`` always run (a ``torch-compile`` that
        fails is reported as skipped).
      steps: training steps per timed round (batches taken epoch after epoch, from the first).
      repeats: timed rounds (>= 5); medians are reported.
      warmup: untimed rounds after the compiling call.
      seed: seeds the data order, our initial weights and both peers' dropout.
      sizes: model settings overriding the size's (e.g. a tiny model for tests; ``dropout=0``
        makes the peers' losses comparable step for step).
      batch_size, num_steps, num_examples: the data's, overriding the size's unless ``None``.
      lr: Adam's learning rate (the book's).
      torch_threads: PyTorch's intra-op threads; ``None``: see the module docstring.
      gemm_size: ``n`` of the ``n x n x n`` float32 GEMM that sets the ceiling.
      data: where the English–French data is (``None``: the usual places). log: for progress.

    Returns:
      A JSON-ready dict; see :func:`format_train` for the table it prints as.
    """
    import jax
    import jax.numpy as jnp
    from flax import nnx

    check_model_and_steps(model, steps)
    peers = _check_peers(peers)
    run = train_sizes(model, size, sizes, batch_size=batch_size, num_steps=num_steps,
                      num_examples=num_examples)
    say = log or (lambda line: None)
    load_before = load_average()
    environment_record = environment()

    nmt, plain, padded, tokens = training_batches(run["batch_size"], run["num_steps"],
                                                   run["num_examples"], data, seed, steps)
    ours_model, optimizer, graphdef, state = our_training(model, run["model"], nmt, seed, lr)
    initial = jax.tree.map(np.asarray, ours_model.params_dict())
    torch_rounds = _torch_rounds(model, run, nmt, initial, plain, peers=peers, tokens=tokens,
                                 seed=seed, lr=lr)
    bos_id = nmt.tgt_vocab["<bos>"]
    rounds = _our_rounds(model, run, nmt, peers, (graphdef, state), padded, plain, tokens,
                         seed=seed, lr=lr)
    say(f"{model}: cost analysis of one step")
    full_flops = _flops_per_step(graphdef, state, padded[0], bos_id)
    flops = {name: full_flops for name in peers}  # ours-bf16: the same model FLOPs as ours
    flops["ours"] = flops["ours-bf16"] = flops["ours-xla-defaults"] = _flops_per_step(
        graphdef, state, rounds["ours"].padded[0], bos_id, nmt.num_steps)
    if "ours-packed" in rounds:
        flops["ours-packed"] = _flops_per_step(graphdef, state, rounds["ours-packed"].padded[0],
                                               bos_id, nmt.num_steps)
    rounds.update(torch_rounds)
    every_peer = dict(rounds)

    samples, first_calls, torch_threads, probes, skipped = _timed_rounds(
        model, rounds, torch_threads=torch_threads, repeats=repeats, warmup=warmup,
        steps=steps, say=say)
    nnx.update((ours_model, optimizer), rounds["ours"].state)
    say(f"{model}: GEMM ceiling")
    gemm = gemm_ceiling(gemm_size)
    peer_records = _train_peers(
        samples, rounds, _peer_settings(run, every_peer, initial, torch_threads), steps=steps,
        tokens=tokens, flops=flops, ceilings={"float32": gemm["ceiling_gflops"] * 1e9,
                                              "bfloat16": gemm["bfloat16_ceiling_gflops"] * 1e9},
        first_calls=first_calls, probes=probes, skipped=skipped)
    settings = {**bench_settings(run["model"], run["batch_size"], run["num_steps"],
                            run["num_examples"], lr, seed, steps, repeats, warmup, devices=1,
                            size=run["size"]), "peers": list(peers)}
    return _train_record(model, settings, peer_records, tokens=tokens, flops=full_flops, gemm=gemm,
                         load_before=load_before, environment_record=environment_record)


def _train_record(model: str, settings: dict, peers: dict, *, tokens: int, flops: float,
                  gemm: dict, load_before, environment_record: dict) -> dict:
    """The record of :func:`bench_train`: the ratios of ours to each peer that ran and of the final
    losses; ``ratio_as_shipped`` (ours / torch) and ``ratio_same_work`` (ours-full / the faster
    PyTorch peer; ``None`` without ``ours-full``)."""
    ours = peers["ours"]
    ran = [name for name, peer in peers.items() if name != "ours" and peer["status"] == "ok"]
    ratios = {name: ours["tokens_per_s"] / peers[name]["tokens_per_s"] for name in ran}
    fastest_torch = max(set(ran) - set(_OUR_PEERS), key=lambda name: peers[name]["tokens_per_s"])
    same_work = ratios[fastest_torch] / ratios["ours-full"] if "ours-full" in ran else None
    losses = {name: abs(ours["final_loss"] - peers[name]["final_loss"])
              / abs(peers[name]["final_loss"]) for name in ran}
    return {
        "benchmark": "train",
        "model": model,
        "size": settings["size"],
        "settings": settings,
        "tokens_per_round": tokens,
        "tokens_per_step": tokens / settings["steps"],
        "flops_per_step": flops,
        "flops_source": "XLA cost analysis of one step of ours as lowered (forward, backward, "
                        "clipping, Adam)",
        "gemm": gemm,
        "peers": peers,
        "ratio_tokens_per_s": ratios["torch"],
        "ratios_tokens_per_s": ratios,
        "ratio_as_shipped": ratios["torch"],
        "ratio_same_work": same_work,
        "bfloat16_speedup": (peers["ours-bf16"]["tokens_per_s"] / ours["tokens_per_s"]
                             if "ours-bf16" in ran else None),
        "same_work_peer": fastest_torch,
        "final_loss_relative_difference": losses["torch"],
        "final_loss_relative_differences": losses,
        "load_average": {"before": load_before, "after": load_average()},
        "environment": environment_record,
    }


def format_train(record: dict) -> str:
    """The record as a small table: one row per peer (a skipped one: why), then the ratios and
    the settings."""
    settings, peers = record["settings"], record["peers"]
    size = settings.get("size", "book")
    lines = [
        format_environment(record["environment"]),
        f"bench train --model {record['model']}{'' if size == 'book' else ' --size ' + size}: "
        f"{settings['steps']} steps per round, "
        f"{record['tokens_per_round']} target tokens, {settings['repeats']} rounds "
        f"(medians), batch {settings['batch_size']}, num_steps {settings['num_steps']}, "
        f"{settings['num_examples']} pairs",
    ]
    if settings["model"] != BOOK_MODELS.get(record["model"]):
        lines.append("model: " + ", ".join(f"{key} {value}"
                                           for key, value in settings["model"].items()))
    width = max(8, 1 + max(map(len, peers)))
    lines += [
        f"model FLOPs per step {record['flops_per_step'] / 1e6:.1f} M "
        f"({record['flops_source']}); GEMM ceiling {record['gemm']['ceiling_gflops']:.1f} "
        f"GFLOP/s (n = {record['gemm']['n']}; bfloat16 operands "
        f"{record['gemm']['bfloat16_ceiling_gflops']:.1f}, the ceiling of ours-bf16)",
        f"{'peer':<{width}}{'tokens/s':>12}{'step ms':>10}{'GFLOP/s':>10}{'% GEMM':>9}"
        f"{'final loss':>12}",
    ]
    for name, peer in peers.items():
        if peer.get("status", "ok") != "ok":
            lines.append(f"{name:<{width}}skipped: {peer['reason']}")
            continue
        lines.append(f"{name:<{width}}{peer['tokens_per_s']:>12.0f}{peer['step_ms']:>10.2f}"
                     f"{peer['gflops']:>10.2f}{100 * peer['gemm_fraction']:>8.2f}%"
                     f"{peer['final_loss']:>12.5f}")
    return "\n".join(lines + _format_train_ratios(record))


def _format_train_ratios(record: dict) -> list[str]:
    """The lines under :func:`format_train`'s table: ratios, compilation, losses, load."""
    ours, torch = record["peers"]["ours"], record["peers"]["torch"]
    compiled = record["peers"].get("torch-compile", {"status": None})
    load = record["load_average"]
    lengths = ours["settings"]["lengths"]
    lines = [f"ours (cut to {lengths[0]}/{lengths[1]} source/target positions) / torch tokens/s: "
             f"{record['ratio_tokens_per_s']:.2f}x (as shipped); our compilation "
             f"{ours['compile_s']:.2f} s (excluded); torch threads {torch['threads']}"]
    if record.get("ratio_same_work") is not None:
        lines.append(f"ours-full / {record['same_work_peer']} tokens/s: "
                     f"{record['ratio_same_work']:.2f}x (the same work, full length); its "
                     f"compilation {record['peers']['ours-full']['compile_s']:.2f} s (excluded)")
    if "ours-packed" in record["ratios_tokens_per_s"]:
        packed = record["peers"]["ours-packed"]
        torch_ratio = packed["tokens_per_s"] / torch["tokens_per_s"]
        lines.append(f"ours-packed / torch tokens/s: {torch_ratio:.2f}x ({packed['settings']['rows']}"
                     f" rows of {packed['settings']['lengths'][1]}; target padding "
                     f"{100 * packed['settings']['target_padding_fraction']:.0f}% against "
                     f"{100 * ours['settings']['target_padding_fraction']:.0f}% cut); its "
                     f"compilation {packed['compile_s']:.2f} s (excluded)")
    if record.get("bfloat16_speedup") is not None:
        lines.append(f"ours-bf16 / ours tokens/s: {record['bfloat16_speedup']:.2f}x (bfloat16 "
                     "products against float32, both cut)")
    if "ours-xla-defaults" in record["ratios_tokens_per_s"]:
        plain = record["peers"]["ours-xla-defaults"]
        lines.append(f"ours / ours-xla-defaults tokens/s: "
                     f"{record['ratios_tokens_per_s']['ours-xla-defaults']:.2f}x; compilation "
                     f"{ours['compile_s']:.2f} s against {plain['compile_s']:.2f} s with XLA's "
                     "defaults")
    if compiled["status"] == "ok":
        lines.append(f"ours / torch-compile tokens/s: "
                     f"{record['ratios_tokens_per_s']['torch-compile']:.2f}x; its compilation "
                     f"{compiled['compile_s']:.2f} s (excluded; "
                     f"{compiled['settings']['compile']['cache']})")
    losses = f"final losses differ by {100 * record['final_loss_relative_difference']:.2f}%"
    if compiled["status"] == "ok":
        losses = ("final losses differ from ours by " + " and ".join(
            f"{100 * difference:.2f}% ({name})"
            for name, difference in record["final_loss_relative_differences"].items()))
    return lines + [f"{losses} (after {ours['steps_trained']} steps each)",
                    f"load average (1, 5, 15 min) before {load['before']}, after {load['after']}"]
