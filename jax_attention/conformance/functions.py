"""The functions the conformance kit checks: their outputs and how to call them.

Every case names one function of :mod:`reference_numpy` by ``"<module>.<name>"`` (the module stem
is the component, e.g. ``"scoring.dot_product_attention"``); the same name exists, with the same
argument order, in :mod:`jax_attention` — in its maths (``jax_attention.nn.<stem>``) or, for the
models, in ``jax_attention.models.<stem>`` (:func:`module_of`). A :class:`Function` says which outputs the function
returns, in which order, and how to call either package's version from a case's ``inputs``,
``params`` and ``config`` (the call is the same for both, as the two packages mirror each other).

A case's ``config`` is passed as keyword arguments (``**config``). It comes from the index's JSON,
so a pair such as ``local_window_size`` arrives as a list ``[left, right]``, which both packages
accept as they accept a tuple.

One function is not in the book: ``"mods.dot_product_attention"`` is
``scoring.dot_product_attention`` with FlexAttention-style mask and score mods, attention sinks
and the log-sum-exp of each row (``return_lse``). Its config names the mods as JSON objects
(``{"mask_mod": {"mod": "and_masks", "mods": [{"mod": "segment_ids", "padding_id": -1},
{"mod": "causal", "offset": 0}]}}``, :func:`build_mod`); the arrays they read are inputs or
params of fixed names (:data:`MOD_ARRAYS`), the sinks the param ``sinks``. The mods are built by
the ``mods`` module of either package (the component) and the attention is its ``scoring``.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType

__all__ = ["Function", "FUNCTIONS", "MOD_ARRAYS", "build_mod", "call", "module_of"]

Arrays = Mapping[str, object]
Call = Callable[[ModuleType, Arrays, Mapping, Mapping], object]


@dataclass(frozen=True)
class Function:
    """One checked function.

    Attributes:
      name: ``"<module>.<function>"``, e.g. ``"scoring.dot_product_attention"``.
      outputs: the names given to the returned arrays, in order.
      signature: the reference call, for people (docs/conformance.md, ``--help``).
      call: ``call(module, inputs, params, config)`` runs ``module.<function>`` on a case, where
        ``module`` is ``reference_numpy.<stem>`` or its twin (:func:`module_of`); returns what the
        function returns (an array, a tuple, or for the Transformer a tuple holding a dict).
    """

    name: str
    outputs: tuple[str, ...]
    signature: str
    call: Call

    @property
    def component(self) -> str:
        """The reference module's stem: ``"scoring"`` of ``"scoring.dot_product_attention"``."""
        return self.name.split(".")[0]


def _get(inputs: Arrays, name: str):
    """An optional input: ``None`` when the case does not give it."""
    return inputs.get(name)


def _attention_functions() -> list[Function]:
    """Masking, attention pooling, scoring and multi-head attention (d2l §11.1–§11.5)."""
    return [
        Function("masking.sequence_mask", ("output",),
                 "sequence_mask(X, valid_len, value=0) -> output",
                 lambda m, i, p, c: m.sequence_mask(i["X"], i["valid_len"], **c)),
        Function("masking.masked_softmax", ("weights",),
                 "masked_softmax(X, valid_lens=None, *, mask=None) -> weights",
                 lambda m, i, p, c: m.masked_softmax(i["X"], _get(i, "valid_lens"),
                                                     mask=_get(i, "mask"))),
        Function("attention_pooling.nadaraya_watson", ("output", "weights"),
                 "nadaraya_watson(queries, keys, values, w=params['w']) -> (output, weights)",
                 lambda m, i, p, c: m.nadaraya_watson(i["queries"], i["keys"], i["values"],
                                                      p["w"])),
        Function("scoring.dot_product_attention", ("output", "weights"),
                 "dot_product_attention(queries, keys, values, valid_lens=None, *, mask=None, "
                 "is_causal=False, bias=None, scale=None, local_window_size=None, "
                 "logit_softcap=None) -> (output, weights)",
                 lambda m, i, p, c: m.dot_product_attention(
                     i["queries"], i["keys"], i["values"], _get(i, "valid_lens"),
                     mask=_get(i, "mask"), bias=_get(i, "bias"), **c)),
        Function("scoring.additive_attention", ("output", "weights"),
                 "additive_attention(params, queries, keys, values, valid_lens=None, *, "
                 "mask=None, is_causal=False) -> (output, weights)",
                 lambda m, i, p, c: m.additive_attention(
                     p, i["queries"], i["keys"], i["values"], _get(i, "valid_lens"),
                     mask=_get(i, "mask"), **c)),
        Function("multihead.multi_head_attention", ("output", "weights"),
                 "multi_head_attention(params, queries, keys, values, valid_lens=None, *, "
                 "num_heads, num_kv_heads=None, mask=None, is_causal=False, bias=None, "
                 "scale=None, local_window_size=None, logit_softcap=None) -> (output, weights)",
                 lambda m, i, p, c: m.multi_head_attention(
                     p, i["queries"], i["keys"], i["values"], _get(i, "valid_lens"),
                     mask=_get(i, "mask"), bias=_get(i, "bias"), **c)),
    ]


def _positional_functions() -> list[Function]:
    """Sinusoidal encoding (d2l §11.6), rotary embedding, relative position buckets and bias."""
    return [
        Function("positional.positional_encoding", ("P",),
                 "positional_encoding(num_steps, num_hiddens, base=10000.0) -> P",
                 lambda m, i, p, c: m.positional_encoding(**c)),
        Function("positional.rotary_embedding", ("output",),
                 "rotary_embedding(X, positions=None, base=10000.0) -> output",
                 lambda m, i, p, c: m.rotary_embedding(i["X"], _get(i, "positions"), **c)),
        Function("positional.relative_position_buckets", ("buckets",),
                 "relative_position_buckets(relative_positions, num_buckets=32, "
                 "max_distance=128, bidirectional=True) -> buckets",
                 lambda m, i, p, c: m.relative_position_buckets(i["relative_positions"], **c)),
        Function("positional.relative_position_bias", ("bias",),
                 "relative_position_bias(params['table'], indices) -> bias",
                 lambda m, i, p, c: m.relative_position_bias(p["table"], i["indices"])),
    ]


def _bahdanau_functions() -> list[Function]:
    """The GRU, its encoder and the Bahdanau attention seq2seq model (d2l §11.4)."""
    return [
        Function("bahdanau.gru", ("outputs", "state"),
                 "gru(params, inputs, state=None) -> (outputs, state)",
                 lambda m, i, p, c: m.gru(p, i["inputs"], _get(i, "state"))),
        Function("bahdanau.encoder", ("outputs", "state"),
                 "encoder(params, src) -> (outputs, state)",
                 lambda m, i, p, c: m.encoder(p, i["src"])),
        Function("bahdanau.seq2seq", ("logits", "weights"),
                 "seq2seq(params, src, src_valid_len, dec_input) -> (logits, weights)",
                 lambda m, i, p, c: m.seq2seq(p, i["src"], i["src_valid_len"], i["dec_input"])),
        Function("bahdanau.teacher_forcing_loss", ("loss",),
                 "teacher_forcing_loss(params, src, src_valid_len, tgt, tgt_valid_len, bos_id) "
                 "-> loss",
                 lambda m, i, p, c: m.teacher_forcing_loss(
                     p, i["src"], i["src_valid_len"], i["tgt"], i["tgt_valid_len"], **c)),
    ]


def _transformer_functions() -> list[Function]:
    """The Transformer's parts, blocks, model and loss (d2l §11.7)."""
    return [
        Function("transformer.position_wise_ffn", ("output",),
                 "position_wise_ffn(params, X) -> output",
                 lambda m, i, p, c: m.position_wise_ffn(p, i["X"])),
        Function("transformer.layer_norm", ("output",),
                 "layer_norm(params, X) -> output  (eps 1e-5)",
                 lambda m, i, p, c: m.layer_norm(p, i["X"])),
        Function("transformer.add_norm", ("output",),
                 "add_norm(params, X, Y) -> output = LayerNorm(Y + X)",
                 lambda m, i, p, c: m.add_norm(p, i["X"], i["Y"])),
        Function("transformer.encoder_block", ("output", "weights"),
                 "encoder_block(params, X, src_valid_len, *, num_heads) -> (output, weights)",
                 lambda m, i, p, c: m.encoder_block(p, i["X"], i["src_valid_len"], **c)),
        Function("transformer.decoder_block", ("output", "self_weights", "cross_weights"),
                 "decoder_block(params, X, enc_outputs, src_valid_len, *, num_heads) -> "
                 "(output, self_weights, cross_weights)",
                 lambda m, i, p, c: m.decoder_block(p, i["X"], i["enc_outputs"],
                                                    i["src_valid_len"], **c)),
        Function("transformer.transformer",
                 ("logits", "encoder_self", "decoder_self", "encoder_decoder"),
                 "transformer(params, src, src_valid_len, dec_input, *, num_heads) -> "
                 "(logits, {encoder_self, decoder_self, encoder_decoder})",
                 lambda m, i, p, c: m.transformer(p, i["src"], i["src_valid_len"],
                                                  i["dec_input"], **c)),
        Function("transformer.teacher_forcing_loss", ("loss",),
                 "teacher_forcing_loss(params, src, src_valid_len, tgt, tgt_valid_len, bos_id, *, "
                 "num_heads) -> loss",
                 lambda m, i, p, c: m.teacher_forcing_loss(
                     p, i["src"], i["src_valid_len"], i["tgt"], i["tgt_valid_len"], **c)),
    ]


#: The arrays each built-in mod reads, by argument: ``(where, name, required)``, ``where`` being
#: the case's ``"inputs"`` or ``"params"`` (a learned table or the sinks); the mod's numbers are
#: the other entries of its config object.
MOD_ARRAYS: dict[str, tuple[tuple[str, str, bool], ...]] = {
    "valid_lengths": (("inputs", "valid_lens", True),),
    "padding": (("inputs", "kv_lens", True), ("inputs", "q_lens", False)),
    "segment_ids": (("inputs", "q_segment_ids", True), ("inputs", "kv_segment_ids", False)),
    "prefix_lm": (("inputs", "prefix_lens", True),),
    "dense_mask": (("inputs", "mask", True),),
    "bias": (("inputs", "bias", True),),
    "clipped_relative_bias": (("params", "clipped_relative_bias", True),),
    "t5_relative_bias": (("params", "t5_relative_bias", True),),
}
#: The built-in mask mods and score mods a case's config may name (besides :data:`MOD_ARRAYS`'s,
#: those that read no array), and the combinators, which take ``"mods": [...]``.
MASK_MODS = ("causal", "sliding_window", "valid_lengths", "padding", "segment_ids", "prefix_lm",
             "chunked_local", "global_tokens", "dense_mask")
SCORE_MODS = ("softcap", "bias", "alibi", "clipped_relative_bias", "t5_relative_bias")
COMBINATORS = {"and_masks": MASK_MODS, "or_masks": MASK_MODS, "compose_score_mods": SCORE_MODS}


def build_mod(mods: ModuleType, spec: Mapping | None, inputs: Arrays, params: Mapping):
    """The mask or score mod that a case's config object ``spec`` names, built by ``mods``
    (:mod:`reference_numpy.mods` or :mod:`jax_attention.nn.mods`); ``None`` for ``None``.

    ``spec`` is ``{"mod": <name>, <argument>: <number>, ...}``: a built-in of :data:`MASK_MODS`
    or :data:`SCORE_MODS` with its numbers as keywords (``{"mod": "causal", "offset": 3}``,
    ``{"mod": "t5_relative_bias", "bidirectional": true, "max_distance": 10}``) and its arrays
    taken from the case by the names of :data:`MOD_ARRAYS`; or a combinator of
    :data:`COMBINATORS` with ``"mods": [spec, ...]``.
    """
    if spec is None:
        return None
    name = spec["mod"]
    numbers = {key: value for key, value in spec.items() if key not in ("mod", "mods")}
    if name in COMBINATORS:
        return getattr(mods, name)(*(build_mod(mods, part, inputs, params)
                                     for part in spec["mods"]))
    if name not in MASK_MODS + SCORE_MODS:
        raise ValueError(f"unknown mod {name!r}; the kit knows {MASK_MODS + SCORE_MODS} and "
                         f"the combinators {tuple(COMBINATORS)}")
    sources = {"inputs": inputs, "params": params}
    arrays = [sources[where][key] if required else sources[where].get(key)
              for where, key, required in MOD_ARRAYS.get(name, ())]
    return getattr(mods, name)(*arrays, **numbers)


def _dot_product_attention_with_mods(mods: ModuleType, i: Arrays, p: Mapping, c: Mapping):
    """``scoring.dot_product_attention`` of ``mods``' package (the reference's, or ours) with the
    mods of the config built by ``mods``, the sinks of the params, and ``return_lse=True``."""
    scoring = importlib.import_module(mods.__name__.rpartition(".")[0] + ".scoring")
    return scoring.dot_product_attention(
        i["queries"], i["keys"], i["values"], mask_mod=build_mod(mods, c.get("mask_mod"), i, p),
        score_mod=build_mod(mods, c.get("score_mod"), i, p), scale=c.get("scale"),
        sinks=_get(p, "sinks"), return_lse=True)


def _mods_functions() -> list[Function]:
    """Scaled dot-product attention with mask mods, score mods and sinks (FlexAttention's model:
    :mod:`reference_numpy.mods`), appended after the book's functions."""
    return [
        Function("mods.dot_product_attention", ("output", "weights", "lse"),
                 "scoring.dot_product_attention(queries, keys, values, *, mask_mod=None, "
                 "score_mod=None, scale=None, sinks=None, return_lse=True) -> (output, weights, "
                 "lse), the mods built by the mods module from the config",
                 _dot_product_attention_with_mods),
    ]


def _functions() -> dict[str, Function]:
    specs = [*_attention_functions(), *_positional_functions(), *_bahdanau_functions(),
             *_transformer_functions(), *_mods_functions()]
    return {spec.name: spec for spec in specs}


#: Every checked function by name, in the order of the book's chapter.
FUNCTIONS: dict[str, Function] = _functions()


#: The rooms of :mod:`jax_attention` that mirror :mod:`reference_numpy` file by file: the maths,
#: then the models (``tests/test_architecture.py`` checks that every reference module has a twin).
MIRROR_ROOMS = ("jax_attention.nn", "jax_attention.models")


def module_of(package: str, component: str) -> ModuleType:
    """The module of ``package`` (``"reference_numpy"`` or ``"jax_attention"``) that holds the
    functions of ``component`` (a module stem of :mod:`reference_numpy`, e.g. ``"scoring"``)."""
    if package != "jax_attention":
        return importlib.import_module(f"{package}.{component}")
    for room in MIRROR_ROOMS:
        if importlib.util.find_spec(f"{room}.{component}") is not None:
            return importlib.import_module(f"{room}.{component}")
    raise ModuleNotFoundError(f"jax_attention has no module {component!r} in {MIRROR_ROOMS}")


def call(package: str, function: str, inputs: Arrays, params: Mapping, config: Mapping) -> dict:
    """Run ``<package>.<function>`` (package ``"reference_numpy"`` or ``"jax_attention"``) on a
    case and name its outputs: ``{output name: array}``.

    The Transformer returns its attention weights as a dict; they are flattened into the named
    outputs, so every output is one array.
    """
    spec = FUNCTIONS[function]
    module = module_of(package, spec.component)
    result = spec.call(module, inputs, params, config)
    if not isinstance(result, tuple):
        result = (result,)
    if len(result) == 2 and isinstance(result[1], Mapping):  # (logits, {weights by name})
        result = (result[0], *(result[1][name] for name in spec.outputs[1:]))
    if len(result) != len(spec.outputs):
        raise ValueError(f"{package}.{function} returned {len(result)} arrays, expected "
                         f"{len(spec.outputs)}: {spec.outputs}")
    return dict(zip(spec.outputs, result))
