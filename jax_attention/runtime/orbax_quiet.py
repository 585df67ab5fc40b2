"""Keeping Orbax's and TensorStore's own failure reports off stderr, during Orbax calls only.

Orbax and TensorStore report their own failures on stderr: Orbax logs every error of its
background threads (with tracebacks) through ``absl.logging``; a failed synchronous Orbax call
closes its ``asyncio`` event loop while other TensorStore reads or writes are in flight, and each
of them then calls ``loop.call_soon_threadsafe`` on the closed loop — a ``RuntimeError: Event loop
is closed`` traceback printed by ``sys.unraisablehook``, from a TensorStore thread, during the
call or later — and its task, collected later, is reported by asyncio's exception handler ("Task
exception was never retrieved"): dozens to hundreds of lines for one damaged checkpoint, whose
error is raised anyway.

Inside :func:`quiet_orbax` (what :mod:`jax_attention.runtime.checkpointing` wraps each of its
Orbax calls in), the records logged from Orbax's own files are dropped and the event loops that
Orbax's files create are made quiet once closed (a callback for them is dropped, their tasks'
reports too: the coroutine that wanted the result is gone, its error is the one raised); after a
failed call, Orbax's background threads are waited for before the logging filter is removed.
Nothing else is filtered: the records of other code pass, and the event loops of other code
(another thread's, made during such a call) are left as made.

Two process-wide objects are touched, each only while some thread is inside :func:`quiet_orbax`
and each put back as it was when the last one leaves: a filter on the ``absl`` and root loggers
(the loggers Orbax logs to) and the ``new_event_loop`` of asyncio's event-loop policy (the one
place Orbax's loops pass through before Orbax closes them). What stays changed afterwards is
Orbax's own closed loops, which nothing else uses.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import threading
import time
import warnings

__all__ = ["quiet_orbax", "DropOrbaxRecords", "quiet_when_closed", "join_new_orbax_threads"]


class DropOrbaxRecords(logging.Filter):
    """A logging filter that drops the records made in Orbax's own files (under ``roots``: the
    directories of the ``orbax`` package, each ending with a separator)."""

    def __init__(self, roots: tuple[str, ...]):
        super().__init__()
        self.roots = roots

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.pathname.startswith(self.roots)


def quiet_when_closed(loop: asyncio.AbstractEventLoop) -> None:
    """Once ``loop`` is closed, make ``loop.call_soon_threadsafe`` drop the callback instead of
    raising ``RuntimeError: Event loop is closed`` (the TensorStore futures that call it belong
    to a coroutine that has ended), and drop the reports of its tasks collected later ("Task
    exception was never retrieved": the other reads of a failed ``gather``, whose error is the
    one raised; "Task was destroyed but it is pending")."""
    original = loop.call_soon_threadsafe

    def exception_handler(loop, context):
        if not loop.is_closed():
            loop.default_exception_handler(context)

    loop.set_exception_handler(exception_handler)

    def call_soon_threadsafe(callback, *args, context=None):
        try:
            return original(callback, *args, context=context)
        except RuntimeError:
            if loop.is_closed():
                return None
            raise

    loop.call_soon_threadsafe = call_soon_threadsafe


def join_new_orbax_threads(before: set, timeout: float = 30.0) -> None:
    """Wait (at most ``timeout`` seconds in all) for the Orbax threads started since ``before``
    (a set of ``threading.enumerate()``): after a failed call they may still be finishing, and
    logging their own error."""
    deadline = time.monotonic() + timeout
    for thread in threading.enumerate():
        if (thread not in before and thread is not threading.current_thread()
                and type(thread).__module__.startswith("orbax.")):
            # Thread.join itself: Orbax's thread class re-raises its error from join().
            threading.Thread.join(thread, max(0.0, deadline - time.monotonic()))


class _Scope:
    """Who is inside :func:`quiet_orbax` (re-entrant, shared by threads) and how to undo the
    quieting when the last one leaves."""

    lock = threading.Lock()
    depth = 0
    undo: tuple = ()


# A marker for "the policy had no attribute of its own", which ``None`` cannot say.
_ABSENT = object()
# asyncio's own folder: its frames (``asyncio.new_event_loop``) stand between a loop's maker and
# the policy's ``new_event_loop``.
_ASYNCIO_ROOT = os.path.join(os.path.dirname(os.path.abspath(asyncio.__file__)), "")


def _orbax_roots() -> tuple[str, ...]:
    """The folders of the ``orbax`` package, each ending with a separator."""
    import orbax

    return tuple(os.path.join(os.path.abspath(path), "") for path in orbax.__path__)


def _made_under(frame, roots: tuple[str, ...]) -> bool:
    """Whether the code that called asyncio from ``frame`` (its first frame outside asyncio's
    files) is in one of the folders ``roots``."""
    while frame is not None and frame.f_code.co_filename.startswith(_ASYNCIO_ROOT):
        frame = frame.f_back
    return frame is not None and frame.f_code.co_filename.startswith(roots)


def _drop_records(roots: tuple[str, ...]) -> list:
    """Drop the records made in Orbax's files; returns the calls that undo it."""
    records = DropOrbaxRecords(roots)
    undo = []
    # Orbax logs through absl (the ``absl`` logger) and, in a few files (its sharding metadata),
    # through ``logging.error``: the root logger, process-wide, is one of its loggers. A logger's
    # filters see only the records made on that logger, so no narrower place catches them; the
    # filter drops no other code's records and is removed when the last call leaves.
    for logger in (logging.getLogger("absl"), logging.getLogger()):
        logger.addFilter(records)
        undo.append(lambda logger=logger: logger.removeFilter(records))
    return undo


def _quiet_orbax_loops(roots: tuple[str, ...]) -> list:
    """Make the event loops that Orbax's files create from now on quiet once closed; returns the
    calls that undo it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the policy API, Python >= 3.14
        policy = asyncio.get_event_loop_policy()
    before = policy.__dict__.get("new_event_loop", _ABSENT)
    new_event_loop = policy.new_event_loop

    def quiet_new_event_loop():
        loop = new_event_loop()
        if _made_under(inspect.currentframe().f_back, roots):
            quiet_when_closed(loop)
        return loop

    # Process-wide for the call, and unavoidable: Orbax makes each loop inside its call with
    # asyncio.new_event_loop() (no loop factory to pass) and closes it before returning, while
    # TensorStore's callbacks reach it later; the policy is the one place a new loop passes
    # through. Only loops made by Orbax's own files are changed, the others pass as made.
    try:
        policy.new_event_loop = quiet_new_event_loop
    except AttributeError:  # a policy without instance attributes: the loops stay as they are
        return []

    def restore():
        if policy.__dict__.get("new_event_loop") is quiet_new_event_loop:
            if before is _ABSENT:
                del policy.new_event_loop
            else:
                policy.new_event_loop = before

    return [restore]


def _silence() -> list:
    """Drop Orbax's records (``absl`` and root loggers) and make the event loops Orbax creates
    from now on quiet once closed; returns the calls that undo it, in order of doing. Where a
    step fails, what was done is undone before the error is raised."""
    roots = _orbax_roots()
    undo = []
    try:
        undo += _drop_records(roots)
        undo += _quiet_orbax_loops(roots)
    except BaseException:
        for step in reversed(undo):
            step()
        raise
    return undo


@contextlib.contextmanager
def quiet_orbax():
    """The scope of an Orbax call (re-entrant, shared by threads): while anyone is inside, the
    records logged from Orbax's files are dropped (:class:`DropOrbaxRecords` on the ``absl`` and
    root loggers) and the event loops that Orbax's files create give up callbacks quietly once
    closed (:func:`quiet_when_closed`). An error leaving it first waits for the Orbax threads
    started inside (:func:`join_new_orbax_threads`); the last one out puts everything back as it
    was."""
    with _Scope.lock:
        if _Scope.depth == 0:
            _Scope.undo = tuple(_silence())
        _Scope.depth += 1
    before = set(threading.enumerate())
    try:
        yield
    except Exception:  # not on Ctrl-C: that interrupts at once
        join_new_orbax_threads(before)
        raise
    finally:
        with _Scope.lock:
            _Scope.depth -= 1
            if _Scope.depth == 0:
                for undo in reversed(_Scope.undo):
                    undo()
                _Scope.undo = ()
