"""Plots: headless PNGs of the right size, shape checks, JAX inputs."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import matplotlib.image
import numpy as np
import pytest
from matplotlib.figure import Figure

from jax_attention.viz.plotting import DPI, plot_curve, plot_kernel_regression, show_heatmaps

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _weights(rows, cols, T=4, S=5):
    """Softmax rows ``(rows, cols, T, S)``, like attention weights."""
    return jax.nn.softmax(jax.random.normal(jax.random.key(0), (rows, cols, T, S)), axis=-1)


def _png_shape(path):
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    return matplotlib.image.imread(path).shape


def test_heatmap_grid_writes_png_that_scales_with_rows_and_cols(tmp_path):
    one = tmp_path / "one.png"
    grid = tmp_path / "nested" / "grid.png"  # parent folders are created
    fig = show_heatmaps(np.asarray(_weights(1, 1)), "keys", "queries", path=one)
    assert isinstance(fig, Figure)
    show_heatmaps(np.asarray(_weights(2, 3)), "keys", "queries", titles=["a", "b", "c"], path=grid)
    height_one, width_one, channels = _png_shape(one)
    assert channels in (3, 4)
    assert (height_one, width_one) == (round(2.5 * DPI), round(2.5 * DPI))
    assert _png_shape(grid)[:2] == (2 * height_one, 3 * width_one)


def test_heatmap_layout_labels_and_shared_colour_scale():
    fig = show_heatmaps(_weights(2, 2), "keys", "queries", titles=["h1", "h2"])
    *heatmaps, colorbar = fig.axes
    assert len(heatmaps) == 4
    assert [ax.get_xlabel() for ax in heatmaps] == ["", "", "keys", "keys"]
    assert [ax.get_ylabel() for ax in heatmaps] == ["queries", "", "queries", ""]
    assert [ax.get_title() for ax in heatmaps] == ["h1", "h2", "h1", "h2"]
    limits = {ax.images[0].get_clim() for ax in heatmaps}
    assert len(limits) == 1  # one colour bar is only honest with one scale


def test_heatmap_takes_jax_arrays_in_any_float_dtype(tmp_path):
    path = tmp_path / "bf16.png"
    show_heatmaps(_weights(1, 2).astype(jnp.bfloat16), "k", "q", path=path)
    assert _png_shape(path)[:2] == (round(2.5 * DPI), round(2 * 2.5 * DPI))


@pytest.mark.parametrize("shape", [(4, 5), (1, 4, 5), (1, 1, 1, 4, 5), (0, 1, 4, 5)])
def test_heatmap_rejects_bad_shapes(shape):
    with pytest.raises(ValueError, match=r"matrices.*\(rows, cols, T, S\).*" + re.escape(str(shape))):
        show_heatmaps(np.zeros(shape), "k", "q")


@pytest.mark.parametrize("titles", [["only one"], ["a", "b", "c"], []])
def test_heatmap_rejects_titles_of_the_wrong_length(titles):
    with pytest.raises(ValueError, match=rf"titles.*2.*got {len(titles)}"):
        show_heatmaps(np.zeros((1, 2, 3, 3)), "k", "q", titles=titles)


def test_kernel_regression_plot(tmp_path):
    x_train = jnp.linspace(0.0, 5.0, 10, dtype=jnp.float32)
    x_test = np.linspace(0.0, 5.0, 20)
    path = tmp_path / "fit.png"
    fig = plot_kernel_regression(x_train, jnp.sin(x_train), x_test, np.sin(x_test), np.cos(x_test),
                                 path=path, title="fit")
    _png_shape(path)
    (ax,) = fig.axes
    assert [text.get_text() for text in ax.get_legend().get_texts()] == ["Truth", "Pred"]
    assert (ax.get_xlabel(), ax.get_ylabel(), ax.get_title()) == ("x", "y", "fit")
    assert ax.get_xlim() == (0, 5) and ax.get_ylim() == (-1, 5)
    truth, pred, points = ax.get_lines()
    assert points.get_marker() == "o" and points.get_alpha() == 0.5
    np.testing.assert_allclose(pred.get_ydata(), np.cos(x_test))


def test_kernel_regression_plot_rejects_mismatched_lengths():
    x = np.arange(5.0)
    with pytest.raises(ValueError, match=r"y_hat.*\(5,\).*\(4,\)"):
        plot_kernel_regression(x, x, x, x, x[:4])
    with pytest.raises(ValueError, match=r"y_train.*\(5,\).*\(3,\)"):
        plot_kernel_regression(x, x[:3], x, x, x)


def test_curve(tmp_path):
    path = tmp_path / "loss.png"
    fig = plot_curve(jnp.asarray([3.0, 2.0, 1.5]), path=path, ylabel="loss", title="t")
    _png_shape(path)
    (line,) = fig.axes[0].get_lines()
    np.testing.assert_array_equal(line.get_xdata(), [1, 2, 3])
    with pytest.raises(ValueError, match=r"values.*\(n,\).*\(2, 2\)"):
        plot_curve(np.zeros((2, 2)))
    with pytest.raises(ValueError, match=r"values.*at least one.*\(0,\)"):
        plot_curve([])


# --------------------------------------------------------------------------- readable figures


def test_heatmap_token_labels_row_titles_suptitle_and_fixed_scale():
    fig = show_heatmaps(np.full((2, 3, 2, 4), 0.1), "keys", "queries",
                        titles=["Head 1", "Head 2", "Head 3"], row_titles=["Layer 1", "Layer 2"],
                        xticklabels=["a", "b", "c", "<eos>"], yticklabels=["x", "y"],
                        suptitle="what it shows")
    *heatmaps, _ = fig.axes
    assert fig.get_suptitle() == "what it shows"
    assert [ax.get_ylabel() for ax in heatmaps[::3]] == ["Layer 1\nqueries", "Layer 2\nqueries"]
    for ax in heatmaps:  # shared axes: the labels show on the bottom row and the left column
        assert list(ax.get_xticks()) == [0, 1, 2, 3] and list(ax.get_yticks()) == [0, 1]
        assert ax.images[0].get_clim() == (0.0, 1.0)  # weights of 0.1 are not drawn dark
    assert [t.get_text() for t in heatmaps[-1].get_xticklabels()] == ["a", "b", "c", "<eos>"]
    assert [t.get_text() for t in heatmaps[0].get_yticklabels()] == ["x", "y"]
    data_scale = show_heatmaps(np.array([[[[1.0, 3.0], [2.0, 2.0]]]]), "k", "q", vmin=None,
                               vmax=None)
    assert data_scale.axes[0].images[0].get_clim() == (1.0, 3.0)


@pytest.mark.parametrize("option, value", [("xticklabels", ["a"]), ("yticklabels", ["a"] * 3),
                                           ("row_titles", ["r"] * 2)])
def test_heatmap_rejects_labels_of_the_wrong_length(option, value):
    with pytest.raises(ValueError, match=rf"{option} must have one entry per"):
        show_heatmaps(np.zeros((1, 1, 2, 4)), "k", "q", **{option: value})


def test_positional_encoding_figures_say_what_they_show():
    from jax_attention.viz.plotting import plot_positional_columns, plot_positional_heatmap
    from jax_attention.nn.positional import positional_encoding

    P = positional_encoding(60, 32)
    (ax,) = plot_positional_columns(P).axes
    assert ax.get_ylabel() and "positional encoding" in ax.get_title()
    heatmap = plot_positional_heatmap(P)
    assert "positional encoding" in heatmap.get_suptitle()
    assert heatmap.axes[0].images[0].get_clim() == (-1.0, 1.0)


def _translation(transformer: bool):
    from jax_attention.models.translation import Translation

    cross = np.full((3, 2, 2, 3), 1 / 3) if transformer else None
    return Translation(source="go .", source_tokens=["go", ".", "<eos>"], tokens=["va"],
                       translation="va", weights=np.full((2, 3), 1 / 3), finished=True,
                       truncated=False, unknown_words=[], notes=[],
                       encoder_self=None if cross is None else np.full((3, 2, 3, 3), 1 / 3),
                       decoder_self=None if cross is None else np.full((3, 2, 2, 2), 0.5),
                       encoder_decoder=cross)


def test_translation_heatmap_names_the_model_the_layer_and_the_sentence(tmp_path):
    from jax_attention.viz.plotting import translation_heatmap

    transformer = translation_heatmap(_translation(True), tmp_path / "t.png")
    title = transformer.get_suptitle()
    assert "Transformer" in title and "layer 3 of 3" in title and "mean over 2 heads" in title
    assert "go ." in title and "va" in title
    ax = transformer.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["go", ".", "<eos>"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["va", "<eos>"]
    assert ax.images[0].get_clim() == (0.0, 1.0)
    bahdanau = translation_heatmap(_translation(False))
    assert "Bahdanau" in bahdanau.get_suptitle() and "go ." in bahdanau.get_suptitle()


def test_transformer_attention_plots_have_titles_and_layer_rows(tmp_path, monkeypatch):
    from jax_attention.viz import plotting

    figures = []
    monkeypatch.setattr(plotting, "save_figure", lambda fig, path: figures.append(fig))
    plotting.transformer_attention_plots(_translation(True), tmp_path)
    titles = [fig.get_suptitle() for fig in figures]
    assert [part in title for part, title in zip(
        ["encoder self", "decoder self", "encoder\u2013decoder"], titles)] == [True] * 3
    assert all("Transformer" in title and "go ." in title for title in titles)
    for fig in figures:
        *heatmaps, _ = fig.axes
        assert [ax.get_ylabel().split("\n")[0] for ax in heatmaps[::2]] == \
            ["Layer 1", "Layer 2", "Layer 3"]
        assert {ax.get_title() for ax in heatmaps} == {"Head 1", "Head 2"}


def _han(text: str) -> int:
    return len(re.findall(r"[\u4e00-\u9fff]", text))


def test_chinese_figures_say_it_in_chinese_and_draw_it_with_a_cjk_font(tmp_path):
    """language="zh": the figures' own words are Chinese, in the edition's terms (查询, 键), and a
    CJK font draws them (Matplotlib warns of a missing glyph otherwise: an error here)."""
    from jax_attention.nn.positional import positional_encoding
    from jax_attention.viz import plotting
    from jax_attention.viz.language import cjk_fonts

    assert cjk_fonts(), "no CJK font installed (apt-get install fonts-noto-cjk)"
    heatmap = plotting.translation_heatmap(_translation(True), tmp_path / "t.png", language="zh")
    ax = heatmap.axes[0]
    assert "键" in ax.get_xlabel() and "查询" in ax.get_ylabel() and "编码器" in heatmap.get_suptitle()
    assert "go ." in heatmap.get_suptitle()  # the sentence itself is never translated
    grid = plotting.layer_head_heatmaps(np.full((2, 3, 2, 2), 0.5), xlabel="键", ylabel="查询",
                                        xticks=["a", "b"], yticks=["c", "d"], language="zh")
    *heatmaps, _ = grid.axes
    assert [ax.get_title() for ax in heatmaps[:3]] == ["头 1", "头 2", "头 3"]
    assert heatmaps[0].get_ylabel().startswith("第 1 层")
    P = positional_encoding(60, 32)
    (columns,) = plotting.plot_positional_columns(P, language="zh").axes
    assert _han(columns.get_title()) and [t.get_text() for t in columns.get_legend().get_texts()] \
        == ["第 6 列", "第 7 列", "第 8 列", "第 9 列"]
    assert _han(plotting.plot_positional_heatmap(P, language="zh").get_suptitle())
    (curve,) = plotting.plot_curve([1.0, 0.5], language="zh").axes
    assert (curve.get_xlabel(), curve.get_ylabel()) == ("迭代周期", "损失")
    (fit,) = plot_kernel_regression(np.arange(3.0), np.arange(3.0), np.arange(2.0), np.arange(2.0),
                                    np.arange(2.0), language="zh").axes
    assert [t.get_text() for t in fit.get_legend().get_texts()] == ["真实值", "预测值"]
    # The English figure is unchanged by the Chinese one made before it.
    (english,) = plotting.plot_curve([1.0, 0.5]).axes
    assert (english.get_xlabel(), english.get_ylabel()) == ("epoch", "loss")
    for figure in (heatmap, grid):
        figure.canvas.draw()  # a missing glyph would warn here (warnings are errors in the tests)


@pytest.mark.parametrize("language", ["fr", "EN", None])
def test_an_unknown_language_is_refused_by_name(language):
    from jax_attention.viz.plotting import plot_positional_heatmap

    with pytest.raises(ValueError, match=r"language must be one of 'en', 'zh'"):
        plot_positional_heatmap(np.zeros((3, 4)), language=language)
