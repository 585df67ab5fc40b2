"""`jax-attention train bahdanau` and `jax-attention translate`, run in-process; checkpoints.

The session's tiny Bahdanau run (:func:`tests.shared_runs.tiny_run`, trained once for every test
that needs a trained model) gives the export, the JSON and the plots that the tests read.
"""

from __future__ import annotations

import json
import shutil

import chex
import matplotlib.image
import numpy as np
import pytest

from jax_attention.data import archive, nmt as data
from jax_attention.models.bahdanau import flatten_params, translate
from jax_attention.cli import main
from jax_attention.train import BOOK_PAIRS, load_checkpoint, save_checkpoint, train_bahdanau
from tests.reproducibility import assert_same_params
from tests.shared_runs import (EPOCHS, run_main, run_main_counting_compilations, tiny_flags,
                               tiny_settings)
from tests.test_attention_view import page_views

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
TINY_ARGS = tiny_flags("bahdanau")


@pytest.fixture(scope="module")
def trained(tiny_run):
    run = tiny_run("bahdanau")
    return {"checkpoint": run.model, "out": run.plots, "json": run.root / "run.json",
            "printed": run.stdout}


def test_train_writes_checkpoint_json_and_plots(trained):
    printed = trained["printed"]
    assert f"epoch {EPOCHS}, loss" in printed and "tokens/sec" in printed
    for source, _ in BOOK_PAIRS:
        assert f"{source} => " in printed
    assert printed.count(", bleu ") == 4

    assert sorted(p.name for p in trained["checkpoint"].iterdir()) == [
        "config.json", "params.npz", "src_vocab.json", "tgt_vocab.json"]
    # The atomic write leaves no temporary directory behind.
    assert sorted(p.name for p in trained["checkpoint"].parent.iterdir()) == [
        "model", "plots", "run.json", "train"]

    plots = {"loss": trained["out"] / "bahdanau_loss.png",
             "attention": trained["out"] / "bahdanau_attention.png",
             "view": trained["out"] / "bahdanau_attention.html"}
    assert sorted(p.name for p in trained["out"].iterdir()) == sorted(
        path.name for path in plots.values())
    for path in (plots["loss"], plots["attention"]):
        assert path.read_bytes()[:8] == PNG_SIGNATURE
        assert matplotlib.image.imread(path).ndim == 3
    # The interactive view of the last sentence, step by step, listed like the PNGs.
    (view,) = page_views(plots["view"])
    assert view["steps"]["source"] == view["tabs"][0]["keys"]
    assert "i'm home ." in view["title"]
    for path in plots.values():
        assert f"wrote {path}" in printed

    record = json.loads(trained["json"].read_text())
    assert record["command"] == "train bahdanau"
    assert record["final_loss"] == record["losses"][-1] and len(record["losses"]) == EPOCHS
    assert record["tokens_per_sec"] > 0 and record["wall_time_s"] > 0
    assert [t["source"] for t in record["translations"]] == [s for s, _ in BOOK_PAIRS]
    assert [t["reference"] for t in record["translations"]] == [r for _, r in BOOK_PAIRS]
    assert all(0 <= t["bleu"] <= 1 for t in record["translations"])
    assert record["config"]["training"]["seed"] == 1 and record["config"]["num_steps"] == 6
    assert record["checkpoint"] == str(trained["checkpoint"])
    assert record["plots"] == {name: str(path) for name, path in plots.items()}
    assert {"jax", "flax", "optax", "backend"} <= set(record)
    for t in record["translations"]:
        assert f"{t['source']} => {t['translation']}, bleu {t['bleu']:.3f}" in trained["printed"]


def test_translate_prints_the_translations(trained, tmp_path, capsys):
    out, record_path = tmp_path / "heatmaps", tmp_path / "t.json"
    status = main(["translate", "--checkpoint", str(trained["checkpoint"]), "--out", str(out),
                   "--json", str(record_path), "i lost .", "go go go go go go go go .",
                   "zorglub ."])
    assert status == 0
    printed = capsys.readouterr().out
    lines = printed.splitlines()
    assert lines[0].startswith("i lost . => ")
    assert "note: source truncated" in printed and "num_steps = 6" in printed
    assert "note: unknown words read as <unk>: zorglub" in printed
    record = json.loads(record_path.read_text())
    assert [t["source"] for t in record["translations"]] == [
        "i lost .", "go go go go go go go go .", "zorglub ."]
    assert record["translations"][1]["truncated"]
    assert record["translations"][2]["unknown_words"] == ["zorglub"]
    # Each heatmap is named after its sentence.
    assert sorted(record["plots"]) == ["translation_go-go-go-go-go-go-go-go",
                                       "translation_i-lost", "translation_zorglub"]
    for name, path in record["plots"].items():
        assert path.endswith(f"{name}.png")
        with open(path, "rb") as stream:
            assert stream.read(8) == PNG_SIGNATURE
    # The same translations as the library call on the loaded checkpoint.
    checkpoint = load_checkpoint(trained["checkpoint"])
    direct = translate(checkpoint.params, "i lost .", checkpoint.src_vocab, checkpoint.tgt_vocab,
                       checkpoint.config["num_steps"])
    assert lines[0] == f"i lost . => {direct.translation}"


def test_translate_writes_one_html_page_of_every_sentence(trained, tmp_path, capsys):
    page, record_path = tmp_path / "views" / "translations.html", tmp_path / "t.json"
    sentences = ["i lost .", "zorglub .", "he's calm ."]
    status = main(["translate", "--checkpoint", str(trained["checkpoint"]), "--html", str(page),
                   "--json", str(record_path), *sentences])
    assert status == 0
    printed = capsys.readouterr().out
    assert f"wrote {page}" in printed
    record = json.loads(record_path.read_text())
    assert record["plots"] == {"view": str(page)}  # listed like --out's heatmaps
    assert "<title>Bahdanau seq2seq attention: 3 translations" in page.read_text()
    views = page_views(page)
    assert len(views) == 3  # one per sentence, in order
    for view, sentence, result in zip(views, sentences, record["translations"]):
        assert sentence in view["title"] and result["translation"] in view["title"]
        (tab,) = view["tabs"]
        outputs = result["translation"].split() + (["<eos>"] if result["finished"] else [])
        assert tab["keys"] == result["source_tokens"] == view["steps"]["source"]
        assert tab["queries"] == outputs == view["steps"]["outputs"]
        # The weights the JSON record holds, to the float32.
        np.testing.assert_array_equal(np.asarray(tab["weights"], np.float32)[0, 0],
                                      np.asarray(result["attention_weights"], np.float32))
    assert "<unk>" in views[1]["tabs"][0]["keys"]  # zorglub is read as <unk>


def _unwritable_html(case, tmp_path, read_only):
    afile = tmp_path / "afile"
    afile.write_text("a user's file\n")
    return {"under a file": (afile / "t.html", "cannot be created"),
            "a directory": (tmp_path, "is a directory"),
            "read-only": (read_only / "t.html", "cannot be written"),
            "the --json file": (tmp_path / "t.json", "must differ from --json")}[case]


@pytest.mark.parametrize("case", ["under a file", "a directory", "read-only", "the --json file"])
def test_an_html_path_that_cannot_be_written_is_refused_before_any_work(trained, tmp_path, case):
    from tests.fault_support import assert_one_line, read_only_dir, tree_snapshot

    with read_only_dir(tmp_path) as read_only:
        html, reason = _unwritable_html(case, tmp_path, read_only)
        before = tree_snapshot(tmp_path)
        status, out, err, compiled = run_main_counting_compilations(
            ["translate", "--checkpoint", str(trained["checkpoint"]), "--html", str(html),
             "--json", str(tmp_path / "t.json"), "i lost ."])
        assert status == 2, err
        line = assert_one_line(err, "argument --html:", reason)
        assert "usage:" not in err
        assert out == "" and compiled == 0, (out, compiled)  # nothing loaded or translated
        assert tree_snapshot(tmp_path) == before, line  # nothing written


def test_a_full_disk_under_html_is_one_line_and_exit_status_4(trained, tmp_path):
    """The check passes (the folder takes a small file) but the page does not fit: the
    translations are printed all the same, the error is one line, no partial page is left."""
    from jax_attention.cli.arguments import EXIT_WRITE_FAILED
    from tests.fault_support import assert_one_line, fill, full_dir

    with full_dir(tmp_path, size_kib=256) as full:
        fill(full, leave_bytes=8 * 1024)  # a view is about 30 KB
        before = sorted(full.iterdir())
        status, out, err = run_main(["translate", "--checkpoint", str(trained["checkpoint"]),
                                     "--html", str(full / "t.html"), "i lost .", "go ."])
        assert status == EXIT_WRITE_FAILED, err
        assert_one_line(err, f"could not write {full / 't.html'}", "No space left")
        assert out.startswith("i lost . => ") and "\ngo . => " in out
        assert sorted(full.iterdir()) == before  # no page, no temporary left behind


def test_checkpoint_round_trip(trained, tmp_path):
    # The same run, in-process: bit-identical to the one the command saved (on CPU).
    run = train_bahdanau(**tiny_settings("bahdanau"))
    loaded = load_checkpoint(trained["checkpoint"])
    assert_same_params(loaded.params, run.params)
    assert loaded.src_vocab == run.src_vocab and loaded.tgt_vocab == run.tgt_vocab
    # save -> load -> identical parameters and translations.
    saved = save_checkpoint(tmp_path / "again", run.params, run.src_vocab, run.tgt_vocab,
                            run.config)
    again = load_checkpoint(saved)
    chex.assert_trees_all_equal(again.params, run.params)
    assert again.config["training"] == run.config["training"]
    assert {"jax", "flax", "jax-attention"} <= set(again.config["versions"])
    sentences = [source for source, _ in BOOK_PAIRS]
    before = translate(run.params, sentences, run.src_vocab, run.tgt_vocab, 6)
    after = translate(again.params, sentences, again.src_vocab, again.tgt_vocab, 6)
    assert [t.translation for t in after] == [t.translation for t in before] == [
        t.translation for _, t in run.translations]
    for a, b in zip(after, before):
        np.testing.assert_array_equal(a.weights, b.weights)
    # Saving over an existing checkpoint replaces it, leaving nothing else behind.
    save_checkpoint(saved, run.params, run.src_vocab, run.tgt_vocab, run.config)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["again"]


def _copy(trained, tmp_path):
    return shutil.copytree(trained["checkpoint"], tmp_path / "copy")


@pytest.mark.parametrize(("damage", "error", "message"), [
    (lambda d: (d / "params.npz").write_bytes((d / "params.npz").read_bytes()[:100]),
     ValueError, r"params.npz cannot be read"),
    (lambda d: (d / "params.npz").unlink(), FileNotFoundError, r"lacks params.npz"),
    (lambda d: (d / "config.json").write_text("{not json"), ValueError,
     r"config.json is not valid JSON"),
    (lambda d: (d / "config.json").write_text('{"format": "other"}'), ValueError,
     r"config.json is not a Bahdanau checkpoint config"),
    (lambda d: (d / "tgt_vocab.json").write_text("[]"), ValueError,
     r"tgt_vocab.json is not a vocabulary"),
    (lambda d: (d / "src_vocab.json").write_text((d / "tgt_vocab.json").read_text()), ValueError,
     r"src_vocab.json has \d+ tokens but config.json says src_vocab_size"),
    (lambda d: _rewrite_params(d, "decoder/dense/b", lambda a: a[:-1]), ValueError,
     r"parameter 'decoder/dense/b' has shape"),
    (lambda d: _rewrite_params(d, "encoder/embedding", lambda a: a * np.nan), ValueError,
     r"parameter 'encoder/embedding' holds NaN or Inf"),
    (lambda d: _rewrite_params(d, "decoder/attention/w_v", None), ValueError,
     r"holds the wrong parameters: missing \['decoder/attention/w_v'\]"),
])
def test_corrupt_checkpoint_gives_a_clear_error(trained, tmp_path, damage, error, message):
    directory = _copy(trained, tmp_path)
    damage(directory)
    with pytest.raises(error, match=message):
        load_checkpoint(directory)


def _rewrite_params(directory, name, change):
    with np.load(directory / "params.npz") as stored:
        flat = {key: stored[key] for key in stored.files}
    if change is None:
        del flat[name]
    else:
        flat[name] = change(flat[name])
    with open(directory / "params.npz", "wb") as stream:
        np.savez(stream, **flat)


def test_translate_with_a_bad_checkpoint_exits_2(trained, tmp_path, capsys):
    directory = _copy(trained, tmp_path)
    (directory / "params.npz").write_bytes(b"garbage")
    with pytest.raises(SystemExit) as exit_info:
        main(["translate", "--checkpoint", str(directory), "go ."])
    assert exit_info.value.code == 2
    assert "params.npz cannot be read" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main(["translate", "--checkpoint", str(tmp_path / "none"), "go ."])
    assert exit_info.value.code == 2
    assert "is not a directory" in capsys.readouterr().err


def test_save_refuses_a_directory_that_is_not_a_checkpoint(trained, tmp_path):
    checkpoint = load_checkpoint(trained["checkpoint"])
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="holds no checkpoint"):
        save_checkpoint(tmp_path / "other", checkpoint.params, checkpoint.src_vocab,
                        checkpoint.tgt_vocab, checkpoint.config)
    assert (tmp_path / "other" / "notes.txt").read_text() == "mine"
    assert flatten_params(checkpoint.params).keys() >= {"decoder/dense/W"}


def test_missing_data_file_exits_2_with_the_clear_error(monkeypatch, tmp_path, capsys):
    monkeypatch.delenv(data.ENV_VAR, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(archive, "checkout_candidates", lambda: [tmp_path / "nowhere.zip"])
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "bahdanau", *TINY_ARGS, "--checkpoint", str(tmp_path / "ckpt")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "the English–French data (fra-eng/fra.txt) was not found" in err and "--data" in err
    assert not (tmp_path / "ckpt").exists()


@pytest.mark.parametrize(("argv", "message"), [
    (["train", "bahdanau", "--dropout", "1.5"], "--dropout: expected a number in [0, 1)"),
    (["train", "bahdanau", "--num-layers", "0"], "--num-layers: expected an integer >= 1"),
    (["train", "bahdanau", "--lr", "0"], "--lr: expected a finite number > 0"),
    (["translate"], "the following arguments are required: SENTENCE"),
    (["translate", ""], "argument SENTENCE: the sentence is empty"),
    (["translate", "--max-len", "0", "go ."], "--max-len: expected an integer >= 1"),
])
def test_bad_arguments_exit_2(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_checkpoint_argument_checked_before_training(tmp_path, capsys):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "bahdanau", "--checkpoint", str(not_a_dir)])
    assert exit_info.value.code == 2
    assert "--checkpoint" in capsys.readouterr().err


def test_help_lists_the_commands(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "translate" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    assert "bahdanau" in capsys.readouterr().out
