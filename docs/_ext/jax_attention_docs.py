"""The site's own Sphinx extension: generates the API and command-line references before the
build reads them, fails the build on an undocumented public name, puts the language switch and the
executed notebook's download link on every page, and writes the executed notebooks into the site.

It also makes the Chinese pages (under ``zh/``) a site of their own inside the site: their
navigation (the sidebar lists the Chinese tutorials, "previous" and "next" follow the Chinese
table of contents), the theme's words (搜索, 上一页 ...) and ``<html lang="zh-CN">``; and it joins the
lines of a Chinese paragraph without the space that a line break inside a sentence would render
(``句子里的 每个词元``).
"""

from __future__ import annotations

import functools
import gettext
import re
from pathlib import Path

import api_reference
import cli_reference
import jupytext
import nbformat
import sphinx
from docutils import nodes
from jupyter_cache import get_cache
from myst_nb.sphinx_ import NbMetadataCollector
from sphinx import addnodes
from sphinx.environment.adapters.toctree import TocTree
from sphinx.search.zh import SearchChinese
from sphinx.util import logging

logger = logging.getLogger(__name__)

#: The Chinese pages live under this folder, mirroring the English ones' paths.
ZH = "zh/"

#: The theme's words that Sphinx's own Chinese catalogue lacks (Furo's), in Chinese.
THEME_WORDS_ZH = {
    "Previous": "上一页", "Next": "下一页", "Home": "首页", "On this page": "本页内容",
    "Back to top": "回到顶部", "Made with ": "本站由 ",
    '<a href="https://www.sphinx-doc.org/">Sphinx</a> and ':
        '<a href="https://www.sphinx-doc.org/">Sphinx</a> 和 ',
    "Please activate JavaScript to enable the search functionality.": "请启用 JavaScript 以使用搜索功能。",
    "Edit this page": "编辑本页", "View this page": "查看本页",
}

# A line break between two Chinese characters (ideographs, full-width punctuation, and the dash,
# ellipsis and quotation marks Chinese text sets with them): joined.
_CJK = "\u2014\u2018-\u201d\u2026\u3000-\u303f\u3400-\u4dbf\u4e00-\u9fff\uff00-\uffef"
_CJK_BREAK = re.compile(f"(?<=[{_CJK}])[ \t]*\n[ \t]*(?=[{_CJK}])")


def generate_references(app) -> None:
    """Write the generated pages; warn (an error under ``-W``) for each undocumented public name."""
    srcdir = Path(app.srcdir)
    names = api_reference.public_names()
    api_reference.show_constructors(names)
    api_reference.write_pages(srcdir, names)
    cli_reference.write_page(srcdir)
    for problem in api_reference.undocumented(names):
        logger.warning("public name missing from the API reference: %s", problem,
                       type="jax_attention", subtype="api")


def counterpart(docname: str, found) -> tuple[str, str]:
    """The page in the other language (its docname and that language's name); the other
    language's home page when the page has no translation."""
    if docname.startswith(ZH):
        other, language = docname[len(ZH):], "English"
        home = "index"
    else:
        other, language = ZH + docname, "简体中文"
        home = ZH + "index"
    return (other if other in found else home), language


def executed_notebook(app, docname: str):
    """The executed notebook of a page, outputs included, from the build's execution cache (what
    MyST-NB shows on the page); ``None`` for a page that is not a notebook or was not executed.

    Read from the cache rather than MyST-NB's own copy, which lacks the outputs of a notebook
    whose execution came from the cache (the Chinese twins, any rebuild)."""
    if not NbMetadataCollector.get_exec_data(app.env, docname):
        return None
    notebook = jupytext.read(app.env.doc2path(docname))
    try:
        _, merged = get_cache(app.config.nb_execution_cache_path).merge_match_into_notebook(notebook)
    except KeyError:  # executed, but not through the cache (another execution mode)
        return None
    return merged


class SearchChineseAndEnglish(SearchChinese):
    """Sphinx's Chinese search (jieba's words, and English words stemmed as in English), whose
    script stems with the English stemmer that it ships: Sphinx 9 names the stemmer after the
    language (``ChineseStemmer``, defined nowhere), which stops the search page with an error."""

    language_name = "English"  # the JavaScript stemmer's name: EnglishStemmer


def join_chinese_lines(app, doctree) -> None:
    """Join the lines of the Chinese pages' paragraphs where both sides of the break are Chinese:
    HTML renders a line break as a space, which Chinese text has none of. A break is inside a
    text or a text of its own between two others (MyST's soft break, ``"\\n"``), around emphasis
    or a link too; code and maths are left as they are."""
    if not app.env.docname.startswith(ZH):
        return
    skip = (nodes.literal_block, nodes.literal, nodes.raw, nodes.math, nodes.math_block)
    for text in list(doctree.findall(nodes.Text)):
        parent = text.parent
        if parent is None or isinstance(parent, skip):
            continue
        # The text between the last character before it and the first after it (its neighbours'),
        # so that a break at its start or end, or a text that is only a break, is seen whole.
        # (By identity: Text is a str, and docutils' index() would find the first equal text.)
        at = next(i for i, child in enumerate(parent.children) if child is text)
        before = parent[at - 1].astext()[-1:].strip() if at > 0 else ""
        after = parent[at + 1].astext()[:1].strip() if at + 1 < len(parent) else ""
        joined = _CJK_BREAK.sub("", before + text.astext() + after)
        joined = joined[len(before):len(joined) - len(after)]
        if joined != text.astext():
            parent[at] = nodes.Text(joined)


@functools.cache
def _chinese_theme_words():
    """The ``gettext`` of the Chinese pages' templates: Sphinx's Chinese catalogue, then
    :data:`THEME_WORDS_ZH`."""
    catalogue = gettext.translation("sphinx", localedir=Path(sphinx.__file__).parent / "locale",
                                    languages=["zh_CN"], fallback=True)

    def translate(message: str) -> str:
        return THEME_WORDS_ZH.get(message) or catalogue.gettext(message)

    return translate


def _chinese_pages(env) -> list[str]:
    """The Chinese home page and the pages of its tables of contents, in reading order."""
    order = [ZH + "index"]
    for toctree in env.get_doctree(ZH + "index").findall(addnodes.toctree):
        order += [docname for _, docname in toctree["entries"] if docname in env.found_docs]
    return order


#: Sphinx's Chinese words of its scripts (the search's messages, "Hide Search Matches"), copied
#: into the site's ``_static`` for the Chinese pages.
SCRIPT_WORDS_ZH = Path(sphinx.__file__).parent / "locale" / "zh_CN" / "LC_MESSAGES" / "sphinx.js"


def chinese_search_page(app):
    """The Chinese pages' own search page, ``zh/search.html``: the same search over the whole
    site, its words in Chinese."""
    yield ZH + "search", {}, "search.html"


def chinese_navigation(app, pagename, templatename, context, doctree) -> None:
    """On a Chinese page (before the theme reads the context): the sidebar's table of contents
    from the Chinese home page, "previous" and "next" along the Chinese pages, the theme's words
    (the templates' and the scripts') in Chinese, and the search box leading to the Chinese search
    page."""
    if not pagename.startswith(ZH):
        return
    env, builder = app.env, app.builder
    root = env.get_doctree(ZH + "index")

    def toctree(collapse: bool = True, **options) -> str:
        resolved = [TocTree(env).resolve(
            pagename, builder, node, prune=True, maxdepth=int(options.get("maxdepth") or 0),
            titles_only=options.get("titles_only", False), collapse=collapse,
            includehidden=options.get("includehidden", False))
            for node in root.findall(addnodes.toctree)]
        return "".join(builder.render_partial(tree)["fragment"] for tree in resolved if tree)

    context["toctree"] = toctree
    order = _chinese_pages(env)
    if pagename in order:
        at = order.index(pagename)
        for key, other in (("prev", at - 1), ("next", at + 1)):
            context[key] = ({"link": context["pathto"](order[other]),
                             "title": env.titles[order[other]].astext()}
                            if 0 <= other < len(order) else None)
    context["gettext"] = _chinese_theme_words()
    context["language"] = "zh-CN"
    english_pathto = context["pathto"]

    def pathto(name: str, resource: int = 0) -> str:
        return english_pathto(ZH + "search" if name == "search" and not resource else name,
                              resource)

    context["pathto"] = pathto
    app.add_js_file("translations-zh.js")  # this page only (called while the page is written)
    if pagename == ZH + "search":
        app.add_js_file("search-links.js", defer="defer")  # its results' links, from the root


def page_context(app, pagename, templatename, context, doctree) -> None:
    """The language switch and, for an executed notebook, its download link."""
    if doctree is None:  # search, index and the source-code pages
        context["language_switch"] = None
        return
    other, language = counterpart(pagename, app.env.found_docs)
    context["language_switch"] = (context["pathto"](other), language)
    executed = NbMetadataCollector.get_exec_data(app.env, pagename) and \
        app.config.nb_execution_mode == "cache"
    context["notebook_download"] = context["pathto"](pagename + ".ipynb", 1) if executed else None


def copy_chinese_script_words(app, exception) -> None:
    """Copy Sphinx's Chinese words of its scripts into the site, for the Chinese pages."""
    if exception is None and app.builder.format == "html":
        (Path(app.outdir) / "_static" / "translations-zh.js").write_bytes(
            SCRIPT_WORDS_ZH.read_bytes())


def write_notebooks(app, exception) -> None:
    """Write each executed notebook beside its page, for the download link."""
    if exception is not None or app.builder.format != "html":
        return
    for docname in sorted(app.env.found_docs):
        notebook = executed_notebook(app, docname)
        if notebook is not None:
            target = Path(app.outdir, *docname.split("/")).with_suffix(".ipynb")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(nbformat.writes(notebook), encoding="utf-8")


def setup(app):
    app.connect("builder-inited", generate_references)
    app.add_search_language(SearchChineseAndEnglish)
    app.connect("doctree-read", join_chinese_lines)
    app.connect("html-collect-pages", chinese_search_page)
    app.connect("html-page-context", chinese_navigation, priority=400)  # before the theme's
    app.connect("html-page-context", page_context)
    app.connect("build-finished", write_notebooks)
    app.connect("build-finished", copy_chinese_script_words)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
