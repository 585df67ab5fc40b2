"""jax-attention: the attention mechanisms of Dive into Deep Learning in JAX and Flax NNX.

The functional core lives in one module per book section (``masking``, ``scoring``,
``attention_pooling``, ...); the most used functions and modules are re-exported here.
Every function is checked against the float64 NumPy reference in :mod:`reference_numpy`.

In a notebook::

    >>> import jax_attention as ja
    >>> model = ja.load_model("runs/transformer")      # kind, heads and sizes from the export
    >>> [t.translation for t in model.translate(["i lost .", "go ."], beam=2)]
    >>> t = model.translate("go .")
    >>> ja.show_heatmaps(t.weights[None, None], "source", "translation",
    ...                  xticklabels=t.source_tokens, yticklabels=t.tokens + ["<eos>"])
    >>> result = ja.train_transformer(epochs=5, num_examples=600)     # or ja.train_bahdanau(...)
    >>> seq2seq = ja.TransformerSeq2Seq(len(result.src_vocab), len(result.tgt_vocab),
    ...                                 params=result.params, rngs=flax.nnx.Rngs(0))
    >>> weights = ja.masked_softmax(jnp.ones((2, 2, 4)), jnp.array([2, 3]))
"""

import importlib

__version__ = "0.1.0"

# The re-exported names and their modules. They are imported on first use (PEP 562), so that
# `import jax_attention` — and the `jax-attention` command's start-up, which must handle Ctrl-C
# from its first moment — does not wait a second for JAX and Flax.
_EXPORTS = {
    "average_pooling": "attention_pooling", "nadaraya_watson": "attention_pooling",
    "nadaraya_watson_weights": "attention_pooling", "NWKernelRegression": "attention_pooling",
    "causal_mask": "masking", "local_window_mask": "masking", "masked_softmax": "masking",
    "sequence_mask": "masking",
    "MultiHeadAttention": "multihead", "multi_head_attention": "multihead",
    "PositionalEncoding": "positional", "RelativePositionBias": "positional",
    "positional_encoding": "positional", "rotary_embedding": "positional",
    "AdditiveAttention": "scoring", "DotProductAttention": "scoring",
    "additive_attention": "scoring", "dot_product_attention": "scoring",
    "load_model": "export", "show_heatmaps": "plotting",
    "BahdanauSeq2Seq": "bahdanau", "TransformerSeq2Seq": "transformer",
    "train_bahdanau": "train.seq2seq", "train_seq2seq": "train.seq2seq",
    "train_transformer": "train.seq2seq",
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
    "BahdanauSeq2Seq",
    "DotProductAttention",
    "MultiHeadAttention",
    "NWKernelRegression",
    "PositionalEncoding",
    "RelativePositionBias",
    "TransformerSeq2Seq",
    "additive_attention",
    "average_pooling",
    "causal_mask",
    "dot_product_attention",
    "load_model",
    "local_window_mask",
    "masked_softmax",
    "multi_head_attention",
    "nadaraya_watson",
    "nadaraya_watson_weights",
    "positional_encoding",
    "rotary_embedding",
    "sequence_mask",
    "show_heatmaps",
    "train_bahdanau",
    "train_seq2seq",
    "train_transformer",
]
