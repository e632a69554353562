"""`model_type="deepseek_v3"` (DeepSeek V3, its attention from DeepSeek V2): multi-head latent
attention in every block, a mixture of experts with a shared expert after the first
`first_k_dense_replace` blocks; `keras_attn.convert.causal_lm_from_transformers` converts the
whole model (its blocks' self-attention a `MultiHeadLatentAttention`, their feed-forward a
`MixtureOfExperts` or the dense SwiGLU MLP), and
`keras_attn.convert.multi_head_latent_attention_from_transformers` one layer's attention
(`latent_attention(config)` below gives its `MultiHeadLatentAttention` arguments).

What transformers' `DeepseekV3Attention` computes, field by field: `q_lora_rank` (None:
one `q_proj`), `kv_lora_rank`, `qk_nope_head_dim`, `qk_rope_head_dim` (RoPE's width:
the config's `head_dim` is set to it), `v_head_dim`, `attention_bias` (on `q_a_proj`,
`kv_a_proj_with_mqa` and `o_proj`), `rms_norm_eps` (`q_a_layernorm`, `kv_a_layernorm`),
`rope_parameters` (yarn's attention factor scales cos and sin; `yarn_apply_mscale`
multiplies the softmax scale `qk_head_dim ** -0.5` by `mscale(factor, mscale_all_dim)**2`
whenever the type is not "default" and `mscale_all_dim` is set), `rope_interleave` (pairs
(2i, 2i + 1) on the rotary parts), `attention_dropout`. `num_key_value_heads` must equal
`num_attention_heads`: the latent is expanded to every head, and transformers' eager
attention then repeats the heads `num_attention_heads // num_key_value_heads` times, which
computes the same attention only at 1 (the class default 128 differs from a small config's
heads).

What its `DeepseekV3MoE` computes (block i from `first_k_dense_replace` on; the earlier
blocks a dense `DeepseekV3MLP` of width `intermediate_size`): `n_routed_experts` SwiGLU
experts of width `moe_intermediate_size` (`hidden_act`), `num_experts_per_tok` per token,
routed by `DeepseekV3TopkRouter` (`MixtureOfExperts(routing="sigmoid_group_topk")`: sigmoid
scores, `e_score_correction_bias` added for the choice only, `n_group` groups scored by
their top two, `topk_group` kept, the weights renormalised when `norm_topk_prob`, times
`routed_scaling_factor`), plus a shared expert every token runs, `n_shared_experts *
moe_intermediate_size` wide. The older remote-code configs' `topk_method` ("noaux_tc" only:
the correction-bias rule) and `scoring_func` ("sigmoid" only) are read when present.
"""

import numbers
from collections.abc import Mapping

from keras_attn.convert._experts import QWEN2_MOE_MODULES, per_expert_checkpoint
from keras_attn.convert._transformers_config import LayerSpec, ModelSpec, _number, _positive_int
from keras_attn.convert.families import _shared
from keras_attn.rope import _yarn_mscale

MODEL_TYPE = "deepseek_v3"
ARCHITECTURES = ("DeepseekV3ForCausalLM", "DeepseekV3Model")  # transformers' classes (`architectures`)
_MOE = ("n_routed_experts", "n_shared_experts", "num_experts_per_tok", "n_group", "topk_group",
        "first_k_dense_replace", "norm_topk_prob", "routed_scaling_factor",
        "moe_intermediate_size", "topk_method", "scoring_func")
FIELDS = {
    "read": ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
             "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
             "v_head_dim", "qk_head_dim", "head_dim", "attention_bias", "attention_dropout",
             "rms_norm_eps", "rope_parameters", "rope_theta", "rope_scaling", "rope_interleave",
             "vocab_size", "intermediate_size", "hidden_act", "tie_word_embeddings") + _MOE,
    "neutral": {"pretraining_tp": (1, None)},
    "ignored": {
        "output_router_logits": "whether the model also returns the router logits; the "
                                "logits are the same",
        "num_nextn_predict_layers": "multi-token prediction modules after the model: "
                                    "DeepseekV3ForCausalLM builds none, the logits are "
                                    "the same",
    },
}

# DeepseekV3Config's defaults for the feed-forward fields left out of a dict config.
_MOE_DEFAULTS = {"n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8,
                 "n_group": 8, "topk_group": 4, "first_k_dense_replace": 3,
                 "norm_topk_prob": True, "routed_scaling_factor": 2.5,
                 "moe_intermediate_size": 2048, "intermediate_size": 18432,
                 "vocab_size": 129280, "tie_word_embeddings": False}


def _mixture_of_experts(config):
    """The `MixtureOfExperts` keywords of the mixture blocks, every field checked."""
    E = _positive_int(config, "n_routed_experts")
    k = _positive_int(config, "num_experts_per_tok")
    groups = _positive_int(config, "n_group")
    if E % groups or E // groups < 2:
        _shared.refuse("n_group", groups, f"it must divide n_routed_experts={E} into groups of "
                       "at least 2 experts (DeepseekV3TopkRouter scores a group by its top 2)")
    kept = _positive_int(config, "topk_group")
    if kept > groups:
        _shared.refuse("topk_group", kept, f"at most n_group={groups}")
    if k > kept * (E // groups):
        _shared.refuse("num_experts_per_tok", k, f"at most the experts of the kept groups, "
                       f"topk_group * n_routed_experts / n_group = {kept * (E // groups)}")
    norm = config.get("norm_topk_prob")
    if not isinstance(norm, bool):
        _shared.refuse("norm_topk_prob", norm, "True or False is needed")
    for field, only in (("topk_method", "noaux_tc"), ("scoring_func", "sigmoid")):
        if field in config and config[field] != only:
            _shared.refuse(field, config[field], f"keras_attn reproduces DeepSeek V3's "
                           f"{only!r} only (transformers' DeepseekV3TopkRouter)")
    width = _positive_int(config, "moe_intermediate_size")
    return dict(num_experts=E, num_experts_per_tok=k, intermediate_dim=width,
                norm_topk_prob=norm, routing="sigmoid_group_topk", n_group=groups,
                topk_group=kept,
                routed_scaling_factor=_number(config, "routed_scaling_factor"),
                shared_intermediate_dim=_positive_int(config, "n_shared_experts") * width)


def spec(config):
    """The whole model: every block's self-attention latent (`ModelSpec.latent_attention`),
    its feed-forward the dense MLP before `first_k_dense_replace`, a mixture after."""
    config = {**_MOE_DEFAULTS, **config}
    # DeepseekV3Config derives head_dim = qk_rope_head_dim when a config leaves it out.
    config.setdefault("head_dim", config.get("qk_rope_head_dim", _DEFAULTS["qk_rope_head_dim"]))
    num_layers, _, attention = latent_attention(config)
    dense = config.get("first_k_dense_replace")
    if isinstance(dense, bool) or not isinstance(dense, int) or dense < 0:
        _shared.refuse("first_k_dense_replace", dense, "a number of layers >= 0 is needed")
    moe = _mixture_of_experts(config)
    core = _shared.core(config)
    layers = [LayerSpec({}) for _ in range(num_layers)]
    for i, layer in enumerate(layers):
        if i >= dense:  # transformers' DeepseekV3DecoderLayer: `layer_idx >= first_k_dense_replace`
            layer.mixture_of_experts = dict(moe)
    return ModelSpec(
        **core, qkv_bias=False, output_bias=False, mlp_bias=False, qk_norm=False,
        final_logit_soft_cap=None, layers=layers, latent_attention=attention)


def _rope_scale(params, head_scale):
    """transformers' `yarn_apply_mscale(rope_parameters, qk_head_dim ** -0.5)`."""
    if params.get("rope_type", params.get("type", "default")) != "default":
        mscale_all_dim = params.get("mscale_all_dim", 0)
        if mscale_all_dim:
            factor = params.get("factor")
            if isinstance(factor, bool) or not isinstance(factor, numbers.Real):
                _shared.refuse("rope_parameters['factor']", factor,
                               "the softmax scale's mscale needs the yarn factor")
            m = _yarn_mscale(float(factor), float(mscale_all_dim))
            return head_scale * m * m
    return head_scale


def latent_attention(config):
    """`(num_layers, hidden_size, the MultiHeadLatentAttention keywords)` of the config."""
    D = _positive_int(config, "hidden_size")
    H = _positive_int(config, "num_attention_heads")
    H_kv = config.get("num_key_value_heads")
    if H_kv is not None and H_kv != H:
        _shared.refuse("num_key_value_heads", H_kv,
                       f"DeepseekV3Attention expands the latent to every head and its eager "
                       f"attention repeats them num_attention_heads // num_key_value_heads "
                       f"times: the same attention only with num_key_value_heads = "
                       f"num_attention_heads={H}")
    q_lora = config.get("q_lora_rank", 1536)
    q_lora = None if q_lora is None else _positive_int(config, "q_lora_rank")
    sizes = {name: _positive_int({**_DEFAULTS, **config}, name) for name in (
        "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")}
    d_qk = sizes["qk_nope_head_dim"] + sizes["qk_rope_head_dim"]
    for name, expected in (("qk_head_dim", d_qk), ("head_dim", sizes["qk_rope_head_dim"])):
        if config.get(name) is not None and config[name] != expected:  # derived by the config
            _shared.refuse(name, config[name], f"DeepseekV3Config derives it: {expected}")
    interleave = config.get("rope_interleave", True)
    if not isinstance(interleave, bool):
        _shared.refuse("rope_interleave", interleave, "True or False")
    bias = config.get("attention_bias", False)
    if not isinstance(bias, bool):
        _shared.refuse("attention_bias", bias, "True or False")
    params = config.get("rope_parameters")
    if params is None and config.get("rope_scaling") is None:
        params = {"rope_type": "default", "rope_theta": config.get("rope_theta", 10000.0)}
        config = {**config, "rope_parameters": params}
    rope = _shared.rope_of(config)
    params = params if isinstance(params, Mapping) else dict(config.get("rope_scaling") or {})
    scale = _rope_scale(params, d_qk ** -0.5)
    arguments = dict(
        num_heads=H, q_lora_rank=q_lora, **sizes, use_bias=bias,
        layer_norm_epsilon=_number(config, "rms_norm_eps", 1e-6),
        dropout=_number(config, "attention_dropout", 0.0, positive=False),
        scale=scale, **rope, rope_interleaved=interleave)
    return _positive_int(config, "num_hidden_layers"), D, arguments


# DeepseekV3Config's defaults for the sizes (a config.json written by transformers holds
# every field anyway).
_DEFAULTS = {"kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
             "v_head_dim": 128}


# The checkpoint's one module per expert (what transformers' `save_pretrained` writes and
# the Hub holds) <-> the fused experts the reader maps (`convert._experts`).
canonical_state_dict, checkpoint_state_dict = per_expert_checkpoint(QWEN2_MOE_MODULES)
