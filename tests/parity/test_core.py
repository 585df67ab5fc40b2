"""NumPy reference vs JAX for the one core of dot-product attention
(:func:`jax_attention.nn.core.attention_core` and :func:`reference_numpy.core.attention_core`).

The public functions reach the core through their checks and masks (tests/parity/test_scoring.py,
tests/parity/test_mods.py); here the core itself, on the arguments only it takes directly: a
dropout mask and its rate, a bias at the scores' rank, the soft cap and a score mod, sinks and
the log-sum-exp, a fully masked row. float64 to 1e-12, float32 to 1e-5 relative, jitted (one
program per case and dtype).
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from jax_attention.nn import core as jax_core
from jax_attention.nn import mods as jax_mods
from reference_numpy import core as np_core
from reference_numpy import mods as np_mods
from tests.parity._support import assert_matches

B, N, T, S, D, V = 2, 3, 4, 5, 4, 2


def _arrays(seed=0):
    rng = np.random.default_rng(seed)
    queries, keys, values = (rng.normal(size=shape) for shape in
                             ((B, N, T, D), (B, N, S, D), (B, N, S, V)))
    keep = rng.random((B, N, T, S)) < 0.7
    keep[0, 0, 1] = False  # a row that attends nothing
    return queries, keys, values, keep, rng.normal(size=(1, N, T, S)), rng.random((B, N, T, S)) > 0.3


CASES = {
    "the book's": dict(),
    "bias, dropout": dict(bias=True, drop=True),
    "soft cap, ALiBi, sinks, scale": dict(variants=True, drop=True),
}


@pytest.mark.parametrize("case", CASES)
def test_attention_core(backend, dtype, case):
    options = CASES[case]
    queries, keys, values, keep, bias, drop = _arrays()
    sinks = np.linspace(-1.0, 1.0, N)

    def variants(mods, cap, sinks_):
        if not options.get("variants"):
            return mods.Variants()
        return mods.Variants(scale=0.3, logit_softcap=mods.softcap(cap),
                             score_mod=mods.alibi(N), sinks=sinks_)

    kwargs = dict(rate=0.25, return_lse=True)
    expected = np_core.attention_core(
        queries, keys, values, keep, bias=bias if options.get("bias") else None,
        variants=variants(np_mods, 2.0, sinks), drop=drop if options.get("drop") else None,
        **kwargs)

    @jax.jit
    def run(queries, keys, values, keep, bias, drop, sinks):
        return jax_core.attention_core(
            queries, keys, values, keep, bias=bias if options.get("bias") else None,
            variants=variants(jax_mods, 2.0, sinks), drop=drop if options.get("drop") else None,
            **kwargs)

    with jax.default_device(backend):
        got = run(*(jax.device_put(np.asarray(a, dtype) if a.dtype.kind == "f" else a, backend)
                    for a in (queries, keys, values, keep, bias, drop, sinks)))
    for g, e in zip(got, expected, strict=True):
        finite = np.isfinite(e)
        assert np.array_equal(np.isfinite(np.asarray(g)), finite)  # -inf: the empty row's lse
        assert_matches(g.at[~finite].set(0) if not finite.all() else g,
                       np.where(finite, e, 0), dtype, backend)
