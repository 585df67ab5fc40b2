"""Ctrl-C (SIGINT) in every phase of a command: exit 130, one line, no crash, nothing lost.

Real subprocesses (``python -m jax_attention``) of a short training run are interrupted at ten
evenly spread moments of its life — start-up, compilation, steps, checkpoint saves, the final
translations, the export, the plots — and each must end with exit status 130 (or 0 when it had
finished first: never a negative status, a crash), no traceback, one line saying what was kept,
and every file on disk complete: the exported model loads, the JSON parses, the newest training
checkpoint reads back and resuming from it finishes the run. A second Ctrl-C stops at once; the
first is acknowledged at once, even during a compilation; ``translate`` stops the same way.
See :mod:`jax_attention.interrupts`.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from jax_attention import data
from jax_attention.checkpointing import read_training_checkpoint
from jax_attention.cli import EXIT_INTERRUPTED
from jax_attention.export import load_model
from tests.fault_support import finish, send_sigint, start_command, wait_for

RUN = ["--epochs", "12", "--num-examples", "128", "--batch-size", "32", "--embed-size", "8",
       "--num-hiddens", "8", "--num-layers", "1", "--num-steps", "6", "--no-progress",
       "--checkpoint-every", "4", "--log-every", "1", "--no-compilation-cache"]


def _train(root: Path, *extra: str):
    return start_command(
        "train", "bahdanau", "--data", str(data.find_data()), *RUN, "--checkpoint-dir",
        str(root / "train"), "--checkpoint", str(root / "model"), "--json",
        str(root / "run.json"), "--out", str(root / "plots"), *extra)


def _interrupted_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("jax-attention: interrupted")]


def _leftovers(root: Path) -> list[Path]:
    return [p for p in root.rglob("*")
            if p.name.endswith(".tmp") or ".orbax-checkpoint-tmp" in p.name]


def _assert_outputs_complete(root: Path, *, temporaries: bool = False) -> None:
    """Whatever a stopped run left is whole: nothing half-written, and (unless
    ``temporaries``: a stop at once during a save) nothing temporary."""
    if (root / "model").exists():
        assert load_model(root / "model").spec.name == "bahdanau"
    if (root / "run.json").exists():
        json.loads((root / "run.json").read_text())
    steps = sorted(int(p.name) for p in (root / "train").iterdir() if p.name.isdigit()) \
        if (root / "train").is_dir() else []
    if steps:
        _, progress = read_training_checkpoint(root / "train")
        assert progress["step"] == steps[-1]
    assert temporaries or not _leftovers(root), _leftovers(root)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> float:
    """The seconds of the whole run, start to exit, uninterrupted."""
    root = tmp_path_factory.mktemp("whole")
    start = time.monotonic()
    status, _, err = finish(_train(root))
    assert status == 0, err
    return time.monotonic() - start


@pytest.mark.parametrize("tenth", range(10))
def test_ctrl_c_at_ten_moments_exits_130_with_one_line_and_whole_files(uninterrupted, tmp_path,
                                                                      tenth):
    process = _train(tmp_path)
    time.sleep(uninterrupted * (tenth + 0.5) / 10)
    running = process.poll() is None
    if running:
        send_sigint(process)
    status, out, err = finish(process)
    assert status >= 0, err  # never a crash (a negative status is a signal)
    assert "Traceback" not in err, err
    _assert_outputs_complete(tmp_path)
    if not running or status == 0:
        # It had finished; or the Ctrl-C came as the interpreter shut down, when it is ignored.
        assert status == 0 and not _interrupted_lines(err), err
        assert json.loads((tmp_path / "run.json").read_text())["checkpoint"]
        return
    assert status == EXIT_INTERRUPTED, err
    lines = _interrupted_lines(err)
    assert len(lines) == 1, err
    line = lines[0]
    if "had finished" in line:  # the Ctrl-C came after its last output, and it says so
        assert json.loads((tmp_path / "run.json").read_text())["checkpoint"]
        return
    steps = sorted(int(p.name) for p in (tmp_path / "train").iterdir() if p.name.isdigit()) \
        if (tmp_path / "train").is_dir() else []
    if steps:  # the line names the newest checkpoint and how to resume
        assert f"training checkpoint {steps[-1]} in {tmp_path / 'train'}" in line, line
        assert line.endswith("--resume"), line
        resumed, _, resumed_err = finish(_train(tmp_path, "--resume"))
        assert resumed == 0, resumed_err
        assert json.loads((tmp_path / "run.json").read_text())["num_bleu_1"] >= 0
    else:
        assert any(words in line for words in ("no training checkpoint", "while starting",
                                                "before the first training step")), line


def _stderr_lines(process, *, stdout: list | None = None
                  ) -> tuple[list[tuple[float, str]], threading.Thread]:
    """Read ``process``'s stderr in a thread: ``[(monotonic time, line)]`` as they come; the
    thread closes both pipes when the process has closed them. ``stdout``: a list that collects
    stdout's lines the same way, as they come (otherwise stdout is read at the end)."""
    lines: list[tuple[float, str]] = []

    def read_stdout():
        for line in process.stdout:
            stdout.append((time.monotonic(), line.rstrip("\n")))

    out_reader = None
    if stdout is not None:
        out_reader = threading.Thread(target=read_stdout, daemon=True)
        out_reader.start()

    def read():
        for line in process.stderr:
            lines.append((time.monotonic(), line.rstrip("\n")))
        if out_reader is None:
            process.stdout.read()
        else:
            out_reader.join()
        process.stdout.close()
        process.stderr.close()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return lines, reader


def test_the_first_ctrl_c_is_acknowledged_at_once_even_while_compiling(tmp_path):
    process = _train(tmp_path)
    stdout: list[tuple[float, str]] = []
    lines, reader = _stderr_lines(process, stdout=stdout)
    # Into the first compilation (seconds of XLA): once the run says it compiles, not after a
    # fixed delay, which a loaded machine's start-up can outlast (the Ctrl-C then lands before
    # the command's handler, which is another test's case).
    wait_for(lambda: any(line.startswith("compiling the training step") for _, line in stdout),
             process, 120, "the compilation")
    time.sleep(0.3)
    sent = time.monotonic()
    send_sigint(process)
    wait_for(lambda: any("Ctrl-C: stopping" in line for _, line in lines), process, 30,
             "the acknowledgement")
    acknowledged = next(t for t, line in lines if "Ctrl-C: stopping" in line)
    assert acknowledged - sent < 1.0
    process.wait(timeout=300)
    reader.join(timeout=10)
    assert process.returncode == EXIT_INTERRUPTED
    text = "\n".join(line for _, line in lines)
    assert "Traceback" not in text
    assert len(_interrupted_lines(text)) == 1, text


def _train_to_a_first_checkpoint(root: Path):
    """A run started and waited for until its first training checkpoint is on disk:
    ``(process, its stderr lines as they come, their reader thread)``."""
    process = _train(root)
    lines, reader = _stderr_lines(process)
    wait_for(lambda: (root / "train").is_dir()
             and any(p.name.isdigit() for p in (root / "train").iterdir()), process,
             what="a first training checkpoint")
    return process, lines, reader


def test_a_second_ctrl_c_stops_at_once_and_names_what_is_on_disk(tmp_path):
    process, lines, reader = _train_to_a_first_checkpoint(tmp_path)
    send_sigint(process)
    time.sleep(0.1)
    send_sigint(process)
    process.wait(timeout=60)
    reader.join(timeout=10)
    text = "\n".join(line for _, line in lines)
    assert process.returncode == EXIT_INTERRUPTED, text
    assert "Traceback" not in text
    stops = _interrupted_lines(text)
    assert len(stops) == 1, text
    newest = max(int(p.name) for p in (tmp_path / "train").iterdir() if p.name.isdigit())
    if "stopped at once" in stops[0]:
        assert f"training checkpoint {newest} in {tmp_path / 'train'}" in stops[0], stops[0]
    assert "--resume" in stops[0]
    # A stop at once in the middle of a save leaves Orbax's temporary directory, never a step;
    # the resumed run removes it and finishes.
    _assert_outputs_complete(tmp_path, temporaries=True)
    resumed, _, err = finish(_train(tmp_path, "--resume"))
    assert resumed == 0, err
    _assert_outputs_complete(tmp_path)


def test_ctrl_c_stops_translate_with_one_line(tmp_path):
    trained, _, err = finish(_train(tmp_path))
    assert trained == 0, err
    process = start_command("translate", "--checkpoint", str(tmp_path / "model"), "go .",
                            "i lost .", "--no-compilation-cache", "--json",
                            str(tmp_path / "translations.json"))
    time.sleep(1.5)
    running = process.poll() is None
    if running:
        send_sigint(process)
    status, _, err = finish(process)
    assert "Traceback" not in err
    if running:
        assert status == EXIT_INTERRUPTED, err
        assert len(_interrupted_lines(err)) == 1, err
    else:
        assert status == 0, err
    if (tmp_path / "translations.json").exists():
        json.loads((tmp_path / "translations.json").read_text())


def test_a_ctrl_c_after_the_stop_line_adds_no_second_line(tmp_path):
    """The first Ctrl-C stops the run; another one, sent as soon as the stop line is out, is
    ignored: one interrupted line, status 130 (it once printed a second, wrong line)."""
    process, lines, reader = _train_to_a_first_checkpoint(tmp_path)
    send_sigint(process)
    deadline = time.monotonic() + 60
    while (not any(line.startswith("jax-attention: interrupted") for _, line in lines)
           and process.poll() is None and time.monotonic() < deadline):
        time.sleep(0.001)
    if process.poll() is None:
        send_sigint(process)
    process.wait(timeout=60)
    reader.join(timeout=10)
    text = "\n".join(line for _, line in lines)
    assert process.returncode == EXIT_INTERRUPTED, text
    stops = _interrupted_lines(text)
    assert len(stops) == 1 and "--resume" in stops[0], text
