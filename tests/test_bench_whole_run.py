"""``bench train --whole-run`` and its PyTorch peer ``python -m jax_attention.bench.book_run``.

The real commands run, with small settings (the book's model, 2 epochs of 128 pairs, one round;
in the slow set, ``make test-slow``, as the peers' two fresh processes cost ~20 s): the tests check
that both peers ran as fresh processes and that the record holds what the schema promises and is
consistent with itself (ratios are the quotients of the medians). Timings of such runs on a
shared machine say nothing about speed, so nothing is asserted about them but their sign.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

from jax_attention.bench import book_run, whole_run  # noqa: E402
from jax_attention.bench.torch_support import ThreadChoice  # noqa: E402
from jax_attention.cli import main  # noqa: E402

EPOCHS, NUM_EXAMPLES = 2, 128


@pytest.fixture(scope="module")
def record(data_path, tmp_path_factory):
    """One round of the Bahdanau model (its compilation is the shorter), run from an empty
    working directory to show that nothing lands there."""
    here = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("cwd"))
    try:
        result = whole_run.bench_whole_run("bahdanau", rounds=1, epochs=EPOCHS,
                                           num_examples=NUM_EXAMPLES, data=data_path)
        left = os.listdir(".")
    finally:
        os.chdir(here)
    return result, left


@pytest.mark.slow  # both peers train the book's model in fresh processes
def test_both_peers_ran_whole(record):
    record, left = record
    assert left == [], "the runs wrote into the caller's working directory"
    assert record["benchmark"] == "train --whole-run" and record["model"] == "bahdanau"
    assert record["settings"]["epochs"] == EPOCHS
    assert record["settings"]["num_examples"] == NUM_EXAMPLES
    assert record["settings"]["cache"] == "cold"
    assert record["tokens_per_epoch"] > 0
    peers = record["peers"]
    assert set(peers) == {"ours", "torch"}
    assert "jax-attention train" in peers["ours"]["peer"]
    assert "compilation cache off" in peers["ours"]["peer"]
    assert "train_seq2seq" in peers["torch"]["peer"] and "eager" in peers["torch"]["peer"]
    assert peers["ours"]["command"][1:5] == ["-m", "jax_attention", "train", "bahdanau"]
    assert peers["torch"]["command"][1:3] == ["-m", "jax_attention.bench.book_run"]
    for name, peer in peers.items():
        assert len(peer["rounds"]) == 1, name
        assert peer["wall_s"] > 0 and peer["steady_tokens_per_s"] > 0, name
        assert peer["cpu_s"] is None or peer["cpu_s"] > 0, name
        # The parent's wall covers the run's own, start-up and exit included.
        assert peer["wall_s"] >= peer["run_wall_s"] > 0, name
        translations = peer["rounds"][0]["translations"]
        assert [t["source"] for t in translations] == ["go .", "i lost .", "he's calm .",
                                                       "i'm home ."]
        assert all(0.0 <= t["bleu"] <= 1.0 for t in translations), name
        assert peer["num_bleu_1"] == sum(t["bleu"] == 1.0 for t in translations)
        assert len(peer["bleu_per_sentence"]) == 4
        assert 0.0 <= peer["mean_bleu"] <= 1.0
    assert peers["ours"]["compile_s"] > 0
    assert peers["torch"]["compile_s"] is None  # eager: nothing compiled
    assert peers["torch"]["rounds"][0]["torch_threads"] >= 1


@pytest.mark.slow  # both peers train the book's model in fresh processes
def test_ratios_are_the_quotients_of_the_medians(record):
    record, _ = record
    ours, torch = record["peers"]["ours"], record["peers"]["torch"]
    ratio = record["ratios"]["ours"]
    assert ratio["steady_tokens_per_s"] == (ours["steady_tokens_per_s"]
                                            / torch["steady_tokens_per_s"])
    assert ratio["wall"] == torch["wall_s"] / ours["wall_s"]
    json.dumps(record)  # JSON-ready


@pytest.mark.slow  # both peers train the book's model in fresh processes
def test_table(record):
    record, _ = record
    table = whole_run.format_whole_run(record)
    assert "process wall s" in table and "steady tokens/s" in table
    assert "ours vs torch" in table
    assert any(line.startswith("torch") for line in table.splitlines())


@pytest.mark.parametrize("settings, name", [
    ({"model": "gpt"}, "model"),
    ({"rounds": 0}, "rounds"),
    ({"epochs": 0}, "epochs"),
    ({"num_examples": 1.5}, "num_examples"),
    ({"seed": -1}, "seed"),
    ({"cache": "hot"}, "cache"),
    ({"torch_threads": 0}, "torch_threads"),
    ({"timeout_s": 0}, "timeout_s"),
])
def test_bad_arguments_name_themselves(settings, name):
    with pytest.raises(ValueError, match=name):
        whole_run.bench_whole_run(**{"model": "bahdanau", **settings})


def test_book_run_as_a_process(data_path, tmp_path):
    out = tmp_path / "torch.json"
    done = subprocess.run(
        [sys.executable, "-m", "jax_attention.bench.book_run", "--model", "transformer",
         "--epochs", "1", "--num-examples", "64", "--torch-threads", "1", "--data",
         str(data_path), "--json", str(out)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout.strip().splitlines()[-1])
    assert printed == json.loads(out.read_text())
    assert printed["peer"] == book_run.PEER
    assert printed["model"] == "transformer"
    assert printed["config"]["training"]["epochs"] == 1
    assert printed["config"]["num_hiddens"] == 32  # the book's settings
    assert len(printed["losses"]) == len(printed["tokens_per_sec_per_epoch"]) == 1
    assert printed["torch_threads"] == 1 and printed["torch_thread_probe_s"] == {}
    assert printed["steady_tokens_per_sec"] == printed["tokens_per_sec_per_epoch"][0]
    assert len(printed["translations"]) == 4


def test_book_run_refuses_bad_flags(capsys):
    with pytest.raises(SystemExit) as exit_info:
        book_run.main(["--model", "transformer", "--torch-threads", "0"])
    assert exit_info.value.code == 2
    assert "--torch-threads" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--whole-run", "--steps", "3"], "argument --steps: not with --whole-run"),
    (["--whole-run", "--devices", "1,2"], "argument --devices: not with --whole-run"),
    (["--rounds", "2"], "argument --rounds: only with --whole-run"),
    (["--epochs", "2"], "argument --epochs: only with --whole-run"),
])
def test_cli_refuses_the_other_modes_options(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "train", *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_thread_choice_takes_turns_then_keeps_the_fastest():
    choice = ThreadChoice(candidates=[1, 2], trials=2)
    seconds = {1: [0.5, 0.3], 2: [0.1, 0.9]}  # 2 has the fastest single unit
    used = []
    while choice.probing:
        threads = choice.threads
        used.append(threads)
        choice.record(threads, seconds[threads][used.count(threads) - 1])
    assert used == [1, 2, 1, 2]
    assert choice.threads == 2 and choice.probe_seconds == {1: 0.3, 2: 0.1}
    _, _, threads = choice.timed(lambda: None)  # after the probes: the fastest, for good
    assert threads == 2 and choice.probe_seconds == {1: 0.3, 2: 0.1}
    fixed = ThreadChoice(3)
    assert not fixed.probing and fixed.threads == 3 and fixed.probe_seconds == {}
    with pytest.raises(ValueError, match="trials"):
        ThreadChoice(trials=0)


@pytest.mark.slow
def test_cli_whole_run_transformer(data_path, tmp_path, capsys):
    out = tmp_path / "whole.json"
    assert main(["bench", "train", "--whole-run", "--model", "transformer", "--rounds", "1",
                 "--epochs", "2", "--num-examples", "128", "--whole-run-cache", "both",
                 "--data", str(data_path), "--no-progress", "--json", str(out)]) == 0
    written = json.loads(out.read_text())
    assert written["command"] == "bench train --whole-run"
    assert set(written["peers"]) == {"ours", "ours_warm", "torch"}
    assert set(written["ratios"]) == {"ours", "ours_warm"}
    assert "ours_warm vs torch" in capsys.readouterr().out
