"""`model_type="gemma"` (Gemma 1): RMSNorm weights stored as `w` for `1 + w`, the
embeddings times sqrt(D), GeGLU (`hidden_act`, tanh-GELU by default), multi-query
attention in the 2B model; no sandwich norms, no soft-caps, the default logit scale."""

import math

from keras_attn.convert._transformers_config import ModelSpec
from keras_attn.convert.families import _shared

MODEL_TYPE = "gemma"
ARCHITECTURES = ("GemmaForCausalLM", "GemmaModel")  # transformers' classes (`architectures`)
FIELDS = {
    "read": _shared.CORE_FIELDS + ("hidden_act", "rms_norm_eps", "attention_bias"),
    "neutral": {"use_bidirectional_attention": (False, None)},
    "ignored": {"hidden_activation": "Gemma 1's modeling reads `hidden_act`"},
}


# transformers 5.24's defaults for fields a config.json may leave out, where they differ
# from what `_shared.core` assumes (tests/convert/test_config_defaults.py compares).
_DEFAULTS = {"head_dim": 256}


def spec(config):
    config = {**_DEFAULTS, **config}
    core = _shared.core(config, default_activation="gelu_pytorch_tanh", tie_default=True)
    bias = bool(config.get("attention_bias", False))
    return ModelSpec(
        **core, qkv_bias=bias, output_bias=bias, mlp_bias=False, qk_norm=False,
        final_logit_soft_cap=None, norm_offset=1.0,
        # transformers casts sqrt(D) to the activations' dtype (exact for float32).
        embedding_scale=float(math.sqrt(core["hidden_dim"])),
        layers=_shared.layer_specs(core["num_layers"], _shared.rope_of(config)))
