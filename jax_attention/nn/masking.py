"""Sequence masks and masked softmax — d2l §11.3.2, in JAX.

Mirror of :mod:`reference_numpy.masking`: the same functions, names and argument order.
Shape letters: ``B`` batch, ``T`` queries, ``S`` keys; ``...`` any extra batch axes (heads).

Mask semantics: a boolean mask is True where a query may attend. A row in which nothing may be
attended (e.g. ``valid_len == 0``) gets **all-zero weights**, so the attention output of that row is
zero and its gradients are finite. The book instead fills masked logits with ``-1e6``, which gives
such a row uniform weights over all keys, including padding (and NaN in float16, where ``-1e6`` is
``-inf``); PyTorch's ``scaled_dot_product_attention``, ONNX ``Attention`` and
``jax.nn.softmax(where=...)`` give zeros, and so do we, in every float dtype. Masking is done with
``jnp.where``, so NaN or Inf in masked positions never reach valid outputs or gradients.

Checking lengths under ``jit``: the shape and dtype of ``valid_lens`` are checked always. Their
*values* (negative, or larger than ``S``) are checked whenever they are concrete — eager calls, and
constants closed over by a jitted function. When they are traced (arguments of a jitted or vmapped
function) they cannot be inspected; the mask ``s < valid_len`` then acts as if they were clipped
to ``[0, S]``: a negative length masks the whole row (zero weights), a length above ``S`` keeps all
keys. This is the package's rule for every value that only the data can show; it is written out,
with the validators that apply it, in :mod:`jax_attention._checks`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jax_attention._checks import (
    as_array_like,
    check_count,
    check_local_window_size,
    check_mask,
    check_static_bool,
    check_valid_lens,
    check_values_fit,
    check_values_in,
    is_integer_dtype,
)
from jax_attention.nn.precision import compute_dtype

__all__ = [
    "sequence_mask",
    "valid_lens_mask",
    "causal_mask",
    "local_window_mask",
    "combine_masks",
    "attention_mask",
    "masked_softmax",
    "masked_fill_value",
]


def _key_positions(num_keys: int, ndim: int) -> jax.Array:
    """``arange(S)`` shaped ``(1, ..., 1, S)`` with ``ndim`` axes, to compare against lengths
    without implicit rank promotion."""
    return jnp.arange(num_keys, dtype=jnp.int32).reshape((1,) * (ndim - 1) + (num_keys,))


def masked_fill_value(dtype) -> jax.Array:
    """The finite logit given to masked entries: the most negative value of ``dtype``.

    It only has to lose every ``max`` against a real score; masked entries are zeroed with
    ``where`` afterwards, so it never turns into a weight (unlike the book's ``-1e6``, which is
    ``-inf`` in float16 and a real, uniform weight in a fully masked row).

    Raises ``TypeError`` for a dtype that is not a real float.
    """
    try:
        is_float = jnp.issubdtype(dtype, jnp.floating)
    except TypeError:
        is_float = False
    if not is_float:
        raise TypeError(f"dtype must be a real float dtype (the scores' dtype), got {dtype!r}")
    return jnp.asarray(jnp.finfo(dtype).min, dtype=dtype)


def sequence_mask(X, valid_len, value=0):
    """Replace the entries of each row past its valid length with ``value`` — d2l §10.7.

    ``X[..., i, s] = value`` wherever ``s >= valid_len[..., i]``. Returns a new array.

    Args:
      X: array of shape ``(..., S)``, for example ``(B, S)`` as in the book.
      valid_len: integer array broadcastable to ``X.shape[:-1]``, for example ``(B,)``, with
        values in ``[0, S]`` (checked when concrete; traced values act as if clipped to
        ``[0, S]``, see the module docstring).
      value: the fill value (cast to ``X``'s dtype).

    Returns:
      An array of ``X``'s shape and dtype.

    Raises ``ValueError`` for ``X`` without an axis, for non-integer lengths, for lengths whose
    shape does not broadcast to ``X.shape[:-1]`` (naming both shapes; e.g. ``(1,)`` against
    ``X`` of shape ``(5,)``, which has no row axis) and, when concrete, outside ``[0, S]``.

    Example::

        >>> sequence_mask(jnp.ones((2, 3)), jnp.array([1, 2])).tolist()
        [[1.0, 0.0, 0.0], [1.0, 1.0, 0.0]]
        >>> sequence_mask(jnp.ones((2, 3)), jnp.array([1, 2]), value=-1.0)[0].tolist()
        [1.0, -1.0, -1.0]
    """
    X = jnp.asarray(X)
    if X.ndim < 1:
        raise ValueError(f"X must have at least one axis (..., S), got shape {X.shape}")
    valid_len = as_array_like(valid_len)
    lens_shape, lens_dtype = jnp.shape(valid_len), jnp.result_type(valid_len)
    if not is_integer_dtype(lens_dtype):
        raise ValueError(
            f"valid_len must hold integers, got dtype {lens_dtype} with shape {lens_shape}"
        )
    try:
        # Broadcasting must not add axes to X (the result keeps X's shape).
        if np.broadcast_shapes(lens_shape, X.shape[:-1]) != X.shape[:-1]:
            raise ValueError
    except ValueError:
        raise ValueError(
            f"valid_len must broadcast to X.shape[:-1] = {X.shape[:-1]}, got shape {lens_shape} "
            f"(X has shape {X.shape}, e.g. (B, S) with valid_len (B,))"
        ) from None
    check_values_in("valid_len", valid_len, 0, X.shape[-1], f"[0, S] = [0, {X.shape[-1]}]")
    lens = jnp.asarray(valid_len).astype(jnp.int32)
    lens = jnp.broadcast_to(lens, X.shape[:-1])
    keep = _key_positions(X.shape[-1], X.ndim) < lens[..., None]
    return jnp.where(keep, X, jnp.asarray(value, dtype=X.dtype))


def valid_lens_mask(valid_lens, num_queries: int, num_keys: int):
    """Boolean mask from d2l's ``valid_lens``: True where key ``s < valid_lens`` (attend).

    Args:
      valid_lens: ``None``, integer ``(B,)`` (one length per sequence, shared by all queries) or
        ``(B, T)`` (one length per query).
      num_queries: ``T``.
      num_keys: ``S``.

    Returns:
      ``None`` when ``valid_lens`` is ``None``, else a boolean array of shape ``(B, T, S)``.

    Raises ``ValueError`` for lengths of the wrong dtype or shape, or (when concrete) outside
    ``[0, S]``, and for sizes that are not integers ``>= 0``.
    """
    num_queries = check_count("num_queries", num_queries)
    num_keys = check_count("num_keys", num_keys)
    if valid_lens is None:
        return None
    lens = check_valid_lens(valid_lens, None, num_queries, num_keys)
    if lens.ndim == 1:
        lens = jnp.broadcast_to(lens[:, None], (lens.shape[0], num_queries))
    return _lens_keep(lens, num_keys)


def _lens_keep(lens, num_keys: int):
    """``s < lens[..., None]`` for checked int32 lengths ``(B,)`` or ``(B, T)``: ``(B, S)`` or
    ``(B, T, S)``."""
    return _key_positions(num_keys, lens.ndim + 1) < lens[..., None]


def _key_and_query_positions(num_queries: int, num_keys: int, offset):
    """``(arange(S)[None, :], arange(T)[:, None] + offset)`` as int32, the positions the causal
    and window masks compare; ``offset`` checked (an integer scalar fitting int32)."""
    offset = as_array_like(offset)
    if jnp.shape(offset) != () or not is_integer_dtype(jnp.result_type(offset)):
        raise TypeError(f"offset must be an integer scalar, got dtype {jnp.result_type(offset)} "
                        f"with shape {jnp.shape(offset)}")
    check_values_fit("offset", offset, "positions are int32", jnp.int32)
    rows = jnp.arange(num_queries, dtype=jnp.int32)[:, None] + jnp.asarray(offset).astype(jnp.int32)
    return jnp.arange(num_keys, dtype=jnp.int32)[None, :], rows


def causal_mask(num_queries: int, num_keys: int | None = None, *, offset: int = 0):
    """Lower-triangular mask: query ``t`` may attend key ``s`` iff ``s <= t + offset``.

    With ``offset=0`` and ``T == S`` this is the usual decoder self-attention mask (each position
    sees itself and the past). ``offset = S - T`` aligns the last query with the last key, as
    when ``T`` new queries attend a cache holding ``S`` keys.

    Args:
      num_queries: ``T >= 0``.
      num_keys: ``S >= 0``; defaults to ``T``.
      offset: position of query 0 relative to key 0 (an integer scalar, may be traced under jit).
        It is used as int32: a concrete NumPy or Python offset outside int32's range raises
        ``ValueError`` (a traced one cannot be checked).

    Returns:
      A boolean array of shape ``(T, S)``.

    Example::

        >>> causal_mask(3).astype(jnp.int32).tolist()
        [[1, 0, 0], [1, 1, 0], [1, 1, 1]]
        >>> causal_mask(2, 4, offset=2).astype(jnp.int32).tolist()   # 2 new queries, 4 cached keys
        [[1, 1, 1, 0], [1, 1, 1, 1]]
    """
    num_queries = check_count("num_queries", num_queries)
    num_keys = num_queries if num_keys is None else check_count("num_keys", num_keys)
    keys, rows = _key_and_query_positions(num_queries, num_keys, offset)
    return keys <= rows


def _positions(num_queries: int, num_keys: int):
    """``(arange(S)[None, :], arange(T)[:, None])`` as int32: offset 0, nothing to check."""
    return (jnp.arange(num_keys, dtype=jnp.int32)[None, :],
            jnp.arange(num_queries, dtype=jnp.int32)[:, None])


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
      offset: position of query 0 relative to key 0 (an integer scalar, may be traced under
        jit), as in :func:`causal_mask`.

    Returns:
      A boolean array of shape ``(T, S)``.

    Raises ``TypeError`` for a window that is not an int or a pair of ints, ``ValueError`` for a
    negative side.

    Example::

        >>> local_window_mask(4, 4, (1, 0)).astype(jnp.int32).tolist()   # itself and one before
        [[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1]]
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


def _window_keep(num_queries: int, num_keys: int, window):
    """:func:`local_window_mask` at offset 0 for a checked ``(left, right)``."""
    keys, rows = _positions(num_queries, num_keys)
    return (keys >= rows - window[0]) & (keys <= rows + window[1])


def group_heads(array, groups: int):
    """``(..., N | 1, T, X) -> (..., N / G | 1, G | 1, T, X)``: the head axis (third from the end)
    split into the key/value heads and the ``G = groups`` query heads that share each one, for
    grouped-query attention (query head ``n`` uses key/value head ``n // G``, as in ``jax.nn`` and
    PyTorch's ``enable_gqa``). A head axis of size 1 (broadcast over the heads) becomes two.
    Not part of the user-facing API (``__all__``): the scoring functions share it."""
    array = jnp.asarray(array)
    heads = array.shape[-3]
    split = (1, 1) if heads == 1 else (heads // groups, groups)
    return array.reshape(array.shape[:-3] + split + array.shape[-2:])


def ungroup_heads(array):
    """``(..., N_kv, G, T, X) -> (..., N_kv * G, T, X)``, the inverse of :func:`group_heads`."""
    array = jnp.asarray(array)
    return array.reshape(array.shape[:-4] + (array.shape[-4] * array.shape[-3],) + array.shape[-2:])


def combine_masks(*masks):
    """Logical AND of the masks that are not ``None`` (broadcasting); ``None`` if all are.

    Masks of fewer axes are aligned to the right (NumPy broadcasting), explicitly, so that strict
    rank promotion holds. Raises ``TypeError`` for a non-boolean mask and ``ValueError`` for
    shapes that do not broadcast together, naming ``masks[i]`` (the position among the arguments).
    """
    given = [(i, as_array_like(m)) for i, m in enumerate(masks) if m is not None]
    if not given:
        return None
    for i, m in given:
        if jnp.result_type(m) != jnp.bool_:
            raise TypeError(f"masks[{i}] must be boolean (True = attend), got dtype "
                            f"{jnp.result_type(m)} with shape {jnp.shape(m)}")
    shapes = [jnp.shape(m) for _, m in given]
    try:
        shape = np.broadcast_shapes(*shapes)
    except ValueError:
        got = ", ".join(f"masks[{i}] {s}" for (i, _), s in zip(given, shapes))
        raise ValueError(f"masks must broadcast together, got shapes {got}") from None
    return _and_all([jnp.asarray(m) for _, m in given])


def _and_all(masks):
    """The AND of boolean arrays that broadcast together (checked), aligned to the right
    explicitly (strict rank promotion); ``None`` for none."""
    combined = None
    for m in masks:
        if combined is None:
            combined = m
            continue
        rank = max(m.ndim, combined.ndim)
        m = m.reshape((1,) * (rank - m.ndim) + m.shape)
        combined = jnp.logical_and(combined.reshape((1,) * (rank - combined.ndim)
                                                    + combined.shape), m)
    return combined


def attention_mask(shape, valid_lens=None, *, mask=None, is_causal=False,
                   local_window_size=None):
    """The boolean attention mask for scores of ``shape`` ``(B, ..., T, S)``, or ``None``.

    Combines d2l's ``valid_lens`` (``(B,)`` or ``(B, T)``), a boolean ``mask`` broadcastable to
    ``shape``, with ``is_causal`` :func:`causal_mask` ``(T, S)`` and with
    ``local_window_size`` :func:`local_window_mask` ``(T, S)`` (as ``jax.nn`` composes them).
    Raises ``ValueError`` for lengths of the wrong shape, type or (when concrete) range;
    ``TypeError`` for a non-boolean mask and for an ``is_causal`` that is not a Python bool (a
    string, an int, an array, or a traced value: causality is static).

    Returns:
      ``None`` (attend everywhere) or a boolean array broadcastable to ``shape``.
    """
    shape = tuple(shape)
    is_causal = check_static_bool("is_causal", is_causal)
    if len(shape) < 2:
        raise ValueError(f"shape (of the attention scores) must be (..., T, S), got {shape}")
    if valid_lens is not None and len(shape) < 3:
        raise ValueError(
            f"valid_lens needs scores with a batch axis (B, ..., T, S), got shape {shape}")
    return attention_keep(
        shape, None if valid_lens is None else check_valid_lens(valid_lens, shape[0], *shape[-2:]),
        None if mask is None else check_mask(mask, shape), is_causal,
        None if local_window_size is None else check_local_window_size(local_window_size))


def attention_keep(shape, lens, mask, is_causal: bool, window):
    """:func:`attention_mask` of arguments checked already (int32 lengths, a boolean mask, a
    bool, a ``(left, right)`` window or ``None``): the one place the mask is built, below the
    checks. Not part of the user-facing API (``__all__``)."""
    T, S = shape[-2], shape[-1]
    parts = []
    if lens is not None:
        # One length per sequence gives a (B, 1, S) mask, not (B, T, S): neither it nor the
        # reductions over it cost a pass over the T x S scores. Lengths index the leading batch
        # axis and apply to every extra axis (e.g. heads).
        lens_mask = _lens_keep(lens[:, None] if lens.ndim == 1 else lens, S)
        parts.append(lens_mask[(slice(None),) + (None,) * (len(shape) - 3)])
    if mask is not None:
        parts.append(mask)
    if is_causal:
        parts.append(_causal_keep(T, S))
    if window is not None:
        parts.append(_window_keep(T, S, window))
    keep = _and_all(parts)
    # The scores' rank, so that strict rank promotion (jax_numpy_rank_promotion="raise") holds.
    return None if keep is None else keep.reshape((1,) * (len(shape) - keep.ndim) + keep.shape)


def _causal_keep(num_queries: int, num_keys: int):
    """:func:`causal_mask` at offset 0."""
    keys, rows = _positions(num_queries, num_keys)
    return keys <= rows


def masked_softmax(X, valid_lens=None, *, mask=None):
    """Softmax over the last axis that gives masked entries exactly zero weight — d2l §11.3.2.

    ``softmax(X)[..., t, s]`` restricted to the keys ``s`` that may be attended: the keys below
    ``valid_lens`` and where ``mask`` is True. A row with no key to attend has all-zero weights
    and finite gradients (not the book's uniform weights; see the module docstring). float16 and
    bfloat16 scores are normalised in float32 and the weights cast back, so half precision
    neither overflows nor loses the row sums.

    Args:
      X: scores of shape ``(B, ..., T, S)``, usually ``(B, T, S)``.
      valid_lens: ``None``, ``(B,)`` or ``(B, T)`` integers in ``[0, S]``; they apply to every
        extra axis ``...`` (for example every head).
      mask: boolean, broadcastable to ``X.shape``; True = attend.

    Returns:
      Weights of ``X``'s shape and dtype: each row sums to 1, or to 0 when fully masked (with
      ``S = 0`` every row is, and the weights are empty).

    Raises:
      ValueError: ``X`` with fewer than two axes; lengths or a mask of the wrong shape; lengths
        of a non-integer dtype or (when concrete) outside ``[0, S]``.
      TypeError: ``X`` that is not real numbers (bool, complex); a non-boolean mask.

    Example::

        >>> weights = masked_softmax(jnp.zeros((2, 2, 4)), jnp.array([2, 3]))
        >>> weights.shape
        (2, 2, 4)
        >>> weights[0, 0].tolist()
        [0.5, 0.5, 0.0, 0.0]
        >>> np.asarray(weights[1, 0]).round(3)
        array([0.333, 0.333, 0.333, 0.   ], dtype=float32)
    """
    X = jnp.asarray(as_array_like(X))
    if X.ndim < 2:
        raise ValueError(f"X must have shape (..., T, S), e.g. (B, T, S), got {X.shape}")
    if not (jnp.issubdtype(X.dtype, jnp.floating) or is_integer_dtype(X.dtype)):
        raise TypeError(f"X must hold real numbers (scores), got dtype {X.dtype} with shape {X.shape}")
    if not jnp.issubdtype(X.dtype, jnp.floating):
        X = X.astype(jnp.result_type(float))
    return softmax_where(X, attention_mask(X.shape, valid_lens, mask=mask))


def softmax_where(scores, keep):
    """The softmax over the last axis of ``scores`` restricted to the entries where ``keep`` is
    True — the one masked softmax of the package, which :func:`masked_softmax` and the attention
    functions call once their inputs are checked (as ``jax.nn.softmax(where=)``, zero rows aside).

    Masked logits get :func:`masked_fill_value`, so they lose every ``max``; the shift is the
    row's maximum, which carries no gradient (softmax is shift-invariant) and is finite even for a
    fully masked row; masked exponentials are zeroed with ``where`` (not multiplied), so NaN or Inf
    there never reaches a weight; a row that keeps nothing sums to 0 and gets all-zero weights.
    Half precision is normalised in float32 (:mod:`jax_attention.nn.precision`).

    Args:
      scores: float ``(..., T, S)``.
      keep: ``None`` (every entry kept: no ``where`` pass over the scores) or a boolean mask
        broadcastable to ``scores``.

    Returns:
      Weights of ``scores``' shape and dtype; rows sum to 1, or to 0 when fully masked.
    """
    if scores.shape[-1] == 0:
        return jnp.zeros(scores.shape, scores.dtype)  # no key: every row is fully masked
    dtype = compute_dtype(scores.dtype)
    logits = scores.astype(dtype)
    if keep is not None:
        logits = jnp.where(keep, logits, masked_fill_value(dtype))
    shift = lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))
    shift = jnp.where(jnp.isfinite(shift), shift, jnp.zeros((), dtype))
    exps = jnp.exp(logits - shift)
    if keep is not None:
        exps = jnp.where(keep, exps, jnp.zeros((), dtype))
    total = jnp.sum(exps, axis=-1, keepdims=True)
    weights = exps / jnp.where(total == 0, jnp.ones((), dtype), total)
    return weights.astype(scores.dtype)


def logsumexp_where(scores, keep):
    """``log sum_s exp(scores)`` over the entries of the last axis where ``keep`` is True
    (``(..., T)``, in the scores' compute dtype; ``-inf`` for a row that keeps nothing, with a
    zero gradient): :func:`softmax_where`'s normaliser, the ``lse`` the attention functions
    return. Not part of the user-facing API (``__all__``)."""
    dtype = compute_dtype(scores.dtype)
    logits = scores.astype(dtype)
    if keep is not None:
        logits = jnp.where(keep, logits, masked_fill_value(dtype))
    shift = lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))
    exps = jnp.exp(logits - shift)
    if keep is not None:
        exps = jnp.where(keep, exps, jnp.zeros((), dtype))
    total = jnp.sum(exps, axis=-1)
    attended = total > 0
    return jnp.where(attended, shift[..., 0] + jnp.log(jnp.where(attended, total, 1)), -jnp.inf)


def zero_unattended(keep, queries=None, *keys_values, heads: str = "own"):
    """The inputs with the queries that attend no key, and the keys and values that no query
    attends, set to zero — the package's one guard against NaN and Inf in padding.

    Their weights are exactly zero already, but ``0 * NaN`` and ``0 * Inf`` are NaN: NaN or Inf
    stored in padding would otherwise reach valid outputs through the weighted sum, and valid
    gradients through the backward pass of the score products and the projections.

    Args:
      keep: the boolean attention mask, broadcastable to the scores ``(B, ..., T, S)``.
      queries: ``(B, ..., T, d)`` or ``None`` (none to zero).
      keys_values: any number of ``(B, ..., S, d)`` arrays (keys, values).
      heads: how the inputs meet the mask's head axis (``-3``): ``"own"``, each has its own
        (or there is none); ``"grouped"``, the keys and values ``(B, ..., N_kv, 1, S, d)`` serve
        the ``G`` query heads of a mask ``(B, ..., N_kv, G, T, S)``
        (:func:`group_heads`): a key is attended when any head of its group attends it;
        ``"shared"``, the inputs ``(B, T, d)`` come before the head split of a mask
        ``(B, N, T, S)`` (multi-head attention): attended by any head.

    Returns:
      ``(queries, *keys_values)`` (``queries`` ``None`` if given so), each in its own dtype.
    """
    query_attends = jnp.any(keep, axis=-1, keepdims=True)  # (B, ..., T, 1)
    key_attended = jnp.swapaxes(jnp.any(keep, axis=-2, keepdims=True), -1, -2)  # (B, ..., S, 1)
    if heads == "grouped":
        key_attended = jnp.any(key_attended, axis=-3, keepdims=True)
    elif heads == "shared":
        query_attends, key_attended = jnp.any(query_attends, -3), jnp.any(key_attended, -3)
    elif heads != "own":
        raise ValueError(f"heads must be 'own', 'grouped' or 'shared', got {heads!r}")
    zeroed = [None if queries is None else
              jnp.where(query_attends, queries, jnp.zeros((), queries.dtype))]
    zeroed += [jnp.where(key_attended, x, jnp.zeros((), x.dtype)) for x in keys_values]
    return tuple(zeroed)
