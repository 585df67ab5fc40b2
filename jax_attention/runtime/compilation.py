"""Compilation: JAX's persistent compilation cache for the commands, and the time spent compiling.

:class:`CompileTimer` adds up the seconds JAX spends tracing, lowering and compiling (or loading
from the cache) while it is open: the figure the training report gives as its compile time.

The cache
---------

``jax-attention train`` and ``translate`` spend seconds compiling the same programs on every run
(the training step's scan, the decoders). :func:`enable_compilation_cache` points JAX's
persistent compilation cache at a directory of the user cache, so that a later run of the same
command loads the compiled programs instead. A loaded program is the one XLA produced, so the
results are bit for bit those of a run that compiled; the cache key covers the program, the
compile options and flags, the device and the jax/jaxlib versions, so a change of any of them
compiles afresh.

Where, in order:

1. nowhere when ``JAX_ATTENTION_COMPILATION_CACHE`` is ``0``/``off``/``false``/``no`` or the
   command's ``--no-compilation-cache`` is given;
2. the directory JAX itself was told (``JAX_COMPILATION_CACHE_DIR`` or
   ``jax.config.update("jax_compilation_cache_dir", ...)``), left as it is;
3. :func:`default_cache_dir`: ``$XDG_CACHE_HOME/jax-attention/compilation`` (else
   ``~/.cache/...``).

A directory that cannot be created or written leaves the cache off with one warning; the command
runs on, compiling as usual. The cache grows by a few MB per model setting; deleting the directory
is always safe.

The library itself never turns the cache on: code that imports :mod:`jax_attention` keeps JAX's
own settings. Call :func:`enable_compilation_cache` to opt in.

Options for the CPU
-------------------

:class:`BackendJit` is ``jax.jit`` with XLA options of its own for the CPU backend
(:data:`CPU_COMPILER_OPTIONS`: the fast-compile preset, LLVM at ``-O1``) and XLA's defaults on any
other: the training step (:func:`jax_attention.train.loop.train_steps`) compiles that way, a third
of a second to half a second sooner, its steps as fast or faster (docs/performance.md). Nothing
else, and no global flag, changes.
"""

from __future__ import annotations

import functools
import os
import tempfile
import threading
import warnings
from pathlib import Path

from jax_attention.runtime import program_cache

__all__ = ["ENVIRONMENT_VARIABLE", "MIN_COMPILE_TIME_S", "CPU_COMPILER_OPTIONS",
           "PROGRAMS", "default_cache_dir", "cache_disabled", "enable_compilation_cache",
           "stored_programs", "CompileTimer",
           "xla_knows", "BackendJit"]

#: Set to ``0`` (or ``off``, ``false``, ``no``) to keep the commands from using the cache.
ENVIRONMENT_VARIABLE = "JAX_ATTENTION_COMPILATION_CACHE"

#: Programs that compile faster than this are not written (JAX's own default is 1 s): the
#: decoders and the evaluation compile in 0.2–2 s each and are worth keeping, the many tiny
#: programs of eager operations are not.
MIN_COMPILE_TIME_S = 0.2

_OFF = {"0", "off", "false", "no"}

#: The subdirectory of the compilation cache that keeps the traced training steps
#: (:mod:`jax_attention.runtime.program_cache`).
PROGRAMS = "programs"

_programs: program_cache.ProgramCache | None = None

#: XLA:CPU's fast-compile preset and its LLVM backend at ``-O1`` (``-O3`` by default): the book
#: models' training step compiles 0.3–0.5 s sooner cold (medians: the Transformer 3.75 s against
#: 4.27 s, the Bahdanau model 2.87 s against 3.16 s) and steps as fast or faster (its time is in
#: library GEMMs and small kernels that ``-O3`` does not speed up). Other LLVM code rounds
#: otherwise in the last bits (the order of a vectorised sum): equal to float32 rounding.
CPU_COMPILER_OPTIONS = {"xla_cpu_opt_preset": "CPU_OPT_PRESET_FAST_COMPILE",
                        "xla_backend_optimization_level": 1}


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/jax-attention/compilation`` (else ``~/.cache/jax-attention/...``)."""
    from jax_attention.data.nmt import cache_dir

    return cache_dir() / "compilation"


def cache_disabled() -> bool:
    """True when ``JAX_ATTENTION_COMPILATION_CACHE`` turns the cache off."""
    return os.environ.get(ENVIRONMENT_VARIABLE, "").strip().lower() in _OFF


def _writable(directory: Path) -> str | None:
    """``None`` when ``directory`` exists (created if need be) and takes a file, else the reason."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".probe-"):
            pass
    except OSError as error:
        return error.strerror or str(error)
    return None


def enable_compilation_cache(enabled: bool = True, directory: Path | str | None = None
                             ) -> Path | None:
    """Turn JAX's persistent compilation cache on for this process; returns its directory.

    Call before the first compilation (JAX opens the cache at its first compile).

    Args:
      enabled: ``False`` (a command's ``--no-compilation-cache``) leaves the cache as JAX has it
        and returns ``None``; so does ``JAX_ATTENTION_COMPILATION_CACHE=0``.
      directory: the cache directory; ``None``: the one JAX was already told, else
        :func:`default_cache_dir`.

    Returns:
      The directory in use, or ``None`` when the cache stays off (disabled, or the directory
      cannot be written: one warning says why).
    """
    import jax

    global _programs
    _programs = None
    if not enabled or cache_disabled():
        return None
    configured = jax.config.jax_compilation_cache_dir
    if directory is None and configured:
        path = Path(configured)  # the user's own choice, with the user's own thresholds
    else:
        path = Path(directory) if directory is not None else default_cache_dir()
        reason = _writable(path)
        if reason is not None:
            warnings.warn(f"the compilation cache {str(path)!r} cannot be written ({reason}); "
                          "compiling without it", RuntimeWarning, stacklevel=2)
            return None
        jax.config.update("jax_compilation_cache_dir", str(path))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_TIME_S)
    _programs = program_cache.ProgramCache(path / PROGRAMS)
    return path


def stored_programs() -> program_cache.ProgramCache | None:
    """The cache of traced programs (:mod:`jax_attention.runtime.program_cache`):
    ``DIR/programs`` of the compilation cache :func:`enable_compilation_cache` turned on in
    this process; ``None`` while it is off, and in a multi-process run (each process would
    write its own part of one program)."""
    import jax

    return _programs if jax.process_count() == 1 else None


#: JAX's monitoring events of one compilation: tracing to a jaxpr, lowering to StableHLO, and
#: XLA's compilation (or the persistent cache's load, which replaces it).
_PHASES = {"/jax/core/compile/jaxpr_trace_duration": "trace_s",
           "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower_s",
           "/jax/core/compile/backend_compile_duration": "backend_s"}
_CACHE_HIT = "/jax/compilation_cache/cache_hits"


class CompileTimer:
    """Seconds spent compiling while open, from JAX's monitoring events (any thread).

    ::

        with CompileTimer() as timer:
            train(...)
        timer.seconds     # trace + lower + XLA compile (or cache load), all programs
        timer.phases      # {"trace_s": ..., "lower_s": ..., "backend_s": ...}
        timer.cache_hits  # programs loaded from the persistent compilation cache

    JAX reports each phase of each compilation as a time span; a function traced inside another
    (an inner ``jit``) reports a span within its caller's, so the timer counts the union of the
    spans, not their sum. Nested timers each count what happens while they are open. A JAX that
    stops emitting these events reads as 0 s.

    Args:
      this_thread: count only the compilations of the thread that opens the timer (JAX reports
        them on the thread that compiles), not those of other threads meanwhile.
    """

    def __init__(self, *, this_thread: bool = False):
        self._spans: dict[str, list[tuple[float, float]]] = {phase: [] for phase in
                                                             _PHASES.values()}
        self.cache_hits = 0
        self._this_thread = this_thread
        self._thread: int | None = None
        self._lock = threading.Lock()

    def _counts(self) -> bool:
        return not self._this_thread or threading.get_ident() == self._thread

    def _listen(self, event: str, start: float, end: float, **_) -> None:
        phase = _PHASES.get(event)
        if phase is not None and self._counts():
            with self._lock:
                self._spans[phase].append((start, end))

    def _count(self, event: str, **_) -> None:
        if event == _CACHE_HIT and self._counts():
            with self._lock:
                self.cache_hits += 1

    @staticmethod
    def _union(spans) -> float:
        total, reach = 0.0, float("-inf")
        for start, end in sorted(spans):
            if end > reach:
                total += end - max(start, reach)
                reach = end
        return total

    @property
    def phases(self) -> dict[str, float]:
        """The seconds of each phase (``trace_s``, ``lower_s``, ``backend_s``)."""
        with self._lock:
            return {phase: self._union(spans) for phase, spans in self._spans.items()}

    @property
    def seconds(self) -> float:
        """The seconds during which any compilation phase ran."""
        with self._lock:
            return self._union([span for spans in self._spans.values() for span in spans])

    def __enter__(self) -> CompileTimer:
        import jax

        self._thread = threading.get_ident()
        jax.monitoring.register_event_time_span_listener(self._listen)
        jax.monitoring.register_event_listener(self._count)
        return self

    def __exit__(self, *exc) -> None:
        import jax

        jax.monitoring.unregister_event_time_span_listener(self._listen)
        jax.monitoring.unregister_event_listener(self._count)


@functools.cache
def xla_knows(name: str, value) -> bool:
    """Whether the installed XLA has the compile option ``name`` (an older jaxlib may lack one:
    jaxlib 0.8.1 has no ``xla_cpu_opt_preset``), tried once per process on a trivial program of
    the default backend. An option it knows with a value it refuses still raises."""
    import jax

    try:
        jax.jit(lambda x: x, compiler_options={name: value}).lower(0.0).compile()
    except jax.errors.JaxRuntimeError as error:
        if f"No such compile option: '{name}'" in str(error):
            return False
        raise
    return True


class BackendJit:
    """``jax.jit(fun, **jit_kwargs)`` compiled with ``cpu_options`` when JAX's default backend is
    the CPU, with XLA's defaults on any other (the options are the CPU's: on a GPU the backend
    level would change its kernels, unmeasured).

    A call runs the jitted function of the default backend (built on first use, so that
    importing never starts a backend); :meth:`lower` lowers it; ``__wrapped__`` is ``fun``. An
    option that ``XLA_FLAGS`` sets itself (``--xla_backend_optimization_level=0``, say) is left
    to it: the user's flag wins.
    """

    def __init__(self, fun, *, cpu_options: dict, **jit_kwargs):
        functools.update_wrapper(self, fun)
        self._fun, self._jit_kwargs = fun, jit_kwargs
        #: The options of the CPU backend.
        self.cpu_options = dict(cpu_options)
        self._jitted: dict[str, object] = {}
        self._lock = threading.Lock()

    def jitted(self, backend: str | None = None, *, xla_defaults: bool = False):
        """The ``jax.jit`` object for ``backend`` (``None``: the default backend); with
        ``xla_defaults``, the one compiled with XLA's defaults on every backend (what the
        options change: ``bench train``'s ``ours-xla-defaults`` peer)."""
        import jax

        key = "xla-defaults" if xla_defaults else (backend or jax.default_backend())
        with self._lock:
            if key not in self._jitted:
                self._jitted[key] = jax.jit(self._fun, compiler_options=self.options(
                    key, xla_defaults=xla_defaults) or None, **self._jit_kwargs)
            return self._jitted[key]

    def options(self, backend: str | None = None, *, xla_defaults: bool = False) -> dict:
        """The options :meth:`jitted` compiles with on ``backend``: :attr:`cpu_options` on the
        CPU less those ``XLA_FLAGS`` sets and those the installed XLA lacks (:func:`xla_knows`),
        none elsewhere or with ``xla_defaults``."""
        import jax

        if xla_defaults or (backend or jax.default_backend()) != "cpu":
            return {}
        flags = os.environ.get("XLA_FLAGS", "")
        return {name: value for name, value in self.cpu_options.items()
                if f"--{name}=" not in flags and xla_knows(name, value)}

    @property
    def static_argnums(self) -> tuple[int, ...]:
        """The ``static_argnums`` given to ``jax.jit``."""
        return self._argnums("static_argnums")

    @property
    def donate_argnums(self) -> tuple[int, ...]:
        """The ``donate_argnums`` given to ``jax.jit``."""
        return self._argnums("donate_argnums")

    def _argnums(self, name: str) -> tuple[int, ...]:
        numbers = self._jit_kwargs.get(name, ())
        return (numbers,) if isinstance(numbers, int) else tuple(numbers)

    def __call__(self, *args, **kwargs):
        return self.jitted()(*args, **kwargs)

    def lower(self, *args, **kwargs):
        """``jax.jit(...).lower`` of the default backend's jitted function."""
        return self.jitted().lower(*args, **kwargs)
