"""Seq2seq with Bahdanau (additive) attention — d2l §10.7 and §11.4 (float64 NumPy reference).

Mirror of :mod:`jax_attention.models.bahdanau`: the same functions, names, argument order, einsum strings
and parameter dicts. Written as plain loops over time and layers, to be read; no dropout (the
reference is the model in evaluation mode), no training.

Shape letters: ``B`` batch, ``S`` source length, ``T`` target length, ``L`` GRU layers, ``E``
embedding size, ``h`` hidden size (``num_hiddens``), ``I`` a GRU layer's input size, ``V``
vocabulary size, ``g = 3h`` the stacked gates.

The GRU is PyTorch's ``nn.GRU`` (which the book uses), gates in its order ``r, z, n``, with
separate input and hidden biases::

    r  = sigmoid(x W_xr + b_xr + h W_hr + b_hr)
    z  = sigmoid(x W_xz + b_xz + h W_hz + b_hz)
    n  = tanh(x W_xn + b_xn + r * (h W_hn + b_hn))
    h' = (1 - z) * n + z * h

Parameters (the same nested dict in NumPy and JAX; dense kernels stored ``(in, out)``)::

    {"encoder": {"embedding": (V_src, E),
                 "gru": {"layer_0": {"W_x": (E, 3h), "W_h": (h, 3h), "b_x": (3h,), "b_h": (3h,)},
                         "layer_1": {"W_x": (h, 3h), ...}, ...}},
     "decoder": {"embedding": (V_tgt, E),
                 "attention": {"W_q": (h, h), "W_k": (h, h), "w_v": (h, 1)},
                 "gru": {"layer_0": {"W_x": (h + E, 3h), ...}, "layer_1": {"W_x": (h, 3h), ...}},
                 "dense": {"W": (h, V_tgt), "b": (V_tgt,)}}}

``W_x`` stacks PyTorch's ``weight_ih_l{k}`` transposed (``[W_xr | W_xz | W_xn]``), ``W_h`` its
``weight_hh_l{k}``, ``b_x`` / ``b_h`` its ``bias_ih`` / ``bias_hh``. A missing or unexpected key,
nested ones included, raises ``ValueError`` naming its path and the expected keys.
"""

from __future__ import annotations

import numpy as np

from reference_numpy._checks import (
    check_int,
    check_lengths,
    check_max_len,
    check_numbered,
    check_param_keys,
    check_special_ids,
    check_tokens,
    check_values_in,
    is_integer_dtype,
)
from reference_numpy.scoring import ADDITIVE_KEYS, WEIGHTED_SUM, additive_attention_weights

__all__ = [
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
]

# The same strings as in jax_attention/models/bahdanau.py.
GRU_INPUTS = "...i,ig->...g"
GRU_STATE = "bh,hg->bg"
DENSE = "...h,hv->...v"

# The keys of the parameter dicts (the structure of param_shapes), for check_param_keys: a key
# maps to the keys of the dict under it; the GRU's "layer_l" are checked one by one.
GRU_LAYER_KEYS = ("W_x", "W_h", "b_x", "b_h")
ENCODER_KEYS = {"embedding": None, "gru": None}
DECODER_KEYS = {"embedding": None, "attention": ADDITIVE_KEYS, "gru": None, "dense": ("W", "b")}
MODEL_KEYS = ("encoder", "decoder")


def _sigmoid(x):
    # tanh form: exact, and no overflow warning for large |x| (1 / (1 + exp(-x)) overflows).
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def _check_gru_layer(params, input_size: int, num_hiddens: int):
    check_param_keys("params", params, GRU_LAYER_KEYS)
    W_x, W_h, b_x, b_h = (np.asarray(params[name]) for name in GRU_LAYER_KEYS)
    g = 3 * num_hiddens
    expected = {"W_x": (input_size, g), "W_h": (num_hiddens, g), "b_x": (g,), "b_h": (g,)}
    for name, array in zip(expected, (W_x, W_h, b_x, b_h)):
        if array.shape != expected[name]:
            raise ValueError(
                f"GRU params[{name!r}] must have shape {expected[name]} (input size {input_size}, "
                f"h = {num_hiddens}, gates r, z, n stacked), got {array.shape}"
            )
    return W_x, W_h, b_x, b_h


def _gru_update(gates_x, gates_h, state):
    """The GRU's gating from the input part ``x W_x + b_x`` and hidden part ``h W_h + b_h``."""
    x_r, x_z, x_n = np.split(gates_x, 3, axis=-1)
    h_r, h_z, h_n = np.split(gates_h, 3, axis=-1)
    r = _sigmoid(x_r + h_r)
    z = _sigmoid(x_z + h_z)
    n = np.tanh(x_n + r * h_n)
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
    inputs, state = np.asarray(inputs), np.asarray(state)
    if inputs.ndim != 2 or state.ndim != 2 or inputs.shape[0] != state.shape[0]:
        raise ValueError(f"inputs must be (B, I) and state (B, h), got inputs {inputs.shape} and "
                         f"state {state.shape}")
    W_x, W_h, b_x, b_h = _check_gru_layer(params, inputs.shape[-1], state.shape[-1])
    gates_x = np.einsum(GRU_INPUTS, inputs, W_x) + b_x.reshape(1, -1)
    gates_h = np.einsum(GRU_STATE, state, W_h) + b_h.reshape(1, -1)
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


def gru(params, inputs, state=None):
    """A multi-layer GRU over a sequence (``nn.GRU(batch_first=True)``, no dropout) — d2l §10.7.

    Layer ``l + 1`` reads the outputs of layer ``l``; the outputs are the top layer's states.

    Args:
      params: ``{"layer_0": {...}, ..., "layer_{L-1}": {...}}``, each as in :func:`gru_cell`.
      inputs: ``(B, T, I)``.
      state: ``(L, B, h)`` initial states, or ``None`` for zeros.

    Returns:
      ``(outputs (B, T, h), state (L, B, h))``: the top layer's state at every step, and every
      layer's state after the last step.
    """
    inputs = np.asarray(inputs)
    if inputs.ndim != 3:
        raise ValueError(f"inputs must have shape (B, T, I), got {inputs.shape}")
    num_layers = _num_layers(params)
    num_hiddens = np.asarray(params["layer_0"]["W_h"]).shape[0]
    B, T = inputs.shape[:2]
    if state is None:
        state = np.zeros((num_layers, B, num_hiddens), dtype=inputs.dtype)
    state = np.asarray(state)
    if state.shape != (num_layers, B, num_hiddens):
        raise ValueError(f"state must have shape (L, B, h) = {(num_layers, B, num_hiddens)}, "
                         f"got {state.shape}")
    layer_inputs, final = inputs, []
    for layer in range(num_layers):
        h = state[layer]
        outputs = []
        for t in range(T):
            h = gru_cell(params[f"layer_{layer}"], layer_inputs[:, t], h)
            outputs.append(h)
        final.append(h)
        layer_inputs = (np.stack(outputs, axis=1) if outputs else
                        np.zeros((B, 0, num_hiddens), np.result_type(inputs, state)))
    return layer_inputs, np.stack(final)


def encoder(params, src):
    """The seq2seq encoder: embedding, then a multi-layer GRU — d2l §10.7.2 ``Seq2SeqEncoder``.

    As in the book, the GRU runs over all ``S`` positions, padding included; attention later
    ignores the padded outputs through the source valid lengths.

    Args:
      params: ``{"embedding": (V_src, E), "gru": {...}}``.
      src: ``(B, S)`` source token ids.

    Returns:
      ``(outputs (B, S, h), state (L, B, h))``.
    """
    check_param_keys("params", params, ENCODER_KEYS)
    _num_layers(params["gru"], "params['gru']")
    embedding = np.asarray(params["embedding"])
    src = check_tokens("src", src, embedding.shape[0], ndim=2)
    return gru(params["gru"], embedding[src])


def _check_decoder_state(params, state, enc_outputs):
    """Checks ``state (L, B, h)`` against the decoder's GRU and ``enc_outputs (B, S, h)``."""
    check_param_keys("params", params, DECODER_KEYS)
    state, enc_outputs = np.asarray(state), np.asarray(enc_outputs)
    L = _num_layers(params["gru"], "params['gru']")
    h = np.shape(params["gru"]["layer_0"]["W_h"])[0]
    if state.ndim != 3 or state.shape[0] != L or state.shape[2] != h:
        raise ValueError(f"state must have shape (L, B, h) = ({L}, B, {h}) for the decoder's GRU, "
                         f"got {state.shape}")
    B = state.shape[1]
    if enc_outputs.ndim != 3 or enc_outputs.shape[0] != B or enc_outputs.shape[2] != h:
        raise ValueError(f"enc_outputs must have shape (B, S, h) = ({B}, S, {h}) for state of "
                         f"shape {state.shape}, got {enc_outputs.shape}")
    return state, enc_outputs


def decoder_step(params, tokens, state, enc_outputs, src_valid_len):
    """One step of the attention decoder — d2l §11.4.2 ``Seq2SeqAttentionDecoder.forward``.

    The query is the top layer's state ``state[-1]``, shaped ``(B, 1, h)``; keys and values are the
    encoder outputs, masked past ``src_valid_len``. The GRU input is ``concat(context, embedding)``
    (the book's order), and the dense layer maps the top layer's new state to the vocabulary.

    Args:
      params: the decoder's dict (``embedding``, ``attention``, ``gru``, ``dense``).
      tokens: ``(B,)`` the input tokens of this step.
      state: ``(L, B, h)``.
      enc_outputs: ``(B, S, h)``.
      src_valid_len: ``(B,)`` integers in ``[0, S]``.

    Returns:
      ``(logits (B, V), state (L, B, h), weights (B, S))``.
    """
    embedding = np.asarray(params["embedding"])
    state, enc_outputs = _check_decoder_state(params, state, enc_outputs)
    tokens = check_tokens("tokens", tokens, embedding.shape[0], ndim=1, batch=state.shape[1])
    query = state[-1][:, None, :]  # (B, 1, h)
    weights = additive_attention_weights(params["attention"], query, enc_outputs, src_valid_len)
    context = np.einsum(WEIGHTED_SUM, weights, enc_outputs)  # (B, 1, h)
    layer_input = np.concatenate([context[:, 0], embedding[tokens]], axis=-1)
    new_state = []
    for layer in range(_num_layers(params["gru"])):
        layer_input = gru_cell(params["gru"][f"layer_{layer}"], layer_input, state[layer])
        new_state.append(layer_input)
    logits = np.einsum(DENSE, layer_input, params["dense"]["W"]) + \
        np.asarray(params["dense"]["b"]).reshape(1, -1)
    return logits, np.stack(new_state), weights[:, 0]


def decoder(params, dec_input, state, enc_outputs, src_valid_len):
    """The attention decoder over a whole (teacher-forced) input sequence — d2l §11.4.2.

    Args:
      params: the decoder's dict.
      dec_input: ``(B, T)`` input tokens (``<bos>`` then the target shifted right).
      state: ``(L, B, h)`` initial state, the encoder's final state.
      enc_outputs: ``(B, S, h)``.
      src_valid_len: ``(B,)``.

    Returns:
      ``(logits (B, T, V), state (L, B, h), weights (B, T, S))``; ``T = 0`` gives empty logits
      and weights and the state unchanged.
    """
    state, enc_outputs = _check_decoder_state(params, state, enc_outputs)
    embedding = np.asarray(params["embedding"])
    dec_input = check_tokens("dec_input", dec_input, embedding.shape[0], ndim=2,
                              batch=state.shape[1])
    if dec_input.shape[1] == 0:
        V = np.shape(params["dense"]["W"])[1]
        B, S = enc_outputs.shape[:2]
        # What the steps would have returned, stacked over no step.
        return (np.zeros((B, 0, V), np.result_type(state, enc_outputs)), state,
                np.zeros((B, 0, S), np.result_type(state, enc_outputs)))
    logits, weights = [], []
    for t in range(dec_input.shape[1]):
        step_logits, state, step_weights = decoder_step(params, dec_input[:, t], state,
                                                        enc_outputs, src_valid_len)
        logits.append(step_logits)
        weights.append(step_weights)
    return np.stack(logits, axis=1), state, np.stack(weights, axis=1)


def seq2seq(params, src, src_valid_len, dec_input):
    """Encoder then decoder, the decoder starting from the encoder's final state (``d2l.EncoderDecoder``).

    Args:
      params: ``{"encoder": {...}, "decoder": {...}}``.
      src: ``(B, S)``. src_valid_len: ``(B,)``. dec_input: ``(B, T)``.

    Returns:
      ``(logits (B, T, V), weights (B, T, S))``.
    """
    # The decoder's inputs are checked before the encoder runs, so that an error costs nothing.
    _check_model(params)
    dec_input = check_tokens("dec_input", dec_input, np.shape(params["decoder"]["embedding"])[0],
                              ndim=2)
    if np.ndim(src) == 2 and np.shape(src)[0] != dec_input.shape[0]:
        raise ValueError(f"src (B, S) and dec_input (B, T) must have the same batch B, got src "
                         f"{np.shape(src)} and dec_input {dec_input.shape}")
    enc_outputs, state = encoder(params["encoder"], src)
    logits, _, weights = decoder(params["decoder"], dec_input, state, enc_outputs, src_valid_len)
    return logits, weights


def teacher_forcing_inputs(tgt, bos_id: int):
    """The decoder inputs of teacher forcing: ``<bos>`` then ``tgt[:, :-1]`` (d2l ``train_seq2seq``).

    Args:
      tgt: ``(B, T)`` integer target token ids (``T = 0`` gives ``(B, 0)``).
      bos_id: the id of ``<bos>``, an integer scalar ``>= 0``.

    Returns:
      ``(B, T)`` of ``tgt``'s dtype.
    """
    tgt = np.asarray(tgt)
    if tgt.ndim != 2 or not is_integer_dtype(tgt.dtype):
        raise ValueError(f"tgt must be integer token ids of shape (B, T), got dtype {tgt.dtype} "
                         f"with shape {tgt.shape}")
    if np.shape(bos_id) != () or not is_integer_dtype(np.asarray(bos_id).dtype):
        raise ValueError(f"bos_id must be an integer scalar (a token id), got {bos_id!r}")
    check_values_in("bos_id", bos_id, 0, np.iinfo(np.int32).max, "[0, V)")
    if tgt.shape[1] == 0:
        return tgt
    bos = np.full((tgt.shape[0], 1), bos_id, dtype=tgt.dtype)
    return np.concatenate([bos, tgt[:, :-1]], axis=1)


def masked_cross_entropy(logits, labels, valid_len, *, num_steps: int | None = None):
    """The book's ``MaskedSoftmaxCELoss`` (d2l §10.7.3): per-sequence masked cross-entropy.

    ``loss[b] = sum_{t < valid_len[b]} -log softmax(logits[b, t])[labels[b, t]] / num_steps``:
    with ``num_steps = T`` (the default) the mean over all ``T`` steps of the cross-entropy with
    padded steps counted as zero; a larger ``num_steps`` gives the loss of the batch padded to
    ``num_steps`` steps.

    Args:
      logits: float ``(B, T, V)``.
      labels: integer ``(B, T)`` ids in ``[0, V)``.
      valid_len: integer ``(B,)`` in ``[0, T]``.
      num_steps: the divisor, an integer ``>= max(T, 1)``; ``None``: ``T``.

    Returns:
      ``(B,)``; zeros when ``T = 0`` (no step to count).
    """
    logits = np.asarray(logits)
    if logits.ndim != 3 or not np.issubdtype(logits.dtype, np.floating):
        raise ValueError(f"logits must be a float array of shape (B, T, V), got dtype "
                         f"{logits.dtype} with shape {logits.shape}")
    B, T, V = logits.shape
    labels = np.asarray(labels)
    if labels.shape != (B, T) or not is_integer_dtype(labels.dtype):
        raise ValueError(f"labels must be integer token ids of shape (B, T) = {(B, T)} for "
                         f"logits {logits.shape}, got dtype {labels.dtype} with shape {labels.shape}")
    check_values_in("labels", labels, 0, V - 1, f"[0, V) = [0, {V})")
    valid_len = check_lengths("valid_len", valid_len, B, T, "T")
    divisor = T if num_steps is None else check_int("num_steps", num_steps, max(T, 1))
    if T == 0:
        return np.zeros((B,), logits.dtype)
    shift = logits.max(axis=-1, keepdims=True)
    log_probs = logits - shift - np.log(np.exp(logits - shift).sum(axis=-1, keepdims=True))
    picked = np.take_along_axis(log_probs, labels[..., None], axis=-1)[..., 0]  # (B, T)
    keep = np.arange(labels.shape[1]).reshape(1, -1) < valid_len.reshape(-1, 1)
    return np.where(keep, -picked, 0.0).sum(axis=1) / divisor


def teacher_forcing_loss(params, src, src_valid_len, tgt, tgt_valid_len, bos_id: int, *,
                         num_steps: int | None = None):
    """Per-sequence training loss with teacher forcing (``(B,)``): the book's ``l`` before
    ``l.sum()``; ``num_steps``: the divisor of targets cut short of their padding
    (``masked_cross_entropy``)."""
    _check_model(params)
    tgt = check_tokens("tgt", tgt, np.shape(params["decoder"]["embedding"])[0], ndim=2)
    tgt_valid_len = check_lengths("tgt_valid_len", tgt_valid_len, tgt.shape[0], tgt.shape[1], "T")
    logits, _ = seq2seq(params, src, src_valid_len, teacher_forcing_inputs(tgt, bos_id))
    return masked_cross_entropy(logits, tgt, tgt_valid_len, num_steps=num_steps)


def greedy_decode(params, src, src_valid_len, *, bos_id: int, eos_id: int, pad_id: int,
                  max_len: int):
    """Greedy decoding, one sentence at a time — the book's ``predict_seq2seq`` (d2l §10.7.6).

    Each row starts from ``<bos>`` and feeds back its argmax until it predicts ``<eos>`` or
    ``max_len`` steps are done. Output conventions match :func:`jax_attention.models.bahdanau.greedy_decode`:
    the ``<eos>`` is written at its step, ``<pad>`` after it, and the weights of the steps after
    ``<eos>`` are zero.

    Returns:
      ``(tokens (B, max_len), lengths (B,), weights (B, max_len, S))``; ``lengths`` counts the
      tokens before ``<eos>``.
    """
    _check_model(params)
    src = check_tokens("src", src, np.shape(params["encoder"]["embedding"])[0], ndim=2)
    src_valid_len = check_lengths("src_valid_len", src_valid_len, src.shape[0], src.shape[1], "S")
    bos_id, eos_id, pad_id = check_special_ids(
        src.shape[0], np.shape(params["decoder"]["dense"]["W"])[1], bos_id=bos_id, eos_id=eos_id,
        pad_id=pad_id)
    max_len = check_max_len(max_len)
    enc_outputs, state = encoder(params["encoder"], src)
    B, S = src.shape
    tokens = np.full((B, max_len), pad_id, dtype=np.int32)
    lengths = np.zeros(B, dtype=np.int32)
    weights = np.zeros((B, max_len, S), dtype=enc_outputs.dtype)
    for b in range(B):
        row_state, token = state[:, b:b + 1], bos_id
        for t in range(max_len):
            logits, row_state, step_weights = decoder_step(
                params["decoder"], np.asarray([token]), row_state, enc_outputs[b:b + 1],
                src_valid_len[b:b + 1])
            token = int(np.argmax(logits[0]))
            tokens[b, t] = token
            weights[b, t] = step_weights[0]
            if token == eos_id:
                break
            lengths[b] += 1
    return tokens, lengths, weights
