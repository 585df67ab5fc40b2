"""The program cache (:mod:`jax_attention.runtime.program_cache`): a stored training step
loads without tracing and trains the same; what keys it; damaged entries, unwritable
directories, pruning; the seed and the epochs left out of the step's key
(:func:`jax_attention.models.configs.step_program`)."""

from __future__ import annotations

import errno
import os
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jax_attention.models.configs import step_program
from jax_attention.models.registry import MODELS
from jax_attention.runtime import compilation, program_cache
from jax_attention.runtime.checkpointing import state_arrays
from jax_attention.runtime.program_cache import ProgramCache, StoredJit
from jax_attention.train import loop, seq2seq
from tests.shared_runs import TINY

_TRACE = "/jax/core/compile/jaxpr_trace_duration"


def _run(seed: int = 1, dropout: float = 0.1):
    """``(nmt, graphdef, state, record)`` of the tiny Bahdanau run before its first step; the
    record is the run's configuration as its checkpoints (and the program cache) get it."""
    spec = MODELS["bahdanau"]
    sizes = {name: value for name, value in TINY.items()
             if name not in ("epochs", "progress", "log")}
    model_settings, train_settings, _ = spec.split_settings({**sizes, "seed": seed})
    model_config = spec.model_config(**model_settings, dropout=dropout)
    train_config = spec.train_config(**train_settings)
    nmt, model_config, model, optimizer = seq2seq.setup(spec, model_config, train_config)
    record = {"model": spec.name, **model_config.record(), "training": train_config.record(),
              "data": nmt.fingerprint}
    return nmt, *nnx.split((model, optimizer)), record


def _arguments(nmt, graphdef, state):
    batches, _ = loop.epoch_batches(nmt, 0)
    return graphdef, state, batches, nmt.tgt_vocab["<bos>"], False, None, None


def _fresh_steps():
    """:func:`loop.train_steps` compiled the same way, as a function no cache of this process has
    seen (``jax.jit`` keeps traces by function): a call that does not trace it loaded it."""

    def steps(graphdef, state, batches, bos_id, skip_nonfinite=False, shardings=None,
              num_steps=None):
        return loop.train_steps.__wrapped__(graphdef, state, batches, bos_id, skip_nonfinite,
                                            shardings, num_steps)

    return compilation.BackendJit(steps, cpu_options=loop.train_steps.cpu_options,
                                  static_argnums=loop.train_steps.static_argnums,
                                  donate_argnums=1)


def _copy(state):
    return jax.tree.map(lambda array: array.copy(), state)


class _Events:
    """While open: the functions JAX traced (their names, from its monitoring events) and the
    programs ``cache`` read back from its directory (``hits``). (The instance's ``load`` is
    wrapped, not the class's, which would change the cache's keys: :func:`live_digest`.)"""

    def __init__(self, cache: ProgramCache):
        self._cache = cache

    def __enter__(self):
        self.traced, self.hits = [], 0
        load = self._cache.load

        def counted(key):
            program = load(key)
            self.hits += program is not None
            return program

        self._cache.load = counted
        jax.monitoring.register_event_time_span_listener(self._span)
        return self

    def _span(self, event, start, end, *, fun_name="", **_):
        if event == _TRACE:
            self.traced.append(fun_name)

    @property
    def traces(self) -> int:
        """How many functions were traced, other than the call of a stored program
        (:meth:`jax.export.Exported.call`, named ``call``)."""
        return sum(name != "call" for name in self.traced)

    def __exit__(self, *exc):
        del self._cache.load
        jax.monitoring.unregister_event_time_span_listener(self._span)


@pytest.fixture
def fresh_memory(monkeypatch):
    """No compiled program of this process's memory: every load reads the directory."""
    monkeypatch.setattr(program_cache, "_LOADED", {})


def test_a_stored_step_loads_without_tracing_and_trains_the_same(tmp_path, fresh_memory):
    nmt, graphdef, state, record = _run()
    args = _arguments(nmt, graphdef, state)
    expected_state, expected_losses = loop.train_steps(*args[:1], _copy(state), *args[2:])
    cache = ProgramCache(tmp_path / "programs")

    with _Events(cache) as first:
        stored = StoredJit(_fresh_steps(), cache, step_program(record), described=(0,))
        state_1, losses_1 = stored(graphdef, _copy(state), *args[2:])
    assert first.traces > 0 and first.hits == 0
    entries = list(cache.directory.iterdir())
    assert len(entries) == 1 and entries[0].suffix == ".program"

    program_cache._LOADED.clear()  # as in a new process
    given = _copy(state)
    with _Events(cache) as second:
        stored = StoredJit(_fresh_steps(), cache, step_program(record), described=(0,))
        state_2, losses_2 = stored(graphdef, given, *args[2:])
    assert second.traces == 0 and second.hits == 1
    # The state is donated, as the jitted step donates it.
    assert all(leaf.is_deleted() for leaf in jax.tree.leaves(given))
    # Traced anew or loaded, the stored program trains as the jitted step does: bit for bit the
    # same losses and state.
    for losses in (losses_1, losses_2):
        np.testing.assert_array_equal(np.asarray(losses), np.asarray(expected_losses))
    want = state_arrays(expected_state)
    for result in (state_1, state_2):
        got = state_arrays(result)
        assert got.keys() == want.keys()
        for path in want:
            np.testing.assert_array_equal(got[path], want[path], err_msg=path)
    # A second call of the same signature reuses the program (no key, no load).
    with _Events(cache) as third:
        stored(graphdef, state_2, *args[2:])
    assert third.traces == 0 and third.hits == 0
    # Another one of this process, the same key: the compiled program from memory, not traced,
    # not read back, not compiled again.
    with _Events(cache) as fourth:
        StoredJit(_fresh_steps(), cache, step_program(record), described=(0,))(
            graphdef, _copy(state), *args[2:])
    assert fourth.traced == [] and fourth.hits == 0


def test_the_seed_and_the_epochs_do_not_change_the_step():
    """What :func:`step_program` leaves out of the key: the step lowered for another seed (and
    so other weights, batches and dropout keys) is the same program."""
    lowered = []
    for seed in (1, 2):
        nmt, graphdef, state, record = _run(seed)
        lowered.append(loop.train_steps.lower(*_arguments(nmt, graphdef, state)).as_text())
    assert lowered[0] == lowered[1]
    records = [_run(seed)[3] for seed in (1, 2)]
    records[1]["training"]["epochs"] = records[0]["training"]["epochs"] + 5
    assert records[0] != records[1]
    assert step_program(records[0]) == step_program(records[1])
    # Every other setting stays in it.
    changed = {**records[0], "dropout": 0.2}
    assert step_program(changed) != step_program(records[0])
    assert set(step_program(records[0])["training"]) == set(records[0]["training"]) - {
        "seed", "epochs"}


def _tiny(x, scale):
    return jnp.sum(jnp.sin(x) * scale)


def _stored_tiny(cache, description=None):
    return StoredJit(compilation.BackendJit(_tiny, static_argnums=(1,), cpu_options={}),
                     cache, {"test": "tiny"} if description is None else description)


def _description(stored, args) -> dict:
    """What ``stored`` keys the program of ``args`` by, beside the environment."""
    return stored._description_of(args, *stored._signature(*stored._split(args))[1:])


def _keyed(cache, description, *args):
    return cache.key(_description(_stored_tiny(cache, description), args))


def test_the_key_changes_with_what_decides_the_program(tmp_path, monkeypatch):
    cache = ProgramCache(tmp_path)
    x = jnp.ones(3)
    base = _keyed(cache, {"a": 1}, x, 2)
    assert _keyed(cache, {"a": 1}, x, 2) == base  # deterministic
    assert _keyed(cache, {"a": 2}, x, 2) != base  # the description
    assert _keyed(cache, {"a": 1}, x, 3) != base  # a static argument
    assert _keyed(cache, {"a": 1}, jnp.ones(4), 2) != base  # a shape
    assert _keyed(cache, {"a": 1}, jnp.ones(3, jnp.bfloat16), 2) != base  # a dtype
    monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", "") + " --xla_dump_to=/x")
    assert _keyed(cache, {"a": 1}, x, 2) != base  # XLA's flags
    monkeypatch.undo()
    with jax.default_matmul_precision("bfloat16"):
        assert _keyed(cache, {"a": 1}, x, 2) != base  # JAX's configuration
    # A function of the package replaced at run time (no file changed) is another program.
    monkeypatch.setattr(loop, "masked_cross_entropy", lambda *args, **kwargs: None)
    assert _keyed(cache, {"a": 1}, x, 2) != base
    monkeypatch.undo()
    monkeypatch.setattr(program_cache, "MAX_ENTRIES", program_cache.MAX_ENTRIES + 1)
    assert _keyed(cache, {"a": 1}, x, 2) != base  # a module's setting likewise
    monkeypatch.undo()
    assert _keyed(cache, {"a": 1}, x, 2) == base


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty", "undeletable"])
def test_a_damaged_entry_is_one_warning_and_compiles_again(tmp_path, fresh_memory, damage,
                                                           monkeypatch):
    """A damaged entry is removed (one that cannot be removed is replaced by the next write),
    with one warning; the program compiles, and is loaded the next time."""
    if damage == "undeletable":
        real_unlink = Path.unlink

        def refuse(path, *args, **kwargs):
            if path.suffix == ".program":
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
            return real_unlink(path, *args, **kwargs)

        monkeypatch.setattr(Path, "unlink", refuse)
    cache = ProgramCache(tmp_path)
    x = jnp.linspace(0.0, 1.0, 5)
    want = float(_tiny(x, 3))
    assert float(_stored_tiny(cache)(x, 3)) == want
    (entry,) = tmp_path.iterdir()
    data = entry.read_bytes()
    entry.write_bytes({"truncated": data[:len(data) // 2], "garbage": b"\x80\x04not a pickle",
                       "empty": b"", "undeletable": data[:10]}[damage])
    program_cache._LOADED.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert float(_stored_tiny(cache)(x, 3)) == want
    assert len(caught) == 1 and "cannot be read back" in str(caught[0].message)
    assert str(entry) in str(caught[0].message)
    # Written again, whole: the next process loads it.
    program_cache._LOADED.clear()
    with _Events(cache) as events, warnings.catch_warnings():
        warnings.simplefilter("error")
        assert float(_stored_tiny(cache)(x, 3)) == want
    assert events.hits == 1 and events.traces == 0


def test_an_entry_of_another_key_is_not_used(tmp_path, fresh_memory):
    """An entry renamed (or copied) under another key is refused, not run."""
    cache = ProgramCache(tmp_path)
    x = jnp.ones(3)
    _stored_tiny(cache)(x, 2)
    (entry,) = tmp_path.iterdir()
    other = _stored_tiny(cache)
    key = cache.key(_description(other, (x, 5)))
    entry.rename(tmp_path / f"{key}.program")
    program_cache._LOADED.clear()
    with pytest.warns(RuntimeWarning, match="not an entry of this format"):
        assert float(other(x, 5)) == float(_tiny(x, 5))


def test_an_unwritable_directory_is_one_warning_and_the_call_goes_on(tmp_path, fresh_memory):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    cache = ProgramCache(blocker / "programs")
    x = jnp.ones(4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert float(_stored_tiny(cache)(x, 7)) == float(_tiny(x, 7))
        assert float(_stored_tiny(cache)(x, 8)) == float(_tiny(x, 8))
    assert len(caught) == 1 and "cannot be kept in" in str(caught[0].message)
    assert blocker.read_text() == "not a directory"


def test_the_newest_entries_are_kept(tmp_path, fresh_memory, monkeypatch):
    monkeypatch.setattr(program_cache, "MAX_ENTRIES", 2)
    cache = ProgramCache(tmp_path)
    stored = _stored_tiny(cache)
    order = []
    for scale in (1, 2, 3):
        stored(jnp.ones(3), scale)
        order += [path.name for path in tmp_path.iterdir() if path.name not in order]
        # Each entry older than the next one written (the file system's clock may be coarse).
        for path in tmp_path.iterdir():
            os.utime(path, (1000 + order.index(path.name),) * 2)
    assert len(order) == 3
    assert {path.name for path in tmp_path.iterdir()} == set(order[1:])
    assert not any(path.name.startswith(".writing-") for path in tmp_path.iterdir())


def test_a_call_of_other_types_gets_its_own_program(tmp_path, fresh_memory):
    """The same static arguments with other traced types (the last program refuses them before
    running) get a program of their own; a Python scalar's weak type is a type too."""
    cache = ProgramCache(tmp_path)
    stored = _stored_tiny(cache)
    for x in (jnp.ones(3), jnp.ones(4), jnp.ones(3, jnp.bfloat16), jnp.ones(4), 1.5,
              jnp.ones(3)):
        assert float(stored(x, 2)) == pytest.approx(float(_tiny(jnp.asarray(x), 2)),
                                                      rel=1e-2)
    assert len(list(tmp_path.iterdir())) == 4


@pytest.mark.parametrize("fault", ["disk full", "Ctrl-C"])
def test_a_write_cut_short_leaves_no_entry(tmp_path, fresh_memory, monkeypatch, fault):
    """A full disk while the entry is written is one warning and no entry (the call's result
    stands); a Ctrl-C (KeyboardInterrupt) there propagates, leaving no entry either."""
    real_fdopen = program_cache.os.fdopen

    class CutShort:
        """The entry's file, which takes some bytes and then fails."""

        def __init__(self, *args, **kwargs):
            self._file = real_fdopen(*args, **kwargs)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self._file.close()

        def write(self, data):
            self._file.write(data[:10])  # some bytes are on disk already
            if fault == "Ctrl-C":
                raise KeyboardInterrupt
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(program_cache.os, "fdopen", CutShort)
    cache = ProgramCache(tmp_path)
    x = jnp.ones(3)
    if fault == "Ctrl-C":
        with pytest.raises(KeyboardInterrupt):
            _stored_tiny(cache)(x, 2)
    else:
        with pytest.warns(RuntimeWarning, match="cannot be kept in .*No space left on device"):
            assert float(_stored_tiny(cache)(x, 2)) == float(_tiny(x, 2))
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr(program_cache.os, "fdopen", real_fdopen)
    program_cache._LOADED.clear()
    assert float(_stored_tiny(cache)(x, 2)) == float(_tiny(x, 2))  # written this time
    assert len(list(tmp_path.iterdir())) == 1


def test_the_graph_definition_shows_in_the_key(tmp_path):
    """A described argument (the NNX graph definition) enters the key as its ``repr`` less
    memory addresses: another module attribute (a dropout rate the description left out) is
    another key, the same model is the same key."""
    cache = ProgramCache(tmp_path)
    keys, shown = [], []
    for dropout in (0.1, 0.3, 0.1):
        nmt, graphdef, state, _ = _run(dropout=dropout)
        assert " at 0x" in repr(graphdef)  # the optimizer's functions
        stored = StoredJit(loop.train_steps, cache, {"partial": True}, described=(0,))
        args = _arguments(nmt, graphdef, state)
        description = _description(stored, args)
        shown += description["shown"]
        keys.append(cache.key(description))
    assert all(" at 0x" not in text for text in shown)
    assert "('dropout', Static(value=0.3))" in shown[1]
    assert keys[0] != keys[1] and keys[0] == keys[2]


def _printing(x, scale):
    jax.debug.callback(lambda value: None, x)  # a host callback: jax.export cannot keep it
    return jnp.sum(x * scale)


def test_a_program_that_cannot_be_exported_is_one_warning_and_compiles_as_usual(tmp_path,
                                                                                fresh_memory):
    """A host callback (a ``jax.debug.print`` left in a model) cannot be serialized: one
    warning, no entry, and the function compiled and called as ``jax.jit`` would."""
    cache = ProgramCache(tmp_path)
    stored = StoredJit(compilation.BackendJit(_printing, static_argnums=(1,), cpu_options={}),
                       cache, {"test": "printing"})
    x = jnp.arange(4.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert float(stored(x, 2)) == 12.0
        assert float(stored(x, 3)) == 18.0
        assert float(stored(x, 2)) == 12.0
    assert len(caught) == 1 and "cannot be kept (" in str(caught[0].message)
    assert "compiling it as usual" in str(caught[0].message)
    assert list(tmp_path.iterdir()) == []
