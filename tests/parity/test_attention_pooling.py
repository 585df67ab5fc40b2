"""NumPy reference vs JAX for Nadaraya–Watson attention pooling (d2l §11.2), on every backend.

The parametrised cases of each pooling test run in one jitted program per backend (and dtype)
(:func:`_together`; each case still checks its own result): eagerly, each new shape compiled a
program per operation. The other tests run jitted too, but leave_one_out (eager); inputs reach the device as NumPy arrays
of the final dtype (``jnp.asarray`` with a dtype would compile a conversion per shape).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_attention.nn import attention_pooling as jax_pooling
from reference_numpy import attention_pooling as np_pooling

pytestmark = pytest.mark.usefixtures("backend")

# (queries, keys, values) shapes: shared keys, per-query keys, vector values, an extra batch axis.
SHAPES = [
    ((7,), (5,), (5,)),
    ((7,), (7, 4), (7, 4)),
    ((7,), (5,), (5, 3)),
    ((7,), (7, 4), (7, 4, 2)),
    ((2, 6), (2, 5), (2, 5)),
    ((2, 6), (2, 6, 5), (2, 6, 5, 3)),
]


def _inputs(shapes, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.uniform(0, 5, size=shape) for shape in shapes]


# The widths of each (function, dtype) group: its test's parametrisation.
WIDTHS = {("nadaraya_watson", jnp.float64): (1.0, 3.5, 0.2), ("nadaraya_watson", jnp.float32): (2.0,),
          ("average_pooling", jnp.float64): (None,)}


@functools.cache
def _together(name, dtype, device):
    """``{(shapes, w): result}``: ``name`` on every case of SHAPES and WIDTHS in one jitted program
    (on ``device``: the backend under test, its fixture's default device); w is static."""
    cases = [(shapes, w) for shapes in SHAPES for w in WIDTHS[name, dtype]]

    def run(inputs):
        function = getattr(jax_pooling, name)
        return [function(*args, **({} if w is None else {"w": w}))
                for args, (_, w) in zip(inputs, cases)]

    inputs = [[np.asarray(a, dtype) for a in _inputs(shapes)] for shapes, _ in cases]
    return dict(zip(cases, jax.jit(run)(inputs)))


def _assert_parity(name, args, kwargs, dtype, tol, shapes, backend):
    expected = getattr(np_pooling, name)(*args, **kwargs)
    got = _together(name, dtype, backend)[shapes, kwargs.get("w")]
    for e, g in zip(expected, got):
        assert g.dtype == dtype
        np.testing.assert_allclose(np.asarray(g, np.float64), e, rtol=tol, atol=tol)


@pytest.mark.parametrize("shapes", SHAPES)
@pytest.mark.parametrize("w", [1.0, 3.5, 0.2])
def test_nadaraya_watson_float64(backend, shapes, w, x64):
    _assert_parity("nadaraya_watson", _inputs(shapes), {"w": w}, jnp.float64, 1e-12, shapes, backend)


@pytest.mark.parametrize("shapes", SHAPES)
def test_nadaraya_watson_float32(backend, shapes, highest_precision):
    _assert_parity("nadaraya_watson", _inputs(shapes), {"w": 2.0}, jnp.float32, 1e-5, shapes, backend)


@pytest.mark.parametrize("shapes", SHAPES)
def test_average_pooling(backend, shapes, x64):
    _assert_parity("average_pooling", _inputs(shapes), {}, jnp.float64, 1e-12, shapes, backend)


def test_weights_with_array_width(x64):
    queries, keys = _inputs([(6,), (6, 4)])
    w = np.linspace(0.5, 2.0, 4)  # one width per key position, broadcast over queries
    expected = np_pooling.nadaraya_watson_weights(queries, keys, w)
    got = jax.jit(jax_pooling.nadaraya_watson_weights)(queries, keys, w)
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-12, atol=1e-12)


def test_leave_one_out(x64):
    x = np.arange(5.0)
    np.testing.assert_array_equal(np.asarray(jax_pooling.leave_one_out(jnp.asarray(x))),
                                  np_pooling.leave_one_out(x))
    assert np_pooling.leave_one_out(x).tolist()[2] == [0.0, 1.0, 3.0, 4.0]


def test_module_matches_reference(x64):
    from flax import nnx

    model = jax_pooling.NWKernelRegression(param_dtype=jnp.float64, rngs=nnx.Rngs(3))
    queries, keys, values = _inputs([(8,), (8, 7), (8, 7)])
    got = nnx.jit(lambda model, *inputs: model(*inputs))(model, queries, keys, values)
    expected, _ = np_pooling.nadaraya_watson(queries, keys, values, np.asarray(model.w[...]))
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-12, atol=1e-12)
