"""`model_type="smollm3"` (SmolLM3): Llama's layout where some blocks have no RoPE
(`no_rope_layers[i] == 0`; derived by transformers from `no_rope_layer_interval` when
absent), and, with `use_sliding_window`, a window on the "sliding_attention" blocks."""

from keras_attn.convert._transformers_config import ModelSpec, _positive_int
from keras_attn.convert.families import _shared

MODEL_TYPE = "smollm3"
ARCHITECTURES = ("SmolLM3ForCausalLM", "SmolLM3Model")  # transformers' classes (`architectures`)
FIELDS = {
    "read": _shared.CORE_FIELDS + ("hidden_act", "rms_norm_eps", "attention_bias", "mlp_bias",
                                   "no_rope_layers", "no_rope_layer_interval",
                                   "use_sliding_window", "sliding_window", "layer_types"),
    "neutral": {},
    "ignored": {},
}


# transformers 5.24's defaults for fields a config.json may leave out, where they differ
# from what `_shared.core` assumes (tests/convert/test_config_defaults.py compares).
_DEFAULTS = {"num_key_value_heads": 4, "tie_word_embeddings": True}


def spec(config):
    config = {**_DEFAULTS, **config}
    core = _shared.core(config)
    n = core["num_layers"]
    uses_rope = config.get("no_rope_layers")
    if uses_rope is None:  # transformers' default, from the interval
        interval = _positive_int(config, "no_rope_layer_interval", 4)
        uses_rope = [int((i + 1) % interval != 0) for i in range(n)]
    if len(uses_rope) != n or any(v not in (0, 1) for v in uses_rope):
        _shared.refuse("no_rope_layers", uses_rope,
                       f"one 0 (no RoPE) or 1 (RoPE) per layer (num_hidden_layers={n})")
    window = _shared.window_of(config) if config.get("use_sliding_window", False) else None
    types = config.get("layer_types")
    if types is None:
        types = ["sliding_attention" if window is not None and not uses_rope[i]
                 else "full_attention" for i in range(n)]
    elif window is not None:
        types = _shared.layer_types(config, n, window)
    else:
        types = _shared.checked_layer_types(types, n, None)  # sliding ones refused:
        # transformers' attention drops the window there, its sliding mask keeps it
    bias = bool(config.get("attention_bias", False))
    return ModelSpec(
        **core, qkv_bias=bias, output_bias=bias, mlp_bias=bool(config.get("mlp_bias", False)),
        qk_norm=False, final_logit_soft_cap=None,
        layers=_shared.layer_specs(n, _shared.rope_of(config, default_theta=2000000.0), uses_rope=uses_rope,
                                   windows=_shared.sliding_windows(types, window)))
