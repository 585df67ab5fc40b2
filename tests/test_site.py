"""The built docs site in a real browser: `make docs`, then `make test-browser`.

The site (``$JAX_ATTENTION_SITE``, default site/) is served on 127.0.0.1 and every page is opened in
headless Chromium (Debian's package, ``$JAX_ATTENTION_CHROMIUM`` or ``chromium`` on the PATH) with
the network off: every host name but 127.0.0.1 fails to resolve, and a request for anything not
served here is refused and counted. On every page: no console error, no uncaught exception, no
failed or refused request, every image loaded, the maths typeset (MathJax from the site itself);
every internal link leads to a page of the site and, with a ``#fragment``, to an element of it;
every page has the language switch and each tutorial its executed notebook. The search finds the
pages about the masked softmax. Screenshots of the home page, a tutorial in each language and an
API page are written to ``$JAX_ATTENTION_SCREENSHOTS`` (default build/docs/screenshots/).
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import re
import threading
from pathlib import Path
from urllib.parse import unquote, urldefrag, urlparse

import pytest

from tests.browser_support import Visit, browser  # noqa: F401  (a fixture)
from tests.docs_support import ROOT

pytestmark = pytest.mark.browser

SITE = Path(os.environ.get("JAX_ATTENTION_SITE", ROOT / "site")).resolve()
SCREENSHOTS = Path(os.environ.get("JAX_ATTENTION_SCREENSHOTS", ROOT / "build" / "docs" / "screenshots"))

#: Pages photographed for the reader of the closing note (and for anyone changing the theme).
SCREENSHOT_PAGES = {"home": "index.html", "tutorial-en": "tutorials/self-attention.html",
                    "tutorial-zh": "zh/tutorials/self-attention.html",
                    "api": "reference/api/jax_attention.nn.masking.html"}

#: The generated pages that are not the site's content (no language switch on them).
UTILITY_PAGES = ("search.html", "zh/search.html", "genindex.html", "py-modindex.html")


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def server():
    if not (SITE / "index.html").is_file():
        pytest.fail(f"no built site in {SITE}: run `make docs` first")
    handler = functools.partial(_Quiet, directory=str(SITE))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()
    httpd.server_close()


def _pages() -> list[str]:
    return sorted(path.relative_to(SITE).as_posix() for path in SITE.rglob("*.html"))


_IMAGES = """() => Array.from(document.images).filter(i => !(i.complete && i.naturalWidth > 0))
                                         .map(i => i.currentSrc || i.src)"""
_LINKS = """() => Array.from(document.querySelectorAll('a[href]')).map(a => a.href)"""
_IDS = """() => Array.from(document.querySelectorAll('[id]')).map(e => e.id)
               .concat(Array.from(document.querySelectorAll('a[name]')).map(a => a.name))"""
_MATHS = """async () => {
    if (!document.querySelector('.math')) return [0, 0];
    await window.MathJax.startup.promise;
    return [document.querySelectorAll('.math').length, document.querySelectorAll('mjx-container').length];
}"""


def _page_of(url: str, server: str) -> tuple[str, str]:
    address, fragment = urldefrag(url)
    path = unquote(urlparse(address).path).lstrip("/")
    if path == "" or path.endswith("/"):
        path += "index.html"
    return path, fragment


def test_every_page_loads_cleanly_offline(browser, server):
    visit = Visit(browser, server)
    problems, ids, links = [], {}, []
    pages = _pages()
    assert len(pages) > 100, pages
    for path in pages:
        page = visit.open(path)
        typeset = page.evaluate(_MATHS)
        if typeset[0] and not typeset[1]:
            visit.problems.append(f"{typeset[0]} formulas not typeset")
        broken = page.evaluate(_IMAGES)
        visit.problems += [f"image not loaded: {src}" for src in broken]
        content = path not in UTILITY_PAGES and not path.startswith("_modules/")
        if content and not page.query_selector("a.language-switch"):
            visit.problems.append("no language switch")
        ids[path] = set(page.evaluate(_IDS))
        links += [(path, href) for href in page.evaluate(_LINKS) if href.startswith(server)]
        problems += [f"{path}: {problem}" for problem in visit.problems]
    visit.context.close()
    for path, href in links:
        target, fragment = _page_of(href, server)
        if not (SITE / target).is_file():
            problems.append(f"{path}: broken link {href}")
        elif fragment and target.endswith(".html") and fragment not in ids.get(target, set()):
            problems.append(f"{path}: no anchor #{fragment} in {target}")
    assert not problems, "\n".join(problems[:50])


def test_each_tutorial_offers_its_executed_notebook(browser, server):
    visit = Visit(browser, server)
    tutorials = [path for path in _pages() if "tutorials/" in path or path.startswith("guides/")]
    assert len(tutorials) >= 13, tutorials
    for path in tutorials:
        page = visit.open(path)
        link = page.query_selector("a.notebook-download")
        assert link is not None, f"{path}: no notebook download"
        target, _ = _page_of(link.evaluate("a => a.href"), server)
        notebook = json.loads((SITE / target).read_text(encoding="utf-8"))
        outputs = [output for cell in notebook["cells"] if cell["cell_type"] == "code"
                   for output in cell["outputs"]]
        assert outputs, f"{target}: not executed"
        prose = "".join(cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
                        for cell in notebook["cells"] if cell["cell_type"] == "markdown")
        han = len(re.findall(r"[\u4e00-\u9fff]", prose)) / len(re.findall(r"[A-Za-z\u4e00-\u9fff]", prose))
        assert (han > 0.3) == path.startswith("zh/"), (target, han)  # the page's language
        if "tutorials/" in path:  # the book's figures
            assert any("image/png" in output.get("data", {}) for output in outputs), target
        assert not visit.problems, visit.problems
    visit.context.close()


def test_the_search_finds_the_masked_softmax(browser, server):
    visit = Visit(browser, server)
    page = visit.open("search.html?q=masked+softmax")
    page.wait_for_selector("#search-results ul.search li", timeout=30_000)
    found = page.eval_on_selector_all("#search-results ul.search li a", "links => links.map(a => a.href)")
    pages = {_page_of(href, server)[0] for href in found}
    assert {"masking.html", "tutorials/attention-scoring.html",
            "reference/api/jax_attention.nn.masking.html"} <= pages, sorted(pages)
    assert not visit.problems, visit.problems
    visit.context.close()


#: The Chinese tutorials in the order of the Chinese home page's table of contents.
CHINESE_TUTORIALS = ["attention-pooling", "attention-scoring", "bahdanau", "multihead-attention",
                     "self-attention", "transformer"]

_NAVIGATION = """() => ({
    lang: document.documentElement.lang,
    sidebar: Array.from(document.querySelectorAll('.sidebar-tree a.reference')).map(a => a.href),
    captions: Array.from(document.querySelectorAll('.sidebar-tree .caption')).map(c => c.innerText),
    prev: (document.querySelector('a.prev-page') || {}).href || null,
    next: (document.querySelector('a.next-page') || {}).href || null,
    search: document.querySelector('input.sidebar-search').placeholder,
    words: Array.from(document.querySelectorAll('.prev-page .context, .next-page .context, '
        + '.back-to-top, .toc-title')).map(e => e.innerText.trim()).filter(t => t),
})"""


def test_the_chinese_pages_are_a_chinese_site(browser, server):
    """On a Chinese page: <html lang="zh-CN">, the sidebar lists the Chinese tutorials only,
    "previous" and "next" follow them (the home page first), and the theme's words are Chinese."""
    visit = Visit(browser, server)
    order = ["zh/index.html", *(f"zh/tutorials/{name}.html" for name in CHINESE_TUTORIALS)]
    for at, path in enumerate(order):
        page = visit.open(path)
        seen = page.evaluate(_NAVIGATION)
        assert seen["lang"] == "zh-CN", (path, seen)
        sidebar = [_page_of(href, server)[0] for href in seen["sidebar"]]
        assert sidebar == order[1:], (path, sidebar)
        assert seen["captions"] == ["教程"], (path, seen["captions"])
        prev = _page_of(seen["prev"], server)[0] if seen["prev"] else None
        nxt = _page_of(seen["next"], server)[0] if seen["next"] else None
        assert prev == (order[at - 1] if at else None), (path, prev)
        assert nxt == (order[at + 1] if at + 1 < len(order) else None), (path, nxt)
        assert seen["search"] == "搜索"
        english = [word for word in seen["words"] if re.search(r"[A-Za-z]{3}", word)
                   and not re.search(r"[\u4e00-\u9fff]", word)]
        assert not english, (path, seen["words"])
        assert not visit.problems, (path, visit.problems)
    english = visit.open("changelog.html").evaluate(_NAVIGATION)
    assert english["lang"] == "en" and english["next"] is None  # the English pages end there
    assert not any("/zh/" in href for href in english["sidebar"]), english["sidebar"]
    visit.context.close()


def test_chinese_sentences_have_no_stray_spaces():
    """A line break inside a Chinese sentence of the source renders as a space in HTML: the
    build joins such lines, so no prose of a Chinese page has a break between two Chinese
    characters (code, scripts and styles aside)."""
    pages = sorted((SITE / "zh").rglob("*.html"))
    assert len(pages) >= 7, pages
    cjk = "\u2014\u2018-\u201d\u2026\u3000-\u303f\u4e00-\u9fff\uff00-\uffef"
    found = []
    for path in pages:
        text = re.sub(r"<pre.*?</pre>|<script.*?</script>|<style.*?</style>", "",
                      path.read_text(encoding="utf-8"), flags=re.S)
        found += [f"{path.relative_to(SITE)}: {text[m.start() - 30:m.end() + 10]!r}"
                  for m in re.finditer(f"[{cjk}][ \t]*\n[ \t]*[{cjk}]", text)]
    assert not found, "\n".join(found[:20])


@pytest.mark.parametrize("word, page", [("掩蔽", "zh/tutorials/attention-scoring.html"),
                                        ("置换", "zh/tutorials/self-attention.html"),
                                        ("热图", "zh/tutorials/bahdanau.html"),
                                        ("注意力汇聚", "zh/tutorials/attention-pooling.html")])
def test_the_search_finds_chinese_words(browser, server, word, page):
    """Sphinx's Chinese search (jieba's words and the chapter's terms) finds a word of the prose;
    the Chinese pages' search box leads to their own search page, which speaks Chinese."""
    visit = Visit(browser, server)
    start = visit.open(page)
    assert _page_of(start.eval_on_selector("form.sidebar-search-container", "f => f.action"),
                    server)[0] == "zh/search.html"
    results = visit.open(f"zh/search.html?q={word}")
    results.wait_for_selector("#search-results ul.search li", timeout=30_000)
    assert results.evaluate("document.documentElement.lang") == "zh-CN"
    assert results.inner_text("#search-results h2") == "搜索结果"
    found = results.eval_on_selector_all("#search-results ul.search li a",
                                         "links => links.map(a => a.href)")
    assert page in {_page_of(href, server)[0] for href in found}, (word, found)
    assert not visit.problems, visit.problems
    visit.context.close()


def test_the_search_from_a_file_lists_its_pages_without_errors(browser):
    """Opened as a file (no server), the browser refuses the requests for the pages' summaries:
    the search then lists the pages found by their titles, with no error in the console."""
    visit = Visit(browser, SITE.as_uri() + "/")
    page = visit.open("search.html?q=masked+softmax")
    page.wait_for_selector("#search-results ul.search li", timeout=30_000)
    assert page.eval_on_selector_all("#search-results ul.search li a", "links => links.length") > 3
    page.wait_for_timeout(500)
    assert not visit.problems, visit.problems
    visit.context.close()


def test_screenshots(browser, server):
    """The pages a reviewer looks at, photographed whole (tall pages: the first 4000 pixels), and
    the interactive views two tutorials embed."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    visit = Visit(browser, server)
    for name, path in SCREENSHOT_PAGES.items():
        page = visit.open(path)
        page.evaluate(_MATHS)
        height = min(page.evaluate("document.body.scrollHeight"), 4000)
        page.screenshot(path=str(SCREENSHOTS / f"{name}.png"),
                        clip={"x": 0, "y": 0, "width": 1280, "height": height}, full_page=True)
        assert not visit.problems, (path, visit.problems)
    # The interactive view a tutorial embeds, drawn inside the page by its own script.
    for name, path in {"tutorial-view-transformer": "tutorials/transformer.html",
                       "tutorial-view-bahdanau-zh": "zh/tutorials/bahdanau.html"}.items():
        page = visit.open(path)
        view = page.locator(".ja-view").first
        assert view.locator("table.ja-matrix").count() >= 1, path
        view.screenshot(path=str(SCREENSHOTS / f"{name}.png"))
        assert not visit.problems, (path, visit.problems)
    visit.context.close()
