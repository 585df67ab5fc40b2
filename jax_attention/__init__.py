"""jax-attention: the attention mechanisms of Dive into Deep Learning in JAX and Flax NNX.

The functional core lives in one module per book section (``masking``, ``scoring``,
``attention_pooling``, ...); the most used functions and modules are re-exported here.
Every function is checked against the float64 NumPy reference in :mod:`reference_numpy`.
"""

import importlib

__version__ = "0.1.0"

# The re-exported names and their modules. They are imported on first use (PEP 562), so that
# `import jax_attention` — and the `jax-attention` command's start-up, which must handle Ctrl-C
# from its first moment — does not wait a second for JAX and Flax.
_EXPORTS = {
    "average_pooling": "attention_pooling", "nadaraya_watson": "attention_pooling",
    "nadaraya_watson_weights": "attention_pooling", "NWKernelRegression": "attention_pooling",
    "causal_mask": "masking", "masked_softmax": "masking", "sequence_mask": "masking",
    "MultiHeadAttention": "multihead", "multi_head_attention": "multihead",
    "PositionalEncoding": "positional", "RelativePositionBias": "positional",
    "positional_encoding": "positional", "rotary_embedding": "positional",
    "AdditiveAttention": "scoring", "DotProductAttention": "scoring",
    "additive_attention": "scoring", "dot_product_attention": "scoring",
}


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f"jax_attention.{_EXPORTS[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'jax_attention' has no attribute {name!r}")


def __dir__():
    return sorted({*globals(), *_EXPORTS})


__all__ = [
    "AdditiveAttention",
    "DotProductAttention",
    "MultiHeadAttention",
    "NWKernelRegression",
    "PositionalEncoding",
    "RelativePositionBias",
    "additive_attention",
    "average_pooling",
    "causal_mask",
    "dot_product_attention",
    "masked_softmax",
    "multi_head_attention",
    "nadaraya_watson",
    "nadaraya_watson_weights",
    "positional_encoding",
    "rotary_embedding",
    "sequence_mask",
]
