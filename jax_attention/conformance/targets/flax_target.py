"""``--against flax``: Flax's built-ins where they exist, our Flax NNX modules for the rest.

Built-ins (their own parameters loaded with the case's, by reshape where the layout differs):

* ``flax.nnx.dot_product_attention`` (output; as Flax documents, it hands over to
  ``jax.nn.dot_product_attention`` without dropout, whose softmax is float32) and
  ``flax.nnx.nn.attention.dot_product_attention_weights`` (weights) — laid out ``(B, T, N, d)``
  (``N = 1`` for a case without heads, a batch of one for an unbatched case), grouped-query
  keys and values with their own ``N_kv`` heads, which both take; a sliding window joins the
  boolean mask. They have no ``scale`` and no soft-capping: those cases are n/a. On the mods'
  cases (``mods.dot_product_attention``) the mask mod is their boolean mask and an additive score
  mod (a bias, ALiBi, clipped or T5 relative biases) their bias, evaluated in NumPy on the whole
  grid; a soft cap, attention sinks or a ``scale`` they cannot express (n/a);
* ``flax.nnx.MultiHeadAttention`` — kernels ``(in, N | N_kv, H)`` and ``(N, H, out)`` are our
  ``(in, N H | N_kv H)`` and ``(N H, out)`` reshaped (head ``n`` = our columns
  ``n*H .. (n+1)*H - 1``), ``num_kv_heads`` for grouped-query cases, a sliding window in the
  mask; called plainly (output) and with ``sow_weights=True`` (output and weights, the unfused
  path). One head size for queries, keys and values, no ``scale``, no soft-capping: such cases
  are n/a;
* ``flax.nnx.LayerNorm`` (``epsilon=1e-5`` as the book's ``nn.LayerNorm``);
* ``flax.nnx.GRUCell`` run by ``flax.nnx.RNN``, one per layer. Its gates have no hidden bias:
  PyTorch's ``b_hr`` and ``b_hz`` are added to the gate's input bias, which is exact, but
  ``b_hn`` sits inside ``r * (W_hn h + b_hn)`` and cannot be moved, so cases with ``b_hn != 0``
  are n/a for it;
* ``flax.nnx.Embed`` for the relative position bias table; ``flax.nnx.softmax(where=)``
  (JAX's ``jax.nn.softmax``, re-exported) for the masked softmax.

Our NNX modules (parameters assigned from the case, ``eval()`` mode, weights read back with
``nnx.capture``): ``NWKernelRegression``, ``DotProductAttention`` (also on the mods' cases, with
the mods built by :mod:`jax_attention.nn.mods` from the case's config), ``AdditiveAttention``,
``MultiHeadAttention``, ``PositionalEncoding``, ``GRU``, ``Seq2SeqEncoder``, ``BahdanauSeq2Seq``,
``PositionWiseFFN``, ``AddNorm``, ``TransformerEncoderBlock``, ``TransformerDecoderBlock``,
``TransformerSeq2Seq``. Functions with neither a Flax built-in nor a module (``sequence_mask``,
``rotary_embedding``, ``relative_position_buckets``) run through our functional core, labelled so.
"""

from __future__ import annotations

import functools

import numpy as np

from jax_attention.conformance.cases import Case, flatten_params
from jax_attention.conformance.target import Implementation, Target
from jax_attention.conformance.targets import jax_target
from jax_attention.conformance.targets._common import (
    check_device,
    first_reason,
    fully_masked_reason,
    heads,
    jax_setup,
    keep_mask,
    mha_heads,
    mods_heads,
    mods_reason,
    no_scale_reason,
    no_softcap_reason,
    softmax_where,
    standard_promotion,
    to_jax,
    value_head_size_reason,
    value_size_reason,
    window_of,
)

FUSED_FLOAT32 = ("without dropout Flax hands over to jax.nn.dot_product_attention, whose softmax "
                 "is float32 whatever the input dtype (by design): held to the float32 tolerance")


def _captured(module, *args, **kwargs):
    """``module(*args, **kwargs)`` jit-compiled, with what it sowed: ``(output, intermediates)``."""
    from flax import nnx

    return nnx.jit(lambda m, *a: nnx.capture(m, nnx.Intermediate)(*a, **kwargs))(module, *args)


def _sown(intermediates, *path):
    node = intermediates
    for key in path:
        node = node[key]
    (value,) = node.get_value()
    return value


def _load(variables: dict, params: dict) -> None:
    """Write ``params`` (nested, NumPy) into ``variables`` (the same nesting, NNX Variables)."""
    import jax.numpy as jnp

    for path, value in flatten_params(params).items():
        node = variables
        for key in path.split("/"):
            node = node[key]
        node[...] = jnp.asarray(value, node[...].dtype)


def _without_initialisers(build):
    """``build()`` — one of our NNX modules — with every array zero (RNG keys fixed) instead of
    its random initial values, for :func:`_load` to overwrite with the case's parameters.

    ``nnx.eval_shape`` gives each Variable only its shape and dtype. Running the initialisers
    instead would compile their random ops anew for each parameter shape — about a second per
    case on a CPU — for values that are thrown away. The module's other state, the RNG streams of
    its dropout layers (rate 0 here, never drawn from), gets a fixed key and a zero count. A
    parameter that :func:`_load` missed would stay zero and fail its row, never pass silently.
    """
    import jax
    from flax import nnx

    graphdef, state = nnx.split(nnx.eval_shape(build))

    def concrete(leaf):
        if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            key = jax.random.key(0)
            return key if leaf.shape == () else jax.random.split(key, leaf.shape)
        return jax.numpy.asarray(np.zeros(leaf.shape, leaf.dtype))

    return nnx.merge(graphdef, jax.tree.map(concrete, state))


def _dtype(params: dict):
    import jax.numpy as jnp

    return jnp.dtype(next(iter(flatten_params(params).values())).dtype)


# --------------------------------------------------------------------------- Flax built-ins


def _flax_dot_product_attention(device) -> list[Implementation]:
    import jax
    from flax import nnx
    from flax.nnx.nn.attention import dot_product_attention_weights

    def prepare(case, inputs):
        # Flax's layout (B, T, N, d), keys and values with their own N_kv heads (its grouped-query
        # attention); masks, sliding window included, and biases (B | 1, N | 1, T, S); causal
        # passed natively.
        h = heads(inputs, case.config, fold_causal=False, fold_window=True)
        q, k, v = (x.transpose(0, 2, 1, 3) for x in (h.queries, h.keys, h.values))
        return h, to_jax((q, k, v, h.bias, h.keep), device)

    @functools.cache
    def attend(is_causal):
        return jax.jit(lambda q, k, v, bias, mask: nnx.dot_product_attention(
            q, k, v, bias, mask, is_causal=is_causal).transpose(0, 2, 1, 3))

    @functools.cache
    def weigh(is_causal):
        return jax.jit(lambda q, k, bias, mask: dot_product_attention_weights(
            q, k, bias, mask, is_causal=is_causal))

    def run_output(case, inputs, params):
        h, (q, k, v, bias, mask) = prepare(case, inputs)
        with standard_promotion():
            out = attend(bool(case.config.get("is_causal", False)))(q, k, v, bias, mask)
        return check_device({"output": h.restore(out)}, device)

    def run_weights(case, inputs, params):
        h, (q, k, v, bias, mask) = prepare(case, inputs)
        with standard_promotion():
            weights = weigh(bool(case.config.get("is_causal", False)))(q, k, bias, mask)
        return check_device({"weights": h.restore(weights)}, device)

    output_name = "flax.nnx.dot_product_attention"
    weights_name = "flax.nnx.nn.attention.dot_product_attention_weights"
    return [
        Implementation(output_name, run_output,
                       first_reason(fully_masked_reason(output_name),
                                    value_size_reason(output_name), no_scale_reason(output_name),
                                    no_softcap_reason(output_name)),
                       tolerance_dtype="float32", note=FUSED_FLOAT32),
        Implementation(weights_name, run_weights,
                       first_reason(fully_masked_reason(weights_name),
                                    no_scale_reason(weights_name),
                                    no_softcap_reason(weights_name))),
    ]


def _flax_dot_product_attention_mods(device) -> list[Implementation]:
    """``flax.nnx.dot_product_attention`` (output) and its weights on the mods' cases: the mask
    mod as the boolean mask and an additive score mod as the bias, evaluated in NumPy
    (:func:`mods_heads`); no scale, no soft cap, no sinks (n/a)."""
    import jax
    from flax import nnx
    from flax.nnx.nn.attention import dot_product_attention_weights

    attend = jax.jit(lambda q, k, v, bias, mask: nnx.dot_product_attention(
        q, k, v, bias, mask).transpose(0, 2, 1, 3))
    weigh = jax.jit(lambda q, k, bias, mask: dot_product_attention_weights(q, k, bias, mask))

    def prepare(case, inputs, params):
        h = mods_heads(case, inputs, params)  # (B, N, T, d) -> Flax's (B, T, N, d)
        q, k, v = (x.transpose(0, 2, 1, 3) for x in (h.queries, h.keys, h.values))
        return h, to_jax((q, k, v, h.bias, h.keep), device)

    def run_output(case, inputs, params):
        h, (q, k, v, bias, mask) = prepare(case, inputs, params)
        with standard_promotion():
            out = attend(q, k, v, bias, mask)
        return check_device({"output": h.restore(out)}, device)

    def run_weights(case, inputs, params):
        h, (q, k, v, bias, mask) = prepare(case, inputs, params)
        with standard_promotion():
            weights = weigh(q, k, bias, mask)
        return check_device({"weights": h.restore(weights)}, device)

    output_name = "flax.nnx.dot_product_attention"
    weights_name = "flax.nnx.nn.attention.dot_product_attention_weights"
    return [
        Implementation(output_name, run_output,
                       first_reason(fully_masked_reason(output_name),
                                    value_size_reason(output_name), mods_reason(output_name),
                                    no_scale_reason(output_name)),
                       tolerance_dtype="float32", note=FUSED_FLOAT32),
        Implementation(weights_name, run_weights,
                       first_reason(fully_masked_reason(weights_name), mods_reason(weights_name),
                                    no_scale_reason(weights_name))),
    ]


def _flax_mha_module(case: Case, params: dict):
    """``flax.nnx.MultiHeadAttention`` holding the case's ``params``: our kernels ``(in, N H |
    N_kv H)`` and ``(N H, out)`` reshaped to its ``(in, N | N_kv, H)`` and ``(N, H, out)``."""
    import jax.numpy as jnp
    from flax import nnx

    num_heads, num_kv_heads, H, _ = mha_heads(case)
    query_size, num_hiddens = params["W_q"].shape
    use_bias = "b_q" in params
    dtype = _dtype(params)
    with standard_promotion():
        module = nnx.MultiHeadAttention(
            num_heads, query_size, num_hiddens, params["W_o"].shape[1],
            num_kv_heads=num_kv_heads, in_kv_features=params["W_k"].shape[0],
            use_bias=use_bias, decode=False, param_dtype=dtype, rngs=nnx.Rngs(0),
            kernel_init=nnx.initializers.zeros)
    # Kernels (in, N | N_kv, H): our columns n*H .. (n+1)*H - 1 are head n.
    for layer, name, N in ((module.query, "q", num_heads), (module.key, "k", num_kv_heads),
                           (module.value, "v", num_kv_heads)):
        layer.kernel[...] = jnp.asarray(params[f"W_{name}"].reshape(-1, N, H))
        if use_bias:
            layer.bias[...] = jnp.asarray(params[f"b_{name}"].reshape(N, H))
    module.out.kernel[...] = jnp.asarray(params["W_o"].reshape(num_heads, H, -1))
    if use_bias:
        module.out.bias[...] = jnp.asarray(params["b_o"])
    return module


def _flax_mha_arguments(case: Case, inputs: dict, device):
    """``(queries, keys, values, mask)`` on ``device`` as ``flax.nnx.MultiHeadAttention`` takes
    them: the case's masks and sliding window as one boolean mask (``None`` without any), the
    causal mask left out (passed natively)."""
    # Batched (B, T, q): masks (B | 1, 1, T, S). Unbatched (T, q), which Flax takes as it
    # is (no batch axes): lengths () or (T,) -> a mask (1, T, S) over the heads.
    unbatched = inputs["queries"].ndim == 2
    T, S = inputs["queries"].shape[-2], inputs["keys"].shape[-2]
    masks = dict(inputs)
    if unbatched and "valid_lens" in masks:
        masks["valid_lens"] = masks["valid_lens"][None]
    keep = keep_mask(masks, T, S, window=window_of(case.config))  # causal passed natively
    if keep is not None and not unbatched:
        keep = keep[:, None]
    return to_jax((inputs["queries"], inputs["keys"], inputs["values"], keep), device)


def _flax_mha_sizes_reason(case: Case) -> str | None:
    """n/a for ``flax.nnx.MultiHeadAttention``: keys and values of different input sizes."""
    W_k, W_v = case.params["W_k"], case.params["W_v"]
    if W_k.shape[0] != W_v.shape[0]:
        return (f"flax.nnx.MultiHeadAttention takes one input size for keys and values "
                f"(in_kv_features); the case has {W_k.shape[0]} and {W_v.shape[0]}")
    return None


def _flax_multi_head_attention(device) -> list[Implementation]:
    """``flax.nnx.MultiHeadAttention`` called plainly (output) and with ``sow_weights=True``
    (output and weights)."""
    from flax import nnx

    def run_plain(case, inputs, params):
        q, k, v, mask = _flax_mha_arguments(case, inputs, device)
        module = _flax_mha_module(case, params)
        with standard_promotion():
            out = nnx.jit(lambda m, q, k, v, mask: m(
                q, k, v, mask=mask, is_causal=case.config.get("is_causal", False)))(
                module, q, k, v, mask)
        return check_device({"output": out}, device)

    def run_sown(case, inputs, params):
        q, k, v, mask = _flax_mha_arguments(case, inputs, device)
        module = _flax_mha_module(case, params)
        with standard_promotion():
            out, sown = _captured(module, q, k, v, mask=mask, sow_weights=True,
                                  is_causal=case.config.get("is_causal", False))
        return check_device({"output": out, "weights": _sown(sown, "attention_weights")}, device)

    name = "flax.nnx.MultiHeadAttention"
    reasons = first_reason(fully_masked_reason(name), value_head_size_reason(name),
                           no_scale_reason(name), no_softcap_reason(name),
                           _flax_mha_sizes_reason)
    return [Implementation("flax.nnx.MultiHeadAttention", run_plain, reasons,
                           tolerance_dtype="float32", note=FUSED_FLOAT32),
            Implementation("flax.nnx.MultiHeadAttention(sow_weights=True)", run_sown, reasons)]


def _flax_layer_norm(device) -> Implementation:
    from flax import nnx

    def run(case, inputs, params):
        D = params["gamma"].shape[0]
        with standard_promotion():
            module = nnx.LayerNorm(D, epsilon=1e-5, param_dtype=_dtype(params), rngs=nnx.Rngs(0))
        _load({"gamma": module.scale, "beta": module.bias}, params)
        with standard_promotion():
            out = nnx.jit(lambda m, X: m(X))(module, to_jax(inputs["X"], device))
        return check_device({"output": out}, device)

    return Implementation("flax.nnx.LayerNorm", run)


def _flax_gru(device) -> Implementation:
    import jax.numpy as jnp
    from flax import nnx

    def run(case, inputs, params):
        dtype = _dtype(params)
        X = to_jax(inputs["inputs"], device)
        B = X.shape[0]
        state = inputs.get("state")
        finals = []
        for layer in range(len(params)):
            p = params[f"layer_{layer}"]
            h = p["W_h"].shape[0]
            with standard_promotion():
                cell = nnx.GRUCell(p["W_x"].shape[0], h, param_dtype=dtype, rngs=nnx.Rngs(0),
                                   kernel_init=nnx.initializers.zeros,
                                   recurrent_kernel_init=nnx.initializers.zeros)
            # PyTorch's r and z hidden biases join the input bias (they are only ever added to
            # it); the candidate's b_hn is zero in the cases this row runs (see n/a).
            folded = p["b_x"] + np.concatenate([p["b_h"][:2 * h], np.zeros(h, p["b_h"].dtype)])
            _load({"k": cell.dense_i.kernel, "b": cell.dense_i.bias, "h": cell.dense_h.kernel},
                  {"k": p["W_x"], "b": folded, "h": p["W_h"]})
            carry = (jnp.zeros((B, h), dtype) if state is None
                     else to_jax(state[layer], device))
            with standard_promotion():
                carry, X = nnx.jit(lambda r, x, c: r(x, initial_carry=c))(
                    nnx.RNN(cell, return_carry=True), X, carry)
            finals.append(carry)
        return check_device({"outputs": X, "state": jnp.stack(finals)}, device)

    def candidate_bias(case: Case) -> str | None:
        for name, p in case.params.items():
            h = p["W_h"].shape[0]
            if np.any(p["b_h"][2 * h:] != 0):
                return ("flax.nnx.GRUCell has no hidden bias: b_hr and b_hz fold into the input "
                        "bias exactly, but PyTorch's b_hn is multiplied by r and cannot; this "
                        f"case has b_hn != 0 ({name}); gru.zero_candidate_hidden_bias checks it")
        return None

    return Implementation("flax.nnx.GRUCell + nnx.RNN", run, candidate_bias)


def _flax_embed(device) -> Implementation:
    import jax.numpy as jnp
    from flax import nnx

    def run(case, inputs, params):
        rows, heads = params["table"].shape
        with standard_promotion():
            module = nnx.Embed(rows, heads, param_dtype=_dtype(params), rngs=nnx.Rngs(0),
                               embedding_init=nnx.initializers.zeros)
        module.embedding[...] = jnp.asarray(params["table"])
        with standard_promotion():
            bias = nnx.jit(lambda m, i: jnp.transpose(m(i), (2, 0, 1))[None])(
                module, to_jax(inputs["indices"], device))
        return check_device({"bias": bias}, device)

    return Implementation("flax.nnx.Embed", run)


# --------------------------------------------------------------------------- our NNX modules


def _ours(device, label: str, build, call, outputs) -> Implementation:
    """One of our NNX modules: ``build(case, params, dtype)`` makes it (eval mode, parameters
    loaded), ``call(module, case, inputs)`` runs it and returns ``(outputs, intermediates)``
    through :func:`_captured`; ``outputs(result, intermediates)`` names the arrays."""

    def run(case, inputs, params):
        module = build(case, params, _dtype(params) if params else None)
        result, sown = call(module, case, to_jax(inputs, device))
        return check_device(outputs(result, sown), device)

    return Implementation(f"jax_attention NNX {label}", run)


def _rngs():
    from flax import nnx

    return nnx.Rngs(0)  # the initial values are overwritten by the case's


def _capture(names, keywords=(), config=()):
    """``call`` for :func:`_ours`: a module taking the inputs ``names`` in order, the inputs
    ``keywords`` and the config entries ``config`` by name."""

    def call(module, case, inputs):
        args = [inputs.get(name) for name in names]
        given = {name: inputs.get(name) for name in keywords}
        given.update({name: case.config[name] for name in config if name in case.config})
        return _captured(module, *args, **given)

    return call


def _loss(module, case, inputs):
    """``call`` for :func:`_ours`: a seq2seq model's teacher-forcing loss (nothing sown)."""
    from flax import nnx

    f = nnx.jit(lambda m, *a: m.loss(*a, bos_id=case.config["bos_id"]))
    return f(module, inputs["src"], inputs["src_valid_len"], inputs["tgt"],
             inputs["tgt_valid_len"]), None


def _named(*names):
    """``outputs`` for :func:`_ours`: the module's tuple of results (or its one result) named."""
    if len(names) == 1:
        return lambda out, sown: {names[0]: out}
    return lambda out, sown: dict(zip(names, out))


def _with_weights(*path):
    """``outputs`` for :func:`_ours`: the module's output and the weights it sowed at ``path``."""
    return lambda out, sown: {"output": out, "weights": _sown(sown, *path)}


def _our_dot_product_attention_mods(device) -> Implementation:
    """Our ``DotProductAttention`` on the mods' cases: the mods built by
    :mod:`jax_attention.nn.mods` from the case's config, as the module takes them (``mask_mod=``,
    ``score_mod=``, ``sinks=``); its output and the weights it sowed."""
    from jax_attention.conformance.functions import build_mod
    from jax_attention.nn import mods, scoring

    def run(case, inputs, params):
        i, p = to_jax(inputs, device), to_jax(params, device)
        given = {name: build_mod(mods, case.config.get(name), i, p)
                 for name in ("mask_mod", "score_mod")}
        out, sown = _captured(scoring.DotProductAttention(sow_weights=True), i["queries"],
                              i["keys"], i["values"], scale=case.config.get("scale"),
                              sinks=p.get("sinks"), **given)
        return check_device({"output": out, "weights": _sown(sown, "attention_weights")}, device)

    return Implementation("jax_attention NNX DotProductAttention", run)


def _our_attention_modules(device) -> dict[str, list[Implementation]]:
    """Nadaraya–Watson regression, dot-product, additive and multi-head attention."""
    import jax.numpy as jnp

    from jax_attention.nn import attention_pooling, multihead, scoring

    def nw(case, params, dtype):
        module = _without_initialisers(lambda: attention_pooling.NWKernelRegression(
            sow_weights=True, param_dtype=dtype, rngs=_rngs()))
        module.w[...] = jnp.asarray(params["w"])
        return module

    def dot(case, params, dtype):
        return scoring.DotProductAttention(sow_weights=True)

    def additive(case, params, dtype):
        (q, h), k = params["W_q"].shape, params["W_k"].shape[0]
        module = _without_initialisers(lambda: scoring.AdditiveAttention(
            q, k, h, sow_weights=True, param_dtype=dtype, rngs=_rngs()))
        _load({"W_q": module.W_q, "W_k": module.W_k, "w_v": module.w_v}, params)
        return module

    def mha(case, params, dtype):
        num_heads, num_kv_heads, _, value_head_size = mha_heads(case)
        module = _without_initialisers(lambda: multihead.MultiHeadAttention(
            params["W_q"].shape[1], num_heads, bias="b_q" in params,
            query_size=params["W_q"].shape[0], key_size=params["W_k"].shape[0],
            value_size=params["W_v"].shape[0], num_kv_heads=num_kv_heads,
            value_head_size=value_head_size, sow_weights=True, param_dtype=dtype,
            rngs=_rngs()))
        _load({name: getattr(module, name) for name in params}, params)
        return module

    ours = functools.partial(_ours, device)
    attention = ("queries", "keys", "values", "valid_lens")
    variants = ("is_causal", "scale", "local_window_size", "logit_softcap")
    return {
        "attention_pooling.nadaraya_watson": [ours(
            "NWKernelRegression", nw, _capture(names=("queries", "keys", "values")),
            _with_weights("attention_weights"))],
        "scoring.dot_product_attention": [ours(
            "DotProductAttention", dot,
            _capture(names=attention, keywords=("mask", "bias"), config=variants),
            _with_weights("attention_weights"))],
        "scoring.additive_attention": [ours(
            "AdditiveAttention", additive,
            _capture(names=attention, keywords=("mask",), config=("is_causal",)),
            _with_weights("attention_weights"))],
        "mods.dot_product_attention": [_our_dot_product_attention_mods(device)],
        "multihead.multi_head_attention": [ours(
            "MultiHeadAttention", mha,
            _capture(names=attention, keywords=("mask", "bias"), config=variants),
            _with_weights("attention", "attention_weights"))],
    }


def _our_positional_modules(device, dtype_name: str) -> dict[str, list[Implementation]]:
    """The sinusoidal positional encoding, its table read off a zero input."""
    import jax.numpy as jnp
    from flax import nnx

    from jax_attention.nn import positional

    run_dtype = jnp.dtype(dtype_name)

    def positional_table(case, params, dtype):
        return positional.PositionalEncoding(case.config["num_hiddens"], 0.0,
                                             max_len=case.config["num_steps"], dtype=run_dtype)

    def positional_call(module, case, inputs):
        zeros = jnp.zeros((1, case.config["num_steps"], case.config["num_hiddens"]), run_dtype)
        return nnx.jit(lambda m, x: m(x, deterministic=True))(module, zeros)[0], None

    return {"positional.positional_encoding": [_ours(
        device, "PositionalEncoding", positional_table, positional_call, _named("P"))]}


def _gru_layers(module) -> dict:
    """A GRU module's Variables by the nested names of its params dict."""
    return {f"layer_{i}": {name: getattr(layer, name) for name in ("W_x", "W_h", "b_x", "b_h")}
            for i, layer in enumerate(module.layers)}


def _our_bahdanau_modules(device) -> dict[str, list[Implementation]]:
    """The GRU, the encoder and the Bahdanau seq2seq model (and its loss)."""
    from jax_attention.models import bahdanau

    def gru(case, params, dtype):
        L, I, h = len(params), params["layer_0"]["W_x"].shape[0], params["layer_0"]["W_h"].shape[0]
        module = _without_initialisers(lambda: bahdanau.GRU(I, h, L, param_dtype=dtype,
                                                             rngs=_rngs()))
        _load(_gru_layers(module), params)
        return module

    def encoder(case, params, dtype):
        (V, E), gru_params = params["embedding"].shape, params["gru"]
        module = _without_initialisers(lambda: bahdanau.Seq2SeqEncoder(
            V, E, gru_params["layer_0"]["W_h"].shape[0], len(gru_params), param_dtype=dtype,
            rngs=_rngs()))
        _load({"embedding": module.embedding, "gru": _gru_layers(module.gru)}, params)
        return module

    def seq2seq(case, params, dtype):
        enc, dec = params["encoder"], params["decoder"]
        # The loss is called without nnx.capture, where sowing would be an error.
        module = _without_initialisers(lambda: bahdanau.BahdanauSeq2Seq(
            enc["embedding"].shape[0], dec["embedding"].shape[0], enc["embedding"].shape[1],
            dec["attention"]["W_q"].shape[0], len(enc["gru"]),
            sow_weights=case.function == "bahdanau.seq2seq", param_dtype=dtype, rngs=_rngs()))
        module.eval()
        e, d = module.encoder, module.decoder
        _load({"encoder": {"embedding": e.embedding, "gru": _gru_layers(e.gru)},
               "decoder": {"embedding": d.embedding,
                           "attention": {"W_q": d.W_q, "W_k": d.W_k, "w_v": d.w_v},
                           "gru": _gru_layers(d.gru),
                           "dense": {"W": d.W, "b": d.b}}}, params)
        return module

    ours = functools.partial(_ours, device)
    return {
        "bahdanau.gru": [ours("GRU", gru, _capture(names=("inputs", "state")),
                              _named("outputs", "state"))],
        "bahdanau.encoder": [ours("Seq2SeqEncoder", encoder, _capture(names=("src",)),
                                  _named("outputs", "state"))],
        "bahdanau.seq2seq": [ours(
            "BahdanauSeq2Seq", seq2seq, _capture(names=("src", "src_valid_len", "dec_input")),
            lambda out, sown: {"logits": out, "weights": _sown(sown, "attention_weights")})],
        "bahdanau.teacher_forcing_loss": [ours("BahdanauSeq2Seq.loss", seq2seq, _loss,
                                               _named("loss"))],
    }


def _param_tree(module) -> dict:
    """A ParamTree module's Variables by the paths of its params dict."""
    return module.param_variables()


def _our_transformer_modules(device) -> dict[str, list[Implementation]]:
    """The Transformer's FFN, add & norm, blocks and model (and its loss)."""
    from jax_attention.models import transformer as tf

    def ffn(case, params, dtype):
        module = _without_initialisers(lambda: tf.PositionWiseFFN(
            params["W_1"].shape[0], params["W_1"].shape[1], param_dtype=dtype, rngs=_rngs()))
        _load(_param_tree(module), params)
        return module

    def add_norm(case, params, dtype):
        module = _without_initialisers(lambda: tf.AddNorm(params["gamma"].shape[0],
                                                           param_dtype=dtype, rngs=_rngs()))
        _load(_param_tree(module), params)
        return module

    def block(kind):
        def build(case, params, dtype):
            D, F = params["ffn"]["W_1"].shape
            return kind(D, F, case.config["num_heads"], param_dtype=dtype, rngs=_rngs(),
                        params=params)

        return build

    def transformer(case, params, dtype):
        enc, dec = params["encoder"], params["decoder"]
        D, F = enc["blocks"]["block_0"]["ffn"]["W_1"].shape
        module = tf.TransformerSeq2Seq(
            enc["embedding"].shape[0], dec["embedding"].shape[0], D, F, case.config["num_heads"],
            len(enc["blocks"]), sow_weights=case.function == "transformer.transformer",
            param_dtype=dtype, rngs=_rngs(), params=params)
        module.eval()
        return module

    ours = functools.partial(_ours, device)
    return {
        "transformer.position_wise_ffn": [ours("PositionWiseFFN", ffn, _capture(names=("X",)),
                                               _named("output"))],
        "transformer.add_norm": [ours("AddNorm", add_norm, _capture(names=("X", "Y")),
                                      _named("output"))],
        "transformer.encoder_block": [ours(
            "TransformerEncoderBlock", block(tf.TransformerEncoderBlock),
            _capture(names=("X", "src_valid_len")), _named("output", "weights"))],
        "transformer.decoder_block": [ours(
            "TransformerDecoderBlock", block(tf.TransformerDecoderBlock),
            _capture(names=("X", "enc_outputs", "src_valid_len")),
            _named("output", "self_weights", "cross_weights"))],
        "transformer.transformer": [ours(
            "TransformerSeq2Seq", transformer,
            _capture(names=("src", "src_valid_len", "dec_input")),
            lambda out, sown: {"logits": out, **_sown(sown, "attention_weights")})],
        "transformer.teacher_forcing_loss": [ours("TransformerSeq2Seq.loss", transformer, _loss,
                                                  _named("loss"))],
    }


def _our_modules(device, dtype_name: str) -> dict[str, list[Implementation]]:
    """Our NNX modules, by the function each is checked on, in the order of the index."""
    return {**_our_attention_modules(device), **_our_positional_modules(device, dtype_name),
            **_our_bahdanau_modules(device), **_our_transformer_modules(device)}


def make_flax_target(dtype: str, platform: str | None, precision: str) -> Target:
    """``--against flax``: Flax's built-ins and our NNX modules, on the JAX ``platform``."""
    from flax import nnx

    device, context, environment = jax_setup(dtype, platform, precision)
    implementations = _our_modules(device, dtype)
    # No Flax built-in and no module of ours: our functional core, labelled as such.
    for function in ("masking.sequence_mask", "positional.rotary_embedding",
                     "positional.relative_position_buckets"):
        functional = jax_target.ours(function, dtype, device)
        implementations[function] = [Implementation(
            "jax_attention (jit); no Flax built-in", functional.run)]
    builtins = {
        "masking.masked_softmax": [softmax_where("flax.nnx.softmax(where=)", nnx.softmax, device)],
        "scoring.dot_product_attention": _flax_dot_product_attention(device),
        "mods.dot_product_attention": _flax_dot_product_attention_mods(device),
        "multihead.multi_head_attention": _flax_multi_head_attention(device),
        "positional.relative_position_bias": [_flax_embed(device)],
        "bahdanau.gru": [_flax_gru(device)],
        "transformer.layer_norm": [_flax_layer_norm(device)],
    }
    for function, rows in builtins.items():
        implementations[function] = rows + implementations.get(function, [])
    return Target("flax", "Flax built-ins (flax.nnx) where they exist, jax_attention's NNX "
                          "modules for the rest", implementations, environment, context)
