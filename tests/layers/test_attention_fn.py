"""`implementation` as a callable (flax's `attention_fn`): MultiHeadAttention and the blocks.

The callable has `keras_attn.scaled_dot_product_attention`'s signature and gets
heads-first tensors: `(B, H, T, d_k)` queries, `(B, H_kv, S, d)` keys and
values, and the layer's mask, causal flag, scale, window, soft-cap and dropout.
"""

import os

import keras
import numpy as np
import pytest

import keras_attn
from keras_attn.testing.weights import randomize_weights, reference_params

from .. import reference
from ..helpers import assert_close, randn, rng, to_numpy

B, T, D, H, H_KV, D_HEAD = 2, 6, 12, 4, 2, 4
CALLS = []


@keras.saving.register_keras_serializable(package="keras_attn_tests")
def recording_attention(query, key, value, **kwargs):
    """keras_attn's own attention, recording what it was given (observes that it ran)."""
    CALLS.append((tuple(query.shape), tuple(key.shape), dict(kwargs)))
    return keras_attn.scaled_dot_product_attention(query, key, value, implementation="explicit",
                                                   **kwargs)


def zero_attention(query, key, value, **kwargs):
    """Every head's output zero: the layer's output is then the output bias alone."""
    return keras.ops.zeros(tuple(query.shape[:-1]) + (value.shape[-1],), query.dtype)


def _layer(implementation, **options):
    layer = keras_attn.MultiHeadAttention(H, D_HEAD, num_key_value_heads=H_KV,
                                          implementation=implementation, **options)
    layer.build((B, T, D))
    randomize_weights(layer, seed=3)
    return layer


def test_callable_gets_heads_first_tensors_and_the_options():
    CALLS.clear()
    layer = _layer(recording_attention, sliding_window=3, logit_soft_cap=2.0, scale=0.7)
    x = randn(rng(0), B, T, D)
    mask = rng(1).random((B, T, T)) > 0.2
    out = layer(x, attention_mask=mask, use_causal_mask=True)
    assert len(CALLS) == 1, "the callable did not run"
    q_shape, k_shape, kwargs = CALLS[0]
    assert q_shape == (B, H, T, D_HEAD) and k_shape == (B, H_KV, T, D_HEAD)
    assert kwargs["is_causal"] is True and kwargs["scale"] == 0.7
    assert kwargs["sliding_window"] == 3 and kwargs["logit_soft_cap"] == 2.0
    expected, _ = reference.multi_head_attention(
        reference_params(layer), x, num_heads=H, mask=mask, is_causal=True,
        num_key_value_heads=H_KV, sliding_window=3, logit_soft_cap=2.0, scale=0.7)
    assert_close(out, expected, what="callable implementation")


def test_callable_output_is_what_the_layer_uses():
    layer = _layer(zero_attention)
    out = to_numpy(layer(randn(rng(2), B, T, D)))
    bias = to_numpy(layer.output_dense.bias)
    np.testing.assert_allclose(out, np.broadcast_to(bias, out.shape), atol=1e-6)
    assert np.abs(bias).max() > 0.1, "a zero bias would make this check vacuous"


def test_callable_with_scores_must_return_a_pair():
    layer = _layer(zero_attention)
    with pytest.raises(ValueError, match=r"must return `\(output, weights\)`.*zero_attention"):
        layer(randn(rng(3), B, T, D), return_attention_scores=True)
    out, scores = _layer(recording_attention)(randn(rng(3), B, T, D),
                                              return_attention_scores=True)
    assert tuple(scores.shape) == (B, H, T, T)


def test_callable_errors():
    with pytest.raises(ValueError, match=r"or a callable.*Received: implementation='flash'"):
        keras_attn.MultiHeadAttention(H, D_HEAD, implementation="flash")
    with pytest.raises(ValueError, match=r"flash_attention=True.*conflicts"):
        keras_attn.MultiHeadAttention(H, D_HEAD, implementation=recording_attention,
                                      flash_attention=True)


def test_registered_callable_is_saved(tmp_path):
    layer = _layer(recording_attention)
    config = layer.get_config()
    assert isinstance(config["implementation"], dict), config["implementation"]
    assert keras_attn.MultiHeadAttention.from_config(config).implementation is recording_attention
    x = randn(rng(4), B, T, D)
    inputs = keras.Input((T, D))
    model = keras.Model(inputs, layer(inputs))
    path = os.path.join(tmp_path, "attention_fn.keras")
    model.save(path)
    again = keras.saving.load_model(path)
    assert again.layers[-1].implementation is recording_attention
    assert_close(again(x), to_numpy(model(x)), what="reloaded")


@pytest.mark.parametrize("block", ["encoder", "decoder"])
def test_blocks_pass_the_callable_on(block):
    CALLS.clear()
    cls = {"encoder": keras_attn.TransformerEncoderLayer,
           "decoder": keras_attn.TransformerDecoderLayer}[block]
    layer = cls(H, intermediate_dim=8, implementation=recording_attention)
    out = layer(randn(rng(5), B, T, D))
    assert tuple(out.shape) == (B, T, D) and len(CALLS) == 1
    assert cls.from_config(layer.get_config()).implementation is recording_attention
