"""Transformer encoder layer (paper Section 3.1)."""

import keras

from keras_attn._validation import check_broadcastable, check_rank
from keras_attn.attention import combine_masks
from keras_attn.layers._transformer_base import TransformerLayerBase

__all__ = ["TransformerEncoderLayer"]


@keras.saving.register_keras_serializable(package="keras_attn")
class TransformerEncoderLayer(TransformerLayerBase):
    """Self-attention then a feed-forward network, each residual + LayerNorm.

    post-LN (default, as in the paper):
        `x = LN1(x + Drop(MHA(x)))`, `x = LN2(x + Drop(FFN(x)))`.
    pre-LN (`normalize_first=True`):
        `x = x + Drop(MHA(LN1(x)))`, `x = x + Drop(FFN(LN2(x)))`.

    Shapes: B batch, T length, D model width (the input's last axis),
    H `num_heads`, F `intermediate_dim`.

    Args:
        num_heads: H, the number of attention heads.
        intermediate_dim: F, the hidden width of the feed-forward network.
        key_dim: width of each attention head. Defaults to D // H, in which
            case D must be divisible by H.
        dropout: rate of the dropout on each sublayer's output before the
            residual sum (training only).
        activation: activation of the feed-forward network.
        layer_norm_epsilon: epsilon of both LayerNorms.
        normalize_first: pre-LN if True, post-LN (paper) if False.
        kernel_initializer: initializer of every dense kernel.
        bias_initializer: initializer of every dense bias.
        num_key_value_heads, rope_max_wavelength, rope_scaling_factor,
            rope_interleaved, sliding_window, logit_soft_cap, qk_norm: the
            self-attention's options (`keras_attn.options.AttentionOptions`,
            whose other fields, `qk_norm_epsilon`, `scale`, `rope_type` and its
            `rope_*` parameters such as `rope_beta_fast`, are keywords too;
            stored as `self.options`); cross-attention takes none of them.
        normalization: `"layer"` (`LayerNormalization`, default) or `"rms"`
            (`RMSNormalization`) for every norm.
        use_bias: whether the attention and feed-forward dense layers have
            biases.
        gated_feed_forward: a gated (GLU-style) feed-forward:
            `W_2 (act(x W_gate) * x W_1)`, sublayers `gate_dense`,
            `intermediate_dense`, `output_dense`.
        implementation: the attention path of every attention sublayer
            (`"auto"`, `"fused"`, `"blockwise"`, `"explicit"`, or a callable;
            see `keras_attn.MultiHeadAttention`).
        attention_dropout: dropout rate on the attention weights (training
            only), separate from `dropout` on the sublayers' outputs.
        attention_use_bias: bias on the attention's q, k, v projections
            (None: `use_bias`). Qwen 2: True, with
            `attention_output_use_bias=False` and `feed_forward_use_bias=False`.
        attention_output_use_bias: bias on the attention's output projection
            (None: as `attention_use_bias`).
        feed_forward_use_bias: bias on the feed-forward's dense layers
            (None: `use_bias`).
        attention: another self-attention layer instead of the default
            `keras_attn.MultiHeadAttention`: a `keras.layers.Layer`, or a
            factory `attention(name="self_attention", dtype=<the block's
            policy>)` called once here that returns one. Its call contract
            (`query`, `use_causal_mask`, `training`, and when they apply
            `attention_mask`, `value_mask`, `return_attention_scores`, `cache`,
            `cache_update_index`) is documented in
            `keras_attn.layers._sublayers`. With it, the default's arguments
            (`num_heads`, `key_dim`, `implementation`, `attention_dropout`,
            `attention_use_bias`, `attention_output_use_bias` and the
            `AttentionOptions` fields) must be left at their defaults (a
            `ValueError` names those set); `num_heads` is then optional.
            Serialized in the config (`keras.saving.serialize_keras_object`),
            so its class must be registered for a `.keras` file.
        feed_forward: another feed-forward layer instead of
            `PositionwiseFeedForward`, a layer or a factory
            `feed_forward(name="feed_forward", dtype=...)`, called as
            `feed_forward(x, training=...)` on `(B, T, D)` (a mixture of
            experts, say). With it, `intermediate_dim`, `activation`,
            `gated_feed_forward` and `feed_forward_use_bias` must be left at
            their defaults. An unbuilt given layer is built here with
            `layer.build((B, T, D))`.
        residual_scale: s > 0 or None: every residual branch is multiplied
            by s before the sum, `x + s * Drop(f(N(x)))` pre-LN and
            `N(x + s * Drop(f(x)))` post-LN (Granite's `residual_multiplier`).
            None (default) multiplies nothing; it is in the config only when
            set.
        use_post_attention_norm, use_post_ffw_norm: keras-hub's Gemma names:
            also normalise the attention's (feed-forward's) output before the
            residual add, `x = x + Drop(N_post(f(N(x))))` with pre-LN (Gemma 2
            and 3, OLMo 2's "sandwich"); sublayers `post_attention_norm`
            (`post_cross_attention_norm` too in a decoder with memory) and
            `post_feed_forward_norm`, of the kind `normalization` says.
        use_gate: Keras's gated attention output for the default
            self-attention (`keras_attn.MultiHeadAttention`'s `use_gate`:
            `attended * sigmoid(query W_g + b_g)` per head and feature, sublayer
            `self_attention.gate_dense`; arXiv 2505.06708, Qwen3-Next). A
            decoder's cross-attention is not gated. In the config only when
            True; with a given `attention` it must stay False.
        use_input_norm: False (keyword) removes the norms before the
            sublayers, so the block is `x = x + Drop(N_post(f(x)))` per
            sublayer (OLMo 2 and 3, EXAONE 4: transformers'
            `post_attention_layernorm` and `post_feedforward_layernorm` are
            their only norms); `self_attention_norm`, `feed_forward_norm`
            (`cross_attention_norm`) are then not made. Needs
            `normalize_first=True` and both post norms (else a `ValueError`
            naming them). In the config only when False.
        use_feed_forward_norm: False (keyword) removes the norm before the
            feed-forward only (`feed_forward_norm` is not made): a given
            `feed_forward` that normalises its own input receives the residual
            stream (`keras_attn.ParallelMixtureOfExperts`, Gemma 4's router).
            Pre-norm only. In the config only when False.
        use_attention_input_norm: False (keyword) removes only the norm
            before the self-attention, keeping the feed-forward's: the block is
            `x = x + Drop(attn(x))`, then `x = x + Drop(ffn(N(x)))` (ModernBERT's
            layer 0, whose `attn_norm` is `nn.Identity()`); `self_attention_norm`
            is then not made. Needs `normalize_first=True` (else a `ValueError`).
            In the config only when False.
        **kwargs: base layer arguments (`name`, `dtype`, ...).

    Sublayers: `self_attention` (`keras_attn.MultiHeadAttention`, or the given
    `attention`),
    `self_attention_norm`, `feed_forward` (`PositionwiseFeedForward`, or the given one),
    `feed_forward_norm` (`LayerNormalization`), and the dropouts
    `self_attention_dropout`, `feed_forward_dropout`.

    Call arguments:
        inputs: `(B, T, D)`.
        padding_mask: bool `(B, T)`, True = real token. Padded tokens are
            never attended. Combined with the Keras mask of `inputs` (from
            `Embedding(mask_zero=True)`, say), which is used the same way.
        attention_mask: bool, broadcastable to `(B, T, T)`; True = may
            attend.
        use_causal_mask: if True, token `i` only attends tokens `j <= i`.
        return_attention_scores: also return the self-attention weights.
        training: whether dropout is active.
        mask, inputs_mask: the Keras mask of `inputs`, filled in by Keras.
        attention_bias: an additive float bias on the self-attention's logits,
            broadcastable to `(B, H, T, T)`, or None (`MultiHeadAttention`'s
            `attention_bias`: after the scale and soft-cap, before the softmax;
            T5's relative position bias). A given `attention` receives it only
            when set.

    Returns:
        `(B, T, D)`, and with `return_attention_scores=True` also the
        weights `(B, H, T, T)`. The output carries the input's Keras mask.

    Example:

    >>> import numpy as np
    >>> encoder = TransformerEncoderLayer(4, intermediate_dim=64, normalize_first=True)
    >>> x = np.random.default_rng(0).standard_normal((2, 10, 32)).astype("float32")
    >>> real = np.arange(10) < np.array([[10], [7]])  # (B, T): row 1 has 7 tokens
    >>> outputs, scores = encoder(x, padding_mask=real, return_attention_scores=True)
    >>> tuple(outputs.shape), tuple(scores.shape)
    ((2, 10, 32), (2, 4, 10, 10))
    """

    def build(self, inputs_shape):
        inputs_shape = check_rank("inputs", inputs_shape, 3, "(B, T, D)")
        self._build_self_attention(inputs_shape)
        self._build_feed_forward(inputs_shape)
        self.built = True

    def compute_output_spec(self, inputs, padding_mask=None, attention_mask=None,
                            use_causal_mask=False, return_attention_scores=False,
                            training=None, mask=None, inputs_mask=None, attention_bias=None):
        """`call`'s structure on symbolic inputs: the outputs, and the scores if asked."""
        output = keras.KerasTensor(inputs.shape, dtype=self.compute_dtype)
        if not return_attention_scores:
            return output
        B, T = inputs.shape[0], inputs.shape[1]
        heads = self._score_heads(self.self_attention)
        return output, keras.KerasTensor((B, heads, T, T), dtype=self.compute_dtype)

    def call(
        self,
        inputs,
        padding_mask=None,
        attention_mask=None,
        use_causal_mask=False,
        return_attention_scores=False,
        training=None,
        mask=None,
        inputs_mask=None,
        attention_bias=None,
    ):
        B, T = check_rank("inputs", inputs, 3, "(B, T, D)")[:2]
        if padding_mask is not None:  # named here: it reaches the attention as `value_mask`
            check_broadcastable("padding_mask", padding_mask, (B, T), "(B, T)")
        keras_mask = mask if mask is not None else inputs_mask
        key_mask = combine_masks(padding_mask, keras_mask)
        attend = self._attention_fn(self.self_attention, None, key_mask, attention_mask,
                                    use_causal_mask, training, bool(return_attention_scores),
                                    bias=attention_bias)
        x, (scores, _) = self._residual(inputs, attend, self.self_attention_norm,
                                        self.self_attention_dropout, training,
                                        self.post_attention_norm)
        x, _ = self._residual(x, lambda h: self.feed_forward(h, training=training),
                              self.feed_forward_norm, self.feed_forward_dropout, training,
                              self.post_feed_forward_norm)
        return (x, scores) if return_attention_scores else x
