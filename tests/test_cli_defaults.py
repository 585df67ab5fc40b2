"""First contact with the CLI (issue 17, items 2, 5 and part of 6): ``translate`` finds the model
a training run wrote and says which, a run says what it replaced, heatmaps named after their
sentence, empty sentences refused, help texts, consistent option spellings, and
``scripts/benchmarks.sh --help``.

Two training runs of the suite's tiny configuration (:mod:`tests.shared_runs`, so that the
compiled steps are shared) in a temporary folder: the first writes ``runs/bahdanau`` and a
directory of training checkpoints, a second, shorter one replaces the model.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from jax_attention.cli import build_parser
from jax_attention.cli.translate import find_models, plot_name
from tests.docs_support import read
from tests.shared_runs import run_main, tiny_flags

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """``runs/bahdanau`` of a 2-epoch run (with training checkpoints in ``training/``), then
    replaced by a 1-epoch run; the printed outputs of both."""
    root = tmp_path_factory.mktemp("first_contact")
    before = Path.cwd()
    os.chdir(root)
    try:
        first = run_main(["train", "bahdanau", *tiny_flags("bahdanau", epochs=2),
                       "--checkpoint-dir", "training"])
        second = run_main(["train", "bahdanau", *tiny_flags("bahdanau", epochs=1)])
    finally:
        os.chdir(before)
    assert first[0] == 0, first[2]
    assert second[0] == 0, second[2]
    return {"root": root, "first": first[1], "second": second[1]}


# --------------------------------------------------------------------------- train's output


def test_train_says_where_the_model_went_and_what_it_replaced(runs):
    assert "wrote checkpoint runs/bahdanau" in runs["first"]
    assert "replaced" not in runs["first"]
    lines = runs["second"].splitlines()
    assert ("replaced the bahdanau model in runs/bahdanau (trained 1 epoch; the one before had 2)"
            in lines)
    assert ("note: the model replaced came from a longer run (2 epochs, this run 1); to keep a "
            "longer run's model, give shorter runs another --checkpoint DIR") in lines


def test_train_without_out_says_no_plots_were_written(runs):
    for printed in (runs["first"], runs["second"]):
        assert printed.splitlines()[-1] == "no plots written (--out DIR writes them)"


# --------------------------------------------------------------------------- translate's model


def test_translate_uses_the_newest_model_under_runs_and_says_so(runs, monkeypatch):
    monkeypatch.chdir(runs["root"])
    status, out, err = run_main(["translate", "go ."])
    assert status == 0, err
    assert out.startswith("go . => ")
    assert err.splitlines() == [
        "jax-attention translate: note: using the bahdanau model in runs/bahdanau (newest under "
        "runs/); --checkpoint DIR chooses another"]
    # With --model, the newest of that kind; none of it: which command writes one.
    status, out, err = run_main(["translate", "--model", "transformer", "go ."])
    assert status == 2 and out == ""
    assert ("no transformer model under runs/ (looked for runs/*/config.json); train one with "
            "'jax-attention train transformer', which writes runs/transformer, "
            "or pass --checkpoint DIR") in err


def test_translate_without_a_model_says_which_command_writes_one(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    status, out, err = run_main(["translate", "go ."])
    assert status == 2 and out == ""
    assert "no trained model under runs/" in err
    assert "'jax-attention train transformer' (or 'make run'), which writes runs/transformer" in err


def test_translate_given_training_checkpoints_names_the_directory_to_pass(runs, monkeypatch):
    monkeypatch.chdir(runs["root"])
    assert any(entry.name.isdigit() for entry in (runs["root"] / "training").iterdir())
    status, out, err = run_main(["translate", "--checkpoint", "training", "go ."])
    assert status == 2 and out == ""
    assert "lacks config.json" not in err
    (line,) = [line for line in err.splitlines() if "error:" in line]
    assert "argument --checkpoint: 'training' holds training checkpoints" in line
    assert "a run's --checkpoint-dir), not an exported model" in line
    assert "pass the run's --checkpoint directory instead (default runs/<model>) " \
           "(runs/bahdanau here)" in line


def test_translate_given_the_runs_folder_names_the_models_in_it(runs, monkeypatch):
    monkeypatch.chdir(runs["root"])
    status, out, err = run_main(["translate", "--checkpoint", "runs", "go ."])
    assert status == 2 and out == ""
    assert ("argument --checkpoint: 'runs' is not a model but holds models in its folders; pass "
            "one of them: runs/bahdanau") in err


def test_find_models_newest_first_and_by_kind(tmp_path):
    for name, record in (("old", {"model": "transformer"}), ("legacy", {}),
                         ("new", {"model": "transformer"})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(record))
    (tmp_path / "training" / "10").mkdir(parents=True)
    now = time.time()
    for age, name in enumerate(("new", "legacy", "old")):
        os.utime(tmp_path / name / "config.json", (now - age * 10, now - age * 10))
    assert find_models(tmp_path) == [(tmp_path / "new", "transformer"),
                                     (tmp_path / "legacy", "bahdanau"),
                                     (tmp_path / "old", "transformer")]
    assert find_models(tmp_path, "bahdanau") == [(tmp_path / "legacy", "bahdanau")]
    assert find_models(tmp_path / "absent") == []


# --------------------------------------------------------------------------- translate's input


@pytest.mark.parametrize("sentences", [[""], ["go .", "  "]])
def test_translate_refuses_an_empty_sentence(sentences, tmp_path):
    # Refused before any model is looked for (there is none here).
    status, out, err = run_main(["translate", "--checkpoint", str(tmp_path / "none"), *sentences])
    assert status == 2 and out == ""
    which = "the sentence" if len(sentences) == 1 else "sentence 2"
    assert (f"argument SENTENCE: {which} is empty; give the words to translate, quoted, e.g. "
            "\"i lost .\"") in err


# --------------------------------------------------------------------------- heatmap names


def test_translate_names_heatmaps_after_the_sentence_and_keeps_earlier_ones(runs, tmp_path):
    checkpoint = str(runs["root"] / "runs" / "bahdanau")
    out = tmp_path / "heatmaps"
    status, printed, err = run_main(["translate", "--checkpoint", checkpoint, "--out", str(out),
                                  "i lost .", "he's calm .", "i lost ."])
    assert status == 0, err
    assert sorted(path.name for path in out.iterdir()) == [
        "translation_hes-calm.png", "translation_i-lost-2.png", "translation_i-lost.png"]
    assert "an earlier translation" not in printed  # one run: no earlier file was there
    first = (out / "translation_i-lost.png").read_bytes()
    status, printed, err = run_main(["translate", "--checkpoint", checkpoint, "--out", str(out),
                                  "--json", str(tmp_path / "t.json"), "i lost ."])
    assert status == 0, err
    assert (out / "translation_i-lost.png").read_bytes() == first
    assert (f"  note: {out / 'translation_i-lost.png'} exists (an earlier translation); not "
            f"overwritten, this heatmap goes to {out / 'translation_i-lost-3.png'}") in printed
    assert f"wrote {out / 'translation_i-lost-3.png'}" in printed
    record = json.loads((tmp_path / "t.json").read_text())
    assert record["plots"] == {"translation_i-lost-3": str(out / "translation_i-lost-3.png")}


@pytest.mark.parametrize(("sentence", "stem"), [
    ("i lost .", "translation_i-lost"), ("he's calm .", "translation_hes-calm"),
    ("Où est-il ?", "translation_o-est-il"), ("?!", "translation_sentence"),
    ("../../etc/passwd", "translation_etc-passwd"),
    ("a " * 40, "translation_" + "-".join(["a"] * 20)),
])
def test_plot_names_are_safe_slugs(sentence, stem, tmp_path):
    assert plot_name(tmp_path, sentence, set()) == (stem, None)
    assert plot_name(tmp_path, sentence, {stem}) == (f"{stem}-2", None)  # this run's: no note
    (tmp_path / f"{stem}.png").write_bytes(b"")
    kept = tmp_path / f"{stem}.png"
    assert plot_name(tmp_path, sentence, set()) == (f"{stem}-2", kept)
    assert plot_name(tmp_path, sentence, {f"{stem}-2"}) == (f"{stem}-3", kept)


# --------------------------------------------------------------------------- help and spellings


def _help(*words: str) -> str:
    status, out, _ = run_main([*words, "--help"])
    assert status == 0
    return " ".join(out.split())  # argparse's line breaks undone


def test_bench_attention_help_prints_single_percent_signs():
    text = _help("bench", "attention")
    assert "%%" not in text
    assert "(~25% of the keys)" in text and "% of a float32 GEMM ceiling" in text


def test_bench_memory_dtype_has_help():
    text = _help("bench", "memory")
    assert "--dtype {float32,bfloat16} dtype of the queries, keys and values" in text


def test_translate_help_states_the_defaults():
    text = _help("translate")
    assert "the newest model under runs/" in text and "translation_i-lost.png" in text
    assert "empty sentence is a usage error" in text


def test_model_and_devices_spellings_are_consistent():
    parser = build_parser()
    for spelling in ("--model", "--models"):
        args = parser.parse_args(["bench", "train", spelling, "transformer"])
        assert args.model == "transformer"
        args = parser.parse_args(["bench", "decode", spelling, "bahdanau"])
        assert args.models == ["bahdanau"]
    assert parser.parse_args(["bench", "decode", "--models", "transformer",
                              "bahdanau"]).models == ["transformer", "bahdanau"]
    # bench train --devices takes train's single count as well as a list of counts.
    assert parser.parse_args(["bench", "train", "--devices", "2"]).devices == [2]
    assert parser.parse_args(["bench", "train", "--devices", "1,2,4"]).devices == [1, 2, 4]
    assert parser.parse_args(["train", "transformer", "--devices", "2"]).devices == 2
    train = _help("bench", "train")
    assert "--model MODEL, --models MODEL" in train and "--devices N[,N...]" in train
    assert "'train --devices N'" in train
    assert "--models MODEL [MODEL ...], --model MODEL [MODEL ...]" in _help("bench", "decode")


# --------------------------------------------------------------------------- benchmarks.sh


def test_benchmarks_script_help_and_bad_options(tmp_path):
    script = ROOT / "scripts" / "benchmarks.sh"
    done = subprocess.run([str(script), "--help"], capture_output=True, text=True, cwd=tmp_path,
                          timeout=60)
    assert done.returncode == 0 and done.stderr == ""
    assert done.stdout.startswith("usage: scripts/benchmarks.sh [OUT_DIR]")
    text = " ".join(done.stdout.split())
    assert "seven runs of the four 'jax-attention bench' commands" in text
    assert "The command is the checkout's .venv/bin/jax-attention" in text
    assert list(tmp_path.iterdir()) == []  # --help is not an output folder
    done = subprocess.run([str(script), "-x"], capture_output=True, text=True, cwd=tmp_path,
                          timeout=60)
    assert done.returncode == 2 and "unknown option -x" in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_benchmarks_script_without_a_command_says_how_to_get_one(tmp_path):
    # A copy of the script outside the checkout, with no jax-attention on PATH.
    (tmp_path / "scripts").mkdir()
    script = tmp_path / "scripts" / "benchmarks.sh"
    script.write_bytes((ROOT / "scripts" / "benchmarks.sh").read_bytes())
    script.chmod(0o755)
    env = {key: value for key, value in os.environ.items() if key != "JAX_ATTENTION"}
    env["PATH"] = "/usr/bin:/bin"
    done = subprocess.run([str(script), str(tmp_path / "out")], capture_output=True, text=True,
                          env=env, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    assert "no jax-attention command" in done.stderr and "command not found" not in done.stderr
    assert ".venv/bin/pip install -e '.[test,torch]'" in done.stderr
    assert not (tmp_path / "out").exists()


def test_the_performance_page_describes_the_benchmarks_script_as_it_is():
    page = " ".join(read("docs/performance.md").split())
    script = (ROOT / "scripts" / "benchmarks.sh").read_text(encoding="utf-8")
    runs = [line for line in script.splitlines() if line.startswith("run ")]
    assert len(runs) == 7
    assert "runs seven benchmarks of the four `bench` commands" in page
    assert "four benchmarks" not in page


def test_benchmarks_script_runs_the_seven_benchmarks_and_times_them(tmp_path):
    # JAX_ATTENTION=/bin/echo stands in for the command: the invocations, not the benchmarks.
    env = {**os.environ, "JAX_ATTENTION": "/bin/echo"}
    done = subprocess.run([str(ROOT / "scripts" / "benchmarks.sh"), str(tmp_path / "out")],
                          capture_output=True, text=True, env=env, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    invocations = done.stdout.splitlines()
    assert len(invocations) == 7
    assert invocations[0] == (f"bench train --whole-run --model transformer --whole-run-cache "
                              f"both --no-progress --json {tmp_path / 'out'}/"
                              "whole-run-transformer.json")
    assert done.stderr.count(" took ") == 8
    assert done.stderr.splitlines()[-1].startswith("== all seven benchmarks took ")
    assert len(list((tmp_path / "out").glob("*.txt"))) == 7
