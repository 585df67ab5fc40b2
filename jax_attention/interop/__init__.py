"""Parameters between our models and PyTorch's: ``to_torch`` and ``from_torch``.

Our parameters are nested dicts of arrays with dense kernels stored ``(in, out)``; PyTorch keeps
``nn.Linear`` weights ``(out, in)`` and names everything by module path. :func:`to_torch` turns our
dict into the ``state_dict`` of a PyTorch module, :func:`from_torch` does the reverse; the round
trip is bit-exact. The components (:data:`COMPONENTS`):

* ``"additive_attention"``: :class:`torch_models.AdditiveAttention` (``W_k.weight``,
  ``W_q.weight``, ``w_v.weight``);
* ``"multihead"``: :class:`torch_models.MultiHeadAttention` (``W_q.weight`` ... ``W_o.weight``
  and, with biases, ``W_q.bias`` ... ``W_o.bias``);
* ``"torch.nn.MultiheadAttention"``: the built-in (``in_proj_weight``, or ``q_proj_weight``,
  ``k_proj_weight``, ``v_proj_weight`` when keys or values have other sizes than ``D``;
  ``in_proj_bias``, ``out_proj.weight``, ``out_proj.bias``);
* ``"gru"``: ``torch.nn.GRU`` (``weight_ih_l{k}``, ``weight_hh_l{k}``, ``bias_ih_l{k}``,
  ``bias_hh_l{k}`` for each layer ``k``);
* ``"layer_norm"``: ``torch.nn.LayerNorm`` (``weight``, ``bias``: our ``gamma``, ``beta``);
* ``"ffn"``: :class:`torch_models.PositionWiseFFN` (``dense1.weight``, ``dense1.bias``,
  ``dense2.weight``, ``dense2.bias``);
* ``"bahdanau"``: :class:`torch_models.BahdanauSeq2Seq`, the book's seq2seq with attention (§11.4);
* ``"transformer"``: :class:`torch_models.TransformerSeq2Seq`, the book's Transformer (§11.7).

GRUs need no reordering: ours uses PyTorch's gate order ``r, z, n`` and its two biases, so
``W_x (I, 3h)`` is ``weight_ih_l{k}`` transposed. ``torch.nn.MultiheadAttention`` always has its
input size equal to ``D`` and its output projection ``(D, D)``; with ``bias=True`` (its default)
our dict without biases gets zero biases, and ``from_torch`` then returns those zeros (the same
function, one more key per projection); pass ``bias=False`` for ``nn.MultiheadAttention(...,
bias=False)``.

This module imports PyTorch only when a conversion needs it; without it, :func:`to_torch` raises
an ``ImportError`` that says ``pip install 'jax-attention[torch]'``.
:mod:`jax_attention.interop.torch_models` (the book's PyTorch models, mirroring ours) imports it
at the top.

Example — the book's trained PyTorch seq2seq with attention (its ``state_dict``, under the book's
key names) translated by our compiled greedy decoder, with the book's vocabularies (our
``load_data_nmt`` builds them token for token); and our parameters exported back to PyTorch::

    import torch
    from jax_attention.models import bahdanau
    from jax_attention.data.nmt import load_data_nmt
    from jax_attention.interop import from_torch, to_torch
    from jax_attention.interop.torch_models import BahdanauSeq2Seq

    data = load_data_nmt(batch_size=64, num_steps=10)          # the book's 600 pairs
    params = from_torch(torch.load("seq2seq.pt"), "bahdanau")  # net.state_dict() after train_seq2seq
    result = bahdanau.translate(params, "he's calm .", data.src_vocab, data.tgt_vocab, num_steps=10)
    print(result.translation, result.weights.shape)

    net = BahdanauSeq2Seq(len(data.src_vocab), len(data.tgt_vocab), embed_size=32, num_hiddens=32,
                          num_layers=2)
    net.load_state_dict(to_torch(params, "bahdanau"))          # strict: every key and shape

The book's 0.17 ``Seq2SeqEncoder`` runs its GRU time-major; its parameters are the same. A
checkpoint of ``jax-attention train transformer`` exports the same way:
``to_torch(load_checkpoint(DIR).params, "transformer")`` loads into
:class:`torch_models.TransformerSeq2Seq` (``jax_attention.train.load_checkpoint``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import numpy as np

from jax_attention.params import flatten_params, unflatten_params

__all__ = ["COMPONENTS", "to_torch", "from_torch"]

#: The ``component`` names :func:`to_torch` and :func:`from_torch` convert: each names a PyTorch
#: module whose ``state_dict`` keys and weight layouts the conversion follows (the list in the
#: module docstring says which); any other name raises ``ValueError``.
COMPONENTS = (
    "additive_attention",
    "multihead",
    "torch.nn.MultiheadAttention",
    "gru",
    "layer_norm",
    "ffn",
    "bahdanau",
    "transformer",
)

_INSTALL_HINT = "pip install 'jax-attention[torch]'"


def _import_torch():
    try:
        import torch
    except ImportError as error:
        raise ImportError(
            f"jax_attention.interop needs PyTorch for this conversion; install it with "
            f"{_INSTALL_HINT} (the pinned CPU build), or pip install torch ({error})"
        ) from error
    return torch


# --------------------------------------------------------------------------- specifications
#
# A component is a list of entries (torch key, our path, transpose, our dims). Dims are written in
# OUR layout with symbolic sizes ("q", "3h", "h+E", "1"); the torch side's dims are the reverse
# for transposed (dense) entries. The symbols are bound from the arrays themselves, so every
# shape is checked against every other, whatever the model's sizes.


def _dense(torch_prefix: str, our_prefix: str, kernel: str, dims, bias: str | None = None,
           bias_dims=None) -> list:
    entries = [(f"{torch_prefix}weight", f"{our_prefix}{kernel}", True, dims)]
    if bias is not None:
        entries.append((f"{torch_prefix}bias", f"{our_prefix}{bias}", False, bias_dims))
    return entries


def _additive_spec(torch_prefix: str = "", our_prefix: str = "", *, sizes=("q", "k", "h")) -> list:
    q, k, h = sizes
    # The book's order of definition (W_k first), which is the state_dict's order.
    return (_dense(f"{torch_prefix}W_k.", our_prefix, "W_k", (k, h))
            + _dense(f"{torch_prefix}W_q.", our_prefix, "W_q", (q, h))
            + _dense(f"{torch_prefix}w_v.", our_prefix, "w_v", (h, "1")))


def _multihead_spec(bias: bool, torch_prefix: str = "", our_prefix: str = "", *,
                    sizes=("q", "k", "v", "D", "E"), kv_width: str | None = None) -> list:
    """``kv_width``: the width of ``W_k``, ``W_v`` when it may differ from ``D`` (grouped-query
    attention's ``N_kv H``); ``None``: ``D``."""
    q, k, v, D, E = sizes
    K = kv_width or D
    entries = []
    for name, dims in (("q", (q, D)), ("k", (k, K)), ("v", (v, K)), ("o", (D, E))):
        entries += _dense(f"{torch_prefix}W_{name}.", our_prefix, f"W_{name}", dims,
                          f"b_{name}" if bias else None, (dims[1],))
    return entries


def _gru_spec(num_layers: int, input_dim: str, torch_prefix: str = "", our_prefix: str = "") -> list:
    entries = []
    for layer in range(num_layers):
        ours = f"{our_prefix}layer_{layer}/"
        entries += [
            (f"{torch_prefix}weight_ih_l{layer}", f"{ours}W_x", True,
             (input_dim if layer == 0 else "h", "3h")),
            (f"{torch_prefix}weight_hh_l{layer}", f"{ours}W_h", True, ("h", "3h")),
            (f"{torch_prefix}bias_ih_l{layer}", f"{ours}b_x", False, ("3h",)),
            (f"{torch_prefix}bias_hh_l{layer}", f"{ours}b_h", False, ("3h",)),
        ]
    return entries


def _layer_norm_spec(torch_prefix: str = "", our_prefix: str = "", dim: str = "D") -> list:
    return [(f"{torch_prefix}weight", f"{our_prefix}gamma", False, (dim,)),
            (f"{torch_prefix}bias", f"{our_prefix}beta", False, (dim,))]


def _ffn_spec(torch_prefix: str = "", our_prefix: str = "") -> list:
    return (_dense(f"{torch_prefix}dense1.", our_prefix, "W_1", ("D", "F"), "b_1", ("F",))
            + _dense(f"{torch_prefix}dense2.", our_prefix, "W_2", ("F", "D"), "b_2", ("D",)))


def _bahdanau_spec(encoder_layers: int, decoder_layers: int) -> list:
    return ([("encoder.embedding.weight", "encoder/embedding", False, ("V_src", "E"))]
            + _gru_spec(encoder_layers, "E", "encoder.rnn.", "encoder/gru/")
            # The query is the decoder's state (h), the keys the encoder's outputs (h).
            + _additive_spec("decoder.attention.", "decoder/attention/", sizes=("h", "h", "h"))
            + [("decoder.embedding.weight", "decoder/embedding", False, ("V_tgt", "E"))]
            # The decoder's GRU reads concat(context (h), embedding (E)).
            + _gru_spec(decoder_layers, "h+E", "decoder.rnn.", "decoder/gru/")
            + _dense("decoder.dense.", "decoder/dense/", "W", ("h", "V_tgt"), "b", ("V_tgt",)))


_SQUARE = ("D", "D", "D", "D", "D")
# The Transformer's W_k, W_v: (D, K) with K = N_kv H, grouped-query attention (K = D in the book).
_KV = "K"


def _transformer_spec(encoder_layers: int, decoder_layers: int) -> list:
    entries = [("encoder.embedding.weight", "encoder/embedding", False, ("V_src", "D"))]
    for i in range(encoder_layers):
        t, o = f"encoder.blks.block{i}.", f"encoder/blocks/block_{i}/"
        entries += (_multihead_spec(False, f"{t}attention.", f"{o}attention/", sizes=_SQUARE,
                                    kv_width=_KV)
                    + _layer_norm_spec(f"{t}addnorm1.ln.", f"{o}addnorm_1/")
                    + _ffn_spec(f"{t}ffn.", f"{o}ffn/")
                    + _layer_norm_spec(f"{t}addnorm2.ln.", f"{o}addnorm_2/"))
    entries.append(("decoder.embedding.weight", "decoder/embedding", False, ("V_tgt", "D")))
    for i in range(decoder_layers):
        t, o = f"decoder.blks.block{i}.", f"decoder/blocks/block_{i}/"
        entries += (_multihead_spec(False, f"{t}attention1.", f"{o}self_attention/", sizes=_SQUARE,
                                    kv_width=_KV)
                    + _layer_norm_spec(f"{t}addnorm1.ln.", f"{o}addnorm_1/")
                    + _multihead_spec(False, f"{t}attention2.", f"{o}cross_attention/",
                                      sizes=_SQUARE, kv_width=_KV)
                    + _layer_norm_spec(f"{t}addnorm2.ln.", f"{o}addnorm_2/")
                    + _ffn_spec(f"{t}ffn.", f"{o}ffn/")
                    + _layer_norm_spec(f"{t}addnorm3.ln.", f"{o}addnorm_3/"))
    return entries + _dense("decoder.dense.", "decoder/dense/", "W", ("D", "V_tgt"), "b", ("V_tgt",))


# torch.nn.MultiheadAttention packs q, k, v into one (3D, D) matrix when keys and values have
# size D; its entries are written here unpacked, under these names, and packed afterwards.
_TORCH_MHA_PARTS = ("q_proj_weight", "k_proj_weight", "v_proj_weight")
_TORCH_MHA_BIAS_PARTS = ("in_proj_bias[q]", "in_proj_bias[k]", "in_proj_bias[v]")


def _torch_mha_spec(bias: bool) -> list:
    entries = [(part, f"W_{name}", True, dims) for part, name, dims in
               zip(_TORCH_MHA_PARTS, "qkv", (("D", "D"), ("k", "D"), ("v", "D")))]
    entries.append(("out_proj.weight", "W_o", True, ("D", "D")))
    if bias:
        entries += [(part, f"b_{name}", False, ("D",)) for part, name in zip(_TORCH_MHA_BIAS_PARTS, "qkv")]
        entries.append(("out_proj.bias", "b_o", False, ("D",)))
    return entries


# --------------------------------------------------------------------------- structure of a given dict


def _count(keys, pattern: str) -> int:
    """``1 + the largest index`` matched by ``pattern`` (one group) among ``keys``; 0 if none."""
    indices = [int(m.group(1)) for m in map(re.compile(pattern).match, keys) if m]
    return max(indices) + 1 if indices else 0


def _our_spec(component: str, flat: dict) -> list:
    """The entries for our (flattened) dict: layer counts and biases read off its paths."""
    def layers(pattern: str) -> int:
        return max(_count(flat, pattern), 1)

    builders = {
        "additive_attention": _additive_spec,
        "multihead": lambda: _multihead_spec(any(p in flat for p in ("b_q", "b_k", "b_v", "b_o"))),
        "gru": lambda: _gru_spec(layers(r"layer_(\d+)/"), "I"),
        "layer_norm": _layer_norm_spec,
        "ffn": _ffn_spec,
        "bahdanau": lambda: _bahdanau_spec(layers(r"encoder/gru/layer_(\d+)/"),
                                           layers(r"decoder/gru/layer_(\d+)/")),
        "transformer": lambda: _transformer_spec(layers(r"encoder/blocks/block_(\d+)/"),
                                                 layers(r"decoder/blocks/block_(\d+)/")),
    }
    return builders[component]()


def _torch_spec(component: str, state: dict) -> list:
    """The entries for a ``state_dict``: layer counts and biases read off its keys."""
    def layers(pattern: str) -> int:
        return max(_count(state, pattern), 1)

    builders = {
        "additive_attention": _additive_spec,
        "multihead": lambda: _multihead_spec(any(re.fullmatch(r"W_[qkvo]\.bias", k) for k in state)),
        "gru": lambda: _gru_spec(layers(r"[a-z]+_[a-z]+_l(\d+)$"), "I"),
        "layer_norm": _layer_norm_spec,
        "ffn": _ffn_spec,
        "bahdanau": lambda: _bahdanau_spec(layers(r"encoder\.rnn\.[a-z]+_[a-z]+_l(\d+)$"),
                                           layers(r"decoder\.rnn\.[a-z]+_[a-z]+_l(\d+)$")),
        "transformer": lambda: _transformer_spec(layers(r"encoder\.blks\.block(\d+)\."),
                                                 layers(r"decoder\.blks\.block(\d+)\.")),
    }
    return builders[component]()


# --------------------------------------------------------------------------- checks


def _check_component(component) -> str:
    if component not in COMPONENTS:
        raise ValueError(f"component must be one of {COMPONENTS}, got {component!r}")
    return component


def _describe(dims) -> str:
    return "(" + ", ".join(dims) + ("," if len(dims) == 1 else "") + ")"


def _check_keys(what: str, component: str, expected: dict, got) -> None:
    """``expected`` maps each expected key to its symbolic shape; ValueError naming the difference."""
    missing = [key for key in expected if key not in got]
    unexpected = sorted(key for key in got if key not in expected)
    if not missing and not unexpected:
        return
    parts = []
    if missing:
        parts.append("missing " + ", ".join(f"{key} {_describe(expected[key])}" for key in missing))
    if unexpected:
        parts.append(f"unexpected {unexpected}")
    raise ValueError(f"{what} for component {component!r}: " + "; ".join(parts))


def _parse_dim(dim: str) -> list[tuple[int, str | None]]:
    """``"3h"`` -> ``[(3, "h")]``, ``"h+E"`` -> ``[(1, "h"), (1, "E")]``, ``"1"`` -> ``[(1, None)]``."""
    terms = []
    for term in dim.split("+"):
        factor, name = re.fullmatch(r"(\d*)([A-Za-z_]\w*)?", term).groups()
        terms.append((int(factor) if factor else 1, name))
    return terms


def _evaluate(dim: str, sizes: dict) -> int | None:
    """The value of ``dim`` under the bound ``sizes``, or ``None`` while a name is unbound."""
    total = 0
    for factor, name in _parse_dim(dim):
        if name is not None and name not in sizes:
            return None
        total += factor * (1 if name is None else sizes[name])
    return total


def _check_shapes(what: str, component: str, arrays: dict, dims: dict) -> None:
    """Binds the symbolic sizes from the arrays; ValueError naming every entry that contradicts them.

    ``arrays`` and ``dims`` share their keys. Each size is bound by a majority of the entries that
    name it alone (``"h"``, ``"3h"``), so that a single wrong entry is the one reported, not every
    entry after it; sizes that occur only in sums (``"h+E"``) are then solved from those.
    """
    problems, shapes = [], {}
    for key, symbolic in dims.items():
        shape = tuple(np.shape(arrays[key]))
        if len(shape) != len(symbolic):
            problems.append(f"{key} has shape {shape}, expected {_describe(symbolic)}")
        else:
            shapes[key] = shape
    votes: dict[str, dict[int, list[str]]] = {}
    for key, shape in shapes.items():
        for dim, size in zip(dims[key], shape):
            terms = _parse_dim(dim)
            if len(terms) == 1 and terms[0][1] is not None:
                factor, name = terms[0]
                if size % factor == 0 and size >= factor:
                    votes.setdefault(name, {}).setdefault(size // factor, []).append(key)
    sizes, source = {}, {}
    for name, candidates in votes.items():
        value, keys = max(candidates.items(), key=lambda item: len(item[1]))  # ties: the first
        sizes[name], source[name] = value, keys[0]
    for key, shape in shapes.items():
        for dim, size in zip(dims[key], shape):
            terms = _parse_dim(dim)
            unknown = [(f, name) for f, name in terms if name is not None and name not in sizes]
            if len(unknown) == 1:
                factor, name = unknown[0]
                rest = size - sum(f * (1 if n is None else sizes[n]) for f, n in terms
                                  if n is None or n in sizes)
                if rest >= factor and rest % factor == 0:
                    sizes[name], source[name] = rest // factor, key
    for key, shape in shapes.items():
        expected = [_evaluate(dim, sizes) for dim in dims[key]]
        if all(e is None or e == n for e, n in zip(expected, shape)):
            continue
        names = dict.fromkeys(name for dim in dims[key] for _, name in _parse_dim(dim)
                              if name is not None and name in sizes and source[name] != key)
        concrete = _describe(tuple("?" if e is None else str(e) for e in expected))
        bound = ", ".join(f"{name} = {sizes[name]} from {source[name]}" for name in names)
        problems.append(f"{key} has shape {shape}, expected {_describe(dims[key])} = {concrete}"
                        + (f" ({bound})" if bound else ""))
    if problems:
        raise ValueError(f"{what} for component {component!r} has inconsistent shapes: "
                         + "; ".join(problems))


def _check_float(what: str, key: str, array) -> None:
    if not np.issubdtype(array.dtype, np.floating) and array.dtype.name != "bfloat16":
        raise TypeError(f"{what}[{key!r}] must be a float array, got dtype {array.dtype} with shape "
                        f"{array.shape}")


# --------------------------------------------------------------------------- array conversion


def _to_numpy(value) -> np.ndarray:
    """A NumPy copy of a tensor (any device, with or without grad), a JAX or a NumPy array."""
    if hasattr(value, "detach"):
        torch = _import_torch()
        value = value.detach().cpu()
        if value.dtype == torch.bfloat16:
            import ml_dtypes  # JAX's own bfloat16 for NumPy

            return value.contiguous().view(torch.int16).numpy().view(ml_dtypes.bfloat16).copy()
        return value.numpy().copy()
    return np.array(value)


def _to_tensor(torch, array: np.ndarray, dtype):
    array = np.ascontiguousarray(array)
    if array.dtype.name == "bfloat16":
        tensor = torch.from_numpy(array.view(np.int16).copy()).view(torch.bfloat16)
    else:
        # A copy: torch.from_numpy shares memory and warns on read-only buffers (JAX arrays).
        tensor = torch.from_numpy(array.copy())
    return tensor if dtype is None else tensor.to(dtype)


def _torch_dtype(torch, dtype):
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    try:
        name = np.dtype(dtype).name
    except TypeError:
        name = None
    if name is None or not isinstance(getattr(torch, name, None), torch.dtype):
        raise TypeError(f"dtype must be a torch or NumPy dtype, got {dtype!r}")
    return getattr(torch, name)


def _as_params(params) -> dict:
    if hasattr(params, "params_dict"):  # our NNX modules
        params = params.params_dict()
    if not isinstance(params, Mapping):
        raise TypeError(f"params must be a (nested) mapping of arrays, got {type(params).__name__}")
    return params


def _as_state_dict(state_dict) -> dict:
    if hasattr(state_dict, "state_dict") and callable(state_dict.state_dict):  # a torch module
        state_dict = state_dict.state_dict()
    if not isinstance(state_dict, Mapping):
        raise TypeError(f"state_dict must be a mapping of tensors, got {type(state_dict).__name__}")
    return state_dict


# --------------------------------------------------------------------------- public API


def to_torch(params, component: str, *, dtype=None, bias: bool = True) -> dict:
    """Our parameters as the ``state_dict`` of the PyTorch module named by ``component``.

    Dense kernels ``(in, out)`` become ``nn.Linear`` weights ``(out, in)``; GRU layers become
    ``weight_ih_l{k}``, ...; LayerNorm ``gamma``/``beta`` become ``weight``/``bias``. Every
    tensor is a new contiguous CPU tensor (nothing shares memory with ``params``); load it with
    ``module.load_state_dict(state_dict)`` (strict).

    Args:
      params: our nested dict of arrays (NumPy or JAX), or one of our NNX modules (its
        ``params_dict()``), laid out as the component's functional core takes it.
      component: one of :data:`COMPONENTS`.
      dtype: a torch or NumPy dtype for every tensor; ``None`` keeps each array's dtype
        (bfloat16 included).
      bias: ``"torch.nn.MultiheadAttention"`` only: ``True`` for the built-in's default
        ``bias=True`` (zeros where ``params`` has no biases), ``False`` for
        ``nn.MultiheadAttention(..., bias=False)`` (``params`` must then have no biases).

    Returns:
      ``dict[str, torch.Tensor]`` in the order the entries are listed by the module.

    Raises:
      ValueError: unknown component, missing or unexpected entries (named with their expected
        shapes), or shapes that do not fit together (named with the sizes they contradict).
      TypeError: non-float arrays.
      ImportError: PyTorch is not installed.
    """
    component = _check_component(component)
    flat = {path: _to_numpy(value) for path, value in flatten_params(_as_params(params)).items()}
    for path, array in flat.items():
        _check_float("params", path, array)
    what = "params"
    if component == "torch.nn.MultiheadAttention":
        has_bias = any(name in flat for name in ("b_q", "b_k", "b_v", "b_o"))
        if has_bias and not bias:
            raise ValueError("params hold biases " + str(sorted(n for n in flat if n.startswith("b_")))
                             + ", which nn.MultiheadAttention(bias=False) cannot hold; pass bias=True")
        spec = _torch_mha_spec(has_bias)
    else:
        spec = _our_spec(component, flat)
    _check_keys(what, component, {ours: dims for _, ours, _, dims in spec}, flat)
    _check_shapes(what, component, flat, {ours: dims for _, ours, _, dims in spec})
    torch = _import_torch()
    dtype = _torch_dtype(torch, dtype)
    arrays = {key: (flat[ours].T if transpose else flat[ours]) for key, ours, transpose, _ in spec}
    if component == "torch.nn.MultiheadAttention":
        arrays = _pack_torch_mha(arrays, bias)
    return {key: _to_tensor(torch, array, dtype) for key, array in arrays.items()}


def _pack_torch_mha(arrays: dict, bias: bool) -> dict:
    """Our unpacked ``q/k/v`` entries in ``nn.MultiheadAttention``'s layout."""
    q, k, v = (arrays[name] for name in _TORCH_MHA_PARTS)
    packed = {}
    if q.shape == k.shape == v.shape:  # kdim == vdim == embed_dim: one in_proj_weight (3D, D)
        packed["in_proj_weight"] = np.concatenate([q, k, v], axis=0)
    else:
        packed.update(q_proj_weight=q, k_proj_weight=k, v_proj_weight=v)
    if bias:
        D, dtype = q.shape[0], q.dtype
        parts = [arrays.get(name, np.zeros((D,), dtype)) for name in _TORCH_MHA_BIAS_PARTS]
        packed["in_proj_bias"] = np.concatenate(parts)
    packed["out_proj.weight"] = arrays["out_proj.weight"]
    if bias:
        packed["out_proj.bias"] = arrays.get("out_proj.bias", np.zeros((q.shape[0],), q.dtype))
    return packed


def _unpack_torch_mha(state: dict) -> dict:
    """``nn.MultiheadAttention``'s entries split into our unpacked ``q/k/v`` names (checked)."""
    packed = "in_proj_weight" in state
    biased = "in_proj_bias" in state or "out_proj.bias" in state
    expected = {"out_proj.weight": ("D", "D")}
    expected.update({"in_proj_weight": ("3D", "D")} if packed else
                    {"q_proj_weight": ("D", "D"), "k_proj_weight": ("D", "k"), "v_proj_weight": ("D", "v")})
    if biased:
        expected.update({"in_proj_bias": ("3D",), "out_proj.bias": ("D",)})
    try:
        _check_keys("state_dict", "torch.nn.MultiheadAttention", expected, state)
    except ValueError as error:
        if any(key in state for key in ("bias_k", "bias_v")):
            raise ValueError(f"{error} (add_bias_kv=True has no counterpart in our multi-head "
                             f"attention)") from None
        raise
    _check_shapes("state_dict", "torch.nn.MultiheadAttention", state, expected)
    unpacked = dict(state)
    if packed:
        for name, part in zip(_TORCH_MHA_PARTS, np.split(unpacked.pop("in_proj_weight"), 3)):
            unpacked[name] = part
    if biased:
        for name, part in zip(_TORCH_MHA_BIAS_PARTS, np.split(unpacked.pop("in_proj_bias"), 3)):
            unpacked[name] = part
    return unpacked


def from_torch(state_dict, component: str) -> dict:
    """A PyTorch ``state_dict`` as our nested parameter dict (the inverse of :func:`to_torch`).

    Args:
      state_dict: ``module.state_dict()`` (or the module itself) of the module named by
        ``component``: tensors on any device, with or without gradients (a dict of their
        ``.grad`` converts the gradients the same way), or NumPy arrays under the same keys.
      component: one of :data:`COMPONENTS`.

    Returns:
      Our nested dict of NumPy arrays (copies, each tensor's dtype; bfloat16 as
      ``ml_dtypes.bfloat16``), dense kernels ``(in, out)``; e.g. ``{"W_q", "W_k", "w_v"}`` for
      ``"additive_attention"``, ``{"encoder": {...}, "decoder": {...}}`` for ``"bahdanau"``.

    Raises:
      ValueError: unknown component, missing or unexpected keys (named with their expected
        shapes), or shapes that do not fit together.
      TypeError: non-float tensors.
    """
    component = _check_component(component)
    state = {key: _to_numpy(value) for key, value in _as_state_dict(state_dict).items()}
    for key, array in state.items():
        _check_float("state_dict", key, array)
    what = "state_dict"
    if component == "torch.nn.MultiheadAttention":
        state = _unpack_torch_mha(state)
        spec = _torch_mha_spec("in_proj_bias[q]" in state)
    else:
        spec = _torch_spec(component, state)
    torch_dims = {key: (tuple(reversed(dims)) if transpose else dims) for key, _, transpose, dims in spec}
    _check_keys(what, component, torch_dims, state)
    _check_shapes(what, component, state, torch_dims)
    flat = {ours: (np.ascontiguousarray(state[key].T) if transpose else state[key])
            for key, ours, transpose, _ in spec}
    return unflatten_params(flat)
