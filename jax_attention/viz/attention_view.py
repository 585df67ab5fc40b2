"""Interactive views of attention weights: one self-contained HTML document (its script and style
inline, nothing fetched, so it works from a file on a machine without network), in a notebook, a
docs page or a browser.

:func:`attention_view` is the sibling of :func:`~jax_attention.viz.plotting.show_heatmaps`: the
same weights and labels give a view with a layer selector, a head selector (all heads side by side
or one), the tokens on both axes, the query, key and weight (3 decimals) of the cell under the
pointer, the row of a query under the pointer highlighted, masked positions drawn apart from a
weight of 0, and the PNGs' fixed ``[0, 1]`` colour scale (Matplotlib's ``Reds``) with its legend.
:func:`translation_view` shows a translation: the Transformer's three attentions as tabs, or
Bahdanau's alignment step by step (choose an output token, see the source weights that produced
it). :func:`to_bertviz` and :func:`translation_to_bertviz` export the weights in the layout
bertviz's ``head_view`` / ``model_view`` take, without needing bertviz or PyTorch.

A view renders itself in Jupyter (``_repr_html_``) and :meth:`AttentionView.save` writes it as a
page; :func:`save_views` writes several into one page.
"""

from __future__ import annotations

import functools
import html
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np

from jax_attention._files import write_text_atomically
from jax_attention.viz.language import words
from jax_attention.viz.plotting import translation_title

__all__ = ["AttentionView", "attention_view", "translation_view", "save_views", "to_bertviz",
           "translation_to_bertviz", "COLORMAP"]

#: The colour map of the views: that of the PNG heatmaps (``show_heatmaps``'s default), sampled at
#: 256 levels over the fixed ``[0, 1]`` scale of attention weights.
COLORMAP = "Reds"


@functools.cache
def _asset(name: str) -> str:
    return resources.files("jax_attention.viz").joinpath("static", name).read_text(encoding="utf-8")


@functools.cache
def _colors() -> tuple[str, ...]:
    from matplotlib import colormaps
    from matplotlib.colors import to_hex

    cmap = colormaps[COLORMAP]
    return tuple(to_hex(cmap(i / 255)) for i in range(256))


def _values(array: np.ndarray) -> list:
    """Nested lists of the weights as JSON numbers (NaN as ``null``): float64 as they are, other
    dtypes as their float32 value's shortest decimal, which reads back to the same float32."""
    nan = np.isnan(array)
    if array.dtype == np.float64:
        values = array.astype(object)
    else:
        shortest = np.vectorize(lambda x: float(np.format_float_positional(x, unique=True)),
                                otypes=[object])
        values = shortest(array.astype(np.float32))
    values[nan] = None
    return values.tolist()


def _labels(name: str, labels, length: int, axis: str, shape: tuple) -> list[str]:
    labels = [str(label) for label in labels]
    if len(labels) != length:
        raise ValueError(f"{name} has {len(labels)} labels for the {length} {axis} of weights of "
                         f"shape {shape}")
    return labels


def _as_weights(weights, allow_nan: bool) -> np.ndarray:
    """``weights`` of shape ``(S,)``, ``(T, S)``, ``(N, T, S)`` or ``(L, N, T, S)`` as a 4-D
    NumPy array, checked."""
    try:
        array = np.asarray(weights)
    except (TypeError, ValueError) as error:
        raise TypeError(f"weights must be an array of numbers, got {type(weights).__name__}") from error
    if array.dtype.name == "bfloat16":  # JAX's, which NumPy does not count as floating
        array = array.astype(np.float32)
    if array.dtype == object or not (np.issubdtype(array.dtype, np.floating)
                                     or np.issubdtype(array.dtype, np.integer)):
        raise TypeError(f"weights must be real numbers, got dtype {array.dtype}")
    if not 1 <= array.ndim <= 4 or 0 in array.shape:
        raise ValueError("weights must have shape (S,), (T, S), (N, T, S) or (L, N, T, S) with no "
                         f"empty axis, got {array.shape}")
    if array.dtype.itemsize < 4 or np.issubdtype(array.dtype, np.integer):
        array = array.astype(np.float32)
    for bad, what, hint in ((np.isinf(array), "infinite", ""),
                            (np.isnan(array) & (not allow_nan), "NaN",
                             "; pass allow_nan=True to draw NaN as NaN")):
        if bad.any():
            where = tuple(int(i) for i in np.argwhere(bad)[0])
            raise ValueError(f"weights of shape {array.shape} hold {int(bad.sum())} {what} values "
                             f"(the first at {where}){hint}")
    return array.reshape((1,) * (4 - array.ndim) + array.shape)


def _as_mask(mask, shape: tuple) -> np.ndarray | None:
    if mask is None:
        return None
    mask = np.asarray(mask)
    if mask.dtype != np.bool_:
        raise TypeError(f"mask must be boolean (True = may attend), got dtype {mask.dtype}")
    try:
        return np.broadcast_to(mask.reshape((1,) * max(0, 4 - mask.ndim) + mask.shape), shape)
    except ValueError:
        raise ValueError(f"mask of shape {mask.shape} does not broadcast to the weights' shape "
                         f"{shape}") from None


@dataclass(frozen=True)
class _Tab:
    """One set of weights of a view, ``(L, N, T, S)``, with its labels."""

    name: str
    weights: np.ndarray
    queries: list[str]
    keys: list[str]
    masked: np.ndarray | None = None
    xlabel: str = "Keys"
    ylabel: str = "Queries"
    layers: list[str] = field(default_factory=list)
    heads: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"name": self.name, "weights": _values(self.weights), "queries": self.queries,
                "keys": self.keys, "xlabel": self.xlabel, "ylabel": self.ylabel,
                "masked": None if self.masked is None else self.masked.astype(int).tolist(),
                "has_nan": bool(np.isnan(self.weights).any()), "layers": self.layers,
                "heads": self.heads}


def _tab(name: str, weights, queries, keys, *, text, mask=None, xlabel: str, ylabel: str,
         layer_names=None, head_names=None, allow_nan: bool = False) -> _Tab:
    array = _as_weights(weights, allow_nan)
    shape = np.shape(weights)
    L, N, T, S = array.shape
    keep = _as_mask(mask, array.shape)
    layers = ([text["layer"].format(n=i) for i in range(1, L + 1)] if layer_names is None
              else layer_names)
    heads = [text["head"].format(n=i) for i in range(1, N + 1)] if head_names is None else head_names
    return _Tab(name, array, _labels("queries", queries, T, "queries (T)", shape),
                _labels("keys", keys, S, "keys (S)", shape),
                None if keep is None else ~keep, xlabel, ylabel,
                _labels("layer_names", layers, L, "layers (L)", shape),
                _labels("head_names", heads, N, "heads (N)", shape))


@dataclass(frozen=True, repr=False)
class AttentionView:
    """An interactive view of attention weights: tabs of ``(L, N, T, S)`` weights and, for a
    Bahdanau translation, its steps. Built by :func:`attention_view` or :func:`translation_view`;
    shows itself in Jupyter, :attr:`html` is the fragment to embed in a page and :meth:`save`
    writes a whole page. ``language`` (``"en"`` or ``"zh"``) is that of the view's controls and
    legend."""

    tabs: tuple[_Tab, ...]
    title: str | None = None
    steps: dict | None = None
    language: str = "en"

    @property
    def html(self) -> str:
        """The view as an HTML fragment (a ``div`` with its style, data and script inline)."""
        text = {key[len("view_"):]: value for key, value in words(self.language).items()
                if key.startswith("view_")}
        data = {"title": self.title, "colors": list(_colors()), "text": text,
                "tabs": [tab.to_json() for tab in self.tabs], "steps": self.steps}
        payload = json.dumps(data, ensure_ascii=False, separators=(",", ":")).replace("</", "<\\/")
        return (f'<div class="ja-view"><style>{_asset("attention_view.css")}</style>'
                f'<script type="application/json" class="ja-view-data">{payload}</script>'
                f'<div class="ja-view-body"></div><script>{_asset("attention_view.js")}</script></div>')

    def _repr_html_(self) -> str:
        return self.html

    def __repr__(self) -> str:
        tabs = ", ".join(f"{tab.name} {tab.weights.shape}" for tab in self.tabs)
        steps = f", {len(self.steps['outputs'])} steps" if self.steps else ""
        return f"AttentionView({self.title!r}: {tabs}{steps})"

    def save(self, path: str | os.PathLike) -> Path:
        """Write the view as a self-contained HTML page (atomically); returns the path."""
        return save_views(path, [self], title=self.title)


def save_views(path: str | os.PathLike, views: Sequence[AttentionView], *,
               title: str | None = None) -> Path:
    """Write ``views`` one below the other as one self-contained HTML page, atomically (the file
    is whole or untouched), in the language of the first view; returns the path."""
    language = views[0].language if views else "en"
    heading = html.escape(title or words(language)["page_title"])
    page = (f'<!DOCTYPE html>\n<html lang="{"zh-CN" if language == "zh" else "en"}">\n<head>\n'
            '<meta charset="utf-8">\n'
            '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f"<title>{heading}</title>\n</head>\n<body>\n"
            + "\n".join(view.html for view in views) + "\n</body>\n</html>\n")
    return write_text_atomically(path, page)


def attention_view(weights, queries: Sequence[str], keys: Sequence[str], *, mask=None,
                   title: str | None = None, xlabel: str | None = None,
                   ylabel: str | None = None, layer_names: Sequence[str] | None = None,
                   head_names: Sequence[str] | None = None,
                   allow_nan: bool = False, language: str = "en") -> AttentionView:
    """An interactive view of attention weights — :func:`~jax_attention.viz.plotting.show_heatmaps`
    as a page: a layer selector, a head selector, the tokens on both axes, the weight under the
    pointer, masked positions drawn apart from a weight of 0, the fixed ``[0, 1]`` colour scale.

    >>> weights = np.full((2, 3, 4), 0.25)                 # (heads N, queries T, keys S)
    >>> view = attention_view(weights, ["je", "suis", "<eos>"], ["i'm", "home", ".", "<eos>"],
    ...                       title="uniform")
    >>> view                      # last in a notebook cell, the view itself is shown
    AttentionView('uniform': Attention weights (1, 2, 3, 4))

    ``view.save("attention.html")`` writes it as a page.

    Args:
      weights: ``(S,)``, ``(T, S)``, ``(N, T, S)`` or ``(L, N, T, S)`` (layers, heads, queries,
        keys), any real dtype; NaN is refused unless ``allow_nan``.
      queries: ``T`` labels (the query tokens), ``keys``: ``S`` labels.
      mask: boolean, True where a query may attend a key, broadcastable to the weights (e.g.
        ``(T, S)`` or ``(L, N, T, S)``); False positions are drawn as masked. ``None``: none is.
      title: shown above the view.
      xlabel, ylabel: names of the key and query axes; ``None``: "Keys" and "Queries" (in
        ``language``).
      layer_names, head_names: ``L`` and ``N`` names (default ``"Layer 1"``, ``"Head 1"``...).
      allow_nan: draw NaN weights as NaN instead of raising.
      language: ``"en"`` or ``"zh"``: the view's own words (its controls, legend and default
        names; :mod:`jax_attention.viz.language`).

    Returns:
      An :class:`AttentionView`.

    Raises:
      ValueError: weights of another rank or with an empty axis; labels or names whose number
        does not match the weights' axis (naming both); a mask that does not broadcast; NaN
        without ``allow_nan``, or infinite weights; a language not in ``("en", "zh")``.
      TypeError: weights that are not real numbers; a mask that is not boolean.
    """
    text = words(language)
    tab = _tab(text["attention_weights"], weights, queries, keys, text=text, mask=mask,
               xlabel=text["keys"] if xlabel is None else xlabel,
               ylabel=text["queries"] if ylabel is None else ylabel,
               layer_names=layer_names, head_names=head_names, allow_nan=allow_nan)
    return AttentionView((tab,), title, language=language)


def _transformer_view(t, language: str) -> AttentionView:
    text = words(language)
    inputs = t.decoder_inputs  # the decoder reads <bos> and its own predictions
    steps = len(inputs)
    causal = np.tril(np.ones((steps, steps), bool))
    tabs = (_tab(text["encoder_self"], t.encoder_self, t.source_tokens, t.source_tokens,
                 text=text, xlabel=text["source_keys"], ylabel=text["source_queries"]),
            _tab(text["decoder_self"], t.decoder_self, inputs, inputs, mask=causal, text=text,
                 xlabel=text["decoder_keys"], ylabel=text["decoder_queries"]),
            _tab(text["encoder_decoder"], t.encoder_decoder, inputs, t.source_tokens, text=text,
                 xlabel=text["source_keys_tokens"], ylabel=text["decoder_queries"]))
    return AttentionView(tabs, text["transformer_view_title"].format(title=translation_title(t)),
                         language=language)


def _bahdanau_view(t, language: str) -> AttentionView:
    text = words(language)
    outputs = t.output_tokens
    weights = np.asarray(t.weights)
    tab = _tab(text["bahdanau_attention"], weights, outputs, t.source_tokens, text=text,
               xlabel=text["source_keys_tokens"], ylabel=text["translation_queries"],
               head_names=[text["additive_attention"]])
    steps = {"outputs": outputs, "source": list(t.source_tokens), "weights": _values(weights)}
    return AttentionView((tab,), text["bahdanau_view_title"].format(title=translation_title(t)),
                         steps, language)


def translation_view(translation, *, language: str = "en") -> AttentionView:
    """The interactive view of one translation (a result of a model's ``translate``).

    The Transformer's: three tabs — encoder self-attention ``(L, N, S, S)``, decoder
    self-attention ``(L, N, steps, steps)`` (its causal mask drawn as masked) and encoder–decoder
    attention ``(L, N, steps, S)`` — with a layer and a head selector each. Bahdanau's: the output
    tokens in order; choosing one shows the source weights that produced it (the book's §11.4
    alignment, one step at a time), above the whole weights table.

    >>> t = jax_attention.load_model("runs/transformer").translate("i lost .")
    >>> translation_view(t).save("i-lost.html")    # or leave it last in a notebook cell

    ``language`` (``"en"`` or ``"zh"``) is that of the view's own words: tabs, axes, controls.
    """
    view = _transformer_view if getattr(translation, "encoder_decoder", None) is not None \
        else _bahdanau_view
    return view(translation, language)


def to_bertviz(weights) -> list[np.ndarray]:
    """Weights in the layout bertviz's ``head_view(attention, tokens)`` takes: a list over layers
    of ``(batch, heads, queries, keys)`` arrays (here ``batch = 1``).

    Args:
      weights: ``(L, N, T, S)``, ``(N, T, S)`` (one layer) or ``(T, S)`` (one layer, one head).

    Returns:
      ``L`` float32 NumPy arrays of shape ``(1, N, T, S)``; with PyTorch, ``[torch.from_numpy(a)
      for a in ...]`` is what bertviz reads.
    """
    array = _as_weights(weights, allow_nan=True)
    if np.ndim(weights) == 1:
        raise ValueError(f"weights must have shape (T, S), (N, T, S) or (L, N, T, S), got "
                         f"{np.shape(weights)}")
    return [layer[None].astype(np.float32) for layer in array]


def translation_to_bertviz(translation) -> dict:
    """A Transformer translation as the keyword arguments of bertviz's ``model_view``:
    ``encoder_attention``, ``decoder_attention``, ``cross_attention`` (each :func:`to_bertviz`'s
    list over layers), ``encoder_tokens`` (the source tokens read) and ``decoder_tokens`` (the
    decoder's inputs, ``<bos>`` first)."""
    t = translation
    if getattr(t, "encoder_decoder", None) is None:
        raise ValueError("translation_to_bertviz needs a Transformer translation (with "
                         "encoder_self, decoder_self and encoder_decoder weights)")
    return {"encoder_attention": to_bertviz(t.encoder_self),
            "decoder_attention": to_bertviz(t.decoder_self),
            "cross_attention": to_bertviz(t.encoder_decoder),
            "encoder_tokens": list(t.source_tokens), "decoder_tokens": t.decoder_inputs}
