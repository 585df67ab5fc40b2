"""Argument validators shared by the modules of the package (a private module: its names are
public within ``jax_attention``, not to users).

Twin of :mod:`reference_numpy._checks`: the same names wherever both packages need them, so the
two files read side by side. Every validator raises ``ValueError``/``TypeError`` naming the
argument, the value or shape received and what was expected; the messages are part of the
package's behaviour (tests match them).

Checking values under ``jit``: shapes and dtypes are static and always checked (under ``jit``
and ``vmap`` alike). The *values* that only the data can show — valid lengths, token ids
(``[0, V)``), table indices, decoding positions — are checked whenever they are concrete (eager
calls, and constants closed over by a jitted function): :func:`check_values_in` raises
``ValueError``. When they are traced (arguments of a jitted or vmapped function) they cannot be
inspected; they are then *clipped* into their range (:func:`clip_values`), so the result stays
defined and finite — never the NaN of an out-of-bounds ``jnp.take``, never the wrap-around of a
negative NumPy index. Lengths are not clipped but compared: the mask ``s < valid_len`` acts as if
they were clipped to ``[0, S]`` (a negative length masks the whole row, with zero weights; a
length above ``S`` keeps all keys). Empty axes (``B``, ``T`` or ``S`` of size 0) give empty
results, and ``S = 0`` gives the zero output of a fully masked row.
"""

from __future__ import annotations

import numbers
import operator
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


# --------------------------------------------------------------------------- static scalars


def check_int(name: str, value, minimum: int, maximum: int | None = None, *,
              static: bool = False) -> int:
    """``value`` as a Python int in ``[minimum, maximum]`` (no upper bound when ``maximum`` is
    ``None``) — the package's one rule for integer arguments (sizes, counts, token ids, seeds).

    A Python or NumPy integer (anything with ``__index__``) is accepted, a bool never (``True``
    would be taken for 1). Anything else raises ``ValueError`` ``"{name} must be an integer >=
    {minimum}, got {value!r}"`` (with a maximum: ``"... an integer in [{minimum}, {maximum}]
    ..."``); ``static`` adds ``" (static)"`` after the bound, for the arguments that fix a
    compiled shape (decoding steps, beams, token ids).
    """
    try:
        number = None if isinstance(value, (bool, np.bool_)) else operator.index(value)
    except TypeError:
        number = None
    if number is None or number < minimum or (maximum is not None and number > maximum):
        bound = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        static_text = " (static)" if static else ""
        raise ValueError(f"{name} must be an integer {bound}{static_text}, got {value!r}")
    return number


def check_size(name: str, value) -> int:
    """A static size that must be positive (a width, a vocabulary, a number of layers)."""
    return check_int(name, value, 1)


def check_count(name: str, value) -> int:
    """A static size that may be 0 (a sequence length), as a Python int."""
    return check_int(name, value, 0)


def check_numbered(name: str, mapping, prefix: str) -> int:
    """The count ``L`` of a mapping that must hold exactly ``{prefix}_0 ... {prefix}_{L-1}``
    (GRU layers, Transformer blocks); ``ValueError`` naming ``name`` otherwise."""
    if not hasattr(mapping, "keys") or not mapping:
        raise ValueError(f"{name} must be a mapping '{prefix}_0', '{prefix}_1', ..., got "
                         f"{mapping!r}")
    names = [f"{prefix}_{i}" for i in range(len(mapping))]
    if sorted(mapping) != sorted(names):
        raise ValueError(f"{name} must hold exactly {names}, got {sorted(mapping)}")
    return len(names)


def check_dropout(dropout) -> float:
    """A dropout rate in ``[0, 1)`` (1 would drop everything and divide by zero)."""
    return check_rate("dropout", dropout)


def check_id(name: str, value) -> int:
    """A special token id (``bos_id``, ``eos_id``, ``pad_id``): a static integer ``>= 0``."""
    return check_int(name, value, 0, static=True)


def check_max_len(max_len) -> int:
    """The number of decoding steps: a static integer ``>= 1``."""
    return check_int("max_len", max_len, 1, static=True)


def check_max_len_fits(max_len, max_positions: int) -> int:
    """Decoding steps that fit a positional table of ``max_positions`` rows (the Transformer)."""
    max_len = check_size("max_len", max_len)
    if max_len > max_positions:
        raise ValueError(f"max_len = {max_len} decoding steps exceed the positional table's "
                         f"max_positions = {max_positions}")
    return max_len


def check_positions(name: str, length: int, max_positions: int, shape=None) -> None:
    """A sequence of ``length`` positions must fit the table of ``max_positions`` rows."""
    max_positions = check_int("max_positions", max_positions, 1)
    if length > max_positions:
        of_shape = "" if shape is None else f" ({name} has shape {tuple(shape)})"
        raise ValueError(f"{name} has {length} positions, more than the positional table's "
                         f"max_positions = {max_positions}{of_shape}")


def check_num_heads(num_hiddens: int | None, num_heads, context: str = "") -> None:
    """``num_heads`` an integer ``>= 1`` (:func:`check_int`) dividing ``num_hiddens``;
    ``context`` (e.g. the shape the width comes from) is added to the message."""
    num_heads = check_int("num_heads", num_heads, 1)
    if num_hiddens is not None and num_hiddens % num_heads:
        raise ValueError(
            f"num_hiddens must be divisible by num_heads, got num_hiddens={num_hiddens} and "
            f"num_heads={num_heads}" + (f" ({context})" if context else "")
        )


def check_num_kv_heads(num_heads: int, num_kv_heads) -> int:
    """``num_kv_heads`` (``None``: ``num_heads``) an integer ``>= 1`` (:func:`check_int`) dividing
    ``num_heads``: the key/value heads of grouped-query attention (1 = multi-query attention)."""
    if num_kv_heads is None:
        return num_heads
    num_kv_heads = check_int("num_kv_heads", num_kv_heads, 1)
    if num_heads % num_kv_heads:
        raise ValueError(f"num_kv_heads must divide num_heads = {num_heads}, got {num_kv_heads}")
    return num_kv_heads


def check_static_bool(name: str, value) -> bool:
    """A flag that fixes the structure of the computation (``is_causal``), as a Python bool.

    ``True``/``False`` and NumPy's ``np.bool_`` are accepted. Anything else raises ``TypeError``
    naming ``name`` and the type received: a string such as ``"False"``, an int or an array would
    otherwise be taken as true. A traced value (an argument of a jitted or vmapped function) is
    refused too, with the advice to make it static: the flag decides which mask is built while
    tracing, so it cannot depend on the data.
    """
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, jax.core.Tracer):
        raise TypeError(f"{name} must be a static Python bool (it decides the mask while tracing), "
                        f"got a traced value {value.aval}; pass it as a static argument "
                        f"(e.g. jax.jit(..., static_argnames='{name}'))")
    raise TypeError(f"{name} must be a Python bool (True or False), got {type(value).__name__} "
                    f"{value!r}")


class KeySet(NamedTuple):
    """The keys of a parameter dict nested in a larger one (a value of ``required`` in
    :func:`check_param_keys`): ``required`` always, ``optional`` (biases) when present."""

    required: tuple
    optional: tuple = ()


def check_param_keys(name: str, params, required, optional=()) -> None:
    """A parameter dict of the functional core must hold exactly the keys ``required`` and any of
    ``optional`` (biases that may be absent), so that a misspelled key (``"B_o"`` for ``"b_o"``)
    is an error rather than a parameter silently left out.

    ``required`` may be a mapping from each key to the keys of the dict stored under it
    (themselves a list, a :class:`KeySet` with optional keys, or such a mapping; ``None`` for an
    array), checked in turn as
    ``name['key']``. Raises ``ValueError`` naming ``name`` (or the nested entry), listing the
    unexpected and missing keys and the expected ones. Only the keys are looked at (no array is
    read), so the check costs nothing on the device, and under ``jit`` it runs once, at tracing.
    """
    if isinstance(required, KeySet):
        required, optional = required
    expected = list(required) + [key for key in optional if key not in required]
    wanted = f"the keys {expected}" if not optional else (
        f"the keys {list(required)} and optionally {list(optional)}")
    if not hasattr(params, "keys"):
        raise ValueError(f"{name} must be a mapping with {wanted}, got {type(params).__name__}")
    unexpected = sorted((key for key in params if key not in expected), key=repr)
    missing = [key for key in required if key not in params]
    if unexpected or missing:
        problems = ([f"unexpected keys {unexpected}"] if unexpected else []) + (
            [f"missing keys {missing}"] if missing else [])
        raise ValueError(f"{name} has {' and '.join(problems)}: expected {wanted}, got "
                         f"{sorted(params, key=repr)}")
    if hasattr(required, "items"):
        for key, keys in required.items():
            if isinstance(keys, KeySet):
                check_param_keys(f"{name}[{key!r}]", params[key], keys.required, keys.optional)
            elif keys is not None:
                check_param_keys(f"{name}[{key!r}]", params[key], keys)


def check_param_shapes(name: str, params, expected: dict, context: str = "") -> None:
    """Each array ``params[key]`` named in ``expected`` (keys ``params`` lacks are skipped: optional
    biases) has the shape ``expected[key]``, a tuple of ints and letters — a letter (``"D"``)
    stands for any size, read from another parameter. The package's one parameter-shape check:
    ``ValueError`` ``"{name}[key] must have shape (D, 8), got (8, 6){context}"``, where
    ``context`` says where the expected sizes come from. Only shapes are read, never values."""
    for key, shape in expected.items():
        if key not in params:
            continue
        got = tuple(jnp.shape(params[key]))
        if len(got) != len(shape) or any(isinstance(n, int) and n != g for n, g in zip(shape, got)):
            text = "(" + ", ".join(str(n) for n in shape) + ("," if len(shape) == 1 else "") + ")"
            raise ValueError(f"{name}[{key!r}] must have shape {text}, got {got}{context}")


# --------------------------------------------------------------------------- values of arrays


def _concrete(x):
    """``x`` as a NumPy array when its values are known now, else ``None`` (traced under jit/vmap)."""
    if isinstance(x, jax.core.Tracer):
        return None
    return np.asarray(x)


def as_array_like(x):
    """Lists and tuples as NumPy arrays, so their shape and dtype can be checked; arrays as they are."""
    return np.asarray(x) if isinstance(x, (list, tuple)) else x


def is_integer_dtype(dtype) -> bool:
    """An integer dtype, bool excluded."""
    return jnp.issubdtype(dtype, jnp.integer) and dtype != jnp.bool_


def check_values_in(name: str, x, lower: int, upper: int, interval: str) -> None:
    """The package's check of values only the data can show (lengths, token ids, indices).

    Concrete ``x`` (eager calls, constants closed over by a jitted function): ``ValueError``
    unless every value lies in ``[lower, upper]``, naming ``name``, the ``interval`` (e.g.
    ``"[0, V) = [0, 7)"``), the values found and the shape. Traced ``x``: nothing can be checked;
    the caller clips the values with :func:`clip_values` (or, for lengths, compares them so
    that they act clipped) and documents it. See the module docstring.
    """
    values = _concrete(x)
    if values is not None and values.size and (values.min() < lower or values.max() > upper):
        raise ValueError(
            f"{name} must lie in {interval}, got values from {values.min()} to {values.max()} "
            f"(shape {values.shape})"
        )


def check_values_fit(name: str, x, why: str, dtype=None) -> None:
    """Integers held on the host (a NumPy array or scalar, a list, a Python int) must fit the
    integer ``dtype`` they are about to be converted to — by default the one JAX converts them to
    (``int64`` becomes ``int32`` while ``jax_enable_x64`` is off) — because the conversion would
    wrap larger values around silently. ``ValueError`` naming ``name``, the smallest and largest
    values and ``why`` otherwise. JAX arrays (traced or not) are not read: traced values cannot be
    checked, and concrete ones are already in a JAX dtype; nothing is computed on the device.
    """
    if isinstance(x, (jax.Array, jax.core.Tracer)):
        return
    values = np.asarray(x)
    if not values.size or not is_integer_dtype(values.dtype):
        return
    info = np.iinfo(jax.dtypes.canonicalize_dtype(values.dtype) if dtype is None else dtype)
    low, high = values.min(), values.max()
    if low < info.min or high > info.max:
        raise ValueError(f"{name} must lie in [{info.min}, {info.max}] ({why}), got values from "
                         f"{low} to {high} (shape {values.shape})")


def clip_values(x, lower: int, upper: int) -> jax.Array:
    """``x`` as int32 clipped to ``[lower, upper]``: the defined result for traced values.

    A no-op for values that passed :func:`check_values_in`. It replaces what a gather would do
    with an index out of range: ``jnp.take`` fills floats with NaN, ``x[i]`` wraps negative ``i``
    around to the end and clamps the rest.
    """
    return jnp.clip(jnp.asarray(x).astype(jnp.int32), lower, upper)


def check_lengths(name: str, lengths, batch: int, maximum: int, letter: str) -> jax.Array:
    """One length per sequence: integers ``(B,)`` in ``[0, maximum]`` (values checked when
    concrete, see :func:`check_values_in`), as int32."""
    lengths = as_array_like(lengths)
    shape, dtype = jnp.shape(lengths), jnp.result_type(lengths)
    if not is_integer_dtype(dtype) or shape != (batch,):
        raise ValueError(f"{name} must hold integers of shape (B,) = ({batch},), got dtype {dtype} "
                         f"with shape {shape}")
    check_values_in(name, lengths, 0, maximum, f"[0, {letter}] = [0, {maximum}]")
    return jnp.asarray(lengths).astype(jnp.int32)


def check_valid_lens(valid_lens, batch: int | None, num_queries: int, num_keys: int) -> jax.Array:
    """``valid_lens`` ``(B,)`` or ``(B, T)`` (any ``B`` when ``batch`` is ``None``) as int32."""
    valid_lens = as_array_like(valid_lens)
    shape, dtype = jnp.shape(valid_lens), jnp.result_type(valid_lens)
    if not is_integer_dtype(dtype):
        raise ValueError(f"valid_lens must hold integers, got dtype {dtype} with shape {shape}")
    expected = (f"(B,) or (B, T) = (B, {num_queries})" if batch is None else
                f"(B,) = ({batch},) or (B, T) = ({batch}, {num_queries})")
    if batch is None and len(shape) in (1, 2):
        batch = shape[0]
    if shape not in ((batch,), (batch, num_queries)):
        raise ValueError(f"valid_lens must have shape {expected}, got {shape}")
    check_values_in("valid_lens", valid_lens, 0, num_keys, f"[0, S] = [0, {num_keys}]")
    # One index dtype whatever the caller passed, so comparisons never promote (x64 on or off).
    return jnp.asarray(valid_lens).astype(jnp.int32)


def check_mask(mask, shape) -> jax.Array:
    """A boolean ``mask`` (True = attend) broadcastable to the scores' ``shape`` ``(B, ..., T, S)``."""
    mask = as_array_like(mask)
    mask_shape, mask_dtype = jnp.shape(mask), jnp.result_type(mask)
    if mask_dtype != jnp.bool_:
        raise TypeError(
            f"mask must be boolean (True = attend), got dtype {mask_dtype} with shape {mask_shape}"
        )
    try:
        if np.broadcast_shapes(mask_shape, shape) != tuple(shape):
            raise ValueError
    except ValueError:
        raise ValueError(
            f"mask must broadcast to the scores' shape (B, ..., T, S) = {tuple(shape)}, "
            f"got shape {mask_shape}"
        ) from None
    return jnp.asarray(mask)


def check_tokens(name: str, tokens, vocab_size: int, ndim: int, batch: int | None = None):
    """Integer ids ``(B,)`` or ``(B, T)`` in ``[0, V)``, as int32 — the package's rule for ids.

    The dtype and shape are checked always (``ValueError``; ``batch``, when given, fixes ``B``).
    Values outside ``[0, V)`` raise ``ValueError`` when concrete; traced ones (under ``jit`` or
    ``vmap``) are clipped to ``[0, V - 1]``, so an embedding lookup never wraps a negative id
    around to the end of the table nor gives NaN (see the module docstring).
    """
    tokens = jnp.asarray(tokens)
    expected = ("(B,)" if ndim == 1 else "(B, T)") if batch is None else (
        f"(B,) = ({batch},)" if ndim == 1 else f"(B, T) = ({batch}, T)")
    if (tokens.ndim != ndim or not is_integer_dtype(tokens.dtype)
            or (batch is not None and tokens.shape[0] != batch)):
        raise ValueError(f"{name} must be integer token ids of shape {expected}, got dtype "
                         f"{tokens.dtype} with shape {tokens.shape}")
    check_values_in(name, tokens, 0, vocab_size - 1, f"[0, V) = [0, {vocab_size})")
    return clip_values(tokens, 0, vocab_size - 1)


# --------------------------------------------------------------------------- attention inputs


def num_kv_groups(queries_shape, keys_shape) -> int | None:
    """``G = N / N_kv``, the query heads per key/value head, for queries ``(B, ..., N, T, q)`` and
    keys ``(B, ..., N_kv, S, k)`` that differ only in ``N_kv`` dividing ``N`` (rank >= 4, the
    head axis just before the sequence axis); 1 when their batch axes are equal; ``None`` when
    they do not fit either way."""
    queries_shape, keys_shape = tuple(queries_shape), tuple(keys_shape)
    if len(queries_shape) != len(keys_shape):
        return None
    if queries_shape[:-2] == keys_shape[:-2]:
        return 1
    if (len(queries_shape) < 4 or queries_shape[:-3] != keys_shape[:-3] or keys_shape[-3] < 1
            or queries_shape[-3] % keys_shape[-3]):
        return None
    return queries_shape[-3] // keys_shape[-3]


def check_scale(scale) -> float | None:
    """``scale=`` of the dot-product scores (``None``: ``1 / sqrt(d)``): a finite real number or
    a 0-d array of one, as a Python float (static, as in ``jax.nn``); ``TypeError`` for a bool, a
    string or an array of another shape, or a traced value, ``ValueError`` for NaN or Inf."""
    if scale is None:
        return None
    if isinstance(scale, jax.core.Tracer):
        raise TypeError(f"scale must be a static number (it is part of the compiled computation, "
                        f"as in jax.nn), got a traced value {scale.aval}")
    if not isinstance(scale, numbers.Real) and hasattr(scale, "__array__"):
        scale = np.asarray(scale)
        if scale.shape != () or scale.dtype.kind not in "iuf":
            raise TypeError(f"scale must be a real number (or None for 1 / sqrt(d)), got an array "
                            f"of dtype {scale.dtype} with shape {scale.shape}")
        scale = scale.item()
    if isinstance(scale, (bool, np.bool_)) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale must be a real number (or None for 1 / sqrt(d)), got "
                        f"{type(scale).__name__} {scale!r}")
    scale = float(scale)
    if not np.isfinite(scale):
        raise ValueError(f"scale must be finite, got {scale!r}")
    return scale


def check_logit_softcap(logit_softcap) -> float | None:
    """``logit_softcap=`` (``None``: no capping): a finite number ``c > 0``, as a Python float;
    the scores become ``c * tanh(s / c)``. ``TypeError`` for a non-number, ``ValueError`` for
    ``c <= 0``, NaN or Inf."""
    if logit_softcap is None:
        return None
    if isinstance(logit_softcap, (bool, np.bool_)) or not isinstance(logit_softcap, numbers.Real):
        raise TypeError(f"logit_softcap must be a positive number (or None), got "
                        f"{type(logit_softcap).__name__} {logit_softcap!r}")
    if not (np.isfinite(logit_softcap) and logit_softcap > 0):
        raise ValueError(f"logit_softcap must be a finite number > 0, got {logit_softcap!r}")
    return float(logit_softcap)


def check_sinks(sinks, scores_shape) -> jax.Array | None:
    """``sinks=`` (``None``: none): learned attention-sink logits, one per query head — float
    ``(N,)`` for scores of ``scores_shape`` ``(B, ..., N, T, S)``, or ``()`` (also without a head axis);
    each joins every row's softmax denominator as a key with a zero value. ``TypeError`` for a
    non-float, ``ValueError`` for another shape, naming both shapes."""
    if sinks is None:
        return None
    sinks = as_array_like(sinks)
    shape, dtype = jnp.shape(sinks), jnp.result_type(sinks)
    if not jnp.issubdtype(dtype, jnp.floating):
        raise TypeError(f"sinks must be float logits, got dtype {dtype} with shape {shape}")
    heads = tuple(scores_shape[-3:-2]) if len(scores_shape) >= 4 else ()
    if shape not in ((), heads):
        raise ValueError(f"sinks must have shape () or (N,) = {heads} (one logit per query head) "
                         f"for scores (B, ..., N, T, S) = {tuple(scores_shape)}, got {shape}")
    return jnp.asarray(sinks)


def check_local_window_size(local_window_size) -> tuple[int, int] | None:
    """``local_window_size=`` (``None``: no window) as ``(left, right)``: an int ``w`` means
    ``(w, w)``; query ``t`` may attend keys ``t - left <= s <= t + right`` (``jax.nn``'s rule).
    Both must be integers ``>= 0`` (static: they decide the mask while tracing); ``TypeError``
    for anything else than an int or a pair, ``ValueError`` for a negative one."""
    if local_window_size is None:
        return None
    def is_int(x):
        return isinstance(x, (numbers.Integral, np.integer)) and not isinstance(x, (bool, np.bool_))
    if is_int(local_window_size):
        pair = (local_window_size, local_window_size)
    elif isinstance(local_window_size, (tuple, list)) and len(local_window_size) == 2 \
            and all(is_int(x) for x in local_window_size):
        pair = tuple(local_window_size)
    else:
        raise TypeError(f"local_window_size must be an int w (= (w, w)) or a pair of ints "
                        f"(left, right), got {type(local_window_size).__name__} "
                        f"{local_window_size!r}")
    if min(pair) < 0:
        raise ValueError(f"local_window_size must be >= 0 on both sides (left, right), got "
                         f"{local_window_size!r}")
    return int(pair[0]), int(pair[1])


def check_unbatched(queries, keys, values, valid_lens):
    """Unbatched inputs of the scoring functions — queries ``(T, q)``, keys ``(S, k)``, values
    ``(S, v)`` — given a batch axis of 1: returns ``(unbatched, queries, keys, values,
    valid_lens)``, where ``valid_lens`` of an unbatched call must be ``()`` (one length for every
    query) or ``(T,)`` (one per query) and becomes ``(1,)`` or ``(1, T)``. Inputs with a batch
    axis come back as they are (``unbatched`` False). Masks and biases need nothing: they are
    aligned to the right, so ``(T, S)`` broadcasts either way."""
    if jnp.ndim(queries) != 2:
        return False, queries, keys, values, valid_lens
    for name, array in (("keys", keys), ("values", values)):
        if array is not None and jnp.ndim(array) != 2:
            size = "S, k" if name == "keys" else "S, v"
            raise ValueError(f"queries {jnp.shape(queries)} are unbatched (T, q), so {name} must "
                             f"be ({size}) too, got {jnp.shape(array)}")
    if valid_lens is not None:
        valid_lens = as_array_like(valid_lens)
        shape = jnp.shape(valid_lens)
        if shape not in ((), (jnp.shape(queries)[0],)):
            raise ValueError(f"valid_lens of unbatched queries (T, q) = {jnp.shape(queries)} must "
                             f"have shape () or (T,) = ({jnp.shape(queries)[0]},), got {shape}")
        valid_lens = jnp.asarray(valid_lens)[None]
    return (True, jnp.asarray(queries)[None], jnp.asarray(keys)[None],
            None if values is None else jnp.asarray(values)[None], valid_lens)


def check_attention_inputs(queries, keys, values=None, *, same_depth: bool,
                           grouped_heads: bool = False):
    """Queries ``(B, ..., T, q)``, keys ``(B, ..., S, k)`` and values ``(B, ..., S, v)`` of the
    scoring functions: shapes, and one float dtype (integers become floats); returns the list of
    float arrays. ``same_depth``: dot-product scores, which need ``q == k >= 1``.
    ``grouped_heads``: keys and values may have fewer heads than the queries — with a head axis
    (rank >= 4), queries ``(B, ..., N, T, q)`` and keys ``(B, ..., N_kv, S, k)`` with ``N_kv``
    dividing ``N`` (grouped-query attention; ``N_kv = 1`` is multi-query attention)."""
    arrays = {"queries": jnp.asarray(queries), "keys": jnp.asarray(keys)}
    if values is not None:
        arrays["values"] = jnp.asarray(values)
    for name, a in arrays.items():
        if a.ndim < 3:
            raise ValueError(f"{name} must have shape (B, ..., len, size), got {a.shape}")
        if not (jnp.issubdtype(a.dtype, jnp.floating) or jnp.issubdtype(a.dtype, jnp.integer)):
            raise TypeError(f"{name} must be numeric, got dtype {a.dtype} with shape {a.shape}")
    q, k = arrays["queries"], arrays["keys"]
    if not (k.ndim == q.ndim and (k.shape[:-2] == q.shape[:-2] or (
            grouped_heads and num_kv_groups(q.shape, k.shape) is not None))):
        grouped = (" (or, for grouped-query attention, (B, ..., N_kv, S, k) with N_kv dividing "
                   "the queries' N heads: (B, ..., N, T, q))" if grouped_heads else "")
        raise ValueError(
            f"queries (B, ..., T, q) and keys (B, ..., S, k) must share their batch axes"
            f"{grouped}, got queries {q.shape} and keys {k.shape}"
        )
    if same_depth and q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"queries and keys must have the same size for dot-product scores, got queries "
            f"{q.shape} (size {q.shape[-1]}) and keys {k.shape} (size {k.shape[-1]})"
        )
    if same_depth and q.shape[-1] == 0:
        # The scores would be 0 / sqrt(0): NaN weights rather than an error.
        raise ValueError(
            f"queries and keys must have a size d >= 1 for scaled dot-product scores, got queries "
            f"{q.shape} and keys {k.shape}"
        )
    if values is not None:
        v = arrays["values"]
        if v.ndim != k.ndim or v.shape[:-1] != k.shape[:-1]:
            raise ValueError(
                f"keys (B, ..., S, k) and values (B, ..., S, v) must have the same batch axes and "
                f"length S, got keys {k.shape} and values {v.shape}"
            )
    floats = []
    for a in arrays.values():
        floats.append(a if jnp.issubdtype(a.dtype, jnp.floating)
                      else a.astype(jnp.result_type(float)))
    arrays = floats
    mixed = False
    for a in arrays[1:]:
        mixed = mixed or a.dtype != arrays[0].dtype
    if mixed:
        names = ", ".join(f"{name} {a.dtype}" for name, a in zip(("queries", "keys", "values"), arrays))
        raise TypeError(f"queries, keys and values must share one float dtype, got {names}")
    return arrays


# --------------------------------------------------------------------------- settings
# The rules of the run settings (jax_attention.models.configs), by the name a config field's metadata
# gives: ("int", minimum), ("int_or_none", minimum), ("rate",), ("positive_float",), ("bool",),
# ("choice", strings).


def check_rate(name: str, value) -> float:
    """A rate in ``[0, 1)`` (dropout, a held-out fraction), as a Python float."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= value < 1:
        raise ValueError(f"{name} must be a number with 0 <= {name} < 1, got {value!r}")
    return float(value)


def check_positive_float(name: str, value) -> float:
    """A finite number ``> 0`` (a learning rate), as a Python float."""
    if (isinstance(value, bool) or not isinstance(value, numbers.Real)
            or not (np.isfinite(value) and value > 0)):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def check_bool(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return value


def check_setting(name: str, value, rule: tuple):
    """``value`` checked by ``rule`` (see above) and normalised (a Python int, float or bool);
    raises ``ValueError`` naming ``name``."""
    kind, *arguments = rule
    if kind == "int_or_none":
        return None if value is None else check_int(name, value, *arguments)
    checks = {"int": check_int, "int_range": check_int, "rate": check_rate,
              "positive_float": check_positive_float, "bool": check_bool,
              "choice": check_choice}
    if kind not in checks:
        raise ValueError(f"unknown setting rule {rule!r} for {name}")
    return checks[kind](name, value, *arguments)


# --------------------------------------------------------------------------- implementation choice

ATTENTION_IMPLEMENTATIONS = ("plain", "chunked")


def check_implementation(implementation) -> str | None:
    """``implementation=`` of ``scoring.dot_product_attention``: ``None`` (choose by size) or one
    of :data:`ATTENTION_IMPLEMENTATIONS`; anything else raises ``ValueError`` naming it."""
    if implementation is None or (isinstance(implementation, str)
                                  and implementation in ATTENTION_IMPLEMENTATIONS):
        return implementation
    raise ValueError(f"implementation must be None, 'plain' or 'chunked', got {implementation!r}")


# --------------------------------------------------------------------------- choices


def check_choice(name: str, value, choices) -> str:
    """``value`` one of the strings ``choices``; ``ValueError`` naming ``name`` and listing them
    otherwise."""
    choices = tuple(choices)
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
    return value
