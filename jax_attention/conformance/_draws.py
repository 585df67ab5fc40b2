"""The building blocks of the canonical cases: random arrays drawn from one case's seed, and
inputs and parameter dicts in the layouts the reference functions take (dense kernels
``(in, out)``). Private to :mod:`jax_attention.conformance.cases`, which builds the cases from
them.
"""

from __future__ import annotations

import numpy as np


class Draw:
    """Random arrays from one case's seed; float64 by construction."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)

    def normal(self, *shape, scale=1.0, loc=0.0) -> np.ndarray:
        """Normal draws of ``shape``, mean ``loc``, standard deviation ``scale``."""
        return loc + scale * self.rng.normal(size=shape)

    def dense(self, fan_in: int, fan_out: int) -> np.ndarray:
        """A kernel ``(in, out)`` scaled like Xavier, so activations neither vanish nor saturate."""
        return self.rng.normal(size=(fan_in, fan_out)) * np.sqrt(2.0 / (fan_in + fan_out))

    def tokens(self, vocab_size: int, *shape) -> np.ndarray:
        """Token ids in ``[0, vocab_size)`` of ``shape``, int32."""
        return self.rng.integers(0, vocab_size, size=shape).astype(np.int32)

    def mask(self, *shape, p=0.65) -> np.ndarray:
        """A boolean mask (True = attend) in which every row keeps at least one key."""
        mask = self.rng.random(shape) < p
        empty = ~mask.any(axis=-1)
        mask[empty, self.rng.integers(0, shape[-1], size=int(empty.sum()))] = True
        return mask


def lens(*values) -> np.ndarray:
    """Valid lengths as int32: ``lens(2, 5)``, ``lens([1, 3], [2, 2])``."""
    return np.asarray(values, dtype=np.int32)


def gru_params(draw: Draw, input_size: int, num_hiddens: int, num_layers: int) -> dict:
    """A multi-layer GRU's ``{"layer_<l>": {W_x, W_h, b_x, b_h}}``, gates ``(r, z, n)``."""
    g = 3 * num_hiddens
    return {f"layer_{layer}": {
        "W_x": draw.dense(input_size if layer == 0 else num_hiddens, g),
        "W_h": draw.dense(num_hiddens, g),
        "b_x": draw.normal(g, scale=0.3),
        "b_h": draw.normal(g, scale=0.3),
    } for layer in range(num_layers)}


def bahdanau_params(draw: Draw, V_src: int, V_tgt: int, E: int, h: int, L: int) -> dict:
    """The Bahdanau seq2seq's ``{"encoder", "decoder"}`` (d2l §11.4)."""
    return {
        "encoder": {"embedding": draw.normal(V_src, E), "gru": gru_params(draw, E, h, L)},
        "decoder": {
            "embedding": draw.normal(V_tgt, E),
            "attention": {"W_q": draw.dense(h, h), "W_k": draw.dense(h, h),
                          "w_v": draw.dense(h, 1)},
            "gru": gru_params(draw, h + E, h, L),
            "dense": {"W": draw.dense(h, V_tgt), "b": draw.normal(V_tgt, scale=0.3)},
        },
    }


def attention_params(draw: Draw, D: int) -> dict:
    """A Transformer block's multi-head attention: ``W_q, W_k, W_v, W_o (D, D)``, no biases."""
    return {name: draw.dense(D, D) for name in ("W_q", "W_k", "W_v", "W_o")}


def norm_params(draw: Draw, D: int) -> dict:
    """LayerNorm's ``gamma`` (near 1) and ``beta``."""
    return {"gamma": draw.normal(D, scale=0.2, loc=1.0), "beta": draw.normal(D, scale=0.2)}


def ffn_params(draw: Draw, D: int, F: int) -> dict:
    """The position-wise FFN's ``W_1 (D, F), b_1, W_2 (F, D), b_2``."""
    return {"W_1": draw.dense(D, F), "b_1": draw.normal(F, scale=0.3), "W_2": draw.dense(F, D),
            "b_2": draw.normal(D, scale=0.3)}


def encoder_block_params(draw: Draw, D: int, F: int) -> dict:
    """A Transformer encoder block (d2l §11.7)."""
    return {"attention": attention_params(draw, D), "addnorm_1": norm_params(draw, D),
            "ffn": ffn_params(draw, D, F), "addnorm_2": norm_params(draw, D)}


def decoder_block_params(draw: Draw, D: int, F: int) -> dict:
    """A Transformer decoder block (d2l §11.7)."""
    return {"self_attention": attention_params(draw, D), "addnorm_1": norm_params(draw, D),
            "cross_attention": attention_params(draw, D), "addnorm_2": norm_params(draw, D),
            "ffn": ffn_params(draw, D, F), "addnorm_3": norm_params(draw, D)}


def transformer_params(draw: Draw, V_src: int, V_tgt: int, D: int, F: int, L: int) -> dict:
    """The Transformer seq2seq's ``{"encoder", "decoder"}`` with ``L`` blocks each."""
    return {
        "encoder": {"embedding": draw.normal(V_src, D),
                    "blocks": {f"block_{i}": encoder_block_params(draw, D, F) for i in range(L)}},
        "decoder": {"embedding": draw.normal(V_tgt, D),
                    "blocks": {f"block_{i}": decoder_block_params(draw, D, F) for i in range(L)},
                    "dense": {"W": draw.dense(D, V_tgt), "b": draw.normal(V_tgt, scale=0.3)}},
    }


def qkv(draw: Draw, query_size=4, key_size=4, value_size=4, B=2, T=3, S=5) -> dict:
    """Queries ``(B, T, q)``, keys ``(B, S, k)`` and values ``(B, S, v)``."""
    return {"queries": draw.normal(B, T, query_size), "keys": draw.normal(B, S, key_size),
            "values": draw.normal(B, S, value_size)}


def heads(draw: Draw, N=4, N_kv=2, B=2, T=3, S=5, d=4, v=4) -> dict:
    """Queries ``(B, N, T, d)`` with grouped keys and values ``(B, N_kv, S, d | v)``."""
    return {"queries": draw.normal(B, N, T, d), "keys": draw.normal(B, N_kv, S, d),
            "values": draw.normal(B, N_kv, S, v)}


def mha_params(draw: Draw, query_size=8, key_size=6, value_size=6, D=8, biases=True) -> dict:
    """The book's multi-head layout: ``W_q (q, D), W_k (k, D), W_v (v, D), W_o (D, D)`` and,
    with ``biases``, ``b_q, b_k, b_v, b_o``."""
    params = {"W_q": draw.dense(query_size, D), "W_k": draw.dense(key_size, D),
              "W_v": draw.dense(value_size, D), "W_o": draw.dense(D, D)}
    if biases:
        params.update({name: draw.normal(D, scale=0.3) for name in ("b_q", "b_k", "b_v", "b_o")})
    return params


def gqa_params(draw: Draw, N: int, N_kv: int, H: int, H_v: int, query_size=8, key_size=6,
               value_size=6, E=8, biases=True) -> dict:
    """Grouped-query heads: ``W_q (q, N H), W_k (k, N_kv H), W_v (v, N_kv H_v), W_o (N H_v, E)``
    and, with ``biases``, ``b_q, b_k, b_v, b_o``."""
    params = {"W_q": draw.dense(query_size, N * H), "W_k": draw.dense(key_size, N_kv * H),
              "W_v": draw.dense(value_size, N_kv * H_v), "W_o": draw.dense(N * H_v, E)}
    if biases:
        params.update({"b_q": draw.normal(N * H, scale=0.3),
                       "b_k": draw.normal(N_kv * H, scale=0.3),
                       "b_v": draw.normal(N_kv * H_v, scale=0.3),
                       "b_o": draw.normal(E, scale=0.3)})
    return params
