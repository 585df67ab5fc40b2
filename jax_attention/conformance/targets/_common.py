"""Helpers shared by the targets: masks for the built-ins, the JAX run context, n/a reasons."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from jax_attention.conformance.cases import Case
from jax_attention.conformance.target import Implementation

#: The n/a reason of a built-in that gives a fully masked row uniform weights (``{name}``: its
#: label), as :func:`fully_masked_reason` words it.
FULLY_MASKED_UNIFORM = (
    "known difference: {name} gives a query that may attend no key uniform weights over all "
    "keys (it fills masked scores with a large negative number, in effect the book's -1e6); "
    "ours gives zero weights and a zero output, as docs/masking.md explains")


def fully_masked_reason(name: str) -> Callable[[Case], str | None]:
    """``not_applicable`` for a built-in that averages uniformly over a fully masked row."""

    def reason(case: Case) -> str | None:
        return FULLY_MASKED_UNIFORM.format(name=name) if "fully_masked_row" in case.tags else None

    return reason


def first_reason(*checks: Callable[[Case], str | None]) -> Callable[[Case], str | None]:
    """``not_applicable`` that gives the first reason any of ``checks`` gives."""

    def reason(case: Case) -> str | None:
        for check in checks:
            found = check(case)
            if found:
                return found
        return None

    return reason


def value_size_reason(name: str) -> Callable[[Case], str | None]:
    """``not_applicable`` for a built-in whose values must have the query/key size."""

    def reason(case: Case) -> str | None:
        value_size, query_size = case.inputs["values"].shape[-1], case.inputs["queries"].shape[-1]
        if value_size != query_size:
            return (f"{name} needs values of the query/key size (one head size for all "
                    f"three); the case has values of size {value_size}, queries {query_size}")
        return None

    return reason


def no_scale_reason(name: str) -> Callable[[Case], str | None]:
    """``not_applicable`` for a built-in without a ``scale`` argument (always ``1 / sqrt(d)``)."""

    def reason(case: Case) -> str | None:
        if case.config.get("scale") is not None:
            return (f"{name} has no scale argument (it always divides the scores by sqrt of the "
                    f"head size); the case scales them by {case.config['scale']}")
        return None

    return reason


def no_softcap_reason(name: str) -> Callable[[Case], str | None]:
    """``not_applicable`` for a built-in without logit soft-capping."""

    def reason(case: Case) -> str | None:
        if case.config.get("logit_softcap") is not None:
            return (f"{name} has no logit soft-capping (scores s -> c tanh(s / c)); the case caps "
                    f"them at c = {case.config['logit_softcap']}")
        return None

    return reason


def mha_heads(case: Case) -> tuple[int, int, int, int]:
    """``(N, N_kv, H, H_v)`` of a multi-head case: query and key/value heads, their sizes, read
    from the config and the kernels as the reference reads them."""
    N = case.config["num_heads"]
    H = case.params["W_q"].shape[1] // N
    N_kv = case.config.get("num_kv_heads") or case.params["W_k"].shape[1] // H
    return N, N_kv, H, case.params["W_v"].shape[1] // N_kv


def grouped_heads_reason(name: str) -> Callable[[Case], str | None]:
    """``not_applicable`` for a built-in that needs as many key/value heads as query heads (no
    grouped-query or multi-query attention): scoring cases with keys ``(B, N_kv, S, d)`` for
    queries ``(B, N, T, d)``, multi-head cases with ``num_kv_heads < num_heads``."""

    def reason(case: Case) -> str | None:
        if case.function == "multihead.multi_head_attention":
            N, N_kv, _, _ = mha_heads(case)
        elif case.inputs["queries"].ndim == 4:
            N, N_kv = case.inputs["queries"].shape[1], case.inputs["keys"].shape[1]
        else:
            return None
        if N_kv != N:
            return (f"{name} has no grouped-query attention: it needs as many key/value heads as "
                    f"query heads; the case has N = {N} query heads sharing N_kv = {N_kv}")
        return None

    return reason


def value_head_size_reason(name: str) -> Callable[[Case], str | None]:
    """``not_applicable`` for a multi-head built-in with one head size for queries, keys and
    values, on a case whose value heads ``H_v`` differ from the key heads ``H``."""

    def reason(case: Case) -> str | None:
        _, _, H, H_v = mha_heads(case)
        if H_v != H:
            return (f"{name} has one head size for queries, keys and values; the case has key "
                    f"heads of size {H} and value heads of size {H_v} (W_v "
                    f"{case.params['W_v'].shape}, W_o {case.params['W_o'].shape})")
        return None

    return reason


def window_of(config) -> tuple[int, int] | None:
    """A case's ``local_window_size`` as ``(left, right)`` (the JSON holds ``[left, right]``; an
    int ``w`` means ``(w, w)``), or ``None``: hashable, for a built-in's static argument."""
    window = config.get("local_window_size")
    if window is None:
        return None
    left, right = np.broadcast_to(np.asarray(window, dtype=np.int64), (2,))
    return int(left), int(right)


def local_window_keep(num_queries: int, num_keys: int, window: tuple[int, int]) -> np.ndarray:
    """The sliding window ``(T, S)`` as a boolean mask, True = attend: query ``t`` attends key
    ``s`` iff ``t - left <= s <= t + right`` (``jax.nn``'s rule). Built with NumPy here, not
    with the library under test."""
    left, right = window
    t, s = np.arange(num_queries)[:, None], np.arange(num_keys)[None, :]
    return (s >= t - left) & (s <= t + right)


@dataclass(frozen=True)
class Heads:
    """A dot-product case laid out with a batch and a head axis: queries ``(B, N, T, d)``, keys
    ``(B, N_kv, S, d)``, values ``(B, N_kv, S, v)`` — a case ``(B, T, d)`` gets ``N = 1``, an
    unbatched one ``(T, d)`` also ``B = 1`` — with its masks and bias ``(B | 1, N | 1, T, S)``.

    Attributes:
      keep: every mask folded in (True = attend), or ``None``.
      bias: the score bias, or ``None``.
      lengths: valid lengths ``(B,)`` left out of ``keep`` for a built-in that takes them.
      rank: the case's rank (2, 3 or 4), for :meth:`restore`.
    """

    queries: np.ndarray
    keys: np.ndarray
    values: np.ndarray
    keep: np.ndarray | None
    bias: np.ndarray | None
    lengths: np.ndarray | None
    rank: int

    @property
    def grouped(self) -> bool:
        """Fewer key/value heads than query heads."""
        return self.keys.shape[1] != self.queries.shape[1]

    def restore(self, array):
        """An output ``(B, N, T, v)`` (NumPy, JAX or PyTorch) in the case's layout."""
        return array if self.rank == 4 else array[:, 0] if self.rank == 3 else array[0, 0]


def heads(inputs: dict, config, *, fold_causal: bool, fold_window: bool,
          native_lengths: bool = False) -> Heads:
    """:class:`Heads` of a dot-product case's NumPy ``inputs``.

    ``fold_causal`` / ``fold_window`` put the causal mask / the sliding window into ``keep``
    (for a built-in that cannot take them with its mask); ``native_lengths`` leaves valid
    lengths ``(B,)`` out of ``keep``, in ``lengths``.
    """
    q, k, v = inputs["queries"], inputs["keys"], inputs["values"]
    rank = q.ndim

    def four(array):  # (T, X) | (B, T, X) | (B, N, T, X) -> (B, N, T, X)
        array = array.reshape((1,) * (rank - array.ndim) + array.shape)
        return array[None, None] if rank == 2 else array[:, None] if rank == 3 else array

    T, S = q.shape[-2], k.shape[-2]
    lens = inputs.get("valid_lens")
    if lens is not None and rank == 2:  # () or (T,) -> (1,) or (1, T)
        lens = lens[None]
    parts, lengths = [], None
    if lens is not None:
        if native_lengths and lens.ndim == 1:
            lengths = lens
        else:
            parts.append(valid_lens_keep(lens, T, S)[:, None])
    if inputs.get("mask") is not None:
        parts.append(four(inputs["mask"]))
    if fold_causal and config.get("is_causal", False):
        parts.append(np.tril(np.ones((T, S), dtype=bool))[None, None])
    if fold_window and window_of(config) is not None:
        parts.append(local_window_keep(T, S, window_of(config))[None, None])
    keep = None
    for part in parts:
        keep = part if keep is None else keep & part
    bias = inputs.get("bias")
    return Heads(four(q), four(k), four(v), keep, None if bias is None else four(bias), lengths,
                 rank)


def valid_lens_keep(valid_lens, num_queries: int, num_keys: int) -> np.ndarray:
    """d2l's valid lengths ``(B,)`` or ``(B, T)`` as a boolean mask ``(B, T, S)``, True = attend.

    Built with NumPy here rather than with the library under test, so that a built-in is fed a
    mask that does not depend on our code.
    """
    valid_lens = np.asarray(valid_lens)
    if valid_lens.ndim == 1:
        valid_lens = np.repeat(valid_lens[:, None], num_queries, axis=1)
    return np.arange(num_keys)[None, None, :] < valid_lens[:, :, None]


def keep_mask(inputs: dict, num_queries: int, num_keys: int, *, is_causal: bool = False,
              window: tuple[int, int] | None = None):
    """Everything that masks a case's scores — valid lengths, boolean mask and (optionally) the
    causal mask and a sliding window — as one boolean ``(B | 1, T, S)`` array, or ``None`` when
    nothing masks."""
    keep = np.ones((1, num_queries, num_keys), dtype=bool)
    masked = False
    if window is not None:
        keep = keep & local_window_keep(num_queries, num_keys, window)[None]
        masked = True
    if inputs.get("valid_lens") is not None:
        keep = keep & valid_lens_keep(inputs["valid_lens"], num_queries, num_keys)
        masked = True
    if inputs.get("mask") is not None:
        keep = keep & inputs["mask"]
        masked = True
    if is_causal:
        keep = keep & np.tril(np.ones((num_queries, num_keys), dtype=bool))[None]
        masked = True
    return keep if masked else None


def jax_setup(dtype: str, platform: str | None, precision: str):
    """The device, run context and environment of a JAX-based target.

    The context switches x64 on for float64 (off for float32), makes ``device`` the default and
    sets the default matmul precision; compilation happens inside it, so the precision reaches
    every matmul of every jitted function.

    Raises:
      RuntimeError: JAX has no such platform here.
    """
    import flax
    import jax
    import jaxlib

    try:
        device = jax.devices(platform)[0] if platform else jax.devices()[0]
    except RuntimeError as error:
        raise RuntimeError(f"JAX has no {platform!r} platform here: {error}") from None

    @contextlib.contextmanager
    def context():
        with jax.enable_x64(dtype == "float64"), jax.default_device(device), \
                jax.default_matmul_precision(precision):
            yield

    environment = {
        "platform": device.platform,
        "device": f"{device} ({device.device_kind})",
        "precision": f"JAX default matmul precision {precision!r}; x64 "
                     f"{'on' if dtype == 'float64' else 'off'}",
        "versions": f"jax {jax.__version__}, jaxlib {jaxlib.__version__}, flax {flax.__version__}",
    }
    return device, context, environment


def to_jax(tree, device):
    """NumPy arrays (already in the run's dtype) as JAX arrays on ``device``, nested dicts kept."""
    import jax

    return jax.device_put(tree, device)


def check_device(outputs: dict, device) -> dict:
    """Raise when an output was computed elsewhere than on the device under test."""
    for name, value in outputs.items():
        devices = getattr(value, "devices", None)
        if devices is not None and devices() != {device}:
            raise RuntimeError(f"output {name} is on {devices()}, expected {device}")
    return outputs


def standard_promotion():
    """The built-ins (jax.nn, Flax) mix dtypes internally (e.g. float32 logits for float64
    inputs), which JAX's strict dtype promotion — the test suite's setting — refuses; they are
    called under standard promotion and our own code under whatever the caller set."""
    import jax

    return jax.numpy_dtype_promotion("standard")


def softmax_where(label: str, softmax: Callable, device) -> Implementation:
    """A built-in ``softmax(X, axis=-1, where=keep)`` (``jax.nn.softmax``, or Flax's re-export)
    on the masked-softmax cases, every mask of the case given as ``where``, jit-compiled."""
    import jax

    compiled = jax.jit(lambda X, where: softmax(X, axis=-1, where=where))

    def run(case: Case, inputs: dict, params: dict) -> dict:
        X = inputs["X"]
        keep = keep_mask(inputs, X.shape[-2], X.shape[-1])
        keep = np.ones(X.shape, bool) if keep is None else np.broadcast_to(keep, X.shape)
        with standard_promotion():
            weights = compiled(*to_jax((X, keep), device))
        return check_device({"weights": weights}, device)

    return Implementation(label, run)


# --------------------------------------------------------------------------- the mods' cases
# A built-in without mods (jax.nn, Flax, PyTorch's SDPA) takes a mods case as a boolean mask and
# an additive bias. Both are evaluated here in NumPy on the whole grid, from the config's
# description of the mods (jax_attention.conformance.functions.build_mod) — written afresh rather
# than with reference_numpy.mods or the library under test, so that a built-in is fed arrays that
# depend on neither.


def _alibi_slopes(num_heads: int) -> np.ndarray:
    """ALiBi's slopes (Press et al. 2022, the paper's code): a power of two ``n`` gets
    ``2^(-8 i / n)``, ``i = 1..n``; another ``n`` those of the power of two below it, then every
    other slope of the power of two above."""
    def powers(n):
        return [2.0 ** (-8.0 * i / n) for i in range(1, n + 1)]

    below = 1 << (num_heads.bit_length() - 1)
    return np.asarray(powers(below) + powers(2 * below)[0::2][:num_heads - below])


def _t5_buckets(rel: np.ndarray, num_buckets: int, max_distance: int,
                bidirectional: bool) -> np.ndarray:
    """T5's bucket of ``rel = kv_idx - q_idx``, as Hugging Face's ``_relative_position_bucket``
    writes it."""
    bucket = np.zeros(rel.shape, np.int64)
    if bidirectional:
        num_buckets //= 2
        bucket += (rel > 0) * num_buckets
        n = np.abs(rel)
    else:
        n = np.maximum(-rel, 0)
    max_exact = num_buckets // 2
    with np.errstate(divide="ignore"):
        large = max_exact + (np.log(np.maximum(n, 1) / max_exact)
                             / np.log(max_distance / max_exact)
                             * (num_buckets - max_exact)).astype(np.int64)
    return bucket + np.where(n < max_exact, n, np.minimum(large, num_buckets - 1))


def _grids(inputs: dict):
    """``(b, h, q, kv)`` index grids broadcasting to ``(B, N, T, S)`` (``N = 1`` without heads)."""
    queries, keys = inputs["queries"], inputs["keys"]
    B = queries.shape[0]
    N = queries.shape[1] if queries.ndim == 4 else 1
    T, S = queries.shape[-2], keys.shape[-2]
    return (np.arange(B)[:, None, None, None], np.arange(N)[None, :, None, None],
            np.arange(T)[None, None, :, None], np.arange(S)[None, None, None, :])


def _four(array: np.ndarray) -> np.ndarray:
    """A mask or bias of a case's inputs, ``(B | 1, N | 1, T | 1, S | 1)``."""
    return array.reshape((1,) * (4 - array.ndim) + array.shape)


def _mask_of(spec: dict, inputs: dict, grids) -> np.ndarray:
    b, h, q, kv = grids
    name = spec["mod"]
    if name in ("and_masks", "or_masks"):
        parts = [_mask_of(part, inputs, grids) for part in spec["mods"]]
        combine = np.logical_and if name == "and_masks" else np.logical_or
        keep = parts[0]
        for part in parts[1:]:
            keep = combine(keep, part)
        return keep
    if name == "causal":
        return kv <= q + spec.get("offset", 0)
    if name == "sliding_window":
        return (kv >= q - spec["left"]) & (kv <= q + spec.get("right", 0))
    if name == "valid_lengths":
        lens = inputs["valid_lens"]
        return kv < (lens[b] if lens.ndim == 1 else lens[b, q])
    if name == "padding":
        keep = kv < inputs["kv_lens"][b]
        return keep & (q < inputs["q_lens"][b]) if "q_lens" in inputs else keep
    if name == "segment_ids":
        q_ids = inputs["q_segment_ids"]
        kv_ids = inputs.get("kv_segment_ids", q_ids)
        keep = q_ids[b, q] == kv_ids[b, kv]
        return keep & (q_ids[b, q] != spec["padding_id"]) if "padding_id" in spec else keep
    if name == "prefix_lm":
        return (kv <= q) | (kv < inputs["prefix_lens"][b])
    if name == "chunked_local":
        return q // spec["chunk_size"] == kv // spec["chunk_size"]
    if name == "global_tokens":
        return (q < spec["num_global"]) | (kv < spec["num_global"])
    if name == "dense_mask":
        return _four(inputs["mask"])
    raise ValueError(f"unknown mask mod {name!r}")


def _bias_of(spec: dict, inputs: dict, params: dict, grids) -> np.ndarray:
    b, h, q, kv = grids
    name = spec["mod"]
    if name == "compose_score_mods":  # additive mods compose by summing
        return sum(_bias_of(part, inputs, params, grids) for part in spec["mods"])
    if name == "bias":
        return _four(inputs["bias"])
    if name == "alibi":
        return _alibi_slopes(spec["num_heads"])[h] * (kv - q)
    if name == "clipped_relative_bias":
        table = params["clipped_relative_bias"]
        k = (table.shape[0] - 1) // 2
        return table[np.clip(kv - q, -k, k) + k, h % table.shape[1]]
    if name == "t5_relative_bias":
        table = params["t5_relative_bias"]
        rows = _t5_buckets(kv - q, table.shape[0], spec["max_distance"], spec["bidirectional"])
        return table[rows, h % table.shape[1]]
    raise ValueError(f"score mod {name!r} is not an additive bias")


def mods_heads(case: Case, inputs: dict, params: dict) -> Heads:
    """:class:`Heads` of a mods case's NumPy ``inputs`` and ``params``: its mask mod as ``keep``
    and its (additive) score mod as ``bias``, ``(B | 1, N | 1, T, S)``, evaluated on the whole
    grid."""
    h = heads({name: inputs[name] for name in ("queries", "keys", "values")}, {},
              fold_causal=False, fold_window=False)
    grids = _grids(inputs)
    T, S = inputs["queries"].shape[-2], inputs["keys"].shape[-2]
    keep = bias = None
    if case.config.get("mask_mod") is not None:
        keep = _mask_of(case.config["mask_mod"], inputs, grids)
        keep = np.broadcast_to(keep, keep.shape[:2] + (T, S)).copy()
    if case.config.get("score_mod") is not None:
        bias = np.asarray(_bias_of(case.config["score_mod"], inputs, params, grids),
                          dtype=inputs["queries"].dtype)
        bias = np.broadcast_to(bias, bias.shape[:2] + (T, S)).copy()
    return Heads(h.queries, h.keys, h.values, keep, bias, None, h.rank)


def _mod_names(spec) -> set[str]:
    if spec is None:
        return set()
    return {spec["mod"]}.union(*(_mod_names(part) for part in spec.get("mods", ())))


def mods_reason(name: str, *, sinks: bool = False) -> Callable[[Case], str | None]:
    """``not_applicable`` of a built-in that takes a mods case as a mask and an additive bias:
    a soft cap is no bias; and, unless ``sinks`` (it returns the log-sum-exp that adds them),
    it has no attention sinks."""

    def reason(case: Case) -> str | None:
        if case.function != "mods.dot_product_attention":
            return None
        if "softcap" in _mod_names(case.config.get("score_mod")):
            return (f"{name} takes a mask and an additive bias; the case's score mod soft-caps "
                    f"the scores (s -> c tanh(s / c)), which no bias expresses")
        if not sinks and "sinks" in case.params:
            return (f"{name} has no attention sinks (a logit per head joining each row's "
                    f"softmax with a zero value) and returns no log-sum-exp to add them with")
        return None

    return reason
