"""The compilation cache of the commands and the compile time they report
(:mod:`jax_attention.runtime.compilation`, ``train --no-compilation-cache``, the ``timing`` record)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_attention.runtime import compilation
from jax_attention.cli import main
from jax_attention.runtime.compilation import CompileTimer, enable_compilation_cache
from tests.shared_runs import tiny_flags

# The session's tiny run (tests/shared_runs.py) without held-out pairs: these runs have their
# own cache (cold), and without a held-out evaluation every program of the evaluation is one
# that the background compilation covers (the last check below).
TINY_ARGS = [*tiny_flags("bahdanau"), "--val-fraction", "0"]


@pytest.fixture
def restore_cache_config():
    """Put JAX's cache settings back as they were (the session's, from conftest.py)."""
    names = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs")
    before = {name: getattr(jax.config, name) for name in names}
    yield
    for name, value in before.items():
        jax.config.update(name, value)


def test_union_of_spans():
    assert CompileTimer._union([(0.0, 2.0), (1.0, 3.0), (5.0, 6.0), (5.5, 5.7)]) == 4.0
    assert CompileTimer._union([]) == 0.0


def test_compile_timer_counts_a_compilation_once_and_a_cached_call_not_at_all():
    offset = float(np.random.default_rng().integers(1 << 30))  # a program no test compiled

    @jax.jit
    def f(x):
        return jnp.sin(x) * offset + jnp.cumsum(x)

    x = jnp.arange(7.0)
    with CompileTimer() as first:
        f(x).block_until_ready()
    assert first.seconds > 0
    assert set(first.phases) == {"trace_s", "lower_s", "backend_s"}
    assert all(value > 0 for value in first.phases.values())
    # Phases nest (a traced inner function reports within its caller): the union is no more
    # than the sum of the phases.
    assert first.seconds <= sum(first.phases.values()) + 1e-9
    with CompileTimer() as again:
        f(x).block_until_ready()
    assert again.seconds == 0.0 and again.cache_hits == 0


def test_cache_settings(monkeypatch, tmp_path, restore_cache_config):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert compilation.default_cache_dir() == tmp_path / "xdg" / "jax-attention" / "compilation"
    assert enable_compilation_cache(False) is None
    for off in ("0", "off", "False", "no"):
        monkeypatch.setenv(compilation.ENVIRONMENT_VARIABLE, off)
        assert enable_compilation_cache() is None
    monkeypatch.delenv(compilation.ENVIRONMENT_VARIABLE)

    # A directory JAX was told already (the test session's own) is used as it is.
    jax.config.update("jax_compilation_cache_dir", str(tmp_path / "configured"))
    assert enable_compilation_cache() == tmp_path / "configured"
    # An explicit one is created and set, with the threshold that keeps the decoders.
    chosen = enable_compilation_cache(directory=tmp_path / "chosen")
    assert chosen == tmp_path / "chosen" and chosen.is_dir()
    assert jax.config.jax_compilation_cache_dir == str(chosen)
    assert jax.config.jax_persistent_cache_min_compile_time_secs == compilation.MIN_COMPILE_TIME_S
    # The default, under XDG_CACHE_HOME, when JAX has none.
    jax.config.update("jax_compilation_cache_dir", None)
    assert enable_compilation_cache() == compilation.default_cache_dir()


def test_the_stored_programs_follow_the_cache(tmp_path, monkeypatch, restore_cache_config):
    """:func:`compilation.stored_programs`: ``programs/`` in the compilation cache's directory
    once :func:`enable_compilation_cache` turned it on; off with the cache."""
    monkeypatch.setattr(compilation, "_programs", compilation._programs)  # put back after
    chosen = enable_compilation_cache(directory=tmp_path / "chosen")
    assert compilation.stored_programs().directory == chosen / compilation.PROGRAMS
    assert enable_compilation_cache(False) is None
    assert compilation.stored_programs() is None


def test_an_unwritable_cache_is_one_warning_and_no_cache(tmp_path, restore_cache_config):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert enable_compilation_cache(directory=blocker / "cache") is None
    assert len(caught) == 1 and "cannot be written" in str(caught[0].message)
    assert str(blocker / "cache") in str(caught[0].message)


def _train(tmp_path: Path, data_path, name: str, *extra: str) -> tuple[dict, str]:
    """``jax-attention train bahdanau`` (tiny) in a fresh process with the user cache in
    ``tmp_path``; its JSON record and stdout."""
    env = {key: value for key, value in os.environ.items()
           if key not in ("JAX_COMPILATION_CACHE_DIR", compilation.ENVIRONMENT_VARIABLE)}
    env["XDG_CACHE_HOME"] = str(tmp_path / "xdg")
    record = tmp_path / f"{name}.json"
    done = subprocess.run(
        [sys.executable, "-m", "jax_attention", "train", "bahdanau", *TINY_ARGS, "--data",
         str(data_path), "--checkpoint", str(tmp_path / name), "--json", str(record), *extra],
        capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    return json.loads(record.read_text()), done.stdout


def test_a_second_run_loads_its_programs_from_the_cache(tmp_path, data_path):
    cache = tmp_path / "xdg" / "jax-attention" / "compilation"
    off, off_out = _train(tmp_path, data_path, "off", "--no-compilation-cache")
    assert off["compilation_cache"] is None and not cache.exists()
    assert "no compilation cache" in off_out
    first, first_out = _train(tmp_path, data_path, "first")
    assert first["compilation_cache"] == str(cache) and any(cache.iterdir())
    assert first["timing"]["compile_cache_hits"] == 0
    assert "compiled the training step in" in first_out
    # The training step is kept whole too (runtime/program_cache.py): one entry.
    (stored,) = (cache / compilation.PROGRAMS).iterdir()
    second, second_out = _train(tmp_path, data_path, "second")
    assert second["timing"]["compile_cache_hits"] > 0
    assert "loaded from the compilation cache" in second_out
    assert "loaded the training step from the compilation cache in" in second_out
    assert list((cache / compilation.PROGRAMS).iterdir()) == [stored]
    # A loaded program is the compiled one: the same losses, bit for bit.
    assert second["losses"] == first["losses"] == off["losses"]
    # translate takes the flag too.
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["translate", "i lost .", "--checkpoint", str(tmp_path / "first"),
                     "--no-compilation-cache"]) == 0
    assert out.getvalue().startswith("i lost . =>")

    for record in (off, first, second):
        timing = record["timing"]
        assert record["compile_s"] == timing["compile_s"]
        assert 0 < timing["training_compile_s"] <= timing["compile_s"] <= record["wall_time_s"]
        assert timing["evaluation_compile_s"] <= timing["compile_s"]
        phases = sum(timing[key] for key in ("setup_s", "training_s", "evaluation_s",
                                             "export_s"))
        assert phases <= record["wall_time_s"]
        assert record["steady_tokens_per_sec"] == pytest.approx(
            float(np.median(record["tokens_per_sec_per_epoch"][1:])))
    # Without a cache the evaluation's programs compile in the background while the epochs run
    # (the thread starts after the first); the evaluation itself then compiles nothing.
    assert off["timing"]["background_compile_s"] > 0
    assert off["timing"]["evaluation_compile_s"] == 0.0


def _scaled_sum(x, *, scale: int):
    return jnp.sum(jnp.sin(x) * scale)


def test_backend_jit_compiles_with_its_cpu_options_on_the_cpu_only(monkeypatch):
    """:class:`compilation.BackendJit`: on the CPU the options reach XLA (a bad one is XLA's
    error), an option ``XLA_FLAGS`` sets is left to it, other backends get XLA's defaults; it
    computes what ``jax.jit`` does and lowers as it does."""
    if jax.default_backend() != "cpu":
        pytest.skip("the CPU options apply on the CPU backend only")
    monkeypatch.setenv("XLA_FLAGS", "")
    bad = compilation.BackendJit(_scaled_sum, static_argnames="scale",
                                 cpu_options={"xla_backend_optimization_level": "bogus"})
    with pytest.raises(jax.errors.JaxRuntimeError, match="xla_backend_optimization_level"):
        bad(jnp.ones(3), scale=2)
    monkeypatch.setenv("XLA_FLAGS", "--xla_backend_optimization_level=0")
    yielded = compilation.BackendJit(_scaled_sum, static_argnames="scale",
                                     cpu_options={"xla_backend_optimization_level": "bogus"})
    x = jnp.linspace(0.0, 3.0, 7)
    assert float(yielded(x, scale=2)) == float(jax.jit(_scaled_sum, static_argnames="scale")(
        x, scale=2))
    fast = compilation.BackendJit(_scaled_sum, static_argnames="scale",
                                  cpu_options=compilation.CPU_COMPILER_OPTIONS)
    assert fast.__wrapped__ is _scaled_sum and fast.__name__ == "_scaled_sum"
    assert fast.jitted("gpu") is not fast.jitted("cpu") and fast.jitted() is fast.jitted("cpu")
    assert float(fast.lower(x, scale=3).compile()(x)) == pytest.approx(
        float(jnp.sum(jnp.sin(x) * 3)), rel=1e-6)
    # An option this XLA does not have (as jaxlib 0.8.1 lacks xla_cpu_opt_preset) is left out.
    unknown = compilation.BackendJit(_scaled_sum, static_argnames="scale", cpu_options={
        "xla_no_such_option_here": 1, "xla_backend_optimization_level": 1})
    monkeypatch.setenv("XLA_FLAGS", "")
    assert unknown.options() == {"xla_backend_optimization_level": 1}
    assert float(unknown(x, scale=2)) == pytest.approx(float(jnp.sum(jnp.sin(x) * 2)), rel=1e-6)
    assert not compilation.xla_knows("xla_no_such_option_here", 1)
    # XLA's CPU presets came with jaxlib 0.10.0 (0.8.1 to 0.9.2 lack them; the install allows
    # 0.8.1): on an older jaxlib the library's preset is dropped, on a newer one it applies.
    import jaxlib

    has_presets = tuple(int(part) for part in jaxlib.__version__.split(".")[:2]) >= (0, 10)
    assert compilation.xla_knows("xla_cpu_opt_preset", "CPU_OPT_PRESET_FAST_COMPILE") \
        == has_presets
    assert ("xla_cpu_opt_preset" in compilation.BackendJit(
        _scaled_sum, cpu_options=compilation.CPU_COMPILER_OPTIONS).options()) == has_presets
    from jax_attention.train import loop
    assert isinstance(loop.train_steps, compilation.BackendJit)
    assert loop.train_steps.cpu_options == compilation.CPU_COMPILER_OPTIONS
