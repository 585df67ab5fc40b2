"""Trained-model export: :func:`save_model` / :func:`load_model` — the model, not training state.

An exported model is a directory that ``jax-attention translate --checkpoint DIR`` reads (the
train commands write one with ``--checkpoint``, default ``runs/<model>``):

- ``config.json``: ``{"format": <the model's format tag>, "model": <registry name>,
  **asdict(model config), "training": <the training config's record>, "versions": {...}}``;
- ``params.npz``: the flattened parameters, keyed by paths such as ``encoder/gru/layer_0/W_x``;
- ``src_vocab.json``, ``tgt_vocab.json``: :meth:`~jax_attention.data.nmt.Vocab.to_json`.

Training checkpoints (``--checkpoint-dir``: parameters *and* optimizer state, dropout stream,
data position; Orbax) are another thing, in :mod:`jax_attention.runtime.checkpointing`.

The format is versioned by its tag (``jax-attention.<model>-checkpoint/1``), one per registered
model (:data:`jax_attention.models.registry.MODELS`); loading dispatches on it and rebuilds the model's
config (:meth:`~jax_attention.models.configs.BahdanauConfig.from_record`). Models exported before the
registry existed have exactly this layout (a file without ``"model"`` is a Bahdanau one, as
written before the Transformer) and load unchanged — tests/fixtures holds two of them.
"""

from __future__ import annotations

import json
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from jax_attention._files import write_directory_atomically
from jax_attention.runtime import provenance
from jax_attention.models.configs import TrainConfig
from jax_attention.models.registry import MODELS, ModelSpec, get_model, model_of_config
from jax_attention.params import flatten_params, unflatten_params

__all__ = ["ExportedModel", "save_model", "load_model", "EXPORT_FILES", "FORMATS", "Checkpoint",
           "save_checkpoint", "load_checkpoint"]

#: The files of an exported model's directory (see the module docstring for what each holds):
#: :func:`save_model` writes them all, and :func:`load_model` raises ``FileNotFoundError`` naming
#: the ones missing.
EXPORT_FILES = ("config.json", "params.npz", "src_vocab.json", "tgt_vocab.json")
#: Format tag -> registry name.
FORMATS = {spec.export_format: name for name, spec in MODELS.items()}


@dataclass(frozen=True, eq=False)
class ExportedModel:
    """A loaded exported model (:func:`load_model`).

    Attributes:
      params: the nested parameter dict, JAX arrays.
      src_vocab, tgt_vocab: :class:`jax_attention.data.nmt.Vocab`.
      config: ``config.json`` as read (model sizes, ``num_steps``, ``"training"``, versions).
      path: the directory it was read from.
      spec: the model's registry entry.
      model_config: the model's config, rebuilt from ``config``.
      train_config: the training config it was trained with, or ``None`` when not recorded.
    """

    params: dict
    src_vocab: object
    tgt_vocab: object
    config: dict
    path: Path
    spec: ModelSpec
    model_config: object
    train_config: TrainConfig | None

    @property
    def kind(self) -> str:
        """The model's registry name, ``"bahdanau"`` or ``"transformer"``."""
        return self.spec.name

    def translate(self, sentences, *, max_len: int | None = None, beam_size: int = 1,
                  beam: int | None = None):
        """Translate with this model (:attr:`ModelSpec.translate`), its sizes (heads, layers,
        ``num_steps``, ...) read from the export.

        >>> model = jax_attention.load_model("runs/transformer")
        >>> [t.translation for t in model.translate(["i lost .", "go ."], beam=2)]
        >>> model.translate("go .").weights          # one sentence: one Translation

        Args:
          sentences: one sentence (returns one :class:`~jax_attention.models.translation.Translation`)
            or a sequence of them (returns a list).
          max_len: decoding steps (default the model's ``num_steps``).
          beam_size: ``1`` greedy, ``k > 1`` beam search (the Transformer only).
          beam: the same as ``beam_size`` (the ``translate --beam`` spelling).

        Raises:
          ValueError: a ``beam_size`` or ``max_len`` the model cannot take
            (:meth:`ModelSpec.check_translation`), or ``beam`` and ``beam_size`` that disagree.
        """
        if beam is not None:
            if beam_size not in (1, beam):
                raise ValueError(f"beam and beam_size are the same option; got beam={beam!r} "
                                 f"and beam_size={beam_size!r}")
            beam_size = beam
        self.spec.check_translation(self.model_config, max_len=max_len, beam_size=beam_size)
        return self.spec.translate(self.params, sentences, self.src_vocab, self.tgt_vocab,
                                   self.model_config, max_len=max_len, beam_size=beam_size)


def _check_destination(directory: Path) -> None:
    if directory.exists():
        if not directory.is_dir():
            raise FileExistsError(f"checkpoint {str(directory)!r} exists and is not a directory")
        if any(directory.iterdir()) and not (directory / "config.json").is_file():
            raise FileExistsError(f"checkpoint {str(directory)!r} is a non-empty directory that "
                                  "holds no checkpoint; refusing to overwrite it")


def _write_files(temporary: Path, params: dict, src_vocab, tgt_vocab, record: dict) -> None:
    flat = {path: np.asarray(value) for path, value in flatten_params(params).items()}
    with open(temporary / "params.npz", "wb") as stream:
        np.savez(stream, **flat)
    (temporary / "src_vocab.json").write_text(src_vocab.to_json(), encoding="utf-8")
    (temporary / "tgt_vocab.json").write_text(tgt_vocab.to_json(), encoding="utf-8")
    provenance.write_json(temporary / "config.json", record)


def save_model(directory: str | os.PathLike, params: dict, src_vocab, tgt_vocab, config, *,
               training: TrainConfig | dict | None = None) -> Path:
    """Export a trained model to ``directory``, atomically.

    Everything is written into a temporary sibling directory that is then renamed onto
    ``directory`` (:func:`jax_attention._files.write_directory_atomically`), so that an
    interrupted or failed save never leaves a half-written export there nor loses the one there
    before. An existing export at ``directory`` is replaced; any other non-empty directory is
    refused.

    Args:
      params: the nested parameter dict (NumPy or JAX arrays).
      src_vocab, tgt_vocab: the vocabularies of the training data.
      config: the model's config (vocabulary sizes filled in), e.g. a
        :class:`~jax_attention.models.configs.TransformerConfig`.
      training: the training config (or its record) to store beside it, or ``None``.

    Returns:
      ``directory`` as a :class:`~pathlib.Path`.

    Raises:
      FileExistsError: ``directory`` exists and is a file, or a non-empty directory that is not
        an export.
      ValueError: the config's vocabulary sizes are not set.
    """
    spec = model_of_config(config)
    if config.src_vocab_size is None or config.tgt_vocab_size is None:
        raise ValueError("config must hold the vocabulary sizes (src_vocab_size, "
                         f"tgt_vocab_size), got {config}")
    directory = Path(directory)
    _check_destination(directory)
    record = {"format": spec.export_format, "model": spec.name, **config.record()}
    if training is not None:
        record["training"] = training.record() if isinstance(training, TrainConfig) else training
    record["versions"] = provenance.versions()
    return write_directory_atomically(
        directory, lambda temporary: _write_files(temporary, params, src_vocab, tgt_vocab, record))


class _Reader:
    """Reads one export directory; every error names the directory and the file."""

    def __init__(self, directory: Path):
        self.directory = directory

    def bad(self, name: str, why: str) -> ValueError:
        return ValueError(f"checkpoint {str(self.directory)!r}: {name} {why}")

    def record(self) -> tuple[dict, ModelSpec]:
        try:
            record = json.loads((self.directory / "config.json").read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
            raise self.bad("config.json", f"is not valid JSON ({error})") from None
        if not isinstance(record, dict) or record.get("format") not in FORMATS:
            names = [name.capitalize() for name in MODELS]
            raise self.bad("config.json", f"is not a {names[0]} checkpoint config"
                           + "".join(f" nor a {name} one" for name in names[1:])
                           + f" (format one of {sorted(FORMATS)} expected)")
        name = FORMATS[record["format"]]
        record.setdefault("model", name)
        if record["model"] != name:
            raise self.bad("config.json", f"says model {record['model']!r} but has the format "
                                          f"of {name!r}")
        return record, get_model(name)

    def configs(self, record: dict, spec: ModelSpec):
        for key in ("src_vocab_size", "tgt_vocab_size"):
            value = record.get(key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise self.bad("config.json", f"has an invalid {key!r}: {value!r}")
        model_config = spec.config_class.from_record(record, where=self._where("config.json"))
        training = record.get("training")
        train_config = (TrainConfig.from_record(training, where=self._where("config.json"),
                                                complete=False)
                        if isinstance(training, dict) else None)
        return model_config, train_config

    def _where(self, name: str) -> str:
        return f"checkpoint {str(self.directory)!r}: {name}"

    def vocab(self, side: str, size: int):
        from jax_attention.data.nmt import RESERVED_TOKENS, Vocab

        name = f"{side}_vocab.json"
        try:
            vocab = Vocab.from_json((self.directory / name).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, ValueError, KeyError,
                TypeError) as error:
            raise self.bad(name, f"is not a vocabulary written by Vocab.to_json ({error})") \
                from None
        if len(vocab) != size:
            raise self.bad(name, f"has {len(vocab)} tokens but config.json says "
                                 f"{side}_vocab_size = {size}")
        absent = [token for token in RESERVED_TOKENS if token not in vocab]
        if absent:
            raise self.bad(name, f"lacks the reserved tokens {absent}")
        return vocab

    def params(self, expected: dict) -> dict:
        try:
            # Our own file handle: np.load(path) leaks its handle when the archive is corrupt.
            with open(self.directory / "params.npz", "rb") as stream, \
                    np.load(stream, allow_pickle=False) as stored:
                flat = {name: stored[name] for name in stored.files}
        except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError) as error:
            raise self.bad("params.npz", f"cannot be read ({type(error).__name__}: {error})") \
                from None
        if set(flat) != set(expected):
            raise self.bad("params.npz", f"holds the wrong parameters: missing "
                                         f"{sorted(set(expected) - set(flat))}, unexpected "
                                         f"{sorted(set(flat) - set(expected))}")
        for name, shape in expected.items():
            array = flat[name]
            if array.shape != tuple(shape) or not np.issubdtype(array.dtype, np.floating):
                raise self.bad("params.npz", f"parameter {name!r} has shape {array.shape} and "
                                             f"dtype {array.dtype}, expected shape "
                                             f"{tuple(shape)} of floats")
            if not np.all(np.isfinite(array)):
                raise self.bad("params.npz", f"parameter {name!r} holds NaN or Inf")
        return unflatten_params({name: jnp.asarray(array) for name, array in flat.items()})


def load_model(directory: str | os.PathLike) -> ExportedModel:
    """Read and validate a model exported by :func:`save_model` (or by earlier versions).

    The returned :class:`ExportedModel` knows its kind (``.kind``), sizes (``.model_config``:
    heads, layers, widths, ``num_steps``) and vocabularies, so translating needs nothing else:

    >>> import jax_attention
    >>> model = jax_attention.load_model("runs/transformer")   # what `make run` writes
    >>> model.kind, model.model_config.num_heads
    ('transformer', 4)
    >>> for t in model.translate(["i lost .", "he's calm ."], beam=2):
    ...     print(t.source, "=>", t.translation)

    Checks that every file is there and readable, the format tag, the model's config (as its
    config class validates it), that the vocabularies have the sizes of the config and hold
    ``<pad> <bos> <eos>``, and that the parameters have exactly the expected names, shapes and a
    float dtype, with finite values.

    Raises:
      FileNotFoundError: ``directory`` or one of its files is missing.
      ValueError: a file is corrupt or does not match the others; the message names the file.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"checkpoint {str(directory)!r} is not a directory; train one "
                                "with 'jax-attention train bahdanau --checkpoint DIR'")
    missing = [name for name in EXPORT_FILES if not (directory / name).is_file()]
    if missing:
        raise FileNotFoundError(f"checkpoint {str(directory)!r} lacks {', '.join(missing)} "
                                f"(expected {', '.join(EXPORT_FILES)})")
    reader = _Reader(directory)
    record, spec = reader.record()
    model_config, train_config = reader.configs(record, spec)
    src_vocab = reader.vocab("src", model_config.src_vocab_size)
    tgt_vocab = reader.vocab("tgt", model_config.tgt_vocab_size)
    params = reader.params(flatten_params(spec.param_shapes(model_config)))
    return ExportedModel(params=params, src_vocab=src_vocab, tgt_vocab=tgt_vocab, config=record,
                         path=directory, spec=spec, model_config=model_config,
                         train_config=train_config)


# --------------------------------------------------------------------------- earlier names

#: :class:`ExportedModel` under its earlier name (``jax_attention.train.Checkpoint``).
Checkpoint = ExportedModel


def save_checkpoint(directory: str | os.PathLike, params: dict, src_vocab, tgt_vocab,
                    config: dict) -> Path:
    """:func:`save_model` with the model's config as the dict earlier versions took:
    ``{"model": name (default "bahdanau"), <its sizes>, "training": {...}}``.

    Raises:
      ValueError: ``config`` names no registered model or lacks a model size.
    """
    # Exports written before the Transformer carry no "model": they are Bahdanau ones.
    spec = get_model(config.get("model", "bahdanau"))
    model_config = spec.config_class.from_record(config, where="config")
    return save_model(directory, params, src_vocab, tgt_vocab, model_config,
                      training=config.get("training"))


def load_checkpoint(directory: str | os.PathLike) -> ExportedModel:
    """:func:`load_model` under its earlier name."""
    return load_model(directory)
