"""The fixed, named parity cases (their inputs and weights: `keras_attn.parity.arrays`;
their float64 reference results: `keras_attn.parity.expected`).

A case is plain data: the layer kind, its constructor arguments, the shapes of its
inputs, its masks (drawn from the case's own NumPy generator) and call arguments.
"""

import dataclasses

import numpy as np

from keras_attn.options import FIELDS

__all__ = ["CASES", "Case", "get_cases", "has_gradients"]


@dataclasses.dataclass(frozen=True)
class Case:
    """One parity case.

    kind: "sdpa", "mha", "ffn", "encoder", "decoder", "mla" (multi-head latent
        attention, self-attention on `query`) or "gdn" (Gated DeltaNet, on `inputs`;
        its cached cases carry a `RecurrentCache`).
    config: constructor arguments of the layer (or sdpa keyword arguments).
    shapes: name -> shape of each differentiable float input.
    masks: name -> a function of a NumPy Generator returning a bool array.
    call: extra call keyword arguments (non-array, for example causal flags).
        `cached_prefill: P` runs the layer with a key/value cache: the first
        P tokens in one call, then one token per call; the reference is the
        uncached forward (causal self-attention). These cases compare
        outputs only: cached decoding is inference, and TensorFlow has no
        gradient for the `slice_update` that writes the cache
        (XlaDynamicUpdateSlice).
    """

    name: str
    kind: str
    description: str
    config: dict
    shapes: dict
    masks: dict = dataclasses.field(default_factory=dict)
    call: dict = dataclasses.field(default_factory=dict)


def _padding(lengths, length):
    return np.arange(length)[None, :] < np.asarray(lengths)[:, None]


def _random_mask(shape, dead_row=None):
    """A random bool mask; `dead_row` (an index tuple) gets no allowed key."""

    def make(g):
        mask = g.random(shape) > 0.35
        mask[..., 0] |= True  # every other row keeps at least one key
        if dead_row is not None:
            mask[dead_row] = False
        return mask

    return make


B, T, S, D = 2, 4, 5, 8

CASES = (
    Case("sdpa_mask_bias", "sdpa",
         "functional core: explicit mask with a fully masked row, additive bias",
         {}, {"query": (B, 2, T, 3), "key": (B, 2, S, 3), "value": (B, 2, S, 4),
              "bias": (B, 2, T, S)},
         masks={"mask": _random_mask((B, 2, T, S), dead_row=(1, 0, 2))}),
    Case("sdpa_causal_offset", "sdpa",
         "functional core: causal, T=3 queries over S=5 keys (bottom-right aligned)",
         {"is_causal": True, "scale": 0.7},
         {"query": (B, 2, 3, 4), "key": (B, 2, S, 4), "value": (B, 2, S, 2)}),
    Case("mha_self_causal", "mha", "MultiHeadAttention: self-attention, causal mask",
         {"num_heads": 2, "key_dim": 4}, {"query": (B, T, D)},
         call={"use_causal_mask": True}),
    Case("mha_cross_dims_masked", "mha",
         "MultiHeadAttention: q/k/v dims 6/10/3, value_dim 5, output_dim 7, explicit "
         "mask with a fully masked row",
         {"num_heads": 2, "key_dim": 3, "value_dim": 5, "output_dim": 7},
         {"query": (B, T, 6), "key": (B, S, 10), "value": (B, S, 3)},
         masks={"attention_mask": _random_mask((B, T, S), dead_row=(0, 1))}),
    Case("mha_per_head_mask_no_bias", "mha",
         "MultiHeadAttention: per-head mask (B, H, T, S), no biases",
         {"num_heads": 2, "key_dim": 4, "use_bias": False},
         {"query": (B, T, D), "key": (B, S, D)},
         masks={"attention_mask": _random_mask((B, 2, T, S))}),
    Case("ffn_relu", "ffn", "PositionwiseFeedForward: relu",
         {"intermediate_dim": 16, "activation": "relu"}, {"inputs": (B, T, D)}),
    Case("ffn_gelu_out_dim", "ffn", "PositionwiseFeedForward: gelu, output_dim 5",
         {"intermediate_dim": 12, "activation": "gelu", "output_dim": 5},
         {"inputs": (B, T, D)}),
    Case("encoder_post_ln_padding", "encoder",
         "TransformerEncoderLayer: post-LN, padding mask (lengths 4 and 2)",
         {"num_heads": 2, "intermediate_dim": 16},
         {"inputs": (B, T, D)},
         masks={"padding_mask": lambda g: _padding([T, 2], T)}),
    Case("encoder_pre_ln_causal_explicit", "encoder",
         "TransformerEncoderLayer: pre-LN, gelu, causal + explicit mask",
         {"num_heads": 2, "intermediate_dim": 16, "normalize_first": True,
          "activation": "gelu"},
         {"inputs": (B, T, D)},
         masks={"attention_mask": _random_mask((B, T, T))},
         call={"use_causal_mask": True}),
    Case("decoder_post_ln_cross", "decoder",
         "TransformerDecoderLayer: post-LN, memory width 6, both padding masks",
         {"num_heads": 2, "intermediate_dim": 16},
         {"inputs": (B, T, D), "memory": (B, S, 6)},
         masks={"padding_mask": lambda g: _padding([T, 3], T),
                "memory_padding_mask": lambda g: _padding([S, 2], S)}),
    Case("decoder_pre_ln_cross_masked", "decoder",
         "TransformerDecoderLayer: pre-LN, memory mask with a fully masked row",
         {"num_heads": 2, "intermediate_dim": 16, "normalize_first": True},
         {"inputs": (B, T, D), "memory": (B, S, D)},
         masks={"memory_attention_mask": _random_mask((B, T, S), dead_row=(1, 3))}),
    Case("decoder_only", "decoder",
         "TransformerDecoderLayer: decoder-only block (no memory), causal",
         {"num_heads": 2, "intermediate_dim": 16},
         {"inputs": (B, T, D)}),
    # Modern attention: grouped heads, RoPE, windows, soft-cap, qk-norm, gated FFN.
    Case("sdpa_gqa_window", "sdpa",
         "functional core: 4 query heads over 2 key/value heads, causal window W=2, T=4, S=5",
         {"is_causal": True, "sliding_window": 2},
         {"query": (B, 4, T, 3), "key": (B, 2, S, 3), "value": (B, 2, S, 4)}),
    Case("sdpa_mqa_soft_cap_two_sided", "sdpa",
         "functional core: one key/value head, two-sided window W=3, soft-cap 1.5, bias",
         {"sliding_window": 3, "logit_soft_cap": 1.5},
         {"query": (B, 2, T, 3), "key": (B, 1, S, 3), "value": (B, 1, S, 2),
          "bias": (B, 2, T, S)}),
    Case("mha_gqa_rope", "mha",
         "MultiHeadAttention: 4 heads over 2 key/value heads, RoPE (half-split), causal",
         {"num_heads": 4, "key_dim": 2, "num_key_value_heads": 2, "rope_max_wavelength": 100.0},
         {"query": (B, T, D)}, call={"use_causal_mask": True}),
    Case("mha_mqa_rope_interleaved_qk_rms", "mha",
         "MultiHeadAttention: multi-query, RoPE interleaved with scaling 2, qk-norm rms, causal",
         {"num_heads": 2, "key_dim": 4, "num_key_value_heads": 1, "rope_max_wavelength": 50.0,
          "rope_interleaved": True, "rope_scaling_factor": 2.0, "qk_norm": "rms"},
         {"query": (B, T, D)}, call={"use_causal_mask": True}),
    Case("mha_gqa_rope_llama3", "mha",
         "MultiHeadAttention: GQA 4/2 heads, llama3 RoPE (factor 4, context 32: one frequency "
         "kept, one smoothed, two scaled), causal",
         {"num_heads": 4, "key_dim": 8, "num_key_value_heads": 2, "rope_max_wavelength": 100.0,
          "rope_type": "llama3", "rope_scaling_factor": 4.0, "rope_low_freq_factor": 1.0,
          "rope_high_freq_factor": 4.0, "rope_original_max_position_embeddings": 32},
         {"query": (B, T, D)}, call={"use_causal_mask": True}),
    Case("mha_rope_yarn", "mha",
         "MultiHeadAttention: YaRN RoPE (factor 4, context 32, beta 4/0.5: a ramp over all "
         "four frequencies, cos/sin times 1.139), causal",
         {"num_heads": 2, "key_dim": 8, "rope_max_wavelength": 100.0, "rope_type": "yarn",
          "rope_scaling_factor": 4.0, "rope_beta_fast": 4.0, "rope_beta_slow": 0.5,
          "rope_original_max_position_embeddings": 32},
         {"query": (B, T, D)}, call={"use_causal_mask": True}),
    Case("mha_rope_partial_interleaved", "mha",
         "MultiHeadAttention: partial rotary (factor 0.5: 4 of 8 features, interleaved, as "
         "GLM-4), causal",
         {"num_heads": 2, "key_dim": 8, "rope_max_wavelength": 100.0,
          "rope_partial_rotary_factor": 0.5, "rope_interleaved": True},
         {"query": (B, T, D)}, call={"use_causal_mask": True}),
    Case("mha_gqa_sinks_window", "mha",
         "MultiHeadAttention: attention sinks (gpt-oss), GQA 4/2 heads, causal window W=3",
         {"num_heads": 4, "key_dim": 2, "num_key_value_heads": 2, "use_sinks": True,
          "sliding_window": 3},
         {"query": (B, T, D)}, call={"use_causal_mask": True}),
    Case("mha_window_qk_layer_soft_cap", "mha",
         "MultiHeadAttention: two-sided window W=2, qk-norm layer, soft-cap 2, cross-attention",
         {"num_heads": 2, "key_dim": 4, "sliding_window": 2, "qk_norm": "layer",
          "logit_soft_cap": 2.0},
         {"query": (B, T, D), "key": (B, S, 6)}),
    Case("mha_gqa_scale", "mha",
         "MultiHeadAttention: 4 heads over 2 key/value heads, logit scale 1.3 (not 1/sqrt(d)), "
         "causal",
         {"num_heads": 4, "key_dim": 4, "num_key_value_heads": 2, "scale": 1.3},
         {"query": (B, T, D)}, call={"use_causal_mask": True}),
    Case("mha_gqa_rope_query_scale", "mha",
         "MultiHeadAttention: GQA 4/2 heads, RoPE, query scale 1 + 0.5 ln(1 + floor(p / 2)) "
         "(Ministral 3's llama_4_scaling_beta: queries 2, 3 times 1.35), causal",
         {"num_heads": 4, "key_dim": 4, "num_key_value_heads": 2, "rope_max_wavelength": 100.0,
          "query_scale_beta": 0.5, "query_scale_length": 2},
         {"query": (B, T, D)}, call={"use_causal_mask": True}),
    Case("mha_llama4_rope_layer", "mha",
         "MultiHeadAttention: Llama 4's RoPE layer: GQA 4/2 heads, interleaved RoPE, the "
         "weightless L2 qk-norm (qk_norm='l2'), chunks of 2, causal",
         {"num_heads": 4, "key_dim": 4, "num_key_value_heads": 2, "rope_max_wavelength": 100.0,
          "rope_interleaved": True, "qk_norm": "l2", "qk_norm_epsilon": 1e-5,
          "attention_chunk_size": 2},
         {"query": (B, T, D)}, call={"use_causal_mask": True}),
    Case("mha_cached_llama4_temperature", "mha",
         "MultiHeadAttention with a cache: Llama 4's NoPE layer, the temperature tuning "
         "1 + 0.5 ln(1 + floor((p + 1) / 2)) (query_scale_offset=1) at the cache's "
         "positions, prefill 1 token, then 3 one-token steps",
         {"num_heads": 2, "key_dim": 4, "query_scale_beta": 0.5, "query_scale_length": 2,
          "query_scale_offset": 1},
         {"query": (B, T, D)}, call={"use_causal_mask": True, "cached_prefill": 1}),
    Case("ffn_swiglu", "ffn", "PositionwiseFeedForward: gated (SwiGLU), no biases",
         {"intermediate_dim": 12, "activation": "silu", "gated": True, "use_bias": False},
         {"inputs": (B, T, D)}),
    Case("decoder_llama_block", "decoder",
         "TransformerDecoderLayer: Llama-style (pre-RMSNorm, GQA + RoPE, SwiGLU, no biases)",
         {"num_heads": 4, "intermediate_dim": 12, "num_key_value_heads": 2,
          "rope_max_wavelength": 10000.0, "normalization": "rms", "normalize_first": True,
          "use_bias": False, "gated_feed_forward": True, "activation": "silu",
          "layer_norm_epsilon": 1e-6},
         {"inputs": (B, T, D)}),
    Case("mha_gated_qkv_bias", "mha",
         "MultiHeadAttention: Keras's use_gate (sigmoid gate per head), GQA 4/2, bias on "
         "q/k/v only (output_use_bias=False), causal",
         {"num_heads": 4, "key_dim": 4, "num_key_value_heads": 2, "use_gate": True,
          "output_use_bias": False},
         {"query": (B, T, D)}, call={"use_causal_mask": True}),
    Case("decoder_gemma_sandwich", "decoder",
         "TransformerDecoderLayer: Gemma-style sandwich norms (post-attention and "
         "post-feed-forward RMSNorm), qk-norm, scale 0.7, soft-cap 3, window 3, Qwen 2's "
         "biases (q/k/v only)",
         {"num_heads": 4, "intermediate_dim": 12, "num_key_value_heads": 2,
          "rope_max_wavelength": 10000.0, "normalization": "rms", "normalize_first": True,
          "gated_feed_forward": True, "activation": "silu", "qk_norm": "rms", "scale": 0.7,
          "logit_soft_cap": 3.0, "sliding_window": 3, "attention_use_bias": True,
          "attention_output_use_bias": False, "feed_forward_use_bias": False,
          "use_post_attention_norm": True, "use_post_ffw_norm": True},
         {"inputs": (B, T, D)}),
    # Cached decoding: a prefill of the first tokens, then one token per call over a
    # key/value cache; the outputs, concatenated, against the uncached reference.
    Case("mha_cached_gqa_rope", "mha",
         "MultiHeadAttention with a cache: GQA 4/2 heads + RoPE, prefill 2 tokens, then "
         "2 one-token steps",
         {"num_heads": 4, "key_dim": 2, "num_key_value_heads": 2, "rope_max_wavelength": 100.0},
         {"query": (B, T, D)}, call={"use_causal_mask": True, "cached_prefill": 2}),
    Case("mha_cached_query_scale", "mha",
         "MultiHeadAttention with a cache: RoPE and the query scale 1 + 0.5 ln(1 + p) at the "
         "cache's positions, prefill 1 token, then 3 one-token steps",
         {"num_heads": 2, "key_dim": 4, "rope_max_wavelength": 100.0,
          "query_scale_beta": 0.5, "query_scale_length": 1},
         {"query": (B, T, D)}, call={"use_causal_mask": True, "cached_prefill": 1}),
    Case("decoder_llama_cached", "decoder",
         "TransformerDecoderLayer with a cache: Llama-style block, sliding window 3, "
         "prefill 1 token, then 3 one-token steps",
         {"num_heads": 4, "intermediate_dim": 12, "num_key_value_heads": 2,
          "rope_max_wavelength": 10000.0, "normalization": "rms", "normalize_first": True,
          "use_bias": False, "gated_feed_forward": True, "activation": "silu",
          "sliding_window": 3},
         {"inputs": (B, T, D)}, call={"cached_prefill": 1}),
    Case("decoder_cross_cached", "decoder",
         "TransformerDecoderLayer with self- and cross-attention caches: post-LN, memory "
         "width 6 with padding, prefill 3 tokens (filling the cross cache), then 1 step",
         {"num_heads": 2, "intermediate_dim": 16},
         {"inputs": (B, T, D), "memory": (B, S, 6)},
         masks={"memory_padding_mask": lambda g: _padding([S, 2], S)},
         call={"cached_prefill": 3}),
    # Chunked attention (Llama 4's attention_chunk_size): position p attends j only if
    # floor(j / C) == floor(p / C).
    Case("sdpa_gqa_chunked_window", "sdpa",
         "functional core: chunked attention C=3 (Llama 4), GQA 4/2 heads, causal window W=2, "
         "T=6, S=7 (queries at positions 1..6: chunks 0..2 and 3..5, then 6)",
         {"is_causal": True, "sliding_window": 2, "attention_chunk_size": 3},
         {"query": (B, 4, 6, 3), "key": (B, 2, 7, 3), "value": (B, 2, 7, 4)}),
    Case("mha_cached_gqa_rope_chunked", "mha",
         "MultiHeadAttention with a cache: chunked attention C=3, GQA 4/2 heads + RoPE "
         "interleaved (Llama 4), prefill 2 tokens, then 2 one-token steps (the last one "
         "opens a new chunk)",
         {"num_heads": 4, "key_dim": 2, "num_key_value_heads": 2, "rope_max_wavelength": 100.0,
          "rope_interleaved": True, "attention_chunk_size": 3},
         {"query": (B, T, D)}, call={"use_causal_mask": True, "cached_prefill": 2}),
    Case("mha_gqa_rope_qk_norm_full_width", "mha",
         "MultiHeadAttention: OLMo 2's q/k RMSNorm over the whole projection (H * d = 8 "
         "query, H_kv * d = 4 key features), GQA 4/2 heads, RoPE, causal",
         {"num_heads": 4, "key_dim": 2, "num_key_value_heads": 2, "rope_max_wavelength": 100.0,
          "qk_norm": "rms", "qk_norm_full_width": True},
         {"query": (B, T, D)}, call={"use_causal_mask": True}),
    # longrope (Phi-3.5 / Phi-4-mini): T = 4 > original 3, so the uncached forward takes
    # the long factors; the cached case stays within its original 4 (short factors: a
    # cached decode across the switch is not the uncached forward, by transformers'
    # rule; tests/layers/test_longrope.py checks that one).
    Case("mha_gqa_rope_longrope", "mha",
         "MultiHeadAttention: GQA 4/2 heads, longrope (T=4 past original 3: the long "
         "factors, attention factor from factor 4), causal",
         {"num_heads": 4, "key_dim": 8, "num_key_value_heads": 2, "rope_max_wavelength": 100.0,
          "rope_type": "longrope", "rope_scaling_factor": 4.0,
          "rope_original_max_position_embeddings": 3,
          "rope_short_factor": (1.0, 1.3, 1.7, 2.2), "rope_long_factor": (1.5, 3.0, 6.0, 12.0)},
         {"query": (B, T, D)}, call={"use_causal_mask": True}),
    Case("mha_cached_longrope", "mha",
         "MultiHeadAttention with a cache: longrope within its original 4 positions (the "
         "short factors), prefill 2 tokens, then 2 one-token steps",
         {"num_heads": 2, "key_dim": 8, "rope_max_wavelength": 100.0, "rope_type": "longrope",
          "rope_original_max_position_embeddings": 4, "rope_attention_factor": 1.2,
          "rope_short_factor": (1.0, 1.3, 1.7, 2.2), "rope_long_factor": (1.5, 3.0, 6.0, 12.0)},
         {"query": (B, T, D)}, call={"use_causal_mask": True, "cached_prefill": 2}),
    # Gemma 4's full-attention layer: K = V, the unweighted value norm, proportional RoPE.
    Case("mha_gqa_proportional_k_eq_v", "mha",
         "MultiHeadAttention: Gemma 4's full layer: K = V (no value projection), values over "
         "their RMS, qk-norm rms, proportional RoPE (share 0.5: 2 of 4 pairs turn, over the "
         "whole head), scale 1, GQA 4/2, causal",
         {"num_heads": 4, "key_dim": 8, "num_key_value_heads": 2, "rope_max_wavelength": 100.0,
          "rope_type": "proportional", "rope_partial_rotary_factor": 0.5,
          "attention_k_eq_v": True, "use_value_norm": True, "qk_norm": "rms", "scale": 1.0,
          "use_bias": False},
         {"query": (B, T, D)}, call={"use_causal_mask": True}),
    Case("mha_cached_k_eq_v_value_norm", "mha",
         "MultiHeadAttention with a cache: K = V and the value norm (the cache holds "
         "normalised values), proportional RoPE, prefill 2 tokens, then 2 one-token steps",
         {"num_heads": 2, "key_dim": 4, "rope_max_wavelength": 100.0,
          "rope_type": "proportional", "rope_partial_rotary_factor": 0.5,
          "attention_k_eq_v": True, "use_value_norm": True},
         {"query": (B, T, D)}, call={"use_causal_mask": True, "cached_prefill": 2}),
    # Multi-head latent attention (DeepSeek V2/V3): low-rank queries, yarn RoPE with
    # mscale (interleaved), the softmax scale given; and cached decoding in both forms.
    Case("mla_low_rank_yarn", "mla",
         "MultiHeadLatentAttention: 2 heads, q_lora_rank 5, kv_lora_rank 6, nope 2 + rope 2, "
         "v 3, yarn RoPE with mscale (interleaved), scale 0.6, causal",
         {"num_heads": 2, "kv_lora_rank": 6, "qk_nope_head_dim": 2, "qk_rope_head_dim": 2,
          "v_head_dim": 3, "q_lora_rank": 5, "rope_max_wavelength": 100.0, "rope_type": "yarn",
          "rope_scaling_factor": 4.0, "rope_original_max_position_embeddings": 2,
          "rope_mscale": 1.0, "rope_mscale_all_dim": 0.5, "scale": 0.6},
         {"query": (B, T, D)}, call={"use_causal_mask": True}),
    Case("mla_cached_absorbed", "mla",
         "MultiHeadLatentAttention with a LatentCache, absorbed decoding: plain query "
         "projection, bias, prefill 2 tokens, then 2 one-token steps",
         {"num_heads": 2, "kv_lora_rank": 6, "qk_nope_head_dim": 2, "qk_rope_head_dim": 2,
          "v_head_dim": 3, "use_bias": True, "rope_max_wavelength": 100.0,
          "decode": "absorbed"},
         {"query": (B, T, D)}, call={"use_causal_mask": True, "cached_prefill": 2}),
    Case("mla_cached_expanded", "mla",
         "MultiHeadLatentAttention with a LatentCache, expanded decoding: q_lora_rank 5, "
         "half-split RoPE, prefill 1 token, then 3 one-token steps",
         {"num_heads": 2, "kv_lora_rank": 6, "qk_nope_head_dim": 2, "qk_rope_head_dim": 2,
          "v_head_dim": 3, "q_lora_rank": 5, "rope_max_wavelength": 100.0,
          "rope_interleaved": False, "decode": "expanded"},
         {"query": (B, T, D)}, call={"use_causal_mask": True, "cached_prefill": 1}),
    # Gated DeltaNet (Qwen 3.5's linear attention): the chunked rule over a length its chunk
    # does not divide, and the recurrent rule over a RecurrentCache after a chunked prefill.
    # d_k = 8: with 4 features the L2 norm of small q / k vectors amplified the half-precision
    # rounding of the convolution's output in the gradients (bfloat16 worst/tol 1.8 against
    # the float64 reference; 0.22 with 8).
    Case("gdn_chunked", "gdn",
         "GatedDeltaNet: 1 query/key head of 8, 2 value heads of 3, convolution 4, the "
         "chunked rule with chunk 3 over T=4 (zero-padded)",
         {"linear_num_key_heads": 1, "linear_num_value_heads": 2, "linear_key_head_dim": 8,
          "linear_value_head_dim": 3, "linear_conv_kernel_dim": 4, "chunk_size": 3},
         {"inputs": (B, T, D)}),
    Case("gdn_cached_recurrent", "gdn",
         "GatedDeltaNet with a RecurrentCache: prefill 2 tokens (chunked, chunk 3), then 2 "
         "one-token steps (the recurrent rule)",
         {"linear_num_key_heads": 1, "linear_num_value_heads": 2, "linear_key_head_dim": 8,
          "linear_value_head_dim": 3, "linear_conv_kernel_dim": 4, "chunk_size": 3},
         {"inputs": (B, T, D)}, call={"cached_prefill": 2}),
)

# Constructor arguments that configure the attention itself (the reference takes them too):
# every `AttentionOptions` field, so that a new option needs only its case here.
ATTENTION_OPTIONS = FIELDS


def _attention_options(config):
    return {n: config[n] for n in ATTENTION_OPTIONS if n in config}


def get_cases(names=None):
    """The cases, optionally only those named (ValueError on an unknown name)."""
    if not names:
        return list(CASES)
    by_name = {case.name: case for case in CASES}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise ValueError(f"Unknown parity case(s) {unknown}; known: {sorted(by_name)}. "
                         f"Received: cases={names}")
    return [by_name[n] for n in names]


def has_gradients(case):
    """Whether the case compares gradients (cached-decoding cases compare outputs only)."""
    return "cached_prefill" not in case.call
