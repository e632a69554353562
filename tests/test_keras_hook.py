"""Keras's `_compute_attention` override point, and `flash_attention` as Keras has it.

A subclass written for Keras's `MultiHeadAttention` overrides
`_compute_attention(query, key, value, attention_mask, training,
return_attention_scores, use_causal_mask)`; keras-hub's layers do. Such a
subclass is honoured here, with Keras's layout (grouped heads repeated, every
positional rule in the mask), never silently ignored.
"""

import keras
import numpy as np
import pytest

import keras_attn
from keras_attn.testing.weights import randomize_weights

from .helpers import UNCACHED, assert_close, randn, rng, to_numpy

ops = keras.ops
B, T, D, H, D_HEAD, S_MAX = 2, 8, 12, 4, 4, 10
OPTIONS = dict(num_key_value_heads=2, rope_max_wavelength=100.0, sliding_window=3)


class Doubled(keras_attn.MultiHeadAttention):
    """Calls the default hook and doubles its output: observes that the hook ran."""

    def _compute_attention(self, query, key, value, attention_mask=None, training=None,
                           return_attention_scores=False, use_causal_mask=False):
        output, scores = super()._compute_attention(
            query, key, value, attention_mask, training, return_attention_scores,
            use_causal_mask)
        return 2.0 * output, scores


class KerasStyle(keras_attn.MultiHeadAttention):
    """Attention written as a Keras subclass would: einsum, masked softmax, einsum."""

    def _compute_attention(self, query, key, value, attention_mask=None, training=None,
                           return_attention_scores=False, use_causal_mask=False):
        assert key.shape[2] == self.num_heads, "grouped heads are repeated for Keras's layout"
        scores = ops.einsum("bthd,bshd->bhts", query, key) / np.sqrt(self.key_dim)
        if use_causal_mask:
            raise AssertionError("the positional rules come in the mask")
        if attention_mask is not None:
            scores = ops.where(attention_mask, scores, -1e9)
        weights = ops.softmax(scores, axis=-1)
        return ops.einsum("bhts,bshd->bthd", weights, value), weights


def _pair(cls, seed=1):
    base = keras_attn.MultiHeadAttention(H, D_HEAD, use_bias=False, **OPTIONS)
    sub = cls(H, D_HEAD, use_bias=False, **OPTIONS)
    for layer in (base, sub):
        layer.build((B, T, D))
    randomize_weights(base, seed=seed)
    for mine, theirs in zip(sub.weights, base.weights, strict=True):
        mine.assign(theirs)
    return base, sub


def test_an_override_that_calls_the_default_is_called():
    base, doubled = _pair(Doubled)
    x = randn(rng(2), B, T, D)
    assert_close(doubled(x, use_causal_mask=True),
                 2.0 * to_numpy(base(x, use_causal_mask=True)), against=UNCACHED)


@pytest.mark.parametrize("causal", [True, False])
def test_a_keras_style_override_gets_every_rule_in_its_mask(causal):
    """GQA, a window and the causal rule: the override computes what the paths compute."""
    base, keras_style = _pair(KerasStyle, seed=3)
    x = randn(rng(4), B, T, D)
    key_mask = np.arange(T)[None, :] != np.array([[-1], [5]])  # row 1 drops key 5
    expected = to_numpy(base(x, use_causal_mask=causal, key_mask=key_mask))
    assert_close(keras_style(x, use_causal_mask=causal, key_mask=key_mask), expected,
                 against=UNCACHED)
    out, scores = keras_style(x, use_causal_mask=causal, return_attention_scores=True)
    assert tuple(scores.shape) == (B, H, T, T)


def test_a_keras_style_override_over_a_cache():
    base, keras_style = _pair(KerasStyle, seed=5)
    x = randn(rng(6), B, T, D)
    full = to_numpy(base(x, use_causal_mask=True))
    cache = keras_style.empty_cache(B, S_MAX)
    start = 0
    for length in (3, 1, 1, 3):
        out, cache = keras_style(x[:, start:start + length], cache=cache,
                                 cache_update_index=start, use_causal_mask=True)
        assert_close(out, full[:, start:start + length], what=f"from {start}", against=UNCACHED)
        start += length


def test_flash_attention_refuses_dropout_and_scores_as_keras_does():
    with pytest.raises(ValueError, match=r"Received: flash_attention=True, dropout=0.1"):
        keras_attn.MultiHeadAttention(H, D_HEAD, flash_attention=True, dropout=0.1)
    layer = keras_attn.MultiHeadAttention(H, D_HEAD, flash_attention=True)
    x = randn(rng(7), B, T, D)
    layer(x)
    with pytest.raises(ValueError, match=r"return_attention_scores=True"):
        layer(x, return_attention_scores=True)
    # This package's own name for the fused path computes scores on the explicit path.
    fused = keras_attn.MultiHeadAttention(H, D_HEAD, implementation="fused", dropout=0.1)
    _, scores = fused(x, return_attention_scores=True)
    assert tuple(scores.shape) == (B, H, T, T)
