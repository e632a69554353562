"""Transformer decoder layer (paper Section 3.1), or a decoder-only block."""

import keras
from keras import ops

from keras_attn._shapes import static_shape
from keras_attn._validation import check_broadcastable, check_positive_int, check_rank
from keras_attn.attention import combine_masks
from keras_attn.cache import cache_length, cache_shape, cache_spec
from keras_attn.layers._common import clone_initializer
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

    Arguments: every argument of `TransformerEncoderLayer`, with the same
    meaning: `num_heads`, `intermediate_dim`, `key_dim`, `dropout`,
    `activation`, `layer_norm_epsilon`, `normalize_first`,
    `kernel_initializer`, `bias_initializer`, the self-attention's options
    (`num_key_value_heads`, `rope_max_wavelength`, `rope_scaling_factor`,
    `rope_interleaved`, `sliding_window`, `logit_soft_cap`, `qk_norm`, and
    by keyword any other `AttentionOptions` field such as `scale`, or
    `rope_type` and its `rope_*` parameters), `normalization`, `use_bias`,
    `gated_feed_forward`, `implementation` and `attention_dropout` (both
    attention sublayers), the biases per projection `attention_use_bias`,
    `attention_output_use_bias`, `feed_forward_use_bias`, the sandwich
    norms `use_post_attention_norm`, `use_post_ffw_norm` and `use_input_norm`
    (False: no norms before the sublayers, `x + N_post(f(x))`, OLMo 2),
    `use_feed_forward_norm` (False: none before the feed-forward, which then reads
    the residual stream: Gemma 4's `ParallelMixtureOfExperts`) and
    `use_attention_input_norm` (False: no norm before the self-attention only,
    ModernBERT's layer 0; the cross-attention's and feed-forward's norms stay); `attention`,
    `feed_forward`, `residual_scale` and `use_gate` (the self-attention's
    gate only) as there too; and `use_layer_scalar`
    (keyword, decoder only): a weight `layer_scalar` `(1,)`, ones at first,
    multiplies the block's output, the whole residual stream (Gemma 4's
    `layer_scalar`); and `hidden_size_per_layer_input` P (keyword, decoder
    only; Gemma 4's and Gemma 3n's per-layer input embeddings): sublayers
    `per_layer_input_gate` `Dense(P)`, `per_layer_projection` `Dense(D)` (no
    biases) and `post_per_layer_input_norm`, and after the feed-forward
    `x + post_per_layer_input_norm(per_layer_projection(activation(
    per_layer_input_gate(x)) * per_layer_input))`, before the layer scalar; and
    `use_parallel_residual` (keyword, decoder only; GPT-NeoX's config name): the
    parallel block `x + attn(N(x)) + ffn(N(x))` with one norm N, the
    `self_attention_norm`, shared by both branches (Cohere 2, GPT-J, Phi-2; GPT-NeoX
    gives its feed-forward a second norm, which this block does not have): no
    `feed_forward_norm` then; pre-norm only (`normalize_first=True`) and decoder-only
    (no `memory`: where a cross-attention would go is ambiguous), a `ValueError`
    otherwise; the sandwich norms, `residual_scale`, the per-layer input and the
    layer scalar apply as in the sequential block. A given `attention` is
    the self-attention (it receives the `self_attention_cache` as `cache`);
    the cross-attention stays the default `MultiHeadAttention`, so `num_heads`,
    `key_dim`, `implementation`, `attention_dropout` and the attention biases
    still configure it (`num_heads` is needed only for a block built with
    memory), while the `AttentionOptions` fields, the self-attention's, must
    be left at their defaults.

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
            S_max)`) or a `keras_attn.KVCache` (`as_kv_cache=True`; returned
            as one), or None. With it, `padding_mask` is `(B, S_max)` and
            `attention_mask` broadcasts to `(B, T, S_max)`, over the cache
            slots; a Keras mask of `inputs` raises a `ValueError`.
        self_attention_cache_update_index: where the T new tokens are
            written (an int or a scalar int tensor): they are the positions
            `self_attention_cache_update_index + i`. Required with
            `self_attention_cache` (there is no read-only self-attention
            cache: the new tokens must be written), and a `ValueError`
            without it. A mask's key axis with a cache is exactly S_max,
            for T = 1 as for T > 1.
        cross_attention_cache: the cross-attention's cache
            `(B, 2, S, H, d)` (`layer.cross_attention.empty_cache(B, S)`),
            or None; only together with `self_attention_cache`. With
            `cross_attention_cache_update_index=None` it is read-only and
            `memory` may be None (it is not read); `memory_padding_mask`
            is `(B, S)`. Its S must equal the memory's length when it is
            filled: a read-only step attends every slot.
        cross_attention_cache_update_index: 0 to fill the cross cache from
            `memory` (the usual prefill), or None to read it. A `ValueError`
            without `cross_attention_cache`.
        attention_bias: an additive float bias on the self-attention's logits,
            broadcastable to `(B, H, T, T)` (`(B, H, T, S_max)` with
            `self_attention_cache`), or None: `MultiHeadAttention`'s
            `attention_bias` (named like `attention_mask`, the self-attention's
            mask; T5's relative position bias). A given `attention` receives it
            as `attention_bias`, only when set.
        per_layer_input: `(B, T, P)`, with `hidden_size_per_layer_input` P
            only (and then required): this block's per-layer input
            (`CausalLM` computes it from the token ids).

    Returns:
        `(B, T, D)`. With `return_attention_scores=True`, a tuple
        `(outputs, self_attention_scores (B, H, T, T),
        cross_attention_scores (B, H, T, S))`, the last only when the layer
        has memory (with caches, their key axis is the cache's length:
        S_max, and the cross cache's S). With caches, the updated caches follow, as keras-hub's
        `TransformerDecoder`: `(outputs, self_attention_cache)`, or
        `(outputs, self_attention_cache, cross_attention_cache)` when both
        are given (after the scores, if requested). On symbolic inputs
        (a Functional model) the same structure comes back as
        `KerasTensor`s.

    Example: a decoder-only (Llama-style) block, then one cached step.

    >>> import numpy as np
    >>> import keras_attn
    >>> block = TransformerDecoderLayer(
    ...     4, intermediate_dim=64, num_key_value_heads=2, rope_max_wavelength=1e4,
    ...     normalization="rms", normalize_first=True, gated_feed_forward=True,
    ...     activation="silu", use_bias=False)
    >>> x = np.random.default_rng(0).standard_normal((2, 6, 32)).astype("float32")
    >>> tuple(block(x).shape)
    (2, 6, 32)
    >>> cache = keras_attn.empty_cache(block, batch_size=2, max_length=8)
    >>> y, cache = block(x[:, :5], self_attention_cache=cache,
    ...                  self_attention_cache_update_index=0)  # the prompt
    >>> y, cache = block(x[:, 5:], self_attention_cache=cache,
    ...                  self_attention_cache_update_index=5)  # one new token
    >>> tuple(y.shape), tuple(cache.shape)
    ((2, 1, 32), (2, 2, 8, 2, 8))
    """

    _has_cross_attention = True

    def __init__(self, num_heads: int | None = None, *args, use_layer_scalar: bool = False,
                 hidden_size_per_layer_input: int | None = None,
                 use_parallel_residual: bool = False, **kwargs) -> None:
        super().__init__(num_heads, *args, **kwargs)
        if not isinstance(use_parallel_residual, bool):
            raise ValueError("`use_parallel_residual` must be a bool. Received: "
                             f"use_parallel_residual={use_parallel_residual!r}")
        if use_parallel_residual and not self.normalize_first:
            # Post-norm would normalise x + attn(x) + ffn(x) with which of two norms? The
            # parallel families are all pre-norm.
            raise ValueError(
                "`use_parallel_residual=True` is the pre-norm parallel block x + attn(N(x)) "
                "+ ffn(N(x)); it needs `normalize_first=True`. Received: "
                "use_parallel_residual=True, normalize_first=False")
        if use_parallel_residual and not self.use_attention_input_norm:
            # The parallel block's one norm is the self-attention's: without it neither
            # branch would be normalised.
            raise ValueError(
                "`use_parallel_residual=True` normalises both branches with the "
                "self-attention's norm, which `use_attention_input_norm=False` removes. "
                "Received: use_parallel_residual=True, use_attention_input_norm=False")
        self.use_parallel_residual = use_parallel_residual
        # Gemma 4's `layer_scalar`: a weight `(1,)` (ones at first) that multiplies the
        # block's whole output (the residual stream), after the feed-forward's residual.
        self.use_layer_scalar = bool(use_layer_scalar)
        # Gemma 4's (Gemma 3n's) per-layer input: P, the width of `per_layer_input`.
        self.hidden_size_per_layer_input = check_positive_int(
            "hidden_size_per_layer_input", hidden_size_per_layer_input, allow_none=True)

    def build(self, inputs_shape, memory_shape=None):
        inputs_shape = check_rank("inputs", inputs_shape, 3, "(B, T, D)")
        model_dim = inputs_shape[-1]
        self.has_memory = memory_shape is not None
        if self.has_memory and self.use_parallel_residual:
            # Cross-attention in a parallel block: a third branch, or after it? No family
            # says; refused rather than guessed.
            raise ValueError(
                f"Layer '{self.name}' has use_parallel_residual=True, a decoder-only block: "
                "it cannot be built with `memory` (where the cross-attention goes is "
                "ambiguous). Received: use_parallel_residual=True, "
                f"memory_shape={tuple(memory_shape)}")
        if self.has_memory and self.num_heads is None:
            raise ValueError(
                f"Layer '{self.name}' is built with `memory`: its default cross-attention "
                "needs `num_heads` (a given `attention` is the self-attention only). "
                f"Received: num_heads=None, memory_shape={tuple(memory_shape)}")
        self._build_self_attention(inputs_shape)
        if self.has_memory:
            memory_shape = check_rank("memory", memory_shape, 3, "(B, S, D_m)")
            self.cross_attention = self._attention(
                "cross_attention", model_dim, inputs_shape, memory_shape, self_attention=False)
            self.cross_attention_norm = self._input_norm("cross_attention_norm", inputs_shape)
            self.cross_attention_dropout = self._dropout("cross_attention_dropout")
            self.post_cross_attention_norm = self._post_norm(
                self.use_post_attention_norm, "post_cross_attention_norm", inputs_shape)
        self._build_feed_forward(inputs_shape)
        if self.hidden_size_per_layer_input:
            P = self.hidden_size_per_layer_input
            self.per_layer_input_gate = self._plain_dense(P, "per_layer_input_gate")
            self.per_layer_input_gate.build(inputs_shape)
            self.per_layer_projection = self._plain_dense(model_dim, "per_layer_projection")
            self.per_layer_projection.build(tuple(inputs_shape[:-1]) + (P,))
            self.post_per_layer_input_norm = self._norm("post_per_layer_input_norm",
                                                        inputs_shape)
        if self.use_layer_scalar:
            self.layer_scalar = self.add_weight(name="layer_scalar", shape=(1,),
                                                initializer="ones")
        self.built = True

    def _plain_dense(self, units, name):
        return keras.layers.Dense(units, use_bias=False, kernel_initializer=clone_initializer(
            self.kernel_initializer), dtype=self.dtype_policy, name=name)

    def _per_layer_input(self, x, per_layer_input):
        """x + norm(W_proj(act(W_gate x) * per_layer_input)): Gemma 4's per-layer input,
        after the feed-forward, before the layer scalar."""
        h = self.activation(self.per_layer_input_gate(x)) * ops.cast(per_layer_input, x.dtype)
        return x + self.post_per_layer_input_norm(self.per_layer_projection(h))

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
                f"{cache_shape(cross_attention_cache)}"
            )

    def _check_call(self, inputs, memory, keras_mask, padding_mask, attention_mask,
                    memory_padding_mask, memory_attention_mask, self_cache, self_index,
                    cross_cache, cross_index):
        """The cache arguments as a set, and their masks, before any computation."""
        check_rank("inputs", inputs, 3, "(B, T, D)")
        self._check_memory(memory, cross_cache, cross_index)
        for cache, index, kind in ((self_cache, self_index, "self"),
                                   (cross_cache, cross_index, "cross")):
            if cache is None and index is not None:
                raise ValueError(
                    f"`{kind}_attention_cache_update_index` says where to write into "
                    f"`{kind}_attention_cache`, which was not given. Pass the cache, or "
                    f"drop the index. Received: {kind}_attention_cache=None, "
                    f"{kind}_attention_cache_update_index={index!r}")
        # Named here: each reaches its attention as `value_mask` (a cache's are checked
        # against its slots below).
        B, T = static_shape(inputs)[:2]
        if self_cache is None and padding_mask is not None:
            check_broadcastable("padding_mask", padding_mask, (B, T), "(B, T)")
        if cross_cache is None and memory is not None and memory_padding_mask is not None:
            check_broadcastable("memory_padding_mask", memory_padding_mask,
                                (B, static_shape(memory)[1]), "(B, S)")
        if cross_cache is not None and self_cache is None:
            raise ValueError(
                "`cross_attention_cache` is used together with `self_attention_cache` "
                "(incremental decoding); pass both, or neither. Received: "
                "self_attention_cache=None, cross_attention_cache.shape="
                f"{cache_shape(cross_cache)}")
        if self_cache is None:
            return
        if self_index is None:
            # Read-only self-attention would never write the new tokens: every
            # step must say where they go.
            raise ValueError(
                "`self_attention_cache` needs `self_attention_cache_update_index`: the "
                "position where this call's T new tokens are written (0 for the prompt, "
                "then the number of tokens so far). Received: "
                f"self_attention_cache.shape={cache_shape(self_cache)}, "
                "self_attention_cache_update_index=None")
        if keras_mask is not None:
            # The inputs' Keras mask covers the T new tokens; with a cache the
            # self-attention's keys are the S_max cache slots.
            raise ValueError(
                "With `self_attention_cache`, mark padded cache slots with "
                "`padding_mask` of shape (B, S_max); the Keras mask of `inputs` (B, T) "
                "does not cover the cached positions. Received: a Keras mask of shape "
                f"{tuple(keras_mask.shape)}")
        masks = [("padding_mask", padding_mask, self_cache),
                 ("attention_mask", attention_mask, self_cache)]
        if cross_cache is not None:
            masks += [("memory_padding_mask", memory_padding_mask, cross_cache),
                      ("memory_attention_mask", memory_attention_mask, cross_cache)]
            S_max, S = cache_length(cross_cache), None
            if memory is not None and cross_index is not None:
                S = static_shape(memory)[1]
            if None not in (S, S_max) and S != S_max:
                # Later read-only steps attend every slot of the cross cache: a
                # slot the memory did not fill would be attended as a zero key.
                raise ValueError(
                    f"The cross-attention cache is filled whole from `memory` and then read "
                    f"over all its slots: its S_max={S_max} must equal the memory's length "
                    f"S={S} (`layer.cross_attention.empty_cache(B, S)`). Received: "
                    f"memory.shape={static_shape(memory)}, "
                    f"cross_attention_cache.shape={cache_shape(cross_cache)}")
        for name, value, cache in masks:
            if value is None:
                continue
            slots, shape = cache_length(cache), static_shape(value)
            if shape and shape[-1] is not None and shape[-1] != slots:
                raise ValueError(
                    f"With a cache, `{name}` is over its S_max={slots} slots: the last axis "
                    f"must be S_max, for one new token as for many (mark the cached "
                    f"positions too). Received: {name}.shape={shape}")

    def _check_per_layer_input(self, per_layer_input):
        if (per_layer_input is None) != (self.hidden_size_per_layer_input is None):
            raise ValueError(
                f"Layer '{self.name}' has hidden_size_per_layer_input="
                f"{self.hidden_size_per_layer_input}: `per_layer_input` (B, T, P) is given "
                "exactly when P is set. Received: per_layer_input="
                f"{None if per_layer_input is None else static_shape(per_layer_input)}")

    def get_config(self):
        config = super().get_config()
        if self.use_layer_scalar:  # absent when unset: the config stays today's
            config["use_layer_scalar"] = True
        if self.hidden_size_per_layer_input:
            config["hidden_size_per_layer_input"] = self.hidden_size_per_layer_input
        if self.use_parallel_residual:  # absent when unset: the config stays today's
            config["use_parallel_residual"] = True
        return config

    def _parallel(self, inputs, attend, training):
        """x + s drop(attn(N(x))) + s drop(ffn(N(x))), N the self-attention's norm; returns
        `(x, attention extras)` as `_residual` does."""
        h = self.self_attention_norm(inputs)
        y = attend(h)
        y, extras = (y[0], y[1:]) if isinstance(y, tuple) else (y, ())
        z = self.feed_forward(h, training=training)
        branches = []
        for out, post, dropout in ((y, self.post_attention_norm, self.self_attention_dropout),
                                   (z, self.post_feed_forward_norm, self.feed_forward_dropout)):
            if post is not None:
                out = post(out)
            out = dropout(out, training=training)
            if self.residual_scale is not None:
                out = out * ops.cast(self.residual_scale, out.dtype)
            branches.append(out)
        return inputs + branches[0] + branches[1], extras

    def compute_output_spec(self, inputs, memory=None, padding_mask=None,
                            memory_padding_mask=None, attention_mask=None,
                            memory_attention_mask=None, use_causal_mask=True,
                            return_attention_scores=False, training=None, mask=None,
                            inputs_mask=None, memory_mask=None, self_attention_cache=None,
                            self_attention_cache_update_index=None, cross_attention_cache=None,
                            cross_attention_cache_update_index=None, attention_bias=None,
                            per_layer_input=None):
        """`call`'s structure on symbolic inputs: outputs, then scores, then caches."""
        self._check_per_layer_input(per_layer_input)
        keras_mask = mask if mask is not None else inputs_mask
        self._check_call(inputs, memory, keras_mask, padding_mask, attention_mask,
                         memory_padding_mask, memory_attention_mask, self_attention_cache,
                         self_attention_cache_update_index, cross_attention_cache,
                         cross_attention_cache_update_index)
        B, T = inputs.shape[0], inputs.shape[1]
        results = [keras.KerasTensor(inputs.shape, dtype=self.compute_dtype)]
        if return_attention_scores:
            caches = ((self_attention_cache, inputs, self._score_heads(self.self_attention)),
                      (cross_attention_cache, memory, self.num_heads))
            for cache, keys, heads in caches[:1 + self.has_memory]:
                S = cache_length(cache) if cache is not None else keys.shape[1]
                results.append(
                    keras.KerasTensor((B, heads, T, S), dtype=self.compute_dtype))
        for cache in (self_attention_cache, cross_attention_cache):
            if cache is not None:
                results.append(cache_spec(cache))  # a KVCache's spec is a KVCache
        return tuple(results) if len(results) > 1 else results[0]

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
        attention_bias=None,
        per_layer_input=None,
    ):
        self._check_per_layer_input(per_layer_input)
        keras_mask = mask if mask is not None else inputs_mask
        self._check_call(inputs, memory, keras_mask, padding_mask, attention_mask,
                         memory_padding_mask, memory_attention_mask, self_attention_cache,
                         self_attention_cache_update_index, cross_attention_cache,
                         cross_attention_cache_update_index)
        self_key_mask = combine_masks(padding_mask, keras_mask)
        scores = bool(return_attention_scores)
        attend = self._attention_fn(self.self_attention, None, self_key_mask, attention_mask,
                                    use_causal_mask, training, scores, self_attention_cache,
                                    self_attention_cache_update_index, bias=attention_bias)
        if self.use_parallel_residual:
            x, (self_scores, self_cache) = self._parallel(inputs, attend, training)
        else:
            x, (self_scores, self_cache) = self._residual(
                inputs, attend, self.self_attention_norm, self.self_attention_dropout,
                training, self.post_attention_norm)
        cross_scores = cross_cache = None
        if self.has_memory:
            memory_key_mask = combine_masks(memory_padding_mask, memory_mask)
            x, (cross_scores, cross_cache) = self._residual(
                x,
                self._attention_fn(self.cross_attention, memory, memory_key_mask,
                                   memory_attention_mask, False, training, scores,
                                   cross_attention_cache, cross_attention_cache_update_index),
                self.cross_attention_norm, self.cross_attention_dropout, training,
                self.post_cross_attention_norm)
        if not self.use_parallel_residual:
            x, _ = self._residual(x, lambda h: self.feed_forward(h, training=training),
                                  self.feed_forward_norm, self.feed_forward_dropout, training,
                                  self.post_feed_forward_norm)
        if self.hidden_size_per_layer_input:
            x = self._per_layer_input(x, per_layer_input)
        if self.use_layer_scalar:
            x = x * ops.cast(self.layer_scalar, x.dtype)
        results = (x, *(s for s in (self_scores, cross_scores) if s is not None),
                   *(c for c in (self_cache, cross_cache) if c is not None))
        return results if len(results) > 1 else x
