"""``bench train --size book,small,base``: how the training's speed changes with the model's size,
from one command.

:func:`bench_train_scaling` runs :func:`jax_attention.bench.train.bench_train` at each named size
in turn, with the same peers, steps, rounds, seed and single settings changed at every size (each
size's GEMM ceiling measured in its own run, next to its peers), and sets the sizes side by side:
for each, the parameters and model FLOPs of a step, every peer's target tokens per second and
share of the GEMM ceiling, the ratios of ours as shipped and for the same work, and the
compilation of ours and of ``torch.compile``. The record keeps every size's whole ``bench
train`` record (each peer and its settings) under ``runs``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from jax_attention.bench.common import format_environment
from jax_attention.bench.train import bench_train
from jax_attention.bench.train_sizes import DATA_OVERRIDES, SIZE_NAMES, train_sizes

__all__ = ["bench_train_scaling", "format_train_scaling", "check_size_names"]


def check_size_names(model: str, size_names: Sequence[str], sizes: dict | None = None, *,
                     batch_size: int | None = None, num_steps: int | None = None,
                     num_examples: int | None = None) -> tuple[str, ...]:
    """``size_names`` as a tuple, each a named size the model has, none twice, and the changed
    settings (``sizes`` and the data's, as :func:`~jax_attention.bench.train_sizes.train_sizes`
    takes them) valid at every one of them: a ``ValueError`` naming the first size that is not,
    before anything runs (``num_heads=3`` divides no size's width)."""
    names = tuple(size_names)
    if not names:
        raise ValueError(f"sizes must name at least one of {SIZE_NAMES}, got none")
    for name in names:
        train_sizes(model, name)  # an unknown size, or one the model does not have
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(f"sizes must differ, got {', '.join(repeated)} more than once")
    for name in names:  # every size exists: what fails now is a changed setting
        try:
            train_sizes(model, name, sizes, batch_size=batch_size, num_steps=num_steps,
                        num_examples=num_examples)
        except ValueError as error:
            raise ValueError(f"at size {name!r}: {error}") from None
    return names


def bench_train_scaling(model: str, size_names: Sequence[str] = SIZE_NAMES, *,
                        log: Callable[[str], object] | None = None, **settings) -> dict:
    """:func:`~jax_attention.bench.train.bench_train` at each of ``size_names``, in that order.

    Args:
      model: ``"bahdanau"`` or ``"transformer"``.
      size_names: named sizes (:data:`~jax_attention.bench.train_sizes.SIZE_NAMES`), each once.
      log: for progress.
      settings: ``bench_train``'s other keywords (``peers``, ``steps``, ``repeats``, ``sizes``,
        ``num_examples``…), the same at every size: a single setting changed
        (``num_examples=600``, ``sizes={"num_layers": 1}``) is changed at every size.

    Returns:
      A JSON-ready dict: ``benchmark`` (``"train-scaling"``), ``model``, ``sizes``, ``rows`` (one
      per size, :func:`format_train_scaling`'s table) and ``runs`` (each size's ``bench train``
      record).
    """
    names = check_size_names(model, size_names, settings.get("sizes"),
                             **{name: settings.get(name) for name in DATA_OVERRIDES})
    say = log or (lambda line: None)
    runs = []
    for number, name in enumerate(names, 1):
        say(f"size {name} ({number} of {len(names)})")
        runs.append(bench_train(model, size=name, log=log, **settings))
    return {"benchmark": "train-scaling", "model": model, "sizes": list(names),
            "rows": [_row(run) for run in runs], "runs": runs}


def _row(run: dict) -> dict:
    """One size's line of the scaling table, from its ``bench train`` record."""
    settings, peers = run["settings"], run["peers"]
    ours = peers["ours"]
    compiled = peers.get("torch-compile", {})
    return {
        "size": run["size"],
        "model": settings["model"],
        "batch_size": settings["batch_size"], "num_steps": settings["num_steps"],
        "num_examples": settings["num_examples"],
        "parameters": ours["settings"]["parameters"],
        "flops_per_step": run["flops_per_step"],
        "gemm_ceiling_gflops": run["gemm"]["ceiling_gflops"],
        "peers": {name: ({"tokens_per_s": peer["tokens_per_s"],
                          "gemm_fraction": peer["gemm_fraction"]}
                         if peer["status"] == "ok" else {"skipped": peer["reason"]})
                  for name, peer in peers.items()},
        "ratios_tokens_per_s": run["ratios_tokens_per_s"],
        "ratio_as_shipped": run["ratio_as_shipped"],
        "ratio_same_work": run["ratio_same_work"],
        "same_work_peer": run["same_work_peer"],
        "ours_compile_s": ours["compile_s"],
        "torch_compile_compile_s": (compiled.get("compile_s")
                                    if compiled.get("status") == "ok" else None),
        "torch_threads": peers["torch"]["threads"],
    }


def format_train_scaling(record: dict) -> str:
    """The sizes side by side: one line per size (parameters, model GFLOPs a step, the GEMM
    ceiling, each peer's tokens/s and % of the ceiling, the ratios, ours' compilation), then a
    line per peer that was skipped at some size."""
    rows = record["rows"]
    first = record["runs"][0]
    settings = first["settings"]
    peers = list(rows[0]["peers"])
    lines = [format_environment(first["environment"]),
             f"bench train --model {record['model']} --size {','.join(record['sizes'])}: "
             f"{settings['steps']} steps per round, {settings['repeats']} rounds (medians) at "
             "each size; tokens/s are real target tokens; % of the GEMM ceiling of the peer's "
             "dtype measured in each size's run (model FLOPs: XLA's cost analysis)"]
    header = (f"{'size':<7}{'params':>11}{'GFLOP/step':>12}{'GEMM':>8}"
              + "".join(f"{name + ' tok/s (%)':>26}" for name in peers)
              + f"{'shipped':>9}{'same':>7}{'compile s':>11}")
    lines.append(header)
    skipped = []
    for row in rows:
        cells = []
        for name in peers:
            peer = row["peers"][name]
            if "skipped" in peer:
                cells.append(f"{'skipped':>26}")
                skipped.append(f"{name} at {row['size']}: skipped: {peer['skipped']}")
            else:
                cells.append(f"{peer['tokens_per_s']:,.0f} ({100 * peer['gemm_fraction']:.1f}%)"
                             .rjust(26))
        same = "" if row["ratio_same_work"] is None else f"{row['ratio_same_work']:.2f}x"
        lines.append(f"{row['size']:<7}{row['parameters']:>11,}"
                     f"{row['flops_per_step'] / 1e9:>12.2f}{row['gemm_ceiling_gflops']:>8.0f}"
                     + "".join(cells)
                     + f"{row['ratio_as_shipped']:>8.2f}x{same:>7}{row['ours_compile_s']:>11.2f}")
    lines.append("GFLOP/step: the full-length step; GEMM: the ceiling in GFLOP/s; shipped: ours / "
                 "torch (ours cut to the longest sentences); same: ours-full / the faster PyTorch "
                 "peer (full length on both sides); compile s: ours' compilation (excluded)")
    compiled = [f"{row['size']} {row['torch_compile_compile_s']:.1f} s" for row in rows
                if row["torch_compile_compile_s"] is not None]
    if compiled:
        lines.append("torch-compile's compilation (excluded): " + ", ".join(compiled))
    return "\n".join(lines + skipped)
