"""float64 stays float64 on every attention path and in the delta rule (issue 38).

Keras 3.15's PyTorch backend computes `ops.matmul`, `ops.where`, `ops.exp` and
`ops.dot_product_attention` of float64 tensors in float32 (keras-team/keras#23704): the
explicit path then mixed dtypes and raised "expected scalar type Double but found Float"
for `logit_soft_cap` in float64. Now every path runs and returns float64; the fused path
computes in float64 (`keras_attn._float64`), checked against the float64 reference at
1e-11, which float32 arithmetic (about 1e-7) cannot meet; on PyTorch the explicit and
blockwise paths and the delta rule keep float32's precision (1e-5 here) until Keras is
fixed. TensorFlow keeps float64 everywhere (1e-11). JAX without x64 and Keras's NumPy
backend compute float64 as float32 by Keras's own rule: the tests run on PyTorch and
TensorFlow.
"""

import keras
import numpy as np
import pytest

import keras_attn
from keras_attn._policy import observe_paths
from keras_attn.linear_attention import chunk_gated_delta_rule
from keras_attn.testing import delta_reference
from keras_attn.testing.weights import randomize_weights, reference_params

from .. import reference
from ..helpers import to_numpy

pytestmark = pytest.mark.skipif(
    keras.backend.backend() in ("jax", "numpy"),
    reason="Keras computes float64 as float32 on JAX (x64 off) and NumPy (result_type)")

B, T, D, H, H_KV, d = 2, 6, 16, 4, 2, 4
CASES = [("explicit", {"logit_soft_cap": 3.0}), ("blockwise", {"logit_soft_cap": 3.0}),
         ("explicit", {"use_sinks": True, "sliding_window": 3}), ("fused", {}),
         ("blockwise", {})]


def _tolerance(path):
    if keras.backend.backend() == "torch" and path != "fused":
        return 1e-5  # Keras's matmul / where / exp in float32 on torch (above)
    return 1e-11


def _relative(out, expected):
    expected = np.asarray(expected, np.float64)
    return float(np.abs(to_numpy(out) - expected).max() / np.abs(expected).max())


@pytest.fixture
def small_blocks():
    keras_attn.config.set_attention_block_size(2)
    yield
    keras_attn.config.set_attention_block_size(None)


@pytest.mark.parametrize("path, options", CASES)
def test_multi_head_attention_in_float64(path, options, small_blocks):
    layer = keras_attn.MultiHeadAttention(H, d, num_key_value_heads=H_KV, dtype="float64",
                                          implementation=path, **options)
    x = np.random.default_rng(0).normal(size=(B, T, D))
    layer(x, x, use_causal_mask=True)
    randomize_weights(layer, seed=1)
    with observe_paths() as taken:
        out = layer(x, x, use_causal_mask=True)
    # PyTorch's fused path reads the grouped key/value heads without repeating them.
    grouped = {"grouped": 1} if path == "fused" and keras.backend.backend() == "torch" else {}
    assert taken == {path: 1, **grouped}
    assert keras.backend.standardize_dtype(out.dtype) == "float64"
    expected, _ = reference.multi_head_attention(
        reference_params(layer), x, x, num_heads=H, num_key_value_heads=H_KV, is_causal=True,
        **options)
    assert _relative(out, expected) < _tolerance(path)


def test_chunked_delta_rule_in_float64():
    rng = np.random.default_rng(2)
    q, k = (delta_reference.l2norm(rng.normal(size=(B, 7, 2, 4))) for _ in range(2))
    v = rng.normal(size=(B, 7, 2, 3))
    g = -np.abs(rng.normal(size=(B, 7, 2))) * 0.5
    beta = 1 / (1 + np.exp(-rng.normal(size=(B, 7, 2))))
    out, state = chunk_gated_delta_rule(q, k, v, g, beta, chunk_size=3)
    expected, expected_state = delta_reference.gated_delta_rule(q, k, v, g, beta)
    assert keras.backend.standardize_dtype(out.dtype) == "float64"
    assert _relative(out, expected) < _tolerance("delta rule")
    assert _relative(state, expected_state) < _tolerance("delta rule")
