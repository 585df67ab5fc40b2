"""Subprocess driver of tests/test_distributed.py: train a tiny seq2seq model for a few steps on
N devices and save the per-step losses and the final parameters (``.npz``).

Run as ``python tests/distributed_driver.py --model bahdanau --devices 1 4 4x2 --out DIR`` in
a process whose device count is set from outside (``XLA_FLAGS=--xla_force_host_platform_device_
count=4``; ``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES`` and ``JAX_PROCESS_ID`` for a
multi-process run). ``NxM`` is ``N`` devices with a ``model`` axis of ``M`` (tensor
parallelism). Writes ``DIR/{model}_{N or NxM}_p{process}.npz``.

:func:`train` is the loop of :func:`jax_attention.train.loop.train_epochs` with
:mod:`jax_attention.runtime.distributed` placed around the same compiled step
(:func:`~jax_attention.train.loop.train_steps`): the mesh, the placed state, the batches split
over the ``data`` axis, the losses and the final state brought back. ``devices = 0`` runs the
loop without any mesh. The model comes from the registry (:data:`jax_attention.models.registry.MODELS`)
and is set up as the trainer sets it up (:func:`jax_attention.train.seq2seq.setup`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

# Before anything starts JAX's backends: a multi-process run joins its peers here.
from jax_attention.runtime import distributed

TINY = {
    "bahdanau": {"embed_size": 8, "num_hiddens": 8, "num_layers": 2},
    "transformer": {"num_hiddens": 8, "ffn_num_hiddens": 16, "num_heads": 2, "num_layers": 1,
                    "max_positions": 16},
}
#: 30 pairs in batches of 8: 4 steps per epoch, the last batch padded with 2 rows of length 0.
DATA = {"batch_size": 8, "num_steps": 10, "num_examples": 30}
DROPOUT = 0.5  # strong: a single differing dropout mask would move the losses far


def train(kind: str, devices: int, *, epochs: int = 2, model_axis: int = 1, seed: int = 0,
          dropout: float = DROPOUT):
    """Train ``kind`` for ``epochs`` epochs on ``devices`` devices (0: no mesh at all).

    Returns:
      ``(losses (epochs * K,), params, info)``: each step's summed loss, the nested parameter
      dict (NumPy) and how the run was placed.
    """
    import jax
    import numpy as np
    from flax import nnx

    from jax_attention.models.registry import MODELS
    from jax_attention.train.loop import epoch_batches, leaf_shardings, train_steps
    from jax_attention.train.seq2seq import setup

    spec = MODELS[kind]
    nmt, _, model, optimizer = setup(spec, spec.model_config(**TINY[kind], dropout=dropout,
                                                             num_steps=DATA["num_steps"]),
                                     spec.train_config(batch_size=DATA["batch_size"],
                                                       num_examples=DATA["num_examples"],
                                                       seed=seed))
    bos_id = nmt.tgt_vocab["<bos>"]

    mesh = None
    if devices:
        mesh = distributed.make_mesh(devices, model=model_axis)
        distributed.check_batch_size(nmt.batch_size, mesh)
    graphdef, state = nnx.split((model, optimizer))
    if mesh is not None:
        state = distributed.place_state(state, mesh)
    losses, info = [], {"split_leaves_before": _split_leaves(state)}
    for epoch in range(1, epochs + 1):
        batches, _ = epoch_batches(nmt, epoch - 1)
        if mesh is not None:
            batches = distributed.shard_batches(batches, mesh)
            info["batch_spec"] = str(batches[0].sharding.spec)
        state, batch_losses = train_steps(graphdef, state, batches, bos_id, False,
                                          leaf_shardings(state))
        losses.extend(float(loss) for loss in distributed.to_host(batch_losses))
    leaves = jax.tree.leaves(state)
    info.update(
        devices_in_state=len(leaves[0].sharding.device_set),
        state_replicated=all(leaf.sharding.is_fully_replicated for leaf in leaves),
        split_leaves_after=_split_leaves(state),
        mesh_shape=None if mesh is None else dict(mesh.shape),
        process_index=jax.process_index(), process_count=jax.process_count(),
        device_count=jax.device_count(), local_device_count=jax.local_device_count())
    nnx.update((model, optimizer), distributed.to_local(state))
    params = jax.tree.map(np.asarray, model.params_dict())
    return np.asarray(losses), params, info


def train_api(kind: str, devices: int, *, epochs: int = 2, model_axis: int = 1, seed: int = 0,
              dropout: float = DROPOUT):
    """:func:`train` through ``jax_attention.train.train_bahdanau`` / ``train_transformer`` with
    their ``devices`` (and ``model_parallel``) arguments: the user's path, the book's four
    sentences translated at the end.

    Returns:
      ``(losses (epochs,), params, info)``: the per-epoch losses per target token.
    """
    import jax
    import numpy as np

    from jax_attention import train as training

    common = dict(dropout=dropout, epochs=epochs, seed=seed, devices=devices, progress=False,
                  log=None, **DATA)
    if training.MODELS[kind].tensor_parallel:
        common["model_parallel"] = model_axis
    result = getattr(training, f"train_{kind}")(**TINY[kind], **common)
    info = {"mesh_shape": dict(distributed.make_mesh(devices, model=model_axis).shape),
            "process_index": jax.process_index(), "process_count": jax.process_count(),
            "device_count": jax.device_count(), "local_device_count": jax.local_device_count()}
    return np.asarray(result.losses), result.params, info


def _split_leaves(state) -> list[str]:
    """The paths of the state's leaves that are split over devices (not replicated)."""
    import jax

    return sorted(jax.tree_util.keystr(path) for path, leaf in
                  jax.tree_util.tree_leaves_with_path(state)
                  if not leaf.sharding.is_fully_replicated)


def _run(text: str) -> tuple[int, int]:
    """``"4"`` -> ``(4, 1)``, ``"4x2"`` -> ``(4, 2)``: devices and ``model`` axis size."""
    devices, _, model = text.partition("x")
    return int(devices), int(model or 1)


def dropout_masks(devices: int):
    """The models' dropout mask (:func:`jax_attention.nn.dropout.keep_mask`, an ``impl="rbg"`` key)
    ``(B, T, 8)`` drawn on one device and drawn with its rows split over ``devices`` devices;
    returns both (NumPy) and the rows each device drew."""
    import jax
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec

    from jax_attention.nn.dropout import keep_mask

    mesh = distributed.make_mesh(devices)
    key = jax.random.key(0, impl="rbg")

    def draw(key):
        return keep_mask(key, DROPOUT, (DATA["batch_size"], DATA["num_steps"], 8))

    one = jax.jit(draw)(key)
    split = jax.jit(draw, out_shardings=NamedSharding(mesh, PartitionSpec(distributed.DATA_AXIS)))(
        distributed.replicate(key, mesh))
    rows = sorted((shard.index[0].start or 0, shard.index[0].stop or DATA["batch_size"])
                  for shard in split.addressable_shards)
    return np.asarray(one), distributed.to_host(split), np.asarray(rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=tuple(TINY), required=True)
    parser.add_argument("--devices", nargs="+", required=True,
                        help="device counts to train on, one run each: N, or NxM for a model "
                             "axis of M (0: no mesh)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--api", action="store_true",
                        help="train through train_bahdanau/train_transformer(devices=...) "
                             "(train_api) instead of the loop (train)")
    parser.add_argument("--dropout-check", action="store_true",
                        help="also write dropout_masks.npz (dropout_masks() on the largest count)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    joined = distributed.initialize_from_env(timeout_s=120)

    import jax
    import numpy as np

    # The test suite's strictness (tests/conftest.py): no implicit rank or dtype promotion.
    jax.config.update("jax_numpy_rank_promotion", "raise")
    jax.config.update("jax_numpy_dtype_promotion", "strict")

    from jax_attention.params import flatten_params

    args.out.mkdir(parents=True, exist_ok=True)
    for run in args.devices:
        devices, model_axis = _run(run)
        start = time.perf_counter()
        losses, params, info = (train_api if args.api else train)(
            args.model, devices, epochs=args.epochs, model_axis=model_axis)
        info.update(multi_process=joined, seconds=time.perf_counter() - start)
        name = f"{args.model}_{run}_p{info['process_index']}.npz"
        np.savez(args.out / name, losses=losses, info=json.dumps(info),
                 **{f"params/{path}": value for path, value in flatten_params(params).items()})
        shown = {key: len(value) if key.startswith("split_leaves") else value
                 for key, value in info.items()}
        print(f"{name}: {json.dumps(shown)}", flush=True)
    if args.dropout_check:
        one, split, rows = dropout_masks(max(_run(run)[0] for run in args.devices))
        np.savez(args.out / "dropout_masks.npz", one=one, split=split, rows=rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
