"""Gated DeltaNet (Yang et al., arXiv 2412.06464) as Qwen 3.5 and Qwen3-Next define it, as a
Keras layer: linear attention with a fixed-size state (`keras_attn.recurrent_cache`).

`call`: project x to the mixed q/k/v (`in_proj_qkv`), the output gate z (`in_proj_z`), the
write strength b and the decay input a -> the causal depthwise convolution over the mixed
q/k/v (its last K - 1 inputs from the cache) and silu -> L2-normalised q, k; beta =
sigmoid(b); g = -exp(A_log) softplus(a + dt_bias) -> the gated delta rule (chunked for more
than one token, recurrent for one; `keras_attn.linear_attention`) -> the gated RMSNorm
norm(o) * silu(z) per value head -> `out_proj`.
"""

import keras
from keras import ops

from keras_attn._shapes import static_shape
from keras_attn._typing import Initializer
from keras_attn._validation import check_positive_float, check_positive_int, check_rank
from keras_attn.linear_attention import chunk_gated_delta_rule, recurrent_gated_delta_rule
from keras_attn.recurrent_cache import RecurrentCache

__all__ = ["GatedDeltaNet"]


@keras.saving.register_keras_serializable(package="keras_attn")
class GatedDeltaNet(keras.layers.Layer):
    """Qwen 3.5's Gated DeltaNet linear-attention layer (transformers' `Qwen3_5GatedDeltaNet`).

    Per value head h and token t (H_k query/key heads, each serving H / H_k consecutive
    value heads; d_k, d_v the head widths):

        [q, k, v] = silu(causal_depthwise_conv(x W_qkv))     (kernel size K)
        q, k = l2norm(q), l2norm(k);  beta = sigmoid(x W_b)
        g = -exp(A_log) * softplus(x W_a + dt_bias)          (log decay, <= 0)
        S_t = exp(g_t) S_{t-1};  S_t += beta_t k_t (v_t - S_t^T k_t)^T
        o_t = S_t^T q_t / sqrt(d_k)
        y = concat_h(RMSNorm(o_h) * norm_scale * silu(z_h)) W_out,   z = x W_z

    The argument names are keras-hub 0.32's (`Qwen3_5GatedDeltaNet`), which are
    transformers' config fields. Weights, with transformers' names (torch `Linear` weights
    transpose into Keras kernels):

    | transformers                  | here                                |
    | ----------------------------- | ----------------------------------- |
    | `in_proj_qkv.weight` (C, D)   | `in_proj_qkv/kernel` (D, C), C = 2 H_k d_k + H d_v, [q, k, v] |
    | `in_proj_z.weight` (H d_v, D) | `in_proj_z/kernel` (D, H d_v)       |
    | `in_proj_b.weight` (H, D)     | `in_proj_b/kernel` (D, H)           |
    | `in_proj_a.weight` (H, D)     | `in_proj_a/kernel` (D, H)           |
    | `conv1d.weight` (C, 1, K)     | `conv1d_kernel` (C, K) (keras-hub's layout) |
    | `dt_bias` (H,), `A_log` (H,)  | `dt_bias`, `A_log`                  |
    | `norm.weight` (d_v,)          | `norm_scale` (d_v,)                 |
    | `out_proj.weight` (D, H d_v)  | `out_proj/kernel` (H d_v, D)        |

    Args:
        linear_num_key_heads: H_k, the query/key heads.
        linear_num_value_heads: H, the value heads (a multiple of H_k).
        linear_key_head_dim: d_k.
        linear_value_head_dim: d_v.
        linear_conv_kernel_dim: K, the short convolution's kernel size (4 in Qwen 3.5).
        layer_norm_epsilon: the gated RMSNorm's epsilon (transformers' `rms_norm_eps`).
        chunk_size: the chunk size of the prompt form (64, as transformers).
        kernel_initializer: for the projections and the convolution.
        **kwargs: `keras.layers.Layer` arguments (name, dtype, ...).

    Call arguments:
        hidden_states: `(B, T, D)`.
        cache: None, or a `keras_attn.recurrent_cache.RecurrentCache` (`empty_cache`): the
            state after the tokens seen so far; then the call returns the new one too.
            One token with a cache runs the recurrent form, more the chunked form.
        use_causal_mask: True (the default): the layer is causal by construction. It is
            here for the block contract (`TransformerDecoderLayer(attention=...)` passes
            it); False is a `ValueError`.
        cache_update_index: the position of the first of the T tokens, which a block
            passes with its cache (`CausalLM.generate`): accepted and not read, since a
            state has no positions (it holds exactly the tokens seen so far).

    Inside a `TransformerDecoderLayer` (`attention=GatedDeltaNet(...)`) it is a block of a
    hybrid `keras_attn.CausalLM` (Qwen 3.5): `keras_attn.empty_cache(block, B, L)` makes
    its `RecurrentCache` (whatever L), which `generate` carries beside the other blocks'
    key/value caches.

    Returns:
        `(B, T, D)`; with a cache, `(output, new_cache)`.

    Example:

    >>> layer = GatedDeltaNet(1, 2, 4, 3, linear_conv_kernel_dim=3, chunk_size=4)
    >>> x = keras.ops.ones((2, 5, 8))
    >>> tuple(layer(x).shape)
    (2, 5, 8)
    >>> y, cache = layer(x, cache=layer.empty_cache(2))
    >>> tuple(cache.recurrent_state.shape)
    (2, 2, 4, 3)
    """

    # Read by `keras_attn.empty_cache`: this layer's cache is a RecurrentCache, not a KVCache.
    has_recurrent_state = True

    def __init__(self, linear_num_key_heads: int, linear_num_value_heads: int,
                 linear_key_head_dim: int, linear_value_head_dim: int,
                 linear_conv_kernel_dim: int = 4, layer_norm_epsilon: float = 1e-6,
                 chunk_size: int = 64, kernel_initializer: Initializer = "glorot_uniform",
                 **kwargs):
        super().__init__(**kwargs)
        self.linear_num_key_heads = check_positive_int("linear_num_key_heads",
                                                       linear_num_key_heads)
        self.linear_num_value_heads = check_positive_int("linear_num_value_heads",
                                                         linear_num_value_heads)
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ValueError(
                "`linear_num_value_heads` must be a multiple of `linear_num_key_heads` (each "
                "query/key head serves consecutive value heads). Received: "
                f"linear_num_value_heads={linear_num_value_heads}, "
                f"linear_num_key_heads={linear_num_key_heads}")
        self.linear_key_head_dim = check_positive_int("linear_key_head_dim", linear_key_head_dim)
        self.linear_value_head_dim = check_positive_int("linear_value_head_dim",
                                                        linear_value_head_dim)
        self.linear_conv_kernel_dim = check_positive_int("linear_conv_kernel_dim",
                                                         linear_conv_kernel_dim)
        self.layer_norm_epsilon = check_positive_float("layer_norm_epsilon", layer_norm_epsilon)
        self.chunk_size = check_positive_int("chunk_size", chunk_size)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)

    @property
    def key_dim(self):
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def value_dim(self):
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def conv_dim(self):
        return 2 * self.key_dim + self.value_dim

    def build(self, hidden_states_shape):
        shape = check_rank("hidden_states", hidden_states_shape, 3, "(B, T, D)")
        self.hidden_size = shape[-1]

        def dense(name, units, width):
            layer = keras.layers.Dense(units, use_bias=False, name=name,
                                       kernel_initializer=self.kernel_initializer,
                                       dtype=self.dtype_policy)
            layer.build((None, None, width))
            return layer

        heads = self.linear_num_value_heads
        self.in_proj_qkv = dense("in_proj_qkv", self.conv_dim, self.hidden_size)
        self.in_proj_z = dense("in_proj_z", self.value_dim, self.hidden_size)
        self.in_proj_b = dense("in_proj_b", heads, self.hidden_size)
        self.in_proj_a = dense("in_proj_a", heads, self.hidden_size)
        self.conv1d_kernel = self.add_weight(
            name="conv1d_kernel", shape=(self.conv_dim, self.linear_conv_kernel_dim),
            initializer=self.kernel_initializer)
        self.dt_bias = self.add_weight(name="dt_bias", shape=(heads,), initializer="ones")
        # transformers draws A from U(0.01, 16); zeros (A = 1) is keras-hub's neutral start.
        self.A_log = self.add_weight(name="A_log", shape=(heads,), initializer="zeros")
        self.norm_scale = self.add_weight(name="norm_scale",
                                          shape=(self.linear_value_head_dim,),
                                          initializer="ones")
        self.out_proj = dense("out_proj", self.hidden_size, self.value_dim)

    def empty_cache(self, batch_size, dtype="float32"):
        """A zero `RecurrentCache` for `batch_size` sequences: conv state `(B, C, K - 1)`,
        recurrent state `(B, H, d_k, d_v)` (float32 by default, as transformers keeps the
        state whatever the weights' dtype)."""
        return RecurrentCache.empty(batch_size, self.conv_dim, self.linear_conv_kernel_dim,
                                    self.linear_num_value_heads, self.linear_key_head_dim,
                                    self.linear_value_head_dim, dtype=dtype)

    def cache_bytes_per_sequence(self, dtype="float32"):
        """Bytes of one sequence's `RecurrentCache`: `C (K - 1) + H d_k d_v` numbers,
        whatever the sequence's length."""
        return self.empty_cache(1, dtype).nbytes_per_sequence()

    def _conv(self, mixed, conv_state):
        """The causal depthwise convolution over `(B, T, C)`, its K - 1 earlier inputs from
        `conv_state` `(B, C, K - 1)`; returns `(silu(conv), new conv state)`."""
        taps = self.linear_conv_kernel_dim
        length = static_shape(mixed)[1]
        past = ops.cast(ops.swapaxes(conv_state, 1, 2), mixed.dtype)
        full = ops.concatenate([past, mixed], axis=1)  # (B, K - 1 + T, C)
        kernel = ops.cast(self.conv1d_kernel, mixed.dtype)
        # K shifted products (K is 4): a loop over the kernel's taps, not over tokens.
        out = sum(full[:, i:i + length] * kernel[:, i] for i in range(taps))
        new_state = ops.swapaxes(full[:, length:], 1, 2)
        return ops.silu(out), new_state

    def call(self, hidden_states, cache=None, training=None, use_causal_mask=True,
             cache_update_index=None):
        if use_causal_mask is not True:
            raise ValueError("`GatedDeltaNet` is causal by construction (a recurrent state): "
                             f"`use_causal_mask` must be True. Received: "
                             f"use_causal_mask={use_causal_mask!r}")
        shape = static_shape(hidden_states)
        length = shape[1]
        heads, d_k, d_v = (self.linear_num_value_heads, self.linear_key_head_dim,
                           self.linear_value_head_dim)
        if cache is not None:
            if not isinstance(cache, RecurrentCache):
                raise ValueError("`cache` must be a `RecurrentCache` (see `empty_cache`). "
                                 f"Received: cache={type(cache).__name__}")
            cache.check(shape[0], self.conv_dim, self.linear_conv_kernel_dim,
                        (heads, d_k, d_v))
            conv_state, state = cache
        else:
            batch = ops.shape(hidden_states)[0]
            conv_state = ops.zeros((batch, self.conv_dim, self.linear_conv_kernel_dim - 1),
                                   hidden_states.dtype)
            state = None
        mixed, new_conv = self._conv(self.in_proj_qkv(hidden_states), conv_state)
        q = ops.reshape(mixed[..., :self.key_dim], (-1, length, self.linear_num_key_heads, d_k))
        k = ops.reshape(mixed[..., self.key_dim:2 * self.key_dim],
                        (-1, length, self.linear_num_key_heads, d_k))
        v = ops.reshape(mixed[..., 2 * self.key_dim:], (-1, length, heads, d_v))
        z = ops.reshape(self.in_proj_z(hidden_states), (-1, length, heads, d_v))
        beta = ops.sigmoid(ops.cast(self.in_proj_b(hidden_states), "float32"))
        # float32 as transformers: exp(A_log) would overflow float16.
        a = ops.cast(self.in_proj_a(hidden_states), "float32") + ops.cast(self.dt_bias, "float32")
        g = -ops.exp(ops.cast(self.A_log, "float32")) * ops.softplus(a)
        if cache is not None and length == 1:
            o, new_state = recurrent_gated_delta_rule(q, k, v, g, beta, state,
                                                      use_qk_l2norm_in_kernel=True)
        else:
            o, new_state = chunk_gated_delta_rule(q, k, v, g, beta, state,
                                                  chunk_size=self.chunk_size,
                                                  use_qk_l2norm_in_kernel=True)
        y = self.out_proj(ops.reshape(self._gated_norm(o, z), (-1, length, self.value_dim)))
        if cache is None:
            return y
        return y, RecurrentCache(ops.cast(new_conv, cache.conv_state.dtype),
                                 ops.cast(new_state, cache.recurrent_state.dtype))

    def _gated_norm(self, o, z):
        """transformers' `Qwen3_5RMSNormGated`: RMSNorm(o) * norm_scale * silu(z), in float32."""
        x = ops.cast(o, "float32")
        x = x * ops.rsqrt(ops.mean(x * x, axis=-1, keepdims=True) + self.layer_norm_epsilon)
        x = x * ops.cast(self.norm_scale, "float32") * ops.silu(ops.cast(z, "float32"))
        return ops.cast(x, self.compute_dtype)

    def compute_output_shape(self, hidden_states_shape):
        return tuple(check_rank("hidden_states", hidden_states_shape, 3, "(B, T, D)"))

    def get_config(self):
        config = super().get_config()
        config.update({
            "linear_num_key_heads": self.linear_num_key_heads,
            "linear_num_value_heads": self.linear_num_value_heads,
            "linear_key_head_dim": self.linear_key_head_dim,
            "linear_value_head_dim": self.linear_value_head_dim,
            "linear_conv_kernel_dim": self.linear_conv_kernel_dim,
            "layer_norm_epsilon": self.layer_norm_epsilon,
            "chunk_size": self.chunk_size,
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
        })
        return config
