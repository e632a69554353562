"""Transformer decoder layer (paper Section 3.1), or a decoder-only block."""

import keras

from keras_attn._validation import check_rank
from keras_attn.attention import combine_masks
from keras_attn.layers._transformer_base import TransformerLayerBase

__all__ = ["TransformerDecoderLayer"]


@keras.saving.register_keras_serializable(package="keras_attn")
class TransformerDecoderLayer(TransformerLayerBase):
    """Causal self-attention, cross-attention over `memory`, then an FFN.

    Each sublayer has a residual connection, dropout and LayerNorm placed as
    in `TransformerEncoderLayer` (post-LN by default, pre-LN with
    `normalize_first=True`). Built without `memory` it is a decoder-only
    (GPT-style) block: no cross-attention sublayers exist, and calling it
    with `memory` later raises a `ValueError` (and vice versa).

    Shapes: B batch, T target length, S memory length, D model width,
    D_m memory width (may differ from D), H `num_heads`.

    Args:
        Same as `TransformerEncoderLayer`: `num_heads`, `intermediate_dim`,
        `key_dim`, `dropout`, `activation`, `layer_norm_epsilon`,
        `normalize_first`, `kernel_initializer`, `bias_initializer`.

    Sublayers: `self_attention`, `self_attention_norm`, `cross_attention`,
    `cross_attention_norm` (only with memory), `feed_forward`,
    `feed_forward_norm`, and their dropouts.

    Call arguments:
        inputs: `(B, T, D)`, the target sequence.
        memory: `(B, S, D_m)`, the encoder output, or None.
        padding_mask: bool `(B, T)`, True = real target token.
        memory_padding_mask: bool `(B, S)`, True = real memory token.
        attention_mask: bool broadcastable to `(B, T, T)` for
            self-attention.
        memory_attention_mask: bool broadcastable to `(B, T, S)` for
            cross-attention.
        use_causal_mask: causal self-attention (default True).
        return_attention_scores: also return the attention weights.
        training: whether dropout is active.
        mask, inputs_mask, memory_mask: the Keras masks of `inputs` and
            `memory`, filled in by Keras; used like the padding masks.
        self_attention_cache: the self-attention's key/value cache
            `(B, 2, S_max, H_kv, d)` (`keras_attn.empty_cache(layer, B,
            S_max)`), or None. With it, `padding_mask` is `(B, S_max)` and
            `attention_mask` broadcasts to `(B, T, S_max)`, over the cache
            slots; a Keras mask of `inputs` raises a `ValueError`.
        self_attention_cache_update_index: where the T new tokens are
            written (an int or a scalar int tensor): they are the positions
            `self_attention_cache_update_index + i`.
        cross_attention_cache: the cross-attention's cache
            `(B, 2, S, H, d)` (`layer.cross_attention.empty_cache(B, S)`),
            or None; only together with `self_attention_cache`. With
            `cross_attention_cache_update_index=None` it is read-only and
            `memory` may be None; `memory_padding_mask` is `(B, S)`.
        cross_attention_cache_update_index: 0 to fill the cross cache from
            `memory` (the usual prefill), or None to read it.

    Returns:
        `(B, T, D)`. With `return_attention_scores=True`, a tuple
        `(outputs, self_attention_scores (B, H, T, T),
        cross_attention_scores (B, H, T, S))`, the last only when the layer
        has memory (with caches, their key axis is the cache's length:
        S_max, and the cross cache's S). With caches, the updated caches follow, as keras-hub's
        `TransformerDecoder`: `(outputs, self_attention_cache)`, or
        `(outputs, self_attention_cache, cross_attention_cache)` when both
        are given (after the scores, if requested).
    """

    def build(self, inputs_shape, memory_shape=None):
        inputs_shape = check_rank("inputs", inputs_shape, 3, "(B, T, D)")
        model_dim = inputs_shape[-1]
        self.has_memory = memory_shape is not None
        self.self_attention = self._attention(
            "self_attention", model_dim, inputs_shape, inputs_shape)
        self.self_attention_norm = self._norm("self_attention_norm", inputs_shape)
        self.self_attention_dropout = self._dropout("self_attention_dropout")
        if self.has_memory:
            memory_shape = check_rank("memory", memory_shape, 3, "(B, S, D_m)")
            self.cross_attention = self._attention(
                "cross_attention", model_dim, inputs_shape, memory_shape, self_attention=False)
            self.cross_attention_norm = self._norm("cross_attention_norm", inputs_shape)
            self.cross_attention_dropout = self._dropout("cross_attention_dropout")
        self.feed_forward = self._feed_forward(inputs_shape)
        self.feed_forward_norm = self._norm("feed_forward_norm", inputs_shape)
        self.feed_forward_dropout = self._dropout("feed_forward_dropout")
        self.built = True

    def _check_memory(self, memory, cross_attention_cache=None,
                      cross_attention_cache_update_index=None):
        if self.has_memory and memory is None and (
                cross_attention_cache is None or cross_attention_cache_update_index is not None):
            raise ValueError(
                f"Layer '{self.name}' was built with `memory` (encoder-decoder "
                "cross-attention) and must be called with it, or with a filled "
                "`cross_attention_cache` and no `cross_attention_cache_update_index`. "
                "Received: memory=None"
            )
        if not self.has_memory and memory is not None:
            raise ValueError(
                f"Layer '{self.name}' was built without `memory` (a "
                "decoder-only block with no cross-attention) and cannot be "
                f"called with it. Received: memory.shape={tuple(memory.shape)}"
            )
        if not self.has_memory and cross_attention_cache is not None:
            raise ValueError(
                f"Layer '{self.name}' was built without `memory` and has no "
                "cross-attention to cache. Received: cross_attention_cache.shape="
                f"{tuple(cross_attention_cache.shape)}"
            )

    def call(
        self,
        inputs,
        memory=None,
        padding_mask=None,
        memory_padding_mask=None,
        attention_mask=None,
        memory_attention_mask=None,
        use_causal_mask=True,
        return_attention_scores=False,
        training=None,
        mask=None,
        inputs_mask=None,
        memory_mask=None,
        self_attention_cache=None,
        self_attention_cache_update_index=None,
        cross_attention_cache=None,
        cross_attention_cache_update_index=None,
    ):
        check_rank("inputs", inputs, 3, "(B, T, D)")
        self._check_memory(memory, cross_attention_cache, cross_attention_cache_update_index)
        if cross_attention_cache is not None and self_attention_cache is None:
            raise ValueError(
                "`cross_attention_cache` is used together with `self_attention_cache` "
                "(incremental decoding); pass both, or neither. Received: "
                "self_attention_cache=None, cross_attention_cache.shape="
                f"{tuple(cross_attention_cache.shape)}")
        keras_mask = mask if mask is not None else inputs_mask
        if self_attention_cache is not None and keras_mask is not None:
            # The inputs' Keras mask covers the T new tokens; with a cache the
            # self-attention's keys are the S_max cache slots.
            raise ValueError(
                "With `self_attention_cache`, mark padded cache slots with "
                "`padding_mask` of shape (B, S_max); the Keras mask of `inputs` (B, T) "
                "does not cover the cached positions. Received: a Keras mask of shape "
                f"{tuple(keras_mask.shape)}")
        self_key_mask = combine_masks(padding_mask, keras_mask)
        scores = [] if return_attention_scores else None
        caches = []
        x = self._residual(
            inputs,
            self._attention_fn(self.self_attention, None, self_key_mask, attention_mask,
                               use_causal_mask, training, scores, self_attention_cache,
                               self_attention_cache_update_index, caches),
            self.self_attention_norm, self.self_attention_dropout, training)
        if self.has_memory:
            memory_key_mask = combine_masks(memory_padding_mask, memory_mask)
            x = self._residual(
                x,
                self._attention_fn(self.cross_attention, memory, memory_key_mask,
                                   memory_attention_mask, False, training, scores,
                                   cross_attention_cache, cross_attention_cache_update_index,
                                   caches),
                self.cross_attention_norm, self.cross_attention_dropout, training)
        x = self._residual(x, lambda h: self.feed_forward(h, training=training),
                           self.feed_forward_norm, self.feed_forward_dropout,
                           training)
        results = (x, *(scores or ()), *caches)
        return results if len(results) > 1 else x
