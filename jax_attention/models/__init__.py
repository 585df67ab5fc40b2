"""The book's models built from :mod:`jax_attention.nn`: the Bahdanau seq2seq (d2l §11.4), the
Transformer with its layers and key/value cache (§11.7), the NNX seq2seq base they share,
decoding (greedy and beam search), translation, BLEU, the run configs and the registry of model
kinds (:mod:`jax_attention.models.registry`), the one place that knows each kind.

Imports the maths and the data pipeline; never the runtime, training or command-line layers.
"""
