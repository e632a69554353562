"""keras_attn's `MultiHeadLatentAttention` from a transformers multi-head latent attention
(DeepSeek V3's `DeepseekV3Attention`), read from the config.

The family module of the config's `model_type` (`keras_attn.convert.families`) reads its
fields (`latent_attention(config)`: the layer's arguments); a family without latent
attention is refused. Every weight is checked against the config before any is assigned.

Mapping (a torch `Linear` weight `W` `(out, in)` is the Keras kernel `W.T`):
`q_proj` -> `query_dense` (with `q_lora_rank` None), `q_a_proj` -> `query_a_dense`,
`q_a_layernorm` -> `query_a_norm`, `q_b_proj` -> `query_b_dense`,
`kv_a_proj_with_mqa` -> `key_value_a_dense`, `kv_a_layernorm` -> `key_value_a_norm`,
`kv_b_proj` -> `key_value_b_dense`, `o_proj` -> `output_dense`.
"""

from typing import Any

from keras_attn.convert import _common, families
from keras_attn.convert._transformers_config import _as_dict, check_fields
from keras_attn.layers.latent_attention import MultiHeadLatentAttention

__all__ = ["multi_head_latent_attention_from_transformers"]


def _plan(entries, layer, D, sub="", check=_common.cross_check):
    """Check every entry of the attention module (under `sub`: `model.layers.{i}.self_attn.`
    in a whole model) against the layer's sizes; the assignments. `check` reads an entry
    and checks its shape (`_common.cross_check`, or save_pretrained's probe)."""
    H, r, d_rope = layer.num_heads, layer.kv_lora_rank, layer.qk_rope_head_dim
    d_qk, d_nope, d_v = layer.qk_head_dim, layer.qk_nope_head_dim, layer.v_head_dim
    heads = (f"num_attention_heads={H}, qk_nope_head_dim={d_nope}, "
             f"qk_rope_head_dim={d_rope} (H * d_qk = {H * d_qk})")
    width = f"hidden_size={D}"
    parts = []  # (transformers name, sublayer, weight shape (out, in), letters, fields, bias)
    if layer.q_lora_rank is None:
        parts.append(("q_proj", layer.query_dense, (H * d_qk, D), "(H * d_qk, D)",
                      f"q_lora_rank=None, {heads}, {width}", False))
    else:
        q_r = layer.q_lora_rank
        parts += [("q_a_proj", layer.query_a_dense, (q_r, D), "(q_lora_rank, D)",
                   f"q_lora_rank={q_r}, {width}", layer.use_bias),
                  ("q_b_proj", layer.query_b_dense, (H * d_qk, q_r), "(H * d_qk, q_lora_rank)",
                   f"{heads}, q_lora_rank={q_r}", False)]
    parts += [("kv_a_proj_with_mqa", layer.key_value_a_dense, (r + d_rope, D),
               "(kv_lora_rank + qk_rope_head_dim, D)",
               f"kv_lora_rank={r}, qk_rope_head_dim={d_rope}, {width}", layer.use_bias),
              ("kv_b_proj", layer.key_value_b_dense, (H * (d_nope + d_v), r),
               "(H * (qk_nope_head_dim + v_head_dim), kv_lora_rank)",
               f"num_attention_heads={H}, qk_nope_head_dim={d_nope}, v_head_dim={d_v}, "
               f"kv_lora_rank={r}", False),
              ("o_proj", layer.output_dense, (D, H * d_v), "(D, H * v_head_dim)",
               f"{width}, num_attention_heads={H}, v_head_dim={d_v}", layer.use_bias)]
    plan = []
    for name, dense, shape, letters, fields, has_bias in parts:
        w = check(entries, f"{sub}{name}.weight", shape, letters, fields)
        b = None
        if has_bias:
            b = check(entries, f"{sub}{name}.bias", shape[:1], letters.split(",")[0] + ",)",
                      f"attention_bias=True, {fields}")
        elif entries.has(f"{sub}{name}.bias"):
            why = ("the config has attention_bias=False" if name not in ("q_proj", "q_b_proj",
                   "kv_b_proj") else f"DeepseekV3Attention's {name} has no bias")
            raise ValueError(f"The config and the weights disagree: {why}, but state_dict has "
                             f"{entries.key(sub + name + '.bias')}.")
        plan += _common.dense_plan(dense, w.T, b, name)
    norms = [("kv_a_layernorm", layer.key_value_a_norm, r, f"kv_lora_rank={r}")]
    if layer.q_lora_rank is not None:
        norms.insert(0, ("q_a_layernorm", layer.query_a_norm, layer.q_lora_rank,
                         f"q_lora_rank={layer.q_lora_rank}"))
    for name, norm, size, fields in norms:
        w = check(entries, f"{sub}{name}.weight", (size,), "(width,)", fields)
        plan.append((norm.scale, w, f"{name} weight"))
    return plan


def multi_head_latent_attention_from_transformers(
        module_or_state_dict: Any, config: Any, layer_index: int = 0,
        prefix: str = "") -> MultiHeadLatentAttention:
    """A `keras_attn.MultiHeadLatentAttention` from a transformers latent attention module.

    Reads `q_proj` (or `q_a_proj`, `q_a_layernorm`, `q_b_proj`), `kv_a_proj_with_mqa`,
    `kv_a_layernorm`, `kv_b_proj` and `o_proj` relative to the attention module (e.g.
    `model.model.layers[i].self_attn` of a `DeepseekV3ForCausalLM`), with the options of
    the config: the sizes, RoPE (interleaved or not, yarn with its attention factor), the
    softmax scale with yarn's `mscale**2`, biases, the norms' epsilon. Call it as
    `layer(x, use_causal_mask=True)` on `(B, T, D)`; positions are `0 .. T - 1`.

    Args:
        module_or_state_dict: the attention module, or its state dict.
        config: a transformers config (or its dict) of a family with latent attention
            (`deepseek_v3`).
        layer_index: which layer (0-based; DeepSeek's attention is the same in every
            layer, the index is checked against `num_hidden_layers`).
        prefix: where the attention's entries start in the state dict, for a whole
            model's (e.g. "model.layers.1.self_attn."); only keys under it are read.

    Returns:
        A built `keras_attn.MultiHeadLatentAttention` for `(B, T, D)`.

    Raises:
        ValueError: a refused or unknown config field, a family without latent
            attention, an entry missing, extra or disagreeing with the config.
    """
    config = _as_dict(config)
    module = families.family(config.get("model_type"))
    check_fields(config, module.MODEL_TYPE, module.FIELDS)
    read = getattr(module, "latent_attention", None)
    if read is None:  # the converters' wording (`_transformers_config._refuse`)
        raise ValueError(
            "config field `model_type` is not supported (its attention is not multi-head "
            "latent attention: convert it with "
            "keras_attn.convert.multi_head_attention_from_transformers). Received: "
            f"model_type={config.get('model_type')!r}")
    num_layers, D, arguments = read(config)
    if isinstance(layer_index, bool) or not isinstance(layer_index, int) or not (
            0 <= layer_index < num_layers):
        raise ValueError(f"`layer_index` must be an int in [0, num_hidden_layers={num_layers}). "
                         f"Received: layer_index={layer_index!r}")
    entries = _common.StateDict(module_or_state_dict, prefix)
    layer = MultiHeadLatentAttention(**arguments)
    layer.build((None, None, D))
    plan = _plan(entries, layer, D)
    entries.check_all_used()
    _common.assign(plan)
    return layer
