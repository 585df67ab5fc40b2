"""Helpers shared by the targets: masks for the built-ins, the JAX run context, n/a reasons."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import numpy as np

from jax_attention.conformance.cases import Case
from jax_attention.conformance.target import Implementation

FULLY_MASKED_UNIFORM = (
    "known difference: {name} gives a query that may attend no key uniform weights over all "
    "keys (it fills masked scores with a large negative number, in effect the book's -1e6); "
    "ours gives zero weights and a zero output, as documented in the README")


def fully_masked_reason(name: str) -> Callable[[Case], str | None]:
    """``not_applicable`` for a built-in that averages uniformly over a fully masked row."""

    def reason(case: Case) -> str | None:
        return FULLY_MASKED_UNIFORM.format(name=name) if "fully_masked_row" in case.tags else None

    return reason


def first_reason(*checks: Callable[[Case], str | None]) -> Callable[[Case], str | None]:
    """``not_applicable`` that gives the first reason any of ``checks`` gives."""

    def reason(case: Case) -> str | None:
        for check in checks:
            found = check(case)
            if found:
                return found
        return None

    return reason


def value_size_reason(name: str) -> Callable[[Case], str | None]:
    """``not_applicable`` for a built-in whose values must have the query/key size."""

    def reason(case: Case) -> str | None:
        value_size, query_size = case.inputs["values"].shape[-1], case.inputs["queries"].shape[-1]
        if value_size != query_size:
            return (f"{name} needs values of the query/key size (one head size for all "
                    f"three); the case has values of size {value_size}, queries {query_size}")
        return None

    return reason


def valid_lens_keep(valid_lens, num_queries: int, num_keys: int) -> np.ndarray:
    """d2l's valid lengths ``(B,)`` or ``(B, T)`` as a boolean mask ``(B, T, S)``, True = attend.

    Built with NumPy here rather than with the library under test, so that a built-in is fed a
    mask that does not depend on our code.
    """
    valid_lens = np.asarray(valid_lens)
    if valid_lens.ndim == 1:
        valid_lens = np.repeat(valid_lens[:, None], num_queries, axis=1)
    return np.arange(num_keys)[None, None, :] < valid_lens[:, :, None]


def keep_mask(inputs: dict, num_queries: int, num_keys: int, *, is_causal: bool = False):
    """Everything that masks a case's scores — valid lengths, boolean mask and (optionally) the
    causal mask — as one boolean ``(B | 1, T, S)`` array, or ``None`` when nothing masks."""
    keep = np.ones((1, num_queries, num_keys), dtype=bool)
    masked = False
    if inputs.get("valid_lens") is not None:
        keep = keep & valid_lens_keep(inputs["valid_lens"], num_queries, num_keys)
        masked = True
    if inputs.get("mask") is not None:
        keep = keep & inputs["mask"]
        masked = True
    if is_causal:
        keep = keep & np.tril(np.ones((num_queries, num_keys), dtype=bool))[None]
        masked = True
    return keep if masked else None


def jax_setup(dtype: str, platform: str | None, precision: str):
    """The device, run context and environment of a JAX-based target.

    The context switches x64 on for float64 (off for float32), makes ``device`` the default and
    sets the default matmul precision; compilation happens inside it, so the precision reaches
    every matmul of every jitted function.

    Raises:
      RuntimeError: JAX has no such platform here.
    """
    import flax
    import jax
    import jaxlib

    try:
        device = jax.devices(platform)[0] if platform else jax.devices()[0]
    except RuntimeError as error:
        raise RuntimeError(f"JAX has no {platform!r} platform here: {error}") from None

    @contextlib.contextmanager
    def context():
        with jax.enable_x64(dtype == "float64"), jax.default_device(device), \
                jax.default_matmul_precision(precision):
            yield

    environment = {
        "platform": device.platform,
        "device": f"{device} ({device.device_kind})",
        "precision": f"JAX default matmul precision {precision!r}; x64 "
                     f"{'on' if dtype == 'float64' else 'off'}",
        "versions": f"jax {jax.__version__}, jaxlib {jaxlib.__version__}, flax {flax.__version__}",
    }
    return device, context, environment


def to_jax(tree, device):
    """NumPy arrays (already in the run's dtype) as JAX arrays on ``device``, nested dicts kept."""
    import jax

    return jax.device_put(tree, device)


def check_device(outputs: dict, device) -> dict:
    """Raise when an output was computed elsewhere than on the device under test."""
    for name, value in outputs.items():
        devices = getattr(value, "devices", None)
        if devices is not None and devices() != {device}:
            raise RuntimeError(f"output {name} is on {devices()}, expected {device}")
    return outputs


def standard_promotion():
    """The built-ins (jax.nn, Flax) mix dtypes internally (e.g. float32 logits for float64
    inputs), which JAX's strict dtype promotion — the test suite's setting — refuses; they are
    called under standard promotion and our own code under whatever the caller set."""
    import jax

    return jax.numpy_dtype_promotion("standard")


def softmax_where(label: str, softmax: Callable, device) -> Implementation:
    """A built-in ``softmax(X, axis=-1, where=keep)`` (``jax.nn.softmax``, or Flax's re-export)
    on the masked-softmax cases, every mask of the case given as ``where``, jit-compiled."""
    import jax

    compiled = jax.jit(lambda X, where: softmax(X, axis=-1, where=where))

    def run(case: Case, inputs: dict, params: dict) -> dict:
        X = inputs["X"]
        keep = keep_mask(inputs, X.shape[-2], X.shape[-1])
        keep = np.ones(X.shape, bool) if keep is None else np.broadcast_to(keep, X.shape)
        with standard_promotion():
            weights = compiled(*to_jax((X, keep), device))
        return check_device({"weights": weights}, device)

    return Implementation(label, run)
