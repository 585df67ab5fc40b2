"""Data parallelism (:mod:`jax_attention.runtime.distributed`): N devices, or two processes, train as one.

The runs are subprocesses of ``tests/distributed_driver.py`` with
``XLA_FLAGS=--xla_force_host_platform_device_count=4`` and ``JAX_PLATFORMS=cpu`` (the device count
is fixed when JAX starts, so it cannot change inside this process). Each trains a tiny Bahdanau or
Transformer model for two epochs of 4 steps (the last batch padded) with dropout 0.5, so that a
single dropout mask drawn differently under sharding would move the losses far. Equality is to
float32 rounding: the devices sum their rows' gradients in a different order than one device.

The two-process run starts two drivers that find each other through ``JAX_COORDINATOR_ADDRESS=
localhost:<free port>``, ``JAX_NUM_PROCESSES=2`` and ``JAX_PROCESS_ID``, 2 host devices each, and
checks they train as one process on 4 devices does. Every subprocess has a timeout, so a
coordinator that never answers fails the test instead of hanging it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest
from jax.sharding import AbstractMesh, AxisType
from jax.sharding import PartitionSpec as P

from jax_attention.models.configs import TransformerConfig
from jax_attention.models.registry import get_model
from jax_attention.runtime import distributed
from tests.compiler_support import with_suite_flags

ROOT = Path(__file__).resolve().parents[1]
DRIVER = Path(__file__).with_name("distributed_driver.py")
TIMEOUT_S = 600
# Float32 rounding after 8 Adam steps: the sums over the batch are split over the devices.
RTOL, ATOL = 1e-5, 1e-5
_ENV_OWNED = ("XLA_FLAGS", "JAX_PLATFORMS", "JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES",
              "JAX_PROCESS_ID", distributed.DISTRIBUTED_VARIABLE)


def _env(host_devices: int, **extra: str) -> dict:
    env = {name: value for name, value in os.environ.items() if name not in _ENV_OWNED}
    env.update(XLA_FLAGS=with_suite_flags(f"--xla_force_host_platform_device_count={host_devices}"),
               JAX_PLATFORMS="cpu",
               PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])]),
               **extra)
    return env


def _command(model: str, devices: list, out: Path, *options: str) -> list[str]:
    return [sys.executable, str(DRIVER), "--model", model, "--devices", *map(str, devices),
            "--out", str(out), *options]


def _check(done_or_output, returncode: int, what: str) -> None:
    if returncode != 0:
        tail = "\n".join(str(done_or_output).strip().splitlines()[-15:])
        pytest.fail(f"{what} exited with status {returncode}:\n{tail}")


def _load(path: Path):
    with np.load(path) as stored:
        losses = stored["losses"]
        info = json.loads(str(stored["info"]))
        params = {name: stored[name] for name in stored.files if name.startswith("params/")}
    return losses, params, info


def _assert_trained_alike(got, expected) -> None:
    (losses, params, _), (expected_losses, expected_params, _) = got, expected
    np.testing.assert_allclose(losses, expected_losses, rtol=RTOL, atol=ATOL)
    assert sorted(params) == sorted(expected_params)
    for name, value in expected_params.items():
        np.testing.assert_allclose(params[name], value, rtol=RTOL, atol=ATOL, err_msg=name)


def _single_process(tmp_path_factory, model: str, devices: list[int], *options: str) -> Path:
    out = tmp_path_factory.mktemp(f"{model}_runs")
    done = subprocess.run(_command(model, devices, out, *options), cwd=ROOT, env=_env(4),
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    _check(done.stdout + done.stderr, done.returncode, f"the {model} driver")
    return out


@pytest.fixture(scope="module")
def bahdanau_api_runs(tmp_path_factory) -> Path:
    """``train_bahdanau(devices=1)`` and ``(devices=4)``."""
    return _single_process(tmp_path_factory, "bahdanau", [1, 4], "--api")


@pytest.fixture(scope="module")
def transformer_api_runs(tmp_path_factory) -> Path:
    """``train_transformer`` on 1 device and on 4 (data parallel); and the dropout masks drawn
    on one device and split over 4."""
    return _single_process(tmp_path_factory, "transformer", [1, 4], "--api", "--dropout-check")


@pytest.fixture(scope="module")
def transformer_tp_api_runs(tmp_path_factory) -> Path:
    """``train_transformer`` on 1 device and on 4 as 2 x 2 (data x model,
    ``model_parallel=2``)."""
    return _single_process(tmp_path_factory, "transformer", [1, "4x2"], "--api")


@pytest.mark.parametrize("model, run", [
    ("transformer", "4"),
    # One more subprocess each, in `make test-slow` (.ci/run runs it): the Bahdanau model's data
    # parallelism, and tensor parallelism (the stretch goal).
    pytest.param("bahdanau", "4", marks=pytest.mark.slow),
    pytest.param("transformer_tp", "4x2", marks=pytest.mark.slow)])
def test_train_functions_on_four_devices_train_as_on_one(model, run, request):
    """The user's path — ``train_bahdanau(devices=4)``, ``train_transformer(devices=4)`` and
    ``train_transformer(devices=4, model_parallel=2)`` — gives the per-epoch losses and the
    final parameters of ``devices=1``, to float32 rounding, with dropout 0.5."""
    runs = request.getfixturevalue(f"{model}_api_runs")
    model = model.removesuffix("_tp")
    one, many = (_load(runs / f"{model}_{name}_p0.npz") for name in ("1", run))
    assert one[2]["mesh_shape"] == {"data": 1, "model": 1}
    assert many[2]["mesh_shape"] == ({"data": 4, "model": 1} if run == "4"
                                     else {"data": 2, "model": 2})
    assert len(one[0]) == 2 and np.all(np.isfinite(many[0]))  # epochs
    _assert_trained_alike(many, one)


# The loop-level runs below (the steps of train.loop.train_epochs spelled out around train_steps, with
# what each device holds) check the placement itself; the user's path above checks the results.
# Each costs a few subprocess compilations, so they run in `make test-slow` (.ci/run runs it).


@pytest.fixture(scope="module")
def bahdanau_runs(tmp_path_factory) -> Path:
    """Bahdanau without a mesh (today's one-device path), on a 1-device mesh and on 4 devices."""
    return _single_process(tmp_path_factory, "bahdanau", [0, 1, 4])


@pytest.fixture(scope="module")
def transformer_runs(tmp_path_factory) -> Path:
    """The Transformer on 1 device, on 4 (data parallel) and on 4 as 2 x 2 (data x model)."""
    return _single_process(tmp_path_factory, "transformer", [1, 4, "4x2"])


@pytest.mark.slow
@pytest.mark.parametrize("model", ["bahdanau", "transformer"])
def test_four_devices_train_as_one(model, request):
    """Same losses step by step and same final parameters, batch split over 4 devices."""
    runs = request.getfixturevalue(f"{model}_runs")
    one, four = _load(runs / f"{model}_1_p0.npz"), _load(runs / f"{model}_4_p0.npz")
    info = four[2]
    assert info["mesh_shape"] == {"data": 4, "model": 1}
    assert info["batch_spec"] == "P(None, 'data')"
    # Parameters, Adam's moments and the dropout stream: replicated on the 4 devices throughout.
    assert info["devices_in_state"] == 4 and info["state_replicated"]
    assert one[2]["devices_in_state"] == 1
    assert len(four[0]) == 8 and np.all(np.isfinite(four[0]))
    _assert_trained_alike(four, one)


@pytest.mark.slow
def test_one_device_mesh_is_the_single_device_path_bit_for_bit(bahdanau_runs):
    """``--devices 1`` (the default on a one-device machine) changes no bit of training."""
    plain, mesh = _load(bahdanau_runs / "bahdanau_0_p0.npz"), _load(bahdanau_runs /
                                                                     "bahdanau_1_p0.npz")
    assert plain[2]["mesh_shape"] is None and mesh[2]["mesh_shape"] == {"data": 1, "model": 1}
    assert plain[0].tolist() == mesh[0].tolist()
    for name, value in plain[1].items():
        np.testing.assert_array_equal(mesh[1][name], value, err_msg=name)


def test_dropout_masks_do_not_depend_on_the_sharding(transformer_api_runs):
    """The models' masks, drawn with their rows split over 4 devices, are the bits drawn on one
    device (each element's bits are a hash of its global index)."""
    with np.load(transformer_api_runs / "dropout_masks.npz") as masks:
        one, split, rows = masks["one"], masks["split"], masks["rows"]
    assert rows.tolist() == [[0, 2], [2, 4], [4, 6], [6, 8]]  # really split, 2 rows each
    assert one.dtype == split.dtype == np.bool_ and 0.3 < one.mean() < 0.7
    np.testing.assert_array_equal(split, one)


@pytest.mark.slow
def test_tensor_parallel_trains_as_one_device(transformer_runs):
    """A 2 x 2 mesh: the batch split over ``data``, the heads and FFN width over ``model``."""
    one, split = (_load(transformer_runs / f"transformer_{run}_p0.npz") for run in ("1", "4x2"))
    info = split[2]
    assert info["mesh_shape"] == {"data": 2, "model": 2} and not info["state_replicated"]
    # Every attention projection and FFN weight of the 1 + 1 blocks, with Adam's two moments;
    # still split after training (the partitioner kept the placement).
    names = {path.split("['params']")[1] for path in info["split_leaves_before"]}
    assert names == {f"['{module}__{weight}'].value"
                     for module in ("attention", "self_attention", "cross_attention")
                     for weight in ("W_q", "W_k", "W_v", "W_o")} | {
        f"['ffn__{weight}'].value" for weight in ("W_1", "b_1", "W_2")}
    assert len(info["split_leaves_before"]) == 3 * (7 + 11)
    assert info["split_leaves_after"] == info["split_leaves_before"]
    _assert_trained_alike(split, one)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("localhost", 0))
        return probe.getsockname()[1]


def _two_processes(out: Path, model: str, *options: str) -> None:
    """Two drivers, 2 host devices each, joined through a coordinator on localhost."""
    port = _free_port()
    processes = [subprocess.Popen(
        _command(model, [4], out, *options), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, env=_env(2, JAX_COORDINATOR_ADDRESS=f"localhost:{port}",
                            JAX_NUM_PROCESSES="2", JAX_PROCESS_ID=str(index)))
        for index in range(2)]
    deadline = time.monotonic() + TIMEOUT_S
    outputs = []
    try:
        for process in processes:
            output, _ = process.communicate(timeout=max(deadline - time.monotonic(), 1))
            outputs.append(output)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the two-process run did not finish in {TIMEOUT_S} s")
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    for index, (process, output) in enumerate(zip(processes, outputs)):
        _check(output, process.returncode, f"process {index} of the two-process run")


def _check_two_processes(out: Path, single: Path, model: str) -> None:
    first, second = _load(out / f"{model}_4_p0.npz"), _load(out / f"{model}_4_p1.npz")
    for index, (_, _, info) in enumerate((first, second)):
        assert info["multi_process"] and info["process_index"] == index
        assert (info["process_count"], info["device_count"],
                info["local_device_count"]) == (2, 4, 2)
        assert info["mesh_shape"] == {"data": 4, "model": 1}
        assert info.get("state_replicated", True)  # reported by the loop-level driver
    # Both processes hold the same replicated result, bit for bit.
    assert first[0].tolist() == second[0].tolist()
    for name, value in first[1].items():
        np.testing.assert_array_equal(second[1][name], value, err_msg=name)
    # ... which is what one process trains, on 4 devices and on 1.
    _assert_trained_alike(first, _load(single / f"{model}_4_p0.npz"))
    _assert_trained_alike(first, _load(single / f"{model}_1_p0.npz"))


@pytest.mark.slow  # two more processes, each compiling the 4-device step: ~30 s of CPU
def test_two_processes_train_as_one(tmp_path, transformer_api_runs):
    """``train_transformer(devices=4)`` in two processes of 2 devices each trains as one
    process does, on 4 devices and on 1."""
    _two_processes(tmp_path, "transformer", "--api")
    _check_two_processes(tmp_path, transformer_api_runs, "transformer")


@pytest.mark.slow
def test_two_processes_train_as_one_bahdanau(tmp_path, bahdanau_runs):
    _two_processes(tmp_path, "bahdanau")
    _check_two_processes(tmp_path, bahdanau_runs, "bahdanau")


# --------------------------------------------------------------------------- in this process


def test_batch_size_must_divide_by_the_data_axis():
    mesh = AbstractMesh((4, 1), (distributed.DATA_AXIS, distributed.MODEL_AXIS),
                        axis_types=(AxisType.Auto, AxisType.Auto))
    distributed.check_batch_size(64, mesh)
    with pytest.raises(ValueError, match=r"batch_size = 10 is not divisible by the 4 "
                                         r"data-parallel devices .*multiple of 4, e\.g\. 8 or 12"):
        distributed.check_batch_size(10, mesh)
    with pytest.raises(ValueError, match=r"batch_size = 2 .* e\.g\. 4 or 4"):
        distributed.check_batch_size(2, mesh)


def test_make_mesh():
    count = jax.device_count()
    mesh = distributed.make_mesh()
    assert dict(mesh.shape) == {"data": count, "model": 1}
    assert all(kind == AxisType.Auto for kind in mesh.axis_types)
    assert dict(distributed.make_mesh(1).shape) == {"data": 1, "model": 1}
    platform = jax.default_backend()
    hint = r".*xla_force_host_platform_device_count" if platform == "cpu" else ""
    with pytest.raises(ValueError, match=rf"devices = {count + 1} but only {count} {platform} "
                                         rf"device{hint}"):
        distributed.make_mesh(count + 1)
    for bad in (0, -1, True, 1.5, "2"):
        with pytest.raises(ValueError, match="devices must be an integer >= 1"):
            distributed.make_mesh(bad)
    with pytest.raises(ValueError, match="model must be an integer >= 1"):
        distributed.make_mesh(1, model=0)
    with pytest.raises(ValueError, match=r"devices = 1 must be a multiple of model = 2"):
        distributed.make_mesh(1, model=2)


def test_tensor_parallel_placement():
    from flax import nnx

    from jax_attention.train.loop import clipped_adam
    from jax_attention.models.transformer import TransformerSeq2Seq

    model = TransformerSeq2Seq(9, 7, 8, 10, 2, 1, 0.0, max_positions=8,
                               rngs=nnx.Rngs(params=jax.random.key(0)))
    _, state = nnx.split((model, nnx.Optimizer(model, clipped_adam(0.005), wrt=nnx.Param)))
    by_name = {}  # "W_q" <- "attention__W_q", "cross_attention__W_q", their Adam moments, ...
    for path, _ in jax.tree_util.tree_leaves_with_path(state):
        name = [key.key for key in path if isinstance(key, jax.tree_util.DictKey)][-1]
        by_name.setdefault(str(name).split("__")[-1], set()).add(
            distributed.tensor_parallel_spec(path))
    assert by_name["W_q"] == by_name["W_k"] == by_name["W_v"] == {P(None, "model")}
    assert by_name["W_o"] == by_name["W_2"] == {P("model", None)}
    assert by_name["W_1"] == {P(None, "model")} and by_name["b_1"] == {P("model")}
    assert by_name["embedding"] == by_name["b_2"] == by_name["gamma"] == {P()}
    # One device: every leaf replicated, whatever its name.
    assert all(s.spec == P() for s in jax.tree.leaves(
        distributed.state_shardings(state, distributed.make_mesh(1))))
    mesh = AbstractMesh((1, 4), (distributed.DATA_AXIS, distributed.MODEL_AXIS),
                        axis_types=(AxisType.Auto, AxisType.Auto))
    with pytest.raises(ValueError, match=r"ffn__W_1.*shape \(8, 10\): axis 1 is not divisible "
                                         r"by the 4 devices of the 'model' axis"):
        distributed.state_shardings(state, mesh)
    check_shards, shards = get_model("transformer").check_shards, distributed.model_size(mesh)
    with pytest.raises(ValueError, match=r"num_heads = 2 is not divisible by the 4 "
                                         r"tensor-parallel devices"):
        check_shards(TransformerConfig(num_heads=2, ffn_num_hiddens=16), shards)
    with pytest.raises(ValueError, match=r"ffn_num_hiddens = 10 is not divisible by the 4"):
        check_shards(TransformerConfig(num_heads=4, ffn_num_hiddens=10), shards)
    with pytest.raises(ValueError, match=r"num_kv_heads = 2 is not divisible by the 4"):
        check_shards(TransformerConfig(num_heads=4, ffn_num_hiddens=16, num_kv_heads=2), shards)
    check_shards(TransformerConfig(num_heads=4, ffn_num_hiddens=16), shards)


def test_replicate_to_local_and_to_host_keep_values_and_typed_keys():
    from flax import nnx

    from jax_attention.models.bahdanau import BahdanauSeq2Seq

    model = BahdanauSeq2Seq(7, 6, 4, 4, 1, 0.1, rngs=nnx.Rngs(
        params=jax.random.key(0), dropout=jax.random.key(0, impl="rbg")))
    _, state = nnx.split(model)
    expected = jax.tree.map(lambda x: np.asarray(jax.random.key_data(x) if
                                                 jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)
                                                 else x), state)
    mesh = distributed.make_mesh()
    placed = distributed.replicate(state, mesh)
    for leaf in jax.tree.leaves(placed):
        assert leaf.sharding.is_fully_replicated and leaf.sharding.mesh.shape == mesh.shape
    back = distributed.to_local(placed)
    keys = [leaf for leaf in jax.tree.leaves(back)
            if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key)]
    assert keys and all(jax.random.key_impl(key) == jax.random.key_impl(
        jax.random.key(0, impl="rbg")) for key in keys)
    got = jax.tree.map(lambda x: np.asarray(jax.random.key_data(x) if
                                            jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)
                                            else x), back)
    jax.tree.map(np.testing.assert_array_equal, got, expected)
    losses = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(distributed.to_host(distributed.replicate(losses, mesh)), losses)


def test_shard_batches():
    mesh = distributed.make_mesh(1)
    src = np.arange(2 * 4 * 3, dtype=np.int32).reshape(2, 4, 3)
    lengths = np.full((2, 4), 3, np.int32)
    placed = distributed.shard_batches((src, lengths), mesh)
    assert [str(array.sharding.spec) for array in placed] == ["P(None, 'data')"] * 2
    np.testing.assert_array_equal(np.asarray(placed[0]), src)
    with pytest.raises(ValueError, match=r"stacked \(K, B, \.\.\.\), got an array of shape \(4,\)"):
        distributed.shard_batches(np.arange(4), mesh)


def test_initialize_from_env():
    jax.devices()  # JAX's backends are running in this process, as in any test
    assert distributed.initialize_from_env({}) is False
    assert distributed.initialize_from_env({"SLURM_NTASKS": "1", "SLURM_PROCID": "0"}) is False
    with pytest.raises(ValueError, match=r"needs all of JAX_COORDINATOR_ADDRESS, "
                                         r"JAX_NUM_PROCESSES, JAX_PROCESS_ID; "
                                         r"JAX_COORDINATOR_ADDRESS set but JAX_NUM_PROCESSES, "
                                         r"JAX_PROCESS_ID missing"):
        distributed.initialize_from_env({"JAX_COORDINATOR_ADDRESS": "localhost:1234"})
    full = {"JAX_COORDINATOR_ADDRESS": "localhost:1234", "JAX_NUM_PROCESSES": "2",
            "JAX_PROCESS_ID": "0"}
    with pytest.raises(ValueError, match=r"JAX_NUM_PROCESSES must be an integer >= 1, got 'two'"):
        distributed.initialize_from_env({**full, "JAX_NUM_PROCESSES": "two"})
    with pytest.raises(ValueError, match=r"JAX_PROCESS_ID must be < JAX_NUM_PROCESSES = 2, got 2"):
        distributed.initialize_from_env({**full, "JAX_PROCESS_ID": "2"})
    with pytest.raises(ValueError, match=r"JAX_ATTENTION_DISTRIBUTED must be 'auto' or unset"):
        distributed.initialize_from_env({"JAX_ATTENTION_DISTRIBUTED": "yes"})
    # Asked for too late: the error says which variables asked (JAX's own does not).
    for environ, source in ((full, "JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID"),
                            ({"SLURM_NTASKS": "2", "SLURM_PROCID": "0"}, "the Slurm launcher"),
                            ({"JAX_ATTENTION_DISTRIBUTED": "auto"}, "JAX_ATTENTION_DISTRIBUTED")):
        with pytest.raises(RuntimeError, match=rf"{source}.* ask for a multi-process run, but "
                                               r"jax.distributed.initialize failed: .*before"):
            distributed.initialize_from_env(environ)
    assert not jax.distributed.is_initialized()


# --------------------------------------------------------------------------- bench train --devices

TINY_TRANSFORMER = {"num_hiddens": 8, "ffn_num_hiddens": 16, "num_heads": 2, "num_layers": 1,
                    "dropout": 0.1, "max_positions": 16}


@pytest.mark.slow  # two fresh processes, each compiling the step: ~30 s of CPU
def test_bench_train_devices_cli(tmp_path, capsys, monkeypatch):
    """``bench train --devices 1,2``: one child per count, step time and tokens/s per count in
    the JSON, and the same losses (the same global batches, split differently)."""
    from jax_attention.bench import train as bench
    from jax_attention.cli import main

    # The children get the model's settings from this process (tiny here, for the test's time).
    monkeypatch.setitem(bench.BOOK_MODELS, "transformer",
                        {**bench.BOOK_MODELS["transformer"], **TINY_TRANSFORMER})
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    path = tmp_path / "devices.json"
    status = main(["bench", "train", "--model", "transformer", "--devices", "1,2", "--steps", "2",
                   "--repeats", "5", "--warmup", "0", "--json", str(path), "--no-progress"])
    assert status == 0
    printed = capsys.readouterr().out
    assert "speedup" in printed and "share this machine's" in printed
    record = json.loads(path.read_text())
    assert record["command"] == "bench train" and record["settings"]["devices"] == [1, 2]
    assert [r["devices"] for r in record["results"]] == [1, 2]
    for result, count in zip(record["results"], (1, 2)):
        assert result["status"] == "ok", result
        assert result["mesh_shape"] == {"data": count, "model": 1}
        assert result["rows_per_device"] == 64 // count
        assert f"--xla_force_host_platform_device_count={count}" in result["xla_flags"]
        for key in ("median_s", "step_ms", "tokens_per_s", "speedup"):
            assert result[key] > 0 and np.isfinite(result[key]), (key, result[key])
        assert result["tokens_per_s"] == pytest.approx(result["tokens_per_round"]
                                                       / result["median_s"])
    assert record["results"][0]["speedup"] == 1.0
    # The first round agrees to rounding; training amplifies rounding after that (the record's
    # loss_note), less so in a tiny model.
    ones, twos = (r["round_losses"] for r in record["results"])
    assert record["results"][1]["first_round_loss_relative_difference"] < 1e-5
    np.testing.assert_allclose(twos, ones, rtol=1e-3)


def test_bench_train_devices_rejects_bad_counts(capsys):
    from jax_attention.bench.train_devices import bench_train_devices
    from jax_attention.cli import main

    with pytest.raises(ValueError, match=r"batch_size = 64 is not divisible by the device "
                                         r"counts \[3, 5\]"):
        bench_train_devices("bahdanau", [1, 3, 5])
    with pytest.raises(ValueError, match="devices must be a non-empty list of integers >= 1"):
        bench_train_devices("bahdanau", [])
    for bad in ("0", "1,x", ""):
        with pytest.raises(SystemExit) as error:
            main(["bench", "train", "--devices", bad])
        assert error.value.code == 2
        assert "--devices" in capsys.readouterr().err
    with pytest.raises(SystemExit) as error:
        main(["bench", "train", "--devices", "3", "--no-progress"])
    assert error.value.code == 2
    assert "batch_size = 64 is not divisible by the device counts [3]" in capsys.readouterr().err
    with pytest.raises(SystemExit) as error:
        main(["bench", "train", "--devices", "1", "--torch-threads", "1", "--no-progress"])
    assert error.value.code == 2
    assert "--torch-threads: not with --devices" in capsys.readouterr().err


def test_train_command_devices_errors(capsys):
    """``--devices`` beyond the devices JAX sees, or not dividing ``--batch-size``: a usage error
    (status 2) naming the numbers, before any training."""
    from jax_attention.cli import main

    available = jax.device_count()
    with pytest.raises(SystemExit) as stop:
        main(["train", "bahdanau", "--devices", str(available + 1), "--epochs", "1"])
    assert stop.value.code == 2
    assert f"devices = {available + 1} but only {available}" in capsys.readouterr().err
    if available == 1:
        return
    with pytest.raises(SystemExit) as stop:
        main(["train", "transformer", "--devices", "2", "--batch-size", "5", "--epochs", "1"])
    assert stop.value.code == 2
    assert "batch_size = 5 is not divisible by the 2" in capsys.readouterr().err
