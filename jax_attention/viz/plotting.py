"""Figures of the attention chapter: heatmaps of attention weights, kernel-regression fits, curves.

Every function builds its own :class:`matplotlib.figure.Figure` with an Agg canvas and never
touches ``pyplot``: no global figure registry, no interactive backend, so it runs headless (CI, a
remote GPU box) and concurrently, and the figures are freed like any other object. Each function
returns the Figure and, given ``path``, also writes it there as a PNG (creating parent folders);
``bahdanau_attention_plots`` and ``transformer_attention_plots`` write a trained model's attention
figures of one translation into a folder and return ``{name: path}``.

Arrays may be NumPy or JAX arrays of any float dtype (bfloat16 included); they are copied to
float64 NumPy before plotting.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from jax_attention._files import write_file_atomically
from jax_attention.viz.language import cjk_fonts, words

__all__ = [
    "show_heatmaps",
    "plot_kernel_regression",
    "plot_curve",
    "plot_positional_columns",
    "plot_positional_heatmap",
    "translation_heatmap",
    "translation_title",
    "layer_head_heatmaps",
    "bahdanau_attention_plots",
    "transformer_attention_plots",
    "transformer_attention_figures",
    "save_figure",
]

# Resolution of the written PNGs; the book's figures are vector graphics, and 150 dpi keeps the
# 50 × 50 weight matrices readable while the files stay small.
DPI = 150


def save_figure(fig: Figure, path: str | os.PathLike) -> Path:
    """Write ``fig`` to ``path`` as a PNG, creating the parent folders; returns the path.

    The image goes to a temporary file beside ``path`` that then replaces it
    (:func:`jax_attention._files.write_file_atomically`), so that a stopped or failed write (a
    full disk) never leaves half an image or destroys the one there before.
    """
    return write_file_atomically(path, lambda temporary: fig.savefig(temporary, format="png",
                                                                     dpi=DPI))


def _new_figure(figsize) -> Figure:
    cjk_fonts()  # Chinese labels, the figures' own or the caller's, fall back to a CJK font
    fig = Figure(figsize=figsize, layout="constrained")
    # An explicit Agg canvas: savefig then never consults (or switches) the global backend.
    FigureCanvasAgg(fig)
    return fig


def _as_float_array(name: str, x) -> np.ndarray:
    """``x`` as float64 NumPy; JAX arrays (even bfloat16) convert through ``np.asarray``."""
    try:
        return np.asarray(x).astype(np.float64)
    except (TypeError, ValueError):
        raise TypeError(
            f"{name} must be a numeric array, got {type(x).__name__} {np.shape(x)}"
        ) from None


def _as_vector(name: str, x, length: int | None = None, like: str | None = None) -> np.ndarray:
    x = _as_float_array(name, x)
    if x.ndim != 1:
        raise ValueError(f"{name} must have shape (n,), got {x.shape}")
    if length is not None and x.shape[0] != length:
        raise ValueError(
            f"{name} must have the length of {like} ({length},), got shape {x.shape}"
        )
    return x


def _check_labels(name: str, labels, length: int, axis: str):
    if labels is None:
        return None
    labels = [str(label) for label in labels]
    if len(labels) != length:
        raise ValueError(f"{name} must have one entry per {axis}, got {len(labels)}")
    return labels


def show_heatmaps(matrices, xlabel: str, ylabel: str, titles: Sequence[str] | None = None,
                  figsize=(2.5, 2.5), cmap: str = "Reds", *, path: str | os.PathLike | None = None,
                  xticklabels: Sequence[str] | None = None,
                  yticklabels: Sequence[str] | None = None,
                  row_titles: Sequence[str] | None = None, suptitle: str | None = None,
                  vmin: float | None = 0.0, vmax: float | None = 1.0) -> Figure:
    """A grid of attention-weight heatmaps with one colour bar — d2l §11.1 ``show_heatmaps``.

    ``matrices[i, j]`` is drawn in row ``i``, column ``j`` (e.g. layer ``i``, head ``j``); all
    heatmaps share their axes and one colour scale, by default the fixed ``[0, 1]`` of attention
    weights, so that the colours mean the same in every panel and every figure (the book's
    version scales each figure to its own range). ``xlabel`` goes under the bottom row,
    ``ylabel`` beside the left column, ``titles[j]`` above column ``j``, ``row_titles[i]`` beside
    row ``i`` and ``suptitle`` above the whole figure.

    >>> import numpy as np
    >>> weights = np.full((2, 4, 3, 5), 0.2)               # (layers, heads, T, S)
    >>> fig = show_heatmaps(weights, "keys", "queries",
    ...                     titles=[f"Head {n}" for n in range(1, 5)],
    ...                     row_titles=["Layer 1", "Layer 2"],
    ...                     xticklabels=["i", "lost", ".", "<eos>", "<pad>"],
    ...                     yticklabels=["j'ai", "perdu", "."],
    ...                     suptitle="encoder-decoder attention", path="attention.png")

    Args:
      matrices: ``(rows, cols, T, S)``, e.g. ``(1, 1, T, S)`` for one weight matrix or
        ``(layers, heads, T, S)`` for multi-head attention.
      xlabel: label of the key axis ``S``.
      ylabel: label of the query axis ``T``.
      titles: ``cols`` column titles (e.g. ``"Head 1"``), or ``None``.
      figsize: ``(width, height)`` in inches of ONE heatmap; the figure is ``cols`` × ``rows`` of
        them, so the book's default ``(2.5, 2.5)`` gives the book's figure for a single matrix.
      cmap: a Matplotlib colour-map name.
      path: where to write the PNG, or ``None``.
      xticklabels: ``S`` labels (e.g. the source tokens), one tick per key; ``None``: automatic
        ticks.
      yticklabels: ``T`` labels, one tick per query; ``None``: automatic ticks.
      row_titles: ``rows`` labels (e.g. ``"Layer 1"``), written above the ``ylabel`` of each row.
      suptitle: the figure's title (what it shows), or ``None``.
      vmin, vmax: the colour scale; ``None`` for the data's minimum or maximum (use it for
        matrices that are not attention weights, e.g. a positional encoding).

    Returns:
      The :class:`~matplotlib.figure.Figure`, of ``cols * width`` × ``rows * height`` inches.
    """
    matrices = _as_float_array("matrices", matrices)
    if matrices.ndim != 4 or 0 in matrices.shape:
        raise ValueError(
            f"matrices must have shape (rows, cols, T, S) with no empty axis, got {matrices.shape}"
        )
    num_rows, num_cols, T, S = matrices.shape
    of_shape = f"for matrices of shape {matrices.shape}"
    titles = _check_labels("titles", titles, num_cols, f"column ({num_cols} {of_shape})")
    row_titles = _check_labels("row_titles", row_titles, num_rows, f"row ({num_rows} {of_shape})")
    xticklabels = _check_labels("xticklabels", xticklabels, S, f"key ({S} {of_shape})")
    yticklabels = _check_labels("yticklabels", yticklabels, T, f"query ({T} {of_shape})")
    width, height = figsize
    fig = _new_figure((num_cols * width, num_rows * height))
    axes = fig.subplots(num_rows, num_cols, sharex=True, sharey=True, squeeze=False)
    finite = matrices[np.isfinite(matrices)]
    low, high = (finite.min(), finite.max()) if finite.size else (0.0, 1.0)
    vmin = low if vmin is None else vmin
    vmax = high if vmax is None else vmax
    for i, (row_axes, row_matrices) in enumerate(zip(axes, matrices)):
        for j, (ax, matrix) in enumerate(zip(row_axes, row_matrices)):
            image = ax.imshow(matrix, cmap=cmap, vmin=vmin, vmax=vmax)
            if i == num_rows - 1:
                ax.set_xlabel(xlabel)
            if j == 0:
                ax.set_ylabel(ylabel if row_titles is None else f"{row_titles[i]}\n{ylabel}")
            if titles is not None:
                ax.set_title(titles[j])
            if xticklabels is not None:
                ax.set_xticks(range(S), labels=xticklabels, rotation=90)
            if yticklabels is not None:
                ax.set_yticks(range(T), labels=yticklabels)
    fig.colorbar(image, ax=axes, shrink=0.6)
    if suptitle is not None:
        fig.suptitle(suptitle)
    if path is not None:
        save_figure(fig, path)
    return fig


def plot_kernel_regression(x_train, y_train, x_test, y_truth, y_hat, *,
                           path: str | os.PathLike | None = None, title: str | None = None,
                           language: str = "en") -> Figure:
    """The book's kernel-regression figure — d2l §11.2 ``plot_kernel_reg``.

    The true function ("Truth") and the prediction ("Pred") as lines over the test inputs, the
    noisy training points as translucent circles, on the book's window ``x in [0, 5]``,
    ``y in [-1, 5]``.

    Args:
      x_train: ``(n_train,)`` training inputs.
      y_train: ``(n_train,)`` noisy training targets.
      x_test: ``(n_test,)`` test inputs.
      y_truth: ``(n_test,)`` noise-free targets at ``x_test``.
      y_hat: ``(n_test,)`` predictions at ``x_test``.
      path: where to write the PNG, or ``None``.
      title: a title above the plot, or ``None``.
      language: ``"en"`` or ``"zh"``, of the legend (:mod:`jax_attention.viz.language`).

    Returns:
      The :class:`~matplotlib.figure.Figure`.
    """
    text = words(language)
    x_train = _as_vector("x_train", x_train)
    y_train = _as_vector("y_train", y_train, x_train.shape[0], "x_train")
    x_test = _as_vector("x_test", x_test)
    y_truth = _as_vector("y_truth", y_truth, x_test.shape[0], "x_test")
    y_hat = _as_vector("y_hat", y_hat, x_test.shape[0], "x_test")
    fig = _new_figure((3.5, 2.5))  # d2l.plot's default size
    ax = fig.subplots()
    ax.plot(x_test, y_truth, "-", label=text["truth"])
    ax.plot(x_test, y_hat, "m--", label=text["prediction"])
    ax.plot(x_train, y_train, "o", alpha=0.5)
    ax.set_xlabel("x")
    ax.set_ylabel("y")
    ax.set_xlim(0, 5)
    ax.set_ylim(-1, 5)
    ax.legend()
    ax.grid(True)
    if title is not None:
        ax.set_title(title)
    if path is not None:
        save_figure(fig, path)
    return fig


def plot_curve(values, *, xlabel: str | None = None, ylabel: str | None = None,
               path: str | os.PathLike | None = None, title: str | None = None,
               language: str = "en") -> Figure:
    """A training curve: ``values[i]`` at ``x = i + 1`` (epochs count from 1, as in the logs).

    Args:
      values: ``(n,)`` with ``n >= 1``, e.g. the loss of each epoch.
      xlabel: label of the horizontal axis; ``None``: "epoch" (in ``language``).
      ylabel: label of the vertical axis; ``None``: "loss" (in ``language``).
      path: where to write the PNG, or ``None``.
      title: a title above the plot, or ``None``.
      language: ``"en"`` or ``"zh"``, of the default labels.

    Returns:
      The :class:`~matplotlib.figure.Figure`.
    """
    text = words(language)
    xlabel = text["epoch"] if xlabel is None else xlabel
    ylabel = text["loss"] if ylabel is None else ylabel
    values = _as_vector("values", values)
    if values.shape[0] == 0:
        raise ValueError(f"values must hold at least one point, got shape {values.shape}")
    fig = _new_figure((3.5, 2.5))
    ax = fig.subplots()
    # Markers so that short runs (the book's 5 epochs, or a single one) stay visible.
    ax.plot(np.arange(1, values.shape[0] + 1), values, "-o", markersize=3)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # no "epoch 2.5" ticks
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True)
    if title is not None:
        ax.set_title(title)
    if path is not None:
        save_figure(fig, path)
    return fig


# d2l.plot's line formats, cycled over the curves.
_LINE_FORMATS = ("-", "m--", "g-.", "r:")


def _as_table(name: str, P) -> np.ndarray:
    P = _as_float_array(name, P)
    if P.ndim != 2 or 0 in P.shape:
        raise ValueError(f"{name} must have shape (T, D) with no empty axis, got {P.shape}")
    return P


def plot_positional_columns(P, columns: Sequence[int] = (6, 7, 8, 9), *,
                            path: str | os.PathLike | None = None, language: str = "en"
                            ) -> Figure:
    """Columns of a positional-encoding table over the positions — d2l §11.6.3, first figure.

    The book draws columns 6 to 9 of ``positional_encoding(60, 32)``: two (sin, cos) pairs whose
    frequency falls with the column index.

    Args:
      P: ``(T, D)``, e.g. :func:`jax_attention.nn.positional.positional_encoding`.
      columns: the column indices to draw, each in ``[0, D)``; one curve each, labelled
        ``"Col c"``.
      path: where to write the PNG, or ``None``.
      language: ``"en"`` or ``"zh"``, of the labels and the title.

    Returns:
      The :class:`~matplotlib.figure.Figure` (6 × 2.5 inches, as in the book).
    """
    text = words(language)
    P = _as_table("P", P)
    columns = [int(c) for c in columns]
    if not columns or any(not 0 <= c < P.shape[1] for c in columns):
        raise ValueError(
            f"columns must be a non-empty list of indices in [0, D) = [0, {P.shape[1]}) for P of "
            f"shape {P.shape}, got {columns}"
        )
    fig = _new_figure((6, 2.5))
    ax = fig.subplots()
    positions = np.arange(P.shape[0])
    for i, column in enumerate(columns):
        ax.plot(positions, P[:, column], _LINE_FORMATS[i % len(_LINE_FORMATS)], label=text["column"].format(n=column))
    ax.set_xlabel(text["row_position"])
    ax.set_ylabel(text["encoding_value"])
    ax.set_title(text["positional_columns_title"].format(T=P.shape[0], D=P.shape[1],
                                                         columns=", ".join(map(str, columns))))
    ax.set_xlim(0, P.shape[0] - 1 if P.shape[0] > 1 else 1)
    ax.legend()
    ax.grid(True)
    if path is not None:
        save_figure(fig, path)
    return fig


def plot_positional_heatmap(P, *, path: str | os.PathLike | None = None,
                            language: str = "en") -> Figure:
    """A positional-encoding table as a heatmap — d2l §11.6.3, second figure.

    The book's ``show_heatmaps(P, xlabel='Column (encoding dimension)', ylabel='Row (position)',
    figsize=(3.5, 4), cmap='Blues')`` for ``P = positional_encoding(60, 32)``: the left columns
    alternate quickly down the positions, the right ones hardly change.

    Args:
      P: ``(T, D)``.
      path: where to write the PNG, or ``None``.
      language: ``"en"`` or ``"zh"``, of the labels and the title.

    Returns:
      The :class:`~matplotlib.figure.Figure` (3.5 × 4 inches).
    """
    text = words(language)
    P = _as_table("P", P)
    return show_heatmaps(P[None, None], xlabel=text["column_dimension"],
                         ylabel=text["row_position"], figsize=(3.5, 4), cmap="Blues", path=path,
                         vmin=-1.0, vmax=1.0,
                         suptitle=text["positional_heatmap_title"].format(T=P.shape[0],
                                                                          D=P.shape[1]))


# --------------------------------------------------------------------------- one translation's weights


def translation_title(translation) -> str:
    """``“source” → “translation”`` of a translation result, for a figure's or a view's title."""
    return f"\u201c{translation.source}\u201d \u2192 \u201c{translation.translation}\u201d"


def translation_heatmap(translation, path: str | os.PathLike | None = None, *,
                        title: str | None = None, language: str = "en") -> Figure:
    """The book's heatmap of one translation's attention weights, with the tokens as tick labels:
    the source tokens read (keys) across, the predicted tokens and ``<eos>`` (queries) down,
    on the fixed ``[0, 1]`` colour scale.

    The default title names the model and what is drawn — Bahdanau's additive attention, or the
    Transformer's last-layer encoder–decoder attention averaged over the heads (the
    translation's ``weights``) — and the sentence with its translation.

    >>> model = jax_attention.load_model("runs/transformer")
    >>> fig = translation_heatmap(model.translate("go ."), "go.png")

    Args:
      translation: a translation result with ``weights`` ``(steps, S)``, ``source_tokens``
        (``S`` of them), ``tokens`` (the predicted ones) and ``finished`` (whether ``<eos>``
        was predicted, the last query then); a Transformer's also has ``encoder_decoder``
        ``(L, N, steps, S)``.
      path: where to write the PNG, or ``None``.
      title: the figure's title instead of the default one.
      language: ``"en"`` or ``"zh"``, of the labels and the default title.

    Returns:
      The :class:`~matplotlib.figure.Figure`.
    """
    text = words(language)
    steps, keys = translation.weights.shape
    queries = translation.output_tokens
    if title is None:
        cross = getattr(translation, "encoder_decoder", None)
        what = (text["bahdanau_attention"] if cross is None else
                text["last_layer_mean"].format(L=cross.shape[0], N=cross.shape[1]))
        title = f"{what}\n{translation_title(translation)}"
    return show_heatmaps(translation.weights[None, None], xlabel=text["source_keys_tokens"],
                         ylabel=text["translation_queries"],
                         figsize=(max(3.5, 0.45 * keys + 1.2), max(3.0, 0.35 * steps + 1.8)),
                         xticklabels=translation.source_tokens, yticklabels=queries,
                         suptitle=title, path=path)


def layer_head_heatmaps(weights, path: str | os.PathLike | None = None, *, xlabel: str,
                        ylabel: str, xticks: Sequence[str], yticks: Sequence[str],
                        title: str | None = None, language: str = "en") -> Figure:
    """``(L, N, T, S)`` weights as a grid, one row per layer (block) and one column per head,
    with the tokens as tick labels, ``"Layer l"`` beside each row and ``"Head n"`` above each
    column: :func:`show_heatmaps` with those options.

    >>> t = jax_attention.load_model("runs/transformer").translate("go .")
    >>> fig = layer_head_heatmaps(t.encoder_self, "enc.png", xlabel="Keys", ylabel="Queries",
    ...                           xticks=t.source_tokens, yticks=t.source_tokens)

    Args:
      weights: ``(L, N, T, S)``.
      path: where to write the PNG, or ``None``.
      xlabel, ylabel: labels of the key axis ``S`` and the query axis ``T``.
      xticks, yticks: ``S`` and ``T`` tick labels (tokens).
      title: the figure's title, or ``None``.
      language: ``"en"`` or ``"zh"``, of the row and column titles (``"Layer l"``, ``"Head n"``).

    Returns:
      The :class:`~matplotlib.figure.Figure`.
    """
    text = words(language)
    L, N, T, S = np.shape(weights)
    return show_heatmaps(weights, xlabel=xlabel, ylabel=ylabel,
                         titles=[text["head"].format(n=n) for n in range(1, N + 1)],
                         row_titles=[text["layer"].format(n=layer) for layer in range(1, L + 1)],
                         xticklabels=xticks, yticklabels=yticks, suptitle=title,
                         # tall enough for "Layer l" above the query label, even for T = 1
                         figsize=(max(2.0, 0.4 * S + 1.0), max(2.8, 0.35 * T + 1.0)), path=path)


def bahdanau_attention_plots(translation, out_dir: str | os.PathLike, *,
                             language: str = "en") -> dict[str, Path]:
    """The book's figure of a Bahdanau translation (d2l §11.4): its weights as
    :func:`translation_heatmap` (in ``language``, ``"en"`` or ``"zh"``), written to
    ``out_dir/bahdanau_attention.png``.

    Returns:
      ``{"attention": path}``.
    """
    plots = {"attention": Path(out_dir) / "bahdanau_attention.png"}
    translation_heatmap(translation, plots["attention"], language=language)
    return plots


def transformer_attention_plots(translation, out_dir: str | os.PathLike, *,
                                language: str = "en") -> dict[str, Path]:
    """The book's figures of a Transformer translation (d2l §11.7.6): the encoder
    self-attention, the decoder self-attention and the encoder–decoder attention, every layer
    (row) and head (column), as :func:`layer_head_heatmaps`, written into ``out_dir``.

    Args:
      translation: a Transformer translation result, with ``encoder_self`` ``(L, N, S, S)``,
        ``decoder_self`` ``(L, N, T, T)`` and ``encoder_decoder`` ``(L, N, T, S)`` weights
        besides the tokens of :func:`translation_heatmap`.
      out_dir: the folder of the PNGs.
      language: ``"en"`` or ``"zh"``, of the labels and titles.

    Returns:
      ``{"encoder_self", "decoder_self", "encoder_decoder": path}``, the files
      ``transformer_encoder_self_attention.png``, ``transformer_decoder_self_attention.png`` and
      ``transformer_encoder_decoder_attention.png``.
    """
    figures = transformer_attention_figures(translation, out_dir, language=language)
    for _, draw in figures.values():
        draw()
    return {name: path for name, (path, _) in figures.items()}


def transformer_attention_figures(translation, out_dir: str | os.PathLike, *,
                                  language: str = "en"
                                  ) -> dict[str, tuple[Path, functools.partial]]:
    """The figures of :func:`transformer_attention_plots`, not drawn yet: ``{name: (path,
    draw)}``, ``draw()`` drawing the figure and writing it to ``path``. Each ``draw`` is a
    :func:`functools.partial` of :func:`layer_head_heatmaps` on NumPy arrays and strings: it
    pickles, so another process can draw it (``jax-attention train`` draws them in two).
    ``language`` (``"en"`` or ``"zh"``) is that of the labels and titles.
    """
    text = words(language)
    out_dir = Path(out_dir)
    t = translation
    inputs = list(t.decoder_inputs)  # the decoder reads <bos> and its own predictions
    title = translation_title(t)
    figures = {
        "encoder_self": (t.encoder_self, "transformer_encoder_self_attention.png",
                         (text["key_positions"], text["query_positions"], t.source_tokens,
                          t.source_tokens), text["encoder_self_all"]),
        "decoder_self": (t.decoder_self, "transformer_decoder_self_attention.png",
                         (text["key_positions"], text["query_positions"], inputs, inputs),
                         text["decoder_self_all"]),
        "encoder_decoder": (t.encoder_decoder, "transformer_encoder_decoder_attention.png",
                            (text["source_keys_tokens"], text["decoder_queries"],
                             t.source_tokens, inputs), text["encoder_decoder_all"]),
    }
    return {name: (out_dir / file, functools.partial(
        layer_head_heatmaps, np.asarray(weights), out_dir / file, xlabel=xlabel, ylabel=ylabel,
        xticks=list(xticks), yticks=list(yticks), title=f"{what}\n{title}", language=language))
        for name, (weights, file, (xlabel, ylabel, xticks, yticks), what) in figures.items()}
