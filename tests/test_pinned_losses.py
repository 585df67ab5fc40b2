"""The seed-0 losses of the book's two runs, pinned bit for bit on CPU.

The values are the first three epochs' losses of ``jax-attention train bahdanau`` and ``train
transformer`` — the book's settings, seed 0 — on the shared English–French file, printed with
``float.hex``: those of ``train_bahdanau(epochs=3, seed=0)`` and ``train_transformer(epochs=3,
seed=0)``, since nothing of an epoch depends on the epochs after it (checked below on the tiny
runs). ``make test`` pins those 3-epoch runs (their training, about 4 s each, in one subprocess
that compiles with XLA's defaults: the suite's own processes compile at LLVM -O0, whose last bits
differ, tests/compiler_support.py); the slow set (``make
test-slow``, which .ci/run runs too) checks that the full book runs — the session's shared runs
that docs/models.md's output blocks are checked on (:meth:`tests.shared_runs.SharedRuns.book`,
200 and 250 epochs, about 50 s of CPU together) — begin with the same three losses.

Renewed for issue 15, whose dropout masks come from a counter-based hash
(:mod:`jax_attention.nn.dropout`) instead of ``jax.random.bernoulli``: a new random stream, judged on
quality over seeds 0–5 at the book's settings (exact book sentences, of 24 per model: the
Transformer 17 before, 21 after; Bahdanau 18 before, 18 after). The earlier pins (main at a86d8b7,
the restructuring of issue 14 left them unchanged) were bahdanau ``0x1.e587d61faf465p-2 ...`` and
transformer ``0x1.c118342b3021ep-2 ...``.

Renewed twice more in issue 15, for speed:

- the Transformer's: in training its attention's backward pass is written by hand
  (:func:`jax_attention.nn.scoring.dropout_attention`, ~9% faster a step), the same gradients to
  float32 rounding in another order. Exact book sentences over seeds 0–5: 21 of 24 before and
  after (per seed 3 4 3 3 4 4 before, 2 4 4 4 4 3 after). The pins before were
  ``0x1.bf5a651bbfd2dp-2 ...``.
- the Bahdanau model's: its decoder projects the attention's keys once instead of at every step
  (:func:`jax_attention.nn.scoring.additive_key_projection`), so the gradient of ``W_k`` is summed
  in another order. Exact book sentences over seeds 0–5: 18 of 24 before and after (3 a seed).
  The pins before were ``0x1.e5c721cdbf9f2p-2 ...``.

Renewed in issue 30 (the Transformer's only): training cuts every batch to the training pairs'
longest sentences (``trim_padding``, :func:`jax_attention.train.loop.padded_lengths`: 5 source and
8 target positions of 10 at the book's settings), the loss still divided by ``num_steps``. Without
dropout the losses and gradients are the full-length ones to rounding
(tests/test_seq2seq_trainer.py); with it the masks, drawn for the cut shapes, are others. Exact
book sentences over seeds 0–5: 21 of 24 at full length (2 4 4 4 4 3, ``--no-trim-padding``), 20
cut (2 4 3 3 4 4). The pins before
were ``0x1.bf5a66043cf29p-2 ...``. The Bahdanau pins did not move: its sources are not cut
(its encoder's final state runs over their padding) and its decoder's dropout masks do not depend
on the number of target steps.

Renewed again in issue 30 (the Transformer's only): a cut batch now draws the full-length batch's
dropout masks at the positions it keeps (``num_steps`` of
:func:`jax_attention.models.transformer.transformer`, the ``padded_shape`` of
:func:`jax_attention.nn.dropout.keep_mask`), so that it trains as the full-length batch to rounding,
dropout on (tests/test_seq2seq_trainer.py). The pins came back to the full-length run's, which the
pins before the cut were, within rounding (``0x1.bf5a66043cf29p-2 0x1.52476d4825f0ep-2
0x1.2b969d76f8074p-2``, now ``0x1.bf5a654f69d9ep-2 0x1.52476c2bfeca0p-2 0x1.2b96cb131243ap-2``:
the cut products and reductions round otherwise). The pins before were ``0x1.bfc5bd9a7cec2p-2
...``.

Renewed for both models in issue 30: the training step compiles with XLA:CPU's fast-compile preset
and LLVM at ``-O1`` (:data:`jax_attention.runtime.compilation.CPU_COMPILER_OPTIONS`), whose code
rounds otherwise in the last bits. Exact book sentences over seeds 0–5: the Transformer 21
(4 4 4 2 4 3; 21 with the masks change alone, 3 3 4 3 4 4), the Bahdanau model 18 (3 each), as
before. The pins before were bahdanau ``0x1.e5c721666b910p-2 ...`` and transformer
``0x1.bf5a654f69d9ep-2 0x1.52476c2bfeca0p-2 ...``.

Pinned per class of CPU since issue 30's last stop (:data:`PINS_BY_CPU`,
:func:`jax_attention.runtime.provenance.vector_isa`): the pins above are an AVX-512 CPU's
(Sapphire Rapids, Zen 4); on an AVX2-only one (a Zen 3 EPYC) XLA:CPU's kernels sum in other
groupings, and the same code gave other last bits (the three losses within 3e-5 of the AVX-512
ones). A CPU of a class without pins is checked to rounding against every class's pins.

Kept in issue 51: the Transformer's attention became the one attention core
(:mod:`jax_attention.nn.core`), whose custom JVP replaced the hand-written backward pass above and
is written so that its transpose runs the same operations; the pins did not move.

Any change to the training code that moves a bit of them (another random stream, another order
of operations, another rounding) fails here; such a change must be judged on quality over several
seeds instead, and the pins renewed in the same commit with the reason.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from jax_attention import train
from jax_attention.models.registry import MODELS
from jax_attention.runtime.provenance import vector_isa
from jax_attention.train.loop import train_epochs
from jax_attention.train.seq2seq import setup, training_lengths
from tests import compiler_support
from tests.compiler_support import default_compiler_env
from tests.reproducibility import assert_same_losses
from tests.shared_runs import tiny_settings

#: The pins of each class of CPU (:func:`jax_attention.runtime.provenance.vector_isa`): XLA:CPU's
#: kernels round otherwise in the last bits with AVX2 than with AVX-512, so the runs are bit for
#: bit the same within a class, not across classes (where the three losses agree to ~3e-5).
PINS_BY_CPU = {
    "avx512": {
        "bahdanau": ["0x1.e5c720ff1782ep-2", "0x1.597cd97424baep-2", "0x1.2ec34cb0627c2p-2"],
        "transformer": ["0x1.bf5a654f69d9ep-2", "0x1.52476bc4aabbep-2", "0x1.2b96ca6b29acap-2"],
    },
    # Measured on a Zen 3 EPYC (AVX2, FMA, no AVX-512) at 08b9b63, the same code as the avx512
    # pins.
    "avx2": {
        "bahdanau": ["0x1.e5c7219a15981p-2", "0x1.597cd9a7cec1fp-2", "0x1.2ec34ce40c833p-2"],
        "transformer": ["0x1.bf5a65ea67ef1p-2", "0x1.52476b0fd7a33p-2", "0x1.2b98f61c74a5ep-2"],
    },
}
#: The models pinned (each class pins the same ones).
PINNED_MODELS = tuple(PINS_BY_CPU["avx512"])
#: How far the pins of two classes of CPU are apart, at most: what a CPU of a class without pins
#: is checked to (the same training to rounding).
ACROSS_CPUS_RTOL = 1e-4


def assert_pinned(model: str, losses: list[str]) -> None:
    """``losses`` (``float.hex``) are the pins of this CPU's class, bit for bit; on a class
    without pins, within :data:`ACROSS_CPUS_RTOL` of every class's pins (the same training to
    rounding: the check says which it made)."""
    pins = PINS_BY_CPU.get(vector_isa())
    if pins is not None:
        assert losses == pins[model], f"{model} on a {vector_isa()} CPU"
        return
    got = [float.fromhex(loss) for loss in losses]
    for isa, known in PINS_BY_CPU.items():
        np.testing.assert_allclose(
            got, [float.fromhex(loss) for loss in known[model]], rtol=ACROSS_CPUS_RTOL,
            err_msg=f"no pins for a {vector_isa()} CPU: {model}'s losses {losses} checked to "
                    f"rounding against the {isa} pins")


ROOT = Path(__file__).resolve().parents[1]
TRAINERS = {"bahdanau": train.train_bahdanau, "transformer": train.train_transformer}


CPU_ONLY = pytest.mark.skipif(jax.default_backend() != "cpu",
                              reason="bit-identical only on CPU (GPU reductions are unordered)")


def three_epoch_losses(model: str, data_path: str) -> list[str]:
    """The trainer's own set-up and epochs (:func:`~jax_attention.train.seq2seq.setup`,
    :func:`~jax_attention.train.loop.train_epochs`) at the book's settings, seed 0: the losses
    (``float.hex``) of ``train_bahdanau(epochs=3, seed=0)`` / ``train_transformer(...)`` without
    the final translation of the book's sentences, whose decoders compile for as long as the
    steps."""
    spec = MODELS[model]
    train_config = spec.train_config(epochs=3)
    nmt, _, module, optimizer = setup(spec, spec.model_config(), train_config, data=data_path)
    assert train_config.seed == 0 and train_config.trim_padding
    result = train_epochs(module, optimizer, nmt, epochs=3, desc=model, progress=False,
                          log=None, log_every=1, config={},
                          lengths=training_lengths(spec, nmt, train_config))
    return [float(loss).hex() for loss in result.losses]


@pytest.fixture(scope="module")
def three_epoch_runs(data_path) -> dict[str, list[str]]:
    """:func:`three_epoch_losses` of both models, in one subprocess compiling with XLA's defaults
    (the suite's processes compile faster but to other last bits: tests/compiler_support.py)."""
    code = ("import json, sys\n"
            "from tests.test_pinned_losses import PINNED_MODELS, three_epoch_losses\n"
            "print(json.dumps({m: three_epoch_losses(m, sys.argv[1]) for m in PINNED_MODELS}))")
    done = subprocess.run([sys.executable, "-c", code, str(data_path)], cwd=ROOT,
                          env=default_compiler_env(), capture_output=True, text=True,
                          timeout=600, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


@CPU_ONLY
@pytest.mark.parametrize("model", PINNED_MODELS)
def test_three_epochs_at_the_books_settings_are_pinned(model, three_epoch_runs):
    assert_pinned(model, three_epoch_runs[model])


def test_a_cpu_without_pins_is_checked_to_rounding(monkeypatch):
    """On a class of CPU without pins the losses are checked against every class's to
    rounding: the pins of one class pass, a loss off by more fails."""
    import tests.test_pinned_losses as module

    monkeypatch.setattr(module, "vector_isa", lambda: "riscv64")
    assert_pinned("transformer", PINS_BY_CPU["avx2"]["transformer"])
    off = [float(float.fromhex(loss) * 1.001).hex() for loss in PINS_BY_CPU["avx2"]["transformer"]]
    with pytest.raises(AssertionError, match="no pins for a riscv64 CPU"):
        assert_pinned("transformer", off)


@pytest.mark.slow
@CPU_ONLY
@pytest.mark.parametrize("model", PINNED_MODELS)
def test_book_run_losses_bit_identical(model, book_run):
    """The whole book run (docs/models.md's command) begins with the pinned losses."""
    losses = book_run(model).record["losses"][:3]
    assert_pinned(model, [float(loss).hex() for loss in losses])


@pytest.mark.parametrize("model", PINNED_MODELS)
def test_a_runs_first_epochs_are_those_of_a_shorter_run(model, tiny_run):
    """Why a long run's first losses are the short run's pins: the 2-epoch run's losses are
    the first two of the 3-epoch tiny run's (same seed, same settings)."""
    shorter = TRAINERS[model](**tiny_settings(model, epochs=2))
    assert_same_losses(shorter.losses, tiny_run(model).record["losses"][:2])


def test_the_suite_compiles_at_o0_and_the_pins_at_xla_defaults():
    """tests/compiler_support.py: `make test`'s processes get LLVM -O0 (on CPU), the pins'
    subprocess and `make test-slow` XLA's defaults; flags that set the level are kept."""
    cpu = {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    compiler_support.apply(cpu)
    assert cpu["XLA_FLAGS"].split() == ["--xla_force_host_platform_device_count=4",
                                        *compiler_support.FAST_FLAGS]
    env = default_compiler_env(cpu)
    assert env["XLA_FLAGS"] == "--xla_force_host_platform_device_count=4"
    assert env[compiler_support.VARIABLE] == "default"
    compiler_support.apply(env)  # what the pins' subprocess (and make test-slow) does
    assert not set(compiler_support.FAST_FLAGS) & set(env["XLA_FLAGS"].split())
    own = {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_backend_optimization_level=2"}
    compiler_support.apply(own)
    assert own["XLA_FLAGS"] == "--xla_backend_optimization_level=2"
    with pytest.raises(ValueError, match="JAX_ATTENTION_TEST_COMPILER"):
        compiler_support.apply({compiler_support.VARIABLE: "O3"})
