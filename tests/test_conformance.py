"""The conformance kit: the stored cases and their file format, the runner against the NumPy
reference, user modules and the ``jax-attention conformance`` command.

The runs against JAX, Flax and PyTorch are in tests/crossframework/test_conformance_*.py, one
module each so that a parallel test run spreads them over its workers.
"""

from __future__ import annotations

import hashlib
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
from tests.fault_support import assert_one_line, command_env, run_command


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


#: The cases of the first release, through transformer.teacher_forcing_loss: later cases are
#: appended and these never change (index entries and arrays, bit for bit), so that a result
#: stays comparable across versions of the kit. The digest is :func:`_digest` of them.
FIRST_RELEASE = 58
FIRST_RELEASE_SHA256 = "77ae15f077866a827c8701e2762635081f083c5ed582a46026bd6e17242e4889"


def _digest(cases, names) -> str:
    """sha256 over the cases' index entries and every array's name, dtype, shape and bytes."""
    digest = hashlib.sha256()
    for name in names:
        case = cases[name]
        digest.update(json.dumps(case.index_entry(), sort_keys=True).encode())
        for kind in ("inputs", "params", "outputs"):
            for key, value in flatten_params(getattr(case, kind)).items():
                value = np.asarray(value)
                digest.update(f"{name}/{kind}/{key}:{value.dtype.str}:{value.shape}".encode())
                digest.update(value.tobytes())
    return digest.hexdigest()


def test_cases_are_appended_and_the_first_ones_never_change(stored):
    names = list(stored)[:FIRST_RELEASE]
    assert names[-1] == "transformer.teacher_forcing_loss"
    assert _digest(stored, names) == FIRST_RELEASE_SHA256
    # What came later is appended: the mods' cases, after every case of the book.
    later = list(stored)[FIRST_RELEASE:]
    assert later and all(stored[name].function == "mods.dot_product_attention" for name in later)


def test_cases_cover_every_function_and_edge_case(stored):
    assert {case.function for case in stored.values()} == set(FUNCTIONS)
    assert DEFAULT_CASES_PATH.stat().st_size < 300 * 1024
    tags = {tag for case in stored.values() for tag in case.tags}
    assert tags == {"fully_masked_row", "nan_in_padding", "large_scores"}
    # Scores past exp's overflow for every function with a softmax a user writes by hand.
    large = {case.function for case in stored.values() if "large_scores" in case.tags}
    assert large == {"masking.masked_softmax", "scoring.dot_product_attention",
                     "multihead.multi_head_attention"}
    # The fully masked row appears for every attention function, with valid lengths of both
    # shapes; each kind of mask and the causal flag appear.
    empty = {case.function for case in stored.values() if "fully_masked_row" in case.tags}
    assert empty == {"masking.masked_softmax", "scoring.dot_product_attention",
                     "scoring.additive_attention", "multihead.multi_head_attention",
                     "mods.dot_product_attention"}
    lens_ndims = {case.inputs["valid_lens"].ndim for case in stored.values()
                  if "valid_lens" in case.inputs}
    assert lens_ndims == {0, 1, 2}  # () for unbatched queries
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


def _softmax_scores(case) -> np.ndarray:
    """The scores a large-score case's softmax sees, computed here from the inputs (not by the
    kit's own helper): X, q k^T / sqrt(d), or the same per head after the projections."""
    i, p = case.inputs, case.params
    if case.function == "masking.masked_softmax":
        return i["X"]
    q, k = i["queries"], i["keys"]
    if case.function == "multihead.multi_head_attention":
        N = case.config["num_heads"]

        def heads(X, name):  # (B, L, N H) -> (B, N, L, H)
            Y = X @ p[f"W_{name}"] + p[f"b_{name}"]
            return Y.reshape(*Y.shape[:2], N, -1).transpose(0, 2, 1, 3)

        q, k = heads(q, "q"), heads(k, "k")
    return q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])


def _naive_softmax(scores: np.ndarray) -> np.ndarray:
    """exp(x) / sum(exp(x)) over the last axis: no maximum subtracted."""
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        exps = np.exp(scores)
        return exps / exps.sum(axis=-1, keepdims=True)


def test_large_score_cases_overflow_a_naive_softmax_in_both_dtypes(stored):
    """Each large-score case has rows whose scores all lie beyond exp's float64 range (so that a
    softmax without the maximum subtracted gives NaN in float64, and in float32, whose range ends
    at 88.7), its weights spread within a row (not one-hot), finite expected outputs, and — for
    the dot-product and multi-head cases — scores exact in float32, so that a float32 run
    measures the softmax rather than the rounding of a score of 900."""
    large = [case for case in stored.values() if "large_scores" in case.tags]
    assert len(large) == 3
    for case in large:
        scores = _softmax_scores(case)
        assert 300 < np.abs(scores).max() < 2000, case.name
        for dtype in (np.float64, np.float32):
            naive = _naive_softmax(scores.astype(dtype))
            rows = ~np.isfinite(naive).all(axis=-1)
            assert rows.sum() >= 2, (case.name, dtype)
        assert all(np.isfinite(value).all() for value in case.outputs.values()), case.name
        weights = case.outputs["weights"]
        assert (weights.max(axis=-1) < 0.99).mean() > 0.6, case.name  # spread, mostly
        assert np.abs(case.outputs.get("output", weights)).max() < 100  # docs' error bound
        if case.function != "masking.masked_softmax":
            f32 = {name: value.astype(np.float32) for name, value in case.inputs.items()}
            cast = type(case)(case.name, case.function, case.config, "", f32,
                              {n: v.astype(np.float32) for n, v in case.params.items()})
            assert np.array_equal(_softmax_scores(cast), scores), case.name
    # A row of the masked softmax past float64's range, one past float32's only.
    X = next(case for case in large if case.function == "masking.masked_softmax").inputs["X"]
    row_max = X.max(axis=-1)
    assert (row_max > 710).any() and ((88.8 < row_max) & (row_max < 709)).any()
    assert (row_max < -746).any()  # and one that underflows: 0 / 0


def _variants(stored, function):
    return {name: case for name, case in stored.items() if case.function == function}


def test_cases_cover_every_variant_of_dot_product_attention(stored):
    """scale, sliding windows (with and without the causal mask, with valid lengths, one leaving
    a row with no key), soft-capping that changes the result, grouped- and multi-query heads and
    unbatched inputs each have a case, checked on the data rather than on the names."""
    from reference_numpy.scoring import dot_product_attention

    dot = _variants(stored, "scoring.dot_product_attention")
    assert any(case.config.get("scale") not in (None, 0.5) for case in dot.values())
    windows = [case for case in dot.values() if "local_window_size" in case.config]
    for case in windows:  # JSON has no tuples: [left, right], which the functions take
        window = case.config["local_window_size"]
        assert isinstance(window, list) and len(window) == 2 and min(window) >= 0
    assert {bool(case.config.get("is_causal")) for case in windows} == {False, True}
    assert all("valid_lens" in case.inputs for case in windows)
    assert any("fully_masked_row" in case.tags for case in windows)
    # The soft cap bites: without it the weights are far from the stored ones.
    capped = [case for case in dot.values() if case.config.get("logit_softcap")]
    assert capped
    for case in capped:
        config = {k: v for k, v in case.config.items() if k != "logit_softcap"}
        i = case.inputs
        _, weights = dot_product_attention(i["queries"], i["keys"], i["values"],
                                           i.get("valid_lens"), mask=i.get("mask"),
                                           bias=i.get("bias"), **config)
        assert np.abs(weights - case.outputs["weights"]).max() > 0.1, case.name
    # Grouped-query (N_kv > 1) and multi-query (N_kv = 1) heads, the weights per query head.
    kv_heads = {(case.inputs["queries"].shape[1], case.inputs["keys"].shape[1])
                for case in dot.values() if case.inputs["queries"].ndim == 4}
    assert any(1 < kv < n for n, kv in kv_heads) and any(kv == 1 < n for n, kv in kv_heads)
    for case in dot.values():
        q = case.inputs["queries"]
        assert case.outputs["weights"].shape == q.shape[:-1] + case.inputs["keys"].shape[-2:-1]
    unbatched = [case for case in dot.values() if case.inputs["queries"].ndim == 2]
    assert unbatched and all(case.outputs["output"].ndim == 2 for case in unbatched)


def _mod_parts(spec) -> list[dict]:
    """A mod's config object and those of the mods it combines, recursively."""
    if spec is None:
        return []
    return [spec] + [inner for part in spec.get("mods", ()) for inner in _mod_parts(part)]


def _mod_names(spec) -> list[str]:
    return [part["mod"] for part in _mod_parts(spec)]


def test_cases_cover_every_mod(stored):
    """Every built-in mask and score mod of jax_attention.nn.mods, every combinator and the
    sinks appear in a case, checked on the config and the data: the mask mods' arrays are
    inputs, the learned tables and sinks params, lse is an output; a T != S case has the
    lower-right causal mask, a padding id is used, and the outputs are what reference_numpy
    gives with the mods built from the config by hand."""
    from jax_attention.conformance.functions import COMBINATORS, MASK_MODS, MOD_ARRAYS, SCORE_MODS
    from jax_attention.nn import mods as jax_mods
    from reference_numpy import mods, scoring

    cases = _variants(stored, "mods.dot_product_attention")
    assert len(cases) == 13
    names = [name for case in cases.values()
             for key in ("mask_mod", "score_mod") for name in _mod_names(case.config.get(key))]
    builtins = set(MASK_MODS) | set(SCORE_MODS) | set(COMBINATORS)
    assert set(names) == builtins
    # Every built-in of the mods module but the helpers (alibi_slopes) is in the kit.
    helpers = {"MaskMod", "ScoreMod", "as_mask_mod", "as_score_mod", "index_grids",
               "mask_from_mod", "alibi_slopes"}
    assert set(jax_mods.__all__) - helpers == builtins == set(mods.__all__) - helpers
    assert sum("sinks" in case.params for case in cases.values()) == 1
    lower_right = padding_id = False
    for case in cases.values():
        assert set(case.config) <= {"mask_mod", "score_mod", "scale"}
        assert list(case.outputs) == ["output", "weights", "lse"]
        parts = [part for key in ("mask_mod", "score_mod")
                 for part in _mod_parts(case.config.get(key))]
        # Exactly the arrays its mods read (and the sinks), where MOD_ARRAYS says.
        read = {(where, key) for part in parts for where, key, _ in MOD_ARRAYS.get(part["mod"], ())}
        given = {("inputs", key) for key in case.inputs} | {("params", key) for key in case.params}
        assert given - {("inputs", "queries"), ("inputs", "keys"), ("inputs", "values"),
                        ("params", "sinks")} <= read, case.name
        T, S = case.inputs["queries"].shape[-2], case.inputs["keys"].shape[-2]
        lower_right |= T != S and {"mod": "causal", "offset": S - T} in parts
        padding_id |= any("padding_id" in part for part in parts)
    assert lower_right and padding_id
    # The same numbers with the mods written out by hand, not through build_mod.
    case = cases["mods.segment_ids"]
    i = case.inputs
    output, weights, lse = scoring.dot_product_attention(
        i["queries"], i["keys"], i["values"], return_lse=True,
        mask_mod=mods.segment_ids(i["q_segment_ids"], i["kv_segment_ids"], padding_id=-1))
    for name, value in (("output", output), ("weights", weights), ("lse", lse)):
        np.testing.assert_array_equal(value, case.outputs[name])
    assert np.isneginf(lse).any() and "fully_masked_row" in case.tags
    case = cases["mods.sinks"]
    i, p = case.inputs, case.params
    _, weights, lse = scoring.dot_product_attention(
        i["queries"], i["keys"], i["values"], return_lse=True, scale=0.3, sinks=p["sinks"],
        mask_mod=mods.sliding_window(2, 0))
    np.testing.assert_array_equal(lse, case.outputs["lse"])
    assert (weights.sum(axis=-1) < 1 - 1e-3).all()  # the sinks take a share of every row


def test_cases_cover_every_variant_of_multi_head_attention(stored):
    mha = _variants(stored, "multihead.multi_head_attention")
    heads = []
    for case in mha.values():
        N = case.config["num_heads"]
        H = case.params["W_q"].shape[1] // N
        N_kv = case.params["W_k"].shape[1] // H
        H_v = case.params["W_v"].shape[1] // N_kv
        assert case.config.get("num_kv_heads", N_kv) == N_kv  # the config agrees with W_k
        assert case.params["W_o"].shape[0] == N * H_v
        heads.append((N, N_kv, H, H_v))
    assert any(1 < N_kv < N for N, N_kv, _, _ in heads)  # grouped-query
    assert any(N_kv == 1 < N for N, N_kv, _, _ in heads)  # multi-query
    assert any(H_v != H for _, _, H, H_v in heads)  # value heads of their own size
    assert any("local_window_size" in case.config and case.config.get("scale")
               for case in mha.values())
    unbatched = [case for case in mha.values() if case.inputs["queries"].ndim == 2]
    assert unbatched and all(case.outputs["output"].ndim == 2 and case.outputs["weights"].ndim == 3
                             for case in unbatched)
    assert any(case.inputs.get("valid_lens", np.zeros(0)).ndim == 1 for case in unbatched)


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


def test_an_infinite_reference_entry_is_matched_by_the_same_infinity_only():
    """The log-sum-exp of a row that attends nothing is -inf: the same -inf passes (no NaN from
    inf - inf), anything else fails, and the finite entries keep their tolerance."""
    from jax_attention.conformance.runner import OutputError, compare

    expected = np.array([1.0, -np.inf])
    assert compare(np.array([1.0, -np.inf]), expected, 1e-9, 1e-12) == OutputError(0.0, 0.0, True)
    for got in ([1.0, 3.0], [1.0, np.inf], [1.0, np.nan], [1.1, -np.inf]):
        assert not compare(np.array(got), expected, 1e-9, 1e-12).passed, got
    assert compare(np.array([1.0, 2.0]), np.array([1.0, -np.inf]), 1e9, 1e9).passed is False
    assert compare(np.array([1.0, -np.inf]), np.array([1.0, 2.0]), 1e-9, 1e-12).note == (
        "non-finite values")


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
    # The example of the module docstring (and docs/conformance.md), run as a user would: from
    # scratch in NumPy, it passes every dot-product case, outputs and weights.
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


#: A user's masked softmax, dot-product and multi-head attention from scratch in NumPy, every
#: variant of the cases included; ``MAX_SUBTRACTION = False`` plants the bug the large-score
#: cases are there to catch: exp(x) / sum(exp(x)), which overflows.
SCRATCH_MODULE = """
    import numpy as np

    MAX_SUBTRACTION = True

    def softmax(scores, keep):
        # Over the last axis, where keep is True; a row with nothing to keep gets zeros.
        if MAX_SUBTRACTION:
            shift = np.max(np.where(keep, scores, -np.inf), axis=-1, keepdims=True)
            shift = np.where(np.isfinite(shift), shift, 0.0)
        else:
            shift = np.zeros(scores.shape[:-1] + (1,), scores.dtype)
        exps = np.where(keep, np.exp(np.where(keep, scores - shift, 0.0)), 0.0)
        total = exps.sum(axis=-1, keepdims=True)
        return exps / np.where(total == 0, 1.0, total)

    def masked_softmax(inputs, params, config):
        X = inputs["X"]
        keep = np.ones(X.shape, bool)
        if "valid_lens" in inputs:
            lens = inputs["valid_lens"]
            keep &= np.arange(X.shape[-1]) < lens.reshape(lens.shape + (1,) * (X.ndim - lens.ndim))
        if "mask" in inputs:
            keep &= inputs["mask"]
        return {"weights": softmax(X, keep)}

    def dot_product_attention(inputs, params, config):
        q, k, v = inputs["queries"], inputs["keys"], inputs["values"]
        lens, mask, bias = (inputs.get(name) for name in ("valid_lens", "mask", "bias"))
        unbatched = q.ndim == 2
        if unbatched:
            q, k, v = q[None], k[None], v[None]
            lens = None if lens is None else lens[None]
        if q.ndim == 4:  # heads; fewer key/value heads: grouped-query attention
            k, v = (np.repeat(x, q.shape[1] // x.shape[1], axis=1) for x in (k, v))
        T, S = q.shape[-2], k.shape[-2]
        scale = config.get("scale")
        scores = q @ np.swapaxes(k, -1, -2) * (q.shape[-1] ** -0.5 if scale is None else scale)
        if config.get("logit_softcap") is not None:
            scores = config["logit_softcap"] * np.tanh(scores / config["logit_softcap"])
        if bias is not None:
            scores = scores + bias
        keep = np.ones(scores.shape, bool)
        if lens is not None:  # (B,) -> (B, [1,] 1, 1); (B, T) -> (B, [1,] T, 1)
            keep &= np.arange(S) < lens.reshape(len(lens), *[1] * (q.ndim - 3), -1, 1)
        if mask is not None:
            keep &= mask
        t, s = np.arange(T)[:, None], np.arange(S)
        if config.get("is_causal", False):
            keep &= s <= t
        if config.get("local_window_size") is not None:
            left, right = config["local_window_size"]
            keep &= (t - left <= s) & (s <= t + right)
        weights = softmax(scores, keep)
        output = weights @ v
        if unbatched:
            output, weights = output[0], weights[0]
        return {"output": output, "weights": weights}

    def multi_head_attention(inputs, params, config):
        unbatched = inputs["queries"].ndim == 2  # (T, q): a batch of one
        batched = {name: value[None] if unbatched else value for name, value in inputs.items()}
        N = config["num_heads"]
        H = params["W_q"].shape[1] // N
        N_kv = config.get("num_kv_heads") or params["W_k"].shape[1] // H

        def heads(X, name, num):  # (B, L, num * size) -> (B, num, L, size)
            Y = X @ params["W_" + name] + params.get("b_" + name, 0.0)
            return Y.reshape(*Y.shape[:2], num, -1).transpose(0, 2, 1, 3)

        batched.update(queries=heads(batched["queries"], "q", N),
                       keys=heads(batched["keys"], "k", N_kv),
                       values=heads(batched["values"], "v", N_kv))
        variants = {name: config[name] for name in ("is_causal", "scale", "local_window_size",
                                                     "logit_softcap") if name in config}
        attended = dot_product_attention(batched, {}, variants)
        heads_out, weights = attended["output"], attended["weights"]
        B, _, T, _ = heads_out.shape  # (B, N, T, H_v) -> (B, T, N H_v)
        merged = heads_out.transpose(0, 2, 1, 3).reshape(B, T, -1)
        output = merged @ params["W_o"] + params.get("b_o", 0.0)
        if unbatched:
            output, weights = output[0], weights[0]
        return {"output": output, "weights": weights}

    IMPLEMENTATIONS = {"masking.masked_softmax": masked_softmax,
                       "scoring.dot_product_attention": dot_product_attention,
                       "multihead.multi_head_attention": multi_head_attention}
"""
_SOFTMAX_FUNCTIONS = {"masking.masked_softmax", "scoring.dot_product_attention",
                      "multihead.multi_head_attention"}


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning",
                            "ignore:invalid value encountered:RuntimeWarning")
def test_softmax_without_the_maximum_subtracted_fails_exactly_the_large_score_cases(
        tmp_path, dtype, stored):
    """A user's from-scratch NumPy attention passes every case of its three functions; the same
    file without the row's maximum subtracted in its softmax (the bug that 10 planted bugs showed
    the kit missed) fails exactly the large-score cases, in both dtypes, with NaN."""
    cases = {name for name, case in stored.items() if case.function in _SOFTMAX_FUNCTIONS}
    large = {name for name, case in stored.items() if "large_scores" in case.tags}
    assert large < cases
    stable = _user_module(tmp_path, SCRATCH_MODULE)
    report = run_conformance(str(stable), dtype=dtype)
    assert {r.case for r in report.results} == cases
    assert [(r.case, r.note) for r in report.results if r.status != "PASS"] == []
    assert not report.failed
    naive = tmp_path / "naive_attention.py"
    naive.write_text(stable.read_text().replace("MAX_SUBTRACTION = True",
                                                "MAX_SUBTRACTION = False"))
    report = run_conformance(str(naive), dtype=dtype)
    failed = {r.case: r for r in report.results if r.status == "FAIL"}
    assert set(failed) == large
    assert {r.status for r in report.results if r.case not in large} == {"PASS"}
    for row in failed.values():
        assert "weights: non-finite values" in row.note, row.note
        assert not row.outputs["weights"].passed
    assert report.failed and report.verdict() == f"{len(large)} of {len(cases)} checked rows failed"


#: A user's dot-product attention that cannot express some cases and says so.
PARTIAL_MODULE = """
    from reference_numpy import scoring

    def dot_product_attention(inputs, params, config):
        if config.get("is_causal"):
            raise NotImplementedError("no causal flag:\\nmy function has no is_causal argument")
        if "mask" in inputs:
            raise NotImplementedError  # no message
        if config.get("logit_softcap") is not None:
            raise ValueError("soft-capping went wrong")  # any other error still fails the row
        output, weights = scoring.dot_product_attention(
            inputs["queries"], inputs["keys"], inputs["values"], inputs.get("valid_lens"),
            bias=inputs.get("bias"), **config)
        return {"output": output, "weights": weights}

    IMPLEMENTATIONS = {"scoring.dot_product_attention": dot_product_attention}
"""


def test_not_implemented_error_makes_the_row_not_applicable(tmp_path, capsys):
    """NotImplementedError("why") from a user's function: that case is n/a with the message (as a
    built-in's documented difference), not a failure; with every other row passing the command
    exits 0. Any other exception still fails its row."""
    path = _user_module(tmp_path, PARTIAL_MODULE)
    dot = {name for name, case in load_cases().items() if case.function == _DOT}
    report = run_conformance(str(path))
    by_case = {r.case: r for r in report.results}
    assert set(by_case) == dot
    causal = {name for name in dot if load_cases()[name].config.get("is_causal")}
    masked = {name for name in dot if "mask" in load_cases()[name].inputs}
    assert causal and masked and not causal & masked
    for name in causal:
        assert by_case[name].status == "n/a"
        assert by_case[name].note == ("raised NotImplementedError: no causal flag: my function "
                                      "has no is_causal argument")
        assert by_case[name].max_abs_err is None and by_case[name].outputs == {}
    for name in masked:
        assert (by_case[name].status, by_case[name].note) == (
            "n/a", "raised NotImplementedError (no message)")
    assert by_case["dot_product_attention.logit_softcap"].status == "FAIL"
    assert "raised ValueError: soft-capping went wrong" in by_case[
        "dot_product_attention.logit_softcap"].note
    passing = dot - causal - masked - {"dot_product_attention.logit_softcap"}
    assert {name for name, r in by_case.items() if r.status == "PASS"} == passing
    # Without the failing case the command exits 0: n/a neither passes nor fails.
    record_path = tmp_path / "partial.json"
    assert main(["conformance", "--against", str(path), "--only", "dot_product_attention.",
                 "--json", str(record_path)]) == 1
    capsys.readouterr()
    no_softcap = path.with_name("no_softcap.py")
    no_softcap.write_text(path.read_text().replace('"logit_softcap"', '"no_such_config"'))
    assert main(["conformance", "--against", str(no_softcap), "--json", str(record_path)]) == 0
    printed = capsys.readouterr().out
    summary = next(line for line in printed.splitlines() if line.startswith(("OK", "FAILED")))
    assert summary.startswith(f"OK: {len(passing) + 1} passed, 0 failed, "
                              f"{len(causal) + len(masked)} n/a")
    assert "raised NotImplementedError: no causal flag: my function has no is_causal" in printed
    record = json.loads(record_path.read_text())
    assert record["summary"]["ok"] is True
    assert record["summary"]["not_applicable"] == len(causal) + len(masked)
    assert {row["note"] for row in record["results"] if row["status"] == "n/a"} == {
        "raised NotImplementedError: no causal flag: my function has no is_causal argument",
        "raised NotImplementedError (no message)"}


def test_every_row_not_implemented_checks_nothing_and_fails(tmp_path, capsys):
    """A module whose every function raises NotImplementedError has checked nothing: the
    summary says so and the command exits 1 (as for any run where every row is n/a)."""
    path = _user_module(tmp_path, f"""
        def attend(inputs, params, config):
            raise NotImplementedError("not written yet")

        IMPLEMENTATIONS = {{"{_DOT}": attend}}
    """)
    assert main(["conformance", "--against", str(path)]) == 1
    printed = capsys.readouterr().out
    summary = printed.strip().splitlines()[-1]
    assert summary.startswith("FAILED: 0 passed, 0 failed, ")
    assert summary.endswith("; no case was checked: every row is n/a")
    assert "raised NotImplementedError: not written yet" in printed


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


# --------------------------------------------------------------------------- faulty user modules
# Run as a real subprocess: a sys.exit or KeyboardInterrupt that escaped would end the command
# (status 0, or a traceback), which only a separate process shows as the user sees it.

_DOT = "scoring.dot_product_attention"


def test_user_module_calling_sys_exit_at_import_cannot_be_loaded(tmp_path):
    path = _user_module(tmp_path, "import sys\nsys.exit(0)\n")
    status, out, err = run_command("conformance", "--against", str(path), "--only", "plain")
    assert status == 2
    assert_one_line(err, f"cannot load {path}", "called sys.exit(0) while being imported")
    assert "FAILED" not in out and "OK" not in out


def test_user_function_calling_sys_exit_fails_its_rows(tmp_path):
    path = _user_module(tmp_path, f"""
        import sys

        def attend(inputs, params, config):
            sys.exit(0)

        IMPLEMENTATIONS = {{"{_DOT}": attend}}
    """)
    status, out, err = run_command("conformance", "--against", str(path), "--only",
                                   "dot_product_attention.plain")
    assert status == 1
    line = assert_one_line(err, "my_attention: my_attention.attend called sys.exit(0) in 1 row",
                           "those rows failed")
    assert line.startswith("jax-attention conformance: error: ")
    # The report is there: the row failed with the reason, and the summary is true.
    assert "FAIL [1]" in out and "[1] called sys.exit(0)" in out
    assert "FAILED: 0 passed, 1 failed" in out and "the one checked row failed" in out


def test_user_module_with_a_syntax_error_names_file_and_line(tmp_path):
    path = _user_module(tmp_path, "import numpy\n\ndef attend(inputs, params:\n    pass\n")
    status, _, err = run_command("conformance", "--against", str(path))
    assert status == 2
    assert_one_line(err, f"cannot load {path}: {path}, line 3: SyntaxError: ")


def test_user_module_raising_at_import_names_the_exception(tmp_path):
    path = _user_module(tmp_path, "raise RuntimeError('no GPU\\nfound')\n")
    status, _, err = run_command("conformance", "--against", str(path))
    assert status == 2
    assert_one_line(err, f"cannot load {path}: RuntimeError: no GPU found", f"{path}, line 1")


def test_user_module_by_name_raising_at_import(tmp_path):
    (tmp_path / "broken_attention.py").write_text("import numpy\nraise ImportError('no lib')\n")
    status, _, err = run_command("conformance", "--against", "broken_attention",
                                   env=command_env(PYTHONPATH=str(tmp_path)))
    assert status == 2
    assert_one_line(err, "cannot load broken_attention: ImportError: no lib")


@pytest.mark.parametrize("where", ["import", "function"])
def test_keyboard_interrupt_in_user_code_is_not_a_failure(tmp_path, where):
    body = ("raise KeyboardInterrupt\n" if where == "import" else f"""
        def attend(inputs, params, config):
            raise KeyboardInterrupt

        IMPLEMENTATIONS = {{"{_DOT}": attend}}
    """)
    path = _user_module(tmp_path, body)
    status, out, err = run_command("conformance", "--against", str(path), "--only", "plain")
    assert status == 130
    assert_one_line(err, "jax-attention conformance: interrupted")
    assert "FAIL" not in out  # not swallowed as a failed row


def test_keyboard_interrupt_is_not_caught_by_the_runner(tmp_path):
    path = _user_module(tmp_path, f"""
        def attend(inputs, params, config):
            raise KeyboardInterrupt

        IMPLEMENTATIONS = {{"{_DOT}": attend}}
    """)
    with pytest.raises(KeyboardInterrupt):
        run_conformance(str(path), only="plain")


# --------------------------------------------------------------------------- a garbage --cases


class _Unpickled:
    """Unpickling this writes a file: proof that nothing was unpickled when it is absent."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def _garbage_cases(tmp_path, kind: str):
    import pickle
    import zipfile

    path = tmp_path / f"cases.{kind}"
    if kind == "random":
        path.write_bytes(np.random.default_rng(0).integers(0, 256, 4096, np.uint8).tobytes())
    elif kind == "text":
        path.write_text("case,function\ndot,scoring.dot_product_attention\n")
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "truncated":
        path.write_bytes(DEFAULT_CASES_PATH.read_bytes()[:3000])
    elif kind == "pickle":
        path.write_bytes(pickle.dumps({"cases": _Unpickled(tmp_path / "unpickled")}))
    elif kind == "npy":
        np.save(path.with_suffix(".npy"), np.arange(3))
        path.with_suffix(".npy").rename(path)
    elif kind == "no_index":
        np.savez(path.with_suffix(".npz"), x=np.arange(3))
        path.with_suffix(".npz").rename(path)
    elif kind == "object_array":  # an .npz whose index is an object array: needs pickle
        np.savez(path.with_suffix(".npz"), __index__=np.array([_Unpickled(tmp_path / "unpickled")],
                                                              dtype=object))
        path.with_suffix(".npz").rename(path)
    elif kind == "bad_json":
        np.savez(path.with_suffix(".npz"), __index__=np.frombuffer(b"{not json", np.uint8))
        path.with_suffix(".npz").rename(path)
    elif kind == "missing_array":  # the shipped index without the arrays it names
        with zipfile.ZipFile(DEFAULT_CASES_PATH) as source, zipfile.ZipFile(path, "w") as target:
            target.writestr("__index__.npy", source.read("__index__.npy"))
    return path


@pytest.mark.parametrize(("kind", "reason"), [
    ("random", "not a zip archive"),
    ("text", "not a zip archive"),
    ("empty", "the file is empty"),
    ("truncated", "a damaged or truncated zip archive"),
    ("pickle", "it is a Python pickle; pickles are never loaded"),
    ("npy", "it is a single .npy array, not an .npz archive"),
    ("no_index", "no __index__ entry"),
    ("object_array", "ValueError: Object arrays cannot be loaded when allow_pickle=False"),
    ("bad_json", "its __index__ is not UTF-8 JSON"),
    ("missing_array", "case '"),  # then: ' has no array <case>/input/<name>'
])
def test_garbage_cases_file_is_one_usage_error(tmp_path, capsys, kind, reason):
    path = _garbage_cases(tmp_path, kind)
    with pytest.raises(SystemExit) as exit_info:
        main(["conformance", "--against", "numpy", "--cases", str(path)])
    assert exit_info.value.code == 2
    assert_one_line(capsys.readouterr().err,
                    f"error: --cases {path} is not a conformance case file ({reason}")
    assert not (tmp_path / "unpickled").exists()  # nothing was unpickled
    with pytest.raises(conformance.CaseFileError, match="is not a conformance case file") as info:
        load_cases(path)
    assert isinstance(info.value, ValueError) and info.value.path == path


def test_garbage_cases_file_in_a_subprocess(tmp_path):
    path = _garbage_cases(tmp_path, "pickle")
    status, _, err = run_command("conformance", "--against", "numpy", "--cases", str(path))
    assert status == 2
    assert_one_line(err, f"--cases {path} is not a conformance case file (it is a Python pickle")
    assert not (tmp_path / "unpickled").exists()


# --------------------------------------------------------------------------- the summary's words


def _report(statuses, num_cases=None):
    from jax_attention.conformance.runner import Report, Result

    results = [Result(f"case{i}", _DOT, "impl", status, 1e-9, 1e-12, "float64")
               for i, status in enumerate(statuses)]
    return Report("impl", "test", "float64", {}, results, [], [], [], str(DEFAULT_CASES_PATH),
                  "0" * 64, len(statuses) if num_cases is None else num_cases)


@pytest.mark.parametrize(("statuses", "num_cases", "verdict"), [
    (["FAIL"] * 8, None, "every checked row failed"),
    (["FAIL"], None, "the one checked row failed"),
    (["FAIL", "n/a"], None, "the one checked row failed"),
    (["n/a", "n/a"], None, "no case was checked: every row is n/a"),
    ([], 0, "no case was checked: no case to run"),
    ([], 5, "no case was checked: no implementation given for any case"),
])
def test_summary_says_what_happened(statuses, num_cases, verdict):
    report = _report(statuses, num_cases)
    assert report.failed and report.verdict() == verdict
    summary = report.format().splitlines()[-1]
    assert summary.startswith("FAILED: 0 passed") and summary.endswith(f"; {verdict}")
    if "FAIL" in statuses:
        assert "no case was checked" not in summary


def test_summary_of_a_mixed_and_a_passing_run():
    mixed = _report(["PASS", "FAIL"])
    assert mixed.failed and mixed.format().splitlines()[-1].endswith("(2 rows, float64)")
    passed = _report(["PASS", "n/a"])
    assert not passed.failed and passed.verdict() == ""
    assert passed.format().splitlines()[-1].startswith("OK: 1 passed")


def test_every_row_failing_is_not_reported_as_nothing_checked(tmp_path, capsys):
    path = _user_module(tmp_path, WRONG_MODULE)
    assert main(["conformance", "--against", str(path), "--only", "dot_product"]) == 1
    out = capsys.readouterr().out
    assert "every checked row failed" in out and "no case was checked" not in out


def test_help_documents_the_exit_statuses(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["conformance", "--help"])
    assert exit_info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for fragment in ("Exit status: 0 every checked row passed", "1 the check ran and a row failed",
                     "calls sys.exit fails its rows", "a module that cannot be loaded",
                     "not a case file", "130 interrupted"):
        assert fragment in text
