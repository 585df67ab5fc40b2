"""Traced training steps kept on disk under a key of what decides them, so that a later run
compiles its step without tracing or lowering it again.

JAX's persistent compilation cache (:mod:`jax_attention.runtime.compilation`) keys a program by
its lowered StableHLO, so a run that finds its training step there has still traced and lowered
it first: most of a warm run's compilation (docs/compilation-cache.md). This cache keeps the
lowered program itself, as :mod:`jax.export` serializes it (StableHLO with its calling
convention), keyed by everything that decides the program *before* it is traced:

- ``description``: the caller's description of the program — for the training step the run's
  configuration (:func:`jax_attention.models.configs.step_program`), which already has to name
  everything that shapes a run, since a training checkpoint is resumed only under the same one —
  and the NNX graph definition's ``repr`` (its modules' static attributes);
- the source of this package (a SHA-256 over every ``.py`` file of ``jax_attention/``) and what
  its imported modules hold now (:func:`live_digest`: a function or setting replaced at run
  time is a miss too), Python's version and the versions of jax, jaxlib, flax, optax and the
  rest of :data:`~jax_attention.runtime.provenance.DISTRIBUTIONS`;
- the backend (platform, its version, the devices' kinds and count) and the CPU (its model and
  flags);
- the compile options, ``XLA_FLAGS`` and every ``jax.config`` setting;
- the arguments: their tree structure, shapes, dtypes, weak types and shardings, and the other
  static ones (``repr``).

Any change is a miss: the program is traced and lowered as usual, and written. Hit or miss, XLA
compiles the stored program (``jax.jit`` of :meth:`jax.export.Exported.call`), or JAX's own
persistent cache serves it, so what runs is XLA's own compilation of the same StableHLO: the
same results bit for bit. (An earlier version kept XLA's executables instead, with
:mod:`jax.experimental.serialize_executable`; on XLA:CPU an executable that JAX's cache had
loaded lost its kernels when serialized again, docs/performance.md.)

Entries are ``DIR/<key>.program``, each written to a temporary file and renamed, so that a writer
killed halfway leaves nothing half-written and two runs writing the same entry leave one whole;
the newest :data:`MAX_ENTRIES` (by last use) are kept. An entry that cannot be read back
(truncated, damaged, another format) is removed with one warning and the program traced and
written again; an entry that cannot be written (a read-only or full disk) gives one warning and
the run goes on; a program that :mod:`jax.export` cannot take (a host callback, such as a
``jax.debug.print`` left in a model) gives one warning and is compiled as usual. The cache is off
unless a command turns it on (:func:`jax_attention.runtime.compilation.enable_compilation_cache`),
and in multi-process runs; the training loop uses it on one device.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import pickle
import re
import sys
import tempfile
import warnings
from pathlib import Path

from jax_attention.runtime.provenance import cpu, os_reason, versions

__all__ = ["FORMAT", "MAX_ENTRIES", "ProgramCache", "StoredJit", "StoredProgram",
           "source_digest", "live_digest"]

#: The format of an entry; another one is a miss.
FORMAT = "jax-attention.program/1"

#: Entries kept (the newest by last use); the book Transformer's step is ~0.3 MB.
MAX_ENTRIES = 16

_SUFFIX = ".program"
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_PACKAGE_DIR = Path(__file__).resolve().parents[1]


@functools.cache
def source_digest() -> str:
    """SHA-256 over the path and bytes of every ``.py`` file of this package, in path order."""
    digest = hashlib.sha256()
    for path in sorted(_PACKAGE_DIR.rglob("*.py")):
        digest.update(f"{path.relative_to(_PACKAGE_DIR).as_posix()}\0".encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


# Module-level settings that :func:`live_digest` records by value: the immutable ones (a dict or
# list is state more often than a setting: a cache, a registry).
_SIMPLE = (bool, int, float, str, bytes, type(None), tuple, frozenset)


def _live_entry(owner: str, name: str, value):
    """What :func:`live_digest` records of one attribute, or ``None``."""
    target = getattr(value, "__wrapped__", value)
    if callable(target) and hasattr(target, "__qualname__"):
        return owner, name, getattr(target, "__module__", None), target.__qualname__
    if isinstance(value, _SIMPLE):
        # A set's order changes with the string hash seed: its sorted items.
        text = repr(sorted(map(repr, value))) if isinstance(value, frozenset) else repr(value)
        return None if _ADDRESS.search(text) else (owner, name, text)
    return None


def live_digest() -> str:
    """SHA-256 of what this package's imported modules hold now: each module-level function,
    class and wrapped function by module and qualified name, each function of a class defined
    there likewise, and each module-level constant (numbers, strings, tuples, frozen sets) by
    its ``repr``. A function or setting replaced at run time (a test's ``monkeypatch``, a user's
    experiment) changes the program without changing a file: it changes this digest."""
    entries = []
    for module_name in sorted(name for name in list(sys.modules)
                              if name == "jax_attention" or name.startswith("jax_attention.")):
        namespace = dict(vars(sys.modules[module_name]))
        for name in sorted(namespace):
            value = namespace[name]
            entry = _live_entry(module_name, name, value)
            if entry is not None:
                entries.append(entry)
            if isinstance(value, type) and value.__module__ == module_name:
                for attribute in sorted(vars(value)):
                    member = vars(value)[attribute]
                    if callable(member) or isinstance(member, _SIMPLE):
                        entry = _live_entry(f"{module_name}.{name}", attribute, member)
                        if entry is not None:
                            entries.append(entry)
    return hashlib.sha256(repr(entries).encode()).hexdigest()


def _leaf_type(leaf) -> tuple:
    """A traced argument's type as the compiled program sees it (hashable)."""
    aval = getattr(leaf, "aval", None)  # an array's, at a tenth of jax.typeof's cost
    if aval is None:
        import jax

        aval = jax.typeof(leaf)
    return aval, getattr(leaf, "sharding", None)


def _sharding_text(sharding) -> str:
    """``repr`` of a sharding with its devices' ids (a mesh's ``repr`` leaves them out)."""
    if sharding is None:
        return "None"
    return f"{sharding!r} on {sorted(device.id for device in sharding.device_set)}"


def _static_text(arg) -> str:
    """A static argument in the key: its ``repr``, a tuple of shardings with their devices."""
    if isinstance(arg, tuple) and arg and all(hasattr(item, "device_set") for item in arg):
        return repr([_sharding_text(sharding) for sharding in arg])
    return repr(arg)


#: Programs compiled in this process, by directory and key (the newest :data:`MAX_ENTRIES`): a
#: second run in one process (the tests, a notebook) takes its compiled step from here, as
#: ``jax.jit``'s own cache would give it, instead of reading and compiling it again.
_LOADED: dict[tuple[str, str], "_Compiled"] = {}


def _remember(directory: Path, key: str, compiled: _Compiled) -> None:
    _LOADED.pop((str(directory), key), None)
    _LOADED[str(directory), key] = compiled
    while len(_LOADED) > MAX_ENTRIES:
        del _LOADED[next(iter(_LOADED))]


class StoredProgram:
    """One lowered program of a :class:`StoredJit`: ``exported`` (a :class:`jax.export.Exported`
    of the function of the traced arguments' leaves, flat) and ``out_tree``, the structure its
    flat results are put back into."""

    def __init__(self, exported, out_tree):
        self.exported, self.out_tree = exported, out_tree

    def serialize(self, key: str) -> bytes:
        """The entry's bytes: the format, the key, the exported program and the result tree."""
        return pickle.dumps({"format": FORMAT, "key": key,
                             "exported": bytes(self.exported.serialize()),
                             "out_tree": self.out_tree}, protocol=pickle.HIGHEST_PROTOCOL)

    @classmethod
    def deserialize(cls, data: bytes, key: str) -> StoredProgram:
        """The program of an entry's bytes; ``ValueError`` for bytes of another format or key."""
        from jax import export

        entry = pickle.loads(data)
        if not isinstance(entry, dict) or entry.get("format") != FORMAT \
                or entry.get("key") != key:
            raise ValueError("not an entry of this format")
        return cls(export.deserialize(bytearray(entry["exported"])), entry["out_tree"])


class ProgramCache:
    """The directory of lowered programs; see the module docstring.

    Args:
      directory: where the entries are kept (created when the first is written).
    """

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)
        self._warned: set[str] = set()

    def _warn_once(self, kind: str, message: str) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            warnings.warn(message, RuntimeWarning, stacklevel=4)

    def _path(self, key: str) -> Path:
        return self.directory / f"{key}{_SUFFIX}"

    def key(self, description: dict) -> str:
        """The entry's name for ``description`` (a JSON-ready dict), with the environment's
        parts added (see the module docstring)."""
        import jax

        backend = jax.devices()[0].client
        record = {"format": FORMAT, "program": description, "sources": source_digest(),
                  "live": live_digest(),
                  "python": sys.version, "versions": versions(),
                  "backend": {"platform": backend.platform,
                              "version": backend.platform_version,
                              "devices": [device.device_kind for device in jax.devices()]},
                  "cpu": dict(cpu()), "xla_flags": os.environ.get("XLA_FLAGS", ""),
                  "jax_config": {name: repr(value)
                                 for name, value in sorted(jax.config.values.items())}}
        text = json.dumps(record, sort_keys=True, default=repr)
        return hashlib.sha256(text.encode()).hexdigest()

    def load(self, key: str) -> StoredProgram | None:
        """The program stored under ``key``, or ``None`` (none, or one that cannot be read
        back: removed, with one warning)."""
        path = self._path(key)
        try:
            data = path.read_bytes()
        except (FileNotFoundError, NotADirectoryError):  # none (or pruned by another run)
            return None
        except OSError as error:
            return self.discard(key, error)
        try:
            program = StoredProgram.deserialize(data, key)
        except Exception as error:  # any damage is a miss; nothing of it is used
            return self.discard(key, error)
        with contextlib.suppress(OSError):
            os.utime(path)  # last use, for pruning
        return program

    def discard(self, key: str, error: BaseException) -> None:
        """Remove the entry of ``key``, which could not be read back or used because of
        ``error``, with one warning (an entry that cannot be removed is replaced by the next
        write); returns ``None``, a miss."""
        path = self._path(key)
        self._warn_once("read", f"the stored program {str(path)!r} cannot be read back "
                                f"({type(error).__name__}: {error}); tracing it again")
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)
        return None

    def refuse(self, error: BaseException) -> None:
        """One warning that a program could not be exported (``error``: a host callback such as
        ``jax.debug.print``, which :mod:`jax.export` cannot serialize); it is compiled as usual."""
        self._warn_once("export", f"the traced program cannot be kept ({type(error).__name__}: "
                                  f"{error}); compiling it as usual")

    def store(self, key: str, program: StoredProgram) -> Path | None:
        """Write ``program`` under ``key``; ``None`` (and one warning) when it cannot be written
        or serialized."""
        temporary = None
        try:
            data = program.serialize(key)
            self.directory.mkdir(parents=True, exist_ok=True)
            handle, temporary = tempfile.mkstemp(dir=self.directory, prefix=".writing-",
                                                 suffix=_SUFFIX)
            with os.fdopen(handle, "wb") as file:
                file.write(data)
            path = self._path(key)
            os.replace(temporary, path)
            temporary = None
        except OSError as error:
            self._warn_once("write", f"the traced program cannot be kept in "
                                     f"{str(self.directory)!r} ({os_reason(error)}); the next "
                                     "run traces it again")
            return None
        except Exception as error:  # a program that cannot be serialized: the run goes on
            self._warn_once("serialize", f"the traced program cannot be serialized "
                                         f"({type(error).__name__}: {error}); the next run "
                                         "traces it again")
            return None
        finally:
            if temporary is not None:
                Path(temporary).unlink(missing_ok=True)
        self._prune()
        return path

    def _prune(self) -> None:
        """Keep the newest :data:`MAX_ENTRIES` entries (by last use)."""
        with contextlib.suppress(OSError):  # another run pruning too: the next write tries again
            entries = sorted(self.directory.glob(f"*{_SUFFIX}"),
                             key=lambda path: path.stat().st_mtime, reverse=True)
            for path in entries[MAX_ENTRIES:]:
                path.unlink(missing_ok=True)


class _Compiled:
    """A :class:`StoredProgram` compiled for one signature: called with the traced arguments,
    it checks their tree, runs XLA's program on their leaves and returns the results' tree."""

    def __init__(self, compiled, in_tree, out_tree):
        self._compiled, self._in_tree, self._out_tree = compiled, in_tree, out_tree

    def __call__(self, traced: list):
        import jax

        leaves, tree = jax.tree.flatten(traced)
        if tree != self._in_tree:
            raise TypeError(f"arguments of another structure: {tree}, not {self._in_tree}")
        return jax.tree.unflatten(self._out_tree, self._compiled(*leaves))


class StoredJit:
    """A jitted function whose traced programs come from a :class:`ProgramCache`.

    Called as the function, with the same arguments: each distinct signature (the static
    arguments and the traced ones' types) is loaded from the cache or traced and lowered once
    (:func:`jax.export.export` of the function of the traced arguments' leaves) and written;
    then XLA compiles it with ``jitted``'s options and donations (JAX's persistent cache may
    serve that), and it is called with the traced arguments. A call with the static arguments
    of the call before goes straight to its program, which checks the traced arguments' tree and
    types itself (a ``TypeError`` or ``ValueError`` before it runs anything: then the signature
    is looked up as for a new one).

    Args:
      jitted: a :class:`~jax_attention.runtime.compilation.BackendJit`, called with positional
        arguments only.
      cache: the :class:`ProgramCache`.
      description: what decides the program beyond the arguments' types (JSON-ready), standing
        in for the static arguments of ``described`` in the key.
      described: the static arguments whose ``repr`` is not stable across processes (an NNX
        graph definition, which shows its optimizer's functions by address), which
        ``description`` describes: they enter the key as ``description`` and as their ``repr``
        less memory addresses. ``description`` must name what that ``repr`` does not show (an
        optimizer's learning rate, a value its functions close over).
    """

    def __init__(self, jitted, cache: ProgramCache, description: dict, *,
                 described: tuple[int, ...] = ()):
        self._jitted, self._cache, self._description = jitted, cache, description
        self._static = frozenset(jitted.static_argnums)
        self._described = frozenset(described)
        self._programs: dict = {}
        self._last: tuple | None = None  # (the static arguments, their program) of the last call

    def _split(self, args) -> tuple[list, list]:
        """``(the static arguments, the traced ones)``, each in order."""
        return ([arg for i, arg in enumerate(args) if i in self._static],
                [arg for i, arg in enumerate(args) if i not in self._static])

    def _signature(self, statics: list, traced: list) -> tuple:
        import jax

        leaves, tree = jax.tree.flatten(traced)
        return tuple(statics), tree, tuple(_leaf_type(leaf) for leaf in leaves)

    def _description_of(self, args, tree, types) -> dict:
        return {"function": getattr(self._jitted, "__qualname__", repr(self._jitted)),
                "module": getattr(self._jitted, "__module__", None),
                "described": self._description, "options": self._jitted.options(),
                "static": [_static_text(arg) for i, arg in enumerate(args)
                           if i in self._static and i not in self._described],
                # What the described arguments show of themselves, less memory addresses (an
                # NNX graph definition's static attributes: a dropout rate, a head count).
                "shown": [_ADDRESS.sub("", repr(arg)) for i, arg in enumerate(args)
                          if i in self._described],
                "tree": str(tree), "types": [[repr(aval), _sharding_text(sharding)]
                                             for aval, sharding in types]}

    def __call__(self, *args):
        statics, traced = self._split(args)
        last = self._last
        if last is not None and len(last[0]) == len(statics) and all(
                a is b or a == b for a, b in zip(last[0], statics)):
            try:
                return last[1](traced)
            except (TypeError, ValueError):  # another structure or types: nothing ran
                pass
        compiled = self._compiled(args, statics, traced)
        self._last = (statics, compiled)
        return compiled(traced)

    def _export(self, statics: list, traced: list) -> StoredProgram:
        """Trace and lower the function of the traced arguments' leaves, ``statics`` fixed."""
        import jax
        from jax import export

        leaves, in_tree = jax.tree.flatten(traced)
        fun, out_trees = self._jitted.__wrapped__, []

        def flat(*leaves):
            args = self._merge(statics, jax.tree.unflatten(in_tree, leaves))
            results, out_tree = jax.tree.flatten(fun(*args))
            out_trees.append(out_tree)
            return results

        exported = export.export(jax.jit(flat))(*leaves)  # for the default backend
        return StoredProgram(exported, out_trees[0])

    def _compile(self, program: StoredProgram, traced: list) -> _Compiled:
        """XLA's compilation of ``program`` for ``traced`` (JAX's persistent cache may serve
        it), with ``jitted``'s options and the leaves of its donated arguments donated."""
        import jax

        leaves, in_tree = jax.tree.flatten(traced)
        positions = [i for i in range(len(self._static) + len(traced)) if i not in self._static]
        donated, offset = [], 0
        for position, arg in zip(positions, traced, strict=True):
            count = len(jax.tree.leaves(arg))
            if position in self._jitted.donate_argnums:
                donated += range(offset, offset + count)
            offset += count
        compiled = jax.jit(program.exported.call, donate_argnums=tuple(donated),
                           compiler_options=self._jitted.options() or None).lower(*leaves).compile()
        return _Compiled(compiled, in_tree, program.out_tree)

    def _compiled(self, args, statics: list, traced: list) -> _Compiled:
        """The compiled program of ``args``' signature: from this object or the process, else
        compiled from the directory's program or from a new trace (written)."""
        signature = self._signature(statics, traced)
        compiled = self._programs.get(signature)
        if compiled is not None:
            return compiled
        key = self._cache.key(self._description_of(args, *signature[1:]))
        compiled = _LOADED.get((str(self._cache.directory), key))
        if compiled is None:
            program = self._cache.load(key)
            if program is not None:
                try:
                    compiled = self._compile(program, traced)
                except Exception as error:  # a program that does not fit after all: traced anew
                    self._cache.discard(key, error)
        if compiled is None:
            try:
                program = self._export(statics, traced)
            except Exception as error:  # a program jax.export cannot take: compiled as usual
                self._cache.refuse(error)
                compiled = functools.partial(self._direct, statics)
                self._programs[signature] = compiled
                return compiled
            compiled = self._compile(program, traced)
            self._cache.store(key, program)
        _remember(self._cache.directory, key, compiled)
        self._programs[signature] = compiled
        return compiled

    def _merge(self, statics: list, traced: list) -> list:
        """The positional arguments of ``statics`` and ``traced`` (:meth:`_split`'s inverse)."""
        given, traced_args = iter(statics), iter(traced)
        return [next(given) if i in self._static else next(traced_args)
                for i in range(len(statics) + len(traced))]

    def _direct(self, statics: list, traced: list):
        """``jitted`` called as usual, for a program that cannot be kept (:meth:`_compiled`)."""
        return self._jitted(*self._merge(statics, traced))
