"""Bias per projection, Keras's gated attention output (`use_gate`) and sandwich norms.

Each option is checked against the float64 reference with random weights far
from identity (biases and norm scales included), and each test also shows that
dropping the option moves the output far beyond the tolerance.
"""

import os
import tempfile

import keras
import numpy as np
import pytest

import keras_attn
from keras_attn._policy import observe_paths
from keras_attn.testing import reference
from keras_attn.testing.weights import randomize_weights, reference_params

from ..helpers import UNCACHED, assert_close, randn, rng, to_numpy

B, T, D, H, H_KV, d = 2, 7, 16, 4, 2, 8


def _mha(x, **kwargs):
    layer = keras_attn.MultiHeadAttention(H, d, num_key_value_heads=H_KV, **kwargs)
    layer.build(x.shape)
    randomize_weights(layer, seed=3)
    return layer


def _far(actual, expected):
    """The relative distance that an ablation must exceed (tolerances are ~1e-5)."""
    return np.abs(to_numpy(actual) - expected).max() / np.abs(expected).max()


def test_output_use_bias_drops_only_the_output_bias():
    x = randn(rng(0), B, T, D)
    layer = _mha(x, output_use_bias=False)
    assert layer.query_dense.bias is not None and layer.value_dense.bias is not None
    assert layer.output_dense.bias is None
    assert not hasattr(layer, "gate_dense")
    params = reference_params(layer)
    expected, _ = reference.multi_head_attention(
        params, x, num_heads=H, num_key_value_heads=H_KV, is_causal=True)
    assert_close(layer(x, use_causal_mask=True), expected)
    # The default keeps Keras's all-or-nothing `use_bias`.
    assert _mha(x).output_dense.bias is not None
    assert _mha(x, use_bias=False, output_use_bias=True).query_dense.bias is None


@pytest.mark.parametrize("implementation", ["explicit", "fused", "blockwise"])
def test_use_gate_matches_the_reference_on_every_path(implementation):
    x = randn(rng(1), B, T, D)
    layer = _mha(x, use_gate=True, implementation=implementation)
    assert tuple(layer.gate_dense.kernel.shape) == (D, H * d)
    params = reference_params(layer)
    expected, _ = reference.multi_head_attention(
        params, x, num_heads=H, num_key_value_heads=H_KV, is_causal=True)
    with observe_paths() as paths:
        output = layer(x, use_causal_mask=True)
    assert paths[implementation] >= 1, dict(paths)
    assert_close(output, expected)
    del params["gate"]
    ungated, _ = reference.multi_head_attention(
        params, x, num_heads=H, num_key_value_heads=H_KV, is_causal=True)
    assert _far(output, ungated) > 0.1


def test_use_gate_over_a_cache_matches_the_uncached_forward():
    x = randn(rng(2), B, T, D)
    layer = _mha(x, use_gate=True, rope_max_wavelength=100.0)
    full = to_numpy(layer(x, use_causal_mask=True))
    cache = layer.empty_cache(B, T + 1)
    steps = []
    for start, stop in ((0, 4), (4, 5), (5, 6), (6, 7)):
        out, cache = layer(x[:, start:stop], use_causal_mask=True, cache=cache,
                           cache_update_index=start)
        steps.append(to_numpy(out))
    assert_close(np.concatenate(steps, axis=1), full, against=UNCACHED)


def test_a_keras_config_with_use_gate_false_loads():
    # Keras 3.15's MultiHeadAttention writes `use_gate` in every config.
    config = {"num_heads": H, "key_dim": d, "value_dim": d, "use_gate": False,
              "use_bias": True, "output_shape": None, "attention_axes": None}
    layer = keras_attn.MultiHeadAttention.from_config(config)
    assert layer.use_gate is False and layer.output_use_bias is True


def _decoder(x, **kwargs):
    layer = keras_attn.TransformerDecoderLayer(
        H, intermediate_dim=32, num_key_value_heads=H_KV, normalization="rms",
        normalize_first=True, gated_feed_forward=True, activation="silu",
        rope_max_wavelength=100.0, **kwargs)
    layer.build(x.shape)
    randomize_weights(layer, seed=4)
    return layer


def _reference_decoder(layer, params, x):
    return reference.decoder_layer(
        params, x, H, normalize_first=True, epsilon=layer.layer_norm_epsilon,
        activation_name="silu", attention_options=dict(
            num_key_value_heads=H_KV, rope_max_wavelength=100.0))


def test_sandwich_norms_and_biases_per_projection_match_the_reference():
    # Gemma 2 / 3's sandwich with Qwen 2's biases (q, k, v only): every switch at once.
    x = randn(rng(5), B, T, D)
    layer = _decoder(x, use_post_attention_norm=True, use_post_ffw_norm=True,
                     attention_use_bias=True, attention_output_use_bias=False,
                     feed_forward_use_bias=False)
    attention = layer.self_attention
    assert attention.query_dense.bias is not None and attention.output_dense.bias is None
    assert layer.feed_forward.gate_dense.bias is None
    assert isinstance(layer.post_attention_norm, keras.layers.RMSNormalization)
    params = reference_params(layer)
    assert {"post_attention_norm", "post_feed_forward_norm"} <= set(params)
    output = layer(x)
    assert_close(output, _reference_decoder(layer, params, x))
    for norm in ("post_attention_norm", "post_feed_forward_norm"):
        ablated = dict(params)
        del ablated[norm]
        assert _far(output, _reference_decoder(layer, ablated, x)) > 0.1, norm


def test_the_bias_switches_default_to_use_bias():
    x = randn(rng(6), B, T, D)
    layer = _decoder(x, use_bias=False)
    assert (layer.attention_use_bias, layer.attention_output_use_bias,
            layer.feed_forward_use_bias) == (False, False, False)
    assert layer.post_attention_norm is None and layer.post_feed_forward_norm is None
    layer = _decoder(x, attention_use_bias=False)  # the output follows q/k/v, the FFN use_bias
    assert (layer.attention_output_use_bias, layer.feed_forward_use_bias) == (False, True)


def test_sandwich_norms_reach_the_cross_attention_and_the_encoder():
    x, memory = randn(rng(7), B, T, D), randn(rng(8), B, 5, D)
    decoder = keras_attn.TransformerDecoderLayer(H, intermediate_dim=32,
                                                 use_post_attention_norm=True)
    decoder.build(x.shape, memory.shape)
    randomize_weights(decoder, seed=9)
    params = reference_params(decoder)
    assert "post_cross_attention_norm" in params
    expected = reference.decoder_layer(params, x, H, memory=memory)
    assert_close(decoder(x, memory), expected)
    encoder = keras_attn.TransformerEncoderLayer(H, intermediate_dim=32, use_post_ffw_norm=True)
    encoder.build(x.shape)
    randomize_weights(encoder, seed=10)
    assert_close(encoder(x), reference.encoder_layer(reference_params(encoder), x, H))


def test_the_options_round_trip_through_a_keras_file():
    x = randn(rng(11), B, T, D)
    inputs = keras.Input((T, D))
    hidden = keras_attn.TransformerDecoderLayer(
        H, intermediate_dim=32, use_post_attention_norm=True, use_post_ffw_norm=True,
        attention_use_bias=True, attention_output_use_bias=False,
        feed_forward_use_bias=False)(inputs)
    outputs = keras_attn.MultiHeadAttention(H, d, use_gate=True, output_use_bias=False)(hidden)
    model = keras.Model(inputs, outputs)
    for layer in model.layers[1:]:
        randomize_weights(layer, seed=12)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "m.keras")
        model.save(path)
        loaded = keras.saving.load_model(path)
    block, attention = loaded.layers[1], loaded.layers[2]
    assert (block.use_post_attention_norm, block.attention_output_use_bias,
            block.feed_forward_use_bias) == (True, False, False)
    assert attention.use_gate and not attention.output_use_bias
    assert_close(loaded(x), to_numpy(model(x)), against=UNCACHED)
