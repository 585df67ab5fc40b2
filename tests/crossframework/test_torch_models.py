"""Ours against the book's PyTorch models (jax_attention.interop.torch_models), on shared weights.

Each torch mirror gets random weights; :func:`~jax_attention.interop.from_torch` gives ours the
same. Outputs, attention weights and the gradients of every parameter (converted back with
``from_torch`` and compared as our nested dicts) agree to 1e-10 in float64 (1e-5 in float32);
the seq2seq models also take one training step each way — the book's ``train_seq2seq`` step
(``loss.sum()``, ``grad_clipping(theta=1)``, ``torch.optim.Adam(lr=0.005)``) against ours
(``optax.clip_by_global_norm(1)`` and ``adam(0.005)``, :func:`jax_attention.train.loop.clipped_adam`)
— and land on the same parameters. The float64 NumPy reference joins where it is cheap.

Dropout is compared at rate 0 (random streams differ between frameworks); separately, the
mirrors in training mode must drop (their outputs differ from evaluation mode's) and in evaluation
mode equal the rate-0 model.

The documented difference: a fully masked row. The mirrors follow our semantics (zero weights,
zero output); the book's ``masked_softmax`` (kept as ``book_masked_softmax``) gives such a row
uniform weights in float32/float64 and NaN in float16, and equals ours on every other row.
"""

from __future__ import annotations

from tests.torch_support import import_torch

torch = import_torch()

import functools  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
import pytest  # noqa: E402

from jax_attention.models import bahdanau, transformer  # noqa: E402

from jax_attention.nn import masking, multihead, scoring
from jax_attention.interop import from_torch  # noqa: E402
from jax_attention.interop import torch_models as tm  # noqa: E402
from jax_attention.train.loop import clipped_adam  # noqa: E402
from reference_numpy import attention_pooling as np_pooling  # noqa: E402
from reference_numpy import bahdanau as np_bahdanau  # noqa: E402
from reference_numpy import masking as np_masking  # noqa: E402
from reference_numpy import positional as np_positional  # noqa: E402
from reference_numpy import scoring as np_scoring  # noqa: E402
from reference_numpy import transformer as np_transformer  # noqa: E402
from tests.crossframework._support import (  # noqa: E402
    as_numpy,
    assert_close,
    assert_tree_close,
    lengths,
    normal,
    to_jax,
)

B, T, S = 3, 4, 5


def _torch_dtype(dtype):
    return getattr(torch, np.dtype(dtype).name)


def _tensors(dtype, *arrays, requires_grad=True):
    return [torch.tensor(np.asarray(a, dtype), requires_grad=requires_grad) for a in arrays]


def _param_grads(module, component):
    return from_torch({name: p.grad for name, p in module.named_parameters()}, component)


# --------------------------------------------------------------------------- masked softmax


@functools.cache
def _ours_masked_softmax():
    def run(X, valid_lens, mask, cotangent):
        weights, vjp = jax.vjp(lambda x: masking.masked_softmax(x, valid_lens, mask=mask), X)
        return weights, vjp(cotangent)[0]

    return jax.jit(run)


def test_masked_softmax_matches_ours(dtype):
    X, cotangent = 2 * normal((B, 2, T, S), 0), normal((B, 2, T, S), 1)  # a heads axis too
    valid_lens = lengths([[5, 0, 3, 1], [2, 2, 0, 5], [4, 4, 4, 4]])
    mask = np.random.default_rng(2).random((1, 2, T, S)) < 0.8
    weights, grad = _ours_masked_softmax()(jnp.asarray(X, dtype), valid_lens, mask,
                                           jnp.asarray(cotangent, dtype))
    (tensor,) = _tensors(dtype, X)
    expected = tm.masked_softmax(tensor, torch.tensor(valid_lens), mask=torch.tensor(mask))
    expected.backward(torch.tensor(cotangent.astype(dtype)))
    assert_close(weights, expected, dtype, what="weights")
    assert_close(grad, tensor.grad, dtype, what="dX")
    empty = ~(np.arange(S) < valid_lens[:, None, :, None]).any(-1)  # (B, 1, T)
    assert (as_numpy(expected)[np.broadcast_to(empty, (B, 2, T))] == 0).all()


def test_book_masked_softmax_differs_only_on_fully_masked_rows():
    X = torch.tensor(normal((B, T, S), 3))
    valid_lens = torch.tensor([[5, 0, 3, 1], [2, 2, 0, 5], [4, 4, 4, 4]])
    empty = (valid_lens == 0).numpy()
    ours, book = tm.masked_softmax(X, valid_lens), tm.book_masked_softmax(X, valid_lens)
    reference = np_masking.masked_softmax(as_numpy(X), valid_lens.numpy())
    # Rows with a key to attend: the same (exp(-1e6 - max) is exactly 0 in float64).
    np.testing.assert_allclose(as_numpy(ours)[~empty], as_numpy(book)[~empty], rtol=1e-15, atol=0)
    # Fully masked rows: zero here (and in ours), uniform 1/S over padding in the book.
    assert (as_numpy(ours)[empty] == 0).all() and (reference[empty] == 0).all()
    np.testing.assert_allclose(as_numpy(ours), reference, rtol=1e-14, atol=0)
    np.testing.assert_array_equal(as_numpy(book)[empty], np.full((empty.sum(), S), 1 / S))
    # float16: the book's -1e6 is -inf, and a row of -inf is NaN; ours stays zero and finite.
    half = X.to(torch.float16)
    book_half, ours_half = tm.book_masked_softmax(half, valid_lens), tm.masked_softmax(half, valid_lens)
    assert torch.isnan(book_half[torch.tensor(empty)]).all()
    assert not torch.isnan(book_half[torch.tensor(~empty)]).any()
    assert ours_half.dtype == torch.float16 and (as_numpy(ours_half)[empty] == 0).all()
    np.testing.assert_allclose(as_numpy(ours_half)[~empty].astype(np.float64),
                               as_numpy(ours)[~empty], atol=1e-3)


def test_sequence_mask_is_the_books():
    X = torch.arange(1.0, 7.0).reshape(2, 3)
    got = tm.sequence_mask(X, torch.tensor([1, 2]))
    np.testing.assert_array_equal(as_numpy(got), [[1, 0, 0], [4, 5, 0]])
    np.testing.assert_array_equal(as_numpy(X), [[1, 2, 3], [4, 5, 6]])  # not in place
    np.testing.assert_array_equal(
        as_numpy(got), np_masking.sequence_mask(np.arange(1.0, 7.0).reshape(2, 3), np.array([1, 2])))


def test_mirrors_check_their_arguments():
    X = torch.zeros(2, 3, 4)
    with pytest.raises(ValueError, match=r"valid_lens must lie in \[0, S\] = \[0, 4\], got values from 0 to 5"):
        tm.masked_softmax(X, torch.tensor([0, 5]))
    with pytest.raises(ValueError, match=r"valid_lens must have shape \(B,\) = \(2,\) or \(B, T\)"):
        tm.masked_softmax(X, torch.tensor([[1, 2]]))
    with pytest.raises(ValueError, match="valid_lens must hold integers"):
        tm.masked_softmax(X, torch.tensor([1.0, 2.0]))
    with pytest.raises(TypeError, match="mask must be boolean"):
        tm.masked_softmax(X, mask=torch.ones(3, 4))
    with pytest.raises(ValueError, match=r"mask must broadcast to .* = \(2, 3, 4\), got shape \(2, 2, 3, 4\)"):
        tm.masked_softmax(X, mask=torch.ones(2, 2, 3, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="num_hiddens must be divisible by num_heads"):
        tm.MultiHeadAttention(10, 4)
    with pytest.raises(ValueError, match="mask must have shape"):
        tm.MultiHeadAttention(8, 2)(torch.zeros(2, 3, 8), torch.zeros(2, 4, 8), torch.zeros(2, 4, 8),
                                    mask=torch.ones(2, 3, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="longer than the positional table's max_len = 4"):
        tm.PositionalEncoding(8, max_len=4)(torch.zeros(1, 5, 8))


# --------------------------------------------------------------------------- scoring and multi-head


@functools.cache
def _ours_layer(name: str, is_causal: bool, num_heads: int | None = None):
    """Our ``scoring.<name>`` or ``multihead.multi_head_attention`` with its VJP, jitted."""
    def run(params, queries, keys, values, valid_lens, cotangent):
        def attend(params, q, k, v):
            if name == "multi_head_attention":
                return multihead.multi_head_attention(params, q, k, v, valid_lens, num_heads=num_heads,
                                                      is_causal=is_causal)
            return getattr(scoring, name)(params, q, k, v, valid_lens, is_causal=is_causal)

        (output, weights), vjp = jax.vjp(attend, params, queries, keys, values)
        return output, weights, vjp((cotangent, jnp.zeros_like(weights)))

    return jax.jit(run)


def _check_layer(module, component, name, dtype, sizes, valid_lens, is_causal, num_heads=None):
    """Runs the mirror and ours on the same inputs and compares outputs, weights and gradients."""
    module = module.to(_torch_dtype(dtype))
    params = from_torch(module.state_dict(), component)
    q, k, v = normal((B, T, sizes[0]), 4), normal((B, S, sizes[1]), 5), normal((B, S, sizes[2]), 6)
    cotangent = normal((B, T, sizes[3]), 7)
    output, weights, grads = _ours_layer(name, is_causal, num_heads)(
        to_jax(params, dtype), *to_jax((q, k, v), dtype), valid_lens, jnp.asarray(cotangent, dtype))
    tensors = _tensors(dtype, q, k, v)
    expected, expected_weights = module(*tensors, torch.tensor(valid_lens), is_causal=is_causal)
    expected.backward(torch.tensor(cotangent.astype(dtype)))
    assert_close(output, expected, dtype, what="output")
    assert_close(weights, expected_weights, dtype, what="weights")
    assert_tree_close(grads[0], _param_grads(module, component), dtype, what="d params")
    for n, got, want in zip("qkv", grads[1:], tensors):
        assert_close(got, want.grad, dtype, what=f"d{n}")
    return params, (q, k, v), as_numpy(expected)


def test_additive_attention_mirror(x64, highest_precision):
    dtype = np.float64
    torch.manual_seed(0)
    valid_lens = lengths([5, 0, 2])  # batch 1 attends nothing: zero output in both
    params, (q, k, v), expected = _check_layer(
        tm.AdditiveAttention(3, 2, 6), "additive_attention", "additive_attention", dtype,
        (3, 2, 4, 4), valid_lens, False)
    assert (expected[1] == 0).all()
    reference, _ = np_scoring.additive_attention(params, q, k, v, valid_lens)
    np.testing.assert_allclose(expected, reference, rtol=1e-10, atol=1e-10)


def test_dot_product_attention_mirror(dtype):
    q, k, v = normal((B, 2, T, 4), 8), normal((B, 2, S, 4), 9), normal((B, 2, S, 3), 10)
    valid_lens = lengths([[5, 0, 3, 1], [2, 2, 0, 5], [4, 4, 4, 4]])
    output, weights = jax.jit(functools.partial(scoring.dot_product_attention, is_causal=True))(
        *to_jax((q, k, v), dtype), valid_lens)
    expected, expected_weights = tm.DotProductAttention()(
        *_tensors(dtype, q, k, v, requires_grad=False), torch.tensor(valid_lens), is_causal=True)
    assert_close(output, expected, dtype)
    assert_close(weights, expected_weights, dtype)


# float32 once, with biases and distinct sizes (each case is a compilation).
@pytest.mark.parametrize("dtype_name, bias", [("float64", True), ("float64", False), ("float32", True)])
def test_multihead_attention_mirror(request, dtype_name, bias):
    request.getfixturevalue("highest_precision")
    if dtype_name == "float64":
        request.getfixturevalue("x64")
    dtype = np.dtype(dtype_name)
    torch.manual_seed(1)
    # Different query, key and value sizes (with biases), so that a transposed kernel cannot pass.
    sizes = (3, 5, 6, 8) if bias else (8, 8, 8, 8)
    module = tm.MultiHeadAttention(8, 2, bias=bias, query_size=sizes[0], key_size=sizes[1],
                                   value_size=sizes[2])
    if bias:
        with torch.no_grad():
            for name in ("W_q", "W_k", "W_v", "W_o"):
                getattr(module, name).bias.normal_()
    valid_lens = lengths([[5, 0, 3, 1], [2, 2, 0, 5], [4, 1, 4, 4]])
    _check_layer(module, "multihead", "multi_head_attention", dtype, sizes, valid_lens,
                 is_causal=not bias, num_heads=2)


def test_transpose_qkv_and_output_are_ours():
    X = normal((2, 3, 8), 11, np.float32)
    book = tm.transpose_qkv(torch.tensor(X), 4)
    np.testing.assert_array_equal(as_numpy(book), np.asarray(multihead.transpose_qkv(X, 4)))
    np.testing.assert_array_equal(as_numpy(tm.transpose_output(book, 4)), X)


def test_ffn_and_add_norm_mirrors(x64, highest_precision):
    dtype = np.float64
    torch.manual_seed(2)
    ffn, add_norm = tm.PositionWiseFFN(6, 10).double(), tm.AddNorm(6).double()
    with torch.no_grad():
        add_norm.ln.weight.normal_()
        add_norm.ln.bias.normal_()
    ffn_params = from_torch(ffn.state_dict(), "ffn")
    norm_params = from_torch({k.removeprefix("ln."): v for k, v in add_norm.state_dict().items()},
                             "layer_norm")
    X, cotangent = normal((B, T, 6), 12), normal((B, T, 6), 13)

    def ours(ffn_params, norm_params, X):
        return transformer.add_norm(norm_params, X, transformer.position_wise_ffn(ffn_params, X))

    output, vjp = jax.vjp(jax.jit(ours), to_jax(ffn_params, dtype), to_jax(norm_params, dtype),
                          jnp.asarray(X))
    grads = vjp(jnp.asarray(cotangent))
    (tensor,) = _tensors(dtype, X)
    expected = add_norm(tensor, ffn(tensor))
    expected.backward(torch.tensor(cotangent))
    assert_close(output, expected, dtype)
    assert_tree_close(grads[0], _param_grads(ffn, "ffn"), dtype, what="d ffn")
    norm_grads = {k.removeprefix("ln."): p.grad for k, p in add_norm.named_parameters()}
    assert_tree_close(grads[1], from_torch(norm_grads, "layer_norm"), dtype, what="d addnorm")
    assert_close(grads[2], tensor.grad, dtype, what="dX")


# --------------------------------------------------------------------------- positions and pooling
# Against the NumPy reference (which the parity tests tie to our JAX functions): eager JAX would
# compile every operation here, for nothing the reference does not show.


def test_positional_mirrors():
    X = normal((2, 6, 8), 14)
    P = np_positional.positional_encoding(50, 8)
    for dtype in (np.float64, np.float32):
        got = tm.PositionalEncoding(8, max_len=50)(torch.tensor(X.astype(dtype)))
        # The table is float64 rounded once to the input's dtype, as ours (the book: float32).
        expected = X.astype(dtype) + P[:6].astype(dtype)
        assert got.dtype == _torch_dtype(dtype)
        np.testing.assert_array_equal(as_numpy(got), expected)
    np.testing.assert_array_equal(as_numpy(tm.positional_encoding(7, 5)),
                                  np_positional.positional_encoding(7, 5))  # odd width too

    heads = normal((2, 3, 6, 4), 15)
    positions = np.arange(6) + 3  # after a cache of 3 keys
    np.testing.assert_allclose(
        as_numpy(tm.rotary_embedding(torch.tensor(heads), torch.tensor(positions))),
        np_positional.rotary_embedding(heads, positions), rtol=1e-13, atol=1e-14)

    relative = np.arange(-300, 301)
    for num_buckets, max_distance, bidirectional in [(32, 128, True), (8, 72, True), (16, 20, False),
                                                     (10, 7, False)]:
        got = tm.relative_position_buckets(torch.tensor(relative), num_buckets, max_distance,
                                           bidirectional)
        np.testing.assert_array_equal(as_numpy(got), np_positional.relative_position_buckets(
            relative, num_buckets, max_distance, bidirectional))


def test_nadaraya_watson_mirror():
    queries, keys = normal((2, 4), 16), normal((2, 6), 17)
    per_query_keys = normal((2, 4, 3), 18)
    cases = [(keys, normal((2, 6), 19), 1.0), (keys, normal((2, 6, 2), 20), 2.5),
             (per_query_keys, normal((2, 4, 3), 21), 0.7)]
    for k, v, w in cases:
        expected = np_pooling.nadaraya_watson(queries, k, v, w)
        got = tm.nadaraya_watson(torch.tensor(queries), torch.tensor(k), torch.tensor(v), w)
        for g, e in zip(got, expected):
            np.testing.assert_allclose(as_numpy(g), e, rtol=1e-13, atol=1e-15)


# --------------------------------------------------------------------------- the seq2seq models

BOS = 1
SRC_VOCAB, TGT_VOCAB = 7, 9
# Source 1 has length 0 (its attention is fully masked: zero context in both), target 2 has
# length 0 (no loss, no gradient from it).
SRC_VALID, TGT_VALID = lengths([4, 0, 2]), lengths([5, 3, 0])
MODELS = {
    # Two GRU layers: the state stack and nn.GRU's dropout between layers matter.
    "bahdanau": lambda dropout=0.0: tm.BahdanauSeq2Seq(SRC_VOCAB, TGT_VOCAB, embed_size=5,
                                                       num_hiddens=6, num_layers=2, dropout=dropout),
    # One block (every kind of parameter; a second one doubles the compilation of the gradient);
    # two blocks are compared with the NumPy reference below.
    "transformer": lambda dropout=0.0, num_layers=1: tm.TransformerSeq2Seq(
        SRC_VOCAB, TGT_VOCAB, num_hiddens=8, ffn_num_hiddens=12, num_heads=2, num_layers=num_layers,
        dropout=dropout, max_len=16),
}


def _batch():
    rng = np.random.default_rng(22)
    src = rng.integers(0, SRC_VOCAB, (B, 4)).astype(np.int32)
    tgt = rng.integers(0, TGT_VOCAB, (B, 5)).astype(np.int32)
    return src, SRC_VALID, tgt, TGT_VALID


def _torch_batch(batch):
    return [torch.tensor(a) for a in batch]


def _forward(kind, params, src, src_valid_len, dec_input):
    if kind == "bahdanau":
        return bahdanau.seq2seq(params, src, src_valid_len, dec_input)
    return transformer.transformer(params, src, src_valid_len, dec_input, num_heads=2, max_positions=16)


@functools.cache
def _ours_training_step(kind: str):
    """Logits, attention weights, per-sequence losses, gradients and the parameters after one
    clipped Adam step, in one compiled function."""
    def run(params, src, src_valid_len, tgt, tgt_valid_len):
        def total(params):
            logits, weights = _forward(kind, params, src, src_valid_len,
                                       bahdanau.teacher_forcing_inputs(tgt, BOS))
            losses = bahdanau.masked_cross_entropy(logits, tgt, tgt_valid_len)
            return jnp.sum(losses), (logits, weights, losses)

        (_, (logits, weights, losses)), grads = jax.value_and_grad(total, has_aux=True)(params)
        optimizer = clipped_adam(0.005)
        # optax's Adam mixes Python floats with its int32 step count (see jax_attention.train.loop).
        with jax.numpy_dtype_promotion("standard"):
            updates, _ = optimizer.update(grads, optimizer.init(params), params)
            stepped = optax.apply_updates(params, updates)
        return logits, weights, losses, grads, stepped

    return jax.jit(run)


def _torch_weights(kind, model, src, src_valid_len, dec_input):
    if kind == "bahdanau":
        encoded = model.encoder(src)
        return model.decoder(dec_input, model.decoder.init_state(encoded, src_valid_len))[2]
    return model.forward_with_weights(src, src_valid_len, dec_input)[1]


@pytest.mark.parametrize("kind", MODELS)
def test_model_forward_loss_gradients_and_one_adam_step(x64, highest_precision, kind):
    dtype = np.float64
    torch.manual_seed(3)
    model = MODELS[kind]().double()
    model.apply(tm.xavier_init_weights)  # the book's initialisation, as train_seq2seq
    params = from_torch(model.state_dict(), kind)
    batch = _batch()
    src, src_valid_len, tgt, tgt_valid_len = _torch_batch(batch)
    dec_input = tm.teacher_forcing_inputs(tgt, BOS)

    logits, weights, losses, grads, stepped = _ours_training_step(kind)(to_jax(params, dtype), *batch)

    expected_logits = model(src, src_valid_len, dec_input)
    assert_close(logits, expected_logits, dtype, what="logits")
    expected_weights = _torch_weights(kind, model, src, src_valid_len, dec_input)
    assert_tree_close(weights, expected_weights, dtype, what="attention weights")
    expected_losses = model.loss(src, src_valid_len, tgt, tgt_valid_len, BOS)
    assert_close(losses, expected_losses, dtype, what="losses")
    assert as_numpy(expected_losses)[2] == 0
    expected_losses.sum().backward()
    torch_grads = _param_grads(model, kind)
    assert_tree_close(grads, torch_grads, dtype, what="d")
    # The step below clips: the book's gradient norm is above theta = 1.
    assert np.sqrt(sum(np.sum(g ** 2) for g in jax.tree.leaves(torch_grads))) > 1

    model.zero_grad()
    loss = tm.train_step(model, torch.optim.Adam(model.parameters(), lr=0.005), src, src_valid_len,
                         tgt, tgt_valid_len, BOS)
    np.testing.assert_allclose(loss, float(np.sum(np.asarray(losses))), rtol=1e-12)
    stepped_torch = from_torch(model.state_dict(), kind)
    assert_tree_close(stepped, stepped_torch, dtype, what="after one step")
    changed = [not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(params),
                                                       jax.tree.leaves(stepped_torch))]
    assert all(changed)  # every parameter got a gradient and moved


def _reference_logits(kind, params, batch, dec_input):
    if kind == "bahdanau":
        return np_bahdanau.seq2seq(params, batch[0], batch[1], dec_input)[0]
    return np_transformer.transformer(params, batch[0], batch[1], dec_input, num_heads=2,
                                      max_positions=16)[0]


def test_models_match_the_numpy_reference():
    # float64 NumPy reference against the torch mirrors; two Transformer blocks here.
    torch.manual_seed(4)
    batch = _batch()
    src, src_valid_len, tgt, _ = _torch_batch(batch)
    dec_input = tm.teacher_forcing_inputs(tgt, BOS)
    for kind, model in (("bahdanau", MODELS["bahdanau"]()),
                        ("transformer", MODELS["transformer"](num_layers=2))):
        model = model.double()
        params = from_torch(model.state_dict(), kind)
        expected = as_numpy(model(src, src_valid_len, dec_input))
        reference = _reference_logits(kind, params, batch, as_numpy(dec_input))
        np.testing.assert_allclose(expected, reference, rtol=1e-10, atol=1e-10, err_msg=kind)


def test_model_mirrors_in_float32():
    # The float32 mirrors against the float64 reference on the same (float32) weights; our float32
    # JAX models meet the same reference in tests/parity (compiling them again here would double
    # the cost of this file for no new pairing).
    torch.manual_seed(5)
    batch = _batch()
    src, src_valid_len, tgt, _ = _torch_batch(batch)
    dec_input = tm.teacher_forcing_inputs(tgt, BOS)
    for kind, model in (("bahdanau", MODELS["bahdanau"]()), ("transformer", MODELS["transformer"]())):
        params = from_torch(model.state_dict(), kind)
        assert all(leaf.dtype == np.float32 for leaf in jax.tree.leaves(params))
        got = model(src, src_valid_len, dec_input)
        assert got.dtype == torch.float32
        reference = _reference_logits(kind, jax.tree.map(lambda a: a.astype(np.float64), params), batch,
                                      as_numpy(dec_input))
        np.testing.assert_allclose(as_numpy(got), reference, rtol=1e-5, atol=1e-5, err_msg=kind)


@pytest.mark.parametrize("num_kv_heads", [2, 1], ids=["gqa", "mqa"])
def test_grouped_query_transformer_mirror_matches_the_numpy_reference(num_kv_heads):
    """The mirror's grouped-query attention (key/value heads repeated per group, as torch's
    enable_gqa) is ours: logits and every attention weight, float64; the registry builds the
    mirror from the config's num_kv_heads and our parameters load into it (strict)."""
    from jax_attention.models.configs import TransformerConfig
    from jax_attention.interop import to_torch
    from jax_attention.models.registry import get_model

    torch.manual_seed(8)
    model = tm.TransformerSeq2Seq(SRC_VOCAB, TGT_VOCAB, num_hiddens=8, ffn_num_hiddens=12,
                                  num_heads=4, num_layers=2, max_len=16,
                                  num_kv_heads=num_kv_heads).double()
    params = from_torch(model.state_dict(), "transformer")
    for attention in ("self_attention", "cross_attention"):
        block = params["decoder"]["blocks"]["block_1"][attention]
        assert block["W_k"].shape == block["W_v"].shape == (8, 2 * num_kv_heads)
    batch = _batch()
    src, src_valid_len, tgt, _ = _torch_batch(batch)
    dec_input = tm.teacher_forcing_inputs(tgt, BOS)
    logits, weights = model.forward_with_weights(src, src_valid_len, dec_input)
    ref_logits, ref_weights = np_transformer.transformer(params, batch[0], batch[1],
                                                         as_numpy(dec_input), num_heads=4,
                                                         max_positions=16)
    np.testing.assert_allclose(as_numpy(logits), ref_logits, rtol=1e-10, atol=1e-10)
    for name, expected in ref_weights.items():
        np.testing.assert_allclose(as_numpy(weights[name]), expected, rtol=1e-10, atol=1e-10,
                                   err_msg=name)
    config = TransformerConfig(num_hiddens=8, ffn_num_hiddens=12, num_heads=4,
                               num_kv_heads=num_kv_heads, num_layers=2, dropout=0.0,
                               num_steps=6, max_positions=16, src_vocab_size=SRC_VOCAB,
                               tgt_vocab_size=TGT_VOCAB)
    mirror = get_model("transformer").torch_mirror(config).double()
    mirror.load_state_dict(to_torch(params, "transformer"))
    np.testing.assert_array_equal(as_numpy(mirror(src, src_valid_len, dec_input)), as_numpy(logits))
    with pytest.raises(ValueError, match=r"num_kv_heads must divide num_heads = 4, got 3"):
        tm.MultiHeadAttention(8, 4, num_kv_heads=3)


# --------------------------------------------------------------------------- dropout in training mode


def _differs_in_training(make, inputs):
    """``make(rate)`` builds a mirror; at rate 0.5 in training mode it must drop (differ from
    evaluation mode, which equals the rate-0 mirror with the same weights)."""
    torch.manual_seed(6)
    dropping = make(0.5)
    plain = make(0.0)
    plain.load_state_dict(dropping.state_dict())
    dropping.train()
    trained = dropping(*inputs)
    dropping.eval()
    evaluated = dropping(*inputs)
    reference = plain.eval()(*inputs)
    first = lambda out: as_numpy(out[0] if isinstance(out, tuple) else out)  # noqa: E731
    assert np.isfinite(first(trained)).all()
    assert not np.allclose(first(trained), first(evaluated))
    np.testing.assert_array_equal(first(evaluated), first(reference))


def test_mirrors_apply_dropout_in_training_mode():
    q, k, v = (torch.tensor(normal(shape, seed)) for shape, seed in
               (((B, T, 8), 23), ((B, S, 8), 24), ((B, S, 8), 25)))
    lens = torch.tensor([5, 3, 2])
    _differs_in_training(lambda p: tm.DotProductAttention(p).double(), (q, k, v, lens))
    _differs_in_training(lambda p: tm.AdditiveAttention(8, 8, 6, p).double(), (q, k, v, lens))
    _differs_in_training(lambda p: tm.MultiHeadAttention(8, 2, p).double(), (q, k, v, lens))
    _differs_in_training(lambda p: tm.AddNorm(8, p).double(), (q, q))
    _differs_in_training(lambda p: tm.PositionalEncoding(8, p, max_len=16), (q,))
    src, src_valid_len, tgt, _ = _torch_batch(_batch())
    for kind in MODELS:
        _differs_in_training(lambda p: MODELS[kind](p).double(),
                             (src, src_valid_len, tm.teacher_forcing_inputs(tgt, BOS)))

    # Where: after the positional sum, inverted (kept entries scaled by 1 / (1 - p)).
    torch.manual_seed(7)
    dropped = as_numpy(tm.PositionalEncoding(8, 0.5, max_len=16).train()(q))
    summed = as_numpy(q) + as_numpy(tm.positional_encoding(T, 8))
    assert ((dropped == 0) | np.isclose(dropped, 2 * summed, rtol=1e-15)).all()
    assert 0 < (dropped == 0).mean() < 1
