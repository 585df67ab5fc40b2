"""Training loops (optax + Flax NNX) for the models of the attention chapter.

- :mod:`jax_attention.train.loop` — the teacher-forced step, the compiled scan of steps and the
  epoch loop with training checkpoints, in reusable pieces;
- :mod:`jax_attention.train.seq2seq` — one trainer for every registered seq2seq model
  (:func:`train_seq2seq`; :func:`train_bahdanau` and :func:`train_transformer` with keyword
  arguments), its result type and the evaluations;
- :mod:`jax_attention.train.kernel_regression` — d2l §11.2.3, Nadaraya–Watson regression with a
  learnable kernel width.

The trained-model export lives in :mod:`jax_attention.runtime.export` (``save_checkpoint`` and
``load_checkpoint`` are re-exported here under their earlier names); training checkpoints in
:mod:`jax_attention.runtime.checkpointing`.

Long runs of the seq2seq models (``checkpoint_dir=``): training checkpoints every ``N`` steps
(Orbax), resumption bit for bit (``resume=True``), a checkpoint and :class:`TrainingInterrupted`
on SIGINT, and :class:`NonFiniteLossError` — or a skipped step — when a loss, gradient or update
is NaN or Inf, decided inside the compiled steps.
"""

from jax_attention.runtime.export import Checkpoint, load_checkpoint, save_checkpoint
from jax_attention.models.registry import MODELS
from jax_attention.train.kernel_regression import (
    KernelRegressionResult,
    summed_squared_error,
    train_kernel_regression,
)
from jax_attention.train.loop import NonFiniteLossError, TrainingInterrupted
from jax_attention.train.seq2seq import (
    BOOK_PAIRS,
    BahdanauResult,
    Seq2SeqResult,
    TransformerResult,
    evaluate_held_out,
    evaluate_translations,
    score_held_out,
    train_bahdanau,
    train_seq2seq,
    train_transformer,
)

#: The export format tag of the Bahdanau model (``config.json``'s ``"format"`` in its exported
#: directory): ``MODELS["bahdanau"].export_format``, kept under its earlier name.
CHECKPOINT_FORMAT = MODELS["bahdanau"].export_format
#: The export format tag of the Transformer model (``"jax-attention.transformer-checkpoint/1"``):
#: ``MODELS["transformer"].export_format``, kept under its earlier name.
TRANSFORMER_CHECKPOINT_FORMAT = MODELS["transformer"].export_format

__all__ = ["KernelRegressionResult", "train_kernel_regression", "summed_squared_error",
           "BOOK_PAIRS", "Seq2SeqResult", "BahdanauResult", "TransformerResult", "train_seq2seq",
           "train_bahdanau", "train_transformer", "evaluate_translations", "score_held_out",
           "evaluate_held_out", "Checkpoint", "save_checkpoint", "load_checkpoint",
           "CHECKPOINT_FORMAT", "TRANSFORMER_CHECKPOINT_FORMAT", "NonFiniteLossError",
           "TrainingInterrupted"]
