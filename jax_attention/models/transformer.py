"""The Transformer encoder–decoder — d2l §11.7, in JAX: functions, then NNX modules.

Mirror of :mod:`reference_numpy.transformer` (same names, argument order, einsum strings and
parameter dicts); the JAX functions add dropout (``dropout``, ``dropout_rng``) and incremental
decoding with a fixed-size key/value cache.

Files: the sublayers (:func:`attention`, :func:`position_wise_ffn`, :func:`layer_norm`,
:func:`add_norm`) are in :mod:`jax_attention.models.transformer_layers` — read it, then this file, beside
the NumPy reference — and the key/value cache (:func:`init_decoder_state`,
:func:`decoder_step`) in :mod:`jax_attention.models.transformer_cache`; both are re-exported here, so
every public name of the model is ``jax_attention.models.transformer.<name>``. :func:`translate` is
:func:`jax_attention.models.translation.translate` with this model's decoder, and the NNX modules share
their plumbing with the Bahdanau model (:mod:`jax_attention.models.seq2seq_module`).

The model of the book (0.17 edition, PyTorch):

* encoder: ``X = embedding(src) * sqrt(D) + P[:S]`` (dropout), then ``num_layers`` blocks of
  ``Y = AddNorm(X, MHA(X, X, X, src_valid_len))``, ``AddNorm(Y, FFN(Y))``;
* decoder: ``X = embedding(dec_input) * sqrt(D) + P[:T]`` (dropout), then blocks of causal
  self-attention, encoder–decoder attention (masked by the source valid lengths) and the FFN, each
  followed by AddNorm; a dense layer maps to the vocabulary;
* ``AddNorm(X, Y) = LayerNorm(dropout(Y) + X)`` (eps ``1e-5``), ``FFN(X) = relu(X W_1 + b_1) W_2 + b_2``;
* multi-head attention without biases (the book's ``bias=False``) and dropout on its weights;
  optionally grouped-query attention (``num_kv_heads`` ``N_kv`` dividing ``N``; 1 = multi-query):
  every attention's ``W_k``, ``W_v`` are then ``(D, N_kv H)`` and the key/value cache holds
  ``N_kv`` heads, ``N / N_kv`` times less memory (:func:`init_decoder_state`). The functions
  read ``N_kv`` from the parameters' ``W_k``; :func:`init_params`, :func:`param_shapes` and the
  modules take ``num_kv_heads`` (``None``: ``N``, the book's model).

Causality is a property of the decoder's self-attention (``is_causal=True`` always), not of the
training mode: the book's training-mode ``dec_valid_lens = 1..T`` is the same mask.

Shape letters: ``B`` batch, ``S`` source length, ``T`` target length, ``L`` blocks (``num_layers``),
``N`` heads, ``H = D / N``, ``N_kv`` key/value heads, ``D`` model width (``num_hiddens``), ``F``
the FFN's hidden width (``ffn_num_hiddens``), ``V`` vocabulary, ``M`` the key/value cache length
(``max_len`` steps).

Parameters: one nested dict, identical in NumPy and JAX (see :func:`param_shapes`); dense kernels
stored ``(in, out)``; a missing or unexpected key, nested ones included, raises ``ValueError``
naming its path (``params['decoder']['blocks']['block_0']['ffn']``) and the expected keys.
Initialisation (:func:`init_params`) as the book's ``xavier_init_weights`` leaves the model:
Xavier-uniform dense kernels (attention ``W_q, W_k, W_v, W_o``, the FFN's ``W_1, W_2``, the output
``W``), PyTorch's default biases ``U(-1/sqrt(in), 1/sqrt(in))``, embeddings ``N(0, 1)``, LayerNorm
``gamma = 1``, ``beta = 0``.

Positions: the sinusoidal table ``P`` (:func:`jax_attention.nn.positional.positional_encoding`) has
``max_positions`` rows (the book's ``max_len = 1000``); longer inputs are refused. In incremental
decoding the token of step ``t`` gets ``P[t]``, not the ``P[0]`` the book's 0.17 ``predict_seq2seq``
adds to every new token (a known bug): the incremental decoder equals the full recomputation of
the prefix, and the tests check it.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jax_attention.models import decoding, packing, translation
from jax_attention._checks import (
    check_dropout,
    check_int,
    check_lengths,
    check_max_len_fits,
    check_positions,
    check_size,
    check_tokens,
)
from jax_attention.models.decoding import greedy_search
from jax_attention.params import flatten_params, unflatten_params
from jax_attention.models.seq2seq_module import ParamTree, Seq2SeqModule
from jax_attention.nn.masking import causal_mask
from jax_attention.nn.multihead import dense
from jax_attention.nn.dropout import dropout as _dropout
from jax_attention.nn.dropout import fold
from jax_attention.models.transformer_cache import (
    cached_step,
    decoder_step,
    init_decoder_state,
    initial_state,
)
from jax_attention.models.transformer_layers import (
    AddNorm,
    DECODER_BLOCK_KEYS,
    DECODER_KEYS,
    ENCODER_BLOCK_KEYS,
    ENCODER_KEYS,
    MAX_POSITIONS,
    add_norm,
    attention,
    attention_shapes,
    check_block,
    check_model,
    check_stack,
    decoder_block_shapes,
    encoder_block_shapes,
    ffn,
    init_params,
    layer_norm,
    lengths_keep,
    param_shapes,
    PositionWiseFFN,
    position_wise_ffn,
    residual,
    sublayer_attention,
)
from jax_attention.models.transformer_layers import check_width, embed, fold_rng, initial_flat
from jax_attention.models.transformer_layers import steps_padded
from jax_attention.models.translation import (
    Decoded,
    Translation,
    masked_cross_entropy,
    teacher_forcing_inputs,
)

__all__ = ["MAX_POSITIONS", "param_shapes", "init_params", "flatten_params", "unflatten_params",
           "position_wise_ffn", "layer_norm", "add_norm", "attention", "encoder_block", "encoder",
           "decoder_block", "decoder", "transformer", "teacher_forcing_loss", "init_decoder_state",
           "decoder_step", "greedy_decode", "beam_decode", "TransformerTranslation", "translate",
           "PositionWiseFFN", "AddNorm", "TransformerEncoderBlock", "TransformerEncoder",
           "TransformerDecoderBlock", "TransformerDecoder", "TransformerSeq2Seq"]

# --------------------------------------------------------------------------- the functional core


# Each public function checks its parameters and inputs once and builds the masks once, then
# runs the private cores below it (_encoder_block, _encoder, ...), which check nothing again.


def encoder_block(params, X, src_valid_len, *, num_heads: int, dropout: float = 0.0,
                  dropout_rng=None):
    """One encoder block — d2l §11.7.4 ``TransformerEncoderBlock``.

    ``Y = AddNorm(X, MHA(X, X, X, src_valid_len))``, then ``AddNorm(Y, FFN(Y))``.

    Args:
      params: ``{"attention", "addnorm_1", "ffn", "addnorm_2"}``, exactly (nested keys too;
        the attention may have biases, see :func:`param_shapes`).
      X: ``(B, S, D)``. src_valid_len: ``(B,)`` or ``None``.
      num_heads: ``N``. dropout, dropout_rng: the rate and a key (``None``: no dropout).

    Returns:
      ``(output (B, S, D), weights (B, N, S, S))``.
    """
    D = check_block(params, ENCODER_BLOCK_KEYS, num_heads)
    X = check_width("X", X, D, "(B, S, D)")
    keep = _source_keep(src_valid_len, X.shape[0], X.shape[1])
    return _encoder_block(params, X, keep, num_heads=num_heads, dropout=check_dropout(dropout),
                          dropout_rng=dropout_rng)


def _source_keep(src_valid_len, B: int, S: int):
    """The source's padding mask ``(B, 1, 1, S)`` (``None``: no lengths), built once for the
    self-attention of every encoder block and the encoder–decoder attention of every decoder
    block; ``src_valid_len`` ``(B,)`` checked (values in ``[0, S]`` when concrete)."""
    if src_valid_len is None:
        return None
    return lengths_keep(check_lengths("src_valid_len", src_valid_len, B, S, "S"), S)


def _encoder_block(params, X, keep, *, num_heads, dropout, dropout_rng, num_steps=None):
    attended, weights = sublayer_attention(params["attention"], X, X, keep, num_heads=num_heads,
                                           dropout=dropout, dropout_rng=fold_rng(dropout_rng, 0),
                                           num_steps=num_steps)
    Y = residual(params["addnorm_1"], X, attended, dropout, fold_rng(dropout_rng, 1), num_steps)
    out = residual(params["addnorm_2"], Y, ffn(params["ffn"], Y), dropout,
                   fold_rng(dropout_rng, 2), num_steps)
    return out, weights


def _float_dtype(params):  # the encoder's computation: its blocks' (the embeddings may be wider)
    return jnp.result_type(*jax.tree.leaves(params["blocks"]))


def encoder(params, src, src_valid_len, *, num_heads: int, max_positions: int = MAX_POSITIONS,
            dropout: float = 0.0, dropout_rng=None):
    """The Transformer encoder — d2l §11.7.4 ``TransformerEncoder``.

    ``X = dropout(embedding(src) * sqrt(D) + P[:S])``, then the blocks.

    Args:
      params: ``{"embedding": (V_src, D), "blocks": {...}}``, exactly (nested keys too).
      src: ``(B, S)`` token ids in ``[0, V_src)``: checked when concrete; under ``jit`` they
        cannot be, and ids outside are clipped to ``[0, V_src - 1]`` (see
        :mod:`jax_attention.nn.masking`). The same holds for ``dec_input`` and ``tokens`` below.
      src_valid_len: ``(B,)`` in ``[0, S]``, or ``None``.
      num_heads, max_positions, dropout, dropout_rng: see the module docstring.

    Returns:
      ``(enc_outputs (B, S, D), weights (L, B, N, S, S))``.
    """
    dropout = check_dropout(dropout)
    check_stack(params, ENCODER_KEYS, ENCODER_BLOCK_KEYS, num_heads)
    src = _checked_tokens("src", src, params, max_positions)
    keep = _source_keep(src_valid_len, src.shape[0], src.shape[1])
    return _encoder(params, src, keep, num_heads=num_heads, max_positions=max_positions,
                    dropout=dropout, dropout_rng=dropout_rng)


def _checked_tokens(name: str, tokens, params, max_positions: int):
    """Token ids ``(B, T)`` for the embedding of ``params`` and a table of ``max_positions``."""
    tokens = check_tokens(name, tokens, jnp.shape(params["embedding"])[0], ndim=2)
    check_positions(name, tokens.shape[1], max_positions, tokens.shape)
    return tokens


def _encoder(params, src, keep, *, num_heads, max_positions, dropout, dropout_rng,
             num_steps=None, positions=None):
    positions = jnp.arange(src.shape[1]) if positions is None else positions
    X = embed(params, src, positions, max_positions, _float_dtype(params))
    X = _dropout(X, dropout, fold_rng(dropout_rng, 0), steps_padded(X.shape, num_steps, 1))
    all_weights = []
    for i in range(len(params["blocks"])):
        X, weights = _encoder_block(params["blocks"][f"block_{i}"], X, keep, num_heads=num_heads,
                                    dropout=dropout, dropout_rng=fold_rng(dropout_rng, i + 1),
                                    num_steps=num_steps)
        all_weights.append(weights)
    return X, jnp.stack(all_weights)


def decoder_block(params, X, enc_outputs, src_valid_len, *, num_heads: int, dropout: float = 0.0,
                  dropout_rng=None):
    """One decoder block over a whole (teacher-forced) sequence — d2l §11.7.5.

    Causal self-attention (query ``t`` sees positions ``<= t``), AddNorm; encoder–decoder
    attention over ``enc_outputs`` masked by ``src_valid_len``, AddNorm; FFN, AddNorm.

    Args:
      params: ``{"self_attention", "addnorm_1", "cross_attention", "addnorm_2", "ffn",
        "addnorm_3"}``, exactly (nested keys too).
      X: ``(B, T, D)``. enc_outputs: ``(B, S, D)``. src_valid_len: ``(B,)`` or ``None``.

    Returns:
      ``(output (B, T, D), self_weights (B, N, T, T), cross_weights (B, N, T, S))``.
    """
    D = check_block(params, DECODER_BLOCK_KEYS, num_heads)
    X = check_width("X", X, D)
    enc_outputs = _checked_enc_outputs(enc_outputs, D, "X", "(B, T, D)", X.shape)
    return _decoder_block(params, X, enc_outputs, _causal_keep(X.shape[1]),
                          _source_keep(src_valid_len, X.shape[0], enc_outputs.shape[1]),
                          num_heads=num_heads, dropout=check_dropout(dropout),
                          dropout_rng=dropout_rng)


def _checked_enc_outputs(enc_outputs, D: int, name: str, letters: str, shape):
    """``enc_outputs (B, S, D)`` with the batch ``B`` of the decoder's input ``name`` (of the
    shape ``letters``, here ``shape``)."""
    enc_outputs = check_width("enc_outputs", enc_outputs, D, "(B, S, D)")
    if enc_outputs.shape[0] != shape[0]:
        raise ValueError(f"{name} {letters} and enc_outputs (B, S, D) must have the same batch "
                         f"B, got {name} {tuple(shape)} and enc_outputs {enc_outputs.shape}")
    return enc_outputs


def _causal_keep(T: int):
    """The decoder's causal self-attention mask ``(1, 1, T, T)``."""
    return causal_mask(T)[None, None]


def _decoder_block(params, X, enc_outputs, self_keep, cross_keep, *, num_heads, dropout,
                   dropout_rng, num_steps=None):
    attended, self_weights = sublayer_attention(
        params["self_attention"], X, X, self_keep, num_heads=num_heads, dropout=dropout,
        dropout_rng=fold_rng(dropout_rng, 0), num_steps=num_steps)
    Y = residual(params["addnorm_1"], X, attended, dropout, fold_rng(dropout_rng, 1), num_steps)
    crossed, cross_weights = sublayer_attention(
        params["cross_attention"], Y, enc_outputs, cross_keep, num_heads=num_heads,
        dropout=dropout, dropout_rng=fold_rng(dropout_rng, 2), num_steps=num_steps)
    Z = residual(params["addnorm_2"], Y, crossed, dropout, fold_rng(dropout_rng, 3), num_steps)
    out = residual(params["addnorm_3"], Z, ffn(params["ffn"], Z), dropout,
                   fold_rng(dropout_rng, 4), num_steps)
    return out, self_weights, cross_weights


def decoder(params, dec_input, enc_outputs, src_valid_len, *, num_heads: int,
            max_positions: int = MAX_POSITIONS, dropout: float = 0.0, dropout_rng=None):
    """The Transformer decoder over a whole (teacher-forced) input — d2l §11.7.5.

    Args:
      params: ``{"embedding": (V_tgt, D), "blocks": {...}, "dense": {"W", "b"}}``, exactly.
      dec_input: ``(B, T)`` ids (``<bos>`` then the target shifted right).
      enc_outputs: ``(B, S, D)``. src_valid_len: ``(B,)`` or ``None``.

    Returns:
      ``(logits (B, T, V), {"decoder_self": (L, B, N, T, T), "encoder_decoder": (L, B, N, T, S)})``.
    """
    dropout = check_dropout(dropout)
    _, D = check_stack(params, DECODER_KEYS, DECODER_BLOCK_KEYS, num_heads)
    dec_input = _checked_tokens("dec_input", dec_input, params, max_positions)
    enc_outputs = _checked_enc_outputs(enc_outputs, D, "dec_input", "(B, T)", dec_input.shape)
    B, T, S = dec_input.shape + enc_outputs.shape[1:2]
    return _decoder(params, dec_input, enc_outputs, _causal_keep(T),
                    _source_keep(src_valid_len, B, S), num_heads=num_heads,
                    max_positions=max_positions, dropout=dropout, dropout_rng=dropout_rng)


def _decoder(params, dec_input, enc_outputs, self_keep, cross_keep, *, num_heads, max_positions,
             dropout, dropout_rng, num_steps=None, positions=None):
    positions = jnp.arange(dec_input.shape[1]) if positions is None else positions
    X = embed(params, dec_input, positions, max_positions, enc_outputs.dtype)
    X = _dropout(X, dropout, fold_rng(dropout_rng, 0), steps_padded(X.shape, num_steps, 1))
    self_weights, cross_weights = [], []
    for i in range(len(params["blocks"])):
        X, s, c = _decoder_block(params["blocks"][f"block_{i}"], X, enc_outputs, self_keep,
                                 cross_keep, num_heads=num_heads, dropout=dropout,
                                 dropout_rng=fold_rng(dropout_rng, i + 1), num_steps=num_steps)
        self_weights.append(s)
        cross_weights.append(c)
    logits = dense(params["dense"], X, "W", "b")
    return logits, {"decoder_self": jnp.stack(self_weights),
                    "encoder_decoder": jnp.stack(cross_weights)}


def transformer(params, src, src_valid_len, dec_input, *, num_heads: int,
                max_positions: int = MAX_POSITIONS, dropout: float = 0.0, dropout_rng=None,
                num_steps: int | None = None, segments: packing.Segments | None = None):
    """Encoder then decoder, teacher-forced (``d2l.EncoderDecoder`` with the Transformer's parts).

    Args:
      params: ``{"encoder": {...}, "decoder": {...}}``, exactly (nested keys too).
      src: ``(B, S)``. src_valid_len: ``(B,)``. dec_input: ``(B, T)``.
      num_heads, max_positions: the model's heads and position table size.
      dropout, dropout_rng: the rate and a key (``None``: no dropout).
      num_steps: ``None``, or the length ``>= max(S, T)`` both were padded to before their
        padding was cut: every dropout mask is then the full-length batch's at the positions
        kept (:func:`jax_attention.nn.dropout.keep_mask`), so that with
        ``masked_cross_entropy(..., num_steps=)`` the cut batch trains as the full one, to
        rounding (the outputs at kept positions do not depend on the cut ones).
      segments: ``None``, or a packed batch's :class:`~jax_attention.models.packing.Segments`:
        attention within each sentence pair, positions within each sentence
        (``src_valid_len`` may then be ``None``; given, it masks the sources too).

    Returns:
      ``(logits (B, T, V), weights)`` with ``weights = {"encoder_self": (L, B, N, S, S),
      "decoder_self": (L, B, N, T, T), "encoder_decoder": (L, B, N, T, S)}`` (before dropout).
    """
    check_model(params, num_heads)
    batch = _checked_model_inputs(params, src, src_valid_len, dec_input, num_heads,
                                  max_positions, num_steps, segments)
    return _transformer(params, *batch, num_heads=num_heads, max_positions=max_positions,
                        dropout=check_dropout(dropout), dropout_rng=dropout_rng)


def _checked_model_inputs(params, src, src_valid_len, dec_input, num_heads: int,
                          max_positions: int, num_steps: int | None = None, segments=None):
    """A batch for the model's ``params`` (checked by :func:`check_model`), checked once:
    ``(src, masks, dec_input, positions, num_steps)`` for :func:`_transformer` — the masks
    of the encoder, the decoder and the encoder–decoder attention, the positions ``None``
    (``0, 1, ...``) or a packed batch's."""
    dec_input = _checked_tokens("dec_input", dec_input, params["decoder"], max_positions)
    src = _checked_tokens("src", src, params["encoder"], max_positions)
    if src.shape[0] != dec_input.shape[0]:
        raise ValueError(f"src (B, S) and dec_input (B, T) must have the same batch B, got src "
                         f"{src.shape} and dec_input {dec_input.shape}")
    if num_steps is not None:  # the full length: no shorter than the inputs
        num_steps = check_int("num_steps", num_steps, max(src.shape[1], dec_input.shape[1], 1))
    src_keep = _source_keep(src_valid_len, src.shape[0], src.shape[1])
    if segments is None:
        return (src, (src_keep, _causal_keep(dec_input.shape[1]), src_keep), dec_input, None,
                num_steps)
    segments = packing.segments(*segments, src_shape=src.shape, tgt_shape=dec_input.shape,
                                max_positions=max_positions)
    masks = packing.packed_masks(segments)
    if src_keep is not None:
        masks = (masks[0] & src_keep, masks[1], masks[2] & src_keep)
    return src, masks, dec_input, segments[2:], num_steps


def _transformer(params, src, masks, dec_input, positions, num_steps, *, num_heads,
                 max_positions, dropout, dropout_rng):
    encoder_rng = decoder_rng = None
    if dropout_rng is not None:
        encoder_rng, decoder_rng = fold(dropout_rng, 0), fold(dropout_rng, 1)
    src_positions, tgt_positions = (None, None) if positions is None else positions
    enc_outputs, enc_weights = _encoder(params["encoder"], src, masks[0], num_heads=num_heads,
                                        max_positions=max_positions, dropout=dropout,
                                        dropout_rng=encoder_rng, num_steps=num_steps,
                                        positions=src_positions)
    logits, weights = _decoder(params["decoder"], dec_input, enc_outputs, masks[1], masks[2],
                               num_heads=num_heads, max_positions=max_positions, dropout=dropout,
                               dropout_rng=decoder_rng, num_steps=num_steps,
                               positions=tgt_positions)
    return logits, {"encoder_self": enc_weights, **weights}


def teacher_forcing_loss(params, src, src_valid_len, tgt, tgt_valid_len, bos_id: int, *,
                         num_heads: int, max_positions: int = MAX_POSITIONS, dropout: float = 0.0,
                         dropout_rng=None, num_steps: int | None = None,
                         segments: packing.Segments | None = None):
    """Per-sequence training loss ``(B,)`` with teacher forcing (the book's ``MaskedSoftmaxCELoss``).

    ``tgt (B, T)`` ids in ``[0, V_tgt)`` and ``tgt_valid_len (B,)`` in ``[0, T]`` follow the
    package's rule for values (checked when concrete, clipped when traced). ``num_steps``: the
    full length of a batch cut short of its padding (:func:`transformer`), also the loss's
    divisor (``masked_cross_entropy``): the full-length batch's loss, to rounding.

    ``segments``: a packed batch (:mod:`jax_attention.models.packing`; ``tgt_valid_len`` is
    then ``None``): each row's loss is the sum of its sentences' book losses, each divided by
    ``num_steps`` — required, the length the unpacked batch pads to (its rows may be longer).
    """
    check_model(params, num_heads)
    tgt = check_tokens("tgt", tgt, jnp.shape(params["decoder"]["embedding"])[0], ndim=2)
    if segments is None:
        tgt_valid_len = check_lengths("tgt_valid_len", tgt_valid_len, tgt.shape[0],
                                      tgt.shape[1], "T")
        dec_input, model_steps = teacher_forcing_inputs(tgt, bos_id), num_steps
    else:
        if num_steps is None:
            raise ValueError("a packed batch's loss needs num_steps, the length the unpacked "
                             "batch pads to (each sentence's loss is divided by it)")
        segments = packing.segments(*segments, tgt_shape=tgt.shape)
        dec_input = packing.packed_teacher_forcing_inputs(tgt, segments.tgt, bos_id)
        model_steps = None  # packed rows draw their own dropout masks
    batch = _checked_model_inputs(params, src, src_valid_len, dec_input, num_heads,
                                  max_positions, model_steps, segments)
    logits, _ = _transformer(params, *batch, num_heads=num_heads, max_positions=max_positions,
                             dropout=check_dropout(dropout), dropout_rng=dropout_rng)
    if segments is not None:
        return packing.packed_cross_entropy(logits, tgt, segments.tgt, num_steps=num_steps)
    return masked_cross_entropy(logits, tgt, tgt_valid_len, num_steps=num_steps)


# --------------------------------------------------------------------------- decoding


def _greedy_step(params, num_heads: int, max_positions: int):
    """The :func:`~jax_attention.models.decoding.greedy_search` protocol: weights ``(B, S)`` are
    the last block's encoder–decoder weights averaged over the heads."""

    def step(state, tokens):
        logits, state, weights = cached_step(params, state, tokens, num_heads=num_heads,
                                             max_positions=max_positions)
        return logits, state, jnp.mean(weights["encoder_decoder"][-1], axis=1)

    return step


def _decoding_state(params, src, src_valid_len, *, num_heads, max_positions, max_len):
    """The source encoded once and the decoder's empty key/value cache: where both searches
    start, from checked ``src`` and int32 ``src_valid_len`` ``(B,)``."""
    enc_outputs, _ = _encoder(params["encoder"], src, lengths_keep(src_valid_len, src.shape[1]),
                              num_heads=num_heads, max_positions=max_positions, dropout=0.0,
                              dropout_rng=None)
    return initial_state(params["decoder"], enc_outputs, src_valid_len, num_heads=num_heads,
                         max_len=max_len)


@functools.partial(jax.jit, static_argnames=("num_heads", "bos_id", "eos_id", "pad_id", "max_len",
                                             "max_positions"))
def _greedy_decode(params, src, src_valid_len, *, num_heads, bos_id, eos_id, pad_id, max_len,
                   max_positions):
    state = _decoding_state(params, src, src_valid_len, num_heads=num_heads,
                            max_positions=max_positions, max_len=max_len)
    return greedy_search(_greedy_step(params["decoder"], num_heads, max_positions), state,
                         src.shape[0], bos_id=bos_id, eos_id=eos_id, pad_id=pad_id,
                         max_len=max_len)


def _checked_source(params, src, src_valid_len, num_heads: int, max_len, max_positions: int):
    """The model and a source batch for decoding, checked once, eagerly, before compiling:
    ``(src, src_valid_len, max_len)``."""
    check_model(params, num_heads)
    src = _checked_tokens("src", src, params["encoder"], max_positions)
    src_valid_len = check_lengths("src_valid_len", src_valid_len, src.shape[0], src.shape[1], "S")
    return src, src_valid_len, check_max_len_fits(max_len, max_positions)


def greedy_decode(params, src, src_valid_len, *, num_heads: int, bos_id: int, eos_id: int,
                  pad_id: int, max_len: int, max_positions: int = MAX_POSITIONS):
    """Batched greedy decoding under ``jit`` with the key/value cache — d2l §11.7.6.

    Every row stops at its own ``<eos>`` (:func:`jax_attention.models.decoding.greedy_search`).
    The parameters and token ids are checked here (eagerly) before compiling.

    Returns:
      ``(tokens (B, max_len) int32, lengths (B,) int32, weights (B, max_len, S))``; ``weights``
      are the last block's encoder–decoder weights averaged over the heads.
    """
    src, src_valid_len, max_len = _checked_source(params, src, src_valid_len, num_heads, max_len,
                                                  max_positions)
    return _greedy_decode(params, src, src_valid_len, num_heads=num_heads,
                          bos_id=bos_id, eos_id=eos_id, pad_id=pad_id, max_len=max_len,
                          max_positions=max_positions)


@functools.partial(jax.jit, static_argnames=("num_heads", "beam_size", "bos_id", "eos_id",
                                             "pad_id", "max_len", "max_positions",
                                             "length_penalty"))
def _beam_decode(params, src, src_valid_len, *, num_heads, beam_size, bos_id, eos_id, pad_id,
                 max_len, max_positions, length_penalty):
    state = _decoding_state(params, src, src_valid_len, num_heads=num_heads,
                            max_positions=max_positions, max_len=max_len)
    return decoding.beam_search(_greedy_step(params["decoder"], num_heads, max_positions), state,
                                src.shape[0], beam_size=beam_size, bos_id=bos_id,
                                eos_id=eos_id, pad_id=pad_id, max_len=max_len,
                                length_penalty=length_penalty)


def beam_decode(params, src, src_valid_len, *, num_heads: int, beam_size: int, bos_id: int,
                eos_id: int, pad_id: int, max_len: int, max_positions: int = MAX_POSITIONS,
                length_penalty: float = 0.75):
    """Beam search with the key/value cache (:func:`jax_attention.models.decoding.beam_search`).

    Returns:
      ``(tokens (B, k, max_len) int32, lengths (B, k) int32, scores (B, k))``, best first.
    """
    src, src_valid_len, max_len = _checked_source(params, src, src_valid_len, num_heads, max_len,
                                                  max_positions)
    return _beam_decode(params, src, src_valid_len, num_heads=num_heads,
                        beam_size=check_size("beam_size", beam_size), bos_id=bos_id,
                        eos_id=eos_id, pad_id=pad_id, max_len=max_len,
                        max_positions=max_positions, length_penalty=float(length_penalty))


# --------------------------------------------------------------------------- translation

#: The result type of :func:`translate`: :class:`jax_attention.models.translation.Translation`, the same
#: for every model, here with its Transformer fields (``encoder_self``, ``decoder_self``,
#: ``encoder_decoder``; ``score`` with beam search) set.
TransformerTranslation = Translation


@functools.partial(jax.jit, static_argnames=("num_heads", "max_positions"))
def _forward_weights(params, src, src_valid_len, dec_input, *, num_heads, max_positions):
    # The decoder checked the model and the source; dec_input is its own output.
    src_keep = lengths_keep(src_valid_len, src.shape[1])
    return _transformer(params, src, (src_keep, _causal_keep(dec_input.shape[1]), src_keep),
                        dec_input, None, None,
                        num_heads=num_heads, max_positions=max_positions, dropout=0.0,
                        dropout_rng=None)[1]


def _translation_decoder(params, *, num_heads: int, beam_size: int = 1,
                         max_positions: int = MAX_POSITIONS, length_penalty: float = 0.75):
    """The decoder that :func:`jax_attention.models.translation.translate` runs for this model.

    Greedy decoding (``beam_size=1``) or beam search (its best beam, with its score); then the
    attention weights of every block and head from one teacher-forced pass on ``<bos>`` and the
    predicted tokens, which equals the incremental decoding that produced them. A row's
    ``weights`` are the last block's encoder–decoder weights averaged over the heads.
    """

    def decode(src, src_valid_len, *, bos_id: int, eos_id: int, pad_id: int, max_len: int):
        options = {"num_heads": num_heads, "bos_id": bos_id, "eos_id": eos_id, "pad_id": pad_id,
                   "max_len": max_len, "max_positions": max_positions}
        scores = None
        if beam_size == 1:
            tokens, lengths, _ = jax.device_get(greedy_decode(params, src, src_valid_len,
                                                              **options))
        else:
            tokens, lengths, scores = jax.device_get(beam_decode(
                params, src, src_valid_len, beam_size=beam_size, length_penalty=length_penalty,
                **options))
            tokens, lengths, scores = tokens[:, 0], lengths[:, 0], scores[:, 0]
        tokens, lengths = np.asarray(tokens), np.asarray(lengths)
        dec_input = np.concatenate([np.full((len(src), 1), bos_id, np.int32),
                                    tokens[:, :-1].astype(np.int32)], axis=1)
        weights = jax.device_get(_forward_weights(params, src, src_valid_len, dec_input,
                                                  num_heads=num_heads, max_positions=max_positions))

        def row_weights(row: int, steps: int, valid: int) -> dict:
            cross = np.asarray(weights["encoder_decoder"][:, row, :, :steps, :valid])
            return {"weights": cross[-1].mean(axis=0),
                    "encoder_self": weights["encoder_self"][:, row, :, :valid, :valid],
                    "decoder_self": weights["decoder_self"][:, row, :, :steps, :steps],
                    "encoder_decoder": cross}

        return Decoded(tokens, lengths, row_weights, scores)

    return decode


def translate(params, sentences: str | Sequence[str], src_vocab, tgt_vocab, num_steps: int, *,
              num_heads: int, max_len: int | None = None, beam_size: int = 1,
              max_positions: int = MAX_POSITIONS, length_penalty: float = 0.75):
    """Translate sentences, all in one batch — d2l §11.7.6, greedy (``beam_size=1``) or beam search.

    :func:`jax_attention.models.translation.translate` with this model's decoder: sources encoded as in
    training, a sentence longer than ``num_steps`` truncated, unknown words as ``<unk>`` (both noted).

    Args:
      params: the parameter dict, or a :class:`TransformerSeq2Seq`.
      sentences: one sentence or a sequence of them.
      src_vocab, tgt_vocab: the vocabularies of the training data.
      num_steps: ``S``, the source length the model was trained with.
      num_heads: ``N``.
      max_len: decoding steps (default ``num_steps``).
      beam_size: ``1`` greedy, ``k > 1`` beam search (best beam) with ``length_penalty``.

    Returns:
      A :class:`~jax_attention.models.translation.Translation` (Transformer fields set), or a list.
    """
    if hasattr(params, "params_dict"):
        params = params.params_dict()
    decode = _translation_decoder(params, num_heads=num_heads,
                                  beam_size=check_size("beam_size", beam_size),
                                  max_positions=max_positions, length_penalty=length_penalty)
    return translation.translate(decode, sentences, src_vocab, tgt_vocab, num_steps,
                                 max_len=max_len)


# --------------------------------------------------------------------------- NNX modules


class _Block(ParamTree):
    """An encoder or a decoder block's parameters (the layout of :attr:`layout`), the heads and
    the options of :func:`param_shapes` (``num_kv_heads``, ``value_head_size``, ``bias``)."""

    layout = staticmethod(encoder_block_shapes)

    def __init__(self, num_hiddens: int, ffn_num_hiddens: int, num_heads: int, *,
                 num_kv_heads: int | None = None, value_head_size: int | None = None,
                 bias: bool = False, param_dtype=jnp.float32, rngs: nnx.Rngs,
                 params: dict | None = None):
        attention = attention_shapes(check_size("num_hiddens", num_hiddens), num_heads,
                                     num_kv_heads, value_head_size, bias)
        self.num_heads = num_heads
        shapes = self.layout(num_hiddens, check_size("ffn_num_hiddens", ffn_num_hiddens),
                             attention)
        self.hold(initial_flat(params, shapes, param_dtype, rngs))


class TransformerEncoderBlock(_Block):
    """One encoder block — d2l §11.7.4; calls :func:`encoder_block` (``num_kv_heads``,
    ``value_head_size`` and ``bias``: see :func:`param_shapes`; with ``bias=True`` it is PyTorch's
    ``nn.TransformerEncoderLayer``)."""

    layout = staticmethod(encoder_block_shapes)

    def __call__(self, X, src_valid_len, *, dropout: float = 0.0, dropout_rng=None):
        """``(B, S, D) -> (output (B, S, D), weights (B, N, S, S))``."""
        return encoder_block(self.params_dict(), X, src_valid_len, num_heads=self.num_heads,
                             dropout=dropout, dropout_rng=dropout_rng)


class TransformerDecoderBlock(_Block):
    """One decoder block — d2l §11.7.5; calls :func:`decoder_block` (causal self-attention; with
    ``bias=True`` it is PyTorch's ``nn.TransformerDecoderLayer``)."""

    layout = staticmethod(decoder_block_shapes)

    def __call__(self, X, enc_outputs, src_valid_len, *, dropout: float = 0.0, dropout_rng=None):
        """``-> (output (B, T, D), self_weights (B, N, T, T), cross_weights (B, N, T, S))``."""
        return decoder_block(self.params_dict(), X, enc_outputs, src_valid_len,
                             num_heads=self.num_heads, dropout=dropout, dropout_rng=dropout_rng)


def _blocks(block: type, num_hiddens: int, ffn_num_hiddens: int, num_heads: int,
            num_layers: int, params, **options) -> nnx.List:
    """``num_layers`` blocks of the class ``block`` (from ``params['blocks']`` when given)."""
    return nnx.List([
        block(num_hiddens, ffn_num_hiddens, num_heads, **options,
              params=None if params is None else params["blocks"][f"block_{i}"])
        for i in range(check_size("num_layers", num_layers))])


class TransformerEncoder(ParamTree):
    """Embedding ``(V, D)`` and ``num_layers`` :class:`TransformerEncoderBlock` — d2l §11.7.4."""

    def __init__(self, vocab_size: int, num_hiddens: int, ffn_num_hiddens: int, num_heads: int,
                 num_layers: int, *, num_kv_heads: int | None = None,
                 value_head_size: int | None = None, bias: bool = False,
                 max_positions: int = MAX_POSITIONS, param_dtype=jnp.float32, rngs: nnx.Rngs,
                 params: dict | None = None):
        shape = (check_size("vocab_size", vocab_size), check_size("num_hiddens", num_hiddens))
        own = None if params is None else {"embedding": params["embedding"]}
        self.embedding = nnx.Param(initial_flat(own, {"embedding": shape}, param_dtype,
                                            rngs)["embedding"])
        self.blocks = _blocks(TransformerEncoderBlock, num_hiddens, ffn_num_hiddens, num_heads,
                              num_layers, params, num_kv_heads=num_kv_heads,
                              value_head_size=value_head_size, bias=bias,
                              param_dtype=param_dtype, rngs=rngs)
        self.num_heads = num_heads
        self.max_positions = check_size("max_positions", max_positions)

    def param_layout(self) -> dict:
        return {"embedding": self.embedding,
                "blocks": {f"block_{i}": block for i, block in enumerate(self.blocks)}}

    def __call__(self, src, src_valid_len, *, dropout: float = 0.0, dropout_rng=None):
        """``(B, S) -> (enc_outputs (B, S, D), weights (L, B, N, S, S))``; see :func:`encoder`."""
        return encoder(self.params_dict(), src, src_valid_len, num_heads=self.num_heads,
                       max_positions=self.max_positions, dropout=dropout, dropout_rng=dropout_rng)


class TransformerDecoder(ParamTree):
    """Embedding, ``num_layers`` :class:`TransformerDecoderBlock` and the output dense — d2l §11.7.5."""

    def __init__(self, vocab_size: int, num_hiddens: int, ffn_num_hiddens: int, num_heads: int,
                 num_layers: int, *, num_kv_heads: int | None = None,
                 value_head_size: int | None = None, bias: bool = False,
                 max_positions: int = MAX_POSITIONS, param_dtype=jnp.float32, rngs: nnx.Rngs,
                 params: dict | None = None):
        V, D = check_size("vocab_size", vocab_size), check_size("num_hiddens", num_hiddens)
        own = None if params is None else {"embedding": params["embedding"],
                                           "dense": params["dense"]}
        values = initial_flat(own, {"embedding": (V, D), "dense": {"W": (D, V), "b": (V,)}},
                          param_dtype, rngs)
        self.embedding = nnx.Param(values["embedding"])
        self.blocks = _blocks(TransformerDecoderBlock, num_hiddens, ffn_num_hiddens, num_heads,
                              num_layers, params, num_kv_heads=num_kv_heads,
                              value_head_size=value_head_size, bias=bias,
                              param_dtype=param_dtype, rngs=rngs)
        self.W, self.b = nnx.Param(values["dense/W"]), nnx.Param(values["dense/b"])
        self.num_heads = num_heads
        self.max_positions = check_size("max_positions", max_positions)

    def param_layout(self) -> dict:
        return {"embedding": self.embedding,
                "blocks": {f"block_{i}": block for i, block in enumerate(self.blocks)},
                "dense": {"W": self.W, "b": self.b}}

    def __call__(self, dec_input, enc_outputs, src_valid_len, *, dropout: float = 0.0,
                 dropout_rng=None):
        """``(B, T) -> (logits (B, T, V), weights)``; see :func:`decoder`."""
        return decoder(self.params_dict(), dec_input, enc_outputs, src_valid_len,
                       num_heads=self.num_heads, max_positions=self.max_positions,
                       dropout=dropout, dropout_rng=dropout_rng)


class TransformerSeq2Seq(Seq2SeqModule):
    """The Transformer encoder–decoder — d2l §11.7, the book's ``EncoderDecoder``.

    Holds a :class:`TransformerEncoder` and a :class:`TransformerDecoder`; :meth:`params_dict` gives
    the nested dict of the functional core and the NumPy reference. Dropout acts in training mode
    (the default; ``model.eval()`` turns it off), its keys drawn from the ``dropout`` stream of
    ``rngs``. With ``sow_weights=True`` every call sows the attention weights dict (``"encoder_self"
    (L, B, N, S, S)``, ``"decoder_self" (L, B, N, T, T)``, ``"encoder_decoder" (L, B, N, T, S)``) as
    ``nnx.Intermediate`` ``"attention_weights"`` (read with ``nnx.capture``); :meth:`forward`
    returns them directly. The loss, greedy decoding and the rest of the plumbing are those of
    :class:`jax_attention.models.seq2seq_module.Seq2SeqModule`.

    Args:
      src_vocab_size, tgt_vocab_size: ``V_src``, ``V_tgt``.
      num_hiddens, ffn_num_hiddens, num_heads, num_layers: ``D``, ``F``, ``N``, ``L`` (the book:
        32, 64, 4, 2).
      dropout: the book's 0.1 (positional encoding, attention weights, AddNorm).
      num_kv_heads: ``N_kv`` key/value heads of every attention (grouped-query attention; 1:
        multi-query), dividing ``N``; ``None``: ``N``, the book's.
      max_positions: rows of the positional table (the book's 1000).
      dtype: the computation's (``None``: the parameters'; ``jnp.bfloat16``: mixed precision,
        :meth:`~jax_attention.models.seq2seq_module.Seq2SeqModule.computation_params`).
      params: initial values (the nested dict of :func:`param_shapes`); default: fresh ones from
        :func:`init_params` (one draw from ``rngs.params()``; submodules built alone draw their own).

    Example::

        >>> model = TransformerSeq2Seq(10, 12, 8, 16, num_heads=2, num_layers=1, rngs=nnx.Rngs(0))
        >>> model(jnp.ones((2, 5), jnp.int32), jnp.array([5, 3]), jnp.ones((2, 4), jnp.int32)).shape
        (2, 4, 12)
    """

    greedy_decode_function = staticmethod(greedy_decode)

    def __init__(self, src_vocab_size: int, tgt_vocab_size: int, num_hiddens: int = 32,
                 ffn_num_hiddens: int = 64, num_heads: int = 4, num_layers: int = 2,
                 dropout: float = 0.0, *, num_kv_heads: int | None = None,
                 max_positions: int = MAX_POSITIONS, sow_weights: bool = False,
                 param_dtype=jnp.float32, dtype=None, rngs: nnx.Rngs, params: dict | None = None):
        if params is None:  # one compiled initialiser for the whole tree, not one per part
            params = init_params(rngs.params(), src_vocab_size, tgt_vocab_size, num_hiddens,
                                 ffn_num_hiddens, num_heads, num_layers,
                                 num_kv_heads=num_kv_heads, param_dtype=param_dtype)
        parts = {"num_kv_heads": num_kv_heads, "max_positions": max_positions,
                 "param_dtype": param_dtype, "rngs": rngs}
        self.encoder = TransformerEncoder(src_vocab_size, num_hiddens, ffn_num_hiddens,
                                          num_heads, num_layers, params=params["encoder"], **parts)
        self.decoder = TransformerDecoder(tgt_vocab_size, num_hiddens, ffn_num_hiddens,
                                          num_heads, num_layers, params=params["decoder"], **parts)
        self.num_heads = num_heads
        self.max_positions = max_positions
        self.init_dropout(dropout, sow_weights=sow_weights, rngs=rngs, dtype=dtype)

    def forward(self, src, src_valid_len, dec_input, num_steps=None, segments=None):
        """``(logits (B, T, V), weights dict)``; see :func:`transformer` (``segments``: a
        packed batch). The batch is checked at every call; the parameter tree, built and
        checked by the constructor, is not."""
        params = self.computation_params()
        batch = _checked_model_inputs(params, src, src_valid_len, dec_input, self.num_heads,
                                      self.max_positions, num_steps, segments)
        return _transformer(params, *batch, num_heads=self.num_heads,
                            max_positions=self.max_positions, dropout=self.dropout,
                            dropout_rng=self._dropout_rng())

    def decoder_options(self) -> dict:
        """``num_heads`` and ``max_positions`` for :func:`greedy_decode`."""
        return {"num_heads": self.num_heads, "max_positions": self.max_positions}
