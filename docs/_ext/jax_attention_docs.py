"""The site's own Sphinx extension: generates the API and command-line references before the
build reads them, fails the build on an undocumented public name, puts the language switch and the
executed notebook's download link on every page, and writes the executed notebooks into the site.
"""

from __future__ import annotations

from pathlib import Path

import api_reference
import cli_reference
import jupytext
import nbformat
from jupyter_cache import get_cache
from myst_nb.sphinx_ import NbMetadataCollector
from sphinx.util import logging

logger = logging.getLogger(__name__)

#: The Chinese pages live under this folder, mirroring the English ones' paths.
ZH = "zh/"


def generate_references(app) -> None:
    """Write the generated pages; warn (an error under ``-W``) for each undocumented public name."""
    srcdir = Path(app.srcdir)
    names = api_reference.public_names()
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
    if pagename.startswith(ZH):
        context["language"] = "zh-CN"


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
    app.connect("html-page-context", page_context)
    app.connect("build-finished", write_notebooks)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
