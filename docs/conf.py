"""Sphinx configuration of the jax-attention site (`make docs` builds it into site/).

Offline by construction: the theme (Furo) ships its assets, MathJax is served from the site
itself (sphinx-mathjax-offline), and nothing else is loaded. The tutorials are MyST notebooks
executed during the build (MyST-NB, through a jupyter-cache keyed on the code cells: the English and
Chinese version of a tutorial have the same code, so one execution serves both); a failing cell
fails the build.
"""

import logging
import os
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS / "_ext"))

import jax_attention  # noqa: E402

project = "jax-attention"
author = "the jax-attention authors"
copyright = "the jax-attention authors; the English–French data: Tatoeba via manythings.org, CC-BY 2.0"
release = version = jax_attention.__version__
language = "en"

extensions = [
    "myst_nb",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "sphinx_copybutton",
    "sphinx-mathjax-offline",
    "jax_attention_docs",
]

root_doc = "index"
source_suffix = {".md": "myst-nb"}
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store", "**.ipynb_checkpoints"]
templates_path = ["_templates"]
html_static_path = ["_static"]
html_css_files = ["site.css"]
html_theme = "furo"
html_title = f"jax-attention {release}"
html_show_sourcelink = False
html_theme_options = {"top_of_page_buttons": []}
html_last_updated_fmt = None
html_js_files = ["file-search.js"]

# Search: one index of both languages. Sphinx's Chinese indexer segments Chinese words with jieba
# (the docs extra installs it), helped by the chapter's terms (_ext/search-words-zh.txt: 掩蔽, 置换,
# 热图 ... as whole words), and stems English words as the English indexer does.
html_search_language = "zh"
logging.getLogger("jieba").setLevel(logging.WARNING)  # its dictionary's loading notes
html_search_options = {"dict": str(DOCS / "_ext" / "search-words-zh.txt")}

# MyST: $...$ maths, ::: fences; headings get anchors down to level 3 (links such as page.md#heading).
myst_enable_extensions = ["dollarmath", "colon_fence", "deflist"]
myst_heading_anchors = 3

# MyST-NB: execute every notebook at build time through the cache; a failing cell fails the build.
nb_execution_mode = os.environ.get("JAX_ATTENTION_DOCS_EXECUTE", "cache")
nb_execution_cache_path = str(DOCS.parent / "build" / "docs" / "jupyter_cache")
nb_execution_raise_on_error = True
nb_execution_show_tb = True
nb_execution_timeout = 600
nb_merge_streams = True

# autodoc: signatures as written, members in source order, type hints in the description.
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_preserve_defaults = True
add_module_names = False
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_ivar = True
# The project's "Returns:" sections are prose (a tuple, a dict's keys), not "type: text": render
# them as written rather than split at the first colon.
napoleon_custom_sections = ["Returns", "Yields"]
viewcode_line_numbers = True

suppress_warnings = []
