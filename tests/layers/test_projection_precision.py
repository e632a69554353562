"""float16 projections sum in float32 and round once, on every backend.

NumPy's einsum rounds every partial sum to float16 (and TensorFlow's sums the
heads of the heads-first output projection in float16), which made the NumPy
backend fail the float16 parity of cached decoding; the projections of
`MultiHeadAttention` are matmuls in float16 so that every backend computes
the same thing (see `keras_attn.layers._projection.einsum_sums_in_float32`).
"""

import keras
import numpy as np
import pytest

import keras_attn
from keras_attn.layers._projection import project_heads, project_output

from ..helpers import to_numpy

WIDTH, HEADS, HEAD_DIM = 256, 4, 8  # a long sum: float16 partial sums drift by several ulps


def _layer():
    # Weights in float16 too: the projections see float16 operands outside a layer call.
    layer = keras_attn.MultiHeadAttention(num_heads=HEADS, key_dim=HEAD_DIM, output_dim=WIDTH,
                                          use_bias=False, dtype="float16")
    layer.build((2, 3, WIDTH))
    g = np.random.default_rng(5)
    for variable in layer.weights:
        fan_in = WIDTH if variable.shape[0] == WIDTH else HEADS * HEAD_DIM
        variable.assign((g.standard_normal(variable.shape) / np.sqrt(fan_in)).astype("float16"))
    return layer, g


def _assert_one_rounding(actual, x, kernel):
    """`actual` is the float32 product `x @ kernel` rounded to float16, within 1 ulp."""
    actual = to_numpy(actual)
    assert actual.dtype == np.float16
    expected = (x.astype(np.float32) @ kernel.astype(np.float32)).astype(np.float16)
    actual = actual.reshape(expected.shape).astype(np.float64)
    error = np.abs(actual - expected.astype(np.float64))
    ulp = np.spacing(np.abs(expected)).astype(np.float64)
    # One float32 summation order against another can move a result across a
    # float16 rounding boundary (1 ulp), never further; the atol covers results
    # that cancel to ~0, where the float32 sums differ by more than their ulp.
    assert np.all(error <= ulp + 1e-5), (
        f"{int((error > ulp + 1e-5).sum())} of {error.size} entries are more than one "
        f"float16 rounding from the float32 sum (max error {error.max():.2e})")


def test_float16_input_projection_rounds_once():
    layer, g = _layer()
    x = g.standard_normal((2, 3, WIDTH)).astype("float16")
    y = project_heads(layer.query_dense, keras.ops.convert_to_tensor(x), HEADS, HEAD_DIM)
    assert tuple(y.shape) == (2, 3, HEADS, HEAD_DIM)
    _assert_one_rounding(y, x, to_numpy(layer.query_dense.kernel))


@pytest.mark.parametrize("heads_first", [False, True])
def test_float16_output_projection_rounds_once(heads_first):
    layer, g = _layer()
    attended = g.standard_normal((2, 3, HEADS, HEAD_DIM)).astype("float16")  # (B, T, H, d_v)
    given = np.swapaxes(attended, 1, 2) if heads_first else attended
    y = project_output(layer.output_dense, keras.ops.convert_to_tensor(given), HEADS, HEAD_DIM,
                       heads_first)
    assert tuple(y.shape) == (2, 3, WIDTH)
    _assert_one_rounding(y, attended.reshape(2, 3, HEADS * HEAD_DIM),
                         to_numpy(layer.output_dense.kernel))
