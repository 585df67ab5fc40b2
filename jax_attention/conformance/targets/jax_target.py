"""``--against jax``: our functional core (jit-compiled), plus JAX's own built-ins where they exist.

Rows:

* ``jax_attention`` — every function, ``jax.jit``-compiled with the case's config static, on
  the chosen device, in the run's dtype and matmul precision;
* ``jax.nn.dot_product_attention`` — the dot-product cases (output only: it returns no weights),
  laid out ``(B, T, N, d)``: a case ``(B, T, d)`` gets a head axis ``N = 1``, an unbatched one
  ``(T, d)`` a batch of one too, a case with heads ``(B, N, T, d)`` is transposed, its keys and
  values keeping their ``N_kv`` heads (jax.nn's grouped-query attention); ``scale``,
  ``local_window_size``, ``is_causal`` and valid lengths ``(B,)`` (``key_value_seq_lengths``)
  passed as its own arguments, other lengths and masks as its boolean mask. It has no logit
  soft-capping: those cases are n/a;
* ``jax.nn.dot_product_attention`` on the mods' cases (``mods.dot_product_attention``: output and
  log-sum-exp, ``return_residual=True``) — the mask mod as its boolean mask and an additive score
  mod (a bias, ALiBi, clipped or T5 relative biases) as its bias, evaluated in NumPy on the whole
  grid; ``scale=`` and grouped key/value heads natively; attention sinks added with the
  log-sum-exp (``output * exp(lse - logaddexp(lse, sink))``). A soft cap is no bias: n/a;
* ``jax.nn.softmax(where=)`` — the masked-softmax cases.
"""

from __future__ import annotations

import functools
import json

import numpy as np

from jax_attention.conformance.cases import Case
from jax_attention.conformance.functions import FUNCTIONS, call
from jax_attention.conformance.target import Implementation, Target
from jax_attention.conformance.targets._common import (
    check_device,
    first_reason,
    fully_masked_reason,
    heads,
    jax_setup,
    mods_heads,
    mods_reason,
    no_softcap_reason,
    softmax_where,
    standard_promotion,
    to_jax,
    value_size_reason,
    window_of,
)

FLOAT32_SOFTMAX = ("jax.nn.dot_product_attention computes its softmax in float32 whatever the "
                   "input dtype (by design), so it is held to the float32 tolerance")


def _extra_config(function: str, dtype: str) -> dict:
    """Keyword arguments only the JAX twin has: the sinusoidal table is built in a chosen dtype
    (float32 by default), so a float64 run asks for float64."""
    return {"dtype": dtype} if function == "positional.positional_encoding" else {}


@functools.cache
def _jitted(function: str, config_json: str):
    """``jax_attention.<function>`` under ``jax.jit``, the config closed over (static).

    Cached per (function, config) only — JAX's own cache then keys on shapes, dtypes, device and
    the x64/precision context, so float32 and float64 runs compile separately, as they must.
    """
    import jax

    config = json.loads(config_json)
    return jax.jit(lambda inputs, params: call("jax_attention", function, inputs, params, config))


def ours(function: str, dtype: str, device) -> Implementation:
    """Our functional core, jit-compiled, as users run it."""

    def run(case: Case, inputs: dict, params: dict) -> dict:
        config = {**case.config, **_extra_config(function, dtype)}
        jitted = _jitted(function, json.dumps(config, sort_keys=True))
        return check_device(jitted(to_jax(inputs, device), to_jax(params, device)), device)

    return Implementation("jax_attention (jit)", run)


def _jax_nn_dot_product_attention(device) -> Implementation:
    import jax

    @functools.cache
    def compiled(is_causal: bool, with_lengths: bool, scale, window):
        def attend(q, k, v, bias, mask, lengths):
            # jax.nn's layout (B, T, N, d); keys and values may have fewer heads (grouped-query).
            q, k, v = (x.transpose(0, 2, 1, 3) for x in (q, k, v))
            out = jax.nn.dot_product_attention(
                q, k, v, bias, mask, scale=scale, is_causal=is_causal,
                key_value_seq_lengths=lengths if with_lengths else None, local_window_size=window)
            return out.transpose(0, 2, 1, 3)

        return jax.jit(attend)

    def run(case: Case, inputs: dict, params: dict) -> dict:
        # Causal mask, sliding window, scale and valid lengths (B,) are jax.nn's own arguments;
        # other lengths and masks go in its boolean mask (B | 1, N | 1, T, S).
        h = heads(inputs, case.config, fold_causal=False, fold_window=False, native_lengths=True)
        with_lengths = h.lengths is not None
        arguments = to_jax((h.queries, h.keys, h.values, h.bias, h.keep,
                            h.lengths.astype(np.int32) if with_lengths else None), device)
        with standard_promotion():
            output = compiled(bool(case.config.get("is_causal", False)), with_lengths,
                              case.config.get("scale"), window_of(case.config))(*arguments)
        return check_device({"output": h.restore(output)}, device)

    name = "jax.nn.dot_product_attention"
    return Implementation(name, run, first_reason(fully_masked_reason(name),
                                                  value_size_reason(name),
                                                  no_softcap_reason(name)),
                          tolerance_dtype="float32", note=FLOAT32_SOFTMAX)


def _jax_nn_mods(device) -> Implementation:
    """``jax.nn.dot_product_attention`` on the mods' cases: the mask mod as its boolean mask and
    an additive score mod as its bias (both evaluated in NumPy, :func:`mods_heads`), ``scale=``
    and grouped key/value heads natively, the log-sum-exp from ``return_residual=True``; sinks
    added with it, as code without sinks of its own adds them (Hugging Face's FlexAttention path
    for gpt-oss): ``output * exp(lse - lse')`` with ``lse' = logaddexp(lse, sink)``."""
    import jax
    import jax.numpy as jnp

    @functools.cache
    def compiled(scale):
        def attend(q, k, v, bias, mask, sinks):
            q, k, v = (x.transpose(0, 2, 1, 3) for x in (q, k, v))
            out, lse = jax.nn.dot_product_attention(q, k, v, bias, mask, scale=scale,
                                                    return_residual=True)
            out, lse = out.transpose(0, 2, 1, 3), lse.transpose(0, 2, 1)  # (B, N, T, v | )
            if sinks is not None:
                total = jnp.logaddexp(lse, sinks.astype(lse.dtype)[None, :, None])
                out, lse = out * jnp.exp(lse - total)[..., None].astype(out.dtype), total
            return out, lse

        return jax.jit(attend)

    def run(case: Case, inputs: dict, params: dict) -> dict:
        h = mods_heads(case, inputs, params)
        arguments = to_jax((h.queries, h.keys, h.values, h.bias, h.keep, params.get("sinks")),
                           device)
        with standard_promotion():
            output, lse = compiled(case.config.get("scale"))(*arguments)
        return check_device({"output": h.restore(output), "lse": h.restore(lse)}, device)

    name = "jax.nn.dot_product_attention"
    return Implementation(name, run, first_reason(fully_masked_reason(name),
                                                  value_size_reason(name),
                                                  mods_reason(name, sinks=True)),
                          tolerance_dtype="float32", note=FLOAT32_SOFTMAX)


def make_jax_target(dtype: str, platform: str | None, precision: str) -> Target:
    """``--against jax``: our functional core (jit) and ``jax.nn``, on the JAX ``platform``."""
    import jax

    device, context, environment = jax_setup(dtype, platform, precision)
    implementations = {function: [ours(function, dtype, device)] for function in FUNCTIONS}
    implementations["scoring.dot_product_attention"].append(_jax_nn_dot_product_attention(device))
    implementations["mods.dot_product_attention"].append(_jax_nn_mods(device))
    implementations["masking.masked_softmax"].append(
        softmax_where("jax.nn.softmax(where=)", jax.nn.softmax, device))
    return Target("jax", "jax_attention's functional core (jit) and JAX's built-ins "
                         "(jax.nn.dot_product_attention, jax.nn.softmax(where=))",
                  implementations, environment, context)
