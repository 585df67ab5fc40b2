"""The Transformer in JAX (d2l §11.7): variants, key/value cache, greedy and beam decoding,
attention weights, causality, dropout, initialisation, training and bad input.

The full default run (200 epochs) is marked ``slow``; the default suite trains tiny models only.

A compilation costs far more than the check it serves, so the model runs under ``jax.jit`` (the
eager path only in ``VariantsTest``, whose subject it is), inputs are put on the device with
``jax.device_put`` (nothing to compile) and compared in NumPy, and the tests share programs: one
set of shapes, the module-level jitted functions below, one ``max_len`` for the greedy decoders.
"""

from __future__ import annotations

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jax_attention.models import decoding, transformer
from jax_attention.train import BOOK_PAIRS, train_transformer
from reference_numpy import transformer as np_transformer
from tests.params_support import rename
from tests.shared_runs import book_run_seed_counts

B, S, T = 3, 6, 5
V_SRC, V_TGT, D, F, N, L = 11, 13, 8, 12, 2, 2
BOS, EOS, PAD = 2, 3, 1
DIMS = chex.Dimensions(B=B, S=S, T=T, L=L, N=N, D=D, V=V_TGT)


def _params(seed=0):
    return transformer.init_params(jax.random.key(seed), V_SRC, V_TGT, D, F, N, L)


def _as_float64(params):
    """``params`` in float64, cast on the host (call it with x64 enabled): the float32 draw's
    program serves every dtype instead of one initialisation program per dtype (and per x64
    setting, which is part of a jitted function's cache key)."""
    return jax.tree.map(lambda x: np.asarray(x, np.float64), params)


_forward = jax.jit(transformer.transformer, static_argnames=("num_heads", "dropout", "num_steps"))


def _initial_cache(params, src, src_valid_len, *, num_heads, max_len):
    """The decoder's key/value cache after the encoder (one program)."""
    enc_outputs, _ = transformer.encoder(params["encoder"], src, src_valid_len,
                                         num_heads=num_heads)
    return transformer.init_decoder_state(params["decoder"], enc_outputs, src_valid_len,
                                          num_heads=num_heads, max_len=max_len)


_initial_cache = jax.jit(_initial_cache, static_argnames=("num_heads", "max_len"))

#: The decoding steps of the decoders below: one for all, so that they share their programs (with
#: tests/parity/test_transformer.py's too, through the session's compilation cache).
MAX_LEN = 7


def _device(array, dtype=None):
    """``array`` as a JAX array of ``dtype``, cast by NumPy: ``jnp.asarray`` would compile a
    conversion program for every new shape and dtype, ``jax.device_put`` compiles nothing."""
    return jax.device_put(np.asarray(array, dtype))


def _numpy_inputs(seed=1):
    rng = np.random.default_rng(seed)
    src = rng.integers(0, V_SRC, size=(B, S)).astype(np.int32)
    src_valid_len = np.asarray([1, S, 3], np.int32)
    dec_input = rng.integers(0, V_TGT, size=(B, T)).astype(np.int32)
    return src, src_valid_len, dec_input


def _inputs(seed=1):
    return tuple(_device(a) for a in _numpy_inputs(seed))


class VariantsTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_forward_shapes_and_weights(self):
        params = _params()
        src, src_valid_len, dec_input = _inputs()

        # Jitted as _forward is: the program the other tests run on these shapes.
        forward = self.variant(transformer.transformer, static_argnames=("num_heads", "dropout"))
        logits, weights = forward(params, src, src_valid_len, dec_input, num_heads=N)
        chex.assert_shape(logits, DIMS["BTV"])
        chex.assert_shape([weights["encoder_self"], weights["decoder_self"],
                           weights["encoder_decoder"]],
                          [DIMS["LBNSS"], DIMS["LBNTT"], DIMS["LBNTS"]])
        for name, w in weights.items():
            np.testing.assert_allclose(np.asarray(w).sum(-1), 1.0, rtol=1e-5, err_msg=name)
        # Keys past the source valid length get no weight; the decoder never looks ahead.
        valid = np.asarray(src_valid_len)
        for b in range(B):
            assert np.all(np.asarray(weights["encoder_decoder"])[:, b, :, :, valid[b]:] == 0)
            assert np.all(np.asarray(weights["encoder_self"])[:, b, :, :, valid[b]:] == 0)
        upper = np.triu(np.ones((T, T), bool), k=1)
        assert np.all(np.asarray(weights["decoder_self"])[..., upper] == 0)


def test_causality_future_targets_do_not_change_earlier_outputs():
    params = _params()
    src, src_valid_len, dec_input = _inputs()
    logits, _ = _forward(params, src, src_valid_len, dec_input, num_heads=N)
    changed = np.array(dec_input)
    changed[:, 3:] = (changed[:, 3:] + 1) % V_TGT
    other, _ = _forward(params, src, src_valid_len, _device(changed), num_heads=N)
    logits, other = np.asarray(logits), np.asarray(other)
    np.testing.assert_allclose(other[:, :3], logits[:, :3], rtol=1e-6, atol=1e-6)
    assert not np.allclose(other[:, 3:], logits[:, 3:])


def test_greedy_decode_rows_stop_at_eos():
    params = _params(seed=3)
    src, src_valid_len, _ = _inputs()
    max_len = MAX_LEN
    tokens, lengths, weights = transformer.greedy_decode(
        params, src, src_valid_len, num_heads=N, bos_id=BOS, eos_id=EOS, pad_id=PAD,
        max_len=max_len)
    chex.assert_shape([tokens, lengths, weights], [(B, max_len), (B,), (B, max_len, S)])
    tokens = np.asarray(tokens)
    for row, length in zip(tokens, np.asarray(lengths)):
        assert EOS not in row[:length]
        if length < max_len:
            assert row[length] == EOS
            assert np.all(row[length + 1:] == PAD)


def test_greedy_decode_with_eos_forced_per_row():
    """Rows that predict <eos> at different steps: force it by biasing the output layer."""
    params = _params(seed=4)
    src, src_valid_len, _ = _inputs()
    bias = np.array(params["decoder"]["dense"]["b"])
    bias[EOS] = 100.0
    params["decoder"]["dense"]["b"] = _device(bias)
    tokens, lengths, _ = transformer.greedy_decode(params, src, src_valid_len, num_heads=N,
                                                   bos_id=BOS, eos_id=EOS, pad_id=PAD,
                                                   max_len=MAX_LEN)
    np.testing.assert_array_equal(lengths, np.zeros(B))
    np.testing.assert_array_equal(tokens, np.asarray([[EOS] + [PAD] * (MAX_LEN - 1)] * B))


@pytest.mark.skipif(not hasattr(decoding, "beam_search"), reason="decoding.beam_search missing")
def test_beam_size_one_equals_greedy_and_beams_are_sorted():
    params = _params(seed=3)
    src, src_valid_len, _ = _inputs()
    kwargs = dict(num_heads=N, bos_id=BOS, eos_id=EOS, pad_id=PAD, max_len=MAX_LEN)
    greedy_tokens, greedy_lengths, _ = transformer.greedy_decode(params, src, src_valid_len,
                                                                 **kwargs)
    tokens, lengths, scores = transformer.beam_decode(params, src, src_valid_len, beam_size=1,
                                                      **kwargs)
    np.testing.assert_array_equal(tokens[:, 0], greedy_tokens)
    np.testing.assert_array_equal(lengths[:, 0], greedy_lengths)
    tokens, lengths, scores = transformer.beam_decode(params, src, src_valid_len, beam_size=3,
                                                      **kwargs)
    chex.assert_shape([tokens, lengths, scores], [(B, 3, MAX_LEN), (B, 3), (B, 3)])
    assert np.all(np.diff(np.asarray(scores), axis=1) <= 0)


def test_dropout_only_with_a_key_and_reproducible():
    params = _params()
    src, src_valid_len, dec_input = _inputs()
    plain, _ = _forward(params, src, src_valid_len, dec_input, num_heads=N,
                                       dropout=0.5)  # no key: no dropout
    # The same seed, the same masks. Two keys of that seed: under the key-reuse checker a key
    # is drawn from once. An "rbg" key as in training: cheaper to compile than threefry.
    a, _ = _forward(params, src, src_valid_len, dec_input, num_heads=N,
                                   dropout=0.5, dropout_rng=jax.random.key(7, impl="rbg"))
    b, _ = _forward(params, src, src_valid_len, dec_input, num_heads=N,
                                   dropout=0.5, dropout_rng=jax.random.key(7, impl="rbg"))
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, plain)


def test_a_batch_cut_short_of_its_padding_draws_the_full_batchs_dropout_masks():
    """``num_steps``: inputs cut from a batch padded to ``num_steps`` (the sources past every
    valid length, the targets anywhere: the decoder is causal) give the full batch's logits at
    the positions kept, dropout on; the loss, divided by ``num_steps``, is the full one's."""
    params = _params()
    src, src_valid_len, dec_input = (np.asarray(a) for a in _numpy_inputs())
    full_src = np.concatenate([src, np.full((B, 3), PAD, src.dtype)], axis=1)  # 9 steps
    full_dec = np.concatenate([dec_input, dec_input[:, :4]], axis=1)
    key, num_steps = jax.random.key(5, impl="rbg"), S + 3

    def forward(src, dec_input, **kwargs):
        return np.asarray(_forward(params, src, src_valid_len, dec_input, num_heads=N,
                                   dropout=0.3, dropout_rng=key, **kwargs)[0])

    full = forward(full_src, full_dec)
    np.testing.assert_array_equal(forward(full_src, full_dec, num_steps=num_steps), full)
    cut = forward(src, dec_input, num_steps=num_steps)
    np.testing.assert_allclose(cut, full[:, :T], rtol=1e-5, atol=1e-6)
    assert not np.allclose(forward(src, dec_input), full[:, :T], rtol=1e-3)  # the cut's masks
    loss = jax.jit(transformer.teacher_forcing_loss,
                   static_argnames=("bos_id", "num_heads", "dropout", "num_steps"))
    full_tgt = np.concatenate([full_dec[:, 1:], full_dec[:, :1]], axis=1)
    tgt_valid_len = np.asarray([5, 2, 4], np.int32)
    losses = [loss(params, s, src_valid_len, t, tgt_valid_len, BOS, num_heads=N, dropout=0.3,
                   dropout_rng=key, num_steps=num_steps) for s, t in
              [(full_src, full_tgt), (src, full_tgt[:, :T])]]
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-5)
    reference = [np_transformer.teacher_forcing_loss(  # no dropout: the divisor only
        jax.tree.map(np.asarray, params), s, src_valid_len, t, tgt_valid_len, BOS, num_heads=N,
        num_steps=num_steps) for s, t in [(full_src, full_tgt), (src, full_tgt[:, :T])]]
    np.testing.assert_allclose(reference[1], reference[0], rtol=1e-6)
    for function, args in [(transformer.transformer, (dec_input,)), (
            np_transformer.teacher_forcing_loss, (dec_input, tgt_valid_len, BOS))]:
        with pytest.raises(ValueError, match=rf"num_steps must be an integer >= {S}, got 5"):
            function(params, src, src_valid_len, *args, num_heads=N, num_steps=5)


def test_training_attention_differentiates_in_both_modes():
    """With dropout active the attention is the core with a dropout mask
    (scoring.dropout_attention), whose one rule serves both modes: forward mode through the
    whole training forward equals the reverse-mode gradient along the same direction. One
    layer (it holds all three attentions): its gradient compiles in half the time of two."""
    params = transformer.init_params(jax.random.key(0), V_SRC, V_TGT, D, F, N, 1)
    src, src_valid_len, dec_input = _inputs()
    rng = jax.random.key(3, impl="rbg")

    def loss(p):
        return jnp.sum(_forward(p, src, src_valid_len, dec_input, num_heads=N, dropout=0.1,
                                dropout_rng=rng)[0] ** 2)

    # Jitted whole, so that each is one or two programs and no eager operation.
    grads = jax.device_get(jax.jit(jax.grad(loss))(params))
    assert all(np.all(np.isfinite(g)) for g in jax.tree.leaves(grads))
    _, tangent = jax.jit(lambda p: jax.jvp(loss, (p,), (p,)))(params)
    along = sum(np.vdot(g, p) for g, p in zip(jax.tree.leaves(grads), jax.tree.leaves(params)))
    np.testing.assert_allclose(tangent, along, rtol=1e-4)


def test_module_train_and_eval_modes_and_sown_weights():
    # An "rbg" dropout key, as in training: its masks compile faster than threefry's.
    model = transformer.TransformerSeq2Seq(
        V_SRC, V_TGT, D, F, N, L, dropout=0.3,
        rngs=nnx.Rngs(params=0, dropout=jax.random.key(0, impl="rbg")))
    src, src_valid_len, dec_input = _inputs()
    call = nnx.jit(lambda model, *args: model(*args))
    train_a = call(model, src, src_valid_len, dec_input)
    train_b = call(model, src, src_valid_len, dec_input)
    assert not np.allclose(train_a, train_b)  # a new dropout mask per call
    model.eval()
    probe = nnx.with_attributes(model, sow_weights=True)
    logits, intermediates = nnx.jit(
        lambda model, *args: nnx.capture(model, nnx.Intermediate)(*args))(
        probe, src, src_valid_len, dec_input)
    (weights,) = intermediates["attention_weights"].get_value()
    expected, expected_weights = _forward(model.params_dict(), src, src_valid_len, dec_input,
                                          num_heads=N)
    np.testing.assert_allclose(np.asarray(logits), np.asarray(expected), rtol=1e-6, atol=1e-6)
    for name in expected_weights:
        np.testing.assert_allclose(np.asarray(weights[name]), np.asarray(expected_weights[name]),
                                   rtol=1e-6, atol=1e-6)


def test_initialisation_follows_the_book():
    params = transformer.init_params(jax.random.key(0), 50, 60, 32, 64, 4, 2)
    flat = transformer.flatten_params(params)
    for path, value in flat.items():
        value = np.asarray(value)
        name = path.rsplit("/", 1)[-1]
        if name == "embedding":
            assert abs(value.mean()) < 0.1 and abs(value.std() - 1.0) < 0.1, path
        elif name == "gamma":
            np.testing.assert_array_equal(value, 1.0)
        elif name == "beta":
            np.testing.assert_array_equal(value, 0.0)
        elif name.startswith("b"):
            fan_in = flat[path[:-len(name)] + name.replace("b", "W")].shape[0]
            assert np.abs(value).max() <= 1 / math.sqrt(fan_in), path
        else:
            bound = math.sqrt(6 / sum(value.shape))
            assert np.abs(value).max() <= bound and np.abs(value).max() > 0.8 * bound, path


def test_nnx_module_structure_matches_param_shapes():
    model = transformer.TransformerSeq2Seq(V_SRC, V_TGT, D, F, N, L, rngs=nnx.Rngs(0))
    shapes = jax.tree.map(lambda x: tuple(x.shape), model.params_dict())
    expected = transformer.param_shapes(V_SRC, V_TGT, D, F, L)
    assert transformer.flatten_params(shapes) == {
        k: tuple(v) for k, v in transformer.flatten_params(expected).items()}


@pytest.mark.parametrize("call, message", [
    (lambda: transformer.init_params(jax.random.key(0), 5, 5, 10, 8, 4, 1),
     r"num_hiddens must be divisible by num_heads, got num_hiddens=10 and num_heads=4"),
    (lambda: transformer.TransformerSeq2Seq(5, 5, 10, 8, 3, 1, rngs=nnx.Rngs(0)),
     r"num_hiddens must be divisible by num_heads"),
    (lambda: transformer.transformer(_params(), jnp.full((B, S), V_SRC, jnp.int32),
                                     jnp.full((B,), S, jnp.int32), jnp.zeros((B, T), jnp.int32),
                                     num_heads=N),
     r"src must lie in \[0, V\) = \[0, 11\), got values from 11 to 11"),
    (lambda: transformer.transformer(_params(), jnp.zeros((B, S), jnp.int32),
                                     jnp.full((B,), S, jnp.int32), jnp.full((B, T), -1, jnp.int32),
                                     num_heads=N),
     r"dec_input must lie in \[0, V\) = \[0, 13\)"),
    (lambda: transformer.encoder(_params()["encoder"], jnp.zeros((B, 9), jnp.int32), None,
                                 num_heads=N, max_positions=8),
     r"src has 9 positions, more than the positional table's max_positions = 8"),
    (lambda: transformer.greedy_decode(_params(), jnp.zeros((B, S), jnp.int32),
                                       jnp.full((B,), S, jnp.int32), num_heads=N, bos_id=BOS,
                                       eos_id=EOS, pad_id=PAD, max_len=20, max_positions=10),
     r"max_len = 20 decoding steps exceed the positional table's max_positions = 10"),
    (lambda: transformer.transformer(_params(), jnp.zeros((B, S), jnp.float32),
                                     jnp.full((B,), S, jnp.int32), jnp.zeros((B, T), jnp.int32),
                                     num_heads=N),
     r"src must be integer token ids of shape \(B, T\)"),
    (lambda: transformer.transformer(_params(), jnp.zeros((B, S), jnp.int32),
                                     jnp.full((B,), S + 1, jnp.int32), jnp.zeros((B, T), jnp.int32),
                                     num_heads=N),
     r"valid"),
])
def test_bad_input_raises_with_the_shapes(call, message):
    with pytest.raises(ValueError, match=message):
        call()


# ------------------------------------------------------------------- issue 16: parameter keys


def _np_params():
    return jax.tree.map(np.asarray, _params())


@pytest.mark.parametrize("path, new_name, message", [
    (("decoder", "blocks", "block_1", "ffn", "b_1"), "B_1",
     r"params\['decoder'\]\['blocks'\]\['block_1'\]\['ffn'\] has unexpected keys \['B_1'\] and "
     r"missing keys \['b_1'\]: expected the keys \['W_1', 'b_1', 'W_2', 'b_2'\]"),
    # The Transformer's attention has no biases: a b_o would have been added silently.
    (("encoder", "blocks", "block_0", "attention", "W_o"), None,
     r"params\['encoder'\]\['blocks'\]\['block_0'\]\['attention'\] has unexpected keys "
     r"\['extra'\]: expected the keys \['W_q', 'W_k', 'W_v', 'W_o'\]"),
    (("decoder", "blocks", "block_0", "addnorm_3"), "addnorm3",
     r"params\['decoder'\]\['blocks'\]\['block_0'\] has unexpected keys \['addnorm3'\] and "
     r"missing keys \['addnorm_3'\]"),
    (("decoder", "dense", "b"), "bias",
     r"params\['decoder'\]\['dense'\] has unexpected keys \['bias'\] and missing keys \['b'\]"),
    (("encoder",), None, r"params has unexpected keys \['extra'\]: expected the keys "
                         r"\['encoder', 'decoder'\]"),
])
def test_misspelled_or_extra_param_keys_are_named_with_their_path(path, new_name, message):
    params = rename(_np_params(), path, new_name)
    src, src_valid_len, dec_input = (np.asarray(a) for a in _inputs())
    decode = {"num_heads": N, "bos_id": BOS, "eos_id": EOS, "pad_id": PAD, "max_len": 2}
    for module in (transformer, np_transformer):
        with pytest.raises(ValueError, match=message):
            module.transformer(params, src, src_valid_len, dec_input, num_heads=N)
        with pytest.raises(ValueError, match=message):
            module.teacher_forcing_loss(params, src, src_valid_len, dec_input,
                                        np.full(B, T, np.int32), BOS, num_heads=N)
        with pytest.raises(ValueError, match=message):
            module.greedy_decode(params, src, src_valid_len, **decode)
    with pytest.raises(ValueError, match=message):
        transformer.beam_decode(params, src, src_valid_len, beam_size=2, **decode)


def test_misspelled_keys_of_blocks_and_sublayers_are_named():
    params = rename(_np_params(), ("decoder", "blocks", "block_0", "self_attention", "W_k"), "W_K")
    decoder = params["decoder"]
    block = decoder["blocks"]["block_0"]
    enc_outputs = np.zeros((B, S, D), np.float32)
    X = np.zeros((B, T, D), np.float32)
    in_decoder = (r"params\['blocks'\]\['block_0'\]\['self_attention'\] has unexpected keys "
                  r"\['W_K'\]")
    for module in (transformer, np_transformer):
        with pytest.raises(ValueError, match=in_decoder):
            module.decoder(decoder, np.zeros((B, T), np.int32), enc_outputs, None, num_heads=N)
        with pytest.raises(ValueError, match=r"params\['self_attention'\] has unexpected keys"):
            module.decoder_block(block, X, enc_outputs, None, num_heads=N)
        with pytest.raises(ValueError, match=r"params has unexpected keys \['W_K'\] and "
                                             r"missing keys \['W_k'\]"):
            module.attention(block["self_attention"], X, X, num_heads=N)
        ffn = dict(block["ffn"], W_3=block["ffn"]["W_2"])
        with pytest.raises(ValueError, match=r"params has unexpected keys \['W_3'\]"):
            module.position_wise_ffn(ffn, X)
        with pytest.raises(ValueError, match=r"params has missing keys \['beta'\]: expected the "
                                             r"keys \['gamma', 'beta'\]"):
            module.layer_norm({"gamma": block["addnorm_1"]["gamma"]}, X)
    with pytest.raises(ValueError, match=in_decoder):
        transformer.init_decoder_state(decoder, enc_outputs, None, num_heads=N, max_len=2)
    state = transformer.init_decoder_state(_np_params()["decoder"], enc_outputs, None, num_heads=N,
                                           max_len=2)
    with pytest.raises(ValueError, match=in_decoder):
        transformer.decoder_step(decoder, state, np.ones(B, np.int32), num_heads=N)


@pytest.mark.parametrize("is_causal", ["False", 1, np.array(True)], ids=["str", "int", "array"])
def test_is_causal_of_the_attention_must_be_a_python_bool(is_causal):
    attention = _np_params()["encoder"]["blocks"]["block_0"]["attention"]
    X = np.zeros((B, T, D), np.float32)
    for module in (transformer, np_transformer):
        with pytest.raises(TypeError, match=rf"is_causal must be a Python bool.*got "
                                            rf"{type(is_causal).__name__}"):
            module.attention(attention, X, X, num_heads=N, is_causal=is_causal)


def test_translate_notes_long_and_unknown_sources():
    from jax_attention.data.nmt import RESERVED_TOKENS, Vocab

    # Filler words make the vocabularies the model's sizes V_SRC and V_TGT, so that the model
    # is _params(), whose initialisation has compiled already.
    src_vocab = Vocab([["go", "."]] * 2 + [list("abcdefg")[:V_SRC - 6]], min_freq=1,
                      reserved_tokens=list(RESERVED_TOKENS))
    tgt_vocab = Vocab([["va", "!"]] * 2 + [list("abcdefghij")[:V_TGT - 6]], min_freq=1,
                      reserved_tokens=list(RESERVED_TOKENS))
    assert (len(src_vocab), len(tgt_vocab)) == (V_SRC, V_TGT)
    params = _params()
    result = transformer.translate(params, "go go go go go zzz .", src_vocab, tgt_vocab, 4,
                                   num_heads=N)
    assert result.truncated and not result.unknown_words  # zzz lies past the 4 tokens read
    assert len(result.source_tokens) == 4
    assert result.encoder_self.shape == (L, N, 4, 4)
    steps = result.weights.shape[0]
    assert result.decoder_self.shape == (L, N, steps, steps)
    assert result.encoder_decoder.shape == (L, N, steps, 4)
    result = transformer.translate(params, ["zzz ."], src_vocab, tgt_vocab, 4, num_heads=N)[0]
    assert result.unknown_words == ["zzz"]
    with pytest.raises(TypeError, match="sentences must be strings"):
        transformer.translate(params, [3], src_vocab, tgt_vocab, 4, num_heads=N)


@pytest.mark.parametrize("kwargs, message", [
    ({"num_hiddens": 30, "num_heads": 4}, "num_hiddens must be divisible by num_heads"),
    ({"dropout": 1.0}, "dropout must be"),
    ({"epochs": 0}, "epochs must be"),
    ({"num_steps": 20, "max_positions": 10}, "num_steps = 20 exceeds max_positions = 10"),
])
def test_training_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        train_transformer(**kwargs)


@pytest.mark.slow  # the whole book run: 200 epochs
def test_the_books_run_on_seed_0_gets_what_the_docs_say(book_run):
    """d2l §11.7.6 with its settings, seed 0 (the shared book run): as many of the four
    sentences exactly as docs/models.md's seed-by-seed figures give seed 0 (its printed lines are
    tests/test_readme_outputs.py's)."""
    _, counts = book_run_seed_counts("transformer")
    assert book_run("transformer").record["num_bleu_1"] == counts[0]


@pytest.mark.slow
@pytest.mark.skipif(jax.default_backend() != "cpu",
                    reason="bit-identical only on CPU: elsewhere rounding moves which sentences")
@pytest.mark.parametrize("seed", range(1, 6))
def test_the_books_run_on_seeds_1_to_5_gets_what_the_docs_say(seed):
    """The book's quality is a claim over seeds (one seed's sentences move with any change of
    rounding in training): each seed's exact sentences are docs/models.md's figure for it."""
    result = train_transformer(seed=seed, progress=False, log=None)
    _, counts = book_run_seed_counts("transformer")
    assert sum(score == 1.0 for score in result.bleu) == counts[seed], [
        (t.source, t.translation) for _, t in result.translations]


# ------------------------------------------------------------------- grouped-query attention

N_GQA = 4  # with D = 8: H = 2; N_kv in {4, 2, 1}


def _gqa_params(num_kv_heads, seed=0):
    return transformer.init_params(jax.random.key(seed), V_SRC, V_TGT, D, F, N_GQA, L,
                                   num_kv_heads=num_kv_heads)


def test_grouped_query_parameter_shapes():
    H = D // N_GQA
    for num_kv_heads in (4, 2, 1):
        shapes = transformer.flatten_params(transformer.param_shapes(
            V_SRC, V_TGT, D, F, L, num_heads=N_GQA, num_kv_heads=num_kv_heads))
        for path, shape in shapes.items():
            if path.endswith(("attention/W_k", "attention/W_v")):
                assert shape == (D, num_kv_heads * H), path
            elif path.endswith(("attention/W_q", "attention/W_o")):
                assert shape == (D, D), path
        model = transformer.TransformerSeq2Seq(V_SRC, V_TGT, D, F, N_GQA, L,
                                               num_kv_heads=num_kv_heads, rngs=nnx.Rngs(0))
        assert {k: tuple(v.shape) for k, v in
                transformer.flatten_params(model.params_dict()).items()} == shapes
    # The default is the book's model, bit for bit: num_kv_heads = N changes nothing.
    book = transformer.param_shapes(V_SRC, V_TGT, D, F, L)
    assert transformer.param_shapes(V_SRC, V_TGT, D, F, L, num_heads=N_GQA,
                                    num_kv_heads=N_GQA) == book
    chex.assert_trees_all_equal(_gqa_params(None), _gqa_params(N_GQA))


def test_attention_biases_and_value_head_size_shapes():
    """bias=True adds PyTorch's four attention biases; value_head_size widens W_v and W_o; the
    function, the modules and init_params agree (the biases start at zero, as nn.MultiheadAttention's)."""
    shapes = transformer.flatten_params(transformer.param_shapes(
        V_SRC, V_TGT, D, F, L, num_heads=N_GQA, num_kv_heads=2, value_head_size=3, bias=True))
    H = D // N_GQA
    expected = {"W_q": (D, D), "W_k": (D, 2 * H), "W_v": (D, 2 * 3), "W_o": (N_GQA * 3, D),
                "b_q": (D,), "b_k": (2 * H,), "b_v": (2 * 3,), "b_o": (D,)}
    for block in ("encoder/blocks/block_0/attention", "decoder/blocks/block_1/self_attention",
                  "decoder/blocks/block_1/cross_attention"):
        assert {name: shapes[f"{block}/{name}"] for name in expected} == expected
    params = transformer.init_params(jax.random.key(0), V_SRC, V_TGT, D, F, N_GQA, L,
                                     num_kv_heads=2, value_head_size=3, bias=True)
    assert {path: leaf.shape for path, leaf in transformer.flatten_params(params).items()} == shapes
    assert all(not np.any(leaf) for path, leaf in transformer.flatten_params(params).items()
               if path.rpartition("/")[2] in expected and path.rpartition("/")[2][0] == "b")
    block = transformer.TransformerDecoderBlock(D, F, N_GQA, num_kv_heads=2, value_head_size=3,
                                                bias=True, rngs=nnx.Rngs(0))
    assert {path: leaf.shape for path, leaf in
            transformer.flatten_params(block.params_dict()).items()} == {
        path.removeprefix("decoder/blocks/block_0/"): shape for path, shape in shapes.items()
        if path.startswith("decoder/blocks/block_0/")}
    # The book's model is unchanged by the defaults.
    assert transformer.param_shapes(V_SRC, V_TGT, D, F, L, num_heads=N_GQA, bias=False) == \
        transformer.param_shapes(V_SRC, V_TGT, D, F, L)


@pytest.mark.parametrize("call, message", [
    (lambda: transformer.param_shapes(5, 5, 8, 8, 1, value_head_size=2), r"num_heads must be "
     r"given with num_kv_heads or value_head_size"),
    (lambda: transformer.init_params(jax.random.key(0), 5, 5, 8, 8, 4, 1, num_kv_heads=3),
     r"num_kv_heads must divide num_heads = 4, got 3"),
    (lambda: transformer.param_shapes(5, 5, 8, 8, 1, num_kv_heads=2), r"num_heads must be"),
    (lambda: transformer.TransformerSeq2Seq(5, 5, 8, 8, 4, 1, num_kv_heads=0, rngs=nnx.Rngs(0)),
     r"num_kv_heads must be an integer >= 1, got 0"),
])
def test_grouped_query_bad_sizes(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_config_num_kv_heads_is_validated_and_defaults_for_old_records():
    from jax_attention.models.configs import TransformerConfig

    assert TransformerConfig().num_kv_heads is None
    assert TransformerConfig(num_kv_heads=2).num_kv_heads == 2
    with pytest.raises(ValueError, match=r"num_kv_heads must divide num_heads = 4, got 3"):
        TransformerConfig(num_kv_heads=3)
    with pytest.raises(ValueError, match=r"num_kv_heads must be an integer >= 1, got 0"):
        TransformerConfig(num_kv_heads=0)
    record = TransformerConfig(num_kv_heads=1).record()
    assert TransformerConfig.from_record(record).num_kv_heads == 1
    del record["num_kv_heads"]  # written before the field existed: the default
    assert TransformerConfig.from_record(record).num_kv_heads is None
    del record["num_heads"]  # the model's other sizes are still required
    with pytest.raises(ValueError, match=r"config lacks \['num_heads'\]"):
        TransformerConfig.from_record(record)


def test_grouped_query_weights_that_are_not_whole_heads_are_named():
    params = _np_params()
    attention = params["decoder"]["blocks"]["block_0"]["self_attention"]
    attention["W_k"] = attention["W_k"][:, :3]  # 3 columns: not a whole number of H = 4
    attention["W_v"] = attention["W_v"][:, :3]
    X = np.zeros((B, T, D), np.float32)
    with pytest.raises(ValueError, match=r"params\['W_k'\] and params\['W_v'\] must be \(D, N_kv "
                                         r"\* H\) and \(D, N_kv \* H_v\) with H = D / N = 4"):
        transformer.attention(attention, X, X, num_heads=N)
    with pytest.raises(ValueError, match=r"params\['blocks'\]\['block_0'\]\['self_attention'\]"
                                         r"\['W_k'\] and"):
        transformer.init_decoder_state(params["decoder"], np.zeros((B, S, D), np.float32), None,
                                       num_heads=N, max_len=2)


def test_decoder_state_of_another_grouping_is_refused():
    mqa, mha = _gqa_params(1), _gqa_params(N_GQA)
    enc_outputs = jnp.zeros((B, S, D))
    state = transformer.init_decoder_state(mha["decoder"], enc_outputs, None, num_heads=N_GQA,
                                           max_len=3)
    with pytest.raises(ValueError, match=r"state\['self_keys'\] must have shape \(B, L, N_kv, M, "
                                         r"H\) with L = 2 blocks, N_kv = 1 key/value heads and H = 2 "
                                         r"\(N = 4 heads \(num_heads\)"):
        transformer.decoder_step(mqa["decoder"], state, jnp.ones(B, jnp.int32), num_heads=N_GQA)


# The grouped models with one layer, as tests/parity/test_transformer.py's: the same programs.
@pytest.mark.parametrize("num_heads, num_kv_heads, num_layers, seed, value_head_size",
                         [(N, None, L, 0, None), (N_GQA, 2, 1, 2, None), (N_GQA, 1, 1, 2, None),
                          (N_GQA, 2, 1, 3, 3)],
                         ids=["mha", "gqa", "mqa", "gqa-biases-value_head_size"])
def test_kv_cache_holds_kv_heads_and_equals_full_recomputation_float64(num_heads, num_kv_heads,
                                                                       num_layers, seed,
                                                                       value_head_size):
    """The book's model (N_kv = N), grouped-query and multi-query attention, and attention with
    biases and a value head size of its own: the cache holds N_kv heads (values of H_v), and
    decoding step by step equals the teacher-forced decoder in float64."""
    # Drawn with x64 off: x64 is part of a jitted function's cache key.
    biased = value_head_size is not None
    params = transformer.init_params(jax.random.key(seed), V_SRC, V_TGT, D, F, num_heads,
                                     num_layers, num_kv_heads=num_kv_heads,
                                     value_head_size=value_head_size, bias=biased)
    if biased:  # the biases start at zero: make every one count
        rng = np.random.default_rng(seed)
        params = transformer.unflatten_params({
            path: rng.normal(size=leaf.shape).astype(np.float32) if path.rpartition("/")[2] in
            ("b_q", "b_k", "b_v", "b_o") else leaf
            for path, leaf in transformer.flatten_params(params).items()})
    num_kv_heads = num_kv_heads or num_heads
    with jax.enable_x64(True):
        params = _as_float64(params)
        src, src_valid_len, dec_input = _numpy_inputs()
        # _forward, as tests/parity/test_transformer.py runs it: the session's compilation cache
        # serves one of the two.
        logits, weights = jax.device_get(_forward(params, src, src_valid_len, dec_input,
                                                  num_heads=num_heads))
        state = _initial_cache(params, src, src_valid_len, num_heads=num_heads, max_len=T)
        H = D // num_heads
        H_v = value_head_size or H
        chex.assert_shape([state["self_keys"], state["self_values"], state["cross_keys"],
                           state["cross_values"]],
                          [(B, num_layers, num_kv_heads, length, size)
                           for length in (T, S) for size in (H, H_v)])
        # Keys and values of one position in every block: L N_kv (H + H_v) itemsize bytes.
        per_token = (state["self_keys"].nbytes + state["self_values"].nbytes) / (B * T)
        assert per_token == num_layers * num_kv_heads * (H + H_v) * 8
        # The state keeps its structure, shapes and dtypes: the step is traced once (counted
        # per parametrisation).
        chex.clear_trace_counter()
        step = jax.jit(chex.assert_max_traces(
            lambda state, tokens: transformer.decoder_step(params["decoder"], state, tokens,
                                                           num_heads=num_heads), n=1))
        for t in range(T):
            step_logits, state, step_weights = step(state, dec_input[:, t])
            np.testing.assert_allclose(np.asarray(step_logits), logits[:, t], rtol=1e-12,
                                       atol=1e-12)
            np.testing.assert_allclose(np.asarray(step_weights["decoder_self"]),
                                       weights["decoder_self"][:, :, :, t], rtol=1e-12,
                                       atol=1e-12)
            np.testing.assert_allclose(np.asarray(step_weights["encoder_decoder"]),
                                       weights["encoder_decoder"][:, :, :, t], rtol=1e-12,
                                       atol=1e-12)
            np.testing.assert_array_equal(np.asarray(state["position"]), np.full(B, t + 1))
        # Every state leaf has the batch first (beam search reorders along axis 0).
        for leaf in jax.tree.leaves(state):
            assert leaf.shape[0] == B


def test_grouped_query_module_dropout_and_beam_search():
    # One layer: grouping is the same at every depth, and each of the five programs below
    # compiles in about half the time of two layers'.
    model = transformer.TransformerSeq2Seq(
        V_SRC, V_TGT, D, F, N_GQA, 1, dropout=0.3, num_kv_heads=2,
        rngs=nnx.Rngs(params=0, dropout=jax.random.key(0, impl="rbg")))
    src, src_valid_len, dec_input = _inputs()
    call = nnx.jit(lambda model, *args: model(*args))
    train_a, train_b = call(model, src, src_valid_len, dec_input), call(model, src,
                                                                          src_valid_len, dec_input)
    train_a, train_b = np.asarray(train_a), np.asarray(train_b)
    assert np.isfinite(train_a).all() and not np.allclose(train_a, train_b)
    model.eval()

    expected, _ = _forward(model.params_dict(), src, src_valid_len, dec_input, num_heads=N_GQA)
    np.testing.assert_allclose(np.asarray(call(model, src, src_valid_len, dec_input)),
                               np.asarray(expected), rtol=1e-6, atol=1e-6)
    if hasattr(decoding, "beam_search"):
        kwargs = {"num_heads": N_GQA, "bos_id": BOS, "eos_id": EOS, "pad_id": PAD,
                  "max_len": MAX_LEN}
        greedy, _, _ = transformer.greedy_decode(model.params_dict(), src, src_valid_len, **kwargs)
        beams, _, _ = transformer.beam_decode(model.params_dict(), src, src_valid_len,
                                              beam_size=1, **kwargs)
        np.testing.assert_array_equal(beams[:, 0], greedy)


def test_cli_trains_exports_and_translates_a_multi_query_transformer(tmp_path):
    """--num-kv-heads flows from the flag to the export (config and W_k shapes) and back."""
    import contextlib
    import io

    from jax_attention.cli import main
    from jax_attention.runtime.export import load_model

    checkpoint = tmp_path / "ckpt"
    with contextlib.redirect_stdout(io.StringIO()):
        status = main(["train", "transformer", "--epochs", "1", "--num-examples", "32",
                       "--batch-size", "32", "--num-hiddens", "8", "--ffn-num-hiddens", "8",
                       "--num-heads", "4", "--num-kv-heads", "1", "--num-layers", "1",
                       "--num-steps", "5", "--dropout", "0", "--no-progress", "--checkpoint",
                       str(checkpoint)])
    assert status == 0
    loaded = load_model(checkpoint)
    assert loaded.config["num_kv_heads"] == 1 and loaded.model_config.num_kv_heads == 1
    assert loaded.params["decoder"]["blocks"]["block_0"]["cross_attention"]["W_k"].shape == (8, 2)
    # The book's four sentences, as training's evaluation translated them: the same batch, so
    # the decoder that training compiled translates them again.
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["translate", "--checkpoint", str(checkpoint),
                     *(source for source, _ in BOOK_PAIRS)]) == 0
    assert "go . => " in printed.getvalue()
