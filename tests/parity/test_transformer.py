"""NumPy reference vs JAX for the Transformer (d2l §11.7).

Same inputs and the same parameters on both sides (one nested dict, copied leaf by leaf); every
backend JAX sees; float64 (x64) to 1e-12 and float32 (full matmul precision) to 1e-5. Covered:
the FFN, LayerNorm / AddNorm, an encoder block, the encoder, a decoder block, the teacher-forced
decoder and the full model (logits and every attention weight), the loss, greedy decoding (JAX:
batched, compiled, key/value cache; NumPy: one sentence at a time, recomputing the prefix), and
the NNX module on its own parameters; grouped-query and multi-query attention (``N_kv`` = 2, 1
key/value heads for ``N = 4``) in the full model, the loss and greedy decoding.

JAX runs under ``jax.jit``, on inputs put on the device by ``jax.device_put`` of NumPy arrays of
the final dtype (``jnp.asarray`` with a dtype compiles a conversion per shape). The full model is
jitted as tests/test_transformer.py jits it, and greedy decoding has its ``max_len``, on the same
sizes: the session's compilation cache compiles each of these programs once for both modules.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx

from jax_attention.models import transformer as jax_transformer
from reference_numpy import transformer as np_transformer
from tests.parity._support import assert_matches

B, S, T = 3, 6, 5
V_SRC, V_TGT, D, F, N, L = 11, 13, 8, 12, 2, 2
BOS, EOS, PAD = 2, 3, 1


def _assert_matches(got, expected, dtype, backend):
    assert_matches(got, expected, dtype, backend, atol32=1e-5)


def _numpy_params(seed=0, scale=0.5, num_heads=None, num_kv_heads=None, num_layers=L):
    rng = np.random.default_rng(seed)
    shapes = jax_transformer.flatten_params(jax_transformer.param_shapes(
        V_SRC, V_TGT, D, F, num_layers, num_heads=num_heads, num_kv_heads=num_kv_heads))
    flat = {}
    for path, shape in shapes.items():
        value = scale * rng.normal(size=shape)
        if path.endswith("gamma"):
            value = 1.0 + value
        flat[path] = value
    return jax_transformer.unflatten_params(flat)


def _to_jax(params, dtype):
    return jax.tree.map(lambda leaf: _device(leaf, dtype), params)


def _device(array, dtype=None):
    """``array`` as a JAX array of ``dtype``, cast by NumPy: ``jax.device_put`` compiles
    nothing."""
    return jax.device_put(np.asarray(array, dtype))


#: The full model as tests/test_transformer.py jits it (the same program for the same sizes).
_forward = jax.jit(jax_transformer.transformer, static_argnames=("num_heads", "dropout"))
_loss = jax.jit(jax_transformer.teacher_forcing_loss, static_argnames=("bos_id", "num_heads"))

#: Greedy decoding's steps: tests/test_transformer.py's MAX_LEN, so that the programs are shared.
MAX_LEN = 7


def _inputs(seed=1):
    rng = np.random.default_rng(seed)
    src = rng.integers(0, V_SRC, size=(B, S)).astype(np.int32)
    src_valid_len = np.asarray([1, S, 3], np.int32)
    dec_input = rng.integers(0, V_TGT, size=(B, T)).astype(np.int32)
    tgt_valid_len = np.asarray([0, T, 2], np.int32)
    return src, src_valid_len, dec_input, tgt_valid_len


def _X(shape, seed=2):
    return np.random.default_rng(seed).normal(size=shape)


def test_ffn_and_add_norm(dtype, backend):
    params = _numpy_params()["encoder"]["blocks"]["block_0"]
    X, Y = _X((B, T, D)), _X((B, T, D), seed=3)
    got = jax.jit(jax_transformer.position_wise_ffn)(_to_jax(params["ffn"], dtype),
                                                     _device(X, dtype))
    _assert_matches(got, np_transformer.position_wise_ffn(params["ffn"], X), dtype, backend)
    got = jax.jit(jax_transformer.add_norm)(_to_jax(params["addnorm_1"], dtype),
                                            _device(X, dtype), _device(Y, dtype))
    _assert_matches(got, np_transformer.add_norm(params["addnorm_1"], X, Y), dtype, backend)


def test_layer_norm_by_hand():
    X = np.asarray([[[1.0, 2.0, 3.0, 6.0]]])
    params = {"gamma": np.ones(4), "beta": np.zeros(4)}
    mean, var = 3.0, np.mean((X - 3.0) ** 2)
    np.testing.assert_allclose(np_transformer.layer_norm(params, X), (X - mean) / np.sqrt(var + 1e-5))


def test_blocks(dtype, backend):
    params = _numpy_params()
    src, src_valid_len, _, _ = _inputs()
    X, Y = _X((B, S, D)), _X((B, T, D), seed=4)
    enc_block = params["encoder"]["blocks"]["block_1"]
    out, w = jax.jit(jax_transformer.encoder_block, static_argnames="num_heads")(
        _to_jax(enc_block, dtype), _device(X, dtype), src_valid_len, num_heads=N)
    ref_out, ref_w = np_transformer.encoder_block(enc_block, X, src_valid_len, num_heads=N)
    _assert_matches(out, ref_out, dtype, backend)
    _assert_matches(w, ref_w, dtype, backend)
    dec_block = params["decoder"]["blocks"]["block_0"]
    got = jax.jit(jax_transformer.decoder_block, static_argnames="num_heads")(
        _to_jax(dec_block, dtype), _device(Y, dtype), _device(X, dtype), src_valid_len,
        num_heads=N)
    expected = np_transformer.decoder_block(dec_block, Y, X, src_valid_len, num_heads=N)
    for g, e in zip(got, expected):
        _assert_matches(g, e, dtype, backend)


def test_full_forward_and_loss(dtype, backend):
    params = _numpy_params()
    src, src_valid_len, dec_input, tgt_valid_len = _inputs()
    jax_params = _to_jax(params, dtype)
    logits, weights = _forward(jax_params, src, src_valid_len, dec_input, num_heads=N)
    loss = _loss(jax_params, src, src_valid_len, dec_input, tgt_valid_len, BOS, num_heads=N)
    ref_logits, ref_weights = np_transformer.transformer(params, src, src_valid_len, dec_input,
                                                         num_heads=N)
    _assert_matches(logits, ref_logits, dtype, backend)
    assert set(weights) == set(ref_weights) == {"encoder_self", "decoder_self", "encoder_decoder"}
    for name in ref_weights:
        _assert_matches(weights[name], ref_weights[name], dtype, backend)
    _assert_matches(loss, np_transformer.teacher_forcing_loss(
        params, src, src_valid_len, dec_input, tgt_valid_len, BOS, num_heads=N), dtype, backend)


def test_greedy_decode_with_cache_equals_recomputation(dtype, backend):
    params = _numpy_params(seed=5, scale=0.4)
    src, src_valid_len, _, _ = _inputs()
    max_len = MAX_LEN
    tokens, lengths, weights = jax_transformer.greedy_decode(
        _to_jax(params, dtype), src, src_valid_len, num_heads=N, bos_id=BOS, eos_id=EOS,
        pad_id=PAD, max_len=max_len)
    ref_tokens, ref_lengths, ref_weights = np_transformer.greedy_decode(
        params, src, src_valid_len, num_heads=N, bos_id=BOS, eos_id=EOS, pad_id=PAD,
        max_len=max_len)
    np.testing.assert_array_equal(np.asarray(tokens), ref_tokens)
    np.testing.assert_array_equal(np.asarray(lengths), ref_lengths)
    _assert_matches(weights, ref_weights, dtype, backend)


def test_nnx_module_runs_the_reference_on_its_own_parameters(dtype, backend):
    model = jax_transformer.TransformerSeq2Seq(V_SRC, V_TGT, D, F, N, L, dropout=0.1,
                                               sow_weights=True, param_dtype=dtype,
                                               rngs=nnx.Rngs(0))
    model.eval()
    src, src_valid_len, dec_input, _ = _inputs()
    logits, intermediates = nnx.jit(
        lambda model, *args: nnx.capture(model, nnx.Intermediate)(*args))(
        model, src, src_valid_len, dec_input)
    (weights,) = intermediates["attention_weights"].get_value()
    params = jax.tree.map(lambda leaf: np.asarray(leaf, np.float64), model.params_dict())
    ref_logits, ref_weights = np_transformer.transformer(params, src, src_valid_len, dec_input,
                                                         num_heads=N)
    _assert_matches(logits, ref_logits, dtype, backend)
    for name in ref_weights:
        _assert_matches(weights[name], ref_weights[name], dtype, backend)


# --------------------------------------------------------------------------- grouped-query attention

N_GQA = 4  # H = 2; N_kv = 2 (grouped-query) and 1 (multi-query)
#: The grouped models have one layer: the heads' grouping is the same at every depth (the
#: layers' stacking is checked on the book's model above), and one layer compiles in half the
#: time. tests/test_transformer.py's key-value cache test runs the same programs.
L_GQA = 1


@pytest.mark.parametrize("num_kv_heads", [2, 1], ids=["gqa", "mqa"])
def test_grouped_query_forward_loss_and_greedy_decode(dtype, backend, num_kv_heads):
    params = _numpy_params(seed=6, scale=0.4, num_heads=N_GQA, num_kv_heads=num_kv_heads,
                           num_layers=L_GQA)
    assert params["decoder"]["blocks"]["block_0"]["self_attention"]["W_k"].shape == (
        D, num_kv_heads * D // N_GQA)
    src, src_valid_len, dec_input, tgt_valid_len = _inputs()
    jax_params = _to_jax(params, dtype)
    logits, weights = _forward(jax_params, src, src_valid_len, dec_input, num_heads=N_GQA)
    loss = _loss(jax_params, src, src_valid_len, dec_input, tgt_valid_len, BOS,
                 num_heads=N_GQA)
    ref_logits, ref_weights = np_transformer.transformer(params, src, src_valid_len, dec_input,
                                                         num_heads=N_GQA)
    _assert_matches(logits, ref_logits, dtype, backend)
    for name in ref_weights:
        assert ref_weights[name].shape[2] == N_GQA  # one set of weights per query head
        _assert_matches(weights[name], ref_weights[name], dtype, backend)
    _assert_matches(loss, np_transformer.teacher_forcing_loss(
        params, src, src_valid_len, dec_input, tgt_valid_len, BOS, num_heads=N_GQA), dtype,
        backend)
    decode = {"num_heads": N_GQA, "bos_id": BOS, "eos_id": EOS, "pad_id": PAD, "max_len": MAX_LEN}
    tokens, lengths, cross = jax_transformer.greedy_decode(_to_jax(params, dtype), src,
                                                           src_valid_len, **decode)
    ref_tokens, ref_lengths, ref_cross = np_transformer.greedy_decode(params, src, src_valid_len,
                                                                      **decode)
    np.testing.assert_array_equal(np.asarray(tokens), ref_tokens)
    np.testing.assert_array_equal(np.asarray(lengths), ref_lengths)
    _assert_matches(cross, ref_cross, dtype, backend)
