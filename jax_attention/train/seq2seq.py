"""One trainer for every registered seq2seq model — d2l's ``train_seq2seq`` (§9.7, §11.4.3, §11.7.6).

:func:`train_seq2seq` takes a model's name (or :class:`~jax_attention.models.registry.ModelSpec`) and the
run's config objects (:mod:`jax_attention.models.configs`): it loads the data, builds the model from its
config, trains it (:func:`jax_attention.train.loop.train_epochs`), translates the book's four
sentences, scores held-out pairs, and exports the model (:func:`jax_attention.runtime.export.save_model`).
:func:`train_bahdanau` and :func:`train_transformer` are the same with keyword arguments.

Deterministic from ``seed``: it seeds the batch order (the data's ``seed``), the parameters
(``jax.random.key(seed)``) and the dropout masks (``jax.random.key(seed, impl="rbg")``); on CPU
the same seed gives the same losses bit for bit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import jax
import numpy as np
from flax import nnx

from jax_attention.runtime import distributed, interrupts, provenance
from jax_attention._checks import check_int
from jax_attention.runtime.compilation import CompileTimer
from jax_attention.models.configs import DeviceConfig, LongRunConfig, TrainConfig
from jax_attention.models.registry import MODELS, ModelSpec, get_model
from jax_attention.data.batches import pack_length
from jax_attention.train.loop import (TrainingInterrupted, clipped_adam, padded_lengths,
                                      train_epochs,
                                      training_mesh)

__all__ = ["BOOK_PAIRS", "Seq2SeqResult", "BahdanauResult", "TransformerResult", "setup",
           "training_lengths", "training_row_length", "train_seq2seq", "train_bahdanau", "train_transformer",
           "evaluate_translations", "score_held_out", "evaluate_held_out"]

logger = logging.getLogger(__name__)

#: The book's test sentences and references (d2l §10.7.6 and §11.4.3).
BOOK_PAIRS = (
    ("go .", "va !"),
    ("i lost .", "j'ai perdu ."),
    ("he's calm .", "il est calme ."),
    ("i'm home .", "je suis chez moi ."),
)


@dataclass(frozen=True, eq=False)  # eq would compare arrays elementwise
class Seq2SeqResult:
    """What :func:`train_seq2seq` trained and measured.

    Attributes:
      losses: the book's loss of each epoch: ``sum`` of the per-sequence losses (masked
        cross-entropy summed over steps, divided by ``num_steps``) over the epoch's batches,
        divided by the number of target tokens — the cross-entropy per token divided by
        ``num_steps``, which is what the book prints (``loss 0.020``).
      cross_entropy: the cross-entropy per target token of each epoch (``losses * num_steps``).
      tokens_per_sec: target tokens per second of each epoch (the first includes compilation).
      model: the trained NNX model, in eval mode.
      params: its parameters as the nested dict of NumPy arrays.
      src_vocab, tgt_vocab: the vocabularies of the data.
      config: the model's sizes, the training settings and the data's fingerprint (JSON-ready;
        stored in training checkpoints): ``{"model": name, **model_config.record(),
        "training": {...}, "data": {...}}``.
      translations: ``(reference, translation)`` for each of the book's sentences.
      bleu: the BLEU (``k = 2``) of each translation against its reference.
      wall_time_s: seconds for the whole run (data, compilation, training, translation).
      checkpoint: where the trained model was exported, or ``None``.
      export_error: ``None``, or what kept the export from ``checkpoint`` (then it is in a
        rescue directory, which ``checkpoint`` names): one line.
      skipped_steps: steps skipped for a non-finite loss, gradient or update
        (``skip_nonfinite``); 0 otherwise.
      resumed_from_step: the training checkpoint's step this run resumed from, or ``None``.
      checkpoint_dir: the directory of the training checkpoints, or ``None``.
      validation: ``None``, or the held-out evaluation (:func:`score_held_out`):
        ``{"num_pairs", "corpus_bleu" (k = 4), "mean_sentence_bleu" (k = 4), "examples"}``.
      model_config, train_config: the run's config objects (vocabulary sizes filled in).
      steady_tokens_per_sec: the median tokens/s of the epochs after the first one this run
        trained (which compiles), or ``None`` when it trained fewer than two.
      timing: seconds by phase: ``setup_s`` (data, model), ``training_s`` (the epochs),
        ``evaluation_s`` (translations, held-out pairs), ``export_s``, and ``compile_s``: the
        compilation within them all (tracing, lowering and XLA, or loading from the persistent
        compilation cache) the run waited for, of which ``training_compile_s`` in the epochs
        and ``evaluation_compile_s`` in the evaluation
        (:class:`jax_attention.runtime.compilation.CompileTimer`); ``background_compile_s``: the
        compilation of the evaluation's programs in a background thread while the epochs ran
        (not waited for); ``compile_cache_hits``: the programs the run loaded from that cache.
    """

    losses: list[float]
    cross_entropy: list[float]
    tokens_per_sec: list[float]
    model: object
    params: dict
    src_vocab: object
    tgt_vocab: object
    config: dict
    translations: list
    bleu: list[float]
    wall_time_s: float
    checkpoint: Path | None
    skipped_steps: int = 0
    resumed_from_step: int | None = None
    checkpoint_dir: Path | None = None
    validation: dict | None = None
    model_config: object = None
    train_config: TrainConfig | None = None
    steady_tokens_per_sec: float | None = None
    timing: dict | None = None
    export_error: str | None = None

    def figures(self) -> dict:
        """The results as JSON-ready Python values (no arrays)."""
        return {
            "final_loss": self.losses[-1],
            "final_cross_entropy": self.cross_entropy[-1],
            "tokens_per_sec": self.tokens_per_sec[-1],
            "losses": list(self.losses),
            "cross_entropy": list(self.cross_entropy),
            "tokens_per_sec_per_epoch": list(self.tokens_per_sec),
            "steady_tokens_per_sec": self.steady_tokens_per_sec,
            "compile_s": None if self.timing is None else self.timing["compile_s"],
            "timing": self.timing,
            "translations": [
                {"source": t.source, "translation": t.translation, "reference": reference,
                 "bleu": score}
                for (reference, t), score in zip(self.translations, self.bleu)
            ],
            "num_bleu_1": sum(score == 1.0 for score in self.bleu),
            "config": self.config,
            "wall_time_s": self.wall_time_s,
            "checkpoint": None if self.checkpoint is None else str(self.checkpoint),
            "export_error": self.export_error,
            "skipped_steps": self.skipped_steps,
            "resumed_from_step": self.resumed_from_step,
            "checkpoint_dir": None if self.checkpoint_dir is None else str(self.checkpoint_dir),
            "validation": self.validation,
        }


#: The result of :func:`train_bahdanau` and :func:`train_transformer` (one type for every model).
BahdanauResult = TransformerResult = Seq2SeqResult


def evaluate_translations(params, src_vocab, tgt_vocab, num_steps: int, pairs=BOOK_PAIRS, *,
                          k: int = 2, translate: Callable | None = None):
    """Translate each ``(source, reference)`` of ``pairs`` and score it with BLEU (``k``).

    ``translate(params, sentences, src_vocab, tgt_vocab, num_steps)`` defaults to
    :func:`jax_attention.models.bahdanau.translate`.

    Returns:
      ``(translations, scores)``: ``[(reference, translation)]`` and the BLEU of each.
    """
    from jax_attention.models.metrics import bleu

    if translate is None:
        from jax_attention.models.bahdanau import translate

    pairs = list(pairs)
    results = translate(params, [source for source, _ in pairs], src_vocab, tgt_vocab, num_steps)
    scores = [bleu(t.translation, reference, k) for (_, reference), t in zip(pairs, results)]
    return [(reference, t) for (_, reference), t in zip(pairs, results)], scores


def score_held_out(spec, params, config, split, src_vocab, tgt_vocab, *, batch_size: int = 256,
                   num_examples_shown: int = 5) -> dict:
    """Greedy translations of held-out pairs scored with corpus and sentence BLEU (k = 4), for
    any registered model (``spec``, its :attr:`~jax_attention.models.registry.ModelSpec.decode` with
    ``params`` and ``config``): :func:`jax_attention.models.translation.evaluate_held_out`.

    Args:
      split: a :class:`jax_attention.data.nmt.TranslationArrays` (``TranslationData.val``).

    Returns:
      ``{"num_pairs", "corpus_bleu", "mean_sentence_bleu", "examples": [{"source", "translation",
      "reference", "bleu"}, ...]}``.
    """
    from jax_attention.models.translation import evaluate_held_out as evaluate

    spec = get_model(spec)

    def decode(src, src_valid_len, **ids):
        return spec.decode(params, src, src_valid_len, config, **ids)

    return evaluate(decode, split, src_vocab, tgt_vocab, max_len=config.num_steps,
                    batch_size=batch_size, num_examples_shown=num_examples_shown)


def evaluate_held_out(params, split, src_vocab, tgt_vocab, *, num_heads: int, num_steps: int,
                      max_positions: int, batch_size: int = 256, num_examples_shown: int = 5
                      ) -> dict:
    """:func:`score_held_out` for a Transformer given by its sizes (the signature of earlier
    versions; :func:`score_held_out` serves every registered model)."""
    from jax_attention.models.transformer_layers import kv_heads

    spec = MODELS["transformer"]
    blocks = params["encoder"]["blocks"]
    config = spec.model_config(
        num_hiddens=int(np.shape(params["encoder"]["embedding"])[1]),
        ffn_num_hiddens=int(np.shape(blocks["block_0"]["ffn"]["W_1"])[1]),
        num_heads=num_heads, num_kv_heads=kv_heads(blocks["block_0"]["attention"], num_heads),
        num_layers=len(blocks), dropout=0.0, num_steps=num_steps,
        max_positions=max_positions, src_vocab_size=len(src_vocab),
        tgt_vocab_size=len(tgt_vocab))
    return score_held_out(spec, params, config, split, src_vocab, tgt_vocab,
                          batch_size=batch_size, num_examples_shown=num_examples_shown)


def setup(spec, model_config, train_config: TrainConfig, *, data=None):
    """The data, the model's config with the vocabulary sizes, the model (training mode) and the
    optimizer of a run, before its first step: ``(nmt, model_config, model, optimizer)``."""
    from jax_attention.data.nmt import load_data_nmt

    spec = get_model(spec)
    t = train_config
    if t.pack and not spec.packs:
        raise ValueError(f"--pack (pack=True): the {spec.title} model cannot take packed batches "
                         f"(its recurrent encoder and decoder run over whole rows)")
    nmt = load_data_nmt(t.batch_size, model_config.num_steps, t.num_examples, data=data,
                        seed=t.seed, val_fraction=t.val_fraction)
    if t.batch_size > len(nmt.train):
        # The last batch of an epoch is padded to the batch size: a batch far beyond the data
        # would allocate for rows that hold nothing.
        raise ValueError(f"batch_size = {t.batch_size} (--batch-size) is larger than the "
                         f"{len(nmt.train)} training pairs; use at most {len(nmt.train)}")
    if t.pack:
        pack_length(nmt, t.pack_length)  # a row shorter than a sentence: refused before any work
    model_config = dataclasses.replace(model_config, src_vocab_size=len(nmt.src_vocab),
                                       tgt_vocab_size=len(nmt.tgt_vocab))
    settings = (spec.name, model_config, None if t.dtype == "float32" else t.dtype, t.lr,
                t.clip_global_norm)
    # Dropout masks come from an "rbg" key (XLA's RngBitGenerator): on CPU the threefry
    # generator's kernels for the masks' shapes roughly double the step's compilation time. Both
    # are deterministic on a given backend.
    keys = (jax.random.key(t.seed), jax.random.key(t.seed, impl="rbg"))
    graphdef = nnx.graphdef(nnx.eval_shape(lambda: _new_training(keys, *settings)))
    model, optimizer = nnx.merge(graphdef, _initial_state(keys, settings))
    return nmt, model_config, model, optimizer


def _new_training(keys: tuple, name: str, model_config, dtype: str | None, lr: float,
                  clip_global_norm: float):
    """The model (training mode) and its optimizer (:func:`setup`); ``keys``: the parameters'
    and dropout's."""
    rngs = nnx.Rngs(params=keys[0], dropout=keys[1])
    model = get_model(name).build(model_config, rngs,
                                  dtype=None if dtype is None else jax.numpy.dtype(dtype))
    model.train()
    return model, nnx.Optimizer(model, clipped_adam(lr, clip_global_norm), wrt=nnx.Param)


@functools.partial(jax.jit, static_argnums=1)
def _initial_state(keys: tuple, settings: tuple):
    """The state of :func:`_new_training` in one compiled program. Built eagerly, its ~20
    operations (the initial draw, Adam's zeros of each shape, ...) compiled one by one took
    ~0.5 s of every run's setup. The keys are traced: one compilation serves every seed. The
    values are those of the eager construction, bit for bit (tests/test_seq2seq_trainer.py)."""
    return nnx.state(_new_training(keys, *settings))


def _run_record(spec: ModelSpec, model_config, train_config: TrainConfig, nmt) -> dict:
    """The run's configuration as checkpoints store it: the model, the training settings and
    the data's fingerprint (:attr:`jax_attention.data.nmt.TranslationData.fingerprint`: the pairs
    used and the vocabularies), so that a resumption on other data is refused."""
    return {"model": spec.name, **model_config.record(), "training": train_config.record(),
            "data": nmt.fingerprint}


def _book_translations(spec: ModelSpec, params, model_config, nmt):
    """The book's sentences translated with ``params`` and scored."""

    def translate(params, sentences, src_vocab, tgt_vocab, num_steps):
        return spec.translate(params, sentences, src_vocab, tgt_vocab, model_config)

    return evaluate_translations(params, nmt.src_vocab, nmt.tgt_vocab, model_config.num_steps,
                                 translate=translate)


class _EvaluationCompile(threading.Thread):
    """Compiles the programs of the book's translations in the background while training runs:
    translating with a copy of the initial parameters (the trained ones have the same shapes)
    fills JAX's caches, so that the evaluation after training compiles nothing. Started after
    the training step's own compilation (``train_epochs(after_first_call=thread.start)``), it
    uses the core the steps leave idle: on 2 cores the Transformer's evaluation went from
    ~2.0 s to ~0.01 s of the run. An error here cannot break the run: it is logged (one warning
    of this module's ``logger``, with its traceback) and left to the real evaluation to meet.
    Then it calls ``warm_up`` (:func:`train_seq2seq`'s), whose errors are left to the caller's
    own later call to meet (logged at debug level only).

    Attributes:
      compile_s: the seconds it compiled (:class:`~jax_attention.runtime.compilation.CompileTimer`).
    """

    def __init__(self, spec: ModelSpec, model, model_config, nmt,
                 warm_up: Callable[[], object] | None = None):
        super().__init__(name="jax-attention-compile-evaluation", daemon=True)
        self._work = (spec, jax.tree.map(lambda leaf: np.array(leaf, copy=True),
                                         model.params_dict()), model_config, nmt)
        self._warm_up = warm_up
        self.compile_s = 0.0

    def run(self) -> None:
        with CompileTimer(this_thread=True) as timer:
            try:
                _book_translations(*self._work)
            except Exception as error:  # noqa: BLE001 - the evaluation itself reports what fails
                # One line where logging is not configured (the command's rule: no traceback);
                # the traceback goes to the debug record, for a user who asks for it.
                logger.warning("compiling the evaluation's programs in the background failed "
                               "(%s: %s); the evaluation after training compiles them itself",
                               type(error).__name__, error)
                logger.debug("the background compile's error", exc_info=True)
        self.compile_s = timer.seconds
        if self._warm_up is not None:
            try:
                self._warm_up()
            except Exception:  # noqa: BLE001 - the caller's own call meets it
                logger.debug("the background warm-up failed", exc_info=True)

    def wait(self) -> None:
        """Wait for its compilations, if it was started: an interpreter that exits while XLA
        compiles in another thread can crash, and the evaluation reuses what it compiled."""
        if self.ident is not None:
            self.join()


def _trained_params(model) -> dict:
    """The trained model's parameters as NumPy arrays; the model put in eval mode."""
    model.eval()
    return jax.tree.map(np.asarray, model.params_dict())


def _export(checkpoint, spec: ModelSpec, params, nmt, model_config, train_config
            ) -> tuple[Path, str | None]:
    """Export the trained model to ``checkpoint``; where that cannot be written (a full disk, a
    path that became read-only), to a rescue directory instead (:func:`jax_attention.runtime.provenance.
    rescue_path`): ``(the directory written, None or the line that says what happened)``."""
    from jax_attention.runtime.export import save_model

    def save(directory):
        return save_model(directory, params, nmt.src_vocab, nmt.tgt_vocab, model_config,
                          training=train_config)

    written, reason = provenance.write_or_rescue(save, checkpoint, f"{spec.name}-model")
    return written, None if reason is None else (
        f"could not write the trained model to {checkpoint} ({reason}); wrote it to {written} "
        "instead")


def _stopped_after_training(long_run: LongRunConfig, total: int, written: Path | None,
                            export_error: str | None) -> TrainingInterrupted:
    """The stop after a Ctrl-C that came once the last step was done: the model exported, the
    evaluation skipped."""
    kept = [f"all {total} steps done"]
    checkpoint = None
    if long_run.directory is not None:
        checkpoint = long_run.directory / str(total)
        kept.append(f"training checkpoint {total} in {long_run.directory} holds them")
    if export_error is not None:
        kept.append(export_error)
    elif written is not None:
        kept.append(f"the trained model was written to {written}")
    return TrainingInterrupted(
        f"interrupted (Ctrl-C) after training; {'; '.join(kept)}; the translations and the "
        "held-out evaluation were skipped", step=total, checkpoint=checkpoint)


def _evaluate(spec: ModelSpec, model, model_config, nmt, early: _EvaluationCompile | None = None):
    """The trained model's parameters (NumPy), the book's sentences translated and scored, and
    the held-out evaluation (``None`` without held-out pairs). ``early``: the
    :class:`_EvaluationCompile` of the run, waited for first (its compilations are reused)."""
    if early is not None:
        early.wait()
    params = _trained_params(model)
    translations, scores = _book_translations(spec, params, model_config, nmt)
    validation = (score_held_out(spec, params, model_config, nmt.val, nmt.src_vocab,
                                 nmt.tgt_vocab) if len(nmt.val) else None)
    return params, translations, scores, validation


def _checked_run(model, model_config, train_config: TrainConfig | None,
                 long_run: LongRunConfig | None, devices: DeviceConfig | None, log_every: int):
    """:func:`train_seq2seq`'s settings checked, before any work, and the defaults filled in:
    ``(spec, model_config, train_config, long_run, mesh)``, ``mesh`` the training's device mesh
    (:func:`jax_attention.train.loop.training_mesh`)."""
    spec = get_model(model)
    model_config = spec.model_config() if model_config is None else model_config
    if not isinstance(model_config, spec.config_class):
        raise TypeError(f"model_config must be a {spec.config_class.__name__} for the "
                        f"{spec.name} model, got {type(model_config).__name__}")
    train_config = spec.train_config() if train_config is None else train_config
    long_run = LongRunConfig() if long_run is None else long_run
    devices = DeviceConfig() if devices is None else devices
    check_int("log_every", log_every, 1)
    if devices.model_parallel != 1 and not spec.tensor_parallel:
        raise ValueError(f"model_parallel = {devices.model_parallel}: the {spec.name} model "
                         "has no tensor-parallel layout; use 1")
    mesh = training_mesh(devices.devices, train_config.batch_size, long_run.checkpoint_dir,
                         model=devices.model_parallel)
    spec.check_shards(model_config, distributed.model_size(mesh))
    return spec, model_config, train_config, long_run, mesh


def training_lengths(spec: ModelSpec, nmt, train_config: TrainConfig) -> tuple[int, int] | None:
    """The ``lengths`` a run of ``spec`` trains with (:func:`~jax_attention.train.loop.
    train_epochs`): the training pairs' longest sentences when ``train_config.trim_padding``
    (the sources only where the model allows, :attr:`ModelSpec.trims_source`), else ``None``
    (also when it packs its batches, :func:`training_row_length`)."""
    if not train_config.trim_padding or train_config.pack:
        return None
    return padded_lengths(nmt, trim_source=spec.trims_source)


def training_row_length(nmt, train_config: TrainConfig) -> int | None:
    """The packed rows' length a run trains with (``--pack``), or ``None`` (not packed)."""
    return pack_length(nmt, train_config.pack_length) if train_config.pack else None


def _train(spec: ModelSpec, module, optimizer, nmt, train_config: TrainConfig,
           early: _EvaluationCompile | None, **epochs_settings):
    """The epochs (:func:`jax_attention.train.loop.train_epochs`, ``epochs_settings`` its
    keywords), starting ``early`` once the training step has compiled; a run that stops (Ctrl-C,
    a non-finite step) waits for ``early`` before it raises."""
    try:
        return train_epochs(module, optimizer, nmt, epochs=train_config.epochs, desc=spec.name,
                            after_first_call=None if early is None else early.start,
                            lengths=training_lengths(spec, nmt, train_config),
                            row_length=training_row_length(nmt, train_config),
                            **epochs_settings)
    except BaseException:
        if early is not None:
            early.wait()
        raise


def _export_if_asked(checkpoint, spec: ModelSpec, params, nmt, model_config, train_config
                     ) -> tuple[Path | None, str | None]:
    """:func:`_export` when the run exports (a ``checkpoint`` directory; in a multi-process run,
    process 0 alone); ``(None, None)`` otherwise."""
    if checkpoint is None or not distributed.is_main_process():
        return None, None
    interrupts.phase("export")
    return _export(checkpoint, spec, params, nmt, model_config, train_config)


def _timing(phases: _Phases, compiling: CompileTimer, training_compile: CompileTimer,
            evaluation_compile: CompileTimer, early: _EvaluationCompile | None) -> dict:
    """:attr:`Seq2SeqResult.timing`: the wall seconds by phase and the compilation's seconds
    (waited for: in all, in the epochs, in the evaluation; ``early``'s in the background) and
    the programs loaded from the persistent cache."""
    return {**phases.seconds, "compile_s": compiling.seconds,
            "training_compile_s": training_compile.seconds,
            "evaluation_compile_s": evaluation_compile.seconds,
            "background_compile_s": 0.0 if early is None else early.compile_s,
            "compile_cache_hits": compiling.cache_hits}


def train_seq2seq(model, model_config=None, train_config: TrainConfig | None = None,
                  long_run: LongRunConfig | None = None, devices: DeviceConfig | None = None, *,
                  data: str | os.PathLike | None = None,
                  checkpoint: str | os.PathLike | None = None, progress: bool = True,
                  log: Callable[[str], object] | None = print,
                  log_every: int = 10,
                  warm_up: Callable[[], object] | None = None) -> Seq2SeqResult:
    """Train a registered seq2seq model on English–French — the book's ``train_seq2seq``.

    The recipe: the first ``num_examples`` pairs (:func:`jax_attention.data.nmt.load_data_nmt`),
    shuffled mini-batches; decoder inputs ``<bos>`` + target[:-1] (teacher forcing); the
    per-sequence masked cross-entropy summed over the batch; its gradient clipped to global norm
    1, then Adam. Dropout is on during training and off for the final translations. The last,
    smaller batch of an epoch is filled up with rows of target length 0, which add exactly
    nothing to the loss and gradient. With ``val_fraction > 0`` the last pairs are held out and
    translated greedily after training (:func:`score_held_out`).

    Args:
      model: a name of :data:`jax_attention.models.registry.MODELS` (``"bahdanau"``, ``"transformer"``)
        or its :class:`~jax_attention.models.registry.ModelSpec`.
      model_config: the model's config (default: the book's); vocabulary sizes come from the data.
      train_config: the data and optimisation (default: the book's, this model's epochs).
      long_run: training checkpoints, resumption, non-finite steps
        (:class:`~jax_attention.models.configs.LongRunConfig`; default: none).
      devices: the device mesh (:class:`~jax_attention.models.configs.DeviceConfig`; default: every
        device, data parallel; in a multi-process run process 0 alone logs and exports).
      data: where the English–French data is (``--data``); ``None`` looks in the usual places.
      checkpoint: a directory to export the trained model into
        (:func:`jax_attention.runtime.export.save_model`), or ``None``.
      progress: show a progress bar over the epochs (stderr, only on a terminal).
      log: called with ``"epoch {e}, loss {loss:.4f}, {tokens/sec:.1f} tokens/sec"`` every
        ``log_every`` epochs (and after the last), or ``None``.
      warm_up: called once, in a background thread, once the training step has compiled (after
        the evaluation's programs compiled there): work the caller will need after training,
        done on the core the steps leave idle (``jax-attention train`` imports its plotting
        module). Its errors are ignored: the caller's own later call meets them. Not called
        by processes other than 0 of a multi-process run.

    Returns:
      A :class:`Seq2SeqResult`, with the book's four sentences translated and scored.

    Raises:
      NonFiniteLossError: a step was not finite (and ``skip_nonfinite`` is False).
      TrainingInterrupted: SIGINT, with a ``checkpoint_dir`` (without it Ctrl-C raises a plain
        :class:`KeyboardInterrupt`), or under the command line's Ctrl-C handling
        (:mod:`jax_attention.runtime.interrupts`): then also after the last step, once the model is
        exported (the evaluation is skipped).
      FileExistsError: ``checkpoint_dir`` holds training checkpoints and ``resume`` is False.

    Example::

        >>> from jax_attention.models.configs import TrainConfig
        >>> config = TrainConfig(epochs=5, num_examples=600)
        >>> result = train_seq2seq("transformer", train_config=config)  # doctest: +SKIP
        >>> result.losses[-1], result.translations[0]  # doctest: +SKIP
    """
    spec, model_config, train_config, long_run, mesh = _checked_run(
        model, model_config, train_config, long_run, devices, log_every)
    if not distributed.is_main_process():
        progress, log = False, None

    start = time.perf_counter()
    phases = _Phases()
    with CompileTimer(this_thread=True) as compiling:
        with phases("setup_s"):
            nmt, model_config, module, optimizer = setup(spec, model_config, train_config,
                                                         data=data)
        config = _run_record(spec, model_config, train_config, nmt)
        early = (_EvaluationCompile(spec, module, model_config, nmt, warm_up)
                 if distributed.is_main_process() else None)
        with phases("training_s"), CompileTimer(this_thread=True) as training_compile:
            trained = _train(spec, module, optimizer, nmt, train_config, early, progress=progress,
                             log=log, log_every=log_every, config=config, long_run=long_run,
                             mesh=mesh)
        stopping = interrupts.requested()  # a Ctrl-C after the last step: export, then stop
        if stopping and early is not None:
            early.wait()
        with phases("evaluation_s"), CompileTimer(this_thread=True) as evaluation_compile:
            if stopping:
                params, translations, scores, validation = _trained_params(module), [], [], None
            else:
                interrupts.phase("evaluation")
                params, translations, scores, validation = _evaluate(spec, module, model_config,
                                                                     nmt, early)
        with phases("export_s"):
            written, export_error = _export_if_asked(checkpoint, spec, params, nmt, model_config,
                                                     train_config)
        if stopping:
            raise _stopped_after_training(long_run, train_config.epochs * nmt.num_batches,
                                          written, export_error)
    timing = _timing(phases, compiling, training_compile, evaluation_compile, early)
    return Seq2SeqResult(
        losses=trained.losses,
        cross_entropy=[loss * model_config.num_steps for loss in trained.losses],
        tokens_per_sec=trained.tokens_per_sec, model=module, params=params,
        src_vocab=nmt.src_vocab, tgt_vocab=nmt.tgt_vocab, config=config,
        translations=translations, bleu=scores, wall_time_s=time.perf_counter() - start,
        checkpoint=written, export_error=export_error, skipped_steps=trained.skipped_steps,
        resumed_from_step=trained.resumed_from_step,
        checkpoint_dir=long_run.directory, validation=validation,
        model_config=model_config, train_config=train_config,
        steady_tokens_per_sec=trained.steady_tokens_per_sec, timing=timing)


class _Phases:
    """Wall seconds by phase: ``with phases("training_s"): ...``; :attr:`seconds`."""

    def __init__(self):
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = time.perf_counter() - start


def _train_by_name(name: str, settings: dict) -> Seq2SeqResult:
    """:func:`train_seq2seq` with every setting as a keyword argument (the configs' field names,
    the :class:`~jax_attention.models.configs.LongRunConfig` and :class:`~jax_attention.models.configs.
    DeviceConfig` ones, and :func:`train_seq2seq`'s own keywords)."""
    spec = MODELS[name]
    model_settings, train_settings, rest = spec.split_settings(settings)
    groups = {}
    for config_class in (LongRunConfig, DeviceConfig):
        names = {field.name for field in dataclasses.fields(config_class)}
        groups[config_class] = config_class(**{k: rest.pop(k) for k in list(rest) if k in names})
    if not spec.tensor_parallel and "model_parallel" in settings:
        raise TypeError(f"train_{name}() got an unexpected keyword argument 'model_parallel'")
    unknown = sorted(set(rest) - {"data", "checkpoint", "progress", "log", "log_every",
                                  "warm_up"})
    if unknown:
        raise TypeError(f"train_{name}() got an unexpected keyword argument {unknown[0]!r}")
    return train_seq2seq(spec, spec.model_config(**model_settings),
                         spec.train_config(**train_settings), groups[LongRunConfig],
                         groups[DeviceConfig], **rest)


def train_bahdanau(**settings) -> Seq2SeqResult:
    """Train seq2seq with Bahdanau attention on English–French — d2l §11.4.3 (``train_seq2seq``).

    :func:`train_seq2seq` of the ``"bahdanau"`` model with every setting a keyword argument:

    - the model (:class:`~jax_attention.models.configs.BahdanauConfig`): ``embed_size``,
      ``num_hiddens``, ``num_layers``, ``dropout``, ``num_steps`` (book: 32, 32, 2, 0.1, 10);
    - the training (:class:`~jax_attention.models.configs.TrainConfig`): ``batch_size``, ``lr``,
      ``epochs``, ``num_examples``, ``val_fraction``, ``seed`` (book: 64, 0.005, 250, 600, 0, 0);
    - long runs (:class:`~jax_attention.models.configs.LongRunConfig`): ``checkpoint_dir``,
      ``checkpoint_every``, ``keep``, ``resume``, ``skip_nonfinite``; ``devices``;
    - ``data``, ``checkpoint``, ``progress``, ``log``, ``log_every``: as :func:`train_seq2seq`.

    Returns:
      A :class:`Seq2SeqResult`.

    Example::

        >>> result = train_bahdanau(epochs=5, num_examples=600, progress=False)  # doctest: +SKIP
        >>> [f"{b:.2f}" for b in result.bleu]  # doctest: +SKIP
    """
    return _train_by_name("bahdanau", settings)


def train_transformer(**settings) -> Seq2SeqResult:
    """Train the Transformer on English–French — d2l §11.7.6, the book's ``train_seq2seq``.

    :func:`train_seq2seq` of the ``"transformer"`` model with every setting a keyword argument:

    - the model (:class:`~jax_attention.models.configs.TransformerConfig`): ``num_hiddens``,
      ``ffn_num_hiddens``, ``num_heads``, ``num_layers``, ``dropout``, ``num_steps``,
      ``max_positions`` (book: 32, 64, 4, 2, 0.1, 10, 1000);
    - the training (:class:`~jax_attention.models.configs.TrainConfig`): ``batch_size``, ``lr``,
      ``epochs``, ``num_examples``, ``val_fraction``, ``seed`` (book: 64, 0.005, 200, 600, 0, 0);
    - long runs (:class:`~jax_attention.models.configs.LongRunConfig`): ``checkpoint_dir``,
      ``checkpoint_every``, ``keep``, ``resume``, ``skip_nonfinite``; ``devices`` and
      ``model_parallel`` (each attention's heads and each FFN's width split over ``M`` devices:
      :data:`jax_attention.runtime.distributed.TENSOR_PARALLEL_SPECS`);
    - ``data``, ``checkpoint``, ``progress``, ``log``, ``log_every``: as :func:`train_seq2seq`.

    Returns:
      A :class:`Seq2SeqResult`.

    Example::

        >>> result = train_transformer(epochs=5, num_heads=2, checkpoint="runs/t")  # doctest: +SKIP
        >>> result.translations[0]  # doctest: +SKIP
    """
    return _train_by_name("transformer", settings)
