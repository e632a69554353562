"""keras_attn `CausalLM`s from keras-hub's Llama 3, Mistral, Qwen 2 and Gemma 3 models.

keras-hub is never imported: the backbone is read by duck typing, its class name
(`type(backbone).__name__`), its `get_config()` and its layers' weights (each top-level
layer's `weights`, by their paths under the layer). Each backbone class has a reader
here that classifies every key of `get_config()` (read, neutral, ignored; any other key
is refused with a `ValueError` naming it), writes the transformers config the backbone
means and renames its weights into the transformers state dict (the tables of keras-hub's
own exporter, `keras_hub/src/utils/transformers/export/`). The transformers family
converter (`keras_attn.convert.transformers.causal_lm_from_transformers`) then checks
that config field by field and every weight against it, as for a transformers model:
nothing is assigned before everything is checked.

Layouts: keras-hub's Llama / Mistral / Qwen query kernel is `(D, H, d)` (Gemma 3's
`(H, D, d)`), its output kernel `(H, d, D)`, its `Dense` kernels `(in, out)`; a
transformers `Linear` weight is `(out, in)`.
"""

from typing import Any

import numpy as np

from keras_attn.convert import _common

__all__ = ["causal_lm_from_keras_hub", "keras_hub_config", "keras_hub_state_dict"]

# `get_config()` keys every Keras layer has (they do not change the logits).
_KERAS_KEYS = {"name": "metadata", "trainable": "training only",
               "dtype": "pass `dtype=` to choose the converted model's"}


def _refuse(cls, field, value, why):
    raise ValueError(f"{cls} option `{field}` is not supported ({why}). Received: "
                     f"{field}={value!r}")


def _check_keys(cls, config, fields):
    """Refuse a key of `config` that `fields` does not classify, or a neutral one that is
    away from its neutral values."""
    for key, value in config.items():
        if key in fields["read"] or key in fields["ignored"] or key in _KERAS_KEYS:
            continue
        if key in fields["neutral"]:
            if not any(value == v and isinstance(value, bool) == isinstance(v, bool)
                       for v in fields["neutral"][key]):
                _refuse(cls, key, value, "keras_attn reproduces only "
                        + " or ".join(repr(v) for v in fields["neutral"][key]))
            continue
        _refuse(cls, key, value, "unknown to keras_attn's keras-hub converter, which "
                "refuses what it does not know to leave the logits unchanged")


def _sizes(config):
    return {"vocab_size": config["vocabulary_size"], "hidden_size": config["hidden_dim"],
            "intermediate_size": config["intermediate_dim"],
            "num_hidden_layers": config["num_layers"],
            "num_attention_heads": config["num_query_heads"],
            "num_key_value_heads": config["num_key_value_heads"],
            "rms_norm_eps": config["layer_norm_epsilon"]}


def _llama3(cls, config, tied):
    rope = {"rope_type": "default", "rope_theta": config["rope_max_wavelength"]}
    position_scaling = config.get("rope_position_scaling_factor", 1.0)
    llama3 = config.get("rope_frequency_adjustment_factor")
    if llama3 is not None and position_scaling != 1.0:
        _refuse(cls, "rope_position_scaling_factor", position_scaling,
                "with `rope_frequency_adjustment_factor` too, it is no transformers RoPE type")
    if llama3 is not None:
        rope.update(rope_type="llama3", factor=llama3,
                    low_freq_factor=config["rope_low_freq_factor"],
                    high_freq_factor=config["rope_high_freq_factor"],
                    original_max_position_embeddings=config["rope_pretraining_sequence_length"])
    elif position_scaling != 1.0:  # positions / s: transformers' linear scaling
        rope.update(rope_type="linear", factor=position_scaling)
    return {"model_type": "llama", **_sizes(config), "hidden_act": "silu",
            "rope_parameters": rope, "tie_word_embeddings": tied}


def _mistral(cls, config, tied):
    rope = {"rope_type": "default", "rope_theta": config["rope_max_wavelength"]}
    if config.get("rope_scaling_factor", 1.0) != 1.0:
        rope.update(rope_type="linear", factor=config["rope_scaling_factor"])
    if tied:
        _refuse(cls, "tie_word_embeddings", tied, "transformers' Mistral has its own head")
    return {"model_type": "mistral", **_sizes(config), "hidden_act": "silu",
            "head_dim": config.get("head_dim"), "sliding_window": config["sliding_window"],
            "rope_parameters": rope, "tie_word_embeddings": False}


def _qwen(cls, config, tied):
    rope = {"rope_type": "default", "rope_theta": config["rope_max_wavelength"]}
    if config.get("rope_scaling_factor", 1.0) != 1.0:
        rope.update(rope_type="linear", factor=config["rope_scaling_factor"])
    return {"model_type": "qwen2", **_sizes(config), "hidden_act": "silu",
            "rope_parameters": rope, "tie_word_embeddings": tied, "use_sliding_window": False}


def _gemma3(cls, config, tied):
    if not tied:
        _refuse(cls, "tie_word_embeddings", tied, "Gemma 3's head is its embedding")
    n = config["num_layers"]
    sliding = config["use_sliding_window_attention"]
    # keras-hub's Gemma3Backbone: blocks i % 6 < 5 slide (RoPE base 1e4, the local
    # factor), the others are full (1e6, the global factor).
    types = ["sliding_attention" if sliding and i % 6 < 5 else "full_attention"
             for i in range(n)]
    scalar = (config["head_dim"] if config["query_head_dim_normalize"]
              else config["hidden_dim"] // config["num_query_heads"])
    return {"model_type": "gemma3_text", **_sizes(config), "head_dim": config["head_dim"],
            "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": scalar,
            "sliding_window": config["sliding_window_size"], "layer_types": types,
            "final_logit_softcapping": config["final_logit_soft_cap"],
            "rope_parameters": {
                "full_attention": {"rope_type": "linear", "rope_theta": 1e6,
                                   "factor": config["global_rope_scaling_factor"]},
                "sliding_attention": {"rope_type": "linear", "rope_theta": 1e4,
                                      "factor": config["local_rope_scaling_factor"]}},
            "tie_word_embeddings": True}


_SIZES = ("vocabulary_size", "num_layers", "num_query_heads", "hidden_dim", "intermediate_dim",
          "num_key_value_heads", "layer_norm_epsilon")
_DROPOUT = {"dropout": (0, 0.0)}  # keras-hub drops out where keras_attn does not: refused
_LLAMA_STACK = {"layers": "transformer_layer_{}", "norm": "sequence_output_layernorm"}

# backbone class -> (its `get_config()` keys, the config writer, its weight names).
_BACKBONES = {
    "Llama3Backbone": ({
        "read": _SIZES + ("rope_max_wavelength", "rope_position_scaling_factor",
                          "rope_frequency_adjustment_factor", "rope_low_freq_factor",
                          "rope_high_freq_factor", "rope_pretraining_sequence_length",
                          "tie_word_embeddings"),
        "neutral": _DROPOUT, "ignored": {}}, _llama3, _LLAMA_STACK),
    "MistralBackbone": ({
        "read": _SIZES + ("rope_max_wavelength", "rope_scaling_factor", "sliding_window",
                          "head_dim"),
        "neutral": _DROPOUT, "ignored": {}}, _mistral, _LLAMA_STACK),
    "QwenBackbone": ({
        "read": _SIZES + ("rope_max_wavelength", "rope_scaling_factor", "tie_word_embeddings"),
        "neutral": {**_DROPOUT, "use_sliding_window_attention": (False,)},
        "ignored": {"sliding_window_size": "read only with use_sliding_window_attention"}},
        _qwen, _LLAMA_STACK),
    "Gemma3Backbone": ({
        "read": _SIZES + ("head_dim", "query_head_dim_normalize", "final_logit_soft_cap",
                          "use_sliding_window_attention", "sliding_window_size",
                          "local_rope_scaling_factor", "global_rope_scaling_factor"),
        "neutral": {**_DROPOUT, "use_query_key_norm": (True,), "use_post_ffw_norm": (True,),
                    "use_post_attention_norm": (True,), "attention_logit_soft_cap": (None,),
                    "vision_encoder": (None,), "use_bidirectional_attention": (False,),
                    "is_embedding_model": (False,), "pooling_intermediate_dim": (None,),
                    "embedding_dim": (None,)},
        "ignored": {"image_size": "the vision encoder's (there is none: vision_encoder=None)"}},
        _gemma3, {"layers": "decoder_block_{}", "norm": "final_normalization"}),
}


def _backbone_of(model):
    """The backbone of a keras-hub `CausalLM` (its `backbone`), or `model` itself."""
    inner = getattr(model, "backbone", None)
    backbone = inner if inner is not None and callable(getattr(inner, "get_config", None)) \
        else model
    cls = type(backbone).__name__
    if cls not in _BACKBONES or not callable(getattr(backbone, "get_layer", None)):
        raise ValueError(
            "`causal_lm_or_backbone` must be a keras-hub CausalLM or backbone of "
            f"{', '.join(sorted(_BACKBONES))} (the class itself, not a subclass). "
            f"Received: causal_lm_or_backbone of type {type(model).__name__}"
            + (f" (backbone {cls})" if backbone is not model else ""))
    return backbone, cls


def _layer_weights(layer):
    """`{path under the layer: numpy array}` of a layer's weights."""
    out = {}
    for variable in layer.weights:
        path = str(getattr(variable, "path", variable.name))
        head = f"{layer.name}/"
        where = path.rfind(head)
        key = path[where + len(head):] if where >= 0 else path
        out[key] = _common.to_numpy(variable, f"weight {path!r}")
    return out


def _embedding(backbone, cls):
    """The token embedding's weights and whether the head is tied to them."""
    layer = backbone.get_layer("token_embedding")
    options = layer.get_config()
    tied = bool(options.get("tie_weights", True))
    cap = options.get("logit_soft_cap")
    if cap is not None and cls != "Gemma3Backbone":
        _refuse(cls, "token_embedding.logit_soft_cap", cap, "this family has no final soft-cap")
    if options.get("reverse_dtype") is not None:
        _refuse(cls, "token_embedding.reverse_dtype", options["reverse_dtype"],
                "keras_attn's head computes in the model's dtype")
    return _layer_weights(layer), tied


def keras_hub_config(causal_lm_or_backbone: Any) -> dict:
    """The transformers config (a dict) that a keras-hub backbone means.

    Args:
        causal_lm_or_backbone: a keras-hub `CausalLM` or backbone (Llama 3, Mistral,
            Qwen 2, Gemma 3).

    Returns:
        A dict in transformers' layout (`model_type` "llama", "mistral", "qwen2" or
        "gemma3_text"), read by `keras_attn.convert.causal_lm_from_transformers`.

    Raises:
        ValueError: an unknown backbone class, or an option keras_attn does not reproduce
            (named, with its value).
    """
    backbone, cls = _backbone_of(causal_lm_or_backbone)
    config = dict(backbone.get_config())
    fields, writer, _ = _BACKBONES[cls]
    _check_keys(cls, config, fields)
    _, tied = _embedding(backbone, cls)
    if "tie_word_embeddings" in config and bool(config["tie_word_embeddings"]) != tied:
        raise ValueError(f"{cls}'s config and its token embedding disagree: "
                         f"tie_word_embeddings={config['tie_word_embeddings']!r} but "
                         f"token_embedding.tie_weights={tied!r}.")
    if getattr(backbone, "tie_word_embeddings", tied) != tied:  # Llama's get_config omits it
        raise ValueError(f"{cls}'s attribute and its token embedding disagree: "
                         f"tie_word_embeddings={backbone.tie_word_embeddings!r} but "
                         f"token_embedding.tie_weights={tied!r}.")
    return writer(cls, config, tied)


def _attention_entries(weights, sub, D, gemma):
    """keras-hub's attention weights under `sub` as transformers' `self_attn.*`."""
    out = {}
    names = ({"query": "q", "key": "k", "value": "v"} if gemma else
             {"self_attention/query": "q", "self_attention/key": "k",
              "self_attention/value": "v"})
    for name, part in names.items():
        kernel = weights.pop(f"{sub}{name}/kernel")
        if gemma:  # (H, D, d) -> (D, H * d)
            kernel = np.transpose(kernel, (1, 0, 2))
        out[f"self_attn.{part}_proj.weight"] = np.reshape(kernel, (D, -1)).T
        if f"{sub}{name}/bias" in weights:  # Qwen 2: (H, d)
            out[f"self_attn.{part}_proj.bias"] = np.reshape(weights.pop(f"{sub}{name}/bias"), -1)
    output = "attention_output" if gemma else "self_attention/attention_output"
    out["self_attn.o_proj.weight"] = np.reshape(weights.pop(f"{sub}{output}/kernel"), (-1, D)).T
    return out


# keras-hub weight (under a block) -> transformers' name (under `model.layers.i.`), `.T`'d.
_LLAMA_BLOCK = {"self_attention_layernorm/scale": "input_layernorm.weight",
                "feedforward_layernorm/scale": "post_attention_layernorm.weight",
                "feedforward_gate_dense/kernel": "mlp.gate_proj.weight",
                "feedforward_intermediate_dense/kernel": "mlp.up_proj.weight",
                "feedforward_output_dense/kernel": "mlp.down_proj.weight"}
_GEMMA3_BLOCK = {"pre_attention_norm/scale": "input_layernorm.weight",
                 "post_attention_norm/scale": "post_attention_layernorm.weight",
                 "pre_ffw_norm/scale": "pre_feedforward_layernorm.weight",
                 "post_ffw_norm/scale": "post_feedforward_layernorm.weight",
                 "attention/query_norm/scale": "self_attn.q_norm.weight",
                 "attention/key_norm/scale": "self_attn.k_norm.weight",
                 "ffw_gating/kernel": "mlp.gate_proj.weight",
                 "ffw_gating_2/kernel": "mlp.up_proj.weight",
                 "ffw_linear/kernel": "mlp.down_proj.weight"}


def _unused(cls, where, weights):
    if weights:
        raise ValueError(
            f"{cls}'s layer {where!r} has weights keras_attn does not map (a LoRA-enabled or "
            "quantized keras-hub model is not converted: merge or dequantize it first). "
            f"Received: {sorted(weights)}")


def keras_hub_state_dict(causal_lm_or_backbone: Any) -> dict:
    """The weights of a keras-hub backbone as a transformers state dict of numpy arrays.

    Args:
        causal_lm_or_backbone: a keras-hub `CausalLM` or backbone (as `keras_hub_config`).

    Returns:
        `{transformers name: numpy array}` (`model.embed_tokens.weight`,
        `model.layers.{i}.self_attn.q_proj.weight`, ..., `lm_head.weight` when untied).

    Raises:
        ValueError: an unknown backbone class, or a weight that is not mapped.
    """
    backbone, cls = _backbone_of(causal_lm_or_backbone)
    _, _, names = _BACKBONES[cls]
    gemma = cls == "Gemma3Backbone"
    table = _GEMMA3_BLOCK if gemma else _LLAMA_BLOCK
    embedding, tied = _embedding(backbone, cls)
    D = embedding["embeddings"].shape[1]
    state = {"model.embed_tokens.weight": embedding.pop("embeddings")}
    if not tied:
        state["lm_head.weight"] = embedding.pop("reverse_embeddings").T
    _unused(cls, "token_embedding", embedding)
    for i in range(backbone.get_config()["num_layers"]):
        where = names["layers"].format(i)
        weights = _layer_weights(backbone.get_layer(where))
        state.update({f"model.layers.{i}.{k}": v for k, v in
                      _attention_entries(weights, "attention/" if gemma else "", D,
                                         gemma).items()})
        for name, target in table.items():
            if name in weights:  # a missing one is named by the transformers converter
                value = weights.pop(name)
                state[f"model.layers.{i}.{target}"] = value.T if value.ndim == 2 else value
        _unused(cls, where, weights)
    final = _layer_weights(backbone.get_layer(names["norm"]))
    state["model.norm.weight"] = final.pop("scale")
    _unused(cls, names["norm"], final)
    return state


def causal_lm_from_keras_hub(causal_lm_or_backbone: Any, **kwargs):
    """A keras_attn `CausalLM` from a keras-hub Llama 3, Mistral, Qwen 2 or Gemma 3 model.

    The backbone is read without importing keras-hub: its `get_config()` (every option
    classified; what keras_attn does not reproduce is refused by name) and its weights,
    renamed into the transformers layout and converted by that family's transformers
    converter, which checks the config field by field and every weight against it. The
    logits are keras-hub's (`backbone.token_embedding(x, reverse=True)`, Gemma 3's final
    soft-cap included).

    Args:
        causal_lm_or_backbone: a keras-hub `Llama3CausalLM`, `MistralCausalLM`,
            `QwenCausalLM` or `Gemma3CausalLM` (text only), or its backbone.
        **kwargs: passed to `keras_attn.CausalLM` (e.g. `dtype`).

    Returns:
        A built `keras_attn.CausalLM`: `lm(token_ids)` gives `(B, T, V)` logits.

    Raises:
        ValueError: an unknown backbone class, an option or weight keras_attn does not
            map (named, with its value).

    Example (with keras-hub, `keras_hub.models.Llama3CausalLM(backbone=...)` in, a
    `keras_attn.CausalLM` out; what is not a keras-hub model is refused):

    >>> import keras_attn
    >>> keras_attn.convert.causal_lm_from_keras_hub(object())  # doctest: +ELLIPSIS
    Traceback (most recent call last):
        ...
    ValueError: `causal_lm_or_backbone` must be a keras-hub CausalLM or backbone of ...
    """
    from keras_attn.convert.transformers import causal_lm_from_transformers

    config = keras_hub_config(causal_lm_or_backbone)
    return causal_lm_from_transformers(config, keras_hub_state_dict(causal_lm_or_backbone),
                                       **kwargs)
