"""Bad input: a ValueError naming the argument and what was received, before computing."""

import numpy as np
import pytest

import keras_attn

from .helpers import randn, rng

x3 = randn(rng(0), 2, 5, 8)


@pytest.mark.parametrize("make, match", [
    (lambda: keras_attn.MultiHeadAttention(0, 4), "Received: num_heads=0"),
    (lambda: keras_attn.MultiHeadAttention(2, -1), "Received: key_dim=-1"),
    (lambda: keras_attn.MultiHeadAttention(2.5, 4), "Received: num_heads=2.5"),
    (lambda: keras_attn.MultiHeadAttention(2, 4, value_dim=0), "Received: value_dim=0"),
    (lambda: keras_attn.MultiHeadAttention(2, 4, dropout=1.0), "Received: dropout=1.0"),
    (lambda: keras_attn.MultiHeadAttention(2, 4, dropout=-0.1), "Received: dropout=-0.1"),
    (lambda: keras_attn.PositionwiseFeedForward(0), "Received: intermediate_dim=0"),
    (lambda: keras_attn.PositionwiseFeedForward(4, dropout=1.5), "Received: dropout=1.5"),
    (lambda: keras_attn.TransformerEncoderLayer(0, intermediate_dim=8), "Received: num_heads=0"),
    (lambda: keras_attn.TransformerEncoderLayer(2, intermediate_dim=0), "Received: intermediate_dim=0"),
    (lambda: keras_attn.TransformerEncoderLayer(2, intermediate_dim=8, dropout=2), "Received: dropout=2"),
    (lambda: keras_attn.TransformerDecoderLayer(2, intermediate_dim=8, key_dim=0), "Received: key_dim=0"),
    (lambda: keras_attn.TransformerDecoderLayer(2, intermediate_dim=8, layer_norm_epsilon=0),
     "Received: layer_norm_epsilon=0"),
], ids=lambda v: v if isinstance(v, str) else "")
def test_constructor_arguments(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_mha_rejects_wrong_rank():
    layer = keras_attn.MultiHeadAttention(2, 4)
    with pytest.raises(ValueError, match=r"`query` must have rank 3.*Received: query.shape=\(5, 8\)"):
        layer(x3[0])
    with pytest.raises(ValueError, match=r"`value` must have rank 3.*Received: value.shape"):
        keras_attn.MultiHeadAttention(2, 4)(x3, randn(rng(1), 2, 3, 4, 8))
    with pytest.raises(ValueError, match=r"`key` must have rank 3.*Received: key.shape"):
        keras_attn.MultiHeadAttention(2, 4)(x3, x3, randn(rng(1), 2, 3, 4, 8))


def test_mha_rejects_key_value_length_mismatch():
    layer = keras_attn.MultiHeadAttention(2, 4)
    with pytest.raises(ValueError, match=r"same length S.*Received: key.shape=\(2, 6, 8\)"):
        layer(x3, randn(rng(1), 2, 7, 8), randn(rng(2), 2, 6, 8))  # (query, value, key)


@pytest.mark.parametrize("shape", [(2, 5, 6), (3, 5, 5), (2, 3, 5, 5), (6,)])
def test_mha_rejects_unbroadcastable_attention_mask(shape):
    layer = keras_attn.MultiHeadAttention(2, 4)
    with pytest.raises(ValueError, match=r"`attention_mask` must be broadcastable.*Received"):
        layer(x3, attention_mask=np.ones(shape, bool))


def test_mha_accepts_broadcastable_masks():
    layer = keras_attn.MultiHeadAttention(2, 4)
    for shape in [(5,), (5, 5), (1, 5, 5), (2, 1, 5), (2, 2, 5, 5), (1, 1, 1, 5)]:
        assert layer(x3, attention_mask=np.ones(shape, bool)).shape == (2, 5, 8)


def test_encoder_model_dim_not_divisible_by_heads():
    with pytest.raises(ValueError, match=r"D=8.*num_heads=3.*Received: model_dim=8, num_heads=3"):
        keras_attn.TransformerEncoderLayer(3, intermediate_dim=16)(x3)


def test_encoder_rejects_wrong_rank():
    with pytest.raises(ValueError, match=r"`inputs` must have rank 3.*Received: inputs.shape"):
        keras_attn.TransformerEncoderLayer(2, intermediate_dim=16)(randn(rng(0), 5, 8))


def test_encoder_rejects_bad_padding_mask():
    with pytest.raises(ValueError, match=r"`padding_mask` must be broadcastable to \(B, T\) "
                                         r"= \(2, 5\)\. Received: padding_mask.shape=\(2, 4\)"):
        keras_attn.TransformerEncoderLayer(2, intermediate_dim=16)(x3, padding_mask=np.ones((2, 4), bool))


def test_decoder_rejects_bad_padding_masks():
    decoder = keras_attn.TransformerDecoderLayer(2, intermediate_dim=16)
    memory = randn(rng(1), 2, 6, 8)
    with pytest.raises(ValueError, match=r"`padding_mask` must be broadcastable.*"
                                         r"Received: padding_mask.shape=\(2, 4\)"):
        decoder(x3, memory, padding_mask=np.ones((2, 4), bool))
    with pytest.raises(ValueError, match=r"`memory_padding_mask` must be broadcastable to "
                                         r"\(B, S\) = \(2, 6\)\. Received: "
                                         r"memory_padding_mask.shape=\(2, 5\)"):
        decoder(x3, memory, memory_padding_mask=np.ones((2, 5), bool))


# Each key mask is named as it was passed: `key` defaults to `value` and `key_mask` to
# `value_mask` (and, in self-attention, that to the query's mask), and the merged key
# padding was reported as `key_mask` whichever the caller had got wrong.
@pytest.mark.parametrize("value, masks, name", [
    (True, {"value_mask": (2, 5)}, "value_mask"),
    (True, {"key_mask": (2, 5)}, "key_mask"),
    (True, {"value_mask": (2, 5), "key_mask": (2, 6)}, "value_mask"),
    (True, {"value_mask": (2, 6), "key_mask": (2, 4)}, "key_mask"),
    (False, {"value_mask": (2, 4)}, "value_mask"),
    (False, {"query_mask": (2, 4)}, "query_mask"),
], ids=["value_mask", "key_mask", "value_mask+key_mask", "key_mask+value_mask",
        "self-attention", "query_mask"])
def test_mha_names_the_wrong_length_key_mask(value, masks, name):
    layer = keras_attn.MultiHeadAttention(2, 4)
    value = randn(rng(1), 2, 6, 8) if value else None
    S = 6 if value is not None else 5
    wrong = masks[name]
    with pytest.raises(ValueError, match=rf"`{name}` must be broadcastable to \(B, S\) = "
                                         rf"\(2, {S}\)\. Received: {name}.shape=\(2, {wrong[1]}\)"):
        layer(x3, value, **{k: np.ones(s, bool) for k, s in masks.items()})


def test_functional_core_errors():
    sdpa = keras_attn.scaled_dot_product_attention
    q, k, v = randn(rng(0), 4, 3), randn(rng(1), 6, 3), randn(rng(2), 6, 2)
    with pytest.raises(ValueError, match=r"same last dimension.*Received: query.shape=\(4, 3\)"):
        sdpa(q, randn(rng(1), 6, 2), v)
    with pytest.raises(ValueError, match=r"same length S.*Received"):
        sdpa(q, k, randn(rng(2), 5, 2))
    with pytest.raises(ValueError, match=r"rank >= 2.*Received: query.shape=\(3,\)"):
        sdpa(q[0], k, v)
    with pytest.raises(ValueError, match=r"`mask` must be broadcastable.*Received: mask.shape=\(4, 5\)"):
        sdpa(q, k, v, mask=np.ones((4, 5), bool))
    with pytest.raises(ValueError, match=r"`bias` must be broadcastable.*Received: bias.shape"):
        sdpa(q, k, v, bias=np.ones((3, 6), "float32"))
    with pytest.raises(ValueError, match=r"Received: dropout_rate=1.0"):
        sdpa(q, k, v, dropout_rate=1.0)


def test_padding_mask_rejects_matrix_lengths():
    with pytest.raises(ValueError, match=r"Received: lengths.shape=\(2, 2\)"):
        keras_attn.padding_mask(np.ones((2, 2), "int32"), 3)
