"""Shared test set-up: strict promotion, key-reuse checks, backends, float64, matmul precision.

Strict dtype and rank promotion (as in Equinox's test suite) make any implicit broadcast or
dtype promotion inside the library an error, so the code under test states every cast.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import tempfile

from tests import compiler_support

compiler_support.apply()  # before JAX starts a backend: XLA reads XLA_FLAGS once

import jax
import pytest

from tests import hypothesis_support  # noqa: F401 - loads the hypothesis profile (ci or dev)

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

# The tests never touch the internet: nothing in the session (the library, the commands, the
# subprocesses, which inherit the variable) downloads d2l's archive. The tests of the download
# opt in (monkeypatch.delenv, or a subprocess environment without it) against a local server on
# 127.0.0.1 (tests/test_download.py).
os.environ["JAX_ATTENTION_NO_DOWNLOAD"] = "1"


# One persistent compilation cache for the whole test session: the xdist workers and the
# subprocesses the tests start (the CLI, the distributed driver, the benchmark children) load the
# programs another process of the session has compiled already instead of compiling them again.
# It lives in a temporary directory made by the first process of the session (pytest itself, or
# the xdist controller before it starts the workers, which inherit the variables) and removed when
# the session ends, so every run starts cold and runs stay independent. Every program is
# written, the small ones too: a command the tests start compiles dozens of them (the model's
# initialisation, the data's eager operations), which the suite's one tiny configuration per
# model (tests/shared_runs.py) lets every later command load instead (a subprocess's set-up went
# from 2.8 s to 0.9 s). A loaded executable is the one the compiler produced, so bit-identical
# results are unaffected; key-reuse checks happen when tracing, before any cache.
#
# A JAX_COMPILATION_CACHE_DIR set by the user is used as it is, with every program written (unless
# JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS says otherwise): a cache kept across runs, for a
# quicker edit-test loop, at the user's choice, e.g.
#   JAX_COMPILATION_CACHE_DIR=~/.cache/jax-attention-tests make test
# (the key is the program, the compile options and the jax/jaxlib versions, so a changed program
# compiles afresh).
_CACHE_VARIABLE = "JAX_COMPILATION_CACHE_DIR"
_OWN_CACHE = _CACHE_VARIABLE not in os.environ
if _OWN_CACHE:
    os.environ[_CACHE_VARIABLE] = tempfile.mkdtemp(prefix="jax-attention-tests-compilation-cache-")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
jax.config.update("jax_compilation_cache_dir", os.environ[_CACHE_VARIABLE])
jax.config.update("jax_persistent_cache_min_compile_time_secs",
                  float(os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]))
jax.config.update("jax_persistent_cache_min_entry_size_bytes",
                  int(os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"]))


def pytest_unconfigure(config):
    if _OWN_CACHE:
        shutil.rmtree(os.environ.pop(_CACHE_VARIABLE), ignore_errors=True)


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
    """One line instead of a skip per test and absent platform, e.g. ``platforms not run: gpu
    (Unknown backend ...), tpu (Backend 'tpu' failed to initialize); 820 parametrisations
    omitted``."""
    record = config.stash.get(_OMITTED_KEY, None)
    if record and record["absent"]:
        absent = ", ".join(f"{platform} ({_short(reason)})"
                           for platform, reason in record["absent"].items())
        terminalreporter.write_line(f"platforms not run: {absent}; {record['omitted']} "
                                    "parametrisations omitted")


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
    ``shared/data/fra-eng.zip`` beside the checkout, then the user cache; docs/design.md,
    Data)."""
    from jax_attention.data import nmt as data

    return data.find_data()


@pytest.fixture(scope="session")
def shared_runs(tmp_path_factory, data_path):
    """The session's shared trained models (:mod:`tests.shared_runs`); at the end, each process
    checks that no test changed the files of one it used."""
    from tests.shared_runs import SharedRuns, shared_directory

    runs = SharedRuns(shared_directory(tmp_path_factory), data_path)
    yield runs
    changed = runs.check_unchanged()
    assert not changed, (f"a test changed the files of the shared runs {changed}; copy them "
                         "first (SharedRun.copy)")


@pytest.fixture(scope="session")
def tiny_run(shared_runs):
    """``tiny_run(kind)``: the session's tiny run of a registered model kind
    (:meth:`tests.shared_runs.SharedRuns.tiny`): export, training checkpoints, report, plots."""
    return shared_runs.tiny


@pytest.fixture(scope="session")
def book_run(shared_runs):
    """``book_run(kind)``: the session's run of a model at the book's settings, seed 0
    (:meth:`tests.shared_runs.SharedRuns.book`): export, report, printed lines."""
    return shared_runs.book


# The work units (modules, or classes of test methods) that take longest, longest first, as
# measured on a 2-core machine (`make test PYTEST_ARGS=--junitxml=FILE`, its times summed per
# unit; those of 4 s or more, with the suite's compiler flags of tests/compiler_support.py); they
# only order the work, so a stale entry costs balance, never a result. Under xdist (`make test`:
# `--dist loadscope --no-loadscope-reorder`) a worker takes one unit at a time in the order of
# the collection, and takes the next one while the last two tests of its unit run: starting with
# the long units (the longest-processing-time-first rule) leaves the short ones to fill in at the
# end, so that no worker is still in a long unit while the other sits idle. The remaining units
# follow, those with the most tests first (xdist's own default order).
LONGEST_FIRST = (
    "test_seq2seq_trainer.py",
    "test_interrupts.py",
    "test_bench_train.py",
    "test_tutorials.py::TestNotebook_tutorials_bahdanau",
    "crossframework/test_flex_mods.py",
    "test_resume.py",
    "test_transformer.py",
    "test_long_run_faults.py",
    "test_tutorials.py::TestNotebook_tutorials_transformer",
    "test_download.py",
    "test_bench_attention.py",
    "test_scoring.py",
    "test_mods.py",
    "test_efficient.py",
    "parity/test_scoring.py",
    "crossframework/test_conformance_jax.py",
    "crossframework/test_readme_outputs_torch.py",
    "test_readme.py",
    "test_pinned_losses.py",
    "test_cli_reference.py",
    "parity/test_multihead.py",
    "crossframework/test_conformance_torch.py",
    "parity/test_mods.py",
    "test_checkpoint_faults.py",
    "crossframework/test_conformance_flax.py",
    "test_tutorials.py::TestNotebook_tutorials_self_attention",
    "test_tutorials.py::TestNotebook_tutorials_multihead_attention",
    "test_bench_decode.py",
    "test_api.py",
    "test_tutorials.py::TestNotebook_tutorials_attention_scoring",
    "test_low_precision.py",
    "test_conformance.py",
    "test_multihead.py",
    "parity/test_transformer.py",
    "test_bahdanau.py",
    "test_bench_step_profile.py",
    "test_compilation.py",
    "test_input_audit.py",
    "test_distributed.py",
    "test_program_cache.py",
    "test_packing.py",
    "crossframework/test_torch_builtins.py",
    "test_scoring.py::ScoringVariantsTest",
    "test_dropout.py",
    "test_tutorials.py::TestNotebook_tutorials_attention_pooling",
    "crossframework/test_readme_torch.py",
    "test_bench_whole_run.py",
    "test_cli_plot.py",
    "test_masking.py",
    "test_translation.py",
    "test_beam_search.py",
    "crossframework/test_torch_models.py",
    "test_multihead.py::MultiHeadVariantsTest",
    "crossframework/test_flax_jax.py",
    "test_data.py",
    "test_tutorials.py::TestNotebook_guides_check_your_implementation",
    "test_train.py",
    "crossframework/test_conformance_guide.py",
    "test_randomness.py",
    "parity/test_bahdanau.py",
)


def _scope(nodeid: str) -> str:
    """xdist's loadscope unit: the module, or the class for a test method."""
    return nodeid.rsplit("::", 1)[0]


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    """In an xdist worker, the longest units first (:data:`LONGEST_FIRST`); every worker
    orders the same collection the same way. A plain `pytest` run keeps the file order."""
    if not hasattr(config, "workerinput"):
        return
    tests_dir = os.path.dirname(__file__)
    scopes: dict[str, list] = {}
    for item in items:
        scopes.setdefault(_scope(item.nodeid), []).append(item)

    def rank(scope: str):
        module = os.path.relpath(str(scopes[scope][0].path), tests_dir).replace(os.sep, "/")
        unit = module + scope[len(scope.split("::", 1)[0]):]  # the module, and its class if any
        if unit in LONGEST_FIRST:
            return (0, LONGEST_FIRST.index(unit), 0)
        return (1, 0, -len(scopes[scope]))

    items[:] = [item for scope in sorted(scopes, key=rank) for item in scopes[scope]]
