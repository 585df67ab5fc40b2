"""The languages of the figures and views: their own words (axis names, titles, the views' controls)
in English and in Chinese, and the fonts that draw Chinese.

The figures and views of :mod:`jax_attention.viz` write some words of their own — "Head 1",
"Source tokens (keys)", the view's "All heads" — and every function that does takes
``language="en"`` or ``language="zh"`` (简体中文, in the terms of the Chinese edition of the book,
zh.d2l.ai: 查询, 键, 值, 注意力 ...). The words the caller passes (``xlabel=``, ``title=``) are drawn as
given, in any language.

Chinese needs a font with CJK glyphs, which Matplotlib's own DejaVu Sans lacks. The first figure
made in a process adds the CJK fonts installed on the machine (Noto Sans CJK, Source Han Sans,
WenQuanYi, or the system fonts of macOS and Windows) to the end of Matplotlib's font families,
so that Matplotlib falls back to them for the glyphs DejaVu Sans lacks and draws Latin text as
before. On Debian and Ubuntu, ``apt-get install fonts-noto-cjk`` installs one
(``scripts/ensure-cjk-font``; ``make docs`` runs it).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from types import MappingProxyType

__all__ = ["LANGUAGES", "check_language", "words", "cjk_fonts"]

#: The languages of the figures' and views' own words: English and simplified Chinese.
LANGUAGES = ("en", "zh")

_WORDS = {
    "en": {
        "keys": "Keys",
        "queries": "Queries",
        "head": "Head {n}",
        "layer": "Layer {n}",
        "source_keys_tokens": "Source tokens (keys)",
        "translation_queries": "Translation (queries)",
        "decoder_queries": "Decoder inputs (queries)",
        "key_positions": "Key positions",
        "query_positions": "Query positions",
        "bahdanau_attention": "Bahdanau (additive) attention",
        "last_layer_mean": "Transformer encoder\u2013decoder attention,\nlayer {L} of {L} (last), "
                           "mean over {N} heads",
        "encoder_self_all": "Transformer encoder self-attention, every layer and head",
        "decoder_self_all": "Transformer decoder self-attention (causal), every layer and head",
        "encoder_decoder_all": "Transformer encoder\u2013decoder attention, every layer and head",
        "truth": "Truth",
        "prediction": "Pred",
        "epoch": "epoch",
        "loss": "loss",
        "column": "Col {n}",
        "row_position": "Row (position)",
        "column_dimension": "Column (encoding dimension)",
        "encoding_value": "Encoding value",
        "positional_columns_title": "Sinusoidal positional encoding ({T} positions \u00d7 {D} "
                                    "dimensions):\ncolumns {columns} over the positions",
        "positional_heatmap_title": "Sinusoidal positional encoding\n({T} positions \u00d7 {D} "
                                    "dimensions)",
        # the interactive views
        "attention_weights": "Attention weights",
        "encoder_self": "Encoder self-attention",
        "decoder_self": "Decoder self-attention",
        "encoder_decoder": "Encoder\u2013decoder attention",
        "source_keys": "Source keys",
        "source_queries": "Source queries",
        "decoder_keys": "Decoder keys",
        "additive_attention": "Additive attention",
        "transformer_view_title": "Transformer attention: {title}",
        "bahdanau_view_title": "Bahdanau attention, step by step: {title}",
        "page_title": "Attention weights",
        "view_layer": "Layer ",
        "view_head": "Head ",
        "view_all_heads": "All heads",
        "view_hover": "Hover a cell for its query, key and weight; a query for its row.",
        "view_masked": "masked",
        "view_masked_legend": "masked (may not attend; not a weight of 0)",
        "view_weight_legend": "1  attention weight",
        "view_query": "query ",
        "view_steps": "Output tokens, in order: choose one to see the source weights that "
                      "produced it.",
        "view_step": "Step {n}: ",
        "view_weighted": " \u2190 the source weighted as below",
    },
    "zh": {
        "keys": "键",
        "queries": "查询",
        "head": "头 {n}",
        "layer": "第 {n} 层",
        "source_keys_tokens": "源词元（键）",
        "translation_queries": "译文（查询）",
        "decoder_queries": "解码器输入（查询）",
        "key_positions": "键的位置",
        "query_positions": "查询的位置",
        "bahdanau_attention": "Bahdanau（加性）注意力",
        "last_layer_mean": "Transformer 编码器－解码器注意力，\n第 {L} 层（共 {L} 层，最后一层），"
                           "{N} 个头的平均",
        "encoder_self_all": "Transformer 编码器自注意力，每一层、每一个头",
        "decoder_self_all": "Transformer 解码器自注意力（因果），每一层、每一个头",
        "encoder_decoder_all": "Transformer 编码器－解码器注意力，每一层、每一个头",
        "truth": "真实值",
        "prediction": "预测值",
        "epoch": "迭代周期",
        "loss": "损失",
        "column": "第 {n} 列",
        "row_position": "行（位置）",
        "column_dimension": "列（编码维度）",
        "encoding_value": "编码值",
        "positional_columns_title": "正弦位置编码（{T} 个位置 \u00d7 {D} 维）：\n第 {columns} "
                                    "列随位置的变化",
        "positional_heatmap_title": "正弦位置编码\n（{T} 个位置 \u00d7 {D} 维）",
        "attention_weights": "注意力权重",
        "encoder_self": "编码器自注意力",
        "decoder_self": "解码器自注意力",
        "encoder_decoder": "编码器－解码器注意力",
        "source_keys": "源序列的键",
        "source_queries": "源序列的查询",
        "decoder_keys": "解码器的键",
        "additive_attention": "加性注意力",
        "transformer_view_title": "Transformer 的注意力：{title}",
        "bahdanau_view_title": "Bahdanau 注意力，逐步查看：{title}",
        "page_title": "注意力权重",
        "view_layer": "层 ",
        "view_head": "头 ",
        "view_all_heads": "所有头",
        "view_hover": "把指针移到一个格子上，看它的查询、键和权重；移到一个查询上，看它的整行。",
        "view_masked": "已掩蔽",
        "view_masked_legend": "已掩蔽（不可关注，不是权重 0）",
        "view_weight_legend": "1  注意力权重",
        "view_query": "查询 ",
        "view_steps": "按顺序排列的输出词元：选一个，看产生它的源序列权重。",
        "view_step": "第 {n} 步：",
        "view_weighted": " \u2190 源序列按下面的权重加权",
    },
}


def check_language(language) -> str:
    """``language`` if it is one of :data:`LANGUAGES`; else a ``ValueError`` naming them."""
    if language not in LANGUAGES:
        raise ValueError(f"language must be one of {', '.join(map(repr, LANGUAGES))}, "
                         f"got {language!r}")
    return language


def words(language: str = "en") -> Mapping[str, str]:
    """The figures' and views' own words in ``language`` (read-only; format the ``{...}`` fields
    with :meth:`str.format`)."""
    return MappingProxyType(_WORDS[check_language(language)])


# Families and font file names of CJK fonts, the most common first.
_CJK_FAMILIES = ("Noto Sans CJK SC", "Noto Sans CJK JP", "Source Han Sans SC", "Source Han Sans CN",
                 "WenQuanYi Micro Hei", "WenQuanYi Zen Hei", "Droid Sans Fallback",
                 "PingFang SC", "Heiti SC", "Hiragino Sans GB", "Microsoft YaHei", "SimHei")
_CJK_FILES = re.compile(r"notosanscjk|sourcehansans|wqy|droidsansfallback|pingfang|stheiti|"
                        r"hiragino ?sans ?gb|msyh|simhei", re.IGNORECASE)


@functools.cache
def cjk_fonts() -> tuple[str, ...]:
    """The CJK font families installed on this machine, added (once per process) to the end of
    Matplotlib's ``font.family`` list, which it falls back along; ``()`` when there is none.

    Matplotlib's font list is cached on disk when Matplotlib first runs, so a font installed later
    is not in it: when the list has none, the system's font folders are searched once and the CJK
    fonts found there are added.
    """
    import matplotlib
    from matplotlib import font_manager

    def installed() -> list[str]:
        names = {font.name for font in font_manager.fontManager.ttflist}
        return [family for family in _CJK_FAMILIES if family in names]

    found = installed()
    if not found:
        for path in font_manager.findSystemFonts():
            if _CJK_FILES.search(path.replace("-", "").replace("_", "")):
                try:
                    font_manager.fontManager.addfont(path)
                except (OSError, RuntimeError, ValueError):  # a font file Matplotlib cannot read
                    continue
        found = installed()
    # Matplotlib falls back from one family of ``font.family`` to the next for a missing glyph
    # (a generic family such as "sans-serif" being one font).
    families = list(matplotlib.rcParams["font.family"])
    matplotlib.rcParams["font.family"] = [*families, *(f for f in found if f not in families)]
    return tuple(found)
