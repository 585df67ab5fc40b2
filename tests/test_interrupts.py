"""Ctrl-C (SIGINT) in every phase of a command: exit 130, one line, no crash, nothing lost.

Real subprocesses (``python -m jax_attention train bahdanau``) of the suite's tiny run
(:func:`tests.shared_runs.run_flags`: 3 epochs of 4 steps, a training checkpoint every 2 steps,
the export, the report and the plots) are interrupted in each phase of their life, one
subprocess per phase: start-up, the compilation, the later steps (the last ones among them), a
checkpoint save, the final evaluation, the export, the plots and the report. The phase is named
through the test hook (``JAX_ATTENTION_TEST_SIGINT``, :func:`jax_attention.runtime.interrupts.phase`):
the command presses Ctrl-C on itself as it enters that phase, so a loaded machine cannot move
the moment. Each run must end with exit status 130, no traceback, one line saying what was kept,
and every file on disk whole: the exported model loads, the JSON parses, the newest training
checkpoint reads back, and resuming finishes the run as the uninterrupted tiny run ended, bit for
bit (losses, parameters, Adam's state, dropout stream). A second Ctrl-C stops at once; the first
is acknowledged at once, even during a real compilation; ``translate`` stops at once.
See :mod:`jax_attention.runtime.interrupts`.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from jax_attention.data import nmt as data
from jax_attention.runtime.checkpointing import read_training_checkpoint
from jax_attention.cli import EXIT_INTERRUPTED
from jax_attention.runtime.export import load_model
from jax_attention.runtime.interrupts import PHASES, TEST_SIGINT_VARIABLE
from tests.fault_support import command_env, finish, send_sigint, start_command, wait_for
from tests.reproducibility import assert_same_losses, assert_same_params
from tests.shared_runs import EVERY, TOTAL_STEPS, run_flags, run_main

KIND = "bahdanau"


def _argv(root: Path, *extra: str, plots: bool = False) -> list[str]:
    return ["train", KIND, "--data", str(data.find_data()), *run_flags(KIND, root, plots=plots),
            *extra]


def _train(root: Path, *extra: str, sigint_at: str | None = None, env=None):
    """The tiny run as a subprocess, outputs under ``root`` (plots only where the Ctrl-C comes
    in their phase); Ctrl-C at ``sigint_at`` (the hook's ``PHASE[:N],...``)."""
    extra_env = {} if sigint_at is None else {TEST_SIGINT_VARIABLE: sigint_at}
    return start_command(*_argv(root, *extra, plots=sigint_at == "plots"),
                         env=env or command_env(**extra_env))


def _resume_in_process(root: Path) -> int:
    status, _, err = run_main(_argv(root, "--resume"))
    assert status == 0, err
    return status


def _interrupted_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("jax-attention: interrupted")]


def _steps(root: Path) -> list[int]:
    train = root / "train"
    return sorted(int(p.name) for p in train.iterdir() if p.name.isdigit()) \
        if train.is_dir() else []


def _leftovers(root: Path) -> list[Path]:
    return [p for p in root.rglob("*")
            if p.name.endswith(".tmp") or ".orbax-checkpoint-tmp" in p.name]


def _assert_outputs_whole(root: Path) -> None:
    """Whatever a stopped run left is whole: nothing half-written, nothing temporary."""
    if (root / "model").exists():
        assert load_model(root / "model").spec.name == KIND
    if (root / "run.json").exists():
        json.loads((root / "run.json").read_text())
    if _steps(root):
        _, progress = read_training_checkpoint(root / "train")
        assert progress["step"] == _steps(root)[-1]
    assert not _leftovers(root), _leftovers(root)


def _assert_ends_as_the_reference(root: Path, reference) -> None:
    """The run in ``root`` ended as the uninterrupted tiny run did, bit for bit."""
    figures = json.loads((root / "run.json").read_text())
    assert_same_losses(figures["losses"], reference.record["losses"])
    arrays, progress = read_training_checkpoint(root / "train")
    expected, _ = read_training_checkpoint(reference.train)
    assert progress["step"] == TOTAL_STEPS
    assert sorted(arrays) == sorted(expected)
    assert_same_params(arrays, expected)
    with np.load(root / "model" / "params.npz") as got, \
            np.load(reference.model / "params.npz") as want:
        assert_same_params(dict(got), dict(want))


def _resume_line(root: Path, phase: str | None = None) -> str:
    return f"resume with: jax-attention {' '.join(_argv(root, plots=phase == 'plots'))} --resume"


# What each phase's stop says, and what is on disk after it: the training checkpoint the line
# names (None: none), whether the export and the report were written. ``{train}`` is the run's
# checkpoint directory.
STOPS = {
    "startup": ("interrupted (Ctrl-C) while starting; nothing was done", None, False, False),
    # The compiled call under way finishes (its steps are done), then a checkpoint is saved.
    "compile": (f"interrupted (Ctrl-C) after step {EVERY} of {TOTAL_STEPS} (next: epoch 1, "
                f"batch 3 of 4); saved training checkpoint {EVERY} in {{train}}", EVERY,
                False, False),
    "steps:2": ("interrupted (Ctrl-C) after step 6 of 12 (next: epoch 2, batch 3 of 4); saved "
                "training checkpoint 6 in {train}", 6, False, False),
    # The last call: the model is exported, the evaluation skipped.
    "steps:5": ("interrupted (Ctrl-C) after training; all 12 steps done; training checkpoint "
                "12 in {train} holds them; the trained model was written to {model}; the "
                "translations and the held-out evaluation were skipped", TOTAL_STEPS, True,
                False),
    # The save under way completes; the stop comes before the next call.
    "save": (f"interrupted (Ctrl-C) after step {EVERY} of {TOTAL_STEPS} (next: epoch 1, batch "
             f"3 of 4); saved training checkpoint {EVERY} in {{train}}", EVERY, False, False),
    "evaluation": ("interrupted (Ctrl-C) after the run; the trained model is in {model}; plots "
                   "and --json not written", TOTAL_STEPS, True, False),
    "export": ("interrupted (Ctrl-C) after the run; the trained model is in {model}; plots and "
               "--json not written", TOTAL_STEPS, True, False),
    "plots": ("interrupted (Ctrl-C) as the command ended; it had finished, its outputs are "
              "written", TOTAL_STEPS, True, True),
    "report": ("interrupted (Ctrl-C) as the command ended; it had finished, its outputs are "
               "written", TOTAL_STEPS, True, True),
}


def test_every_phase_is_interrupted_here():
    assert {entry.split(":")[0] for entry in STOPS} == set(PHASES)


@pytest.mark.parametrize("phase", list(STOPS))
def test_ctrl_c_in_each_phase_exits_130_with_one_line_and_resumes_to_the_same_end(
        phase, tmp_path, tiny_run):
    reference = tiny_run(KIND)
    status, _, err = finish(_train(tmp_path, sigint_at=phase))
    assert "Traceback" not in err, err
    assert status == EXIT_INTERRUPTED, err
    lines = _interrupted_lines(err)
    assert len(lines) == 1, err
    line, step, exported, reported = STOPS[phase]
    line = "jax-attention: " + line.format(train=tmp_path / "train", model=tmp_path / "model")
    if step is not None and step < TOTAL_STEPS or phase == "steps:5":
        line += f"; {_resume_line(tmp_path)}"
    assert lines[0] == line
    assert "Ctrl-C: stopping after the current training steps and saving a training " \
           "checkpoint" in err or phase == "startup", err
    _assert_outputs_whole(tmp_path)
    assert (_steps(tmp_path) or [None])[-1] == step
    assert (tmp_path / "model").is_dir() == exported
    assert (tmp_path / "run.json").is_file() == reported
    assert (tmp_path / "plots").is_dir() == (phase == "plots")
    if phase == "startup":
        assert list(tmp_path.iterdir()) == []  # nothing was done
        return
    if reported:
        assert json.loads((tmp_path / "run.json").read_text())["checkpoint"] == \
            str(tmp_path / "model")
        _assert_ends_as_the_reference(tmp_path, reference)
        return
    _resume_in_process(tmp_path)
    _assert_outputs_whole(tmp_path)
    _assert_ends_as_the_reference(tmp_path, reference)


def test_a_second_ctrl_c_stops_at_once_and_names_what_is_on_disk(tmp_path, tiny_run):
    """Two Ctrl-Cs as the second checkpoint save starts: the first asks for a stop, the second
    stops at once, before that save; the line names the newest checkpoint on disk."""
    status, _, err = finish(_train(tmp_path, sigint_at="save:2,save:2"))
    assert status == EXIT_INTERRUPTED, err
    assert "Traceback" not in err
    stops = _interrupted_lines(err)
    assert stops == [f"jax-attention: interrupted (Ctrl-C), stopped at once; training "
                     f"checkpoint {EVERY} in {tmp_path / 'train'} is the newest; "
                     f"{_resume_line(tmp_path)}"], err
    assert _steps(tmp_path) == [EVERY]
    _assert_outputs_whole(tmp_path)
    _resume_in_process(tmp_path)
    _assert_ends_as_the_reference(tmp_path, tiny_run(KIND))


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
    """A real compilation (no compilation cache: seconds of XLA in one C++ call) and a real
    SIGINT from outside, 0.3 s into it: acknowledged within a second, not once XLA returns."""
    env = {key: value for key, value in command_env().items()
           if key != "JAX_COMPILATION_CACHE_DIR"}
    process = _train(tmp_path, env=env)
    stdout: list[tuple[float, str]] = []
    lines, reader = _stderr_lines(process, stdout=stdout)
    # Into the first compilation: once the run says it compiles, not after a fixed delay.
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


def test_a_ctrl_c_after_the_stop_line_adds_no_second_line(tmp_path):
    """The first Ctrl-C stops the run; another one, sent as soon as the stop line is out, is
    ignored: one interrupted line, status 130 (it once printed a second, wrong line)."""
    process = _train(tmp_path, sigint_at="steps:1")
    lines, reader = _stderr_lines(process)
    wait_for(lambda: any(line.startswith("jax-attention: interrupted") for _, line in lines)
             or process.poll() is not None, process, 120, "the stop line")
    if process.poll() is None:
        send_sigint(process)
    process.wait(timeout=60)
    reader.join(timeout=10)
    text = "\n".join(line for _, line in lines)
    assert process.returncode == EXIT_INTERRUPTED, text
    stops = _interrupted_lines(text)
    assert len(stops) == 1 and "--resume" in stops[0], text


@pytest.mark.parametrize("phase", ["evaluation", "plots"])
def test_ctrl_c_stops_translate_at_once_with_one_line(phase, tmp_path, tiny_run):
    model = tiny_run(KIND).model
    process = start_command(
        "translate", "--checkpoint", str(model), "go .", "i lost .", "--json",
        str(tmp_path / "translations.json"), "--out", str(tmp_path / "heatmaps"),
        env=command_env(**{TEST_SIGINT_VARIABLE: phase}))
    status, out, err = finish(process)
    assert "Traceback" not in err
    assert status == EXIT_INTERRUPTED, err
    assert _interrupted_lines(err) == ["jax-attention: interrupted (Ctrl-C), stopped"], err
    assert not (tmp_path / "translations.json").exists()
    assert (" => " in out) == (phase == "plots")  # the translations were printed first


def test_an_unknown_phase_in_the_hook_is_an_error(monkeypatch):
    from jax_attention.runtime import interrupts

    monkeypatch.setenv(TEST_SIGINT_VARIABLE, "compiling")
    with pytest.raises(ValueError, match="'compiling' is not PHASE"):
        interrupts.phase("compile")
    monkeypatch.delenv(TEST_SIGINT_VARIABLE)
    interrupts.phase("compile")  # unset: nothing
    assert os.environ.get(TEST_SIGINT_VARIABLE) is None
