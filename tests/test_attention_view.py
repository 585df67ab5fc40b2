"""The interactive attention views as documents (jax_attention/viz/attention_view.py): what they
hold, that they hold nothing fetched, their size at the book's Transformer, the bertviz layout, and
bad input. What they do in a browser: tests/test_attention_view_browser.py."""

from __future__ import annotations

import dataclasses
import json
import re

import numpy as np
import pytest

from jax_attention.models.translation import Translation
from jax_attention.viz.attention_view import (
    AttentionView,
    attention_view,
    save_views,
    to_bertviz,
    translation_to_bertviz,
    translation_view,
)


def softmax_weights(shape, seed=0) -> np.ndarray:
    scores = np.random.default_rng(seed).normal(size=shape) * 2
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    return (weights / weights.sum(-1, keepdims=True)).astype(np.float32)


def view_data(view: AttentionView) -> dict:
    match = re.search(r'<script type="application/json" class="ja-view-data">(.*?)</script>',
                      view.html, flags=re.S)
    return json.loads(match.group(1))


def page_views(path) -> list[dict]:
    """The data of every view of the HTML page ``path``, which must be a whole page."""
    text = path.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>\n") and text.endswith("</body>\n</html>\n")
    blocks = re.findall(r'<script type="application/json" class="ja-view-data">(.*?)</script>',
                        text, flags=re.S)
    assert text.count('<div class="ja-view">') == len(blocks)
    return [json.loads(block) for block in blocks]


def book_translation(seed=0) -> Translation:
    """A translation with the book Transformer's shapes (2 layers × 4 heads, 10 tokens each way)."""
    source = ["i", "lost", "my", "keys", "and", "he", "is", "calm", ".", "<eos>"]
    tokens = ["j'ai", "perdu", "mes", "clés", "et", "il", "est", "calme", "."]
    steps, S = len(tokens) + 1, len(source)
    return Translation(
        source="i lost my keys and he is calm .", source_tokens=source, tokens=tokens, translation=" ".join(tokens),
        weights=softmax_weights((steps, S), seed), finished=True, truncated=False, unknown_words=[],
        notes=[], encoder_self=softmax_weights((2, 4, S, S), seed + 1),
        decoder_self=np.tril(softmax_weights((2, 4, steps, steps), seed + 2)),
        encoder_decoder=softmax_weights((2, 4, steps, S), seed + 3))


def test_the_values_read_back_exactly():
    weights = softmax_weights((2, 3, 4, 5))
    data = view_data(attention_view(weights, list("abcd"), list("vwxyz")))
    (tab,) = data["tabs"]
    assert np.array_equal(np.asarray(tab["weights"], np.float32), weights)
    assert tab["layers"] == ["Layer 1", "Layer 2"] and tab["heads"] == ["Head 1", "Head 2", "Head 3"]
    assert tab["queries"] == list("abcd") and tab["keys"] == list("vwxyz") and tab["masked"] is None
    float64 = softmax_weights((4, 5)).astype(np.float64) / 3
    (tab,) = view_data(attention_view(float64, list("abcd"), list("vwxyz")))["tabs"]
    assert np.array_equal(np.asarray(tab["weights"])[0, 0], float64)
    assert len(data["colors"]) == 256 and data["colors"][0] == "#fff5f0"  # matplotlib's Reds


@pytest.mark.parametrize("shape", [(5,), (4, 5), (3, 4, 5), (2, 3, 4, 5)])
def test_every_rank_of_the_chapter_becomes_layers_and_heads(shape):
    weights = softmax_weights(shape)
    queries = list("abcd")[:shape[-2]] if len(shape) > 1 else ["q"]
    (tab,) = view_data(attention_view(weights, queries, list("vwxyz")))["tabs"]
    assert np.asarray(tab["weights"]).shape == (1,) * (4 - len(shape)) + shape


def test_the_mask_marks_what_may_not_be_attended():
    weights = softmax_weights((2, 3, 4))
    keep = np.array([[True, True, False, False], [True, True, True, True]])[:, None, :]
    (tab,) = view_data(attention_view(weights, list("abc"), list("wxyz"), mask=keep))["tabs"]
    assert np.array_equal(np.asarray(tab["masked"])[0], ~np.broadcast_to(keep, (2, 3, 4)))


def test_the_document_is_self_contained():
    view = translation_view(book_translation())
    page = view.html
    assert not re.search(r"https?://|\bsrc=|\bhref=|@import|url\(", page), "something fetched"
    assert page.count("<script>") == 1 and page.count("<style>") == 1
    assert view._repr_html_() == page


def test_a_label_cannot_close_the_script():
    view = attention_view(softmax_weights((1, 2)), ["</script><b>x"], ["a", "b"])
    assert "</script><b>" not in view.html
    assert view_data(view)["tabs"][0]["queries"] == ["</script><b>x"]


def test_the_book_transformers_view_is_under_a_megabyte(tmp_path):
    path = translation_view(book_translation()).save(tmp_path / "view.html")
    assert path.stat().st_size < 1_000_000, path.stat().st_size
    (view,) = page_views(path)
    tabs = [tab["name"] for tab in view["tabs"]]
    assert tabs == ["Encoder self-attention", "Decoder self-attention",
                    "Encoder\u2013decoder attention"]


def test_the_transformer_views_masks_and_labels():
    t = book_translation()
    encoder, decoder, cross = view_data(translation_view(t))["tabs"]
    steps = len(t.tokens) + 1
    assert decoder["queries"] == ["<bos>", *t.tokens] and decoder["keys"] == decoder["queries"]
    assert np.array_equal(np.asarray(decoder["masked"])[0, 0], np.triu(np.ones((steps, steps)), 1))
    assert encoder["masked"] is None and cross["keys"] == t.source_tokens


def test_the_bahdanau_view_goes_step_by_step():
    t = dataclasses.replace(book_translation(), encoder_self=None, decoder_self=None,
                            encoder_decoder=None)
    data = view_data(translation_view(t))
    assert data["steps"]["outputs"] == [*t.tokens, "<eos>"]
    assert data["steps"]["source"] == t.source_tokens
    assert np.array_equal(np.asarray(data["steps"]["weights"], np.float32), t.weights)


def test_several_views_in_one_page(tmp_path):
    views = [attention_view(softmax_weights((2, 3)), ["a", "b"], ["x", "y", "z"], title=f"v{i}")
             for i in range(3)]
    path = save_views(tmp_path / "all.html", views, title="three")
    assert [view["title"] for view in page_views(path)] == ["v0", "v1", "v2"]
    assert "<title>three</title>" in path.read_text(encoding="utf-8")


def test_the_bertviz_layout():
    weights = softmax_weights((2, 4, 3, 5))
    layers = to_bertviz(weights)
    assert len(layers) == 2 and all(layer.shape == (1, 4, 3, 5) for layer in layers)
    assert all(layer.dtype == np.float32 for layer in layers)
    assert np.array_equal(np.concatenate(layers), weights)
    assert [layer.shape for layer in to_bertviz(weights[0])] == [(1, 4, 3, 5)]
    assert [layer.shape for layer in to_bertviz(weights[0, 0])] == [(1, 1, 3, 5)]
    t = book_translation()
    kwargs = translation_to_bertviz(t)
    assert set(kwargs) == {"encoder_attention", "decoder_attention", "cross_attention",
                           "encoder_tokens", "decoder_tokens"}
    assert kwargs["encoder_attention"][1].shape == (1, 4, 10, 10)
    assert kwargs["cross_attention"][0].shape == (1, 4, len(kwargs["decoder_tokens"]), 10)
    assert kwargs["decoder_tokens"][0] == "<bos>"


@pytest.mark.parametrize("bad, message", [
    (dict(queries=list("abc")), r"queries has 3 labels for the 4 queries \(T\) of weights of "
                                r"shape \(2, 4, 5\)"),
    (dict(keys=list("xyz")), r"keys has 3 labels for the 5 keys \(S\) of weights of shape "
                             r"\(2, 4, 5\)"),
    (dict(weights=np.zeros((1, 2, 2, 4, 5))), r"weights must have shape .* got \(1, 2, 2, 4, 5\)"),
    (dict(weights=np.zeros((2, 0, 5))), r"no empty axis, got \(2, 0, 5\)"),
    (dict(head_names=["a"]), r"head_names has 1 labels for the 2 heads \(N\)"),
    (dict(mask=np.ones((3, 5), bool)), r"mask of shape \(3, 5\) does not broadcast to the "
                                       r"weights' shape \(1, 2, 4, 5\)"),
])
def test_bad_input_names_the_argument_and_both_shapes(bad, message):
    arguments = dict(weights=softmax_weights((2, 4, 5)), queries=list("abcd"), keys=list("vwxyz"))
    arguments.update(bad)
    with pytest.raises(ValueError, match=message):
        attention_view(arguments.pop("weights"), arguments.pop("queries"), arguments.pop("keys"),
                       **arguments)


def test_nan_is_refused_unless_allowed():
    weights = softmax_weights((2, 4, 5))
    weights[1, 2, 3] = np.nan
    with pytest.raises(ValueError, match=r"weights of shape \(2, 4, 5\) hold 1 NaN values "
                                         r"\(the first at \(1, 2, 3\)\); pass allow_nan=True"):
        attention_view(weights, list("abcd"), list("vwxyz"))
    (tab,) = view_data(attention_view(weights, list("abcd"), list("vwxyz"),
                                      allow_nan=True))["tabs"]
    assert tab["weights"][0][1][2][3] is None and tab["has_nan"]
    weights[1, 2, 3] = np.inf
    with pytest.raises(ValueError, match=r"hold 1 infinite values \(the first at \(1, 2, 3\)\)$"):
        attention_view(weights, list("abcd"), list("vwxyz"), allow_nan=True)


def test_wrong_kinds_are_type_errors():
    with pytest.raises(TypeError, match="mask must be boolean"):
        attention_view(softmax_weights((2, 3)), ["a", "b"], list("xyz"), mask=np.ones((2, 3)))
    with pytest.raises(TypeError, match="weights must be real numbers, got dtype <U1"):
        attention_view(np.array([["a"]]), ["a"], ["x"])


def test_a_chinese_view_has_chinese_controls_and_names():
    """language="zh": every word the view writes itself (its controls, legend, tabs, axes and
    default names) comes in Chinese; the tokens stay as they are."""
    from jax_attention.viz.language import words

    english, chinese = words("en"), words("zh")
    assert english.keys() == chinese.keys()
    data = view_data(translation_view(book_translation(), language="zh"))
    assert set(data["text"].values()) == {value for key, value in chinese.items()
                                          if key.startswith("view_")}
    assert data["text"]["all_heads"] == "所有头"
    assert [tab["name"] for tab in data["tabs"]] == ["编码器自注意力", "解码器自注意力", "编码器－解码器注意力"]
    assert data["tabs"][0]["heads"][0] == "头 1" and data["tabs"][0]["layers"][1] == "第 2 层"
    assert data["title"].startswith("Transformer 的注意力") and "i lost my keys" in data["title"]
    single = view_data(attention_view(softmax_weights((2, 3)), ["a", "b"], ["x", "y", "z"],
                                      language="zh"))
    assert (single["tabs"][0]["xlabel"], single["tabs"][0]["ylabel"]) == ("键", "查询")
    assert view_data(attention_view(softmax_weights((2, 3)), ["a", "b"], ["x", "y", "z"])
                     )["text"]["all_heads"] == "All heads"


def test_a_chinese_page_says_so(tmp_path):
    view = attention_view(softmax_weights((2, 3)), ["a", "b"], ["x", "y", "z"], language="zh")
    text = save_views(tmp_path / "zh.html", [view]).read_text(encoding="utf-8")
    assert '<html lang="zh-CN">' in text and "<title>注意力权重</title>" in text
    with pytest.raises(ValueError, match="language must be one of"):
        translation_view(book_translation(), language="de")
