"""`model_type="qwen2"` (Qwen 2, 2.5): Llama's layout with biases on the query, key and
value projections (none on the output one), and, with `use_sliding_window`, a window on
the "sliding_attention" blocks (`layer_types`; without it, transformers' derivation:
the blocks from `max_window_layers` on)."""

from keras_attn.convert._transformers_config import ModelSpec
from keras_attn.convert.families import _shared

MODEL_TYPE = "qwen2"
ARCHITECTURES = ("Qwen2ForCausalLM", "Qwen2Model")  # transformers' classes (`architectures`)
FIELDS = {
    "read": _shared.CORE_FIELDS + ("hidden_act", "rms_norm_eps", "sliding_window",
                                   "use_sliding_window", "max_window_layers", "layer_types"),
    "neutral": {},
    "ignored": {},
}


def spec(config):
    core = _shared.core(config)
    n = core["num_layers"]
    rope = _shared.rope_of(config)
    windows = _shared.windows_from_max_window_layers(config, n)
    return ModelSpec(
        **core, qkv_bias=True, output_bias=False, mlp_bias=False, qk_norm=False,
        final_logit_soft_cap=None,
        layers=_shared.layer_specs(n, rope, windows=windows,
                                   logit_soft_cap=None, scale=None))
