"""Multi-head attention and self-attention — d2l §11.5 and §11.6 (float64 NumPy reference).

Mirror of :mod:`jax_attention.nn.multihead` (same names, argument order and einsum strings).
Shape letters: ``B`` batch, ``T`` queries, ``S`` keys/values, ``N`` heads, ``H = D / N`` head size,
``D`` = ``num_hiddens``; ``q``/``k``/``v`` the input sizes of queries, keys and values, ``E`` the
output size (``D`` in the book).

Parameters are a dict of dense kernels stored ``(in, out)`` — ``W_q (q, D)``, ``W_k (k, D)``,
``W_v (v, D)``, ``W_o (D, E)`` — and optional biases ``b_q (D,)``, ``b_k (D,)``, ``b_v (D,)``,
``b_o (E,)``. Grouped-query attention has ``N_kv`` key/value heads (dividing ``N``; 1 =
multi-query attention): ``W_k (k, N_kv H)``, ``W_v (v, N_kv H_v)``, and a value head size
``H_v`` other than ``H`` makes ``W_v (v, N_kv H_v)`` and ``W_o (N H_v, E)``; ``H_v`` is read from
``W_v``'s width, ``N_kv`` from ``num_kv_heads`` (default: from ``W_k``'s width). Any other
key (a misspelled ``B_o``) or a missing kernel raises ``ValueError`` naming it. ``is_causal``
must be a Python bool (``TypeError`` otherwise). Head ``n`` uses columns
``n*H .. (n+1)*H - 1`` of the projected width, as the book's
``transpose_qkv`` splits them. Self-attention is the same function on ``(X, X, X)``.
"""

from __future__ import annotations

import numpy as np

from reference_numpy._checks import (
    check_attention_inputs,
    check_num_heads,
    check_num_kv_heads,
    check_param_keys,
    check_param_shapes,
    check_unbatched,
)
from reference_numpy.masking import attention_mask
from reference_numpy.scoring import dot_product_attention

__all__ = [
    "split_heads",
    "merge_heads",
    "transpose_qkv",
    "transpose_output",
    "project_heads",
    "combine_heads",
    "multi_head_attention",
]

# The same strings as in jax_attention/nn/multihead.py.
DENSE = "...i,io->...o"


def split_heads(X, num_heads: int):
    """``(B, T, D) -> (B, N, T, D / N)``: head ``n`` takes columns ``n*H .. (n+1)*H - 1``."""
    X = np.asarray(X)
    if X.ndim != 3:
        raise ValueError(f"X must have shape (B, T, D), got {X.shape}")
    check_num_heads(X.shape[-1], num_heads, f"D from X of shape {X.shape}")
    B, T, D = X.shape
    return X.reshape(B, T, num_heads, D // num_heads).transpose(0, 2, 1, 3)


def merge_heads(X):
    """``(B, N, T, H) -> (B, T, N * H)``, the inverse of :func:`split_heads`."""
    X = np.asarray(X)
    if X.ndim != 4:
        raise ValueError(f"X must have shape (B, N, T, H), got {X.shape}")
    B, N, T, H = X.shape
    return X.transpose(0, 2, 1, 3).reshape(B, T, N * H)


def transpose_qkv(X, num_heads: int):
    """The book's head split, ``(B, T, D) -> (B * N, T, D / N)`` — d2l §11.5.2."""
    heads = split_heads(X, num_heads)
    return heads.reshape((-1,) + heads.shape[2:])


def transpose_output(X, num_heads: int):
    """The book's head merge, ``(B * N, T, H) -> (B, T, N * H)``, inverse of :func:`transpose_qkv`."""
    X = np.asarray(X)
    check_num_heads(None, num_heads)
    if X.ndim != 3 or X.shape[0] % num_heads:
        raise ValueError(f"X must have shape (B * N, T, H) with N = {num_heads}, got {X.shape}")
    return merge_heads(X.reshape((-1, num_heads) + X.shape[1:]))


#: The keys of the parameter dict: the kernels, always, and the biases, which may be absent.
KERNEL_KEYS = ("W_q", "W_k", "W_v", "W_o")
BIAS_KEYS = ("b_q", "b_k", "b_v", "b_o")


def _check_params(params, queries, keys, values, num_heads: int, num_kv_heads=None):
    """The parameters checked against the inputs' sizes and the heads: ``W_q (q, D)`` with ``N``
    dividing ``D`` (``H = D / N``), ``W_k (k, N_kv H)``, ``W_v (v, N_kv H_v)``,
    ``W_o (N H_v, E)`` and the biases of those widths. Returns ``(params, N_kv)``."""
    check_param_keys("params", params, KERNEL_KEYS, BIAS_KEYS)
    D = np.shape(params["W_q"])[-1]
    check_num_heads(D, num_heads, f"D from params['W_q'] of shape {np.shape(params['W_q'])}")
    H = D // num_heads
    if num_kv_heads is None:  # read from W_k's width, when it is a whole number of heads
        width = np.shape(params["W_k"])[-1]
        num_kv_heads = width // H if H and width % H == 0 and width // H >= 1 else num_heads
        if num_heads % num_kv_heads:
            num_kv_heads = num_heads  # no grouping fits: the shape check below says so
    num_kv_heads = check_num_kv_heads(num_heads, num_kv_heads)
    D_v = np.shape(params["W_v"])[-1]
    if D_v % num_kv_heads:
        raise ValueError(f"params['W_v'] must have a width N_kv * H_v divisible by num_kv_heads = "
                         f"{num_kv_heads}, got shape {np.shape(params['W_v'])}")
    E = np.shape(params["W_o"])[-1]
    D_k, D_o = num_kv_heads * H, num_heads * (D_v // num_kv_heads)
    shapes = {"W_q": (queries.shape[-1], D), "W_k": (keys.shape[-1], D_k),
              "W_v": (values.shape[-1], D_v), "W_o": (D_o, E),
              "b_q": (D,), "b_k": (D_k,), "b_v": (D_v,), "b_o": (E,)}
    context = (f" (q, k, v from queries {queries.shape}, keys {keys.shape}, values {values.shape}; "
               f"D = {D} from params['W_q'], N = {num_heads} heads of H = {H}, "
               f"N_kv = {num_kv_heads} key/value heads, H_v = {D_v // num_kv_heads} from "
               f"params['W_v'], E = {E} from params['W_o'])")
    check_param_shapes("params", params, shapes, context)
    return {name: np.asarray(params[name]) for name in shapes if name in params}, num_kv_heads


def _check_inputs(queries, keys, values):
    arrays = {"queries": np.asarray(queries), "keys": np.asarray(keys), "values": np.asarray(values)}
    for name, array in arrays.items():
        if array.ndim != 3:
            raise ValueError(f"{name} must have shape (B, len, size), got {array.shape}")
    q, k, v = arrays.values()
    if not q.shape[0] == k.shape[0] == v.shape[0] or k.shape[1] != v.shape[1]:
        raise ValueError(
            f"queries (B, T, q), keys (B, S, k) and values (B, S, v) must share B and keys and "
            f"values S, got queries {q.shape}, keys {k.shape}, values {v.shape}"
        )
    # Integers become float64 and one float dtype is required, as in scoring and the JAX twin
    # (which casts the parameters to the inputs' dtype, so it must be a float).
    return tuple(check_attention_inputs(q, k, v, same_depth=False))


def mask_inputs(queries, keys, values, valid_lens, mask, is_causal, num_heads, *,
                local_window_size=None):
    """Checks the inputs, builds the mask of every head once and zeroes what nothing attends.

    The first half of its JAX twin's multi-head assembly
    (:func:`jax_attention.nn.multihead.attend_heads`); not part of the user-facing API
    (``__all__``).

    Returns ``(keep, queries, keys, values)``: the boolean mask broadcastable to ``(B, N, T, S)``
    (or ``None``) and the inputs in which the queries that attend no key, and the keys and values
    that no query of any head attends, are zero. Their weights are zero already; the outputs do
    not change, but the JAX twin needs it so that NaN or Inf stored there (padding) cannot reach
    the gradients of ``W_q``, ``W_k`` and ``W_v`` through the projections (``0 * NaN`` is NaN).
    """
    queries, keys, values = _check_inputs(queries, keys, values)
    check_num_heads(None, num_heads)
    keep = attention_mask((queries.shape[0], num_heads, queries.shape[1], keys.shape[1]), valid_lens,
                          mask=mask, is_causal=is_causal, local_window_size=local_window_size)
    if keep is None:
        return keep, queries, keys, values
    query_attends = np.any(keep, axis=(1, 3))[..., None]  # (B | 1, T, 1)
    key_attended = np.any(keep, axis=(1, 2))[..., None]  # (B | 1, S, 1)
    zero = np.zeros((), queries.dtype)
    return (keep, np.where(query_attends, queries, zero), np.where(key_attended, keys, zero),
            np.where(key_attended, values, zero))


def dense(params, X, kernel: str, bias: str | None = None):
    """``X params[kernel] + params[bias]`` over the last axis; no bias when ``bias`` is ``None``
    or ``params`` holds none by that name. Not part of the user-facing API (``__all__``)."""
    out = np.einsum(DENSE, X, np.asarray(params[kernel]))
    if bias is None or bias not in params:
        return out
    b = np.asarray(params[bias])
    return out + b.reshape((1,) * (out.ndim - 1) + b.shape)


def project_heads(params, queries, keys, values, *, num_heads: int, num_kv_heads=None):
    """Project queries, keys and values with ``W_q``, ``W_k``, ``W_v`` and split the heads.

    Args:
      params: see the module docstring.
      queries: ``(B, T, q)``.
      keys: ``(B, S, k)``.
      values: ``(B, S, v)``.
      num_heads: ``N``; must divide ``D``.
      num_kv_heads: ``N_kv``, dividing ``N``; ``None``: read from ``W_k``'s width (``N``
        for the book's parameters).

    Returns:
      ``(queries (B, N, T, H), keys (B, N_kv, S, H), values (B, N_kv, S, H_v))``.
    """
    queries, keys, values = _check_inputs(queries, keys, values)
    params, num_kv_heads = _check_params(params, queries, keys, values, num_heads, num_kv_heads)
    return tuple(
        split_heads(dense(params, X, f"W_{name}", f"b_{name}"), heads)
        for X, name, heads in ((queries, "q", num_heads), (keys, "k", num_kv_heads),
                               (values, "v", num_kv_heads))
    )


def combine_heads(params, heads):
    """Merge the heads ``(B, N, T, H_v)`` and apply the output projection ``W_o (N H_v, E)``:
    ``(B, T, E)``."""
    if np.ndim(heads) != 4:
        raise ValueError(f"heads must have shape (B, N, T, H), got {np.shape(heads)}")
    # W_q, W_k and W_v are not used here, but may be present: the dict of multi_head_attention.
    check_param_keys("params", params, ("W_o",), KERNEL_KEYS[:3] + BIAS_KEYS)
    merged = merge_heads(heads)
    E = np.shape(params["W_o"])[-1]
    check_param_shapes("params", params, {"W_o": (merged.shape[-1], E), "b_o": (E,)})
    return dense(params, merged, "W_o", "b_o")


def _per_head(name, array):
    """Masks and biases are ``(T, S)`` or ``(B | 1, N | 1, T, S)``; a 3-D one is ambiguous
    (``(B, T, S)`` or ``(N, T, S)``?), so it is refused rather than guessed."""
    if array is None:
        return None
    array = np.asarray(array)
    if array.ndim not in (2, 4):
        raise ValueError(
            f"{name} must have shape (T, S) or (B, N, T, S) (1 for broadcast axes); add the head "
            f"axis explicitly, e.g. {name}[:, None] for (B, T, S), got shape {array.shape}"
        )
    return array


def _batched_inputs(queries, keys, values, valid_lens, mask, bias):
    """Unbatched inputs — queries ``(T, q)``, keys ``(S, k)``, values ``(S, v)``, lengths ``()``
    or ``(T,)``, masks and biases ``(T, S)`` or ``(N | 1, T, S)`` — given a batch axis of 1:
    ``(unbatched, queries, keys, values, valid_lens, mask, bias)``; batched ones as they are."""
    unbatched, queries, keys, values, valid_lens = check_unbatched(queries, keys, values, valid_lens)
    if unbatched:
        mask, bias = (a if a is None or np.ndim(a) != 3 else np.asarray(a)[None]
                      for a in (mask, bias))
    return unbatched, queries, keys, values, valid_lens, mask, bias


def multi_head_attention(params, queries, keys, values, valid_lens=None, *, num_heads: int,
                         num_kv_heads=None, mask=None, is_causal=False, bias=None, scale=None,
                         local_window_size=None, logit_softcap=None, mask_mod=None,
                         score_mod=None, sinks=None):
    """Multi-head scaled dot-product attention — d2l §11.5.

    ``head_n = softmax(Q_n K_n^T / sqrt(H) + bias_n) V_n`` with ``Q_n = queries W_q[:, n]`` etc.,
    then ``concat(head_1, ..., head_N) W_o``. Masking as in :mod:`reference_numpy.masking`; a
    fully masked query row gives zero weights, so its output is ``b_o`` (zero without biases).
    Grouped-query attention: query head ``n`` uses key/value head ``n // (N / N_kv)``.

    Args:
      params: ``W_q (q, D)``, ``W_k (k, N_kv H)``, ``W_v (v, N_kv H_v)``, ``W_o (N H_v, E)``,
        optional ``b_q (D,)``, ``b_k (N_kv H,)``, ``b_v (N_kv H_v,)``, ``b_o (E,)``; in the
        book, ``N_kv = N`` and ``H_v = H = D / N``.
      queries: ``(B, T, q)``, or unbatched ``(T, q)``.
      keys: ``(B, S, k)`` (unbatched ``(S, k)``).
      values: ``(B, S, v)`` (unbatched ``(S, v)``).
      valid_lens: ``None``, ``(B,)`` or ``(B, T)``, shared by all heads (unbatched: ``()`` or
        ``(T,)``).
      num_heads: ``N``; must divide ``D``.
      num_kv_heads: ``N_kv`` key/value heads, dividing ``N`` (1: multi-query attention);
        ``None``: read from ``W_k``'s width.
      mask: boolean ``(T, S)`` or ``(B | 1, N | 1, T, S)`` (unbatched: ``(N | 1, T, S)``);
        True = attend.
      is_causal: also apply a causal mask ``(T, S)``.
      bias: added to the scores before the softmax, ``(T, S)`` or ``(B | 1, N | 1, T, S)``
        (e.g. a relative position bias ``(1, N, T, S)``).
      scale, local_window_size, logit_softcap, mask_mod, score_mod, sinks: as in
        :func:`reference_numpy.scoring.dot_product_attention` (``scale`` defaults to
        ``1 / sqrt(H)``; the mods see the heads ``(B, N, T, S)``, ``sinks`` is ``(N,)``).

    Returns:
      ``(output (B, T, E), weights (B, N, T, S))`` (unbatched: ``(T, E)``, ``(N, T, S)``).
    """
    unbatched, queries, keys, values, valid_lens, mask, bias = _batched_inputs(
        queries, keys, values, valid_lens, mask, bias)
    mask, bias = _per_head("mask", mask), _per_head("bias", bias)
    keep, queries, keys, values = mask_inputs(queries, keys, values, valid_lens, mask, is_causal,
                                              num_heads, local_window_size=local_window_size)
    heads_q, heads_k, heads_v = project_heads(params, queries, keys, values, num_heads=num_heads,
                                              num_kv_heads=num_kv_heads)
    output, weights = dot_product_attention(heads_q, heads_k, heads_v, mask=keep, bias=bias,
                                            scale=scale, logit_softcap=logit_softcap,
                                            mask_mod=mask_mod, score_mod=score_mod, sinks=sinks)
    output = combine_heads(params, output)
    return (output[0], weights[0]) if unbatched else (output, weights)
