"""`model_type="qwen3_5_text"` (Qwen 3.5's language model, transformers 5.24's
`Qwen3_5ForCausalLM`): a hybrid stack of Gated DeltaNet blocks and gated softmax blocks.

`layer_types` says per layer "linear_attention" (`linear_attn`: a
`keras_attn.layers.GatedDeltaNet` of `linear_num_key_heads` H_k, `linear_num_value_heads`
H, `linear_key_head_dim`, `linear_value_head_dim` and `linear_conv_kernel_dim`, its norm's
epsilon `rms_norm_eps`, the short convolution's activation `hidden_act`) or
"full_attention" (`self_attn`); without it, every `full_attention_interval`-th layer (4) is
full, as transformers derives it. The full layers' attention:

- `q_proj` `(2 H d, D)` holds, per head, d query rows then d gate rows
  (`q_proj(x).view(..., H, 2d).chunk(2)`): split on load into `q_proj` and the gate
  (`MultiHeadAttention(use_gate=True)`: the attended values times `sigmoid(x W_g)` per head,
  before `o_proj`), and joined back when written;
- per-head RMS `q_norm` / `k_norm`, RoPE on the leading `partial_rotary_factor` of each head
  (0.25 by default) with the halves pairing; the multimodal RoPE fields
  (`rope_parameters['mrope_section']`, `['mrope_interleaved']`) recompose the frequencies
  from the three position axes, which a text model's positions fill alike: the identity.

Every RMSNorm of the blocks, the final norm and the qk-norms multiply by `1 + w`
(`Qwen3_5RMSNorm`); the Gated DeltaNet's own gated norm by `w`.
"""

from collections.abc import Mapping

from keras_attn.convert._transformers_config import ModelSpec
from keras_attn.convert.families import _shared

MODEL_TYPE = "qwen3_5_text"
ARCHITECTURES = ("Qwen3_5ForCausalLM", "Qwen3_5TextModel")  # transformers' classes (`architectures`)
FIELDS = {
    "read": _shared.CORE_FIELDS + _shared.LINEAR_FIELDS + (
        "hidden_act", "rms_norm_eps", "attention_bias", "partial_rotary_factor",
        "layer_types", "full_attention_interval"),
    # The released configs say the attention output is gated; transformers always gates.
    "neutral": {"attn_output_gate": (True,)},
    "ignored": {
        "mtp_num_hidden_layers": "the multi-token-prediction layers (`mtp.*`), which "
                                 "transformers' Qwen3_5ForCausalLM neither builds nor loads",
        "mtp_use_dedicated_embeddings": "as mtp_num_hidden_layers",
    },
}
# Qwen3_5TextConfig's defaults for fields left out of a dict config.
_DEFAULTS = {"num_key_value_heads": 4, "head_dim": 256, "linear_conv_kernel_dim": 4,
             "linear_key_head_dim": 128, "linear_value_head_dim": 128,
             "linear_num_key_heads": 16, "linear_num_value_heads": 32}
_MROPE = ("mrope_section", "mrope_interleaved")


def _without_mrope(config):
    """The config with the multimodal RoPE keys checked and taken out of its RoPE
    parameters (an identity for text: see the module docstring)."""
    for where in ("rope_parameters", "rope_scaling"):
        params = config.get(where)
        if not isinstance(params, Mapping) or not any(k in params for k in _MROPE):
            continue
        section = params.get("mrope_section")
        if section is not None and (not isinstance(section, (list, tuple)) or not all(
                isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in section)):
            _shared.refuse(f"{where}['mrope_section']", section,
                           "a list of non-negative ints is needed")
        if params.get("mrope_interleaved") not in (None, True, False):
            _shared.refuse(f"{where}['mrope_interleaved']", params["mrope_interleaved"],
                           "True or False is needed")
        config = {**config, where: {k: v for k, v in params.items() if k not in _MROPE}}
    return config


def spec(config):
    # Qwen3_5TextConfig sets partial_rotary_factor 0.25 when absent (into rope_parameters).
    config = _without_mrope({**_DEFAULTS, "partial_rotary_factor": 0.25, **config})
    core = _shared.core(config, tie_default=False)
    n = core["num_layers"]
    types = _shared.hybrid_layer_types(config, n)
    linear = _shared.gated_deltanet_arguments(config, core)
    where = "rope_parameters" if config.get("rope_parameters") else "rope_scaling"
    rope = _shared.check_rotary_width(_shared.rope_of(config, partial_rotary=True),
                                      core["head_dim"], where)
    layers = _shared.layer_specs(n, rope, qk_norm="rms", qk_norm_epsilon=core["epsilon"],
                                 use_gate=True)
    for layer, kind in zip(layers, types, strict=True):
        if kind == "linear_attention":
            layer.attention, layer.linear_attention = {}, dict(linear)
    bias = bool(config.get("attention_bias", False))
    return ModelSpec(
        **core, qkv_bias=bias, output_bias=bias, mlp_bias=False, qk_norm=True,
        final_logit_soft_cap=None, norm_offset=1.0, layers=layers)


def canonical_state_dict(entries, spec):
    """Each full layer's `self_attn.q_proj` `(2 H d, D)` (and bias) split per head into
    `q_proj` and `gate_proj` `(H d, D)`, the row count cross-checked against the config."""
    return _shared.split_query_gate(entries, spec.num_heads, spec.head_dim)


def checkpoint_state_dict(tensors, spec):
    """The inverse: `q_proj` and `gate_proj` interleaved per head back into `q_proj`."""
    return _shared.join_query_gate(tensors, spec.num_heads, spec.head_dim)
