"""`model_type="qwen3_moe"` (Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen 3's attention
(qk-norm, `attention_bias`) with mixture-of-experts feed-forwards: `num_experts`
(transformers 5 stores it as `num_local_experts`) SwiGLU experts of width
`moe_intermediate_size`, `num_experts_per_tok` per token, the top-k probabilities
renormalised when `norm_topk_prob` (`keras_attn.MixtureOfExperts`).

Which layers are mixtures (transformers' `Qwen3MoeDecoderLayer`): layer i unless it is
in `mlp_only_layers`, when `num_experts > 0` and `(i + 1) % decoder_sparse_step == 0`;
the others are dense SwiGLU MLPs of width `intermediate_size` (`mlp.gate_proj`, ...).
With `use_sliding_window`, `sliding_window` is every layer's window (transformers sets
it to None otherwise).
"""

from keras_attn.convert._experts import QWEN2_MOE_MODULES, per_expert_checkpoint
from keras_attn.convert._transformers_config import ModelSpec, _positive_int, _refuse
from keras_attn.convert.families import _shared

MODEL_TYPE = "qwen3_moe"
ARCHITECTURES = ("Qwen3MoeForCausalLM", "Qwen3MoeModel")  # transformers' classes (`architectures`)
FIELDS = {
    "read": _shared.CORE_FIELDS + (
        "hidden_act", "rms_norm_eps", "attention_bias", "sliding_window",
        "use_sliding_window", "num_experts", "num_local_experts", "num_experts_per_tok",
        "moe_intermediate_size", "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers"),
    "neutral": {},
    "ignored": {
        **_shared.ROUTER_TRAINING_FIELDS,
    },
}

# Qwen3MoeConfig's defaults for fields left out of a dict config.
_DEFAULTS = {"num_key_value_heads": 4, "decoder_sparse_step": 1, "mlp_only_layers": [],
             "norm_topk_prob": False, "num_experts_per_tok": 8, "moe_intermediate_size": 768}


def _num_experts(config):
    values = {f: config[f] for f in ("num_local_experts", "num_experts") if f in config}
    if len(set(map(repr, values.values()))) > 1:
        _refuse("num_experts", values.get("num_experts"),
                f"it disagrees with num_local_experts={values['num_local_experts']!r}")
    value = next(iter(values.values()), 128)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        _refuse("num_experts", value, "a number of experts >= 0 is needed")
    return value


def moe_layers(config, num_layers, num_experts):
    """Whether each layer's feed-forward is a mixture (transformers' rule)."""
    step = _positive_int(config, "decoder_sparse_step")
    dense = config.get("mlp_only_layers") or []
    if not isinstance(dense, (list, tuple)) or not all(
            isinstance(i, int) and not isinstance(i, bool) and 0 <= i < num_layers
            for i in dense):
        _refuse("mlp_only_layers", dense, f"layer indices in [0, {num_layers}) are needed")
    return [i not in dense and num_experts > 0 and (i + 1) % step == 0
            for i in range(num_layers)]


def spec(config):
    config = {**_DEFAULTS, **config}
    core = _shared.core(config)
    n = core["num_layers"]
    experts = _num_experts(config)
    k = _positive_int(config, "num_experts_per_tok")
    if experts and k > experts:
        _refuse("num_experts_per_tok", k, f"at most num_experts={experts}")
    width = _positive_int(config, "moe_intermediate_size")
    norm = config.get("norm_topk_prob")
    if not isinstance(norm, bool):
        _refuse("norm_topk_prob", norm, "True or False is needed")
    rope = _shared.rope_of(config)
    window = _shared.window_of(config) if config.get("use_sliding_window") else None
    bias = bool(config.get("attention_bias", False))
    layers = _shared.layer_specs(n, rope, windows=[window] * n, logit_soft_cap=None,
                                 scale=None, qk_norm="rms", qk_norm_epsilon=core["epsilon"])
    for layer, moe in zip(layers, moe_layers(config, n, experts), strict=True):
        if moe:
            layer.mixture_of_experts = dict(num_experts=experts, num_experts_per_tok=k,
                                            intermediate_dim=width, norm_topk_prob=norm)
    return ModelSpec(
        **core, qkv_bias=bias, output_bias=bias, mlp_bias=False, qk_norm=True,
        final_logit_soft_cap=None, layers=layers)


# The checkpoint's one module per expert (what transformers' `save_pretrained` writes and
# the Hub holds) <-> the fused experts the reader maps (`convert._experts`).
canonical_state_dict, checkpoint_state_dict = per_expert_checkpoint(QWEN2_MOE_MODULES)
