"""`model_type="qwen3_next"` (Qwen3-Next-80B-A3B, transformers 5.24's `Qwen3NextForCausalLM`):
a hybrid stack of Gated DeltaNet blocks and gated softmax blocks, each with a mixture of
experts that has a gated shared expert.

`layer_types` says per layer "linear_attention" (`linear_attn`: a
`keras_attn.layers.GatedDeltaNet` of `linear_num_key_heads` H_k, `linear_num_value_heads`
H, `linear_key_head_dim` d_k, `linear_value_head_dim` d_v and `linear_conv_kernel_dim`, its
norm's epsilon `rms_norm_eps`, the short convolution's activation `hidden_act`) or
"full_attention" (`self_attn`); without it, every `full_attention_interval`-th layer (4) is
full, as transformers derives it.

Unlike Qwen 3.5's separate `in_proj_qkv` / `in_proj_z` / `in_proj_b` / `in_proj_a`, the
linear layers fuse their input projections per key head (`fix_query_key_value_ordering`):
`in_proj_qkvz` `(H_k (2 d_k + 2 r d_v), D)` holds, for each key head, its d_k query rows,
d_k key rows, then the r = H / H_k value heads' r d_v value rows and r d_v gate (z) rows;
`in_proj_ba` `(2 H, D)` the r b rows then the r a rows of each key head. Both are split on
load into the GatedDeltaNet's layout, the row counts cross-checked against the config.

The full layers' attention: `q_proj` `(2 H d, D)` holds, per head, d query rows then d gate
rows (split on load into `q_proj` and the gate, `MultiHeadAttention(use_gate=True)`);
per-head RMS `q_norm` / `k_norm`; RoPE on the leading `partial_rotary_factor` of each head
(0.25 by default), the halves pairing.

The feed-forwards (`Qwen3NextSparseMoeBlock`, where layer i is not in `mlp_only_layers`,
`num_experts > 0` and `(i + 1) % decoder_sparse_step == 0`; a dense SwiGLU of width
`intermediate_size` otherwise): a softmax over `num_experts` experts of width
`moe_intermediate_size`, the top `num_experts_per_tok` kept (renormalised when
`norm_topk_prob`), plus the shared expert `mlp.shared_expert` of width
`shared_expert_intermediate_size` times `sigmoid(x W)` (`mlp.shared_expert_gate`):
`keras_attn.MixtureOfExperts(shared_intermediate_dim=..., shared_expert_gate=True)`.

Every RMSNorm of the blocks, the final norm and the qk-norms multiply by `1 + w`
(`Qwen3NextRMSNorm`); the Gated DeltaNet's own gated norm by `w`.
"""

import numpy as np

from keras_attn.convert import _common
from keras_attn.convert._experts import QWEN2_MOE_MODULES, join_expert_modules, split_expert_modules
from keras_attn.convert._transformers_config import ModelSpec, _positive_int
from keras_attn.convert.families import _shared

MODEL_TYPE = "qwen3_next"
ARCHITECTURES = ("Qwen3NextForCausalLM", "Qwen3NextModel")  # transformers' classes (`architectures`)
_MOE = ("num_experts", "num_experts_per_tok", "moe_intermediate_size",
        "shared_expert_intermediate_size", "norm_topk_prob", "decoder_sparse_step",
        "mlp_only_layers")
FIELDS = {
    "read": _shared.CORE_FIELDS + _shared.LINEAR_FIELDS + _MOE + (
        "hidden_act", "rms_norm_eps", "attention_bias", "partial_rotary_factor",
        "layer_types", "full_attention_interval"),
    "neutral": {},
    "ignored": {
        **_shared.ROUTER_TRAINING_FIELDS,
    },
}
# Qwen3NextConfig's defaults for fields left out of a dict config.
_DEFAULTS = {"num_key_value_heads": 2, "head_dim": 256, "linear_conv_kernel_dim": 4,
             "linear_key_head_dim": 128, "linear_value_head_dim": 128,
             "linear_num_key_heads": 16, "linear_num_value_heads": 32,
             "decoder_sparse_step": 1, "moe_intermediate_size": 512,
             "shared_expert_intermediate_size": 512, "num_experts_per_tok": 10,
             "num_experts": 512, "norm_topk_prob": True, "mlp_only_layers": []}
# Qwen3-Next's name for the shared expert's MLP (`Qwen3NextSparseMoeBlock.shared_expert`).
SHARED_EXPERT_PREFIX = "mlp.shared_expert."


def _moe_layers(config, num_layers, num_experts):
    """Whether each layer's feed-forward is a mixture (transformers' rule)."""
    step = _positive_int(config, "decoder_sparse_step")
    dense = config.get("mlp_only_layers") or []
    if not isinstance(dense, (list, tuple)) or not all(
            isinstance(i, int) and not isinstance(i, bool) and 0 <= i < num_layers
            for i in dense):
        _shared.refuse("mlp_only_layers", dense,
                       f"layer indices in [0, {num_layers}) are needed")
    return [i not in dense and num_experts > 0 and (i + 1) % step == 0
            for i in range(num_layers)]


def _mixture(config):
    """The `MixtureOfExperts` keywords of a sparse layer, and the number of experts."""
    experts = config.get("num_experts")
    if isinstance(experts, bool) or not isinstance(experts, int) or experts < 0:
        _shared.refuse("num_experts", experts, "a number of experts >= 0 is needed")
    if not experts:
        return None, 0
    k = _positive_int(config, "num_experts_per_tok")
    if k > experts:
        _shared.refuse("num_experts_per_tok", k, f"at most num_experts={experts}")
    norm = config.get("norm_topk_prob")
    if not isinstance(norm, bool):
        _shared.refuse("norm_topk_prob", norm, "True or False is needed")
    return dict(num_experts=experts, num_experts_per_tok=k,
                intermediate_dim=_positive_int(config, "moe_intermediate_size"),
                norm_topk_prob=norm,
                shared_intermediate_dim=_positive_int(config, "shared_expert_intermediate_size"),
                shared_expert_gate=True), experts


def spec(config):
    # Qwen3NextConfig sets partial_rotary_factor 0.25 when absent (into rope_parameters).
    config = {**_DEFAULTS, "partial_rotary_factor": 0.25, **config}
    core = _shared.core(config, tie_default=False)
    n = core["num_layers"]
    types = _shared.hybrid_layer_types(config, n)
    linear = _shared.gated_deltanet_arguments(config, core)
    moe, experts = _mixture(config)
    where = "rope_parameters" if config.get("rope_parameters") else "rope_scaling"
    rope = _shared.check_rotary_width(_shared.rope_of(config, partial_rotary=True),
                                      core["head_dim"], where)
    layers = _shared.layer_specs(n, rope, qk_norm="rms", qk_norm_epsilon=core["epsilon"],
                                 use_gate=True)
    for layer, kind, sparse in zip(layers, types, _moe_layers(config, n, experts), strict=True):
        if kind == "linear_attention":
            layer.attention, layer.linear_attention = {}, dict(linear)
        if sparse:
            layer.mixture_of_experts = dict(moe)
    bias = bool(config.get("attention_bias", False))
    return ModelSpec(
        **core, qkv_bias=bias, output_bias=bias, mlp_bias=False, qk_norm=True,
        final_logit_soft_cap=None, norm_offset=1.0, layers=layers,
        shared_expert_prefix=SHARED_EXPERT_PREFIX)


def _linear_sizes(spec):
    """H_k, r = H / H_k, d_k, d_v of the linear layers (the same in each)."""
    linear = next(layer.linear_attention for layer in spec.layers
                  if layer.linear_attention is not None)
    H_k, H = linear["linear_num_key_heads"], linear["linear_num_value_heads"]
    return H_k, H // H_k, linear["linear_key_head_dim"], linear["linear_value_head_dim"]


def _rows(entries, key, rows, fields):
    part = _common.to_numpy(entries.pop(key), f"state_dict entry {key!r}")
    if part.ndim != 2 or part.shape[0] != rows:
        raise ValueError(
            f"The config and the weights disagree: {fields} give {rows} rows for state_dict "
            f"entry {key!r}, which has shape {_common.shape_text(part.shape)}.")
    return part


def _split_linear(entries, spec):
    """Each `in_proj_qkvz` / `in_proj_ba` split per key head (see the module docstring)."""
    keys = [k for k in entries if isinstance(k, str)
            and k.endswith(("in_proj_qkvz.weight", "in_proj_ba.weight"))]
    if not keys or all(layer.linear_attention is None for layer in spec.layers):
        return entries  # none to split (an entry no layer reads is refused by name)
    H_k, r, d_k, d_v = _linear_sizes(spec)
    heads = (f"linear_num_key_heads={H_k}, linear_num_value_heads={H_k * r}, "
             f"linear_key_head_dim={d_k}, linear_value_head_dim={d_v}")
    for key in keys:
        prefix = key[:key.rindex("in_proj_")]
        if key.endswith("in_proj_qkvz.weight"):
            width = 2 * d_k + 2 * r * d_v
            part = _rows(entries, key, H_k * width,
                         f"{heads} (H_k (2 d_k + 2 r d_v) = {H_k * width})")
            groups = part.reshape(H_k, width, -1)
            q, k = groups[:, :d_k], groups[:, d_k:2 * d_k]
            v, z = groups[:, 2 * d_k:2 * d_k + r * d_v], groups[:, 2 * d_k + r * d_v:]
            D = part.shape[1]
            entries[prefix + "in_proj_qkv.weight"] = np.concatenate(
                [q.reshape(-1, D), k.reshape(-1, D), v.reshape(-1, D)])
            entries[prefix + "in_proj_z.weight"] = z.reshape(-1, D)
        else:
            part = _rows(entries, key, 2 * H_k * r, f"{heads} (2 H = {2 * H_k * r})")
            groups = part.reshape(H_k, 2 * r, -1)
            entries[prefix + "in_proj_b.weight"] = groups[:, :r].reshape(H_k * r, -1)
            entries[prefix + "in_proj_a.weight"] = groups[:, r:].reshape(H_k * r, -1)
    return entries


def canonical_state_dict(entries, spec):
    """The linear layers' `in_proj_qkvz` and `in_proj_ba` split into `in_proj_qkv`,
    `in_proj_z`, `in_proj_b`, `in_proj_a`; each full layer's `self_attn.q_proj` `(2 H d, D)`
    (and bias) split per head into `q_proj` and `gate_proj` `(H d, D)`; every row count
    cross-checked against the config; the checkpoint's one module per expert stacked
    into the fused experts (`convert._experts.join_expert_modules`)."""
    entries = join_expert_modules(entries, QWEN2_MOE_MODULES)
    entries = _split_linear(entries, spec)
    return _shared.split_query_gate(entries, spec.num_heads, spec.head_dim)


def checkpoint_state_dict(tensors, spec):
    """The inverse (`CausalLM.save_pretrained`): `in_proj_qkv` / `in_proj_z` and
    `in_proj_b` / `in_proj_a` fused back per key head, `q_proj` and `gate_proj` interleaved
    per head back into `q_proj`; the experts one module each, as transformers writes them."""
    tensors = split_expert_modules(tensors, QWEN2_MOE_MODULES)
    tensors = _shared.join_query_gate(tensors, spec.num_heads, spec.head_dim)
    keys = [k for k in tensors if k.endswith("linear_attn.in_proj_qkv.weight")]
    if not keys:
        return tensors
    H_k, r, d_k, d_v = _linear_sizes(spec)
    for key in keys:
        prefix = key[:-len("in_proj_qkv.weight")]
        qkv, z = tensors.pop(key), tensors.pop(prefix + "in_proj_z.weight")
        D = qkv.shape[1]
        q, k, v = np.split(qkv, [H_k * d_k, 2 * H_k * d_k])
        tensors[prefix + "in_proj_qkvz.weight"] = np.concatenate(
            [q.reshape(H_k, d_k, D), k.reshape(H_k, d_k, D), v.reshape(H_k, r * d_v, D),
             z.reshape(H_k, r * d_v, D)], axis=1).reshape(-1, D)
        b, a = tensors.pop(prefix + "in_proj_b.weight"), tensors.pop(prefix + "in_proj_a.weight")
        tensors[prefix + "in_proj_ba.weight"] = np.concatenate(
            [b.reshape(H_k, r, D), a.reshape(H_k, r, D)], axis=1).reshape(-1, D)
    return tensors
