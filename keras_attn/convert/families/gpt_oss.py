"""`model_type="gpt_oss"` (gpt-oss): its attention, with biases on q/k/v/o
(`attention_bias`), attention sinks (`self_attn.sinks`, one logit per query head:
`MultiHeadAttention`'s `use_sinks` weight `sinks`), alternating sliding / full blocks
(`layer_types`; without it transformers' default, the even blocks sliding), yarn RoPE
(`rope_parameters`, GptOssConfig's `truncate=False`) and its own `head_dim`.

The feed-forward of every block is a mixture of `num_local_experts` experts of width
`intermediate_size`, `num_experts_per_tok` per token (issue 34): `keras_attn.
MixtureOfExperts` with gpt-oss's router (`routing="topk_softmax"`: the top-k logits,
softmax over those k; `use_router_bias`) and experts (`use_expert_bias`,
`expert_activation="gpt_oss_swiglu"` with `swiglu_alpha` and `swiglu_limit`).

transformers 5 stores them as `mlp.router.weight` (E, D) and `.bias` (E,),
`mlp.experts.gate_up_proj` (E, D, 2F) with the gate and up columns INTERLEAVED (gate
`[..., ::2]`, up `[..., 1::2]`), `gate_up_proj_bias` (E, 2F) likewise, `down_proj`
(E, F, D) and `down_proj_bias` (E, D); `canonical_state_dict` de-interleaves them into
the layout the converter maps (Mixtral's `mlp.gate` and `(E, 2F, D)` `[gate; up]`, plus
the biases), each cross-checked against the config; `checkpoint_state_dict` is its
inverse (`CausalLM.save_pretrained`).
"""

import numpy as np

from keras_attn.convert import _common
from keras_attn.convert._transformers_config import ModelSpec, _number, _positive_int, _refuse
from keras_attn.convert.families import _shared

MODEL_TYPE = "gpt_oss"
ARCHITECTURES = ("GptOssForCausalLM", "GptOssModel")  # transformers' classes (`architectures`)
# GptOssConfig's RoPE when a config gives none (its default_theta and __post_init__).
_DEFAULT_ROPE = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                 "truncate": False, "original_max_position_embeddings": 4096}
_EXPERT_FIELDS = ("num_local_experts", "num_experts_per_tok", "swiglu_alpha", "swiglu_limit")
FIELDS = {
    "read": _shared.CORE_FIELDS + ("rms_norm_eps", "attention_bias", "sliding_window",
                                   "layer_types") + _EXPERT_FIELDS,
    "neutral": {},
    "ignored": {"router_aux_loss_coef": "the router's auxiliary loss, training only",
                "output_router_logits": "what is returned (the router's logits)",
                "hidden_act": "transformers' gpt-oss does not read it: its experts' "
                              "activation is the clamped SwiGLU (swiglu_alpha, swiglu_limit)"},
}
# transformers 5.24's defaults for fields a config.json may leave out, where they differ
# from what `_shared.core` assumes (tests/convert/test_config_defaults.py compares), and
# GptOssConfig's defaults of the experts' fields.
_DEFAULTS = {"head_dim": 64, "num_key_value_heads": 8, "num_local_experts": 128,
             "num_experts_per_tok": 4, "swiglu_alpha": 1.702, "swiglu_limit": 7.0}


def spec(config):
    config = {**_DEFAULTS, **config}
    core = _shared.core({k: v for k, v in config.items() if k != "hidden_act"},
                        default_epsilon=1e-5)
    n, window = core["num_layers"], _shared.window_of(config)
    types = config.get("layer_types")
    if types is None:  # GptOssConfig's default: the even blocks (0, 2, ...) slide
        types = _shared.every_nth_full(n, 2)
    types = _shared.checked_layer_types(types, n, window)
    experts = _positive_int(config, "num_local_experts")
    k = _positive_int(config, "num_experts_per_tok")
    if k > experts:
        _refuse("num_experts_per_tok", k, f"at most num_local_experts={experts}")
    alpha = _number(config, "swiglu_alpha")
    limit = _number(config, "swiglu_limit")
    bias = bool(config.get("attention_bias", True))
    if config.get("rope_parameters") is None and config.get("rope_scaling") is None:
        config = {**config, "rope_parameters": {
            **_DEFAULT_ROPE, "rope_theta": config.get("rope_theta", 150000.0)}}
    layers = _shared.layer_specs(n, _shared.rope_of(config),
                                 windows=_shared.sliding_windows(types, window),
                                 use_sinks=True)
    for layer in layers:
        layer.mixture_of_experts = dict(
            num_experts=experts, num_experts_per_tok=k,
            intermediate_dim=core["intermediate_dim"], routing="topk_softmax",
            use_router_bias=True, use_expert_bias=True, expert_activation="gpt_oss_swiglu",
            swiglu_alpha=alpha, swiglu_limit=limit)
    return ModelSpec(
        **core, qkv_bias=bias, output_bias=bias, mlp_bias=False, qk_norm=False,
        final_logit_soft_cap=None, layers=layers)


def _array(entries, key, shape, letters, fields):
    value = _common.to_numpy(entries.pop(key), f"state_dict entry {key!r}")
    if value.shape != tuple(shape):
        raise ValueError(
            f"The config and the weights disagree: {fields} give {letters} = "
            f"{_common.shape_text(shape)} for state_dict entry {key!r}, which has shape "
            f"{_common.shape_text(value.shape)}.")
    return value


def canonical_state_dict(entries, spec):
    """The router renamed to `mlp.gate`; the interleaved `gate_up_proj` (E, D, 2F) and its
    bias split into `[gate; up]` (E, 2F, D) / (E, 2F); `down_proj` (E, F, D) transposed to
    (E, D, F): each entry's shape cross-checked against the config."""
    D = spec.hidden_dim
    moe = next((layer.mixture_of_experts for layer in spec.layers
                if layer.mixture_of_experts), None)
    if moe is None:
        return entries
    E, F = moe["num_experts"], moe["intermediate_dim"]
    sizes = (f"num_local_experts={E}, intermediate_size={F}, hidden_size={D}")
    for key in [k for k in entries if isinstance(k, str)]:
        if key.endswith("mlp.router.weight") or key.endswith("mlp.router.bias"):
            entries[key.replace("mlp.router.", "mlp.gate.")] = entries.pop(key)
        elif key.endswith("mlp.experts.gate_up_proj"):
            fused = _array(entries, key, (E, D, 2 * F), "(E, D, 2F)", sizes)
            split = np.concatenate([fused[..., ::2], fused[..., 1::2]], axis=-1)
            entries[key] = split.transpose(0, 2, 1)
        elif key.endswith("mlp.experts.gate_up_proj_bias"):
            fused = _array(entries, key, (E, 2 * F), "(E, 2F)", sizes)
            entries[key] = np.concatenate([fused[..., ::2], fused[..., 1::2]], axis=-1)
        elif key.endswith("mlp.experts.down_proj"):
            entries[key] = _array(entries, key, (E, F, D), "(E, F, D)", sizes).transpose(0, 2, 1)
    return entries


def _interleave(split):
    """`[gate | up]` on the last axis back to gpt-oss's interleaved columns."""
    F = split.shape[-1] // 2
    fused = np.empty_like(split)
    fused[..., ::2], fused[..., 1::2] = split[..., :F], split[..., F:]
    return fused


def checkpoint_state_dict(entries, spec):
    """The inverse of `canonical_state_dict` (for writing a checkpoint): `mlp.gate` back to
    `mlp.router`, `[gate; up]` re-interleaved into `gate_up_proj` (E, D, 2F) and its bias,
    `down_proj` back to (E, F, D)."""
    renamed = {}
    for key, value in entries.items():
        if ".mlp.gate." in key:
            key = key.replace(".mlp.gate.", ".mlp.router.")
        elif key.endswith("mlp.experts.gate_up_proj"):
            value = _interleave(np.asarray(value).transpose(0, 2, 1))
        elif key.endswith("mlp.experts.gate_up_proj_bias"):
            value = _interleave(np.asarray(value))
        elif key.endswith("mlp.experts.down_proj"):
            value = np.asarray(value).transpose(0, 2, 1)
        renamed[key] = np.ascontiguousarray(value)
    return renamed
