"""``to_torch`` / ``from_torch``: lossless round trips for every component, and clear errors.

Every component of :data:`jax_attention.interop.COMPONENTS` goes both ways bit for bit — a torch
module's ``state_dict`` through ours and back, our parameters through torch and back — and the
converted ``state_dict`` loads strictly into the module. Bad dicts raise ``ValueError``/``TypeError``
naming the keys and shapes. (The numbers computed with the converted parameters are compared in
test_torch_builtins.py and test_torch_models.py.)
"""

from __future__ import annotations

from tests.torch_support import import_torch

torch = import_torch()

import re  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from jax_attention.models import bahdanau, transformer  # noqa: E402
from jax_attention.interop import COMPONENTS, from_torch, to_torch  # noqa: E402
from jax_attention.interop import torch_models as tm  # noqa: E402

# One torch module per component, with sizes that differ from each other so that a transposed or
# swapped entry cannot pass.
MODULES = {
    "additive_attention": lambda: tm.AdditiveAttention(3, 5, 4),
    "multihead": lambda: tm.MultiHeadAttention(8, 2, bias=True, query_size=3, key_size=5, value_size=6),
    "torch.nn.MultiheadAttention": lambda: torch.nn.MultiheadAttention(8, 2, batch_first=True),
    "gru": lambda: torch.nn.GRU(3, 4, 3, batch_first=True),
    "layer_norm": lambda: torch.nn.LayerNorm(6),
    "ffn": lambda: tm.PositionWiseFFN(6, 10),
    "bahdanau": lambda: tm.BahdanauSeq2Seq(7, 9, embed_size=5, num_hiddens=6, num_layers=2),
    "transformer": lambda: tm.TransformerSeq2Seq(7, 9, num_hiddens=8, ffn_num_hiddens=12, num_heads=2,
                                                 num_layers=2),
}

# Our layout of each component (the shapes our functions take).
OUR_SHAPES = {
    "additive_attention": {"W_q": (3, 4), "W_k": (5, 4), "w_v": (4, 1)},
    "multihead": {"W_q": (3, 8), "W_k": (5, 8), "W_v": (6, 8), "W_o": (8, 8), "b_q": (8,), "b_k": (8,),
                  "b_v": (8,), "b_o": (8,)},
    "torch.nn.MultiheadAttention": {"W_q": (8, 8), "W_k": (8, 8), "W_v": (8, 8), "W_o": (8, 8),
                                    "b_q": (8,), "b_k": (8,), "b_v": (8,), "b_o": (8,)},
    "gru": {f"layer_{i}": {"W_x": (3 if i == 0 else 4, 12), "W_h": (4, 12), "b_x": (12,), "b_h": (12,)}
            for i in range(3)},
    "layer_norm": {"gamma": (6,), "beta": (6,)},
    "ffn": {"W_1": (6, 10), "b_1": (10,), "W_2": (10, 6), "b_2": (6,)},
    "bahdanau": bahdanau.param_shapes(7, 9, 5, 6, 2),
    "transformer": transformer.param_shapes(7, 9, 8, 12, 2),
}


def _shapes(tree):
    return jax.tree.map(lambda a: tuple(np.shape(a)), tree, is_leaf=lambda x: not isinstance(x, dict))


def _random_params(shapes, seed=0):
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda shape: rng.normal(size=shape).astype(np.float32), shapes,
                        is_leaf=lambda x: isinstance(x, tuple))


def _assert_same_state(got: dict, expected: dict):
    assert list(got) == list(expected)
    for key in expected:
        assert got[key].dtype == expected[key].dtype, key
        assert torch.equal(got[key], expected[key]), key
        assert got[key].is_contiguous(), key


def _assert_same_params(got, expected):
    assert _shapes(got) == _shapes(expected)
    for g, e in zip(jax.tree.leaves(got), jax.tree.leaves(expected)):
        assert isinstance(g, np.ndarray) and g.dtype == np.asarray(e).dtype
        np.testing.assert_array_equal(g, np.asarray(e))


def test_components():
    assert set(COMPONENTS) == set(MODULES)


@pytest.mark.parametrize("component", COMPONENTS)
def test_round_trips_are_lossless(component):
    torch.manual_seed(0)
    module = MODULES[component]()
    with torch.no_grad():  # no parameter left at an initial 0 or 1: every entry is told apart
        for parameter in module.parameters():
            parameter.normal_()
    state = module.state_dict()
    ours = from_torch(state, component)
    assert _shapes(ours) == OUR_SHAPES[component]
    _assert_same_state(to_torch(ours, component), state)
    _assert_same_params(from_torch(module, component), ours)  # a module is read as its state_dict

    params = _random_params(OUR_SHAPES[component])
    exported = to_torch(params, component)
    module.load_state_dict(exported)  # strict: every key and shape
    _assert_same_params(from_torch(module.state_dict(), component), params)
    # JAX arrays in, the same tensors out.
    _assert_same_state(to_torch(jax.tree.map(jnp.asarray, params), component), exported)


def test_kernels_are_transposed_and_gru_gates_kept_in_order():
    params = _random_params(OUR_SHAPES["gru"])
    state = to_torch(params, "gru")
    np.testing.assert_array_equal(state["weight_ih_l0"].numpy(), params["layer_0"]["W_x"].T)
    # Gates r, z, n in both: the first h rows of weight_hh are our first h columns of W_h.
    np.testing.assert_array_equal(state["weight_hh_l1"][:4].numpy(), params["layer_1"]["W_h"][:, :4].T)
    np.testing.assert_array_equal(state["bias_hh_l2"].numpy(), params["layer_2"]["b_h"])
    norm = to_torch({"gamma": np.arange(3.0), "beta": -np.arange(3.0)}, "layer_norm")
    assert norm["weight"].tolist() == [0, 1, 2] and norm["bias"].tolist() == [0, -1, -2]
    state = to_torch(_random_params(OUR_SHAPES["transformer"]), "transformer")
    assert state["decoder.blks.block1.attention2.W_o.weight"].shape == (8, 8)
    assert state["decoder.dense.weight"].shape == (9, 8)  # (V, D): the kernel (D, V) transposed


def test_torch_multihead_attention_packing():
    rng = np.random.default_rng(1)
    D = 8
    ours = {"W_q": rng.normal(size=(D, D)), "W_k": rng.normal(size=(D, D)), "W_v": rng.normal(size=(D, D)),
            "W_o": rng.normal(size=(D, D))}
    # Equal sizes: one (3D, D) in_proj_weight, rows q | k | v; no biases in ours -> zeros (bias=True).
    state = to_torch(ours, "torch.nn.MultiheadAttention")
    assert list(state) == ["in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"]
    np.testing.assert_array_equal(state["in_proj_weight"][D:2 * D].numpy(), ours["W_k"].T)
    assert not state["in_proj_bias"].any() and not state["out_proj.bias"].any()
    back = from_torch(state, "torch.nn.MultiheadAttention")
    assert sorted(back) == ["W_k", "W_o", "W_q", "W_v", "b_k", "b_o", "b_q", "b_v"]
    assert not any(back[name].any() for name in ("b_q", "b_k", "b_v", "b_o"))
    # bias=False: the built-in without biases, and an exact round trip of a bias-free dict.
    no_bias = torch.nn.MultiheadAttention(D, 2, bias=False, dtype=torch.float64)
    no_bias.load_state_dict(to_torch(ours, "torch.nn.MultiheadAttention", bias=False))
    _assert_same_params(from_torch(no_bias, "torch.nn.MultiheadAttention"), ours)
    with pytest.raises(ValueError, match=r"biases \['b_k', 'b_o', 'b_q', 'b_v'\].*bias=False"):
        to_torch(dict(ours, **{f"b_{n}": np.zeros(D) for n in "qkvo"}), "torch.nn.MultiheadAttention",
                 bias=False)
    # Different key and value sizes: separate q/k/v projection weights (kdim, vdim).
    separate = dict(ours, W_k=rng.normal(size=(5, D)), W_v=rng.normal(size=(6, D)),
                    b_q=rng.normal(size=D), b_k=rng.normal(size=D), b_v=rng.normal(size=D),
                    b_o=rng.normal(size=D))
    module = torch.nn.MultiheadAttention(D, 2, kdim=5, vdim=6, dtype=torch.float64)
    module.load_state_dict(to_torch(separate, "torch.nn.MultiheadAttention"))
    assert module.k_proj_weight.shape == (D, 5) and module.in_proj_weight is None
    _assert_same_params(from_torch(module, "torch.nn.MultiheadAttention"), separate)


def test_dtypes():
    params = _random_params(OUR_SHAPES["ffn"])
    assert {t.dtype for t in to_torch(params, "ffn").values()} == {torch.float32}
    for dtype in (torch.float64, np.float64, "float64", jnp.float64):
        assert {t.dtype for t in to_torch(params, "ffn", dtype=dtype).values()} == {torch.float64}
    # bfloat16 both ways, bit for bit (as ml_dtypes.bfloat16 on our side).
    half = jax.tree.map(lambda a: a.astype(ml_dtypes.bfloat16), params)
    state = to_torch(half, "ffn")
    assert {t.dtype for t in state.values()} == {torch.bfloat16}
    _assert_same_params(from_torch(state, "ffn"), half)
    # Gradients and GPU-style tensors: detached and copied, nothing shared.
    module = tm.PositionWiseFFN(6, 10)
    module(torch.ones(2, 6)).sum().backward()
    grads = from_torch({name: p.grad for name, p in module.named_parameters()}, "ffn")
    np.testing.assert_array_equal(grads["b_2"], np.ones(6, np.float32) * 2)
    converted = from_torch(module, "ffn")
    converted["W_1"][...] = 0
    assert module.dense1.weight.abs().sum() > 0
    with pytest.raises(TypeError, match="dtype"):
        to_torch(params, "ffn", dtype="int7")


def test_our_nnx_modules_are_read_as_their_params():
    from flax import nnx

    from jax_attention.models.transformer import AddNorm

    module = AddNorm(6, rngs=nnx.Rngs(0))
    module.params["beta"][...] = jnp.arange(6.0)
    state = to_torch(module, "layer_norm")
    assert state["weight"].tolist() == [1.0] * 6 and state["bias"].tolist() == list(range(6))


# --------------------------------------------------------------------------- errors


def _error(function, *args, match, error=ValueError, **kwargs):
    with pytest.raises(error) as info:
        function(*args, **kwargs)
    assert re.search(match, str(info.value)), str(info.value)


def test_missing_and_unexpected_keys_are_named():
    state = MODULES["bahdanau"]().state_dict()
    del state["decoder.rnn.bias_hh_l1"]
    state["decoder.rnn.weight_ih_l0_reverse"] = torch.zeros(18, 11)
    _error(from_torch, state, "bahdanau", match=r"state_dict for component 'bahdanau': missing "
           r"decoder\.rnn\.bias_hh_l1 \(3h,\); unexpected \['decoder\.rnn\.weight_ih_l0_reverse'\]")
    params = _random_params(OUR_SHAPES["transformer"])
    del params["encoder"]["blocks"]["block_1"]["ffn"]["b_2"]
    params["decoder"]["extra"] = np.zeros(3)
    _error(to_torch, params, "transformer",
           match=r"params for component 'transformer': missing encoder/blocks/block_1/ffn/b_2 \(D,\); "
                 r"unexpected \['decoder/extra'\]")
    # A missing middle layer: its keys, not a silently shorter GRU.
    params = _random_params(OUR_SHAPES["gru"])
    del params["layer_1"]
    _error(to_torch, params, "gru", match=r"missing layer_1/W_x \(h, 3h\), layer_1/W_h")
    _error(from_torch, {}, "layer_norm", match=r"missing weight \(D,\), bias \(D,\)")
    _error(from_torch, torch.nn.MultiheadAttention(8, 2, add_bias_kv=True), "torch.nn.MultiheadAttention",
           match=r"unexpected \['bias_k', 'bias_v'\].*add_bias_kv")
    _error(from_torch, torch.nn.GRU(3, 4, bias=False).state_dict(), "gru",
           match=r"missing bias_ih_l0 \(3h,\), bias_hh_l0 \(3h,\)")


def test_inconsistent_shapes_are_named():
    state = MODULES["additive_attention"]().state_dict()
    state["w_v.weight"] = torch.zeros(1, 7)
    _error(from_torch, state, "additive_attention",
           match=r"w_v\.weight has shape \(1, 7\), expected \(1, h\) = \(1, 4\) \(h = 4 from W_k\.weight\)")
    state = MODULES["bahdanau"]().state_dict()
    state["decoder.rnn.weight_ih_l0"] = torch.zeros(18, 12)
    _error(from_torch, state, "bahdanau",
           match=r"decoder\.rnn\.weight_ih_l0 has shape \(18, 12\), expected \(3h, h\+E\) = \(18, 11\) "
                 r"\(h = 6 from .*, E = 5 from encoder\.embedding\.weight\)$")
    state = MODULES["gru"]().state_dict()
    state["weight_hh_l2"] = torch.zeros(13, 4)
    _error(from_torch, state, "gru",
           match=r"weight_hh_l2 has shape \(13, 4\), expected \(3h, h\) = \(12, 4\)")
    params = _random_params(OUR_SHAPES["ffn"])
    params["W_2"] = np.zeros((10, 6, 1), np.float32)
    _error(to_torch, params, "ffn", match=r"W_2 has shape \(10, 6, 1\), expected \(F, D\)")
    state = torch.nn.MultiheadAttention(8, 2).state_dict()
    state["in_proj_weight"] = torch.zeros(25, 8)
    _error(from_torch, state, "torch.nn.MultiheadAttention",
           match=r"in_proj_weight has shape \(25, 8\), expected \(3D, D\) = \(24, 8\) "
                 r"\(D = 8 from out_proj\.weight\)")
    _error(to_torch, {"W_q": np.zeros((5, 8)), "W_k": np.zeros((8, 8)), "W_v": np.zeros((8, 8)),
                      "W_o": np.zeros((8, 8))}, "torch.nn.MultiheadAttention",
           match=r"shapes: W_q has shape \(5, 8\), expected \(D, D\) = \(8, 8\)$")  # queries of size D


def test_bad_arguments():
    _error(to_torch, {}, "seq2seq", match=r"component must be one of \(.*'bahdanau'.*\), got 'seq2seq'")
    _error(from_torch, {}, "Transformer", match="component must be one of")
    _error(to_torch, [np.zeros(3)], "layer_norm", error=TypeError, match="params must be a .*mapping.*list")
    _error(from_torch, "weights.pt", "layer_norm", error=TypeError,
           match="state_dict must be a mapping.*str")
    state = torch.nn.LayerNorm(4).state_dict()
    state["weight"] = torch.arange(4)
    _error(from_torch, state, "layer_norm", error=TypeError,
           match=r"state_dict\['weight'\] must be a float array, got dtype int64 with shape \(4,\)")
