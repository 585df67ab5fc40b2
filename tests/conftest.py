"""Shared test set-up: strict promotion, key-reuse checks, backends, float64, matmul precision.

Strict dtype and rank promotion (as in Equinox's test suite) make any implicit broadcast or
dtype promotion inside the library an error, so the code under test states every cast.
"""

from __future__ import annotations

import functools
import json

import jax
import pytest

jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_numpy_dtype_promotion", "strict")
# Every comparison in the suite is at float32 or float64 tolerance; GPUs would otherwise multiply
# float32 matrices in TF32 (about 1e-3 relative). The `highest_precision` fixture below states it
# again where a test is about precision.
jax.config.update("jax_default_matmul_precision", "highest")
# Every PRNG key in the suite and the library is a typed key (`jax.random.key`, never the legacy
# uint32 `PRNGKey`), which lets JAX track its use: drawing twice from one key (two dropout masks
# from the same key, say) raises `jax.errors.KeyReuseError` instead of silently repeating or
# correlating the draws. tests/test_randomness.py checks that no legacy key is left.
jax.config.update("jax_debug_key_reuse", True)

PLATFORMS = ("cpu", "gpu", "tpu")


@functools.cache
def _platforms() -> tuple[tuple[str, ...], dict[str, str]]:
    """The platforms of PLATFORMS that JAX has here, and why each of the others is missing.

    Asking initialises JAX's backends in this process (each xdist worker collects on its own);
    the subprocesses of tests/test_distributed.py start their own JAX with their own XLA_FLAGS.
    """
    present, absent = [], {}
    for platform in PLATFORMS:
        try:
            jax.devices(platform)
        except RuntimeError as error:
            absent[platform] = str(error)
        else:
            present.append(platform)
    return tuple(present), absent


def pytest_generate_tests(metafunc):
    """A test that uses ``backend`` runs once per platform JAX has; the platforms it lacks get no
    parametrisation at all (one line in the terminal summary says which, instead of a skip per
    test and platform)."""
    if "backend" in metafunc.fixturenames:
        present, _ = _platforms()
        metafunc.parametrize("backend", present, indirect=True, ids=present)


@pytest.fixture
def backend(request):
    """The device of the platform under test (see :func:`pytest_generate_tests`), made JAX's
    default device for the test."""
    device = jax.devices(request.param)[0]
    with jax.default_device(device):
        yield device


_OMITTED = "jax_attention_omitted_backend_parametrisations"
_OMITTED_KEY = pytest.StashKey[dict]()


def _backend_of(item):
    callspec = getattr(item, "callspec", None)
    return callspec.params.get("backend") if callspec is not None else None


def pytest_collection_finish(session):
    """Counts the parametrisations the absent platforms would have added: for each absent
    platform, one per selected test on a present one."""
    runs = [_backend_of(item) for item in session.items]
    record = {"absent": {}, "omitted": 0}
    if any(runs):
        present, absent = _platforms()
        record = {"absent": absent, "omitted": runs.count(present[0]) * len(absent)}
    session.config.stash[_OMITTED_KEY] = record
    if hasattr(session.config, "workeroutput"):  # an xdist worker: tell the controller
        session.config.workeroutput[_OMITTED] = json.dumps(record)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """xdist's controller collects nothing itself: it takes the workers' count (each worker
    collects the whole suite, so any one of them has it)."""
    record = getattr(node, "workeroutput", {}).get(_OMITTED)
    if record is not None:
        node.config.stash[_OMITTED_KEY] = json.loads(record)


def pytest_terminal_summary(terminalreporter, config):
    record = config.stash.get(_OMITTED_KEY, None)
    if record and record["absent"]:
        reasons = "; ".join(f"{platform}: {_short(reason)}"
                            for platform, reason in record["absent"].items())
        terminalreporter.write_line(
            f"platforms not run: {', '.join(record['absent'])} (no such backend on this "
            f"machine; {reasons}); {record['omitted']} parametrisations omitted")


def _short(reason: str) -> str:
    """The first sentence of JAX's error, without the list of platforms it repeats."""
    return reason.split(". ")[0].split(": INTERNAL")[0]


@pytest.fixture
def x64():
    """Run the test with 64-bit JAX types, to compare against the float64 NumPy reference."""
    with jax.enable_x64(True):
        yield


@pytest.fixture
def highest_precision():
    """Full-precision matmuls (GPUs otherwise default to TF32) for equivalence tests."""
    with jax.default_matmul_precision("highest"):
        yield


@pytest.fixture(scope="session")
def data_path():
    """The English–French corpus, found as the CLI finds it (``$JAX_ATTENTION_DATA``, then
    ``shared/data/fra-eng.zip`` beside the checkout, then the user cache; DESIGN.md, Data)."""
    from jax_attention import data

    return data.find_data()
