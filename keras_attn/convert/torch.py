"""keras_attn layers from `torch.nn` state dicts.

`multi_head_attention_from_torch` reads a `torch.nn.MultiheadAttention`,
`transformer_encoder_layer_from_torch` and `transformer_decoder_layer_from_torch`
a `TransformerEncoderLayer` and a `TransformerDecoderLayer`. torch is never
imported: the tensors are read as arrays (see `keras_attn.convert`).
"""

from collections.abc import Mapping
from typing import Any

from keras_attn.convert import _common
from keras_attn.layers.multi_head_attention import MultiHeadAttention
from keras_attn.layers.transformer_decoder import TransformerDecoderLayer
from keras_attn.layers.transformer_encoder import TransformerEncoderLayer

__all__ = ["multi_head_attention_from_torch", "transformer_decoder_layer_from_torch",
           "transformer_encoder_layer_from_torch"]

_TRANSFORMER_DERIVED = ("intermediate_dim", "key_dim", "activation", "layer_norm_epsilon",
                        "normalize_first")
_TORCH_ACTIVATIONS = ("relu", "gelu")  # torch's exact gelu is keras's default gelu


def _torch_mha(entries, num_heads, sub=""):
    """Check and read a `torch.nn.MultiheadAttention` state dict under `sub`.

    Returns `(D, D_k, D_v, use_bias, weights)` with `weights[part] = (kernel, bias)`
    in keras_attn's layout.
    """
    if entries.has(sub + "bias_k") or entries.has(sub + "bias_v"):
        raise ValueError(
            f"state_dict has {entries.key(sub + 'bias_k')} / {entries.key(sub + 'bias_v')}: "
            "torch.nn.MultiheadAttention(add_bias_kv=True) appends a learned key and value "
            "to every sequence, which keras_attn.MultiHeadAttention does not support.")
    packed = entries.has(sub + "in_proj_weight")
    separate = [sub + n for n in ("q_proj_weight", "k_proj_weight", "v_proj_weight")]
    if not packed and not any(entries.has(n) for n in separate):
        entries.require(sub + "in_proj_weight", hint=" (or the separate "
                        + ", ".join(entries.key(n) for n in separate) + ")")
    entries.require(sub + "out_proj.weight")
    if not packed:
        entries.require(*separate)
    has_in_bias, has_out_bias = entries.has(sub + "in_proj_bias"), entries.has(sub + "out_proj.bias")
    if has_in_bias != has_out_bias:
        present, absent = ((sub + "in_proj_bias", sub + "out_proj.bias") if has_in_bias
                           else (sub + "out_proj.bias", sub + "in_proj_bias"))
        raise ValueError(
            f"state_dict has {entries.key(present)} but is missing {entries.key(absent)}: "
            "keras_attn.MultiHeadAttention has biases on all four projections or on none.")
    use_bias = has_in_bias

    out_weight = entries.rank(sub + "out_proj.weight", 2, "(D, D)")
    D = out_weight.shape[0]
    entries.shaped(sub + "out_proj.weight", "(D, D)", (D, D))
    if D % num_heads:
        raise ValueError(
            f"The embedding width D={D} (from {entries.key(sub + 'out_proj.weight')}) must be "
            f"divisible by num_heads. Received: num_heads={num_heads}")
    if packed:
        in_weight = entries.shaped(sub + "in_proj_weight", "(3D, D)", (3 * D, D))
        q_w, k_w, v_w = in_weight[:D], in_weight[D:2 * D], in_weight[2 * D:]
    else:
        q_w = entries.shaped(sub + "q_proj_weight", "(D, D)", (D, D))
        k_w = entries.rank(sub + "k_proj_weight", 2, "(D, D_k)")
        k_w = entries.shaped(sub + "k_proj_weight", "(D, D_k)", (D, k_w.shape[1]))
        v_w = entries.rank(sub + "v_proj_weight", 2, "(D, D_v)")
        v_w = entries.shaped(sub + "v_proj_weight", "(D, D_v)", (D, v_w.shape[1]))
    q_b = k_b = v_b = out_b = None
    if use_bias:
        in_bias = entries.shaped(sub + "in_proj_bias", "(3D,)", (3 * D,))
        q_b, k_b, v_b = in_bias[:D], in_bias[D:2 * D], in_bias[2 * D:]
        out_b = entries.shaped(sub + "out_proj.bias", "(D,)", (D,))
    weights = {"query": (q_w.T, q_b), "key": (k_w.T, k_b), "value": (v_w.T, v_b),
               "output": (out_weight.T, out_b)}
    return D, k_w.shape[1], v_w.shape[1], use_bias, weights


def multi_head_attention_from_torch(state_dict: Mapping[str, Any], num_heads: int, *,
                                    prefix: str = "", **kwargs) -> MultiHeadAttention:
    """A `keras_attn.MultiHeadAttention` from a `torch.nn.MultiheadAttention` state dict.

    The torch module is `MultiheadAttention(D, H, batch_first=True)`, with
    optional `kdim=D_k`, `vdim=D_v` and `bias`. Its packed
    `in_proj_weight` `(3D, D)` (or `q_proj_weight` `(D, D)`, `k_proj_weight`
    `(D, D_k)`, `v_proj_weight` `(D, D_v)`), `in_proj_bias` `(3D,)`,
    `out_proj.weight` `(D, D)` and `out_proj.bias` `(D,)` become the
    kernels `W.T` and biases of `query_dense`, `key_dense`, `value_dense`
    and `output_dense`. Masks differ in sign: torch's `key_padding_mask`
    `(B, S)` is True = ignore; pass its negation as `key_mask=` (or as a
    bool `attention_mask` `(B, T, S)`, True = may attend).

    Args:
        state_dict: the module's `state_dict()` (a mapping from names to
            arrays or tensors), or the module itself.
        num_heads: H; it must divide D.
        prefix: the prefix of the module's entries in a larger state dict,
            e.g. `"encoder.layers.0.self_attn."` (a missing final dot is
            added). Entries outside the prefix are ignored.
        **kwargs: further arguments of `keras_attn.MultiHeadAttention`
            (`name`, `dropout`, `dtype`, `implementation`, ...). `key_dim`,
            `value_dim`, `output_dim` and `use_bias` are read from the
            weights and cannot be passed.

    Returns:
        A built `keras_attn.MultiHeadAttention` with H heads of width
        d = D // H, output width D, query width D, key width D_k, value
        width D_v, and `use_bias` True iff the biases are present.

    Raises:
        ValueError: an entry is missing or mis-shaped, the dict holds
            `bias_k`/`bias_v` (`add_bias_kv=True`) or other unexpected
            entries, or H does not divide D.
    """
    _common.check_num_heads(num_heads)
    _common.check_kwargs(kwargs, _common.MHA_DERIVED[1:], "state dict")
    entries = _common.StateDict(state_dict, prefix)
    D, D_k, D_v, use_bias, weights = _torch_mha(entries, num_heads)
    entries.check_all_used()
    layer = MultiHeadAttention(num_heads, key_dim=D // num_heads, use_bias=use_bias, **kwargs)
    layer.build(query_shape=(None, None, D), key_shape=(None, None, D_k),
                value_shape=(None, None, D_v))
    _common.assign(_common.mha_plan(layer, weights))
    return layer


def _torch_activation(activation):
    name = activation if isinstance(activation, str) else getattr(activation, "__name__", None)
    if name not in _TORCH_ACTIVATIONS:
        raise ValueError(
            f"`activation` must be one of {_TORCH_ACTIVATIONS} (torch's string options, or "
            f"torch.nn.functional.relu / gelu). Received: activation={activation!r}")
    return name


def _torch_layer_norm(entries, name, D):
    return (entries.shaped(name + ".weight", "(D,)", (D,)),
            entries.shaped(name + ".bias", "(D,)", (D,)))


def _torch_block(entries, num_heads, norms, cross):
    """Read a torch encoder/decoder layer: `(D, D_m, F, plan_fn)`."""
    required = ["linear1.weight", "linear1.bias", "linear2.weight", "linear2.bias"]
    required += [f"{n}.{w}" for n in norms for w in ("weight", "bias")]
    entries.require(*required, hint=" (keras_attn Transformer layers always have biases: a torch "
                    "layer built with bias=False cannot be converted)"
                    if any(not entries.has(n) for n in required if n.endswith("bias")) else "")
    D, D_k, D_v, use_bias, self_weights = _torch_mha(entries, num_heads, "self_attn.")
    if not use_bias:
        entries.require("self_attn.in_proj_bias", "self_attn.out_proj.bias")
    if (D_k, D_v) != (D, D):
        raise ValueError(
            f"The self-attention key and value widths must equal D={D}. "
            f"Received: D_k={D_k}, D_v={D_v}")
    D_m, cross_weights = None, None
    if cross:
        D_q, D_m, D_mv, use_bias, cross_weights = _torch_mha(entries, num_heads, "multihead_attn.")
        if not use_bias:
            entries.require("multihead_attn.in_proj_bias", "multihead_attn.out_proj.bias")
        if D_q != D:
            raise ValueError(
                f"state_dict entry {entries.key('multihead_attn.out_proj.weight')} must have "
                f"shape (D, D) = {_common.shape_text((D, D))}. "
                f"Received: shape {_common.shape_text((D_q, D_q))}")
        if D_mv != D_m:
            raise ValueError(
                "The cross-attention key and value widths must be equal (both are the memory "
                f"width D_m). Received: D_k={D_m}, D_v={D_mv}")
    F = entries.rank("linear1.bias", 1, "(F,)").shape[0]
    w1 = entries.shaped("linear1.weight", "(F, D)", (F, D))
    b1 = entries.get("linear1.bias")
    w2 = entries.shaped("linear2.weight", "(D, F)", (D, F))
    b2 = entries.shaped("linear2.bias", "(D,)", (D,))
    norm_weights = [_torch_layer_norm(entries, n, D) for n in norms]
    entries.check_all_used()

    def plan(layer):
        steps = _common.mha_plan(layer.self_attention, self_weights)
        if cross:
            steps += _common.mha_plan(layer.cross_attention, cross_weights)
        steps += _common.dense_plan(layer.feed_forward.intermediate_dense, w1.T, b1, "linear1")
        steps += _common.dense_plan(layer.feed_forward.output_dense, w2.T, b2, "linear2")
        ours = ["self_attention_norm"] + (["cross_attention_norm"] if cross else [])
        for norm_name, torch_name, (gamma, beta) in zip(ours + ["feed_forward_norm"], norms,
                                                       norm_weights):
            steps += _common.norm_plan(getattr(layer, norm_name), gamma, beta, torch_name)
        return steps

    return D, D_m, F, plan


def _transformer_options(num_heads, norm_first, activation, layer_norm_eps, kwargs):
    _common.check_num_heads(num_heads)
    _common.check_kwargs(kwargs, _TRANSFORMER_DERIVED, "state dict or the torch-named arguments")
    return {"activation": _torch_activation(activation), "layer_norm_epsilon": layer_norm_eps,
            "normalize_first": bool(norm_first), **kwargs}


def transformer_encoder_layer_from_torch(state_dict: Mapping[str, Any], num_heads: int, *,
                                         norm_first: bool = False, activation: str = "relu",
                                         layer_norm_eps: float = 1e-5, prefix: str = "",
                                         **kwargs) -> TransformerEncoderLayer:
    """A `keras_attn.TransformerEncoderLayer` from a `torch.nn.TransformerEncoderLayer` state dict.

    The torch layer is `TransformerEncoderLayer(D, H, F, batch_first=True)`
    with biases (the default). Its entries map as: `self_attn.*` to
    `self_attention` (see `multi_head_attention_from_torch`), `linear1`
    (`(F, D)`, `(F,)`) and `linear2` (`(D, F)`, `(D,)`) to
    `feed_forward.intermediate_dense` / `output_dense` (kernel `W.T`),
    `norm1` to `self_attention_norm` and `norm2` to `feed_forward_norm`
    (`weight` to gamma, `bias` to beta). Both compute post-LN
    `x = LN1(x + SA(x)); x = LN2(x + FF(x))`, or pre-LN with `norm_first`.
    torch's `src_key_padding_mask` `(B, T)` is True = ignore; ours,
    `padding_mask`, is True = real token.

    Args:
        state_dict: the layer's `state_dict()`, or the layer itself.
        num_heads: H (torch's `nhead`); it must divide D.
        norm_first: the torch layer's `norm_first` (pre-LN); becomes
            `normalize_first`.
        activation: the torch layer's activation: `"relu"` or `"gelu"`
            (exact, erf-based, like Keras's default `"gelu"`), or
            `torch.nn.functional.relu` / `gelu`.
        layer_norm_eps: the torch layer's `layer_norm_eps`.
        prefix: the prefix of the layer's entries in a larger state dict,
            e.g. `"encoder.layers.0."` (a missing final dot is added).
        **kwargs: further arguments of `keras_attn.TransformerEncoderLayer`
            (`dropout`, `name`, `dtype`, ...). Dropout defaults to 0, not to
            torch's 0.1.

    Returns:
        A `keras_attn.TransformerEncoderLayer` built for inputs
        `(B, T, D)`, with `intermediate_dim` F, H heads of width D // H, and
        the torch layer's weights.

    Raises:
        ValueError: an entry is missing (for example the biases of a torch
            layer built with `bias=False`) or mis-shaped, an unexpected
            entry is present, or an option is unsupported.
    """
    options = _transformer_options(num_heads, norm_first, activation, layer_norm_eps, kwargs)
    entries = _common.StateDict(state_dict, prefix)
    D, _, F, plan = _torch_block(entries, num_heads, ("norm1", "norm2"), cross=False)
    layer = TransformerEncoderLayer(num_heads, intermediate_dim=F, **options)
    layer.build((None, None, D))
    _common.assign(plan(layer))
    return layer


def transformer_decoder_layer_from_torch(state_dict: Mapping[str, Any], num_heads: int, *,
                                         norm_first: bool = False, activation: str = "relu",
                                         layer_norm_eps: float = 1e-5,
                                         memory_dim: int | None = None, prefix: str = "",
                                         **kwargs) -> TransformerDecoderLayer:
    """A `keras_attn.TransformerDecoderLayer` from a `torch.nn.TransformerDecoderLayer` state dict.

    The torch layer is `TransformerDecoderLayer(D, H, F, batch_first=True)`
    with biases. Its entries map as: `self_attn.*` to `self_attention`,
    `multihead_attn.*` to `cross_attention`, `linear1`/`linear2` to
    `feed_forward`, and `norm1`, `norm2`, `norm3` to `self_attention_norm`,
    `cross_attention_norm`, `feed_forward_norm`. The result is built with
    memory. Ours is causal by default; torch's equivalent is
    `tgt_mask=Transformer.generate_square_subsequent_mask(T)`,
    `tgt_is_causal=True`. torch's key padding masks are True = ignore;
    ours (`padding_mask`, `memory_padding_mask`) are True = real token.

    Args:
        state_dict: the layer's `state_dict()`, or the layer itself.
        num_heads: H (torch's `nhead`); it must divide D.
        norm_first: the torch layer's `norm_first`; becomes
            `normalize_first`.
        activation: `"relu"` or `"gelu"` (exact), or
            `torch.nn.functional.relu` / `gelu`.
        layer_norm_eps: the torch layer's `layer_norm_eps`.
        memory_dim: D_m, the width of `memory` `(B, S, D_m)`. Defaults to
            the width read from the cross-attention key weight (D for a
            torch `TransformerDecoderLayer`); if given, it must match it.
        prefix: the prefix of the layer's entries in a larger state dict,
            e.g. `"decoder.layers.0."` (a missing final dot is added).
        **kwargs: further arguments of `keras_attn.TransformerDecoderLayer`
            (`dropout`, `name`, `dtype`, ...). Dropout defaults to 0.

    Returns:
        A `keras_attn.TransformerDecoderLayer` built for inputs `(B, T, D)`
        and memory `(B, S, D_m)`, with `intermediate_dim` F and the torch
        layer's weights.

    Raises:
        ValueError: an entry is missing or mis-shaped, an unexpected entry
            is present, `memory_dim` disagrees with the weights, or an
            option is unsupported.
    """
    options = _transformer_options(num_heads, norm_first, activation, layer_norm_eps, kwargs)
    if memory_dim is not None and (isinstance(memory_dim, bool) or not isinstance(memory_dim, int)
                                   or memory_dim <= 0):
        raise ValueError(f"`memory_dim` must be a positive integer or None. Received: "
                         f"memory_dim={memory_dim!r}")
    entries = _common.StateDict(state_dict, prefix)
    D, D_m, F, plan = _torch_block(entries, num_heads, ("norm1", "norm2", "norm3"), cross=True)
    if memory_dim is not None and memory_dim != D_m:
        raise ValueError(
            f"`memory_dim` must match the width of {entries.key('multihead_attn.k_proj_weight')} "
            f"or {entries.key('multihead_attn.in_proj_weight')}, D_m={D_m}. "
            f"Received: memory_dim={memory_dim}")
    layer = TransformerDecoderLayer(num_heads, intermediate_dim=F, **options)
    layer.build((None, None, D), memory_shape=(None, None, D_m))
    _common.assign(plan(layer))
    return layer

