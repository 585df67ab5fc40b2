"""jax-attention: the attention mechanisms of Dive into Deep Learning in JAX and Flax NNX.

The functional core lives in one module per book section (``masking``, ``scoring``,
``attention_pooling``, ...); the most used functions and modules are re-exported here.
Every function is checked against the float64 NumPy reference in :mod:`reference_numpy`.
"""

from jax_attention.attention_pooling import (
    NWKernelRegression,
    average_pooling,
    nadaraya_watson,
    nadaraya_watson_weights,
)
from jax_attention.masking import causal_mask, masked_softmax, sequence_mask
from jax_attention.scoring import (
    AdditiveAttention,
    DotProductAttention,
    additive_attention,
    dot_product_attention,
)

__version__ = "0.1.0"

__all__ = [
    "AdditiveAttention",
    "DotProductAttention",
    "NWKernelRegression",
    "additive_attention",
    "average_pooling",
    "causal_mask",
    "dot_product_attention",
    "masked_softmax",
    "nadaraya_watson",
    "nadaraya_watson_weights",
    "sequence_mask",
]
