"""jax-attention: the attention mechanisms of Dive into Deep Learning in JAX and Flax NNX.

The package's rooms: ``nn`` (the attention maths, one module per book section: ``masking``,
``scoring``, ``attention_pooling``, ...), ``models`` (Bahdanau, the Transformer, decoding,
translation, the registry of model kinds), ``data`` (the English–French pipeline), ``runtime``
(checkpoints, Ctrl-C, devices, export), ``viz`` (figures), ``train``, ``cli``, ``bench``,
``conformance`` and ``interop``. The most used functions and modules are re-exported here.
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
    "average_pooling": "nn.attention_pooling", "nadaraya_watson": "nn.attention_pooling",
    "nadaraya_watson_weights": "nn.attention_pooling", "NWKernelRegression": "nn.attention_pooling",
    "causal_mask": "nn.masking", "local_window_mask": "nn.masking", "masked_softmax": "nn.masking",
    "sequence_mask": "nn.masking",
    "MultiHeadAttention": "nn.multihead", "multi_head_attention": "nn.multihead",
    "PositionalEncoding": "nn.positional", "RelativePositionBias": "nn.positional",
    "positional_encoding": "nn.positional", "rotary_embedding": "nn.positional",
    "AdditiveAttention": "nn.scoring", "DotProductAttention": "nn.scoring",
    "additive_attention": "nn.scoring", "dot_product_attention": "nn.scoring",
    "load_model": "runtime.export", "show_heatmaps": "viz.plotting",
    "attention_view": "viz.attention_view", "translation_view": "viz.attention_view",
    "BahdanauSeq2Seq": "models.bahdanau", "TransformerSeq2Seq": "models.transformer",
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
    "attention_view",
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
    "translation_view",
]
