"""Ctrl-C (SIGINT) for the commands: acknowledged at once, obeyed at a safe point, never a crash.

Python raises :class:`KeyboardInterrupt` wherever the main thread happens to be when it next runs
Python code — inside JAX's tracing, a compilation's callbacks, Orbax's save, interpreter
clean-up — and only once a long C++ call (an XLA compilation of many seconds) returns. An
exception in such places left the process in states that crashed it on exit (segmentation
faults) and made it look dead for seconds. :func:`handle_sigint` replaces that for a command:

- The signal never raises. Python's C-level handler writes it to a socket (``signal.
  set_wakeup_fd``) that a small thread waits on, so the signal is *seen at once*, even while the
  main thread compiles; the Python-level handler does nothing.
- ``graceful`` (training): the first Ctrl-C prints one line at once ("stopping after the current
  steps ...") and sets a request that the work checks at its safe points (:func:`requested`,
  :func:`request_event`): between compiled training calls, where a checkpoint can be saved, and between
  the phases of a run. A second Ctrl-C stops the process at once (``os._exit``, status 130) with
  one line that says what is on disk (:func:`set_note`).
- not ``graceful`` (translate, plot, bench, conformance: nothing to save half-way): the first
  Ctrl-C stops at once, the same way.

Stopping at once skips the interpreter's clean-up — which is where the crashes were — and loses
nothing: every file the commands write is written to a temporary name and renamed into place
(exports, JSON, training checkpoints), so a stop leaves the old file or the new one, never half
of one (a leftover temporary is removed or ignored by the next run).

In Python code that does not use :func:`handle_sigint`, nothing changes: Ctrl-C raises
:class:`KeyboardInterrupt` (the training loop turns the first one into a checkpoint when it keeps
checkpoints, :func:`jax_attention.train.loop.sigint_requests`).

A test hook, for the test suite only: the commands mark the phases of their work with
:func:`phase` (:data:`PHASES`), and ``JAX_ATTENTION_TEST_SIGINT`` (:data:`TEST_SIGINT_VARIABLE`)
names the phases at which the process presses Ctrl-C on itself, so that the tests stop a run in
a named phase instead of after a guessed number of seconds. Unset, :func:`phase` does nothing.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator

__all__ = ["EXIT_INTERRUPTED", "handle_sigint", "stop_outside_commands", "ignore_from_now", "finish",
           "active", "requested", "request_event", "set_note", "resume_command", "Interrupted",
           "TEST_SIGINT_VARIABLE", "PHASES", "phase"]

#: The exit status after Ctrl-C: 128 + SIGINT, what a shell reports for a program it stopped.
EXIT_INTERRUPTED = 128 + signal.SIGINT


class Interrupted(KeyboardInterrupt):
    """Raised at a safe point after a Ctrl-C was requested; the message says what was kept."""


class _Handler:
    """The state of one :func:`handle_sigint`: the request, the note and the watcher thread."""

    def __init__(self, prog: str, graceful: bool, acknowledgement: str,
                 resume_command: str | None):
        self.prog = prog
        self.resume_command = resume_command
        self.graceful = graceful
        self.acknowledgement = acknowledgement
        self.event = threading.Event()
        self.note = ""
        self.count = 0  # the Ctrl-Cs acted on
        self.received = 0  # every SIGINT the watcher took, acted on or ignored (the test hook)
        # Held while a Ctrl-C is acted on, and by :func:`finish`: the command's last line and
        # a stop at once never both print.
        self.lock = threading.Lock()
        self.finished = False
        self.reader, self.writer = socket.socketpair()
        self.reader.setblocking(True)
        self.writer.setblocking(False)
        self.thread = threading.Thread(target=self._watch, name="jax-attention-sigint",
                                       daemon=True)

    def _watch(self) -> None:
        while True:
            try:
                data = self.reader.recv(64)
            except OSError:
                return
            if not data or 0 in data:  # closed, or the stop byte of :meth:`stop`
                return
            for number in data:
                if number == signal.SIGINT:
                    self._on_sigint()

    def _on_sigint(self) -> None:
        with self.lock:
            self.received += 1
            if self.finished:  # the command has said its last line: nothing to stop
                return
            self.count += 1
            if self.graceful and self.count == 1:
                self.event.set()
                _write_line(f"{self.prog}: Ctrl-C: {self.acknowledgement}; press Ctrl-C again "
                            "to stop at once")
                return
            # Stop now: say what is on disk, flush what the command printed, and leave without
            # the interpreter's clean-up (threads of XLA or Orbax may be mid-call). The lock is
            # never released: the process ends here.
            stopped = "stopped at once" if self.count > 1 else "stopped"
            note = f"; {self.note}" if self.note else ""
            with contextlib.suppress(Exception):
                sys.stdout.flush()
            _write_line(f"{self.prog}: interrupted (Ctrl-C), {stopped}{note}")
            os._exit(EXIT_INTERRUPTED)

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self.writer.send(b"\0")
        self.thread.join(timeout=5)
        self.reader.close()
        self.writer.close()


def _write_line(line: str) -> None:
    """``line`` to stderr in one system call, past Python's buffers (a thread may hold them)."""
    try:
        descriptor = sys.__stderr__.fileno()
    except (AttributeError, OSError, ValueError):  # no real stderr object: the process's own
        descriptor = 2
    with contextlib.suppress(OSError):
        os.write(descriptor, (line + "\n").encode())


_active: _Handler | None = None
# What a Ctrl-C outside :func:`handle_sigint` says (:func:`stop_outside_commands`); ``when``
# None: nothing, the Ctrl-C is ignored (the command has said its last line).
_outside = {"prog": "jax-attention", "when": "while starting; nothing was done"}


def _stop_outside(signum, frame) -> None:
    if _outside["when"] is None:  # the command said its last line (finish)
        return
    _write_line(f"{_outside['prog']}: interrupted (Ctrl-C) {_outside['when']}")
    os._exit(EXIT_INTERRUPTED)  # mid-import or at exit: no clean-up of half-done modules


def ignore_from_now() -> None:
    """Ignore SIGINT from now on (the process is exiting; its status is decided)."""
    with contextlib.suppress(ValueError):  # off the main thread: nothing to do
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def finish() -> None:
    """The command is about to print its last line (after a stop at a safe point): a Ctrl-C
    from now on is ignored (until the next command), and one already being acted on ends the
    process before that line, so that exactly one of the two is printed."""
    if _active is not None:
        with _active.lock:
            _active.finished = True


def stop_outside_commands(prog: str) -> None:
    """Outside :func:`handle_sigint` — while Python imports JAX (a second or more) and parses
    the command line, and after the command until :func:`ignore_from_now` — a Ctrl-C ends the
    process at once with status 130 and one line, not with Python's ``KeyboardInterrupt``
    traceback and a death by signal. Installed only over Python's default handler (an ignored
    SIGINT stays ignored)."""
    _outside["prog"] = prog
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _stop_outside)


@contextlib.contextmanager
def handle_sigint(prog: str, *, graceful: bool,
                  acknowledgement: str = "stopping at the next safe point",
                  resume_command: str | None = None) -> Iterator[None]:
    """Handle Ctrl-C as the module docstring says, for the ``with`` block.

    Nothing is installed off the main thread (Python runs signal handlers there only), when
    SIGINT is ignored (``nohup``, a background job) or when a handler is active already.

    Args:
      prog: the command's name, the start of the lines printed.
      graceful: the first Ctrl-C is a request (see :func:`requested`), the second stops at
        once; otherwise the first stops at once.
      acknowledgement: what the first Ctrl-C prints in ``graceful`` mode, after "Ctrl-C: ".
      resume_command: the command line that continues the run (see :func:`set_note`).
    """
    global _active
    previous = signal.getsignal(signal.SIGINT)
    if (_active is not None or threading.current_thread() is not threading.main_thread()
            or previous in (signal.SIG_IGN, None)):
        yield
        return
    handler = _Handler(prog, graceful, acknowledgement, resume_command)
    handler.thread.start()
    signal.signal(signal.SIGINT, lambda signum, frame: None)  # the watcher does the work
    old_fd = signal.set_wakeup_fd(handler.writer.fileno(), warn_on_full_buffer=False)
    _active = handler
    try:
        yield
    finally:
        _active = None
        _outside["when"] = None if handler.finished else "as the command was ending"
        signal.set_wakeup_fd(old_fd)
        signal.signal(signal.SIGINT, previous)
        handler.stop()


def active() -> bool:
    """Whether :func:`handle_sigint` is in force (the command line handles Ctrl-C)."""
    return _active is not None


def request_event() -> threading.Event | None:
    """The event the first Ctrl-C sets under a graceful :func:`handle_sigint`, else ``None``."""
    return _active.event if _active is not None and _active.graceful else None


def requested() -> bool:
    """Whether a Ctrl-C asked the command to stop at its next safe point."""
    return _active is not None and _active.event.is_set()


def set_note(note: str, *, resumable: bool = False) -> None:
    """What a stop at once says is on disk (e.g. "training checkpoint 8 in DIR is the newest");
    the empty string for nothing to say. ``resumable``: the note is followed by the command that
    resumes the run, when :func:`handle_sigint` was given one."""
    if _active is not None:
        command = _active.resume_command
        _active.note = note + (f"; resume with: {command}" if resumable and command else "")


def resume_command() -> str | None:
    """The command line that resumes the run, as :func:`handle_sigint` was given it."""
    return None if _active is None else _active.resume_command


# --------------------------------------------------------------------------- the test hook

#: Test-only (tests/test_interrupts.py): ``PHASE[:N]`` entries separated by commas. When the
#: process enters the ``N``-th (default: the first) ``PHASE`` it sends itself SIGINT, once per
#: entry, and waits until the Ctrl-C handling has taken it, as if the user had pressed Ctrl-C at
#: that moment: ``steps:2`` is a Ctrl-C as the third compiled call of training steps starts,
#: ``save,save`` two at the first checkpoint save (the second stops at once). Not for users.
TEST_SIGINT_VARIABLE = "JAX_ATTENTION_TEST_SIGINT"

#: The phases the commands mark with :func:`phase`, in the order a training run meets them:
#: ``startup`` (Python imports JAX), ``compile`` (the first compiled call of training steps),
#: ``steps`` (each later call), ``save`` (a training checkpoint), ``evaluation`` (the trained
#: model's translations; ``translate``'s decoding), ``export`` (the trained model), ``plots``,
#: ``report`` (the ``--json`` file).
PHASES = ("startup", "compile", "steps", "save", "evaluation", "export", "plots", "report")

_entered: dict[str, int] = {}


def phase(name: str) -> None:
    """Mark that the command enters phase ``name`` of :data:`PHASES` (for the test hook: see
    :data:`TEST_SIGINT_VARIABLE`; without it, nothing happens)."""
    entries = os.environ.get(TEST_SIGINT_VARIABLE, "").strip()
    if not entries:
        return
    count = _entered[name] = _entered.get(name, 0) + 1
    for entry in entries.split(","):
        wanted, _, nth = entry.strip().partition(":")
        if wanted not in PHASES or not (nth or "1").isdigit():
            raise ValueError(f"{TEST_SIGINT_VARIABLE}: {entry!r} is not PHASE[:N] with PHASE one "
                             f"of {', '.join(PHASES)}")
        if wanted == name and int(nth or 1) == count:
            _press_ctrl_c()


def _press_ctrl_c() -> None:
    """SIGINT to this process, returning once it is handled: outside :func:`handle_sigint`
    Python runs the handler before ``raise_signal`` returns; under it, the watcher thread has
    acted on it (a stop at once never returns)."""
    handler = _active
    seen = None if handler is None else handler.received
    signal.raise_signal(signal.SIGINT)
    if handler is None:
        return
    deadline = time.monotonic() + 30
    while handler.received == seen and time.monotonic() < deadline:
        time.sleep(0.001)
    with handler.lock:  # held while the watcher acts on it (for good, when it stops at once)
        pass
