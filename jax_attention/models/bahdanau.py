"""Seq2seq with Bahdanau (additive) attention — d2l §10.7 and §11.4, in JAX: functions, then NNX modules.

Mirror of :mod:`reference_numpy.bahdanau` (same names, argument order, einsum strings and parameter
dicts); the JAX functions add dropout (``dropout``, ``dropout_rng``) and run their time loops with
``lax.scan``. Teacher forcing, the masked cross-entropy and :func:`translate` are shared with the
Transformer (:mod:`jax_attention.models.translation`, re-exported here), and so is the NNX plumbing of
the modules (:mod:`jax_attention.models.seq2seq_module`).

The model of the book (0.17 edition, PyTorch): an embedding and a multi-layer GRU encode the
source; at each target step the decoder's query is the top GRU layer's state, additive attention
over the encoder outputs (masked by the source valid lengths) gives a context, ``concat(context,
embedding(y_t))`` feeds a multi-layer GRU whose top state a dense layer maps to the vocabulary.
Dropout (training only) acts between GRU layers — not after the last, as in ``nn.GRU`` — and on
the attention weights (``d2l.AdditiveAttention``'s dropout).

Shape letters: ``B`` batch, ``S`` source length, ``T`` target length, ``L`` GRU layers, ``E``
embedding size, ``h`` hidden size (``num_hiddens``), ``I`` a GRU layer's input size, ``V``
vocabulary size, ``g = 3h`` the stacked gates.

GRU: PyTorch's ``nn.GRU`` equations, gates in its order ``r, z, n``, separate input and hidden
biases (Flax's ``nnx.GRUCell`` differs: no hidden bias on ``r`` and ``z``)::

    r  = sigmoid(x W_xr + b_xr + h W_hr + b_hr)
    z  = sigmoid(x W_xz + b_xz + h W_hz + b_hz)
    n  = tanh(x W_xn + b_xn + r * (h W_hn + b_hn))
    h' = (1 - z) * n + z * h

Parameters: one nested dict, identical in NumPy and JAX (see :func:`param_shapes`); ``W_x`` stacks
``[W_xr | W_xz | W_xn]`` as ``(I, 3h)`` (PyTorch's ``weight_ih_l{k}`` transposed), ``W_h`` is
``(h, 3h)``; dense kernels are stored ``(in, out)``. Every function checks the keys of the dicts
it is given, nested ones included: a missing or unexpected key (``"w_V"`` for ``"w_v"``) raises
``ValueError`` naming its path (``params['decoder']['attention']``) and the expected keys.

Initialisation (:func:`init_params`) as the book's ``xavier_init_weights`` leaves the model:
Xavier-uniform for every dense kernel (attention ``W_q``, ``W_k``, ``w_v``, the output ``dense``)
and every GRU weight matrix (on the stacked ``(I, 3h)`` matrix, the same bound as PyTorch's on
``(3h, I)``); the rest keeps PyTorch's defaults — embeddings ``N(0, 1)``, GRU biases and the dense
bias ``U(-1/sqrt(h), 1/sqrt(h))``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax import lax

from jax_attention.models import translation
from jax_attention._checks import (
    check_dropout,
    check_id,
    check_lengths,
    check_max_len,
    check_numbered,
    check_param_keys,
    check_size,
    check_tokens,
)
from jax_attention.models.decoding import greedy_search
from jax_attention.params import flatten_params, unflatten_params
from jax_attention.nn.scoring import (ADDITIVE_KEYS, additive_attention_weights_of_projected,
                                   additive_key_projection, weighted_sum)
from jax_attention.models.seq2seq_module import ParamTree, Seq2SeqModule
from jax_attention.nn.dropout import dropout as _dropout
from jax_attention.nn.dropout import fold, keep_mask
from jax_attention.nn.precision import product
from jax_attention.models.translation import (
    Decoded,
    Translation,
    masked_cross_entropy,
    teacher_forcing_inputs,
)

__all__ = [
    "param_shapes",
    "init_params",
    "gru_cell",
    "gru",
    "encoder",
    "decoder_step",
    "decoder",
    "seq2seq",
    "teacher_forcing_inputs",
    "masked_cross_entropy",
    "teacher_forcing_loss",
    "greedy_decode",
    "Translation",
    "translate",
    "GRULayer",
    "GRU",
    "Seq2SeqEncoder",
    "Seq2SeqAttentionDecoder",
    "BahdanauSeq2Seq",
]

# The same strings as in reference_numpy/bahdanau.py.
GRU_INPUTS = "...i,ig->...g"
GRU_STATE = "bh,hg->bg"
DENSE = "...h,hv->...v"

# The keys of the parameter dicts (the structure of param_shapes), for check_param_keys: a key
# maps to the keys of the dict under it; the GRU's "layer_l" are checked one by one.
GRU_LAYER_KEYS = ("W_x", "W_h", "b_x", "b_h")
ENCODER_KEYS = {"embedding": None, "gru": None}
DECODER_KEYS = {"embedding": None, "attention": ADDITIVE_KEYS, "gru": None, "dense": ("W", "b")}
MODEL_KEYS = ("encoder", "decoder")


# --------------------------------------------------------------------------- parameters


def _gru_shapes(input_size: int, num_hiddens: int, num_layers: int) -> dict:
    g = 3 * num_hiddens
    return {
        f"layer_{layer}": {"W_x": (input_size if layer == 0 else num_hiddens, g),
                           "W_h": (num_hiddens, g), "b_x": (g,), "b_h": (g,)}
        for layer in range(num_layers)
    }


def param_shapes(src_vocab_size: int, tgt_vocab_size: int, embed_size: int, num_hiddens: int,
                 num_layers: int) -> dict:
    """The nested dict of parameter shapes (the structure every params dict must have).

    Returns:
      ``{"encoder": {"embedding", "gru": {"layer_l": {"W_x", "W_h", "b_x", "b_h"}}},
      "decoder": {"embedding", "attention": {"W_q", "W_k", "w_v"}, "gru": {...},
      "dense": {"W", "b"}}}`` with shape tuples as leaves.
    """
    V_src, V_tgt, E, h, L = (check_size(name, value) for name, value in (
        ("src_vocab_size", src_vocab_size), ("tgt_vocab_size", tgt_vocab_size),
        ("embed_size", embed_size), ("num_hiddens", num_hiddens), ("num_layers", num_layers)))
    return {
        "encoder": {"embedding": (V_src, E), "gru": _gru_shapes(E, h, L)},
        "decoder": {
            "embedding": (V_tgt, E),
            "attention": {"W_q": (h, h), "W_k": (h, h), "w_v": (h, 1)},
            "gru": _gru_shapes(h + E, h, L),  # input: concat(context (h), embedding (E))
            "dense": {"W": (h, V_tgt), "b": (V_tgt,)},
        },
    }


@functools.partial(jax.jit, static_argnames=("spec", "dtype", "bias_bound"))
def _init_leaves(rng, spec: tuple, dtype, bias_bound: float) -> tuple:
    """Initial values of the leaves ``spec = ((name, shape), ...)``, chosen by name.

    One uniform draw on ``(-1, 1)`` serves every leaf, each taking its own slice: drawing ~25
    arrays separately would compile the random-number generator ~25 times (seconds on CPU).

    * ``embedding``: ``N(0, 1)`` (``nn.Embedding``), as ``jax.random.normal``: ``sqrt(2) erfinv(u)``;
    * ``b_x``, ``b_h``, ``b``: ``U(-1/sqrt(h), 1/sqrt(h))`` (``nn.GRU``'s and ``nn.Linear(h, V)``'s
      default biases);
    * kernels ``(in, out)``: Xavier-uniform, ``U(-a, a)`` with ``a = sqrt(6 / (in + out))`` (the
      book's ``xavier_init_weights``).
    """
    sizes = [math.prod(shape) for _, shape in spec]
    # (-1, 1) open at -1, as jax.random.normal, so that erfinv stays finite.
    uniform = jax.random.uniform(rng, (sum(sizes),), dtype, jnp.nextafter(
        jnp.asarray(-1.0, dtype), jnp.asarray(1.0, dtype)), 1.0)
    values, start = [], 0
    for (name, shape), size in zip(spec, sizes):
        u = uniform[start:start + size].reshape(shape)
        start += size
        if name == "embedding":
            values.append(jnp.sqrt(jnp.asarray(2.0, dtype)) * lax.erf_inv(u))
        elif name in ("b_x", "b_h", "b"):
            values.append(u * bias_bound)
        else:
            fan_in, fan_out = shape
            values.append(u * math.sqrt(6.0 / (fan_in + fan_out)))
    return tuple(values)


def _init_named(rng, shapes: dict, dtype, num_hiddens: int) -> dict:
    """``{name: shape}`` (flat) -> ``{name: initial value}``."""
    spec = tuple((path.rsplit("/", 1)[-1], tuple(shape)) for path, shape in shapes.items())
    values = _init_leaves(rng, spec, jnp.dtype(dtype), 1.0 / math.sqrt(num_hiddens))
    return dict(zip(shapes, values))


def init_params(rng, src_vocab_size: int, tgt_vocab_size: int, embed_size: int = 32,
                num_hiddens: int = 32, num_layers: int = 2, *, param_dtype=jnp.float32) -> dict:
    """Fresh parameters, initialised as the book's model (see the module docstring).

    Args:
      rng: a ``jax.random`` key (one uniform draw, sliced into the parameters).
      src_vocab_size, tgt_vocab_size, embed_size, num_hiddens, num_layers: the model's sizes.
      param_dtype: the parameters' dtype.

    Returns:
      The nested dict of :func:`param_shapes`, with arrays as leaves.
    """
    shapes = param_shapes(src_vocab_size, tgt_vocab_size, embed_size, num_hiddens, num_layers)
    return unflatten_params(_init_named(rng, flatten_params(shapes), param_dtype, num_hiddens))


# --------------------------------------------------------------------------- the functional core


def _check_gru_layer(params, input_size: int, num_hiddens: int, dtype):
    check_param_keys("params", params, GRU_LAYER_KEYS)
    W_x, W_h, b_x, b_h = (jnp.asarray(params[name]) for name in GRU_LAYER_KEYS)
    g = 3 * num_hiddens
    expected = {"W_x": (input_size, g), "W_h": (num_hiddens, g), "b_x": (g,), "b_h": (g,)}
    for name, array in zip(expected, (W_x, W_h, b_x, b_h)):
        if array.shape != expected[name]:
            raise ValueError(
                f"GRU params[{name!r}] must have shape {expected[name]} (input size {input_size}, "
                f"h = {num_hiddens}, gates r, z, n stacked), got {array.shape}"
            )
    return (p.astype(dtype) for p in (W_x, W_h, b_x, b_h))


def _gru_update(gates_x, gates_h, state):
    """The GRU's gating from the input part ``x W_x + b_x`` and hidden part ``h W_h + b_h``."""
    x_r, x_z, x_n = jnp.split(gates_x, 3, axis=-1)
    h_r, h_z, h_n = jnp.split(gates_h, 3, axis=-1)
    r = jax.nn.sigmoid(x_r + h_r)
    z = jax.nn.sigmoid(x_z + h_z)
    n = jnp.tanh(x_n + r * h_n)
    return (1.0 - z) * n + z * state


def gru_cell(params, inputs, state):
    """One GRU step (PyTorch's ``nn.GRUCell`` equations; see the module docstring).

    Args:
      params: ``{"W_x": (I, 3h), "W_h": (h, 3h), "b_x": (3h,), "b_h": (3h,)}``.
      inputs: ``(B, I)``.
      state: ``(B, h)``.

    Returns:
      The new state ``(B, h)``.
    """
    inputs, state = jnp.asarray(inputs), jnp.asarray(state)
    if inputs.ndim != 2 or state.ndim != 2 or inputs.shape[0] != state.shape[0]:
        raise ValueError(f"inputs must be (B, I) and state (B, h), got inputs {inputs.shape} and "
                         f"state {state.shape}")
    W_x, W_h, b_x, b_h = _check_gru_layer(params, inputs.shape[-1], state.shape[-1], state.dtype)
    gates_x = product(GRU_INPUTS, inputs, W_x) + b_x.reshape(1, -1)
    gates_h = product(GRU_STATE, state, W_h) + b_h.reshape(1, -1)
    return _gru_update(gates_x, gates_h, state)


def _num_layers(params, name: str = "params") -> int:
    """The number of layers of a GRU's dict, whose layers' keys are checked (named from ``name``)."""
    num_layers = check_numbered("GRU params", params, "layer")
    for layer in range(num_layers):
        check_param_keys(f"{name}['layer_{layer}']", params[f"layer_{layer}"], GRU_LAYER_KEYS)
    return num_layers


def _check_model(params) -> None:
    """The whole model's dict ``{"encoder", "decoder"}``, every nested key, named by its path."""
    check_param_keys("params", params, MODEL_KEYS)
    for part, keys in (("encoder", ENCODER_KEYS), ("decoder", DECODER_KEYS)):
        check_param_keys(f"params[{part!r}]", params[part], keys)
        _num_layers(params[part]["gru"], f"params[{part!r}]['gru']")


def _gru_layer_scan(params, inputs, state):
    """One GRU layer over ``(B, T, I)``: the input projections of all steps at once, then a scan."""
    W_x, W_h, b_x, b_h = _check_gru_layer(params, inputs.shape[-1], state.shape[-1], state.dtype)
    gates_x = product(GRU_INPUTS, inputs, W_x) + b_x.reshape(1, 1, -1)  # (B, T, 3h)

    def step(h, gx):
        gates_h = product(GRU_STATE, h, W_h) + b_h.reshape(1, -1)
        h = _gru_update(gx, gates_h, h)
        return h, h

    final, outputs = lax.scan(step, state, jnp.swapaxes(gates_x, 0, 1))
    return jnp.swapaxes(outputs, 0, 1), final


def gru(params, inputs, state=None, *, dropout: float = 0.0, dropout_rng=None):
    """A multi-layer GRU over a sequence (``nn.GRU(batch_first=True)``) — d2l §10.7; ``lax.scan`` in time.

    Layer ``l + 1`` reads the outputs of layer ``l``, with dropout between layers (not after the
    last), as ``nn.GRU(dropout=...)``.

    Args:
      params: ``{"layer_0": {...}, ..., "layer_{L-1}": {...}}``, each as in :func:`gru_cell`.
      inputs: ``(B, T, I)``.
      state: ``(L, B, h)`` initial states, or ``None`` for zeros.
      dropout: the dropout rate between layers.
      dropout_rng: a key; ``None`` = no dropout (evaluation).

    Returns:
      ``(outputs (B, T, h), state (L, B, h))``.
    """
    inputs = jnp.asarray(inputs)
    if inputs.ndim != 3:
        raise ValueError(f"inputs must have shape (B, T, I), got {inputs.shape}")
    dropout = check_dropout(dropout)
    num_layers = _num_layers(params)
    num_hiddens = jnp.shape(params["layer_0"]["W_h"])[0]
    B = inputs.shape[0]
    if state is None:
        state = jnp.zeros((num_layers, B, num_hiddens), dtype=inputs.dtype)
    state = jnp.asarray(state)
    if state.shape != (num_layers, B, num_hiddens):
        raise ValueError(f"state must have shape (L, B, h) = {(num_layers, B, num_hiddens)}, "
                         f"got {state.shape}")
    layer_inputs, final = inputs, []
    for layer in range(num_layers):
        if layer > 0 and dropout_rng is not None:
            layer_inputs = _dropout(layer_inputs, dropout, fold(dropout_rng, layer))
        layer_inputs, last = _gru_layer_scan(params[f"layer_{layer}"], layer_inputs, state[layer])
        final.append(last)
    return layer_inputs, jnp.stack(final)


def encoder(params, src, *, dropout: float = 0.0, dropout_rng=None):
    """The seq2seq encoder: embedding, then a multi-layer GRU — d2l §10.7.2 ``Seq2SeqEncoder``.

    As in the book, the GRU runs over all ``S`` positions, padding included; attention later
    ignores the padded outputs through the source valid lengths.

    Args:
      params: ``{"embedding": (V_src, E), "gru": {...}}``.
      src: ``(B, S)`` source token ids in ``[0, V_src)``: checked when concrete; under ``jit``
        they cannot be, and ids outside are clipped to ``[0, V_src - 1]`` (never NaN, never a
        negative id wrapping around; see :mod:`jax_attention.nn.masking`).
      dropout, dropout_rng: as in :func:`gru`.

    Returns:
      ``(outputs (B, S, h), state (L, B, h))``.
    """
    check_param_keys("params", params, ENCODER_KEYS)
    _num_layers(params["gru"], "params['gru']")
    embedding = jnp.asarray(params["embedding"])
    src = check_tokens("src", src, embedding.shape[0], ndim=2)
    # The rows in the GRU's dtype (the table may be kept wider: mixed precision).
    rows = embedding[src].astype(jnp.asarray(params["gru"]["layer_0"]["W_x"]).dtype)
    return gru(params["gru"], rows, dropout=dropout, dropout_rng=dropout_rng)


def _decoder_keep_masks(rng, rate: float, shape_prefix: tuple, num_keys: int, num_layers: int,
                        num_hiddens: int):
    """Dropout keep-masks of decoder steps: attention ``(*prefix, S)``, layers ``(*prefix[:-1], L-1, B, h)``.

    Drawn all at once outside the time loop, so that the loop's body holds no random-number
    generator (which would dominate its compilation time).
    """
    *steps, batch = shape_prefix
    attention_keep = keep_mask(fold(rng, 0), rate, (*steps, batch, num_keys))
    layers_keep = keep_mask(fold(rng, 1), rate,
                            (*steps, max(num_layers - 1, 0), batch, num_hiddens))
    return attention_keep, layers_keep


def _apply_keep(x, keep, rate: float):
    return jnp.where(keep, x / (1.0 - rate), jnp.zeros((), x.dtype))


def _check_decoder_state(params, state, enc_outputs):
    """Checks ``state (L, B, h)`` against the decoder's GRU and ``enc_outputs (B, S, h)``."""
    check_param_keys("params", params, DECODER_KEYS)
    state, enc_outputs = jnp.asarray(state), jnp.asarray(enc_outputs)
    L = _num_layers(params["gru"], "params['gru']")
    h = jnp.shape(params["gru"]["layer_0"]["W_h"])[0]
    if state.ndim != 3 or state.shape[0] != L or state.shape[2] != h:
        raise ValueError(f"state must have shape (L, B, h) = ({L}, B, {h}) for the decoder's GRU, "
                         f"got {state.shape}")
    B = state.shape[1]
    if enc_outputs.ndim != 3 or enc_outputs.shape[0] != B or enc_outputs.shape[2] != h:
        raise ValueError(f"enc_outputs must have shape (B, S, h) = ({B}, S, {h}) for state of "
                         f"shape {state.shape}, got {enc_outputs.shape}")
    return state, enc_outputs


def _decoder_step(params, tokens, state, enc_outputs, projected_keys, src_valid_len,
                  dropout: float, keep):
    """:func:`decoder_step` with its dropout given as keep-masks (``None``: no dropout) and the
    attention's keys already projected (:func:`~jax_attention.nn.scoring.additive_key_projection`
    of ``enc_outputs``: the same at every step, so :func:`decoder` projects them once)."""
    embedding = jnp.asarray(params["embedding"])
    state, enc_outputs = _check_decoder_state(params, state, enc_outputs)
    tokens = check_tokens("tokens", tokens, embedding.shape[0], ndim=1, batch=state.shape[1])
    query = state[-1][:, None, :]  # (B, 1, h)
    weights = additive_attention_weights_of_projected(params["attention"], query, projected_keys,
                                                      src_valid_len)
    dropped = weights if keep is None else _apply_keep(weights, keep[0][:, None, :], dropout)
    context = weighted_sum(dropped, enc_outputs)  # (B, 1, h)
    layer_input = jnp.concatenate([context[:, 0], embedding[tokens].astype(state.dtype)], axis=-1)
    new_state = []
    for layer in range(_num_layers(params["gru"])):
        if layer > 0 and keep is not None:
            layer_input = _apply_keep(layer_input, keep[1][layer - 1], dropout)
        layer_input = gru_cell(params["gru"][f"layer_{layer}"], layer_input, state[layer])
        new_state.append(layer_input)
    W, b = (jnp.asarray(params["dense"][name]).astype(state.dtype) for name in ("W", "b"))
    logits = product(DENSE, layer_input, W) + b.reshape(1, -1)
    return logits, jnp.stack(new_state), weights[:, 0]


def decoder_step(params, tokens, state, enc_outputs, src_valid_len, *, dropout: float = 0.0,
                 dropout_rng=None):
    """One step of the attention decoder — d2l §11.4.2 ``Seq2SeqAttentionDecoder.forward``.

    The query is the top layer's state ``state[-1]``, shaped ``(B, 1, h)``; keys and values are the
    encoder outputs, masked past ``src_valid_len``. The GRU input is ``concat(context, embedding)``
    (the book's order), and the dense layer maps the top layer's new state to the vocabulary.
    Dropout (with a key) acts on the attention weights and between GRU layers.

    Args:
      params: the decoder's dict (``embedding``, ``attention``, ``gru``, ``dense``).
      tokens: ``(B,)`` the input tokens of this step, in ``[0, V)`` (clipped when traced).
      state: ``(L, B, h)``.
      enc_outputs: ``(B, S, h)``.
      src_valid_len: ``(B,)`` integers in ``[0, S]`` (act as clipped when traced).
      dropout, dropout_rng: the rate and a key (``None``: no dropout).

    Returns:
      ``(logits (B, V), state (L, B, h), weights (B, S))``; the weights are those before dropout.
    """
    dropout = check_dropout(dropout)
    state, enc_outputs = _check_decoder_state(params, state, enc_outputs)
    keep = None
    if dropout_rng is not None and dropout > 0:
        L, B, h = state.shape
        keep = _decoder_keep_masks(dropout_rng, dropout, (B,), enc_outputs.shape[1], L, h)
    projected_keys = additive_key_projection(params["attention"], enc_outputs, src_valid_len)
    return _decoder_step(params, tokens, state, enc_outputs, projected_keys, src_valid_len,
                         dropout, keep)


def decoder(params, dec_input, state, enc_outputs, src_valid_len, *, dropout: float = 0.0,
            dropout_rng=None):
    """The attention decoder over a whole (teacher-forced) input sequence — d2l §11.4.2; ``lax.scan``.

    Args:
      params: the decoder's dict.
      dec_input: ``(B, T)`` input tokens (``<bos>`` then the target shifted right).
      state: ``(L, B, h)`` initial state, the encoder's final state.
      enc_outputs: ``(B, S, h)``.
      src_valid_len: ``(B,)``.
      dropout, dropout_rng: as in :func:`decoder_step`; every step gets its own masks.

    Returns:
      ``(logits (B, T, V), state (L, B, h), weights (B, T, S))``.
    """
    dropout = check_dropout(dropout)
    state, enc_outputs = _check_decoder_state(params, state, enc_outputs)
    embedding_rows = jnp.shape(params["embedding"])[0]
    dec_input = check_tokens("dec_input", dec_input, embedding_rows, ndim=2,
                              batch=state.shape[1])
    B, T = dec_input.shape
    keep = None
    if dropout_rng is not None and dropout > 0:
        L, _, h = state.shape
        keep = _decoder_keep_masks(dropout_rng, dropout, (T, B), jnp.shape(enc_outputs)[1], L, h)

    # The keys' projection is the same at every step: computed once, outside the loop (and its
    # weight gradient once, on the sum of the steps' gradients).
    projected_keys = additive_key_projection(params["attention"], enc_outputs, src_valid_len)

    def step(state, xs):
        tokens, step_keep = xs
        logits, state, weights = _decoder_step(params, tokens, state, enc_outputs, projected_keys,
                                               src_valid_len, dropout, step_keep)
        return state, (logits, weights)

    state, (logits, weights) = lax.scan(step, state, (jnp.swapaxes(dec_input, 0, 1), keep))
    return jnp.swapaxes(logits, 0, 1), state, jnp.swapaxes(weights, 0, 1)


def seq2seq(params, src, src_valid_len, dec_input, *, dropout: float = 0.0, dropout_rng=None):
    """Encoder then decoder, the decoder starting from the encoder's final state (``d2l.EncoderDecoder``).

    Args:
      params: ``{"encoder": {...}, "decoder": {...}}``.
      src: ``(B, S)``. src_valid_len: ``(B,)``. dec_input: ``(B, T)``.
      dropout, dropout_rng: the rate and a key (``None``: no dropout).

    Returns:
      ``(logits (B, T, V), weights (B, T, S))``.
    """
    encoder_rng = decoder_rng = None
    if dropout_rng is not None:
        encoder_rng, decoder_rng = fold(dropout_rng, 0), fold(dropout_rng, 1)
    # The decoder's inputs are checked before the encoder runs, so that an error costs nothing.
    _check_model(params)
    dec_input = check_tokens("dec_input", dec_input, jnp.shape(params["decoder"]["embedding"])[0],
                              ndim=2)
    if jnp.ndim(src) == 2 and jnp.shape(src)[0] != dec_input.shape[0]:
        raise ValueError(f"src (B, S) and dec_input (B, T) must have the same batch B, got src "
                         f"{jnp.shape(src)} and dec_input {dec_input.shape}")
    enc_outputs, state = encoder(params["encoder"], src, dropout=dropout, dropout_rng=encoder_rng)
    logits, _, weights = decoder(params["decoder"], dec_input, state, enc_outputs, src_valid_len,
                                 dropout=dropout, dropout_rng=decoder_rng)
    return logits, weights


def teacher_forcing_loss(params, src, src_valid_len, tgt, tgt_valid_len, bos_id: int, *,
                         dropout: float = 0.0, dropout_rng=None, num_steps: int | None = None):
    """Per-sequence training loss with teacher forcing (``(B,)``): the book's ``l`` before ``l.sum()``.

    ``tgt (B, T)`` ids in ``[0, V_tgt)`` and ``tgt_valid_len (B,)`` in ``[0, T]`` follow the
    package's rule for values (checked when concrete, clipped when traced). ``num_steps``: the
    loss's divisor, the full length of targets cut short of their padding (the decoder's dropout
    masks, drawn time first, are the full-length batch's already).
    """
    _check_model(params)
    tgt = check_tokens("tgt", tgt, jnp.shape(params["decoder"]["embedding"])[0], ndim=2)
    tgt_valid_len = check_lengths("tgt_valid_len", tgt_valid_len, tgt.shape[0], tgt.shape[1], "T")
    logits, _ = seq2seq(params, src, src_valid_len, teacher_forcing_inputs(tgt, bos_id),
                        dropout=dropout, dropout_rng=dropout_rng)
    return masked_cross_entropy(logits, tgt, tgt_valid_len, num_steps=num_steps)


@functools.partial(jax.jit, static_argnames=("bos_id", "eos_id", "pad_id", "max_len"))
def _greedy_decode(params, src, src_valid_len, *, bos_id: int, eos_id: int, pad_id: int,
                   max_len: int):
    enc_outputs, state = encoder(params["encoder"], src)

    projected_keys = additive_key_projection(params["decoder"]["attention"], enc_outputs,
                                             src_valid_len)

    def step(state, tokens):
        return _decoder_step(params["decoder"], tokens, state, enc_outputs, projected_keys,
                             src_valid_len, 0.0, None)

    return greedy_search(step, state, enc_outputs.shape[0], bos_id=bos_id, eos_id=eos_id,
                         pad_id=pad_id, max_len=max_len)


def greedy_decode(params, src, src_valid_len, *, bos_id: int, eos_id: int, pad_id: int,
                  max_len: int):
    """Batched greedy decoding, compiled once per shape — the book's ``predict_seq2seq`` (d2l §10.7.6).

    Every row starts from ``<bos>`` and feeds back its own argmax for a fixed ``max_len`` steps
    (:func:`jax_attention.models.decoding.greedy_search`); a row stops at its own ``<eos>``: that step
    writes ``<eos>``, the later ones ``<pad>`` with zero attention weights.

    The inputs are checked here, eagerly, before the compiled loop: ``src`` ids in
    ``[0, V_src)`` and ``src_valid_len`` in ``[0, S]`` when concrete (inside a caller's ``jit``
    they are clipped, as everywhere in the package), and the special ids in ``[0, V_tgt)``.

    Args:
      params: ``{"encoder": ..., "decoder": ...}``.
      src: ``(B, S)`` source ids. src_valid_len: ``(B,)`` in ``[0, S]``.
      bos_id, eos_id, pad_id: token ids in ``[0, V_tgt)`` (static). max_len: the number of
        steps, ``>= 1`` (static).

    Returns:
      ``(tokens (B, max_len) int32, lengths (B,) int32, weights (B, max_len, S))``; ``lengths``
      counts the tokens before ``<eos>``.
    """
    _check_model(params)
    src = check_tokens("src", src, jnp.shape(params["encoder"]["embedding"])[0], ndim=2)
    src_valid_len = check_lengths("src_valid_len", src_valid_len, src.shape[0], src.shape[1], "S")
    return _greedy_decode(params, src, src_valid_len, bos_id=check_id("bos_id", bos_id),
                          eos_id=check_id("eos_id", eos_id), pad_id=check_id("pad_id", pad_id),
                          max_len=check_max_len(max_len))


# --------------------------------------------------------------------------- translation


def _translation_decoder(params):
    """The decoder that :func:`jax_attention.models.translation.translate` runs for this model: greedy
    decoding, a row's ``weights`` the additive attention's weights of its steps."""

    def decode(src, src_valid_len, *, bos_id: int, eos_id: int, pad_id: int, max_len: int):
        tokens, lengths, weights = jax.device_get(greedy_decode(
            params, src, src_valid_len, bos_id=bos_id, eos_id=eos_id, pad_id=pad_id,
            max_len=max_len))

        def row_weights(row: int, steps: int, valid: int) -> dict:
            return {"weights": np.asarray(weights[row, :steps, :valid])}

        return Decoded(tokens, lengths, row_weights)

    return decode


def translate(params, sentences: str | Sequence[str], src_vocab, tgt_vocab, num_steps: int, *,
              max_len: int | None = None):
    """Translate sentences greedily, all in one batch — d2l §10.7.6 / §11.4.3 ``predict_seq2seq``.

    :func:`jax_attention.models.translation.translate` with this model's greedy decoder: each sentence
    is encoded as in training (:func:`jax_attention.data.nmt.encode_source`: the book's
    preprocessing, unknown words as ``<unk>``, ``<eos>`` appended, cut or padded to
    ``num_steps``); a sentence longer than ``num_steps`` (with its ``<eos>``) is truncated and
    its :class:`~jax_attention.models.translation.Translation` says so in ``truncated`` and ``notes``;
    unknown words are listed likewise.

    Args:
      params: the parameter dict, or a :class:`BahdanauSeq2Seq` (its :meth:`~BahdanauSeq2Seq.params_dict`).
      sentences: one sentence (``str``) or a sequence of them.
      src_vocab, tgt_vocab: the vocabularies of the training data.
      num_steps: ``S``, the source length the model was trained with.
      max_len: decoding steps (default ``num_steps``, as the book).

    Returns:
      A :class:`~jax_attention.models.translation.Translation` for a ``str``, else a list of them (in
      order); ``weights`` ``(steps, len(source_tokens))`` are the decoder's attention weights.
    """
    if hasattr(params, "params_dict"):
        params = params.params_dict()
    return translation.translate(_translation_decoder(params), sentences, src_vocab, tgt_vocab,
                                 num_steps, max_len=max_len)


# --------------------------------------------------------------------------- NNX modules


class GRULayer(ParamTree):
    """One GRU layer's parameters ``W_x (I, 3h)``, ``W_h (h, 3h)``, ``b_x``, ``b_h (3h,)``; calls :func:`gru_cell`."""

    def __init__(self, input_size: int, num_hiddens: int, *, param_dtype=jnp.float32,
                 rngs: nnx.Rngs):
        shapes = _gru_shapes(check_size("input_size", input_size),
                             check_size("num_hiddens", num_hiddens), 1)["layer_0"]
        values = _init_named(rngs.params(), shapes, param_dtype, num_hiddens)
        self.W_x, self.W_h, self.b_x, self.b_h = (nnx.Param(values[name]) for name in shapes)

    def param_layout(self) -> dict:
        """``{"W_x", "W_h", "b_x", "b_h"}``."""
        return {"W_x": self.W_x, "W_h": self.W_h, "b_x": self.b_x, "b_h": self.b_h}

    def __call__(self, inputs, state):
        """``(B, I), (B, h) -> (B, h)``; see :func:`gru_cell`."""
        return gru_cell(self.params_dict(), inputs, state)


class GRU(ParamTree):
    """A multi-layer GRU (``nn.GRU``): ``num_layers`` :class:`GRULayer`; calls :func:`gru`.

    Dropout between layers acts when a ``dropout_rng`` is passed to the call.
    """

    def __init__(self, input_size: int, num_hiddens: int, num_layers: int, dropout: float = 0.0,
                 *, param_dtype=jnp.float32, rngs: nnx.Rngs):
        self.layers = nnx.List([
            GRULayer(input_size if layer == 0 else num_hiddens, num_hiddens,
                     param_dtype=param_dtype, rngs=rngs)
            for layer in range(check_size("num_layers", num_layers))
        ])
        self.dropout = check_dropout(dropout)

    def param_layout(self) -> dict:
        """``{"layer_0": ..., ...}``."""
        return {f"layer_{i}": layer for i, layer in enumerate(self.layers)}

    def __call__(self, inputs, state=None, *, dropout_rng=None):
        """``(B, T, I) -> (outputs (B, T, h), state (L, B, h))``; see :func:`gru`."""
        return gru(self.params_dict(), inputs, state, dropout=self.dropout, dropout_rng=dropout_rng)


class Seq2SeqEncoder(ParamTree):
    """Embedding and multi-layer GRU — d2l §10.7.2; calls :func:`encoder`."""

    def __init__(self, vocab_size: int, embed_size: int, num_hiddens: int, num_layers: int,
                 dropout: float = 0.0, *, param_dtype=jnp.float32, rngs: nnx.Rngs):
        shape = (check_size("vocab_size", vocab_size), check_size("embed_size", embed_size))
        values = _init_named(rngs.params(), {"embedding": shape}, param_dtype, num_hiddens)
        self.embedding = nnx.Param(values["embedding"])
        self.gru = GRU(embed_size, num_hiddens, num_layers, dropout, param_dtype=param_dtype,
                       rngs=rngs)

    def param_layout(self) -> dict:
        """``{"embedding", "gru"}``."""
        return {"embedding": self.embedding, "gru": self.gru}

    def __call__(self, src, *, dropout_rng=None):
        """``(B, S) -> (outputs (B, S, h), state (L, B, h))``; see :func:`encoder`."""
        return encoder(self.params_dict(), src, dropout=self.gru.dropout, dropout_rng=dropout_rng)


class Seq2SeqAttentionDecoder(ParamTree):
    """The decoder with additive attention — d2l §11.4.2; calls :func:`decoder`.

    Parameters: ``embedding (V, E)``, ``attention`` ``W_q``, ``W_k (h, h)``, ``w_v (h, 1)``, a GRU
    with input ``h + E`` and the output ``dense`` ``W (h, V)``, ``b (V,)``.
    """

    def __init__(self, vocab_size: int, embed_size: int, num_hiddens: int, num_layers: int,
                 dropout: float = 0.0, *, param_dtype=jnp.float32, rngs: nnx.Rngs):
        V, E, h = (check_size(n, v) for n, v in (("vocab_size", vocab_size),
                                                   ("embed_size", embed_size),
                                                   ("num_hiddens", num_hiddens)))
        shapes = {"embedding": (V, E), "W_q": (h, h), "W_k": (h, h), "w_v": (h, 1),
                  "W": (h, V), "b": (V,)}
        values = _init_named(rngs.params(), shapes, param_dtype, h)
        self.embedding = nnx.Param(values["embedding"])
        self.W_q, self.W_k, self.w_v = (nnx.Param(values[n]) for n in ("W_q", "W_k", "w_v"))
        self.gru = GRU(h + E, h, num_layers, dropout, param_dtype=param_dtype, rngs=rngs)
        self.W, self.b = nnx.Param(values["W"]), nnx.Param(values["b"])

    def param_layout(self) -> dict:
        """``{"embedding", "attention": {"W_q", "W_k", "w_v"}, "gru", "dense": {"W", "b"}}``."""
        return {"embedding": self.embedding,
                "attention": {"W_q": self.W_q, "W_k": self.W_k, "w_v": self.w_v},
                "gru": self.gru,
                "dense": {"W": self.W, "b": self.b}}

    def __call__(self, dec_input, state, enc_outputs, src_valid_len, *, dropout_rng=None):
        """``(B, T) -> (logits (B, T, V), state, weights (B, T, S))``; see :func:`decoder`."""
        return decoder(self.params_dict(), dec_input, state, enc_outputs, src_valid_len,
                       dropout=self.gru.dropout, dropout_rng=dropout_rng)


class BahdanauSeq2Seq(Seq2SeqModule):
    """Seq2seq with Bahdanau attention — d2l §11.4, the book's ``EncoderDecoder(encoder, decoder)``.

    Holds a :class:`Seq2SeqEncoder` and a :class:`Seq2SeqAttentionDecoder`; :meth:`params_dict` gives
    the plain nested dict of the functional core (the NumPy reference's layout). Dropout acts in
    training mode (the default; ``model.eval()`` turns it off, ``model.train()`` back on), drawing
    its keys from the ``dropout`` stream of the ``rngs`` given at construction. With
    ``sow_weights=True`` the decoder's attention weights ``(B, T, S)`` are sown as
    ``nnx.Intermediate`` ``"attention_weights"`` (read them with ``nnx.capture``). The loss, greedy
    decoding and the rest of the plumbing are those of
    :class:`jax_attention.models.seq2seq_module.Seq2SeqModule`.

    Args:
      src_vocab_size, tgt_vocab_size: ``V_src``, ``V_tgt``.
      embed_size, num_hiddens, num_layers: ``E``, ``h``, ``L`` (the book: 32, 32, 2).
      dropout: the rate between GRU layers and on the attention weights (the book: 0.1).
      sow_weights: sow the attention weights on every call.
      param_dtype: the parameters' dtype.
      rngs: ``nnx.Rngs`` with ``params`` (and ``dropout``) streams; a single seed serves both.
      dtype: the computation's (``None``: the parameters'; ``jnp.bfloat16``: mixed precision,
        :meth:`~jax_attention.models.seq2seq_module.Seq2SeqModule.computation_params`).
      params: initial values (the nested dict of :func:`param_shapes`, e.g. a trained model's
        ``load_model(path).params``), as :class:`~jax_attention.models.transformer.TransformerSeq2Seq`
        takes them; ``ValueError`` when their shapes differ; default: fresh ones.

    >>> model = BahdanauSeq2Seq(len(src_vocab), len(tgt_vocab), rngs=nnx.Rngs(0))
    >>> exported = jax_attention.load_model("runs/bahdanau")
    >>> c = exported.model_config
    >>> trained = BahdanauSeq2Seq(c.src_vocab_size, c.tgt_vocab_size, c.embed_size,
    ...                           c.num_hiddens, c.num_layers, params=exported.params,
    ...                           rngs=nnx.Rngs(0))
    """

    greedy_decode_function = staticmethod(greedy_decode)

    def __init__(self, src_vocab_size: int, tgt_vocab_size: int, embed_size: int = 32,
                 num_hiddens: int = 32, num_layers: int = 2, dropout: float = 0.0, *,
                 sow_weights: bool = False, param_dtype=jnp.float32, dtype=None,
                 rngs: nnx.Rngs, params: dict | None = None):
        self.encoder = Seq2SeqEncoder(src_vocab_size, embed_size, num_hiddens, num_layers,
                                      dropout, param_dtype=param_dtype, rngs=rngs)
        self.decoder = Seq2SeqAttentionDecoder(tgt_vocab_size, embed_size, num_hiddens,
                                               num_layers, dropout, param_dtype=param_dtype,
                                               rngs=rngs)
        if params is not None:
            self._load(params, param_dtype)
        self.init_dropout(dropout, sow_weights=sow_weights, rngs=rngs, dtype=dtype)

    def _load(self, params: dict, param_dtype) -> None:
        """Put ``params`` (checked against the module's own shapes) into the parameters."""
        variables = self.param_variables()
        flat = {path: jnp.asarray(value, param_dtype)
                for path, value in flatten_params(params).items()}
        expected = {path: tuple(variable[...].shape) for path, variable in variables.items()}
        got = {path: value.shape for path, value in flat.items()}
        if got != expected:
            raise ValueError(f"params must have the shapes {expected}, got {got}")
        for path, value in flat.items():
            variables[path][...] = value

    def forward(self, src, src_valid_len, dec_input, num_steps=None, segments=None):
        """``(logits (B, T, V), weights (B, T, S))``; see :func:`seq2seq`. ``num_steps`` changes
        nothing: the decoder's dropout masks, drawn time first, do not depend on ``T``. A packed
        batch (``segments``) is refused: the recurrent encoder and decoder run over whole rows."""
        if segments is not None:
            raise ValueError("the Bahdanau model cannot take packed batches (segments): its GRU "
                             "encoder and decoder run over whole rows; pack the Transformer's")
        return seq2seq(self.computation_params(), src, src_valid_len, dec_input,
                       dropout=self.dropout, dropout_rng=self._dropout_rng())
