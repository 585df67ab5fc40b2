"""The book's PyTorch models (d2l 0.17 edition), rewritten to mirror ours — d2l §10.7, §11.2–§11.7.

These are the PyTorch classes of *Dive into Deep Learning* — ``AdditiveAttention``,
``DotProductAttention``, ``MultiHeadAttention`` (with ``transpose_qkv`` / ``transpose_output``),
``PositionalEncoding``, ``Seq2SeqEncoder``, ``Seq2SeqAttentionDecoder``, ``PositionWiseFFN``,
``AddNorm``, the Transformer blocks, encoder and decoder, and ``EncoderDecoder`` — written again
so that they compute exactly what :mod:`jax_attention` computes, for the cross-framework tests
and for moving trained weights between the two (:func:`jax_attention.interop.to_torch`,
:func:`~jax_attention.interop.from_torch`). Their ``state_dict`` keys are the book's.

Where they differ from the book's code, on purpose:

* **Masking** follows our semantics (:mod:`jax_attention.nn.masking`): masked scores are replaced with
  ``torch.where`` by the dtype's most negative finite value and their weights set to exactly
  zero, so a fully masked row (``valid_len == 0``) has all-zero weights, a zero output and finite
  gradients — as ``torch.nn.functional.scaled_dot_product_attention``. The book fills masked
  scores with ``-1e6``, which gives such a row uniform weights over all keys (padding included)
  and NaN in float16; :func:`book_masked_softmax` keeps the book's version to pin the
  difference. Rows with at least one valid key agree with the book to rounding. Unlike our JAX
  functions, these modules do not scrub NaN/Inf stored in masked keys or values (``0 * NaN`` is
  NaN), as the book's do not.
* **Explicit sizes** (``nn.Linear(in, out)``) instead of ``nn.LazyLinear``, so that a model has
  its parameters, and a ``state_dict`` to load, before its first call.
* **Batch-first** everywhere, as our JAX code: the book's ``Seq2SeqEncoder`` returns time-major
  outputs ``(S, B, h)``; here ``(B, S, h)`` (``nn.GRU(batch_first=True)``). The book's
  ``MultiHeadAttention`` returns weights ``(B * N, T, S)``; here ``(B, N, T, S)``.
* **Returned attention weights** instead of the book's ``attention_weights`` attributes:
  the attention modules return ``(output, weights)`` (the weights before dropout).
* **Causality** is an argument (``is_causal``), not the book's training-mode
  ``dec_valid_lens = 1..T``, which is the same mask. The Transformer decoder here is the
  teacher-forced one; it has no key/value state for step-by-step prediction:
  :meth:`TransformerSeq2Seq.predict` (the book's ``predict_seq2seq``, :func:`predict_seq2seq`)
  re-runs it on the prefix for every token (:func:`jax_attention.models.transformer.greedy_decode`
  has the cache).
* **Positions**: the sinusoidal table is computed in float64 and rounded once to the input's
  dtype (ours does the same); the book computes it in float32. An odd width is allowed.

Every module works in float32 and float64 (``model.double()``). Shape letters: ``B`` batch,
``T`` queries / target length, ``S`` keys / source length, ``N`` heads, ``H = D / N``, ``D``
model width (``num_hiddens``), ``F`` the FFN's hidden width, ``E`` embedding size, ``h`` the GRU's
hidden size, ``L`` layers, ``V`` vocabulary.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from jax_attention._checks import check_num_heads, check_num_kv_heads

__all__ = [
    "sequence_mask",
    "valid_lens_mask",
    "causal_mask",
    "attention_mask",
    "masked_softmax",
    "book_masked_softmax",
    "nadaraya_watson",
    "DotProductAttention",
    "AdditiveAttention",
    "transpose_qkv",
    "transpose_output",
    "MultiHeadAttention",
    "positional_encoding",
    "PositionalEncoding",
    "rotary_embedding",
    "relative_position_buckets",
    "Seq2SeqEncoder",
    "Seq2SeqAttentionDecoder",
    "BahdanauSeq2Seq",
    "PositionWiseFFN",
    "AddNorm",
    "TransformerEncoderBlock",
    "TransformerEncoder",
    "TransformerDecoderBlock",
    "TransformerDecoder",
    "TransformerSeq2Seq",
    "teacher_forcing_inputs",
    "masked_cross_entropy",
    "xavier_init_weights",
    "grad_clipping",
    "train_step",
    "predict_seq2seq",
]

_HALF = (torch.float16, torch.bfloat16)


# --------------------------------------------------------------------------- masking (§11.3.2)


def sequence_mask(X, valid_len, value=0.0):
    """``X`` with the entries of each row past its valid length replaced by ``value`` — d2l §10.7.

    The book's version writes into ``X`` in place; this one returns a new tensor.

    Args:
      X: ``(..., S)``, e.g. ``(B, S)``.
      valid_len: integers broadcastable to ``X.shape[:-1]``, e.g. ``(B,)``.
      value: the fill value (in ``X``'s dtype: ``-1e6`` is ``-inf`` in float16).

    Returns:
      A tensor of ``X``'s shape and dtype.
    """
    valid_len = torch.as_tensor(valid_len, device=X.device)
    keep = torch.arange(X.shape[-1], device=X.device) < valid_len.unsqueeze(-1)
    return torch.where(keep, X, torch.as_tensor(value, dtype=X.dtype, device=X.device))


def _check_valid_lens(valid_lens, batch: int, num_queries: int, num_keys: int):
    valid_lens = torch.as_tensor(valid_lens)
    if valid_lens.dtype.is_floating_point or valid_lens.dtype.is_complex or valid_lens.dtype == torch.bool:
        raise ValueError(f"valid_lens must hold integers, got dtype {valid_lens.dtype} with shape "
                         f"{tuple(valid_lens.shape)}")
    if tuple(valid_lens.shape) not in ((batch,), (batch, num_queries)):
        raise ValueError(f"valid_lens must have shape (B,) = ({batch},) or (B, T) = ({batch}, "
                         f"{num_queries}), got {tuple(valid_lens.shape)}")
    if valid_lens.numel() and (valid_lens.min() < 0 or valid_lens.max() > num_keys):
        raise ValueError(f"valid_lens must lie in [0, S] = [0, {num_keys}], got values from "
                         f"{int(valid_lens.min())} to {int(valid_lens.max())}")
    return valid_lens


def valid_lens_mask(valid_lens, num_queries: int, num_keys: int):
    """Boolean ``(B, T, S)``: True where key ``s < valid_lens`` (attend); ``None`` for ``None``.

    Args:
      valid_lens: ``None``, ``(B,)`` (shared by all queries) or ``(B, T)`` integers.
      num_queries: ``T``. num_keys: ``S``.
    """
    if valid_lens is None:
        return None
    lens = torch.as_tensor(valid_lens)
    if lens.dim() == 1:
        lens = lens.unsqueeze(1).expand(lens.shape[0], num_queries)
    return torch.arange(num_keys, device=lens.device) < lens.unsqueeze(-1)


def causal_mask(num_queries: int, num_keys: int | None = None, device=None):
    """Lower-triangular ``(T, S)`` boolean mask: query ``t`` may attend key ``s`` iff ``s <= t``.

    The top-left alignment of ``scaled_dot_product_attention(is_causal=True)``.
    """
    num_keys = num_queries if num_keys is None else num_keys
    return torch.ones(num_queries, num_keys, dtype=torch.bool, device=device).tril()


def attention_mask(shape, valid_lens=None, *, mask=None, is_causal=False, device=None):
    """The boolean mask (True = attend) for scores of ``shape`` ``(B, ..., T, S)``, or ``None``.

    Combines ``valid_lens`` (``(B,)`` or ``(B, T)``, applied to every extra axis such as heads),
    a boolean ``mask`` broadcastable to ``shape`` and, with ``is_causal``, :func:`causal_mask`.

    Returns:
      ``None`` (attend everywhere) or a boolean tensor broadcastable to ``shape``.
    """
    shape = tuple(shape)
    T, S = shape[-2], shape[-1]
    keep = None
    if valid_lens is not None:
        if len(shape) < 3:
            raise ValueError(f"valid_lens needs scores with a batch axis (B, ..., T, S), got {shape}")
        lens = _check_valid_lens(valid_lens, shape[0], T, S).to(device)
        lens_mask = valid_lens_mask(lens, T, S)
        keep = lens_mask.reshape(lens_mask.shape[:1] + (1,) * (len(shape) - 3) + lens_mask.shape[1:])
    if mask is not None:
        mask = torch.as_tensor(mask, device=device)
        if mask.dtype != torch.bool:
            raise TypeError(f"mask must be boolean (True = attend), got dtype {mask.dtype} with "
                            f"shape {tuple(mask.shape)}")
        try:
            broadcast = tuple(torch.broadcast_shapes(mask.shape, shape))
        except RuntimeError:
            broadcast = None
        if broadcast != shape:
            raise ValueError(f"mask must broadcast to the scores' shape (B, ..., T, S) = {shape}, "
                             f"got shape {tuple(mask.shape)}")
        keep = mask if keep is None else keep & mask
    if is_causal:
        causal = causal_mask(T, S, device=device)
        keep = causal if keep is None else keep & causal
    return keep


def masked_softmax(X, valid_lens=None, *, mask=None):
    """Softmax over the last axis giving masked entries exactly zero weight — d2l §11.3.2, our semantics.

    Masked scores become the dtype's most negative finite value (``torch.where``, no ``-1e6``),
    and their weights are set to zero after the softmax: a row with no key to attend has all-zero
    weights and zero gradients, never uniform weights or NaN. Half-precision scores are
    normalised in float32 and the weights cast back, as ours.

    Args:
      X: scores ``(B, ..., T, S)``.
      valid_lens: ``None``, ``(B,)`` or ``(B, T)``, applied to every extra axis.
      mask: boolean, broadcastable to ``X.shape``; True = attend.

    Returns:
      Weights of ``X``'s shape and dtype; rows sum to 1, or to 0 when fully masked.
    """
    keep = attention_mask(X.shape, valid_lens, mask=mask, device=X.device)
    logits = X.float() if X.dtype in _HALF else X
    if keep is None:
        return F.softmax(logits, dim=-1).to(X.dtype)
    logits = torch.where(keep, logits, torch.finfo(logits.dtype).min)
    weights = torch.where(keep, F.softmax(logits, dim=-1), 0.0)
    return weights.to(X.dtype)


def book_masked_softmax(X, valid_lens):
    """The book's ``masked_softmax`` (d2l §11.3.2), kept to pin the documented difference.

    Masked scores are replaced by ``-1e6`` before the softmax. A fully masked row
    (``valid_len == 0``) therefore gets uniform weights ``1 / S`` over all keys, padding
    included; in float16 ``-1e6`` is ``-inf`` and such a row is NaN. Other rows agree with
    :func:`masked_softmax` to rounding.

    Args:
      X: scores ``(B, T, S)``.
      valid_lens: ``None``, ``(B,)`` or ``(B, T)``.

    Returns:
      Weights ``(B, T, S)``.
    """
    if valid_lens is None:
        return F.softmax(X, dim=-1)
    shape = X.shape
    valid_lens = torch.as_tensor(valid_lens, device=X.device)
    if valid_lens.dim() == 1:
        valid_lens = torch.repeat_interleave(valid_lens, shape[1])
    else:
        valid_lens = valid_lens.reshape(-1)
    X = sequence_mask(X.reshape(-1, shape[-1]), valid_lens, value=-1e6)
    return F.softmax(X.reshape(shape), dim=-1)


# --------------------------------------------------------------------------- attention pooling (§11.2)


def nadaraya_watson(queries, keys, values, w=1.0):
    """Nadaraya–Watson regression ``f(q) = sum_k softmax_k(-((q - k) w)^2 / 2) y_k`` — d2l §11.2.

    Same semantics as :func:`jax_attention.nn.attention_pooling.nadaraya_watson`.

    Args:
      queries: ``(..., Q)``.
      keys: ``(..., K)`` shared by all queries, or ``(..., Q, K)`` per query (leave-one-out).
      values: the keys' shape, optionally with a trailing value axis ``v``.
      w: inverse kernel width, a number or a tensor broadcastable to ``(..., Q, K)``.

    Returns:
      ``(prediction (..., Q[, v]), weights (..., Q, K))``.
    """
    queries, keys, values = (torch.as_tensor(a) for a in (queries, keys, values))
    if keys.dim() == queries.dim() and keys.shape[:-1] == queries.shape[:-1]:
        batch_axes = queries.dim() - 1
        keys = keys.unsqueeze(batch_axes).expand(*queries.shape, keys.shape[-1])
        values = values.unsqueeze(batch_axes).expand(*queries.shape, *values.shape[batch_axes:])
    elif not (keys.dim() == queries.dim() + 1 and keys.shape[:-1] == queries.shape):
        raise ValueError(f"keys must have shape (..., K) or (..., Q, K) for queries (..., Q) = "
                         f"{tuple(queries.shape)}, got {tuple(keys.shape)}")
    if values.shape[:keys.dim()] != keys.shape or values.dim() > keys.dim() + 1:
        raise ValueError(f"values must have the keys' shape {tuple(keys.shape)} or that shape plus "
                         f"a value axis, got {tuple(values.shape)}")
    w = torch.as_tensor(w, dtype=queries.dtype, device=queries.device)
    weights = F.softmax(-(((queries.unsqueeze(-1) - keys) * w) ** 2) / 2, dim=-1)
    if values.dim() == keys.dim():
        return (weights * values).sum(-1), weights
    return torch.einsum("...qk,...qkv->...qv", weights, values), weights


# --------------------------------------------------------------------------- scoring (§11.3)


class _Attention(nn.Module):
    """Masked softmax of the scores, dropout on the weights, the weighted sum of the values."""

    def __init__(self, dropout: float):
        super().__init__()
        self.dropout = nn.Dropout(dropout)

    def _pool(self, scores, values, valid_lens, mask, is_causal):
        weights = masked_softmax(scores, valid_lens,
                                 mask=_with_causal(mask, is_causal, scores.shape, scores.device))
        return self.dropout(weights) @ values, weights


class DotProductAttention(_Attention):
    """Scaled dot-product attention with dropout on the weights — d2l §11.3.3.

    ``softmax(Q K^T / sqrt(d)) V``, masked as :func:`masked_softmax`.

    Args:
      dropout: rate on the attention weights (training mode only).
    """

    def __init__(self, dropout: float = 0.0):
        super().__init__(dropout)

    def forward(self, queries, keys, values, valid_lens=None, *, mask=None, is_causal=False):
        """Attend.

        Args:
          queries: ``(B, ..., T, d)``. keys: ``(B, ..., S, d)``. values: ``(B, ..., S, v)``.
          valid_lens: ``None``, ``(B,)`` or ``(B, T)``.
          mask: boolean, broadcastable to ``(B, ..., T, S)``; True = attend.
          is_causal: also apply :func:`causal_mask`.

        Returns:
          ``(output (B, ..., T, v), weights (B, ..., T, S))``; the weights before dropout.
        """
        scores = queries @ keys.transpose(-1, -2) / math.sqrt(queries.shape[-1])
        return self._pool(scores, values, valid_lens, mask, is_causal)


def _with_causal(mask, is_causal: bool, shape, device):
    if not is_causal:
        return mask
    causal = causal_mask(shape[-2], shape[-1], device=device)
    return causal if mask is None else torch.as_tensor(mask, device=device) & causal


class AdditiveAttention(_Attention):
    """Additive attention ``softmax(w_v^T tanh(W_q q + W_k k)) V`` with dropout — d2l §11.3.2.

    Parameters (the book's names): ``W_q`` ``nn.Linear(query_size, num_hiddens, bias=False)``,
    ``W_k`` ``nn.Linear(key_size, num_hiddens, bias=False)``, ``w_v``
    ``nn.Linear(num_hiddens, 1, bias=False)``. The book's 0.17 signature lists ``key_size``
    first; this one follows ours (``query_size, key_size``).

    Args:
      query_size: ``q``. key_size: ``k``. num_hiddens: ``h``.
      dropout: rate on the attention weights.
    """

    def __init__(self, query_size: int, key_size: int, num_hiddens: int, dropout: float = 0.0):
        super().__init__(dropout)
        self.W_k = nn.Linear(key_size, num_hiddens, bias=False)
        self.W_q = nn.Linear(query_size, num_hiddens, bias=False)
        self.w_v = nn.Linear(num_hiddens, 1, bias=False)

    def forward(self, queries, keys, values, valid_lens=None, *, mask=None, is_causal=False):
        """Attend.

        Args:
          queries: ``(B, ..., T, q)``. keys: ``(B, ..., S, k)``. values: ``(B, ..., S, v)``.
          valid_lens: ``None``, ``(B,)`` or ``(B, T)``.
          mask: boolean, broadcastable to ``(B, ..., T, S)``; True = attend.
          is_causal: also apply :func:`causal_mask`.

        Returns:
          ``(output (B, ..., T, v), weights (B, ..., T, S))``; the weights before dropout.
        """
        # Every query meets every key: (..., T, 1, h) + (..., 1, S, h) -> (..., T, S, h).
        features = torch.tanh(self.W_q(queries).unsqueeze(-2) + self.W_k(keys).unsqueeze(-3))
        return self._pool(self.w_v(features).squeeze(-1), values, valid_lens, mask, is_causal)


# --------------------------------------------------------------------------- multi-head (§11.5)


def transpose_qkv(X, num_heads: int):
    """The book's head split ``(B, T, D) -> (B * N, T, D / N)``; head ``n`` takes columns
    ``n*H .. (n+1)*H - 1``."""
    X = X.reshape(X.shape[0], X.shape[1], num_heads, -1).permute(0, 2, 1, 3)
    return X.reshape(-1, X.shape[2], X.shape[3])


def transpose_output(X, num_heads: int):
    """The book's head merge ``(B * N, T, H) -> (B, T, N * H)``, the inverse of :func:`transpose_qkv`."""
    X = X.reshape(-1, num_heads, X.shape[1], X.shape[2]).permute(0, 2, 1, 3)
    return X.reshape(X.shape[0], X.shape[1], -1)


class MultiHeadAttention(nn.Module):
    """Multi-head attention with dropout on the weights — d2l §11.5.

    ``W_q`` ``nn.Linear(in, D, bias)``, ``W_k``, ``W_v`` ``nn.Linear(in, N_kv H, bias)`` and
    ``W_o`` ``nn.Linear(D, D, bias)`` (the book's ``bias=False`` by default, ``N_kv = N``); the
    heads are split by :func:`transpose_qkv` and the lengths repeated per head, as in the book.
    Grouped-query attention (``N_kv < N``): each key/value head is repeated for its ``N / N_kv``
    query heads (``repeat_interleave``, as ``F.scaled_dot_product_attention(enable_gqa=True)``
    does), so query head ``n`` uses key/value head ``n // (N / N_kv)``, as ours.

    Args:
      num_hiddens: ``D``. num_heads: ``N``, dividing ``D``.
      dropout: rate on the attention weights.
      bias: whether the four projections have biases.
      query_size, key_size, value_size: input sizes (default ``D``).
      num_kv_heads: ``N_kv``, dividing ``N`` (default ``N``).
    """

    def __init__(self, num_hiddens: int, num_heads: int, dropout: float = 0.0, bias: bool = False, *,
                 query_size: int | None = None, key_size: int | None = None,
                 value_size: int | None = None, num_kv_heads: int | None = None):
        super().__init__()
        check_num_heads(num_hiddens, num_heads)
        num_kv_heads = check_num_kv_heads(num_heads, num_kv_heads)
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        kv_width = num_kv_heads * (num_hiddens // num_heads)
        self.attention = DotProductAttention(dropout)
        self.W_q = nn.Linear(query_size or num_hiddens, num_hiddens, bias=bias)
        self.W_k = nn.Linear(key_size or num_hiddens, kv_width, bias=bias)
        self.W_v = nn.Linear(value_size or num_hiddens, kv_width, bias=bias)
        self.W_o = nn.Linear(num_hiddens, num_hiddens, bias=bias)

    def _kv_heads(self, X):
        """``(B, S, N_kv H) -> (B * N, S, H)``: the key/value heads, each repeated for its group."""
        heads = transpose_qkv(X, self.num_kv_heads)
        groups = self.num_heads // self.num_kv_heads
        if groups == 1:
            return heads
        heads = heads.reshape(-1, self.num_kv_heads, heads.shape[1], heads.shape[2])
        return heads.repeat_interleave(groups, dim=1).reshape(-1, heads.shape[2], heads.shape[3])

    def forward(self, queries, keys, values, valid_lens=None, *, mask=None, is_causal=False):
        """Attend with every head.

        Args:
          queries: ``(B, T, q)``. keys: ``(B, S, k)``. values: ``(B, S, v)``.
          valid_lens: ``None``, ``(B,)`` or ``(B, T)``, shared by all heads.
          mask: boolean ``(T, S)`` or ``(B | 1, N | 1, T, S)``; True = attend.
          is_causal: also apply :func:`causal_mask`.

        Returns:
          ``(output (B, T, D), weights (B, N, T, S))`` — the book returns ``(B * N, T, S)``
          weights in an attribute; the weights are those before dropout. A fully masked query
          row gives zero weights, so its output is ``W_o``'s bias (zero without biases).
        """
        N = self.num_heads
        B, T, S = queries.shape[0], queries.shape[1], keys.shape[1]
        if valid_lens is not None:
            valid_lens = _check_valid_lens(valid_lens, B, T, S).to(queries.device)
            valid_lens = torch.repeat_interleave(valid_lens, N, dim=0)
        if mask is not None:
            mask = torch.as_tensor(mask, device=queries.device)
            if mask.dim() not in (2, 4):
                raise ValueError(f"mask must have shape (T, S) or (B, N, T, S) (1 for broadcast "
                                 f"axes), got {tuple(mask.shape)}")
            if mask.dim() == 4:
                mask = mask.expand(B, N, T, S).reshape(B * N, T, S)
        output, weights = self.attention(transpose_qkv(self.W_q(queries), N),
                                         self._kv_heads(self.W_k(keys)),
                                         self._kv_heads(self.W_v(values)), valid_lens,
                                         mask=mask, is_causal=is_causal)
        return self.W_o(transpose_output(output, N)), weights.reshape(B, N, T, S)


# --------------------------------------------------------------------------- positions (§11.6.3)


def _inverse_frequencies(width: int, base: float) -> np.ndarray:
    return 1.0 / base ** (np.arange(0, width, 2, dtype=np.float64) / width)


def positional_encoding(num_steps: int, num_hiddens: int, base: float = 10000.0):
    """The sinusoidal table ``P (T, D)`` in float64 — d2l §11.6.3.

    ``P[i, 2j] = sin(i / base^(2j/D))``, ``P[i, 2j + 1] = cos(i / base^(2j/D))``.

    Computed in float64 (the book: float32), so that it rounds once to any dtype, as ours; an odd
    ``D`` ends with a sine column.

    Returns:
      A float64 tensor ``(num_steps, num_hiddens)``.
    """
    angles = np.arange(num_steps, dtype=np.float64)[:, None] * _inverse_frequencies(num_hiddens, base)
    P = np.empty((num_steps, num_hiddens), dtype=np.float64)
    P[:, 0::2] = np.sin(angles)
    P[:, 1::2] = np.cos(angles[:, : num_hiddens // 2])
    return torch.from_numpy(P)


class PositionalEncoding(nn.Module):
    """``dropout(X + P[:T])`` with the sinusoidal table — d2l §11.6.3.

    ``P`` ``(1, max_len, D)`` is float64 and not a parameter or buffer (as in the book, it is
    not in the ``state_dict``); each call rounds ``P[:, :T]`` to ``X``'s dtype.

    Args:
      num_hiddens: ``D``. dropout: the rate after the sum. max_len: rows of ``P``.
    """

    def __init__(self, num_hiddens: int, dropout: float = 0.0, max_len: int = 1000):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.P = positional_encoding(max_len, num_hiddens).unsqueeze(0)

    def forward(self, X):
        """``(B, T, D) -> (B, T, D)``; ``T <= max_len``."""
        if X.shape[1] > self.P.shape[1]:
            raise ValueError(f"sequence of length {X.shape[1]} is longer than the positional "
                             f"table's max_len = {self.P.shape[1]}")
        return self.dropout(X + self.P[:, : X.shape[1]].to(X.dtype).to(X.device))


def rotary_embedding(X, positions=None, base: float = 10000.0):
    """RoPE with interleaved pairs, as :func:`jax_attention.nn.positional.rotary_embedding`.

    ``out[2j] = x[2j] cos(theta_j) - x[2j+1] sin(theta_j)``, ``out[2j+1] = x[2j] sin(theta_j) +
    x[2j+1] cos(theta_j)``, ``theta_j = p / base^(2j/H)``; half precision is rotated in float32.

    Args:
      X: ``(..., T, H)``, ``H`` even. positions: ``None`` (``0 .. T-1``) or integers
        broadcastable to ``(..., T)``. base: the wavelength scale.

    Returns:
      ``(..., T, H)`` in ``X``'s dtype.
    """
    H = X.shape[-1]
    if H % 2:
        raise ValueError(f"X must have an even last axis H, got shape {tuple(X.shape)}")
    compute = torch.float32 if X.dtype in _HALF else X.dtype
    if positions is None:
        positions = torch.arange(X.shape[-2], device=X.device)
    positions = torch.as_tensor(positions, device=X.device).expand(X.shape[:-1])
    frequencies = torch.from_numpy(_inverse_frequencies(H, base)).to(compute).to(X.device)
    angles = positions.to(compute).unsqueeze(-1) * frequencies
    cos, sin = torch.cos(angles), torch.sin(angles)
    pairs = X.to(compute).reshape(*X.shape[:-1], H // 2, 2)
    even, odd = pairs[..., 0], pairs[..., 1]
    rotated = torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1)
    return rotated.reshape(X.shape).to(X.dtype)


def relative_position_buckets(relative_positions, num_buckets: int = 32, max_distance: int = 128,
                              bidirectional: bool = True):
    """T5's bucket of each relative position ``j - i``, as ours (``positional.relative_position_buckets``).

    Distances below ``max_exact = buckets_per_direction // 2`` get a bucket each, larger ones
    log-spaced buckets up to ``max_distance`` (the log in float32, as T5); with
    ``bidirectional`` the second half of the buckets is for keys after the query.

    Args:
      relative_positions: integer tensor of any shape. num_buckets, max_distance, bidirectional:
        as T5.

    Returns:
      int32 buckets in ``[0, num_buckets)``, of the input's shape.
    """
    if bidirectional and (num_buckets < 4 or num_buckets % 2):
        raise ValueError(f"num_buckets must be even and >= 4 when bidirectional, got {num_buckets}")
    relative_positions = torch.as_tensor(relative_positions).long()
    per_direction = num_buckets // 2 if bidirectional else num_buckets
    max_exact = per_direction // 2
    if max_distance <= max_exact:
        raise ValueError(f"max_distance must be > {max_exact}, got {max_distance}")
    if bidirectional:
        direction = (relative_positions > 0).long() * per_direction
        distance = relative_positions.abs()
    else:
        direction = torch.zeros_like(relative_positions)
        distance = (-relative_positions).clamp(min=0)
    f32 = torch.float32
    large = distance.clamp(min=max_exact).to(f32)
    log_ratio = torch.log(large / torch.tensor(max_exact, dtype=f32)) / torch.tensor(
        math.log(max_distance / max_exact), dtype=f32)
    if_large = max_exact + (log_ratio * torch.tensor(per_direction - max_exact, dtype=f32)).long()
    buckets = torch.where(distance < max_exact, distance, if_large.clamp(max=per_direction - 1))
    return (direction + buckets).to(torch.int32)


# --------------------------------------------------------------------------- seq2seq (§10.7, §11.4)


def _one_row(src_tokens):
    """Source ids ``(S,)`` (NumPy, a list or a tensor) as a ``(1, S)`` int64 tensor."""
    return torch.as_tensor(np.asarray(src_tokens), dtype=torch.long).reshape(1, -1)


def predict_seq2seq(model: nn.Module, src_tokens, src_valid_len: int, *, bos_id: int,
                    eos_id: int, max_len: int) -> list[int]:
    """The book's ``predict_seq2seq`` (d2l §10.7.6) with a mirror model: greedy, one sentence.

    ``model.predict`` in eval mode under ``torch.no_grad()``; the model's training mode is
    restored afterwards.

    Args:
      model: a :class:`BahdanauSeq2Seq` or :class:`TransformerSeq2Seq`.
      src_tokens: ``(S,)`` source ids, encoded as in training
        (:func:`jax_attention.data.nmt.encode_source`). src_valid_len: its valid length.
      bos_id, eos_id: the target's ``<bos>`` and ``<eos>``. max_len: at most this many steps.

    Returns:
      The predicted target ids, ``<eos>`` excluded.
    """
    training = model.training
    model.eval()
    try:
        with torch.no_grad():
            return model.predict(src_tokens, src_valid_len, bos_id=bos_id, eos_id=eos_id,
                                 max_len=max_len)
    finally:
        model.train(training)



def teacher_forcing_inputs(tgt, bos_id: int):
    """The decoder inputs of teacher forcing: ``<bos>`` then ``tgt[:, :-1]`` — ``(B, T) -> (B, T)``."""
    bos = torch.full((tgt.shape[0], 1), bos_id, dtype=tgt.dtype, device=tgt.device)
    return torch.cat([bos, tgt[:, :-1]], dim=1)


def masked_cross_entropy(logits, labels, valid_len):
    """The book's ``MaskedSoftmaxCELoss`` (d2l §10.7.3): per-sequence loss ``(B,)``.

    ``loss[b] = sum_{t < valid_len[b]} CE(logits[b, t], labels[b, t]) / T`` (padded steps count as
    zero in the mean over all ``T`` steps).

    Args:
      logits: ``(B, T, V)``. labels: ``(B, T)`` ids. valid_len: ``(B,)``.
    """
    weights = sequence_mask(torch.ones_like(labels, dtype=logits.dtype), valid_len)
    unweighted = F.cross_entropy(logits.permute(0, 2, 1), labels.long(), reduction="none")
    return (unweighted * weights).mean(dim=1)


class Seq2SeqEncoder(nn.Module):
    """Embedding and multi-layer GRU — d2l §10.7.2 (batch-first; the book returns time-major outputs).

    Args:
      vocab_size: ``V``. embed_size: ``E``. num_hiddens: ``h``. num_layers: ``L``.
      dropout: ``nn.GRU``'s rate between layers.
    """

    def __init__(self, vocab_size: int, embed_size: int, num_hiddens: int, num_layers: int,
                 dropout: float = 0.0):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embed_size)
        self.rnn = nn.GRU(embed_size, num_hiddens, num_layers, dropout=dropout, batch_first=True)

    def forward(self, src):
        """``src (B, S)`` ids ``-> (outputs (B, S, h), state (L, B, h))``."""
        return self.rnn(self.embedding(src))


class Seq2SeqAttentionDecoder(nn.Module):
    """The GRU decoder with additive (Bahdanau) attention — d2l §11.4.2.

    At each step the query is the top layer's state, ``AdditiveAttention(h, h, h, dropout)`` over
    the encoder outputs (masked past the source valid lengths) gives a context, and
    ``concat(context, embedding(y_t))`` (the book's order) is the GRU's input; a dense layer maps
    the top layer's outputs to the vocabulary.

    Args:
      vocab_size: ``V``. embed_size: ``E``. num_hiddens: ``h``. num_layers: ``L``.
      dropout: rate on the attention weights and between GRU layers.
    """

    def __init__(self, vocab_size: int, embed_size: int, num_hiddens: int, num_layers: int,
                 dropout: float = 0.0):
        super().__init__()
        self.attention = AdditiveAttention(num_hiddens, num_hiddens, num_hiddens, dropout)
        self.embedding = nn.Embedding(vocab_size, embed_size)
        self.rnn = nn.GRU(embed_size + num_hiddens, num_hiddens, num_layers, dropout=dropout,
                          batch_first=True)
        self.dense = nn.Linear(num_hiddens, vocab_size)

    def init_state(self, enc_outputs, enc_valid_lens):
        """``(outputs (B, S, h), state (L, B, h))`` of the encoder, ``(B,)`` -> the decoder state."""
        outputs, hidden_state = enc_outputs
        return outputs, hidden_state, enc_valid_lens

    def forward(self, X, state):
        """Decode a teacher-forced input, one step at a time.

        Args:
          X: ``(B, T)`` input ids.
          state: ``(enc_outputs (B, S, h), hidden (L, B, h), enc_valid_lens (B,))``.

        Returns:
          ``(logits (B, T, V), state, weights (B, T, S))``; the weights before dropout.
        """
        enc_outputs, hidden_state, enc_valid_lens = state
        embedded = self.embedding(X)  # (B, T, E)
        outputs, all_weights = [], []
        for t in range(X.shape[1]):
            query = hidden_state[-1].unsqueeze(1)  # (B, 1, h)
            context, weights = self.attention(query, enc_outputs, enc_outputs, enc_valid_lens)
            step_input = torch.cat([context, embedded[:, t:t + 1]], dim=-1)  # (B, 1, h + E)
            out, hidden_state = self.rnn(step_input, hidden_state)
            outputs.append(out)
            all_weights.append(weights)
        logits = self.dense(torch.cat(outputs, dim=1))
        return logits, (enc_outputs, hidden_state, enc_valid_lens), torch.cat(all_weights, dim=1)


class BahdanauSeq2Seq(nn.Module):
    """The book's ``EncoderDecoder(Seq2SeqEncoder, Seq2SeqAttentionDecoder)`` — d2l §11.4.

    ``state_dict`` keys: ``encoder.embedding.weight``, ``encoder.rnn.weight_ih_l0``, ...,
    ``decoder.attention.W_q.weight``, ``decoder.attention.W_k.weight``,
    ``decoder.attention.w_v.weight``, ``decoder.embedding.weight``, ``decoder.rnn.*``,
    ``decoder.dense.weight``, ``decoder.dense.bias`` (see ``to_torch(params, "bahdanau")``).

    Args:
      src_vocab_size, tgt_vocab_size: ``V_src``, ``V_tgt``.
      embed_size, num_hiddens, num_layers: ``E``, ``h``, ``L`` (the book: 32, 32, 2).
      dropout: the book's 0.1 for training.
    """

    def __init__(self, src_vocab_size: int, tgt_vocab_size: int, embed_size: int = 32,
                 num_hiddens: int = 32, num_layers: int = 2, dropout: float = 0.0):
        super().__init__()
        self.encoder = Seq2SeqEncoder(src_vocab_size, embed_size, num_hiddens, num_layers, dropout)
        self.decoder = Seq2SeqAttentionDecoder(tgt_vocab_size, embed_size, num_hiddens, num_layers,
                                               dropout)

    def forward(self, src, src_valid_len, dec_input):
        """Teacher-forced logits ``(B, T, V)``.

        Args:
          src: ``(B, S)`` ids. src_valid_len: ``(B,)``. dec_input: ``(B, T)`` ids (``<bos>`` first).
        """
        state = self.decoder.init_state(self.encoder(src), src_valid_len)
        return self.decoder(dec_input, state)[0]

    def loss(self, src, src_valid_len, tgt, tgt_valid_len, bos_id: int):
        """The per-sequence training loss ``(B,)`` with teacher forcing (``<bos>`` + ``tgt[:, :-1]``)."""
        logits = self(src, src_valid_len, teacher_forcing_inputs(tgt, bos_id))
        return masked_cross_entropy(logits, tgt, tgt_valid_len)

    def predict(self, src_tokens, src_valid_len: int, *, bos_id: int, eos_id: int,
                max_len: int) -> list[int]:
        """Greedy decoding of one source, the book's ``predict_seq2seq`` loop (d2l §10.7.6):
        the decoder one step at a time from its GRU state, the argmax fed back, until ``<eos>``.

        Call in eval mode without gradients (:func:`predict_seq2seq` does both).

        Args:
          src_tokens: ``(S,)`` source ids, encoded as in training. src_valid_len: its length.
          bos_id, eos_id: the target's ``<bos>`` and ``<eos>``. max_len: at most this many steps.

        Returns:
          The predicted ids, ``<eos>`` excluded.
        """
        src = _one_row(src_tokens)
        state = self.decoder.init_state(self.encoder(src), torch.tensor([int(src_valid_len)]))
        X = torch.tensor([[bos_id]])
        output = []
        for _ in range(max_len):
            Y, state, _ = self.decoder(X, state)
            X = Y.argmax(dim=2)
            token = int(X[0, 0])
            if token == eos_id:
                break
            output.append(token)
        return output


# --------------------------------------------------------------------------- Transformer (§11.7)


class PositionWiseFFN(nn.Module):
    """``dense2(relu(dense1(X)))`` — d2l §11.7.2; ``(B, T, D) -> (B, T, D)``.

    Args:
      num_hiddens: ``D``. ffn_num_hiddens: ``F``.
    """

    def __init__(self, num_hiddens: int, ffn_num_hiddens: int):
        super().__init__()
        self.dense1 = nn.Linear(num_hiddens, ffn_num_hiddens)
        self.relu = nn.ReLU()
        self.dense2 = nn.Linear(ffn_num_hiddens, num_hiddens)

    def forward(self, X):
        """``X (B, T, D) -> (B, T, D)``."""
        return self.dense2(self.relu(self.dense1(X)))


class AddNorm(nn.Module):
    """``LayerNorm(dropout(Y) + X)`` — d2l §11.7.3; ``ln`` is ``nn.LayerNorm(D)`` (eps ``1e-5``).

    Args:
      num_hiddens: ``D``. dropout: rate on ``Y``.
    """

    def __init__(self, num_hiddens: int, dropout: float = 0.0):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.ln = nn.LayerNorm(num_hiddens)

    def forward(self, X, Y):
        """``X``, ``Y`` ``(B, T, D) -> (B, T, D)``."""
        return self.ln(self.dropout(Y) + X)


class TransformerEncoderBlock(nn.Module):
    """Self-attention, AddNorm, FFN, AddNorm — d2l §11.7.4 (attention without biases, as the book).

    Args:
      num_hiddens: ``D``. ffn_num_hiddens: ``F``. num_heads: ``N``. dropout: the book's rate.
      num_kv_heads: ``N_kv`` (grouped-query attention; default ``N``).
    """

    def __init__(self, num_hiddens: int, ffn_num_hiddens: int, num_heads: int, dropout: float = 0.0,
                 *, num_kv_heads: int | None = None):
        super().__init__()
        self.attention = MultiHeadAttention(num_hiddens, num_heads, dropout,
                                            num_kv_heads=num_kv_heads)
        self.addnorm1 = AddNorm(num_hiddens, dropout)
        self.ffn = PositionWiseFFN(num_hiddens, ffn_num_hiddens)
        self.addnorm2 = AddNorm(num_hiddens, dropout)

    def forward(self, X, valid_lens):
        """``X (B, S, D)``, ``valid_lens (B,)`` -> ``(output (B, S, D), weights (B, N, S, S))``."""
        attended, weights = self.attention(X, X, X, valid_lens)
        Y = self.addnorm1(X, attended)
        return self.addnorm2(Y, self.ffn(Y)), weights


def _embed(embedding: nn.Embedding, pos_encoding: PositionalEncoding, tokens, num_hiddens: int):
    # The book scales the embeddings by sqrt(D) before adding P (their entries are N(0, 1) while
    # P's lie in [-1, 1]).
    return pos_encoding(embedding(tokens) * math.sqrt(num_hiddens))


class TransformerEncoder(nn.Module):
    """``dropout(embedding(src) * sqrt(D) + P)``, then ``num_layers`` encoder blocks — d2l §11.7.4.

    Args:
      vocab_size: ``V``. num_hiddens, ffn_num_hiddens, num_heads, num_layers: ``D``, ``F``,
      ``N``, ``L``. dropout: the book's rate. max_len: rows of the position table.
      num_kv_heads: ``N_kv`` (grouped-query attention; default ``N``).
    """

    def __init__(self, vocab_size: int, num_hiddens: int, ffn_num_hiddens: int, num_heads: int,
                 num_layers: int, dropout: float = 0.0, max_len: int = 1000, *,
                 num_kv_heads: int | None = None):
        super().__init__()
        self.num_hiddens = num_hiddens
        self.embedding = nn.Embedding(vocab_size, num_hiddens)
        self.pos_encoding = PositionalEncoding(num_hiddens, dropout, max_len)
        self.blks = nn.Sequential()
        for i in range(num_layers):
            self.blks.add_module(f"block{i}", TransformerEncoderBlock(
                num_hiddens, ffn_num_hiddens, num_heads, dropout, num_kv_heads=num_kv_heads))

    def forward(self, src, valid_lens):
        """``src (B, S)``, ``valid_lens (B,)`` -> ``(outputs (B, S, D), weights (L, B, N, S, S))``."""
        X = _embed(self.embedding, self.pos_encoding, src, self.num_hiddens)
        all_weights = []
        for block in self.blks:
            X, weights = block(X, valid_lens)
            all_weights.append(weights)
        return X, torch.stack(all_weights)


class TransformerDecoderBlock(nn.Module):
    """Causal self-attention, AddNorm, encoder–decoder attention, AddNorm, FFN, AddNorm — d2l §11.7.5.

    Teacher-forced only (no key/value state for prediction, unlike the book's block).

    Args:
      num_hiddens: ``D``. ffn_num_hiddens: ``F``. num_heads: ``N``. dropout: the book's rate.
      num_kv_heads: ``N_kv`` of both attentions (grouped-query attention; default ``N``).
    """

    def __init__(self, num_hiddens: int, ffn_num_hiddens: int, num_heads: int, dropout: float = 0.0,
                 *, num_kv_heads: int | None = None):
        super().__init__()
        self.attention1 = MultiHeadAttention(num_hiddens, num_heads, dropout,
                                             num_kv_heads=num_kv_heads)
        self.addnorm1 = AddNorm(num_hiddens, dropout)
        self.attention2 = MultiHeadAttention(num_hiddens, num_heads, dropout,
                                             num_kv_heads=num_kv_heads)
        self.addnorm2 = AddNorm(num_hiddens, dropout)
        self.ffn = PositionWiseFFN(num_hiddens, ffn_num_hiddens)
        self.addnorm3 = AddNorm(num_hiddens, dropout)

    def forward(self, X, enc_outputs, enc_valid_lens):
        """``X (B, T, D)``, ``enc_outputs (B, S, D)``, ``enc_valid_lens (B,)`` ->
        ``(output (B, T, D), self_weights (B, N, T, T), cross_weights (B, N, T, S))``."""
        attended, self_weights = self.attention1(X, X, X, is_causal=True)
        Y = self.addnorm1(X, attended)
        crossed, cross_weights = self.attention2(Y, enc_outputs, enc_outputs, enc_valid_lens)
        Z = self.addnorm2(Y, crossed)
        return self.addnorm3(Z, self.ffn(Z)), self_weights, cross_weights


class TransformerDecoder(nn.Module):
    """Embedding as the encoder, ``num_layers`` decoder blocks and ``dense`` ``(D -> V)`` — d2l §11.7.5.

    Args: as :class:`TransformerEncoder`.
    """

    def __init__(self, vocab_size: int, num_hiddens: int, ffn_num_hiddens: int, num_heads: int,
                 num_layers: int, dropout: float = 0.0, max_len: int = 1000, *,
                 num_kv_heads: int | None = None):
        super().__init__()
        self.num_hiddens = num_hiddens
        self.embedding = nn.Embedding(vocab_size, num_hiddens)
        self.pos_encoding = PositionalEncoding(num_hiddens, dropout, max_len)
        self.blks = nn.Sequential()
        for i in range(num_layers):
            self.blks.add_module(f"block{i}", TransformerDecoderBlock(
                num_hiddens, ffn_num_hiddens, num_heads, dropout, num_kv_heads=num_kv_heads))
        self.dense = nn.Linear(num_hiddens, vocab_size)

    def forward(self, dec_input, enc_outputs, enc_valid_lens):
        """``dec_input (B, T)`` -> ``(logits (B, T, V), {"decoder_self": (L, B, N, T, T),
        "encoder_decoder": (L, B, N, T, S)})``."""
        X = _embed(self.embedding, self.pos_encoding, dec_input, self.num_hiddens)
        self_weights, cross_weights = [], []
        for block in self.blks:
            X, s, c = block(X, enc_outputs, enc_valid_lens)
            self_weights.append(s)
            cross_weights.append(c)
        return self.dense(X), {"decoder_self": torch.stack(self_weights),
                               "encoder_decoder": torch.stack(cross_weights)}


class TransformerSeq2Seq(nn.Module):
    """The book's ``EncoderDecoder(TransformerEncoder, TransformerDecoder)`` — d2l §11.7.

    ``state_dict`` keys: ``encoder.embedding.weight``,
    ``encoder.blks.block{i}.attention.W_q.weight`` (``W_k``, ``W_v``, ``W_o``),
    ``encoder.blks.block{i}.addnorm1.ln.weight`` / ``.bias``, ``...ffn.dense1.weight`` / ``.bias``,
    ``...ffn.dense2.*``, ``...addnorm2.*``; ``decoder.embedding.weight``,
    ``decoder.blks.block{i}.attention1.*`` (causal self-attention), ``attention2.*``
    (encoder–decoder), ``addnorm1..3``, ``ffn``; ``decoder.dense.weight`` / ``.bias``.

    Args:
      src_vocab_size, tgt_vocab_size: ``V_src``, ``V_tgt``.
      num_hiddens, ffn_num_hiddens, num_heads, num_layers: ``D``, ``F``, ``N``, ``L`` (the book:
        32, 64, 4, 2).
      dropout: the book's 0.1 for training. max_len: rows of the position table.
      num_kv_heads: ``N_kv`` key/value heads of every attention (grouped-query attention,
        ``W_k``, ``W_v`` ``nn.Linear(D, N_kv H)``); default ``N``, the book's model.
    """

    def __init__(self, src_vocab_size: int, tgt_vocab_size: int, num_hiddens: int = 32,
                 ffn_num_hiddens: int = 64, num_heads: int = 4, num_layers: int = 2,
                 dropout: float = 0.0, max_len: int = 1000, *, num_kv_heads: int | None = None):
        super().__init__()
        self.encoder = TransformerEncoder(src_vocab_size, num_hiddens, ffn_num_hiddens, num_heads,
                                          num_layers, dropout, max_len, num_kv_heads=num_kv_heads)
        self.decoder = TransformerDecoder(tgt_vocab_size, num_hiddens, ffn_num_hiddens, num_heads,
                                          num_layers, dropout, max_len, num_kv_heads=num_kv_heads)

    def forward_with_weights(self, src, src_valid_len, dec_input):
        """``(logits (B, T, V), weights)`` with ``weights`` ``{"encoder_self" (L, B, N, S, S),
        "decoder_self" (L, B, N, T, T), "encoder_decoder" (L, B, N, T, S)}``, as ours."""
        enc_outputs, enc_weights = self.encoder(src, src_valid_len)
        logits, weights = self.decoder(dec_input, enc_outputs, src_valid_len)
        return logits, {"encoder_self": enc_weights, **weights}

    def forward(self, src, src_valid_len, dec_input):
        """Teacher-forced logits ``(B, T, V)``.

        Args:
          src: ``(B, S)`` ids. src_valid_len: ``(B,)``. dec_input: ``(B, T)`` ids (``<bos>`` first).
        """
        return self.forward_with_weights(src, src_valid_len, dec_input)[0]

    def loss(self, src, src_valid_len, tgt, tgt_valid_len, bos_id: int):
        """The per-sequence training loss ``(B,)`` with teacher forcing."""
        logits = self(src, src_valid_len, teacher_forcing_inputs(tgt, bos_id))
        return masked_cross_entropy(logits, tgt, tgt_valid_len)

    def predict(self, src_tokens, src_valid_len: int, *, bos_id: int, eos_id: int,
                max_len: int) -> list[int]:
        """Greedy decoding of one source, the book's ``predict_seq2seq`` loop (d2l §10.7.6).

        This decoder has no key/value state, so each new token re-runs it on the whole prefix
        (the same tokens as the book's incremental decoder, which caches the blocks' inputs).
        Call in eval mode without gradients (:func:`predict_seq2seq` does both).

        Args:
          src_tokens: ``(S,)`` source ids, encoded as in training. src_valid_len: its length.
          bos_id, eos_id: the target's ``<bos>`` and ``<eos>``. max_len: at most this many steps.

        Returns:
          The predicted ids, ``<eos>`` excluded.
        """
        src_valid_len = torch.tensor([int(src_valid_len)])
        enc_outputs, _ = self.encoder(_one_row(src_tokens), src_valid_len)
        prefix, output = [bos_id], []
        for _ in range(max_len):
            logits, _ = self.decoder(torch.tensor([prefix]), enc_outputs, src_valid_len)
            token = int(logits[0, -1].argmax())
            if token == eos_id:
                break
            output.append(token)
            prefix.append(token)
        return output


# --------------------------------------------------------------------------- training (train_seq2seq)


def xavier_init_weights(module: nn.Module) -> None:
    """The book's initialisation, for ``model.apply``: Xavier-uniform ``nn.Linear`` and ``nn.GRU`` weights.

    Biases, embeddings (``N(0, 1)``) and LayerNorms keep PyTorch's defaults — what our
    ``init_params`` draws from the same distributions.
    """
    if isinstance(module, nn.Linear):
        nn.init.xavier_uniform_(module.weight)
    if isinstance(module, nn.GRU):
        for name, parameter in module.named_parameters():
            if "weight" in name:
                nn.init.xavier_uniform_(parameter)


def grad_clipping(model: nn.Module, theta: float) -> torch.Tensor:
    """The book's ``grad_clipping``: gradients times ``theta / norm`` when their global norm exceeds ``theta``.

    No epsilon; gradients of norm ``<= theta`` are left alone (optax's ``clip_by_global_norm``
    computes the same). Returns the norm before clipping.
    """
    grads = [p.grad for p in model.parameters() if p.requires_grad and p.grad is not None]
    norm = torch.sqrt(sum(torch.sum(g ** 2) for g in grads))
    if norm > theta:
        for g in grads:
            g.mul_(theta / norm)
    return norm


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, src, src_valid_len, tgt,
               tgt_valid_len, bos_id: int, grad_clip: float = 1.0) -> float:
    """One step of the book's ``train_seq2seq``: ``loss(...).sum()``, backward, clip to ``grad_clip``, step.

    Args:
      model: a :class:`BahdanauSeq2Seq` or :class:`TransformerSeq2Seq` (any model with ``loss``).
      optimizer: e.g. ``torch.optim.Adam(model.parameters(), lr=0.005)`` (the book's).
      src: ``(B, S)``. src_valid_len: ``(B,)``. tgt: ``(B, T)``. tgt_valid_len: ``(B,)``.
      bos_id: the id of ``<bos>``. grad_clip: the book's ``theta = 1``.

    Returns:
      The summed loss of the batch (before the step).

    Speed: measured against d2l's own ``train_seq2seq`` (issue 15), this step is no slower than
    the book's: fewer ATen operations, the same CPU time. Slow PyTorch figures come from its
    thread count on a loaded machine, which the benchmarks choose by timing
    (:class:`jax_attention.bench.torch_support.ThreadChoice` says what was measured).
    """
    optimizer.zero_grad()
    loss = model.loss(src, src_valid_len, tgt, tgt_valid_len, bos_id).sum()
    loss.backward()
    grad_clipping(model, grad_clip)
    optimizer.step()
    return float(loss.detach())
