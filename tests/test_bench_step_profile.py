"""``jax-attention bench profile``: the kernels of the compiled training step.

Timings on a shared machine say nothing: the tests check that the profile reads the kernels of
the real compiled step back from the trace (every kernel an instruction of the program, each
phase present, the shares adding up) and how instructions are sorted into phases and kinds.
"""

from __future__ import annotations

import json
import math
import os

import pytest

from jax_attention.bench import step_profile as profile
from jax_attention.cli import main

TINY = {"num_hiddens": 8, "ffn_num_hiddens": 16, "num_heads": 2, "num_layers": 1,
        "dropout": 0.1, "max_positions": 16}


@pytest.fixture(scope="module")
def record():
    return profile.profile_train_step("transformer", steps=2, calls=2, sizes=TINY, top=5)


def test_every_phase_holds_kernels_of_the_compiled_step(record):
    assert record["benchmark"] == "step_profile" and record["model"] == "transformer"
    assert set(record["phases"]) == set(profile.PHASES)
    for phase in record["phases"].values():
        assert phase["kernels_per_step"] > 0 and phase["us_per_step"] > 0
    assert sum(p["share"] for p in record["phases"].values()) == pytest.approx(1, abs=1e-3)
    assert sum(k["share"] for k in record["kinds"]) == pytest.approx(1, abs=1e-3)
    assert record["kernels_per_step"] == pytest.approx(
        sum(p["kernels_per_step"] for p in record["phases"].values()), abs=0.5)
    assert record["kernel_ms_per_step"] > 0 and record["wall_ms_per_step"] > 0
    assert record["compile_s"] > 0 and record["tokens_per_s"] > 0


def test_slowest_kernels_are_named_with_their_shape_and_operation(record):
    kernels = record["slowest_kernels"]
    assert 1 <= len(kernels) <= 5 and len(record["shapes"]) <= 5
    assert [k["us_per_step"] for k in kernels] == sorted(
        (k["us_per_step"] for k in kernels), reverse=True)
    for kernel in kernels:
        assert kernel["shape"].split("[")[0] in ("f32", "s32", "u32", "pred")
        # Kernels XLA adds itself (copies, wrapped reduce-windows: about a microsecond each) carry
        # no op_name; one stalled by a busy machine can rank among the slowest (seen once in CI
        # with four test processes on two cores). Every kernel with a name is the step's.
        assert kernel["opcode"] and (kernel["op_name"].startswith("jit(train_steps)")
                                     or kernel["op_name"] == "")
    assert any(k["op_name"].startswith("jit(train_steps)") for k in kernels)
    json.dumps(record)
    assert math.isfinite(record["kernel_ms_per_step"])


def test_format_lists_every_table(record):
    text = profile.format_step_profile(record)
    for header in ("phase", "kind", "output shape", "kernel"):
        assert f"\n{header} " in f"\n{text}"
    for phase in profile.PHASES:
        assert f"\n{phase} " in text


def test_kernel_table_reads_the_compiled_text():
    text = "\n".join([
        "%fused_computation (param_0: f32[4]) -> f32[4] {",
        '  ROOT %dot.3 = f32[640,32]{1,0} dot(%a, %b), lhs_contracting_dims={1}, metadata='
        '{op_name="jit(train_steps)/while/body/closed_call/transpose(jvp(bti,io->bto))/dot"}',
        '  %ynn_fusion.2 = f32[64,10]{1,0} fusion(%c), kind=kCustom, metadata={op_name='
        '"jit(train_steps)/while/body/closed_call/jvp(x)/dot_general"}',
        "  %copy.1 = f32[3]{0} copy(%d)",
        "  %fusion.4 = (f32[2]{0}, s32[]) fusion(%e), kind=kLoop",
        "  %cond.7 = f32[3]{0} conditional(%p, %x, %y)",
        "}",
    ])
    table = profile.kernel_table(text)
    assert table == {
        "dot.3": ("f32[640,32]", "dot",
                  "jit(train_steps)/while/body/closed_call/transpose(jvp(bti,io->bto))/dot"),
        "ynn_fusion.2": ("f32[64,10]", "fusion",
                         "jit(train_steps)/while/body/closed_call/jvp(x)/dot_general"),
        "copy.1": ("f32[3]", "copy", ""),
        "fusion.4": ("(f32[2], s32[])", "fusion", ""),
        "cond.7": ("f32[3]", "conditional", ""),
    }
    assert [profile.phase_of(op) for _, _, op in table.values()][:3] == ["backward", "forward",
                                                                          "update"]
    # A conditional's span holds its branch's kernels: not counted itself. Nor is what is not
    # an instruction (the runtime's spans), nor what is not a complete event.
    trace = {"traceEvents": [{"ph": "X", "name": "dot.3", "dur": 5}, {"ph": "X", "name": "cond.7",
             "dur": 9}, {"ph": "X", "name": "ThunkExecutor::Execute", "dur": 20},
             {"ph": "X", "name": "fusion.4", "dur": 2}, {"ph": "M", "name": "copy.1"}]}
    assert profile.kernel_events(trace, table) == [("dot.3", 5.0), ("fusion.4", 2.0)]
    assert profile.phase_of("jit(train_steps)/while/body/add") == "update"
    assert profile.kind_of("dot.3", "dot") == "GEMM, generic (Eigen)"
    assert profile.kind_of("ynn_fusion.2", "fusion") == "library fusion (YNNPACK)"
    assert profile.kind_of("add_fusion", "fusion").startswith("fusion")
    assert profile.kind_of("copy.1", "copy") == "copy"


def test_a_stale_trace_folder_of_a_dead_process_is_removed(tmp_path, monkeypatch):
    import subprocess
    import sys
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    stale = tmp_path / f"jax-attention-profile-{gone}-abc"
    alive = tmp_path / f"jax-attention-profile-{os.getppid()}-abc"
    other = tmp_path / "jax-attention-profile-notapid"
    for folder in (stale, alive, other):
        folder.mkdir()
    profile.profile_train_step("transformer", steps=1, calls=1, sizes=TINY, top=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([alive.name, other.name])


def test_bad_arguments_name_themselves():
    with pytest.raises(ValueError, match="model must be one of"):
        profile.profile_train_step("lstm")
    with pytest.raises(ValueError, match="steps"):
        profile.profile_train_step("transformer", steps=0)


def test_command_line_prints_and_writes_json(tmp_path, capsys, monkeypatch):
    out = tmp_path / "profile.json"
    calls, real = [], profile.profile_train_step

    def fake(model, **kwargs):  # the record of a real run, without profiling the book model
        calls.append((model, kwargs))
        return real("transformer", steps=1, calls=1, sizes=TINY, top=3, log=kwargs["log"])

    monkeypatch.setattr(profile, "profile_train_step", fake)
    assert main(["bench", "profile", "--model", "transformer", "--steps", "1", "--calls", "1",
                 "--top", "3", "--json", str(out)]) == 0
    [(model, kwargs)] = calls
    assert model == "transformer" and kwargs["log"] is not None
    assert {k: kwargs[k] for k in ("steps", "calls", "seed", "top")} == {
        "steps": 1, "calls": 1, "seed": 0, "top": 3}
    printed = capsys.readouterr()
    assert "kernels a step" in printed.out and "profiling 1 calls" in printed.err
    record = json.loads(out.read_text())
    assert record["command"] == "bench profile" and record["benchmark"] == "step_profile"
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "profile", "--steps", "0"])
    assert exit_info.value.code == 2
