"""The model registry: what the trainers, the export, the CLI, bench and conformance need to know
about each seq2seq model, in one place.

``MODELS["transformer"]`` is a :class:`ModelSpec`: the model's config class (its book defaults),
how to build the NNX module from a config, its parameter shapes, its decoder and translation,
its export format tag, its default number of epochs and which command-line features it supports
(tensor parallelism, beam search). Nothing outside this module branches on a model's name: a
new model is one file (the model) and one entry here (see docs/architecture.md, "Adding a model").
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from jax_attention.models.configs import BahdanauConfig, TrainConfig, TransformerConfig

__all__ = ["ModelSpec", "MODELS", "get_model", "model_of_config"]


@dataclass(frozen=True)
class ModelSpec:
    """One registered seq2seq model.

    Attributes:
      name: the registry key (``train NAME``, ``--model NAME``, exports' ``"model"``).
      title: the model's name in titles and messages (``"Transformer"``).
      summary, description: the ``train NAME`` command's help line and description.
      config_class: its frozen config dataclass (:mod:`jax_attention.models.configs`).
      export_format: the format tag of its exported models (``config.json``'s ``"format"``).
      default_epochs: the book's number of epochs for this model.
      tensor_parallel: whether ``--model-parallel`` (heads and FFN split over devices) applies.
      trims_source: whether training may cut the sources' padding
        (:func:`jax_attention.train.loop.padded_lengths`): the padding is masked everywhere it
        is read. False for Bahdanau, whose encoder's final state is the GRU's after the padding.
      packs: whether training can pack several sentence pairs into a row (``--pack``): the
        model takes segment ids (the Transformer; not the Bahdanau model's recurrent encoder).
      beam_search: whether translation supports ``beam_size > 1``.
      build: ``build(config, rngs, **module_kwargs) -> nnx.Module`` (training mode), the model
        whose call ``model(src, src_valid_len, dec_input)`` gives the teacher-forced logits.
      param_shapes: ``param_shapes(config) -> nested dict`` of the parameters' shapes.
      decode: ``decode(params, src, src_valid_len, config, *, bos_id, eos_id, pad_id, max_len)
        -> (tokens (B, max_len), lengths (B,), extras)``: batched greedy decoding (compiled).
      translate: ``translate(params, sentences, src_vocab, tgt_vocab, config, *, max_len=None,
        beam_size=1) -> list`` of translations (:mod:`jax_attention.models.translation`).
      attention_plots: ``attention_plots(translation, out_dir, *, run=...) -> {name: path}``:
        the book's attention figures of one translation, written as PNG, and its interactive
        view (``"view"``, an HTML page: :func:`jax_attention.viz.attention_view.translation_view`).
        ``run(tasks)`` draws them, ``tasks`` a list of ``(draw, portable)``: ``draw()`` writes
        one file, ``portable`` says it pickles for another process (arrays and strings); the
        default draws them in order, here.
      torch_mirror: ``torch_mirror(config) -> torch.nn.Module``: the book's PyTorch model
        mirroring ours (:mod:`jax_attention.interop.torch_models`; weights by
        ``interop.to_torch(params, name)``).
      check_shards: ``check_shards(config, shards)`` raises ``ValueError`` when the model cannot
        be split over ``shards`` tensor-parallel devices (the size of the mesh's ``model`` axis).
    """

    name: str
    title: str
    summary: str
    description: str
    config_class: type
    export_format: str
    default_epochs: int
    tensor_parallel: bool
    beam_search: bool
    trims_source: bool
    packs: bool
    build: Callable
    param_shapes: Callable
    decode: Callable
    translate: Callable
    attention_plots: Callable
    torch_mirror: Callable
    check_shards: Callable = lambda config, shards: None

    def model_config(self, **settings):
        """This model's config: the book's defaults, with ``settings`` changed."""
        return self.config_class(**settings)

    def train_config(self, **settings) -> TrainConfig:
        """The training config with this model's default epochs, with ``settings`` changed."""
        return TrainConfig(**{"epochs": self.default_epochs, **settings})

    def split_settings(self, settings: dict) -> tuple[dict, dict, dict]:
        """Keyword arguments as ``(model settings, training settings, the rest)``."""
        model_names = {field.name for field in dataclasses.fields(self.config_class)}
        train_names = {field.name for field in dataclasses.fields(TrainConfig)}
        model = {k: v for k, v in settings.items() if k in model_names}
        train = {k: v for k, v in settings.items() if k in train_names and k not in model_names}
        rest = {k: v for k, v in settings.items() if k not in model_names | train_names}
        return model, train, rest

    def check_translation(self, config, *, max_len: int | None, beam_size: int) -> None:
        """Raise ``ValueError`` (naming the CLI flag) when ``max_len``/``beam_size`` cannot work."""
        if beam_size != 1 and not self.beam_search:
            raise ValueError(f"argument --beam: beam search is not implemented for the "
                             f"{self.name} model; use --beam 1")
        if beam_size > config.tgt_vocab_size:
            raise ValueError(f"argument --beam: {beam_size} exceeds the target vocabulary size "
                             f"{config.tgt_vocab_size}")
        max_positions = getattr(config, "max_positions", None)
        if max_len is not None and max_positions is not None and max_len > max_positions:
            raise ValueError(f"argument --max-len: {max_len} exceeds the model's max_positions "
                             f"= {max_positions}")


# --------------------------------------------------------------------------- Bahdanau


def _bahdanau_build(config: BahdanauConfig, rngs, **module_kwargs):
    from jax_attention.models.bahdanau import BahdanauSeq2Seq

    return BahdanauSeq2Seq(config.src_vocab_size, config.tgt_vocab_size, config.embed_size,
                           config.num_hiddens, config.num_layers, config.dropout, rngs=rngs,
                           **module_kwargs)


def _bahdanau_shapes(config: BahdanauConfig) -> dict:
    from jax_attention.models.bahdanau import param_shapes

    return param_shapes(config.src_vocab_size, config.tgt_vocab_size, config.embed_size,
                        config.num_hiddens, config.num_layers)


def _bahdanau_decode(params, src, src_valid_len, config: BahdanauConfig, **ids):
    from jax_attention.models.bahdanau import greedy_decode

    return greedy_decode(params, src, src_valid_len, **ids)


def _bahdanau_translate(params, sentences, src_vocab, tgt_vocab, config: BahdanauConfig, *,
                        max_len=None, beam_size=1):
    from jax_attention.models.bahdanau import translate

    return translate(params, sentences, src_vocab, tgt_vocab, config.num_steps, max_len=max_len)


def _run_here(tasks) -> None:
    for draw, _ in tasks:
        draw()


def _save_view(translation, path: Path) -> None:
    from jax_attention.viz.attention_view import translation_view

    translation_view(translation).save(path)


def _bahdanau_plots(translation, out_dir: Path, *, run=_run_here) -> dict:
    from jax_attention.viz.plotting import bahdanau_attention_plots

    plots = {"attention": Path(out_dir) / "bahdanau_attention.png",
             "view": Path(out_dir) / "bahdanau_attention.html"}
    run([(functools.partial(bahdanau_attention_plots, translation, out_dir), False),
         (functools.partial(_save_view, translation, plots["view"]), False)])
    return plots


def _bahdanau_torch(config: BahdanauConfig):
    from jax_attention.interop import torch_models

    return torch_models.BahdanauSeq2Seq(config.src_vocab_size, config.tgt_vocab_size,
                                        config.embed_size, config.num_hiddens,
                                        config.num_layers, config.dropout)


# --------------------------------------------------------------------------- Transformer


def _transformer_build(config: TransformerConfig, rngs, **module_kwargs):
    from jax_attention.models.transformer import TransformerSeq2Seq

    return TransformerSeq2Seq(config.src_vocab_size, config.tgt_vocab_size, config.num_hiddens,
                              config.ffn_num_hiddens, config.num_heads, config.num_layers,
                              config.dropout, num_kv_heads=config.num_kv_heads,
                              max_positions=config.max_positions, rngs=rngs, **module_kwargs)


def _transformer_shapes(config: TransformerConfig) -> dict:
    from jax_attention.models.transformer import param_shapes

    return param_shapes(config.src_vocab_size, config.tgt_vocab_size, config.num_hiddens,
                        config.ffn_num_hiddens, config.num_layers, num_heads=config.num_heads,
                        num_kv_heads=config.num_kv_heads)


def _transformer_decode(params, src, src_valid_len, config: TransformerConfig, **ids):
    from jax_attention.models.transformer import greedy_decode

    return greedy_decode(params, src, src_valid_len, num_heads=config.num_heads,
                         max_positions=config.max_positions, **ids)


def _transformer_translate(params, sentences, src_vocab, tgt_vocab, config: TransformerConfig, *,
                           max_len=None, beam_size=1):
    from jax_attention.models.transformer import translate

    return translate(params, sentences, src_vocab, tgt_vocab, config.num_steps,
                     num_heads=config.num_heads, max_len=max_len, beam_size=beam_size,
                     max_positions=config.max_positions)


def _transformer_torch(config: TransformerConfig):
    from jax_attention.interop import torch_models

    return torch_models.TransformerSeq2Seq(config.src_vocab_size, config.tgt_vocab_size,
                                           config.num_hiddens, config.ffn_num_hiddens,
                                           config.num_heads, config.num_layers, config.dropout,
                                           max_len=config.max_positions,
                                           num_kv_heads=config.num_kv_heads)


def _transformer_check_shards(config: TransformerConfig, shards: int) -> None:
    # The heads and the FFN's width split over the devices, and W_k and W_v by whole key/value
    # heads too (grouped-query attention).
    for name in ("num_heads", "ffn_num_hiddens", "num_kv_heads"):
        value = getattr(config, name)
        if value is not None and value % shards:
            raise ValueError(f"{name} = {value} is not divisible by the {shards} tensor-parallel "
                             f"devices of the mesh's 'model' axis")


def _transformer_plots(translation, out_dir: Path, *, run=_run_here) -> dict:
    from jax_attention.viz.plotting import transformer_attention_figures

    figures = transformer_attention_figures(translation, out_dir)
    plots = {**{name: path for name, (path, _) in figures.items()},
             "view": Path(out_dir) / "transformer_attention.html"}
    run([(draw, True) for _, draw in figures.values()]
        + [(functools.partial(_save_view, translation, plots["view"]), False)])
    return plots


#: The registered seq2seq models, by name.
MODELS: dict[str, ModelSpec] = {
    "bahdanau": ModelSpec(
        name="bahdanau", title="Bahdanau seq2seq",
        summary="seq2seq with Bahdanau attention on English–French (d2l §11.4)",
        description="Train the book's seq2seq model with Bahdanau (additive) attention on the "
                    "first --num-examples English–French pairs (d2l §11.4.3): GRU encoder and "
                    "attention decoder, teacher forcing, masked cross-entropy, Adam with "
                    "gradients clipped to norm 1. The defaults are the book's. Prints the loss "
                    "and tokens/sec, translates the book's four sentences with their BLEU, and "
                    "writes a checkpoint that 'jax-attention translate' reads.",
        config_class=BahdanauConfig,
        export_format="jax-attention.bahdanau-checkpoint/1",
        default_epochs=250, tensor_parallel=False, beam_search=False, trims_source=False,
        packs=False,
        build=_bahdanau_build, param_shapes=_bahdanau_shapes, decode=_bahdanau_decode,
        translate=_bahdanau_translate, attention_plots=_bahdanau_plots,
        torch_mirror=_bahdanau_torch),
    "transformer": ModelSpec(
        name="transformer", title="Transformer",
        summary="the Transformer encoder–decoder on English–French (d2l §11.7)",
        description="Train the book's Transformer (d2l §11.7.6) on the first --num-examples "
                    "English–French pairs: embeddings scaled by sqrt(D) plus sinusoidal "
                    "positions, multi-head self-attention, causal decoder self-attention, "
                    "encoder–decoder attention, position-wise FFN, add & norm; teacher "
                    "forcing, masked cross-entropy, Adam with gradients clipped to norm 1. "
                    "The defaults are the book's. Prints the loss and tokens/sec, translates "
                    "the book's four sentences with their BLEU, optionally scores held-out "
                    "pairs (--val-fraction), and writes a checkpoint that 'jax-attention "
                    "translate' reads.",
        config_class=TransformerConfig,
        export_format="jax-attention.transformer-checkpoint/1",
        default_epochs=200, tensor_parallel=True, beam_search=True, trims_source=True,
        packs=True,
        build=_transformer_build, param_shapes=_transformer_shapes, decode=_transformer_decode,
        translate=_transformer_translate, attention_plots=_transformer_plots,
        torch_mirror=_transformer_torch, check_shards=_transformer_check_shards),
}


def get_model(name) -> ModelSpec:
    """The registry entry ``name`` (or ``name`` itself when it is a :class:`ModelSpec`)."""
    if isinstance(name, ModelSpec):
        return name
    if name not in MODELS:
        raise ValueError(f"model must be one of {sorted(MODELS)}, got {name!r}")
    return MODELS[name]


def model_of_config(config) -> ModelSpec:
    """The registry entry whose config class ``config`` is an instance of."""
    for spec in MODELS.values():
        if isinstance(config, spec.config_class):
            return spec
    raise TypeError(f"config must be one of {[s.config_class.__name__ for s in MODELS.values()]}, "
                    f"got {type(config).__name__}")
