"""`model_type="gpt_oss"` (gpt-oss): its attention, with biases on q/k/v/o
(`attention_bias`), attention sinks (`self_attn.sinks`, one logit per query head:
`MultiHeadAttention`'s `use_sinks` weight `sinks`), alternating sliding / full blocks
(`layer_types`; without it transformers' default, the even blocks sliding), yarn RoPE
(`rope_parameters`, GptOssConfig's `truncate=False`) and its own `head_dim`.

The feed-forward of every block is a mixture of experts (`num_local_experts` experts,
`num_experts_per_tok` chosen per token by a router, a clamped SwiGLU): keras_attn builds
no such block yet (issue 34), so the spec says so (`ModelSpec.mixture_of_experts`) and the
block and model converters refuse it, naming `num_local_experts`; the attention converter
(`multi_head_attention_from_transformers`) converts each block's attention."""

from keras_attn.convert._transformers_config import ModelSpec, _number, _positive_int
from keras_attn.convert.families import _shared

MODEL_TYPE = "gpt_oss"
# GptOssConfig's RoPE when a config gives none (its default_theta and __post_init__).
_DEFAULT_ROPE = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                 "truncate": False, "original_max_position_embeddings": 4096}
# The fields of the experts: read to refuse the blocks (see the module docstring).
_EXPERT_FIELDS = ("num_local_experts", "num_experts_per_tok", "swiglu_alpha", "swiglu_limit")
FIELDS = {
    "read": _shared.CORE_FIELDS + ("hidden_act", "rms_norm_eps", "attention_bias",
                                   "sliding_window", "layer_types") + _EXPERT_FIELDS,
    "neutral": {},
    "ignored": {"router_aux_loss_coef": "the router's auxiliary loss, training only",
                "output_router_logits": "what is returned (the router's logits)"},
}


# transformers 5.24's defaults for fields a config.json may leave out, where they differ
# from what `_shared.core` assumes (tests/convert/test_config_defaults.py compares).
_DEFAULTS = {"head_dim": 64, "num_key_value_heads": 8}


def spec(config):
    config = {**_DEFAULTS, **config}
    core = _shared.core(config, default_epsilon=1e-5)
    n, window = core["num_layers"], _shared.window_of(config)
    types = config.get("layer_types")
    if types is None:  # GptOssConfig's default: the even blocks (0, 2, ...) slide
        types = _shared.every_nth_full(n, 2)
    types = _shared.checked_layer_types(types, n, window)
    experts = _positive_int(config, "num_local_experts", 128)
    if config.get("num_experts_per_tok") is not None:
        _positive_int(config, "num_experts_per_tok")
    for field in ("swiglu_alpha", "swiglu_limit"):
        _number(config, field, 1.0)
    bias = bool(config.get("attention_bias", True))
    if config.get("rope_parameters") is None and config.get("rope_scaling") is None:
        config = {**config, "rope_parameters": {
            **_DEFAULT_ROPE, "rope_theta": config.get("rope_theta", 150000.0)}}
    return ModelSpec(
        **core, qkv_bias=bias, output_bias=bias, mlp_bias=False, qk_norm=False,
        final_logit_soft_cap=None, mixture_of_experts=("num_local_experts", experts),
        layers=_shared.layer_specs(n, _shared.rope_of(config),
                                   windows=_shared.sliding_windows(types, window),
                                   use_sinks=True))
