"""`model_type="granite"` (IBM Granite 3): Llama's layout with four multipliers, each a
first-class keras_attn option (not folded into the weights, so training sees them as
transformers does): `attention_multiplier` is the logit scale (AttentionOptions
`scale`), `embedding_multiplier` the embedding scale (CausalLM `embedding_scale`),
`residual_multiplier` every residual branch's (the blocks' `residual_scale`), and
`logits_scaling` divides the logits (CausalLM `logits_scaling`)."""

from keras_attn.convert._transformers_config import ModelSpec, _number
from keras_attn.convert.families import _shared

MODEL_TYPE = "granite"
ARCHITECTURES = ("GraniteForCausalLM", "GraniteModel")  # transformers' classes (`architectures`)
FIELDS = {
    "read": _shared.CORE_FIELDS + ("hidden_act", "rms_norm_eps", "attention_bias", "mlp_bias",
                                   "attention_multiplier", "embedding_multiplier",
                                   "residual_multiplier", "logits_scaling"),
    "neutral": {},
    "ignored": {},
}


# transformers 5.24's defaults for fields a config.json may leave out, where they differ
# from what `_shared.core` assumes (tests/convert/test_config_defaults.py compares).
_DEFAULTS = {"tie_word_embeddings": False}


def spec(config):
    config = {**_DEFAULTS, **config}
    core = _shared.core(config, tie_default=True)
    bias = bool(config.get("attention_bias", False))
    scale = _number(config, "attention_multiplier", 1.0)
    return ModelSpec(
        **core, qkv_bias=bias, output_bias=bias, mlp_bias=bool(config.get("mlp_bias", False)),
        qk_norm=False, final_logit_soft_cap=None,
        embedding_scale=_number(config, "embedding_multiplier", 1.0),
        residual_scale=_number(config, "residual_multiplier", 1.0),
        logits_scaling=_number(config, "logits_scaling", 1.0),
        layers=_shared.layer_specs(core["num_layers"], _shared.rope_of(config), scale=scale))
