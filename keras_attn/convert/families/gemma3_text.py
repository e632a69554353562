"""`model_type="gemma3_text"` (Gemma 3, the text model): Gemma 2's layout with qk-norm
(`q_norm` / `k_norm`, weights `w` for `1 + w`) and no attention soft-cap (transformers
stores `attn_logit_softcapping` but never applies it: refused unless None rather than
guessed), a RoPE of its own per layer type (`rope_parameters` a dict by
"full_attention" / "sliding_attention"; in older configs `rope_theta` and
`rope_scaling` for the full blocks, `rope_local_base_freq` for the sliding ones; beside
`rope_parameters`, as keras-hub's exporter writes them, accepted only where they agree), and
without `layer_types` every `sliding_window_pattern`-th block full (6 by default)."""

import math
from collections.abc import Mapping

from keras_attn.convert._transformers_config import (
    LAYER_TYPES,
    ModelSpec,
    _number,
    _refuse,
    _rope,
)
from keras_attn.convert.families import _shared

MODEL_TYPE = "gemma3_text"
ARCHITECTURES = ("Gemma3ForCausalLM", "Gemma3TextModel")  # transformers' classes (`architectures`)
FIELDS = {
    "read": _shared.CORE_FIELDS + ("rms_norm_eps", "hidden_activation", "attention_bias",
                                   "query_pre_attn_scalar", "final_logit_softcapping",
                                   "sliding_window", "layer_types", "rope_local_base_freq",
                                   "sliding_window_pattern"),
    "neutral": {"use_bidirectional_attention": (False, None),
                "attn_logit_softcapping": (None,)},
    "ignored": {"hidden_act": "Gemma 3's modeling reads `hidden_activation`",
                "_sliding_window_pattern": ("a private attribute transformers writes and "
                                            "does not read back: without `layer_types` it derives them "
                                            "from `sliding_window_pattern` (6 by default), as here"),
                "cache_implementation": "how transformers caches"},
}


def rope_by_layer_type(config):
    """`{layer_type: rope options}` from `rope_parameters` (a dict by layer type) or, in an
    older config.json, `rope_theta` / `rope_scaling` (full) and `rope_local_base_freq`
    (sliding)."""
    max_positions = config.get("max_position_embeddings")
    params = config.get("rope_parameters")
    if params is not None and config.get("rope_scaling") is not None:
        _refuse("rope_scaling", config["rope_scaling"],
                "give either `rope_parameters` or the older `rope_scaling`, not both")
    if params is None:  # an older config.json: rope_scaling applies to the full layers
        scaling = dict(config.get("rope_scaling") or {})
        params = {"full_attention": {"rope_theta": config.get("rope_theta", 1e6), **scaling},
                  "sliding_attention": {"rope_theta": config.get("rope_local_base_freq", 1e4)}}
    else:  # beside `rope_parameters` (keras-hub's exporter writes both): only if they agree
        for field, kind in (("rope_theta", "full_attention"),
                            ("rope_local_base_freq", "sliding_attention")):
            given = params.get(kind) if isinstance(params, Mapping) else None
            theta = given.get("rope_theta") if isinstance(given, Mapping) else None
            if field in config and config[field] != theta:
                raise ValueError(
                    f"config fields `{field}` and `rope_parameters` disagree (the RoPE base "
                    f"of the {kind!r} layers is in both). Received: {field}="
                    f"{config[field]!r} and rope_parameters[{kind!r}]['rope_theta']={theta!r}")
    if not isinstance(params, Mapping) or set(params) - set(LAYER_TYPES):
        _refuse("rope_parameters", params, "Gemma 3's is a dict by layer type "
                "('full_attention', 'sliding_attention')")
    return {kind: _rope(params.get(kind, {"rope_theta": 1e6 if kind == "full_attention" else 1e4}),
                        f"rope_parameters[{kind!r}]", max_positions) for kind in LAYER_TYPES}


# transformers 5.24's defaults for fields a config.json may leave out, where they differ
# from what `_shared.core` assumes (tests/convert/test_config_defaults.py compares).
_DEFAULTS = {"num_key_value_heads": 4, "head_dim": 256}


def spec(config):
    config = {**_DEFAULTS, **config}
    core = _shared.core(config, activation_field="hidden_activation",
                        default_activation="gelu_pytorch_tanh", tie_default=True)
    n = core["num_layers"]
    rope = rope_by_layer_type(config)
    window = _shared.window_of(config)
    types = config.get("layer_types")
    if types is None:
        types = _shared.every_nth_full(n, config.get(
            "sliding_window_pattern", 6))
    types = _shared.checked_layer_types(types, n, window)
    scale = _number(config, "query_pre_attn_scalar", 256) ** -0.5
    final_cap = _number(config, "final_logit_softcapping", None, allow_none=True)
    bias = bool(config.get("attention_bias", False))
    return ModelSpec(
        **core, qkv_bias=bias, output_bias=bias, mlp_bias=False, qk_norm=True,
        final_logit_soft_cap=final_cap, sandwich_norms=True, norm_offset=1.0,
        # transformers casts sqrt(D) to the activations' dtype (exact for float32).
        embedding_scale=float(math.sqrt(core["hidden_dim"])),
        layers=_shared.layer_specs(n, [rope[kind] for kind in types],
                                   windows=_shared.sliding_windows(types, window),
                                   logit_soft_cap=None, scale=scale, qk_norm="rms",
                                   qk_norm_epsilon=core["epsilon"]))
