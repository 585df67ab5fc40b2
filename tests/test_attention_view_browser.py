"""The interactive attention views in headless Chromium, opened from a file with the network off
(`make test-browser`): nothing is requested but the file, nothing logs an error; the layer and head
selectors show exactly that head's weights; hovering a cell names its tokens and weight; masked
cells look masked; the Bahdanau view's step k shows row k of the weights; the screenshots are not
blank (and are kept in ``$JAX_ATTENTION_SCREENSHOTS``, default build/docs/screenshots/)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np
import pytest

from jax_attention.viz.attention_view import attention_view, translation_view
from tests.browser_support import Visit, browser  # noqa: F401  (a fixture)
from tests.docs_support import ROOT
from tests.test_attention_view import book_translation, softmax_weights

pytestmark = pytest.mark.browser

SCREENSHOTS = Path(os.environ.get("JAX_ATTENTION_SCREENSHOTS", ROOT / "build" / "docs" / "screenshots"))


def open_view(browser, view, path: Path):
    view.save(path)
    url = path.resolve().as_uri()
    visit = Visit(browser, url)
    requests = []
    visit.page.on("request", lambda request: requests.append(request.url))
    page = visit.open("")
    return visit, page, requests


def shown_weights(page, layer: int, head: int) -> np.ndarray:
    table = f'table.ja-matrix[data-layer="{layer}"][data-head="{head}"]'
    rows = page.eval_on_selector_all(
        f"{table} tr.ja-row", "rows => rows.map(r => Array.from(r.querySelectorAll('td'))"
                              ".map(c => c.dataset.value))")
    return np.asarray(rows, dtype=np.float64).astype(np.float32)


def not_blank(path: Path) -> float:
    from matplotlib.image import imread

    pixels = imread(path)[..., :3]
    return float((pixels.min(axis=-1) < 0.9).mean())  # the share of pixels that are not white


def screenshot(page, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    assert not_blank(path) > 0.01, f"{path} is blank"
    return path


def test_layer_and_head_selectors_show_that_head(browser, tmp_path):
    weights = softmax_weights((3, 4, 5, 6))
    keep = np.ones((5, 6), bool)
    keep[:, 4:] = False
    view = attention_view(weights, [f"q{t}" for t in range(5)], [f"k{s}" for s in range(6)],
                          mask=keep, title="three layers, four heads")
    visit, page, requests = open_view(browser, view, tmp_path / "view.html")
    assert page.locator("table.ja-matrix").count() == 4  # all heads of layer 1
    np.testing.assert_array_equal(shown_weights(page, 0, 2), weights[0, 2])
    for layer, head in [(2, 1), (1, 3), (0, 0)]:
        page.select_option("select.ja-layer", str(layer))
        page.select_option("select.ja-head", str(head + 1))
        assert page.locator("table.ja-matrix").count() == 1
        np.testing.assert_array_equal(shown_weights(page, layer, head), weights[layer, head])
    masked = page.eval_on_selector_all(
        "td.ja-cell", "cells => cells.map(c => [c.dataset.masked, c.classList.contains('ja-masked')])")
    assert masked == [["1", True] if s >= 4 else ["0", False] for t in range(5) for s in range(6)]
    assert not visit.problems, visit.problems
    assert requests == [(tmp_path / "view.html").resolve().as_uri()], requests
    visit.context.close()


def test_hovering_names_the_tokens_and_the_weight(browser, tmp_path):
    weights = softmax_weights((2, 3, 4))
    view = attention_view(weights, ["je", "suis", "<eos>"], ["i'm", "home", ".", "<eos>"])
    visit, page, _ = open_view(browser, view, tmp_path / "view.html")
    page.hover('table.ja-matrix[data-head="1"] td.ja-cell[data-t="2"][data-s="1"]')
    assert page.inner_text(".ja-info") == f"<eos> \u2192 home: {weights[1, 2, 1]:.3f}"
    page.hover('table.ja-matrix[data-head="0"] th.ja-query >> nth=1')
    assert page.locator('table.ja-matrix[data-head="0"] tr.ja-row-hl').count() == 1
    assert page.inner_text(".ja-info").startswith("query suis: i'm ")
    assert not visit.problems, visit.problems
    visit.context.close()


def test_the_transformer_view_has_a_tab_per_attention(browser, tmp_path):
    t = book_translation()
    visit, page, _ = open_view(browser, translation_view(t), tmp_path / "transformer.html")
    tabs = page.locator("button.ja-tab")
    assert tabs.all_inner_texts() == ["Encoder self-attention", "Decoder self-attention",
                                      "Encoder\u2013decoder attention"]
    for i, (name, weights) in enumerate([("encoder-self", t.encoder_self),
                                         ("decoder-self", t.decoder_self),
                                         ("encoder-decoder", t.encoder_decoder)]):
        page.locator("button.ja-tab").nth(i).click()
        page.select_option("select.ja-layer", "1")
        np.testing.assert_array_equal(shown_weights(page, 1, 3), weights[1, 3])
        screenshot(page, f"view-transformer-{name}")
    assert page.locator("td.ja-masked").count() == 0  # the cross attention masks nothing
    page.locator("button.ja-tab").nth(1).click()
    steps = len(t.tokens) + 1
    assert page.locator("td.ja-masked").count() == 4 * steps * (steps - 1) // 2  # causal, 4 heads
    assert not visit.problems, visit.problems
    visit.context.close()


def test_the_bahdanau_view_shows_each_step(browser, tmp_path):
    t = dataclasses.replace(book_translation(), encoder_self=None, decoder_self=None,
                            encoder_decoder=None)
    visit, page, _ = open_view(browser, translation_view(t), tmp_path / "bahdanau.html")
    outputs = page.locator("button.ja-step").all_inner_texts()
    assert outputs == [*t.tokens, "<eos>"]
    for k in (0, 4, len(outputs) - 1):
        page.locator("button.ja-step").nth(k).click()
        row = page.eval_on_selector_all(f'.ja-step-row[data-step="{k}"] .ja-step-cell',
                                        "cells => cells.map(c => c.dataset.value)")
        np.testing.assert_array_equal(np.asarray(row, np.float64).astype(np.float32), t.weights[k])
        assert page.locator("tr.ja-row").nth(k).get_attribute("class") == "ja-row ja-row-hl"
    screenshot(page, "view-bahdanau")
    assert not visit.problems, visit.problems
    visit.context.close()


def test_views_of_trained_models(browser, tmp_path, tiny_run):
    """The views `train MODEL --out` writes beside its PNGs, from real translations."""
    for kind in ("bahdanau", "transformer"):
        page_path = tiny_run(kind).root / "plots" / f"{kind}_attention.html"
        assert page_path.is_file(), sorted(page_path.parent.iterdir())
        visit = Visit(browser, page_path.resolve().as_uri())
        page = visit.open("")
        assert page.locator("table.ja-matrix").count() >= 1
        screenshot(page, f"view-trained-{kind}")
        assert not visit.problems, visit.problems
        visit.context.close()
