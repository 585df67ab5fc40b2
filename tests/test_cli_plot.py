"""The `jax-attention plot ...` commands, run in-process."""

from __future__ import annotations

import json
import re

import matplotlib.image
import numpy as np
import pytest

from jax_attention.cli import main

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _assert_png(path):
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
    return image


def test_plot_positional_encoding_writes_both_figures_and_json(tmp_path, capsys):
    out, record_path = tmp_path / "plots", tmp_path / "runs" / "pe.json"
    assert main(["plot", "positional-encoding", "--out", str(out), "--json", str(record_path),
                 "--seed", "4"]) == 0
    plots = {"columns": out / "positional_encoding_columns.png",
             "heatmap": out / "positional_encoding_heatmap.png"}
    columns, heatmap = (_assert_png(path) for path in plots.values())
    # The book's sizes: a 6 x 2.5 inch line plot and a 3.5 x 4 inch heatmap, at the same dpi.
    assert columns.shape[1] / columns.shape[0] == pytest.approx(6 / 2.5, rel=0.02)
    assert heatmap.shape[1] / heatmap.shape[0] == pytest.approx(3.5 / 4, rel=0.02)
    record = json.loads(record_path.read_text())
    assert record["command"] == "plot positional-encoding" and record["seed"] == 4
    assert (record["num_steps"], record["encoding_dim"], record["columns"]) == (60, 32, [6, 7, 8, 9])
    assert record["shapes"] == {"P": [60, 32]}
    assert record["plots"] == {name: str(path) for name, path in plots.items()}
    printed = capsys.readouterr().out
    assert all(f"wrote {path}" in printed for path in [*plots.values(), record_path])


def test_plot_attention_writes_heatmaps_and_json(tmp_path, capsys):
    record_path = tmp_path / "attention.json"
    assert main(["plot", "attention", "--out", str(tmp_path / "a"), "--json", str(record_path),
                 "--seed", "1"]) == 0
    first = _assert_png(tmp_path / "a" / "multihead_attention.png")
    # 5 heads across, 2 examples down: the figure is wider than tall.
    assert first.shape[1] > 2 * first.shape[0]
    record = json.loads(record_path.read_text())
    assert record["command"] == "plot attention" and record["seed"] == 1
    sizes = [record[name] for name in ("num_hiddens", "num_heads", "batch_size", "num_queries")]
    assert sizes == [100, 5, 2, 4]
    assert record["valid_lens"] == [3, 2]
    assert record["shapes"] == {"X": [2, 4, 100], "output": [2, 4, 100], "weights": [2, 5, 4, 4]}
    assert record["plots"] == {"attention": str(tmp_path / "a" / "multihead_attention.png")}
    assert {"jax", "flax", "backend"} <= set(record)

    # The seed decides the picture: the same seed draws it again pixel for pixel, another does not.
    assert main(["plot", "attention", "--out", str(tmp_path / "b"), "--seed", "1"]) == 0
    assert main(["plot", "attention", "--out", str(tmp_path / "c"), "--seed", "2"]) == 0
    np.testing.assert_array_equal(_assert_png(tmp_path / "b" / "multihead_attention.png"), first)
    assert not np.array_equal(_assert_png(tmp_path / "c" / "multihead_attention.png"), first)
    assert not (tmp_path / "b" / "attention.json").exists()


def test_plot_attention_with_other_sizes(tmp_path):
    record_path = tmp_path / "r.json"
    assert main(["plot", "attention", "--out", str(tmp_path), "--json", str(record_path),
                 "--num-hiddens", "8", "--num-heads", "2", "--batch-size", "3", "--num-queries", "5",
                 "--valid-lens", "4"]) == 0
    record = json.loads(record_path.read_text())
    assert record["valid_lens"] == [4, 4, 4]  # one length for every example
    assert record["shapes"]["weights"] == [3, 2, 5, 5]
    _assert_png(tmp_path / "multihead_attention.png")


def _view(path) -> dict:
    """The data of the one view of the HTML page ``path``, which must be a whole page."""
    text = path.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>\n") and text.endswith("</body>\n</html>\n")
    assert text.count('<div class="ja-view">') == 1
    (block,) = re.findall(r'<script type="application/json" class="ja-view-data">(.*?)</script>',
                          text, flags=re.S)
    return json.loads(block)


def test_plot_attention_writes_the_interactive_view(tmp_path, capsys):
    out, page = tmp_path / "a", tmp_path / "views" / "attention.html"
    record_path = tmp_path / "r.json"
    assert main(["plot", "attention", "--out", str(out), "--html", str(page), "--json",
                 str(record_path), "--num-heads", "4", "--batch-size", "3", "--num-queries", "5",
                 "--valid-lens", "5", "2", "0"]) == 0
    _assert_png(out / "multihead_attention.png")  # the PNG as before
    printed = capsys.readouterr().out
    assert f"wrote {page}" in printed
    record = json.loads(record_path.read_text())
    assert record["plots"] == {"attention": str(out / "multihead_attention.png"),
                               "view": str(page)}
    view = _view(page)
    assert "Multi-head self-attention" in view["title"] and view["steps"] is None
    (tab,) = view["tabs"]
    # One "layer" per sequence of the batch, the heads as heads, the positions as tokens.
    assert tab["layers"] == ["Sequence 1 (valid length 5)", "Sequence 2 (valid length 2)",
                             "Sequence 3 (valid length 0)"]
    assert tab["heads"] == ["Head 1", "Head 2", "Head 3", "Head 4"]
    assert tab["queries"] == tab["keys"] == ["0", "1", "2", "3", "4"]
    assert (tab["xlabel"], tab["ylabel"]) == ("Key positions", "Query positions")
    # The keys past each sequence's valid length are masked, and only those.
    masked = np.asarray(tab["masked"])
    expected = np.arange(5)[None, :] >= np.asarray([5, 2, 0])[:, None]  # (B, S)
    np.testing.assert_array_equal(masked, np.broadcast_to(expected[:, None, None, :],
                                                          (3, 4, 5, 5)).astype(int))
    weights = np.asarray(tab["weights"])
    assert weights.shape == (3, 4, 5, 5) and record["shapes"]["weights"] == [3, 4, 5, 5]
    # Each row sums to 1 over its valid keys; a sequence of valid length 0 attends nowhere.
    sums = np.broadcast_to(np.asarray([1.0, 1.0, 0.0])[:, None, None], (3, 4, 5))
    np.testing.assert_allclose(weights.sum(-1), sums, rtol=1e-5)
    np.testing.assert_array_equal(weights[masked == 1], 0)


def test_plot_attention_html_alone_writes_only_the_page(tmp_path, capsys):
    page = tmp_path / "attention.html"
    assert main(["plot", "attention", "--html", str(page)]) == 0
    assert capsys.readouterr().out == f"wrote {page}\n"
    assert sorted(tmp_path.iterdir()) == [page]  # no PNG without --out
    (tab,) = _view(page)["tabs"]
    assert np.asarray(tab["weights"]).shape == (2, 5, 4, 4)  # the book's example


def test_plot_attention_html_that_cannot_be_written_is_refused_before_any_work(tmp_path,
                                                                               monkeypatch):
    from jax_attention.nn import multihead
    from tests.fault_support import assert_one_line, read_only_dir, tree_snapshot
    from tests.shared_runs import run_main

    def no_work(*args, **kwargs):
        raise AssertionError("the attention was built before the --html check")

    monkeypatch.setattr(multihead, "MultiHeadAttention", no_work)
    with read_only_dir(tmp_path) as read_only:
        before = tree_snapshot(tmp_path)
        status, out, err = run_main(["plot", "attention", "--out", str(tmp_path / "out"),
                                     "--html", str(read_only / "view.html")])
        assert status == 2, err
        assert_one_line(err, "argument --html:", str(read_only / "view.html"), "cannot be written")
        assert "usage:" not in err and out == ""
        assert tree_snapshot(tmp_path) == before  # nothing written, not even --out


@pytest.mark.parametrize("argv", [["plot"], ["plot", "positional-encoding"], ["plot", "attention"]])
def test_help_exits_0(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--help"])
    assert exit_info.value.code == 0
    printed = capsys.readouterr().out
    assert "usage: jax-attention plot" in printed
    if argv == ["plot"]:
        assert "positional-encoding" in printed and "attention" in printed


@pytest.mark.parametrize(("argv", "message"), [
    (["plot", "attention"], "one of the arguments --out --html is required"),
    (["plot", "attention", "--out", "{tmp}", "--seed", "-1"], "--seed: expected an integer >= 0, got -1"),
    (["plot", "attention", "--out", "{tmp}", "--num-heads", "3"],
     "--num-heads: must divide --num-hiddens = 100, got 3"),
    (["plot", "attention", "--out", "{tmp}", "--valid-lens", "1", "2", "3"],
     "--valid-lens: expected one length or --batch-size = 2 lengths, got 3"),
    (["plot", "attention", "--out", "{tmp}", "--valid-lens", "5", "2"],
     "--valid-lens: lengths must be <= --num-queries = 4"),
    (["plot", "attention", "--out", "{tmp}", "--num-hiddens", "0"],
     "--num-hiddens: expected an integer >= 1"),
    (["plot", "positional-encoding", "--out", "{tmp}", "--columns", "6", "32"],
     "--columns: columns must be < --encoding-dim = 32, got [32]"),
    (["plot", "positional-encoding", "--out", "{tmp}", "--num-steps", "x"],
     "--num-steps: expected an integer >= 1"),
    (["plot", "positional-encoding", "--out", "{file}"], "--out: '{file}' exists and is not a directory"),
    (["plot", "attention", "--out", "{tmp}", "--json", "{tmp}"], "--json: '{tmp}' is a directory"),
    (["plot", "attention", "--out", "{tmp}/out", "--html", "{tmp}"],
     "--html: '{tmp}' is a directory, expected a file path"),
    (["plot", "attention", "--out", "{tmp}/out", "--html", "{file}/view.html"],
     "--html: '{file}/view.html' cannot be created: '{file}' is a file"),
    (["plot", "attention", "--out", "{tmp}/out", "--html", "{tmp}/r.json", "--json",
      "{tmp}/r.json"], "--html: must differ from --json"),
    (["plot", "positional-encoding", "--out", "{tmp}", "--html", "{tmp}/v.html"],
     "unrecognized arguments: --html"),
    (["plot", "no-such-figure"], "invalid choice: 'no-such-figure'"),
    (["plot"], "required: COMMAND"),
])
def test_bad_arguments_exit_2(tmp_path, capsys, argv, message):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    fill = {"tmp": str(tmp_path), "file": str(not_a_dir)}
    with pytest.raises(SystemExit) as exit_info:
        main([arg.format(**fill) for arg in argv])
    assert exit_info.value.code == 2
    assert message.format(**fill) in capsys.readouterr().err
    assert sorted(path.name for path in tmp_path.iterdir()) == ["file"]  # nothing written


def _figures(monkeypatch):
    """The Figures the command draws, as written."""
    from jax_attention.viz import plotting

    figures = {}
    original = plotting.save_figure
    monkeypatch.setattr(plotting, "save_figure",
                        lambda fig, path: figures.setdefault(path.name, fig) and original(fig, path))
    return figures


def test_plot_attention_labels_rows_and_every_key(tmp_path, monkeypatch):
    figures = _figures(monkeypatch)
    assert main(["plot", "attention", "--out", str(tmp_path), "--num-queries", "6",
                 "--valid-lens", "5", "2"]) == 0
    fig = figures["multihead_attention.png"]
    assert "Multi-head self-attention" in fig.get_suptitle()
    *heatmaps, _ = fig.axes
    assert [ax.get_ylabel() for ax in heatmaps[::5]] == [
        "Sequence 1\n(valid length 5)\nQuery positions",
        "Sequence 2\n(valid length 2)\nQuery positions"]
    for ax in heatmaps:
        assert list(ax.get_xticks()) == list(range(6))  # a tick on every key
        assert ax.images[0].get_clim() == (0.0, 1.0)
    assert [t.get_text() for t in heatmaps[-1].get_xticklabels()] == [str(i) for i in range(6)]


def test_plot_positional_encoding_has_titles_and_y_label(tmp_path, monkeypatch):
    figures = _figures(monkeypatch)
    assert main(["plot", "positional-encoding", "--out", str(tmp_path)]) == 0
    (columns,) = figures["positional_encoding_columns.png"].axes
    assert columns.get_ylabel() == "Encoding value"
    assert "columns 6, 7, 8, 9" in columns.get_title()
    assert "positional encoding" in figures["positional_encoding_heatmap.png"].get_suptitle()
