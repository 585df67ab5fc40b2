"""Our mask and score mods against PyTorch FlexAttention (``torch.nn.attention.flex_attention``).

Each case states a mask mod and a score mod twice: ours from :mod:`jax_attention.nn.mods`
(built-ins and combinators), and FlexAttention's own idiom written here with torch operations
(``lambda b, h, q_idx, kv_idx: ...`` indexing tensors by ``b`` and ``q_idx``, the mask as a
``create_block_mask``). In float64 on the CPU, outputs, log-sum-exps and the gradients of a
random output cotangent with respect to queries, keys, values and the learned tables (a bias,
clipped relative positions, T5's buckets) agree to 1e-10 on every path of ours: the plain one,
the chunked one (``implementation="chunked"``) and the memory-efficient kernel with query chunks
of 4 and key chunks of 5. Shapes: B = 2, N = 4 query heads, T = 11 queries, S = 13 keys (T = S =
12 for the self-attention mods), and grouped cases with keys and values of 2 heads (FlexAttention's
``enable_gqa=True``).

How FlexAttention is run here (torch 2.13, CPU):

* eagerly — it then compiles its graph with the eager backend and warns that it is not using
  ``torch.compile``; the warning is filtered, as in
  :func:`jax_attention.conformance.targets.torch_target._flex`;
* its public entry point refuses inputs that require gradients on the CPU
  (``_validate_device``: "FlexAttention does not support backward on CPU"), yet the operator
  underneath has its own autograd, the dense math of ``sdpa_dense_backward`` (FlexAttention's
  reference backward). For the gradients that one check is patched out
  (:func:`_flex_backward_on_cpu`); if the private name goes away the patch fails loudly instead
  of skipping;
* the log-sum-exp is requested with ``return_aux=AuxRequest(lse=True)`` (``return_lse=True`` is
  deprecated in 2.13 and warns); it is natural-log, as ours.

Fully masked rows (a padded query, a zero length, a query segment no key has): FlexAttention
gives a zero output, a log-sum-exp of ``-inf`` and zero gradients — ours exactly, so such rows
stay in every comparison; :func:`test_fully_masked_rows_as_flex` pins the convention on both sides.

Not here: attention sinks (FlexAttention has none). ``MaskMod.block_any`` (the blocks the kernel
skips) is checked only through the kernel's results.
"""

from __future__ import annotations

from tests.torch_support import import_torch

torch = import_torch()

import contextlib  # noqa: E402
import functools  # noqa: E402
import math  # noqa: E402
import warnings  # noqa: E402
from typing import NamedTuple  # noqa: E402
from unittest import mock  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from torch.nn.attention import flex_attention as flex_module  # noqa: E402
from torch.nn.attention.flex_attention import (  # noqa: E402
    AuxRequest,
    create_block_mask,
    flex_attention,
)

from jax_attention.nn import efficient, mods, scoring  # noqa: E402
from tests.crossframework._support import assert_close, normal  # noqa: E402

pytestmark = pytest.mark.usefixtures("x64", "highest_precision")

DTYPE = np.float64
B, N, D, D_V = 2, 4, 8, 6
T, S = 11, 13  # queries, keys
T_SELF = 12  # both, for the self-attention mods (segments of one sequence, prefix-LM)

# --------------------------------------------------------------------------- the cases' data

VALID_LENS = np.array([0, 9], np.int32)  # row 0 attends nothing
VALID_LENS_BT = np.array([[13, 0, 1, 2, 3, 4, 5, 6, 7, 8, 13],
                          [5, 5, 5, 0, 0, 13, 13, 9, 9, 9, 9]], np.int32)
KV_LENS, Q_LENS = np.array([7, 13], np.int32), np.array([11, 6], np.int32)
# -1: padding (an ordinary segment, or padding_id=-1).
SEGMENTS = np.array([[0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 2],
                     [0, 0, 0, 0, 0, 1, 1, 1, 1, 1, -1, -1]], np.int32)
# Row 1 unsorted; query id 3 has no key (a fully masked query), key id 4 no query.
Q_SEGMENTS = np.array([[0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2],
                       [2, 0, 1, 1, 3, 0, 2, 2, 1, 0, 0]], np.int32)
KV_SEGMENTS = np.array([[0, 0, 1, 1, 1, 1, 1, 2, 2, 2, 4, 4, 4],
                        [1, 1, 0, 2, 2, 0, 0, 1, 2, 1, 0, 2, 1]], np.int32)
PREFIX = np.array([3, 7], np.int32)
DENSE_KEEP = np.random.default_rng(7).random((B, N, T, S)) < 0.5  # per head: checks h in GQA
SOFTCAP = 1.5
CLIP_K = 3
T5_BIDIRECTIONAL = dict(num_buckets=8, max_distance=10)  # no bucket boundary at an integer quotient
T5_CAUSAL = dict(num_buckets=6, max_distance=10)


def _tables() -> dict[str, np.ndarray]:
    """The learned tables of the score mods (float64; each gets its gradient on both sides)."""
    return {"bias": normal((B, 1, T, S), 20), "clipped": normal((2 * CLIP_K + 1, N), 21),
            "t5": normal((T5_BIDIRECTIONAL["num_buckets"], N), 22),
            "t5_causal": normal((T5_CAUSAL["num_buckets"], 1), 23)}


# --------------------------------------------------------------------------- FlexAttention's side


def _t5_bucket(rel, num_buckets, max_distance, bidirectional):
    """T5's bucket of ``rel = kv_idx - q_idx``, as Hugging Face's ``_relative_position_bucket``
    writes it (torch operations, the log in float32)."""
    bucket = torch.zeros_like(rel)
    if bidirectional:
        num_buckets //= 2
        bucket = bucket + (rel > 0).to(rel.dtype) * num_buckets
        n = torch.abs(rel)
    else:
        n = torch.clamp(-rel, min=0)
    max_exact = num_buckets // 2
    large = max_exact + (torch.log(n.float() / max_exact) / math.log(max_distance / max_exact)
                         * (num_buckets - max_exact)).to(rel.dtype)
    large = torch.clamp(large, max=num_buckets - 1)
    return bucket + torch.where(n < max_exact, n, large)


def _torch_alibi_slopes(n):
    return 2.0 ** (-8.0 * torch.arange(1, n + 1, dtype=torch.float64) / n)  # n a power of two


def _t(array):
    return torch.from_numpy(np.asarray(array))


def _alibi_flex(p):
    slopes = _torch_alibi_slopes(N)
    return lambda score, b, h, q, kv: score + slopes[h] * (kv - q)


def _softcap_flex(p):
    return lambda score, b, h, q, kv: SOFTCAP * torch.tanh(score / SOFTCAP)


def _clipped_flex(p):
    return lambda score, b, h, q, kv: score + p["clipped"][
        torch.clamp(kv - q, -CLIP_K, CLIP_K) + CLIP_K, h]


def _t5_flex(p):
    return lambda score, b, h, q, kv: score + p["t5"][_t5_bucket(kv - q, bidirectional=True,
                                                                **T5_BIDIRECTIONAL), h]


def _then(first, second):
    return lambda score, b, h, q, kv: second(first(score, b, h, q, kv), b, h, q, kv)


# Each mask: (ours, FlexAttention's), functions of nothing giving the mask mod.
MASKS = {
    None: (lambda: None, lambda: None),
    "causal": (mods.causal, lambda: lambda b, h, q, kv: q >= kv),
    "causal_lower_right": (lambda: mods.causal(offset=S - T),
                           lambda: lambda b, h, q, kv: kv <= q + (S - T)),
    "sliding_window_3_2": (lambda: mods.sliding_window(3, 2),
                           lambda: lambda b, h, q, kv: (kv >= q - 3) & (kv <= q + 2)),
    "causal_and_sliding_window_3": (
        lambda: mods.and_masks(mods.causal(), mods.sliding_window(3)),
        lambda: lambda b, h, q, kv: (q >= kv) & (q - kv <= 3)),
    "valid_lengths_B": (  # row 0: length 0, every query fully masked
        lambda: mods.valid_lengths(VALID_LENS),
        lambda: (lambda lens: lambda b, h, q, kv: kv < lens[b])(_t(VALID_LENS))),
    "valid_lengths_BT": (
        lambda: mods.valid_lengths(VALID_LENS_BT),
        lambda: (lambda lens: lambda b, h, q, kv: kv < lens[b, q])(_t(VALID_LENS_BT))),
    "padding": (  # row 1: queries 6.. are padding, fully masked
        lambda: mods.padding(KV_LENS, Q_LENS),
        lambda: (lambda kv_lens, q_lens: lambda b, h, q, kv: (kv < kv_lens[b]) & (q < q_lens[b]))(
            _t(KV_LENS), _t(Q_LENS))),
    "segment_ids_and_causal": (  # self-attention (T = S); -1 an ordinary segment here
        lambda: mods.and_masks(mods.segment_ids(SEGMENTS), mods.causal()),
        lambda: (lambda ids: lambda b, h, q, kv: (ids[b, q] == ids[b, kv]) & (q >= kv))(
            _t(SEGMENTS))),
    "segment_ids_padding_id": (
        lambda: mods.segment_ids(SEGMENTS, padding_id=-1),
        lambda: (lambda ids: lambda b, h, q, kv: (ids[b, q] == ids[b, kv]) & (ids[b, q] != -1))(
            _t(SEGMENTS))),
    "segment_ids_query_key": (  # distinct query and key ids (T != S), id 3 with no key
        lambda: mods.segment_ids(Q_SEGMENTS, KV_SEGMENTS),
        lambda: (lambda q_ids, kv_ids: lambda b, h, q, kv: q_ids[b, q] == kv_ids[b, kv])(
            _t(Q_SEGMENTS), _t(KV_SEGMENTS))),
    "prefix_lm": (
        lambda: mods.prefix_lm(PREFIX),
        lambda: (lambda prefix: lambda b, h, q, kv: (kv <= q) | (kv < prefix[b]))(_t(PREFIX))),
    "chunked_local_4": (lambda: mods.chunked_local(4),
                        lambda: lambda b, h, q, kv: q // 4 == kv // 4),
    "chunked_local_4_and_causal": (
        lambda: mods.and_masks(mods.chunked_local(4), mods.causal()),
        lambda: lambda b, h, q, kv: (q // 4 == kv // 4) & (q >= kv)),
    "sliding_window_1_1_or_prefix_lm": (
        lambda: mods.or_masks(mods.sliding_window(1, 1), mods.prefix_lm(PREFIX)),
        lambda: (lambda prefix: lambda b, h, q, kv: ((kv >= q - 1) & (kv <= q + 1))
                 | ((kv <= q) | (kv < prefix[b])))(_t(PREFIX))),
    "dense_mask": (  # per head: with grouped keys, h is the query head on both sides
        lambda: mods.dense_mask(DENSE_KEEP),
        lambda: (lambda keep: lambda b, h, q, kv: keep[b, h, q, kv])(_t(DENSE_KEEP))),
}

# Each score mod: (ours, FlexAttention's), functions of the tables (JAX arrays for ours, torch
# tensors that require gradients for FlexAttention's) giving the score mod.
SCORES = {
    None: (lambda p: None, lambda p: None),
    "softcap": (lambda p: mods.softcap(SOFTCAP), _softcap_flex),
    "bias": (lambda p: mods.bias(p["bias"]),
             lambda p: lambda score, b, h, q, kv: score + p["bias"][b, 0, q, kv]),
    "alibi": (lambda p: mods.alibi(N), _alibi_flex),
    "clipped_relative_bias": (lambda p: mods.clipped_relative_bias(p["clipped"]), _clipped_flex),
    "t5_relative_bias": (
        lambda p: mods.t5_relative_bias(p["t5"], bidirectional=True,
                                        max_distance=T5_BIDIRECTIONAL["max_distance"]),
        _t5_flex),
    "t5_relative_bias_causal_shared_heads": (
        lambda p: mods.t5_relative_bias(p["t5_causal"], bidirectional=False,
                                        max_distance=T5_CAUSAL["max_distance"]),
        lambda p: lambda score, b, h, q, kv: score + p["t5_causal"][
            _t5_bucket(kv - q, bidirectional=False, **T5_CAUSAL), 0]),
    "alibi_then_softcap": (
        lambda p: mods.compose_score_mods(mods.alibi(N), mods.softcap(SOFTCAP)),
        lambda p: _then(_alibi_flex(p), _softcap_flex(p))),
    "softcap_then_clipped_relative_bias": (
        lambda p: mods.compose_score_mods(mods.softcap(SOFTCAP),
                                          mods.clipped_relative_bias(p["clipped"])),
        lambda p: _then(_softcap_flex(p), _clipped_flex(p))),
}


# The tables each score mod reads (their gradients are compared).
TABLES_USED = {None: (), "softcap": (), "alibi": (), "alibi_then_softcap": (), "bias": ("bias",),
               "clipped_relative_bias": ("clipped",), "t5_relative_bias": ("t5",),
               "t5_relative_bias_causal_shared_heads": ("t5_causal",),
               "softcap_then_clipped_relative_bias": ("clipped",)}


class Case(NamedTuple):
    """A mask (a key of MASKS), a score mod (of SCORES), the sequence lengths and the key/value
    heads (fewer than N: grouped, query head h reads head h // (N / kv_heads))."""
    mask: str | None
    score: str | None
    T: int = T
    S: int = S
    kv_heads: int = N

    def ours(self, tables):
        return MASKS[self.mask][0](), SCORES[self.score][0](tables)

    def flex(self, tables):
        return MASKS[self.mask][1](), SCORES[self.score][1](tables)


# Every mask and every score mod at least once, a score mod with each of most masks (one compiled
# program per case and path is what the time goes to). Self-attention mods (segments of one
# sequence, prefix-LM) on T = S; the lower-right causal mask needs T != S.
_CASES = [
    Case("causal", "alibi"),
    Case("causal_lower_right", "t5_relative_bias"),
    Case("sliding_window_3_2", "softcap"),
    Case("valid_lengths_B", "bias"),
    Case("valid_lengths_BT", "clipped_relative_bias"),
    Case("padding", "t5_relative_bias_causal_shared_heads"),
    Case("segment_ids_and_causal", "alibi_then_softcap", T=T_SELF, S=T_SELF),
    Case("segment_ids_padding_id", None, T=T_SELF, S=T_SELF),
    Case("segment_ids_query_key", "clipped_relative_bias"),
    Case("prefix_lm", "t5_relative_bias", T=T_SELF, S=T_SELF),
    Case("chunked_local_4", "softcap"),
    Case("chunked_local_4_and_causal", None),
    Case("sliding_window_1_1_or_prefix_lm", "bias"),
    Case(None, "alibi_then_softcap"),
    Case("causal_and_sliding_window_3", "alibi", kv_heads=2),
    Case("dense_mask", "clipped_relative_bias", kv_heads=2),
    Case("padding", "softcap_then_clipped_relative_bias", kv_heads=2),
]
CASES = {f"{'grouped-' if c.kv_heads != N else ''}{c.mask or 'no_mask'}+{c.score or 'no_score'}": c
         for c in _CASES}
# Not expressible in FlexAttention: attention sinks (an extra softmax term with no key), so they
# are not tested here.


def _inputs(case: Case) -> dict[str, np.ndarray]:
    return {"q": normal((B, N, case.T, D), 1), "k": normal((B, case.kv_heads, case.S, D), 2),
            "v": normal((B, case.kv_heads, case.S, D_V), 3),
            "cotangent": normal((B, N, case.T, D_V), 4)}


@contextlib.contextmanager
def _flex_backward_on_cpu():
    """Lets FlexAttention's public entry point take CPU inputs that require gradients: torch 2.13
    refuses them up front (``_validate_device``), though the operator's autograd (dense math,
    ``sdpa_dense_backward``) runs there. Only that check is replaced."""
    with mock.patch.object(flex_module, "_validate_device", lambda query, key, value: None):
        yield


def _flex(case: Case, *, grad: bool):
    """FlexAttention on the case: ``(output, lse, grads)``, grads a dict (empty unless ``grad``)."""
    x = _inputs(case)
    q, k, v = (torch.tensor(x[n], requires_grad=grad) for n in "qkv")
    tables = {n: torch.tensor(t, requires_grad=grad) for n, t in _tables().items()}
    mask_mod, score_mod = case.flex(tables)
    block_mask = (None if mask_mod is None
                  else create_block_mask(mask_mod, B, N, case.T, case.S, device="cpu"))
    with warnings.catch_warnings(), (_flex_backward_on_cpu() if grad else contextlib.nullcontext()):
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        output, aux = flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask,
                                     enable_gqa=case.kv_heads != N,
                                     return_aux=AuxRequest(lse=True))
        if not grad:
            return output, aux.lse, {}
        output.backward(torch.tensor(x["cotangent"]))
    grads = {"q": q.grad, "k": k.grad, "v": v.grad}
    grads.update({n: t.grad for n, t in tables.items() if t.grad is not None})
    return output, aux.lse, grads


@functools.lru_cache(maxsize=None)
def _flex_results(name: str):
    return _flex(CASES[name], grad=True)


# --------------------------------------------------------------------------- ours

# The chunked path takes one block at these sizes; the kernel with query chunks of 4 and key chunks
# of 5 has 3 x 3 blocks, neither size dividing its length (padded last chunks).
PATHS = {
    "plain": lambda q, k, v, **kw: _drop_weights(
        scoring.dot_product_attention(q, k, v, implementation="plain", return_lse=True, **kw)),
    "chunked": lambda q, k, v, **kw: _drop_weights(
        scoring.dot_product_attention(q, k, v, implementation="chunked", return_lse=True, **kw)),
    "efficient_4x5": lambda q, k, v, **kw: efficient.dot_product_attention(
        q, k, v, query_chunk_size=4, key_chunk_size=5, return_lse=True, **kw),
}


def _drop_weights(results):
    output, _, lse = results
    return output, lse


# Compiling is most of this file's time: XLA's CPU backend compiles these small programs 3-4 times
# faster without LLVM's optimisations and with its older elemental emitters instead of the fusion
# emitters (the same operations, the same float64 results to 1e-10; other backends ignore them).
_FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": False}


@functools.partial(jax.jit, static_argnames=("name", "path"), compiler_options=_FAST_COMPILE)
def _ours_jitted(name, path, q, k, v, tables, cotangent):
    """``(output, lse, (dq, dk, dv, d_tables))``, the mods built from the tables inside, so that
    the tables get their gradients; jitted once per case and path (the fully masked rows' test
    reuses them)."""
    def attend(q, k, v, tables):
        mask_mod, score_mod = CASES[name].ours(tables)
        return PATHS[path](q, k, v, mask_mod=mask_mod, score_mod=score_mod)

    output, vjp, lse = jax.vjp(attend, q, k, v, tables, has_aux=True)
    return output, lse, vjp(cotangent)


def _ours(name: str, path: str):
    x = {n: jnp.asarray(a) for n, a in _inputs(CASES[name]).items()}
    tables = {n: jnp.asarray(t) for n, t in _tables().items()}
    output, lse, (dq, dk, dv, d_tables) = _ours_jitted(name, path, x["q"], x["k"], x["v"], tables,
                                                       x["cotangent"])
    return output, lse, {"q": dq, "k": dk, "v": dv, **d_tables}


# --------------------------------------------------------------------------- the tests


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("name", list(CASES))
def test_mods_match_flex_attention(name, path):
    expected_output, expected_lse, expected_grads = _flex_results(name)
    output, lse, grads = _ours(name, path)
    what = f"{name}, {path}: "
    assert_close(output, expected_output, DTYPE, what=what + "output")
    lse, expected_lse = np.asarray(lse), expected_lse.detach().numpy()
    # -inf exactly on the rows that attend nothing, on both sides; equal elsewhere.
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(expected_lse), err_msg=what + "lse")
    assert_close(np.where(np.isneginf(lse), 0.0, lse),
                 np.where(np.isneginf(expected_lse), 0.0, expected_lse), DTYPE, what=what + "lse")
    assert sorted(expected_grads) == sorted(["q", "k", "v", *TABLES_USED[CASES[name].score]])
    for n in expected_grads:
        assert_close(grads[n], expected_grads[n], DTYPE, what=f"{what}d{n}")


def test_fully_masked_rows_as_flex():
    """A query that may attend no key: FlexAttention (torch 2.13, CPU, eager) gives it a zero
    output, an lse of ``-inf`` — not NaN, not 0 — and zero gradients, with or without autograd;
    ours the same on every path (padding: queries 6.. of row 1; a zero length: row 0)."""
    for name in ["padding+t5_relative_bias_causal_shared_heads", "valid_lengths_B+bias"]:
        case = CASES[name]
        rows = np.s_[1, :, Q_LENS[1]:] if case.mask == "padding" else np.s_[0]
        for grad in (False, True):
            output, lse, grads = _flex_results(name) if grad else _flex(case, grad=False)
            assert (output[rows] == 0).all() and torch.isneginf(lse[rows]).all(), (name, grad)
            if grad:
                assert (grads["q"][rows] == 0).all(), name
                assert all(torch.isfinite(g).all() for g in grads.values()), name
        for path in PATHS:
            output, lse, grads = _ours(name, path)
            assert (np.asarray(output)[rows] == 0).all(), (name, path)
            assert np.isneginf(np.asarray(lse)[rows]).all(), (name, path)
            assert (np.asarray(grads["q"])[rows] == 0).all(), (name, path)
