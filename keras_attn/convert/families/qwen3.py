"""`model_type="qwen3"` (Qwen 3): Llama's layout with qk-norm (an RMSNorm over each
head's queries and keys, `q_norm` / `k_norm`), `attention_bias` on the four attention
projections, and, with `use_sliding_window`, a window on the "sliding_attention" blocks
(`layer_types`; without it, the blocks from `max_window_layers` on)."""

from keras_attn.convert._transformers_config import ModelSpec
from keras_attn.convert.families import _shared

MODEL_TYPE = "qwen3"
ARCHITECTURES = ("Qwen3ForCausalLM", "Qwen3Model")  # transformers' classes (`architectures`)
FIELDS = {
    "read": _shared.CORE_FIELDS + ("hidden_act", "rms_norm_eps", "attention_bias",
                                   "sliding_window", "use_sliding_window", "max_window_layers",
                                   "layer_types"),
    "neutral": {},
    "ignored": {},
}


def spec(config):
    core = _shared.core(config)
    n = core["num_layers"]
    rope = _shared.rope_of(config)
    windows = _shared.windows_from_max_window_layers(config, n)
    bias = bool(config.get("attention_bias", False))
    return ModelSpec(
        **core, qkv_bias=bias, output_bias=bias, mlp_bias=False, qk_norm=True,
        final_logit_soft_cap=None,
        layers=_shared.layer_specs(n, rope, windows=windows,
                                   logit_soft_cap=None, scale=None, qk_norm="rms",
                                   qk_norm_epsilon=core["epsilon"]))
