"""`use_parallel_residual`: the parallel block x + attn(N(x)) + ffn(N(x)), one norm (Cohere 2)."""

import keras
import numpy as np
import pytest

import keras_attn
from keras_attn.testing import reference
from keras_attn.testing.weights import randomize_weights, reference_params

from ..helpers import UNCACHED, assert_close, randn, rng, to_numpy

B, T, D, H = 2, 6, 8, 2
_KWARGS = dict(intermediate_dim=16, normalize_first=True, num_key_value_heads=1,
               rope_max_wavelength=1e4)


def _block(**kwargs):
    layer = keras_attn.TransformerDecoderLayer(H, use_parallel_residual=True,
                                               **{**_KWARGS, **kwargs})
    layer.build((B, T, D))
    randomize_weights(layer, seed=1)
    return layer


@pytest.mark.parametrize("kwargs", [{}, {"normalization": "rms", "gated_feed_forward": True,
                                         "activation": "silu", "use_post_attention_norm": True,
                                         "use_post_ffw_norm": True, "residual_scale": 0.5}])
def test_matches_the_float64_reference(kwargs):
    x = randn(rng(0), B, T, D)
    real = np.arange(T) < np.array([[T], [4]])
    layer = _block(**kwargs)
    assert layer.feed_forward_norm is None  # one norm: the self-attention's
    out = to_numpy(layer(x, padding_mask=real))
    params = reference_params(layer)
    options = {"num_key_value_heads": 1, "rope_max_wavelength": 1e4}
    common = dict(num_heads=H, padding_mask=real, normalize_first=True,
                  activation_name=kwargs.get("activation", "relu"), attention_options=options,
                  residual_scale=kwargs.get("residual_scale"))
    assert_close(out, reference.decoder_layer(params, x, parallel_residual=True, **common))
    # Ablation: the sequential block over the same weights (the one norm before both
    # sublayers) is far away.
    params["feed_forward_norm"] = params["self_attention_norm"]
    sequential = reference.decoder_layer(params, x, **common)
    assert np.abs(sequential - out).max() > 0.1


@pytest.mark.skipif(keras.backend.backend() == "jax",
                    reason="eager JAX compiles every op of the cached calls (about 15 s); "
                           "the cohere2 family fixture checks cached generate on JAX")
def test_cached_decoding_is_the_uncached_forward():
    x = randn(rng(2), B, T, D)
    layer = _block()
    full = to_numpy(layer(x))
    cache = keras_attn.empty_cache(layer, B, T)
    first, cache = layer(x[:, :4], self_attention_cache=cache,
                         self_attention_cache_update_index=0)
    rest, cache = layer(x[:, 4:], self_attention_cache=cache,
                        self_attention_cache_update_index=4)
    assert_close(np.concatenate([to_numpy(first), to_numpy(rest)], 1), full, against=UNCACHED)


def test_config_and_keras_round_trip(tmp_path):
    cls = keras_attn.TransformerDecoderLayer
    assert "use_parallel_residual" not in cls(H, intermediate_dim=16).get_config()
    layer = _block()
    config = layer.get_config()
    assert config["use_parallel_residual"] is True
    x = randn(rng(3), B, T, D)
    inputs = keras.Input((T, D))
    model = keras.Model(inputs, layer(inputs))
    path = str(tmp_path / "parallel.keras")
    model.save(path)
    restored = keras.saving.load_model(path)
    assert restored.layers[-1].use_parallel_residual
    assert_close(to_numpy(restored(x)), to_numpy(model(x)), against=UNCACHED)


def test_refuses_combinations_that_make_no_sense():
    cls = keras_attn.TransformerDecoderLayer
    with pytest.raises(ValueError, match=r"Received: use_parallel_residual=True, normalize_fir"):
        cls(H, intermediate_dim=16, use_parallel_residual=True)
    with pytest.raises(ValueError, match=r"Received: use_parallel_residual=1"):
        cls(H, intermediate_dim=16, normalize_first=True, use_parallel_residual=1)
    layer = cls(H, intermediate_dim=16, normalize_first=True, use_parallel_residual=True)
    with pytest.raises(ValueError, match=r"Received: use_parallel_residual=True, memory_shape"):
        layer.build((B, T, D), (B, 4, D))
