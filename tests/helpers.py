"""Small shared helpers for the tests."""

import keras
import numpy as np

from keras_attn.testing.tolerances import tolerance


def to_numpy(x):
    return keras.ops.convert_to_numpy(x)


# Worst errors seen by assert_close, per dtype; the conftest prints them at the end.
WORST = {}


def assert_close(actual, expected, dtype="float32", what="output", quantity="output"):
    """Compare against the float64 reference with the project's tolerance.

    `quantity` is "output" or "gradient" (see keras_attn.testing.tolerances).
    """
    actual = np.asarray(to_numpy(actual), np.float64)
    expected = np.asarray(expected, np.float64)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    tol = tolerance(dtype, quantity)
    np.testing.assert_allclose(actual, expected, err_msg=what, **tol)
    if actual.size:
        abs_err = np.abs(actual - expected)
        rel_err = abs_err / np.maximum(np.abs(expected), 1e-3)
        worst = WORST.setdefault(dtype, [0.0, 0.0])
        worst[0] = max(worst[0], float(abs_err.max()))
        worst[1] = max(worst[1], float(rel_err.max()))


def rng(seed=0):
    return np.random.default_rng(seed)


def randn(generator, *shape):
    return generator.standard_normal(shape).astype("float32")
