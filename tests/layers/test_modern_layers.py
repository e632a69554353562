"""The modern options of the layers against the float64 reference.

RotaryEmbedding, MultiHeadAttention with grouped heads / RoPE / windows /
soft-cap / qk-norm, the gated feed-forward, and a Llama-style decoder block
(pre-RMSNorm, GQA + RoPE, SwiGLU, no biases) as one TransformerDecoderLayer.
"""

import keras
import numpy as np
import pytest

import keras_attn
from keras_attn.testing.weights import randomize_weights, reference_params

from .. import reference
from ..helpers import assert_close, randn, rng, to_numpy

BACKEND = keras.backend.backend()


# ----------------------------------------------------------------------------
# RoPE


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("rank", [3, 4])
def test_rotary_embedding_matches_reference(interleaved, rank):
    g = rng(0)
    x = randn(g, 2, 7, 3, 8) if rank == 4 else randn(g, 2, 7, 8)
    layer = keras_attn.RotaryEmbedding(max_wavelength=500, scaling_factor=2.0,
                                       interleaved=interleaved)
    out = layer(x, start_index=4)
    as_heads = np.swapaxes(x, 1, 2) if rank == 4 else x  # reference wants (..., L, d)
    expected = reference.rotary_embedding(as_heads, np.arange(7) + 4, max_wavelength=500,
                                          scaling_factor=2.0, interleaved=interleaved)
    assert_close(out, np.swapaxes(expected, 1, 2) if rank == 4 else expected)
    positions = np.array([3, 1, 4, 1, 5, 9, 2])
    assert_close(layer(x, positions=positions), to_numpy(keras_attn.rotary_embedding(
        x, positions, max_wavelength=500, scaling_factor=2.0, interleaved=interleaved)))


def test_rotary_hand_checkable_values():
    """d = 2, position 1, base irrelevant (theta_0 = 1): a rotation by 1 radian."""
    x = np.array([[[1.0, 0.0], [1.0, 0.0]]], "float32")  # (1, 2, 2): positions 0 and 1
    out = to_numpy(keras_attn.rotary_embedding(x))
    np.testing.assert_allclose(out[0, 0], [1.0, 0.0], atol=1e-7)
    np.testing.assert_allclose(out[0, 1], [np.cos(1.0), np.sin(1.0)], atol=1e-6)


def test_rotary_angles_in_float32_for_half_precision():
    x = np.ones((1, 4096, 2), "float32")
    out = keras_attn.rotary_embedding(keras.ops.cast(x, "float16"), start_index=60000)
    expected = reference.rotary_embedding(x, np.arange(4096) + 60000)
    assert_close(keras.ops.cast(out, "float32"), expected, dtype="float16")


def test_rotary_rejects_odd_width_and_round_trips():
    with pytest.raises(ValueError, match=r"must be even.*Received: x.shape=\(2, 3, 5\)"):
        keras_attn.RotaryEmbedding()(np.ones((2, 3, 5), "float32"))
    layer = keras_attn.RotaryEmbedding(1000, 4.0, interleaved=True)
    again = keras_attn.RotaryEmbedding.from_config(layer.get_config())
    assert (again.max_wavelength, again.scaling_factor, again.interleaved) == (1000, 4.0, True)


# ----------------------------------------------------------------------------
# MultiHeadAttention


OPTIONS = {
    "gqa": dict(num_key_value_heads=2),
    "mqa_rope": dict(num_key_value_heads=1, rope_max_wavelength=100.0),
    "rope_interleaved_scaled": dict(rope_max_wavelength=50.0, rope_scaling_factor=4.0,
                                    rope_interleaved=True),
    "window_gqa": dict(num_key_value_heads=2, sliding_window=3),
    "soft_cap": dict(logit_soft_cap=1.5),
    "qk_rms_rope": dict(qk_norm="rms", rope_max_wavelength=10000.0, num_key_value_heads=2),
    "qk_layer": dict(qk_norm="layer"),
    "scale_gqa": dict(scale=1.3, num_key_value_heads=2),
}


@pytest.mark.parametrize("path", ["auto", "explicit", "fused", "blockwise"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_mha_options_match_reference(name, causal, path):
    options = OPTIONS[name]
    if path == "fused" and "logit_soft_cap" in options:
        pytest.skip("the fused kernel cannot soft-cap (a ValueError, tested elsewhere)")
    g = rng(len(name))
    x, memory = randn(g, 2, 6, 12), randn(g, 2, 9, 10)
    layer = keras_attn.MultiHeadAttention(4, 4, implementation=path, **options)
    layer.build(x.shape, memory.shape)
    randomize_weights(layer, seed=1)
    if "num_key_value_heads" in options:
        assert tuple(layer.key_dense.kernel.shape) == (10, options["num_key_value_heads"] * 4)
    mask = g.random((2, 6, 9)) > 0.2
    out = layer(x, memory, attention_mask=mask, use_causal_mask=causal)
    expected, _ = reference.multi_head_attention(
        reference_params(layer), x, memory, num_heads=4, mask=mask, is_causal=causal,
        qk_norm_epsilon=layer.qk_norm_epsilon, **options)
    assert_close(out, expected, what=f"{name} {path}")


def test_mha_option_errors():
    with pytest.raises(ValueError, match=r"divisible by `num_key_value_heads`.*num_heads=4, "
                                         r"num_key_value_heads=3"):
        keras_attn.MultiHeadAttention(4, 8, num_key_value_heads=3)
    with pytest.raises(ValueError, match=r"even.*Received: key_dim=5"):
        keras_attn.MultiHeadAttention(4, 5, rope_max_wavelength=10000)
    with pytest.raises(ValueError, match=r"Received: sliding_window=0"):
        keras_attn.MultiHeadAttention(4, 8, sliding_window=0)
    with pytest.raises(ValueError, match=r"Received: scale=0"):
        keras_attn.MultiHeadAttention(4, 8, scale=0)
    with pytest.raises(ValueError, match=r"Received: logit_soft_cap=0"):
        keras_attn.MultiHeadAttention(4, 8, logit_soft_cap=0)
    with pytest.raises(ValueError, match=r"Received: qk_norm='batch'"):
        keras_attn.MultiHeadAttention(4, 8, qk_norm="batch")
    with pytest.raises(ValueError, match=r"even.*Received: key_dim=3"):
        keras_attn.TransformerDecoderLayer(4, intermediate_dim=8, rope_max_wavelength=1e4)(
            np.ones((1, 2, 12), "float32"))


# ----------------------------------------------------------------------------
# Feed-forward and blocks


@pytest.mark.parametrize("activation", ["silu", "gelu"])
def test_gated_feed_forward_matches_reference(activation):
    g = rng(3)
    x = randn(g, 2, 5, 8)
    layer = keras_attn.PositionwiseFeedForward(16, activation=activation, gated=True,
                                               use_bias=False)
    layer.build(x.shape)
    randomize_weights(layer, seed=3)
    assert [w.path.split("/")[-2] for w in layer.weights] == [
        "gate_dense", "intermediate_dense", "output_dense"]
    assert_close(layer(x), reference.feed_forward(reference_params(layer), x, activation))


LLAMA = dict(num_key_value_heads=2, rope_max_wavelength=10000.0, normalization="rms",
             normalize_first=True, use_bias=False, gated_feed_forward=True, activation="silu",
             layer_norm_epsilon=1e-6)


def _llama_block(**extra):
    return keras_attn.TransformerDecoderLayer(4, intermediate_dim=24, **LLAMA, **extra)


@pytest.mark.parametrize("window", [None, 3])
def test_llama_style_decoder_block_matches_reference(window):
    g = rng(4)
    x = randn(g, 2, 7, 16)
    layer = _llama_block(sliding_window=window)
    layer.build(x.shape)
    randomize_weights(layer, seed=4)
    assert not any(w.path.endswith("bias") for w in layer.weights)
    assert isinstance(layer.self_attention_norm, keras.layers.RMSNormalization)
    padding = np.arange(7)[None, :] < np.array([[7], [5]])
    out = layer(x, padding_mask=padding)
    options = dict(num_key_value_heads=2, rope_max_wavelength=10000.0, sliding_window=window)
    expected = reference.decoder_layer(
        reference_params(layer), x, num_heads=4, padding_mask=padding, normalize_first=True,
        epsilon=1e-6, activation_name="silu", attention_options=options)
    assert_close(out, expected)


def test_encoder_with_modern_options_matches_reference():
    g = rng(5)
    x = randn(g, 2, 6, 16)
    layer = keras_attn.TransformerEncoderLayer(
        4, intermediate_dim=24, num_key_value_heads=1, rope_max_wavelength=100.0,
        rope_interleaved=True, sliding_window=2, qk_norm="rms", normalization="rms",
        gated_feed_forward=True, activation="gelu")
    layer.build(x.shape)
    randomize_weights(layer, seed=5)
    options = dict(num_key_value_heads=1, rope_max_wavelength=100.0, rope_interleaved=True,
                   sliding_window=2, qk_norm="rms")
    expected = reference.encoder_layer(reference_params(layer), x, num_heads=4,
                                       activation_name="gelu", attention_options=options)
    assert_close(layer(x), expected)


def test_modern_block_saves_and_loads(tmp_path):
    g = rng(6)
    inputs = keras.Input((None, 16))
    block = _llama_block(sliding_window=4, logit_soft_cap=30.0, qk_norm="rms",
                         rope_interleaved=True, rope_scaling_factor=2.0)
    model = keras.Model(inputs, block(inputs))
    randomize_weights(block, seed=6)
    path = str(tmp_path / "block.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    x = randn(g, 2, 9, 16)
    assert_close(loaded.predict_on_batch(x), model.predict_on_batch(x))
    config = loaded.layers[-1].get_config()
    for key, value in dict(LLAMA, sliding_window=4, logit_soft_cap=30.0, qk_norm="rms",
                           rope_interleaved=True, rope_scaling_factor=2.0).items():
        assert config[key] == value or keras.activations.get(config[key]) == keras.activations.get(
            value), key


@pytest.mark.requires_trainable_backend
def test_llama_block_trains_under_mixed_bfloat16():
    keras.config.set_dtype_policy("mixed_bfloat16")
    g = rng(7)
    inputs = keras.Input((8, 16))
    block = _llama_block(qk_norm="rms")
    model = keras.Model(inputs, block(inputs))
    # Small weights keep the logits O(1): bfloat16's 8 bits on logits of ~20 would move
    # the softmax by more than any tolerance says about the layer.
    randomize_weights(block, seed=7, scale=0.2)
    model.compile(keras.optimizers.SGD(1e-2), "mse", jit_compile=BACKEND != "torch")
    x = randn(g, 4, 8, 16)
    out = model.predict_on_batch(x)
    expected = reference.decoder_layer(
        reference_params(block), x, num_heads=4, normalize_first=True, epsilon=1e-6,
        activation_name="silu",
        attention_options=dict(num_key_value_heads=2, rope_max_wavelength=10000.0, qk_norm="rms"))
    assert_close(out, expected, dtype="bfloat16")
    loss = model.train_on_batch(x, np.zeros_like(x))
    assert np.isfinite(loss)
