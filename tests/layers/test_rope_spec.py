"""`RopeSpec`: one frozen object for what RoPE computes, shared by `RotaryEmbedding`,
`rotary_embedding`, `AttentionOptions` (its flat `rope_*` fields) and the converters, and
the `ROPE_TYPES` registry (a new type is one entry).

The frequencies themselves are checked against the float64 reference and transformers in
tests/test_rotary_types.py; here, that every user of RoPE reads the one spec.
"""

import dataclasses

import numpy as np
import pytest

import keras_attn
from keras_attn import rope as rope_module
from keras_attn.options import AttentionOptions
from keras_attn.rope import ROPE_TYPES, RopeSpec, RopeType

from .. import reference
from ..helpers import assert_close, randn, rng, to_numpy

LLAMA3 = dict(max_wavelength=500.0, scaling_factor=6.0, rope_type="llama3",
              low_freq_factor=2.0, high_freq_factor=16.0, original_max_position_embeddings=256)


def test_one_spec_behind_every_spelling():
    spec = RopeSpec(**LLAMA3, interleaved=True)
    layer = keras_attn.RotaryEmbedding(**dataclasses.asdict(spec))
    assert layer.rope == spec and layer.max_wavelength == 500.0
    again = keras_attn.RotaryEmbedding.from_config(layer.get_config())
    assert again.rope == spec
    options = AttentionOptions(**spec.options())
    assert options.rope == spec
    assert AttentionOptions().rope is None
    # The saved form stays flat: the layers' configs hold `rope_*` JSON values, no object.
    config = keras_attn.MultiHeadAttention(2, 8, **spec.options()).get_config()
    assert config["rope_low_freq_factor"] == 2.0 and "rope" not in config
    with pytest.raises(AttributeError):  # one copy: the layer's fields read the spec
        layer.max_wavelength = 1.0


def test_layers_apply_the_spec():
    """RotaryEmbedding and rotary_embedding apply the spec as the float64 reference does."""
    x = randn(rng(0), 2, 5, 3, 16)  # (B, L, H, d)
    # The reference rotates (..., L, d): heads before positions.
    expected = np.swapaxes(reference.rotary_embedding(
        np.swapaxes(x, 1, 2), np.arange(5) + 2, **LLAMA3), 1, 2)
    assert_close(keras_attn.RotaryEmbedding(**LLAMA3)(x, start_index=2), expected)
    assert_close(keras_attn.rotary_embedding(x, start_index=2, **LLAMA3), expected)


def test_errors_name_the_argument_of_each_spelling():
    with pytest.raises(ValueError, match="needs `original_max_position_embeddings`"):
        RopeSpec(rope_type="yarn")
    with pytest.raises(ValueError, match="needs `rope_original_max_position_embeddings`"):
        AttentionOptions(rope_max_wavelength=1e4, rope_type="yarn")
    with pytest.raises(ValueError, match=r"Received: rope_beta_fast=-1"):
        AttentionOptions(rope_max_wavelength=1e4, rope_beta_fast=-1)
    with pytest.raises(ValueError, match=r"Received: beta_slow=0"):
        keras_attn.RotaryEmbedding(beta_slow=0)
    with pytest.raises(ValueError, match="'longrope'` needs `short_factor`"):
        RopeSpec(rope_type="longrope")


def test_from_rope_parameters_reads_transformers_keys():
    spec = RopeSpec.from_rope_parameters({
        "rope_type": "llama3", "rope_theta": 500.0, "factor": 6.0, "low_freq_factor": 2.0,
        "high_freq_factor": 16.0, "original_max_position_embeddings": 256})
    assert spec == RopeSpec(**LLAMA3)
    # yarn: transformers' defaults (factor from the context lengths, the attention factor).
    yarn = RopeSpec.from_rope_parameters(
        {"rope_type": "yarn", "rope_theta": 1e4, "original_max_position_embeddings": 64},
        max_position_embeddings=256)
    assert yarn.scaling_factor == 4.0
    assert yarn.attention_factor == pytest.approx(0.1 * np.log(4.0) + 1)
    for params, where in (({"rope_theta": 1e4, "factor": 2.0}, "['factor']"),
                          ({"rope_type": "llama3", "rope_theta": 1e4, "factor": 2.0},
                           "['low_freq_factor']"),
                          ({"rope_type": "dynamic", "rope_theta": 1e4}, "['rope_type']"),
                          ({"rope_theta": -3.0}, "['rope_theta']")):
        with pytest.raises(ValueError, match=r"config field `rope_scaling\[" + where[1:]):
            RopeSpec.from_rope_parameters(params, where="rope_scaling")


def test_a_new_type_is_one_registry_entry(monkeypatch):
    """An entry of ROPE_TYPES reaches RotaryEmbedding, AttentionOptions and the attention
    layer with no other change: here a type that halves the default frequencies, which
    must equal the default type at scaling factor 2 (and differ from it at 1)."""

    def halved(spec, dim):
        theta, factor = ROPE_TYPES["default"].frequencies(spec, dim)
        return theta / 2, factor

    monkeypatch.setitem(ROPE_TYPES, "halved", RopeType(halved))
    x = randn(rng(1), 1, 6, 2, 8)
    new = to_numpy(keras_attn.RotaryEmbedding(100.0, rope_type="halved")(x))
    assert_close(new, to_numpy(keras_attn.RotaryEmbedding(100.0, 2.0)(x)))
    assert np.abs(new - to_numpy(keras_attn.RotaryEmbedding(100.0)(x))).max() > 0.1
    options = AttentionOptions(rope_max_wavelength=100.0, rope_type="halved")
    assert options.rope.frequencies(8)[0] == pytest.approx(
        RopeSpec(100.0, 2.0).frequencies(8)[0])
    monkeypatch.delitem(ROPE_TYPES, "halved")
    with pytest.raises(ValueError, match="rope_type"):
        RopeSpec(rope_type="halved")


def test_fields_are_the_options_and_layer_arguments():
    """The field list is written once: the AttentionOptions `rope_*` fields and the
    RotaryEmbedding arguments are exactly RopeSpec's fields."""
    import inspect

    option_fields = {f.name for f in dataclasses.fields(AttentionOptions)}
    assert {("rope_type" if n == "rope_type" else f"rope_{n}") for n in rope_module.FIELDS} == {
        n for n in option_fields if n.startswith("rope_")}
    arguments = set(inspect.signature(keras_attn.RotaryEmbedding.__init__).parameters)
    assert set(rope_module.FIELDS) == arguments - {"self", "sequence_axis", "feature_axis",
                                                   "kwargs"}
