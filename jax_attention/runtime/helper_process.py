"""A helper process, started ahead of need, that shares work with this one: the plots after training.

Matplotlib draws in Python, under the GIL: a thread cannot draw beside the main thread, a process
can. ``jax-attention train --out DIR`` writes four or five figures after training (~1.4 s for the
Transformer on one core); :class:`HelperProcess` draws about half of them on the other core.

* :meth:`HelperProcess.start` starts one worker process (``spawn``: a fresh interpreter, nothing
  of JAX's threads inherited) and waits until it has imported ``preload``. Call it from a
  background thread while the main thread is busy (``train_seq2seq(warm_up=...)``): its second
  or so of starting then costs nothing on the critical path.
* :meth:`HelperProcess.run` runs a list of tasks: every other *portable* task in the worker, the
  rest here, at the same time, and returns once all are done. A task the worker could not run (it
  was never started, or died) runs here instead, so the result never depends on the helper.
* :meth:`HelperProcess.close` stops the worker, after the task it is running.

Like every ``spawn`` worker of :mod:`multiprocessing`, the worker imports the main module of this
process first (as ``__mp_main__``): the ``jax-attention`` command's entry points are guarded by
``if __name__ == "__main__"``, and a script that starts a helper must be too.

Ctrl-C: the worker ignores SIGINT (it is blocked from its first instruction, since the starting
thread blocks it while spawning, and ignored once it runs), so a Ctrl-C in the terminal, which
reaches the whole process group, stops only the main process: :meth:`run` then waits for the
worker's current task (a file is written whole or not at all) and cancels the rest.
"""

from __future__ import annotations

import concurrent.futures
import gc
import importlib
import multiprocessing
import signal
import threading
from collections.abc import Callable, Sequence
from concurrent.futures.process import BrokenProcessPool

__all__ = ["Task", "HelperProcess"]


class Task:
    """One piece of work for :meth:`HelperProcess.run`: ``function(*args, **kwargs)``, its result
    dropped. ``portable``: it may run in the worker (a module-level function and arguments that
    pickle cheaply: arrays, strings); ``False`` keeps it here."""

    def __init__(self, function: Callable, *args, portable: bool = True, **kwargs):
        self.function, self.args, self.kwargs, self.portable = function, args, kwargs, portable

    def __call__(self) -> None:
        self.function(*self.args, **self.kwargs)


def _initialize(preload: tuple[str, ...]) -> None:
    """The worker's start: SIGINT ignored (the main process answers Ctrl-C), modules imported."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    for name in preload:
        importlib.import_module(name)
    # Imported for the worker's life: its collections (and its exit's final one, which
    # :meth:`HelperProcess.close` waits for) then walk only what its tasks make.
    gc.freeze()


def _ready() -> bool:
    return True


class HelperProcess:
    """One worker process for :class:`Task` lists (module docstring). ``preload``: the modules
    the worker imports once it starts (e.g. ``("jax_attention.viz.plotting",)``)."""

    def __init__(self, preload: Sequence[str] = ()):
        self._preload = tuple(preload)
        self._executor: concurrent.futures.ProcessPoolExecutor | None = None
        self._lock = threading.Lock()

    def start(self) -> bool:
        """Start the worker and wait until it has imported ``preload``; returns whether it is up
        (``False``: it could not start, and every task will run here)."""
        with self._lock:
            if self._executor is not None:
                return True
            # The worker inherits this thread's signal mask: blocked, a Ctrl-C that comes while
            # it starts cannot end it with a traceback before _initialize ignores SIGINT.
            blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
            executor = None
            try:
                executor = concurrent.futures.ProcessPoolExecutor(
                    max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                    initializer=_initialize, initargs=(self._preload,))
                executor.submit(_ready).result()
            except Exception:  # noqa: BLE001 - no helper: every task runs here
                if executor is not None:
                    executor.shutdown(wait=True, cancel_futures=True)
                return False
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
            self._executor = executor
            return True

    def run(self, tasks: Sequence[Task]) -> None:
        """Run ``tasks``: every other portable one in the worker (when it is up), the others
        here, concurrently; return when all are done. The first error of a task (in either
        process) is raised once every task has ended; a task the worker could not run runs here.
        """
        with self._lock:
            executor = self._executor
        portable = [task for task in tasks if task.portable]
        sent = portable[::2] if executor is not None else []
        futures = []
        try:
            for task in sent:
                futures.append((task, executor.submit(task)))
        except (RuntimeError, BrokenProcessPool):  # shut down or broken: what was not sent stays
            sent = [task for task, _ in futures]
        errors, interrupted = [], True
        try:
            for task in tasks:
                if not any(task is other for other in sent):
                    try:
                        task()
                    except Exception as error:  # noqa: BLE001 - raised below, after the rest
                        errors.append(error)
            interrupted = False
        finally:
            if interrupted:  # a Ctrl-C: the worker's current task ends, the others are dropped
                for _, future in futures:
                    future.cancel()
            for task, future in futures:
                if future.cancelled():
                    continue
                try:
                    future.result()
                except BrokenProcessPool:  # the worker died: its task runs here
                    if not interrupted:
                        try:
                            task()
                        except Exception as error:  # noqa: BLE001 - raised below
                            errors.append(error)
                except Exception as error:  # noqa: BLE001 - raised below
                    errors.append(error)
        if errors:
            raise errors[0]

    def close(self) -> None:
        """Stop the worker (after its current task); later :meth:`run` calls run every task
        here."""
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)
