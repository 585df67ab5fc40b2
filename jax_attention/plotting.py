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

import os
import uuid
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

__all__ = [
    "show_heatmaps",
    "plot_kernel_regression",
    "plot_curve",
    "plot_positional_columns",
    "plot_positional_heatmap",
    "translation_heatmap",
    "layer_head_heatmaps",
    "bahdanau_attention_plots",
    "transformer_attention_plots",
    "save_figure",
]

# Resolution of the written PNGs; the book's figures are vector graphics, and 150 dpi keeps the
# 50 × 50 weight matrices readable while the files stay small.
DPI = 150


def save_figure(fig: Figure, path: str | os.PathLike) -> Path:
    """Write ``fig`` to ``path`` as a PNG, creating the parent folders; returns the path.

    The image goes to a temporary file beside ``path`` that then replaces it, so that a stopped
    or failed write (a full disk) never leaves half an image or destroys the one there before.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        fig.savefig(temporary, format="png", dpi=DPI)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return path


def _new_figure(figsize) -> Figure:
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


def show_heatmaps(matrices, xlabel: str, ylabel: str, titles: Sequence[str] | None = None,
                  figsize=(2.5, 2.5), cmap: str = "Reds", *, path: str | os.PathLike | None = None
                  ) -> Figure:
    """A grid of attention-weight heatmaps with one colour bar — d2l §11.1 ``show_heatmaps``.

    ``matrices[i, j]`` is drawn in row ``i``, column ``j``; all heatmaps share their axes and one
    colour scale (so the single colour bar holds for every panel, which the book's version, scaled
    per panel, does not guarantee). ``xlabel`` goes under the bottom row, ``ylabel`` beside the left
    column, ``titles[j]`` above column ``j``.

    Args:
      matrices: ``(rows, cols, T, S)``, e.g. ``(1, 1, T, S)`` for one weight matrix or
        ``(layers, heads, T, S)`` for multi-head attention.
      xlabel: label of the key axis ``S``.
      ylabel: label of the query axis ``T``.
      titles: ``cols`` column titles, or ``None``.
      figsize: ``(width, height)`` in inches of ONE heatmap; the figure is ``cols`` × ``rows`` of
        them, so the book's default ``(2.5, 2.5)`` gives the book's figure for a single matrix.
      cmap: a Matplotlib colour-map name.
      path: where to write the PNG, or ``None``.

    Returns:
      The :class:`~matplotlib.figure.Figure`, of ``cols * width`` × ``rows * height`` inches.
    """
    matrices = _as_float_array("matrices", matrices)
    if matrices.ndim != 4 or 0 in matrices.shape:
        raise ValueError(
            f"matrices must have shape (rows, cols, T, S) with no empty axis, got {matrices.shape}"
        )
    num_rows, num_cols = matrices.shape[:2]
    if titles is not None:
        titles = list(titles)
        if len(titles) != num_cols:
            raise ValueError(
                f"titles must have one entry per column ({num_cols} for matrices of shape "
                f"{matrices.shape}), got {len(titles)}"
            )
    width, height = figsize
    fig = _new_figure((num_cols * width, num_rows * height))
    axes = fig.subplots(num_rows, num_cols, sharex=True, sharey=True, squeeze=False)
    finite = matrices[np.isfinite(matrices)]
    vmin, vmax = (finite.min(), finite.max()) if finite.size else (0.0, 1.0)
    for i, (row_axes, row_matrices) in enumerate(zip(axes, matrices)):
        for j, (ax, matrix) in enumerate(zip(row_axes, row_matrices)):
            image = ax.imshow(matrix, cmap=cmap, vmin=vmin, vmax=vmax)
            if i == num_rows - 1:
                ax.set_xlabel(xlabel)
            if j == 0:
                ax.set_ylabel(ylabel)
            if titles is not None:
                ax.set_title(titles[j])
    fig.colorbar(image, ax=axes, shrink=0.6)
    if path is not None:
        save_figure(fig, path)
    return fig


def plot_kernel_regression(x_train, y_train, x_test, y_truth, y_hat, *,
                           path: str | os.PathLike | None = None, title: str | None = None
                           ) -> Figure:
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

    Returns:
      The :class:`~matplotlib.figure.Figure`.
    """
    x_train = _as_vector("x_train", x_train)
    y_train = _as_vector("y_train", y_train, x_train.shape[0], "x_train")
    x_test = _as_vector("x_test", x_test)
    y_truth = _as_vector("y_truth", y_truth, x_test.shape[0], "x_test")
    y_hat = _as_vector("y_hat", y_hat, x_test.shape[0], "x_test")
    fig = _new_figure((3.5, 2.5))  # d2l.plot's default size
    ax = fig.subplots()
    ax.plot(x_test, y_truth, "-", label="Truth")
    ax.plot(x_test, y_hat, "m--", label="Pred")
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


def plot_curve(values, *, xlabel: str = "epoch", ylabel: str = "loss",
               path: str | os.PathLike | None = None, title: str | None = None) -> Figure:
    """A training curve: ``values[i]`` at ``x = i + 1`` (epochs count from 1, as in the logs).

    Args:
      values: ``(n,)`` with ``n >= 1``, e.g. the loss of each epoch.
      xlabel: label of the horizontal axis.
      ylabel: label of the vertical axis.
      path: where to write the PNG, or ``None``.
      title: a title above the plot, or ``None``.

    Returns:
      The :class:`~matplotlib.figure.Figure`.
    """
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
                            path: str | os.PathLike | None = None) -> Figure:
    """Columns of a positional-encoding table over the positions — d2l §11.6.3, first figure.

    The book draws columns 6 to 9 of ``positional_encoding(60, 32)``: two (sin, cos) pairs whose
    frequency falls with the column index.

    Args:
      P: ``(T, D)``, e.g. :func:`jax_attention.positional.positional_encoding`.
      columns: the column indices to draw, each in ``[0, D)``; one curve each, labelled
        ``"Col c"``.
      path: where to write the PNG, or ``None``.

    Returns:
      The :class:`~matplotlib.figure.Figure` (6 × 2.5 inches, as in the book).
    """
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
        ax.plot(positions, P[:, column], _LINE_FORMATS[i % len(_LINE_FORMATS)], label=f"Col {column}")
    ax.set_xlabel("Row (position)")
    ax.set_xlim(0, P.shape[0] - 1 if P.shape[0] > 1 else 1)
    ax.legend()
    ax.grid(True)
    if path is not None:
        save_figure(fig, path)
    return fig


def plot_positional_heatmap(P, *, path: str | os.PathLike | None = None) -> Figure:
    """A positional-encoding table as a heatmap — d2l §11.6.3, second figure.

    The book's ``show_heatmaps(P, xlabel='Column (encoding dimension)', ylabel='Row (position)',
    figsize=(3.5, 4), cmap='Blues')`` for ``P = positional_encoding(60, 32)``: the left columns
    alternate quickly down the positions, the right ones hardly change.

    Args:
      P: ``(T, D)``.
      path: where to write the PNG, or ``None``.

    Returns:
      The :class:`~matplotlib.figure.Figure` (3.5 × 4 inches).
    """
    P = _as_table("P", P)
    return show_heatmaps(P[None, None], xlabel="Column (encoding dimension)", ylabel="Row (position)",
                         figsize=(3.5, 4), cmap="Blues", path=path)


# --------------------------------------------------------------------------- one translation's weights


def translation_heatmap(translation, path: str | os.PathLike) -> Figure:
    """The book's heatmap of one translation's attention weights, with the tokens as tick labels:
    the source tokens read (keys) across, the predicted tokens and ``<eos>`` (queries) down.

    Args:
      translation: a translation result with ``weights`` ``(steps, S)``, ``source_tokens``
        (``S`` of them), ``tokens`` (the predicted ones) and ``finished`` (whether ``<eos>``
        was predicted, the last query then).
      path: where to write the PNG.

    Returns:
      The :class:`~matplotlib.figure.Figure`.
    """
    steps, keys = translation.weights.shape
    queries = translation.tokens + (["<eos>"] if translation.finished else [])
    fig = show_heatmaps(translation.weights[None, None], xlabel="Source tokens (keys)",
                        ylabel="Translation (queries)",
                        figsize=(max(2.5, 0.45 * keys + 1.2), max(2.5, 0.35 * steps + 1.2)))
    axes = fig.axes[0]
    axes.set_xticks(range(keys), labels=translation.source_tokens, rotation=90)
    axes.set_yticks(range(steps), labels=queries)
    save_figure(fig, path)
    return fig


def layer_head_heatmaps(weights, path: str | os.PathLike, *, xlabel: str, ylabel: str,
                        xticks: Sequence[str], yticks: Sequence[str]) -> Figure:
    """``(L, N, T, S)`` weights as a grid, one row per layer (block) and one column per head,
    with the tokens as tick labels and ``"Layer l"`` beside each row.

    Args:
      weights: ``(L, N, T, S)``.
      path: where to write the PNG.
      xlabel, ylabel: labels of the key axis ``S`` and the query axis ``T``.
      xticks, yticks: ``S`` and ``T`` tick labels (tokens).

    Returns:
      The :class:`~matplotlib.figure.Figure`.
    """
    L, N, T, S = weights.shape
    fig = show_heatmaps(weights, xlabel=xlabel, ylabel=ylabel,
                        titles=[f"Head {n}" for n in range(1, N + 1)],
                        figsize=(max(2.0, 0.4 * S + 1.0), max(2.0, 0.35 * T + 1.0)))
    for layer, axes in enumerate(fig.axes[:L * N]):
        axes.set_xticks(range(S), labels=xticks, rotation=90)
        axes.set_yticks(range(T), labels=yticks)
        if axes.get_subplotspec().is_first_col():
            axes.set_ylabel(f"Layer {layer // N + 1}\n{ylabel}")
    save_figure(fig, path)
    return fig


def bahdanau_attention_plots(translation, out_dir: str | os.PathLike) -> dict[str, Path]:
    """The book's figure of a Bahdanau translation (d2l §11.4): its weights as
    :func:`translation_heatmap`, written to ``out_dir/bahdanau_attention.png``.

    Returns:
      ``{"attention": path}``.
    """
    plots = {"attention": Path(out_dir) / "bahdanau_attention.png"}
    translation_heatmap(translation, plots["attention"])
    return plots


def transformer_attention_plots(translation, out_dir: str | os.PathLike) -> dict[str, Path]:
    """The book's figures of a Transformer translation (d2l §11.7.6): the encoder
    self-attention, the decoder self-attention and the encoder–decoder attention, every layer
    (row) and head (column), as :func:`layer_head_heatmaps`, written into ``out_dir``.

    Args:
      translation: a Transformer translation result, with ``encoder_self`` ``(L, N, S, S)``,
        ``decoder_self`` ``(L, N, T, T)`` and ``encoder_decoder`` ``(L, N, T, S)`` weights
        besides the tokens of :func:`translation_heatmap`.
      out_dir: the folder of the PNGs.

    Returns:
      ``{"encoder_self", "decoder_self", "encoder_decoder": path}``, the files
      ``transformer_encoder_self_attention.png``, ``transformer_decoder_self_attention.png`` and
      ``transformer_encoder_decoder_attention.png``.
    """
    out_dir = Path(out_dir)
    t = translation
    queries = t.tokens + (["<eos>"] if t.finished else [])
    inputs = ["<bos>"] + queries[:-1]  # the decoder reads <bos> and its own predictions
    plots = {"encoder_self": out_dir / "transformer_encoder_self_attention.png",
             "decoder_self": out_dir / "transformer_decoder_self_attention.png",
             "encoder_decoder": out_dir / "transformer_encoder_decoder_attention.png"}
    layer_head_heatmaps(t.encoder_self, plots["encoder_self"], xlabel="Key positions",
                        ylabel="Query positions", xticks=t.source_tokens, yticks=t.source_tokens)
    layer_head_heatmaps(t.decoder_self, plots["decoder_self"], xlabel="Key positions",
                        ylabel="Query positions", xticks=inputs, yticks=inputs)
    layer_head_heatmaps(t.encoder_decoder, plots["encoder_decoder"],
                        xlabel="Source tokens (keys)", ylabel="Decoder inputs (queries)",
                        xticks=t.source_tokens, yticks=inputs)
    return plots
