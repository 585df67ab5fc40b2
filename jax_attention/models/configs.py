"""The configuration objects of a training run: one frozen dataclass per concern.

- :class:`BahdanauConfig`, :class:`TransformerConfig` — a model's hyper-parameters, the book's
  defaults written once here (d2l §11.4.3 and §11.7.6). The vocabulary sizes come from the data
  (``None`` until the trainer fills them in with :func:`dataclasses.replace`).
- :class:`TrainConfig` — the data and the optimisation (batch, learning rate, epochs, seed, ...).
- :class:`LongRunConfig` — training checkpoints, resumption and non-finite steps.
- :class:`DeviceConfig` — the device mesh (data and tensor parallelism).

Each is validated once, in ``__post_init__``, with the package's messages (``"embed_size must
be an integer >= 1, got 0"``). One object flows from the command line (whose flags are built
from the fields' metadata, :mod:`jax_attention.cli.arguments`) through the trainer
(:func:`jax_attention.train.train_seq2seq`) and the model to the export
(:func:`jax_attention.runtime.export.save_model` stores :meth:`record`; :func:`~jax_attention.runtime.export.
load_model` rebuilds the config from it).

A field's ``metadata`` says how it is checked (``check``) and how it appears on the command line
(``help``, ``metavar``; ``flag=False`` for fields that are not flags, such as the vocabulary
sizes). Adding a field here adds its flag, its check and its place in checkpoints and exports.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path

from jax_attention import _checks

__all__ = ["BahdanauConfig", "TransformerConfig", "TrainConfig", "LongRunConfig", "DeviceConfig",
           "ModelConfig", "DEFAULT_KEEP", "MAX_SEED", "step_program"]

#: The largest seed: JAX's keys take a signed 64-bit seed.
MAX_SEED = 2**63 - 1

#: Training checkpoints kept by default (``--keep``): the newest, and two to fall back on.
DEFAULT_KEEP = 3


def _option(default, check, help: str, metavar: str | None = None, *, flag: bool = True,
            added: bool = False):
    """A config field: its default, how it is checked, and its command-line flag. ``added``: the
    field came after records were first written, so a record without it takes the default."""
    return field(default=default, metadata={"check": check, "help": help, "metavar": metavar,
                                            "flag": flag, "added": added})


def validate(config) -> None:
    """Check every field of a config dataclass by its ``check`` metadata (raises ``ValueError``)
    and store the normalised value (Python ``int``/``float``/``bool``, JSON-ready)."""
    for spec in dataclasses.fields(config):
        check = spec.metadata.get("check")
        if check is not None:
            value = _checks.check_setting(spec.name, getattr(config, spec.name), check)
            object.__setattr__(config, spec.name, value)


class _Validated:
    """Validated on construction; :meth:`record` is the JSON-ready ``asdict``."""

    def __post_init__(self):
        validate(self)
        self._check_together()

    def _check_together(self) -> None:
        """Checks that involve several fields (none by default)."""

    def record(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_record(cls, record: dict, *, where: str = "config", complete: bool = True):
        """The config of a stored :meth:`record` (unknown keys ignored).

        Args:
          where: names the record in error messages.
          complete: every field must be there (a model's sizes) but those marked ``added``
            (newer than the first records, e.g. ``num_kv_heads``); else missing ones take their
            defaults (settings added after the record was written).

        Raises:
          ValueError: a field is missing (``complete``) or invalid; the message names ``where``.
        """
        names = [spec.name for spec in dataclasses.fields(cls)]
        missing = [spec.name for spec in dataclasses.fields(cls)
                   if spec.name not in record and not spec.metadata.get("added")]
        if complete and missing:
            raise ValueError(f"{where} lacks {missing}")
        try:
            return cls(**{name: record[name] for name in names if name in record})
        except (TypeError, ValueError) as error:
            raise ValueError(f"{where}: {error}") from None


_VOCAB = "vocabulary size, from the data"


@dataclass(frozen=True)
class BahdanauConfig(_Validated):
    """The seq2seq model with Bahdanau attention — d2l §11.4 (book: 32, 32, 2, 0.1, 10).

    Attributes:
      embed_size: embedding size ``E``.
      num_hiddens: GRU and attention hidden size ``h``.
      num_layers: GRU layers in the encoder and the decoder.
      dropout: dropout between GRU layers and on the attention weights, in ``[0, 1)``.
      num_steps: tokens per sequence (padded or cut), the model's source length and its
        decoding length.
      src_vocab_size, tgt_vocab_size: from the data; ``None`` before it is loaded.
    """

    embed_size: int = _option(32, ("int", 1), "embedding size", "E")
    num_hiddens: int = _option(32, ("int", 1), "GRU and attention hidden size", "H")
    num_layers: int = _option(2, ("int", 1), "GRU layers in the encoder and the decoder", "L")
    dropout: float = _option(0.1, ("rate",), "dropout between GRU layers and on the attention "
                                             "weights", "P")
    num_steps: int = _option(10, ("int", 1), "tokens per sequence, padded or cut", "T")
    src_vocab_size: int | None = _option(None, ("int_or_none", 1), _VOCAB, flag=False)
    tgt_vocab_size: int | None = _option(None, ("int_or_none", 1), _VOCAB, flag=False)


@dataclass(frozen=True)
class TransformerConfig(_Validated):
    """The Transformer encoder–decoder — d2l §11.7.6 (book: 32, 64, 4, 2, 0.1, 10).

    Attributes:
      num_hiddens: model width ``D``.
      ffn_num_hiddens: hidden width of the position-wise FFN.
      num_heads: attention heads ``N``; must divide ``num_hiddens``.
      num_kv_heads: key/value heads ``N_kv`` of every attention (grouped-query attention, 1:
        multi-query), dividing ``num_heads``; ``None``: ``num_heads``, the book's model. The
        key/value cache of decoding holds ``N_kv`` heads, ``N / N_kv`` times less memory per
        token; ``W_k``, ``W_v`` are ``(D, N_kv D / N)``. Records written before this field
        existed load with ``None``.
      num_layers: encoder and decoder blocks.
      dropout: after the positional encoding, on the attention weights and in add & norm.
      num_steps: tokens per sequence (padded or cut); at most ``max_positions``.
      max_positions: rows of the sinusoidal position table.
      src_vocab_size, tgt_vocab_size: from the data; ``None`` before it is loaded.
    """

    num_hiddens: int = _option(32, ("int", 1), "model width", "D")
    ffn_num_hiddens: int = _option(64, ("int", 1), "hidden width of the position-wise FFN", "F")
    num_heads: int = _option(4, ("int", 1), "attention heads; must divide --num-hiddens", "N")
    num_kv_heads: int | None = _option(
        None, ("int_or_none", 1), "key/value heads of grouped-query attention (1: multi-query), "
                                  "dividing --num-heads; the decoding cache holds only these; "
                                  "None: --num-heads, the book's", "N_KV", added=True)
    num_layers: int = _option(2, ("int", 1), "encoder and decoder blocks", "L")
    dropout: float = _option(0.1, ("rate",), "dropout after the positional encoding, on the "
                                             "attention weights and in add & norm", "P")
    num_steps: int = _option(10, ("int", 1), "tokens per sequence, padded or cut", "T")
    max_positions: int = _option(1000, ("int", 1), "rows of the sinusoidal position table",
                                 "P", flag=False)
    src_vocab_size: int | None = _option(None, ("int_or_none", 1), _VOCAB, flag=False)
    tgt_vocab_size: int | None = _option(None, ("int_or_none", 1), _VOCAB, flag=False)

    def _check_together(self):
        _checks.check_num_heads(self.num_hiddens, self.num_heads)
        _checks.check_num_kv_heads(self.num_heads, self.num_kv_heads)
        if self.num_steps > self.max_positions:
            raise ValueError(f"num_steps = {self.num_steps} exceeds max_positions = "
                             f"{self.max_positions}")


#: Any registered model's config (see :data:`jax_attention.models.registry.MODELS`).
ModelConfig = BahdanauConfig | TransformerConfig


@dataclass(frozen=True)
class TrainConfig(_Validated):
    """The data and the optimisation of a seq2seq run — the book's ``train_seq2seq``.

    Gradients of the batch's summed loss are clipped to global norm ``clip_global_norm``, then
    Adam (``lr``) updates the parameters.

    Attributes:
      batch_size: examples per batch.
      lr: Adam's learning rate.
      epochs: passes over the data (book: 250 for Bahdanau, 200 for the Transformer: each
        model's registry entry holds its default).
      num_examples: English–French pairs used (the first ones of the file).
      val_fraction: the fraction of the pairs held out and scored after training (BLEU, k = 4).
      seed: seeds the batch order, the parameters and dropout.
      clip_global_norm: the global gradient norm clip (book: 1).
      dtype: the training's computation: ``"float32"`` (the book's), or ``"bfloat16"``: products
        and activations in bfloat16, from a bfloat16 copy of the float32 parameters (Adam's
        moments, the gradients, the softmax's, the layer norm's and the loss's accumulations stay
        float32).
      trim_padding: cut each batch to the training split's longest sentence instead of padding
        it to ``num_steps``, the loss still divided by ``num_steps``
        (:func:`jax_attention.train.loop.padded_lengths`): the book's losses and gradients, to
        rounding, on less padding. False: the book's full-length batches.
      pack: pack the sentence pairs of each batch into as few rows as fit ``pack_length``
        tokens, told apart by segment ids (:mod:`jax_attention.data.packing`; the Transformer
        only): the same sentences and losses as the unpacked batch, on less padding.
      pack_length: the packed rows' length (sources and targets); 0: twice the training pairs'
        longest sentence, rounded up to a multiple of 8.
    """

    batch_size: int = _option(64, ("int", 1), "examples per batch", "N")
    lr: float = _option(0.005, ("positive_float",), "Adam learning rate", "LR")
    epochs: int = _option(250, ("int", 1), "passes over the data", "N")
    num_examples: int = _option(600, ("int", 1), "English–French pairs used", "N")
    val_fraction: float = _option(
        0.0, ("rate",), "hold out this fraction of the pairs and report their corpus BLEU "
                        "(k = 4) and mean sentence BLEU, greedy decoding", "P")
    seed: int = _option(0, ("int_range", 0, MAX_SEED),
                        "seeds the batch order, the parameters and dropout; the same seed gives "
                        "the same losses bit for bit on CPU", "N")
    clip_global_norm: float = _option(1.0, ("positive_float",), "global gradient norm clip",
                                      flag=False)
    dtype: str = _option("float32", ("choice", ("float32", "bfloat16")),
                         "the training's computation: bfloat16 products and activations from "
                         "float32 parameters, moments and accumulations (mixed precision)",
                         "DTYPE", added=True)
    trim_padding: bool = _option(
        True, ("bool",), "cut each batch to the longest sentence of the training pairs instead of "
                         "padding it to --num-steps, the loss still divided by --num-steps (the "
                         "same losses and gradients to rounding; dropout draws other masks); "
                         "--no-trim-padding: the book's full-length batches", added=True)
    pack: bool = _option(
        False, ("bool",), "pack each batch's sentence pairs into as few rows of --pack-length "
                          "tokens as fit them, told apart by segment ids (the Transformer only): "
                          "the same sentences and losses on less padding", added=True)
    pack_length: int = _option(
        0, ("int", 0), "the packed rows' length; 0: twice the longest training sentence, "
                       "rounded up to a multiple of 8", "N", added=True)

    def record(self) -> dict:
        """What checkpoints and exports store: the fields and the fixed parts of the recipe."""
        return {**super().record(), "optimizer": "adam",
                "loss": "d2l MaskedSoftmaxCELoss, summed over the batch"}


def step_program(run: dict) -> dict:
    """What decides a run's compiled training step beside its arguments' types: the run's record
    (model settings, ``"training"``: :meth:`TrainConfig.record`, the data's fingerprint) less the
    seed and the epochs, which change the state and the number of calls, not the program
    (tests/test_program_cache.py lowers the step both ways). The key of the step in the
    program cache (:mod:`jax_attention.runtime.program_cache`)."""
    training = {name: value for name, value in run.get("training", {}).items()
                if name not in ("seed", "epochs")}
    return {**run, "training": training}


@dataclass(frozen=True)
class LongRunConfig(_Validated):
    """Training checkpoints, resumption and non-finite steps (docs/long-runs.md).

    Attributes:
      checkpoint_dir: where training checkpoints go (:mod:`jax_attention.runtime.checkpointing`), or
        ``None`` for none. Not the trained model's export directory.
      checkpoint_every: save every this many steps, counted over the run; ``None``: every epoch.
      keep: how many of the newest training checkpoints to keep.
      resume: continue from the newest readable training checkpoint in ``checkpoint_dir``.
      skip_nonfinite: skip (and count) a step whose loss, gradient or update is NaN or Inf,
        instead of stopping with :class:`~jax_attention.train.NonFiniteLossError`.
    """

    checkpoint_dir: str | os.PathLike | None = _option(None, None, "training checkpoints")
    checkpoint_every: int | None = _option(None, ("int_or_none", 1), "steps between checkpoints")
    keep: int = _option(DEFAULT_KEEP, ("int", 1), "newest training checkpoints kept")
    resume: bool = _option(False, ("bool",), "resume from the newest training checkpoint")
    skip_nonfinite: bool = _option(False, ("bool",), "skip non-finite steps")

    def _check_together(self):
        if self.checkpoint_dir is None and self.checkpoint_every is not None:
            raise ValueError(f"checkpoint_every = {self.checkpoint_every!r} needs a "
                             "checkpoint_dir, got None")
        if self.checkpoint_dir is None and self.resume:
            raise ValueError("resume = True needs a checkpoint_dir, got None")

    @property
    def directory(self) -> Path | None:
        return None if self.checkpoint_dir is None else Path(self.checkpoint_dir)


@dataclass(frozen=True)
class DeviceConfig(_Validated):
    """The device mesh of a run (:func:`jax_attention.runtime.distributed.make_mesh`).

    Attributes:
      devices: train on this many devices (``None``: every device JAX sees), data parallel.
      model_parallel: split each attention's heads and each FFN's width over this many of them
        (tensor parallelism; models whose registry entry allows it).
    """

    devices: int | None = _option(None, ("int_or_none", 1), "devices")
    model_parallel: int = _option(1, ("int", 1), "tensor-parallel devices")
