"""Multi-head attention and self-attention — d2l §11.5 and §11.6, in JAX.

Pure functions first, the NNX module below. Mirror of :mod:`reference_numpy.multihead` (same
names, argument order and einsum strings).
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
``transpose_qkv`` splits them (and as ``flax.nnx.MultiHeadAttention``'s ``(in, N, H)`` kernels
reshape). The computation runs in the queries' float dtype; parameters are cast to it.
Self-attention is the same function on ``(X, X, X)``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jax_attention._checks import (
    check_attention_inputs,
    check_dropout,
    check_num_heads,
    check_num_kv_heads,
    check_param_keys,
    check_param_shapes,
    check_size,
    check_unbatched,
)
from jax_attention.nn.masking import attention_mask, zero_unattended
from jax_attention.nn.scoring import DotProductAttention, dot_product_attention
from jax_attention.nn.precision import product

__all__ = [
    "split_heads",
    "merge_heads",
    "transpose_qkv",
    "transpose_output",
    "project_heads",
    "combine_heads",
    "multi_head_attention",
    "MultiHeadAttention",
]

# The same string as in reference_numpy/multihead.py: a dense layer over the last axis.
DENSE = "...i,io->...o"


def split_heads(X, num_heads: int):
    """``(B, T, D) -> (B, N, T, D / N)``: head ``n`` takes columns ``n*H .. (n+1)*H - 1``."""
    X = jnp.asarray(X)
    if X.ndim != 3:
        raise ValueError(f"X must have shape (B, T, D), got {X.shape}")
    check_num_heads(X.shape[-1], num_heads, f"D from X of shape {X.shape}")
    return to_heads(X, num_heads)


def merge_heads(X):
    """``(B, N, T, H) -> (B, T, N * H)``, the inverse of :func:`split_heads`."""
    X = jnp.asarray(X)
    if X.ndim != 4:
        raise ValueError(f"X must have shape (B, N, T, H), got {X.shape}")
    return from_heads(X)


def to_heads(X, num_heads: int):
    """:func:`split_heads` of a checked ``X``; not part of the user-facing API (``__all__``).
    ``H`` is explicit rather than ``-1``, which an empty sequence (``T = 0``) leaves open."""
    B, T, D = X.shape
    return X.reshape(B, T, num_heads, D // num_heads).transpose(0, 2, 1, 3)


def from_heads(X):
    """:func:`merge_heads` of a checked ``X``; not part of the user-facing API (``__all__``)."""
    B, N, T, H = X.shape
    return X.transpose(0, 2, 1, 3).reshape(B, T, N * H)


def transpose_qkv(X, num_heads: int):
    """The book's head split, ``(B, T, D) -> (B * N, T, D / N)`` — d2l §11.5.2."""
    heads = split_heads(X, num_heads)
    return heads.reshape((-1,) + heads.shape[2:])


def transpose_output(X, num_heads: int):
    """The book's head merge, ``(B * N, T, H) -> (B, T, N * H)``, inverse of :func:`transpose_qkv`."""
    X = jnp.asarray(X)
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
    D = jnp.shape(params["W_q"])[-1]
    check_num_heads(D, num_heads, f"D from params['W_q'] of shape {jnp.shape(params['W_q'])}")
    H = D // num_heads
    if num_kv_heads is None:  # read from W_k's width, when it is a whole number of heads
        width = jnp.shape(params["W_k"])[-1]
        num_kv_heads = width // H if H and width % H == 0 and width // H >= 1 else num_heads
        if num_heads % num_kv_heads:
            num_kv_heads = num_heads  # no grouping fits: the shape check below says so
    num_kv_heads = check_num_kv_heads(num_heads, num_kv_heads)
    D_v = jnp.shape(params["W_v"])[-1]
    if D_v % num_kv_heads:
        raise ValueError(f"params['W_v'] must have a width N_kv * H_v divisible by num_kv_heads = "
                         f"{num_kv_heads}, got shape {jnp.shape(params['W_v'])}")
    E = jnp.shape(params["W_o"])[-1]
    D_k, D_o = num_kv_heads * H, num_heads * (D_v // num_kv_heads)
    shapes = {"W_q": (queries.shape[-1], D), "W_k": (keys.shape[-1], D_k),
              "W_v": (values.shape[-1], D_v), "W_o": (D_o, E),
              "b_q": (D,), "b_k": (D_k,), "b_v": (D_v,), "b_o": (E,)}
    context = (f" (q, k, v from queries {queries.shape}, keys {keys.shape}, values {values.shape}; "
               f"D = {D} from params['W_q'], N = {num_heads} heads of H = {H}, "
               f"N_kv = {num_kv_heads} key/value heads, H_v = {D_v // num_kv_heads} from "
               f"params['W_v'], E = {E} from params['W_o'])")
    check_param_shapes("params", params, shapes, context)
    return {name: jnp.asarray(params[name]).astype(queries.dtype)
            for name in shapes if name in params}, num_kv_heads


def _check_inputs(queries, keys, values):
    arrays = {"queries": jnp.asarray(queries), "keys": jnp.asarray(keys), "values": jnp.asarray(values)}
    for name, array in arrays.items():
        if array.ndim != 3:
            raise ValueError(f"{name} must have shape (B, len, size), got {array.shape}")
    q, k, v = arrays.values()
    if not q.shape[0] == k.shape[0] == v.shape[0] or k.shape[1] != v.shape[1]:
        raise ValueError(
            f"queries (B, T, q), keys (B, S, k) and values (B, S, v) must share B and keys and "
            f"values S, got queries {q.shape}, keys {k.shape}, values {v.shape}"
        )
    # Integers become floats and one float dtype is required, as in scoring (the parameters are
    # cast to the inputs' dtype, so integer inputs would otherwise truncate them).
    return tuple(check_attention_inputs(q, k, v, same_depth=False))


def dense(params, X, kernel: str, bias: str | None = None):
    """``X params[kernel] + params[bias]`` over the last axis, ``(..., i) -> (..., o)``, in
    ``X``'s dtype (half precision: :func:`~jax_attention.nn.precision.product`); no bias when
    ``bias`` is ``None`` or ``params`` holds none by that name (the projections' optional
    biases). The one dense layer of the package: the projections here, the
    Transformer's FFN, output layer and key/value cache. Not part of the user-facing API
    (``__all__``)."""
    out = product(DENSE, X, jnp.asarray(params[kernel]).astype(X.dtype))
    if bias is None or bias not in params:
        return out
    b = jnp.asarray(params[bias]).astype(X.dtype)
    return out + b.reshape((1,) * (out.ndim - 1) + b.shape)


def _project(params, queries, keys, values, num_heads: int, num_kv_heads: int):
    """:func:`project_heads` on checked inputs and parameters (cast to the inputs' dtype)."""
    return tuple(
        to_heads(dense(params, X, f"W_{name}", f"b_{name}"), heads)
        for X, name, heads in ((queries, "q", num_heads), (keys, "k", num_kv_heads),
                               (values, "v", num_kv_heads))
    )


def _combine(params, heads):
    """:func:`combine_heads` with checked parameters: ``(B, N, T, H_v) -> (B, T, E)``."""
    return dense(params, from_heads(heads), "W_o", "b_o")


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
    return _project(params, queries, keys, values, num_heads, num_kv_heads)


def combine_heads(params, heads):
    """Merge the heads ``(B, N, T, H_v)`` and apply the output projection ``W_o (N H_v, E)``:
    ``(B, T, E)``."""
    if jnp.ndim(heads) != 4:
        raise ValueError(f"heads must have shape (B, N, T, H), got {jnp.shape(heads)}")
    # W_q, W_k and W_v are not used here, but may be present: the dict of multi_head_attention.
    check_param_keys("params", params, ("W_o",), KERNEL_KEYS[:3] + BIAS_KEYS)
    B, N, T, H_v = jnp.shape(heads)
    E = jnp.shape(params["W_o"])[-1]
    check_param_shapes("params", params, {"W_o": (N * H_v, E), "b_o": (E,)})
    dtype = jnp.result_type(heads)
    return _combine({name: jnp.asarray(params[name]).astype(dtype)
                     for name in ("W_o", "b_o") if name in params}, heads)


def attend_heads(params, queries, keys, values, valid_lens, attend, *, num_heads: int,
                 num_kv_heads=None, mask=None, is_causal=False, bias=None,
                 local_window_size=None):
    """The multi-head assembly of the package: :func:`multi_head_attention`,
    :class:`MultiHeadAttention` and the Transformer's layers
    (:func:`jax_attention.models.transformer_layers.attention`) all run it, each with its own
    ``attend``. Not part of the user-facing API (``__all__``).

    It checks the inputs and the parameters once, builds the mask of every head once
    (:func:`~jax_attention.nn.masking.attention_mask`), zeroes the queries that attend no key and
    the keys and values no head attends (so NaN or Inf in padding never reaches the gradients of
    ``W_q``, ``W_k``, ``W_v`` through the projections), projects and splits the heads, calls
    ``attend(heads_q (B, N, T, H), heads_k (B, N_kv, S, H), heads_v (B, N_kv, S, H_v), keep,
    bias) -> (heads (B, N, T, H_v), weights (B, N, T, S))`` and merges and projects the heads.
    Arguments as :func:`multi_head_attention`; returns ``(output (B, T, E), weights)``
    (unbatched: ``(T, E)`` and ``weights[0]``), ``weights`` as ``attend`` returns them.
    """
    unbatched, queries, keys, values, valid_lens, mask, bias = _batched_inputs(
        queries, keys, values, valid_lens, mask, bias)
    mask, bias = _per_head("mask", mask), _per_head("bias", bias)
    queries, keys, values = _check_inputs(queries, keys, values)
    check_num_heads(None, num_heads)
    keep = attention_mask((queries.shape[0], num_heads, queries.shape[1], keys.shape[1]),
                          valid_lens, mask=mask, is_causal=is_causal,
                          local_window_size=local_window_size)
    params, num_kv_heads = _check_params(params, queries, keys, values, num_heads, num_kv_heads)
    output, weights = assemble_heads(params, queries, keys, values, keep, attend,
                                     num_heads=num_heads, num_kv_heads=num_kv_heads, bias=bias)
    if unbatched:  # an attend that returns no weights (the module sows them) gives None back
        return output[0], None if weights is None else weights[0]
    return output, weights


def assemble_heads(params, queries, keys, values, keep, attend, *, num_heads: int,
                   num_kv_heads: int, bias=None):
    """:func:`attend_heads` on checked inputs ``(B, T, q)``, ``(B, S, k)``, ``(B, S, v)``, checked
    parameters and the mask ``keep`` it built (or ``None``): zero what no head attends, project
    and split the heads, ``attend``, merge and project. The Transformer's layers call it with a
    mask built once for all their blocks. Not part of the user-facing API (``__all__``)."""
    if keep is not None:
        queries, keys, values = zero_unattended(keep, queries, keys, values, heads="shared")
    dtype = queries.dtype
    params = {name: jnp.asarray(array).astype(dtype) for name, array in params.items()}
    heads, weights = attend(*_project(params, queries, keys, values, num_heads, num_kv_heads),
                            keep, bias)
    return _combine(params, heads), weights


def _per_head(name, array):
    """Masks and biases are ``(T, S)`` or ``(B | 1, N | 1, T, S)``; a 3-D one is ambiguous
    (``(B, T, S)`` or ``(N, T, S)``?), so it is refused rather than guessed."""
    if array is None:
        return None
    array = jnp.asarray(array)
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
        mask, bias = (a if a is None or jnp.ndim(a) != 3 else jnp.asarray(a)[None]
                      for a in (mask, bias))
    return unbatched, queries, keys, values, valid_lens, mask, bias


def multi_head_attention(params, queries, keys, values, valid_lens=None, *, num_heads: int,
                         num_kv_heads=None, mask=None, is_causal=False, bias=None, scale=None,
                         local_window_size=None, logit_softcap=None, mask_mod=None,
                         score_mod=None, sinks=None):
    """Multi-head scaled dot-product attention — d2l §11.5.

    ``head_n = softmax(Q_n K_n^T / sqrt(H) + bias_n) V_n`` with ``Q_n = queries W_q[:, n]`` etc.,
    then ``concat(head_1, ..., head_N) W_o``. Masking as in :mod:`jax_attention.nn.masking`; a
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
        :func:`jax_attention.nn.scoring.dot_product_attention` (``scale`` defaults to
        ``1 / sqrt(H)``; the mods see the heads ``(B, N, T, S)``, ``sinks`` is ``(N,)``).

    Returns:
      ``(output (B, T, E), weights (B, N, T, S))`` (unbatched: ``(T, E)``, ``(N, T, S)``).

    Example::

        >>> params = MultiHeadAttention(8, num_heads=2, rngs=nnx.Rngs(0)).params_dict()
        >>> X = jnp.ones((2, 4, 8))
        >>> out, w = multi_head_attention(params, X, X, X, jnp.array([3, 4]), num_heads=2)
        >>> out.shape, w.shape
        ((2, 4, 8), (2, 2, 4, 4))
        >>> gqa = MultiHeadAttention(8, num_heads=4, num_kv_heads=2, rngs=nnx.Rngs(0))
        >>> gqa.params_dict()["W_k"].shape                    # 2 key/value heads of size 2
        (8, 4)
        >>> multi_head_attention(gqa.params_dict(), X, X, X, num_heads=4,
        ...                      local_window_size=(1, 0))[1].shape
        (2, 4, 4, 4)
    """
    def attend(heads_q, heads_k, heads_v, keep, bias):
        return dot_product_attention(heads_q, heads_k, heads_v, mask=keep, bias=bias,
                                     scale=scale, logit_softcap=logit_softcap,
                                     mask_mod=mask_mod, score_mod=score_mod, sinks=sinks)

    return attend_heads(params, queries, keys, values, valid_lens, attend, num_heads=num_heads,
                        num_kv_heads=num_kv_heads, mask=mask, is_causal=is_causal, bias=bias,
                        local_window_size=local_window_size)


# --------------------------------------------------------------------------- NNX module


class MultiHeadAttention(nnx.Module):
    """Multi-head attention with dropout on the weights — d2l §11.5.

    Holds ``W_q (query_size, D)``, ``W_k (key_size, N_kv H)``, ``W_v (value_size, N_kv H_v)``,
    ``W_o (N H_v, D)`` (Xavier-uniform; ``H = D / N``) and, with ``bias=True``, zero-initialised
    ``b_q, b_k, b_v, b_o``; :meth:`params_dict` gives them as the plain dict
    :func:`multi_head_attention` and the NumPy reference take. With the defaults
    (``num_kv_heads = N``, ``value_head_size = H``) these are the book's four ``(D, D)``
    kernels. Self-attention: ``module(X, X, X, valid_lens)``.

    With ``sow_weights=True`` the weights ``(B, N, T, S)`` (before dropout) are sown by the inner
    :class:`~jax_attention.nn.scoring.DotProductAttention` as ``nnx.Intermediate``
    ``"attention_weights"``; read them with ``nnx.capture(module, nnx.Intermediate)``.

    Args:
      num_hiddens: ``D``.
      num_heads: ``N``; must divide ``D``.
      dropout: dropout rate on the attention weights.
      bias: whether the four projections have biases (the book's ``bias=False``).
      query_size, key_size, value_size: input sizes (default ``D``).
      num_kv_heads: ``N_kv`` key/value heads shared by groups of ``N / N_kv`` query heads
        (grouped-query attention; 1 = multi-query attention); default ``N``. ``W_k`` and
        ``W_v`` shrink by ``N / N_kv``, and so does a key/value cache.
      value_head_size: ``H_v``, the size of each head's values (default ``H``), like
        ``torch.nn.MultiheadAttention``'s separate value width: ``W_v (value_size, N_kv H_v)``,
        ``W_o (N H_v, D)``.
      sow_weights: sow the attention weights on every call (use inside ``nnx.capture``).
      param_dtype: dtype of the parameters.
      rngs: ``nnx.Rngs`` with a ``params`` stream (and ``dropout`` when dropout is active).

    Example::

        >>> attention = MultiHeadAttention(num_hiddens=8, num_heads=2, rngs=nnx.Rngs(0))
        >>> X = jnp.ones((2, 4, 8))                           # self-attention: (B, T, D)
        >>> attention(X, X, X, jnp.array([3, 4])).shape
        (2, 4, 8)
        >>> attention.params_dict()["W_q"].shape
        (8, 8)
        >>> mqa = MultiHeadAttention(8, num_heads=2, num_kv_heads=1, value_head_size=3,
        ...                          rngs=nnx.Rngs(0))
        >>> {name: w.shape for name, w in mqa.params_dict().items()}
        {'W_q': (8, 8), 'W_k': (8, 4), 'W_v': (8, 3), 'W_o': (6, 8)}
        >>> mqa(X[0], X[0], X[0], is_causal=True).shape     # unbatched (T, D)
        (4, 8)
    """

    def __init__(self, num_hiddens: int, num_heads: int, dropout: float = 0.0, bias: bool = False, *,
                 query_size: int | None = None, key_size: int | None = None,
                 value_size: int | None = None, num_kv_heads: int | None = None,
                 value_head_size: int | None = None, sow_weights: bool = False,
                 param_dtype=jnp.float32, rngs: nnx.Rngs):
        check_num_heads(check_size("num_hiddens", num_hiddens), num_heads)
        dropout = check_dropout(dropout)
        self.num_heads = num_heads
        self.num_kv_heads = check_num_kv_heads(num_heads, num_kv_heads)
        head_size = num_hiddens // num_heads
        value_head_size = (head_size if value_head_size is None
                           else check_size("value_head_size", value_head_size))
        init = nnx.initializers.xavier_uniform()
        sizes = {"q": num_hiddens if query_size is None else check_size("query_size", query_size),
                 "k": num_hiddens if key_size is None else check_size("key_size", key_size),
                 "v": num_hiddens if value_size is None else check_size("value_size", value_size)}
        widths = {"q": num_hiddens, "k": self.num_kv_heads * head_size,
                  "v": self.num_kv_heads * value_head_size, "o": num_heads * value_head_size}
        self.W_q, self.W_k, self.W_v = (
            nnx.Param(init(rngs.params(), (sizes[name], widths[name]), param_dtype))
            for name in "qkv"
        )
        self.W_o = nnx.Param(init(rngs.params(), (widths["o"], num_hiddens), param_dtype))
        if bias:
            self.b_q, self.b_k, self.b_v, self.b_o = (
                nnx.Param(jnp.zeros((width,), param_dtype))
                for width in (widths["q"], widths["k"], widths["v"], num_hiddens)
            )
        self.attention = DotProductAttention(dropout, sow_weights=sow_weights, rngs=rngs)

    def params_dict(self) -> dict[str, jax.Array]:
        """The parameters as plain arrays ``{"W_q", "W_k", "W_v", "W_o"[, "b_q", ...]}``."""
        names = ("W_q", "W_k", "W_v", "W_o", "b_q", "b_k", "b_v", "b_o")
        return {name: getattr(self, name)[...] for name in names if hasattr(self, name)}

    def __call__(self, queries, keys, values, valid_lens=None, *, mask=None, is_causal=False,
                 bias=None, scale=None, local_window_size=None, logit_softcap=None,
                 mask_mod=None, score_mod=None, sinks=None,
                 deterministic: bool | None = None, rngs: nnx.Rngs | None = None):
        """Returns the output ``(B, T, D)`` (unbatched: ``(T, D)``); see
        :func:`multi_head_attention` for the arguments."""
        params = self.params_dict()
        for name, X, W, size_name in (("queries", queries, "W_q", "query_size"),
                                      ("keys", keys, "W_k", "key_size"),
                                      ("values", values, "W_v", "value_size")):
            size, letter = params[W].shape[0], name[0]
            if jnp.ndim(X) not in (2, 3) or jnp.shape(X)[-1] != size:
                raise ValueError(f"{name} must have shape (B, len, {letter}) or unbatched "
                                 f"(len, {letter}) with {letter} = {size} (the module's "
                                 f"{size_name}), got {jnp.shape(X)}")
        unbatched = jnp.ndim(queries) == 2

        def attend(heads_q, heads_k, heads_v, keep, bias):
            # Dropout acts on the weights; unbatched, the sown weights (N, T, S) drop the batch
            # axis, and so do the heads, which get it back for the output projection.
            heads = self.attention(heads_q, heads_k, heads_v, mask=keep, bias=bias, scale=scale,
                                   logit_softcap=logit_softcap, mask_mod=mask_mod,
                                   score_mod=score_mod, sinks=sinks, deterministic=deterministic,
                                   rngs=rngs, drop_batch_axis=unbatched)
            return (heads[None] if unbatched else heads), None

        output, _ = attend_heads(params, queries, keys, values, valid_lens, attend,
                                 num_heads=self.num_heads, num_kv_heads=self.num_kv_heads,
                                 mask=mask, is_causal=is_causal, bias=bias,
                                 local_window_size=local_window_size)
        return output
