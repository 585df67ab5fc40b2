"""Every output path is checked before any work, in every command; an output that still cannot be
written at the end is kept elsewhere and the command says where (exit status 4).

Unwritable places are a read-only mount, a path under a file, a ``--json`` that is a directory;
a full place is a tiny tmpfs (:mod:`tests.fault_support`). Each case asserts the exit status,
the one line naming the argument, no traceback, that no work started (no epoch, and not one
program compiled: JAX's compilation events are counted, not the seconds) and that nothing was
created.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from jax_attention.data import nmt as data

from jax_attention.runtime import provenance
from jax_attention.cli import EXIT_WRITE_FAILED
from jax_attention.runtime.export import load_model
from tests.fault_support import (assert_one_line, command_env, fill, full_dir, read_only_dir,
                                 run_command, tree_snapshot)
from tests.shared_runs import run_main_counting_compilations, tiny_flags


def _cli(*argv) -> tuple[int, str, str, int]:
    """``jax-attention *argv`` in-process: (exit status, stdout, stderr, XLA programs compiled)."""
    return run_main_counting_compilations(list(argv))


def _train(*argv) -> list[str]:
    """The session's tiny Bahdanau run (tests/shared_runs.py) with ``argv``'s outputs."""
    return ["train", "bahdanau", "--data", str(data.find_data()), *tiny_flags("bahdanau"), *argv]


@pytest.fixture
def read_only(tmp_path):
    with read_only_dir(tmp_path, contents={"keep.txt": b"the user's file\n"}) as directory:
        yield directory


def _cases(read_only: Path, tmp_path: Path) -> dict[str, tuple[list[str], str]]:
    afile = tmp_path / "afile"
    afile.write_text("a user's file\n")
    (tmp_path / "adir").mkdir(exist_ok=True)
    return {
        "checkpoint read-only": (_train("--checkpoint", str(read_only / "ck")), "--checkpoint"),
        "checkpoint under a file": (_train("--checkpoint", str(afile / "ck")), "--checkpoint"),
        "json read-only": (_train("--json", str(read_only / "x.json"), "--checkpoint",
                                  str(tmp_path / "m")), "--json"),
        "json is a directory": (_train("--json", str(tmp_path / "adir"), "--checkpoint",
                                       str(tmp_path / "m")), "--json"),
        "out read-only": (_train("--out", str(read_only / "plots"), "--checkpoint",
                                 str(tmp_path / "m")), "--out"),
        "out under a file": (_train("--out", str(afile / "plots"), "--checkpoint",
                                    str(tmp_path / "m")), "--out"),
        "checkpoint-dir read-only": (_train("--checkpoint-dir", str(read_only / "train"),
                                            "--checkpoint", str(tmp_path / "m")),
                                     "--checkpoint-dir"),
        "translate json": (["translate", "go .", "--checkpoint", str(tmp_path / "none"),
                            "--json", str(read_only / "t.json")], "--json"),
        "translate out": (["translate", "go .", "--checkpoint", str(tmp_path / "none"),
                           "--out", str(read_only / "plots")], "--out"),
        "plot out": (["plot", "positional-encoding", "--out", str(read_only / "plots")],
                     "--out"),
        "kernel regression json": (["train", "kernel-regression", "--json",
                                    str(afile / "k.json")], "--json"),
        "conformance json": (["conformance", "--json", str(read_only / "c.json")], "--json"),
        "bench attention json": (["bench", "attention", "--json", str(read_only / "b.json")],
                                 "--json"),
        "bench memory json": (["bench", "memory", "--json", str(read_only / "b.json")],
                              "--json"),
        "bench train json": (["bench", "train", "--json", str(read_only / "b.json")], "--json"),
        "bench decode json": (["bench", "decode", "--json", str(read_only / "b.json")],
                              "--json"),
        "bench profile json": (["bench", "profile", "--json", str(read_only / "b.json")],
                               "--json"),
    }


CASES = ["checkpoint read-only", "checkpoint under a file", "json read-only",
         "json is a directory", "out read-only", "out under a file", "checkpoint-dir read-only",
         "translate json", "translate out", "plot out", "kernel regression json",
         "conformance json", "bench attention json", "bench memory json", "bench train json",
         "bench decode json", "bench profile json"]


@pytest.mark.parametrize("case", CASES)
def test_an_output_path_that_cannot_be_written_is_refused_before_any_work(read_only, tmp_path,
                                                                         case):
    argv, argument = _cases(read_only, tmp_path)[case]
    before = tree_snapshot(tmp_path)
    status, out, err, compiled = _cli(*argv)
    assert status == 2, err
    line = assert_one_line(err, f"argument {argument}:")
    assert "usage:" not in err  # one line, not the usage of a command with forty options
    assert "epoch" not in out and compiled == 0, (out, compiled)  # nothing trained or compiled
    assert tree_snapshot(tmp_path) == before, line  # nothing created, nothing changed


def test_the_write_check_leaves_nothing_behind(tmp_path):
    from jax_attention.cli.arguments import writable_problem

    assert writable_problem(tmp_path / "a" / "b" / "c.json", directory=False) is None
    assert writable_problem(tmp_path / "d", directory=True) is None
    assert list(tmp_path.iterdir()) == []


def test_a_model_that_cannot_be_written_at_the_end_is_kept_elsewhere(tmp_path):
    """The check passes (the place is writable at the start), the disk fills during training:
    the trained model goes to the rescue place, the command says where and exits 4."""
    with full_dir(tmp_path, size_kib=64) as full:
        fill(full)
        cache = tmp_path / "cache"
        status, out, err = run_command(
            *_train("--checkpoint", str(full / "model"), "--json", str(tmp_path / "run.json")),
            env=command_env(XDG_CACHE_HOME=str(cache)))
        assert status == EXIT_WRITE_FAILED, err
        line = assert_one_line(err, f"could not write the trained model to {full / 'model'}",
                               "No space left on device", "instead")
        rescued = Path(line.rsplit("wrote it to ", 1)[1].removesuffix(" instead"))
        assert rescued.is_relative_to(cache / "jax-attention" / "rescued")
        assert load_model(rescued).spec.name == "bahdanau"
        record = json.loads((tmp_path / "run.json").read_text())
        assert record["checkpoint"] == str(rescued)
        assert record["export_error"] == line.split(": error: ", 1)[1]
        assert not (full / "model").exists()


def test_a_json_report_that_cannot_be_written_at_the_end_is_kept_elsewhere(tmp_path, monkeypatch):
    from jax_attention.cli import arguments

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    real = provenance.write_json

    def failing(path, record):
        if Path(path).parent == tmp_path:
            raise OSError(28, "No space left on device")
        return real(path, record)

    monkeypatch.setattr(provenance, "write_json", failing)
    args = type("Args", (), {"json": tmp_path / "report.json"})()
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        status = arguments.finish_outputs(args, "test", {"value": 1.0}, {}, {})
    assert status == EXIT_WRITE_FAILED
    line = assert_one_line(err.getvalue(), f"could not write {tmp_path / 'report.json'}",
                           "[Errno 28] No space left on device", "instead")
    rescued = Path(line.rsplit("wrote the report to ", 1)[1].removesuffix(" instead"))
    assert json.loads(rescued.read_text())["value"] == 1.0


def test_json_reports_write_null_for_nan_and_say_so(tmp_path, capsys):
    from jax_attention.cli.arguments import write_json_report

    path = write_json_report(tmp_path / "r.json", {"losses": [1.0, float("nan")],
                                                    "x": {"y": float("inf")}, "ok": 2})
    text = path.read_text()
    assert "NaN" not in text and "Infinity" not in text
    record = json.loads(text)
    assert record["losses"] == [1.0, None] and record["x"] == {"y": None} and record["ok"] == 2
    assert record["null_for_non_finite"] == ["losses[1]", "x.y"]
    assert "2 NaN or infinite values written as null" in capsys.readouterr().out


@pytest.mark.parametrize("seed", ["9223372036854775808", "-1", "1e3"])
def test_a_seed_out_of_range_is_a_usage_error(seed):
    status, _, err, _ = _cli(*_train("--seed", seed))
    assert status == 2 and "argument --seed" in err and "Traceback" not in err


def test_the_largest_seed_is_accepted_by_the_config():
    from jax_attention.models.configs import MAX_SEED, TrainConfig

    assert TrainConfig(seed=MAX_SEED).seed == MAX_SEED
    with pytest.raises(ValueError, match="seed must be an integer in"):
        TrainConfig(seed=MAX_SEED + 1)
