"""``jax-attention bench train --whole-run``: the whole training command against the book's
PyTorch training of the same model, each a fresh process, from start to exit.

What a user feels is the wall time of ``jax-attention train MODEL`` — interpreter start,
imports, data, compilation, training, the book's sentences, plots, export, exit — against the
book's own PyTorch code doing the same job. The peers:

* ``ours`` — ``python -m jax_attention train MODEL --out out --json ours.json --no-progress
  --seed S --data PATH`` (what ``make run`` does), in a fresh temporary working directory, so
  that its ``runs/`` and plots never land in the user's tree. Its compilation cache: ``cold``
  (``JAX_ATTENTION_COMPILATION_CACHE=0`` and no ``JAX_COMPILATION_CACHE_DIR``: everything
  compiled afresh, a first run) or ``warm`` (a temporary persistent cache, filled by one untimed
  run of the same command first, as a user's second run finds it; the user's own cache is never
  read or written). ``cache="both"`` runs both, as peers ``ours`` and ``ours_warm``.
* ``torch`` — ``python -m jax_attention.bench.book_run --model MODEL ...``
  (:mod:`jax_attention.bench.book_run`): the book's ``train_seq2seq`` loop on the PyTorch mirror
  (eager, one step per batch) and its ``predict_seq2seq``, with the same data, settings and seed.

Each round runs every peer once, one after the other, the order rotating from round to round.
The parent times each process from start to exit (``process wall``) and takes its CPU time from
``getrusage`` of its children; the rest comes from each run's own JSON: the compile time (ours:
``compile_s`` of the training report; eager PyTorch compiles nothing), the steady tokens/s (the
median over the epochs after the first, the first being the one that compiles) and the BLEU
(k = 2) of the book's four sentences, with the number of them at BLEU 1.0. The record gives the
median over the rounds of each figure and the ratios of those medians: ours / torch for tokens/s,
torch / ours for the wall (both > 1 when ours is faster).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from jax_attention._checks import check_choice, check_int, check_positive_float, check_setting
from jax_attention.bench.common import environment, format_environment, format_table, load_average
from jax_attention.models.registry import get_model

__all__ = ["CACHES", "OURS_PEER", "bench_whole_run", "format_whole_run"]

#: ``cache=``: our command's compilation cache in the timed runs.
CACHES = ("cold", "warm", "both")

#: What ``ours`` is (the record adds the cache).
OURS_PEER = ("jax-attention train MODEL as a user runs it (python -m jax_attention train MODEL "
             "--out DIR --json FILE --no-progress): data, the compiled training, the book's "
             "sentences, plots and the export; a fresh process in a temporary directory")

_CACHE_NOTES = {
    "cold": "compilation cache off (JAX_ATTENTION_COMPILATION_CACHE=0): every program compiled "
            "afresh, a first run",
    "warm": "a temporary compilation cache (with its programs/, the training step kept "
            "traced), filled by one untimed run of the same command first: a second run",
}
_CACHE_VARIABLES = ("JAX_ATTENTION_COMPILATION_CACHE", "JAX_COMPILATION_CACHE_DIR",
                    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS")


def _check_arguments(model, rounds, epochs, num_examples, seed, cache, torch_threads,
                     timeout_s) -> None:
    get_model(model)
    check_int("rounds", rounds, 1)
    check_setting("epochs", epochs, ("int_or_none", 1))
    check_setting("num_examples", num_examples, ("int_or_none", 1))
    check_int("seed", seed, 0)
    check_choice("cache", cache, CACHES)
    check_setting("torch_threads", torch_threads, ("int_or_none", 1))
    if timeout_s is not None:
        check_positive_float("timeout_s", timeout_s)


def _our_peers(cache: str) -> list[str]:
    return {"cold": ["ours"], "warm": ["ours_warm"], "both": ["ours", "ours_warm"]}[cache]


def _overrides(epochs, num_examples, seed: int, data: Path) -> list[str]:
    """The flags both commands share."""
    flags = ["--seed", str(seed), "--data", str(data)]
    if epochs is not None:
        flags += ["--epochs", str(epochs)]
    if num_examples is not None:
        flags += ["--num-examples", str(num_examples)]
    return flags


def _commands(model: str, shared: list[str], torch_threads) -> dict[str, list[str]]:
    """Each peer's command, run in its own fresh working directory (relative output paths)."""
    ours = [sys.executable, "-m", "jax_attention", "train", model, "--out", "out", "--json",
            "ours.json", "--no-progress", *shared]
    torch = [sys.executable, "-m", "jax_attention.bench.book_run", "--model", model, "--json",
             "torch.json", "--torch-threads", "auto" if torch_threads is None else
             str(torch_threads), *shared]
    return {"ours": ours, "ours_warm": ours, "torch": torch}


def _environment(peer: str, cache_dir: Path) -> dict[str, str]:
    """The child's environment: the caller's, with our compilation cache set as ``peer`` wants
    (the torch peer's left as it is)."""
    env = os.environ.copy()
    if peer == "torch":
        return env
    for name in _CACHE_VARIABLES:
        env.pop(name, None)
    if peer == "ours":
        env["JAX_ATTENTION_COMPILATION_CACHE"] = "0"
    else:
        from jax_attention.runtime.compilation import MIN_COMPILE_TIME_S

        env["JAX_COMPILATION_CACHE_DIR"] = str(cache_dir)
        env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = str(MIN_COMPILE_TIME_S)
    return env


def _child_cpu_s() -> float | None:
    try:
        import resource
    except ImportError:  # not on this OS
        return None
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _run(peer: str, command: list[str], env: dict, directory: Path,
         timeout_s: float | None) -> tuple[dict, float, float | None]:
    """Run one peer in ``directory``: ``(its JSON record, process wall s, process CPU s)``."""
    directory.mkdir(parents=True)
    cpu_before = _child_cpu_s()
    start = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=directory, env=env, capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{peer}: timed out after {timeout_s:g} s: {' '.join(command)}") \
            from None
    wall = time.perf_counter() - start
    cpu_after = _child_cpu_s()
    if done.returncode != 0:
        tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-5:])
        raise RuntimeError(f"{peer}: exited with status {done.returncode}: {tail}")
    record = json.loads((directory / command[command.index("--json") + 1]).read_text())
    cpu = None if cpu_before is None else cpu_after - cpu_before
    return record, wall, cpu


def _round_figures(record: dict, wall: float, cpu: float | None) -> dict:
    """One run's figures from its JSON (ours' or book_run's, the same keys)."""
    rates = record["tokens_per_sec_per_epoch"]
    steady = record.get("steady_tokens_per_sec")
    if steady is None and len(rates) > 1:
        steady = statistics.median(rates[1:])
    translations = [{key: t[key] for key in ("source", "translation", "reference", "bleu")}
                    for t in record["translations"]]
    figures = {
        "wall_s": wall,
        "cpu_s": cpu,
        "run_wall_s": record.get("wall_time_s"),
        "compile_s": record.get("compile_s"),
        "steady_tokens_per_s": steady,
        "first_epoch_tokens_per_s": rates[0],
        "final_loss": record["losses"][-1],
        "translations": translations,
        "mean_bleu": statistics.fmean(t["bleu"] for t in translations),
        "num_bleu_1": sum(t["bleu"] == 1.0 for t in translations),
        "timing": record.get("timing"),
    }
    if "torch_threads" in record:
        figures["torch_threads"] = record["torch_threads"]
    return figures


def _median(rounds: list[dict], key: str):
    values = [r[key] for r in rounds if r.get(key) is not None]
    return statistics.median(values) if values else None


def _summary(description: str, rounds: list[dict], command: list[str]) -> dict:
    """A peer's medians over the rounds, what it is, its command and its rounds."""
    summary = {"peer": description, "command": [Path(command[0]).name, *command[1:]]}
    for key in ("wall_s", "cpu_s", "run_wall_s", "compile_s", "steady_tokens_per_s",
                "mean_bleu", "num_bleu_1"):
        summary[key] = _median(rounds, key)
    sentences = zip(*[[t["bleu"] for t in r["translations"]] for r in rounds])
    summary["bleu_per_sentence"] = [statistics.median(scores) for scores in sentences]
    summary["rounds"] = rounds
    return summary


def _ratios(peers: dict) -> dict:
    """For each of our peers: ours / torch for tokens/s, torch / ours for the walls."""
    torch = peers["torch"]
    ratios = {}
    for name, ours in peers.items():
        if name == "torch":
            continue
        steady = (ours["steady_tokens_per_s"] / torch["steady_tokens_per_s"]
                  if ours["steady_tokens_per_s"] and torch["steady_tokens_per_s"] else None)
        ratios[name] = {"steady_tokens_per_s": steady,
                        "wall": torch["wall_s"] / ours["wall_s"]}
    return ratios


def _tokens_per_epoch(model: str, num_examples, seed: int, data: Path) -> int:
    """Target tokens of one epoch of the run's data (the same for both peers)."""
    from jax_attention.data.nmt import load_data_nmt

    spec = get_model(model)
    train_config = spec.train_config(**({} if num_examples is None else
                                        {"num_examples": num_examples}), seed=seed)
    nmt = load_data_nmt(train_config.batch_size, spec.model_config().num_steps,
                        train_config.num_examples, data=data, seed=seed)
    return int(nmt.train.tgt_valid_len.sum())


def _rounds(model: str, peers: list[str], commands: dict, workdir: Path, *, rounds: int,
            timeout_s, say) -> tuple[dict[str, list[dict]], dict[str, str]]:
    """Every round: each peer once, the order rotating. Returns the figures of each run by
    peer, and what each peer is (the torch peer's from its own record)."""
    results: dict[str, list[dict]] = {peer: [] for peer in peers}
    descriptions = {peer: f"{OURS_PEER}; {_CACHE_NOTES['cold' if peer == 'ours' else 'warm']}"
                    for peer in peers if peer != "torch"}
    cache_dir = workdir / "compilation-cache"
    if "ours_warm" in peers:
        say(f"{model}: filling the warm compilation cache (one untimed run)")
        _run("ours_warm", commands["ours_warm"], _environment("ours_warm", cache_dir),
             workdir / "priming", timeout_s)
    for number in range(rounds):
        order = peers[number % len(peers):] + peers[:number % len(peers)]
        for peer in order:
            say(f"{model}: round {number + 1}/{rounds}: {peer}")
            record, wall, cpu = _run(peer, commands[peer], _environment(peer, cache_dir),
                                     workdir / f"round{number + 1}-{peer}", timeout_s)
            figures = {"round": number + 1, "position": order.index(peer) + 1,
                       **_round_figures(record, wall, cpu)}
            if peer == "torch":
                descriptions["torch"] = record["peer"]
            results[peer].append(figures)
            say(f"{model}: {peer}: process wall {wall:.1f} s, steady "
                f"{figures['steady_tokens_per_s'] or float('nan'):.0f} tokens/s, "
                f"{figures['num_bleu_1']} of {len(figures['translations'])} at BLEU 1")
    return results, descriptions


def bench_whole_run(model: str = "transformer", *, rounds: int = 3, epochs: int | None = None,
                    num_examples: int | None = None, seed: int = 0, cache: str = "cold",
                    torch_threads: int | None = None, data=None,
                    timeout_s: float | None = 3600.0,
                    log: Callable[[str], object] | None = None) -> dict:
    """Time ``jax-attention train MODEL`` against the book's PyTorch training, whole processes.

    Args:
      model: a registered model (``"transformer"``, ``"bahdanau"``).
      rounds: rounds of every peer (the figures are medians over them; 3 or more for a report,
        fewer for a quick look).
      epochs, num_examples: change the book's settings for both (``None``: the book's).
      seed: both runs' ``--seed``.
      cache: our compilation cache, ``"cold"``, ``"warm"`` or ``"both"`` (module docstring).
      torch_threads: PyTorch's threads in the book's run (``None``: the faster of 1 and its
        default over the first epochs, :class:`~jax_attention.bench.torch_support.ThreadChoice`).
      data: the English–French data (``None``: found as ``jax-attention train`` finds it; both
        runs are given the same file).
      timeout_s: per run (``None``: no limit); a run that fails or times out raises.
      log: called with progress lines, or ``None``.

    Returns:
      A JSON-ready dict: ``settings``, ``peers`` (per peer: ``peer``, its ``command``, the
      medians ``wall_s``, ``cpu_s``, ``run_wall_s``, ``compile_s``, ``steady_tokens_per_s``,
      ``mean_bleu``, ``num_bleu_1``, ``bleu_per_sentence``, and its ``rounds``), ``ratios``,
      ``tokens_per_epoch``, the load average and the environment.

    Raises:
      ValueError: a bad argument (the message names it).
      RuntimeError: a run failed or timed out (the message has the end of its output).
    """
    from jax_attention.data.nmt import find_data

    _check_arguments(model, rounds, epochs, num_examples, seed, cache, torch_threads, timeout_s)
    say = log or (lambda line: None)
    spec = get_model(model)
    data = find_data(data).resolve()
    load_before = load_average()
    environment_record = environment()
    peers = _our_peers(cache) + ["torch"]
    commands = _commands(model, _overrides(epochs, num_examples, seed, data), torch_threads)
    with tempfile.TemporaryDirectory(prefix="jax-attention-whole-run-") as workdir:
        results, descriptions = _rounds(model, peers, commands, Path(workdir), rounds=rounds,
                                        timeout_s=timeout_s, say=say)
    summaries = {peer: _summary(descriptions[peer], results[peer], commands[peer])
                 for peer in peers}
    return {
        "benchmark": "train --whole-run",
        "model": spec.name,
        "settings": {"rounds": rounds, "epochs": spec.default_epochs if epochs is None else epochs,
                     "num_examples": spec.train_config().num_examples if num_examples is None
                     else num_examples, "seed": seed, "cache": cache,
                     "torch_threads": "auto" if torch_threads is None else torch_threads,
                     "data": str(data),
                     "order": "each round runs every peer once, one after the other; the order "
                              "rotates from round to round"},
        "tokens_per_epoch": _tokens_per_epoch(model, num_examples, seed, data),
        "peers": summaries,
        "ratios": _ratios(summaries),
        "load_average": {"before": load_before, "after": load_average()},
        "environment": environment_record,
    }


def _cell(value, digits: int = 1):
    return None if value is None else f"{value:,.{digits}f}"


def format_whole_run(record: dict) -> str:
    """The record as a table: one row per peer (medians), then the ratios and what each peer is."""
    settings = record["settings"]
    rows = []
    for name, peer in record["peers"].items():
        rows.append([name, _cell(peer["wall_s"]), _cell(peer["cpu_s"]), _cell(peer["compile_s"]),
                     _cell(peer["steady_tokens_per_s"], 0), _cell(peer["mean_bleu"], 3),
                     _cell(peer["num_bleu_1"], 1)])
    lines = [
        format_environment(record["environment"]),
        f"bench train --whole-run --model {record['model']}: {settings['rounds']} round(s) "
        f"(medians), {settings['epochs']} epochs, {settings['num_examples']} pairs, seed "
        f"{settings['seed']}, our compilation cache {settings['cache']}; each run a fresh "
        f"process, the peers one after the other, the order rotating",
        format_table(["peer", "process wall s", "CPU s", "compile s", "steady tokens/s",
                      "mean BLEU", "BLEU = 1 (of 4)"], rows),
    ]
    for name, ratio in record["ratios"].items():
        tokens = ratio["steady_tokens_per_s"]
        tokens = "-" if tokens is None else f"{tokens:.2f}x"
        lines.append(f"{name} vs torch: steady tokens/s {tokens} (ours / torch), process wall "
                     f"{ratio['wall']:.2f}x (torch / ours)")
    lines += [f"{name}: {peer['peer']}" for name, peer in record["peers"].items()]
    load = record["load_average"]
    lines.append(f"load average (1, 5, 15 min) before {load['before']}, after {load['after']}")
    return "\n".join(lines)
