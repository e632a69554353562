"""`model_type="gemma4_text"` (Gemma 4, the text model; its dense variants): Gemma 3's
sandwich norms, qk-norm, `sqrt(D)` embedding scale and final soft-cap, with

- RMSNorms that multiply by `w` (transformers' `Gemma4RMSNorm`, ones at first), not
  Gemma 3's `1 + w`;
- an attention scale of 1 (`self.scaling = 1.0`: no `query_pre_attn_scalar`);
- per-layer head widths and key/value heads: the full-attention layers use
  `global_head_dim` (512 by default) and, with `attention_k_eq_v`,
  `num_global_key_value_heads` (transformers' `per_layer_config`, which a config
  object writes out and which wins over the two fields when both are given);
- a RoPE per layer type (`rope_parameters` by "full_attention" / "sliding_attention";
  by default "proportional" with `partial_rotary_factor` 0.25 and base 1e6 on the full
  layers, "default" with base 1e4 on the sliding ones);
- `attention_k_eq_v`: on the full-attention layers the key projection's output is also
  the values (no `v_proj`), before `k_norm` and RoPE;
- `v_norm`: every layer's values normalised over d without a scale (`use_value_norm`);
- `layer_scalar`: a `(1,)` buffer of each layer multiplying its output (the residual
  stream), read from the state dict.

- KV sharing (`num_kv_shared_layers` k > 0, E2B / E4B): the last k layers ("reuse")
  attend the keys and values of the last earlier layer of their type ("store"): no
  `k_proj`, `v_proj`, `k_norm` of their own (`is_kv_shared_layer`, `CausalLM`'s
  `kv_sharing`; stored ones are dropped, as transformers ignores them on load), and
  with `use_double_wide_mlp` an MLP twice `intermediate_size` wide;
- per-layer input embeddings (`hidden_size_per_layer_input` P > 0, E2B / E4B):
  `embed_tokens_per_layer`, `per_layer_model_projection`, `per_layer_projection_norm`
  (`CausalLM`'s `hidden_size_per_layer_input`, `vocab_size_per_layer_input`) and per
  layer `per_layer_input_gate`, `per_layer_projection`, `post_per_layer_input_norm`.

- the mixture of experts (`enable_moe_block`, 26B-A4B, issue 34): in every layer the
  dense MLP and `num_experts` experts (`moe_intermediate_size` wide, `top_k_experts` per
  token) side by side, a `ParallelMixtureOfExperts` as the block's feed-forward (with
  `use_feed_forward_norm=False`: it holds `pre_feedforward_layernorm`, and its router
  reads the residual stream); `router.proj`, `router.scale`, `router.per_expert_scale`,
  `experts.gate_up_proj` / `down_proj` and the norms `post_feedforward_layernorm_1`,
  `pre_feedforward_layernorm_2`, `post_feedforward_layernorm_2` (convert/_experts.py's
  `parallel_experts_plan`). Without `enable_moe_block` the three sizes are unread, as
  transformers leaves them.

transformers forces the last layer to "full_attention" (with a warning); so does this
module. Refused, naming the field: bidirectional attention
(`use_bidirectional_attention`), and KV sharing in every layer (no layer would compute
the keys: transformers fails there too).
"""

import math
from collections.abc import Mapping

from keras_attn.convert._transformers_config import (
    LAYER_TYPES,
    ModelSpec,
    _number,
    _positive_int,
    _refuse,
    _rope,
)
from keras_attn.convert.families import _shared

MODEL_TYPE = "gemma4_text"
ARCHITECTURES = ("Gemma4ForCausalLM", "Gemma4TextModel")  # transformers' classes (`architectures`)
FIELDS = {
    "read": _shared.CORE_FIELDS + ("rms_norm_eps", "hidden_activation", "attention_bias",
                                   "final_logit_softcapping", "sliding_window", "layer_types",
                                   "per_layer_config", "global_head_dim",
                                   "num_global_key_value_heads", "attention_k_eq_v",
                                   "num_kv_shared_layers", "hidden_size_per_layer_input",
                                   "vocab_size_per_layer_input", "use_double_wide_mlp",
                                   "enable_moe_block", "num_experts", "top_k_experts",
                                   "moe_intermediate_size"),
    "neutral": {"use_bidirectional_attention": (None,)},
    "ignored": {"cache_implementation": "how transformers caches"},
}
# Gemma4TextConfig's defaults where they differ from what `_shared.core` assumes of a field
# left out (a config.json written by transformers holds every field anyway).
_DEFAULTS = {"num_key_value_heads": 4, "head_dim": 256, "sliding_window": 512,
             "hidden_size_per_layer_input": 256, "vocab_size_per_layer_input": 262144}
_DEFAULT_ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                 "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                    "rope_theta": 1000000.0}}
_LAYER_OVERRIDES = ("head_dim", "num_key_value_heads")  # what per_layer_config may set


def rope_by_layer_type(config):
    """`{layer_type: rope options}` from `rope_parameters` (a dict by layer type; Gemma 4
    has no older `rope_theta` / `rope_scaling` form). Only "proportional" reads
    `partial_rotary_factor` (Gemma 4's other RoPE types rotate the whole head)."""
    for field in ("rope_theta", "rope_scaling"):
        if config.get(field) is not None:
            _refuse(field, config[field], "Gemma 4's modeling reads `rope_parameters` only")
    params = config.get("rope_parameters")
    params = _DEFAULT_ROPE if params is None else params
    if not isinstance(params, Mapping) or set(params) - set(LAYER_TYPES):
        _refuse("rope_parameters", params, "Gemma 4's is a dict by layer type "
                "('full_attention', 'sliding_attention')")
    rope = {}
    for kind, values in params.items():
        where = f"rope_parameters[{kind!r}]"
        if not isinstance(values, Mapping):
            _refuse(where, values, "a dict of RoPE parameters is expected")
        rope[kind] = _rope(values, where, config.get("max_position_embeddings"),
                           partial_rotary=values.get("rope_type") == "proportional")
    return rope


def per_layer_heads(config, types, d, H_kv):
    """Each layer's `(head_dim, num_key_value_heads)`: `per_layer_config` (by layer index,
    as int or str), or what `Gemma4TextConfig` derives without it (`global_head_dim` and,
    with `attention_k_eq_v`, `num_global_key_value_heads` on the full layers)."""
    overrides = config.get("per_layer_config")
    if overrides is None:
        full = {"head_dim": _positive_int(config, "global_head_dim", 512)}
        if config.get("attention_k_eq_v", False) and config.get(
                "num_global_key_value_heads") is not None:
            full["num_key_value_heads"] = _positive_int(config, "num_global_key_value_heads")
        overrides = {i: full for i, kind in enumerate(types) if kind == "full_attention"}
    if not isinstance(overrides, Mapping):
        _refuse("per_layer_config", overrides, "a dict from layer index to overrides")
    by_index = {}
    for key, values in overrides.items():
        index = int(key) if isinstance(key, int) or (isinstance(key, str) and key.isdigit()) else -1
        if not 0 <= index < len(types) or not isinstance(values, Mapping):
            _refuse("per_layer_config", overrides, f"keys are layer indices in [0, "
                    f"{len(types)}), values dicts of {', '.join(_LAYER_OVERRIDES)}")
        for field, value in values.items():
            if field not in _LAYER_OVERRIDES:
                _refuse(f"per_layer_config[{key!r}][{field!r}]", value,
                        f"keras_attn reads {', '.join(_LAYER_OVERRIDES)} per layer")
        by_index[index] = {field: _positive_int(values, field) for field in values}
    heads = []
    for i in range(len(types)):
        layer = by_index.get(i, {})
        heads.append((layer.get("head_dim", d), layer.get("num_key_value_heads", H_kv)))
    for kind in set(types):  # transformers makes one RoPE per layer type, for one width
        widths = {heads[i][0] for i, t in enumerate(types) if t == kind}
        if len(widths) > 1:
            _refuse("per_layer_config", overrides, f"the {kind!r} layers must share one "
                    f"head_dim (its RoPE is made once per layer type); received {sorted(widths)}")
    return heads


def spec(config):
    config = {**_DEFAULTS, **config}
    core = _shared.core(config, activation_field="hidden_activation",
                        default_activation="gelu_pytorch_tanh", tie_default=True)
    n, H = core["num_layers"], core["num_heads"]
    window = _shared.window_of(config)
    types = config.get("layer_types")
    types = list(_shared.every_nth_full(n, 6) if types is None else types)
    if types and types[-1] != "full_attention":
        types[-1] = "full_attention"  # as Gemma4TextConfig.__post_init__ (with a warning)
    types = _shared.checked_layer_types(types, n, window)
    rope = rope_by_layer_type(config)
    for kind in set(types):
        if kind not in rope:
            _refuse("rope_parameters", config.get("rope_parameters"),
                    f"it has no {kind!r} entry, and layer_types has such layers")
    heads = per_layer_heads(config, types, core["head_dim"], core["num_key_value_heads"])
    for i, (_, kv) in enumerate(heads):
        if H % kv:
            _refuse("per_layer_config", config.get("per_layer_config"),
                    f"layer {i}'s num_key_value_heads={kv} must divide num_attention_heads={H}")
    k_eq_v = bool(config.get("attention_k_eq_v", False))
    bias = bool(config.get("attention_bias", False))
    final_cap = _number(config, "final_logit_softcapping", None, allow_none=True)
    layers = _shared.layer_specs(
        n, [rope[kind] for kind in types], windows=_shared.sliding_windows(types, window),
        scale=1.0, qk_norm="rms", qk_norm_epsilon=core["epsilon"], use_value_norm=True)
    sources = kv_sources(config, types)
    wide = bool(config.get("use_double_wide_mlp", False))
    for i, layer in enumerate(layers):
        layer.head_dim, layer.num_key_value_heads = heads[i]
        if k_eq_v and types[i] == "full_attention":
            layer.attention["attention_k_eq_v"] = True
        if sources[i] is not None:
            layer.kv_source = sources[i]
            layer.attention["is_kv_shared_layer"] = True
            if wide:  # transformers' Gemma4TextMLP: double width on the shared layers only
                layer.intermediate_dim = 2 * core["intermediate_dim"]
    moe = mixture_of_experts(config)
    for layer in layers if moe else ():
        layer.mixture_of_experts = dict(moe)
    P = config.get("hidden_size_per_layer_input")
    if P not in (0, None):
        P = _positive_int(config, "hidden_size_per_layer_input")
    return ModelSpec(
        **core, qkv_bias=bias, output_bias=bias, mlp_bias=False, qk_norm=True,
        final_logit_soft_cap=final_cap,
        sandwich_norms=True, norm_offset=0.0,
        # transformers casts sqrt(D) to the weights' dtype (exact for float32).
        embedding_scale=float(math.sqrt(core["hidden_dim"])), layer_scalar=True,
        per_layer_input_dim=P or None,
        per_layer_vocabulary_size=_positive_int(config, "vocab_size_per_layer_input")
        if P else None, layers=layers, parallel_dense_mlp=bool(moe))


def mixture_of_experts(config):
    """Every layer's `MixtureOfExperts` sizes with `enable_moe_block` (beside the dense
    MLP; Gemma 4's router and its renormalised top-k are `ParallelMixtureOfExperts`'
    own), or None without it."""
    enabled = config.get("enable_moe_block", False)
    if not isinstance(enabled, bool):
        _refuse("enable_moe_block", enabled, "True or False")
    if not enabled:
        return None
    E = _positive_int(config, "num_experts")
    k = _positive_int(config, "top_k_experts")
    if k > E:
        _refuse("top_k_experts", k, f"at most num_experts={E}")
    return {"num_experts": E, "num_experts_per_tok": k,
            "intermediate_dim": _positive_int(config, "moe_intermediate_size")}


def kv_sources(config, types):
    """Each layer's KV source: None, or for the last `num_kv_shared_layers` the last earlier
    layer of the same type (`Gemma4TextConfig.kv_sharing_modes`: "reuse" and "store")."""
    n, shared = len(types), config.get("num_kv_shared_layers", 0)
    if shared in (0, None):
        return [None] * n
    if isinstance(shared, bool) or not isinstance(shared, int) or not 0 < shared < n:
        _refuse("num_kv_shared_layers", shared, f"an int in [0, num_hidden_layers={n}): "
                "some layer must compute the keys and values the others reuse")
    first = n - shared
    sources = [None] * n
    for i in range(first, n):
        earlier = [j for j in range(first) if types[j] == types[i]]
        if not earlier:
            _refuse("num_kv_shared_layers", shared, f"layer {i} ({types[i]!r}) has no earlier "
                    "layer of its type to take the keys and values from")
        sources[i] = earlier[-1]
    return sources


def canonical_state_dict(entries, spec):
    """The state dict without the KV-shared layers' `k_proj`, `v_proj`, `k_norm`, `v_norm`
    (transformers' `_keys_to_ignore_on_load_unexpected`: a checkpoint may hold them, the
    model never reads them)."""
    for i, layer in enumerate(spec.layers):
        if layer.kv_source is None:
            continue
        prefix = f"model.layers.{i}.self_attn."
        for key in [k for k in entries if isinstance(k, str) and k.startswith(prefix)]:
            if key[len(prefix):].split(".")[0] in ("k_proj", "v_proj", "k_norm", "v_norm"):
                entries.pop(key)
    return entries


def checkpoint_state_dict(tensors, spec):
    """The inverse of `canonical_state_dict` (for writing a checkpoint): the tensors as they
    are. The KV-shared layers' `k_proj`, `v_proj`, `k_norm`, `v_norm` it drops are neither
    in the model nor in what transformers writes (its shared layers have none), and every
    other entry, the per-layer inputs' and the experts' included, keeps its name."""
    return tensors
