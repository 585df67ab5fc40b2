"""Nadaraya–Watson attention pooling in JAX (d2l §11.2): variants, vmap, gradients, properties.

Inputs reach the device by ``jax.device_put`` of NumPy arrays (``jnp.asarray`` with a dtype
compiles a conversion per shape). The tests that are not about eager execution run their JAX
computations jitted, one program per test (or per drawn shape) instead of one per operation; the
chex variants keep the eager (without_jit) runs.
"""

from __future__ import annotations

import chex
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from jax.test_util import check_grads

from jax_attention.nn import attention_pooling as pooling
from reference_numpy import attention_pooling as np_pooling
from tests.hypothesis_support import examples, sizes


def _data(seed=0, n_queries=6, n_keys=5, dtype=jnp.float32):
    rng = np.random.default_rng(seed)
    queries = np.sort(rng.uniform(0, 5, n_queries))
    keys = np.sort(rng.uniform(0, 5, n_keys))
    values = rng.normal(size=n_keys)
    return tuple(jax.device_put(np.asarray(a, dtype)) for a in (queries, keys, values))


class VariantsTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_shapes_and_row_sums(self):
        dims = chex.Dimensions(Q=6, K=5, V=3)
        queries, keys, values = _data()
        prediction, weights = self.variant(pooling.nadaraya_watson)(queries, keys, values, 2.0)
        chex.assert_shape(prediction, dims["Q"])
        chex.assert_shape(weights, dims["QK"])
        np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-6)
        vector_values = jax.device_put(np.ones(dims["KV"], np.float32))
        prediction, _ = self.variant(pooling.nadaraya_watson)(queries, keys, vector_values)
        chex.assert_shape(prediction, dims["QV"])

    @chex.variants(with_jit=True, without_jit=True)
    def test_leave_one_out_keys(self):
        x = jax.device_put(np.arange(6, dtype=np.float32))
        tiles = self.variant(pooling.leave_one_out)(x)
        chex.assert_shape(tiles, (6, 5))
        for i in range(6):
            assert float(i) not in np.asarray(tiles[i]).tolist()

    @chex.variants(with_jit=True, without_jit=True)
    def test_average_pooling_is_the_mean(self):
        queries, keys, values = _data()
        prediction, weights = self.variant(pooling.average_pooling)(queries, keys, values)
        np.testing.assert_allclose(prediction, np.full(6, np.mean(np.asarray(values))), rtol=1e-6)
        np.testing.assert_allclose(weights, np.full((6, 5), 0.2), rtol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_module_under_variants(self):
        model = pooling.NWKernelRegression(rngs=nnx.Rngs(0))
        queries, keys, values = _data()
        w = model.w[...]
        got = self.variant(lambda q, k, v, w: pooling.nadaraya_watson(q, k, v, w)[0])(queries, keys, values, w)
        np.testing.assert_allclose(model(queries, keys, values), got, rtol=1e-6)


def test_hand_worked_weights():
    # One query at 0 and keys at 0 and 1: weights ∝ exp(0), exp(-1/2) for w = 1.
    prediction, weights = jax.jit(pooling.nadaraya_watson)(
        np.zeros(1, np.float32), np.asarray([0.0, 1.0], np.float32), np.asarray([2.0, 4.0], np.float32))
    expected = np.array([1.0, np.exp(-0.5)]) / (1.0 + np.exp(-0.5))
    np.testing.assert_allclose(weights[0], expected, rtol=1e-6)
    np.testing.assert_allclose(prediction[0], 2 * expected[0] + 4 * expected[1], rtol=1e-6)


def test_width_limits():
    queries, keys, values = _data()
    # w = 0: every key is equally similar, so the estimator is average pooling.
    np.testing.assert_allclose(pooling.nadaraya_watson(queries, keys, values, 0.0)[0],
                               pooling.average_pooling(queries, keys, values)[0], rtol=1e-6)
    # A very narrow kernel returns the value of the nearest key.
    nearest = np.abs(np.asarray(queries)[:, None] - np.asarray(keys)[None, :]).argmin(-1)
    np.testing.assert_allclose(pooling.nadaraya_watson(queries, keys, values, 200.0)[0],
                               np.asarray(values)[nearest], rtol=1e-5)


def test_shared_keys_equal_tiled_keys():
    queries, keys, values = _data()
    tiled_keys = jnp.broadcast_to(keys[None, :], (6, 5))
    tiled_values = jnp.broadcast_to(values[None, :], (6, 5))
    shared = pooling.nadaraya_watson(queries, keys, values, 1.5)
    tiled = pooling.nadaraya_watson(queries, tiled_keys, tiled_values, 1.5)
    for a, b in zip(shared, tiled):
        np.testing.assert_array_equal(a, b)


def test_vmap_equals_loop():
    rng = np.random.default_rng(1)
    queries = rng.uniform(0, 5, (4, 6)).astype(np.float32)
    keys = rng.uniform(0, 5, (4, 6, 5)).astype(np.float32)
    values = rng.normal(size=(4, 6, 5)).astype(np.float32)
    widths = np.asarray([0.5, 1.0, 2.0, 4.0], np.float32)

    @jax.jit  # the vmapped call and the loop in one program
    def batched_and_looped(queries, keys, values, widths):
        return (jax.vmap(pooling.nadaraya_watson)(queries, keys, values, widths),
                [pooling.nadaraya_watson(queries[i], keys[i], values[i], widths[i]) for i in range(4)])

    batched, looped = batched_and_looped(queries, keys, values, widths)
    for i in range(4):
        for a, b in zip(batched, looped[i]):
            np.testing.assert_allclose(a[i], b, rtol=1e-6, atol=1e-7)


def test_gradients_match_finite_differences(x64):
    queries, keys, values = _data(dtype=np.float64)
    w = jax.device_put(np.asarray(1.3, np.float64))

    @jax.jit  # check_grads's evaluations (and their jvp/vjp) reuse compiled programs
    def f(q, k, v, w):
        return pooling.nadaraya_watson(q, k, v, w)[0]

    check_grads(f, (queries, keys, values, w), order=1, modes=("rev",))
    check_grads(f, (queries, keys, values, w), order=1, modes=("fwd",))


def test_module_sows_weights_and_learns():
    model = pooling.NWKernelRegression(sow_weights=True, rngs=nnx.Rngs(0))
    queries, keys, values = _data()


    @nnx.jit  # the captured call and the function it must equal in one program
    def captured_and_expected(model, queries, keys, values):
        prediction, intermediates = nnx.capture(model, nnx.Intermediate)(queries, keys, values)
        return prediction, intermediates, pooling.nadaraya_watson(queries, keys, values, model.w[...])

    prediction, intermediates, (expected_prediction, expected_weights) = captured_and_expected(
        model, queries, keys, values)
    (weights,) = intermediates["attention_weights"].get_value()
    np.testing.assert_array_equal(weights, expected_weights)
    np.testing.assert_array_equal(prediction, expected_prediction)
    model.sow_weights = False  # outside nnx.capture, sowing would store a hidden attribute
    grads = nnx.jit(nnx.grad(lambda m: jnp.sum((m(queries, keys, values) - 1.0) ** 2)))(model)
    assert np.isfinite(float(grads["w"][...])) and float(grads["w"][...]) != 0.0


def test_module_init_is_reproducible():
    first = pooling.NWKernelRegression(rngs=nnx.Rngs(7)).w[...]
    again = pooling.NWKernelRegression(rngs=nnx.Rngs(7)).w[...]
    other = pooling.NWKernelRegression(rngs=nnx.Rngs(8)).w[...]
    assert first == again and first != other
    assert 0.0 <= float(first) < 1.0


def test_book_data():
    @jax.jit  # the data and the targets of its inputs in one program (called twice, same key)
    def data_and_target(key):
        data = pooling.kernel_regression_data(key)
        return data, pooling.target_function(data["x_train"])

    data, target = data_and_target(jax.random.key(0))
    chex.assert_shape([data["x_train"], data["y_train"], data["x_test"], data["y_truth"]], (50,))
    x_train = np.asarray(data["x_train"])
    assert np.all(np.diff(x_train) >= 0) and x_train.min() >= 0 and x_train.max() < 5
    np.testing.assert_allclose(data["x_test"], np.arange(50) * 0.1, rtol=1e-6)
    truth = 2 * np.sin(np.asarray(data["x_test"], np.float64)) + np.asarray(data["x_test"], np.float64) ** 0.8
    np.testing.assert_allclose(data["y_truth"], truth, rtol=1e-5, atol=1e-6)
    noise = np.asarray(data["y_train"]) - np.asarray(target)
    assert 0.2 < noise.std() < 0.8  # N(0, 0.5) noise
    again, _ = data_and_target(jax.random.key(0))
    for name in data:
        np.testing.assert_array_equal(data[name], again[name])


_nadaraya_watson_jit = jax.jit(pooling.nadaraya_watson)  # one program per drawn shape


@settings(max_examples=examples(ci=10, dev=30))
@given(
    n_queries=sizes(1, 6),
    n_keys=sizes(1, 6),
    per_query=st.booleans(),
    w=st.floats(0.0, 10.0),
    seed=st.integers(0, 2**16),
)
def test_property_matches_reference(n_queries, n_keys, per_query, w, seed):
    rng = np.random.default_rng(seed)
    queries = rng.uniform(0, 5, n_queries)
    keys = rng.uniform(0, 5, (n_queries, n_keys) if per_query else n_keys)
    values = rng.normal(size=keys.shape)
    expected, expected_weights = np_pooling.nadaraya_watson(queries, keys, values, w)
    with jax.enable_x64(True):
        got, weights = _nadaraya_watson_jit(queries, keys, values, w)
        np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(np.asarray(weights).sum(-1), 1.0, rtol=1e-12)
    assert np.all(expected_weights >= 0)


@pytest.mark.parametrize("module", [pooling, np_pooling], ids=["jax", "numpy"])
def test_bad_shapes_raise(module):
    with pytest.raises(ValueError, match=r"keys must have shape .*\(4,\).*\(3, 5\)"):
        module.nadaraya_watson(np.ones(4), np.ones((3, 5)), np.ones((3, 5)))
    with pytest.raises(ValueError, match=r"values must have the keys' shape \(5,\).*got \(6,\)"):
        module.nadaraya_watson(np.ones(4), np.ones(5), np.ones(6))
    with pytest.raises(ValueError, match=r"queries must have shape \(\.\.\., Q\), got \(\)"):
        module.average_pooling(np.ones(()), np.ones(5), np.ones(5))
    with pytest.raises(ValueError, match=r"x must have shape \(n, \.\.\.\) with n >= 2, got \(1,\)"):
        module.leave_one_out(np.ones(1))
