"""``--against jax``: our functional core (jit-compiled), plus JAX's own built-ins where they exist.

Rows:

* ``jax_attention`` — every function, ``jax.jit``-compiled with the case's config static, on
  the chosen device, in the run's dtype and matmul precision;
* ``jax.nn.dot_product_attention`` — the dot-product cases (output only: it returns no weights;
  heads laid out ``(B, T, N=1, d)``; valid lengths ``(B,)`` through ``key_value_seq_lengths``);
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
    jax_setup,
    keep_mask,
    softmax_where,
    standard_promotion,
    to_jax,
    value_size_reason,
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
    def compiled(is_causal: bool, with_lengths: bool):
        def attend(q, k, v, bias, mask, lengths):
            # One head: (B, T, d) -> jax.nn's (B, T, N = 1, d), and back.
            out = jax.nn.dot_product_attention(
                q[:, :, None], k[:, :, None], v[:, :, None], bias, mask, is_causal=is_causal,
                key_value_seq_lengths=lengths if with_lengths else None)
            return out[:, :, 0]

        return jax.jit(attend)

    def run(case: Case, inputs: dict, params: dict) -> dict:
        T, S = inputs["queries"].shape[1], inputs["keys"].shape[1]
        lengths = inputs.get("valid_lens")
        with_lengths = lengths is not None and lengths.ndim == 1  # jax.nn's own argument
        masks = {name: inputs[name] for name in ("valid_lens", "mask")
                 if name in inputs and not (name == "valid_lens" and with_lengths)}
        keep = keep_mask(masks, T, S)  # (B | 1, T, S) or None; causal is passed natively
        mask = None if keep is None else keep[:, None]  # (B | 1, N = 1, T, S)
        bias = inputs.get("bias")
        bias = None if bias is None else bias[:, None]
        arguments = to_jax((inputs["queries"], inputs["keys"], inputs["values"], bias, mask,
                            lengths.astype(np.int32) if with_lengths else None), device)
        with standard_promotion():
            output = compiled(bool(case.config.get("is_causal", False)), with_lengths)(*arguments)
        return check_device({"output": output}, device)

    name = "jax.nn.dot_product_attention"
    return Implementation(name, run, first_reason(fully_masked_reason(name),
                                                  value_size_reason(name)),
                          tolerance_dtype="float32", note=FLOAT32_SOFTMAX)


def make_jax_target(dtype: str, platform: str | None, precision: str) -> Target:
    import jax

    device, context, environment = jax_setup(dtype, platform, precision)
    implementations = {function: [ours(function, dtype, device)] for function in FUNCTIONS}
    implementations["scoring.dot_product_attention"].append(_jax_nn_dot_product_attention(device))
    implementations["masking.masked_softmax"].append(
        softmax_where("jax.nn.softmax(where=)", jax.nn.softmax, device))
    return Target("jax", "jax_attention's functional core (jit) and JAX's built-ins "
                         "(jax.nn.dot_product_attention, jax.nn.softmax(where=))",
                  implementations, environment, context)
