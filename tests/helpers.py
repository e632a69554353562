"""Small shared helpers for the tests."""

import keras
import numpy as np

from keras_attn.testing.tolerances import tolerance


def to_numpy(x):
    return keras.ops.convert_to_numpy(x)


def assert_close(actual, expected, dtype="float32", what="output"):
    """Compare against the float64 reference with the project's tolerance."""
    actual = np.asarray(to_numpy(actual), np.float64)
    expected = np.asarray(expected, np.float64)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    tol = tolerance(dtype)
    np.testing.assert_allclose(actual, expected, err_msg=what, **tol)
    return float(np.max(np.abs(actual - expected))) if actual.size else 0.0


def rng(seed=0):
    return np.random.default_rng(seed)


def randn(generator, *shape):
    return generator.standard_normal(shape).astype("float32")
