"""docs/guides/check-your-implementation.md, the conformance kit's guide, runs as the docs build
runs it: a MyST notebook executed cell by cell in a Jupyter kernel (jupytext reads it, nbclient
executes it), so that every output it shows is real. Its step 4 wraps the book's PyTorch code,
hence this module's place among the cross-framework tests.

tests/test_tutorials.py runs it too, as every notebook, for errors alone; here its outputs are
read. The guide asserts its own claims in visible cells (its module passes everything; the planted
softmax bug fails exactly the large-score cases in both dtypes; the book's code fails exactly the
fully masked rows); a failing cell fails here. The outputs are checked on top of that (nothing
on stderr), and the guide must leave the repository as it found it (it works in a temporary
folder).
"""

from __future__ import annotations

import pytest

from tests.docs_support import NOTEBOOK_FRONT_MATTER, ROOT
from tests.torch_support import import_torch

import_torch()
import jupytext  # noqa: E402  (the docs extra, which make test installs)
import nbclient  # noqa: E402

GUIDE = ROOT / "docs" / "guides" / "check-your-implementation.md"
FRONT_MATTER = NOTEBOOK_FRONT_MATTER + "\n# Check your own implementation\n"

def _outputs(cell) -> str:
    """What a code cell printed (streams and results), as one text."""
    parts = []
    for output in cell.get("outputs", []):
        if output.output_type == "stream":
            parts.append(output.text)
        elif output.output_type in ("execute_result", "display_data"):
            parts.append(output.data.get("text/plain", ""))
    return "".join(parts)


@pytest.fixture(scope="module")
def executed():
    notebook = jupytext.read(GUIDE)
    before = {path for path in GUIDE.parent.iterdir()}
    nbclient.NotebookClient(notebook, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(GUIDE.parent)}}).execute()
    assert {path for path in GUIDE.parent.iterdir()} == before  # nothing written beside it
    return notebook


def test_the_guide_is_a_myst_notebook():
    text = GUIDE.read_text(encoding="utf-8")
    assert text.startswith(FRONT_MATTER)
    assert "```{code-cell} ipython3" in text
    assert "](../conformance.md)" in text and "](../masking.md)" in text


def test_the_guide_executes_and_shows_what_it_says(executed):
    notebook = executed
    cells = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert not [output for cell in cells for output in cell.get("outputs", [])
                if output.output_type == "error"
                or (output.output_type == "stream" and output.name == "stderr")]
    printed = "\n".join(_outputs(cell) for cell in cells)
    # Step 2: the module passes every case of its three functions, in both dtypes, and the
    # command exits 0.
    assert "OK: 35 passed, 0 failed, 0 n/a, 36 not covered (35 rows, float64)" in printed
    assert "OK: 35 passed, 0 failed, 0 n/a, 36 not covered (35 rows, float32)" in printed
    assert "exit status 0" in printed
    # Step 3: the naive softmax fails the three large-score cases, with NaN, in both dtypes.
    for dtype in ("float64", "float32"):
        assert f"FAILED: 32 passed, 3 failed, 0 n/a, 36 not covered (35 rows, {dtype})" in printed
    for case in ("masked_softmax", "dot_product_attention", "multi_head_attention"):
        assert f"FAIL {case}.large_scores" in printed
    assert "weights: non-finite values" in printed
    # Step 4: the book's code: every case it cannot express n/a with its reason, and exactly the
    # fully masked rows fail, with uniform weights where zeros are expected.
    assert "failed:         ['dot_product_attention.fully_masked_row', " \
           "'masked_softmax.fully_masked_row', 'multi_head_attention.fully_masked_row']" in printed
    assert "n/a  dot_product_attention.causal" in printed
    assert "raised NotImplementedError: the book's DotProductAttention has no is_causal" in printed
    assert "the book's weights: [0.25 0.25 0.25 0.25]" in printed
    assert "the expected:       [0. 0. 0. 0.]" in printed
    book_summary = [line for line in printed.splitlines()
                    if line.strip().startswith("FAILED: 14 passed, 3 failed, 18 n/a")]
    assert len(book_summary) == 1
