"""Every layer against the float64 reference, with copied (randomised) weights."""

import numpy as np
import pytest

import keras_attn
from keras_attn.testing.weights import randomize_weights, reference_params

from .. import reference
from ..helpers import assert_close, randn, rng

B, T, S = 2, 5, 7


def _padding(lengths, length):
    return np.arange(length)[None, :] < np.asarray(lengths)[:, None]


# ----------------------------------------------------------------------------
# MultiHeadAttention


@pytest.mark.parametrize("causal", [False, True])
def test_mha_self_attention(causal):
    g = rng(1)
    x = randn(g, B, T, 12)
    layer = keras_attn.MultiHeadAttention(num_heads=3, key_dim=4)
    layer.build(x.shape)
    randomize_weights(layer, seed=1)
    out, scores = layer(x, use_causal_mask=causal, return_attention_scores=True)
    ref_out, ref_scores = reference.multi_head_attention(
        reference_params(layer), x, num_heads=3, is_causal=causal)
    assert_close(out, ref_out, what="output")
    assert_close(scores, ref_scores, what="scores")


def test_mha_cross_attention_with_different_dims():
    g = rng(2)
    q, k, v = randn(g, B, T, 6), randn(g, B, S, 10), randn(g, B, S, 3)
    layer = keras_attn.MultiHeadAttention(
        num_heads=2, key_dim=5, value_dim=7, output_dim=9)
    layer.build(q.shape, v.shape, k.shape)  # Keras order: (query, value, key)
    assert tuple(layer.query_dense.kernel.shape) == (6, 10)
    assert tuple(layer.key_dense.kernel.shape) == (10, 10)
    assert tuple(layer.value_dense.kernel.shape) == (3, 14)
    assert tuple(layer.output_dense.kernel.shape) == (14, 9)
    randomize_weights(layer, seed=2)
    mask = g.random((B, T, S)) > 0.4
    mask[1, 2] = False  # a query that may attend nothing
    out = layer(q, v, k, attention_mask=mask)
    ref_out, _ = reference.multi_head_attention(
        reference_params(layer), q, k, v, num_heads=2, mask=mask)
    assert out.shape == (B, T, 9)
    assert_close(out, ref_out)


def test_mha_per_head_mask_and_key_mask():
    g = rng(3)
    q, kv = randn(g, B, T, 8), randn(g, B, S, 8)
    layer = keras_attn.MultiHeadAttention(num_heads=2, key_dim=3)
    layer.build(q.shape, kv.shape)
    randomize_weights(layer, seed=3)
    head_mask = g.random((B, 2, T, S)) > 0.3
    key_mask = _padding([4, 7], S)
    out = layer(q, kv, attention_mask=head_mask, key_mask=key_mask, use_causal_mask=True)
    ref_out, _ = reference.multi_head_attention(
        reference_params(layer), q, kv, num_heads=2,
        mask=head_mask & key_mask[:, None, None, :], is_causal=True)
    assert_close(out, ref_out)


def test_mha_without_bias():
    g = rng(4)
    x = randn(g, B, T, 8)
    layer = keras_attn.MultiHeadAttention(num_heads=2, key_dim=4, use_bias=False)
    layer.build(x.shape)
    assert layer.query_dense.bias is None
    randomize_weights(layer, seed=4)
    assert_close(layer(x), reference.multi_head_attention(
        reference_params(layer), x, num_heads=2)[0])


# ----------------------------------------------------------------------------
# PositionwiseFeedForward


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_feed_forward(activation):
    g = rng(5)
    x = randn(g, B, T, 6)
    layer = keras_attn.PositionwiseFeedForward(16, activation=activation)
    layer.build(x.shape)
    randomize_weights(layer, seed=5)
    assert_close(layer(x), reference.feed_forward(reference_params(layer), x, activation))


def test_feed_forward_has_no_activation_after_second_dense():
    # All-negative second-layer weights: a trailing relu would clip to zero.
    x = np.ones((1, 1, 2), "float32")
    layer = keras_attn.PositionwiseFeedForward(3, output_dim=2)
    layer.build(x.shape)
    layer.intermediate_dense.kernel.assign(np.ones((2, 3), "float32"))
    layer.output_dense.kernel.assign(-np.ones((3, 2), "float32"))
    # hidden = relu(1 + 1) = 2 per unit; output = -(2 + 2 + 2) = -6
    assert_close(layer(x), [[[-6.0, -6.0]]])


# ----------------------------------------------------------------------------
# TransformerEncoderLayer / TransformerDecoderLayer


@pytest.mark.parametrize("normalize_first", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_encoder(normalize_first, causal):
    g = rng(6)
    x = randn(g, B, T, 8)
    padding = _padding([3, 5], T)
    attention_mask = g.random((B, T, T)) > 0.2
    layer = keras_attn.TransformerEncoderLayer(
        num_heads=2, intermediate_dim=16, normalize_first=normalize_first,
        activation="gelu")
    layer.build(x.shape)
    randomize_weights(layer, seed=6)
    out = layer(x, padding_mask=padding, attention_mask=attention_mask,
                use_causal_mask=causal)
    expected = reference.encoder_layer(
        reference_params(layer), x, num_heads=2, padding_mask=padding,
        attention_mask=attention_mask, is_causal=causal,
        normalize_first=normalize_first, activation_name="gelu")
    assert_close(out, expected)


@pytest.mark.parametrize("normalize_first", [False, True])
def test_decoder_with_memory(normalize_first):
    g = rng(7)
    x, memory = randn(g, B, T, 8), randn(g, B, S, 6)
    padding, memory_padding = _padding([5, 2], T), _padding([7, 4], S)
    layer = keras_attn.TransformerDecoderLayer(
        num_heads=2, intermediate_dim=12, normalize_first=normalize_first)
    layer.build(x.shape, memory.shape)
    randomize_weights(layer, seed=7)
    out, self_scores, cross_scores = layer(
        x, memory, padding_mask=padding, memory_padding_mask=memory_padding,
        return_attention_scores=True)
    expected = reference.decoder_layer(
        reference_params(layer), x, num_heads=2, memory=memory,
        padding_mask=padding, memory_padding_mask=memory_padding,
        normalize_first=normalize_first)
    assert_close(out, expected)
    assert self_scores.shape == (B, 2, T, T) and cross_scores.shape == (B, 2, T, S)


def test_decoder_only_block():
    g = rng(8)
    x = randn(g, B, T, 8)
    layer = keras_attn.TransformerDecoderLayer(num_heads=4, intermediate_dim=8)
    layer.build(x.shape)
    assert not hasattr(layer, "cross_attention")
    randomize_weights(layer, seed=8)
    assert_close(layer(x), reference.decoder_layer(reference_params(layer), x, num_heads=4))


def test_decoder_with_memory_attention_mask():
    g = rng(9)
    x, memory = randn(g, B, T, 8), randn(g, B, S, 8)
    cross_mask = g.random((B, T, S)) > 0.5
    self_mask = g.random((B, T, T)) > 0.3
    layer = keras_attn.TransformerDecoderLayer(num_heads=2, intermediate_dim=8)
    layer.build(x.shape, memory.shape)
    randomize_weights(layer, seed=9)
    out = layer(x, memory, attention_mask=self_mask, memory_attention_mask=cross_mask,
                use_causal_mask=False)
    expected = reference.decoder_layer(
        reference_params(layer), x, num_heads=2, memory=memory, attention_mask=self_mask,
        memory_attention_mask=cross_mask, is_causal=False)
    assert_close(out, expected)


def test_encoder_key_dim_override():
    g = rng(10)
    x = randn(g, B, T, 10)
    layer = keras_attn.TransformerEncoderLayer(num_heads=3, intermediate_dim=8, key_dim=4)
    layer.build(x.shape)
    assert tuple(layer.self_attention.query_dense.kernel.shape) == (10, 12)
    randomize_weights(layer, seed=10)
    assert_close(layer(x), reference.encoder_layer(reference_params(layer), x, num_heads=3))
