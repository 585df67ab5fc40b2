"""The tutorials and guides kept as MyST notebooks under docs/: each runs from its first cell to its
last without an error (the docs build runs them too, and shows what they print), and each Chinese
tutorial is its English twin translated — the prose in the Chinese edition's terms, and the same
code cells with their words (strings, comments, the figures' ``language="zh"``) in Chinese — so that
the Chinese page computes what the English one does. The docs build executes both.

Each notebook is a test class of its own, so that ``--dist loadscope`` runs them in parallel.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import jupytext  # the docs extra, which make test installs
import nbclient
import pytest

from tests.docs_support import DOCS, notebooks

ZH = DOCS / "zh"

#: The Chinese edition's terms (zh.d2l.ai), which the Chinese pages must use, and the renderings
#: they must not (other books' or machine translations' words for the same things).
TERMS = ("注意力汇聚", "查询", "键", "值", "掩蔽softmax", "加性注意力", "缩放点积注意力", "多头注意力",
         "自注意力", "位置编码")
NOT_TERMS = ("注意力池化", "掩码softmax", "遮蔽softmax", "加法注意力", "缩放点乘注意力", "位置嵌入编码")


def _english() -> list[Path]:
    return [path for path in notebooks() if ZH not in path.parents]


def _chinese() -> list[Path]:
    return [path for path in notebooks() if ZH in path.parents]


def _code_cells(path: Path) -> list[str]:
    notebook = jupytext.read(path)
    return [cell.source for cell in notebook.cells if cell.cell_type == "code"]


def _prose(path: Path) -> str:
    notebook = jupytext.read(path)
    return "\n".join(cell.source for cell in notebook.cells if cell.cell_type == "markdown")


def execute(path: Path):
    """Run every cell of the notebook at ``path`` in a fresh kernel, in its own folder (as the docs
    build does); raises ``nbclient.exceptions.CellExecutionError`` at the first failing cell."""
    notebook = jupytext.read(path)
    client = nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    return notebook


def _execution_test(path: Path):
    def test_runs_without_an_error(self):
        notebook = execute(path)
        code = [cell for cell in notebook.cells if cell.cell_type == "code"]
        assert code, f"{path}: no code cell"
        errors = [output for cell in code for output in cell.outputs
                  if output.output_type == "error"
                  or (output.output_type == "stream" and output.name == "stderr")]
        assert not errors, f"{path}: {errors}"
    return test_runs_without_an_error


# One class per English notebook (the Chinese ones have the same code: see below).
for _path in _english():
    _name = "TestNotebook_" + re.sub(r"\W", "_", _path.relative_to(DOCS).with_suffix("").as_posix())
    globals()[_name] = type(_name, (), {"test_runs_without_an_error": _execution_test(_path),
                                        "__doc__": f"{_path.relative_to(DOCS)} runs."})


def test_there_is_a_tutorial_per_book_section_and_the_guide():
    names = {path.relative_to(DOCS).with_suffix("").as_posix() for path in _english()}
    assert {"tutorials/attention-pooling", "tutorials/attention-scoring", "tutorials/bahdanau",
            "tutorials/multihead-attention", "tutorials/self-attention", "tutorials/transformer",
            "guides/check-your-implementation"} <= names, names


def test_every_tutorial_has_its_chinese_twin():
    english = {path.relative_to(DOCS) for path in _english() if path.parent.name == "tutorials"}
    chinese = {path.relative_to(ZH) for path in _chinese()}
    assert english == chinese, (english ^ chinese)


class _Words(ast.NodeTransformer):
    """Blanks what a translation may change in a code cell: its strings (the parts of an f-string
    outside its braces included) and the ``language=`` argument of the figures and views."""

    def visit_Constant(self, node):
        return ast.Constant("") if isinstance(node.value, str) else node

    def visit_JoinedStr(self, node):
        return ast.JoinedStr([self.visit(value) for value in node.values
                              if not isinstance(value, ast.Constant)])

    def visit_Call(self, node):
        node.keywords = [keyword for keyword in node.keywords if keyword.arg != "language"]
        return self.generic_visit(node)


def code_shape(source: str) -> tuple[list[str], str]:
    """What a Chinese code cell must keep of its English twin: its IPython magics as written and
    the rest as Python code, less its words (:class:`_Words`; comments do not count either)."""
    lines = source.splitlines()
    magics = [line for line in lines if line.lstrip().startswith(("%", "!"))]
    code = "\n".join(line for line in lines if not line.lstrip().startswith(("%", "!")))
    return magics, ast.dump(_Words().visit(ast.parse(code)))


@pytest.mark.parametrize("path", _chinese(), ids=lambda path: path.name)
def test_chinese_code_cells_are_the_english_ones(path):
    """The same code cells in the same order, the same code: only their words may be translated
    (strings, comments, ``language="zh"``), so that the Chinese page computes what the English
    one does and shows it in Chinese."""
    english = DOCS / path.relative_to(ZH)
    chinese_cells, english_cells = _code_cells(path), _code_cells(english)
    assert len(chinese_cells) == len(english_cells), (len(chinese_cells), len(english_cells))
    for number, (chinese, original) in enumerate(zip(chinese_cells, english_cells), start=1):
        assert code_shape(chinese) == code_shape(original), (
            f"{path.relative_to(DOCS)}: code cell {number} is not the English one translated:\n"
            f"{chinese}\n--- English ---\n{original}")


def test_the_code_shape_ignores_words_only():
    english = 'show(x, xlabel="Keys", title=f"{n} heads")  # the heads\n%matplotlib inline'
    assert code_shape('show(x, xlabel="键", title=f"{n} 个头", language="zh")  # 头\n'
                      '%matplotlib inline') == code_shape(english)
    for changed in ('show(y, xlabel="键", title=f"{n} 个头")', 'show(x, xlabel="键", title=f"{m}")',
                    'show(x, ylabel="键", title=f"{n}")', 'show(x, xlabel="Keys", title=f"{n} heads", dpi=2)'):
        assert code_shape(changed + "\n%matplotlib inline") != code_shape(english), changed


@pytest.mark.parametrize("path", _chinese(), ids=lambda path: path.name)
def test_chinese_prose_is_chinese_in_the_editions_terms(path):
    prose = _prose(path)
    han = len(re.findall(r"[\u4e00-\u9fff]", prose))
    assert han > 0.3 * len(re.findall(r"[A-Za-z\u4e00-\u9fff]", prose)), f"{path}: mostly not Chinese"
    wrong = [term for term in NOT_TERMS if term in prose]
    assert not wrong, f"{path}: {wrong} (the Chinese edition says otherwise)"


def test_the_chinese_tutorials_use_the_editions_terms():
    prose = "\n".join(_prose(path) for path in _chinese())
    missing = [term for term in TERMS if term not in prose]
    assert not missing, missing
