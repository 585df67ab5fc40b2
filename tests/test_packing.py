"""Packed batches (issue 52): several sentence pairs in one row, told apart by segment ids, in
the Transformer (:mod:`jax_attention.models.packing`) and in the data (first-fit decreasing,
:mod:`jax_attention.data.batches`).

The model's promise is checked where it is exact: in float64 with dropout off, a packed batch's
per-sentence losses, its summed loss's gradient and each sentence's logits equal the unpacked
batch's to rounding. The packing's: the same sentences, each once, in rows no longer than asked;
a row shorter than a sentence, or packing for the Bahdanau model, is one ``ValueError``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jax_attention.data import batches
from jax_attention.models import bahdanau, packing, transformer
from jax_attention.train import train_transformer
from tests.reproducibility import assert_same_losses
from tests.shared_runs import tiny_settings

V_SRC, V_TGT, D, F, N = 11, 13, 8, 12, 2
BOS, PAD = 2, 1
NUM_STEPS = 6
SRC_LEN = np.array([3, 2, 4, 1, 2, 6])
TGT_LEN = np.array([4, 2, 5, 3, 1, 2])
ROW = 8


def _unpacked(seed=0):
    """Six pairs padded to ``(6, 6)``: sources and targets of the lengths above."""
    rng = np.random.default_rng(seed)
    src = rng.integers(3, V_SRC, (6, NUM_STEPS)).astype(np.int32)
    tgt = rng.integers(3, V_TGT, (6, NUM_STEPS)).astype(np.int32)
    src[np.arange(NUM_STEPS) >= SRC_LEN[:, None]] = PAD
    tgt[np.arange(NUM_STEPS) >= TGT_LEN[:, None]] = PAD
    return src, SRC_LEN.astype(np.int32), tgt, TGT_LEN.astype(np.int32)


def _packed():
    src, src_len, tgt, tgt_len = _unpacked()
    rows = batches.first_fit_decreasing(src_len, tgt_len, ROW, ROW)
    return rows, batches.pack_batch(src, src_len, tgt, tgt_len, rows, ROW, ROW, num_rows=4,
                                    pad_id=PAD)


def test_first_fit_decreasing_packs_every_pair_once_within_the_rows():
    rows, (src, src_seg, tgt, tgt_seg) = _packed()
    assert sorted(i for row in rows for i in row) == list(range(6))
    assert len(rows) == 3 and src.shape == tgt.shape == (4, ROW)  # one row all padding
    unpacked = _unpacked()
    for r, members in enumerate(rows):
        for segment, i in enumerate(members, 1):
            np.testing.assert_array_equal(src[r][src_seg[r] == segment],
                                          unpacked[0][i, :SRC_LEN[i]])
            np.testing.assert_array_equal(tgt[r][tgt_seg[r] == segment],
                                          unpacked[2][i, :TGT_LEN[i]])
    assert not src_seg[3].any() and (src[3] == PAD).all()
    with pytest.raises(ValueError, match="does not fit a packed row of 5"):
        batches.first_fit_decreasing(SRC_LEN, TGT_LEN, 5, 5)


def test_segment_positions_and_teacher_forcing_restart_at_each_sentence():
    ids = np.array([[1, 1, 1, 2, 2, 0, 0]])
    np.testing.assert_array_equal(packing.segment_positions(ids), [[0, 1, 2, 0, 1, 0, 1]])
    tgt = np.array([[5, 6, 7, 8, 9, 1, 1]])
    np.testing.assert_array_equal(packing.packed_teacher_forcing_inputs(tgt, ids, BOS),
                                  [[BOS, 5, 6, BOS, 8, BOS, 1]])


def test_packed_losses_gradients_and_logits_equal_the_unpacked_x64(x64):
    # One layer: it holds all three attentions (a second repeats them) and compiles in half the
    # time of two.
    params = jax.tree.map(lambda x: np.asarray(x, np.float64), transformer.init_params(
        jax.random.key(0), V_SRC, V_TGT, D, F, N, 1))
    src, src_len, tgt, tgt_len = _unpacked()
    rows, (psrc, src_seg, ptgt, tgt_seg) = _packed()
    segments = packing.segments(src_seg, tgt_seg)

    def unpacked_loss(p):
        return transformer.teacher_forcing_loss(p, src, src_len, tgt, tgt_len, BOS, num_heads=N,
                                                num_steps=NUM_STEPS)

    def packed_loss(p):
        return transformer.teacher_forcing_loss(p, psrc, None, ptgt, None, BOS, num_heads=N,
                                                num_steps=NUM_STEPS, segments=segments)

    # Jitted: one program each, not one per primitive.
    per_sentence = jax.jit(unpacked_loss)(params)
    per_row = jax.jit(packed_loss)(params)
    for r, members in enumerate(rows):
        np.testing.assert_allclose(per_row[r], sum(per_sentence[i] for i in members), rtol=1e-13)
    assert per_row[3] == 0  # the row of padding
    got = jax.jit(jax.grad(lambda p: jnp.sum(packed_loss(p))))(params)
    want = jax.jit(jax.grad(lambda p: jnp.sum(unpacked_loss(p))))(params)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-11, atol=1e-13)
    # Each sentence's logits, through the NNX module: those of the unpacked batch.
    model = transformer.TransformerSeq2Seq(V_SRC, V_TGT, D, F, N, 1, rngs=nnx.Rngs(0),
                                           params=params, param_dtype=jnp.float64)
    dec_input = np.concatenate([np.full((6, 1), BOS), tgt[:, :-1]], axis=1)
    logits = model(src, src_len, dec_input)
    packed_logits = model(psrc, None, packing.packed_teacher_forcing_inputs(ptgt, tgt_seg, BOS),
                          segments=segments)
    per_segment = packing.segment_losses(packed_logits, ptgt, tgt_seg, max(map(len, rows)),
                                         num_steps=NUM_STEPS)
    for r, members in enumerate(rows):
        for segment, i in enumerate(members, 1):
            np.testing.assert_allclose(packed_logits[r][np.asarray(tgt_seg[r]) == segment],
                                       logits[i, :TGT_LEN[i]], rtol=1e-11, atol=1e-12)
            np.testing.assert_allclose(per_segment[r, segment - 1], per_sentence[i], rtol=1e-12)


def test_bad_packing_is_one_clear_error_before_any_work():
    src, _, tgt, _ = _unpacked()
    seg = np.ones((6, NUM_STEPS), np.int32)
    with pytest.raises(ValueError, match="src_segment_ids must be integer ids of the shape"):
        transformer.transformer(transformer.init_params(jax.random.key(0), V_SRC, V_TGT, D, F,
                                                        N, 1), src, None, tgt, num_heads=N,
                                segments=packing.segments(seg[:, :3], seg))
    with pytest.raises(ValueError, match="needs num_steps"):
        transformer.teacher_forcing_loss(
            transformer.init_params(jax.random.key(0), V_SRC, V_TGT, D, F, N, 1), src, None,
            tgt, None, BOS, num_heads=N, segments=packing.segments(seg, seg))
    model = bahdanau.BahdanauSeq2Seq(V_SRC, V_TGT, 4, 4, 1, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="cannot take packed batches"):
        model(src, None, tgt, segments=packing.segments(seg, seg))
    with pytest.raises(ValueError, match="cannot take packed batches"):
        from jax_attention.train import train_bahdanau
        train_bahdanau(epochs=1, pack=True, progress=False, log=None)
    with pytest.raises(ValueError, match="pack_length = 3 is shorter than the longest"):
        train_transformer(epochs=1, pack=True, pack_length=3, progress=False, log=None)


@pytest.mark.slow
def test_packed_training_runs_and_trains_on_the_same_tokens():
    """A tiny packed run: the same target tokens a step as the unpacked run, finite losses
    near the unpacked run's (other dropout masks, another summation order)."""
    settings = dict(epochs=2, num_examples=96, num_layers=1, progress=False, log=None)
    packed = train_transformer(pack=True, **settings)
    unpacked = train_transformer(**settings)
    assert np.isfinite(packed.losses).all()
    np.testing.assert_allclose(packed.losses, unpacked.losses, rtol=0.1)


@pytest.mark.slow
def test_a_packed_run_resumed_equals_the_uninterrupted_run(tmp_path):
    """A packed run stopped after its second epoch and resumed for a third trains as the run of
    three epochs, bit for bit on CPU: each epoch packs its own batches alike."""
    settings = {**tiny_settings("transformer"), "pack": True, "progress": False, "log": None}
    whole = train_transformer(**{**settings, "epochs": 3})
    train_transformer(**{**settings, "epochs": 2}, checkpoint_dir=tmp_path)
    resumed = train_transformer(**{**settings, "epochs": 3}, checkpoint_dir=tmp_path, resume=True)
    assert resumed.resumed_from_step is not None
    assert_same_losses(resumed.losses, whole.losses)
