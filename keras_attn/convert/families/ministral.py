"""`model_type="ministral"` (Ministral 8B): Mistral's layout with `layer_types`, each
block's window its own (`sliding_window` on the "sliding_attention" blocks, none on the
"full_attention" ones)."""

from keras_attn.convert._transformers_config import ModelSpec
from keras_attn.convert.families import _shared

MODEL_TYPE = "ministral"
ARCHITECTURES = ("MinistralForCausalLM", "MinistralModel")  # transformers' classes (`architectures`)
FIELDS = {
    "read": _shared.CORE_FIELDS + ("hidden_act", "rms_norm_eps", "sliding_window",
                                   "layer_types"),
    "neutral": {},
    "ignored": {},
}


# transformers 5.24's defaults for fields a config.json may leave out, where they differ
# from what `_shared.core` assumes (tests/convert/test_config_defaults.py compares).
_DEFAULTS = {"num_key_value_heads": 8}


def spec(config):
    config = {**_DEFAULTS, **config}
    core = _shared.core(config)
    n, window = core["num_layers"], _shared.window_of(config)
    types = (_shared.layer_types(config, n, window) if config.get("layer_types") is not None
             else ["sliding_attention" if window is not None else "full_attention"] * n)
    return ModelSpec(
        **core, qkv_bias=False, output_bias=False, mlp_bias=False, qk_norm=False,
        final_logit_soft_cap=None,
        layers=_shared.layer_specs(n, _shared.rope_of(config),
                                   windows=_shared.sliding_windows(types, window)))
