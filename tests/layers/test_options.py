"""`keras_attn.options`: the options object, its fields as layer arguments, `scale`.

A field of `AttentionOptions` is a keyword argument of MultiHeadAttention and
of the blocks, and an entry of their configs, without the layers listing it:
`scale` (added after the layers were written) is the witness.
"""

import keras
import numpy as np
import pytest

import keras_attn
from keras_attn.options import FIELDS, AttentionOptions, pop_options
from keras_attn.testing.weights import randomize_weights, reference_params

from .. import reference
from ..helpers import assert_close, randn, rng, to_numpy

B, T, D = 2, 6, 12


def test_pop_options_takes_only_fields():
    kwargs = {"scale": 0.5, "name": "attention", "dtype": "float32"}
    options = pop_options(kwargs, sliding_window=4)
    assert options == AttentionOptions(sliding_window=4, scale=0.5)
    assert kwargs == {"name": "attention", "dtype": "float32"}
    assert "scale" in FIELDS and "qk_norm_epsilon" in FIELDS


def test_scale_is_a_layer_argument_and_config_entry():
    layer = keras_attn.MultiHeadAttention(4, 4, scale=1.3, num_key_value_heads=2)
    assert layer.scale == 1.3 and layer.options.scale == 1.3
    config = layer.get_config()
    assert config["scale"] == 1.3
    assert keras_attn.MultiHeadAttention.from_config(config).scale == 1.3
    for cls in (keras_attn.TransformerEncoderLayer, keras_attn.TransformerDecoderLayer):
        block = cls(4, intermediate_dim=8, scale=1.3)
        block(np.zeros((B, T, D), "float32"))
        assert block.self_attention.scale == 1.3
        assert cls.from_config(block.get_config()).options.scale == 1.3


def test_scale_moves_the_output_far_beyond_the_tolerance():
    """The reference with the default scale is far from the layer with scale=1.3."""
    x = randn(rng(0), B, T, D)
    layer = keras_attn.MultiHeadAttention(4, 4, scale=1.3)
    layer.build(x.shape)
    randomize_weights(layer, seed=2)
    out = to_numpy(layer(x, use_causal_mask=True))
    params = reference_params(layer)
    expected, _ = reference.multi_head_attention(params, x, num_heads=4, is_causal=True,
                                                 scale=1.3)
    assert_close(out, expected, what="scale=1.3")
    default, _ = reference.multi_head_attention(params, x, num_heads=4, is_causal=True)
    assert np.abs(out - default).max() > 0.1, "scale had no effect"


def test_blocks_scale_matches_the_reference():
    x = randn(rng(1), B, T, D)
    block = keras_attn.TransformerDecoderLayer(4, intermediate_dim=8, scale=1.3,
                                               normalize_first=True)
    block.build(x.shape)
    randomize_weights(block, seed=4)
    out = block(x)
    default = keras_attn.TransformerDecoderLayer(4, intermediate_dim=8, normalize_first=True)
    default.build(x.shape)
    default.set_weights(block.get_weights())
    assert np.abs(to_numpy(out) - to_numpy(default(x))).max() > 0.05, "scale had no effect"
    attention = block.self_attention
    h = to_numpy(block.self_attention_norm(x))
    expected, _ = reference.multi_head_attention(reference_params(attention), h, num_heads=4,
                                                 is_causal=True, scale=1.3)
    assert_close(attention(keras.ops.convert_to_tensor(h), use_causal_mask=True), expected)


def test_scale_errors():
    with pytest.raises(ValueError, match=r"Received: scale=-1"):
        AttentionOptions(scale=-1)
    with pytest.raises(ValueError, match=r"Received: scale=nan"):
        keras_attn.TransformerEncoderLayer(4, intermediate_dim=8, scale=float("nan"))
