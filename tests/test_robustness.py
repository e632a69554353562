"""What real pipelines feed: half precision, odd masks, NaN in padding, empty sequences.

Every case either matches the float64 reference or raises a `ValueError`
naming the argument, on every path and every backend.
"""

import keras
import numpy as np
import pytest

import keras_attn
from keras_attn import _device
from keras_attn.testing.weights import randomize_weights, reference_params

from . import reference
from .fixtures import attention_settings_fixture
from .helpers import assert_close, randn, rng, to_numpy

sdpa = keras_attn.scaled_dot_product_attention
PATHS = ["explicit", "fused", "blockwise"]
BACKEND = keras.backend.backend()


# Blocks of 4 so that the test sizes span several, partial blocks. (This module used
# to restore `config.attention_block_size()`, which reads 512 when unset, so it left
# a setting of 512 behind for the modules after it.)
_small_blocks = attention_settings_fixture(block_size=4)


def _qkv(seed, T=6, S=7, d_k=4, d_v=3, lead=(2, 2), scale=1.0):
    g = rng(seed)
    return (g, scale * randn(g, *lead, T, d_k), scale * randn(g, *lead, S, d_k),
            randn(g, *lead, S, d_v))


# ----------------------------------------------------------------------------
# Half precision: softmax in float32 on every path, no NaN beyond the float16 range.


@pytest.mark.parametrize("path", ["auto"] + PATHS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_large_logits_stay_finite(path, dtype):
    if BACKEND == "numpy" and dtype == "bfloat16":
        pytest.skip("NumPy has no bfloat16 matmul (Keras's NumPy backend cannot run it)")
    # Logits up to ~1e5, beyond float16's 65504: a float16 softmax gives NaN.
    g, q, k, v = _qkv(1, scale=250.0)
    bias = np.zeros((2, 2, 6, 7), "float32")
    bias[0, 1, 3] = -np.inf  # a row forbidden by the bias alone
    q16, k16, v16, b16 = (keras.ops.cast(x, dtype) for x in (q, k, v, bias))
    out = sdpa(q16, k16, v16, bias=b16, is_causal=True, implementation=path)
    assert keras.backend.standardize_dtype(out.dtype) == dtype
    out = to_numpy(keras.ops.cast(out, "float32"))
    assert np.isfinite(out).all()
    as32 = [to_numpy(keras.ops.cast(x, "float32")) for x in (q16, k16, v16)]
    expected, _ = reference.scaled_dot_product_attention(*as32, bias=bias, is_causal=True)
    assert_close(out, expected, dtype=dtype, what=f"{path} {dtype}")


@pytest.mark.requires_trainable_backend
@pytest.mark.parametrize("path", ["auto", "fused", "blockwise"])
def test_half_precision_compiled_model_is_finite(path):
    """Under jit / tf.function (XLA on JAX and TF): no crash, no NaN, close to the reference."""
    keras.config.set_dtype_policy("mixed_float16")
    g = rng(2)
    x = 40.0 * randn(g, 2, 8, 16)
    inputs = keras.Input((8, 16))
    layer = keras_attn.MultiHeadAttention(2, 8, implementation=path)
    model = keras.Model(inputs, layer(inputs, use_causal_mask=True))
    randomize_weights(layer, seed=2)
    model.compile(keras.optimizers.SGD(1e-3), "mse", jit_compile=BACKEND != "torch")
    out = model.predict_on_batch(x)
    assert np.isfinite(out).all()
    expected, _ = reference.multi_head_attention(
        reference_params(layer), x, num_heads=2, is_causal=True)
    # Inputs this large make float16 rounding of the projections dominate:
    # compare relative to the output's scale.
    scale = np.abs(expected).max()
    assert_close(out / scale, expected / scale, dtype="float16")
    loss = model.train_on_batch(x, np.zeros_like(x))
    assert np.isfinite(loss)


# ----------------------------------------------------------------------------
# Masks: one meaning for every dtype, on every path.


@pytest.mark.parametrize("path", PATHS)
def test_integer_mask_means_nonzero_may_attend(path):
    g, q, k, v = _qkv(3)
    allowed = g.random((2, 1, 6, 7)) > 0.4
    allowed[1, 0, 2] = False
    as_int = (allowed * g.integers(1, 4, allowed.shape)).astype("int32")  # 0 or 1..3
    out = sdpa(q, k, v, mask=as_int, implementation=path)
    expected, _ = reference.scaled_dot_product_attention(q, k, v, mask=allowed)
    assert_close(out, expected, what=f"{path} int mask")
    assert_close(sdpa(q, k, v, mask=as_int.astype("uint8"), implementation=path), expected)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("values", [(1.0, 0.0), (1.0, 0.5), (0.0, -np.inf)])
def test_floating_mask_is_refused_with_a_pointer_to_bias(path, values):
    g, q, k, v = _qkv(4)
    mask = np.where(g.random((6, 7)) > 0.5, *values).astype("float32")
    with pytest.raises(ValueError, match=r"`mask` must be a bool or integer.*`bias=`.*"
                                         r"Received: mask.dtype=float32"):
        sdpa(q, k, v, mask=mask, implementation=path)


def test_mha_floating_attention_mask_is_refused():
    x = randn(rng(5), 2, 5, 8)
    with pytest.raises(ValueError, match=r"`attention_mask` must be a bool or integer.*"
                                         r"Received: attention_mask.dtype=float32"):
        keras_attn.MultiHeadAttention(2, 4)(x, attention_mask=np.ones((2, 5, 5), "float32"))


def test_mha_integer_attention_mask_equals_bool():
    g = rng(6)
    x = randn(g, 2, 5, 8)
    allowed = g.random((2, 5, 5)) > 0.4
    layer = keras_attn.MultiHeadAttention(2, 4)
    assert_close(layer(x, attention_mask=allowed.astype("int32")),
                 to_numpy(layer(x, attention_mask=allowed)))


@pytest.mark.parametrize("dtype", ["int32", "bool"])
def test_non_floating_inputs_are_refused(dtype):
    q = np.ones((2, 3, 4), dtype)
    for name, args in (("query", (q, q.astype("float32"), q.astype("float32"))),
                       ("key", (q.astype("float32"), q, q.astype("float32"))),
                       ("value", (q.astype("float32"), q.astype("float32"), q))):
        with pytest.raises(ValueError, match=rf"`{name}` must be a floating tensor.*"
                                             rf"Received: {name}.dtype={dtype}"):
            sdpa(*args)
    with pytest.raises(ValueError, match=rf"`query` must be a floating.*{dtype}"):
        keras_attn.MultiHeadAttention(2, 4)(q)


# ----------------------------------------------------------------------------
# NaN stored in padding never reaches an output.


@pytest.mark.parametrize("path", ["auto"] + PATHS)
@pytest.mark.parametrize("how", ["mask", "bias"])
def test_nan_in_masked_out_keys_does_not_leak(path, how):
    g, q, k, v = _qkv(7)
    keep = np.ones((2, 1, 1, 7), bool)
    keep[0, ..., 5:] = False  # the last two keys of sequence 0 are padding
    k[0, :, 5:] = np.nan
    v[0, :, 5:] = np.inf
    mask, bias = (keep, None) if how == "mask" else (None, np.where(keep, 0, -np.inf))
    out = sdpa(q, k, v, mask=mask, bias=None if bias is None else bias.astype("float32"),
               is_causal=False, implementation=path)
    assert np.isfinite(to_numpy(out)).all()
    clean_k, clean_v = k.copy(), v.copy()
    clean_k[0, :, 5:], clean_v[0, :, 5:] = 0.0, 0.0
    expected, _ = reference.scaled_dot_product_attention(q, clean_k, clean_v, mask=keep)
    assert_close(out, expected, what=f"{path} with NaN padding")


@pytest.mark.parametrize("path", ["auto"] + PATHS)
def test_mha_nan_in_padded_values_does_not_leak(path):
    g = rng(8)
    x, memory = randn(g, 2, 5, 8), randn(g, 2, 6, 8)
    lengths = np.array([6, 3])
    memory[1, 3:] = np.nan
    key_mask = np.arange(6)[None, :] < lengths[:, None]
    layer = keras_attn.MultiHeadAttention(2, 4, implementation=path)
    out = to_numpy(layer(x, memory, value_mask=key_mask))
    assert np.isfinite(out).all()
    clean = np.nan_to_num(memory)
    expected, _ = reference.multi_head_attention(
        reference_params(layer), x, clean, num_heads=2, mask=key_mask[:, None, :])
    assert_close(out, expected)


# ----------------------------------------------------------------------------
# Empty sequences.


@pytest.mark.parametrize("path", ["auto"] + PATHS)
@pytest.mark.parametrize("T,S", [(0, 5), (4, 0), (0, 0)])
def test_empty_sequences(path, T, S):
    g, q, k, v = _qkv(9, T=T, S=S)
    mask = np.ones((T, S), bool)
    for kwargs in ({}, {"mask": mask}, {"is_causal": True}):
        out = to_numpy(sdpa(q, k, v, implementation=path, **kwargs))
        assert out.shape == (2, 2, T, 3)
        np.testing.assert_array_equal(out, 0.0)
    out, weights = sdpa(q, k, v, return_attention_scores=True, implementation=path)
    assert tuple(weights.shape) == (2, 2, T, S)


@pytest.mark.requires_trainable_backend
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("T,S", [(0, 5), (4, 0)])
def test_empty_sequence_gradients_are_zero(path, T, S):
    g, q, k, v = _qkv(10, T=T, S=S)

    def loss(q_, k_, v_):
        return keras.ops.sum(sdpa(q_, k_, v_, is_causal=True, implementation=path))

    value, grads = _device.value_and_grad(loss, [q, k, v])
    assert value == 0.0
    for grad, x in zip(grads, (q, k, v), strict=True):
        assert grad.shape == x.shape
        np.testing.assert_array_equal(grad, 0.0)


def test_mha_empty_query_and_source():
    g = rng(11)
    layer = keras_attn.MultiHeadAttention(2, 4)
    assert tuple(layer(randn(g, 2, 0, 8), randn(g, 2, 5, 8)).shape) == (2, 0, 8)
    out = to_numpy(layer(randn(g, 2, 3, 8), randn(g, 2, 0, 8)))
    assert out.shape == (2, 3, 8)
    # No key to attend: the attention output is zero, so only the output bias remains.
    np.testing.assert_allclose(out, np.broadcast_to(to_numpy(layer.output_dense.bias), out.shape))


# ----------------------------------------------------------------------------
# Shape mismatches the layer can see.


def test_mha_batch_mismatch():
    g = rng(12)
    with pytest.raises(ValueError, match=r"same batch size B.*query.shape=\(2, 5, 8\).*"
                                         r"value.shape=\(3, 5, 8\)"):
        keras_attn.MultiHeadAttention(2, 4)(randn(g, 2, 5, 8), randn(g, 3, 5, 8))


def test_functional_batch_mismatch():
    g = rng(13)
    with pytest.raises(ValueError, match=r"broadcastable leading dims.*Received: "
                                         r"query.shape=\(2, 5, 4\), key.shape=\(3, 5, 4\)"):
        sdpa(randn(g, 2, 5, 4), randn(g, 3, 5, 4), randn(g, 3, 5, 4))


def test_built_layer_called_on_another_width():
    g = rng(14)
    layer = keras_attn.MultiHeadAttention(2, 4)
    layer(randn(g, 2, 5, 8))
    with pytest.raises(ValueError, match=r"built for `query` of width 8.*"
                                         r"Received: query.shape=\(2, 5, 6\)"):
        layer(randn(g, 2, 5, 6))
    with pytest.raises(ValueError, match=r"built for `value` of width 8.*"
                                         r"Received: value.shape=\(2, 5, 3\)"):
        layer(randn(g, 2, 5, 8), randn(g, 2, 5, 3))


# ----------------------------------------------------------------------------
# Regressions found by the property tests (tests/kernels/test_properties.py).


@pytest.mark.parametrize("path", PATHS)
def test_rank_one_mask_with_nan_in_a_masked_key(path):
    """A mask of shape (S,) (found by Hypothesis: the dead-key reduction assumed rank >= 2)."""
    g, q, k, v = _qkv(20, T=1, S=3)
    keep = np.array([True, False, True])
    v[..., 1, :] = np.nan
    out = sdpa(q, k, v, mask=keep, implementation=path)
    clean = v.copy()
    clean[..., 1, :] = 0.0
    expected, _ = reference.scaled_dot_product_attention(q, k, clean, mask=keep)
    assert_close(out, expected)


@pytest.mark.parametrize("path", PATHS)
def test_integer_mask_of_256_means_may_attend(path):
    """Found by Hypothesis (thorough, torch): a uint8 cast read 256 as 0 on the blockwise path."""
    g, q, k, v = _qkv(21, T=2, S=3)
    mask = np.array([[256, 0, 1], [0, 512, 0]], "int32")
    out = sdpa(q, k, v, mask=mask, implementation=path)
    expected, _ = reference.scaled_dot_product_attention(q, k, v, mask=mask != 0)
    assert_close(out, expected)


def test_encoder_and_decoder_declare_their_output_shape():
    """Found by Hypothesis: compute_output_shape raised NotImplementedError."""
    for cls in (keras_attn.TransformerEncoderLayer, keras_attn.TransformerDecoderLayer):
        assert cls(2, intermediate_dim=8).compute_output_shape((3, 5, 8)) == (3, 5, 8)
