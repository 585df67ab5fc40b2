"""``python -m jax_attention`` and the ``jax-attention`` command (its console script's entry).

Ctrl-C is handled from the first moment: while Python imports JAX (a second or more), parses
the command line, a Ctrl-C ends the process at once with status 130 and one line
(:func:`jax_attention.runtime.interrupts.stop_outside_commands`); once the command has ended, Ctrl-C is
ignored while the interpreter shuts down; while the command runs,
:func:`jax_attention.runtime.interrupts.handle_sigint` takes over (see :func:`jax_attention.cli.main`).
"""

import gc
import sys

from jax_attention.runtime import interrupts  # imports no JAX


def main() -> int:
    """Run ``jax-attention`` with ``sys.argv``; returns the exit status."""
    interrupts.stop_outside_commands("jax-attention")
    interrupts.phase("startup")
    from jax_attention.cli import main as run

    # The modules imported so far (JAX's above all) live as long as the process: frozen, the
    # collector's full passes during the command no longer walk them (~0.2 s of a training run).
    gc.freeze()
    status = run()
    # The command is over; the interpreter's shutdown (JAX's and Orbax's threads, the backends)
    # must not die by a late Ctrl-C: Python's finalization stops running signal handlers, and a
    # SIGINT there would end the process by the signal.
    interrupts.ignore_from_now()
    # Nor wait on the collector: the shutdown's final full pass would walk every object of the
    # run (JAX's traces and caches, Matplotlib's figures), ~0.4 s after a training run. Frozen
    # objects are still released by reference counting; only unreachable cycles are left to the
    # operating system, as at any exit, and every output is written and closed by now.
    gc.freeze()
    return status


if __name__ == "__main__":
    sys.exit(main())
