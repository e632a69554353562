"""`model_type="deepseek_v3"` (DeepSeek V3, its attention from DeepSeek V2): multi-head latent
attention, converted per layer by `keras_attn.convert.multi_head_latent_attention_from_transformers`
(`latent_attention(config)` below gives its `MultiHeadLatentAttention` arguments).

The whole model is refused (`spec`): its feed-forward is a mixture of experts
(`n_routed_experts`, issue 34), and keras_attn's `CausalLM` blocks hold `MultiHeadAttention`,
not latent attention.

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
"""

import numbers
from collections.abc import Mapping

from keras_attn.convert._transformers_config import _number, _positive_int
from keras_attn.convert.families import _shared
from keras_attn.rope import _yarn_mscale

MODEL_TYPE = "deepseek_v3"
_MOE = ("n_routed_experts", "n_shared_experts", "num_experts_per_tok", "n_group", "topk_group",
        "first_k_dense_replace", "norm_topk_prob", "routed_scaling_factor",
        "moe_intermediate_size", "output_router_logits")
FIELDS = {
    "read": ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
             "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
             "v_head_dim", "qk_head_dim", "head_dim", "attention_bias", "attention_dropout",
             "rms_norm_eps", "rope_parameters", "rope_theta", "rope_scaling", "rope_interleave",
             "n_routed_experts"),
    "neutral": {"pretraining_tp": (1, None)},
    "ignored": {
        **{name: "the mixture-of-experts feed-forward: not converted (issue 34); the whole "
                 "model is refused by `n_routed_experts`" for name in _MOE[1:]},
        "vocab_size": "the embeddings: not converted (the whole model is refused)",
        "intermediate_size": "the dense feed-forward: not converted (the model is refused)",
        "hidden_act": "the feed-forward's activation: not converted (the model is refused)",
        "tie_word_embeddings": "the LM head: not converted (the model is refused)",
        "num_nextn_predict_layers": "multi-token prediction modules after the model: not "
                                    "part of the attention (the model is refused)",
    },
}


def spec(config):
    """Refused: DeepSeek V3's feed-forward is a mixture of experts (a `ValueError` naming
    `n_routed_experts`), and its attention is latent (`kv_lora_rank`)."""
    experts = config.get("n_routed_experts", 256)
    if experts:
        _shared.refuse("n_routed_experts", experts,
                       "DeepSeek V3's feed-forward is a mixture of experts, which keras_attn "
                       "does not convert (issue 34); its attention converts per layer with "
                       "keras_attn.convert.multi_head_latent_attention_from_transformers")
    _shared.refuse("kv_lora_rank", config.get("kv_lora_rank"),
                   "keras_attn's CausalLM blocks hold MultiHeadAttention, not multi-head latent "
                   "attention; convert the attention per layer with "
                   "keras_attn.convert.multi_head_latent_attention_from_transformers")


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
