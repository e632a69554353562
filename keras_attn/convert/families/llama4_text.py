"""`model_type="llama4_text"` (the text model of Llama 4 Scout and Maverick: transformers'
`Llama4TextConfig`, `Llama4ForCausalLM`), field by field as `Llama4TextAttention`,
`Llama4TextMoe` and `Llama4TextDecoderLayer` compute it:

- RoPE layers (`no_rope_layers[i] == 1`): RoPE as complex numbers over consecutive
  pairs (`apply_rotary_emb`'s `view_as_complex`: features (2i, 2i + 1)),
  `rope_interleaved=True`; with `use_qk_norm`, `Llama4TextL2Norm(rms_norm_eps)` on the
  queries and keys after RoPE, no weights (`qk_norm="l2"`: keras_attn normalises before
  RoPE, the same numbers, as RoPE keeps each head's mean square);
- NoPE layers (`no_rope_layers[i] == 0`, every `no_rope_layer_interval`-th layer when it is
  not given): no RoPE, no qk-norm; with `attn_temperature_tuning`, the queries at absolute
  position p times `log(floor((p + 1) / floor_scale) + 1) * attn_scale + 1`
  (`query_scale_beta=attn_scale`, `query_scale_length=floor_scale`,
  `query_scale_offset=1`; over a cache, p from the cache index, as transformers'
  `cache.get_seq_length`);
- `layer_types` "chunked_attention" (transformers derives it for the RoPE layers when
  `attention_chunk_size` is set): chunked attention, `attention_chunk_size`;
  "full_attention": causal over every position;
- the feed-forward of the layers in `moe_layers` (every `interleave_moe_layer_step`-th
  when it is None) a mixture of `num_local_experts` SwiGLU experts of width
  `intermediate_size`, `num_experts_per_tok` per token, routed by `Llama4Router`: the
  sigmoid of the top-k logits scaling each chosen expert's input
  (`MixtureOfExperts(routing="llama4_sigmoid_topk")`), plus a shared expert of width
  `intermediate_size` every token runs; the other layers a dense SwiGLU MLP of width
  `intermediate_size_mlp` (`ModelSpec.intermediate_dim`);
- `attention_bias` on q, k, v and o; the softmax scale `head_dim ** -0.5`.

Weights (renamed by `canonical_state_dict` into the layout the converter maps, and back by
`checkpoint_state_dict`): `feed_forward.router.weight` `(E, D)` is `mlp.gate.weight`;
`feed_forward.experts.gate_up_proj` `(E, D, 2F)` (gate columns first) and `down_proj`
`(E, F, D)` are transformers 5's fused `mlp.experts.gate_up_proj` `(E, 2F, D)` and
`down_proj` `(E, D, F)` transposed; `feed_forward.shared_expert.*` is
`mlp.shared_expert.*`; a dense layer's `feed_forward.{gate,up,down}_proj` is `mlp.*`.

The multimodal `llama4` (`Llama4ForConditionalGeneration`: a vision tower and projector,
the text weights under `language_model.`) is refused (`families.REFUSED`).
"""

import numpy as np

from keras_attn.convert import _common
from keras_attn.convert._transformers_config import ModelSpec, _positive_int
from keras_attn.convert.families import _shared

MODEL_TYPE = "llama4_text"
ARCHITECTURES = ("Llama4ForCausalLM", "Llama4TextModel")  # transformers' classes (`architectures`)
FIELDS = {
    "read": _shared.CORE_FIELDS + (
        "hidden_act", "rms_norm_eps", "attention_bias", "intermediate_size_mlp",
        "num_local_experts", "num_experts_per_tok", "moe_layers", "interleave_moe_layer_step",
        "use_qk_norm", "no_rope_layers", "no_rope_layer_interval", "attention_chunk_size",
        "layer_types", "attn_temperature_tuning", "floor_scale", "attn_scale"),
    "neutral": {},
    "ignored": {
        **_shared.ROUTER_TRAINING_FIELDS,
        "router_jitter_noise": "not read by transformers' Llama4TextMoe (no noise in "
                               "training either); the logits are the same",
    },
}

# Llama4TextConfig's defaults for the fields left out of a dict config.
_DEFAULTS = {"vocab_size": 202048, "hidden_size": 5120, "intermediate_size": 8192,
             "intermediate_size_mlp": 16384, "num_hidden_layers": 48,
             "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128,
             "rms_norm_eps": 1e-5, "num_experts_per_tok": 1, "num_local_experts": 16,
             "interleave_moe_layer_step": 1, "use_qk_norm": True, "no_rope_layer_interval": 4,
             "attention_chunk_size": 8192, "attn_temperature_tuning": True,
             "floor_scale": 8192, "attn_scale": 0.1, "attention_bias": False,
             "tie_word_embeddings": False}
_LAYER_TYPES = ("chunked_attention", "full_attention")
SHARED_EXPERT_PREFIX = "mlp.shared_expert."


def _flag(config, field):
    value = config.get(field)
    if not isinstance(value, bool):
        _shared.refuse(field, value, "True or False is needed")
    return value


def _uses_rope(config, n):
    """`no_rope_layers` (1: RoPE, 0: NoPE) for the n layers, or transformers' derivation."""
    flags = config.get("no_rope_layers")
    if not flags:  # Llama4TextConfig: a NoPE layer every no_rope_layer_interval layers
        interval = _positive_int(config, "no_rope_layer_interval")
        return [bool((i + 1) % interval) for i in range(n)]
    if not isinstance(flags, (list, tuple)) or len(flags) < n or any(
            f not in (0, 1) or isinstance(f, float) for f in flags):
        _shared.refuse("no_rope_layers", flags, f"a 1 (RoPE) or 0 (NoPE) for each of the "
                       f"num_hidden_layers={n} layers is needed")
    return [bool(f) for f in flags[:n]]


def _layer_types(config, n, uses_rope, chunk):
    types = config.get("layer_types")
    if types is None:
        types = ["chunked_attention" if rope and chunk is not None else "full_attention"
                 for rope in uses_rope]
    if not isinstance(types, (list, tuple)) or len(types) != n or any(
            t not in _LAYER_TYPES for t in types):
        _shared.refuse("layer_types", types, f"one of {_LAYER_TYPES} per layer "
                       f"(num_hidden_layers={n})")
    if "chunked_attention" in types and chunk is None:
        _shared.refuse("attention_chunk_size", chunk,
                       "layer_types has chunked layers: a chunk size is needed")
    return list(types)


def _moe_layers(config, n):
    layers = config.get("moe_layers")
    if layers is None:
        step = _positive_int(config, "interleave_moe_layer_step")
        return set(range(step - 1, n, step))
    if not isinstance(layers, (list, tuple)) or not all(
            isinstance(i, int) and not isinstance(i, bool) and 0 <= i < n for i in layers):
        _shared.refuse("moe_layers", layers, f"layer indices in [0, {n}) are needed")
    return set(layers)


def _temperature(config):
    """The NoPE layers' query-scale options (none without `attn_temperature_tuning`)."""
    if not _flag(config, "attn_temperature_tuning"):
        return {}
    beta = config.get("attn_scale")
    if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not beta >= 0:
        _shared.refuse("attn_scale", beta, "the temperature's strength: a number >= 0")
    if beta == 0:  # the scale is 1 everywhere
        return {}
    return {"query_scale_beta": float(beta),
            "query_scale_length": _positive_int(config, "floor_scale"),
            "query_scale_offset": 1}


def spec(config):
    config = {**_DEFAULTS, **config}
    core = _shared.core(config, default_epsilon=1e-5)
    n = core["num_layers"]
    chunk = config.get("attention_chunk_size")
    chunk = None if chunk is None else _positive_int(config, "attention_chunk_size")
    uses_rope = _uses_rope(config, n)
    types = _layer_types(config, n, uses_rope, chunk)
    rope = _shared.check_rotary_width(
        dict(_shared.rope_of(config, default_theta=500000.0), rope_interleaved=True),
        core["head_dim"], "rope_parameters")
    qk_norm = ({"qk_norm": "l2", "qk_norm_epsilon": core["epsilon"]}
               if _flag(config, "use_qk_norm") else {})
    temperature = _temperature(config)
    layers = _shared.layer_specs(n, rope, uses_rope=uses_rope)
    experts = _positive_int(config, "num_local_experts")
    k = _positive_int(config, "num_experts_per_tok")
    if k > experts:
        _shared.refuse("num_experts_per_tok", k, f"at most num_local_experts={experts}")
    moe = _moe_layers(config, n)
    for i, layer in enumerate(layers):
        layer.attention.update(qk_norm if uses_rope[i] else temperature)
        if types[i] == "chunked_attention":
            layer.attention["attention_chunk_size"] = chunk
        if i in moe:
            layer.mixture_of_experts = dict(
                num_experts=experts, num_experts_per_tok=k,
                intermediate_dim=core["intermediate_dim"], routing="llama4_sigmoid_topk",
                shared_intermediate_dim=core["intermediate_dim"])
    bias = _flag(config, "attention_bias")
    core["intermediate_dim"] = _positive_int(config, "intermediate_size_mlp")  # dense layers'
    return ModelSpec(
        **core, qkv_bias=bias, output_bias=bias, mlp_bias=False, qk_norm=False,
        final_logit_soft_cap=None, layers=layers, shared_expert_prefix=SHARED_EXPERT_PREFIX,
        intermediate_field="intermediate_size_mlp")


# (Llama 4's name under a layer, the converter's name, the transpose of the array or None)
_RENAMES = (("feed_forward.router.weight", "mlp.gate.weight", None),
            ("feed_forward.experts.gate_up_proj", "mlp.experts.gate_up_proj", (0, 2, 1)),
            ("feed_forward.experts.down_proj", "mlp.experts.down_proj", (0, 2, 1)),
            ("feed_forward.shared_expert.", SHARED_EXPERT_PREFIX, None),
            ("feed_forward.", "mlp.", None))


def _renamed(entries, renames, read):
    out = {}
    for key, value in entries.items():
        for old, new, axes in renames:
            if isinstance(key, str) and old in key:
                if axes is not None:
                    value = read(key, value)
                    if value.ndim != 3:
                        raise ValueError(
                            f"state_dict entry {key!r} must be an (E, ., .) stack of experts. "
                            f"Received: shape {_common.shape_text(value.shape)}")
                    value = np.transpose(value, axes)
                key = key.replace(old, new, 1)
                break
        out[key] = value
    return out


def canonical_state_dict(entries, spec):
    """Llama 4's `feed_forward.*` under the names the converter maps, its stacked experts
    `(E, D, 2F)` / `(E, F, D)` transposed into transformers 5's fused layout (the shapes
    are then checked against the config by the converter)."""
    return _renamed(entries, _RENAMES,
                    lambda key, value: _common.to_numpy(value, f"state_dict entry {key!r}"))


def checkpoint_state_dict(tensors, spec):
    """The inverse (`CausalLM.save_pretrained`): Llama 4's names and stacked layout."""
    inverse = tuple((new, old, axes) for old, new, axes in _RENAMES)
    return _renamed(tensors, inverse, lambda key, value: np.asarray(value))
