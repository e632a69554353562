"""Hugging Face `transformers` configs read per model family: every field read, refused or ignored.

A config is a `transformers` config object (read through `to_dict()`) or a
plain dict (a `config.json`). Every key of it must be in the family's table:

- `read`: reproduced (each one changes the converted model);
- `neutral`: refused with a `ValueError` naming the field unless it holds its
  neutral value (the one that leaves the computation as keras_attn does it);
- `ignored`: does not change the logits (with the reason, in `IGNORED`).

A key in none of these is refused too ("unknown"), so a field added by a
newer `transformers` cannot be dropped silently. `family_table()` returns the
tables, for the documentation and the tests.
"""

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

__all__ = ["FAMILIES", "LayerSpec", "ModelSpec", "family_table", "read_config"]

# Keys of every `PretrainedConfig` (and of config.json files) that do not change the logits.
IGNORED = {
    "_name_or_path": "metadata", "transformers_version": "metadata",
    "architectures": "metadata (the class names)", "model_type": "read to choose the family",
    "dtype": "the Keras model's dtype policy decides", "torch_dtype": "as `dtype`",
    "id2label": "labels of classification heads", "label2id": "as `id2label`",
    "problem_type": "loss of classification heads", "output_attentions": "what is returned",
    "output_hidden_states": "what is returned", "return_dict": "what is returned",
    "use_return_dict": "what is returned", "torchscript": "how torch exports",
    "chunk_size_feed_forward": "chunking of the MLP: the same values",
    "use_cache": "keras_attn's `generate` always caches", "initializer_range": "initialisation",
    "bos_token_id": "tokenizer ids (pass `end_token_id` to `generate`)",
    "eos_token_id": "as `bos_token_id`", "pad_token_id": "as `bos_token_id`",
    "tie_encoder_decoder": "encoder-decoder models only",
    "max_position_embeddings": "the positions are not limited (yarn's default "
                               "original_max_position_embeddings reads it)",
}
NEUTRAL_ALL = {"is_encoder_decoder": (False, None), "add_cross_attention": (False, None),
               "pruned_heads": ({}, None), "quantization_config": (None,),
               "partial_rotary_factor": (1.0, None)}
_LLAMA_READ = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
               "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_act",
               "rms_norm_eps", "rope_parameters", "rope_theta", "rope_scaling",
               "attention_dropout", "tie_word_embeddings")
_GEMMA_READ = tuple(f for f in _LLAMA_READ if f != "hidden_act") + (
    "hidden_activation", "attention_bias", "query_pre_attn_scalar", "attn_logit_softcapping",
    "final_logit_softcapping", "sliding_window", "layer_types")
FAMILIES: dict[str, dict[str, Any]] = {
    "llama": {"read": _LLAMA_READ + ("attention_bias", "mlp_bias"),
              "ignored": {"pretraining_tp": "transformers 5 ignores it (an exact split of the "
                                            "matmuls in older versions)"}},
    "mistral": {"read": _LLAMA_READ + ("sliding_window",), "ignored": {}},
    "qwen2": {"read": _LLAMA_READ + ("sliding_window", "use_sliding_window", "max_window_layers",
                                     "layer_types"), "ignored": {}},
    "qwen3": {"read": _LLAMA_READ + ("attention_bias", "sliding_window", "use_sliding_window",
                                     "max_window_layers", "layer_types"), "ignored": {}},
    "gemma2": {"read": _GEMMA_READ,
               "neutral": {"use_bidirectional_attention": (False, None)},
               "ignored": {"hidden_act": "Gemma 2's modeling reads `hidden_activation`",
                           "cache_implementation": "how transformers caches"}},
    # transformers' Gemma 3 stores attn_logit_softcapping but never applies it (its attention
    # passes no softcap): refused unless None rather than guessed.
    "gemma3_text": {"read": tuple(f for f in _GEMMA_READ if f != "attn_logit_softcapping") + (
        "rope_local_base_freq", "sliding_window_pattern", "_sliding_window_pattern"),
                    "neutral": {"use_bidirectional_attention": (False, None),
                                "attn_logit_softcapping": (None,)},
                    "ignored": {"hidden_act": "Gemma 3's modeling reads `hidden_activation`",
                                "cache_implementation": "how transformers caches"}},
}
ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu": "gelu",
               "gelu_pytorch_tanh": "gelu_approximate", "gelu_new": "gelu_approximate"}
LAYER_TYPES = ("full_attention", "sliding_attention")
# rope_parameters keys per rope_type -> AttentionOptions field (besides rope_type, rope_theta).
ROPE_KEYS: dict[str, dict[str, str | None]] = {
    "default": {},
    "linear": {"factor": "rope_scaling_factor"},
    "llama3": {"factor": "rope_scaling_factor", "low_freq_factor": "rope_low_freq_factor",
               "high_freq_factor": "rope_high_freq_factor",
               "original_max_position_embeddings": "rope_original_max_position_embeddings"},
    "yarn": {"factor": "rope_scaling_factor", "beta_fast": "rope_beta_fast",
             "beta_slow": "rope_beta_slow", "attention_factor": "rope_attention_factor",
             "original_max_position_embeddings": "rope_original_max_position_embeddings",
             "mscale": None, "mscale_all_dim": None, "truncate": "rope_truncate"},
}

# What transformers requires (it raises a KeyError without them); yarn defaults its own.
REQUIRED_ROPE_KEYS = {"linear": ("factor",), "llama3": tuple(ROPE_KEYS["llama3"])}


@dataclasses.dataclass
class LayerSpec:
    """The keras_attn options of one decoder layer (`TransformerDecoderLayer` keywords)."""

    attention: dict[str, Any]  # AttentionOptions fields: RoPE, window, soft-cap, qk-norm, scale


@dataclasses.dataclass
class ModelSpec:
    """What the config says, in keras_attn's terms (weights are checked against it)."""

    family: str
    vocabulary_size: int
    hidden_dim: int
    intermediate_dim: int
    num_layers: int
    num_heads: int
    num_key_value_heads: int
    head_dim: int
    activation: str
    epsilon: float
    attention_dropout: float
    tie_word_embeddings: bool
    qkv_bias: bool
    output_bias: bool
    mlp_bias: bool
    qk_norm: bool
    final_logit_soft_cap: float | None
    layers: list[LayerSpec]
    # Each field one fact (issue 32: `gemma` meant the first three at once).
    sandwich_norms: bool = False  # norms after attention and MLP too (Gemma 2 and 3)
    norm_offset: float = 0.0  # the norms multiply by `norm_offset + w` (Gemma: 1 + w)
    embedding_scale: float | None = None  # the embeddings times it (Gemma: sqrt(D))
    normalization: str = "rms"  # "rms" (RMSNorm) or "layer" (LayerNorm with a bias)
    gated_feed_forward: bool = True  # gate * up (SwiGLU, GeGLU); False: up then down
    residual_scale: float | None = None  # every residual branch times it (Granite)
    logits_scaling: float | None = None  # the logits divided by it (Granite)


def table_of(fields):
    """A family's `FIELDS` with the fields every config has: `{"read": [...], "neutral":
    {field: values}, "ignored": {field: why}}`."""
    return {"read": sorted(set(fields["read"])),
            "neutral": {**NEUTRAL_ALL, **fields.get("neutral", {})},
            "ignored": {**IGNORED, **fields.get("ignored", {})}}


def family_table():
    """`{model_type: {"read": [...], "neutral": {field: values}, "ignored": {field: why}}}`."""
    from keras_attn.convert import families

    return {name: table_of(families.family(name).FIELDS) for name in families.model_types()}


def _as_dict(config):
    if isinstance(config, Mapping):
        return dict(config)
    to_dict = getattr(config, "to_dict", None)
    if callable(to_dict):
        return dict(to_dict())
    raise ValueError("`config` must be a transformers config or a dict (a config.json). "
                     f"Received: config of type {type(config).__name__}")


def _refuse(field, value, why):
    raise ValueError(f"config field `{field}` is not supported ({why}). Received: "
                     f"{field}={value!r}")


def _positive_int(config, field, default=None):
    value = config.get(field, default)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"config field `{field}` must be a positive integer. "
                         f"Received: {field}={value!r}")
    return value


def _number(config, field, default=None, allow_none=False, positive=True):
    value = config.get(field, default)
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(
            value) or (positive and value <= 0) or value < 0:
        raise ValueError(f"config field `{field}` must be a {'positive' if positive else 'non-negative'} "
                         f"number. Received: {field}={value!r}")
    return float(value)


def check_fields(config, family, fields):
    """Refuse a field of `config` that `fields` (a family's `FIELDS`) does not classify, or a
    neutral one away from its neutral value."""
    table = table_of(fields)
    for field, value in config.items():
        if field in table["read"] or field in table["ignored"]:
            continue
        if field in table["neutral"]:
            if not any(value == neutral and isinstance(value, bool) == isinstance(neutral, bool)
                       for neutral in table["neutral"][field]):
                _refuse(field, value, "keras_attn reproduces only "
                        + " or ".join(repr(v) for v in table["neutral"][field]))
            continue
        _refuse(field, value, f"unknown to keras_attn's {family!r} converter, which refuses "
                "what it does not know to leave the logits unchanged; remove it from a dict "
                "config if it does")


def _rope(params, where, max_positions):
    """AttentionOptions RoPE fields from one `rope_parameters` dict (named `where` in errors)."""
    if not isinstance(params, Mapping):
        _refuse(where, params, "a dict of RoPE parameters is expected")
    params = dict(params)
    rope_type = params.pop("rope_type", params.pop("type", "default"))
    params.pop("type", None)
    if rope_type not in ROPE_KEYS:
        _refuse(f"{where}['rope_type']", rope_type,
                f"keras_attn reproduces the RoPE types {', '.join(map(repr, ROPE_KEYS))}")
    theta = _number(params, "rope_theta", allow_none=True)
    params.pop("rope_theta", None)
    if theta is None:
        _refuse(f"{where}['rope_theta']", None, "the RoPE base is required")
    partial = params.pop("partial_rotary_factor", None)
    if partial not in (None, 1, 1.0):
        _refuse(f"{where}['partial_rotary_factor']", partial, "RoPE over the whole head only")
    options = {"rope_max_wavelength": theta, "rope_type": rope_type}
    keys = ROPE_KEYS[rope_type]
    for key in params:
        if key not in keys:
            _refuse(f"{where}[{key!r}]", params[key],
                    f"not a parameter keras_attn reads for rope_type {rope_type!r}")
    if rope_type == "default":
        return options
    for key in REQUIRED_ROPE_KEYS.get(rope_type, ()):
        if params.get(key) is None:
            _refuse(f"{where}[{key!r}]", params.get(key), f"rope_type {rope_type!r} needs it")
    if rope_type == "yarn":
        # transformers' defaults and truthiness (`beta_fast or 32`, `if mscale and mscale_all_dim`).
        original = params.get("original_max_position_embeddings") or max_positions
        factor = params.get("factor")
        if factor is None and original:
            factor = max_positions / original
        params["factor"], params["original_max_position_embeddings"] = factor, original
        params["beta_fast"] = params.get("beta_fast") or 32.0
        params["beta_slow"] = params.get("beta_slow") or 1.0
        mscale, mscale_all_dim = params.pop("mscale", None), params.pop("mscale_all_dim", None)
        if params.get("attention_factor") is None and factor is not None:

            def get_mscale(scale, m=1.0):
                return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

            params["attention_factor"] = (get_mscale(factor, mscale) / get_mscale(
                factor, mscale_all_dim) if mscale and mscale_all_dim else get_mscale(factor))
    for key, value in params.items():
        field = keys[key]
        if value is None:
            _refuse(f"{where}[{key!r}]", value, f"rope_type {rope_type!r} needs it")
        options[field] = value
    return options


def _rope_by_layer_type(config, family):
    """`{layer_type: rope options}` from `rope_parameters` (5.x) or `rope_theta`/`rope_scaling`."""
    max_positions = config.get("max_position_embeddings")
    params = config.get("rope_parameters")
    if params is not None and "rope_scaling" in config and config["rope_scaling"] is not None:
        _refuse("rope_scaling", config["rope_scaling"],
                "give either `rope_parameters` or the older `rope_scaling`, not both")
    if family == "gemma3_text":
        if params is None:  # an older config.json: rope_scaling applies to the full layers
            scaling = dict(config.get("rope_scaling") or {})
            params = {"full_attention": {"rope_theta": config.get("rope_theta", 1e6), **scaling},
                      "sliding_attention": {"rope_theta": config.get("rope_local_base_freq", 1e4)}}
        elif "rope_local_base_freq" in config or "rope_theta" in config:
            _refuse("rope_local_base_freq" if "rope_local_base_freq" in config else "rope_theta",
                    config.get("rope_local_base_freq", config.get("rope_theta")),
                    "the RoPE bases are in `rope_parameters` already")
        if not isinstance(params, Mapping) or set(params) - set(LAYER_TYPES):
            _refuse("rope_parameters", params, "Gemma 3's is a dict by layer type "
                    "('full_attention', 'sliding_attention')")
        return {kind: _rope(params.get(kind, {"rope_theta": 1e6 if kind == "full_attention" else 1e4}),
                            f"rope_parameters[{kind!r}]", max_positions) for kind in LAYER_TYPES}
    if params is None:
        params = {"rope_theta": config.get("rope_theta", 10000.0),
                  **dict(config.get("rope_scaling") or {})}
        where = "rope_scaling"
    else:
        if "rope_theta" in config and config["rope_theta"] != params.get("rope_theta"):
            _refuse("rope_theta", config["rope_theta"],
                    "it differs from rope_parameters['rope_theta']")
        where = "rope_parameters"
    options = _rope(params, where, max_positions)
    return {kind: options for kind in LAYER_TYPES}


def _layer_types(config, family, num_layers):
    """Each layer's "full_attention" / "sliding_attention", as transformers derives them."""
    window = config.get("sliding_window")
    if family in ("llama",):
        return ["full_attention"] * num_layers, None
    if family == "mistral":
        kind = "full_attention" if window is None else "sliding_attention"
        return [kind] * num_layers, window
    if family in ("qwen2", "qwen3"):
        if not config.get("use_sliding_window", False):
            window = None
    types = config.get("layer_types")
    if types is None:
        if family in ("qwen2", "qwen3"):
            start = config.get("max_window_layers", 28)
            types = ["sliding_attention" if window is not None and i >= start
                     else "full_attention" for i in range(num_layers)]
        else:
            pattern = 2 if family == "gemma2" else config.get(
                "sliding_window_pattern", config.get("_sliding_window_pattern", 6))
            types = ["sliding_attention" if (i + 1) % pattern else "full_attention"
                     for i in range(num_layers)]
    types = list(types)
    if len(types) != num_layers or any(t not in LAYER_TYPES for t in types):
        _refuse("layer_types", types, f"one of {LAYER_TYPES} per layer "
                f"(num_hidden_layers={num_layers})")
    if "sliding_attention" in types and window is None:
        _refuse("sliding_window", window, "layer_types has sliding layers: a window is needed")
    return types, window


def read_config(config):
    """The `ModelSpec` of a transformers config or dict; a `ValueError` for what is refused.

    The family module registered for `config["model_type"]`
    (`keras_attn.convert.families`) checks every field and reads the spec.
    """
    from keras_attn.convert import families  # the registry imports the modules it lists

    config = _as_dict(config)
    module = families.family(config.get("model_type"))
    check_fields(config, module.MODEL_TYPE, module.FIELDS)
    return module.spec(config)


def read_llama_like(config, family):
    """The spec of today's first six families (llama ... gemma3_text), whose family modules
    share this reader (its `family` branches are theirs)."""
    gemma = family.startswith("gemma")
    D = _positive_int(config, "hidden_size")
    H = _positive_int(config, "num_attention_heads")
    kv = config.get("num_key_value_heads")
    H_kv = _positive_int(config, "num_key_value_heads") if kv is not None else H
    if H % H_kv:
        _refuse("num_key_value_heads", H_kv, f"it must divide num_attention_heads={H}")
    head_dim = config.get("head_dim")
    d = _positive_int(config, "head_dim") if head_dim is not None else D // H
    num_layers = _positive_int(config, "num_hidden_layers")
    act_field = "hidden_activation" if gemma else "hidden_act"
    act = config.get(act_field, "gelu_pytorch_tanh" if gemma else "silu")
    if act not in ACTIVATIONS:
        _refuse(act_field, act, f"supported: {', '.join(map(repr, ACTIVATIONS))}")
    epsilon = _number(config, "rms_norm_eps", 1e-6)
    rope = _rope_by_layer_type(config, family)
    types, window = _layer_types(config, family, num_layers)
    if window is not None:
        window = _positive_int({"sliding_window": window}, "sliding_window")
    soft_cap = final_cap = scale = None
    if gemma:
        scale = _number(config, "query_pre_attn_scalar", 256) ** -0.5
        if family == "gemma2":
            soft_cap = _number(config, "attn_logit_softcapping", 50.0, allow_none=True)
        final_cap = _number(config, "final_logit_softcapping",
                            30.0 if family == "gemma2" else None, allow_none=True)
    qk_norm = family in ("qwen3", "gemma3_text")
    layers = []
    for kind in types:
        attention = dict(rope[kind])
        attention["sliding_window"] = window if kind == "sliding_attention" else None
        attention["logit_soft_cap"] = soft_cap
        attention["scale"] = scale
        if qk_norm:
            attention.update(qk_norm="rms", qk_norm_epsilon=epsilon)
        layers.append(LayerSpec(attention))
    attention_bias = bool(config.get("attention_bias", False))
    return ModelSpec(
        family=family, vocabulary_size=_positive_int(config, "vocab_size"), hidden_dim=D,
        intermediate_dim=_positive_int(config, "intermediate_size"), num_layers=num_layers,
        num_heads=H, num_key_value_heads=H_kv, head_dim=d, activation=ACTIVATIONS[act],
        epsilon=epsilon,
        attention_dropout=_number(config, "attention_dropout", 0.0, positive=False),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", gemma)),
        qkv_bias=True if family == "qwen2" else attention_bias,
        output_bias=False if family == "qwen2" else attention_bias,
        mlp_bias=bool(config.get("mlp_bias", False)), qk_norm=qk_norm,
        final_logit_soft_cap=final_cap, layers=layers, sandwich_norms=gemma,
        norm_offset=1.0 if gemma else 0.0, embedding_scale=float(math.sqrt(D)) if gemma else None)
