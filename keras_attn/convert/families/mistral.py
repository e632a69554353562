"""`model_type="mistral"` (Mistral 7B): Llama's layout without biases, and
`sliding_window` (when not None) the window of every block."""

from keras_attn.convert._transformers_config import ModelSpec
from keras_attn.convert.families import _shared

MODEL_TYPE = "mistral"
FIELDS = {
    "read": _shared.CORE_FIELDS + ("hidden_act", "rms_norm_eps", "sliding_window"),
    "neutral": {},
    "ignored": {},
}


def spec(config):
    core = _shared.core(config)
    n = core["num_layers"]
    rope = _shared.rope_of(config)
    window = _shared.window_of(config)
    return ModelSpec(
        **core, qkv_bias=False, output_bias=False, mlp_bias=False, qk_norm=False,
        final_logit_soft_cap=None,
        layers=_shared.layer_specs(n, rope, windows=[window] * n, logit_soft_cap=None,
                                   scale=None))
