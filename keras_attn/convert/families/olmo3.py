"""`model_type="olmo3"` (OLMo 3): OLMo 2's block (no norm before the sublayers, the
norms after them; full-width qk-norm) with "sliding_attention" / "full_attention" blocks
(`layer_types`; without it every 4th block full, as transformers derives) and a RoPE per
layer type (`rope_parameters` a dict by layer type; a flat one applies to both)."""

from collections.abc import Mapping

from keras_attn.convert._transformers_config import LAYER_TYPES, ModelSpec, _rope
from keras_attn.convert.families import _shared

MODEL_TYPE = "olmo3"
ARCHITECTURES = ("Olmo3ForCausalLM", "Olmo3Model")  # transformers' classes (`architectures`)
FIELDS = {
    "read": _shared.CORE_FIELDS + ("hidden_act", "rms_norm_eps", "attention_bias",
                                   "sliding_window", "layer_types"),
    "neutral": {},
    "ignored": {},
}
DEFAULT_THETA = 500000.0  # Olmo3Config.default_theta
DEFAULT_WINDOW = 4096  # Olmo3Config.sliding_window


def rope_by_layer_type(config):
    """`{layer_type: rope options}`: `rope_parameters` by layer type (transformers 5's
    form), a flat `rope_parameters` for both, or the older `rope_theta` / `rope_scaling`
    (transformers applies `rope_scaling` to the full blocks only)."""
    params = config.get("rope_parameters")
    max_positions = config.get("max_position_embeddings")
    if params is None:
        theta = config.get("rope_theta", DEFAULT_THETA)
        params = {"full_attention": {"rope_theta": theta, **dict(config.get("rope_scaling") or {})},
                  "sliding_attention": {"rope_theta": theta}}
    elif config.get("rope_scaling") is not None or "rope_theta" in config:
        field = "rope_scaling" if config.get("rope_scaling") is not None else "rope_theta"
        _shared.refuse(field, config[field], "the RoPE is in `rope_parameters` already")
    if not isinstance(params, Mapping):
        _shared.refuse("rope_parameters", params, "a dict (by layer type, or one for both)")
    if not set(params) & set(LAYER_TYPES):  # one RoPE for both kinds of block
        params = {kind: params for kind in LAYER_TYPES}
    elif set(params) - set(LAYER_TYPES):
        _shared.refuse("rope_parameters", params, f"a dict by layer type {LAYER_TYPES}")
    return {kind: _rope({"rope_theta": DEFAULT_THETA, **dict(params.get(kind) or {})},
                        f"rope_parameters[{kind!r}]", max_positions) for kind in LAYER_TYPES}


def spec(config):
    core = _shared.core(config, default_epsilon=1e-5)
    n = core["num_layers"]
    # Olmo3Config's default window (4096) when a config.json has none.
    window = _shared.window_of({"sliding_window": DEFAULT_WINDOW, **config})
    types = config.get("layer_types")
    if types is None:  # transformers' derivation: every 4th block full
        types = _shared.every_nth_full(n, 4)
    types = _shared.checked_layer_types(types, n, window)
    rope = rope_by_layer_type(config)
    bias = bool(config.get("attention_bias", False))
    return ModelSpec(
        **core, qkv_bias=bias, output_bias=bias, mlp_bias=False, qk_norm=True,
        final_logit_soft_cap=None, input_norms=False,
        layers=_shared.layer_specs(n, [rope[kind] for kind in types],
                                   windows=_shared.sliding_windows(types, window),
                                   qk_norm="rms", qk_norm_epsilon=core["epsilon"],
                                   qk_norm_full_width=True))
