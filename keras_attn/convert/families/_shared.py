"""What every decoder family's config holds, read once (the family modules use it).

`core(config, ...)` reads the sizes, the activation and the norm epsilon;
`rope_of` the RoPE options, `window_of` the sliding window; `layer_types`,
`checked_layer_types`, `windows_from_max_window_layers`, `every_nth_full` and `sliding_windows` give each
block's "full_attention" / "sliding_attention" and window; `layer_specs(...)` makes the
per-block attention options. Field names are transformers' (a family whose field is
named otherwise passes its name). Nothing here branches on a family's name: what
differs between families is in their modules, as arguments to these helpers.
"""

from collections.abc import Mapping

from keras_attn.convert._transformers_config import (
    ACTIVATIONS,
    LAYER_TYPES,
    LayerSpec,
    _number,
    _positive_int,
    _refuse,
    _rope,
)

__all__ = ["HYBRID_LAYER_TYPES", "LINEAR_FIELDS", "ROUTER_TRAINING_FIELDS",
           "check_rotary_width", "checked_layer_types", "core", "every_nth_full",
           "gated_deltanet_arguments", "hybrid_layer_types", "join_query_gate", "layer_specs",
           "layer_types", "refuse", "refuse_changed_defaults", "rope_of", "sliding_windows",
           "split_gate_up",
           "split_query_gate", "window_of", "windows_from_max_window_layers"]

refuse = _refuse
# The fields `core` reads (each family lists them with its own in FIELDS["read"]).
CORE_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
               "num_attention_heads", "num_key_value_heads", "head_dim", "attention_dropout",
               "tie_word_embeddings", "rope_parameters", "rope_theta", "rope_scaling")
# The softmax routers' training-only fields: ignored, with why (Mixtral, Qwen3-MoE, Qwen3-Next).
ROUTER_TRAINING_FIELDS = {
    "router_aux_loss_coef": "the load-balancing loss's weight, read by training only "
                            "(transformers adds the loss with output_router_logits); the "
                            "logits are the same: set MixtureOfExperts' own to train",
    "output_router_logits": "whether the model also returns the router logits; the "
                            "logits are the same",
}
# The Gated DeltaNet fields of the hybrid Qwen families (Qwen 3.5, Qwen3-Next), and their
# layer types.
LINEAR_FIELDS = ("linear_conv_kernel_dim", "linear_key_head_dim", "linear_value_head_dim",
                 "linear_num_key_heads", "linear_num_value_heads")
HYBRID_LAYER_TYPES = ("linear_attention", "full_attention")


def core(config, *, activation_field="hidden_act", default_activation="silu",
         epsilon_field="rms_norm_eps", default_epsilon=1e-6, tie_default=False):
    """The keyword arguments of `ModelSpec` that every family reads the same way."""
    D = _positive_int(config, "hidden_size")
    H = _positive_int(config, "num_attention_heads")
    H_kv = (_positive_int(config, "num_key_value_heads")
            if config.get("num_key_value_heads") is not None else H)
    if H % H_kv:
        _refuse("num_key_value_heads", H_kv, f"it must divide num_attention_heads={H}")
    d = _positive_int(config, "head_dim") if config.get("head_dim") is not None else D // H
    activation = config.get(activation_field, default_activation)
    if activation not in ACTIVATIONS:
        _refuse(activation_field, activation, f"supported: {', '.join(map(repr, ACTIVATIONS))}")
    return dict(
        family=config["model_type"], vocabulary_size=_positive_int(config, "vocab_size"),
        hidden_dim=D, intermediate_dim=_positive_int(config, "intermediate_size"),
        num_layers=_positive_int(config, "num_hidden_layers"), num_heads=H,
        num_key_value_heads=H_kv, head_dim=d, activation=ACTIVATIONS[activation],
        epsilon=_number(config, epsilon_field, default_epsilon),
        attention_dropout=_number(config, "attention_dropout", 0.0, positive=False),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", tie_default)))


def refuse_changed_defaults(config, defaults_4):
    """Refuse, naming it, a field of `defaults_4` (`{field: transformers 4.45's default}`, where
    the family's 4.x default differs from 5.x's) that a config written by transformers 4
    (`transformers_version` "4.*") leaves out: `save_pretrained` leaves out the fields equal
    to the writing version's defaults, so the value meant is 4.x's, which 5.x (and
    keras_attn) would not take."""
    version = config.get("transformers_version")
    if not (isinstance(version, str) and version.startswith("4.")):
        return
    for field, default in defaults_4.items():
        if field not in config:
            _refuse(field, None, f"left out of a config written by transformers {version}, "
                    f"whose default ({default!r} in 4.45) differs from transformers 5's: give "
                    "it in the config")


def rope_of(config, *, partial_rotary=False, longrope=False, default_theta=10000.0):
    """The RoPE options (AttentionOptions fields) of a config with one `rope_parameters`
    (or the older `rope_theta` / `rope_scaling`).

    `partial_rotary`: the family rotates `partial_rotary_factor` of each head (read from
    the RoPE parameters, or from the config's top level when they lack it, as
    transformers' `setdefault` does). `longrope`: the family reads longrope (its
    generation recomputes the cache at the switch, as `CausalLM.generate`).
    `default_theta`: the family's `rope_theta` when the config has no RoPE fields at all
    (transformers' `default_theta`).
    """
    params = config.get("rope_parameters")
    if params is not None and config.get("rope_scaling") is not None:
        _refuse("rope_scaling", config["rope_scaling"],
                "give either `rope_parameters` or the older `rope_scaling`, not both")
    if isinstance(params, Mapping) and "rope_scaling" in config and (
            params.get("rope_type", params.get("type", "default")) != "default"
            or set(params) - {"rope_type", "type", "rope_theta"}):
        # Only transformers 4 writes `rope_scaling` (None here): its model reads rope_theta
        # and rope_scaling, and a `rope_parameters` given to a 4.x config is stored unread.
        _refuse("rope_parameters", params,
                "the config also has rope_scaling=None, as transformers 4 writes it, whose "
                "model reads rope_theta and rope_scaling and ignores rope_parameters; give "
                "the RoPE scaling as rope_scaling there")
    if params is None:
        params = {"rope_theta": config.get("rope_theta", default_theta),
                  **dict(config.get("rope_scaling") or {})}
        where = "rope_scaling"
    else:
        if "rope_theta" in config and config["rope_theta"] != params.get("rope_theta"):
            _refuse("rope_theta", config["rope_theta"],
                    "it differs from rope_parameters['rope_theta']")
        where = "rope_parameters"
    if partial_rotary and isinstance(params, Mapping) and config.get(
            "partial_rotary_factor") is not None:
        params = {"partial_rotary_factor": config["partial_rotary_factor"], **params}
    return _rope(params, where, config.get("max_position_embeddings"),
                 partial_rotary=partial_rotary, longrope=longrope)


def check_rotary_width(rope, head_dim, where):
    """The RoPE options `rope` (from `rope_of`) checked against the head width: the rotated
    slice even, longrope's factor lists d/2 long; a `ValueError` naming the config field
    `where` (with keras_attn's reason) otherwise."""
    from keras_attn.options import AttentionOptions

    try:
        AttentionOptions(**rope).for_heads(1, head_dim)
    except ValueError as error:
        raise ValueError(f"config field `{where}` is not supported: {error}") from None
    return rope


def window_of(config, field="sliding_window"):
    """The config's window (a positive int), or None."""
    window = config.get(field)
    return None if window is None else _positive_int(config, field)


def layer_types(config, num_layers, window):
    """`layer_types` checked: one of LAYER_TYPES per layer, a window for sliding ones."""
    return checked_layer_types(config["layer_types"], num_layers, window)


def checked_layer_types(types, num_layers, window):
    """`types` (the config's `layer_types`, or what transformers derives without it) as a
    list, checked: one of LAYER_TYPES per layer, a window for sliding ones."""
    types = list(types)
    if len(types) != num_layers or any(t not in LAYER_TYPES for t in types):
        _refuse("layer_types", types, f"one of {LAYER_TYPES} per layer "
                f"(num_hidden_layers={num_layers})")
    if "sliding_attention" in types and window is None:
        _refuse("sliding_window", window, "layer_types has sliding layers: a window is needed")
    return types


def windows_from_max_window_layers(config, num_layers):
    """Each block's window in the Qwen 2 / Qwen 3 convention: a window only with
    `use_sliding_window`, on the "sliding_attention" blocks of `layer_types` or, without
    it, transformers' derivation (the blocks from `max_window_layers`, default 28, on)."""
    window = window_of(config) if config.get("use_sliding_window", False) else None
    types = config.get("layer_types")
    if types is None:
        start = config.get("max_window_layers", 28)
        types = ["sliding_attention" if window is not None and i >= start else "full_attention"
                 for i in range(num_layers)]
    return sliding_windows(checked_layer_types(types, num_layers, window), window)


def every_nth_full(num_layers, n):
    """Every `n`-th block (the n-th, the 2n-th, ...) full, the others sliding."""
    return ["sliding_attention" if (i + 1) % n else "full_attention" for i in range(num_layers)]


def sliding_windows(types, window):
    """Each block's window: `window` on the "sliding_attention" blocks, None on the others."""
    return [window if kind == "sliding_attention" else None for kind in types]


def layer_specs(num_layers, rope, *, windows=None, uses_rope=None, **attention):
    """One LayerSpec per block: the RoPE options `rope` (a list: `rope[i]` for block i)
    where `uses_rope[i]` (all by default), the window `windows[i]` (None: none), and
    `attention`'s other options everywhere."""
    specs = []
    for i in range(num_layers):
        block_rope = rope[i] if isinstance(rope, list) else rope
        options = dict(block_rope) if uses_rope is None or uses_rope[i] else {}
        options["sliding_window"] = None if windows is None else windows[i]
        options.update(attention)
        specs.append(LayerSpec(options))
    return specs


def split_gate_up(entries, intermediate_dim):
    """Every fused `mlp.gate_up_proj.weight` `(2F, D)` of `entries` (a dict) split into
    `gate_proj` and `up_proj` `(F, D)`, as transformers' `chunk(2)` (Phi-3, GLM-4), the
    row count cross-checked against `intermediate_size`."""
    import numpy as np

    from keras_attn.convert import _common

    F = intermediate_dim
    for key in [k for k in entries if isinstance(k, str)]:
        if key.endswith("mlp.gate_up_proj.weight"):
            prefix = key[:-len("gate_up_proj.weight")]
            part = _common.to_numpy(entries.pop(key), f"state_dict entry {key!r}")
            if part.ndim != 2 or part.shape[0] != 2 * F:
                raise ValueError(
                    f"The config and the weights disagree: intermediate_size={F} (2 * F = "
                    f"{2 * F}) give {2 * F} rows for state_dict entry {key!r}, which has shape "
                    f"{_common.shape_text(part.shape)}.")
            gate, up = np.split(part, 2, axis=0)
            entries.update({prefix + "gate_proj.weight": gate, prefix + "up_proj.weight": up})
    return entries


def _query_rows(num_heads, head_dim):
    return (f"num_attention_heads={num_heads}, head_dim={head_dim} (2 * H * d = "
            f"{2 * num_heads * head_dim}: a query and a gate per head)")


def split_query_gate(entries, num_heads, head_dim):
    """Each gated attention's `q_proj` `(2 H d, D)` (and bias) of `entries` (a dict) split
    per head into `q_proj` and `gate_proj` `(H d, D)` (transformers'
    `q_proj(x).view(..., H, 2d).chunk(2)`: per head, d query rows then d gate rows), the
    row count cross-checked against the config (Qwen 3.5, Qwen3-Next)."""
    from keras_attn.convert import _common

    H, d = num_heads, head_dim
    for key in [k for k in entries if isinstance(k, str)]:
        if not key.endswith(("q_proj.weight", "q_proj.bias")):  # a model's, a layer's
            continue
        part = _common.to_numpy(entries.pop(key), f"state_dict entry {key!r}")
        if part.shape[:1] != (2 * H * d,):
            raise ValueError(
                f"The config and the weights disagree: {_query_rows(H, d)} give {2 * H * d} "
                f"rows for state_dict entry {key!r}, which has shape "
                f"{_common.shape_text(part.shape)}.")
        heads = part.reshape((H, 2 * d) + part.shape[1:])
        rest = part.shape[1:]
        entries[key] = heads[:, :d].reshape((H * d,) + rest)
        cut = key.rindex("q_proj.")
        entries[key[:cut] + "gate_proj." + key[cut + 7:]] = heads[:, d:].reshape((H * d,) + rest)
    return entries


def join_query_gate(tensors, num_heads, head_dim):
    """The inverse of `split_query_gate`: `q_proj` and `gate_proj` interleaved per head back
    into `q_proj` (a new dict)."""
    import numpy as np

    H, d = num_heads, head_dim
    tensors = dict(tensors)
    for key in [k for k in tensors if k.endswith(("self_attn.gate_proj.weight",
                                                  "self_attn.gate_proj.bias"))]:
        gate = tensors.pop(key)
        q_key = key.replace(".gate_proj.", ".q_proj.")
        q, rest = tensors[q_key], gate.shape[1:]
        joined = np.concatenate([q.reshape((H, d) + rest), gate.reshape((H, d) + rest)], axis=1)
        tensors[q_key] = joined.reshape((2 * H * d,) + rest)
    return tensors


def hybrid_layer_types(config, num_layers):
    """A hybrid Qwen config's `layer_types`, checked; without them transformers' derivation:
    every `full_attention_interval`-th layer (4 by default) full, the others linear."""
    types = config.get("layer_types")
    if types is None:
        n = _positive_int(config, "full_attention_interval", 4)
        types = ["linear_attention" if (i + 1) % n else "full_attention"
                 for i in range(num_layers)]
    if not isinstance(types, (list, tuple)) or len(types) != num_layers or any(
            t not in HYBRID_LAYER_TYPES for t in types):
        refuse("layer_types", types, f"one of {HYBRID_LAYER_TYPES} per layer "
               f"(num_hidden_layers={num_layers})")
    return list(types)


def gated_deltanet_arguments(config, core):
    """The `GatedDeltaNet` keywords of a hybrid Qwen config (`LINEAR_FIELDS` and the norm's
    epsilon), checked: silu (the short convolution's activation here) and value heads a
    multiple of the key heads."""
    if core["activation"] != "silu":  # the linear layers' convolution uses it too
        refuse("hidden_act", config.get("hidden_act"),
               "the Gated DeltaNet's short convolution is silu in keras_attn")
    linear = dict(**{f: _positive_int(config, f) for f in LINEAR_FIELDS},
                  layer_norm_epsilon=core["epsilon"])
    if linear["linear_num_value_heads"] % linear["linear_num_key_heads"]:
        refuse("linear_num_value_heads", linear["linear_num_value_heads"],
               f"a multiple of linear_num_key_heads={linear['linear_num_key_heads']} is needed")
    return linear
