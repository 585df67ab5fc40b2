"""``bench train --devices``: how our training scales over devices.

For each device count a fresh process (``python -m jax_attention.bench.train_devices --child
...``) trains on a mesh of that many devices (:mod:`jax_attention.runtime.distributed`: state
replicated, each batch split over the ``data`` axis) on the batches of
:func:`jax_attention.bench.train.training_batches`, cut as ``jax-attention train`` cuts them,
with ``XLA_FLAGS=--xla_force_host_platform_device_count=N`` so that a CPU run gets ``N`` host
devices. Forced host devices share the machine's cores: on a CPU they show that the sharded
program runs and what the split costs, not the speed-up of ``N`` real accelerators. No PyTorch
peer runs in this mode.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence

from jax_attention.bench.common import (environment, format_environment, load_average,
                                        summarize, time_interleaved)
from jax_attention.bench.train import (MODELS, OurRounds, bench_settings, check_model_and_steps,
                                       our_training, shipped_lengths, training_batches)
from jax_attention.bench.train_sizes import train_sizes
from jax_attention.runtime import distributed

__all__ = ["bench_train_devices", "format_train_devices", "child_main"]


def _check_device_counts(devices: Sequence[int], batch_size: int) -> list[int]:
    counts = list(dict.fromkeys(devices))
    if not counts or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in counts):
        raise ValueError(f"devices must be a non-empty list of integers >= 1, got "
                         f"{list(devices)!r}")
    uneven = [n for n in counts if batch_size % n]
    if uneven:
        raise ValueError(f"batch_size = {batch_size} is not divisible by the device counts "
                         f"{uneven}; every device gets the same number of rows")
    return counts


def _devices_child(model: str, devices: int, *, steps: int, repeats: int, warmup: int, seed: int,
                   sizes: dict, batch_size: int, num_steps: int, num_examples: int, lr: float,
                   data) -> dict:
    """One device count, in this (fresh) process: ``steps`` training steps per round on a mesh of
    ``devices`` devices, timed after the compiling call and ``warmup`` rounds."""
    import jax

    mesh = distributed.make_mesh(devices)
    distributed.check_batch_size(batch_size, mesh)
    nmt, _, padded, tokens = training_batches(batch_size, num_steps, num_examples, data, seed,
                                               steps)
    _, _, graphdef, state = our_training(model, sizes, nmt, seed, lr)
    lengths = shipped_lengths(model, nmt)
    ours = OurRounds(graphdef, state, padded, nmt.tgt_vocab["<bos>"], tokens, mesh,
                     lengths=lengths, num_steps=nmt.num_steps)

    start = time.perf_counter()
    ours()
    first_call_s = time.perf_counter() - start
    samples = time_interleaved({"ours": ours}, repeats=repeats, warmup=warmup)["ours"]
    summary = summarize(samples)
    step_s = summary["median_s"] / steps
    return {
        **summary,
        "devices": devices,
        "mesh_shape": {name: int(size) for name, size in mesh.shape.items()},
        "platform": jax.default_backend(),
        "device_kind": mesh.devices.flat[0].device_kind,
        "process_count": jax.process_count(),
        "rows_per_device": batch_size // distributed.data_size(mesh),
        "lengths": list(lengths),
        "tokens_per_round": tokens,
        "step_ms": step_s * 1e3,
        "tokens_per_s": tokens / summary["median_s"],
        "first_call_s": first_call_s,
        "compile_s": max(first_call_s - statistics.median(samples), 0.0),
        "final_loss": ours.losses[-1],
        "round_losses": ours.losses,
        "steps_trained": ours.steps_trained,
    }


def child_main(argv: Sequence[str] | None = None) -> int:
    """``python -m jax_attention.bench.train_devices --child --model M --devices N ...``: one
    device count of :func:`bench_train_devices`; prints one JSON line."""
    parser = argparse.ArgumentParser(prog="python -m jax_attention.bench.train_devices",
                                     description="one device count of `jax-attention bench "
                                                 "train --devices`")
    parser.add_argument("--child", action="store_true", required=True,
                        help="run one device count in this process (what the benchmark spawns)")
    parser.add_argument("--model", choices=MODELS, required=True)
    parser.add_argument("--devices", type=int, required=True)
    parser.add_argument("--settings", type=json.loads, required=True,
                        help="JSON: steps, repeats, warmup, seed, sizes, batch_size, num_steps, "
                             "num_examples, lr, data")
    args = parser.parse_args(argv)
    print(json.dumps(_devices_child(args.model, args.devices, **args.settings)))
    return 0


def _force_host_devices(flags: str, count: int) -> str:
    """``XLA_FLAGS`` with ``--xla_force_host_platform_device_count`` set to ``count`` (replacing
    any value already there; the other flags kept)."""
    kept = re.sub(r"--xla_force_host_platform_device_count=\S*", "", flags).split()
    return " ".join(kept + [f"--xla_force_host_platform_device_count={count}"])


def _run_devices_child(model: str, devices: int, settings: dict, timeout_s: float | None) -> dict:
    """Run one child; a failed child (too few devices, timeout) gives ``{"status": "failed",
    "reason": ...}`` instead of raising, so that one device count cannot lose the others."""
    command = [sys.executable, "-m", "jax_attention.bench.train_devices", "--child", "--model",
               model, "--devices", str(devices), "--settings", json.dumps(settings)]
    env = os.environ.copy()
    env["XLA_FLAGS"] = _force_host_devices(env.get("XLA_FLAGS", ""), devices)
    start = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        return {"devices": devices, "status": "failed",
                "reason": f"timed out after {timeout_s:g} s"}
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return {"devices": devices, "status": "failed",
                "reason": f"child exited with status {done.returncode}: " + " | ".join(tail)}
    return {"status": "ok", **json.loads(lines[-1]), "wall_s": time.perf_counter() - start,
            "xla_flags": env["XLA_FLAGS"]}


def bench_train_devices(model: str = "bahdanau", devices: Sequence[int] = (1, 2, 4), *,
                        size: str = "book", steps: int = 20, repeats: int = 7, warmup: int = 1,
                        seed: int = 0, sizes: dict | None = None, batch_size: int | None = None,
                        num_steps: int | None = None, num_examples: int | None = None,
                        lr: float = 0.005, data=None,
                        timeout_s: float | None = 1800.0,
                        log: Callable[[str], object] | None = None) -> dict:
    """Step time and tokens/s of our training on each device count, each in a fresh process.

    Every child trains the same model from the same weights on the same batches (the global
    batch is ``batch_size`` whatever the device count: each of ``N`` devices gets
    ``batch_size / N`` rows), so their losses agree to float32 rounding; the record says by how
    much.

    Args:
      model: ``"bahdanau"`` or ``"transformer"``.
      devices: the device counts (each must divide ``batch_size``).
      size, steps, repeats, warmup, seed, sizes, batch_size, num_steps, num_examples, lr, data:
        as in :func:`bench_train`.
      timeout_s: per child; a child that runs longer is recorded as failed.
      log: called with a line before each child, or ``None``.

    Returns:
      A JSON-ready dict: ``results`` holds one record per device count (``status`` ``ok`` or
      ``failed`` with the reason) with ``step_ms``, ``tokens_per_s``, ``speedup`` (tokens/s over
      the first device count's) and ``final_loss_relative_difference`` (against the first).
    """
    check_model_and_steps(model, steps)
    if repeats < 5:
        raise ValueError(f"repeats must be >= 5 for a median worth reporting, got {repeats}")
    run = train_sizes(model, size, sizes, batch_size=batch_size, num_steps=num_steps,
                      num_examples=num_examples)
    settings, batch_size = run["model"], run["batch_size"]
    num_steps, num_examples = run["num_steps"], run["num_examples"]
    counts = _check_device_counts(devices, batch_size)
    say = log or (lambda line: None)
    load_before = load_average()
    environment_record = environment()
    child_settings = {"steps": steps, "repeats": repeats, "warmup": warmup, "seed": seed,
                      "sizes": settings, "batch_size": batch_size, "num_steps": num_steps,
                      "num_examples": num_examples, "lr": lr,
                      "data": None if data is None else str(data)}
    results = []
    for count in counts:
        say(f"{model}: {count} device{'s' if count > 1 else ''} ({steps} steps x {repeats} rounds)")
        results.append(_run_devices_child(model, count, child_settings, timeout_s))
    first = next((r for r in results if r["status"] == "ok"), None)
    for result in results:
        if result["status"] == "ok" and first is not None:
            result["speedup"] = result["tokens_per_s"] / first["tokens_per_s"]
            result["first_round_loss_relative_difference"] = (
                abs(result["round_losses"][0] - first["round_losses"][0])
                / abs(first["round_losses"][0]))
            result["final_loss_relative_difference"] = (
                abs(result["final_loss"] - first["final_loss"]) / abs(first["final_loss"]))
    cores = environment_record.get("affinity") or environment_record.get("cpu_count")
    return {
        "benchmark": "train",
        "model": model,
        "settings": {**bench_settings(settings, batch_size, num_steps, num_examples, lr, seed,
                                      steps, repeats, warmup, devices=counts, size=size),
                     "parallelism": "data: state replicated, each batch split over the devices"},
        "results": results,
        "note": (f"each device count ran in a fresh process with XLA_FLAGS="
                 f"--xla_force_host_platform_device_count=N; on CPU the N host devices share "
                 f"this machine's {cores} usable cores, so the times show what splitting costs "
                 f"here, not the speed-up of N real accelerators"),
        "loss_note": ("the device counts differ only in the order of float32 sums; training "
                      "amplifies such rounding (on one device, one ulp added to one weight of "
                      "the book's Transformer moved its loss by ~6e-4 after 30 steps), so the "
                      "first round's losses agree to rounding and later ones more loosely"),
        "load_average": {"before": load_before, "after": load_average()},
        "environment": environment_record,
    }


def format_train_devices(record: dict) -> str:
    """The record of :func:`bench_train_devices` as a table, one row per device count."""
    settings = record["settings"]
    lines = [format_environment(record["environment"]),
             f"bench train --model {record['model']}"
             f"{'' if settings.get('size', 'book') == 'book' else ' --size ' + settings['size']}"
             " --devices "
             f"{','.join(map(str, settings['devices']))}: {settings['steps']} steps per round, "
             f"{settings['repeats']} rounds (medians), global batch {settings['batch_size']}, "
             f"num_steps {settings['num_steps']}, {settings['num_examples']} pairs",
             f"{'devices':<8}{'platform':>9}{'rows/dev':>9}{'step ms':>10}{'tokens/s':>11}"
             f"{'speedup':>9}{'compile s':>10}{'final loss':>12}"]
    for r in record["results"]:
        if r["status"] != "ok":
            lines.append(f"{r['devices']:<8}failed: {r['reason']}")
            continue
        lines.append(f"{r['devices']:<8}{r['platform']:>9}{r['rows_per_device']:>9}"
                     f"{r['step_ms']:>10.2f}{r['tokens_per_s']:>11.0f}{r['speedup']:>8.2f}x"
                     f"{r['compile_s']:>10.2f}{r['final_loss']:>12.5f}")
    def worst(key: str) -> float:
        return max((r.get(key, 0.0) for r in record["results"] if r["status"] == "ok"),
                   default=0.0)

    load = record["load_average"]
    lines += [f"losses against the first device count (relative): first round "
              f"{worst('first_round_loss_relative_difference'):.1e}, after the last round "
              f"{worst('final_loss_relative_difference'):.1e}; {record['loss_note']}",
              record["note"],
              f"load average (1, 5, 15 min) before {load['before']}, after {load['after']}"]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(child_main())
