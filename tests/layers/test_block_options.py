"""The encoder and decoder take `implementation` and `attention_dropout`, like MHA."""

import os
import tempfile

import keras
import numpy as np
import pytest

import keras_attn
from keras_attn.testing.weights import randomize_weights

from ..helpers import UNCACHED, assert_close, randn, rng, to_numpy

B, T, D, H = 2, 6, 8, 2


@pytest.mark.parametrize("cls", [keras_attn.TransformerEncoderLayer,
                                 keras_attn.TransformerDecoderLayer])
def test_implementation_reaches_every_attention_sublayer(cls):
    x = randn(rng(1), B, T, D)
    outputs = {}
    for implementation in ("explicit", "fused", "blockwise"):
        layer = cls(H, intermediate_dim=16, implementation=implementation)
        layer.build(x.shape)
        randomize_weights(layer, seed=2)
        assert layer.self_attention.implementation == implementation
        assert layer.get_config()["implementation"] == implementation
        outputs[implementation] = to_numpy(layer(x))
    for implementation in ("fused", "blockwise"):
        assert_close(outputs[implementation], outputs["explicit"], what=implementation,
                     against=UNCACHED)
    with pytest.raises(ValueError, match=r"Received: implementation='flash'"):
        cls(H, intermediate_dim=16, implementation="flash")


@pytest.mark.requires_trainable_backend
def test_attention_dropout_acts_on_the_weights_in_training_only():
    x = randn(rng(3), B, T, D)
    layer = keras_attn.TransformerDecoderLayer(H, intermediate_dim=16, attention_dropout=0.5)
    memory = randn(rng(4), B, 4, D)
    layer.build(x.shape, memory.shape)
    randomize_weights(layer, seed=5)
    assert layer.self_attention.dropout == layer.cross_attention.dropout == 0.5
    inference = to_numpy(layer(x, memory, training=False))
    assert np.abs(to_numpy(layer(x, memory, training=True)) - inference).max() > 1e-2
    plain = keras_attn.TransformerDecoderLayer(H, intermediate_dim=16)
    plain.build(x.shape, memory.shape)
    for mine, theirs in zip(plain.weights, layer.weights, strict=True):
        mine.assign(theirs)
    assert_close(plain(x, memory, training=True), inference, against=UNCACHED)
    with pytest.raises(ValueError, match=r"Received: attention_dropout=1.5"):
        keras_attn.TransformerEncoderLayer(H, intermediate_dim=16, attention_dropout=1.5)


def test_the_options_round_trip_through_a_keras_file():
    x = randn(rng(6), B, T, D)
    inputs = keras.Input((T, D))
    outputs = keras_attn.TransformerEncoderLayer(
        H, intermediate_dim=16, implementation="explicit", attention_dropout=0.25)(inputs)
    model = keras.Model(inputs, outputs)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "m.keras")
        model.save(path)
        loaded = keras.saving.load_model(path)
    layer = loaded.layers[-1]
    assert (layer.implementation, layer.attention_dropout) == ("explicit", 0.25)
    assert_close(loaded(x), to_numpy(model(x)), against=UNCACHED)


def test_a_key_mask_of_shape_s_is_the_same_for_every_row():
    """(S,) broadcasts to (B, S): it used to be read as (S, 1, 1) against (B, H, T, S)."""
    x = randn(rng(7), B, T, D)
    layer = keras_attn.MultiHeadAttention(H, 4)
    keys = np.arange(T) != 2  # drop key 2 everywhere
    expected = to_numpy(layer(x, key_mask=np.broadcast_to(keys, (B, T))))
    assert_close(layer(x, key_mask=keys), expected, against=UNCACHED)
