"""`model_type="gemma2"` (Gemma 2): sandwich norms (after attention and after the MLP
too), RMSNorm weights stored as `w` for `1 + w`, the embeddings times sqrt(D), GeGLU
(`hidden_activation`), the logit scale `query_pre_attn_scalar ** -0.5`, soft-caps on the
attention logits (`attn_logit_softcapping`) and the final ones
(`final_logit_softcapping`), and a window on the "sliding_attention" blocks (without
`layer_types`: every other block, the first sliding)."""

import math

from keras_attn.convert._transformers_config import ModelSpec, _number
from keras_attn.convert.families import _shared

MODEL_TYPE = "gemma2"
ARCHITECTURES = ("Gemma2ForCausalLM", "Gemma2Model")  # transformers' classes (`architectures`)
FIELDS = {
    "read": _shared.CORE_FIELDS + ("rms_norm_eps", "hidden_activation", "attention_bias",
                                   "query_pre_attn_scalar", "attn_logit_softcapping",
                                   "final_logit_softcapping", "sliding_window", "layer_types"),
    "neutral": {"use_bidirectional_attention": (False, None)},
    "ignored": {"hidden_act": "Gemma 2's modeling reads `hidden_activation`",
                "cache_implementation": "how transformers caches"},
}


# transformers 5.24's defaults for fields a config.json may leave out, where they differ
# from what `_shared.core` assumes (tests/convert/test_config_defaults.py compares).
_DEFAULTS = {"num_key_value_heads": 4, "head_dim": 256}
# transformers 4.45's Gemma2Config defaults where 5's differ: left out of a 4.x config.json,
# they are refused by name (`_shared.refuse_changed_defaults`).
_DEFAULTS_4 = {"num_key_value_heads": 16, "query_pre_attn_scalar": 224}


def spec(config):
    _shared.refuse_changed_defaults(config, _DEFAULTS_4)
    config = {**_DEFAULTS, **config}
    core = _shared.core(config, activation_field="hidden_activation",
                        default_activation="gelu_pytorch_tanh", tie_default=True)
    n = core["num_layers"]
    rope = _shared.rope_of(config)
    window = _shared.window_of(config)
    types = config.get("layer_types")
    if types is None:
        types = _shared.every_nth_full(n, 2)
    types = _shared.checked_layer_types(types, n, window)
    scale = _number(config, "query_pre_attn_scalar", 256) ** -0.5
    soft_cap = _number(config, "attn_logit_softcapping", 50.0, allow_none=True)
    final_cap = _number(config, "final_logit_softcapping", 30.0, allow_none=True)
    bias = bool(config.get("attention_bias", False))
    return ModelSpec(
        **core, qkv_bias=bias, output_bias=bias, mlp_bias=False, qk_norm=False,
        final_logit_soft_cap=final_cap, sandwich_norms=True, norm_offset=1.0,
        # transformers casts sqrt(D) to the activations' dtype (exact for float32).
        embedding_scale=float(math.sqrt(core["hidden_dim"])),
        layers=_shared.layer_specs(n, rope, windows=_shared.sliding_windows(types, window),
                                   logit_soft_cap=soft_cap, scale=scale))
