"""The Transformer encoder–decoder — d2l §11.7 (float64 NumPy reference).

Mirror of :mod:`jax_attention.models.transformer`: the same functions, names, argument order, einsum
strings and parameter dicts (see :func:`jax_attention.models.transformer.param_shapes`). No dropout (the
reference is the model in evaluation mode), no training, no cache: :func:`greedy_decode` recomputes
the whole prefix at every step, one sentence at a time, so that it checks the JAX key/value cache.

``AddNorm(X, Y) = LayerNorm(Y + X)`` (eps ``1e-5``); ``FFN(X) = relu(X W_1 + b_1) W_2 + b_2``;
the encoder and the decoder scale the embeddings by ``sqrt(D)`` before adding ``P``; the decoder's
self-attention is causal; the encoder–decoder attention is masked by the source valid lengths.
A missing or unexpected parameter key, nested ones included, raises ``ValueError`` naming its path.

Grouped-query attention (``N_kv`` key/value heads dividing ``N``; 1 = multi-query): every
attention's ``W_k``, ``W_v`` are ``(D, N_kv H)`` (:func:`jax_attention.models.transformer.param_shapes`
with ``num_kv_heads``), ``N_kv`` is read from ``W_k``'s width, as in the JAX functions, and query
head ``n`` attends with key/value head ``n // (N / N_kv)``
(:func:`reference_numpy.multihead.multi_head_attention`).
"""

from __future__ import annotations

import math

import numpy as np

from reference_numpy._checks import (
    check_int,
    KeySet,
    check_lengths,
    check_max_len,
    check_num_heads,
    check_numbered,
    check_param_keys,
    check_param_shapes,
    check_positions,
    check_special_ids,
    check_tokens,
)
from reference_numpy.bahdanau import masked_cross_entropy, teacher_forcing_inputs
from reference_numpy.multihead import BIAS_KEYS, KERNEL_KEYS, dense, multi_head_attention
from reference_numpy.positional import positional_encoding

__all__ = [
    "MAX_POSITIONS",
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
    "greedy_decode",
]

#: The book's ``PositionalEncoding(max_len=1000)``: the rows of the position table, the longest
#: sequence :func:`encoder` and :func:`decoder` embed (as
#: :data:`jax_attention.models.transformer_layers.MAX_POSITIONS`).
MAX_POSITIONS = 1000
#: The ``eps`` added to the variance in :func:`layer_norm`: PyTorch's ``nn.LayerNorm`` default,
#: which the book's ``AddNorm`` uses.
LAYER_NORM_EPS = 1e-5

# The keys of the parameter dicts, for check_param_keys (as in
# jax_attention/models/transformer_layers.py): a key maps to the keys of the dict under it. The
# dense layers are reference_numpy.multihead.dense, as in JAX.
ATTENTION_KEYS = KeySet(KERNEL_KEYS, BIAS_KEYS)  # the book's bias=False: no biases
FFN_KEYS = ("W_1", "b_1", "W_2", "b_2")
NORM_KEYS = ("gamma", "beta")
ENCODER_BLOCK_KEYS = {"attention": ATTENTION_KEYS, "addnorm_1": NORM_KEYS, "ffn": FFN_KEYS,
                      "addnorm_2": NORM_KEYS}
DECODER_BLOCK_KEYS = {"self_attention": ATTENTION_KEYS, "addnorm_1": NORM_KEYS,
                      "cross_attention": ATTENTION_KEYS, "addnorm_2": NORM_KEYS, "ffn": FFN_KEYS,
                      "addnorm_3": NORM_KEYS}
ENCODER_KEYS = {"embedding": None, "blocks": None}
DECODER_KEYS = {"embedding": None, "blocks": None, "dense": ("W", "b")}
MODEL_KEYS = ("encoder", "decoder")


def _check_stack(params, keys: dict, block_keys: dict, name: str = "params") -> int:
    """An encoder's or decoder's dict: its keys, then each block's, named by their path from
    ``name``; returns the number of blocks."""
    check_param_keys(name, params, keys)
    L = check_numbered("blocks", params["blocks"], "block")
    for i in range(L):
        check_param_keys(f"{name}['blocks']['block_{i}']", params["blocks"][f"block_{i}"],
                         block_keys)
    return L


def _check_model(params) -> None:
    """The whole model's dict ``{"encoder", "decoder"}``, every nested key, named by its path."""
    check_param_keys("params", params, MODEL_KEYS)
    _check_stack(params["encoder"], ENCODER_KEYS, ENCODER_BLOCK_KEYS, "params['encoder']")
    _check_stack(params["decoder"], DECODER_KEYS, DECODER_BLOCK_KEYS, "params['decoder']")


def _check_width(name: str, X, D: int, what: str = "(B, T, D)"):
    """``X`` as an array of shape ``what`` (``"(..., D)"``: any rank ``>= 1``) whose last axis is
    the model width ``D``."""
    X = np.asarray(X)
    rank_ok = X.ndim >= 1 if what.startswith("(...") else X.ndim == what.count(",") + 1
    if not rank_ok or X.shape[-1] != D:
        raise ValueError(f"{name} must have shape {what} with D = {D} (the parameters' width), "
                         f"got {X.shape}")
    return X


def position_wise_ffn(params, X):
    """``relu(X W_1 + b_1) W_2 + b_2`` — d2l §11.7.2. ``(B, T, D) -> (B, T, D)``; ``params``
    holds exactly ``W_1, b_1, W_2, b_2`` (``ValueError`` naming a missing or unexpected key)."""
    check_param_keys("params", params, FFN_KEYS)
    check_param_shapes("params", params, {"W_1": ("D", "F")})
    D, F = np.shape(params["W_1"])
    check_param_shapes("params", params, {"b_1": (F,), "W_2": (F, D), "b_2": (D,)})
    X = _check_width("X", X, D, "(..., D)")
    return dense(params, np.maximum(dense(params, X, "W_1", "b_1"), 0.0), "W_2", "b_2")


def layer_norm(params, X, eps: float = LAYER_NORM_EPS):
    """LayerNorm over the last axis (biased variance, eps ``1e-5``); ``X (..., D)``, ``D >= 1``;
    ``params`` holds exactly ``gamma, beta``."""
    check_param_keys("params", params, NORM_KEYS)
    check_param_shapes("params", params, {"gamma": ("D",)})
    D = np.shape(params["gamma"])[0]
    check_param_shapes("params", params, {"beta": (D,)})
    X = _check_width("X", X, D, "(..., D)")
    if D == 0:
        raise ValueError(f"X must have shape (..., D) with D >= 1, got {X.shape}")
    mean = X.mean(axis=-1, keepdims=True)
    variance = np.square(X - mean).mean(axis=-1, keepdims=True)
    return (X - mean) / np.sqrt(variance + eps) * np.asarray(params["gamma"]) + np.asarray(params["beta"])


def add_norm(params, X, Y):
    """``LayerNorm(Y + X)`` — d2l §11.7.3 (no dropout in the reference); ``X``, ``Y`` one shape."""
    X, Y = np.asarray(X), np.asarray(Y)
    if X.shape != Y.shape:
        raise ValueError(f"X (the residual) and Y (the sublayer's output) must have the same "
                         f"shape, got X {X.shape} and Y {Y.shape}")
    return layer_norm(params, Y + X)


def attention(params, queries, keys_values, valid_lens=None, *, num_heads: int,
              is_causal: bool = False):
    """Multi-head attention — d2l §11.5. Returns ``(output, weights (B, N, T, S))``.

    ``params`` holds ``W_q, W_k, W_v, W_o`` and optionally the biases ``b_q, b_k, b_v, b_o``
    (the book has none; PyTorch's layers do): those of :func:`reference_numpy.multihead.
    multi_head_attention`, whose sizes are read from their shapes (``W_k (D, N_kv H)``: ``N_kv``
    key/value heads; ``W_v (D, N_kv H_v)``); ``is_causal`` is a Python bool."""
    check_param_keys("params", params, ATTENTION_KEYS)
    D = np.shape(params["W_q"])[0]
    queries = _check_width("queries", queries, D)
    keys_values = _check_width("keys_values", keys_values, D, "(B, S, D)")
    return multi_head_attention(params, queries, keys_values, keys_values, valid_lens,
                                num_heads=num_heads, is_causal=is_causal)


def _source_lengths(src_valid_len, B: int, S: int):
    """``src_valid_len`` ``(B,)`` in ``[0, S]`` (or ``None``), checked by its name."""
    if src_valid_len is None:
        return None
    return check_lengths("src_valid_len", src_valid_len, B, S, "S")


def encoder_block(params, X, src_valid_len, *, num_heads: int):
    """``Y = AddNorm(X, MHA(X, X, X))``, ``AddNorm(Y, FFN(Y))`` — d2l §11.7.4.

    Returns ``(output (B, S, D), weights (B, N, S, S))``. ``params`` holds exactly the keys of
    the JAX function's (nested ones included); ``ValueError`` naming the entry otherwise.
    """
    check_param_keys("params", params, ENCODER_BLOCK_KEYS)
    X = _check_width("X", X, np.shape(params["attention"]["W_q"])[0], "(B, S, D)")
    src_valid_len = _source_lengths(src_valid_len, X.shape[0], X.shape[1])
    attended, weights = attention(params["attention"], X, X, src_valid_len, num_heads=num_heads)
    Y = add_norm(params["addnorm_1"], X, attended)
    return add_norm(params["addnorm_2"], Y, position_wise_ffn(params["ffn"], Y)), weights


def _embed(params, name: str, tokens, max_positions: int):
    embedding = np.asarray(params["embedding"])
    D = embedding.shape[1]
    T = tokens.shape[1]
    check_positions(name, T, max_positions, tokens.shape)
    # Row t of the table depends on t only, so the first T rows of any longer table are these.
    return embedding[tokens] * math.sqrt(D) + positional_encoding(max(T, 1), D)[None, :T]


def encoder(params, src, src_valid_len, *, num_heads: int, max_positions: int = MAX_POSITIONS):
    """The Transformer encoder — d2l §11.7.4. Returns ``(enc_outputs (B, S, D), weights (L, B, N, S, S))``."""
    L = _check_stack(params, ENCODER_KEYS, ENCODER_BLOCK_KEYS)
    src = check_tokens("src", src, np.shape(params["embedding"])[0], ndim=2)
    X = _embed(params, "src", src, max_positions)
    weights = []
    for i in range(L):
        X, w = encoder_block(params["blocks"][f"block_{i}"], X, src_valid_len, num_heads=num_heads)
        weights.append(w)
    return X, np.stack(weights)


def decoder_block(params, X, enc_outputs, src_valid_len, *, num_heads: int):
    """Causal self-attention, encoder–decoder attention, FFN, each with AddNorm — d2l §11.7.5.

    Returns ``(output (B, T, D), self_weights (B, N, T, T), cross_weights (B, N, T, S))``.
    """
    check_param_keys("params", params, DECODER_BLOCK_KEYS)
    D = np.shape(params["self_attention"]["W_q"])[0]
    X = _check_width("X", X, D)
    enc_outputs = _check_width("enc_outputs", enc_outputs, D, "(B, S, D)")
    if enc_outputs.shape[0] != X.shape[0]:
        raise ValueError(f"X (B, T, D) and enc_outputs (B, S, D) must have the same batch B, got "
                         f"X {X.shape} and enc_outputs {enc_outputs.shape}")
    src_valid_len = _source_lengths(src_valid_len, X.shape[0], enc_outputs.shape[1])
    attended, self_weights = attention(params["self_attention"], X, X, num_heads=num_heads,
                                       is_causal=True)
    Y = add_norm(params["addnorm_1"], X, attended)
    crossed, cross_weights = attention(params["cross_attention"], Y, enc_outputs, src_valid_len,
                                       num_heads=num_heads)
    Z = add_norm(params["addnorm_2"], Y, crossed)
    return (add_norm(params["addnorm_3"], Z, position_wise_ffn(params["ffn"], Z)), self_weights,
            cross_weights)


def decoder(params, dec_input, enc_outputs, src_valid_len, *, num_heads: int,
            max_positions: int = MAX_POSITIONS):
    """The Transformer decoder, teacher-forced — d2l §11.7.5.

    Returns ``(logits (B, T, V), {"decoder_self": (L, B, N, T, T), "encoder_decoder": (L, B, N, T, S)})``.
    """
    L = _check_stack(params, DECODER_KEYS, DECODER_BLOCK_KEYS)
    dec_input = check_tokens("dec_input", dec_input, np.shape(params["embedding"])[0], ndim=2)
    check_positions("dec_input", dec_input.shape[1], max_positions, dec_input.shape)
    D = np.shape(params["embedding"])[1]
    enc_outputs = _check_width("enc_outputs", enc_outputs, D, "(B, S, D)")
    if enc_outputs.shape[0] != dec_input.shape[0]:
        raise ValueError(f"dec_input (B, T) and enc_outputs (B, S, D) must have the same batch B, "
                         f"got dec_input {dec_input.shape} and enc_outputs {enc_outputs.shape}")
    X = _embed(params, "dec_input", dec_input, max_positions)
    self_weights, cross_weights = [], []
    for i in range(L):
        X, s, c = decoder_block(params["blocks"][f"block_{i}"], X, enc_outputs, src_valid_len,
                                num_heads=num_heads)
        self_weights.append(s)
        cross_weights.append(c)
    return dense(params["dense"], X, "W", "b"), {"decoder_self": np.stack(self_weights),
                                                  "encoder_decoder": np.stack(cross_weights)}


def transformer(params, src, src_valid_len, dec_input, *, num_heads: int,
                max_positions: int = MAX_POSITIONS):
    """Encoder then decoder. Returns ``(logits (B, T, V), weights dict)`` as the JAX function."""
    _check_model(params)
    dec_input = check_tokens("dec_input", dec_input, np.shape(params["decoder"]["embedding"])[0],
                              ndim=2)
    if np.ndim(src) == 2 and np.shape(src)[0] != dec_input.shape[0]:
        raise ValueError(f"src (B, S) and dec_input (B, T) must have the same batch B, got src "
                         f"{np.shape(src)} and dec_input {dec_input.shape}")
    enc_outputs, enc_weights = encoder(params["encoder"], src, src_valid_len, num_heads=num_heads,
                                       max_positions=max_positions)
    logits, weights = decoder(params["decoder"], dec_input, enc_outputs, src_valid_len,
                              num_heads=num_heads, max_positions=max_positions)
    return logits, {"encoder_self": enc_weights, **weights}


def teacher_forcing_loss(params, src, src_valid_len, tgt, tgt_valid_len, bos_id: int, *,
                         num_heads: int, max_positions: int = MAX_POSITIONS,
                         num_steps: int | None = None):
    """Per-sequence masked cross-entropy ``(B,)`` with teacher forcing; ``num_steps`` (at least
    the source's and the target's lengths): the divisor of a batch cut short of its padding."""
    _check_model(params)
    tgt = check_tokens("tgt", tgt, np.shape(params["decoder"]["embedding"])[0], ndim=2)
    tgt_valid_len = check_lengths("tgt_valid_len", tgt_valid_len, tgt.shape[0], tgt.shape[1], "T")
    if num_steps is not None:
        num_steps = check_int("num_steps", num_steps, max(np.shape(src)[-1], tgt.shape[1], 1))
    logits, _ = transformer(params, src, src_valid_len, teacher_forcing_inputs(tgt, bos_id),
                            num_heads=num_heads, max_positions=max_positions)
    return masked_cross_entropy(logits, tgt, tgt_valid_len, num_steps=num_steps)


def greedy_decode(params, src, src_valid_len, *, num_heads: int, bos_id: int, eos_id: int,
                  pad_id: int, max_len: int, max_positions: int = MAX_POSITIONS):
    """Greedy decoding, one sentence at a time, recomputing the whole prefix at each step.

    The step-``t`` token is at position ``t`` (``P[t]``), unlike the book's 0.17 predict loop
    which adds ``P[0]`` to every new token. Output conventions as
    :func:`jax_attention.models.transformer.greedy_decode`.

    Returns:
      ``(tokens (B, max_len), lengths (B,), weights (B, max_len, S))``; ``weights`` are the last
      block's encoder–decoder weights averaged over the heads.
    """
    _check_model(params)
    src = check_tokens("src", src, np.shape(params["encoder"]["embedding"])[0], ndim=2)
    check_positions("src", src.shape[1], max_positions, src.shape)
    src_valid_len = check_lengths("src_valid_len", src_valid_len, src.shape[0], src.shape[1], "S")
    check_num_heads(np.shape(params["encoder"]["embedding"])[1], num_heads,
                     f"D from params['encoder']['embedding'] of shape "
                     f"{np.shape(params['encoder']['embedding'])}")
    bos_id, eos_id, pad_id = check_special_ids(
        src.shape[0], np.shape(params["decoder"]["dense"]["W"])[1], bos_id=bos_id, eos_id=eos_id,
        pad_id=pad_id)
    max_len = check_max_len(max_len)
    if max_len > max_positions:
        raise ValueError(f"max_len = {max_len} decoding steps exceed the positional table's "
                         f"max_positions = {max_positions}")
    B, S = src.shape
    tokens = np.full((B, max_len), pad_id, dtype=np.int32)
    lengths = np.zeros(B, dtype=np.int32)
    weights = np.zeros((B, max_len, S))
    for b in range(B):
        enc_outputs, _ = encoder(params["encoder"], src[b:b + 1], src_valid_len[b:b + 1],
                                 num_heads=num_heads, max_positions=max_positions)
        prefix = [bos_id]
        for t in range(max_len):
            logits, step_weights = decoder(params["decoder"], np.asarray([prefix]), enc_outputs,
                                           src_valid_len[b:b + 1], num_heads=num_heads,
                                           max_positions=max_positions)
            token = int(np.argmax(logits[0, -1]))
            tokens[b, t] = token
            weights[b, t] = step_weights["encoder_decoder"][-1, 0, :, -1].mean(axis=0)
            if token == eos_id:
                break
            lengths[b] += 1
            prefix.append(token)
    return tokens, lengths, weights
