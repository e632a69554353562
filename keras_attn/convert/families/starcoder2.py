"""`model_type="starcoder2"` (StarCoder 2): LayerNorm with a bias, a non-gated tanh-GELU
MLP (`c_fc`, `c_proj`), biases on every projection (`use_bias`), a sliding window.

The MLP's `c_fc` / `c_proj` map to keras_attn's `intermediate_dense` / `output_dense`
(renamed here to the Llama layout's `up_proj` / `down_proj`, which the converter maps).
"""

from keras_attn.convert._transformers_config import ModelSpec, _number
from keras_attn.convert.families import _shared

MODEL_TYPE = "starcoder2"
ARCHITECTURES = ("Starcoder2ForCausalLM", "Starcoder2Model")  # transformers' classes (`architectures`)
FIELDS = {
    "read": _shared.CORE_FIELDS + ("hidden_act", "norm_epsilon", "use_bias", "sliding_window"),
    "neutral": {},
    "ignored": {"residual_dropout": "dropout while training only (inference: identity)",
                "embedding_dropout": "dropout while training only (inference: identity)"},
}


# transformers 5.24's defaults for fields a config.json may leave out, where they differ
# from what `_shared.core` assumes (tests/convert/test_config_defaults.py compares).
_DEFAULTS = {"num_key_value_heads": 2}


def spec(config):
    config = {**_DEFAULTS, **config}
    core = _shared.core(config, default_activation="gelu_pytorch_tanh",
                        epsilon_field="norm_epsilon", default_epsilon=1e-5, tie_default=True)
    window = _shared.window_of(config)
    bias = bool(config.get("use_bias", True))
    for field in ("residual_dropout", "embedding_dropout"):
        _number(config, field, 0.0, positive=False)  # checked, applied only in training
    return ModelSpec(
        **core, qkv_bias=bias, output_bias=bias, mlp_bias=bias, qk_norm=False,
        final_logit_soft_cap=None, normalization="layer", gated_feed_forward=False,
        layers=_shared.layer_specs(core["num_layers"], _shared.rope_of(config),
                                   windows=[window] * core["num_layers"]))


def canonical_state_dict(entries, spec):
    """`mlp.c_fc` / `mlp.c_proj` under their Llama-layout names (`up_proj`, `down_proj`)."""
    renamed = {}
    for key, value in entries.items():
        for old, new in ((".mlp.c_fc.", ".mlp.up_proj."), (".mlp.c_proj.", ".mlp.down_proj.")):
            if isinstance(key, str) and (old in key or key.startswith(old[1:])):
                key = key.replace(old, new) if old in key else new[1:] + key[len(old) - 1:]
        renamed[key] = value
    return renamed


def checkpoint_state_dict(entries, spec):
    """The inverse of `canonical_state_dict` (for writing a checkpoint): `up_proj` /
    `down_proj` back to `mlp.c_fc` / `mlp.c_proj`."""
    renamed = {}
    for key, value in entries.items():
        for new, old in ((".mlp.c_fc.", ".mlp.up_proj."), (".mlp.c_proj.", ".mlp.down_proj.")):
            key = key.replace(old, new)
        renamed[key] = value
    return renamed
