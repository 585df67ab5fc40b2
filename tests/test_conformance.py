"""The conformance kit: the stored cases and their file format, the runner against the NumPy
reference, user modules and the ``jax-attention conformance`` command.

The runs against JAX, Flax and PyTorch are in tests/crossframework/test_conformance_*.py, one
module each so that a parallel test run spreads them over its workers.
"""

from __future__ import annotations

import json
import re
import sys
import textwrap

import numpy as np
import pytest

import jax_attention.conformance as conformance
from jax_attention.cli import main
from jax_attention.conformance import (
    DEFAULT_CASES_PATH,
    FUNCTIONS,
    generate_cases,
    load_cases,
    run_conformance,
)
from jax_attention.conformance.cases import GRID, flatten_params
from tests.conformance_support import assert_conforms


@pytest.fixture(scope="module")
def stored():
    return load_cases()


# --------------------------------------------------------------------------- the stored file


def _assert_same_bits(a: np.ndarray, b: np.ndarray, where: str) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape, where
    assert a.tobytes() == b.tobytes(), where


def test_stored_cases_are_current(stored):
    """The shipped file is what generate_cases() builds now, so it cannot go stale.

    Everything drawn from the seeds (inputs, parameters), the index and every integer or boolean
    output must agree bit for bit. Float outputs come out of libm and SIMD transcendentals (exp,
    tanh, sin) that may differ by an ulp between CPUs, so they must agree to 1e-13 relative —
    orders of magnitude below any change of the reference code, which is what this test is for.
    """
    fresh = generate_cases()
    assert list(stored) == list(fresh)
    for name, case in fresh.items():
        old = stored[name]
        assert old.index_entry() == case.index_entry(), name
        for kind in ("inputs", "params"):
            old_arrays = flatten_params(getattr(old, kind))
            new_arrays = flatten_params(getattr(case, kind))
            assert list(old_arrays) == list(new_arrays)
            for key in new_arrays:
                _assert_same_bits(old_arrays[key], np.asarray(new_arrays[key]),
                                  f"{name}/{kind}/{key}")
        for key, value in case.outputs.items():
            if value.dtype.kind == "f":
                assert old.outputs[key].dtype == value.dtype, f"{name}/output/{key}"
                np.testing.assert_allclose(old.outputs[key], value, rtol=1e-13, atol=1e-15,
                                           err_msg=f"{name}/output/{key}: run "
                                                   "'jax-attention conformance --regenerate'")
            else:
                _assert_same_bits(old.outputs[key], value, f"{name}/output/{key}")


def test_cases_cover_every_function_and_edge_case(stored):
    assert {case.function for case in stored.values()} == set(FUNCTIONS)
    assert DEFAULT_CASES_PATH.stat().st_size < 300 * 1024
    tags = {tag for case in stored.values() for tag in case.tags}
    assert tags == {"fully_masked_row", "nan_in_padding"}
    # The fully masked row appears for every attention function, with valid lengths of both
    # shapes; each kind of mask and the causal flag appear.
    empty = {case.function for case in stored.values() if "fully_masked_row" in case.tags}
    assert empty == {"masking.masked_softmax", "scoring.dot_product_attention",
                     "scoring.additive_attention", "multihead.multi_head_attention"}
    lens_ndims = {case.inputs["valid_lens"].ndim for case in stored.values()
                  if "valid_lens" in case.inputs}
    assert lens_ndims == {1, 2}
    assert any("mask" in case.inputs for case in stored.values())
    assert any("bias" in case.inputs for case in stored.values())
    assert any(case.config.get("is_causal") for case in stored.values())
    # Inputs and parameters are exact in float32 (the grid), so float32 runs measure arithmetic.
    for case in stored.values():
        arrays = {**case.inputs, **flatten_params(case.params)}
        for key, value in arrays.items():
            if value.dtype.kind == "f":
                finite = value[np.isfinite(value)]
                assert (finite.astype(np.float32).astype(np.float64) == finite).all(), key
                assert (np.round(finite / GRID) * GRID == finite).all(), key


def test_file_format_is_readable_without_the_package(stored):
    # What the module docstring promises to other languages: flat keys, a uint8 JSON index.
    with np.load(DEFAULT_CASES_PATH, allow_pickle=False) as archive:
        index = json.loads(archive["__index__"].tobytes())
        assert archive["__index__"].dtype == np.uint8
        assert index["format"] == "jax-attention-conformance" and index["version"] == 1
        entry = next(e for e in index["cases"] if e["name"] == "seq2seq.logits")
        assert entry["component"] == "bahdanau" and entry["function"] == "bahdanau.seq2seq"
        assert entry["outputs"] == ["logits", "weights"]
        assert "decoder/gru/layer_0/W_x" in entry["params"]
        W_x = archive["seq2seq.logits/param/decoder/gru/layer_0/W_x"]
        assert W_x.dtype == np.float64 and W_x.shape == (6 + 5, 18)
        assert archive["seq2seq.logits/input/src"].dtype == np.int32
        expected_keys = {"__index__"} | {
            f"{e['name']}/{kind}/{name}" for e in index["cases"]
            for kind, names in (("input", e["inputs"]), ("param", e["params"]),
                                ("output", e["outputs"])) for name in names}
        assert set(archive.files) == expected_keys


def test_docstring_lists_every_function_and_its_outputs():
    # The contract users read; it must not drift from the index.
    for function in FUNCTIONS.values():
        line = next(line for line in conformance.__doc__.split("\n* ``")
                    if line.startswith(function.name + "``"))
        assert "-> " + ", ".join(function.outputs) in " ".join(line.split()), function.name


# --------------------------------------------------------------------------- the runner


@pytest.fixture(scope="module", params=["float64", "float32"])
def numpy_report(request):
    return run_conformance("numpy", dtype=request.param)


def test_numpy_reference_reproduces_the_stored_outputs(numpy_report):
    assert_conforms(numpy_report, [])
    if numpy_report.dtype == "float64":
        # Same code, same inputs: the stored file is current to rounding.
        assert max(r.max_abs_err for r in numpy_report.results) < 1e-13


# --------------------------------------------------------------------------- the CLI


def _user_module(tmp_path, body: str):
    path = tmp_path / "my_attention.py"
    path.write_text(textwrap.dedent(body))
    return path


WRONG_MODULE = """
    import numpy as np
    from reference_numpy import masking, scoring

    def masked_softmax(inputs, params, config):
        return {"weights": masking.masked_softmax(inputs["X"], inputs.get("valid_lens"),
                                                  mask=inputs.get("mask"))}

    def dot_product_attention(inputs, params, config):
        # Deliberately wrong: scores not scaled by 1 / sqrt(d).
        q, k = inputs["queries"], inputs["keys"]
        scaled = {**inputs, "queries": q * np.sqrt(q.shape[-1])}
        output, weights = scoring.dot_product_attention(
            scaled["queries"], k, inputs["values"], inputs.get("valid_lens"),
            mask=inputs.get("mask"), bias=inputs.get("bias"), **config)
        return {"output": output, "weights": weights}

    IMPLEMENTATIONS = {
        "masking.masked_softmax": masked_softmax,
        "scoring.dot_product_attention": dot_product_attention,
        "scoring.no_such_function": masked_softmax,
    }
"""


def test_wrong_user_module_fails_exactly_its_wrong_function(tmp_path, capsys):
    path = _user_module(tmp_path, WRONG_MODULE)
    record_path = tmp_path / "out" / "conformance.json"
    status = main(["conformance", "--against", str(path), "--json", str(record_path)])
    printed = capsys.readouterr().out
    assert status == 1
    record = json.loads(record_path.read_text())
    by_status = {}
    for row in record["results"]:
        by_status.setdefault(row["status"], set()).add(row["function"])
    assert by_status == {"FAIL": {"scoring.dot_product_attention"},
                         "PASS": {"masking.masked_softmax"}}
    fails = [line for line in printed.splitlines() if " FAIL" in line]
    assert fails and all("scoring.dot_product_attention" in line for line in fails)
    # Every dot-product case fails, the fully masked one too (its other rows attend).
    passes = [row["case"] for row in record["results"]
              if row["function"] == "scoring.dot_product_attention" and row["status"] == "PASS"]
    assert passes == []
    assert record["unknown_functions"] == ["scoring.no_such_function"]
    assert "scoring.no_such_function" in printed and "FAILED" in printed
    covered = {"masking.masked_softmax", "scoring.dot_product_attention"}
    assert set(record["not_covered"]) == {name for name, case in load_cases().items()
                                          if case.function not in covered}
    assert record["not_covered_functions"] == [name for name in FUNCTIONS if name not in covered]


def test_user_module_by_name_passes_and_errors_fail_the_row(tmp_path, monkeypatch, capsys):
    _user_module(tmp_path, """
        from reference_numpy import positional

        def rotary(inputs, params, config):
            return {"output": positional.rotary_embedding(inputs["X"], inputs.get("positions"),
                                                          **config).tolist()}

        def broken(inputs, params, config):
            raise RuntimeError("not implemented yet")

        IMPLEMENTATIONS = {"positional.rotary_embedding": rotary,
                           "transformer.layer_norm": broken}
    """)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert main(["conformance", "--against", "my_attention", "--only", "rotary"]) == 0
        assert "OK: 2 passed" in capsys.readouterr().out
        assert main(["conformance", "--against", "my_attention", "--only", "layer_norm"]) == 1
        printed = capsys.readouterr().out
        assert "raised RuntimeError: not implemented yet" in printed
    finally:
        sys.modules.pop("my_attention", None)  # imported by name: do not leak into other tests


def test_json_schema(tmp_path):
    record_path = tmp_path / "r.json"
    assert main(["conformance", "--against", "numpy", "--dtype", "float32",
                 "--json", str(record_path)]) == 0
    record = json.loads(record_path.read_text())
    assert set(record) == {"command", "against", "description", "dtype", "environment",
                           "cases_file", "cases_sha256", "num_cases", "summary", "results",
                           "not_covered", "not_covered_functions", "unknown_functions"}
    assert record["command"] == "conformance" and record["against"] == "numpy"
    assert record["dtype"] == "float32" and len(record["cases_sha256"]) == 64
    assert {"python", "numpy", "platform", "dtype"} <= set(record["environment"])
    assert record["summary"] == {"passed": record["num_cases"], "failed": 0, "not_applicable": 0,
                                 "not_covered": 0, "ok": True}
    row = record["results"][0]
    assert set(row) == {"case", "component", "function", "implementation", "status",
                        "max_abs_err", "max_rel_err", "rtol", "atol", "tolerance_dtype",
                        "outputs", "note"}
    assert row["tolerance_dtype"] == "float32" and row["rtol"] == 1e-5
    assert set(row["outputs"]["output"]) == {"max_abs_err", "max_rel_err", "passed", "note"}
    assert all(isinstance(r["max_abs_err"], float) for r in record["results"])


def test_regenerate_round_trips(tmp_path, capsys, stored):
    path = tmp_path / "cases.npz"
    assert main(["conformance", "--regenerate", "--cases", str(path)]) == 0
    assert f"wrote {len(stored)} cases to {path}" in capsys.readouterr().out
    again = load_cases(path)
    assert list(again) == list(stored)
    for name, case in again.items():
        assert case.index_entry() == stored[name].index_entry()
    # Regenerating twice writes the same bytes (fixed zip timestamps), so git sees no change.
    second = tmp_path / "again.npz"
    assert main(["conformance", "--regenerate", "--cases", str(second)]) == 0
    assert second.read_bytes() == path.read_bytes()
    assert main(["conformance", "--against", "numpy", "--cases", str(path), "--only",
                 "transformer"]) == 0


def test_docstring_example_module_passes(tmp_path):
    # The example of the module docstring (and the README), run as a user would: from scratch in
    # NumPy, it passes every dot-product case, outputs and weights.
    example = re.search(r"    # my_attention\.py\n(.*?)\n\n``jax-attention", conformance.__doc__,
                        re.S)
    path = tmp_path / "my_attention.py"
    path.write_text("\n".join(line[4:] for line in example.group(1).splitlines()) + "\n")
    for dtype in ("float64", "float32"):
        report = run_conformance(str(path), dtype=dtype)
        rows = report.results
        assert {r.function for r in rows} == {"scoring.dot_product_attention"}
        assert all(r.status == "PASS" and set(r.outputs) == {"output", "weights"} for r in rows)
        assert len(rows) == sum(case.function == "scoring.dot_product_attention"
                                for case in load_cases().values())
        assert not report.failed and report.unknown == []


@pytest.mark.parametrize(("argv", "message"), [
    (["conformance"], "argument --against: required"),
    (["conformance", "--against", "no_such_module_xyz"], "cannot import 'no_such_module_xyz'"),
    (["conformance", "--against", "missing.py"], "no such file: missing.py"),
    (["conformance", "--regenerate", "--against", "numpy"], "drop --against numpy"),
    (["conformance", "--against", "numpy", "--cases", "nowhere.npz"], "no such file"),
    (["conformance", "--against", "numpy", "--dtype", "float16"], "invalid choice: 'float16'"),
    (["conformance", "--against", "numpy", "--platform", "cpu"], "numpy runs on the host CPU"),

])
def test_usage_errors_exit_2(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_missing_platform_is_a_usage_error(capsys):
    import jax

    def available(platform):
        try:
            return bool(jax.devices(platform))
        except RuntimeError:
            return False

    missing = [platform for platform in ("tpu", "gpu") if not available(platform)]
    if not missing:
        pytest.skip("every platform is present")
    with pytest.raises(SystemExit) as exit_info:
        main(["conformance", "--against", "jax", "--platform", missing[0]])
    assert exit_info.value.code == 2
    assert f"JAX has no {missing[0]!r} platform here" in capsys.readouterr().err


def test_module_without_implementations_is_a_usage_error(tmp_path, capsys):
    path = _user_module(tmp_path, "X = 1\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["conformance", "--against", str(path)])
    assert exit_info.value.code == 2
    assert "must define IMPLEMENTATIONS" in capsys.readouterr().err
