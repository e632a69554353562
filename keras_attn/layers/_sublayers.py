"""The blocks' pluggable sublayers: `attention=` and `feed_forward=`, and their contract.

`TransformerEncoderLayer` and `TransformerDecoderLayer` build a
`keras_attn.MultiHeadAttention` and a `keras_attn.PositionwiseFeedForward`
from their flat arguments, or take another layer for either place.

Given as:
    - a `keras.layers.Layer` instance, used as it is (its own name and
      dtype; it may be built already);
    - a factory, any callable `factory(name=..., dtype=...)` returning a
      `keras.layers.Layer`, called once when the block is made, with the
      block's attribute name (`"self_attention"`, `"feed_forward"`, so the
      variable paths are the default's) and the block's dtype policy;
    - a serialized layer (a dict from `keras.saving.serialize_keras_object`),
      as the block's `from_config` receives it.
The block attaches the layer as `self_attention` / `feed_forward` in its
own `build`, where the default would be made (so the weights come in the
default's order), building an unbuilt one by calling
`layer.build(inputs_shape)` with the block's input shape `(B, T, D)`, so the
layer must create its weights there (a `.keras` file loads weights into the
built layer). The block's `get_config` stores the layer
(`keras.saving.serialize_keras_object`): its class must be serializable
(`keras.saving.register_keras_serializable`) for a `.keras` round trip.

Attention call contract (the self-attention; a decoder's cross-attention
stays the default `MultiHeadAttention`). The block calls
`attention(query, use_causal_mask=..., training=..., **extras)` with
`query` `(B, T, D)`, the normalised input (pre-LN) or the input (post-LN),
and only those `extras` that apply to this call:
    - `attention_mask`: bool, broadcastable to `(B, T, S)`, True = may attend;
    - `value_mask`: bool `(B, S)`, True = a real key (the padding mask);
    - `return_attention_scores=True` when the block's caller asks for the
      weights;
    - `cache` and `cache_update_index` (a decoder called with
      `self_attention_cache`): the T new tokens are positions
      `cache_update_index + i`; S is then the cache's length.
    - `attention_bias`: float, broadcastable to `(B, H, T, S)`, added to the
      logits (when the block's caller passes `attention_bias`).
The keys are the queries (self-attention: no `value` or `key` is passed).
It returns the output `(B, T, D)`; `(output, scores)` when asked for the
scores; with a cache, `(output, new_cache)` or `(output, scores,
new_cache)`. A layer with `num_heads` tells the block's symbolic output spec
the scores' head axis. `CausalLM.generate` makes each block's cache with
`keras_attn.empty_cache(block, B, L)`, which reads the attention's
`num_key_value_heads`, `key_dim` and `compute_dtype`.

Feed-forward call contract: `feed_forward(x, training=...)` with `x`
`(B, T, D)`, returning `(B, T, D)` (a mixture of experts fits here).

The block keeps what wraps the sublayer: the norms, the dropout, the
residual sum and `residual_scale`.
"""

import keras

__all__ = ["GivenSublayers", "build_given", "check_ignored", "given_sublayer"]


class GivenSublayers:
    """A block's given `attention` and `feed_forward` (or None) until its `build`.

    A plain object: Keras tracks a layer held in a layer's attribute, and the
    block attaches them itself in `build`, in the defaults' places.
    """

    def __init__(self, attention, feed_forward):
        self.attention, self.feed_forward = attention, feed_forward


def given_sublayer(argument, value, name, dtype):
    """None, or the layer that `value` gives for the block's `argument` place.

    Args:
        argument: the block's argument, `"attention"` or `"feed_forward"`.
        value: None, a layer, a factory or a serialized layer.
        name: the name a factory is called with (the block's attribute).
        dtype: the dtype policy a factory is called with (the block's).
    """
    if value is None:
        return None
    if isinstance(value, dict):
        value = keras.saving.deserialize_keras_object(value)
    if isinstance(value, keras.layers.Layer):
        return value
    if callable(value):
        layer = value(name=name, dtype=dtype)
        if not isinstance(layer, keras.layers.Layer):
            raise ValueError(
                f"The `{argument}` factory must return a keras.layers.Layer. Received: "
                f"{argument}(name={name!r}, dtype=...) returned {type(layer).__name__} "
                f"({layer!r})")
        return layer
    raise ValueError(
        f"`{argument}` must be a keras.layers.Layer, a factory `{argument}(name=..., "
        f"dtype=...)` that returns one, or a serialized layer. Received: "
        f"{argument}={value!r} of type {type(value).__name__}")


def check_ignored(argument, what, received):
    """A ValueError if a flat argument of the default `what` was set beside `argument`.

    `received`: `{name: value}` of the flat arguments that differ from their
    defaults and that the given layer would make meaningless.
    """
    if received:
        listed = ", ".join(f"{key}={value!r}" for key, value in received.items())
        raise ValueError(
            f"With `{argument}` given, these arguments of the default {what} would be "
            f"ignored: {', '.join(received)}. Configure the given layer instead and drop "
            f"them. Received: {listed}")


def build_given(layer, inputs_shape):
    """`layer`, built for the block's input shape unless it is built."""
    if not layer.built:
        layer.build(inputs_shape)
    return layer
