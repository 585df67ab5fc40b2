"""Progress of a training run: the bar over the epochs and the lines that tell what happens.

:class:`ProgressLog` (a tqdm bar on a terminal, log lines otherwise, at least every
:attr:`ProgressLog.LINE_EVERY_S` without a bar), :func:`report_compiled` (what the first call's
compilation took) and :func:`time_left` (the estimate from the steps after it).
"""

from __future__ import annotations

import time

from tqdm import tqdm

__all__ = ["ProgressLog", "time_left", "report_compiled"]


class ProgressLog:
    """A tqdm bar over the epochs (stderr, only on a terminal) and log lines that do not garble
    it. A context manager; :meth:`emit` logs a line, :meth:`epoch_done` moves the bar,
    :meth:`restart_clock` starts its rate and ETA afresh (after the first call, which compiles).

    The bar's rate is the average since the clock started (no smoothing): an epoch that
    included seconds of compilation would otherwise show a rate and an ETA far off for a while.
    """

    #: Without a bar (not a terminal: a log, a pipe, a notebook's ``!``), an epoch line is logged
    #: at least this often, besides every ``log_every`` epochs.
    LINE_EVERY_S = 10.0

    def __init__(self, epochs: int, *, desc: str, progress: bool, log, initial: int = 0):
        # Updated by hand, not by iterating: tqdm's iterator syncs its count only when it
        # redraws, so a bar redrawn after a log line would show a stale epoch.
        self.bar = tqdm(total=epochs, initial=initial, desc=desc, unit="epoch",
                        disable=None if progress else True, leave=False, smoothing=0)
        self.log = log
        self.last_line = time.monotonic()

    def __enter__(self) -> ProgressLog:
        return self

    def __exit__(self, *exc_info) -> None:
        self.bar.close()

    @property
    def terminal(self) -> bool:
        """Whether the bar is shown (a terminal, and progress asked for)."""
        return not self.bar.disable

    def quiet_for(self) -> float:
        """Seconds since the last line logged."""
        return time.monotonic() - self.last_line

    def emit(self, line: str) -> None:
        if self.log is None:
            return
        self.last_line = time.monotonic()
        if self.bar.disable:
            self.log(line)
        else:
            with tqdm.external_write_mode():
                self.log(line)

    def epoch_done(self, **postfix) -> None:
        self.bar.set_postfix(refresh=False, **postfix)
        self.bar.update(1)

    def restart_clock(self) -> None:
        """Rate and ETA from now on: the epochs done so far (and their compilation) left out."""
        if self.bar.disable:
            return
        self.bar.initial = self.bar.n
        self.bar.start_t = self.bar.last_print_t = self.bar._time()
        self.bar.refresh()


def time_left(step: int, total: int, clock: tuple[float, int] | None) -> str:
    """``", about N s left"`` for ``step`` of ``total`` steps done, from the rate since
    ``clock = (time.perf_counter(), step)`` (taken at the end of the first call, which
    compiles), or ``""`` before there is a rate or at the end."""
    if clock is None or step == total or step == clock[1]:
        return ""
    per_step = (time.perf_counter() - clock[0]) / (step - clock[1])
    seconds = per_step * (total - step)
    if seconds >= 120:
        return f", about {seconds / 60:.0f} min left"
    return f", about {seconds:.0f} s left" if seconds >= 10 else f", about {seconds:.1f} s left"


def report_compiled(bar: ProgressLog, timer, steps: int, seconds: float) -> None:
    """The line after the first call: what compiling (or loading it from the cache) took;
    ``timer``: the :class:`~jax_attention.runtime.compilation.CompileTimer` of that call."""
    how = ("loaded the training step from the compilation cache" if timer.cache_hits
           else "compiled the training step")
    bar.emit(f"{how} in {timer.seconds:.1f} s; the first {steps} step{'s' if steps != 1 else ''} "
             f"took {seconds:.1f} s with it")
