"""Small attention and feed-forward layers written only to the blocks' sublayer contract.

They share nothing with `keras_attn.MultiHeadAttention` or
`PositionwiseFeedForward`, so a block that still reached for its defaults
(or for their attributes) would fail with them. Each has a float64 NumPy
twin here for the references.
"""

import keras
import numpy as np
from keras import ops


@keras.saving.register_keras_serializable(package="keras_attn_tests")
class MeanAttention(keras.layers.Layer):
    """One head whose weights are uniform over the keys a query may attend.

    `y = W_o (sum_j m_ij W_v x_j / sum_j m_ij)`, `m` the causal, padding and
    attention masks: a linear-attention-like layer with no softmax and no
    query or key projection. It keeps the attention contract of
    `keras_attn.layers._sublayers`, no cache.
    """

    num_heads = 1  # the head axis of its scores

    def build(self, input_shape):
        D = input_shape[-1]
        self.value_kernel = self.add_weight(name="value_kernel", shape=(D, D))
        self.output_kernel = self.add_weight(name="output_kernel", shape=(D, D))

    def call(self, query, use_causal_mask=False, training=None, attention_mask=None,
             value_mask=None, return_attention_scores=False):
        T = query.shape[1]
        allowed = ops.ones((1, T, T), dtype=query.dtype)
        if use_causal_mask:
            allowed = ops.tril(allowed)
        if value_mask is not None:
            allowed = allowed * ops.cast(value_mask, query.dtype)[:, None, :]
        if attention_mask is not None:
            allowed = allowed * ops.cast(attention_mask, query.dtype)
        weights = allowed / ops.sum(allowed, axis=-1, keepdims=True)
        y = ops.matmul(weights, ops.matmul(query, self.value_kernel))
        y = ops.matmul(y, self.output_kernel)
        return (y, weights[:, None]) if return_attention_scores else y

    def get_config(self):  # the base layer's: `name`, `dtype` (a factory passes a policy)
        return super().get_config()


def mean_attention_reference(params, x, causal, value_mask=None):
    """`MeanAttention` in float64: `params` holds its two kernels."""
    T = x.shape[1]
    allowed = np.tril(np.ones((T, T))) if causal else np.ones((T, T))
    allowed = np.broadcast_to(allowed, (x.shape[0], T, T))
    if value_mask is not None:
        allowed = allowed * np.asarray(value_mask, np.float64)[:, None, :]
    weights = allowed / allowed.sum(-1, keepdims=True)
    return weights @ (x @ params["value_kernel"]) @ params["output_kernel"]


@keras.saving.register_keras_serializable(package="keras_attn_tests")
class TanhFeedForward(keras.layers.Layer):
    """`W_2 tanh(W_1 x)` of width `units`: the feed-forward contract `ff(x, training=...)`."""

    def __init__(self, units, **kwargs):
        super().__init__(**kwargs)
        self.units = units

    def build(self, input_shape):
        D = input_shape[-1]
        self.up_kernel = self.add_weight(name="up_kernel", shape=(D, self.units))
        self.down_kernel = self.add_weight(name="down_kernel", shape=(self.units, D))

    def call(self, x, training=None):
        return ops.matmul(ops.tanh(ops.matmul(x, self.up_kernel)), self.down_kernel)

    def get_config(self):
        return {**super().get_config(), "units": self.units}


def tanh_feed_forward_reference(params, x):
    return np.tanh(x @ params["up_kernel"]) @ params["down_kernel"]


def float64_weights(layer):
    """`{variable name: float64 array}` of a custom layer's own weights."""
    return {v.name: keras.ops.convert_to_numpy(v).astype(np.float64) for v in layer.weights}
