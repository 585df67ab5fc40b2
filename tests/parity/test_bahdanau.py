"""NumPy reference vs JAX for seq2seq with Bahdanau attention (d2l §10.7, §11.4).

Same inputs and the same parameters on both sides (one nested dict, copied leaf by leaf with
``np.asarray``); every backend JAX sees; float64 (x64) to 1e-12 and float32 (full matmul precision)
to 1e-5 relative. Covered: the GRU cell, the multi-layer GRU, the encoder, one decoder step, the
teacher-forced decoder (logits, attention weights, final state), the masked loss, greedy decoding
(JAX batched and compiled, NumPy one sentence at a time as the book's ``predict_seq2seq``), and the
NNX module on its own parameters.

The ``dtype`` fixture (tests/parity/conftest.py) runs each test in float64 and float32 on every
backend. JAX runs under ``jax.jit`` here (one compilation per test; the model and its loss in one
program), the NNX module under ``nnx.jit``, on inputs put on the device by ``jax.device_put`` of
NumPy arrays of the final dtype (``jnp.asarray`` with a dtype compiles a conversion per shape);
tests/test_bahdanau.py runs the functions with and without jit.
"""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx

from jax_attention.models import bahdanau as jax_bahdanau
from reference_numpy import bahdanau as np_bahdanau
from tests.parity._support import assert_matches

B, S, T = 3, 6, 5
V_SRC, V_TGT, E, H, L = 11, 13, 4, 5, 2
BOS, EOS, PAD = 2, 3, 1


def _assert_matches(got, expected, dtype, backend):
    # Gates and logits of O(1) magnitude: float32 agrees to 1e-5 absolute near zero too.
    assert_matches(got, expected, dtype, backend, atol32=1e-5)


def _numpy_params(seed=0, scale=0.5):
    """Random float64 parameters of the model's structure (larger than the init, to exercise
    the gates' non-linear ranges)."""
    rng = np.random.default_rng(seed)
    shapes = jax_bahdanau.flatten_params(jax_bahdanau.param_shapes(V_SRC, V_TGT, E, H, L))
    return jax_bahdanau.unflatten_params(
        {path: scale * rng.normal(size=shape) for path, shape in shapes.items()})


def _to_jax(params, dtype):
    return jax.tree.map(lambda leaf: _device(leaf, dtype), params)


def _device(array, dtype=None):
    """``array`` as a JAX array of ``dtype``, cast by NumPy: ``jax.device_put`` compiles
    nothing."""
    return jax.device_put(np.asarray(array, dtype))


def _inputs(seed=1):
    rng = np.random.default_rng(seed)
    src = rng.integers(0, V_SRC, size=(B, S)).astype(np.int32)
    src_valid_len = np.asarray([1, S, 3], np.int32)
    dec_input = rng.integers(0, V_TGT, size=(B, T)).astype(np.int32)
    tgt_valid_len = np.asarray([0, T, 2], np.int32)
    return src, src_valid_len, dec_input, tgt_valid_len


def test_gru_cell(dtype, backend):
    params = _numpy_params()["encoder"]["gru"]["layer_0"]
    rng = np.random.default_rng(2)
    inputs, state = rng.normal(size=(B, E)), rng.normal(size=(B, H))
    expected = np_bahdanau.gru_cell(params, inputs, state)
    got = jax.jit(jax_bahdanau.gru_cell)(_to_jax(params, dtype), _device(inputs, dtype),
                                         _device(state, dtype))
    _assert_matches(got, expected, dtype, backend)


def test_gru_cell_by_hand():
    """PyTorch's equations written out per gate, on the stacked parameters."""
    params = _numpy_params(seed=3)["encoder"]["gru"]["layer_1"]
    rng = np.random.default_rng(4)
    x, h = rng.normal(size=(2, H)), rng.normal(size=(2, H))
    W_x, W_h, b_x, b_h = (params[name] for name in ("W_x", "W_h", "b_x", "b_h"))
    gate = {name: slice(i * H, (i + 1) * H) for i, name in enumerate("rzn")}
    sigmoid = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
    r = sigmoid(x @ W_x[:, gate["r"]] + b_x[gate["r"]] + h @ W_h[:, gate["r"]] + b_h[gate["r"]])
    z = sigmoid(x @ W_x[:, gate["z"]] + b_x[gate["z"]] + h @ W_h[:, gate["z"]] + b_h[gate["z"]])
    n = np.tanh(x @ W_x[:, gate["n"]] + b_x[gate["n"]] + r * (h @ W_h[:, gate["n"]] + b_h[gate["n"]]))
    np.testing.assert_allclose(np_bahdanau.gru_cell(params, x, h), (1 - z) * n + z * h,
                               rtol=1e-12, atol=1e-12)


def test_gru(dtype, backend):
    params = _numpy_params()["encoder"]["gru"]
    rng = np.random.default_rng(5)
    inputs, state = rng.normal(size=(B, S, E)), rng.normal(size=(L, B, H))
    expected_outputs, expected_state = np_bahdanau.gru(params, inputs, state)
    outputs, final = jax.jit(jax_bahdanau.gru)(_to_jax(params, dtype), _device(inputs, dtype),
                                               _device(state, dtype))
    _assert_matches(outputs, expected_outputs, dtype, backend)
    _assert_matches(final, expected_state, dtype, backend)
    # The outputs are the top layer's states; the final state of the top layer is the last output.
    np.testing.assert_array_equal(expected_outputs[:, -1], expected_state[-1])


def test_encoder(dtype, backend):
    params = _numpy_params()
    src, *_ = _inputs()
    expected_outputs, expected_state = np_bahdanau.encoder(params["encoder"], src)
    outputs, state = jax.jit(jax_bahdanau.encoder)(_to_jax(params["encoder"], dtype), src)
    _assert_matches(outputs, expected_outputs, dtype, backend)
    _assert_matches(state, expected_state, dtype, backend)


def test_decoder_step(dtype, backend):
    params = _numpy_params()
    src, src_valid_len, dec_input, _ = _inputs()
    enc_outputs, state = np_bahdanau.encoder(params["encoder"], src)
    expected = np_bahdanau.decoder_step(params["decoder"], dec_input[:, 0], state, enc_outputs,
                                        src_valid_len)
    got = jax.jit(jax_bahdanau.decoder_step)(
        _to_jax(params["decoder"], dtype), dec_input[:, 0], _device(state, dtype),
        _device(enc_outputs, dtype), src_valid_len)
    for g, e in zip(got, expected):
        _assert_matches(g, e, dtype, backend)


def test_teacher_forced_decoder(dtype, backend):
    params = _numpy_params()
    src, src_valid_len, dec_input, _ = _inputs()
    enc_outputs, state = np_bahdanau.encoder(params["encoder"], src)
    expected_logits, expected_state, expected_weights = np_bahdanau.decoder(
        params["decoder"], dec_input, state, enc_outputs, src_valid_len)
    logits, final, weights = jax.jit(jax_bahdanau.decoder)(
        _to_jax(params["decoder"], dtype), dec_input, _device(state, dtype),
        _device(enc_outputs, dtype), src_valid_len)
    _assert_matches(logits, expected_logits, dtype, backend)
    _assert_matches(final, expected_state, dtype, backend)
    _assert_matches(weights, expected_weights, dtype, backend)
    assert logits.shape == (B, T, V_TGT) and weights.shape == (B, T, S)
    # Attention never reaches past a row's source valid length.
    for row, valid in enumerate(src_valid_len):
        assert np.all(expected_weights[row, :, valid:] == 0)
        np.testing.assert_allclose(expected_weights[row].sum(axis=-1), 1.0, rtol=1e-12)


def test_seq2seq_and_loss(dtype, backend):
    params = _numpy_params()
    src, src_valid_len, tgt, tgt_valid_len = _inputs()
    expected_logits, expected_weights = np_bahdanau.seq2seq(
        params, src, src_valid_len, np_bahdanau.teacher_forcing_inputs(tgt, BOS))
    expected_loss = np_bahdanau.teacher_forcing_loss(params, src, src_valid_len, tgt,
                                                     tgt_valid_len, BOS)
    # The model on the shifted target and the loss, in one program.
    (logits, weights), loss = jax.jit(lambda params, src, src_valid_len, tgt, tgt_valid_len: (
        jax_bahdanau.seq2seq(params, src, src_valid_len,
                             jax_bahdanau.teacher_forcing_inputs(tgt, BOS)),
        jax_bahdanau.teacher_forcing_loss(params, src, src_valid_len, tgt, tgt_valid_len, BOS)))(
        _to_jax(params, dtype), src, src_valid_len, tgt, tgt_valid_len)
    _assert_matches(logits, expected_logits, dtype, backend)
    _assert_matches(weights, expected_weights, dtype, backend)
    _assert_matches(loss, expected_loss, dtype, backend)
    assert expected_loss[0] == 0.0  # target valid length 0: nothing to learn


def test_masked_cross_entropy_with_a_divisor(dtype, backend):
    rng = np.random.default_rng(2)
    logits = rng.normal(size=(B, T, V_TGT))
    labels = rng.integers(0, V_TGT, size=(B, T)).astype(np.int32)
    _, _, _, valid_len = _inputs()
    expected = np_bahdanau.masked_cross_entropy(logits, labels, valid_len, num_steps=2 * T)
    np.testing.assert_allclose(expected * 2, np_bahdanau.masked_cross_entropy(
        logits, labels, valid_len), rtol=1e-12)
    got = jax.jit(jax_bahdanau.masked_cross_entropy, static_argnames="num_steps")(
        _device(logits, dtype), labels, valid_len, num_steps=2 * T)
    _assert_matches(got, expected, dtype, backend)


def test_greedy_decode_batched_equals_one_sentence_at_a_time(dtype, backend):
    """The compiled batch decoder against the book's per-sentence loop that breaks at <eos>."""
    params = _numpy_params(seed=6, scale=1.0)
    # Make <eos> likely so that rows stop at different steps: raise its output bias.
    params["decoder"]["dense"]["b"][EOS] += 1.5
    rng = np.random.default_rng(7)
    src = rng.integers(0, V_SRC, size=(8, S)).astype(np.int32)
    src_valid_len = rng.integers(1, S + 1, size=8).astype(np.int32)
    max_len = 7
    expected = np_bahdanau.greedy_decode(params, src, src_valid_len, bos_id=BOS, eos_id=EOS,
                                         pad_id=PAD, max_len=max_len)
    tokens, lengths, weights = jax_bahdanau.greedy_decode(
        _to_jax(params, dtype), src, src_valid_len, bos_id=BOS, eos_id=EOS, pad_id=PAD,
        max_len=max_len)
    np.testing.assert_array_equal(np.asarray(tokens), expected[0])
    np.testing.assert_array_equal(np.asarray(lengths), expected[1])
    _assert_matches(weights, expected[2], dtype, backend)
    # The case is not trivial: some rows stop early, at different steps.
    assert len(set(expected[1].tolist())) > 1 and expected[1].min() < max_len


def test_nnx_module_runs_the_reference_on_its_own_parameters(dtype, backend):
    model = jax_bahdanau.BahdanauSeq2Seq(V_SRC, V_TGT, E, H, L, dropout=0.3, sow_weights=True,
                                         param_dtype=dtype, rngs=nnx.Rngs(0))
    model.eval()  # no dropout: the reference has none
    src, src_valid_len, dec_input, _ = _inputs()
    logits, intermediates = nnx.jit(
        lambda model, *args: nnx.capture(model, nnx.Intermediate)(*args))(
        model, src, src_valid_len, dec_input)
    (weights,) = intermediates["attention_weights"].get_value()
    params = jax.tree.map(lambda leaf: np.asarray(leaf, np.float64), model.params_dict())
    expected_logits, expected_weights = np_bahdanau.seq2seq(params, src, src_valid_len, dec_input)
    _assert_matches(logits, expected_logits, dtype, backend)
    _assert_matches(weights, expected_weights, dtype, backend)
