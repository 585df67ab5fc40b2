"""Sequence masks and masked softmax — d2l §11.3.2 (float64 NumPy reference).

Mirror of :mod:`jax_attention.nn.masking`: the same functions, names and argument order.
Shape letters: ``B`` batch, ``T`` queries, ``S`` keys; ``...`` any extra batch axes (heads).

Mask semantics (shared with the JAX package): a boolean mask is True where a query may attend.
A row in which nothing may be attended (e.g. ``valid_len == 0``) gets all-zero weights, so the
attention output of that row is zero. The book instead fills masked logits with ``-1e6``, which
gives such a row uniform weights over all keys (and NaN in float16); PyTorch's
``scaled_dot_product_attention``, ONNX ``Attention`` and ``jax.nn.softmax(where=...)`` give zeros,
and so do we.
"""

from __future__ import annotations

import numpy as np

from reference_numpy._checks import (
    check_count,
    check_local_window_size,
    check_mask,
    check_static_bool,
    check_valid_lens,
    check_values_in,
    is_integer_dtype,
)

__all__ = [
    "sequence_mask",
    "valid_lens_mask",
    "causal_mask",
    "local_window_mask",
    "combine_masks",
    "masked_softmax",
]


def sequence_mask(X, valid_len, value=0):
    """Replace the entries of each row past its valid length with ``value`` — d2l §10.7.

    ``X[..., i, s] = value`` wherever ``s >= valid_len[..., i]``. Returns a new array; ``X`` is
    never modified.

    Args:
      X: array of shape ``(..., S)``, for example ``(B, S)`` as in the book.
      valid_len: integer array broadcastable to ``X.shape[:-1]``, for example ``(B,)``, with
        values in ``[0, S]``.
      value: the fill value.

    Returns:
      An array of ``X``'s shape and dtype.

    Raises ``ValueError`` for ``X`` without an axis, for non-integer lengths, for lengths whose
    shape does not broadcast to ``X.shape[:-1]`` (naming both shapes; e.g. ``(1,)`` against
    ``X`` of shape ``(5,)``, which has no row axis) and for lengths outside ``[0, S]``.
    """
    X = np.asarray(X)
    valid_len = np.asarray(valid_len)
    if X.ndim < 1:
        raise ValueError(f"X must have at least one axis (..., S), got shape {X.shape}")
    if not is_integer_dtype(valid_len.dtype):
        raise ValueError(
            f"valid_len must hold integers, got dtype {valid_len.dtype} with shape {valid_len.shape}"
        )
    try:
        # Broadcasting must not add axes to X (the result keeps X's shape).
        if np.broadcast_shapes(valid_len.shape, X.shape[:-1]) != X.shape[:-1]:
            raise ValueError
    except ValueError:
        raise ValueError(
            f"valid_len must broadcast to X.shape[:-1] = {X.shape[:-1]}, got shape "
            f"{valid_len.shape} (X has shape {X.shape}, e.g. (B, S) with valid_len (B,))"
        ) from None
    check_values_in("valid_len", valid_len, 0, X.shape[-1], f"[0, S] = [0, {X.shape[-1]}]")
    keep = np.arange(X.shape[-1]) < valid_len[..., None]
    return np.where(keep, X, np.asarray(value, dtype=X.dtype))


def valid_lens_mask(valid_lens, num_queries: int, num_keys: int):
    """Boolean mask from d2l's ``valid_lens``: True where key ``s < valid_lens`` (attend).

    Args:
      valid_lens: ``None``, integer ``(B,)`` (one length per sequence, shared by all queries) or
        ``(B, T)`` (one length per query).
      num_queries: ``T``.
      num_keys: ``S``.

    Returns:
      ``None`` when ``valid_lens`` is ``None``, else a boolean array of shape ``(B, T, S)``.

    Raises ``ValueError`` for lengths of the wrong dtype, shape or range, and for sizes that are
    not integers ``>= 0``.
    """
    num_queries = check_count("num_queries", num_queries)
    num_keys = check_count("num_keys", num_keys)
    if valid_lens is None:
        return None
    valid_lens = check_valid_lens(valid_lens, None, num_queries, num_keys)
    if valid_lens.ndim == 1:
        valid_lens = np.broadcast_to(valid_lens[:, None], (valid_lens.shape[0], num_queries))
    return np.arange(num_keys) < valid_lens[..., None]


def _key_and_query_positions(num_queries: int, num_keys: int, offset):
    """``(arange(S)[None, :], arange(T)[:, None] + offset)``, the positions the causal and window
    masks compare; ``offset`` checked (an integer scalar)."""
    if np.shape(offset) != () or not is_integer_dtype(np.asarray(offset).dtype):
        raise TypeError(f"offset must be an integer scalar, got dtype {np.asarray(offset).dtype} "
                        f"with shape {np.shape(offset)}")
    return np.arange(num_keys)[None, :], np.arange(num_queries)[:, None] + offset


def causal_mask(num_queries: int, num_keys: int | None = None, *, offset: int = 0):
    """Lower-triangular mask: query ``t`` may attend key ``s`` iff ``s <= t + offset``.

    With ``offset=0`` and ``T == S`` this is the usual decoder self-attention mask (each position
    sees itself and the past). ``offset = S - T`` aligns the last query with the last key, as
    when ``T`` new queries attend a cache holding ``S`` keys.

    Args:
      num_queries: ``T >= 0``.
      num_keys: ``S >= 0``; defaults to ``T``.
      offset: position of query 0 relative to key 0, an integer scalar.

    Returns:
      A boolean array of shape ``(T, S)``.
    """
    num_queries = check_count("num_queries", num_queries)
    num_keys = num_queries if num_keys is None else check_count("num_keys", num_keys)
    keys, rows = _key_and_query_positions(num_queries, num_keys, offset)
    return keys <= rows


def local_window_mask(num_queries: int, num_keys: int | None = None, local_window_size=None, *,
                      offset: int = 0):
    """Sliding-window mask: query ``t`` may attend key ``s`` iff
    ``t + offset - left <= s <= t + offset + right`` — ``jax.nn``'s ``local_window_size``.

    Args:
      num_queries: ``T >= 0``.
      num_keys: ``S >= 0``; defaults to ``T``.
      local_window_size: ``(left, right)`` integers ``>= 0``, or ``w`` for ``(w, w)``. With
        ``is_causal`` the right side is moot; ``(w, 0)`` alone is a causal window of ``w + 1``
        keys (the query's own and ``w`` before it).
      offset: position of query 0 relative to key 0, an integer scalar.

    Returns:
      A boolean array of shape ``(T, S)``.

    Raises ``TypeError`` for a window that is not an int or a pair of ints, ``ValueError`` for a
    negative side.
    """
    num_queries = check_count("num_queries", num_queries)
    num_keys = num_queries if num_keys is None else check_count("num_keys", num_keys)
    window = check_local_window_size(local_window_size)
    if window is None:
        raise TypeError("local_window_size must be an int w (= (w, w)) or a pair of ints "
                        "(left, right), got None")
    left, right = window
    keys, rows = _key_and_query_positions(num_queries, num_keys, offset)
    return (keys >= rows - left) & (keys <= rows + right)


def group_heads(array, groups: int):
    """``(..., N | 1, T, X) -> (..., N / G | 1, G | 1, T, X)``: the head axis (third from the end)
    split into the key/value heads and the ``G = groups`` query heads that share each one, for
    grouped-query attention (query head ``n`` uses key/value head ``n // G``, as in ``jax.nn`` and
    PyTorch's ``enable_gqa``). A head axis of size 1 (broadcast over the heads) becomes two.
    Not part of the user-facing API (``__all__``): the scoring functions share it."""
    array = np.asarray(array)
    heads = array.shape[-3]
    split = (1, 1) if heads == 1 else (heads // groups, groups)
    return array.reshape(array.shape[:-3] + split + array.shape[-2:])


def ungroup_heads(array):
    """``(..., N_kv, G, T, X) -> (..., N_kv * G, T, X)``, the inverse of :func:`group_heads`."""
    array = np.asarray(array)
    return array.reshape(array.shape[:-4] + (array.shape[-4] * array.shape[-3],) + array.shape[-2:])


def combine_masks(*masks):
    """Logical AND of the masks that are not ``None`` (broadcasting); ``None`` if all are.

    Raises ``TypeError`` for a non-boolean mask and ``ValueError`` for shapes that do not
    broadcast together, naming ``masks[i]`` (the position among the arguments).
    """
    given = [(i, np.asarray(m)) for i, m in enumerate(masks) if m is not None]
    if not given:
        return None
    for i, m in given:
        if m.dtype != np.bool_:
            raise TypeError(f"masks[{i}] must be boolean (True = attend), got dtype {m.dtype} "
                            f"with shape {m.shape}")
    try:
        np.broadcast_shapes(*(m.shape for _, m in given))
    except ValueError:
        got = ", ".join(f"masks[{i}] {m.shape}" for i, m in given)
        raise ValueError(f"masks must broadcast together, got shapes {got}") from None
    combined = given[0][1]
    for _, m in given[1:]:
        combined = np.logical_and(combined, m)
    return combined


def attention_mask(shape, valid_lens=None, *, mask=None, is_causal=False,
                   local_window_size=None):
    """The boolean attention mask for scores of ``shape`` ``(B, ..., T, S)``, or ``None``.

    Combines d2l's ``valid_lens`` (``(B,)`` or ``(B, T)``), a boolean ``mask`` broadcastable to
    ``shape``, with ``is_causal`` :func:`causal_mask` ``(T, S)`` and with
    ``local_window_size`` :func:`local_window_mask` ``(T, S)`` (as ``jax.nn`` composes them).
    Raises ``ValueError`` for lengths of the wrong shape, type or range; ``TypeError`` for a
    non-boolean mask and for an ``is_causal`` that is not a Python bool (a string, an int, an
    array).
    """
    is_causal = check_static_bool("is_causal", is_causal)
    if len(shape) < 2:
        raise ValueError(f"shape (of the attention scores) must be (..., T, S), got {tuple(shape)}")
    T, S = shape[-2], shape[-1]
    parts = []
    if valid_lens is not None:
        if len(shape) < 3:
            raise ValueError(
                f"valid_lens needs scores with a batch axis (B, ..., T, S), got shape {tuple(shape)}"
            )
        lens = check_valid_lens(valid_lens, shape[0], T, S)
        lens_mask = valid_lens_mask(lens, T, S)
        parts.append(lens_mask[(slice(None),) + (None,) * (len(shape) - 3)])
    if mask is not None:
        parts.append(check_mask(mask, shape))
    if is_causal:
        parts.append(causal_mask(T, S))
    if local_window_size is not None:
        parts.append(local_window_mask(T, S, local_window_size))
    # Equal ranks, so that strict rank promotion (jax_numpy_rank_promotion="raise") holds.
    return combine_masks(*(m.reshape((1,) * (len(shape) - m.ndim) + m.shape) for m in parts))


def masked_softmax(X, valid_lens=None, *, mask=None):
    """Softmax over the last axis that gives masked entries exactly zero weight — d2l §11.3.2.

    ``softmax(X)[..., t, s]`` restricted to the keys ``s`` that may be attended: the keys below
    ``valid_lens`` and where ``mask`` is True. A row with no key to attend has all-zero weights
    (not the book's uniform weights; see the module docstring). Masking uses ``where``, so NaN or
    Inf in masked entries of ``X`` never reach the result. ``X`` is never modified.

    Args:
      X: scores of shape ``(B, ..., T, S)``, usually ``(B, T, S)``.
      valid_lens: ``None``, ``(B,)`` or ``(B, T)`` integers in ``[0, S]``; they apply to every
        extra axis ``...`` (for example every head).
      mask: boolean, broadcastable to ``X.shape``; True = attend.

    Returns:
      Weights of ``X``'s shape: each row sums to 1, or to 0 when fully masked (with ``S = 0``
      every row is, and the weights are empty).

    Raises:
      ValueError: ``X`` with fewer than two axes; lengths or a mask of the wrong shape; lengths
        of a non-integer dtype or outside ``[0, S]``.
      TypeError: ``X`` that is not real numbers (bool, complex); a non-boolean mask.
    """
    X = np.asarray(X)
    if X.ndim < 2:
        raise ValueError(f"X must have shape (..., T, S), e.g. (B, T, S), got {X.shape}")
    if not (np.issubdtype(X.dtype, np.floating) or is_integer_dtype(X.dtype)):
        raise TypeError(f"X must hold real numbers (scores), got dtype {X.dtype} with shape {X.shape}")
    if not np.issubdtype(X.dtype, np.floating):
        X = X.astype(np.float64)
    keep = attention_mask(X.shape, valid_lens, mask=mask)
    if X.shape[-1] == 0:
        # No key at all: every row is fully masked, and its (empty) weights need no softmax.
        return np.zeros(X.shape, X.dtype)
    keep = np.ones(X.shape, dtype=bool) if keep is None else np.broadcast_to(keep, X.shape)
    # The fill value only has to lose every max against a real score; `where` below zeroes it.
    logits = np.where(keep, X, np.finfo(X.dtype).min)
    shift = logits.max(axis=-1, keepdims=True)
    shift = np.where(np.isfinite(shift), shift, 0)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        exps = np.where(keep, np.exp(logits - shift), 0)
    total = exps.sum(axis=-1, keepdims=True)
    return exps / np.where(total == 0, 1, total)
