"""``bench attention`` and ``bench memory``: the records on tiny shapes, the CLI, bad options.

Timings here are of tiny shapes on a shared machine: the tests check that every peer ran the real
code and the record holds what the schema promises (finite positive times, ratios, small errors,
the environment), not how fast anything is.
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys

import numpy as np
import pytest

from jax_attention.bench.attention_peers import float64_grads, numpy_peer
from jax_attention.bench.attention import (PEERS, attention_flops,
                                           bench_attention, format_attention, padding_lens,
                                           window_band, window_pairs)
from jax_attention.bench.memory import (bench_memory, format_memory, nothing_measured,
                                        plain_estimate_bytes, run_child)
from jax_attention.cli import build_parser, main
from tests.fault_support import assert_one_line, run_command

# PyTorch is optional: without it the torch peer must be recorded as skipped, with the reason.
HAVE_TORCH = importlib.util.find_spec("torch") is not None

TINY = (2, 2, 16, 8)  # (B, N, T, H)
WINDOW = (2, 1)  # query t attends keys t-2..t+1


def _positive(x) -> bool:
    return isinstance(x, float) and math.isfinite(x) and x > 0


@pytest.fixture(scope="module")
def record():
    """One run of every peer on a tiny shape, with and without padding (shared by the tests)."""
    return bench_attention([TINY], repeats=5, warmup=0, gemm_size=64, budget_s=600.0)


@pytest.fixture(scope="module")
def windowed():
    """Every peer on the tiny shape, with and without padding, without a window and with
    :data:`WINDOW` (with padding, some queries of TINY's shorter sequence attend no key)."""
    return bench_attention([TINY], local_window_sizes=[None, WINDOW], repeats=5, warmup=0,
                           gemm_size=64, budget_s=600.0)


def test_attention_flops():
    # 2·T·S·H for Q K^T and as many for weights · V, per batch and head; backward twice that.
    assert attention_flops(2, 3, 5, 7, 11) == 4 * 2 * 3 * 5 * 7 * 11
    assert attention_flops(2, 3, 5, 7, 11, backward=True) == 3 * 4 * 2 * 3 * 5 * 7 * 11


@pytest.mark.parametrize("batch", [1, 4, 8])
def test_padding_lens(batch):
    lens = padding_lens(batch, 128, np.random.default_rng(0))
    assert lens.shape == (batch,) and lens.dtype == np.int32
    assert (lens >= 1).all() and (lens <= 128).all()
    assert abs(1 - lens.mean() / 128 - 0.25) < 0.01


def test_record_schema(record):
    env = record["environment"]
    assert {"cpu", "cpu_count", "jax", "numpy", "loadavg", "env", "torch"} <= set(env)
    assert _positive(record["gemm"]["ceiling_gflops"])
    # Which code ran: a hash per module under test, unchanged while the test ran.
    assert set(record["sources"]["modules"]) == {"jax_attention.nn.scoring", "jax_attention.nn.efficient",
                                                 "jax_attention.nn.masking", "jax_attention.nn.mods"}
    assert all(record["sources"]["modules"].values())
    assert record["sources_changed_during_run"] is False and record["loadavg_after"] is not None
    assert record["settings"]["repeats"] == 5 and record["settings"]["dtype"] == "float32"
    assert [r["mask"] for r in record["results"]] == ["none", "padding"]
    assert record["settings"]["local_window_sizes"] == [None]
    for result in record["results"]:
        assert result["shape"] == {"B": 2, "N": 2, "T": 16, "S": 16, "H": 8}
        assert result["local_window_size"] is None and result["window_flops"] is None
        assert result["queries_without_keys"] == 0
        assert result["flops"]["forward"] == attention_flops(2, 2, 16, 16, 8)
        if result["mask"] == "padding":
            assert len(result["valid_lens"]) == 2 and result["padding_fraction"] == 0.25
        else:
            assert result["valid_lens"] is None and result["padding_fraction"] == 0.0
        assert list(result["peers"]) == list(PEERS)
        for name, entry in result["peers"].items():
            if name == "torch" and not HAVE_TORCH:
                assert entry["status"] == "skipped" and "PyTorch" in entry["reason"]
                continue
            assert entry["status"] == "ok", entry
            passes = ["forward"] + ([] if name == "numpy" else ["forward_backward"])
            if name == "numpy":
                assert entry["forward_backward"] is None
            for kind in passes:
                figures = entry[kind]
                assert figures["repeats"] == 5
                for key in ("median_s", "min_s", "max_s", "gflops", "percent_of_ceiling"):
                    assert _positive(figures[key]), (name, kind, key, figures)
                assert figures["min_s"] <= figures["median_s"] <= figures["max_s"]
                assert _positive(figures["ratio_to_jax.nn"])
                if HAVE_TORCH:
                    assert _positive(figures["ratio_to_torch"])
                # float32 against float64 on O(1) values: a few float32 ulps.
                assert 0 <= figures["max_abs_error"] < 1e-5, (name, kind, figures)
        # A baseline's ratio to itself is 1.
        assert result["peers"]["jax.nn"]["forward"]["ratio_to_jax.nn"] == 1.0
    json.dumps(record)  # JSON-able as it is


def test_table_has_every_peer(record):
    table = format_attention(record)
    assert "GEMM ceiling" in table and "load average" in table
    assert ("torch.get_num_threads() = " if HAVE_TORCH else "torch: not installed") in table
    for name in PEERS:
        assert name in table


def test_structured_masks():
    """The documents and chunks cases: the dense mask every other peer gets is the mask function
    our peers get, and each peer's output and gradients match the float64 references under it."""
    from jax_attention.bench.attention import CHUNK, DOCUMENTS, structure
    from jax_attention.nn import mods

    T = 2 * CHUNK
    for name in ("documents", "chunks"):
        case = structure(name, T)
        expected = mods.mask_from_mod(case.mask_mod(), (1, 1, T, T))
        np.testing.assert_array_equal(case.keep, np.asarray(expected))
    assert structure("documents", T).keep.sum() == T * T // DOCUMENTS
    assert structure("none", T) is None and structure("padding", T) is None
    record = bench_attention([(1, 2, 24, 4)], peers=["ours_efficient", "ours_efficient_dense",
                                                     "jax.nn", "numpy"],
                             masks=["documents"], repeats=5, warmup=0, gemm_size=64,
                             efficient_chunks={"query_chunk_size": 4, "key_chunk_size": 4})
    peers = record["results"][0]["peers"]
    assert "mask_mod=segment_ids" in peers["ours_efficient"]["note"]
    assert "dense boolean mask (1, 1, T, S)" in peers["ours_efficient_dense"]["note"]
    for name, entry in peers.items():
        assert entry["status"] == "ok", entry
        assert entry["forward"]["max_abs_error"] < 1e-5, (name, entry)
        if name != "numpy":
            assert entry["forward_backward"]["max_abs_error"] < 1e-5, (name, entry)


def test_window_band_and_pairs():
    from jax_attention.nn.masking import local_window_mask

    for T, S, window in [(16, 16, (2, 1)), (7, 7, (0, 0)), (5, 9, (3, 6)), (8, 8, (20, 20))]:
        band = window_band(T, S, window)
        assert band.shape == (T, S)
        np.testing.assert_array_equal(band, np.asarray(local_window_mask(T, S, window)))
        assert window_pairs(T, S, window) == band.sum()
    assert window_pairs(16, 16, None) == 256


def test_windowed_record(windowed):
    results = windowed["results"]
    assert windowed["settings"]["local_window_sizes"] == [None, list(WINDOW)]
    # Every (shape, mask) case once per window, in that order.
    assert [(r["mask"], r["local_window_size"]) for r in results] == [
        ("none", None), ("none", list(WINDOW)), ("padding", None), ("padding", list(WINDOW))]
    B, N, T, H = TINY
    pairs = window_pairs(T, T, WINDOW)
    for result in results:
        if result["local_window_size"] is None:
            assert result["window_flops"] is None and result["queries_without_keys"] == 0
            continue
        # The dense count stays; window_flops counts only the pairs inside the window.
        assert result["flops"]["forward"] == attention_flops(B, N, T, T, H)
        assert result["window_flops"] == {"forward": 4 * B * N * H * pairs,
                                          "forward_backward": 12 * B * N * H * pairs,
                                          "fraction_of_dense": pairs / (T * T)}
        assert "local_window_size=(2, 1)" in result["reference"]["forward"]
        assert "window" in result["reference"]["gradients"] or not HAVE_TORCH
        if result["mask"] == "padding":
            # Lengths 10 and 14: queries 12..15 of the shorter one attend no key.
            assert sorted(result["valid_lens"]) == [10, 14]
            assert result["queries_without_keys"] == 4
        else:
            assert result["queries_without_keys"] == 0
        for name, entry in result["peers"].items():
            if name == "torch" and not HAVE_TORCH:
                assert entry["status"] == "skipped"
                continue
            assert entry["status"] == "ok", entry
            if name != "numpy":
                assert "local_window_size=(2, 1)" in entry["note"] or "T, S" in entry["note"], \
                    entry["note"]
            # Small against the windowed float64 references, so each peer applied the window:
            # without it, the outputs differ by O(0.1) (test_windowed_references_are_windowed).
            assert 0 <= entry["forward"]["max_abs_error"] < 1e-5, (name, entry)
            if name != "numpy":
                assert 0 <= entry["forward_backward"]["max_abs_error"] < 1e-5, (name, entry)
                assert _positive(entry["forward_backward"]["median_s"])
    json.dumps(windowed)
    table = format_attention(windowed)
    header = next(line for line in table.splitlines() if line.startswith("peer"))
    assert header.split()[:4] == ["peer", "B,N,T,H", "mask", "window"]
    assert "  2,1  " in table and "GFLOP/s counts the dense" in table


def test_windowed_references_are_windowed():
    # The float64 references of a windowed case differ from the unwindowed ones, and agree with
    # an independent windowing: the reference given the band as a mask; for the gradients, our
    # own function under JAX's x64 (the fallback without PyTorch).
    import jax.numpy as jnp

    from reference_numpy import scoring as reference

    rng = np.random.default_rng(1)
    q, k, v, cotangent = (rng.standard_normal((2, 2, 16, 8)) for _ in range(4))
    lens = np.array([14, 10], np.int32)
    for window_lens in (None, lens):
        plain = numpy_peer(q, k, v, window_lens, jnp.dtype("float32")).forward()
        windowed = numpy_peer(q, k, v, window_lens, jnp.dtype("float32"), WINDOW).forward()
        assert np.max(np.abs(windowed - plain)) > 1e-2
        seen = [np.asarray(a.astype(np.float32)).astype(np.float64) for a in (q, k, v)]
        masked = reference.dot_product_attention(*seen, window_lens,
                                                 mask=window_band(16, 16, WINDOW))[0]
        np.testing.assert_allclose(windowed, masked, rtol=0, atol=1e-12)
    grads, source = float64_grads(q, k, v, cotangent, lens, WINDOW)
    unwindowed, _ = float64_grads(q, k, v, cotangent, lens)
    assert max(np.max(np.abs(g - u)) for g, u in zip(grads, unwindowed)) > 1e-2
    if HAVE_TORCH:
        assert source.startswith("torch") and "window" in source
        # Only queries that attend a key: the cotangent of the others is zeroed by the benchmark.
        rows = (np.arange(16)[None, :] - WINDOW[0] < lens[:, None])[:, None, :, None]
        ct = np.where(rows, cotangent, 0.0)
        with_torch, _ = float64_grads(q, k, v, ct, lens, WINDOW)
        with pytest.MonkeyPatch.context() as patch:
            patch.setitem(sys.modules, "torch", None)
            with_jax, jax_source = float64_grads(q, k, v, ct, lens, WINDOW)
        assert jax_source.startswith("ours, float64")
        for a, b in zip(with_torch, with_jax):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-10)


def test_over_budget_is_skipped_with_the_reason_and_errors_still_measured():
    record = bench_attention([(1, 1, 8, 4)], peers=["ours", "numpy"], masks=["none"], repeats=5,
                             warmup=0, gemm_size=32, budget_s=1e-9)
    for entry in record["results"][0]["peers"].values():
        assert entry["status"] == "skipped" and "budget" in entry["reason"]
        assert entry["forward"]["max_abs_error"] < 1e-5 and "median_s" not in entry["forward"]
    assert "skipped:" in format_attention(record)


def test_without_torch(monkeypatch):
    # `import torch` fails: the torch peer is skipped with the reason, and the float64 gradients
    # come from our function in JAX's 64-bit mode instead.
    monkeypatch.setitem(sys.modules, "torch", None)
    record = bench_attention([(1, 2, 8, 4)], peers=["ours", "torch"], masks=["padding"],
                             repeats=5, warmup=0, gemm_size=32)
    result = record["results"][0]
    assert result["reference"]["gradients"].startswith("ours, float64")
    assert result["peers"]["torch"]["status"] == "skipped"
    assert "PyTorch is not installed" in result["peers"]["torch"]["reason"]
    ours = result["peers"]["ours"]
    assert ours["status"] == "ok" and ours["forward_backward"]["max_abs_error"] < 1e-5
    assert ours["forward"]["ratio_to_torch"] is None


@pytest.mark.parametrize("kwargs, message", [
    ({"repeats": 4}, "repeats"),
    ({"peers": ["ours", "tensorflow"]}, "peers"),
    ({"peers": []}, "peers"),
    ({"masks": ["causal"]}, "masks"),
    ({"dtype": "float16"}, "dtype"),
    ({"shapes": [(1, 2, 8)]}, "four positive integers"),
    ({"shapes": [(1, 0, 8, 4)]}, "four positive integers"),
    ({"local_window_sizes": []}, "local_window_sizes"),
    ({"local_window_sizes": [(-1, 2)]}, "local_window_sizes"),
    ({"local_window_sizes": [(1, 2, 3)]}, "local_window_sizes"),
    ({"local_window_sizes": ["512"]}, "local_window_sizes"),
    ({"local_window_sizes": "512"}, "local_window_sizes"),
])
def test_bad_arguments(kwargs, message):
    arguments = {"shapes": [(1, 1, 8, 4)], **kwargs}
    with pytest.raises(ValueError, match=message):
        bench_attention(**arguments)


def test_cli_writes_json(tmp_path, capsys):
    path = tmp_path / "out" / "bench.json"
    status = main(["bench", "attention", "--shapes", "1,2,8,4", "--peers", "ours", "jax.nn",
                   "--no-mask", "--repeats", "5", "--warmup", "0", "--gemm-size", "32",
                   "--json", str(path)])
    assert status == 0
    captured = capsys.readouterr()
    printed = captured.out
    assert "(B, N, T, H) = (1, 2, 8, 4), mask none ..." in captured.err  # progress on stderr
    assert "fwd+bwd ms" in printed and "jax.nn" in printed and f"wrote {path}" in printed
    record = json.loads(path.read_text())
    assert record["command"] == "bench attention"
    settings = record["settings"]
    assert settings["masks"] == ["none"] and settings["peers"] == ["ours", "jax.nn"]
    assert record["settings"]["shapes"] == [[1, 2, 8, 4]]
    assert record["results"][0]["peers"]["ours"]["status"] == "ok"
    # No window by default: the table has no window column.
    assert settings["local_window_sizes"] == [None]
    assert record["results"][0]["local_window_size"] is None
    header = next(line for line in printed.splitlines() if line.startswith("peer"))
    assert "window" not in header


def test_cli_local_window_size_parses():
    parser = build_parser()
    args = parser.parse_args(["bench", "attention", "--local-window-size", "none", "3", "2,1",
                              "0,0", "NONE"])
    assert args.local_window_size == [None, (3, 3), (2, 1), (0, 0), None]
    assert parser.parse_args(["bench", "attention"]).local_window_size == [None]


def test_cli_writes_windows(tmp_path, capsys):
    path = tmp_path / "bench.json"
    status = main(["bench", "attention", "--shapes", "1,2,8,4", "--peers", "ours", "jax.nn",
                   "--no-mask", "--local-window-size", "none", "2,1", "3", "--repeats", "5",
                   "--warmup", "0", "--gemm-size", "32", "--json", str(path)])
    assert status == 0
    captured = capsys.readouterr()
    assert "mask none, window 2,1 ..." in captured.err and "mask none ..." in captured.err
    header = next(line for line in captured.out.splitlines() if line.startswith("peer"))
    assert "window" in header
    record = json.loads(path.read_text())
    assert record["settings"]["local_window_sizes"] == [None, [2, 1], [3, 3]]
    assert [r["local_window_size"] for r in record["results"]] == [None, [2, 1], [3, 3]]
    for result in record["results"]:
        for entry in result["peers"].values():
            assert entry["status"] == "ok"
            assert entry["forward"]["max_abs_error"] < 1e-5
            assert entry["forward_backward"]["max_abs_error"] < 1e-5


@pytest.mark.parametrize("argv, message", [
    (["bench", "attention", "--shapes", "8,8,128"], "B,N,T,H"),
    (["bench", "attention", "--shapes", "8,8,x,64"], "B,N,T,H"),
    (["bench", "attention", "--repeats", "4"], ">= 5"),
    (["bench", "attention", "--peers", "ours", "tf"], "invalid choice: 'tf'"),
    (["bench", "attention", "--dtype", "float16"], "invalid choice: 'float16'"),
    (["bench", "attention", "--budget", "0"], "> 0"),
    (["bench", "attention", "--local-window-size", "-1"], "argument --local-window-size"),
    (["bench", "attention", "--local-window-size", "1,2,3"], "argument --local-window-size"),
    (["bench", "attention", "--local-window-size", "x"], "argument --local-window-size"),
    (["bench", "attention", "--local-window-size", "4,-1"], "argument --local-window-size"),
    (["bench", "attention", "--local-window-size", "2,"], "LEFT,RIGHT"),
    (["bench", "attention", "--local-window-size"], "argument --local-window-size"),
    (["bench", "memory", "--sizes", "0"], ">= 1"),
    (["bench", "memory", "--variants", "flash"], "invalid choice: 'flash'"),
    (["bench", "memory", "--cap-gib", "-1"], "> 0"),
])
def test_cli_bad_options(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_cli_json_path_is_a_directory(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "memory", "--json", str(tmp_path)])
    assert exit_info.value.code == 2 and "is a directory" in capsys.readouterr().err


def test_memory_children_and_cap():
    # 3·4·64² = 48 KiB fits the cap, 3·4·128² = 192 KiB does not: plain at 128 is skipped
    # (and no process is started for it).
    cap = 100_000
    assert plain_estimate_bytes(64) < cap < plain_estimate_bytes(128)
    # While this process holds 640 MiB: Linux's ru_maxrss would carry that into every child
    # through exec; the children's own peaks must not see it.
    ballast = np.ones(640 * 2**20 // 8)
    record = bench_memory([64, 128], variants=["plain"], cap_bytes=cap, timeout_s=300)
    del ballast
    measured, skipped = record["results"]
    assert measured["baseline_peak_rss_bytes"] < 600 * 2**20
    if sys.platform.startswith("linux"):  # where exec keeps the parent's high-water mark
        assert measured["ru_maxrss_bytes"] > 600 * 2**20
    assert measured["status"] == "ok", measured
    assert (measured["n"], measured["variant"]) == (64, "plain") and measured["grads_finite"]
    assert measured["peak_rss_bytes"] > 0 and measured["baseline_peak_rss_bytes"] > 0
    assert measured["peak_rss_bytes"] >= measured["peak_rss_after_compile_bytes"]
    assert measured["attention_bytes"] == (measured["peak_rss_bytes"]
                                           - measured["baseline_peak_rss_bytes"])
    assert _positive(measured["run_s"]) and _positive(measured["compile_s"])
    assert skipped["status"] == "skipped" and "cap" in skipped["reason"]
    assert record["sources"]["modules"]["jax_attention.nn.scoring"] and "loadavg_after" in record
    assert "peak_rss_bytes" not in skipped
    table = format_memory(record)
    assert "not measured:" in table and "plain at N = 128" in table


def test_memory_child_efficient():
    child = run_child("efficient", 96, head_size=8, timeout_s=300)
    assert child["status"] == "ok", child
    assert child["peak_rss_bytes"] > 0 and child["grads_finite"] and child["variant"] == "efficient"


def test_memory_child_failure_is_recorded():
    failed = run_child("baseline", 64, timeout_s=0.01)
    assert failed["status"] == "failed" and "timed out" in failed["reason"]
    with pytest.raises(ValueError, match="variant"):
        run_child("flash", 64)


def test_memory_cli_writes_json(tmp_path, capsys):
    path = tmp_path / "memory.json"
    # The cap skips plain attention at this size, so no child runs: the CLI path alone. Nothing
    # was measured: status 1 and one line saying why, after the table and the record.
    assert main(["bench", "memory", "--sizes", "4096", "--variants", "plain", "--cap-gib", "0.001",
                 "--json", str(path), "--no-progress"]) == 1
    record = json.loads(path.read_text())
    assert record["command"] == "bench memory" and record["settings"]["sizes"] == [4096]
    assert record["results"][0]["status"] == "skipped"
    captured = capsys.readouterr()
    assert "not measured:" in captured.out
    assert_one_line(captured.err, "jax-attention bench memory: error: nothing was measured: "
                                  "every run was skipped (plain at N = 4096 skipped: plain "
                                  "attention would hold at least 192.0 MiB", "--cap-gib")


def test_memory_cli_nothing_measured_when_every_child_fails(tmp_path):
    # Every child (the baseline and efficient attention) is killed by the tiny timeout.
    status, out, err = run_command("bench", "memory", "--sizes", "16", "--variants", "efficient",
                                   "--head-size", "4", "--timeout", "0.01", "--no-progress")
    assert status == 1
    line = assert_one_line(err, "nothing was measured: every run failed (efficient at N = 16 "
                                "failed: timed out after 0.01 s)")
    assert "--cap-gib" not in line
    assert "not measured:" in out


def test_nothing_measured():
    ok = {"n": 64, "variant": "plain", "status": "ok"}
    skipped = {"n": 128, "variant": "plain", "status": "skipped", "reason": "over the cap"}
    failed = {"n": 64, "variant": "efficient", "status": "failed",
              "reason": "child exited with status -9: killed"}
    assert nothing_measured({"results": [ok, skipped]}) is None
    assert nothing_measured({"results": [skipped]}) == (
        "every run was skipped (plain at N = 128 skipped: over the cap)")
    assert nothing_measured({"results": [failed, skipped]}) == (
        "every run was skipped or failed (efficient at N = 64 failed: child exited with status "
        "-9: killed; plain at N = 128 skipped: over the cap)")


def test_memory_dtype_has_help(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "memory", "--help"])
    assert exit_info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--dtype {float32,bfloat16} dtype of the queries, keys and values" in text
    assert "Exit status: 0 when at least one run was measured; 1 when nothing was" in text


@pytest.mark.parametrize("kwargs", [{"sizes": []}, {"sizes": [0]}, {"variants": ["flash"]},
                                    {"dtype": "float16"}, {"cap_bytes": 0}])
def test_memory_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        bench_memory(**{"sizes": [64], **kwargs})
