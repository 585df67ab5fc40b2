"""The CPU as :mod:`jax_attention.runtime.provenance` reads it: one reader for the benchmarks'
records, the program cache's key and the tests' per-class figures."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest

from jax_attention.bench.common import environment
from jax_attention.runtime import provenance

X86 = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 9R14
flags\t\t: fpu sse2 avx2 avx512f avx512_bf16 fma
processor\t: 1
model name\t: another model
flags\t\t: fpu
"""
AVX2 = "model name\t: AMD EPYC 7R13\nflags\t\t: sse2 fma avx2\n"
ARM = "processor\t: 0\nFeatures\t: fp asimd sve\nCPU part\t: 0xd40\n"


@pytest.fixture
def cpuinfo(monkeypatch, tmp_path):
    """Make :func:`provenance.cpu` read ``text`` (``None``: no ``/proc/cpuinfo`` at all)."""

    def use(text):
        target = tmp_path / "cpuinfo"
        if text is not None:
            target.write_text(text)
        monkeypatch.setattr(provenance, "Path",
                            lambda name: target if name == "/proc/cpuinfo" else Path(name))
        provenance.cpu.cache_clear()

    yield use
    provenance.cpu.cache_clear()


def test_cpu_takes_the_first_processors_model_and_sorted_flags(cpuinfo):
    cpuinfo(X86)
    assert provenance.cpu() == {"machine": platform.machine(), "model name": "AMD EPYC 9R14",
                                "flags": "avx2 avx512_bf16 avx512f fma fpu sse2"}
    assert provenance.vector_isa() == "avx512"


def test_vector_isa_names_each_class(cpuinfo):
    cpuinfo(AVX2)
    assert provenance.vector_isa() == "avx2"
    cpuinfo(ARM)
    assert provenance.cpu()["Features"] == "asimd fp sve" and provenance.cpu()["CPU part"] == "0xd40"
    assert provenance.vector_isa() == platform.machine()


def test_the_cpu_record_is_shared_and_read_only(cpuinfo):
    cpuinfo(X86)
    assert provenance.cpu() is provenance.cpu()  # read once
    with pytest.raises(TypeError):
        provenance.cpu()["flags"] = "avx2"  # a caller cannot change it for the others
    assert provenance.vector_isa() == "avx512"


def test_without_cpuinfo_only_the_machine_is_known(cpuinfo):
    cpuinfo(None)
    assert provenance.cpu() == {"machine": platform.machine()}
    assert provenance.vector_isa() == platform.machine()


def test_the_benchmarks_record_the_cpu_and_its_class():
    record = environment()
    assert record["vector_isa"] == provenance.vector_isa()
    assert record["cpu"] == provenance.cpu().get("model name", record["cpu"])
    assert record["cpu"]
