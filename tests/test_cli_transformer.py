"""`jax-attention train transformer` and `jax-attention translate --model transformer`, in-process.

The session's tiny Transformer run (:func:`tests.shared_runs.tiny_run`: 80 pairs, a fifth held
out) gives the export, the JSON and the plots that the tests read.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil

import matplotlib.image
import numpy as np
import pytest

from jax_attention.models import decoding, transformer
from jax_attention.cli import main
from jax_attention.train import BOOK_PAIRS, load_checkpoint
from tests.shared_runs import EPOCHS
from tests.test_attention_view import page_views

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _run(argv):
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        status = main(argv)
    return status, printed.getvalue()


@pytest.fixture(scope="module")
def trained(tiny_run):
    run = tiny_run("transformer")
    return {"checkpoint": run.model, "out": run.plots, "json": run.root / "run.json",
            "printed": run.stdout}


def test_train_writes_checkpoint_json_and_plots(trained):
    printed = trained["printed"]
    assert f"epoch {EPOCHS}, loss" in printed and "tokens/sec" in printed
    for source, _ in BOOK_PAIRS:
        assert f"{source} => " in printed
    assert printed.count(", bleu ") == 4
    assert "held-out: 16 pairs, corpus BLEU (k = 4)" in printed
    assert sorted(p.name for p in trained["checkpoint"].iterdir()) == [
        "config.json", "params.npz", "src_vocab.json", "tgt_vocab.json"]
    names = ["transformer_loss.png", "transformer_encoder_self_attention.png",
             "transformer_decoder_self_attention.png",
             "transformer_encoder_decoder_attention.png"]
    # Beside the PNGs, the interactive view of the last sentence (its three attentions as tabs).
    assert sorted(p.name for p in trained["out"].iterdir()) == sorted(
        [*names, "transformer_attention.html"])
    (view,) = page_views(trained["out"] / "transformer_attention.html")
    assert len(view["tabs"]) == 3 and "i'm home ." in view["title"]
    assert f"wrote {trained['out'] / 'transformer_attention.html'}" in printed
    for name in names:
        path = trained["out"] / name
        assert path.read_bytes()[:8] == PNG_SIGNATURE
        assert matplotlib.image.imread(path).ndim == 3

    record = json.loads(trained["json"].read_text())
    assert record["command"] == "train transformer"
    assert record["config"]["model"] == "transformer"
    assert record["config"]["num_heads"] == 2
    assert len(record["translations"]) == 4
    assert record["validation"]["num_pairs"] == 16
    assert 0 <= record["validation"]["corpus_bleu"] <= 1
    assert 0 <= record["validation"]["mean_sentence_bleu"] <= 1
    assert set(record["plots"]) == {"loss", "encoder_self", "decoder_self", "encoder_decoder",
                                    "view"}
    assert record["plots"]["view"] == str(trained["out"] / "transformer_attention.html")


def test_checkpoint_loads_with_its_kind_and_translates_as_training_did(trained):
    checkpoint = load_checkpoint(trained["checkpoint"])
    config = checkpoint.config
    assert config["model"] == "transformer"
    assert config["format"] == "jax-attention.transformer-checkpoint/1"
    result = transformer.translate(checkpoint.params, [s for s, _ in BOOK_PAIRS],
                                   checkpoint.src_vocab, checkpoint.tgt_vocab,
                                   config["num_steps"], num_heads=config["num_heads"])
    record = json.loads(trained["json"].read_text())
    assert [r.translation for r in result] == [t["translation"] for t in record["translations"]]


@pytest.mark.parametrize("beam", [
    "1", pytest.param("3", marks=pytest.mark.skipif(not hasattr(decoding, "beam_search"),
                                                    reason="decoding.beam_search missing"))])
def test_translate_detects_the_model_and_writes_heatmaps(trained, tmp_path, beam):
    out, path, page = tmp_path / "plots", tmp_path / "translations.json", tmp_path / "t.html"
    status, printed = _run(["translate", "--checkpoint", str(trained["checkpoint"]), "--beam",
                            beam, "--out", str(out), "--json", str(path), "--html", str(page),
                            "he's calm .", "go ."])
    assert status == 0
    assert "he's calm . => " in printed and "go . => " in printed
    record = json.loads(path.read_text())
    assert record["model"] == "transformer" and record["beam"] == int(beam)
    assert (out / "translation_hes-calm.png").read_bytes()[:8] == PNG_SIGNATURE
    weights = np.asarray(record["translations"][1]["attention_weights"])
    assert weights.shape[1] == len(record["translations"][1]["source_tokens"])
    # --html: one view per sentence, each with the Transformer's three attentions as tabs.
    assert record["plots"]["view"] == str(page) and f"wrote {page}" in printed
    assert "<title>Transformer attention: 2 translations" in page.read_text()
    views = page_views(page)
    assert len(views) == 2
    for view, result in zip(views, record["translations"]):
        assert f"\u201c{result['source']}\u201d" in view["title"]  # in order
        encoder, decoder, cross = view["tabs"]
        assert encoder["keys"] == encoder["queries"] == result["source_tokens"]
        assert cross["keys"] == result["source_tokens"] and cross["queries"] == decoder["keys"]
        assert decoder["queries"][0] == "<bos>" and decoder["masked"] is not None
        assert view["steps"] is None


def test_translate_refuses_the_wrong_model(trained, capsys):
    with pytest.raises(SystemExit) as error:
        main(["translate", "--checkpoint", str(trained["checkpoint"]), "--model", "bahdanau",
              "go ."])
    assert error.value.code == 2
    assert "the checkpoint holds a 'transformer' model" in capsys.readouterr().err


def test_train_refuses_heads_that_do_not_divide_the_width(tmp_path, capsys):
    with pytest.raises(SystemExit) as error:
        main(["train", "transformer", "--num-hiddens", "10", "--num-heads", "4",
              "--checkpoint", str(tmp_path / "ckpt")])
    assert error.value.code == 2
    assert ("num_hiddens must be divisible by num_heads, got num_hiddens=10 and num_heads=4"
            in capsys.readouterr().err)


@pytest.mark.parametrize("max_positions", [5, "x"])
def test_translate_with_a_config_whose_table_is_too_short_is_one_usage_error(trained, tmp_path,
                                                                             max_positions):
    """A hand-edited export whose positional table (max_positions) is shorter than its num_steps
    is refused when loaded, naming the file and both values — not a traceback at decoding."""
    broken = tmp_path / "broken"
    shutil.copytree(trained["checkpoint"], broken)
    config = json.loads((broken / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps({**config, "max_positions": max_positions}))
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as stop:
        main(["translate", "--checkpoint", str(broken), "go ."])
    assert stop.value.code == 2
    text = err.getvalue()
    assert "Traceback" not in text and "usage:" not in text
    assert "argument --checkpoint" in text and "config.json" in text and "max_positions" in text
