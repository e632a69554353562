"""The transformers model families compared with `keras_attn.convert.causal_lm_from_transformers`.

Shared by tests/convert/test_families.py (torch env, live against transformers),
tools/make_family_fixtures.py (writes tests/assets/families/) and
tools/family_report.py. Needs torch and transformers only in `build_hf` and
`hf_reference`; `CASES`, `relative_error` and the ablations' configs are plain data.

Tiny random configs: V=128, D=64, H=4, H_kv=2, T=24 tokens (windows smaller
than T so they matter), every parameter re-drawn with std 0.35 so that norm
weights and biases are far from 1 and 0. float32, eager attention.
"""

import numpy as np

from . import transformers_versions as tv
from .transformers_versions import as_transformers_4, skip_without  # noqa: F401 (the tests')

V, D, H, H_KV, F = 128, 64, 4, 2, 96
B, T, NEW = 2, 24, 16  # the logits over T tokens; 16 greedy tokens after a prompt of P
P = 8
STD = 0.35
TOLERANCE = 1e-4  # max |keras - hf| / max |hf|
DROP = object()  # a case's value for a common kwarg its config does not have
ROUTER_WIDENING = 12.0  # Gemma 4's router weights drawn this much wider (its input / sqrt(D))

_COMMON = dict(vocab_size=V, hidden_size=D, intermediate_size=F, num_attention_heads=H,
               num_key_value_heads=H_KV, max_position_embeddings=64, rms_norm_eps=1e-6,
               bos_token_id=None, eos_token_id=None, pad_token_id=None)

# name: (transformers config class, config kwargs, seed, ablation). An ablation (what,
# kind, changes) breaks the converted model in one place; its logits must then move far
# beyond the tolerance (the tests can fail): kind "config" sets `changes` in the configs of
# the blocks `changes["where"]` selects ("all", "sliding" or "no_rope": those without RoPE),
# "norm_offset" takes 1 from every RMSNorm scale (forgetting Gemma's `1 + w`),
# "qk_norm_ones" sets the qk-norm scales to 1 (ignoring q_norm / k_norm), "zero_weights"
# zeroes the kernels of the layers named in `changes["names"]`, "zero_variables" the
# variables of those names (a MixtureOfExperts' `router_correction_bias`), "variables" sets
# every variable whose name is a key of `changes` to its value.
# The post-norm families' tiny sizes (V 64, D 32) and their ablation: the same norms
# before the sublayers (the post norms' weights become the input norms': same order).
_TINY = dict(vocab_size=64, hidden_size=32, intermediate_size=48)
_PRE_NORM = {"where": "all", "use_input_norm": True, "use_post_attention_norm": False,
             "use_post_ffw_norm": False}
CASES = {
    "llama": ("LlamaConfig", dict(num_hidden_layers=2, tie_word_embeddings=False,
                                  rope_parameters={"rope_type": "default", "rope_theta": 1e4}),
              0, ("RoPE base 1e4 -> 1e2", "config",
                  {"where": "all", "rope_max_wavelength": 100.0})),
    "llama3": ("LlamaConfig", dict(num_hidden_layers=2, tie_word_embeddings=False,
                                   rope_parameters={"rope_type": "llama3", "rope_theta": 1e4,
                                                    "factor": 8.0, "low_freq_factor": 1.0,
                                                    "high_freq_factor": 4.0,
                                                    "original_max_position_embeddings": 16}),
               1, ("rope_type llama3 -> default", "config",
                   {"where": "all", "rope_type": "default", "rope_scaling_factor": 1.0})),
    "yarn": ("LlamaConfig", dict(num_hidden_layers=2, tie_word_embeddings=True,
                                 rope_parameters={"rope_type": "yarn", "rope_theta": 1e4,
                                                  "factor": 4.0,
                                                  "original_max_position_embeddings": 16}),
             2, ("rope_type yarn -> linear", "config", {"where": "all", "rope_type": "linear"})),
    "mistral": ("MistralConfig", dict(num_hidden_layers=2, sliding_window=6,
                                      tie_word_embeddings=False),
                3, ("sliding_window -> None", "config",
                    {"where": "sliding", "sliding_window": None})),
    "qwen2": ("Qwen2Config", dict(num_hidden_layers=2, use_sliding_window=True,
                                  sliding_window=6, max_window_layers=1,
                                  tie_word_embeddings=True),
              4, ("sliding_window -> None", "config",
                  {"where": "sliding", "sliding_window": None})),
    "qwen3": ("Qwen3Config", dict(num_hidden_layers=2, head_dim=24, tie_word_embeddings=False),
              5, ("q_norm / k_norm weights -> 1", "qk_norm_ones", {})),
    "gemma2": ("Gemma2Config", dict(num_hidden_layers=4, head_dim=16, sliding_window=6,
                                    query_pre_attn_scalar=24, attn_logit_softcapping=3.0,
                                    final_logit_softcapping=5.0),
               6, ("RMSNorm weights w, not 1 + w", "norm_offset", {})),
    "gemma3_text": ("Gemma3TextConfig", dict(
        num_hidden_layers=4, head_dim=16, sliding_window=6, query_pre_attn_scalar=16,
        final_logit_softcapping=8.0,
        layer_types=["sliding_attention", "full_attention", "sliding_attention",
                     "full_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                         "full_attention": {"rope_type": "linear", "factor": 4.0,
                                            "rope_theta": 1e5}}),
        7, ("sliding layers' RoPE base 1e4 -> 1e5", "config",
            {"where": "sliding", "rope_max_wavelength": 1e5})),
    # The families of issue 32, each in a module of its own (keras_attn/convert/families/).
    "starcoder2": ("Starcoder2Config", dict(
        num_hidden_layers=2, sliding_window=6, use_bias=True, norm_epsilon=1e-5,
        hidden_act="gelu_pytorch_tanh", tie_word_embeddings=False, rms_norm_eps=DROP),
        8, ("sliding_window -> None", "config", {"where": "sliding", "sliding_window": None})),
    "gemma": ("GemmaConfig", dict(num_hidden_layers=2, head_dim=16, num_key_value_heads=1,
                                  hidden_act="gelu_pytorch_tanh"),
              9, ("RMSNorm weights w, not 1 + w", "norm_offset", {})),
    "phi3": ("Phi3Config", dict(num_hidden_layers=2, sliding_window=8,
                                tie_word_embeddings=False),
             10, ("RoPE base 1e4 -> 1e2", "config",
                  {"where": "all", "rope_max_wavelength": 100.0})),
    "granite": ("GraniteConfig", dict(num_hidden_layers=2, attention_multiplier=0.3,
                                      embedding_multiplier=6.0, residual_multiplier=0.4,
                                      logits_scaling=4.0, tie_word_embeddings=True),
                11, ("residual_multiplier 0.4 -> 1", "config",
                     {"where": "all", "residual_scale": None})),
    "ministral": ("MinistralConfig", dict(
        num_hidden_layers=3, head_dim=16, sliding_window=6, tie_word_embeddings=False,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"]),
        12, ("sliding_window -> None", "config", {"where": "sliding", "sliding_window": None})),
    "smollm3": ("SmolLM3Config", dict(num_hidden_layers=4, no_rope_layer_interval=2,
                                      tie_word_embeddings=True),
                13, ("RoPE (the model's base 2e6) on the no-RoPE blocks (no_rope_layers "
                     "ignored)", "config", {"where": "no_rope", "rope_max_wavelength": 2e6})),
    "glm4": ("Glm4Config", dict(num_hidden_layers=2, head_dim=16, partial_rotary_factor=0.5,
                                tie_word_embeddings=False),
             14, ("RoPE over the whole head (partial_rotary_factor ignored)", "config",
                  {"where": "all", "rope_partial_rotary_factor": 1.0})),
    # Issue 33: Ministral 3's query scale 1 + beta log(1 + floor(p / n)) with n = 4, so the
    # T = 24 positions and the 16 greedy tokens cross five steps of floor(p / 4); yarn
    # RoPE over the same n, factor 32 / 4 (its default layout, smaller).
    "ministral3": ("Ministral3Config", dict(
        num_hidden_layers=2, head_dim=16, tie_word_embeddings=False,
        max_position_embeddings=32,
        rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 8.0,
                         "original_max_position_embeddings": 4, "beta_fast": 32.0,
                         "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                         "llama_4_scaling_beta": 0.1}),
        15, ("query scale removed (llama_4_scaling_beta ignored)", "config",
             {"where": "all", "query_scale_beta": None, "query_scale_length": None})),
    # Issue 33: longrope (Phi-3.5-style, full rotary): original_max_position_embeddings 16
    # (top level, as Phi-3's configs) and 64, so the T = 24 logits use the long factors and
    # generation from P = 8 switches at length 17. The factor lists are cut to d/2 of the
    # rotated width (`config_kwargs`). Ablation: the switch never happens.
    "phi3_longrope": ("Phi3Config", dict(
        num_hidden_layers=2, head_dim=16, tie_word_embeddings=False,
        original_max_position_embeddings=16, max_position_embeddings=64,
        rope_parameters={"rope_type": "longrope", "rope_theta": 1e4,
                         "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.1, 3.8],
                         "long_factor": [1.2, 1.9, 3.0, 4.7, 7.4, 11.6, 18.3, 28.8]}),
        27, ("never the long factors (original_max_position_embeddings 16 -> 64)", "config",
             {"where": "all", "rope_original_max_position_embeddings": 64})),
    # Phi-4-mini-style: longrope over a partial rotary slice (0.75 of each head), the
    # attention factor from the default factor 64 / 16. Ablation: no attention factor.
    "phi4_mini_longrope": ("Phi3Config", dict(
        num_hidden_layers=2, head_dim=16, tie_word_embeddings=True, partial_rotary_factor=0.75,
        original_max_position_embeddings=16, max_position_embeddings=64,
        rope_parameters={"rope_type": "longrope", "rope_theta": 1e4,
                         "partial_rotary_factor": 0.75,
                         "short_factor": [1.0, 1.2, 1.5, 1.9, 2.4, 3.0, 3.7, 4.5],
                         "long_factor": [1.0, 2.2, 3.9, 6.8, 11.0, 17.5, 27.0, 40.0]}),
        17, ("attention factor sqrt(1 + ln 4 / ln 16) -> 1", "config",
             {"where": "all", "rope_attention_factor": 1.0})),
    # Issue 33: Gemma 4, 31B-style (no per-layer embeddings, no KV sharing): the full layers
    # 32 wide with one key/value head (global_head_dim, num_global_key_value_heads), their
    # keys also the values (attention_k_eq_v) and "proportional" RoPE over a quarter of the
    # head; v_norm and the layer scalars everywhere.
    "gemma4_text": ("Gemma4TextConfig", dict(
        num_hidden_layers=4, head_dim=16, global_head_dim=32, num_global_key_value_heads=1,
        attention_k_eq_v=True, sliding_window=6, final_logit_softcapping=8.0,
        hidden_size_per_layer_input=0,
        layer_types=["sliding_attention", "full_attention", "sliding_attention",
                     "full_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                         "full_attention": {"rope_type": "proportional",
                                            "partial_rotary_factor": 0.25,
                                            "rope_theta": 1e6}}),
        20, ("values not normalised (v_norm ignored)", "config",
             {"where": "all", "use_value_norm": False})),
    # Gemma 4, E2B-style: per-layer input embeddings (P = 8) and the last two layers
    # reusing the keys and values of the last earlier layer of their type (layer 3 those of
    # layer 2, layer 4 those of layer 1), with double-wide MLPs there.
    "gemma4_text_e2b": ("Gemma4TextConfig", dict(
        num_hidden_layers=5, head_dim=16, global_head_dim=32, sliding_window=6,
        final_logit_softcapping=8.0, hidden_size_per_layer_input=8,
        vocab_size_per_layer_input=V, num_kv_shared_layers=2, use_double_wide_mlp=True,
        layer_types=["full_attention", "full_attention", "sliding_attention",
                     "sliding_attention", "full_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                         "full_attention": {"rope_type": "proportional",
                                            "partial_rotary_factor": 0.25,
                                            "rope_theta": 1e6}}),
        21, ("per-layer inputs dropped (per_layer_projection zeroed)", "zero_weights",
             {"names": ("per_layer_projection",)})),
    # Gemma 4, 26B-A4B-style (issue 34): in every layer the dense MLP (F = 96) and a
    # mixture of 4 experts (F = 24 each, top-2) side by side, each between its two norms,
    # the router on the residual stream (its scale-free RMSNorm, `router.scale`, D**-0.5,
    # softmax, the top-2 renormalised, times `per_expert_scale`); the 31B-style attention.
    # `router.proj` drawn 12 times wider (`build_hf`: std 4.2, against the D**-0.5 of its
    # input); seed 51: every router's second and third logits differ by more than 1e-2
    # (0.036 at least; tests/convert/test_gemma4.py asserts it). Ablation: per_expert_scale
    # dropped (ones).
    "gemma4_text_moe": ("Gemma4TextConfig", dict(
        num_hidden_layers=2, head_dim=16, global_head_dim=32, num_global_key_value_heads=1,
        attention_k_eq_v=True, sliding_window=6, final_logit_softcapping=8.0,
        hidden_size_per_layer_input=0, enable_moe_block=True, num_experts=4,
        top_k_experts=2, moe_intermediate_size=24,
        layer_types=["sliding_attention", "full_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                         "full_attention": {"rope_type": "proportional",
                                            "partial_rotary_factor": 0.25,
                                            "rope_theta": 1e6}}),
        51, ("per_expert_scale dropped (ones)", "variables", {"per_expert_scale": 1.0})),
    # The norm after the sublayer only (no input norm): OLMo 2 (full-width qk-norm), OLMo 3
    # (a sliding and a full block, a RoPE per layer type), EXAONE 4 (per-head qk-norm, no
    # RoPE on its full block). Their ablation moves the post norms before the sublayers.
    "olmo2": ("Olmo2Config", dict(_TINY, num_hidden_layers=2, attention_bias=True,
                                  rope_parameters={"rope_type": "default", "rope_theta": 1e4}),
              22, ("post norms -> pre norms", "config", _PRE_NORM)),
    "olmo3": ("Olmo3Config", dict(
        _TINY, num_hidden_layers=2, sliding_window=6,
        layer_types=["sliding_attention", "full_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                         "full_attention": {"rope_type": "default", "rope_theta": 1e3}}),
              23, ("post norms -> pre norms", "config", _PRE_NORM)),
    "exaone4": ("Exaone4Config", dict(
        _TINY, num_hidden_layers=2, sliding_window=6,
        layer_types=["sliding_attention", "full_attention"],
        rope_parameters={"rope_type": "default", "rope_theta": 1e4}),
              24, ("post norms -> pre norms", "config", _PRE_NORM)),
    # Cohere 2: the parallel block (one LayerNorm without bias), interleaved RoPE on the
    # sliding blocks only (none on the full ones), tied embeddings, logits * logit_scale.
    "cohere2": ("Cohere2Config", dict(
        num_hidden_layers=2, sliding_window=6, layer_norm_eps=1e-5, logit_scale=0.25,
        rms_norm_eps=DROP, layer_types=["sliding_attention", "full_attention"],
        rope_parameters={"rope_type": "default", "rope_theta": 1e4}),
        22, ("sequential block instead of parallel", "sequential", {})),
    # GPT-2: learned absolute positions (wpe, n_positions rows), no RoPE, fused c_attn,
    # Conv1D weights, LayerNorm and biases everywhere, gelu_new, a tied head.
    "gpt2": ("GPT2Config", dict(
        num_hidden_layers=2, n_inner=F, activation_function="gelu_new",
        layer_norm_epsilon=1e-5, intermediate_size=DROP, num_key_value_heads=DROP,
        rms_norm_eps=DROP),
        24, ("positions dropped (position_embedding zeroed)", "zero_weights",
             {"names": ("position_embedding",)})),
    # Issue 34: Mixtral, 4 experts, top-2 (F = 48 each), a window of 6. Ablation: the
    # top-2 probabilities not renormalised (kind "feed_forward": every block's
    # feed-forward config updated).
    "mixtral": ("MixtralConfig", dict(
        num_hidden_layers=2, intermediate_size=48, num_local_experts=4, num_experts_per_tok=2,
        sliding_window=6, tie_word_embeddings=False),
        28, ("norm_topk_prob True -> False", "feed_forward", {"norm_topk_prob": False})),
    # Qwen3-MoE: layer 0 dense (mlp_only_layers), layer 1 a mixture of 4 experts, top-2,
    # F = 48 each, not renormalised. Ablation: top-1 instead of top-2.
    "qwen3_moe": ("Qwen3MoeConfig", dict(
        num_hidden_layers=2, head_dim=16, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=48, norm_topk_prob=False, mlp_only_layers=[0],
        decoder_sparse_step=1, tie_word_embeddings=False),
        29, ("num_experts_per_tok 2 -> 1", "feed_forward", {"num_experts_per_tok": 1})),
    # gpt-oss: the attention (sinks, biases, a sliding and a full block, yarn) and every
    # feed-forward a mixture of 4 experts, top-2 (F = 48 each): the router's softmax over
    # the top-2 logits, biases everywhere, the clamped SwiGLU with a limit of 3 (which the
    # std-0.35 projections cross). Ablation: the softmax over all 4 experts, top-2 kept and
    # not renormalised.
    "gpt_oss": ("GptOssConfig", dict(
        num_hidden_layers=2, head_dim=16, intermediate_size=48, num_local_experts=4,
        num_experts_per_tok=2, sliding_window=6, swiglu_limit=3.0, tie_word_embeddings=False,
        layer_types=["sliding_attention", "full_attention"],
        rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0,
                         "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                         "original_max_position_embeddings": 16}),
        30, ("softmax over all experts, not over the top-k", "feed_forward",
             {"routing": "softmax_topk", "norm_topk_prob": False})),
    # DeepSeek V3: latent attention (a low-rank query, interleaved RoPE) in every block;
    # block 0 dense (first_k_dense_replace), blocks 1 and 2 a mixture of 8 experts in 4
    # groups, 2 groups kept, top-2, renormalised, times 2.5, with one shared expert; the
    # correction biases drawn with std 0.35 (`build_hf`); seed 36, where every router's
    # group and expert margins exceed 2e-3 (tests/convert/test_deepseek_v3.py asserts it).
    # Ablation: the correction bias ignored in the choice (zeroed).
    "deepseek_v3": ("DeepseekV3Config", dict(
        num_hidden_layers=3, num_key_value_heads=H, q_lora_rank=24, kv_lora_rank=16,
        qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=12, n_routed_experts=8,
        num_experts_per_tok=2, n_group=4, topk_group=2, n_shared_experts=1,
        moe_intermediate_size=24, first_k_dense_replace=1, norm_topk_prob=True,
        routed_scaling_factor=2.5, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1e4}),
        36, ("correction bias ignored in the choice (router_correction_bias zeroed)",
             "zero_variables", {"names": ("router_correction_bias",)})),
    # Qwen 3.5 (issue 35): 3 Gated DeltaNet layers then a gated softmax one, partial
    # rotary 0.5 of d = 16, the multimodal RoPE fields (an identity for text), T = 24 and
    # P = 8 against the chunk of 64. Ablation: the decay removed (A_log -> -30: g = 0).
    "qwen3_5_text": ("Qwen3_5TextConfig", dict(
        num_hidden_layers=4, head_dim=16, tie_word_embeddings=False,
        layer_types=["linear_attention"] * 3 + ["full_attention"],
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
        linear_value_head_dim=12, linear_conv_kernel_dim=4,
        rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                         "partial_rotary_factor": 0.5, "mrope_section": [2, 1, 1],
                         "mrope_interleaved": True}),
        30, ("decay removed: A_log -> -30", "variables", {"A_log": -30.0})),
    # Qwen3-Next (issue 35): Qwen 3.5's hybrid stack (3 Gated DeltaNet layers, their
    # q/k/v/z and b/a projections fused per key head, then a gated softmax one; partial
    # rotary 0.5 of d = 16) with a mixture in every layer but layer 0 (mlp_only_layers):
    # 4 experts of F = 24, top-2, renormalised, plus a shared expert of S = 32 times its
    # sigmoid gate. Seed 37: every router's second and third logits differ by more than
    # 1e-2 (0.038 at least; tests/convert/test_qwen3_next.py asserts it). Ablation: the shared expert's gate
    # removed (its kernel zeroed: sigmoid(0) = 1/2 for every token).
    "qwen3_next": ("Qwen3NextConfig", dict(
        num_hidden_layers=4, head_dim=16, tie_word_embeddings=False,
        layer_types=["linear_attention"] * 3 + ["full_attention"],
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
        linear_value_head_dim=12, linear_conv_kernel_dim=4, num_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=24, shared_expert_intermediate_size=32,
        norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[0],
        rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                         "partial_rotary_factor": 0.5}),
        37, ("shared expert's gate removed (its kernel zeroed: 1/2)", "zero_variables",
             {"names": ("shared_expert_gate_kernel",)})),
    # Llama 4 (issue 34): 4 layers, NoPE every 2nd (no_rope_layer_interval) with the
    # temperature tuning (attn_scale 0.5, floor_scale 4: floor((p + 1) / 4) up to 6 over
    # the 24 positions), the RoPE layers chunked (8: three chunks of T) with the weightless
    # L2 qk-norm and complex (interleaved) RoPE; a mixture every 2nd layer
    # (interleave_moe_layer_step): 4 experts of F = 48, top-1, the sigmoid score scaling the
    # expert's input, plus the shared expert; the dense layers 96 wide
    # (intermediate_size_mlp). Seed 44: every router's top two logits differ by more than
    # 1e-2 (0.097; tests/convert/test_llama4_text.py asserts it). Ablation: the temperature tuning
    # off on the NoPE layers.
    "llama4_text": ("Llama4TextConfig", dict(
        num_hidden_layers=4, head_dim=16, intermediate_size=48, intermediate_size_mlp=96,
        num_local_experts=4, num_experts_per_tok=1, interleave_moe_layer_step=2,
        no_rope_layer_interval=2, attention_chunk_size=8, floor_scale=4, attn_scale=0.5,
        tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 1e4}),
        44, ("temperature tuning off (NoPE layers' query scale removed)", "config",
             {"where": "no_rope", "query_scale_beta": None, "query_scale_length": None,
              "query_scale_offset": 0})),
}
# The fixtures (tests/assets/families/, < 100 KB each): the same cases, smaller.
SMALL = dict(vocab_size=32, hidden_size=16, intermediate_size=32, num_attention_heads=2,
             num_key_value_heads=1)


def config_kwargs(name, small=False):
    """The transformers config kwargs of case `name` (the fixtures' smaller one if `small`)."""
    kwargs = {k: v for k, v in {**_COMMON, **CASES[name][1]}.items() if v is not DROP}
    if small:
        kwargs.update(SMALL, num_hidden_layers=2)
        if "head_dim" in kwargs:
            kwargs["head_dim"] = 8 if name != "qwen3" else 12
        if "layer_types" in kwargs:  # the hybrid's: one linear layer, one full
            kwargs["layer_types"] = (kwargs["layer_types"][-2:]
                                     if name in ("qwen3_5_text", "qwen3_next")
                                     else kwargs["layer_types"][:2])
        if "sliding_window" in kwargs:
            kwargs["sliding_window"] = 4
        if "query_pre_attn_scalar" in kwargs:
            kwargs["query_pre_attn_scalar"] = 12
        for key, value in CASES[name][1].items():  # the family has no such field
            if value is DROP:
                kwargs.pop(key, None)
        if kwargs.get("kv_lora_rank"):  # latent attention: every head its own key/value
            kwargs["num_key_value_heads"] = kwargs["num_attention_heads"]
        if kwargs.get("num_kv_shared_layers"):  # two layers: the second reuses the first's
            kwargs["num_kv_shared_layers"] = 1
        if kwargs.get("vocab_size_per_layer_input"):
            kwargs["vocab_size_per_layer_input"] = SMALL["vocab_size"]
    params = kwargs.get("rope_parameters")
    if isinstance(params, dict) and params.get("rope_type") == "longrope":
        head_dim = kwargs.get("head_dim") or kwargs["hidden_size"] // kwargs["num_attention_heads"]
        half = int(head_dim * params.get("partial_rotary_factor", 1.0)) // 2
        kwargs["rope_parameters"] = {**params, "short_factor": params["short_factor"][:half],
                                     "long_factor": params["long_factor"][:half]}
    return kwargs


def ablate(lm, name):
    """A copy of the converted `lm` with case `name`'s ablation (keras only: every backend)."""
    import keras

    from keras_attn import CausalLM

    _, kind, changes = CASES[name][3]
    config = lm.get_config()
    if kind == "feed_forward":
        for block in config["blocks"]:  # the given feed-forwards (the mixtures) only
            if block["config"].get("feed_forward") is not None:
                block["config"]["feed_forward"]["config"].update(changes)
    if kind == "config":
        changes = dict(changes)
        where = changes.pop("where")
        for block in config["blocks"]:
            chosen = {"all": True, "sliding": block["config"]["sliding_window"] is not None,
                      "no_rope": block["config"]["rope_max_wavelength"] is None}[where]
            if chosen:
                block["config"].update(changes)
    if kind == "sequential":  # the same weights, the one norm before each sublayer in turn
        for block in config["blocks"]:
            block["config"]["use_parallel_residual"] = False
        new = CausalLM.from_config(config)

        def key(model, path):  # the path below the model (built or loaded, named or not)
            return path[len(model.name) + 1:] if path.startswith(model.name + "/") else path

        old = {key(lm, v.path): v for v in lm.weights}
        for v in new.weights:
            path = key(new, v.path)
            if path not in old:  # the sequential block's second norm: the shared one
                path = path.replace("feed_forward_norm", "self_attention_norm")
            v.assign(old[path])
        return new
    new = CausalLM.from_config(config)
    new.set_weights(lm.get_weights())
    for layer in new._flatten_layers(include_self=False, recursive=True):
        if not isinstance(layer, keras.layers.RMSNormalization):
            continue
        if kind == "norm_offset":
            layer.scale.assign(keras.ops.convert_to_numpy(layer.scale) - 1.0)
        elif kind == "qk_norm_ones" and layer.name in ("query_norm", "key_norm"):
            layer.scale.assign(np.ones(tuple(layer.scale.shape), "float32"))
    if kind == "zero_variables":
        for variable in new.weights:
            if variable.name in changes["names"]:
                variable.assign(np.zeros(tuple(variable.shape), variable.dtype))
    if kind == "variables":  # every variable named so (its last path part) set to a value
        for variable in new.weights:
            if variable.path.split("/")[-1] in changes:
                value = changes[variable.path.split("/")[-1]]
                variable.assign(np.full(tuple(variable.shape), value, "float32"))
    if kind == "zero_weights":
        for layer in new._flatten_layers(include_self=False, recursive=True):
            if layer.name in changes["names"]:
                weight = (layer.embeddings if isinstance(layer, keras.layers.Embedding)
                          else layer.kernel)
                weight.assign(np.zeros(tuple(weight.shape), "float32"))
    return new


def token_ids(name, small=False):
    """The (B, T) int32 ids case `name` is compared on."""
    vocabulary = config_kwargs(name, small)["vocab_size"]
    return np.random.default_rng(CASES[name][2]).integers(0, vocabulary, (B, T)).astype("int32")


def relative_error(actual, expected):
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    return float(np.abs(actual - expected).max() / np.abs(expected).max())


def hf_config(name, small=False, **overrides):
    """The installed transformers' config of case `name` (its kwargs updated with
    `overrides`, in transformers 4's names there); `pytest.skip` with the reason when that
    version cannot build it (`transformers_versions.installed_transformers_lacks`)."""
    import transformers

    kwargs = {**config_kwargs(name, small), **overrides}
    if tv.transformers_4():
        translated = tv.as_transformers_4(kwargs)
        reason = (f"transformers {transformers.__version__} has no form of the case's "
                  "per-layer-type rope_parameters" if translated is None
                  else tv.installed_transformers_lacks(CASES[name][0], translated, _COMMON))
        kwargs = translated
    else:
        reason = tv.installed_transformers_lacks(CASES[name][0], kwargs, _COMMON)
    if reason is not None:
        import pytest

        pytest.skip(reason)
    return getattr(transformers, CASES[name][0])(**kwargs)


def build_hf(name, small=False, **overrides):
    """The transformers `*ForCausalLM` of case `name` (its config kwargs updated with
    `overrides`), with its random weights (torch only); skipped where the installed
    transformers cannot build it (`hf_config`)."""
    import torch
    import transformers

    _, _, seed, _ = CASES[name]
    config = hf_config(name, small, **overrides)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for key, parameter in model.named_parameters():
            value = STD * torch.randn(parameter.shape, generator=generator)
            if parameter.ndim == 1 and "norm" in key and not name.startswith("gemma"):
                value = value + 1.0  # Llama-style norms multiply by w: around 1, not 0
            parameter.copy_(value)
        for key, buffer in model.named_buffers():
            if key.endswith("layer_scalar"):  # Gemma 4's: a stored buffer, ones at first
                buffer.copy_(1.0 + STD * torch.randn(buffer.shape, generator=generator))
            if key.endswith("e_score_correction_bias"):  # DeepSeek V3's: zeros at first
                buffer.copy_(STD * torch.randn(buffer.shape, generator=generator))
        for key, parameter in model.named_parameters():
            if key.endswith("router.proj.weight"):  # Gemma 4's: its input is D**-0.5 small
                parameter.mul_(ROUTER_WIDENING)
    return model.float().eval()


def hf_reference(model, ids, generate=True):
    """transformers' logits over `ids` `(B, T)`, 16 greedy tokens after the first P, and the
    smallest greedy margin (top-1 minus top-2 logit) over those steps (None, None without
    `generate`)."""
    import torch

    with torch.no_grad():
        logits = model(torch.from_numpy(ids).long()).logits.numpy()
        if not generate:
            return logits, None, None
        prompt = torch.from_numpy(ids[:, :P]).long()
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                             max_new_tokens=NEW, min_new_tokens=NEW, return_dict_in_generate=True,
                             output_logits=True, pad_token_id=0)
    steps = np.stack([s.float().numpy() for s in out.logits])  # (NEW, B, V)
    top = np.sort(steps, axis=-1)
    margin = float((top[..., -1] - top[..., -2]).min())
    return logits, out.sequences.numpy().astype("int32"), margin
