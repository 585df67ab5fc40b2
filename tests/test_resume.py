"""Training that survives a kill: training checkpoints, ``--resume``, damaged checkpoints,
non-finite steps.

The suite's tiny Bahdanau run (:func:`tests.shared_runs.tiny_run`: 3 epochs of 4 steps, a
training checkpoint every 2 steps), trained without a stop, is the reference. A real subprocess
(``python -m jax_attention train bahdanau``) is killed with SIGKILL once its first checkpoint is
on disk; resuming it in-process (the same compiled steps as the reference) must end with the
reference's losses and final state (parameters, Adam's moments and count, dropout stream) bit for
bit on CPU (:mod:`tests.reproducibility`). Ctrl-C in every phase, then ``--resume``, is
tests/test_interrupts.py's.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jax_attention import train

from jax_attention.runtime import checkpointing

from jax_attention.data import nmt as data
from jax_attention.models.registry import MODELS
from jax_attention.train import loop, seq2seq
from jax_attention.models.bahdanau import BahdanauSeq2Seq, teacher_forcing_inputs
from jax_attention.runtime.checkpointing import (CheckpointMismatchError, CorruptCheckpointWarning,
                                         TrainingCheckpoints, read_training_checkpoint)
from jax_attention.cli import EXIT_NONFINITE
from jax_attention.data.nmt import load_data_nmt
from jax_attention.params import flatten_params
from tests.fault_support import start_command
from tests.reproducibility import assert_same_losses, assert_same_params
from tests.shared_runs import (EPOCHS, EVERY, STEPS_PER_EPOCH, TOTAL_STEPS, run_flags, run_main,
                               tiny_flags, tiny_settings)

TOTAL = TOTAL_STEPS
TINY = tiny_settings("bahdanau")
TINY_ARGS = [*tiny_flags("bahdanau"), "--checkpoint-every", str(EVERY)]


def _cli(*argv) -> tuple[int, str, str]:
    """``jax-attention train bahdanau --data ... *argv`` in-process: (exit status, stdout,
    stderr); usage errors included."""
    return run_main(["train", "bahdanau", "--data", str(data.find_data()), *argv])


def _run_args(root: Path) -> list[str]:
    return run_flags("bahdanau", root, plots=False)


def _assert_same_arrays(got: dict, expected: dict) -> None:
    assert list(got) == list(expected)
    assert_same_params(got, expected)


@pytest.fixture(scope="module")
def reference(tiny_run):
    """The uninterrupted run (the shared tiny run): JSON figures and the final training
    checkpoint."""
    run = tiny_run("bahdanau")
    arrays, progress = read_training_checkpoint(run.train)
    return {"root": run.root, "json": run.record, "arrays": arrays, "progress": progress}


def _assert_matches_reference(root: Path, reference) -> dict:
    """The run in ``root`` ended as the reference did: losses, every array of the final state."""
    figures = json.loads((root / "run.json").read_text())
    assert_same_losses(figures["losses"], reference["json"]["losses"])
    arrays, progress = read_training_checkpoint(root / "train")
    assert progress["step"] == TOTAL and progress["losses"] == figures["losses"]
    _assert_same_arrays(arrays, reference["arrays"])
    return figures


def test_reference_run_writes_the_last_checkpoints(reference):
    root = reference["root"]
    steps = sorted(int(p.name) for p in (root / "train").iterdir() if p.name.isdigit())
    assert steps == [TOTAL - 2 * EVERY, TOTAL - EVERY, TOTAL]  # --keep 3 (the default)
    progress = reference["progress"]
    assert (progress["epoch"], progress["batch"], progress["steps_per_epoch"]) == (
        EPOCHS, 0, STEPS_PER_EPOCH)
    assert progress["config"]["training"]["seed"] == 1 and progress["skipped_steps"] == 0
    assert len(progress["losses"]) == EPOCHS and reference["json"]["skipped_steps"] == 0
    # The Adam count and the dropout stream advanced once per step.
    assert int(reference["arrays"]["model/dropout_rngs/count"]) == TOTAL
    assert int(reference["arrays"]["optimizer/opt_state/1/0/count"]) == TOTAL
    assert reference["json"]["checkpoint_dir"] == str(root / "train")


def test_chunked_epochs_equal_whole_epoch_scans(reference, tmp_path):
    """Checkpointing every 2 steps scans each epoch in two compiled calls; without checkpoints,
    or with one per epoch, each epoch is one call: the same losses and final state (parameters,
    Adam's state, dropout stream), bit for bit on CPU."""
    whole = train.train_bahdanau(**TINY)
    assert_same_losses(whole.losses, reference["json"]["losses"])
    with np.load(reference["root"] / "model" / "params.npz") as expected:
        assert_same_params(flatten_params(whole.params), dict(expected))
    per_epoch = train.train_bahdanau(**TINY, checkpoint_dir=tmp_path / "train")
    assert_same_losses(per_epoch.losses, reference["json"]["losses"])
    arrays, progress = read_training_checkpoint(tmp_path / "train")
    assert progress["step"] == TOTAL
    _assert_same_arrays(arrays, reference["arrays"])


def _wait_for_a_checkpoint(process: subprocess.Popen, directory: Path, timeout: float = 240):
    """Poll until ``directory`` holds a completed step (Orbax renames it into place when done)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if directory.is_dir() and any(p.name.isdigit() for p in directory.iterdir()):
            return
        if process.poll() is not None:
            pytest.fail(f"training exited ({process.returncode}) before its first checkpoint: "
                        f"{process.communicate()[1]}")
        time.sleep(0.005)
    process.kill()
    pytest.fail(f"no checkpoint in {directory} after {timeout} s")


def _start(root: Path):
    return start_command("train", "bahdanau", "--data", str(data.find_data()), *_run_args(root))


def test_sigkill_mid_run_then_resume_equals_the_uninterrupted_run(reference, tmp_path):
    process = _start(tmp_path)
    _wait_for_a_checkpoint(process, tmp_path / "train")
    process.send_signal(signal.SIGKILL)
    process.communicate(timeout=60)
    assert process.returncode == -signal.SIGKILL
    killed_at = max(int(p.name) for p in (tmp_path / "train").iterdir() if p.name.isdigit())
    assert killed_at < TOTAL and not (tmp_path / "run.json").exists()  # really mid-run

    status, out, err = _cli(*_run_args(tmp_path), "--resume")
    assert status == 0, err
    figures = _assert_matches_reference(tmp_path, reference)
    assert figures["resumed_from_step"] >= killed_at
    assert f"resumed from training checkpoint {figures['resumed_from_step']}" in out
    # Same trained model exported for 'translate'.
    with np.load(tmp_path / "model" / "params.npz") as got, \
            np.load(reference["root"] / "model" / "params.npz") as expected:
        assert_same_params(dict(got), dict(expected))
    # A kill during a save would have left a temporary directory: resuming removes it.
    assert all(p.name.isdigit() for p in (tmp_path / "train").iterdir())


def _copy_run(reference, tmp_path: Path) -> Path:
    shutil.copytree(reference["root"] / "train", tmp_path / "train")
    return tmp_path / "train"


def _damage_data_file(step_dir: Path) -> str:
    target = sorted((step_dir / "state" / "d").iterdir())[0]  # the arrays, compressed
    os.truncate(target, target.stat().st_size // 2)
    return "DATA_LOSS|OUT_OF_RANGE"


def _damage_progress(step_dir: Path) -> str:
    (step_dir / "progress" / "metadata").write_text('{"format": "jax-attention.training-che')
    return "JSONDecodeError"


# Orbax's synchronous restore runs TensorStore reads on an asyncio loop that it closes when a read
# fails; the reads still in flight then call back into the closed loop, and Python reports each
# as an "Exception ignored" (RuntimeError: Event loop is closed) whenever the garbage collector
# gets to it — sometimes in this test, sometimes in a later one. Noise from Orbax's clean-up
# after the failure this test causes on purpose; what it checks (the warning, the fallback, the
# resumed result) is asserted below.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("damage", [_damage_data_file, _damage_progress])
def test_a_damaged_newest_checkpoint_is_reported_and_the_one_before_used(reference, tmp_path,
                                                                         damage):
    directory = _copy_run(reference, tmp_path)
    why = damage(directory / str(TOTAL))
    # The finished run resumed: from step TOTAL - EVERY, its last two steps trained again.
    with pytest.warns(CorruptCheckpointWarning,
                      match=rf"training checkpoint {TOTAL} in .* cannot be read back "
                            rf"\(.*({why}).*moved it to {TOTAL}\.corrupt"):
        run = train.train_bahdanau(**TINY, checkpoint_dir=directory, checkpoint_every=EVERY,
                                   resume=True)
    assert run.resumed_from_step == TOTAL - EVERY
    assert_same_losses(run.losses, reference["json"]["losses"])
    _assert_same_arrays(read_training_checkpoint(directory)[0], reference["arrays"])
    assert (directory / f"{TOTAL}.corrupt").is_dir()  # kept aside for inspection
    # Orbax's stray read callbacks (above): collected here, not in another test.
    time.sleep(0.5)
    gc.collect()


def test_no_readable_checkpoint_is_an_error_not_a_fresh_start(reference, tmp_path):
    directory = _copy_run(reference, tmp_path)
    for step in (TOTAL - 2 * EVERY, TOTAL - EVERY, TOTAL):
        _damage_progress(directory / str(step))
    with pytest.warns(CorruptCheckpointWarning), \
            pytest.raises(FileNotFoundError, match="no readable training checkpoint"):
        train.train_bahdanau(**TINY, checkpoint_dir=directory, resume=True)


def test_resuming_another_configuration_names_every_difference(reference, tmp_path):
    directory = _copy_run(reference, tmp_path)
    with pytest.raises(CheckpointMismatchError) as error:
        train.train_bahdanau(**{**TINY, "num_hiddens": 12, "num_layers": 2},
                             checkpoint_dir=directory, resume=True)
    message = str(error.value)
    assert f"cannot resume from training checkpoint {TOTAL}" in message
    assert "num_hiddens: 8 in the checkpoint, 12 in this run" in message
    assert "num_layers: 1 in the checkpoint, 2 in this run" in message
    assert "missing from the checkpoint: model/decoder/gru/layers/1/W_h" in message
    assert "model/decoder/W_k: float32[8, 8] in the checkpoint, float32[12, 12] in this run" \
        in message
    # The CLI: a usage error (status 2) with the same message, before any training.
    status, _, err = _cli(*TINY_ARGS, "--checkpoint-dir", str(directory), "--checkpoint",
                          str(tmp_path / "model"), "--resume", "--lr", "0.01")
    assert status == 2 and "training.lr: 0.005 in the checkpoint, 0.01 in this run" in err
    assert sorted(p.name for p in directory.iterdir()) == sorted(
        p.name for p in (reference["root"] / "train").iterdir())  # nothing written


def test_a_checkpoint_of_another_structure_is_refused_by_path(reference, tmp_path):
    """Same settings, arrays that do not fit: refused, naming the paths (never a partial load)."""
    nmt = load_data_nmt(TINY["batch_size"], TINY["num_steps"], TINY["num_examples"], seed=1,
                        val_fraction=TINY["val_fraction"])
    model = BahdanauSeq2Seq(len(nmt.src_vocab), len(nmt.tgt_vocab), 8, 8, 2, 0.1,
                            rngs=nnx.Rngs(0))
    _, state = nnx.split((model, nnx.Optimizer(model, loop.clipped_adam(0.005),
                                                wrt=nnx.Param)))
    with TrainingCheckpoints(_copy_run(reference, tmp_path),
                             config=reference["progress"]["config"]) as checkpoints, \
            pytest.raises(CheckpointMismatchError) as error:
        checkpoints.restore(state)
    missing, key = str(error.value).splitlines()[1:]  # no settings differ
    assert missing.startswith("  missing from the checkpoint: model/decoder/gru/layers/1/W_h, ")
    assert "optimizer/opt_state/1/0/mu/encoder/gru/layers/1/W_x" in missing
    # Dropout keys of another PRNG implementation (threefry, not the trainer's rbg).
    assert key == "  model/dropout_rngs/key: uint32[4] in the checkpoint, uint32[2] in this run"


def test_an_existing_run_is_not_overwritten_without_resume(reference, tmp_path):
    directory = _copy_run(reference, tmp_path)
    status, _, err = _cli(*TINY_ARGS, "--checkpoint-dir", str(directory), "--checkpoint",
                          str(tmp_path / "model"))
    assert status == 2 and "holds training checkpoints already" in err and "--resume" in err


def test_resume_with_more_epochs_extends_the_run(reference, tmp_path):
    directory = _copy_run(reference, tmp_path)
    longer = train.train_bahdanau(**{**TINY, "epochs": EPOCHS + 1}, checkpoint_dir=directory,
                                  checkpoint_every=EVERY, resume=True)
    assert longer.resumed_from_step == TOTAL
    assert_same_losses(longer.losses[:EPOCHS], reference["json"]["losses"])
    assert len(longer.losses) == EPOCHS + 1 and np.isfinite(longer.losses[-1])
    fewer = EPOCHS - 1
    with pytest.raises(ValueError, match=rf"epochs = {fewer} \({fewer * STEPS_PER_EPOCH} steps\) "
                                         rf"is fewer than the {TOTAL + STEPS_PER_EPOCH} steps"):
        train.train_bahdanau(**{**TINY, "epochs": fewer}, checkpoint_dir=directory, resume=True)


# --------------------------------------------------------------------------- non-finite steps

HUGE_LR = ["--lr", "1e30", "--epochs", "1", "--checkpoint-every", "1"]


def test_a_non_finite_step_stops_training_and_keeps_the_last_good_checkpoint(tmp_path):
    """lr = 1e30: Adam's first update moves every parameter by about 1e30, and the second step's
    forward pass overflows. Training stops at step 2 with status 3 and keeps checkpoint 1."""
    directory = tmp_path / "train"
    status, _, err = _cli(*TINY_ARGS, *HUGE_LR, "--checkpoint-dir", str(directory),
                          "--checkpoint", str(tmp_path / "model"))
    assert status == EXIT_NONFINITE == 3
    assert ("non-finite loss, gradient or parameter update (NaN or Inf) at step 2 (epoch 1, "
            "batch 2 of 4)") in err
    assert f"the last training checkpoint is step 1 in {directory}" in err
    assert sorted(p.name for p in directory.iterdir()) == ["1"]
    arrays, progress = read_training_checkpoint(directory)
    assert all(np.all(np.isfinite(a)) for a in arrays.values() if a.dtype.kind == "f")
    assert not (tmp_path / "model").exists()

    # The step named is the first bad one: from checkpoint 1, the plain (unguarded) compiled
    # step on the second batch of epoch 1 gives a non-finite loss or parameters.
    nmt, graphdef, state = _setup(lr=1e30)
    with TrainingCheckpoints(directory, config=progress["config"]) as checkpoints:
        state, _ = checkpoints.restore(state)
    batches, _ = loop.epoch_batches(nmt, 0)
    src, src_valid_len, tgt, tgt_valid_len = (array[1] for array in batches)
    state, loss = loop.jit_step(graphdef, state, (
        src, src_valid_len, teacher_forcing_inputs(tgt, nmt.tgt_vocab["<bos>"]), tgt,
        tgt_valid_len))
    params = [p for p in jax.tree.leaves(nnx.to_pure_dict(state)[0])
              if jnp.issubdtype(p.dtype, jnp.floating)]
    assert not (np.isfinite(loss) and all(np.all(np.isfinite(p)) for p in params))

    # --resume --skip-nonfinite finishes the run: steps 2 to 4 skipped, counted, no update.
    status, out, err = _cli(*TINY_ARGS, *HUGE_LR, "--checkpoint-dir", str(directory),
                            "--checkpoint", str(tmp_path / "model"), "--json",
                            str(tmp_path / "run.json"), "--resume", "--skip-nonfinite")
    assert status == 0, err
    figures = json.loads((tmp_path / "run.json").read_text())
    assert figures["skipped_steps"] == 3 and "skipped 3 step(s)" in out
    final, _ = read_training_checkpoint(directory)
    assert_same_params({p: a for p, a in final.items() if "dropout_rngs" not in p},
                       {p: a for p, a in arrays.items() if "dropout_rngs" not in p})
    assert int(final["model/dropout_rngs/count"]) == 4  # the dropout stream moved on


def _setup(lr: float = 0.005):
    """``(nmt, graphdef, state)`` of ``train_bahdanau(**TINY, lr=lr)`` before its first step."""
    spec = MODELS["bahdanau"]
    sizes = {name: value for name, value in TINY.items()
             if name not in ("epochs", "progress", "log")}
    model_settings, train_settings, _ = spec.split_settings(sizes)
    nmt, _, model, optimizer = seq2seq.setup(
        spec, spec.model_config(**model_settings, dropout=0.1),
        spec.train_config(**train_settings, lr=lr))
    return nmt, *nnx.split((model, optimizer))


def test_the_compiled_steps_reject_a_non_finite_step_without_a_host_sync(monkeypatch, reference):
    """A loss made NaN for one batch, inside the compiled scan: stop mode keeps the state before
    it (and rejects the rest of the call); skip mode leaves out only its update — the parameters
    and Adam's state stay, the dropout stream moves on — so that the later steps are those of a
    run without that batch's update. (The oracles run the same poisoned program.)"""
    nmt, graphdef, state = _setup()
    bos_id = nmt.tgt_vocab["<bos>"]
    first, second = loop.epoch_batches(nmt, 0)[0], loop.epoch_batches(nmt, 1)[0]
    batches = tuple(np.concatenate([a, b[:1]]) for a, b in zip(first, second))  # 5 batches
    assert batches[3].min() >= 1  # every target has a token: a row of length 0 marks a batch
    bad = 2
    marked = batches[:3] + (batches[3].copy(),)
    marked[3][bad, 0] = 0

    unpoisoned = loop.masked_cross_entropy

    def poisoned(logits, tgt, tgt_valid_len, **divisor):
        ce = unpoisoned(logits, tgt, tgt_valid_len, **divisor)
        return ce * jnp.where(jnp.any(tgt_valid_len == 0), jnp.nan, 1.0)

    monkeypatch.setattr(loop, "masked_cross_entropy", poisoned)
    # A fresh compilation (the module's jit would reuse the unpoisoned one), which the oracles
    # below run too: the poisoned program is another program than the module's, whose fusions
    # may round otherwise (they do on a GPU, and on CPU with XLA's elemental fusion emitters).
    fresh = jax.jit(loop.train_steps.__wrapped__, static_argnums=(0, 3))

    def steps(state, batches, skip=False):
        state, losses = fresh(graphdef, state, batches, bos_id, skip)
        return state, np.asarray(losses)

    def copy(state):
        return jax.tree.map(lambda array: array.copy(), state)

    prefix, prefix_losses = steps(copy(state), tuple(a[:bad] for a in batches))
    prefix_arrays = checkpointing.state_arrays(prefix)  # before the next call donates it
    # The skip oracle: the steps before, the dropout count advanced by one, the steps after.
    count = prefix[0]["dropout_rngs"]["count"]
    count.set_value(count.get_value() + jnp.uint32(1))
    suffix, suffix_losses = steps(prefix, tuple(a[bad + 1:] for a in batches))

    stopped, losses = steps(copy(state), marked)
    assert np.isnan(losses[bad:]).all() and np.isfinite(losses[:bad]).all()
    # The same program on other batches: bit for bit on CPU, to rounding on a GPU.
    assert_same_losses(losses[:bad], prefix_losses)
    _assert_same_arrays(checkpointing.state_arrays(stopped), prefix_arrays)

    skipped, losses = steps(state, marked, skip=True)
    assert np.isnan(losses[bad]) and np.isfinite(np.delete(losses, bad)).all()
    assert_same_losses(np.delete(losses, bad), np.concatenate([prefix_losses, suffix_losses]))
    _assert_same_arrays(checkpointing.state_arrays(skipped), checkpointing.state_arrays(suffix))


def test_save_refuses_a_state_with_nan(tmp_path):
    _, _, state = _setup()
    state[0]["encoder"]["embedding"].set_value(
        state[0]["encoder"]["embedding"].get_value().at[0, 0].set(jnp.nan))
    with TrainingCheckpoints(tmp_path, config={}) as checkpoints, \
            pytest.raises(ValueError, match="refusing to write checkpoint 5: NaN or Inf in "
                                            "model/encoder/embedding"):
        checkpoints.save(5, state, {})
    assert not any(tmp_path.iterdir())


# --------------------------------------------------------------------------- arguments


@pytest.mark.parametrize(("argv", "message"), [
    (["--checkpoint-every", "5"], "argument --checkpoint-every: needs --checkpoint-dir"),
    (["--resume"], "argument --resume: needs --checkpoint-dir"),
    (["--checkpoint-dir", "D", "--keep", "0"], "argument --keep: expected an integer >= 1"),
    (["--checkpoint-dir", "D", "--checkpoint-every", "0"],
     "argument --checkpoint-every: expected an integer >= 1"),
    (["--checkpoint-dir", "runs/x", "--checkpoint", "runs/x"],
     "argument --checkpoint-dir: must differ from --checkpoint"),
])
def test_bad_long_run_arguments_exit_2(argv, message):
    status, _, err = _cli(*argv)
    assert status == 2 and message in err


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"checkpoint_every": 5}, r"checkpoint_every = 5 needs a checkpoint_dir, got None"),
    ({"resume": True}, r"resume = True needs a checkpoint_dir, got None"),
    ({"checkpoint_dir": "D", "keep": 0}, r"keep must be an integer >= 1, got 0"),
    ({"checkpoint_dir": "D", "checkpoint_every": 0},
     r"checkpoint_every must be an integer >= 1, got 0"),
    ({"skip_nonfinite": 1}, r"skip_nonfinite must be True or False, got 1"),
])
def test_training_rejects_bad_long_run_arguments(kwargs, message):
    for trainer in (train.train_bahdanau, train.train_transformer):
        with pytest.raises(ValueError, match=message):
            trainer(**kwargs)


def test_the_transformer_resumes_mid_epoch_bit_for_bit(tmp_path, tiny_run):
    """``train_transformer`` shares the machinery: interrupted by SIGINT (sent in-process from its
    log callback as it logs epoch 1: step 4, a checkpoint), its newest checkpoint dropped (as if
    killed after step 2), then resumed mid-epoch: the shared tiny run's losses and final state,
    the uninterrupted run of the same settings."""
    reference = tiny_run("transformer")
    settings = tiny_settings("transformer", checkpoint_every=EVERY)

    def interrupt(line):
        if not line.startswith("epoch 1,"):  # the compile lines come first
            return
        handler = signal.getsignal(signal.SIGINT)  # the trainer's, or SIGINT would stop pytest
        assert handler not in (signal.default_int_handler, signal.SIG_DFL, signal.SIG_IGN)
        os.kill(os.getpid(), signal.SIGINT)

    directory = tmp_path / "run"
    # Python's own handler first: a test runner started in the background ignores SIGINT, and
    # the trainer leaves an ignored SIGINT ignored.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(train.TrainingInterrupted) as stop:
            train.train_transformer(**{**settings, "log": interrupt}, log_every=1,
                                    checkpoint_dir=directory)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back
    finally:
        signal.signal(signal.SIGINT, previous)
    assert stop.value.step == STEPS_PER_EPOCH
    assert stop.value.checkpoint == directory / str(STEPS_PER_EPOCH)
    shutil.rmtree(directory / str(STEPS_PER_EPOCH))
    resumed = train.train_transformer(**settings, checkpoint_dir=directory, resume=True)
    assert resumed.resumed_from_step == EVERY
    assert_same_losses(resumed.losses, reference.record["losses"])
    _assert_same_arrays(read_training_checkpoint(directory)[0],
                        read_training_checkpoint(reference.train)[0])


def test_a_setting_added_since_the_checkpoint_is_no_difference_at_its_old_value():
    """Bahdanau runs record ``training.val_fraction`` since the configs of issue 14; a checkpoint
    written before has none, which is what 0.0 does: it still resumes. Another value differs."""
    old = {"model": "bahdanau", "training": {"lr": 0.005, "epochs": 2}}
    same = {"model": "bahdanau", "training": {"lr": 0.005, "epochs": 4, "val_fraction": 0.0}}
    assert checkpointing.config_differences(old, same) == []
    other = {"model": "bahdanau", "training": {"lr": 0.005, "epochs": 2, "val_fraction": 0.1}}
    assert checkpointing.config_differences(old, other) == [
        "training.val_fraction: '<absent>' in the checkpoint, 0.1 in this run"]
