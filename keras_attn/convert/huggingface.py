"""keras_attn layers from Hugging Face Llama state dicts: `LlamaAttention`, `LlamaDecoderLayer`.

transformers is never imported: the state dict's tensors are read as arrays
(see `keras_attn.convert`).
"""

from collections.abc import Mapping
from typing import Any

from keras_attn.convert import _common
from keras_attn.layers.multi_head_attention import MultiHeadAttention
from keras_attn.layers.transformer_decoder import TransformerDecoderLayer

__all__ = ["multi_head_attention_from_llama", "transformer_decoder_layer_from_llama"]

_LLAMA_MHA_DERIVED = _common.MHA_DERIVED + ("num_key_value_heads", "rope_max_wavelength")
_LLAMA_DERIVED = ("intermediate_dim", "key_dim", "activation", "layer_norm_epsilon",
                  "normalize_first", "num_key_value_heads", "rope_max_wavelength",
                  "normalization", "use_bias", "gated_feed_forward")


def _check_key_value_heads(num_heads, num_key_value_heads):
    if (isinstance(num_key_value_heads, bool) or not isinstance(num_key_value_heads, int)
            or num_key_value_heads <= 0 or num_heads % num_key_value_heads):
        raise ValueError(
            "`num_key_value_heads` must be a positive integer that divides `num_heads`. "
            f"Received: num_heads={num_heads!r}, num_key_value_heads={num_key_value_heads!r}")


def _llama_attention(entries, num_heads, num_key_value_heads, sub=""):
    """Check and read a `LlamaAttention` state dict under `sub`.

    Returns `(D, d, use_bias, weights)` with `weights[part] = (kernel, bias)`
    in keras_attn's layout.
    """
    H, H_kv = num_heads, num_key_value_heads
    names = [sub + n + "_proj.weight" for n in ("q", "k", "v", "o")]
    entries.require(*names)
    bias_names = [sub + n + "_proj.bias" for n in ("q", "k", "v", "o")]
    present = [n for n in bias_names if entries.has(n)]
    if present and len(present) != len(bias_names):
        absent = [n for n in bias_names if not entries.has(n)]
        raise ValueError(
            f"state_dict has {', '.join(entries.key(n) for n in present)} but is missing "
            f"{', '.join(entries.key(n) for n in absent)}: keras_attn.MultiHeadAttention has "
            "biases on all four projections (Llama's `attention_bias=True`) or on none.")
    use_bias = bool(present)

    q_w = entries.rank(sub + "q_proj.weight", 2, "(H * d, D)")
    Hd, D = q_w.shape
    if Hd % H:
        raise ValueError(
            f"The query width H * d = {Hd} (from {entries.key(sub + 'q_proj.weight')}) must be "
            f"divisible by num_heads. Received: num_heads={H}")
    d = Hd // H
    k_w = entries.shaped(sub + "k_proj.weight", "(H_kv * d, D)", (H_kv * d, D))
    v_w = entries.shaped(sub + "v_proj.weight", "(H_kv * d, D)", (H_kv * d, D))
    o_w = entries.shaped(sub + "o_proj.weight", "(D, H * d)", (D, Hd))
    q_b = k_b = v_b = o_b = None
    if use_bias:
        q_b = entries.shaped(sub + "q_proj.bias", "(H * d,)", (Hd,))
        k_b = entries.shaped(sub + "k_proj.bias", "(H_kv * d,)", (H_kv * d,))
        v_b = entries.shaped(sub + "v_proj.bias", "(H_kv * d,)", (H_kv * d,))
        o_b = entries.shaped(sub + "o_proj.bias", "(D,)", (D,))
    weights = {"query": (q_w.T, q_b), "key": (k_w.T, k_b), "value": (v_w.T, v_b),
               "output": (o_w.T, o_b)}
    return D, d, use_bias, weights


def multi_head_attention_from_llama(state_dict: Mapping[str, Any], num_heads: int,
                                    num_key_value_heads: int, *, rope_theta: float = 10000.0,
                                    prefix: str = "", **kwargs) -> MultiHeadAttention:
    """A `keras_attn.MultiHeadAttention` from a Hugging Face `LlamaAttention` state dict.

    `LlamaAttention` projects with `q_proj.weight` `(H * d, D)`,
    `k_proj.weight` and `v_proj.weight` `(H_kv * d, D)` and
    `o_proj.weight` `(D, H * d)` (with `q_proj.bias` `(H * d,)`,
    `k_proj.bias`, `v_proj.bias` `(H_kv * d,)` and `o_proj.bias` `(D,)`
    only if `attention_bias=True`), rotates queries and keys with half-split
    RoPE of base `rope_theta`, and lets query head n use key/value head
    `n // (H / H_kv)`. These become the kernels `W.T` (and biases) of
    `query_dense`, `key_dense`, `value_dense` and `output_dense` of a layer
    with `num_key_value_heads=H_kv` and `rope_max_wavelength=rope_theta`;
    head order and the RoPE pairing are the same, so nothing is permuted.

    Call the result as self-attention, `layer(x, use_causal_mask=True)` for
    Llama's causal mask, on `x` `(B, T, D)`; positions are `0 .. T - 1`
    (Llama's default `position_ids`). This function does not read the
    config: RoPE is the default one unless `**kwargs` say otherwise
    (`rope_type="llama3"` or `"yarn"` with its `rope_*` parameters, or
    `rope_scaling_factor=s` for `"linear"`). To read all of it from the
    config, and have what cannot be reproduced refused, use
    `keras_attn.convert.multi_head_attention_from_transformers`.

    Args:
        state_dict: the module's `state_dict()` (a mapping from names to
            arrays or tensors), or the module itself.
        num_heads: H, the config's `num_attention_heads`.
        num_key_value_heads: H_kv, the config's `num_key_value_heads`; must
            divide H (H_kv = H is plain multi-head attention, 1 is
            multi-query).
        rope_theta: the config's `rope_theta` (in newer `transformers`,
            `config.rope_parameters["rope_theta"]`).
        prefix: the prefix of the module's entries in a larger state dict,
            e.g. `"model.layers.0.self_attn."` (a missing final dot is
            added). Entries outside the prefix are ignored.
        **kwargs: further arguments of `keras_attn.MultiHeadAttention`
            (`name`, `dtype`, `implementation`, `rope_scaling_factor`,
            `sliding_window`, ...). `num_heads`, `key_dim`, `value_dim`,
            `output_dim`, `use_bias`, `num_key_value_heads` and
            `rope_max_wavelength` are given or read from the weights and
            cannot be passed.

    Returns:
        A `keras_attn.MultiHeadAttention` built for query, key and value
        `(B, T, D)`, with H heads of width d (read from the weights; the
        config's `head_dim`), H_kv key/value heads, RoPE of base
        `rope_theta`, and `use_bias` True iff the biases are present.

    Raises:
        ValueError: an entry is missing or mis-shaped, only some biases
            are present, another entry is present under `prefix`, H_kv
            does not divide H, or H does not divide the query width.
    """
    _common.check_num_heads(num_heads)
    _check_key_value_heads(num_heads, num_key_value_heads)
    _common.check_kwargs(kwargs, _LLAMA_MHA_DERIVED[1:], "state dict or the Llama-named arguments")
    entries = _common.StateDict(state_dict, prefix)
    D, d, use_bias, weights = _llama_attention(entries, num_heads, num_key_value_heads)
    entries.check_all_used()
    layer = MultiHeadAttention(num_heads, key_dim=d, num_key_value_heads=num_key_value_heads,
                               rope_max_wavelength=rope_theta, use_bias=use_bias, **kwargs)
    layer.build(query_shape=(None, None, D))
    _common.assign(_common.mha_plan(layer, weights))
    return layer


def transformer_decoder_layer_from_llama(state_dict: Mapping[str, Any], num_heads: int,
                                         num_key_value_heads: int, *, rope_theta: float = 10000.0,
                                         rms_norm_eps: float = 1e-6, prefix: str = "",
                                         **kwargs) -> TransformerDecoderLayer:
    """A Llama-style `keras_attn.TransformerDecoderLayer` from a `LlamaDecoderLayer` state dict.

    The Hugging Face `LlamaDecoderLayer` computes
    `x = x + attn(rms(x)); x = x + mlp(rms(x))` with
    `mlp(x) = down_proj(silu(gate_proj(x)) * up_proj(x))`. Its entries map as:

    - `self_attn.{q,k,v,o}_proj.*` to `self_attention` (see
      `multi_head_attention_from_llama`);
    - `input_layernorm.weight` `(D,)` to `self_attention_norm` and
      `post_attention_layernorm.weight` `(D,)` to `feed_forward_norm`
      (Keras `RMSNormalization` `scale`);
    - `mlp.gate_proj.weight` `(F, D)` to `feed_forward.gate_dense`,
      `mlp.up_proj.weight` `(F, D)` to `feed_forward.intermediate_dense`
      and `mlp.down_proj.weight` `(D, F)` to `feed_forward.output_dense`
      (kernels `W.T`; biases `(F,)`, `(F,)`, `(D,)` only with
      `mlp_bias=True`).

    The result is `TransformerDecoderLayer(H, intermediate_dim=F,
    num_key_value_heads=H_kv, rope_max_wavelength=rope_theta,
    normalization="rms", normalize_first=True, use_bias=...,
    gated_feed_forward=True, activation="silu",
    layer_norm_epsilon=rms_norm_eps)`, built without memory (a decoder-only
    block). It is causal by default, as Llama; positions are `0 .. T - 1`.
    keras_attn has one `use_bias` for the whole block, so the attention and
    MLP biases must be both present (`attention_bias=True`,
    `mlp_bias=True`) or both absent (Llama's default). Only `hidden_act`
    `"silu"` and the default RoPE (or `"linear"` scaling, via
    `rope_scaling_factor` in `**kwargs`) are reproduced.

    Args:
        state_dict: the layer's `state_dict()`, or the layer itself.
        num_heads: H, the config's `num_attention_heads`.
        num_key_value_heads: H_kv, the config's `num_key_value_heads`; must
            divide H.
        rope_theta: the config's `rope_theta`.
        rms_norm_eps: the config's `rms_norm_eps`.
        prefix: the prefix of the layer's entries in a larger state dict,
            e.g. `"model.layers.0."` (a missing final dot is added).
        **kwargs: further arguments of `keras_attn.TransformerDecoderLayer`
            (`name`, `dtype`, `dropout`, `rope_scaling_factor`,
            `sliding_window`, ...). The Llama structure (`intermediate_dim`,
            `key_dim`, `activation`, `layer_norm_epsilon`,
            `normalize_first`, `num_key_value_heads`, `rope_max_wavelength`,
            `normalization`, `use_bias`, `gated_feed_forward`) is fixed or
            read from the weights and cannot be passed.

    Returns:
        A `keras_attn.TransformerDecoderLayer` built for inputs `(B, T, D)`
        without memory, with `intermediate_dim` F, H heads of width d (the
        `key_dim`, read from the weights), and the Llama layer's weights.

    Raises:
        ValueError: an entry is missing or mis-shaped, only some biases are
            present, an unexpected entry is present, or H_kv does not
            divide H.
    """
    _common.check_num_heads(num_heads)
    _check_key_value_heads(num_heads, num_key_value_heads)
    _common.check_kwargs(kwargs, _LLAMA_DERIVED, "state dict or the Llama-named arguments")
    entries = _common.StateDict(state_dict, prefix)
    mlp = ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
    entries.require("input_layernorm.weight", "post_attention_layernorm.weight",
                    *(n + ".weight" for n in mlp))
    D, d, use_bias, attention_weights = _llama_attention(
        entries, num_heads, num_key_value_heads, "self_attn.")
    mlp_bias = [entries.has(n + ".bias") for n in mlp]
    if any(mlp_bias) != use_bias or len(set(mlp_bias)) > 1:
        state = {True: "present", False: "absent"}
        raise ValueError(
            "keras_attn.TransformerDecoderLayer has one `use_bias` for the attention and the "
            "feed-forward: the biases of self_attn.{q,k,v,o}_proj and of mlp.{gate,up,down}_proj "
            "must all be present or all be absent. Received: "
            f"self_attn biases {state[use_bias]}, "
            + ", ".join(f"{entries.key(n + '.bias')} {state[f]}" for n, f in zip(mlp, mlp_bias)))
    F = entries.rank("mlp.gate_proj.weight", 2, "(F, D)").shape[0]
    gate_w = entries.shaped("mlp.gate_proj.weight", "(F, D)", (F, D))
    up_w = entries.shaped("mlp.up_proj.weight", "(F, D)", (F, D))
    down_w = entries.shaped("mlp.down_proj.weight", "(D, F)", (D, F))
    gate_b = up_b = down_b = None
    if use_bias:
        gate_b = entries.shaped("mlp.gate_proj.bias", "(F,)", (F,))
        up_b = entries.shaped("mlp.up_proj.bias", "(F,)", (F,))
        down_b = entries.shaped("mlp.down_proj.bias", "(D,)", (D,))
    input_norm = entries.shaped("input_layernorm.weight", "(D,)", (D,))
    post_norm = entries.shaped("post_attention_layernorm.weight", "(D,)", (D,))
    entries.check_all_used()

    layer = TransformerDecoderLayer(
        num_heads, intermediate_dim=F, key_dim=d, num_key_value_heads=num_key_value_heads,
        rope_max_wavelength=rope_theta, normalization="rms", normalize_first=True,
        use_bias=use_bias, gated_feed_forward=True, activation="silu",
        layer_norm_epsilon=rms_norm_eps, **kwargs)
    layer.build((None, None, D))
    feed_forward = layer.feed_forward
    plan = _common.mha_plan(layer.self_attention, attention_weights)
    plan += _common.dense_plan(feed_forward.gate_dense, gate_w.T, gate_b, "mlp.gate_proj")
    plan += _common.dense_plan(feed_forward.intermediate_dense, up_w.T, up_b, "mlp.up_proj")
    plan += _common.dense_plan(feed_forward.output_dense, down_w.T, down_b, "mlp.down_proj")
    plan += [(layer.self_attention_norm.scale, input_norm, "input_layernorm weight"),
             (layer.feed_forward_norm.scale, post_norm, "post_attention_layernorm weight")]
    _common.assign(plan)
    return layer
