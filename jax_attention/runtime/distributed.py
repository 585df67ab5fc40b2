"""Training on many devices and hosts: a device mesh, replicated state, batches split by JAX.

Data parallelism the SPMD way (``jax.sharding``): the training step stays the one compiled
function of :mod:`jax_attention.train`; only where its inputs live changes. A
:class:`~jax.sharding.Mesh` has a ``data`` axis (and a ``model`` axis, size 1 unless tensor
parallelism is asked for); the parameters, Adam's moments and the dropout stream are replicated on
every device (:func:`replicate`, ``PartitionSpec()``), each batch is split along its batch axis
(:func:`shard_batches`, ``PartitionSpec(None, "data")`` for the stacked ``(K, B, ...)`` batches).
XLA's SPMD partitioner then runs each device's rows and inserts the all-reduce of the gradients
(the loss is a sum over the batch) — no hand-written communication. Results equal those on one
device up to the order of float32 sums.

Dropout: the models draw their masks from an ``impl="rbg"`` key (XLA's ``RngBitGenerator``).
Under the SPMD partitioner each device generates the whole mask and keeps its rows — redundant
work, but the masks are the same bits as on one device (``jax.random``'s table: ``rbg`` is
"identical across shardings"), which is what makes a run on N devices equal to a run on one.
XLA's ``--xla_tpu_spmd_rng_bit_generator_unsafe=1`` would generate only each device's rows and
break that equality; do not set it.

Tensor parallelism (``model`` axis > 1, the Transformer): the attention projections and the
FFN's weights are split over the ``model`` axis by heads and by FFN width
(:data:`TENSOR_PARALLEL_SPECS`, :func:`place_state`); the step is still unchanged, XLA derives
the per-device matmuls and the all-reduces from the placement.

Multi-host: one process per host (or per accelerator), all running the same command. Call
:func:`initialize_from_env` before any other JAX use; every process then sees every device
(``jax.devices()``) and its own (``jax.local_devices()``). Each process builds the same
deterministic batch order on its host and places only the rows of its own devices
(:func:`shard_batches`); results come back with :func:`to_host` and :func:`to_local`.

Shape letters: ``K`` steps stacked in one call, ``B`` batch, ``T`` time steps.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jax_attention._checks import check_int

__all__ = ["DATA_AXIS", "MODEL_AXIS", "COORDINATOR_VARIABLES", "DISTRIBUTED_VARIABLE",
           "TENSOR_PARALLEL_SPECS", "initialize_from_env", "make_mesh", "data_size",
           "model_size", "check_batch_size", "replicate",
           "tensor_parallel_spec", "state_shardings", "place_state", "shard_batches", "to_local",
           "to_host", "is_main_process"]

#: The name of the mesh axis that batches are split along (data parallelism): each batch's rows
#: go to the devices of this axis, ``PartitionSpec(None, DATA_AXIS)`` for stacked ``(K, B, ...)``
#: batches; the state is replicated over it.
DATA_AXIS = "data"
#: The name of the mesh axis that the Transformer's attention heads and FFN width are split along
#: (tensor parallelism, :data:`TENSOR_PARALLEL_SPECS`); size 1 unless asked for.
MODEL_AXIS = "model"

#: Set all three to start a multi-process run by hand (each process its own ``JAX_PROCESS_ID``):
#: the address ``host:port`` of process 0, where it serves the coordinator, the number of
#: processes, and this process's index. ``jax.distributed.initialize``'s own names.
COORDINATOR_VARIABLES = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")

#: ``JAX_ATTENTION_DISTRIBUTED=auto``: let JAX find the cluster (Cloud TPU pod slices, GKE,
#: Slurm, Open MPI, Kubernetes) — ``jax.distributed.initialize()`` without arguments.
DISTRIBUTED_VARIABLE = "JAX_ATTENTION_DISTRIBUTED"


def _launcher(environ: Mapping[str, str]) -> str | None:
    """The multi-process launcher whose variables are set (more than one task), or ``None``."""
    for name, count_variable, marker in (("Slurm", "SLURM_NTASKS", "SLURM_PROCID"),
                                         ("Open MPI", "OMPI_COMM_WORLD_SIZE",
                                          "OMPI_MCA_orte_hnp_uri")):
        count = environ.get(count_variable, "")
        if marker in environ and count.isdigit() and int(count) > 1:
            return name
    return None


def _int_variable(environ: Mapping[str, str], name: str, minimum: int) -> int:
    text = environ[name]
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {text!r}") from None
    if value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value}")
    return value


def initialize_from_env(environ: Mapping[str, str] | None = None, *,
                        timeout_s: int = 300) -> bool:
    """Start JAX's multi-process runtime (``jax.distributed.initialize``) when the environment
    asks for it; do nothing otherwise. Idempotent.

    The environment asks for it with

    * :data:`COORDINATOR_VARIABLES` — ``JAX_COORDINATOR_ADDRESS=host:port``,
      ``JAX_NUM_PROCESSES=n`` and ``JAX_PROCESS_ID=i`` (all three);
    * a multi-task Slurm step (``srun``, ``SLURM_NTASKS > 1``) or an Open MPI launch
      (``mpirun``, ``OMPI_COMM_WORLD_SIZE > 1``), whose variables JAX reads itself;
    * ``JAX_ATTENTION_DISTRIBUTED=auto`` — JAX's cluster detection, for Cloud TPU pod slices
      and the other clusters it knows.

    Must run before anything starts JAX's backends (a computation, ``jax.devices()``, a
    ``device_put``): the training commands call it first.

    Args:
      environ: the variables to read (default: ``os.environ``).
      timeout_s: how long a process waits for the others to join before failing.

    Returns:
      Whether this process is part of a multi-process run.

    Raises:
      ValueError: only some of the coordinator variables are set, or one is malformed.
      RuntimeError: ``jax.distributed.initialize`` failed — JAX's backends were already
        started, or the processes did not find each other within ``timeout_s``; the message
        names the variables that asked for the run.
    """
    environ = os.environ if environ is None else environ
    if jax.distributed.is_initialized():
        return True
    given = [name for name in COORDINATOR_VARIABLES if environ.get(name)]
    mode = environ.get(DISTRIBUTED_VARIABLE, "").strip().lower()
    if mode not in ("", "auto"):
        raise ValueError(f"{DISTRIBUTED_VARIABLE} must be 'auto' or unset, got "
                         f"{environ[DISTRIBUTED_VARIABLE]!r}")
    if given:
        missing = [name for name in COORDINATOR_VARIABLES if name not in given]
        if missing:
            raise ValueError(f"a multi-process run needs all of "
                             f"{', '.join(COORDINATOR_VARIABLES)}; {', '.join(given)} set but "
                             f"{', '.join(missing)} missing")
        num_processes = _int_variable(environ, "JAX_NUM_PROCESSES", 1)
        process_id = _int_variable(environ, "JAX_PROCESS_ID", 0)
        if process_id >= num_processes:
            raise ValueError(f"JAX_PROCESS_ID must be < JAX_NUM_PROCESSES = {num_processes}, "
                             f"got {process_id}")
        arguments = {"coordinator_address": environ["JAX_COORDINATOR_ADDRESS"],
                     "num_processes": num_processes, "process_id": process_id}
        source = ", ".join(COORDINATOR_VARIABLES)
    elif mode == "auto" or _launcher(environ) is not None:
        arguments = {}
        source = (f"{DISTRIBUTED_VARIABLE}=auto" if mode == "auto"
                  else f"the {_launcher(environ)} launcher's variables")
    else:
        return False
    try:
        jax.distributed.initialize(**arguments, initialization_timeout=int(timeout_s))
    except RuntimeError as error:
        # E.g. JAX's backends already started (then it must be called earlier) or the
        # coordinator unreachable: say which variables asked for the run.
        raise RuntimeError(f"{source} ask for a multi-process run, but "
                           f"jax.distributed.initialize failed: {error}") from error
    return True


def is_main_process() -> bool:
    """Whether this is process 0, the one that logs and writes files in a multi-process run."""
    return jax.process_index() == 0


def _select_devices(count: int) -> list:
    """``count`` devices, the same number from each process (a process without devices in the
    mesh could not feed its rows), in ``jax.devices()`` order."""
    processes = jax.process_count()
    if count == jax.device_count():
        return list(jax.devices())
    if count % processes:
        raise ValueError(f"devices = {count} must be a multiple of the {processes} processes "
                         "(each process trains on the same number of its own devices)")
    per_process = count // processes
    by_process: dict[int, list] = {}
    for device in jax.devices():
        by_process.setdefault(device.process_index, []).append(device)
    short = {index: len(local) for index, local in by_process.items() if len(local) < per_process}
    if short:
        raise ValueError(f"devices = {count} needs {per_process} devices in each of the "
                         f"{processes} processes; processes {sorted(short)} have {short}")
    return [device for index in sorted(by_process) for device in by_process[index][:per_process]]


def make_mesh(devices: int | None = None, *, model: int = 1) -> Mesh:
    """The ``(data, model)`` device mesh of a training run.

    Args:
      devices: how many devices to train on (``--devices``); ``None`` = all of them
        (``jax.device_count()``, every process's). In a multi-process run it must be a multiple
        of the number of processes; each contributes the same number of its devices.
      model: the size of the ``model`` axis (tensor parallelism); ``devices`` must divide by
        it. The ``data`` axis gets ``devices // model``.

    Returns:
      A :class:`~jax.sharding.Mesh` with axes ``("data", "model")`` of ``AxisType.Auto``: the
      shardings of the inputs are hints that XLA's partitioner propagates through the
      unchanged step (explicit axes would make sharding part of every array's type).

    Raises:
      ValueError: ``devices`` or ``model`` is not a positive integer, more devices are asked
        for than there are, or ``devices`` does not divide by ``model``.
    """
    available = jax.device_count()
    for name, value in (("devices", devices), ("model", model)):
        if value is None and name == "devices":
            continue
        check_int(name, value, 1)
    count = available if devices is None else int(devices)
    if count > available:
        platform = jax.default_backend()
        hint = (" (on CPU, XLA_FLAGS=--xla_force_host_platform_device_count=N makes N host "
                "devices)" if platform == "cpu" else "")
        raise ValueError(f"devices = {count} but only {available} {platform} device"
                         f"{'s are' if available != 1 else ' is'} available{hint}")
    if count % model:
        raise ValueError(f"devices = {count} must be a multiple of model = {model} (the mesh "
                         f"is data x model)")
    return jax.make_mesh((count // model, int(model)), (DATA_AXIS, MODEL_AXIS),
                         axis_types=(AxisType.Auto, AxisType.Auto),
                         devices=_select_devices(count))


def data_size(mesh: Mesh) -> int:
    """The number of data-parallel replicas: the size of the mesh's ``data`` axis."""
    return int(mesh.shape[DATA_AXIS])


def model_size(mesh: Mesh) -> int:
    """The number of tensor-parallel shards: the size of the mesh's ``model`` axis (1 if absent)."""
    return int(dict(mesh.shape).get(MODEL_AXIS, 1))


def check_batch_size(batch_size: int, mesh: Mesh) -> None:
    """Raise unless ``batch_size`` splits evenly over the mesh's ``data`` axis.

    Raises:
      ValueError: naming the batch size and the number of data-parallel devices.
    """
    replicas = data_size(mesh)
    if batch_size % replicas:
        lower = batch_size - batch_size % replicas
        raise ValueError(f"batch_size = {batch_size} is not divisible by the {replicas} "
                         f"data-parallel devices (--devices); use a multiple of {replicas}, "
                         f"e.g. {lower or replicas} or {lower + replicas}")


def replicate(tree, mesh: Mesh):
    """Every array of ``tree`` (parameters, optimizer state, typed PRNG keys) replicated on every
    device of ``mesh`` (``PartitionSpec()``).

    Every process must pass the same values (in a training run they are: the same seed
    initialises the same state everywhere). A single-device array already on the mesh's first
    device is not copied, so donating the result to the step consumes the input, as donating
    the input itself would.
    """
    sharding = NamedSharding(mesh, P())
    # Unlike jax.device_put, this also places typed key arrays when the mesh spans processes.
    return jax.tree.map(lambda x: jax.make_array_from_process_local_data(sharding, x, x.shape),
                        tree)


#: Tensor parallelism of the Transformer over the ``model`` axis (the split of Megatron-LM,
#: Shoeybi et al. 2019): ``W_q, W_k, W_v (D, N H)`` by columns — whole heads per device when
#: ``N`` divides by the axis — and ``W_o (N H, D)`` by rows; the FFN's ``W_1 (D, F)`` and ``b_1``
#: by ``F``, ``W_2 (F, D)`` by rows. Adam's moments follow their parameters (same names). Only
#: the placement changes: XLA's partitioner derives the per-device computation and the
#: all-reduces after ``W_o`` and ``W_2`` from these shardings.
TENSOR_PARALLEL_SPECS = {
    "W_q": P(None, MODEL_AXIS), "W_k": P(None, MODEL_AXIS), "W_v": P(None, MODEL_AXIS),
    "W_o": P(MODEL_AXIS, None),
    "W_1": P(None, MODEL_AXIS), "b_1": P(MODEL_AXIS), "W_2": P(MODEL_AXIS, None),
}
_ATTENTION_WEIGHTS = frozenset({"W_q", "W_k", "W_v", "W_o"})
_FFN_WEIGHTS = frozenset({"W_1", "b_1", "W_2"})


def _leaf_name(path) -> str:
    """The last string dict key of a pytree path (NNX state: ``attention__W_q``)."""
    for key in reversed(path):
        if isinstance(key, jax.tree_util.DictKey) and isinstance(key.key, str):
            return key.key
    return ""


def tensor_parallel_spec(path) -> P:
    """The :data:`TENSOR_PARALLEL_SPECS` entry of a Transformer state leaf, ``P()`` for the rest.

    Args:
      path: the leaf's pytree path in the NNX state of ``(model, optimizer)``; the Transformer's
        blocks name their weights ``attention__W_q``, ``cross_attention__W_o``, ``ffn__W_1``, ...
        (Bahdanau's additive-attention ``W_q``, ``W_k`` stay replicated).
    """
    module, _, weight = _leaf_name(path).rpartition("__")
    if (module.endswith("attention") and weight in _ATTENTION_WEIGHTS) or (
            module == "ffn" and weight in _FFN_WEIGHTS):
        return TENSOR_PARALLEL_SPECS[weight]
    return P()


def state_shardings(state, mesh: Mesh):
    """The :class:`~jax.sharding.NamedSharding` of each leaf of a training state on ``mesh``:
    replicated, except the weights of :data:`TENSOR_PARALLEL_SPECS` when the ``model`` axis has
    more than one device.

    Raises:
      ValueError: a split axis of a weight does not divide by the ``model`` axis (names the
        leaf, its shape and the axis size).
    """
    shards = model_size(mesh)

    def sharding(path, x):
        spec = P() if shards == 1 else tensor_parallel_spec(path)
        for axis, name in enumerate(spec):
            if name is not None and x.shape[axis] % shards:
                raise ValueError(f"{jax.tree_util.keystr(path)} has shape {x.shape}: axis {axis} "
                                 f"is not divisible by the {shards} devices of the 'model' axis")
        return NamedSharding(mesh, spec)

    return jax.tree_util.tree_map_with_path(sharding, state)


def place_state(state, mesh: Mesh):
    """The training state placed on ``mesh`` as :func:`state_shardings` says: replicated for data
    parallelism (:func:`replicate`), the Transformer's heads and FFN width split over the
    ``model`` axis for tensor parallelism. Every process passes the same values."""
    return jax.tree.map(
        lambda x, sharding: jax.make_array_from_process_local_data(sharding, x, x.shape),
        state, state_shardings(state, mesh))


def shard_batches(batches, mesh: Mesh):
    """Stacked global batches ``(K, B, ...)`` split along ``B`` over the mesh's ``data`` axis.

    Every process passes the same global arrays (the batch order is deterministic from the
    seed) and places only the rows of its own devices: device ``d`` of ``n`` gets rows
    ``[d B/n, (d + 1) B/n)`` of every step.

    Args:
      batches: a pytree of NumPy arrays ``(K, B, ...)`` with the same ``B``.

    Returns:
      The same pytree of global :class:`jax.Array` with ``PartitionSpec(None, "data")``.

    Raises:
      ValueError: an array has fewer than 2 axes, or ``B`` does not divide by the data axis.
    """
    sharding = NamedSharding(mesh, P(None, DATA_AXIS))

    def place(array):
        array = np.asarray(array)
        if array.ndim < 2:
            raise ValueError(f"batches must be stacked (K, B, ...), got an array of shape "
                             f"{array.shape}")
        check_batch_size(array.shape[1], mesh)
        return jax.make_array_from_callback(array.shape, sharding, lambda index: array[index])

    return jax.tree.map(place, batches)


def _identity(x):
    return x


def to_local(tree):
    """Each global array of ``tree`` as an array on one of this process's devices.

    The end of training: the state goes back into the model, and what follows (translation,
    checkpoints, ``np.asarray``) runs on one device, in every process alike. A replicated array
    gives its local copy; a split one (tensor parallelism) is first gathered, which every process
    must do together (call it in all of them).

    Raises:
      ValueError: a split array whose sharding is not a :class:`~jax.sharding.NamedSharding`.
    """

    def local(x):
        if not isinstance(x, jax.Array) or len(x.sharding.device_set) == 1:
            return x
        if not x.sharding.is_fully_replicated:
            if not isinstance(x.sharding, NamedSharding):
                raise ValueError(f"to_local gathers NamedSharding arrays, got shape {x.shape} "
                                 f"with sharding {x.sharding}")
            x = jax.jit(_identity, out_shardings=NamedSharding(x.sharding.mesh, P()))(x)
        return x.addressable_data(0)

    return jax.tree.map(local, tree)


def to_host(x) -> np.ndarray:
    """``x`` as a NumPy array in every process: a replicated array from a local copy, a sharded
    one gathered across processes."""
    if not isinstance(x, jax.Array) or x.is_fully_addressable:
        return np.asarray(x)
    if x.sharding.is_fully_replicated:
        return np.asarray(x.addressable_data(0))
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x, tiled=True))

