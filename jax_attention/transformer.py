"""The Transformer encoder–decoder — d2l §11.7, in JAX: functions, then NNX modules.

Mirror of :mod:`reference_numpy.transformer` (same names, argument order, einsum strings and
parameter dicts); the JAX functions add dropout (``dropout``, ``dropout_rng``) and incremental
decoding with a fixed-size key/value cache.

The model of the book (0.17 edition, PyTorch):

* encoder: ``X = embedding(src) * sqrt(D) + P[:S]`` (dropout), then ``num_layers`` blocks of
  ``Y = AddNorm(X, MHA(X, X, X, src_valid_len))``, ``AddNorm(Y, FFN(Y))``;
* decoder: ``X = embedding(dec_input) * sqrt(D) + P[:T]`` (dropout), then blocks of causal
  self-attention, encoder–decoder attention (masked by the source valid lengths) and the FFN, each
  followed by AddNorm; a dense layer maps to the vocabulary;
* ``AddNorm(X, Y) = LayerNorm(dropout(Y) + X)`` (eps ``1e-5``), ``FFN(X) = relu(X W_1 + b_1) W_2 + b_2``;
* multi-head attention without biases (the book's ``bias=False``) and dropout on its weights.

Causality is a property of the decoder's self-attention (``is_causal=True`` always), not of the
training mode: the book's training-mode ``dec_valid_lens = 1..T`` is the same mask.

Shape letters: ``B`` batch, ``S`` source length, ``T`` target length, ``L`` blocks
(``num_layers``), ``N`` heads, ``H = D / N``, ``D`` model width (``num_hiddens``), ``F`` the FFN's
hidden width (``ffn_num_hiddens``), ``V`` vocabulary, ``M`` the key/value cache length
(``max_len`` decoding steps).

Parameters: one nested dict, identical in NumPy and JAX (see :func:`param_shapes`); dense kernels
stored ``(in, out)``. Initialisation (:func:`init_params`) as the book's ``xavier_init_weights``
leaves the model: Xavier-uniform dense kernels (attention ``W_q, W_k, W_v, W_o``, the FFN's
``W_1, W_2``, the output ``W``), PyTorch's default biases ``U(-1/sqrt(in), 1/sqrt(in))``,
embeddings ``N(0, 1)``, LayerNorm ``gamma = 1``, ``beta = 0``.

Positions: the sinusoidal table ``P`` (:func:`jax_attention.positional.positional_encoding`) has
``max_positions`` rows (the book's ``max_len = 1000``); longer inputs are refused. During
incremental decoding the token of step ``t`` gets ``P[t]``. The book's 0.17 ``predict_seq2seq``
feeds the decoder one token at a time and its ``PositionalEncoding`` then adds ``P[0]`` to every
new token — a known bug, which we do not reproduce (the incremental decoder here equals the
full recomputation of the prefix, and the tests check it).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax import lax

from jax_attention import decoding
from jax_attention.bahdanau import (
    _check_dropout,
    _check_size,
    _check_tokens,
    _dropout,
    _special_id,
    flatten_params,
    masked_cross_entropy,
    teacher_forcing_inputs,
    unflatten_params,
)
from jax_attention.decoding import greedy_search
from jax_attention.masking import _check_lengths, _check_values_in, _clip_values, _is_integer_dtype
from jax_attention.multihead import _check_num_heads, _mask_inputs, combine_heads, project_heads
from jax_attention.positional import positional_encoding
from jax_attention.scoring import WEIGHTED_SUM, dot_product_attention_weights

__all__ = [
    "MAX_POSITIONS",
    "param_shapes",
    "init_params",
    "flatten_params",
    "unflatten_params",
    "position_wise_ffn",
    "layer_norm",
    "add_norm",
    "attention",
    "encoder_block",
    "encoder",
    "decoder_block",
    "decoder",
    "transformer",
    "teacher_forcing_loss",
    "init_decoder_state",
    "decoder_step",
    "greedy_decode",
    "beam_decode",
    "TransformerTranslation",
    "translate",
    "PositionWiseFFN",
    "AddNorm",
    "TransformerEncoderBlock",
    "TransformerEncoder",
    "TransformerDecoderBlock",
    "TransformerDecoder",
    "TransformerSeq2Seq",
]

#: The book's ``PositionalEncoding(max_len=1000)``: the rows of the position table.
MAX_POSITIONS = 1000
LAYER_NORM_EPS = 1e-5

# The same strings as in reference_numpy/transformer.py.
DENSE = "...i,io->...o"


# --------------------------------------------------------------------------- parameters


def _attention_shapes(D: int) -> dict:
    return {"W_q": (D, D), "W_k": (D, D), "W_v": (D, D), "W_o": (D, D)}


def _ffn_shapes(D: int, F: int) -> dict:
    return {"W_1": (D, F), "b_1": (F,), "W_2": (F, D), "b_2": (D,)}


def _norm_shapes(D: int) -> dict:
    return {"gamma": (D,), "beta": (D,)}


def _encoder_block_shapes(D: int, F: int) -> dict:
    return {"attention": _attention_shapes(D), "addnorm_1": _norm_shapes(D),
            "ffn": _ffn_shapes(D, F), "addnorm_2": _norm_shapes(D)}


def _decoder_block_shapes(D: int, F: int) -> dict:
    return {"self_attention": _attention_shapes(D), "addnorm_1": _norm_shapes(D),
            "cross_attention": _attention_shapes(D), "addnorm_2": _norm_shapes(D),
            "ffn": _ffn_shapes(D, F), "addnorm_3": _norm_shapes(D)}


def param_shapes(src_vocab_size: int, tgt_vocab_size: int, num_hiddens: int,
                 ffn_num_hiddens: int, num_layers: int) -> dict:
    """The nested dict of parameter shapes (the structure every params dict must have).

    Returns:
      ``{"encoder": {"embedding": (V_src, D), "blocks": {"block_l": {"attention": {W_q, W_k,
      W_v, W_o}, "addnorm_1": {gamma, beta}, "ffn": {W_1, b_1, W_2, b_2}, "addnorm_2"}}},
      "decoder": {"embedding": (V_tgt, D), "blocks": {"block_l": {"self_attention",
      "addnorm_1", "cross_attention", "addnorm_2", "ffn", "addnorm_3"}}, "dense": {"W": (D, V),
      "b": (V,)}}}`` with shape tuples as leaves.
    """
    V_src, V_tgt, D, F, L = (_check_size(name, value) for name, value in (
        ("src_vocab_size", src_vocab_size), ("tgt_vocab_size", tgt_vocab_size),
        ("num_hiddens", num_hiddens), ("ffn_num_hiddens", ffn_num_hiddens),
        ("num_layers", num_layers)))
    return {
        "encoder": {"embedding": (V_src, D),
                    "blocks": {f"block_{i}": _encoder_block_shapes(D, F) for i in range(L)}},
        "decoder": {"embedding": (V_tgt, D),
                    "blocks": {f"block_{i}": _decoder_block_shapes(D, F) for i in range(L)},
                    "dense": {"W": (D, V_tgt), "b": (V_tgt,)}},
    }


# A bias's fan-in is its kernel's input size: b_1 <- W_1, b_2 <- W_2, b <- W.
_BIAS_KERNEL = {"b_1": "W_1", "b_2": "W_2", "b": "W"}


@functools.partial(jax.jit, static_argnames=("spec", "dtype"))
def _init_leaves(rng, spec: tuple, dtype) -> tuple:
    """Initial values of the leaves ``spec = ((name, shape, fan_in), ...)``, chosen by name.

    One uniform draw on ``(-1, 1)`` serves every random leaf, each taking its own slice (one
    compilation of the generator instead of one per leaf):

    * ``embedding``: ``N(0, 1)`` (``nn.Embedding``), as ``sqrt(2) erfinv(u)``;
    * ``gamma``: ones, ``beta``: zeros (``nn.LayerNorm``);
    * biases ``b_1``, ``b_2``, ``b``: ``U(-1/sqrt(in), 1/sqrt(in))`` (``nn.Linear``'s default);
    * kernels ``(in, out)``: Xavier-uniform ``U(-a, a)``, ``a = sqrt(6 / (in + out))``.
    """
    sizes = [math.prod(shape) for _, shape, _ in spec]
    uniform = jax.random.uniform(rng, (sum(sizes),), dtype, jnp.nextafter(
        jnp.asarray(-1.0, dtype), jnp.asarray(1.0, dtype)), 1.0)
    values, start = [], 0
    for (name, shape, fan_in), size in zip(spec, sizes):
        u = uniform[start:start + size].reshape(shape)
        start += size
        if name == "embedding":
            values.append(jnp.sqrt(jnp.asarray(2.0, dtype)) * lax.erf_inv(u))
        elif name == "gamma":
            values.append(jnp.ones(shape, dtype))
        elif name == "beta":
            values.append(jnp.zeros(shape, dtype))
        elif name in _BIAS_KERNEL:
            values.append(u * (1.0 / math.sqrt(fan_in)))
        else:
            values.append(u * math.sqrt(6.0 / (shape[0] + shape[1])))
    return tuple(values)


def _init_flat(rng, shapes: dict, dtype) -> dict:
    """``{"a/b/W_1": shape, ...}`` -> ``{"a/b/W_1": initial value, ...}``."""
    spec = []
    for path, shape in shapes.items():
        prefix, _, name = path.rpartition("/")
        fan_in = 0
        if name in _BIAS_KERNEL:
            kernel = f"{prefix}/{_BIAS_KERNEL[name]}" if prefix else _BIAS_KERNEL[name]
            fan_in = shapes[kernel][0]
        spec.append((name, tuple(shape), fan_in))
    values = _init_leaves(rng, tuple(spec), jnp.dtype(dtype))
    return dict(zip(shapes, values))


def init_params(rng, src_vocab_size: int, tgt_vocab_size: int, num_hiddens: int = 32,
                ffn_num_hiddens: int = 64, num_heads: int = 4, num_layers: int = 2, *,
                param_dtype=jnp.float32) -> dict:
    """Fresh parameters, initialised as the book's model (see the module docstring).

    Args:
      rng: a ``jax.random`` key.
      src_vocab_size, tgt_vocab_size, num_hiddens, ffn_num_hiddens, num_layers: the sizes
        (the book: D = 32, F = 64, L = 2).
      num_heads: ``N``; checked to divide ``num_hiddens`` (the parameters do not depend on it).
      param_dtype: the parameters' dtype.

    Returns:
      The nested dict of :func:`param_shapes`, with arrays as leaves.
    """
    _check_num_heads(_check_size("num_hiddens", num_hiddens), num_heads)
    shapes = param_shapes(src_vocab_size, tgt_vocab_size, num_hiddens, ffn_num_hiddens, num_layers)
    return unflatten_params(_init_flat(rng, flatten_params(shapes), param_dtype))


# --------------------------------------------------------------------------- the functional core


def _rng(dropout_rng, index: int):
    return None if dropout_rng is None else jax.random.fold_in(dropout_rng, index)


def _dense(params, X, kernel: str, bias: str | None):
    W = jnp.asarray(params[kernel]).astype(X.dtype)
    out = jnp.einsum(DENSE, X, W)
    if bias is None:
        return out
    b = jnp.asarray(params[bias]).astype(X.dtype)
    return out + b.reshape((1,) * (out.ndim - 1) + b.shape)


def _check_params(params, expected: dict) -> None:
    """``params[name]`` must have the shape ``expected[name]`` (a tuple of ints or letters)."""
    if not hasattr(params, "keys"):
        raise ValueError(f"params must be a mapping with {sorted(expected)}, got "
                         f"{type(params).__name__}")
    missing = [name for name in expected if name not in params]
    if missing:
        raise ValueError(f"params must hold {sorted(expected)}, missing {missing}")
    for name, shape in expected.items():
        got = jnp.shape(params[name])
        if len(got) != len(shape) or any(isinstance(n, int) and n != g for n, g in zip(shape, got)):
            text = "(" + ", ".join(str(n) for n in shape) + ("," if len(shape) == 1 else "") + ")"
            raise ValueError(f"params[{name!r}] must have shape {text}, got {got}")


def _check_width(name: str, X, D: int, what: str = "(B, T, D)"):
    """``X`` as an array of shape ``what`` (``"(..., D)"``: any rank ``>= 1``) whose last axis is
    the model width ``D``."""
    X = jnp.asarray(X)
    rank_ok = X.ndim >= 1 if what.startswith("(...") else X.ndim == what.count(",") + 1
    if not rank_ok or X.shape[-1] != D:
        raise ValueError(f"{name} must have shape {what} with D = {D} (the parameters' width), "
                         f"got {X.shape}")
    return X


def position_wise_ffn(params, X):
    """The position-wise feed-forward network — d2l §11.7.2: ``relu(X W_1 + b_1) W_2 + b_2``.

    Args:
      params: ``{"W_1": (D, F), "b_1": (F,), "W_2": (F, D), "b_2": (D,)}``.
      X: ``(B, T, D)`` (any leading axes ``(..., D)``).

    Returns:
      ``(B, T, D)``.
    """
    _check_params(params, {"W_1": ("D", "F"), "b_1": ("F",), "W_2": ("F", "D"), "b_2": ("D",)})
    D, F = jnp.shape(params["W_1"])
    _check_params(params, {"b_1": (F,), "W_2": (F, D), "b_2": (D,)})
    X = _check_width("X", X, D, "(..., D)")
    return _dense(params, jax.nn.relu(_dense(params, X, "W_1", "b_1")), "W_2", "b_2")


def layer_norm(params, X, eps: float = LAYER_NORM_EPS):
    """Layer normalisation over the last axis (``nn.LayerNorm(D)``, biased variance, eps ``1e-5``).

    Args:
      params: ``{"gamma": (D,), "beta": (D,)}``. X: ``(..., D)`` with ``D >= 1``.
    """
    _check_params(params, {"gamma": ("D",), "beta": ("D",)})
    D = jnp.shape(params["gamma"])[0]
    _check_params(params, {"beta": (D,)})
    X = _check_width("X", X, D, "(..., D)")
    if D == 0:
        # The mean and variance of no feature are 0 / 0.
        raise ValueError(f"X must have shape (..., D) with D >= 1, got {X.shape}")
    mean = jnp.mean(X, axis=-1, keepdims=True)
    variance = jnp.mean(jnp.square(X - mean), axis=-1, keepdims=True)
    shape = (1,) * (X.ndim - 1) + (X.shape[-1],)
    gamma = jnp.asarray(params["gamma"]).astype(X.dtype).reshape(shape)
    beta = jnp.asarray(params["beta"]).astype(X.dtype).reshape(shape)
    return (X - mean) / jnp.sqrt(variance + eps) * gamma + beta


def add_norm(params, X, Y, *, dropout: float = 0.0, dropout_rng=None):
    """Residual connection and layer normalisation — d2l §11.7.3: ``LayerNorm(dropout(Y) + X)``.

    Args:
      params: ``{"gamma", "beta"}``. X: the residual ``(B, T, D)``. Y: the sublayer's output,
        of ``X``'s shape.
      dropout, dropout_rng: the rate and a key (``None``: no dropout).
    """
    X, Y = jnp.asarray(X), jnp.asarray(Y)
    if X.shape != Y.shape:
        raise ValueError(f"X (the residual) and Y (the sublayer's output) must have the same "
                         f"shape, got X {X.shape} and Y {Y.shape}")
    return layer_norm(params, _dropout(Y, _check_dropout(dropout), dropout_rng) + X)


def _project_one(params, X, name: str, num_heads: int):
    """``X W_name`` split into heads: ``(B, T, D) -> (B, N, T, H)``."""
    B, T, _ = X.shape
    out = jnp.einsum(DENSE, X, jnp.asarray(params[name]).astype(X.dtype))
    # Explicit H rather than -1, which an empty sequence (T = 0) leaves undetermined.
    return out.reshape(B, T, num_heads, out.shape[-1] // num_heads).transpose(0, 2, 1, 3)


def _attend(heads_q, heads_k, heads_v, keep, dropout: float, dropout_rng):
    """Scaled dot-product attention of projected heads; dropout acts on the weights only."""
    weights = dot_product_attention_weights(heads_q, heads_k, mask=keep)
    dropped = _dropout(weights, dropout, dropout_rng)
    return jnp.einsum(WEIGHTED_SUM, dropped, heads_v), weights


def attention(params, queries, keys_values, valid_lens=None, *, num_heads: int,
              is_causal: bool = False, dropout: float = 0.0, dropout_rng=None):
    """Multi-head attention of the Transformer (no biases) with dropout on its weights — d2l §11.5.

    The same computation as :func:`jax_attention.multihead.multi_head_attention` (its masking,
    projections and head split), plus the book's dropout on the attention weights.

    Args:
      params: ``{"W_q", "W_k", "W_v", "W_o"}``, each ``(D, D)``.
      queries: ``(B, T, D)``. keys_values: ``(B, S, D)``.
      valid_lens: ``None``, ``(B,)`` or ``(B, T)``.
      num_heads: ``N``. is_causal: add the causal mask.
      dropout, dropout_rng: on the weights (``None``: no dropout).

    Returns:
      ``(output (B, T, D), weights (B, N, T, S))``; the weights are those before dropout.
    """
    D = jnp.shape(params["W_q"])[0] if "W_q" in params else None
    if D is not None:
        queries = _check_width("queries", queries, D)
        keys_values = _check_width("keys_values", keys_values, D, "(B, S, D)")
    _check_dropout(dropout)
    keep, queries, keys, values = _mask_inputs(queries, keys_values, keys_values, valid_lens,
                                               None, is_causal, num_heads)
    heads_q, heads_k, heads_v = project_heads(params, queries, keys, values, num_heads=num_heads)
    heads, weights = _attend(heads_q, heads_k, heads_v, keep, dropout, dropout_rng)
    return combine_heads(params, heads), weights


def encoder_block(params, X, src_valid_len, *, num_heads: int, dropout: float = 0.0,
                  dropout_rng=None):
    """One encoder block — d2l §11.7.4 ``TransformerEncoderBlock``.

    ``Y = AddNorm(X, MHA(X, X, X, src_valid_len))``, then ``AddNorm(Y, FFN(Y))``.

    Args:
      params: ``{"attention", "addnorm_1", "ffn", "addnorm_2"}``.
      X: ``(B, S, D)``. src_valid_len: ``(B,)`` or ``None``.
      num_heads: ``N``. dropout, dropout_rng: the rate and a key (``None``: no dropout).

    Returns:
      ``(output (B, S, D), weights (B, N, S, S))``.
    """
    X = _check_width("X", X, jnp.shape(params["attention"]["W_q"])[0], "(B, S, D)")
    attended, weights = attention(params["attention"], X, X, src_valid_len, num_heads=num_heads,
                                  dropout=dropout, dropout_rng=_rng(dropout_rng, 0))
    Y = add_norm(params["addnorm_1"], X, attended, dropout=dropout,
                 dropout_rng=_rng(dropout_rng, 1))
    out = add_norm(params["addnorm_2"], Y, position_wise_ffn(params["ffn"], Y), dropout=dropout,
                   dropout_rng=_rng(dropout_rng, 2))
    return out, weights


def _num_blocks(blocks) -> int:
    if not hasattr(blocks, "keys") or not blocks:
        raise ValueError(f"blocks must be a mapping 'block_0', 'block_1', ..., got {blocks!r}")
    names = [f"block_{i}" for i in range(len(blocks))]
    if sorted(blocks) != sorted(names):
        raise ValueError(f"blocks must hold exactly {names}, got {sorted(blocks)}")
    return len(names)


def _check_positions(name: str, length: int, max_positions: int, shape=None) -> None:
    """A sequence of ``length`` positions must fit the table of ``max_positions`` rows."""
    max_positions = _check_size("max_positions", max_positions)
    if length > max_positions:
        of_shape = "" if shape is None else f" ({name} has shape {tuple(shape)})"
        raise ValueError(f"{name} has {length} positions, more than the positional table's "
                         f"max_positions = {max_positions}{of_shape}")


def _embed(params, tokens, offset_positions, max_positions: int, dtype):
    """``embedding[tokens] * sqrt(D) + P[positions]`` (d2l: the embedding scaled before adding P)."""
    embedding = jnp.asarray(params["embedding"]).astype(dtype)
    D = embedding.shape[1]
    P = positional_encoding(max_positions, D, dtype=dtype)
    positional = P[offset_positions]
    positional = positional.reshape((1,) * (tokens.ndim + 1 - positional.ndim) + positional.shape)
    return embedding[tokens] * math.sqrt(D) + positional


def _float_dtype(params):
    return jnp.asarray(params["embedding"]).dtype


def encoder(params, src, src_valid_len, *, num_heads: int, max_positions: int = MAX_POSITIONS,
            dropout: float = 0.0, dropout_rng=None):
    """The Transformer encoder — d2l §11.7.4 ``TransformerEncoder``.

    ``X = dropout(embedding(src) * sqrt(D) + P[:S])``, then the blocks.

    Args:
      params: ``{"embedding": (V_src, D), "blocks": {...}}``.
      src: ``(B, S)`` token ids in ``[0, V_src)``: checked when concrete; under ``jit`` they
        cannot be, and ids outside are clipped to ``[0, V_src - 1]`` (see
        :mod:`jax_attention.masking`). The same holds for ``dec_input`` and ``tokens`` below.
      src_valid_len: ``(B,)`` in ``[0, S]``, or ``None``.
      num_heads, max_positions, dropout, dropout_rng: see the module docstring.

    Returns:
      ``(enc_outputs (B, S, D), weights (L, B, N, S, S))``.
    """
    dropout = _check_dropout(dropout)
    embedding_rows = jnp.shape(params["embedding"])[0]
    src = _check_tokens("src", src, embedding_rows, ndim=2)
    _check_positions("src", src.shape[1], max_positions, src.shape)
    X = _embed(params, src, jnp.arange(src.shape[1]), max_positions, _float_dtype(params))
    X = _dropout(X, dropout, _rng(dropout_rng, 0))
    all_weights = []
    for i in range(_num_blocks(params["blocks"])):
        X, weights = encoder_block(params["blocks"][f"block_{i}"], X, src_valid_len,
                                   num_heads=num_heads, dropout=dropout,
                                   dropout_rng=_rng(dropout_rng, i + 1))
        all_weights.append(weights)
    return X, jnp.stack(all_weights)


def decoder_block(params, X, enc_outputs, src_valid_len, *, num_heads: int, dropout: float = 0.0,
                  dropout_rng=None):
    """One decoder block over a whole (teacher-forced) sequence — d2l §11.7.5.

    Causal self-attention (query ``t`` sees positions ``<= t``), AddNorm; encoder–decoder
    attention over ``enc_outputs`` masked by ``src_valid_len``, AddNorm; FFN, AddNorm.

    Args:
      params: ``{"self_attention", "addnorm_1", "cross_attention", "addnorm_2", "ffn",
        "addnorm_3"}``.
      X: ``(B, T, D)``. enc_outputs: ``(B, S, D)``. src_valid_len: ``(B,)`` or ``None``.

    Returns:
      ``(output (B, T, D), self_weights (B, N, T, T), cross_weights (B, N, T, S))``.
    """
    D = jnp.shape(params["self_attention"]["W_q"])[0]
    X = _check_width("X", X, D)
    enc_outputs = _check_width("enc_outputs", enc_outputs, D, "(B, S, D)")
    if enc_outputs.shape[0] != X.shape[0]:
        raise ValueError(f"X (B, T, D) and enc_outputs (B, S, D) must have the same batch B, got "
                         f"X {X.shape} and enc_outputs {enc_outputs.shape}")
    attended, self_weights = attention(params["self_attention"], X, X, num_heads=num_heads,
                                       is_causal=True, dropout=dropout,
                                       dropout_rng=_rng(dropout_rng, 0))
    Y = add_norm(params["addnorm_1"], X, attended, dropout=dropout,
                 dropout_rng=_rng(dropout_rng, 1))
    crossed, cross_weights = attention(params["cross_attention"], Y, enc_outputs, src_valid_len,
                                       num_heads=num_heads, dropout=dropout,
                                       dropout_rng=_rng(dropout_rng, 2))
    Z = add_norm(params["addnorm_2"], Y, crossed, dropout=dropout,
                 dropout_rng=_rng(dropout_rng, 3))
    out = add_norm(params["addnorm_3"], Z, position_wise_ffn(params["ffn"], Z), dropout=dropout,
                   dropout_rng=_rng(dropout_rng, 4))
    return out, self_weights, cross_weights


def decoder(params, dec_input, enc_outputs, src_valid_len, *, num_heads: int,
            max_positions: int = MAX_POSITIONS, dropout: float = 0.0, dropout_rng=None):
    """The Transformer decoder over a whole (teacher-forced) input — d2l §11.7.5.

    Args:
      params: ``{"embedding": (V_tgt, D), "blocks": {...}, "dense": {"W", "b"}}``.
      dec_input: ``(B, T)`` ids (``<bos>`` then the target shifted right).
      enc_outputs: ``(B, S, D)``. src_valid_len: ``(B,)`` or ``None``.

    Returns:
      ``(logits (B, T, V), {"decoder_self": (L, B, N, T, T), "encoder_decoder": (L, B, N, T, S)})``.
    """
    dropout = _check_dropout(dropout)
    embedding_rows = jnp.shape(params["embedding"])[0]
    dec_input = _check_tokens("dec_input", dec_input, embedding_rows, ndim=2)
    _check_positions("dec_input", dec_input.shape[1], max_positions, dec_input.shape)
    D = jnp.shape(params["embedding"])[1]
    enc_outputs = _check_width("enc_outputs", enc_outputs, D, "(B, S, D)")
    if enc_outputs.shape[0] != dec_input.shape[0]:
        raise ValueError(f"dec_input (B, T) and enc_outputs (B, S, D) must have the same batch B, "
                         f"got dec_input {dec_input.shape} and enc_outputs {enc_outputs.shape}")
    X = _embed(params, dec_input, jnp.arange(dec_input.shape[1]), max_positions,
               enc_outputs.dtype)
    X = _dropout(X, dropout, _rng(dropout_rng, 0))
    self_weights, cross_weights = [], []
    for i in range(_num_blocks(params["blocks"])):
        X, s, c = decoder_block(params["blocks"][f"block_{i}"], X, enc_outputs, src_valid_len,
                                num_heads=num_heads, dropout=dropout,
                                dropout_rng=_rng(dropout_rng, i + 1))
        self_weights.append(s)
        cross_weights.append(c)
    logits = _dense(params["dense"], X, "W", "b")
    return logits, {"decoder_self": jnp.stack(self_weights),
                    "encoder_decoder": jnp.stack(cross_weights)}


def transformer(params, src, src_valid_len, dec_input, *, num_heads: int,
                max_positions: int = MAX_POSITIONS, dropout: float = 0.0, dropout_rng=None):
    """Encoder then decoder, teacher-forced (``d2l.EncoderDecoder`` with the Transformer's parts).

    Args:
      params: ``{"encoder": {...}, "decoder": {...}}``.
      src: ``(B, S)``. src_valid_len: ``(B,)``. dec_input: ``(B, T)``.
      num_heads, max_positions: the model's heads and position table size.
      dropout, dropout_rng: the rate and a key (``None``: no dropout).

    Returns:
      ``(logits (B, T, V), weights)`` with ``weights = {"encoder_self": (L, B, N, S, S),
      "decoder_self": (L, B, N, T, T), "encoder_decoder": (L, B, N, T, S)}`` (before dropout).
    """
    # The decoder's inputs are checked before the encoder runs, so that an error costs nothing.
    dec_input = _check_tokens("dec_input", dec_input, jnp.shape(params["decoder"]["embedding"])[0],
                              ndim=2)
    if jnp.ndim(src) == 2 and jnp.shape(src)[0] != dec_input.shape[0]:
        raise ValueError(f"src (B, S) and dec_input (B, T) must have the same batch B, got src "
                         f"{jnp.shape(src)} and dec_input {dec_input.shape}")
    encoder_rng = decoder_rng = None
    if dropout_rng is not None:
        encoder_rng, decoder_rng = jax.random.split(dropout_rng)
    enc_outputs, enc_weights = encoder(params["encoder"], src, src_valid_len, num_heads=num_heads,
                                       max_positions=max_positions, dropout=dropout,
                                       dropout_rng=encoder_rng)
    logits, weights = decoder(params["decoder"], dec_input, enc_outputs, src_valid_len,
                              num_heads=num_heads, max_positions=max_positions, dropout=dropout,
                              dropout_rng=decoder_rng)
    return logits, {"encoder_self": enc_weights, **weights}


def teacher_forcing_loss(params, src, src_valid_len, tgt, tgt_valid_len, bos_id: int, *,
                         num_heads: int, max_positions: int = MAX_POSITIONS, dropout: float = 0.0,
                         dropout_rng=None):
    """Per-sequence training loss ``(B,)`` with teacher forcing (the book's ``MaskedSoftmaxCELoss``).

    ``tgt (B, T)`` ids in ``[0, V_tgt)`` and ``tgt_valid_len (B,)`` in ``[0, T]`` follow the
    package's rule for values (checked when concrete, clipped when traced).
    """
    tgt = _check_tokens("tgt", tgt, jnp.shape(params["decoder"]["embedding"])[0], ndim=2)
    tgt_valid_len = _check_lengths("tgt_valid_len", tgt_valid_len, tgt.shape[0], tgt.shape[1], "T")
    logits, _ = transformer(params, src, src_valid_len, teacher_forcing_inputs(tgt, bos_id),
                            num_heads=num_heads, max_positions=max_positions, dropout=dropout,
                            dropout_rng=dropout_rng)
    return masked_cross_entropy(logits, tgt, tgt_valid_len)


# --------------------------------------------------------------------------- incremental decoding


def init_decoder_state(params, enc_outputs, src_valid_len, *, num_heads: int, max_len: int):
    """The decoder's state before step 0: empty key/value caches of ``max_len`` steps.

    Every leaf has the batch as its leading axis (beam search repeats and reorders the state
    along axis 0):

    * ``position (B,) int32``: the step about to be decoded (its position in ``P`` and the cache
      slot it writes);
    * ``self_keys``, ``self_values`` ``(B, L, N, M, H)``: the self-attention cache, zeros;
    * ``cross_keys``, ``cross_values`` ``(B, L, N, S, H)``: the encoder outputs projected once by
      each block's ``W_k`` and ``W_v``;
    * ``src_valid_len (B,) int32``.

    Args:
      params: the decoder's dict. enc_outputs: ``(B, S, D)``.
      src_valid_len: ``(B,)`` integers in ``[0, S]`` (checked when concrete; act as clipped when
        traced), or ``None`` for ``S``.
      num_heads: ``N``. max_len: ``M``, the number of steps the cache holds.
    """
    enc_outputs = _check_width("enc_outputs", enc_outputs, jnp.shape(params["embedding"])[1],
                               "(B, S, D)")
    B, S, D = enc_outputs.shape
    _check_num_heads(D, num_heads, f"D from enc_outputs of shape {enc_outputs.shape}")
    max_len = _check_size("max_len", max_len)
    L = _num_blocks(params["blocks"])
    H = D // num_heads
    cross_keys = jnp.stack([_project_one(params["blocks"][f"block_{i}"]["cross_attention"],
                                         enc_outputs, "W_k", num_heads) for i in range(L)], axis=1)
    cross_values = jnp.stack([_project_one(params["blocks"][f"block_{i}"]["cross_attention"],
                                           enc_outputs, "W_v", num_heads) for i in range(L)],
                             axis=1)
    if src_valid_len is None:
        src_valid_len = jnp.full((B,), S, jnp.int32)
    src_valid_len = _check_lengths("src_valid_len", src_valid_len, B, S, "S")
    zeros = jnp.zeros((B, L, num_heads, max_len, H), enc_outputs.dtype)
    return {"position": jnp.zeros((B,), jnp.int32), "self_keys": zeros, "self_values": zeros,
            "cross_keys": cross_keys, "cross_values": cross_values,
            "src_valid_len": src_valid_len.astype(jnp.int32)}


_STATE_SHAPES = {"position": "(B,)", "self_keys": "(B, L, N, M, H)",
                 "self_values": "(B, L, N, M, H)", "cross_keys": "(B, L, N, S, H)",
                 "cross_values": "(B, L, N, S, H)", "src_valid_len": "(B,)"}


def _check_decoder_state(state, L: int, N: int, H: int):
    """The state of :func:`init_decoder_state` for ``L`` blocks, ``N`` heads of size ``H``;
    returns ``(B, M, S)``."""
    if not hasattr(state, "keys") or set(state) != set(_STATE_SHAPES):
        raise ValueError(f"state must be the dict of init_decoder_state with keys "
                         f"{sorted(_STATE_SHAPES)}, got "
                         f"{sorted(state) if hasattr(state, 'keys') else type(state).__name__}")
    shapes = {name: jnp.shape(value) for name, value in state.items()}
    B = shapes["position"][0] if len(shapes["position"]) == 1 else None
    self_shape = shapes["self_keys"]
    M = self_shape[3] if len(self_shape) == 5 else None
    cross_shape = shapes["cross_keys"]
    S = cross_shape[3] if len(cross_shape) == 5 else None
    expected = {"position": (B,), "self_keys": (B, L, N, M, H), "self_values": (B, L, N, M, H),
                "cross_keys": (B, L, N, S, H), "cross_values": (B, L, N, S, H),
                "src_valid_len": (B,)}
    for name, shape in expected.items():
        if None in shape or shapes[name] != shape:
            letters = _STATE_SHAPES[name]
            raise ValueError(
                f"state[{name!r}] must have shape {letters} with L = {L} blocks, N = {N} heads "
                f"(num_heads) and H = {H}, got {shapes[name]} (state['position'] "
                f"{shapes['position']}, state['self_keys'] {self_shape}, state['cross_keys'] "
                f"{cross_shape})")
    for name in ("position", "src_valid_len"):
        if not _is_integer_dtype(jnp.result_type(state[name])):
            raise ValueError(f"state[{name!r}] must hold integers, got dtype "
                             f"{jnp.result_type(state[name])} with shape {shapes[name]}")
    return B, M, S


def _write_cache(cache, new, position):
    """``cache (B, N, M, H)`` with ``new (B, N, 1, H)`` written at each row's ``position``."""
    def write(c, n, p):
        return lax.dynamic_update_slice(c, n, (jnp.zeros((), jnp.int32), p,
                                               jnp.zeros((), jnp.int32)))
    return jax.vmap(write)(cache, new, position)


def decoder_step(params, state, tokens, *, num_heads: int, max_positions: int = MAX_POSITIONS):
    """One incremental decoder step with the key/value cache (no dropout: decoding only).

    The token of each row gets ``P[position]``; each block projects it once, writes its key and
    value into the cache at ``position`` (``lax.dynamic_update_slice``, fixed shapes) and
    attends cache slots ``<= position`` — the causal self-attention of the full forward pass, so
    that the logits equal those of :func:`decoder` on the whole prefix.

    Positions: the token of step ``t`` gets ``P[t]``. (The book's 0.17 ``predict_seq2seq`` feeds
    one token at a time through ``PositionalEncoding``, which adds ``P[0]`` to every new token —
    a known bug that we do not reproduce.)

    Values follow the package's rule (:mod:`jax_attention.masking`): ``tokens`` outside
    ``[0, V)`` and positions outside ``[0, M)`` (a step past the cache) raise ``ValueError`` when
    concrete; traced ones are clipped — tokens to ``[0, V - 1]``, positions to ``[0, M - 1]``
    (a step past the cache overwrites its last slot instead of writing nowhere).

    Args:
      params: the decoder's dict. state: see :func:`init_decoder_state`. tokens: ``(B,)`` ids.

    Returns:
      ``(logits (B, V), state, weights)`` with ``weights = {"decoder_self": (L, B, N, M),
      "encoder_decoder": (L, B, N, S)}`` of this step (slots past ``position`` have weight 0).
    """
    embedding_rows, D = jnp.shape(params["embedding"])
    _check_num_heads(D, num_heads, f"D from params['embedding'] of shape {(embedding_rows, D)}")
    L = _num_blocks(params["blocks"])
    B, M, S = _check_decoder_state(state, L, num_heads, D // num_heads)
    tokens = _check_tokens("tokens", tokens, embedding_rows, ndim=1, batch=B)
    _check_positions("state['self_keys'] (the key/value cache)", M, max_positions,
                     jnp.shape(state["self_keys"]))
    _check_values_in("state['position']", state["position"], 0, M - 1,
                     f"[0, M) = [0, {M}) (the cache's steps)")
    position = _clip_values(state["position"], 0, M - 1)
    dtype = state["self_keys"].dtype
    X = _embed(params, tokens, position, max_positions, dtype)[:, None, :]  # (B, 1, D)
    self_keep = (jnp.arange(M, dtype=jnp.int32).reshape(1, M) <= position.reshape(-1, 1))
    self_keep = self_keep[:, None, None, :]  # (B, 1, 1, M)
    cross_keep = (jnp.arange(S, dtype=jnp.int32).reshape(1, S)
                  < state["src_valid_len"].reshape(-1, 1))[:, None, None, :]
    self_keys, self_values = [], []
    self_weights, cross_weights = [], []
    for i in range(_num_blocks(params["blocks"])):
        block = params["blocks"][f"block_{i}"]
        q = _project_one(block["self_attention"], X, "W_q", num_heads)
        k = _write_cache(state["self_keys"][:, i], _project_one(block["self_attention"], X, "W_k",
                                                                 num_heads), position)
        v = _write_cache(state["self_values"][:, i], _project_one(block["self_attention"], X,
                                                                   "W_v", num_heads), position)
        self_keys.append(k)
        self_values.append(v)
        heads, w_self = _attend(q, k, v, self_keep, 0.0, None)
        Y = add_norm(block["addnorm_1"], X, combine_heads(block["self_attention"], heads))
        q = _project_one(block["cross_attention"], Y, "W_q", num_heads)
        heads, w_cross = _attend(q, state["cross_keys"][:, i], state["cross_values"][:, i],
                                 cross_keep, 0.0, None)
        Z = add_norm(block["addnorm_2"], Y, combine_heads(block["cross_attention"], heads))
        X = add_norm(block["addnorm_3"], Z, position_wise_ffn(block["ffn"], Z))
        self_weights.append(w_self[:, :, 0])
        cross_weights.append(w_cross[:, :, 0])
    logits = _dense(params["dense"], X[:, 0], "W", "b")
    new_state = dict(state, position=position + 1, self_keys=jnp.stack(self_keys, axis=1),
                     self_values=jnp.stack(self_values, axis=1))
    return logits, new_state, {"decoder_self": jnp.stack(self_weights),
                               "encoder_decoder": jnp.stack(cross_weights)}


def _greedy_step(params, num_heads: int, max_positions: int):
    """The :func:`~jax_attention.decoding.greedy_search` protocol: weights ``(B, S)`` are the last
    block's encoder–decoder weights averaged over the heads."""

    def step(state, tokens):
        logits, state, weights = decoder_step(params, state, tokens, num_heads=num_heads,
                                              max_positions=max_positions)
        return logits, state, jnp.mean(weights["encoder_decoder"][-1], axis=1)

    return step


def _check_max_len(max_len, max_positions):
    max_len = _check_size("max_len", max_len)
    if max_len > max_positions:
        raise ValueError(f"max_len = {max_len} decoding steps exceed the positional table's "
                         f"max_positions = {max_positions}")
    return max_len


@functools.partial(jax.jit, static_argnames=("num_heads", "bos_id", "eos_id", "pad_id", "max_len",
                                             "max_positions"))
def _greedy_decode(params, src, src_valid_len, *, num_heads, bos_id, eos_id, pad_id, max_len,
                   max_positions):
    enc_outputs, _ = encoder(params["encoder"], src, src_valid_len, num_heads=num_heads,
                             max_positions=max_positions)
    state = init_decoder_state(params["decoder"], enc_outputs, src_valid_len,
                               num_heads=num_heads, max_len=max_len)
    return greedy_search(_greedy_step(params["decoder"], num_heads, max_positions), state,
                         enc_outputs.shape[0], bos_id=bos_id, eos_id=eos_id, pad_id=pad_id,
                         max_len=max_len)


def greedy_decode(params, src, src_valid_len, *, num_heads: int, bos_id: int, eos_id: int,
                  pad_id: int, max_len: int, max_positions: int = MAX_POSITIONS):
    """Batched greedy decoding under ``jit`` with the key/value cache — d2l §11.7.6.

    Every row stops at its own ``<eos>`` (:func:`jax_attention.decoding.greedy_search`). Token
    ids are checked here (eagerly) before compiling.

    Returns:
      ``(tokens (B, max_len) int32, lengths (B,) int32, weights (B, max_len, S))``; ``weights``
      are the last block's encoder–decoder weights averaged over the heads.
    """
    src = _check_tokens("src", src, jnp.shape(params["encoder"]["embedding"])[0], ndim=2)
    _check_positions("src", src.shape[1], max_positions, src.shape)
    src_valid_len = _check_lengths("src_valid_len", src_valid_len, src.shape[0], src.shape[1], "S")
    max_len = _check_max_len(max_len, max_positions)
    return _greedy_decode(params, src, src_valid_len, num_heads=num_heads,
                          bos_id=bos_id, eos_id=eos_id, pad_id=pad_id, max_len=max_len,
                          max_positions=max_positions)


@functools.partial(jax.jit, static_argnames=("num_heads", "beam_size", "bos_id", "eos_id",
                                             "pad_id", "max_len", "max_positions",
                                             "length_penalty"))
def _beam_decode(params, src, src_valid_len, *, num_heads, beam_size, bos_id, eos_id, pad_id,
                 max_len, max_positions, length_penalty):
    enc_outputs, _ = encoder(params["encoder"], src, src_valid_len, num_heads=num_heads,
                             max_positions=max_positions)
    state = init_decoder_state(params["decoder"], enc_outputs, src_valid_len,
                               num_heads=num_heads, max_len=max_len)
    return decoding.beam_search(_greedy_step(params["decoder"], num_heads, max_positions), state,
                                enc_outputs.shape[0], beam_size=beam_size, bos_id=bos_id,
                                eos_id=eos_id, pad_id=pad_id, max_len=max_len,
                                length_penalty=length_penalty)


def beam_decode(params, src, src_valid_len, *, num_heads: int, beam_size: int, bos_id: int,
                eos_id: int, pad_id: int, max_len: int, max_positions: int = MAX_POSITIONS,
                length_penalty: float = 0.75):
    """Beam search with the key/value cache (:func:`jax_attention.decoding.beam_search`).

    Returns:
      ``(tokens (B, k, max_len) int32, lengths (B, k) int32, scores (B, k))``, best first.
    """
    if not hasattr(decoding, "beam_search"):
        raise NotImplementedError("jax_attention.decoding.beam_search is not available yet")
    src = _check_tokens("src", src, jnp.shape(params["encoder"]["embedding"])[0], ndim=2)
    _check_positions("src", src.shape[1], max_positions, src.shape)
    src_valid_len = _check_lengths("src_valid_len", src_valid_len, src.shape[0], src.shape[1], "S")
    max_len = _check_max_len(max_len, max_positions)
    return _beam_decode(params, src, src_valid_len, num_heads=num_heads,
                        beam_size=_check_size("beam_size", beam_size), bos_id=bos_id,
                        eos_id=eos_id, pad_id=pad_id, max_len=max_len,
                        max_positions=max_positions, length_penalty=float(length_penalty))


# --------------------------------------------------------------------------- translation


@dataclass(frozen=True, eq=False)  # eq would compare arrays elementwise
class TransformerTranslation:
    """The translation of one sentence (:func:`translate`).

    Attributes:
      source, source_tokens, tokens, translation, finished, truncated, unknown_words, notes: as
        :class:`jax_attention.bahdanau.Translation`.
      weights: ``(steps, len(source_tokens))``: the last block's encoder–decoder weights averaged
        over the heads, one row per decoding step (``<eos>`` included when predicted).
      encoder_self: ``(L, N, S', S')`` the encoder self-attention weights, ``S'`` the source
        tokens read.
      decoder_self: ``(L, N, steps, steps)`` the decoder self-attention weights.
      encoder_decoder: ``(L, N, steps, S')`` the encoder–decoder weights of every block and head.
      score: the beam's length-normalised log-probability (``None`` for greedy decoding).

    The attention weights of every block and head are those of the teacher-forced forward pass
    on ``<bos>`` and the predicted tokens, which equals the incremental decoding that produced
    them.
    """

    source: str
    source_tokens: list[str]
    tokens: list[str]
    translation: str
    weights: np.ndarray
    encoder_self: np.ndarray
    decoder_self: np.ndarray
    encoder_decoder: np.ndarray
    finished: bool
    truncated: bool
    unknown_words: list[str]
    notes: list[str]
    score: float | None = None


@functools.partial(jax.jit, static_argnames=("num_heads", "max_positions"))
def _forward_weights(params, src, src_valid_len, dec_input, *, num_heads, max_positions):
    return transformer(params, src, src_valid_len, dec_input, num_heads=num_heads,
                       max_positions=max_positions)[1]


def translate(params, sentences: str | Sequence[str], src_vocab, tgt_vocab, num_steps: int, *,
              num_heads: int, max_len: int | None = None, beam_size: int = 1,
              max_positions: int = MAX_POSITIONS, length_penalty: float = 0.75):
    """Translate sentences, all in one batch — d2l §11.7.6, greedy (``beam_size=1``) or beam search.

    Sources are encoded as in training (:func:`jax_attention.data.encode_source`); a sentence
    longer than ``num_steps`` is truncated (noted), unknown words are read as ``<unk>`` (noted).

    Args:
      params: the parameter dict, or a :class:`TransformerSeq2Seq`.
      sentences: one sentence or a sequence of them.
      src_vocab, tgt_vocab: the vocabularies of the training data.
      num_steps: ``S``, the source length the model was trained with.
      num_heads: ``N``.
      max_len: decoding steps (default ``num_steps``).
      beam_size: ``1`` greedy, ``k > 1`` beam search (best beam) with ``length_penalty``.

    Returns:
      A :class:`TransformerTranslation` for a ``str``, else a list of them.
    """
    from jax_attention.data import encode_source, preprocess

    if hasattr(params, "params_dict"):
        params = params.params_dict()
    single = isinstance(sentences, str)
    sentences = [sentences] if single else list(sentences)
    for sentence in sentences:
        if not isinstance(sentence, str):
            raise TypeError(f"sentences must be strings, got {sentence!r} ({type(sentence).__name__})")
    num_steps = _check_size("num_steps", num_steps)
    max_len = num_steps if max_len is None else _check_size("max_len", max_len)
    beam_size = _check_size("beam_size", beam_size)
    if not sentences:
        return []
    bos_id, eos_id, pad_id = (_special_id(tgt_vocab, t) for t in ("<bos>", "<eos>", "<pad>"))
    encoded = [encode_source(sentence, src_vocab, num_steps) for sentence in sentences]
    src = np.stack([ids for ids, _ in encoded]).astype(np.int32)
    src_valid_len = np.asarray([valid for _, valid in encoded], dtype=np.int32)
    scores = None
    if beam_size == 1:
        tokens, lengths, _ = jax.device_get(greedy_decode(
            params, src, src_valid_len, num_heads=num_heads, bos_id=bos_id, eos_id=eos_id,
            pad_id=pad_id, max_len=max_len, max_positions=max_positions))
    else:
        tokens, lengths, scores = jax.device_get(beam_decode(
            params, src, src_valid_len, num_heads=num_heads, beam_size=beam_size, bos_id=bos_id,
            eos_id=eos_id, pad_id=pad_id, max_len=max_len, max_positions=max_positions,
            length_penalty=length_penalty))
        tokens, lengths, scores = tokens[:, 0], lengths[:, 0], scores[:, 0]
    tokens, lengths = np.asarray(tokens), np.asarray(lengths)
    # All weights from one teacher-forced pass on <bos> + the predictions (equal to the cache's).
    dec_input = np.concatenate([np.full((len(sentences), 1), bos_id, np.int32),
                                tokens[:, :-1].astype(np.int32)], axis=1)
    weights = jax.device_get(_forward_weights(params, src, src_valid_len, dec_input,
                                              num_heads=num_heads, max_positions=max_positions))

    results = []
    for row, sentence in enumerate(sentences):
        words = preprocess(sentence).split()
        valid = int(src_valid_len[row])
        length = int(lengths[row])
        finished = length < max_len and bool(np.any(tokens[row] == eos_id))
        steps = length + 1 if finished else length
        predicted = tgt_vocab.to_tokens([int(i) for i in tokens[row, :length]])
        unknown = [word for word in words[:num_steps] if word not in src_vocab]
        truncated = len(words) + 1 > num_steps
        notes = []
        if truncated:
            notes.append(f"source truncated: {len(words)} words and <eos> exceed num_steps = "
                         f"{num_steps}; the model read only the first {num_steps} tokens"
                         + ("" if len(words) > num_steps else " (no <eos>)"))
        if unknown:
            notes.append("unknown words read as <unk>: " + ", ".join(unknown))
        if not finished:
            notes.append(f"no <eos> within max_len = {max_len} steps; the translation may be cut")
        cross = np.asarray(weights["encoder_decoder"][:, row, :, :steps, :valid])
        results.append(TransformerTranslation(
            source=sentence,
            source_tokens=src_vocab.to_tokens([int(i) for i in src[row, :valid]]),
            tokens=predicted,
            translation=" ".join(predicted),
            weights=cross[-1].mean(axis=0),
            encoder_self=np.asarray(weights["encoder_self"][:, row, :, :valid, :valid]),
            decoder_self=np.asarray(weights["decoder_self"][:, row, :, :steps, :steps]),
            encoder_decoder=cross,
            finished=finished,
            truncated=truncated,
            unknown_words=unknown,
            notes=notes,
            score=None if scores is None else float(scores[row]),
        ))
    return results[0] if single else results


# --------------------------------------------------------------------------- NNX modules


def _init_module(rngs: nnx.Rngs, shapes: dict, dtype) -> dict:
    """Initial values for a module's own (nested) shapes, keyed by ``/``-joined paths."""
    return _init_flat(rngs.params(), flatten_params(shapes), dtype)


def _initial(values, shapes: dict, param_dtype, rngs: nnx.Rngs) -> dict:
    """``values`` (a nested dict of the module's structure) flattened and checked, or fresh ones."""
    if values is None:
        return _init_module(rngs, shapes, param_dtype)
    flat = {path: jnp.asarray(value, param_dtype) for path, value in flatten_params(values).items()}
    expected = {path: tuple(shape) for path, shape in flatten_params(shapes).items()}
    got = {path: value.shape for path, value in flat.items()}
    if got != expected:
        raise ValueError(f"params must have the shapes {expected}, got {got}")
    return flat


class _ParamTree(nnx.Module):
    """Holds a nested dict of parameters as ``nnx.Param`` leaves; :meth:`params_dict` returns it."""

    def __init__(self, shapes: dict, *, param_dtype, rngs: nnx.Rngs, values=None):
        values = _initial(values, shapes, param_dtype, rngs)
        self._paths = tuple(values)
        self.params = nnx.Dict({path.replace("/", "__"): nnx.Param(value)
                                for path, value in values.items()})

    def params_dict(self) -> dict:
        return unflatten_params({path: self.params[path.replace("/", "__")][...]
                                 for path in self._paths})


class PositionWiseFFN(_ParamTree):
    """``relu(X W_1 + b_1) W_2 + b_2`` — d2l §11.7.2; calls :func:`position_wise_ffn`."""

    def __init__(self, num_hiddens: int, ffn_num_hiddens: int, *, param_dtype=jnp.float32,
                 rngs: nnx.Rngs):
        super().__init__(_ffn_shapes(_check_size("num_hiddens", num_hiddens),
                                     _check_size("ffn_num_hiddens", ffn_num_hiddens)),
                         param_dtype=param_dtype, rngs=rngs)

    def __call__(self, X):
        return position_wise_ffn(self.params_dict(), X)


class AddNorm(_ParamTree):
    """``LayerNorm(dropout(Y) + X)`` — d2l §11.7.3; calls :func:`add_norm`."""

    def __init__(self, num_hiddens: int, *, param_dtype=jnp.float32, rngs: nnx.Rngs):
        super().__init__(_norm_shapes(_check_size("num_hiddens", num_hiddens)),
                         param_dtype=param_dtype, rngs=rngs)

    def __call__(self, X, Y, *, dropout: float = 0.0, dropout_rng=None):
        return add_norm(self.params_dict(), X, Y, dropout=dropout, dropout_rng=dropout_rng)


class TransformerEncoderBlock(_ParamTree):
    """One encoder block — d2l §11.7.4; calls :func:`encoder_block`."""

    def __init__(self, num_hiddens: int, ffn_num_hiddens: int, num_heads: int, *,
                 param_dtype=jnp.float32, rngs: nnx.Rngs, params: dict | None = None):
        _check_num_heads(_check_size("num_hiddens", num_hiddens), num_heads)
        self.num_heads = num_heads
        super().__init__(_encoder_block_shapes(num_hiddens, _check_size("ffn_num_hiddens",
                                                                        ffn_num_hiddens)),
                         param_dtype=param_dtype, rngs=rngs, values=params)

    def __call__(self, X, src_valid_len, *, dropout: float = 0.0, dropout_rng=None):
        """``(B, S, D) -> (output (B, S, D), weights (B, N, S, S))``."""
        return encoder_block(self.params_dict(), X, src_valid_len, num_heads=self.num_heads,
                             dropout=dropout, dropout_rng=dropout_rng)


class TransformerDecoderBlock(_ParamTree):
    """One decoder block — d2l §11.7.5; calls :func:`decoder_block` (causal self-attention)."""

    def __init__(self, num_hiddens: int, ffn_num_hiddens: int, num_heads: int, *,
                 param_dtype=jnp.float32, rngs: nnx.Rngs, params: dict | None = None):
        _check_num_heads(_check_size("num_hiddens", num_hiddens), num_heads)
        self.num_heads = num_heads
        super().__init__(_decoder_block_shapes(num_hiddens, _check_size("ffn_num_hiddens",
                                                                        ffn_num_hiddens)),
                         param_dtype=param_dtype, rngs=rngs, values=params)

    def __call__(self, X, enc_outputs, src_valid_len, *, dropout: float = 0.0, dropout_rng=None):
        """``-> (output (B, T, D), self_weights (B, N, T, T), cross_weights (B, N, T, S))``."""
        return decoder_block(self.params_dict(), X, enc_outputs, src_valid_len,
                             num_heads=self.num_heads, dropout=dropout, dropout_rng=dropout_rng)


class TransformerEncoder(nnx.Module):
    """Embedding ``(V, D)`` and ``num_layers`` :class:`TransformerEncoderBlock` — d2l §11.7.4."""

    def __init__(self, vocab_size: int, num_hiddens: int, ffn_num_hiddens: int, num_heads: int,
                 num_layers: int, *, max_positions: int = MAX_POSITIONS, param_dtype=jnp.float32,
                 rngs: nnx.Rngs, params: dict | None = None):
        shape = (_check_size("vocab_size", vocab_size), _check_size("num_hiddens", num_hiddens))
        own = None if params is None else {"embedding": params["embedding"]}
        self.embedding = nnx.Param(_initial(own, {"embedding": shape}, param_dtype,
                                            rngs)["embedding"])
        self.blocks = nnx.List([
            TransformerEncoderBlock(num_hiddens, ffn_num_hiddens, num_heads,
                                    param_dtype=param_dtype, rngs=rngs,
                                    params=None if params is None else params["blocks"][f"block_{i}"])
            for i in range(_check_size("num_layers", num_layers))])
        self.num_heads = num_heads
        self.max_positions = _check_size("max_positions", max_positions)

    def params_dict(self) -> dict:
        return {"embedding": self.embedding[...],
                "blocks": {f"block_{i}": b.params_dict() for i, b in enumerate(self.blocks)}}

    def __call__(self, src, src_valid_len, *, dropout: float = 0.0, dropout_rng=None):
        """``(B, S) -> (enc_outputs (B, S, D), weights (L, B, N, S, S))``; see :func:`encoder`."""
        return encoder(self.params_dict(), src, src_valid_len, num_heads=self.num_heads,
                       max_positions=self.max_positions, dropout=dropout, dropout_rng=dropout_rng)


class TransformerDecoder(nnx.Module):
    """Embedding, ``num_layers`` :class:`TransformerDecoderBlock` and the output dense — d2l §11.7.5."""

    def __init__(self, vocab_size: int, num_hiddens: int, ffn_num_hiddens: int, num_heads: int,
                 num_layers: int, *, max_positions: int = MAX_POSITIONS, param_dtype=jnp.float32,
                 rngs: nnx.Rngs, params: dict | None = None):
        V, D = _check_size("vocab_size", vocab_size), _check_size("num_hiddens", num_hiddens)
        own = None if params is None else {"embedding": params["embedding"],
                                           "dense": params["dense"]}
        values = _initial(own, {"embedding": (V, D), "dense": {"W": (D, V), "b": (V,)}},
                          param_dtype, rngs)
        self.embedding = nnx.Param(values["embedding"])
        self.blocks = nnx.List([
            TransformerDecoderBlock(num_hiddens, ffn_num_hiddens, num_heads,
                                    param_dtype=param_dtype, rngs=rngs,
                                    params=None if params is None else params["blocks"][f"block_{i}"])
            for i in range(_check_size("num_layers", num_layers))])
        self.W, self.b = nnx.Param(values["dense/W"]), nnx.Param(values["dense/b"])
        self.num_heads = num_heads
        self.max_positions = _check_size("max_positions", max_positions)

    def params_dict(self) -> dict:
        return {"embedding": self.embedding[...],
                "blocks": {f"block_{i}": b.params_dict() for i, b in enumerate(self.blocks)},
                "dense": {"W": self.W[...], "b": self.b[...]}}

    def __call__(self, dec_input, enc_outputs, src_valid_len, *, dropout: float = 0.0,
                 dropout_rng=None):
        """``(B, T) -> (logits (B, T, V), weights)``; see :func:`decoder`."""
        return decoder(self.params_dict(), dec_input, enc_outputs, src_valid_len,
                       num_heads=self.num_heads, max_positions=self.max_positions,
                       dropout=dropout, dropout_rng=dropout_rng)


class TransformerSeq2Seq(nnx.Module):
    """The Transformer encoder–decoder — d2l §11.7, the book's ``EncoderDecoder``.

    Holds a :class:`TransformerEncoder` and a :class:`TransformerDecoder`; :meth:`params_dict`
    gives the nested dict of the functional core and the NumPy reference. Dropout acts in
    training mode (the default; ``model.eval()`` turns it off), its keys drawn from the
    ``dropout`` stream of ``rngs``. With ``sow_weights=True`` every call sows the attention
    weights dict (``"encoder_self" (L, B, N, S, S)``, ``"decoder_self" (L, B, N, T, T)``,
    ``"encoder_decoder" (L, B, N, T, S)``) as ``nnx.Intermediate`` ``"attention_weights"``
    (read with ``nnx.capture``); :meth:`forward` returns them directly.

    Args:
      src_vocab_size, tgt_vocab_size: ``V_src``, ``V_tgt``.
      num_hiddens, ffn_num_hiddens, num_heads, num_layers: ``D``, ``F``, ``N``, ``L`` (the book:
        32, 64, 4, 2).
      dropout: the book's 0.1 (positional encoding, attention weights, AddNorm).
      max_positions: rows of the positional table (the book's 1000).
      params: initial values (the nested dict of :func:`param_shapes`); default: fresh ones from
        :func:`init_params` (one draw from ``rngs.params()``; the submodules, built on their
        own, draw their own).
    """

    def __init__(self, src_vocab_size: int, tgt_vocab_size: int, num_hiddens: int = 32,
                 ffn_num_hiddens: int = 64, num_heads: int = 4, num_layers: int = 2,
                 dropout: float = 0.0, *, max_positions: int = MAX_POSITIONS,
                 sow_weights: bool = False, param_dtype=jnp.float32, rngs: nnx.Rngs,
                 params: dict | None = None):
        if params is None:  # one compiled initialiser for the whole tree, not one per part
            params = init_params(rngs.params(), src_vocab_size, tgt_vocab_size, num_hiddens,
                                 ffn_num_hiddens, num_heads, num_layers, param_dtype=param_dtype)
        self.encoder = TransformerEncoder(src_vocab_size, num_hiddens, ffn_num_hiddens,
                                          num_heads, num_layers, max_positions=max_positions,
                                          param_dtype=param_dtype, rngs=rngs,
                                          params=params["encoder"])
        self.decoder = TransformerDecoder(tgt_vocab_size, num_hiddens, ffn_num_hiddens,
                                          num_heads, num_layers, max_positions=max_positions,
                                          param_dtype=param_dtype, rngs=rngs,
                                          params=params["decoder"])
        self.num_heads = num_heads
        self.max_positions = max_positions
        self.dropout = _check_dropout(dropout)
        self.deterministic = False
        self.sow_weights = sow_weights
        self.dropout_rngs = rngs.dropout.fork() if self.dropout > 0 else nnx.data(None)

    def params_dict(self) -> dict:
        """``{"encoder": {...}, "decoder": {...}}``."""
        return {"encoder": self.encoder.params_dict(), "decoder": self.decoder.params_dict()}

    def _dropout_rng(self):
        if self.deterministic or self.dropout == 0.0:
            return None
        return self.dropout_rngs()

    def forward(self, src, src_valid_len, dec_input):
        """``(logits (B, T, V), weights dict)``; see :func:`transformer`."""
        return transformer(self.params_dict(), src, src_valid_len, dec_input,
                           num_heads=self.num_heads, max_positions=self.max_positions,
                           dropout=self.dropout, dropout_rng=self._dropout_rng())

    def __call__(self, src, src_valid_len, dec_input):
        """Teacher-forced logits ``(B, T, V)`` (the weights are sown with ``sow_weights``)."""
        logits, weights = self.forward(src, src_valid_len, dec_input)
        if self.sow_weights:
            self.sow(nnx.Intermediate, "attention_weights", weights)
        return logits

    def loss(self, src, src_valid_len, tgt, tgt_valid_len, *, bos_id: int):
        """The book's per-sequence loss ``(B,)``, dropout as the mode says."""
        logits = self(src, src_valid_len, teacher_forcing_inputs(tgt, bos_id))
        return masked_cross_entropy(logits, tgt, tgt_valid_len)

    def greedy_decode(self, src, src_valid_len, *, bos_id: int, eos_id: int, pad_id: int,
                      max_len: int):
        """:func:`greedy_decode` on this model's parameters (no dropout)."""
        return greedy_decode(self.params_dict(), src, src_valid_len, num_heads=self.num_heads,
                             bos_id=bos_id, eos_id=eos_id, pad_id=pad_id, max_len=max_len,
                             max_positions=self.max_positions)
