"""`model_type="mistral"` (Mistral 7B): Llama's layout without biases, and
`sliding_window` (when not None) the window of every block."""

from keras_attn.convert._transformers_config import ModelSpec
from keras_attn.convert.families import _shared

MODEL_TYPE = "mistral"
ARCHITECTURES = ("MistralForCausalLM", "MistralModel")  # transformers' classes (`architectures`)
FIELDS = {
    "read": _shared.CORE_FIELDS + ("hidden_act", "rms_norm_eps", "sliding_window"),
    "neutral": {},
    "ignored": {},
}


# transformers 5.24's defaults for fields a config.json may leave out, where they differ
# from what `_shared.core` assumes (tests/convert/test_config_defaults.py compares).
_DEFAULTS = {"num_key_value_heads": 8, "sliding_window": 4096}


def spec(config):
    config = {**_DEFAULTS, **config}
    core = _shared.core(config)
    n = core["num_layers"]
    rope = _shared.rope_of(config)
    window = _shared.window_of(config)
    return ModelSpec(
        **core, qkv_bias=False, output_bias=False, mlp_bias=False, qk_norm=False,
        final_logit_soft_cap=None,
        layers=_shared.layer_specs(n, rope, windows=[window] * n, logit_soft_cap=None,
                                   scale=None))
