"""The quieting of Orbax (:func:`jax_attention.runtime.orbax_quiet.quiet_orbax`), in process: what
it changes, only for Orbax's records and loops, and that everything is put back after the call.

Code "in Orbax's files" is simulated by compiling a snippet under a file name inside the
``orbax`` package's folder (the file need not exist: logging and the loop hook read only the
code's file name), so that no Orbax call is needed; tests/test_checkpoint_faults.py checks the
real noise of real Orbax calls.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading

import orbax
import pytest

from jax_attention.runtime.orbax_quiet import DropOrbaxRecords, quiet_orbax

ORBAX_FILE = os.path.join(os.path.abspath(orbax.__path__[0]), "not_a_real_module.py")


def _in_orbax(source: str) -> dict:
    """Run ``source`` as if it were code of an Orbax file; returns its namespace."""
    namespace: dict = {}
    exec(compile(source, ORBAX_FILE, "exec"), namespace)  # noqa: S102 - the test's own code
    return namespace


def _policy():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the policy API, Python >= 3.14
        return asyncio.get_event_loop_policy()


def _global_state() -> tuple:
    """What quiet_orbax may change: the absl and root loggers' filters, the policy's own
    attributes."""
    policy = _policy()
    return (list(logging.getLogger("absl").filters), list(logging.getLogger().filters),
            policy, dict(vars(policy)))


def _closed_loop_raises(loop: asyncio.AbstractEventLoop) -> bool:
    loop.close()
    try:
        loop.call_soon_threadsafe(print)
    except RuntimeError as error:
        assert str(error) == "Event loop is closed"
        return True
    return False


class _Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.fixture
def records():
    """The messages that reach the root logger's handlers (absl's records propagate there)."""
    handler = _Records()
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield handler.messages
    finally:
        root.removeHandler(handler)


def test_the_filters_and_the_loop_hook_are_there_only_during_the_call():
    before = _global_state()
    with quiet_orbax():
        absl_filters, root_filters, policy, attributes = _global_state()
        assert [type(f) for f in absl_filters[len(before[0]):]] == [DropOrbaxRecords]
        assert [type(f) for f in root_filters[len(before[1]):]] == [DropOrbaxRecords]
        assert "new_event_loop" in attributes and "new_event_loop" not in before[3]
    assert _global_state() == before


def test_everything_is_put_back_after_a_failed_call_and_after_ctrl_c():
    before = _global_state()
    for error in (ValueError("Orbax failed"), KeyboardInterrupt()):
        with pytest.raises(type(error)):
            with quiet_orbax():
                raise error
        assert _global_state() == before


def test_nested_and_concurrent_calls_put_back_only_when_the_last_one_leaves():
    before = _global_state()
    entered, leave = threading.Event(), threading.Event()

    def other_call():
        with quiet_orbax():
            entered.set()
            leave.wait(30)

    thread = threading.Thread(target=other_call)
    thread.start()
    try:
        assert entered.wait(30)
        inside = _global_state()
        with quiet_orbax():
            with quiet_orbax():
                assert _global_state() == inside  # one filter each, one hook, not stacked
        assert _global_state() == inside  # the other thread is still inside
    finally:
        leave.set()
        thread.join(30)
    assert _global_state() == before


def test_only_the_records_made_in_orbax_files_are_dropped(records):
    log = ('import logging\n'
           'logging.getLogger().error("orbax via logging")\n'
           'logging.getLogger("absl").error("orbax via absl")\n')
    with quiet_orbax():
        _in_orbax(log)
        logging.getLogger().error("ours via logging")
        logging.getLogger("absl").error("ours via absl")
    assert records == ["ours via logging", "ours via absl"]
    records.clear()
    _in_orbax(log)  # after the call, Orbax's records pass again
    assert records == ["orbax via logging", "orbax via absl"]


def test_only_the_event_loops_made_in_orbax_files_are_made_quiet():
    make = "import asyncio\nloop = asyncio.new_event_loop()\n"
    with quiet_orbax():
        orbax_loop = _in_orbax(make)["loop"]
        other_loop = asyncio.new_event_loop()
    assert not _closed_loop_raises(orbax_loop)  # the callback is dropped, quietly
    assert "call_soon_threadsafe" not in vars(other_loop)
    assert _closed_loop_raises(other_loop)
    after = _in_orbax(make)["loop"]  # after the call, Orbax's loops are left as made
    assert "call_soon_threadsafe" not in vars(after)
    assert _closed_loop_raises(after)


def test_a_loop_made_by_another_thread_during_the_call_is_left_as_made():
    made = []
    with quiet_orbax():
        thread = threading.Thread(target=lambda: made.append(asyncio.new_event_loop()))
        thread.start()
        thread.join(30)
    assert "call_soon_threadsafe" not in vars(made[0])
    assert _closed_loop_raises(made[0])


def test_a_new_event_loop_set_on_the_policy_before_is_used_and_kept():
    policy = _policy()
    made = []

    def theirs():
        loop = asyncio.DefaultEventLoopPolicy.new_event_loop(policy)
        made.append(loop)
        return loop

    policy.new_event_loop = theirs
    try:
        with quiet_orbax():
            loop = _in_orbax("import asyncio\nloop = asyncio.new_event_loop()\n")["loop"]
        assert made == [loop] and not _closed_loop_raises(loop)
        assert vars(policy)["new_event_loop"] is theirs
    finally:
        del policy.new_event_loop
