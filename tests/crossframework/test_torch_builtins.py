"""Ours against PyTorch's scaled_dot_product_attention, nn.MultiheadAttention, nn.GRU and nn.LayerNorm.

The same inputs and parameters on both sides (parameters cross with :mod:`jax_attention.interop`);
outputs and gradients agree to 1e-10 in float64 and 1e-5 in float32. Gradients are taken against
random cotangents, so that every output element counts.

Fully masked rows are pinned where the frameworks meet them:

* ``scaled_dot_product_attention`` (its default CPU kernel and its math path alike) gives a
  fully masked row a zero output and zero gradients — ours exactly;
* ``nn.MultiheadAttention`` gives such a row NaN (output and weights) with ``need_weights=True``,
  which computes the softmax itself, and ``out_proj.bias`` with ``need_weights=False``, which calls
  ``scaled_dot_product_attention`` — ours (``b_o``) on every row.
"""

from __future__ import annotations

from tests.torch_support import import_torch

torch = import_torch()

import contextlib  # noqa: E402
import functools  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from torch.nn import functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

from jax_attention.models import bahdanau, transformer  # noqa: E402

from jax_attention.nn import multihead, scoring
from jax_attention.interop import from_torch, to_torch  # noqa: E402
from tests.crossframework._support import (  # noqa: E402
    as_numpy,
    assert_close,
    assert_tree_close,
    lengths,
    normal,
    to_jax,
)

B, N, T, S, H = 2, 2, 3, 5, 4


def _tensors(dtype, *arrays, requires_grad=True):
    return [torch.tensor(np.asarray(a, dtype), requires_grad=requires_grad) for a in arrays]


def _grads(tensors):
    return [t.grad for t in tensors]


# --------------------------------------------------------------------------- scaled_dot_product_attention

# (valid_lens, is_causal): lengths (B,) or (B, T) with a 0, so that fully masked rows occur.
SDPA_CASES = {
    "lens_B": ([0, 3], False),
    "lens_BT": ([[2, 0, 5], [1, 4, 3]], False),
    "causal": (None, True),
    "causal_and_lens_BT": ([[2, 0, 5], [1, 4, 3]], True),
}


@functools.cache
def _ours_attention(is_causal: bool):
    def run(queries, keys, values, valid_lens, cotangent):
        def attend(q, k, v):
            return scoring.dot_product_attention(q, k, v, valid_lens, is_causal=is_causal)[0]

        output, vjp = jax.vjp(attend, queries, keys, values)
        return output, vjp(cotangent)

    return jax.jit(run)


def _sdpa_mask(valid_lens, is_causal):
    """Our (valid_lens, is_causal) as SDPA's boolean ``attn_mask`` (True = attend) ``(B, 1, T, S)``."""
    if valid_lens is None:
        return None
    lens = np.asarray(valid_lens).reshape(B, -1)  # (B, 1) or (B, T)
    keep = np.arange(S)[None, None, :] < lens[:, :, None]
    if is_causal:
        keep = keep & np.tril(np.ones((T, S), bool))[None]
    return torch.tensor(np.broadcast_to(keep, (B, T, S))[:, None])


# Every case in float64; float32 once, on the case that combines everything (compilations are
# the cost of these tests).
DTYPE_CASES = [("float64", case) for case in SDPA_CASES] + [("float32", "causal_and_lens_BT")]


def _dtype(request, name):
    """The dtype ``name`` with full-precision matmuls (and x64 for float64)."""
    request.getfixturevalue("highest_precision")
    if name == "float64":
        request.getfixturevalue("x64")
    return np.dtype(name)


@pytest.mark.parametrize("dtype_name, case", DTYPE_CASES)
def test_scaled_dot_product_attention(request, backend, dtype_name, case):
    dtype = _dtype(request, dtype_name)
    valid_lens, is_causal = SDPA_CASES[case]
    q, k, v = normal((B, N, T, H), 0), normal((B, N, S, H), 1), normal((B, N, S, H), 2)
    cotangent = normal((B, N, T, H), 3)
    lens = None if valid_lens is None else lengths(valid_lens)
    output, grads = _ours_attention(is_causal)(*to_jax((q, k, v), dtype), lens,
                                               jnp.asarray(cotangent, dtype))
    assert output.devices() == {backend}

    mask = _sdpa_mask(valid_lens, is_causal)
    # Fully masked query rows (B, T); (B, N, T, H) arrays are indexed with them heads-last.
    empty = np.zeros((B, T), bool) if mask is None else ~as_numpy(mask).any(-1)[:, 0]
    assert empty.any() == (mask is not None)

    def rows(x):
        return as_numpy(x).transpose(0, 2, 1, 3)[empty]

    # Ours: a zero output and zero query gradient there, exactly; no NaN anywhere.
    assert (rows(output) == 0).all() and (rows(grads[0]) == 0).all()
    assert all(np.isfinite(np.asarray(g)).all() for g in grads)
    # With a mask, causality is in it (SDPA refuses both); alone, SDPA's own is_causal runs.
    torch_causal = is_causal and mask is None
    for kernel in (None, SDPBackend.MATH):  # the default CPU kernel, then the math path
        tensors = _tensors(dtype, q, k, v)
        with sdpa_kernel(kernel) if kernel is not None else contextlib.nullcontext():
            expected = F.scaled_dot_product_attention(*tensors, attn_mask=mask, is_causal=torch_causal)
            expected.backward(torch.tensor(cotangent.astype(dtype)))
        assert_close(output, expected, dtype, what=f"{kernel} output")
        for name, got, want in zip("qkv", grads, _grads(tensors)):
            assert_close(got, want, dtype, what=f"{kernel} d{name}")
        # torch 2.13, both paths: the same exact zeros on fully masked rows, finite gradients.
        assert (rows(expected) == 0).all() and (rows(tensors[0].grad) == 0).all(), kernel
        assert all(torch.isfinite(t.grad).all() for t in tensors), kernel


# --------------------------------------------------------------------------- nn.MultiheadAttention

D = 8


def _mha_params(bias, key_size, value_size, seed=0):
    rng = np.random.default_rng(seed)
    params = {"W_q": rng.normal(size=(D, D)) / 3, "W_k": rng.normal(size=(key_size, D)) / 3,
              "W_v": rng.normal(size=(value_size, D)), "W_o": rng.normal(size=(D, D))}
    if bias:
        params.update({name: rng.normal(size=(D,)) for name in ("b_q", "b_k", "b_v", "b_o")})
    return params


@functools.cache
def _ours_mha(is_causal: bool):
    def run(params, queries, keys, values, valid_lens, cotangent):
        def attend(params, q, k, v):
            return multihead.multi_head_attention(params, q, k, v, valid_lens, num_heads=N,
                                                  is_causal=is_causal)

        (output, weights), vjp = jax.vjp(attend, params, queries, keys, values)
        return output, weights, vjp((cotangent, jnp.zeros_like(weights)))

    return jax.jit(run)


def _torch_mha(params, bias, key_size, value_size, dtype):
    module = torch.nn.MultiheadAttention(
        D, N, bias=bias, batch_first=True, kdim=key_size, vdim=value_size,
        dtype=getattr(torch, np.dtype(dtype).name))
    module.load_state_dict(to_torch(params, "torch.nn.MultiheadAttention", bias=bias))
    return module


# (bias, key size, value size, valid_lens (B,) or None, is_causal, need_weights, average):
MHA_CASES = {
    "bias-packed-padding-averaged": (True, D, D, [5, 2], False, True, True),
    "nobias-kdim-vdim-causal-per_head": (False, 5, 6, None, True, True, False),
    "bias-kdim-vdim-padding-causal-sdpa": (True, 5, 6, [5, 2], True, False, None),
}


@pytest.mark.parametrize("dtype_name, case", [("float64", case) for case in MHA_CASES]
                         + [("float32", "bias-packed-padding-averaged")])
def test_multihead_attention_matches_torch_nn(request, backend, dtype_name, case):
    dtype = _dtype(request, dtype_name)
    bias, key_size, value_size, valid_lens, is_causal, need_weights, average = MHA_CASES[case]
    params = _mha_params(bias, key_size, value_size)
    q, k, v = normal((B, T, D), 4), normal((B, S, key_size), 5), normal((B, S, value_size), 6)
    cotangent = normal((B, T, D), 7)
    lens = None if valid_lens is None else lengths(valid_lens)
    output, weights, grads = _ours_mha(is_causal)(to_jax(params, dtype), *to_jax((q, k, v), dtype),
                                                  lens, jnp.asarray(cotangent, dtype))
    assert output.devices() == {backend}

    module = _torch_mha(params, bias, key_size, value_size, dtype)
    tensors = _tensors(dtype, q, k, v)
    padding = None if lens is None else torch.tensor(np.arange(S)[None, :] >= lens[:, None])
    causal = torch.tensor(~np.tril(np.ones((T, S), bool))) if is_causal else None  # True = masked
    kwargs = {} if average is None else {"average_attn_weights": average}
    expected, expected_weights = module(*tensors, key_padding_mask=padding, attn_mask=causal,
                                        need_weights=need_weights, **kwargs)
    expected.backward(torch.tensor(cotangent.astype(dtype)))

    assert_close(output, expected, dtype, what="output")
    if need_weights:
        ours = np.asarray(weights).mean(axis=1) if average else np.asarray(weights)
        assert_close(ours, expected_weights, dtype, what="weights")
    else:
        assert expected_weights is None
    torch_grads = {name: p.grad for name, p in module.named_parameters()}
    assert_tree_close(grads[0], from_torch(torch_grads, "torch.nn.MultiheadAttention"), dtype,
                      what="d params")
    for name, got, want in zip("qkv", grads[1:], _grads(tensors)):
        assert_close(got, want, dtype, what=f"d{name}")


def test_multihead_attention_fully_masked_batch_vs_torch_nn(backend, x64, highest_precision):
    # Batch 1 may attend no key at all (key_padding_mask all True).
    dtype = np.float64
    params = _mha_params(True, D, D, seed=1)
    q, k, v = normal((B, T, D), 8), normal((B, S, D), 9), normal((B, S, D), 10)
    cotangent = normal((B, T, D), 11)
    lens = lengths([4, 0])
    output, weights, grads = _ours_mha(False)(to_jax(params, dtype), *to_jax((q, k, v), dtype), lens,
                                              jnp.asarray(cotangent))
    assert output.devices() == {backend}
    output = np.asarray(output)
    # Ours: zero weights, so every query of batch 1 outputs b_o.
    assert (np.asarray(weights)[1] == 0).all()
    np.testing.assert_allclose(output[1], np.broadcast_to(params["b_o"], (T, D)), rtol=1e-14)

    module = _torch_mha(params, True, D, D, dtype)
    padding = torch.tensor(np.arange(S)[None, :] >= lens[:, None])
    tensors = _tensors(dtype, q, k, v, requires_grad=False)
    with_weights, torch_weights = module(*tensors, key_padding_mask=padding, need_weights=True)
    # need_weights=True: torch's own softmax of all -inf scores is NaN, output and weights.
    assert np.isnan(as_numpy(with_weights)[1]).all() and np.isnan(as_numpy(torch_weights)[1]).all()
    assert_close(output[0], with_weights[0], dtype, what="batch 0, need_weights=True")

    # need_weights=False: scaled_dot_product_attention gives the empty rows zero, hence b_o: ours.
    tensors = _tensors(dtype, q, k, v)
    without_weights, _ = module(*tensors, key_padding_mask=padding, need_weights=False)
    without_weights.backward(torch.tensor(cotangent))
    assert_close(output, without_weights, dtype, what="need_weights=False")
    torch_grads = {name: p.grad for name, p in module.named_parameters()}
    assert_tree_close(grads[0], from_torch(torch_grads, "torch.nn.MultiheadAttention"), dtype)
    for got, want in zip(grads[1:], _grads(tensors)):
        assert_close(got, want, dtype)
        assert (as_numpy(want)[1] == 0).all()  # nothing of batch 1 reaches the output


# --------------------------------------------------------------------------- nn.GRU and nn.LayerNorm


@functools.cache
def _ours_gru():
    def run(params, inputs, state, cotangents):
        outputs, vjp = jax.vjp(bahdanau.gru, params, inputs, state)
        return outputs, vjp(cotangents)

    return jax.jit(run)


def test_gru_matches_torch_nn(backend, dtype):
    input_size, hidden, layers, steps = 3, 4, 3, 5
    torch.manual_seed(0)
    module = torch.nn.GRU(input_size, hidden, layers, batch_first=True,
                          dtype=getattr(torch, np.dtype(dtype).name))
    params = from_torch(module.state_dict(), "gru")
    assert sorted(params) == ["layer_0", "layer_1", "layer_2"]
    inputs, state = normal((B, steps, input_size), 12), normal((layers, B, hidden), 13)
    cotangents = (normal((B, steps, hidden), 14), normal((layers, B, hidden), 15))
    (outputs, final), grads = _ours_gru()(to_jax(params, dtype), *to_jax((inputs, state), dtype),
                                          to_jax(cotangents, dtype))
    assert outputs.devices() == {backend}

    tensors = _tensors(dtype, inputs, state)
    expected, expected_final = module(*tensors)
    torch.autograd.backward((expected, expected_final),
                            [torch.tensor(c.astype(dtype)) for c in cotangents])
    assert_close(outputs, expected, dtype, what="outputs")
    assert_close(final, expected_final, dtype, what="final state")
    torch_grads = from_torch({name: p.grad for name, p in module.named_parameters()}, "gru")
    assert_tree_close(grads[0], torch_grads, dtype, what="d params")
    assert_close(grads[1], tensors[0].grad, dtype, what="d inputs")
    assert_close(grads[2], tensors[1].grad, dtype, what="d initial state")


@functools.cache
def _ours_layer_norm():
    def run(params, X, cotangent):
        output, vjp = jax.vjp(transformer.layer_norm, params, X)
        return output, vjp(cotangent)

    return jax.jit(run)


def test_layer_norm_matches_torch_nn(backend, dtype):
    width = 6
    params = {"gamma": normal((width,), 16), "beta": normal((width,), 17)}
    X, cotangent = 3 * normal((B, T, width), 18) + 1, normal((B, T, width), 19)
    output, grads = _ours_layer_norm()(to_jax(params, dtype), jnp.asarray(X, dtype),
                                       jnp.asarray(cotangent, dtype))
    assert output.devices() == {backend}

    module = torch.nn.LayerNorm(width, dtype=getattr(torch, np.dtype(dtype).name))
    module.load_state_dict(to_torch(params, "layer_norm", dtype=dtype))
    (tensor,) = _tensors(dtype, X)
    expected = module(tensor)
    expected.backward(torch.tensor(cotangent.astype(dtype)))
    assert_close(output, expected, dtype, what="output")
    torch_grads = from_torch({name: p.grad for name, p in module.named_parameters()}, "layer_norm")
    assert_tree_close(grads[0], torch_grads, dtype, what="d params")
    assert_close(grads[1], tensor.grad, dtype, what="d X")


# --------------------------------------------------------------------------- SDPA variants
# Grouped-query heads (SDPA's enable_gqa=True), scale= and a sliding window (as SDPA's boolean
# attn_mask), outputs and gradients, float64.

GQA_N = 4

SDPA_VARIANTS = {
    "GQA, scale": {"kv_heads": 2, "scale": 0.4},
    "MQA, causal": {"kv_heads": 1, "is_causal": True},
    "GQA, window (1, 2), lens BT": {"kv_heads": 2, "local_window_size": (1, 2),
                                    "valid_lens": [[2, 0, 5], [1, 4, 3]]},
    "window 1, causal, scale": {"kv_heads": GQA_N, "local_window_size": 1, "is_causal": True,
                                "scale": 2.0},
}


@functools.cache
def _ours_variant(variant: str, implementation: str):
    case = {name: value for name, value in SDPA_VARIANTS[variant].items()
            if name in ("scale", "local_window_size", "is_causal")}

    def run(queries, keys, values, valid_lens, cotangent):
        def attend(q, k, v):
            return scoring.dot_product_attention(q, k, v, valid_lens, implementation=implementation,
                                                 **case)[0]

        output, vjp = jax.vjp(attend, queries, keys, values)
        return output, vjp(cotangent)

    return jax.jit(run)


@pytest.mark.parametrize("implementation", ["plain", "chunked"])
@pytest.mark.parametrize("variant", list(SDPA_VARIANTS), ids=list(SDPA_VARIANTS))
def test_sdpa_variants(request, backend, variant, implementation):
    dtype = _dtype(request, "float64")
    case = SDPA_VARIANTS[variant]
    kv_heads = case["kv_heads"]
    q, k, v = normal((B, GQA_N, T, H), 4), normal((B, kv_heads, S, H), 5), normal((B, kv_heads, S, H), 6)
    cotangent = normal((B, GQA_N, T, H), 7)
    valid_lens = case.get("valid_lens")
    output, grads = _ours_variant(variant, implementation)(
        *to_jax((q, k, v), dtype), None if valid_lens is None else lengths(valid_lens),
        jnp.asarray(cotangent, dtype))
    # SDPA's boolean attn_mask (True = attend), built from the definitions.
    t, s = np.arange(T)[:, None], np.arange(S)[None, :]
    keep = np.ones((B, 1, T, S), bool)
    if valid_lens is not None:
        keep &= (s < np.asarray(valid_lens).reshape(B, -1)[:, :, None])[:, None]
    if case.get("is_causal"):
        keep &= s <= t
    if "local_window_size" in case:
        window = case["local_window_size"]
        left, right = (window, window) if isinstance(window, int) else window
        keep &= (s >= t - left) & (s <= t + right)
    tensors = _tensors(dtype, q, k, v)
    expected = F.scaled_dot_product_attention(*tensors, attn_mask=torch.tensor(keep),
                                              scale=case.get("scale"), enable_gqa=kv_heads < GQA_N)
    expected.backward(torch.tensor(cotangent.astype(dtype)))
    assert_close(output, expected, dtype, what="output")
    for name, got, want in zip("qkv", grads, _grads(tensors)):
        assert got.shape == want.shape
        assert_close(got, want, dtype, what=f"d{name}")


# --------------------------------------------------------------------------- nn.TransformerEncoderLayer
# and nn.TransformerDecoderLayer: PyTorch's post-norm layers (norm_first=False, ReLU), which are
# the book's blocks with biased attention. Every weight and bias is random and copied from the
# torch module to ours; dropout 0 in training mode (PyTorch's fused inference path pads its output
# with zeros where the keys are padding, which is not the layer's mathematics).

F_LAYER = 12  # the FFN's hidden width


def _random_layer(cls, dtype, seed):
    """A torch ``cls`` layer (D, N heads, F_LAYER, dropout 0, batch first) whose every parameter is
    random, biases of the attentions included (PyTorch initialises those to zero)."""
    layer = cls(D, N, dim_feedforward=F_LAYER, dropout=0.0, batch_first=True,
                dtype=getattr(torch, np.dtype(dtype).name))
    rng = np.random.default_rng(seed)
    layer.load_state_dict({name: torch.tensor(rng.normal(size=tuple(value.shape)).astype(dtype)
                                              / np.sqrt(value.shape[-1]))
                           for name, value in layer.state_dict().items()})
    return layer.train()


def _block_params(state, decoder: bool) -> dict:
    """A torch layer's ``state`` (``state_dict()`` or its parameters' gradients) as our block's
    parameter dict: the attentions through :func:`jax_attention.interop.from_torch`, the FFN's and
    the norms' by name."""
    state = {name: as_numpy(value) for name, value in state.items()}

    def attention(prefix):
        return from_torch({name[len(prefix) + 1:]: value for name, value in state.items()
                           if name.startswith(prefix + ".")}, "torch.nn.MultiheadAttention")

    def norm(i):
        return {"gamma": state[f"norm{i}.weight"], "beta": state[f"norm{i}.bias"]}

    ffn = {"W_1": state["linear1.weight"].T, "b_1": state["linear1.bias"],
           "W_2": state["linear2.weight"].T, "b_2": state["linear2.bias"]}
    if not decoder:
        return {"attention": attention("self_attn"), "addnorm_1": norm(1), "ffn": ffn,
                "addnorm_2": norm(2)}
    return {"self_attention": attention("self_attn"), "addnorm_1": norm(1),
            "cross_attention": attention("multihead_attn"), "addnorm_2": norm(2), "ffn": ffn,
            "addnorm_3": norm(3)}


@functools.cache
def _ours_block(decoder: bool):
    def run(params, inputs, valid_lens, cotangent):
        def block(params, *inputs):
            if decoder:
                return transformer.decoder_block(params, *inputs, valid_lens, num_heads=N)[0]
            return transformer.encoder_block(params, *inputs, valid_lens, num_heads=N)[0]

        output, vjp = jax.vjp(block, params, *inputs)
        return output, vjp(cotangent)

    return jax.jit(run)


@pytest.mark.parametrize("dtype_name", ["float64", "float32"])
@pytest.mark.parametrize("decoder", [False, True], ids=["encoder", "decoder"])
def test_transformer_blocks_with_biases_match_torch_layers(request, backend, decoder, dtype_name):
    """Our encoder (decoder) block with biased attention is ``nn.TransformerEncoderLayer``
    (``nn.TransformerDecoderLayer``): outputs, the inputs' and every parameter's gradients, with
    source padding (``src_key_padding_mask`` / ``memory_key_padding_mask``) and, in the decoder,
    the causal self-attention (``tgt_mask``); the NumPy reference gives the same outputs."""
    from reference_numpy import transformer as np_transformer

    dtype = _dtype(request, dtype_name)
    layer = _random_layer(torch.nn.TransformerDecoderLayer if decoder
                          else torch.nn.TransformerEncoderLayer, dtype, seed=20 + decoder)
    params = _block_params(layer.state_dict(), decoder)
    assert {"b_q", "b_k", "b_v", "b_o"} <= set(params["self_attention" if decoder else "attention"])
    source, target = normal((B, S, D), 21), normal((B, T, D), 22)
    src_valid_len = lengths([5, 2])
    inputs = (target, source) if decoder else (source,)
    cotangent = normal((B, T if decoder else S, D), 23)
    output, grads = _ours_block(decoder)(to_jax(params, dtype), to_jax(inputs, dtype),
                                         src_valid_len, jnp.asarray(cotangent, dtype))
    assert output.devices() == {backend}

    tensors = _tensors(dtype, *inputs)
    padding = torch.tensor(np.arange(S)[None, :] >= src_valid_len[:, None])  # True = masked
    if decoder:
        causal = torch.tensor(~np.tril(np.ones((T, T), bool)))
        expected = layer(*tensors, tgt_mask=causal, memory_key_padding_mask=padding)
    else:
        expected = layer(*tensors, src_key_padding_mask=padding)
    expected.backward(torch.tensor(cotangent.astype(dtype)))
    assert_close(output, expected, dtype, what="output")
    torch_grads = _block_params({name: p.grad for name, p in layer.named_parameters()}, decoder)
    assert_tree_close(grads[0], torch_grads, dtype, what="d params")
    for name, got, want in zip(("X", "enc_outputs") if decoder else ("X",), grads[1:],
                               _grads(tensors)):
        assert_close(got, want, dtype, what=f"d {name}")

    reference = (np_transformer.decoder_block if decoder else np_transformer.encoder_block)(
        {key: value for key, value in jax.tree.map(np.float64, params).items()},
        *(np.float64(x) for x in inputs), src_valid_len, num_heads=N)[0]
    assert_close(reference.astype(dtype), expected, dtype, what="reference_numpy output")
