"""Seq2seq with Bahdanau attention in JAX (d2l §11.4): variants, scan vs loops, loss, dropout,
initialisation, one training step, training runs and bad input.

The full default run (250 epochs) is marked ``slow``; the default suite trains tiny models only.

The model tests run under ``jax.jit`` (eagerly only where a test compares eager and jitted calls,
``VariantsTest``): a compilation per eager operation costs far more than the check it serves.
Inputs reach the device by ``jax.device_put`` of NumPy arrays and are compared in NumPy.
"""

from __future__ import annotations

import functools
import math
import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jax_attention.data import archive, nmt as data

from jax_attention.models import bahdanau
from jax_attention.train import BOOK_PAIRS, train_bahdanau
from reference_numpy import bahdanau as np_bahdanau
from tests.params_support import rename
from tests.reproducibility import assert_same_losses, assert_same_params
from tests.shared_runs import EPOCHS, book_run_seed_counts, book_run_text, tiny_settings

B, S, T = 3, 5, 4
V_SRC, V_TGT, E, H, L = 10, 12, 4, 6, 2
BOS = 2
DIMS = chex.Dimensions(B=B, S=S, T=T, L=L, H=H, V=V_TGT)


def _params(seed=0):
    return bahdanau.init_params(jax.random.key(seed), V_SRC, V_TGT, E, H, L)


def _numpy_inputs(seed=1):
    rng = np.random.default_rng(seed)
    src = rng.integers(0, V_SRC, size=(B, S)).astype(np.int32)
    src_valid_len = np.asarray([1, S, 3], np.int32)
    tgt = rng.integers(0, V_TGT, size=(B, T)).astype(np.int32)
    tgt_valid_len = np.asarray([2, T, 0], np.int32)
    return src, src_valid_len, tgt, tgt_valid_len


def _inputs(seed=1):
    """:func:`_numpy_inputs` on the device (``jax.device_put`` compiles nothing)."""
    return tuple(jax.device_put(a) for a in _numpy_inputs(seed))


#: The model, compiled once for the shapes above and shared by the tests.
_seq2seq = jax.jit(bahdanau.seq2seq, static_argnames="dropout")


class VariantsTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_encoder_and_decoder_shapes(self):
        params = _params()
        src, src_valid_len, tgt, _ = _inputs()
        outputs, state = self.variant(bahdanau.encoder)(params["encoder"], src)
        chex.assert_shape([outputs, state], [DIMS["BSH"], DIMS["LBH"]])
        logits, final, weights = self.variant(bahdanau.decoder)(
            params["decoder"], tgt, state, outputs, src_valid_len)
        chex.assert_shape([logits, final, weights], [DIMS["BTV"], DIMS["LBH"], DIMS["BTS"]])
        chex.assert_tree_all_finite([logits, final, weights])

    @chex.variants(with_jit=True, without_jit=True)
    def test_seq2seq_agrees_with_itself_under_jit(self):
        params = _params()
        src, src_valid_len, tgt, _ = _inputs()
        # Jitted as _seq2seq is: the program the other tests run on these shapes.
        logits, weights = self.variant(bahdanau.seq2seq, static_argnames="dropout")(
            params, src, src_valid_len, tgt)
        eager_logits, eager_weights = bahdanau.seq2seq(params, src, src_valid_len, tgt)
        np.testing.assert_allclose(np.asarray(logits), np.asarray(eager_logits), rtol=1e-5,
                                   atol=1e-6)
        np.testing.assert_allclose(np.asarray(weights), np.asarray(eager_weights), rtol=1e-5,
                                   atol=1e-6)


def test_gru_scan_equals_a_python_loop_of_cells():
    params = _params()["encoder"]["gru"]
    inputs = np.random.default_rng(2).normal(size=(B, S, E)).astype(np.float32)
    outputs, state = jax.jit(bahdanau.gru)(params, jax.device_put(inputs))
    cell = jax.jit(bahdanau.gru_cell)  # one program per layer's input width
    layer_inputs, final = inputs, []
    for layer in range(L):
        h, steps = np.zeros((B, H), np.float32), []
        for t in range(S):
            h = np.asarray(cell(params[f"layer_{layer}"], layer_inputs[:, t], h))
            steps.append(h)
        final.append(h)
        layer_inputs = np.stack(steps, axis=1)
    np.testing.assert_allclose(np.asarray(outputs), layer_inputs, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(state), np.stack(final), rtol=1e-5, atol=1e-6)


def test_decoder_scan_equals_a_python_loop_of_steps():
    params = _params()
    src, src_valid_len, tgt, _ = _numpy_inputs()
    enc_outputs, state = jax.jit(bahdanau.encoder)(params["encoder"], src)
    logits, final, weights = jax.device_get(jax.jit(bahdanau.decoder)(
        params["decoder"], tgt, state, enc_outputs, src_valid_len))
    step = jax.jit(bahdanau.decoder_step)
    for t in range(T):
        step_logits, state, step_weights = step(params["decoder"], tgt[:, t], state, enc_outputs,
                                                src_valid_len)
        np.testing.assert_allclose(logits[:, t], np.asarray(step_logits), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(weights[:, t], np.asarray(step_weights), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(final, np.asarray(state), rtol=1e-5, atol=1e-6)


def test_masked_cross_entropy_by_hand():
    # Two classes; uniform logits give log 2 per step, a confident right answer about 0.
    logits = np.asarray([[[0.0, 0.0], [0.0, 0.0], [0.0, 0.0]],
                         [[0.0, math.log(3.0)], [5.0, 5.0], [0.0, 0.0]]], np.float32)
    labels = np.asarray([[0, 1, 1], [1, 0, 0]], np.int32)
    valid_len = np.asarray([2, 1], np.int32)
    masked_cross_entropy = jax.jit(bahdanau.masked_cross_entropy)  # one program for both calls
    loss = masked_cross_entropy(logits, labels, valid_len)
    # Row 0: two valid steps of log 2, over T = 3. Row 1: one step, -log(3/4), over 3.
    np.testing.assert_allclose(np.asarray(loss), [2 * math.log(2) / 3, -math.log(0.75) / 3],
                               rtol=1e-6)
    assert float(np.asarray(masked_cross_entropy(logits, labels,
                                                 np.zeros(2, np.int32))).sum()) == 0


def test_masked_cross_entropy_of_a_cut_batch_with_the_books_divisor():
    """A batch cut to its longest sentence, divided by the length it was padded to, gives the
    padded batch's loss: the cut steps were padding, counted as zero."""
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 7, 5)).astype(np.float32)
    labels = rng.integers(0, 5, size=(3, 7)).astype(np.int32)
    valid_len = np.asarray([4, 0, 2], np.int32)
    full = bahdanau.masked_cross_entropy(logits, labels, valid_len)
    cut = bahdanau.masked_cross_entropy(logits[:, :4], labels[:, :4], valid_len, num_steps=7)
    np.testing.assert_allclose(np.asarray(cut), np.asarray(full), rtol=1e-6)
    same = bahdanau.masked_cross_entropy(logits, labels, valid_len, num_steps=7)
    np.testing.assert_array_equal(np.asarray(same), np.asarray(full))
    with pytest.raises(ValueError, match=r"num_steps must be an integer >= 4, got 3"):
        bahdanau.masked_cross_entropy(logits[:, :4], labels[:, :4], valid_len, num_steps=3)


def test_teacher_forcing_inputs_shift_right_after_bos():
    tgt = jnp.asarray([[5, 6, 3, 1], [7, 3, 1, 1]], jnp.int32)
    np.testing.assert_array_equal(bahdanau.teacher_forcing_inputs(tgt, BOS),
                                  [[BOS, 5, 6, 3], [BOS, 7, 3, 1]])


def test_dropout_only_with_a_key_and_reproducible():
    params = _params()
    src, src_valid_len, tgt, _ = _inputs()
    run = _seq2seq
    key = functools.partial(jax.random.key, impl="rbg")
    plain, _ = run(params, src, src_valid_len, tgt)
    no_rate, _ = run(params, src, src_valid_len, tgt, dropout=0.0, dropout_rng=key(0))
    first, _ = run(params, src, src_valid_len, tgt, dropout=0.5, dropout_rng=key(0))
    again, _ = run(params, src, src_valid_len, tgt, dropout=0.5, dropout_rng=key(0))
    other, _ = run(params, src, src_valid_len, tgt, dropout=0.5, dropout_rng=key(1))
    np.testing.assert_array_equal(plain, no_rate)
    np.testing.assert_array_equal(first, again)
    assert not np.allclose(first, plain) and not np.allclose(first, other)


def test_module_train_and_eval_modes():
    # An "rbg" dropout key: threefry's mask kernels would take seconds to compile on CPU.
    rngs = nnx.Rngs(params=0, dropout=jax.random.key(0, impl="rbg"))
    model = bahdanau.BahdanauSeq2Seq(V_SRC, V_TGT, E, H, L, dropout=0.5, rngs=rngs)
    src, src_valid_len, tgt, _ = _inputs()
    call = nnx.jit(lambda model: model(src, src_valid_len, tgt))
    first, second = call(model), call(model)
    assert not np.allclose(first, second)  # a new dropout mask each call
    model.eval()
    evaluated = call(model)
    expected, _ = _seq2seq(model.params_dict(), src, src_valid_len, tgt)
    # Equal on CPU; on GPU, XLA fuses the jitted module's graph differently from the functional
    # call's program (last-bit differences, seen on an H200 against the eager call).
    np.testing.assert_allclose(np.asarray(evaluated), np.asarray(expected), rtol=1e-6, atol=1e-7)
    model.train()
    assert not model.deterministic


def test_initialisation_follows_the_book():
    params = bahdanau.init_params(jax.random.key(0), 300, 400, 32, 32, 2)
    shapes = bahdanau.param_shapes(300, 400, 32, 32, 2)
    assert jax.tree.map(lambda a: a.shape, params) == jax.tree.map(
        tuple, shapes, is_leaf=lambda x: isinstance(x, tuple))
    flat = bahdanau.flatten_params(params)
    assert all(leaf.dtype == jnp.float32 for leaf in flat.values())
    for path, leaf in flat.items():
        leaf = np.asarray(leaf)
        name = path.rsplit("/", 1)[-1]
        if name == "embedding":
            assert abs(leaf.mean()) < 0.05 and abs(leaf.std() - 1) < 0.05, path
        elif name in ("b_x", "b_h", "b"):
            bound = 1 / math.sqrt(32)
            assert np.abs(leaf).max() <= bound and np.abs(leaf).max() > 0.9 * bound, path
        else:  # Xavier-uniform on the (in, out) kernel
            bound = math.sqrt(6 / sum(leaf.shape))
            assert np.abs(leaf).max() <= bound and np.abs(leaf).max() > 0.8 * bound, path
    # Different keys give different parameters; the same key the same.
    again = bahdanau.init_params(jax.random.key(0), 300, 400, 32, 32, 2)
    chex.assert_trees_all_equal(params, again)
    other = bahdanau.init_params(jax.random.key(1), 300, 400, 32, 32, 2)
    assert not np.array_equal(other["decoder"]["dense"]["W"], params["decoder"]["dense"]["W"])


def test_params_round_trip_through_flat_paths():
    params = _params()
    flat = bahdanau.flatten_params(params)
    assert "encoder/gru/layer_1/W_h" in flat and "decoder/attention/w_v" in flat
    chex.assert_trees_all_equal(bahdanau.unflatten_params(flat), params)


def test_one_training_step_decreases_the_loss():
    from jax_attention.train.loop import train_step

    # One GRU layer and no dropout: the smallest step to compile.
    model = bahdanau.BahdanauSeq2Seq(V_SRC, V_TGT, E, H, 1, dropout=0.0, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.chain(optax.clip_by_global_norm(1.0),
                                                 optax.adam(0.01)), wrt=nnx.Param)
    src, src_valid_len, tgt, tgt_valid_len = _inputs()
    dec_input = bahdanau.teacher_forcing_inputs(tgt, BOS)

    # One program for the loss before and after the update.
    total_loss = jax.jit(lambda params: bahdanau.teacher_forcing_loss(
        params, src, src_valid_len, tgt, tgt_valid_len, BOS).sum())

    def loss():
        return float(total_loss(model.params_dict()))

    before = loss()
    reported = train_step(model, optimizer, src, src_valid_len, dec_input, tgt, tgt_valid_len)
    np.testing.assert_allclose(float(reported), before, rtol=1e-5)  # the loss before the update
    after = loss()
    assert after < before


@pytest.mark.parametrize(("call", "message"), [
    (lambda p: bahdanau.encoder(p["encoder"], jnp.asarray([[0, V_SRC]], jnp.int32)),
     r"src must lie in \[0, V\) = \[0, 10\), got values from 0 to 10"),
    (lambda p: bahdanau.encoder(p["encoder"], jnp.asarray([[0.0, 1.0]], jnp.float32)),
     r"src must be integer token ids of shape \(B, T\)"),
    (lambda p: bahdanau.encoder(p["encoder"], jnp.asarray([0, 1], jnp.int32)),
     r"src must be integer token ids of shape \(B, T\), got dtype int32 with shape \(2,\)"),
    (lambda p: bahdanau.gru(p["encoder"]["gru"], jnp.ones((2, 3, E)), jnp.ones((L, 5, H))),
     r"state must have shape \(L, B, h\) = \(2, 2, 6\), got \(2, 5, 6\)"),
    (lambda p: bahdanau.gru_cell(p["encoder"]["gru"]["layer_0"], jnp.ones((2, E + 1)),
                                 jnp.ones((2, H))),
     r"GRU params\['W_x'\] must have shape \(5, 18\)"),
    (lambda p: bahdanau.gru({"layer_1": {}}, jnp.ones((2, 3, E))),
     r"GRU params must hold exactly \['layer_0'\]"),
    (lambda p: bahdanau.seq2seq(p, jnp.zeros((B, S), jnp.int32), jnp.asarray([1, 2, S + 1]),
                                jnp.zeros((B, T), jnp.int32)),
     r"valid_lens must lie in \[0, S\] = \[0, 5\]"),
    (lambda p: bahdanau.seq2seq(p, jnp.zeros((B, S), jnp.int32), jnp.ones(B, jnp.int32),
                                jnp.zeros((B, T), jnp.int32), dropout=1.0),
     r"dropout must be a number with 0 <= dropout < 1, got 1.0"),
    (lambda p: bahdanau.param_shapes(10, 0, 4, 6, 2), r"tgt_vocab_size must be an integer >= 1"),
])
def test_bad_input_raises_with_the_shapes(call, message):
    with pytest.raises(ValueError, match=message):
        call(_params())


# ------------------------------------------------------------------- issue 16: parameter keys


def _np_params():
    return jax.tree.map(np.asarray, _params())


def test_teacher_forcing_loss_of_targets_cut_short_with_the_books_divisor():
    """``num_steps``: targets cut past every valid length give the full targets' loss (the
    decoder's dropout masks, drawn time first, are the full ones' already), in JAX and NumPy."""
    params = _np_params()
    src, src_valid_len, tgt, _ = _numpy_inputs()
    tgt_valid_len, cut = np.asarray([2, 3, 0], np.int32), 3
    for module in (bahdanau, np_bahdanau):
        full = module.teacher_forcing_loss(params, src, src_valid_len, tgt, tgt_valid_len, BOS)
        short = module.teacher_forcing_loss(params, src, src_valid_len, tgt[:, :cut],
                                            tgt_valid_len, BOS, num_steps=T)
        np.testing.assert_allclose(np.asarray(short), np.asarray(full), rtol=1e-6)
        with pytest.raises(ValueError, match=rf"num_steps must be an integer >= {cut}"):
            module.teacher_forcing_loss(params, src, src_valid_len, tgt[:, :cut],
                                        tgt_valid_len, BOS, num_steps=cut - 1)


@pytest.mark.parametrize("path, new_name, message", [
    (("decoder", "attention", "w_v"), "w_V",
     r"params\['decoder'\]\['attention'\] has unexpected keys \['w_V'\] and missing keys "
     r"\['w_v'\]: "
     r"expected the keys \['W_q', 'W_k', 'w_v'\]"),
    (("encoder", "gru", "layer_1", "b_h"), None,
     r"params\['encoder'\]\['gru'\]\['layer_1'\] has unexpected keys \['extra'\]: expected "
     r"the keys "
     r"\['W_x', 'W_h', 'b_x', 'b_h'\]"),
    (("decoder", "dense"), "Dense", r"params\['decoder'\] has unexpected keys \['Dense'\] and "
                                    r"missing keys \['dense'\]"),
    (("encoder",), "Encoder", r"params has unexpected keys \['Encoder'\] and missing keys "
                              r"\['encoder'\]: expected the keys \['encoder', 'decoder'\]"),
])
def test_misspelled_or_extra_param_keys_are_named_with_their_path(path, new_name, message):
    params = rename(_np_params(), path, new_name)
    src, src_valid_len, tgt, tgt_valid_len = (np.asarray(a) for a in _inputs())
    for module in (bahdanau, np_bahdanau):
        with pytest.raises(ValueError, match=message):
            module.seq2seq(params, src, src_valid_len, tgt)
        with pytest.raises(ValueError, match=message):
            module.teacher_forcing_loss(params, src, src_valid_len, tgt, tgt_valid_len, BOS)
        with pytest.raises(ValueError, match=message):
            module.greedy_decode(params, src, src_valid_len, bos_id=BOS, eos_id=3, pad_id=1,
                                 max_len=2)


def test_misspelled_keys_of_the_parts_are_named_too():
    params = rename(_np_params(), ("decoder", "gru", "layer_0", "W_h"), "W_H")
    state = np.zeros((L, B, H), np.float32)
    enc_outputs = np.zeros((B, S, H), np.float32)
    layer = params["decoder"]["gru"]["layer_0"]
    for module in (bahdanau, np_bahdanau):
        with pytest.raises(ValueError, match=r"params\['gru'\]\['layer_0'\] has unexpected keys "
                                             r"\['W_H'\] and missing keys \['W_h'\]"):
            module.decoder_step(params["decoder"], np.ones(B, np.int32), state, enc_outputs,
                                np.full(B, S, np.int32))
        with pytest.raises(ValueError, match=r"params has unexpected keys \['W_H'\]"):
            module.gru_cell(layer, np.zeros((B, H + E), np.float32), np.zeros((B, H), np.float32))
        with pytest.raises(ValueError, match=r"params\['layer_0'\] has unexpected keys \['W_H'\]"):
            module.gru(params["decoder"]["gru"], np.zeros((B, T, H + E), np.float32))
        encoder = rename(_np_params()["encoder"], ("embedding",), None)
        with pytest.raises(ValueError, match=r"params has unexpected keys \['extra'\]"):
            module.encoder(encoder, np.zeros((B, S), np.int32))


# --------------------------------------------------------------------------- training runs

#: The session's tiny Bahdanau run (tests/shared_runs.py): its compiled programs are shared.
TINY = tiny_settings("bahdanau")


@pytest.fixture(scope="module")
def run():
    return train_bahdanau(**TINY)


def test_tiny_run_reports_everything(run):
    assert len(run.losses) == len(run.tokens_per_sec) == len(run.cross_entropy) == EPOCHS
    assert all(np.isfinite(run.losses)) and run.losses[-1] < run.losses[0]
    np.testing.assert_allclose(run.cross_entropy, np.asarray(run.losses) * TINY["num_steps"])
    assert all(rate > 0 for rate in run.tokens_per_sec)
    assert [t.source for _, t in run.translations] == [source for source, _ in BOOK_PAIRS]
    assert [reference for reference, _ in run.translations] == [ref for _, ref in BOOK_PAIRS]
    assert all(0.0 <= score <= 1.0 for score in run.bleu)
    assert run.config["training"]["seed"] == TINY["seed"]
    assert run.config["num_steps"] == TINY["num_steps"]
    assert run.config["src_vocab_size"] == len(run.src_vocab) and run.checkpoint is None
    chex.assert_trees_all_equal(run.params, jax.tree.map(np.asarray, run.model.params_dict()))
    assert run.model.deterministic  # returned in eval mode
    figures = run.figures()
    assert figures["final_loss"] == run.losses[-1] and len(figures["translations"]) == 4


def test_same_seed_same_run_bit_for_bit(run, tiny_run):
    again = train_bahdanau(**TINY)
    assert_same_losses(again.losses, run.losses)
    assert_same_params(again.params, run.params)
    # The library's run is the command's: the session's tiny run of `jax-attention train`.
    assert_same_losses(run.losses, tiny_run("bahdanau").record["losses"])
    other = train_bahdanau(**{**TINY, "seed": TINY["seed"] + 1})
    assert other.losses != run.losses


def test_logs_every_few_epochs():
    lines = []
    train_bahdanau(**{**TINY, "log": lines.append}, log_every=2)
    assert lines[0].startswith("compiling the training step")
    assert lines[1].startswith(("compiled the training step", "loaded the training step"))
    assert [line.split(",")[0] for line in lines[2:]] == ["epoch 2", "epoch 3"]
    assert re.fullmatch(r"epoch 2, loss \d+\.\d{4}, \d+\.\d tokens/sec, about [\d.]+ s left",
                        lines[2])


def test_missing_data_file_gives_the_clear_error(monkeypatch, tmp_path):
    monkeypatch.delenv(data.ENV_VAR, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(archive, "checkout_candidates", lambda: [tmp_path / "nowhere.zip"])
    with pytest.raises(FileNotFoundError, match="was not found. Looked at") as error:
        train_bahdanau(**TINY)
    assert "--data PATH" in str(error.value) and data.ENV_VAR in str(error.value)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        train_bahdanau(data=tmp_path / "no-such.zip", **TINY)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"epochs": 0}, r"epochs must be an integer >= 1, got 0"),
    ({"lr": -1.0}, r"lr must be a finite number > 0, got -1.0"),
    ({"dropout": 1.0}, r"dropout must be a number with 0 <= dropout < 1, got 1.0"),
    ({"num_layers": 0}, r"num_layers must be an integer >= 1, got 0"),
    ({"seed": -1}, r"seed must be an integer in \[0, 9223372036854775807\], got -1"),
])
def test_training_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        train_bahdanau(**{**TINY, **kwargs})


@pytest.mark.slow  # the whole book run: 250 epochs
def test_the_books_run_on_seed_0_gets_what_the_docs_say(book_run):
    """d2l §11.4.3 with its settings, seed 0 (the shared book run): the book's loss, and as many
    of the four sentences exactly as docs/models.md's seed-by-seed figures give seed 0 (the book:
    va ! / j'ai perdu . / il est riche . (0.658) / je suis chez moi .; its printed lines are
    tests/test_readme_outputs.py's)."""
    record = book_run("bahdanau").record
    low, high = _loss_range()  # the book: loss 0.020
    assert low <= record["final_loss"] <= high
    _, counts = book_run_seed_counts("bahdanau")
    assert record["num_bleu_1"] == counts[0]


def _loss_range() -> tuple[float, float]:
    """docs/models.md's "with a final loss between A and B" over seeds 0–5 of the book's run."""
    match = re.search(r"with a\s+final loss between (\d+\.\d+) and (\d+\.\d+)",
                      book_run_text("bahdanau"))
    return float(match.group(1)), float(match.group(2))


@pytest.mark.slow
@pytest.mark.skipif(jax.default_backend() != "cpu",
                    reason="bit-identical only on CPU: elsewhere rounding moves which sentences")
@pytest.mark.parametrize("seed", range(1, 6))
def test_the_books_run_on_seeds_1_to_5_gets_what_the_docs_say(seed):
    """The book's quality is a claim over seeds: each seed's exact sentences are docs/models.md's
    figure for it."""
    run = train_bahdanau(seed=seed, progress=False, log=None)
    _, counts = book_run_seed_counts("bahdanau")
    assert sum(score == 1.0 for score in run.bleu) == counts[seed], [
        (t.source, t.translation) for _, t in run.translations]
    low, high = _loss_range()
    assert low <= run.losses[-1] <= high


def test_module_takes_params_like_the_transformer():
    """``BahdanauSeq2Seq(params=...)`` holds exactly those values; wrong shapes are refused."""
    from jax_attention.models.bahdanau import BahdanauSeq2Seq as Module
    from jax_attention.models.bahdanau import init_params as init
    from jax_attention.params import flatten_params as flat

    params = init(jax.random.key(3), 11, 13, 8, 16, 2)
    module = Module(11, 13, 8, 16, 2, rngs=nnx.Rngs(0), params=params)
    got, want = flat(module.params_dict()), flat(params)
    assert set(got) == set(want)
    for path in want:
        np.testing.assert_array_equal(np.asarray(got[path]), np.asarray(want[path]))
    fresh = flat(Module(11, 13, 8, 16, 2, rngs=nnx.Rngs(0)).params_dict())
    assert not np.array_equal(np.asarray(fresh["decoder/dense/W"]),
                              np.asarray(want["decoder/dense/W"]))
    with pytest.raises(ValueError, match="params must have the shapes"):
        Module(11, 13, 8, 32, 2, rngs=nnx.Rngs(0), params=params)
