"""`RotaryEmbedding(feature_axis=...)`: keras-hub's meaning (the features on any axis but
the sequence's), against a float64 NumPy reference written from keras-hub's definition
(move the features last and the sequence to axis 1, rotate the halves, move them back)."""

import keras
import numpy as np
import pytest

import keras_attn

from ..helpers import assert_close, randn, rng, to_numpy

BASE, FACTOR = 300.0, 2.0


def _keras_hub_rope(x, sequence_axis, feature_axis, positions=None, start_index=0):
    """keras-hub's RotaryEmbedding ("linear" rope type) in float64 NumPy."""
    moved = np.moveaxis(np.asarray(x, np.float64), (feature_axis, sequence_axis), (-1, 1))
    length, dim = moved.shape[1], moved.shape[-1]
    if positions is None:
        positions = np.arange(length) + start_index
    positions = np.asarray(positions, np.float64).reshape(-1, length)  # (1 or B, L)
    inverse = BASE ** (-np.arange(0, dim, 2) / dim) / FACTOR  # (d/2,)
    angles = positions[..., None] * inverse  # (1 or B, L, d/2)
    angles = np.concatenate([angles, angles], axis=-1)  # (1 or B, L, d)
    angles = angles.reshape(angles.shape[:2] + (1,) * (moved.ndim - 3) + (dim,))
    first, second = np.split(moved, 2, axis=-1)
    rotated = moved * np.cos(angles) + np.concatenate([-second, first], axis=-1) * np.sin(angles)
    return np.moveaxis(rotated, (-1, 1), (feature_axis, sequence_axis))


# (shape, sequence_axis, feature_axis): d = 8 and L = 6 everywhere; the last axis is even
# and not d, so a layer that ignored feature_axis would rotate the wrong (but valid) axis.
CASES = {
    "B_L_d_H": ((2, 6, 8, 4), 1, 2),
    "B_L_d_H_negative": ((2, 6, 8, 4), 1, -2),
    "B_d_H_L": ((2, 8, 4, 6), -1, 1),
    "B_H_d_L": ((2, 4, 8, 6), 3, 2),
    "d_B_L": ((8, 2, 6), 2, 0),
    "B_d_L": ((2, 8, 6), 2, 1),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_feature_axis_matches_keras_hub_semantics(case):
    shape, sequence_axis, feature_axis = CASES[case]
    x = randn(rng(1), *shape)
    layer = keras_attn.RotaryEmbedding(max_wavelength=BASE, scaling_factor=FACTOR,
                                       sequence_axis=sequence_axis, feature_axis=feature_axis)
    expected = _keras_hub_rope(x, sequence_axis, feature_axis, start_index=3)
    if sequence_axis % len(shape) != len(shape) - 1:
        # The test can tell: rotating the last axis instead is far from the expected values
        # (where the sequence is last, rotating it would be refused).
        ignored = _keras_hub_rope(x, sequence_axis, -1, start_index=3)
        assert np.max(np.abs(ignored - expected)) > 0.1
    out = layer(x, start_index=3)
    assert tuple(out.shape) == shape
    assert_close(out, expected, what=f"{case}, start_index")
    positions = np.array([3, 1, 4, 1, 5, 9])
    assert_close(layer(x, positions=positions),
                 _keras_hub_rope(x, sequence_axis, feature_axis, positions=positions),
                 what=f"{case}, positions")
    if shape[0] == 2 and sequence_axis % len(shape) != 0 and feature_axis % len(shape) != 0:
        batched = np.stack([positions, positions[::-1]])  # (B, L)
        assert_close(layer(x, positions=batched),
                     _keras_hub_rope(x, sequence_axis, feature_axis, positions=batched),
                     what=f"{case}, (B, L) positions")


def test_feature_axis_default_is_the_last_axis():
    x = randn(rng(2), 2, 6, 3, 8)
    plain = keras_attn.RotaryEmbedding(max_wavelength=BASE, scaling_factor=FACTOR)
    assert plain.feature_axis == -1
    assert_close(plain(x, start_index=2), _keras_hub_rope(x, 1, -1, start_index=2))
    explicit = keras_attn.RotaryEmbedding(max_wavelength=BASE, scaling_factor=FACTOR,
                                          feature_axis=3)
    np.testing.assert_array_equal(to_numpy(explicit(x)), to_numpy(plain(x)))


def test_feature_axis_with_interleaved_and_functional_form():
    """Interleaved pairs and the functional form move the features the same way."""
    x = randn(rng(3), 2, 8, 6, 4)  # (B, d, L, H)
    moved = np.moveaxis(x, 1, -1)  # (B, L, H, d)
    for interleaved in (False, True):
        layer = keras_attn.RotaryEmbedding(BASE, interleaved=interleaved, sequence_axis=2,
                                           feature_axis=1)
        last = keras_attn.rotary_embedding(moved, max_wavelength=BASE, interleaved=interleaved)
        np.testing.assert_allclose(to_numpy(layer(x)), np.moveaxis(to_numpy(last), -1, 1),
                                   rtol=1e-6, atol=1e-6)
        functional = keras_attn.rotary_embedding(x, max_wavelength=BASE, interleaved=interleaved,
                                                 sequence_axis=2, feature_axis=1)
        np.testing.assert_array_equal(to_numpy(functional), to_numpy(layer(x)))


@pytest.mark.parametrize("feature_axis", [4, -5])
def test_feature_axis_out_of_range(feature_axis):
    layer = keras_attn.RotaryEmbedding(feature_axis=feature_axis)
    with pytest.raises(ValueError, match=rf"`feature_axis`.*Received: feature_axis={feature_axis}"):
        layer(np.ones((2, 6, 3, 8), "float32"))


def test_sequence_axis_out_of_range():
    with pytest.raises(ValueError, match=r"`sequence_axis`.*Received: sequence_axis=3"):
        keras_attn.RotaryEmbedding(sequence_axis=3)(np.ones((2, 6, 8), "float32"))


def test_feature_axis_equal_to_sequence_axis():
    with pytest.raises(ValueError, match=r"Received: feature_axis=1, sequence_axis=1"):
        keras_attn.RotaryEmbedding(feature_axis=1)
    # The same axis counted from either end: known only once the rank is.
    layer = keras_attn.RotaryEmbedding(feature_axis=-3)
    with pytest.raises(ValueError, match=r"Received: feature_axis=-3, sequence_axis=1"):
        layer(np.ones((2, 6, 3, 8), "float32"))


def test_feature_axis_must_be_an_int_and_even():
    with pytest.raises(ValueError, match=r"Received: feature_axis=1.5"):
        keras_attn.RotaryEmbedding(feature_axis=1.5)
    with pytest.raises(ValueError, match=r"must be even.*Received: x.shape=\(2, 6, 5, 8\)"):
        keras_attn.RotaryEmbedding(feature_axis=2)(np.ones((2, 6, 5, 8), "float32"))


def test_feature_axis_config_round_trip():
    layer = keras_attn.RotaryEmbedding(BASE, FACTOR, sequence_axis=3, feature_axis=1)
    config = layer.get_config()
    assert (config["feature_axis"], config["sequence_axis"]) == (1, 3)
    again = keras_attn.RotaryEmbedding.from_config(config)
    assert (again.feature_axis, again.sequence_axis, again.max_wavelength) == (1, 3, BASE)
    # A config saved before feature_axis existed loads with the last axis.
    del config["feature_axis"]
    assert keras_attn.RotaryEmbedding.from_config(config).feature_axis == -1


def test_feature_axis_saves_and_loads(tmp_path):
    inputs = keras.Input((8, 4, 6))  # (B, d, H, L)
    outputs = keras_attn.RotaryEmbedding(BASE, FACTOR, sequence_axis=-1, feature_axis=1)(inputs)
    model = keras.Model(inputs, outputs)
    x = randn(rng(4), 2, 8, 4, 6)
    expected = _keras_hub_rope(x, -1, 1)
    assert_close(model(x), expected, what="before saving")
    path = tmp_path / "rope.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    rope = [layer for layer in loaded.layers if isinstance(layer, keras_attn.RotaryEmbedding)][0]
    assert (rope.feature_axis, rope.sequence_axis) == (1, -1)
    assert_close(loaded(x), expected, what="after loading")
