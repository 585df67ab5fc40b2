"""The named sizes of ``bench train --size``: the model and the data both peers train, in one place.

Each size gives every model's settings (over the book's, :data:`BOOK_MODELS`) and the data's
(``batch_size``, ``num_steps``, ``num_examples``); :func:`train_sizes` resolves a size for one
model, with single settings overridden (``bench train --num-hiddens ...``), and checks the
result against the model's config before anything is built. Both peers of
:func:`jax_attention.bench.train.bench_train` — ours and the PyTorch mirror, eager or compiled —
are built from what it returns (:func:`jax_attention.bench.train.model_config`), so that a size
cannot reach one peer and not the other.

* ``book``: the book's settings (d2l §11.4.3, §11.7.6: width 32, 600 pairs, batch 64, 10
  tokens), ``bench train``'s default.
* ``small``: the Transformer at width 128, FFN 512, 4 heads, 2 + 2 blocks; the Bahdanau model at
  embedding and hidden size 128, 2 GRU layers; 2,000 pairs, batch 128, 20 tokens.
* ``base``: the Transformer at width 256, FFN 1024, 8 heads, 4 + 4 blocks; the Bahdanau model at
  256, 2 layers; 5,000 pairs, batch 128, 20 tokens.
"""

from __future__ import annotations

import dataclasses

from jax_attention._checks import check_int
from jax_attention.models import registry

__all__ = ["BOOK_MODELS", "SIZES", "SIZE_NAMES", "MODEL_OVERRIDES", "DATA_OVERRIDES",
           "train_sizes", "describe_size"]

#: The book's model settings (d2l §11.4.3 and §11.7.6): each config's defaults, less the data's
#: sizes (``num_steps`` and the vocabularies are the run's).
BOOK_MODELS = {name: {key: value for key, value in spec.model_config().record().items()
                      if key not in ("num_steps", "src_vocab_size", "tgt_vocab_size")}
               for name, spec in registry.MODELS.items()}

#: The named sizes: ``{"data": {batch_size, num_steps, num_examples}, "models": {model: its
#: settings over BOOK_MODELS}}``. A model missing from a size's ``"models"`` does not have it.
SIZES = {
    "book": {
        "data": {"batch_size": 64, "num_steps": 10, "num_examples": 600},
        "models": {name: {} for name in BOOK_MODELS},
    },
    "small": {
        "data": {"batch_size": 128, "num_steps": 20, "num_examples": 2000},
        "models": {
            "transformer": {"num_hiddens": 128, "ffn_num_hiddens": 512, "num_heads": 4,
                            "num_layers": 2},
            "bahdanau": {"embed_size": 128, "num_hiddens": 128, "num_layers": 2},
        },
    },
    "base": {
        "data": {"batch_size": 128, "num_steps": 20, "num_examples": 5000},
        "models": {
            "transformer": {"num_hiddens": 256, "ffn_num_hiddens": 1024, "num_heads": 8,
                            "num_layers": 4},
            "bahdanau": {"embed_size": 256, "num_hiddens": 256, "num_layers": 2},
        },
    },
}

#: The names of :data:`SIZES`, in order (the choices of ``bench train --size``).
SIZE_NAMES = tuple(SIZES)
#: The model settings ``bench train`` can override one by one (a flag each: ``--num-hiddens``).
MODEL_OVERRIDES = ("embed_size", "num_hiddens", "ffn_num_hiddens", "num_heads", "num_layers")
#: The data settings it can override (``--batch-size``, ``--num-steps``, ``--num-examples``).
DATA_OVERRIDES = ("batch_size", "num_steps", "num_examples")

# How describe_size names a setting.
_WORDS = {"embed_size": "embed", "num_hiddens": "hidden", "ffn_num_hiddens": "FFN",
          "num_heads": "heads", "num_layers": "layers"}


def train_sizes(model: str, size: str = "book", sizes: dict | None = None, *,
                batch_size: int | None = None, num_steps: int | None = None,
                num_examples: int | None = None) -> dict:
    """The settings ``model`` trains with at ``size``, with single settings overridden.

    Args:
      model: a registered model (:data:`jax_attention.models.registry.MODELS`).
      size: one of :data:`SIZE_NAMES`.
      sizes: model settings over the size's (any field of the model's config, e.g. a tiny
        model for tests, ``dropout=0``).
      batch_size, num_steps, num_examples: the data's, over the size's (``None``: the size's).

    Returns:
      ``{"size", "model": the model's settings (BOOK_MODELS' keys), "batch_size", "num_steps",
      "num_examples"}``.

    Raises:
      ValueError: an unknown size, a size the model does not have, a setting its config does not
        have, or settings its config refuses (``num_heads`` not dividing ``num_hiddens``).
    """
    if size not in SIZES:
        raise ValueError(f"size must be one of {SIZE_NAMES}, got {size!r}")
    spec = registry.get_model(model)
    if model not in SIZES[size]["models"]:
        have = [name for name in SIZE_NAMES if model in SIZES[name]["models"]]
        raise ValueError(f"the {model} model has no size {size!r} (its sizes: "
                         f"{', '.join(have)})")
    fields = {field.name for field in dataclasses.fields(spec.config_class)}
    unknown = sorted(set(sizes or {}) - fields)
    if unknown:
        raise ValueError(f"the {model} model has no {', '.join(unknown)} (its settings: "
                         f"{', '.join(BOOK_MODELS[model])})")
    data = dict(SIZES[size]["data"])
    for name, value in (("batch_size", batch_size), ("num_steps", num_steps),
                        ("num_examples", num_examples)):
        if value is not None:
            data[name] = check_int(name, value, 1)
    settings = {**BOOK_MODELS[model], **SIZES[size]["models"][model], **(sizes or {})}
    spec.model_config(**settings, num_steps=data["num_steps"])  # its own checks
    return {"size": size, "model": settings, **data}


def describe_size(size: str) -> str:
    """One size in words, each model's settings then the data's, e.g. ``"transformer: hidden
    128, FFN 512, heads 4, layers 2+2; ...; batch 128, num_steps 20, 2000 pairs"`` (layers:
    the encoder's + the decoder's)."""
    entry = SIZES[size]
    models = []
    for model in (name for name in BOOK_MODELS if name in entry["models"]):
        settings = entry["models"][model]
        shown = {**{key: BOOK_MODELS[model][key] for key in _WORDS if key in BOOK_MODELS[model]},
                 **settings}
        models.append(f"{model}: " + ", ".join(
            f"{_WORDS[key]} {value}+{value}" if key == "num_layers" else f"{_WORDS[key]} {value}"
            for key, value in shown.items()))
    data = entry["data"]
    return "; ".join(models + [f"batch {data['batch_size']}, num_steps {data['num_steps']}, "
                               f"{data['num_examples']} pairs"])
