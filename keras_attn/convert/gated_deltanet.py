"""A hybrid model's linear-attention blocks: `keras_attn.layers.GatedDeltaNet` from a
transformers Gated DeltaNet (Qwen 3.5's `Qwen3_5GatedDeltaNet`, a layer's `linear_attn`).

The family module reads the layer's fields into `LayerSpec.linear_attention` (the
`GatedDeltaNet` keywords); `convert/transformers.py` makes such a layer's block with
`layer(spec, index, dtype)` as its `attention=` and maps its weights with `plan`, each
entry cross-checked against the config before any is assigned.

Mapping (a torch `Linear` weight `W` `(out, in)` is the Keras kernel `W.T`):
`in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`, `out_proj` -> the `Dense` sublayers
of the same names; `conv1d.weight` `(C, 1, K)` -> `conv1d_kernel` `(C, K)`; `dt_bias`,
`A_log` -> the weights of the same names; `norm.weight` (the gated RMSNorm's `w`, without
an offset) -> `norm_scale`.
"""

from keras_attn.layers.gated_deltanet import GatedDeltaNet

__all__ = ["layer", "plan"]


def layer(spec, index, dtype=None):
    """The unbuilt `GatedDeltaNet` of layer `index` (named as the block's self-attention)."""
    return GatedDeltaNet(**spec.layers[index].linear_attention, name="self_attention",
                         dtype=dtype)


def plan(entries, spec, layer, sub, check):
    """Check and plan the Gated DeltaNet entries under `sub` (`...linear_attn.`) onto the
    built `layer`; `check(entries, name, shape, letters, fields)` as the attention's."""
    D = spec.hidden_dim
    H_k, H = layer.linear_num_key_heads, layer.linear_num_value_heads
    d_k, d_v, K = layer.linear_key_head_dim, layer.linear_value_head_dim, \
        layer.linear_conv_kernel_dim
    C = layer.conv_dim
    mixed = (f"linear_num_key_heads={H_k}, linear_key_head_dim={d_k}, linear_num_value_heads="
             f"{H}, linear_value_head_dim={d_v} (2 H_k d_k + H d_v = {C})")
    values = (f"linear_num_value_heads={H}, linear_value_head_dim={d_v} (H d_v = {H * d_v})")
    heads = f"linear_num_value_heads={H}"
    width = f"hidden_size={D}"
    parts = [("in_proj_qkv", layer.in_proj_qkv, (C, D), "(2 H_k d_k + H d_v, D)", mixed),
             ("in_proj_z", layer.in_proj_z, (H * d_v, D), "(H d_v, D)", values),
             ("in_proj_b", layer.in_proj_b, (H, D), "(H, D)", heads),
             ("in_proj_a", layer.in_proj_a, (H, D), "(H, D)", heads),
             ("out_proj", layer.out_proj, (D, H * d_v), "(D, H d_v)", values)]
    assignments = []
    for name, dense, shape, letters, fields in parts:
        w = check(entries, f"{sub}{name}.weight", shape, letters, f"{fields}, {width}")
        assignments.append((dense.kernel, w.T, f"linear_attn.{name} weight"))
    conv = check(entries, sub + "conv1d.weight", (C, 1, K), "(C, 1, K)",
                 f"{mixed}, linear_conv_kernel_dim={K}")
    assignments.append((layer.conv1d_kernel, conv[:, 0, :], "linear_attn.conv1d weight"))
    for name, variable in (("dt_bias", layer.dt_bias), ("A_log", layer.A_log)):
        w = check(entries, sub + name, (H,), "(H,)", heads)
        assignments.append((variable, w, f"linear_attn.{name}"))
    norm = check(entries, sub + "norm.weight", (d_v,), "(d_v,)", f"linear_value_head_dim={d_v}")
    assignments.append((layer.norm_scale, norm, "linear_attn.norm weight"))
    return assignments
