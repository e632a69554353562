"""`model_type="mixtral"` (Mixtral 8x7B, 8x22B): Mistral's layout (no biases,
`sliding_window` the window of every block when set) with every feed-forward a mixture
of `num_local_experts` SwiGLU experts of width `intermediate_size`, `num_experts_per_tok`
of them per token: `keras_attn.MixtureOfExperts` with `norm_topk_prob=True`, as
transformers' `MixtralTopKRouter` always renormalises the top-k probabilities.

transformers 5 stores the experts fused: `mlp.experts.gate_up_proj` (E, 2F, D) and
`mlp.experts.down_proj` (E, D, F), the router `mlp.gate.weight` (E, D).
"""

from keras_attn.convert._experts import MIXTRAL_MODULES, per_expert_checkpoint
from keras_attn.convert._transformers_config import ModelSpec, _positive_int, _refuse
from keras_attn.convert.families import _shared

MODEL_TYPE = "mixtral"
ARCHITECTURES = ("MixtralForCausalLM", "MixtralModel")  # transformers' classes (`architectures`)
FIELDS = {
    "read": _shared.CORE_FIELDS + ("hidden_act", "rms_norm_eps", "sliding_window",
                                   "num_local_experts", "num_experts_per_tok"),
    "neutral": {},
    "ignored": {
        **_shared.ROUTER_TRAINING_FIELDS,
        "router_jitter_noise": "multiplicative noise on the experts' inputs in training only; "
                               "inference, which the conversion reproduces, has none",
    },
}

# MixtralConfig's defaults where they differ from what `_shared.core` assumes of a field
# left out (a config.json written by transformers holds every field anyway).
_DEFAULTS = {"num_key_value_heads": 8, "rms_norm_eps": 1e-5, "num_local_experts": 8,
             "num_experts_per_tok": 2}


def spec(config):
    config = {**_DEFAULTS, **config}
    core = _shared.core(config)
    n = core["num_layers"]
    experts = _positive_int(config, "num_local_experts")
    k = _positive_int(config, "num_experts_per_tok")
    if k > experts:
        _refuse("num_experts_per_tok", k, f"at most num_local_experts={experts}")
    rope = _shared.rope_of(config, default_theta=1000000.0)
    window = _shared.window_of(config)
    layers = _shared.layer_specs(n, rope, windows=[window] * n, logit_soft_cap=None,
                                 scale=None)
    for layer in layers:
        layer.mixture_of_experts = dict(num_experts=experts, num_experts_per_tok=k,
                                        intermediate_dim=core["intermediate_dim"],
                                        norm_topk_prob=True)
    return ModelSpec(
        **core, qkv_bias=False, output_bias=False, mlp_bias=False, qk_norm=False,
        final_logit_soft_cap=None, layers=layers)


# The checkpoint's one module per expert (what transformers' `save_pretrained` writes and
# the Hub holds) <-> the fused experts the reader maps (`convert._experts`).
canonical_state_dict, checkpoint_state_dict = per_expert_checkpoint(MIXTRAL_MODULES)
