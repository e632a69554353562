"""keras_attn layers from Hugging Face Llama state dicts: `LlamaAttention`, `LlamaDecoderLayer`.

transformers is never imported: the state dict's tensors are read as arrays
(see `keras_attn.convert`). These converters take no config: the sizes (D, d, F)
and the biases are read from the weights, H, H_kv, `rope_theta` and
`rms_norm_eps` are arguments. What is then mapped onto the layer, entry by entry, is
`keras_attn.convert.transformers`' Llama mapping (`_attention_plan`, `_block_plan`),
the one the config-reading converters use; the shapes are checked against the weights'
own sizes (`_shaped`), not against a config.
"""

from collections.abc import Mapping
from typing import Any

from keras_attn.convert import _common
from keras_attn.convert._transformers_config import LayerSpec, ModelSpec
from keras_attn.convert._weight_plan import _attention_plan, _block_plan
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


def _shaped(entries, name, shape, letters, fields):
    """The plans' shape check without a config: entry `name` must have `shape` (there is no
    config field to name, so `fields` is not used)."""
    del fields
    return entries.shaped(name, letters, shape)


def _attention_sizes(entries, num_heads, sub=""):
    """`(D, d, use_bias)` of a `LlamaAttention` state dict under `sub`, read from its weights:
    the four projections are required, their biases all present or all absent, and
    `q_proj.weight` `(H * d, D)` gives D and d."""
    H = num_heads
    entries.require(*(sub + n + "_proj.weight" for n in ("q", "k", "v", "o")))
    bias_names = [sub + n + "_proj.bias" for n in ("q", "k", "v", "o")]
    present = [n for n in bias_names if entries.has(n)]
    if present and len(present) != len(bias_names):
        absent = [n for n in bias_names if not entries.has(n)]
        raise ValueError(
            f"state_dict has {', '.join(entries.key(n) for n in present)} but is missing "
            f"{', '.join(entries.key(n) for n in absent)}: keras_attn.MultiHeadAttention has "
            "biases on all four projections (Llama's `attention_bias=True`) or on none.")
    Hd, D = entries.rank(sub + "q_proj.weight", 2, "(H * d, D)").shape
    if Hd % H:
        raise ValueError(
            f"The query width H * d = {Hd} (from {entries.key(sub + 'q_proj.weight')}) must be "
            f"divisible by num_heads. Received: num_heads={H}")
    return D, Hd // H, bool(present)


def _llama_spec(num_heads, num_key_value_heads, D, d, use_bias, F=0, epsilon=1e-6):
    """The `ModelSpec` of one Llama layer with these sizes, for the plans (which read its
    sizes, biases and norms; the model-level fields are placeholders they do not read)."""
    return ModelSpec(
        family="llama", vocabulary_size=0, hidden_dim=D, intermediate_dim=F, num_layers=1,
        num_heads=num_heads, num_key_value_heads=num_key_value_heads, head_dim=d,
        activation="silu", epsilon=epsilon, attention_dropout=0.0, tie_word_embeddings=False,
        qkv_bias=use_bias, output_bias=use_bias, mlp_bias=use_bias, qk_norm=False,
        final_logit_soft_cap=None, layers=[LayerSpec({})])


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
    D, d, use_bias = _attention_sizes(entries, num_heads)
    layer = MultiHeadAttention(num_heads, key_dim=d, num_key_value_heads=num_key_value_heads,
                               rope_max_wavelength=rope_theta, use_bias=use_bias, **kwargs)
    layer.build(query_shape=(None, None, D))
    spec = _llama_spec(num_heads, num_key_value_heads, D, d, use_bias)
    plan = _attention_plan(entries, spec, layer, check=_shaped)
    entries.check_all_used()
    _common.assign(plan)
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
    D, d, use_bias = _attention_sizes(entries, num_heads, "self_attn.")
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

    layer = TransformerDecoderLayer(
        num_heads, intermediate_dim=F, key_dim=d, num_key_value_heads=num_key_value_heads,
        rope_max_wavelength=rope_theta, normalization="rms", normalize_first=True,
        use_bias=use_bias, gated_feed_forward=True, activation="silu",
        layer_norm_epsilon=rms_norm_eps, **kwargs)
    layer.build((None, None, D))
    spec = _llama_spec(num_heads, num_key_value_heads, D, d, use_bias, F, rms_norm_eps)
    plan = _block_plan(entries, spec, layer, check=_shaped)
    entries.check_all_used()
    _common.assign(plan)
    return layer
