"""No sentence of a tutorial contradicts the output printed above it.

What a trained model learns — its translations, which head attends where, its loss and weights —
depends on the machine: XLA:CPU groups float32 sums in another order on CPUs with AVX-512 than on
CPUs with AVX2 only, and training grows those last-bit differences into other parameters. A
sentence written once about such a result (``"go ." comes out exactly``, ``head 4 sends most
queries to "home"``) is then false on the other machines, under the output that the docs build
executes there. So in the prose of a tutorial notebook after its first training cell
(:data:`TRAINING`), such facts come from the notebook's own output: printed by a code cell, or
glued (``glue("key", value, display=False)`` of ``myst_nb``, shown in the prose by
``{glue:text}`key```), or the sentence is rephrased to hold whatever the model learns. The rules,
sentence by sentence (:func:`prose_claims`; a glued value is not a claim, its role is removed
first):

- ``head``: a head named by its number (``head 4``, ``头 4``, ``第 2 个头``);
- ``value``: a loss, BLEU, weight or other measured value written out: a decimal number (section
  numbers such as §10.7.6 and 第 9.7 节, and a command-line option's value, excepted), a
  percentage, or ``≈ 17``;
- ``outcome``: what became of one of the book's sentences (:data:`BOOK_PAIRS`, English or
  French) — the sentence with an outcome word (``exactly``, ``becomes``, ``=>``, ``完全正确``,
  ``译成`` ...) —, a count of sentences right (``21 of these 24``), or a quoted token of those
  sentences with a verb of writing (``the step that writes "chez"``, ``写出“chez”``);
- ``attention``: a single token of the book's sentences, quoted, with a verb of attending (``the
  final `.` goes back to `i'm```, ``最后的 `.` 回看 `i'm```).

Everywhere in a notebook (:func:`notebook_claims`):

- ``pasted output``: a fenced block of output (``text``, ``console``, ``output``) in the prose:
  what a reader sees under a notebook's code is what the build executed, never a copy;
- ``glue``: a ``{glue}`` role or directive whose key no code cell of the same notebook glues
  (read statically: the literal first argument of a ``glue(...)`` call), and a key glued twice
  (myst-nb warns, and the docs build fails on warnings).

The rules are fast (no execution; tests/test_tutorials.py executes the notebooks) and checked on
planted claims below, so that a rule that stopped matching would fail here too.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import jupytext  # the docs extra, which make test installs
import pytest

from jax_attention.train import BOOK_PAIRS
from tests.docs_support import DOCS, NOTEBOOK_FRONT_MATTER, notebooks

#: A code cell that trains: after the first one, the prose may not state what training made.
TRAINING = re.compile(r"\btrain(?:_\w+)?\(")

#: The tutorials checked here: every notebook under docs/tutorials and docs/zh/tutorials.
TUTORIALS = [path for path in notebooks()
             if path.parent in (DOCS / "tutorials", DOCS / "zh" / "tutorials")]

# ------------------------------------------------------------------------------------- the rules

_GLUE_ROLE = re.compile(r"\{glue(?::(?:any|text|md))?\}`([^`]*)`")
_GLUE_DIRECTIVE = re.compile(r"^(?:```|:::)\{glue(?::(?:any|figure|math|md))?\}[ \t]+(\S+)",
                             flags=re.M)
_FENCE = re.compile(r"^(```+|:::+)[ \t]*([^\n`]*)\n.*?^\1[ \t]*$", flags=re.M | re.S)
#: The languages of a fenced block that holds a command's output.
OUTPUT_LANGUAGES = {"text", "txt", "console", "output", "plain", "none"}

_HEAD = re.compile(r"\bheads?\s+\d|头\s*\d|第\s*\d+\s*个头", flags=re.I)
_DECIMAL = re.compile(r"(?<![\w.])\d*\.\d+(?:\.\d+)*(?![\w.]*\d)")
_PERCENT = re.compile(r"\d\s*%")
_APPROX = re.compile(r"(?:≈|\\approx)\s*\d")
_OPTION_BEFORE = re.compile(r"--[\w-]+[ =]$")
#: Words that say what became of a sentence (with one of the book's sentences: an outcome).
_OUTCOME = re.compile("|".join([
    r"\bexact(?:ly)?\b", r"\bcorrect(?:ly)?\b", r"\bright\b", r"\bwrong\b", r"\bbecom(?:es|e)\b",
    r"\bbecame\b", r"\bcomes? out\b", r"\bgets?\b", r"\btranslat\w*\b", "=>", "→",
    "完全正确", "翻对", "翻错", "译成", "译为", "翻译成", "翻译为", "译作", "得到"]), flags=re.I)
#: A count of sentences: "21 of these 24", "24 个句子中的 21 个".
_COUNT = re.compile(r"\b\d+ of (?:these |the |its |all )?\d+\b|\d+\s*个(?:句子)?中的\s*\d+\s*个")
#: Verbs of writing (with a quoted token of the book's sentences: what the model wrote, an outcome).
_WRITES = re.compile(r"\bwr(?:ites?|ote|itten)\b|\bpredict\w*|\boutputs?\b|写出|预测出|输出", flags=re.I)
#: Verbs of attending (with a quoted token of the book's sentences: an attention claim).
_ATTENDS = re.compile("|".join([
    r"\battend\w*", r"\blook\w*", r"\bdraw\w*", r"\bgo(?:es)? back\b", r"\bsend\w*", r"\bputs?\b",
    r"\bpair(?:s|ed)?(?= [`\"“])", r"\bfocus\w*", r"\bspread\w*", r"\bconcentrat\w*",
    r"\bpoint\w* (?:at|to)\b",
    "关注", "回看", "回到", "看向", "取自", "引向", "放在", "分散在", "集中在", "指向"]), flags=re.I)
_QUOTED = re.compile(r"`([^`]+)`|\"([^\"]+)\"|“([^”]+)”")
#: The book's four sentences and their references, as the prose quotes them.
SENTENCES = tuple(sentence for pair in BOOK_PAIRS for sentence in pair)
#: Their tokens less the punctuation: a quoted one is a token the model read or wrote.
TOKENS = {token for sentence in SENTENCES for token in sentence.split() if token.isalpha()
          or "'" in token}


def _sentences(text: str) -> list[str]:
    """The sentences of a stretch of prose (English or Chinese), each on one line."""
    found = []
    for paragraph in re.split(r"\n\s*\n", text):
        paragraph = " ".join(paragraph.split())
        # a sentence ends at . ! ? before a capital letter (not inside a quoted ``go .``), or at
        # a Chinese full stop, exclamation or question mark, or semicolon
        parts = re.split(r"(?<=[.!?])\s+(?=[A-Z*])|(?<=[。！？；])", paragraph)
        found += [part for part in parts if part.strip()]
    return found


def _values(sentence: str) -> list[str]:
    values = []
    for match in _DECIMAL.finditer(sentence):
        before, after = sentence[:match.start()], sentence[match.end():]
        section = (match.group().count(".") > 1 or re.search(r"(§|第|[Ss]ection)\s*$", before)
                   or re.match(r"\s*节", after))
        if not section and not _OPTION_BEFORE.search(before):
            values.append(match.group())
    values += [match.group() for regex in (_PERCENT, _APPROX) for match in regex.finditer(sentence)]
    return values


def _names_a_sentence(sentence: str) -> bool:
    return any(re.search(rf"(?<![\w']){re.escape(book)}", sentence) for book in SENTENCES)


def prose_claims(text: str) -> list[tuple[str, str]]:
    """``(rule, sentence)`` for each sentence of ``text`` (prose after a training cell) that
    states a trained model's result literally; see the module's docstring for the rules."""
    text = _GLUE_ROLE.sub("⟨glued⟩", text)              # a glued value is the output's
    text = re.sub(r"\]\([^)]*\)", "]", text)             # a link's target is no prose
    claims = []
    for sentence in _sentences(text):
        if _HEAD.search(sentence):
            claims.append(("head", sentence))
        if _values(sentence):
            claims.append(("value", sentence))
        quoted = {next(group for group in match.groups() if group is not None)
                  for match in _QUOTED.finditer(sentence)} & TOKENS
        if ((_OUTCOME.search(sentence) and _names_a_sentence(sentence)) or _COUNT.search(sentence)
                or (quoted and _WRITES.search(sentence))):
            claims.append(("outcome", sentence))
        if quoted and _ATTENDS.search(sentence):
            claims.append(("attention", sentence))
    return claims


def _glued_keys(code: str) -> list[str]:
    """The keys that the ``glue(...)`` calls of a code cell glue; a key that is not a literal
    string is returned as ``"<not a literal>"`` (no static check could follow it)."""
    source = "\n".join(line for line in code.splitlines()
                       if not line.lstrip().startswith(("%", "!")))
    keys = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
            if name == "glue":
                first = node.args[0] if node.args else None
                literal = isinstance(first, ast.Constant) and isinstance(first.value, str)
                keys.append(first.value if literal else "<not a literal>")
    return keys


def glue_keys_used(prose: str) -> list[str]:
    """The keys of the ``{glue}`` roles (less a ``:format`` after the key) and directives."""
    return ([role.split(":", 1)[0].strip() for role in _GLUE_ROLE.findall(prose)]
            + _GLUE_DIRECTIVE.findall(prose))


@dataclass(frozen=True)
class Claim:
    """A rule's finding: the rule, the markdown cell's number (1-based, among all cells) and the
    sentence or block."""

    rule: str
    cell: int
    text: str


def notebook_claims(notebook) -> list[Claim]:
    """The claims of a notebook read by jupytext: the prose rules after its first training cell,
    the pasted-output and glue rules everywhere."""
    cells = notebook.cells
    code = [cell.source for cell in cells if cell.cell_type == "code"]
    glued = [key for source in code for key in _glued_keys(source)]
    trained = False
    claims = []
    for number, cell in enumerate(cells, start=1):
        if cell.cell_type == "code":
            trained = trained or bool(TRAINING.search(cell.source))
            continue
        if cell.cell_type != "markdown":
            continue
        prose = cell.source
        for match in _FENCE.finditer(prose):
            if match.group(2).strip().lower() in OUTPUT_LANGUAGES:
                claims.append(Claim("pasted output", number, match.group().splitlines()[0]))
        for key in glue_keys_used(prose):
            if key not in glued:
                claims.append(Claim("glue", number, f"{key!r} is not glued by a code cell"))
        if trained:
            outside_fences = _FENCE.sub("", prose)
            claims += [Claim(rule, number, sentence)
                       for rule, sentence in prose_claims(outside_fences)]
    for key in sorted({key for key in glued if glued.count(key) > 1 or key == "<not a literal>"}):
        claims.append(Claim("glue", 0, f"{key!r} glued {glued.count(key)} times"))
    return claims


def _claims_of(path: Path) -> set[tuple[str, str]]:
    return {(claim.rule, claim.text) for claim in notebook_claims(jupytext.read(path))}


# ------------------------------------------------------------------------------ the real pages

def test_the_tutorials_are_found():
    names = {path.relative_to(DOCS).as_posix() for path in TUTORIALS}
    assert {"tutorials/transformer.md", "tutorials/bahdanau.md", "zh/tutorials/transformer.md",
            "zh/tutorials/bahdanau.md"} <= names, names


@pytest.mark.parametrize("path", TUTORIALS, ids=lambda path: path.relative_to(DOCS).as_posix())
def test_no_tutorial_states_a_trained_result_in_its_prose(path):
    page = path.relative_to(DOCS).as_posix()
    found = sorted(_claims_of(path))
    assert not found, f"{page}:\n" + "\n".join(f"{rule}: {text}" for rule, text in found)


@pytest.mark.parametrize("path", [path for path in TUTORIALS
                                  if path.stem in ("transformer", "bahdanau")],
                         ids=lambda path: path.relative_to(DOCS).as_posix())
def test_the_translation_tutorials_glue_what_they_say_of_the_trained_model(path):
    """The two pages that train translation models state their results through glue: a glued key
    is used in the prose, and each key used is glued (the rule ``glue`` above)."""
    notebook = jupytext.read(path)
    prose = "\n".join(cell.source for cell in notebook.cells if cell.cell_type == "markdown")
    glued = {key for cell in notebook.cells if cell.cell_type == "code"
             for key in _glued_keys(cell.source)}
    assert glued, f"{path}: nothing glued"
    assert glued == set(glue_keys_used(prose)), glued ^ set(glue_keys_used(prose))


# ------------------------------------------------------------------------ the rules, on plants

@pytest.mark.parametrize("sentence, rule", [
    # what the tutorials said before they glued their results
    ("In the run shown here, \"go .\" and \"i'm home .\" come out exactly, while \"i lost .\" "
     "and \"he's calm .\" get a fluent but wrong French sentence.", "outcome"),
    ("`he's calm .` becomes `il est <unk> .` here as in the book's longer run.", "outcome"),
    ("With seed 0 it prints `loss 0.019` and gets `go .` and `i'm home .` exactly.", "value"),
    ("With seed 0 it prints `loss 0.019` and gets `go .` and `i'm home .` exactly.", "outcome"),
    ("Over seeds 0–5 it gets 21 of these 24 sentences exactly.", "outcome"),
    ("Row \"suis\" is the step that reads \"suis\" and writes \"chez\".", "outcome"),
    ("It falls fast at first; the book's 250 epochs bring it to about 0.020.", "value"),
    ("The first word draws mostly on `i'm` (its weight there is about one half).", "attention"),
    ("The final `.` goes back to `i'm`.", "attention"),
    ("Head 4 sends most queries to \"home\", head 1 pairs \"home\" and \".\" with each other.",
     "head"),
    ("Head 4 sends most queries to \"home\".", "attention"),
    ("In the second block, head 3 puts most of that step's weight on \"home\".", "head"),
    ("With $w \\approx 17$ the kernel is narrow.", "value"),
    ("After 300 steps it finds it in 98% of the test questions.", "value"),
    # the same in Chinese
    ("“go .”和“i'm home .”翻译得完全正确。", "outcome"),
    ("最后的 `.` 又回看 `i'm`。", "attention"),
    ("“suis”这一行是读入“suis”、写出“chez”的那一步；", "outcome"),
    ("头 4 把大多数查询引向“home”。", "head"),
    ("在第二个块中，第 3 个头把这一步的大部分权重放在“home”上。", "head"),
    ("在种子 0–5 上，它把这 24 个句子中的 21 个翻译得完全正确。", "outcome"),
    ("它最终的损失为 `loss 0.030`（书中为 0.032）。", "value"),
])
def test_a_planted_claim_is_found(sentence, rule):
    assert rule in {found for found, _ in prose_claims(sentence)}, prose_claims(sentence)


@pytest.mark.parametrize("sentence", [
    # what they say instead, and what holds on every machine
    "After this short training {glue:text}`bahdanau_exact` of the four sentences come out exactly.",
    "In the first block, head {glue:text}`gathering_head` sends {glue:text}`gathering_count` of "
    "its four queries to \"{glue:text}`gathering_key`\".",
    "No row puts more than {glue:text}`bahdanau_top_weight:.2f` of its weight on one token.",
    "The reference of `he's calm .` is `il est calme .`, and `calme` is in the French vocabulary.",
    "Take \"i'm home .\": the source is read as 4 tokens (`<eos>` included).",
    "The first query (`<bos>`) can only attend to itself.",
    "Each row is labelled by the word the step predicted (`<bos>` by the first word it wrote).",
    "At the step that reads “{glue:text}`cross_reads`” and writes “{glue:text}`cross_writes`”.",
    "Everything above the diagonal is exactly zero; each row sums to 1.",
    "The BLEU of §10.7.6, up to 2-grams (第 9.7 节); see section 11.4.",
    "Train on more pairs with `--num-examples 20000 --val-fraction 0.05`.",
    "A dictionary would match `je` to `i'm` and `chez moi` to `home`.",
    "We use $D = 32$, 4 heads, 2 blocks and 60 of the book's 200 epochs.",
    "See [The models](../models.md#section-2.5) for the runs.",
])
def test_a_sentence_that_holds_everywhere_is_not_a_claim(sentence):
    assert prose_claims(sentence) == [], prose_claims(sentence)


_PLANTED_NOTEBOOK = NOTEBOOK_FRONT_MATTER + """
Before training, nothing is a result yet: head 1 of a random model.

```{{code-cell}} ipython3
from myst_nb import glue

result = train_transformer(epochs=60)
glue("exact", 2, display=False)
```

{prose}
"""


def _planted(prose: str) -> set[tuple[str, str]]:
    return {(claim.rule, claim.text)
            for claim in notebook_claims(jupytext.reads(_PLANTED_NOTEBOOK.format(prose=prose),
                                                        fmt="md:myst"))}


def test_a_notebook_with_its_results_glued_has_no_claim():
    assert _planted("After training {glue:text}`exact` of the four come out exactly.") == set()


def test_a_notebook_claim_after_training_is_found_and_one_before_is_not():
    assert _planted("Now head 2 is the sharpest.") == {("head", "Now head 2 is the sharpest.")}


def test_a_misspelt_glue_key_is_found():
    claims = _planted("After training {glue:text}`exactt` of the four come out exactly.")
    assert claims == {("glue", "'exactt' is not glued by a code cell")}


def test_a_glue_directive_is_checked_too():
    assert _planted("```{glue:figure} figure\n```") == {
        ("glue", "'figure' is not glued by a code cell")}


def test_pasted_output_is_found():
    claims = _planted("With seed 0 it translates:\n\n```text\ngo . => va !, bleu 1.000\n```")
    assert ("pasted output", "```text") in claims
    # the block's contents are not read as prose, the block is the finding
    assert {rule for rule, _ in claims} == {"pasted output"}
