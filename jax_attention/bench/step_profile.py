"""Where a training step's time goes: XLA:CPU's kernels of the compiled step, timed one by one.

``jax-attention bench profile [--model transformer] [--json FILE]`` builds the model and the
batches exactly as ``bench train`` does (:func:`jax_attention.bench.train.our_training`,
:func:`~jax_attention.bench.train.training_batches`: the book's settings and data), compiles
:func:`jax_attention.train.loop.train_steps` for ``steps`` steps (the code path of ``jax-attention
train``), then runs it ``calls`` times under ``jax.profiler`` and reads the trace back. XLA:CPU's
runtime records each kernel it runs (a fusion, a library GEMM, a copy) under the name of its HLO
instruction; the compiled program's text maps each name to its output shape and to the JAX
operation it came from, so that every kernel is counted in one phase:

* ``forward``: the model's forward pass (JAX names these operations ``jvp(...)``);
* ``backward``: its transpose (``transpose(jvp(...))``);
* ``update``: everything else — the global-norm clipping, Adam, the non-finite check, the
  dropout stream.

The record gives, per training step: the wall time measured without the profiler (median of
``calls`` calls), the kernels run and their summed time (on every thread: more than the wall
when two kernels overlap), and that time split by phase, by kind of kernel (a GEMM on the generic
path, a library (YNNPACK) fusion, an elementwise or reduction fusion, a copy) and by the output
shape, with the slowest kernels. The profiler adds a little time to each kernel: compare the
shares, not the absolute times, with the wall.

docs/performance.md's "What limits it" comes from this record.
"""

from __future__ import annotations

import collections
import gzip
import json
import os
import re
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from jax_attention._checks import check_int
from jax_attention.bench.common import environment, format_table, load_average

__all__ = ["PHASES", "CONTAINERS", "kernel_table", "kernel_events", "phase_of", "kind_of",
           "profile_train_step", "format_step_profile"]

#: The phases a kernel's time is counted in (:func:`phase_of`), in the order they are reported:
#: ``"forward"`` (JAX's ``jvp(...)`` operations), ``"backward"`` (``transpose(jvp(...))``) and
#: ``"update"`` (everything else: clipping, Adam, the non-finite check, the dropout stream).
PHASES = ("forward", "backward", "update")

#: Instructions whose trace events hold other kernels' (a loop, a conditional, a call): counting
#: them would count their kernels twice.
CONTAINERS = ("while", "conditional", "call")

# An instruction of the compiled program's text: `%name = shape opcode(...)` (ROOT optional);
# the shape is an array's or a tuple's (a multi-output fusion's).
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (\([^()]*\)|\S+) ([a-z][\w\-]*)\(")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_LAYOUT = re.compile(r"\{[^{}]*\}")  # `{1,0}` after each array's dimensions


def kernel_table(hlo_text: str) -> dict:
    """``{instruction name: (output shape, opcode, JAX op_name)}`` of every instruction in the
    compiled program's text (``compiled.as_text()``); the shape without its layout."""
    table = {}
    for line in hlo_text.splitlines():
        match = _INSTRUCTION.match(line)
        if match:
            op_name = _OP_NAME.search(line)
            table[match.group(1)] = (_LAYOUT.sub("", match.group(2)), match.group(3),
                                     op_name.group(1) if op_name else "")
    return table


def phase_of(op_name: str) -> str:
    """The phase (:data:`PHASES`) of a kernel from the JAX operation it came from."""
    inner = op_name.split("/while/body/", 1)[-1].removeprefix("closed_call/")
    if inner.startswith("transpose(jvp"):
        return "backward"
    if inner.startswith("jvp"):
        return "forward"
    return "update"


def kind_of(name: str, opcode: str) -> str:
    """What kind of kernel an instruction runs as."""
    if "ynn_fusion" in name or "xnn_fusion" in name:
        return "library fusion (YNNPACK)"
    if opcode in ("dot", "convolution"):
        return "GEMM, generic (Eigen)"
    if opcode == "fusion":
        return "fusion (elementwise, reduction, transpose)"
    if opcode in ("copy", "transpose"):
        return "copy"
    return "other"


def kernel_events(trace, table: dict) -> list[tuple[str, float]]:
    """``(name, microseconds)`` of each kernel run in a Chrome/Perfetto ``trace`` (its dict, or
    its list of events): the complete events whose name is an instruction of the program
    (``table``, :func:`kernel_table`), less the :data:`CONTAINERS`. The runtime's own spans and
    Python's are not instructions."""
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    return [(event["name"], float(event["dur"])) for event in events
            if event.get("ph") == "X" and event.get("name") in table
            and table[event["name"]][1] not in CONTAINERS]


def _read_trace(trace_dir: Path):
    files = sorted(trace_dir.glob("plugins/profile/*/perfetto_trace.json.gz"))
    if not files:
        raise RuntimeError(f"jax.profiler wrote no trace under {trace_dir}")
    with gzip.open(files[-1], "rt") as handle:
        return json.load(handle)


_TRACE_PREFIX = "jax-attention-profile-"


def _remove_stale_traces() -> None:
    """Remove the trace folders of earlier profiles whose process is gone (a second Ctrl-C, or
    the first one in a command without a safe point, ends the process without its clean-up)."""
    for folder in Path(tempfile.gettempdir()).glob(f"{_TRACE_PREFIX}*-*"):
        pid = folder.name[len(_TRACE_PREFIX):].split("-", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
        except OSError:
            pass  # alive, another user's


def _shares(totals: dict, counts: dict, steps: int, total: float) -> list[dict]:
    return [{"name": name, "us_per_step": round(value / steps, 1),
             "kernels_per_step": round(counts[name] / steps, 1),
             "share": round(value / total, 4) if total else 0.0}
            for name, value in sorted(totals.items(), key=lambda item: -item[1])]


def _tally(events: list[tuple[str, float]], table: dict, total_steps: int) -> dict:
    """The kernels' time and count per step by phase, kind, output shape and kernel (each a list
    of rows, the largest first), and ``total``, the kernels' summed microseconds."""
    by = {key: collections.defaultdict(float) for key in ("phase", "kind", "shape", "kernel")}
    counts = {key: collections.Counter() for key in by}
    for name, us in events:
        shape, opcode, op_name = table[name]
        for key, value in (("phase", phase_of(op_name)), ("kind", kind_of(name, opcode)),
                           ("shape", shape), ("kernel", name)):
            by[key][value] += us
            counts[key][value] += 1
    total = sum(us for _, us in events)
    tally = {key: _shares(by[key], counts[key], total_steps, total) for key in by}
    for row in tally["kernel"]:
        shape, opcode, op_name = table[row["name"]]
        row.update(shape=shape, opcode=opcode, op_name=op_name)
    return {**tally, "total": total}


def _check_arguments(model: str, steps: int, calls: int, top: int) -> None:
    """:func:`profile_train_step`'s arguments checked before any work: a registered ``model``;
    ``steps``, ``calls`` and ``top`` integers >= 1 (``ValueError`` naming the bad one)."""
    from jax_attention.bench.train import MODELS

    if model not in MODELS:
        raise ValueError(f"model must be one of {MODELS}, got {model!r}")
    check_int("steps", steps, 1)
    check_int("calls", calls, 1)
    check_int("top", top, 1)


def _timed_calls(call, calls: int) -> list[float]:
    """The wall seconds of ``calls`` calls of ``call``, after two untimed ones (the buffers)."""
    for _ in range(2):  # warm-up: the buffers
        call()
    walls = []
    for _ in range(calls):
        started = time.perf_counter()
        call()
        walls.append(time.perf_counter() - started)
    return walls


def _profiled_kernels(call, calls: int, table: dict) -> list[tuple[str, float]]:
    """``calls`` calls of ``call`` under ``jax.profiler``: the kernels they ran, as
    :func:`kernel_events` reads them from the trace (in a temporary folder, removed after)."""
    import jax

    _remove_stale_traces()
    with tempfile.TemporaryDirectory(prefix=f"{_TRACE_PREFIX}{os.getpid()}-") as directory:
        jax.profiler.start_trace(directory, create_perfetto_trace=True)
        try:
            for _ in range(calls):
                call()
        finally:
            jax.profiler.stop_trace()
        return kernel_events(_read_trace(Path(directory)), table)


def profile_train_step(model: str = "transformer", *, steps: int = 10, calls: int = 10,
                       seed: int = 0, sizes: dict | None = None, batch_size: int = 64,
                       num_steps: int = 10, num_examples: int = 600, lr: float = 0.005,
                       data=None, top: int = 15, log=None) -> dict:
    """Profile ``calls`` compiled calls of ``steps`` training steps each (see the module
    docstring); returns a JSON-ready record, per training step.

    Args:
      model: a registered model kind (``"transformer"``, ``"bahdanau"``).
      steps: training steps per compiled call (the book's data: 10 make an epoch).
      calls: profiled calls, and timed calls without the profiler (medians).
      sizes: model settings overriding the book's (``bench train``'s ``BOOK_MODELS``).
      batch_size, num_steps, num_examples, lr, data: as ``bench train``.
      top: how many of the slowest kernels and output shapes to list.
      log: called with progress lines, or ``None``.
    """
    from jax_attention.bench.train import BOOK_MODELS, our_training, stack_batches, \
        training_batches
    from jax_attention.train.loop import train_steps

    _check_arguments(model, steps, calls, top)
    say = log or (lambda line: None)
    settings = {**BOOK_MODELS[model], **(sizes or {})}
    load_before = load_average()
    nmt, _, padded, tokens = training_batches(batch_size, num_steps, num_examples, data, seed,
                                              steps)
    _, _, graphdef, state = our_training(model, settings, nmt, seed, lr)
    batches = stack_batches(padded)
    bos_id = nmt.tgt_vocab["<bos>"]

    say(f"{model}: compiling {steps} training steps")
    started = time.perf_counter()
    compiled = train_steps.lower(graphdef, state, batches, bos_id).compile()
    compile_s = time.perf_counter() - started
    table = kernel_table(compiled.as_text())

    def call():
        nonlocal state
        state, losses = compiled(state, batches)  # the dynamic arguments of train_steps
        np.asarray(losses)  # the call's one device sync

    walls = _timed_calls(call, calls)
    say(f"{model}: profiling {calls} calls")
    events = _profiled_kernels(call, calls, table)
    tally = _tally(events, table, steps * calls)
    return {
        "benchmark": "step_profile",
        "model": model,
        "settings": {"model": settings, "batch_size": batch_size, "num_steps": num_steps,
                     "num_examples": num_examples, "lr": lr, "seed": seed, "steps": steps,
                     "calls": calls},
        "compile_s": round(compile_s, 3),
        "wall_ms_per_step": round(1e3 * statistics.median(walls) / steps, 3),
        "tokens_per_s": round(tokens * calls / sum(walls), 1),
        "kernels_per_step": round(len(events) / (steps * calls), 1),
        "kernel_ms_per_step": round(tally["total"] / (steps * calls) / 1e3, 3),
        "phases": {row["name"]: row for row in tally["phase"]},
        "kinds": tally["kind"],
        "shapes": tally["shape"][:top],
        "slowest_kernels": tally["kernel"][:top],
        "load_average": {"before": load_before, "after": load_average()},
        "environment": environment(),
    }


def format_step_profile(record: dict) -> str:
    """The record as text: the totals, then tables by phase, kind, shape and kernel."""
    lines = [
        f"{record['model']}: {record['settings']['steps']} steps a call, "
        f"{record['settings']['calls']} calls; compile {record['compile_s']:.2f} s",
        f"wall {record['wall_ms_per_step']:.2f} ms a step (without the profiler); "
        f"{record['kernels_per_step']:.0f} kernels a step, "
        f"{record['kernel_ms_per_step']:.2f} ms of kernel time (all threads, profiled)",
        "",
    ]

    def rows(items, extra=()):
        return [[item["name"], *[item[key] for key in extra], f"{item['us_per_step']:.0f}",
                 f"{item['kernels_per_step']:.1f}", f"{100 * item['share']:.1f}%"]
                for item in items]

    phases = [record["phases"][name] for name in PHASES if name in record["phases"]]
    for title, items, extra in (("phase", phases, ()), ("kind", record["kinds"], ()),
                                ("output shape", record["shapes"], ()),
                                ("kernel", record["slowest_kernels"], ("shape",))):
        lines.append(format_table([title, *extra, "us/step", "kernels/step", "share"],
                                  rows(items, extra)))
        lines.append("")
    return "\n".join(lines).rstrip()
