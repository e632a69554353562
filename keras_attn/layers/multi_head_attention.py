"""Multi-head attention (paper Section 3.2.2) as a Keras layer."""

import math

import keras
from keras import ops

from keras_attn._validation import (
    check_broadcastable,
    check_dropout,
    check_positive_int,
    check_rank,
    static_shape,
)
from keras_attn.attention import (
    check_implementation,
    combine_masks,
    fused_attention_bthd,
    scaled_dot_product_attention,
    select_implementation,
)
from keras_attn.layers._common import clone_initializer

__all__ = ["MultiHeadAttention"]


@keras.saving.register_keras_serializable(package="keras_attn")
class MultiHeadAttention(keras.layers.Layer):
    """Multi-head attention, with masks that are never silently dropped.

    `output = concat(head_1, ..., head_H) W_o`, where
    `head_h = attention(query W_q^h, key W_k^h, value W_v^h)` and attention is
    `keras_attn.scaled_dot_product_attention`.

    Shapes: B batch, T query length, S key/value length, H `num_heads`,
    q_dim, k_dim, v_dim the widths of query, key and value (they may all
    differ), d_k `key_dim`, d_v `value_dim`.

    Weight layout: the sublayers are `keras.layers.Dense` named
    `query_dense` (kernel `(q_dim, H * d_k)`), `key_dense`
    (`(k_dim, H * d_k)`), `value_dense` (`(v_dim, H * d_v)`) and
    `output_dense` (`(H * d_v, output_dim)`). Head `h` owns columns
    `[h * d_k, (h + 1) * d_k)` of the query and key kernels (and likewise for
    values). This is the transpose of `torch.nn.MultiheadAttention`'s
    layout: to port its weights, split `in_proj_weight` into its q, k, v
    blocks and transpose each (`kernel = W.T`), and use
    `out_proj.weight.T` for `output_dense`.

    Args:
        num_heads: H, the number of attention heads.
        key_dim: d_k, the width of each head's queries and keys.
        value_dim: d_v, the width of each head's values. Defaults to
            `key_dim`.
        output_dim: width of the output. Defaults to q_dim.
        dropout: dropout rate on the attention weights (training only).
        use_bias: whether the four dense layers have biases.
        kernel_initializer: initializer of the dense kernels.
        bias_initializer: initializer of the dense biases.
        kernel_regularizer: regularizer of the dense kernels.
        bias_regularizer: regularizer of the dense biases.
        seed: int seed of the attention dropout.
        implementation: `"auto"` (default), `"fused"`, `"blockwise"` or
            `"explicit"`; see `keras_attn.scaled_dot_product_attention`.
            The fused path keeps the projections in `(B, T, H, d)` layout
            (no head transposes); attention scores and attention dropout
            always use the explicit path. The weights are the same on
            every path.
        **kwargs: base layer arguments (`name`, `dtype`, ...).

    Call arguments:
        query: `(B, T, q_dim)`.
        key: `(B, S, k_dim)`. Defaults to `query` (self-attention).
        value: `(B, S, v_dim)`. Defaults to `key`.
        attention_mask: boolean, broadcastable to `(B, T, S)` or
            `(B, H, T, S)`; True = may attend. Combined (logical AND) with
            the causal mask and with the Keras masks of the inputs.
        use_causal_mask: if True, query `i` may only attend key
            `j <= i + (S - T)`.
        return_attention_scores: also return the attention weights.
        training: whether attention dropout is active.
        query_mask, key_mask, value_mask: Keras masks `(B, T)`, `(B, S)`,
            `(B, S)`, filled in by Keras from masked inputs (for example
            after `Embedding(mask_zero=True)`). Masked keys and values are
            never attended; the output carries the query's mask.
        mask: the query's Keras mask when `query` is the only tensor
            argument (Keras fills it in); used as `query_mask`.

    Returns:
        The output `(B, T, output_dim)`, and with
        `return_attention_scores=True` also the weights `(B, H, T, S)`.
        A query that may attend no key gets a zero attention output.
    """

    def __init__(
        self,
        num_heads,
        key_dim,
        value_dim=None,
        output_dim=None,
        dropout=0.0,
        use_bias=True,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        kernel_regularizer=None,
        bias_regularizer=None,
        seed=None,
        implementation="auto",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.key_dim = check_positive_int("key_dim", key_dim)
        self.value_dim = check_positive_int("value_dim", value_dim, allow_none=True)
        self.output_dim = check_positive_int("output_dim", output_dim, allow_none=True)
        self.dropout = check_dropout("dropout", dropout)
        self.use_bias = bool(use_bias)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.kernel_regularizer = keras.regularizers.get(kernel_regularizer)
        self.bias_regularizer = keras.regularizers.get(bias_regularizer)
        self.seed = seed
        self.implementation = check_implementation(implementation)
        self.seed_generator = keras.random.SeedGenerator(seed) if self.dropout > 0 else None
        self.supports_masking = True

    @property
    def head_value_dim(self):
        """d_v: `value_dim`, or `key_dim` when it is not set."""
        return self.value_dim or self.key_dim

    def _dense(self, units, name):
        return keras.layers.Dense(
            units,
            use_bias=self.use_bias,
            kernel_initializer=clone_initializer(self.kernel_initializer),
            bias_initializer=clone_initializer(self.bias_initializer),
            kernel_regularizer=self.kernel_regularizer,
            bias_regularizer=self.bias_regularizer,
            dtype=self.dtype_policy,
            name=name,
        )

    def build(self, query_shape, key_shape=None, value_shape=None):
        query_shape = check_rank("query", query_shape, 3, "(B, T, q_dim)")
        key_shape = query_shape if key_shape is None else check_rank(
            "key", key_shape, 3, "(B, S, k_dim)")
        value_shape = key_shape if value_shape is None else check_rank(
            "value", value_shape, 3, "(B, S, v_dim)")
        H, d_k, d_v = self.num_heads, self.key_dim, self.head_value_dim
        out_dim = self.output_dim or query_shape[-1]

        self.query_dense = self._dense(H * d_k, "query_dense")
        self.query_dense.build(query_shape)
        self.key_dense = self._dense(H * d_k, "key_dense")
        self.key_dense.build(key_shape)
        self.value_dense = self._dense(H * d_v, "value_dense")
        self.value_dense.build(value_shape)
        self.output_dense = self._dense(out_dim, "output_dense")
        self.output_dense.build(query_shape[:-1] + (H * d_v,))
        self.built = True

    @staticmethod
    def _plain(dense):
        """Whether `dense` computes `x @ kernel + bias` (no LoRA, no quantization)."""
        return not getattr(dense, "lora_enabled", False) and not getattr(
            dense, "quantization_mode", None)

    def _project_heads(self, dense, x, head_dim):
        """`dense(x)` as `(B, L, H, d)`.

        One einsum into the heads layout (as Keras's own MHA does with
        `EinsumDense`), reading the `Dense` kernel `(in, H * d)` as
        `(in, H, d)` (a free reshape). This measured faster than `Dense` +
        reshape in JAX's compiled train step; the weights are the same.
        """
        if not self._plain(dense):
            y = dense(x)
            return ops.reshape(y, (ops.shape(y)[0], ops.shape(y)[1], self.num_heads, head_dim))
        kernel = ops.reshape(dense.kernel, (dense.kernel.shape[0], self.num_heads, head_dim))
        y = ops.einsum("bli,ihd->blhd", x, kernel)
        if dense.bias is not None:
            y = y + ops.reshape(dense.bias, (self.num_heads, head_dim))
        return y

    def _project_output(self, attended):
        """`output_dense` applied to `(B, T, H, d_v)`, contracting heads and width."""
        dense = self.output_dense
        if not self._plain(dense):
            B, T = ops.shape(attended)[0], ops.shape(attended)[1]
            return dense(ops.reshape(attended, (B, T, self.num_heads * self.head_value_dim)))
        kernel = ops.reshape(dense.kernel, (self.num_heads, self.head_value_dim, -1))
        y = ops.einsum("bthd,hdo->bto", attended, kernel)
        if dense.bias is not None:
            y = y + dense.bias
        return y

    def _attention_mask(self, query, key, attention_mask, key_padding):
        """Merge the explicit mask and the key padding into `(B, H|1, T, S)`."""
        B, T = static_shape(query)[:2]
        S = static_shape(key)[1]
        if attention_mask is not None:
            rank = len(static_shape(attention_mask))
            if rank == 4:
                check_broadcastable("attention_mask", attention_mask,
                                    (B, self.num_heads, T, S), "(B, H, T, S)")
            else:
                check_broadcastable("attention_mask", attention_mask,
                                    (B, T, S), "(B, T, S)")
                if rank == 3:
                    attention_mask = ops.expand_dims(attention_mask, 1)  # (B, 1, T, S)
                # rank < 3 ((T, S) or (S,)) already broadcasts from the right.
        if key_padding is not None:
            check_broadcastable("key_mask", key_padding, (B, S), "(B, S)")
            key_padding = ops.expand_dims(ops.expand_dims(key_padding, 1), 1)  # (B, 1, 1, S)
        return combine_masks(attention_mask, key_padding)

    def call(
        self,
        query,
        key=None,
        value=None,
        attention_mask=None,
        use_causal_mask=False,
        return_attention_scores=False,
        training=None,
        query_mask=None,
        key_mask=None,
        value_mask=None,
        mask=None,
    ):
        query_mask = query_mask if query_mask is not None else mask
        if key is None:
            key, key_mask = query, (key_mask if key_mask is not None else query_mask)
        if value is None:
            value, value_mask = key, (value_mask if value_mask is not None else key_mask)
        check_rank("query", query, 3, "(B, T, q_dim)")
        check_rank("key", key, 3, "(B, S, k_dim)")
        check_rank("value", value, 3, "(B, S, v_dim)")
        S_key, S_value = static_shape(key)[1], static_shape(value)[1]
        if None not in (S_key, S_value) and S_key != S_value:
            raise ValueError(
                "`key` and `value` must have the same length S. "
                f"Received: key.shape={static_shape(key)}, "
                f"value.shape={static_shape(value)}"
            )
        mask_4d = self._attention_mask(
            query, key, attention_mask, combine_masks(key_mask, value_mask)
        )

        H, d_k, d_v = self.num_heads, self.key_dim, self.head_value_dim
        training = bool(training)
        needs_weights = bool(return_attention_scores) or (training and self.dropout > 0.0)
        B, T = static_shape(query)[:2]
        S = static_shape(key)[1]
        path = select_implementation(
            self.implementation, lead=(B, H), T=T, S=S, has_mask=mask_4d is not None,
            has_bias=False, is_causal=use_causal_mask, needs_weights=needs_weights,
            symbolic=isinstance(query, keras.KerasTensor))

        q = self._project_heads(self.query_dense, query, d_k)  # (B, T, H, d_k)
        k = self._project_heads(self.key_dense, key, d_k)  # (B, S, H, d_k)
        v = self._project_heads(self.value_dense, value, d_v)  # (B, S, H, d_v)
        scores = None
        if path == "fused":
            # Keras's (B, T, H, d) layout: no transposes on our side.
            attended = fused_attention_bthd(
                q, k, v, mask=mask_4d, is_causal=use_causal_mask,
                scale=1.0 / math.sqrt(d_k))  # (B, T, H, d_v)
        else:
            q, k, v = (ops.transpose(x, (0, 2, 1, 3)) for x in (q, k, v))  # (B, H, L, d)
            attended = scaled_dot_product_attention(
                q, k, v,
                mask=mask_4d,
                is_causal=use_causal_mask,
                dropout_rate=self.dropout,
                seed=self.seed_generator,
                training=training,
                return_attention_scores=bool(return_attention_scores),
                implementation=path,
            )
            if return_attention_scores:
                attended, scores = attended
            attended = ops.transpose(attended, (0, 2, 1, 3))  # (B, T, H, d_v)
        output = self._project_output(attended)  # (B, T, output_dim)
        if return_attention_scores:
            return output, scores
        return output

    def compute_output_shape(self, query_shape, key_shape=None, value_shape=None):
        query_shape = check_rank("query", query_shape, 3, "(B, T, q_dim)")
        return query_shape[:-1] + (self.output_dim or query_shape[-1],)

    def compute_output_spec(
        self, query, key=None, value=None, attention_mask=None,
        use_causal_mask=False, return_attention_scores=False, training=None,
        query_mask=None, key_mask=None, value_mask=None, mask=None,
    ):
        key = query if key is None else key
        output = keras.KerasTensor(
            self.compute_output_shape(query.shape), dtype=self.compute_dtype)
        if not return_attention_scores:
            return output
        B, T = query.shape[0], query.shape[1]
        scores_shape = (B, self.num_heads, T, key.shape[1])
        return output, keras.KerasTensor(scores_shape, dtype=self.compute_dtype)

    def get_config(self):
        config = super().get_config()
        config.update({
            "num_heads": self.num_heads,
            "key_dim": self.key_dim,
            "value_dim": self.value_dim,
            "output_dim": self.output_dim,
            "dropout": self.dropout,
            "use_bias": self.use_bias,
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            "kernel_regularizer": keras.regularizers.serialize(self.kernel_regularizer),
            "bias_regularizer": keras.regularizers.serialize(self.bias_regularizer),
            "seed": self.seed,
            "implementation": self.implementation,
        })
        return config
