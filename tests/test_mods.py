"""Mask mods and score mods (:mod:`jax_attention.nn.mods`): FlexAttention's model, in JAX.

Each built-in mask mod against the mask it stands for (:mod:`jax_attention.nn.masking` or the
rule written out in NumPy), each built-in score mod against the bias it stands for
(:mod:`jax_attention.nn.positional`); ``mask_mod=`` / ``score_mod=`` against ``mask=`` /
``bias=``; the plain path against the chunked kernel in float64 (outputs, log-sum-exp and the
gradients of queries, keys, values, a learned bias table and the sinks; grouped heads, chunks
that divide neither length, fully masked rows with and without sinks); jit, vmap; block
skipping (a mod whose ``block_any`` lies changes exactly the rows of the block it hides); bad
input; bfloat16; multi-head attention. Every compiled function serves several assertions: one
compilation per case.
"""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jax_attention.nn import efficient, masking, mods, positional, scoring
from jax_attention.nn.multihead import MultiHeadAttention, multi_head_attention

# Queries (B, N, T, H) against grouped keys and values (B, N_KV, S, .); the chunks (3, 4) divide
# neither T nor S, so both passes meet padded query and key blocks.
B, N, N_KV, T, S, H, V = 2, 4, 2, 13, 17, 4, 3
CHUNKS = (3, 4)
SCORES = (B, N, T, S)


def _device(array, dtype=None):
    """``array`` as a JAX array of ``dtype``, cast by NumPy (``jax.device_put`` compiles
    nothing)."""
    return jax.device_put(np.asarray(array, dtype))


def _normal(shape, dtype=jnp.float32, seed=0):
    return _device(np.random.default_rng(seed).normal(size=shape), dtype)


def _qkv(dtype=jnp.float32, batch=(B,)):
    return (_normal(batch + (N, T, H), dtype, 1), _normal(batch + (N_KV, S, H), dtype, 2),
            _normal(batch + (N_KV, S, V), dtype, 3))


def _max_abs(a, b):
    if a is None or b is None:  # no sinks: no sink gradient on either side
        assert a is None and b is None
        return 0.0
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)),
                        initial=0.0))


def _close(a, b):
    chex.assert_trees_all_close(a, b, rtol=1e-5, atol=1e-5)


def _packed(lengths, total):
    """Segment ids of documents of ``lengths`` packed in order, the rest of the row id 9."""
    ids = np.concatenate([np.full(n, i) for i, n in enumerate(lengths)])
    return np.concatenate([ids, np.full(total - len(ids), 9)])[:total]


# Row 0: three documents; row 1: two, its queries past 10 are padding (id -1).
Q_IDS = np.stack([_packed([4, 5, 4], T), _packed([6, 4], T)]).astype(np.int32)
Q_IDS[1, 10:] = -1
KV_IDS = np.stack([_packed([6, 6, 5], S), _packed([9, 8], S)]).astype(np.int32)
LENS_B = np.array([5, 17], np.int32)
LENS_BT = np.random.default_rng(5).integers(1, S + 1, size=(B, T)).astype(np.int32)
LENS_BT[0, 6] = 0  # a query that attends nothing
DENSE = np.random.default_rng(6).random((B, 1, T, S)) < 0.6

_t, _s = np.arange(T)[:, None], np.arange(S)[None, :]


def _np_segments(q_ids, kv_ids, pad):
    keep = q_ids[:, :, None] == kv_ids[:, None, :]
    return (keep & (q_ids[:, :, None] != pad))[:, None]


# name: (the mod, the mask it stands for, broadcastable to (B, N, T, S)).
MASKS = {
    "causal": (lambda: mods.causal(), lambda: masking.causal_mask(T, S)),
    "causal_lower_right": (lambda: mods.causal(S - T),
                           lambda: masking.causal_mask(T, S, offset=S - T)),
    "sliding_window": (lambda: mods.sliding_window(3, 1),
                       lambda: masking.local_window_mask(T, S, (3, 1))),
    "sliding_window_causal": (lambda: mods.sliding_window(2),
                              lambda: masking.local_window_mask(T, S, (2, 0))),
    "valid_lengths_B": (lambda: mods.valid_lengths(LENS_B),
                        lambda: masking.valid_lens_mask(LENS_B, T, S)[:, None]),
    "valid_lengths_BT": (lambda: mods.valid_lengths(LENS_BT),
                         lambda: masking.valid_lens_mask(LENS_BT, T, S)[:, None]),
    "padding": (lambda: mods.padding(np.array([9, 17], np.int32), np.array([13, 7], np.int32)),
                lambda: ((_s < np.array([9, 17])[:, None, None])
                         & (_t < np.array([13, 7])[:, None, None]))[:, None]),
    "segment_ids_padding_id": (lambda: mods.segment_ids(Q_IDS, KV_IDS, padding_id=-1),
                               lambda: _np_segments(Q_IDS, KV_IDS, -1)),
    "prefix_lm": (lambda: mods.prefix_lm(np.array([5, 0], np.int32)),
                  lambda: ((_s <= _t) | (_s < np.array([5, 0])[:, None, None]))[:, None]),
    "prefix_lm_scalar": (lambda: mods.prefix_lm(4), lambda: (_s <= _t) | (_s < 4)),
    "chunked_local": (lambda: mods.chunked_local(5), lambda: _t // 5 == _s // 5),
    "and": (lambda: mods.and_masks(mods.chunked_local(6), mods.causal()),
            lambda: (_t // 6 == _s // 6) & (_s <= _t)),
    "or": (lambda: mods.or_masks(mods.sliding_window(1, 1), mods.chunked_local(4)),
           lambda: (np.abs(_s - _t) <= 1) | (_t // 4 == _s // 4)),
    "or_with_plain_function": (
        lambda: mods.or_masks(mods.causal(), lambda b, h, q, kv: (kv - h) % 4 == 0),
        lambda: (_s <= _t) | ((_s - np.arange(N)[:, None, None]) % 4 == 0)),
    "dense_mask": (lambda: mods.dense_mask(DENSE), lambda: DENSE),
    "global_tokens": (lambda: mods.global_tokens(2), lambda: (_t < 2) | (_s < 2)),
    "longformer": (lambda: mods.or_masks(mods.sliding_window(1, 1), mods.global_tokens(1)),
                   lambda: (np.abs(_s - _t) <= 1) | (_t < 1) | (_s < 1)),
}


@pytest.mark.parametrize("name", sorted(MASKS))
def test_mask_mod_is_its_mask_and_attends_like_it(name):
    """The mod's mask is the mask it stands for; ``mask_mod=mod`` gives the outputs, weights and
    log-sum-exp of ``mask=`` that mask."""
    make_mod, make_mask = MASKS[name]
    mod, expected = make_mod(), np.broadcast_to(np.asarray(make_mask()), SCORES)
    keep = mods.mask_from_mod(mod, SCORES)
    assert keep.dtype == jnp.bool_
    np.testing.assert_array_equal(np.broadcast_to(keep, SCORES), expected)
    queries, keys, values = _qkv()
    by_mod = scoring.dot_product_attention(queries, keys, values, mask_mod=mod, return_lse=True)
    by_mask = scoring.dot_product_attention(queries, keys, values, mask=expected,
                                            return_lse=True)
    for got, want in zip(by_mod, by_mask):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    empty = ~expected.any(-1)  # rows the mask leaves without a key: zero output, lse -inf
    assert (np.asarray(by_mod[0])[empty] == 0).all()
    assert np.isneginf(np.asarray(by_mod[2])[empty]).all()
    assert np.isfinite(np.asarray(by_mod[2])[~empty]).all()


def test_segment_ids_default_to_self_attention():
    """One set of ids: the keys' are the queries' (``T = S``); (B, N, T, S) broadcast."""
    ids = KV_IDS[:, :T]
    keep = mods.mask_from_mod(mods.segment_ids(ids, padding_id=2), (B, N, T, T))
    np.testing.assert_array_equal(np.broadcast_to(keep, (B, N, T, T)),
                                  np.broadcast_to(_np_segments(ids, ids, 2), (B, N, T, T)))


def test_alibi_slopes_follow_the_paper():
    np.testing.assert_array_equal(mods.alibi_slopes(8), 2.0 ** -np.arange(1, 9))
    # Not a power of two: the 8 slopes of 8 heads, then every other slope of 16 heads.
    expected = np.r_[2.0 ** -np.arange(1, 9), 2.0 ** -np.array([0.5, 1.5, 2.5, 3.5])]
    np.testing.assert_allclose(mods.alibi_slopes(12), expected, rtol=1e-7)
    assert mods.alibi_slopes(12).dtype == jnp.float32


def _bias_of(score_mod, shape=(1, N, T, S)):
    """What ``score_mod`` adds to zero scores of ``shape``."""
    return score_mod(jnp.zeros(shape, jnp.float32), *mods.index_grids(shape))


@pytest.mark.parametrize("bidirectional", [True, False])
def test_t5_relative_bias_is_positional_relative_position_bias(bidirectional):
    table = _normal((8, N), seed=11)
    buckets = positional.relative_position_buckets(positional.relative_positions(T, S), 8, 6,
                                                   bidirectional)
    np.testing.assert_array_equal(
        _bias_of(mods.t5_relative_bias(table, bidirectional=bidirectional, max_distance=6)),
        positional.relative_position_bias(table, buckets))


def test_clipped_relative_bias_and_alibi_are_their_biases():
    table = _normal((7, N), seed=12)  # k = 3
    np.testing.assert_array_equal(
        _bias_of(mods.clipped_relative_bias(table)),
        positional.relative_position_bias(
            table, positional.clipped_relative_positions(positional.relative_positions(T, S), 3)))
    slopes = np.asarray(mods.alibi_slopes(N))
    np.testing.assert_allclose(_bias_of(mods.alibi(N)),
                               (slopes[:, None, None] * (_s - _t))[None], rtol=1e-7)
    shared = _normal((3, 1), seed=13)  # one column: shared by every head
    np.testing.assert_array_equal(_bias_of(mods.clipped_relative_bias(shared))[0, 3],
                                  np.asarray(shared)[np.clip(_s - _t, -1, 1) + 1, 0])


def test_score_mods_act_as_their_bias_and_softcap_is_unchanged():
    """``score_mod=bias(table)`` is ``bias=table``; ``logit_softcap=c`` is ``c tanh(s / c)``
    before the bias, the same as composing :func:`mods.softcap` and then the bias."""
    queries, keys, values = _qkv()
    table = _normal((1, N, T, S), seed=14)
    given = scoring.dot_product_attention(queries, keys, values, bias=table, is_causal=True)
    as_mod = scoring.dot_product_attention(queries, keys, values, score_mod=mods.bias(table),
                                           is_causal=True)
    chex.assert_trees_all_close(as_mod, given, rtol=1e-6, atol=1e-7)
    # The soft cap of 2 on the scores of 10 q (most of them beyond it), against the formula.
    big = 10 * np.asarray(queries, np.float64)
    scores = np.einsum("bngtd,bnsd->bngts", big.reshape(B, N_KV, 2, T, H),
                       np.asarray(keys, np.float64)).reshape(SCORES) / np.sqrt(H)
    capped = 2 * np.tanh(scores / 2) + np.asarray(table, np.float64)
    weights = np.exp(capped - capped.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    big = _device(big, jnp.float32)
    _, capped_weights = scoring.dot_product_attention(big, keys, values, logit_softcap=2.0,
                                                      bias=table)
    np.testing.assert_allclose(capped_weights, weights, rtol=1e-5, atol=1e-6)
    composed = scoring.dot_product_attention_weights(
        big, keys, score_mod=mods.compose_score_mods(mods.softcap(2.0), mods.bias(table)))
    np.testing.assert_allclose(composed, capped_weights, rtol=1e-6, atol=1e-7)


# --------------------------------------------------------------------------- plain vs chunked


def _case_mods(case, table, aux):
    """``(mask_mod, score_mod, logit_softcap)`` of a float64 case; ``table`` is learned."""
    if case == "t5_segments_sinks":  # a padded query (id -1): no key, but its sink
        q_ids, kv_ids = aux
        mask = mods.and_masks(mods.segment_ids(q_ids, kv_ids, padding_id=-1), mods.causal(S - T))
        return mask, mods.t5_relative_bias(table, max_distance=8), 3.0
    if case == "clipped_lengths_window":  # a query of length 0, no sinks
        mask = mods.and_masks(mods.valid_lengths(aux), mods.sliding_window(5, 2))
        return mask, mods.clipped_relative_bias(table), None
    # "prefix_or_chunks_padding_sinks": a padded query (q_lens), a bias of S columns.
    kv_lens, q_lens = aux
    mask = mods.and_masks(
        mods.or_masks(mods.prefix_lm(np.array([3, 0], np.int32)),
                      mods.and_masks(mods.chunked_local(5), mods.causal())),
        mods.padding(kv_lens, q_lens))
    return mask, mods.compose_score_mods(mods.alibi(N), mods.bias(table)), None


CASES = {  # name: (table shape, sinks shape or None, aux, the rows that attend nothing)
    "t5_segments_sinks": ((8, N), (N,), (Q_IDS, KV_IDS), Q_IDS == -1),
    "clipped_lengths_window": ((2 * 3 + 1, N), None, LENS_BT, LENS_BT == 0),
    "prefix_or_chunks_padding_sinks": (
        (1, N, 1, S), (N,), (np.array([15, 11], np.int32), np.array([13, 12], np.int32)),
        np.array([[False] * T, [False] * 12 + [True]])),
}
PATHS = ("plain", "chunked", "efficient")


def _attend(path, queries, keys, values, table, sinks, aux, case):
    mask_mod, score_mod, cap = _case_mods(case, table, aux)
    kw = dict(mask_mod=mask_mod, score_mod=score_mod, sinks=sinks, logit_softcap=cap,
              return_lse=True)
    if path == "efficient":
        return efficient.dot_product_attention(queries, keys, values, query_chunk_size=CHUNKS[0],
                                               key_chunk_size=CHUNKS[1], **kw)
    output, _, lse = scoring.dot_product_attention(queries, keys, values, implementation=path,
                                                   **kw)
    return output, lse


@functools.partial(jax.jit, static_argnames="case")
def _all_paths(queries, keys, values, table, sinks, aux, cotangents, *, case):
    """Per path: ``(output, lse, (dQ, dK, dV, dTable, dSinks))`` for the cotangents of the
    output and the lse — one compilation per case. The chunked kernel through
    ``scoring.dot_product_attention`` (one block here: automatic chunks) in the first case."""
    results = {}
    for path in PATHS if case == "t5_segments_sinks" else ("plain", "efficient"):
        (output, lse), vjp = jax.vjp(
            lambda *args, path=path: _attend(path, *args, aux, case),
            queries, keys, values, table, sinks)
        results[path] = (output, lse, vjp(cotangents))
    return results


@pytest.mark.parametrize("case", sorted(CASES))
def test_chunked_kernel_equals_plain_path_float64(case, x64):
    table_shape, sinks_shape, aux, empty = CASES[case]
    queries, keys, values = _qkv(jnp.float64)
    table = _normal(table_shape, jnp.float64, 21)
    sinks = None if sinks_shape is None else _normal(sinks_shape, jnp.float64, 22)
    cotangents = (_normal((B, N, T, V), jnp.float64, 23), _normal((B, N, T), jnp.float64, 24))
    results = _all_paths(queries, keys, values, table, sinks,
                         jax.tree.map(_device, aux), cotangents, case=case)
    output, lse, grads = results["plain"]
    chex.assert_type([output, lse, *grads], jnp.float64)
    chex.assert_equal_shape([grads[1], keys])  # dK, dV keep the N_KV heads
    assert len(results) == (3 if case == "t5_segments_sinks" else 2)
    for path in set(results) - {"plain"}:
        got_output, got_lse, got_grads = results[path]
        assert _max_abs(got_output, output) < 1e-10, path
        np.testing.assert_array_equal(np.isneginf(got_lse), np.isneginf(lse))
        finite = np.isfinite(np.asarray(lse))
        assert _max_abs(np.asarray(got_lse)[finite], np.asarray(lse)[finite]) < 1e-10, path
        for name, got, want in zip(("queries", "keys", "values", "table", "sinks"), got_grads,
                                   grads):
            assert _max_abs(got, want) < 1e-10, (path, name)
    # The rows that attend nothing (those planted, and those a window leaves without a key):
    # zero output and query gradient, every gradient finite.
    keep = mods.mask_from_mod(_case_mods(case, table, jax.tree.map(_device, aux))[0], SCORES)
    planted, empty = empty, ~np.broadcast_to(keep, SCORES).any(-1)
    assert empty[:, 0][planted].all() and not empty.all()
    for output, lse, grads in results.values():
        output, lse = np.asarray(output), np.asarray(lse)
        assert (output[empty] == 0).all() and (np.asarray(grads[0])[empty] == 0).all()
        assert all(np.isfinite(np.asarray(g)).all() for g in jax.tree.leaves(grads))
        if sinks is None:  # lse -inf without a sink, the sink's logit with one
            assert np.isneginf(lse[empty]).all() and np.isfinite(lse[~empty]).all()
        else:
            np.testing.assert_allclose(
                lse[empty], np.broadcast_to(np.asarray(sinks)[..., None], lse.shape)[empty],
                rtol=1e-14)
    # The learned table and the sinks do get gradients.
    for grad in grads[3:]:
        if grad is not None:
            assert _max_abs(grad, 0) > 1e-3


def test_a_scalar_sink_serves_every_head():
    """``sinks=()`` is one logit for every query head: the same as ``(N,)`` copies of it, on
    the plain path and in the chunked kernel, grouped heads included."""
    queries, keys, values = _qkv()
    mod, sink = mods.causal(S - T), np.float32(0.7)
    per_head = scoring.dot_product_attention(queries, keys, values, mask_mod=mod,
                                             sinks=_device(np.full(N, sink)), return_lse=True)
    plain = scoring.dot_product_attention(queries, keys, values, mask_mod=mod,
                                          sinks=_device(sink), return_lse=True)
    _close(plain, per_head)
    chunked = jax.jit(functools.partial(efficient.dot_product_attention, mask_mod=mod,
                                        return_lse=True, query_chunk_size=CHUNKS[0],
                                        key_chunk_size=CHUNKS[1]))
    _close(chunked(queries, keys, values, sinks=_device(sink)), per_head[::2])


# --------------------------------------------------------------------------- jit, vmap


def _segments_alibi_sinks(path, queries, keys, values, q_ids, kv_ids, sinks):
    """``(output, lse)`` of packed rows (a padded query) with ALiBi and sinks."""
    kw = dict(mask_mod=mods.segment_ids(q_ids, kv_ids, padding_id=-1), score_mod=mods.alibi(N),
              sinks=sinks, return_lse=True)
    if path == "efficient":
        return efficient.dot_product_attention(queries, keys, values, query_chunk_size=CHUNKS[0],
                                               key_chunk_size=CHUNKS[1], **kw)
    output, _, lse = scoring.dot_product_attention(queries, keys, values, implementation=path,
                                                   **kw)
    return output, lse


@jax.jit
def _low_and_full_precision(queries, keys, values, q_ids, kv_ids, sinks):
    """Per path (plain, efficient): :func:`_segments_alibi_sinks` of the inputs in bfloat16
    and as they are (float32)."""
    low = [x.astype(jnp.bfloat16) for x in (queries, keys, values, sinks)]
    return {path: tuple(_segments_alibi_sinks(path, q, k, v, q_ids, kv_ids, sinks)
                        for q, k, v, sinks in (low, (queries, keys, values, sinks)))
            for path in ("plain", "efficient")}


def _low_and_full_precision_args():
    return _qkv() + (_device(Q_IDS), _device(KV_IDS), _normal((N,), seed=31))


@pytest.mark.parametrize("path", ["plain", "efficient"])
def test_jit_equals_eager(path):
    args = _low_and_full_precision_args()
    eager = _segments_alibi_sinks(path, *args)
    _close(_low_and_full_precision(*args)[path][1], eager)
    assert np.isfinite(np.asarray(eager[0])).all() and _max_abs(eager[0], 0) > 0.1


@jax.jit
def _vmapped_and_merged(queries, keys, values, q_ids, kv_ids, cotangent):
    """The output and query gradient of each path vmapped over the leading axis E (the ids
    too), and of the plain path with E merged into the batch axis. (No sinks: their gradient
    is the float64 cases'.)"""
    def output_and_grad(path, q, k, v, q_ids, kv_ids, ct):
        output, vjp = jax.vjp(
            lambda q: _segments_alibi_sinks(path, q, k, v, q_ids, kv_ids, None)[0], q)
        return output, vjp(ct)[0]

    def merged(x):
        return x.reshape((-1,) + x.shape[2:])

    args = (queries, keys, values, q_ids, kv_ids, cotangent)
    return ([jax.vmap(functools.partial(output_and_grad, path))(*args)
             for path in ("plain", "efficient")],
            output_and_grad("plain", *map(merged, args)))


def test_vmap_over_a_leading_axis_with_vmapped_segment_ids():
    """Under vmap the ids, hence the blocks skipped, differ per example (``lax.cond`` on a
    batched predicate)."""
    E = 2
    queries, keys, values = _qkv(batch=(E, B))
    q_ids = _device(np.stack([Q_IDS, Q_IDS[::-1]]))
    kv_ids = _device(np.stack([KV_IDS, np.sort(KV_IDS[::-1] % 2, axis=-1)]))
    vmapped, merged = _vmapped_and_merged(queries, keys, values, q_ids, kv_ids,
                                          _normal((E, B, N, T, V), seed=33))
    for path in vmapped:
        chex.assert_shape(path[0], (E, B, N, T, V))
        _close(tuple(x.reshape(y.shape) for x, y in zip(path, merged)), merged)
    assert (np.asarray(merged[0]).reshape(E, B, N, T, V)[1, 0, :, 10:] == 0).all()  # padding


# --------------------------------------------------------------------------- block skipping


def _attend_everything(b, h, q, kv):
    return kv >= 0


def _hide_block(q_start, q_size, kv_start, kv_size):
    """A lie: the block of queries 3..5 and keys 4..7 has nothing to attend."""
    return ~((q_start == 3) & (kv_start == 4))


# The two mods whose chunked results are compared with the plain path given a dense mask: the
# lying one, and segment ids (whose blocks do hold nothing to attend when skipped).
SKIPPING = {
    "lying_block_any": lambda: mods.MaskMod(_attend_everything, block_any=_hide_block),
    "segment_ids": lambda: mods.segment_ids(_device(Q_IDS), _device(KV_IDS)),
}


@functools.partial(jax.jit, static_argnames="name")
def _skipping_and_dense(queries, keys, values, dense, cotangent, *, name):
    """Output and (dQ, dK, dV) of: the chunked kernel with the mod; the chunked kernel with
    ``dense``; the plain path with the mod; the plain path with ``dense``."""
    mod = SKIPPING[name]()
    chunked = functools.partial(efficient.dot_product_attention, query_chunk_size=CHUNKS[0],
                                key_chunk_size=CHUNKS[1])
    plain = functools.partial(scoring.dot_product_attention, implementation="plain")
    calls = (lambda q, k, v: chunked(q, k, v, mask_mod=mod),
             lambda q, k, v: chunked(q, k, v, mask=dense),
             lambda q, k, v: plain(q, k, v, mask_mod=mod)[0],
             lambda q, k, v: plain(q, k, v, mask=dense)[0])
    results = []
    for call in calls:
        output, vjp = jax.vjp(call, queries, keys, values)
        results.append((output, vjp(cotangent)))
    return results


def test_the_chunked_kernel_skips_the_blocks_block_any_rules_out():
    """A ``block_any`` that hides one block (queries 3..5, keys 4..7) of keys those queries
    do attend: the chunked kernel drops exactly that block, in both passes — its result is
    the plain path's with those pairs masked, and differs from the truth in rows 3..5 only —
    while the plain path, which skips nothing, ignores ``block_any``."""
    queries, keys, values = _qkv()
    hidden = np.ones((1, 1, T, S), bool)
    hidden[..., 3:6, 4:8] = False
    (lied, lied_grads), hidden_chunked, (plain_lied, plain_lied_grads), plain_hidden = (
        _skipping_and_dense(queries, keys, values, _device(hidden),
                            _normal((B, N, T, V), seed=41), name="lying_block_any"))
    truth = scoring.dot_product_attention(queries, keys, values)[0]
    _close(plain_lied, truth)  # the plain path evaluates the mod on every pair
    _close((lied, lied_grads), plain_hidden)
    _close((lied, lied_grads), hidden_chunked)
    rows = np.abs(np.asarray(lied) - np.asarray(truth)).max(axis=(0, 1, 3)) > 1e-3
    np.testing.assert_array_equal(rows, np.isin(np.arange(T), [3, 4, 5]))
    for got, want in zip(lied_grads, plain_lied_grads):  # the gradients skip it too
        assert _max_abs(got, want) > 1e-3


def test_segment_ids_skip_blocks_and_equal_the_dense_mask_in_the_chunked_kernel():
    # Blocks (queries 0..2, keys 12..15) and (queries 12.., keys 0..3) share no id: skipped.
    mod = SKIPPING["segment_ids"]()
    assert not mod.block_any(0, CHUNKS[0], 12, CHUNKS[1])
    assert not mod.block_any(12, CHUNKS[0], 0, CHUNKS[1])
    assert mod.block_any(3, CHUNKS[0], 4, CHUNKS[1])
    dense = _device(_np_segments(Q_IDS, KV_IDS, None))
    (by_mod, mod_grads), (by_mask, mask_grads), (plain, plain_grads), _ = _skipping_and_dense(
        *_qkv(), dense, _normal((B, N, T, V), seed=42), name="segment_ids")
    _close((by_mod, mod_grads), (by_mask, mask_grads))
    _close((by_mod, mod_grads), (plain, plain_grads))
    assert all(_max_abs(g, 0) > 0.1 for g in mod_grads)


# --------------------------------------------------------------------------- arguments


def test_return_residual_is_return_lse():
    queries, keys, values = _qkv()
    mod = mods.causal(S - T)
    residual = scoring.dot_product_attention(queries, keys, values, mask_mod=mod,
                                             return_residual=True)
    lse = scoring.dot_product_attention(queries, keys, values, mask_mod=mod, return_lse=True)
    assert len(residual) == 3
    chex.assert_trees_all_equal(residual, lse)
    assert len(scoring.dot_product_attention(queries, keys, values, return_residual=False)) == 2


def _returns_ints(b, h, q, kv):
    return kv - q


def _dpa(**kw):
    return lambda: scoring.dot_product_attention(*_qkv(), **kw)


def _efficient(**kw):
    return lambda: efficient.dot_product_attention(*_qkv(), query_chunk_size=CHUNKS[0],
                                                   key_chunk_size=CHUNKS[1], **kw)


BAD = {  # name: (call, error, the message's pattern)
    "mask_mod_not_callable": (_dpa(mask_mod=3), TypeError, "mask_mod must be a function"),
    "mask_mod_not_callable_efficient": (_efficient(mask_mod="causal"), TypeError, "mask_mod"),
    "score_mod_not_callable": (_dpa(score_mod=np.ones(3)), TypeError,
                               "score_mod must be a function"),
    "score_mod_not_callable_module": (
        lambda: scoring.DotProductAttention()(*_qkv(), score_mod=1.0), TypeError, "score_mod"),
    "sinks_shape": (_dpa(sinks=np.zeros(3, np.float32)), ValueError, r"\(4,\).*\(3,\)"),
    "sinks_shape_efficient": (_efficient(sinks=np.zeros((1, N), np.float32)), ValueError,
                              r"\(4,\).*\(1, 4\)"),
    "sinks_int": (_dpa(sinks=np.zeros(N, np.int32)), TypeError, "sinks must be float"),
    "mask_mod_returns_ints": (_dpa(mask_mod=_returns_ints), TypeError, "booleans"),
    "mask_mod_returns_ints_chunked": (_dpa(mask_mod=_returns_ints, implementation="chunked"),
                                      TypeError, "booleans"),
    "mask_mod_returns_ints_efficient": (_efficient(mask_mod=_returns_ints), TypeError,
                                        "booleans"),
    "segment_ids_1d": (lambda: mods.segment_ids(np.zeros(T, np.int32)), ValueError,
                       r"q_segment_ids.*\(B, T\).*\(13,\)"),
    "segment_ids_float": (lambda: mods.segment_ids(np.zeros((B, T))), ValueError, "float"),
    "segment_ids_batch_mismatch": (
        lambda: mods.segment_ids(Q_IDS, KV_IDS[:1]), ValueError, r"same B.*\(2, 13\).*\(1, 17\)"),
    "valid_lengths_3d": (lambda: mods.valid_lengths(np.zeros((B, T, 1), np.int32)), ValueError,
                         "valid_lens"),
    "chunk_size_0": (lambda: mods.chunked_local(0), ValueError, "chunk_size"),
    "global_tokens_negative": (lambda: mods.global_tokens(-1), ValueError, "num_global"),
    "window_negative": (lambda: mods.sliding_window(-1), ValueError, "left"),
    "window_right_negative": (lambda: mods.sliding_window(2, -3), ValueError, "right"),
    "softcap_0": (lambda: mods.softcap(0), ValueError, "cap"),
    "bias_bool_table": (lambda: mods.bias(DENSE), TypeError, "float"),
    "clipped_even_rows": (lambda: mods.clipped_relative_bias(np.zeros((4, 1), np.float32)),
                          ValueError, "odd"),
    "dense_mask_not_bool": (lambda: mods.dense_mask(DENSE.astype(np.int32)), TypeError,
                            "boolean"),
    "no_mods_to_combine": (lambda: mods.and_masks(), ValueError, "at least one"),
    # Arrays that do not fit the scores are refused at the boundary (indexing would clamp or
    # wrap silently): ids for T queries used for S keys, a table of another head count, ...
    "segment_ids_default_keys_shorter_than_S": (
        _dpa(mask_mod=mods.segment_ids(Q_IDS)), ValueError,
        r"kv_segment_ids.*\(2, 17\).*\(2, 13\)"),
    "segment_ids_in_an_and": (
        _efficient(mask_mod=mods.and_masks(mods.causal(), mods.segment_ids(Q_IDS))), ValueError,
        "kv_segment_ids"),
    "valid_lengths_batch": (_dpa(mask_mod=mods.valid_lengths(np.ones(3, np.int32))), ValueError,
                            r"valid_lens must have shape \(2,\)"),
    "dense_mask_rows": (_dpa(mask_mod=mods.dense_mask(np.ones((1, 1, T - 1, S), bool))),
                        ValueError, "keep"),
    "bias_heads": (_dpa(score_mod=mods.bias(np.zeros((1, 3, 1, 1), np.float32))), ValueError,
                   r"table must have shape \(1, 4, 1, 1\)"),
    "alibi_heads": (_efficient(score_mod=mods.alibi(8)), ValueError, r"slopes.*\(4,\)"),
    "t5_heads": (_dpa(score_mod=mods.t5_relative_bias(np.zeros((32, 3), np.float32))),
                 ValueError, "table"),
    "prefix_batch": (_dpa(mask_mod=mods.prefix_lm(np.ones(3, np.int32))), ValueError,
                     "prefix_lens"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_input_is_rejected_naming_it(name):
    call, error, pattern = BAD[name]
    with pytest.raises(error, match=pattern):
        call()


# --------------------------------------------------------------------------- bfloat16


def test_bfloat16_with_mods_and_sinks_is_close_to_float32():
    results = _low_and_full_precision(*_low_and_full_precision_args())
    for path, ((output, lse), (output32, lse32)) in results.items():
        assert output.dtype == jnp.bfloat16 and lse.dtype == jnp.float32, path
        assert np.isfinite(np.asarray(output, np.float32)).all() and np.isfinite(lse).all()
        np.testing.assert_allclose(np.asarray(output, np.float32), output32, atol=3e-2,
                                   err_msg=path)
        np.testing.assert_allclose(lse, lse32, atol=3e-2, err_msg=path)


# --------------------------------------------------------------------------- multi-head


def test_multi_head_attention_mask_mod_equals_its_mask():
    """Self-attention over packed rows: ``mask_mod=segment_ids(ids)`` is ``mask=`` the
    ``(B, 1, T, S)`` mask, for the module and the function, with sinks and a shared key/value
    head too."""
    module = MultiHeadAttention(8, num_heads=2, num_kv_heads=1, rngs=nnx.Rngs(0))
    ids = np.where(Q_IDS == -1, 7, Q_IDS)

    @jax.jit
    def by_mod_and_by_mask(X, ids, mask, sinks):
        mod = mods.segment_ids(ids, padding_id=7)
        return [(module(X, X, X, mask_mod=mod, sinks=sinks),
                 multi_head_attention(module.params_dict(), X, X, X, num_heads=2, mask_mod=mod)),
                (module(X, X, X, mask=mask, sinks=sinks),
                 multi_head_attention(module.params_dict(), X, X, X, num_heads=2, mask=mask))]

    by_mod, by_mask = by_mod_and_by_mask(_normal((B, T, 8), seed=61), _device(ids),
                                         _device(_np_segments(ids, ids, 7)), _normal((2,), seed=62))
    _close(by_mod, by_mask)
    chex.assert_shape(by_mod[1][1], (B, 2, T, T))
    np.testing.assert_array_equal(np.asarray(by_mod[1][1])[1, :, 10:], 0)  # padded queries
