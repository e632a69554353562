"""`residual_scale`: every residual branch times s (Granite's `residual_multiplier`)."""

import numpy as np
import pytest

import keras_attn
from keras_attn.testing import reference
from keras_attn.testing.weights import randomize_weights, reference_params

from ..helpers import UNCACHED, assert_close, randn, rng, to_numpy

B, T, S, D, H = 2, 6, 4, 8, 2
SCALE = 0.22  # granite-3's residual_multiplier


def test_encoder_post_ln_matches_the_reference():
    x = randn(rng(0), B, T, D)
    real = np.arange(T) < np.array([[T], [4]])
    layer = keras_attn.TransformerEncoderLayer(H, intermediate_dim=16, residual_scale=SCALE)
    layer.build(x.shape)
    randomize_weights(layer, seed=1)
    out = to_numpy(layer(x, padding_mask=real))
    params = reference_params(layer)
    expected = reference.encoder_layer(params, x, num_heads=H, padding_mask=real,
                                       residual_scale=SCALE)
    assert_close(out, expected)
    # Ablation: the unscaled block is far away.
    plain = reference.encoder_layer(params, x, num_heads=H, padding_mask=real)
    assert np.abs(plain - out).max() > 0.1


def test_decoder_pre_ln_with_memory_and_sandwich_norms_matches_the_reference():
    g = rng(2)
    x, memory = randn(g, B, T, D), randn(g, B, S, D)
    layer = keras_attn.TransformerDecoderLayer(
        H, intermediate_dim=16, normalize_first=True, normalization="rms",
        use_post_attention_norm=True, use_post_ffw_norm=True, gated_feed_forward=True,
        activation="silu", num_key_value_heads=1, rope_max_wavelength=1e4,
        residual_scale=SCALE)
    layer.build(x.shape, memory.shape)
    randomize_weights(layer, seed=3)
    out = to_numpy(layer(x, memory))
    params = reference_params(layer)
    options = {"num_key_value_heads": 1, "rope_max_wavelength": 1e4}
    expected = reference.decoder_layer(params, x, num_heads=H, memory=memory,
                                       normalize_first=True, epsilon=1e-5,
                                       activation_name="silu", attention_options=options,
                                       residual_scale=SCALE)
    assert_close(out, expected)
    plain = reference.decoder_layer(params, x, num_heads=H, memory=memory,
                                    normalize_first=True, activation_name="silu",
                                    attention_options=options)
    assert np.abs(plain - out).max() > 0.1


def test_cached_decoding_with_a_residual_scale_is_the_uncached_forward():
    x = randn(rng(4), B, T, D)
    layer = keras_attn.TransformerDecoderLayer(H, intermediate_dim=16, normalize_first=True,
                                               residual_scale=SCALE)
    layer.build(x.shape)
    randomize_weights(layer, seed=5)
    full = to_numpy(layer(x))
    cache = keras_attn.empty_cache(layer, B, T)
    first, cache = layer(x[:, :4], self_attention_cache=cache,
                         self_attention_cache_update_index=0)
    rest, cache = layer(x[:, 4:], self_attention_cache=cache,
                        self_attention_cache_update_index=4)
    assert_close(np.concatenate([to_numpy(first), to_numpy(rest)], 1), full, against=UNCACHED)


def test_config_holds_the_scale_only_when_set():
    cls = keras_attn.TransformerDecoderLayer
    assert "residual_scale" not in cls(H, intermediate_dim=16).get_config()
    config = cls(H, intermediate_dim=16, residual_scale=0.5).get_config()
    assert config["residual_scale"] == 0.5
    assert cls.from_config(config).residual_scale == 0.5
    del config["residual_scale"]  # a config saved before the option: the default
    assert cls.from_config(config).residual_scale is None
    for bad in (0.0, -1.0, float("nan"), "0.5"):
        with pytest.raises(ValueError, match=r"Received: residual_scale="):
            cls(H, intermediate_dim=16, residual_scale=bad)
