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
from jax_attention.multihead import MultiHeadAttention, multi_head_attention
from jax_attention.positional import (
    PositionalEncoding,
    RelativePositionBias,
    positional_encoding,
    rotary_embedding,
)
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
