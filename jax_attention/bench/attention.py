"""``jax-attention bench attention``: scaled dot-product attention against the built-ins.

Peers, each fed its native layout (the transposes are made once, outside the timed calls):

* ``ours`` — :func:`jax_attention.nn.scoring.dot_product_attention` with its default dispatch
  (``implementation=None``: plain or chunked by size, see
  :func:`jax_attention.nn.scoring.dot_product_implementation`), heads-first ``(B, N, T, H)``,
  padding as ``valid_lens``, a sliding window as ``local_window_size``;
* ``ours_plain`` — the same with ``implementation="plain"`` (whole ``T x S`` scores);
* ``ours_efficient`` — :func:`jax_attention.nn.efficient.dot_product_attention` (chunked,
  online softmax: what ``implementation="chunked"`` runs), same layout and arguments;
* ``ours_efficient_dense`` — the same kernel with the case's mask as a dense boolean ``mask``
  ``(B | 1, 1, T | 1, S)`` (padding, documents, chunks and the window's band ANDed): what the
  kernel costs when it cannot skip a block, against ``ours_efficient``'s mask functions;
* ``jax.nn`` — :func:`jax.nn.dot_product_attention`, ``(B, T, N, H)``, padding as
  ``key_value_seq_lengths``, a window as its own ``local_window_size``;
* ``flax.nnx`` — :func:`flax.nnx.dot_product_attention`, ``(B, T, N, H)``, padding as a boolean
  ``mask`` ``(B, 1, 1, S)``; with a window, that mask AND the ``(T, S)`` band: ``(B, 1, T, S)``;
* ``torch`` — ``torch.nn.functional.scaled_dot_product_attention``, ``(B, N, T, H)``, padding as
  a boolean ``attn_mask`` ``(B, 1, 1, S)`` (with a window, ``(B, 1, T, S)`` as Flax's); forward
  under ``torch.inference_mode``, backward with ``torch.autograd.grad``;
* ``numpy`` — :func:`reference_numpy.scoring.dot_product_attention` in float64, forward only (it
  is also the forward reference the errors are measured against), with ``local_window_size``.

Structured masks (``masks``): ``"documents"`` packs :data:`DOCUMENTS` documents of equal length
into each row, attended only within themselves (segment ids; FlexAttention's document mask),
``"chunks"`` attends within fixed chunks of :data:`CHUNK` positions (chunked-local attention).
Our peers take them as mask functions (:func:`jax_attention.nn.mods.segment_ids`,
:func:`~jax_attention.nn.mods.chunked_local`), from which the chunked kernel skips the blocks
they rule out; every other peer gets the same mask as a dense boolean array.

Sliding windows (``local_window_sizes``, jax.nn's rule: query ``t`` attends keys
``t - left <= s <= t + right``): every (shape, mask) case runs once per window, ``None`` meaning
no window, so that a windowed attention is measured against the same without one. Only our
chunked kernel skips the key blocks outside the window; the others mask the whole ``T x S``
scores. With padding, a window can leave a query attending no key (past the padding by more
than ``left``); the peers' conventions differ there (zeros, or the mean of every value), so
those query rows are left out of the output error and get a zero cotangent (as a training loss
ignores padded positions), and the case records how many there were.

Each JAX peer's forward and forward+backward (the gradients of ``sum(output * cotangent)`` with
respect to queries, keys and values, one cotangent shared by every peer) are jitted once. All
peers are timed interleaved (:func:`~jax_attention.bench.common.time_interleaved`) and reported
as medians, effective GFLOP/s (``4·B·N·T·S·H`` flops forward, three times that with the
backward pass, whatever the mask or the window skips: the dense count; a windowed case also
records ``window_flops``, the count of only the ``(t, s)`` pairs inside the window), the
percentage of a float32 GEMM ceiling measured in the same run, the time ratios to ``jax.nn`` and
``torch``, and the largest absolute error of the output and of the gradients against float64.

A peer whose timed rounds would take longer than ``budget_s`` at a shape (NumPy at
``T = S = 8192``, say) is measured once for its error and recorded as skipped with the estimate,
never dropped silently. The default budget, 60 s, keeps every compiled peer at the default shapes
on a busy two-core machine (30–50 s each at ``T = 8192`` with a load average of 6, where a 30 s
budget dropped jax.nn, Flax and torch); NumPy at ``T = 8192`` is at the limit (50–85 s measured,
depending on the load), so whether it is timed there depends on the machine, and the record says
which.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

import numpy as np

from jax_attention.bench.attention_peers import (PEERS, Peer, build_peers, float64_grads,
                                                forward_backward, keep_mask, numpy_peer,
                                                window_band, window_note)
from jax_attention.bench.common import (environment, format_environment, format_table,
                                        gemm_ceiling, load_average, source_fingerprint, summarize,
                                        time_interleaved)

__all__ = ["PEERS", "DEFAULT_SHAPES", "MASKS", "DEFAULT_MASKS", "DOCUMENTS", "CHUNK", "DTYPES",
           "attention_flops", "window_pairs", "window_band", "padding_lens", "Structure",
           "structure", "forward_backward", "bench_attention", "format_attention",
           "format_sources"]

#: The default ``(B, N, T, H)`` shapes (batch, heads, sequence length ``T = S``, head size), from
#: many short sequences to one long one; ``B·N·T²`` is 1M, 8M, 32M, 64M.
DEFAULT_SHAPES = ((8, 8, 128, 64), (4, 8, 512, 64), (1, 8, 2048, 64), (1, 1, 8192, 64))
#: The masking cases: ``"none"`` (every key attended), ``"padding"`` (per-row valid key lengths
#: from :func:`padding_lens`, about 25% padded), ``"documents"`` and ``"chunks"`` (see the module
#: docstring); :data:`DEFAULT_MASKS` (``--mask both``) runs the first two.
MASKS = ("none", "padding", "documents", "chunks")
#: The masking cases run by default (``--mask both``): without a mask and with padding.
DEFAULT_MASKS = ("none", "padding")
#: Documents per row of the ``"documents"`` case, and the chunk of the ``"chunks"`` case.
DOCUMENTS, CHUNK = 8, 512
#: The input dtypes of the compiled peers (NumPy always computes in float64, on inputs rounded to
#: this dtype); the choices of ``--dtype``.
DTYPES = ("float32", "bfloat16")
PADDING_FRACTION = 0.25
# The peers the ratios are taken against: the built-ins a user would otherwise call.
BASELINES = ("jax.nn", "torch")
# Our code under test, fingerprinted at the start and the end of a run.
SOURCES = ("jax_attention.nn.scoring", "jax_attention.nn.efficient", "jax_attention.nn.masking",
           "jax_attention.nn.mods")


def attention_flops(B: int, N: int, T: int, S: int, H: int, *, backward: bool = False) -> int:
    """Effective flops: ``2·T·S·H`` for ``Q K^T`` and as many for ``weights V``, per batch and
    head; the backward pass counts twice the forward (four matmuls of the same size)."""
    forward = 4 * B * N * T * S * H
    return 3 * forward if backward else forward


def window_pairs(T: int, S: int, window: tuple[int, int] | None) -> int:
    """How many ``(t, s)`` pairs of the ``T x S`` scores the window ``(left, right)`` keeps
    (``t - left <= s <= t + right``); ``T·S`` without a window. Padding is not subtracted (nor
    is it from the dense count)."""
    if window is None:
        return T * S
    left, right = window
    t = np.arange(T, dtype=np.int64)
    first = np.maximum(t - left, 0)
    last = np.minimum(t + right, S - 1)
    return int(np.maximum(last - first + 1, 0).sum())


def check_window(window) -> tuple[int, int] | None:
    """A window as the benchmark records it: ``None``, or ``(left, right)`` from an int ``w``
    (``(w, w)``) or a pair of integers ``>= 0``; ``ValueError`` otherwise."""
    from jax_attention._checks import check_local_window_size

    try:
        return check_local_window_size(window)
    except (TypeError, ValueError) as error:
        raise ValueError(f"local_window_sizes: {error}") from None


def padding_lens(batch: int, num_keys: int, rng: np.random.Generator,
                 fraction: float = PADDING_FRACTION) -> np.ndarray:
    """Valid key lengths ``(B,)`` whose mean padding is ``fraction`` of ``num_keys``.

    Spread evenly between ``2·fraction`` padding and none (so batches differ, as real padding
    does) and shuffled; with ``B = 1`` the single length pads exactly ``fraction``. Every length
    is at least 1, so no query row is fully masked (where the peers' conventions differ) unless
    a sliding window also masks it (see :func:`bench_attention`).
    """
    padded = 2 * fraction * (np.arange(batch) + 0.5) / batch  # mean = fraction
    lens = np.clip(np.round(num_keys * (1 - padded)), 1, num_keys).astype(np.int32)
    return rng.permutation(lens)


class Structure(NamedTuple):
    """A structured mask case: its ``keep`` as a dense boolean ``(1, 1, T, S)`` array (True =
    attend) and ``mask_mod()``, the same mask as a :mod:`jax_attention.nn.mods` function."""

    keep: np.ndarray
    mask_mod: Callable


def structure(mask: str, T: int) -> Structure | None:
    """The :class:`Structure` of a ``"documents"`` or ``"chunks"`` case at ``T = S``; ``None``
    for ``"none"`` and ``"padding"``. Documents: :data:`DOCUMENTS` of ``T / DOCUMENTS``
    positions each (the last one takes the remainder), as segment ids."""
    if mask not in ("documents", "chunks"):
        return None
    positions = np.arange(T)
    if mask == "documents":
        ids = np.minimum(positions // max(T // DOCUMENTS, 1), DOCUMENTS - 1).astype(np.int32)
        keep = ids[:, None] == ids[None, :]

        def mask_mod():
            from jax_attention.nn import mods
            return mods.segment_ids(ids[None])
    else:
        keep = positions[:, None] // CHUNK == positions[None, :] // CHUNK

        def mask_mod():
            from jax_attention.nn import mods
            return mods.chunked_local(CHUNK)
    return Structure(keep[None, None], mask_mod)


# --------------------------------------------------------------------------- the benchmark


def _max_error(got, expected, rows=None) -> float:
    """Largest ``|got - expected|``; ``rows`` (broadcastable to ``(B, N, T, 1)``, or ``None`` for
    all): only the query rows where it is True count."""
    difference = np.abs(np.asarray(got) - np.asarray(expected))
    if rows is not None:
        difference = np.where(rows, difference, 0.0)
    return float(np.max(difference))


def _check_shapes(shapes) -> list[tuple[int, int, int, int]]:
    checked = []
    for shape in shapes:
        shape = tuple(shape)
        if len(shape) != 4 or not all(isinstance(n, (int, np.integer)) and n > 0 for n in shape):
            raise ValueError(f"a shape must be four positive integers (B, N, T, H), got {shape}")
        checked.append(tuple(int(n) for n in shape))
    if not checked:
        raise ValueError("shapes must name at least one (B, N, T, H)")
    return checked


def _check_arguments(shapes, peers, masks, dtype, repeats, warmup, budget_s,
                     local_window_sizes) -> tuple[list, list, list, list]:
    """:func:`bench_attention`'s arguments checked (``ValueError`` naming the bad one), before
    any work: ``(shapes, peers, masks, windows)``, the last three without repeats."""
    shapes = _check_shapes(shapes)
    peers = list(dict.fromkeys(peers))
    unknown = [p for p in peers if p not in PEERS]
    if unknown or not peers:
        raise ValueError(f"peers must be a non-empty subset of {', '.join(PEERS)}, got {peers}")
    masks = list(dict.fromkeys(masks))
    if not masks or any(m not in MASKS for m in masks):
        raise ValueError(f"masks must be a non-empty subset of {', '.join(MASKS)}, got {masks}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if repeats < 5:
        raise ValueError(f"repeats must be >= 5 for a median worth reporting, got {repeats}")
    if warmup < 0 or not budget_s > 0:
        raise ValueError(f"need warmup >= 0 and budget_s > 0, got {warmup} and {budget_s}")
    if (isinstance(local_window_sizes, (str, bytes))
            or not isinstance(local_window_sizes, Iterable)):
        raise ValueError(f"local_window_sizes must be a sequence of windows (None, w or (left, "
                         f"right)), got {local_window_sizes!r}")
    windows = list(dict.fromkeys(check_window(w) for w in local_window_sizes))
    if not windows:
        raise ValueError("local_window_sizes must name at least one window (None: no window)")
    return shapes, peers, masks, windows


#: What the figures of a record mean, in its ``settings``.
SETTINGS_NOTES = {
    "interleaving": "each round calls every timed function once, in a new random order (seeded)",
    "flops": "4·B·N·T·S·H forward, 3× that forward+backward: the dense count (effective: the "
             "same whatever the mask or the window skips; GFLOP/s and % of ceiling use it); "
             "window_flops: 4·B·N·H·(the (t, s) pairs inside the window) forward, 3× that "
             "forward+backward, padding not subtracted",
    "ratios": "this peer's median time / the baseline's (> 1: slower)",
    "errors": "max |peer - float64 reference| over the output (forward) and over dq, dk, dv "
              "(forward_backward); the query rows that the padding and the window leave no key "
              "(queries_without_keys) are left out of the output's and get a zero cotangent",
}


def bench_attention(shapes: Iterable[Sequence[int]] = DEFAULT_SHAPES, *,
                    peers: Sequence[str] = PEERS, masks: Sequence[str] = DEFAULT_MASKS,
                    dtype: str = "float32", repeats: int = 7, warmup: int = 1,
                    budget_s: float = 60.0, gemm_size: int = 2048, seed: int = 0,
                    efficient_chunks: dict | None = None,
                    local_window_sizes: Sequence = (None,),
                    log: Callable[[str], None] | None = None) -> dict:
    """Run the attention benchmark; returns its JSON-able record.

    Args:
      shapes: ``(B, N, T, H)`` tuples, ``S = T``.
      peers: a subset of :data:`PEERS`.
      masks: a subset of :data:`MASKS`: ``"none"``, ``"padding"`` (valid key lengths with
        about 25% padding, see :func:`padding_lens`), ``"documents"``, ``"chunks"``
        (:func:`structure`).
      dtype: ``"float32"`` or ``"bfloat16"`` for every peer but NumPy (float64).
      repeats: timed rounds (>= 5); the medians are reported.
      warmup: untimed rounds before them, after each peer's first (compiling) calls.
      budget_s: a peer whose ``warmup + repeats`` rounds at a shape would take longer, estimated
        from a call after compilation, is measured for its error only and recorded as skipped.
      gemm_size: ``n`` of the ``n³`` float32 GEMM whose best GFLOP/s is the ceiling.
      seed: seeds the inputs and the order of the valid lengths.
      efficient_chunks: keyword arguments for ``ours_efficient`` (``query_chunk_size``,
        ``key_chunk_size``); ``None`` keeps its defaults.
      local_window_sizes: the sliding windows each (shape, mask) case runs with, one case per
        window: ``None`` (no window), an int ``w`` (= ``(w, w)``) or ``(left, right)``; query
        ``t`` attends keys ``t - left <= s <= t + right``. Every peer applies it (see the module
        docstring), and so do both float64 references. Default: no window only.
      log: called with a line before each case (progress); ``None`` for silence.

    Returns:
      ``{"command", "environment", "settings", "gemm", "results": [...], "sources",
      "sources_changed_during_run", "loadavg_after"}``; each result holds a
      shape, a mask, its ``local_window_size`` (``None`` or ``[left, right]``), the flops (the
      dense count) and ``window_flops`` (``None`` without a window), ``queries_without_keys``
      (query rows, over the batch, that the padding and the window leave no key: left out of
      the errors), the float64 references used and ``peers``: per peer
      ``{"status": "ok" | "skipped", "reason", "note", "forward": {...},
      "forward_backward": {...}}`` with the timing summary, ``gflops``,
      ``percent_of_ceiling``, ``ratio_to_<baseline>`` (time / the baseline's time) and
      ``max_abs_error`` in each pass.
    """
    shapes, peers, masks, windows = _check_arguments(
        shapes, peers, masks, dtype, repeats, warmup, budget_s, local_window_sizes)
    efficient_chunks = dict(efficient_chunks or {})
    log = log or (lambda line: None)

    env = environment()
    sources = source_fingerprint(*SOURCES)
    log(f"GEMM ceiling ({gemm_size}³ float32) ...")
    gemm = gemm_ceiling(gemm_size)
    ceiling = gemm["ceiling_gflops"]
    rng = np.random.default_rng(seed)
    results = []
    for B, N, T, H in shapes:
        S = T
        # The inputs of every mask case at this shape are the same draws.
        arrays = [rng.standard_normal(shape, dtype=np.float32)
                  for shape in ((B, N, T, H), (B, N, S, H), (B, N, S, H), (B, N, T, H))]
        lens_padding = padding_lens(B, S, rng)
        for mask in masks:
            lens = lens_padding if mask == "padding" else None
            for window in windows:
                log(f"(B, N, T, H) = ({B}, {N}, {T}, {H}), mask {mask}"
                    + ("" if window is None else f", window {window[0]},{window[1]}") + " ...")
                results.append(_bench_case(arrays, lens, mask, peers, dtype, repeats, warmup,
                                           budget_s, ceiling, efficient_chunks, window))
    return {"command": "bench attention", "environment": env,
            "settings": {"shapes": [list(s) for s in shapes], "peers": peers, "masks": masks,
                         "local_window_sizes": [None if w is None else list(w) for w in windows],
                         "dtype": dtype, "repeats": repeats, "warmup": warmup,
                         "budget_s": budget_s, "seed": seed, "efficient_chunks": efficient_chunks,
                         **SETTINGS_NOTES},
            "gemm": gemm, "results": results, "sources": sources,
            "sources_changed_during_run":
                source_fingerprint(*SOURCES)["modules"] != sources["modules"],
            # With the start's (in "environment"): how busy the machine was during the run.
            "loadavg_after": load_average()}


def _case_flops(B: int, N: int, T: int, S: int, H: int, window) -> tuple[dict, dict | None]:
    """The dense FLOP counts of a case and, with a window, those of the scores inside it."""
    flops = {"forward": attention_flops(B, N, T, S, H),
             "forward_backward": attention_flops(B, N, T, S, H, backward=True)}
    if window is None:
        return flops, None
    pairs = window_pairs(T, S, window)
    return flops, {"forward": 4 * B * N * H * pairs, "forward_backward": 3 * 4 * B * N * H * pairs,
                   "fraction_of_dense": pairs / (T * S)}


def _rows_with_keys(lens, B: int, T: int, S: int, window, structure=None):
    """``(rows, count)``: the query rows that attend some key, ``(B, 1, T, 1)``, and how many do
    not — or ``(None, 0)`` when every row does. Rows without a key (padding and a window together)
    are where the peers disagree (zeros, or the mean of every value): they count for no error and
    get a zero cotangent."""
    keep = keep_mask(lens, T, S, window, structure)
    if keep is None:
        return None, 0
    rows = np.broadcast_to(keep.any(axis=-1, keepdims=True), (B, 1, T, 1))
    without_keys = int((~rows).sum())
    return (rows, without_keys) if without_keys else (None, 0)


def _add_timings(record_peers: dict, medians: dict, flops: dict, ceiling: float) -> None:
    """Each timed peer's medians, GFLOP/s (dense count), % of the ceiling and time ratios."""
    for name, entry in record_peers.items():
        for kind in ("forward", "forward_backward"):
            result = entry.get(kind)
            timing = medians.get(f"{name}/{kind}")
            if result is None or timing is None:
                continue
            result.update(timing)
            result["gflops"] = flops[kind] / timing["median_s"] / 1e9
            result["percent_of_ceiling"] = 100.0 * result["gflops"] / ceiling
            for baseline in BASELINES:
                other = medians.get(f"{baseline}/{kind}")
                result[f"ratio_to_{baseline}"] = (None if other is None else
                                                  timing["median_s"] / other["median_s"])


class _References(NamedTuple):
    """A case's float64 references: the ``output (B, N, T, H)`` and the ``seconds`` it took, the
    ``grads`` ``[dq, dk, dv]`` and what made them (``grads_source``)."""

    output: np.ndarray
    seconds: float
    grads: list
    grads_source: str


def _float64_references(arrays, built: dict, lens, dtype: str, window,
                        structure=None) -> _References:
    """The float64 references of a case, from the inputs each peer actually sees (rounded to
    ``dtype``); the output is the ``numpy`` peer's (built here when the case does not run it)."""
    import jax.numpy as jnp

    q, k, v, _ = arrays
    seen = [np.asarray(a.astype(jnp.dtype(dtype))).astype(np.float64) for a in arrays]
    start = time.perf_counter()
    if isinstance(built.get("numpy"), Peer):
        output = built["numpy"].forward()
    else:
        # Not timed: one head at a time, so that the float64 T x S arrays of all the heads at
        # once (4 GiB each at (1, 8, 8192, 64)) are never held together.
        output = np.concatenate([
            numpy_peer(q[:, n:n + 1], k[:, n:n + 1], v[:, n:n + 1], lens, jnp.dtype(dtype),
                       window, structure).forward() for n in range(q.shape[1])], axis=1)
    seconds = time.perf_counter() - start
    grads, grads_source = float64_grads(*seen, lens, window, structure)
    return _References(output, seconds, grads, grads_source)


def _round_seconds(peer: Peer) -> float:
    """The seconds one timed round of ``peer`` (compiled by now) will take: the faster of two
    calls of each of its functions."""
    # The faster, because one call on a busy machine can stall (PyTorch's backward at
    # T = 8192 took 20 s instead of 0.4 s now and then with a load average of 4).
    estimate = math.inf
    for _ in range(2):
        start = time.perf_counter()
        peer.forward()
        if peer.forward_backward is not None:
            peer.forward_backward()
        estimate = min(estimate, time.perf_counter() - start)
    return estimate


def _measure_peer(name: str, peer: Peer, references: _References, rows, timed: dict, *,
                  repeats: int, warmup: int, budget_s: float) -> dict:
    """A peer's entry of a case: the errors of its first calls (which compile) against the
    float64 ``references`` (:func:`_float64_references`; ``rows``: the query rows that count,
    or ``None``) and its estimated seconds per round. Its functions join ``timed`` (``{"name/
    pass": call}``) unless ``warmup + repeats`` rounds would take longer than ``budget_s``: then
    it is recorded as skipped, with the estimate."""
    reference_output, reference_seconds, reference_grads, _ = references
    entry = {"status": "ok", "note": peer.note, "forward": {}, "forward_backward": None}
    # First calls: compilation, and the results whose errors are reported.
    output = reference_output if name == "numpy" else peer.output(peer.forward())
    entry["forward"]["max_abs_error"] = _max_error(output, reference_output, rows)
    if peer.forward_backward is not None:
        entry["forward_backward"] = {"max_abs_error": max(
            _max_error(g, e) for g, e in zip(peer.grads(peer.forward_backward()),
                                             reference_grads))}
    estimate = reference_seconds if name == "numpy" else _round_seconds(peer)
    projected = estimate * (warmup + repeats)
    entry["estimated_s_per_round"] = estimate
    if projected > budget_s:
        entry["status"] = "skipped"
        entry["reason"] = (f"{warmup + repeats} rounds would take about {projected:.0f} s "
                           f"(> budget {budget_s:g} s); errors measured from one call")
    else:
        timed[f"{name}/forward"] = peer.forward
        if peer.forward_backward is not None:
            timed[f"{name}/forward_backward"] = peer.forward_backward
    return entry


def _bench_case(arrays, lens, mask, peer_names, dtype, repeats, warmup, budget_s, ceiling,
                efficient_chunks, window=None) -> dict:
    case = structure(mask, arrays[0].shape[2])
    """One (shape, mask, window) case: every peer built, checked against the float64
    references and, within the budget, timed in interleaved rounds; its record."""
    q, k, v, cotangent = arrays
    B, N, T, H = q.shape
    S = k.shape[2]
    flops, window_flops = _case_flops(B, N, T, S, H, window)
    rows, without_keys = _rows_with_keys(lens, B, T, S, window, case)
    if rows is not None:
        arrays = [q, k, v, np.where(rows, cotangent, np.float32(0))]
    built = build_peers(peer_names, arrays, lens, dtype, efficient_chunks, window, case)
    references = _float64_references(arrays, built, lens, dtype, window, case)

    record_peers: dict[str, dict] = {}
    timed: dict[str, Callable[[], object]] = {}
    for name in peer_names:
        peer = built[name]
        record_peers[name] = ({"status": "skipped", "reason": peer} if isinstance(peer, str) else
                              _measure_peer(name, peer, references, rows, timed, repeats=repeats,
                                            warmup=warmup, budget_s=budget_s))

    samples = (time_interleaved(timed, repeats=repeats, warmup=warmup, shuffle_seed=0)
               if timed else {})
    _add_timings(record_peers, {key: summarize(times) for key, times in samples.items()}, flops,
                 ceiling)
    return {"shape": {"B": B, "N": N, "T": T, "S": S, "H": H}, "mask": mask,
            "local_window_size": None if window is None else list(window),
            "valid_lens": None if lens is None else lens.tolist(),
            "padding_fraction": 0.0 if lens is None else float(1 - lens.sum() / (B * S)),
            "queries_without_keys": without_keys,
            "flops": flops, "window_flops": window_flops,
            "reference": {"forward": "reference_numpy.scoring.dot_product_attention, float64"
                                     + window_note(window),
                          "forward_s": references.seconds,
                          "gradients": references.grads_source},
            "peers": record_peers}


# --------------------------------------------------------------------------- printing


def format_sources(record: dict, *, imported_once: bool = True) -> str:
    """One line saying which code was measured, and a warning if it changed during the run.

    ``imported_once``: the run imported the code once, at its start (``bench attention``), so its
    figures are of the fingerprinted version; otherwise (``bench memory``, a process per figure)
    they may mix versions.
    """
    sources = record.get("sources") or {}
    commit = (sources.get("git_commit") or "no git")[:10]
    modified = sources.get("modified")
    line = f"code: commit {commit}" + (f", modified: {', '.join(modified)}" if modified else "")
    if record.get("sources_changed_during_run"):
        line += ("\nWARNING: the code under test was edited during the run; " +
                 ("the figures are of the version imported at its start (above)" if imported_once
                  else "processes started after the edit measured the new version"))
    return line


def _fmt(value, spec):
    return None if value is None else format(value, spec)


def _window_text(window) -> str:
    return "none" if window is None else f"{window[0]},{window[1]}"


def format_attention(record: dict) -> str:
    """The environment header and one table row per (shape, mask, peer), with a window column
    when some case has a sliding window."""
    gemm = record["gemm"]
    settings = record["settings"]
    windowed = any(r.get("local_window_size") is not None for r in record["results"])
    lines = [format_environment(record["environment"]),
             f"GEMM ceiling ({gemm['n']}³ float32): {gemm['ceiling_gflops']:.1f} GFLOP/s ("
             + ", ".join(f"{k} {v:.1f}" for k, v in gemm["gflops"].items()) + ")",
             f"dtype {settings['dtype']}, medians of {settings['repeats']} interleaved rounds after "
             f"{settings['warmup']} warm-up; GFLOP/s and % of ceiling are forward+backward "
             f"(forward for numpy); ×jax.nn, ×torch: time ratios (> 1 slower)",
             *(["window: left,right (query t attends keys t-left..t+right); GFLOP/s counts the "
                "dense T·S scores whatever the window skips (window_flops in the JSON counts "
                "only those inside)"] if windowed else []),
             f"load average at the end: {record.get('loadavg_after')}",
             format_sources(record), ""]
    headers = ["peer", "B,N,T,H", "mask", *(["window"] if windowed else []), "fwd ms",
               "fwd+bwd ms", "GFLOP/s", "% ceil",
               "fwd ×jax.nn", "f+b ×jax.nn", "fwd ×torch", "f+b ×torch", "err fwd", "err grad"]
    rows = []
    skipped = []
    for result in record["results"]:
        s = result["shape"]
        shape = f"{s['B']},{s['N']},{s['T']},{s['H']}"
        window = _window_text(result.get("local_window_size"))
        for name, entry in result["peers"].items():
            fwd = entry.get("forward") or {}
            both = entry.get("forward_backward") or {}
            main = both if "median_s" in both else fwd
            if entry["status"] != "ok":
                skipped.append(f"  {name} at {shape}, mask {result['mask']}"
                               + (f", window {window}" if windowed else "")
                               + f": {entry['reason']}")
            rows.append([
                name if entry["status"] == "ok" else name + " (skipped)", shape, result["mask"],
                *([window] if windowed else []),
                _fmt(fwd.get("median_s") and fwd["median_s"] * 1e3, ".2f"),
                _fmt(both.get("median_s") and both["median_s"] * 1e3, ".2f"),
                _fmt(main.get("gflops"), ".1f"), _fmt(main.get("percent_of_ceiling"), ".0f"),
                _fmt(fwd.get("ratio_to_jax.nn"), ".2f"), _fmt(both.get("ratio_to_jax.nn"), ".2f"),
                _fmt(fwd.get("ratio_to_torch"), ".2f"), _fmt(both.get("ratio_to_torch"), ".2f"),
                _fmt(fwd.get("max_abs_error"), ".1e"), _fmt(both.get("max_abs_error"), ".1e"),
            ])
    lines.append(format_table(headers, rows))
    if skipped:
        lines += ["", "skipped:"] + skipped
    return "\n".join(lines)
