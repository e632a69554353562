"""Position-wise feed-forward network (paper Section 3.3, Eq. 2)."""

from collections.abc import Callable

import keras

from keras_attn._typing import Initializer
from keras_attn._validation import check_dropout, check_positive_int
from keras_attn.layers._common import clone_initializer

__all__ = ["PositionwiseFeedForward"]


@keras.saving.register_keras_serializable(package="keras_attn")
class PositionwiseFeedForward(keras.layers.Layer):
    """`FFN(x) = W_2 dropout(activation(W_1 x + b_1)) + b_2`, per position.

    The activation is applied after the first dense layer only, as in the
    paper's Eq. 2 (not after the second). With `gated=True` it is the gated
    form of today's decoders, `W_down dropout(act(W_gate x) * W_up x)`:
    SwiGLU with `activation="silu"` (Llama, Mistral), GeGLU with `"gelu"`.

    Shapes: B batch, T length, D input width, F `intermediate_dim`.

    Args:
        intermediate_dim: F, width of the hidden layer.
        output_dim: width of the output. Defaults to D.
        activation: activation of the hidden layer (name or callable).
        dropout: dropout rate on the hidden activations (training only).
        use_bias: whether the dense layers have biases.
        gated: the gated form. Sublayers: `gate_dense` (W_gate, with the
            activation), `intermediate_dense` (W_up, linear) and
            `output_dense` (W_down), as keras-hub's Llama feed-forward.
        kernel_initializer: initializer of the kernels.
        bias_initializer: initializer of the biases.
        **kwargs: base layer arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: `(B, T, D)` (any leading dims work).
        training: whether dropout is active.

    Returns:
        `(B, T, output_dim or D)`. Keras masks pass through unchanged.

    Example:

    >>> import numpy as np
    >>> ffn = PositionwiseFeedForward(64, activation="silu", gated=True)
    >>> tuple(ffn(np.zeros((2, 5, 16), "float32")).shape)
    (2, 5, 16)
    """

    def __init__(
        self,
        intermediate_dim: int,
        output_dim: int | None = None,
        activation: str | Callable = "relu",
        dropout: float = 0.0,
        use_bias: bool = True,
        kernel_initializer: Initializer = "glorot_uniform",
        bias_initializer: Initializer = "zeros",
        gated: bool = False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.intermediate_dim = check_positive_int("intermediate_dim", intermediate_dim)
        self.output_dim = check_positive_int("output_dim", output_dim, allow_none=True)
        self.activation = keras.activations.get(activation)
        self.dropout = check_dropout("dropout", dropout)
        self.use_bias = bool(use_bias)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.gated = bool(gated)
        self.supports_masking = True

    def _dense(self, units, activation, name):
        return keras.layers.Dense(
            units,
            activation=activation,
            use_bias=self.use_bias,
            kernel_initializer=clone_initializer(self.kernel_initializer),
            bias_initializer=clone_initializer(self.bias_initializer),
            dtype=self.dtype_policy,
            name=name,
        )

    def build(self, input_shape):
        input_shape = tuple(input_shape)
        if self.gated:
            self.gate_dense = self._dense(self.intermediate_dim, self.activation, "gate_dense")
            self.gate_dense.build(input_shape)
        self.intermediate_dense = self._dense(
            self.intermediate_dim, None if self.gated else self.activation, "intermediate_dense")
        self.intermediate_dense.build(input_shape)
        self.dropout_layer = keras.layers.Dropout(
            self.dropout, dtype=self.dtype_policy, name="dropout")
        self.output_dense = self._dense(
            self.output_dim or input_shape[-1], None, "output_dense")
        self.output_dense.build(input_shape[:-1] + (self.intermediate_dim,))
        self.built = True

    def call(self, inputs, training=None):
        hidden = self.intermediate_dense(inputs)  # (B, T, F), activation applied unless gated
        if self.gated:
            hidden = self.gate_dense(inputs) * hidden  # act(W_gate x) * W_up x
        hidden = self.dropout_layer(hidden, training=training)
        return self.output_dense(hidden)  # (B, T, output_dim)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)[:-1] + (self.output_dim or input_shape[-1],)

    def get_config(self):
        config = super().get_config()
        config.update({
            "intermediate_dim": self.intermediate_dim,
            "output_dim": self.output_dim,
            "activation": keras.activations.serialize(self.activation),
            "dropout": self.dropout,
            "use_bias": self.use_bias,
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            "gated": self.gated,
        })
        return config
