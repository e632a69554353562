"""`use_input_norm=False`: the block without norms before its sublayers,
`x + N_post(f(x))` per sublayer (OLMo 2 and 3, EXAONE 4)."""

import os
import tempfile

import keras
import numpy as np
import pytest

import keras_attn
from keras_attn.testing import reference
from keras_attn.testing.weights import randomize_weights, reference_params

from ..helpers import UNCACHED, assert_close, randn, rng, to_numpy
from ..shapes import B, D, H, S, T

POST_NORM = dict(normalize_first=True, normalization="rms", use_post_attention_norm=True,
                 use_post_ffw_norm=True, use_input_norm=False, gated_feed_forward=True,
                 activation="silu")
OPTIONS = {"num_key_value_heads": 1, "rope_max_wavelength": 1e4}
INPUT_NORMS = ("self_attention_norm", "cross_attention_norm", "feed_forward_norm")
# The numerics run on torch and numpy (the CI budget): on JAX and TensorFlow the same
# blocks are checked through the olmo2 / olmo3 / exaone4 fixtures
# (tests/convert/test_family_fixtures.py), against transformers.
numerics = pytest.mark.skipif(keras.backend.backend() in ("jax", "tensorflow"),
                              reason="on jax/tensorflow through the family fixtures")


def _block(memory=None, seed=1):
    g = rng(seed)
    x = randn(g, B, T, D)
    layer = keras_attn.TransformerDecoderLayer(H, intermediate_dim=16, **POST_NORM, **OPTIONS)
    layer.build(x.shape, None if memory is None else memory.shape)
    randomize_weights(layer, seed=seed + 1)
    return layer, x


@numerics
def test_decoder_with_memory_matches_the_reference_and_has_no_input_norms():
    memory = randn(rng(7), B, S, D)
    layer, x = _block(memory)
    # The path: the input norms are not made (no weights), the post norms are.
    names = {w.path.split("/")[1] for w in layer.weights}
    assert not names & set(INPUT_NORMS), names
    assert {"post_attention_norm", "post_cross_attention_norm",
            "post_feed_forward_norm"} <= names
    out = to_numpy(layer(x, memory))
    params = reference_params(layer)
    assert not set(INPUT_NORMS) & set(params)
    expected = reference.decoder_layer(params, x, num_heads=H, memory=memory,
                                       normalize_first=True, activation_name="silu",
                                       attention_options=OPTIONS)
    assert_close(out, expected)
    # Ablation: the same norms before the sublayers (pre-norm, x + f(N(x))) are far away.
    moved = {k: v for k, v in params.items() if not k.startswith("post_")}
    moved.update(self_attention_norm=params["post_attention_norm"],
                 cross_attention_norm=params["post_cross_attention_norm"],
                 feed_forward_norm=params["post_feed_forward_norm"])
    pre = reference.decoder_layer(moved, x, num_heads=H, memory=memory, normalize_first=True,
                                  activation_name="silu", attention_options=OPTIONS)
    assert np.abs(pre - out).max() > 0.1


@numerics
def test_encoder_matches_the_reference():
    x = randn(rng(3), B, T, D)
    real = np.arange(T) < np.array([[T], [3]])
    layer = keras_attn.TransformerEncoderLayer(H, intermediate_dim=16, **POST_NORM)
    layer.build(x.shape)
    randomize_weights(layer, seed=4)
    out = to_numpy(layer(x, padding_mask=real))
    expected = reference.encoder_layer(reference_params(layer), x, num_heads=H,
                                       padding_mask=real, normalize_first=True,
                                       activation_name="silu")
    assert_close(out, expected)


@numerics
def test_cached_decoding_is_the_uncached_forward():
    layer, x = _block(seed=5)
    full = to_numpy(layer(x))
    cache = keras_attn.empty_cache(layer, B, T)
    first, cache = layer(x[:, :3], self_attention_cache=cache,
                         self_attention_cache_update_index=0)
    rest, cache = layer(x[:, 3:], self_attention_cache=cache,
                        self_attention_cache_update_index=3)
    assert_close(np.concatenate([to_numpy(first), to_numpy(rest)], 1), full, against=UNCACHED)


@numerics
def test_config_and_keras_file_round_trip():
    cls = keras_attn.TransformerDecoderLayer
    assert "use_input_norm" not in cls(H, intermediate_dim=16).get_config()  # today's config
    layer, x = _block(seed=9)
    config = layer.get_config()
    assert config["use_input_norm"] is False
    assert cls.from_config(config).use_input_norm is False
    model = keras.Sequential([keras.Input((T, D)), layer])
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "block.keras")
        model.save(path)
        loaded = keras.saving.load_model(path)
    assert loaded.layers[0].use_input_norm is False
    assert_close(to_numpy(loaded(x)), to_numpy(model(x)), against="the saved block")


@pytest.mark.backend_independent
@pytest.mark.parametrize("changes", [
    {"normalize_first": False},  # post-LN: the input norm is the block's only norm
    {"use_post_attention_norm": False},
    {"use_post_ffw_norm": False},
    {"use_post_attention_norm": False, "use_post_ffw_norm": False},
])
def test_an_unnormalised_sublayer_is_refused_naming_the_arguments(changes):
    with pytest.raises(ValueError, match=r"Received: use_input_norm=False, normalize_first="):
        keras_attn.TransformerDecoderLayer(H, intermediate_dim=16, **{**POST_NORM, **changes})


@pytest.mark.backend_independent
def test_a_non_bool_is_refused():
    with pytest.raises(ValueError, match=r"Received: use_input_norm=0"):
        keras_attn.TransformerDecoderLayer(H, intermediate_dim=16, use_input_norm=0)
