"""A drop-in for `keras.layers.MultiHeadAttention`: change the class, convert the weights.

A Keras model written for Keras's layer is built a second time with
`keras_attn.MultiHeadAttention` (only the class changes), the weights are
converted, and every call style gives the same outputs.
"""

import keras
import numpy as np
import pytest

import keras_attn
from keras_attn import convert

from ..helpers import assert_close, randn, requires_keras_mha_argument, rng, to_numpy

B, T, S, D = 2, 5, 7, 8


def _randomize(layer, seed):
    g = rng(seed)
    for variable in layer.weights:
        variable.assign(g.normal(0.0, 0.5, tuple(variable.shape)).astype("float32"))


def _model(cls, output_shape=None):
    """A model written against Keras's API, using every call style of the issue."""
    x = keras.Input((T, D), name="x")
    y = keras.Input((T, D), name="y")
    z = keras.Input((S, D), name="z")
    w = keras.Input((S, 6), name="w")
    mask = keras.Input((T, S), dtype="bool", name="mask")
    # value_dim == key_dim: Keras's own layer fails on JAX when they differ (its fused
    # path reshapes d_v as d_k); tests/convert/test_convert.py covers value_dim != key_dim.
    kwargs = dict(num_heads=2, key_dim=4, value_dim=4, dropout=0.0, use_bias=True,
                  output_shape=output_shape, attention_axes=None, seed=1,
                  kernel_regularizer=keras.regularizers.L2(1e-4))
    layers = [cls(name=f"mha_{i}", **kwargs) for i in range(6)]
    outputs = {
        "keyword_value": layers[0](query=x, value=z),  # key defaults to value
        "keyword_value_same_length": layers[1](query=x, value=y),
        "positional_query_value_key": layers[2](x, y, x),  # (query, value, key)
        "positional_cross": layers[3](x, z),
        "keyword_key": layers[4](query=x, value=z, key=w, attention_mask=mask),
        "causal": layers[5](x, y, use_causal_mask=True),
    }
    return keras.Model({"x": x, "y": y, "z": z, "w": w, "mask": mask}, outputs)


def _inputs(seed):
    g = rng(seed)
    mask = g.random((B, T, S)) > 0.4
    mask[..., 0] = True  # every query may attend a key (Keras gives NaN/uniform rows otherwise)
    return {"x": randn(g, B, T, D), "y": randn(g, B, T, D), "z": randn(g, B, S, D),
            "w": randn(g, B, S, 6), "mask": mask}


@pytest.mark.parametrize("output_shape", [None, 7, (7,)])
def test_switching_the_class_gives_the_same_outputs(output_shape):
    keras_model = _model(keras.layers.MultiHeadAttention, output_shape)
    ours = _model(keras_attn.MultiHeadAttention, output_shape)
    for i in range(6):
        source = keras_model.get_layer(f"mha_{i}")
        _randomize(source, seed=i)
        converted = convert.multi_head_attention_from_keras(source)
        ours.get_layer(f"mha_{i}").set_weights(converted.get_weights())
    data = _inputs(0)
    expected = keras_model.predict_on_batch(data)
    actual = ours.predict_on_batch(data)
    for name, value in expected.items():
        assert_close(actual[name], value, what=name)
    width = D if output_shape is None else 7
    assert actual["keyword_value"].shape == (B, T, width)
    # The regularizer came along: both models report the same weight penalty.
    np.testing.assert_allclose(sum(float(to_numpy(x)) for x in ours.losses),
                               sum(float(to_numpy(x)) for x in keras_model.losses), rtol=1e-5)


def test_attention_scores_match_keras():
    g = rng(4)
    source = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4)
    x, z = randn(g, B, T, D), randn(g, B, S, D)
    source(x, z)
    _randomize(source, seed=4)
    ours = convert.multi_head_attention_from_keras(source)
    out, scores = ours(x, z, return_attention_scores=True)
    ref_out, ref_scores = source(x, z, return_attention_scores=True)
    assert tuple(scores.shape) == (B, 2, T, S)
    assert_close(out, to_numpy(ref_out))
    assert_close(scores, to_numpy(ref_scores), what="scores")


@requires_keras_mha_argument("sliding_window")
@pytest.mark.parametrize("causal", [False, True])
def test_keras_sliding_window_comes_along(causal):
    g = rng(5)
    source = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4, sliding_window=2)
    x, y = randn(g, B, T, D), randn(g, B, T, D)
    source(x, y)
    _randomize(source, seed=5)
    ours = convert.multi_head_attention_from_keras(source)
    assert ours.sliding_window == 2
    assert_close(ours(x, y, use_causal_mask=causal),
                 to_numpy(source(x, y, use_causal_mask=causal)))


def test_keyword_value_is_the_source_not_the_query():
    """`mha(query=x, value=z)` attends over z (not over x) and accepts S != T."""
    g = rng(1)
    x, z = randn(g, B, T, D), randn(g, B, S, D)
    layer = keras_attn.MultiHeadAttention(2, 4)
    out = to_numpy(layer(query=x, value=z))
    np.testing.assert_allclose(out, to_numpy(layer(x, z, z)), rtol=1e-6, atol=1e-6)
    assert np.abs(out - to_numpy(layer(x, x))[:, :T]).max() > 1e-3


def test_key_mask_and_value_mask_from_masked_inputs():
    """Keras masks of `value` and `key` (Embedding(mask_zero=True)) reach the layer."""
    tokens = np.array([[3, 4, 5, 0, 0, 0, 0], [1, 2, 3, 4, 5, 6, 7]], "int32")
    g = rng(2)
    x = keras.Input((T, D))
    ids = keras.Input((S,), dtype="int32")
    embedded = keras.layers.Embedding(10, D, mask_zero=True)(ids)

    def model(cls):
        out = cls(num_heads=2, key_dim=4, name="mha")(query=x, value=embedded)
        return keras.Model([x, ids], out)

    keras_model, ours = model(keras.layers.MultiHeadAttention), model(keras_attn.MultiHeadAttention)
    _randomize(keras_model.get_layer("mha"), seed=2)  # the Embedding is shared by both models
    ours.get_layer("mha").set_weights(
        convert.multi_head_attention_from_keras(keras_model.get_layer("mha")).get_weights())
    xs = randn(g, B, T, D)
    assert_close(ours.predict_on_batch([xs, tokens]), keras_model.predict_on_batch([xs, tokens]))


def test_keras_hub_positional_order_fails_loudly():
    """keras-hub's TransformerEncoder takes (intermediate_dim, num_heads): ours refuses it."""
    for cls in (keras_attn.TransformerEncoderLayer, keras_attn.TransformerDecoderLayer):
        with pytest.raises(TypeError, match=r"keyword.*intermediate_dim=.*Received: 1 extra"):
            cls(64, 4)
        assert cls(4, intermediate_dim=64).intermediate_dim == 64


@pytest.mark.parametrize("kwargs, match", [
    ({"output_shape": (3, 4)}, r"Received: output_shape=\(3, 4\)"),
    ({"output_shape": 7, "output_dim": 8}, r"give one. Received: output_dim=8, output_shape=7"),
    ({"attention_axes": (1, 2)}, r"Received: attention_axes=\(1, 2\)"),
    ({"flash_attention": True, "implementation": "blockwise"}, r"Received: flash_attention=True"),
])
def test_keras_constructor_arguments_are_checked(kwargs, match):
    with pytest.raises(ValueError, match=match):
        keras_attn.MultiHeadAttention(2, 4, **kwargs)


def test_keras_constructor_arguments_mean_the_same():
    layer = keras_attn.MultiHeadAttention(
        2, 4, output_shape=(6,), attention_axes=(1,), flash_attention=False,
        kernel_constraint="non_neg", bias_constraint=keras.constraints.MaxNorm(1.0),
        activity_regularizer="l2")
    assert layer.output_dim == 6 and layer.implementation == "explicit"
    layer(randn(rng(3), B, T, D))
    assert isinstance(layer.query_dense.kernel_constraint, keras.constraints.NonNeg)
    config = layer.get_config()
    assert config["kernel_constraint"]["class_name"] == "NonNeg"
    again = keras_attn.MultiHeadAttention.from_config(config)
    assert again.output_dim == 6 and isinstance(again.bias_constraint, keras.constraints.MaxNorm)
    assert keras_attn.MultiHeadAttention(2, 4, flash_attention=True).implementation == "fused"
