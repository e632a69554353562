"""`model_type="glm4"` (GLM-4): partial rotary (`partial_rotary_factor`, 0.5 by default)
with the interleaved pairing within the rotated slice, sandwich norms (after attention
and after the MLP too) with plain RMSNorm weights, biases on the query, key and value
projections only (`attention_bias`), and a fused `gate_up_proj` split on load.

transformers names the four norms of a block `input_layernorm`, `post_self_attn_layernorm`
(after attention), `post_attention_layernorm` (before the MLP) and `post_mlp_layernorm`;
they are renamed into the sandwich layout the converter maps (Gemma 2's names), and back
(with `gate_up_proj` fused again) by `checkpoint_state_dict` when writing a checkpoint.
"""

import numpy as np

from keras_attn.convert._transformers_config import ModelSpec
from keras_attn.convert.families import _shared

MODEL_TYPE = "glm4"
ARCHITECTURES = ("Glm4ForCausalLM", "Glm4Model")  # transformers' classes (`architectures`)
FIELDS = {
    "read": _shared.CORE_FIELDS + ("hidden_act", "rms_norm_eps", "attention_bias",
                                   "partial_rotary_factor"),
    "neutral": {},
    "ignored": {},
}

# transformers' GLM-4 norm -> the sandwich layout's (mapped by convert/transformers.py).
_NORMS = {"post_self_attn_layernorm": "post_attention_layernorm",
          "post_attention_layernorm": "pre_feedforward_layernorm",
          "post_mlp_layernorm": "post_feedforward_layernorm"}


# transformers 5.24's defaults for fields a config.json may leave out, where they differ
# from what `_shared.core` assumes (tests/convert/test_config_defaults.py compares).
_DEFAULTS = {"num_key_value_heads": 2, "rms_norm_eps": 1.5625e-07}


def spec(config):
    config = {**_DEFAULTS, **config}
    core = _shared.core(config, tie_default=False)
    # GLM-4's default is 0.5 (its config sets it when absent); transformers' standardised
    # config carries it in rope_parameters.
    config = {"partial_rotary_factor": 0.5, **config}
    rope = {**_shared.rope_of(config, partial_rotary=True), "rope_interleaved": True}
    return ModelSpec(
        **core, qkv_bias=bool(config.get("attention_bias", True)), output_bias=False,
        mlp_bias=False, qk_norm=False, final_logit_soft_cap=None, sandwich_norms=True,
        layers=_shared.layer_specs(core["num_layers"], rope))


def canonical_state_dict(entries, spec):
    """The fused `gate_up_proj` split; the norms renamed into the sandwich layout."""
    renamed = {}
    for key, value in entries.items():
        if isinstance(key, str):
            for old, new in _NORMS.items():
                if f".{old}." in key:
                    key = key.replace(f".{old}.", f".{new}.")
                    break
        renamed[key] = value
    return _shared.split_gate_up(renamed, spec.intermediate_dim)


def checkpoint_state_dict(tensors, spec):
    """The inverse of `canonical_state_dict` (for writing a checkpoint): `gate_proj` and
    `up_proj` fused back into `gate_up_proj` (gate rows first, as transformers' `chunk(2)`
    splits them), the sandwich layout's norms under GLM-4's names."""
    back = {new: old for old, new in _NORMS.items()}
    out = {}
    for key, value in tensors.items():
        if key.endswith(".mlp.up_proj.weight"):
            continue  # fused with its gate_proj below
        if key.endswith(".mlp.gate_proj.weight"):
            prefix = key[:-len("gate_proj.weight")]
            out[prefix + "gate_up_proj.weight"] = np.concatenate(
                [value, tensors[prefix + "up_proj.weight"]], axis=0)
            continue
        for new, old in back.items():
            if f".{new}." in key:
                key = key.replace(f".{new}.", f".{old}.")
                break
        out[key] = value
    return out
