"""Hugging Face `transformers` configs read per model family: every field read, refused or ignored.

A config is a `transformers` config object (read through `to_dict()`) or a
plain dict (a `config.json`). `read_config` finds the family module of its
`model_type` (`keras_attn.convert.families`, one module per family, each with its
`FIELDS` and its `spec(config)`), checks every key against that family's table and
returns the module's `ModelSpec`. What this module holds is family-neutral: the
fields every config has, `ModelSpec` / `LayerSpec`, the field checks and the RoPE
reader (`_rope`) the family modules call. Every key must be in the family's table:

- `read`: reproduced (each one changes the converted model);
- `neutral`: refused with a `ValueError` naming the field unless it holds its
  neutral value (the one that leaves the computation as keras_attn does it);
- `ignored`: does not change the logits (with the reason, in `IGNORED`).

A key in none of these is refused too ("unknown"), so a field added by a
newer `transformers` cannot be dropped silently. `family_table()` returns the
tables, for the documentation and the tests.
"""

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from keras_attn.convert._transformers4_fields import IGNORED_4, NEUTRAL_4
from keras_attn.rope import RopeSpec

__all__ = ["LayerSpec", "ModelSpec", "family_table", "read_config"]

# Keys of every `PretrainedConfig` (and of config.json files) that do not change the logits.
IGNORED = {
    "_name_or_path": "metadata", "transformers_version": "metadata",
    "architectures": "the class names: cross-checked against `model_type` "
                     "(`families.check_architectures`)", "model_type": "read to choose the family",
    "dtype": "the Keras model's dtype policy decides", "torch_dtype": "as `dtype`",
    "id2label": "labels of classification heads", "label2id": "as `id2label`",
    "problem_type": "loss of classification heads", "output_attentions": "what is returned",
    "output_hidden_states": "what is returned", "return_dict": "what is returned",
    "use_return_dict": "what is returned", "torchscript": "how torch exports",
    "chunk_size_feed_forward": "chunking of the MLP: the same values",
    "use_cache": "keras_attn's `generate` always caches", "initializer_range": "initialisation",
    "bos_token_id": "tokenizer ids (pass `end_token_id` to `generate`)",
    "eos_token_id": "as `bos_token_id`", "pad_token_id": "as `bos_token_id`",
    "tie_encoder_decoder": "encoder-decoder models only",
    "max_position_embeddings": "the positions are not limited (yarn's default "
                               "original_max_position_embeddings reads it)",
    # transformers 4's PretrainedConfig fields (`_transformers4_fields`): 4.x configs too.
    **IGNORED_4,
}
NEUTRAL_ALL = {"is_encoder_decoder": (False, None), "add_cross_attention": (False, None),
               "pruned_heads": ({}, None), "quantization_config": (None,),
               "partial_rotary_factor": (1.0, None), **NEUTRAL_4}
ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu": "gelu",
               "gelu_pytorch_tanh": "gelu_approximate", "gelu_new": "gelu_approximate"}
LAYER_TYPES = ("full_attention", "sliding_attention")
@dataclasses.dataclass
class LayerSpec:
    """The keras_attn options of one decoder layer (`TransformerDecoderLayer` keywords)."""

    attention: dict[str, Any]  # AttentionOptions fields: RoPE, window, soft-cap, qk-norm, scale
    # This layer's head width and key/value heads where they differ from the model's
    # (Gemma 4's `per_layer_config`: `global_head_dim` on full-attention layers); None: the
    # model's `head_dim` / `num_key_value_heads`.
    head_dim: int | None = None
    num_key_value_heads: int | None = None
    intermediate_dim: int | None = None  # this layer's F (Gemma 4's double-wide MLP), or None
    kv_source: int | None = None  # the layer whose keys and values this one reuses, or None
    # `MixtureOfExperts` keywords when this layer's feed-forward is a mixture of experts
    # (`num_experts`, `num_experts_per_tok`, `intermediate_dim`, `norm_topk_prob`; gpt-oss
    # also `routing`, the biases and its `expert_activation`; DeepSeek V3 its `routing`,
    # `n_group`, `topk_group`, `routed_scaling_factor` and `shared_intermediate_dim`), or
    # None for the dense MLP (Qwen3-MoE's `mlp_only_layers` / `decoder_sparse_step`
    # schedule, DeepSeek V3's `first_k_dense_replace`).
    mixture_of_experts: dict[str, Any] | None = None
    # `GatedDeltaNet` keywords when this layer's attention is linear (Qwen 3.5's
    # "linear_attention" layers: `linear_attn`), or None for softmax attention (`attention`).
    linear_attention: dict[str, Any] | None = None


@dataclasses.dataclass
class ModelSpec:
    """What the config says, in keras_attn's terms (weights are checked against it)."""

    family: str
    vocabulary_size: int
    hidden_dim: int
    intermediate_dim: int
    num_layers: int
    num_heads: int
    num_key_value_heads: int
    head_dim: int
    activation: str
    epsilon: float
    attention_dropout: float
    tie_word_embeddings: bool
    qkv_bias: bool
    output_bias: bool
    mlp_bias: bool
    qk_norm: bool
    final_logit_soft_cap: float | None
    layers: list[LayerSpec]
    # Each field one fact (issue 32: `gemma` meant the first three at once).
    sandwich_norms: bool = False  # norms after attention and MLP too (Gemma 2 and 3)
    norm_offset: float = 0.0  # the norms multiply by `norm_offset + w` (Gemma: 1 + w)
    embedding_scale: float | None = None  # the embeddings times it (Gemma: sqrt(D))
    normalization: str = "rms"  # "rms" (RMSNorm) or "layer" (LayerNorm with a bias)
    gated_feed_forward: bool = True  # gate * up (SwiGLU, GeGLU); False: up then down
    residual_scale: float | None = None  # every residual branch times it (Granite)
    logits_scaling: float | None = None  # the logits divided by it (Granite)
    # (config field, value) when every block's feed-forward is a mixture of experts, which
    # keras_attn does not build yet (issue 34): the block and model converters refuse it,
    # naming the field; the attention converter converts the attention alone.
    mixture_of_experts: tuple | None = None
    layer_scalar: bool = False  # each layer's output times its `layer_scalar` weight (Gemma 4)
    per_layer_input_dim: int | None = None  # P of the per-layer input embeddings (Gemma 4)
    per_layer_vocabulary_size: int | None = None  # their vocabulary (Gemma 4), None: V
    # False: no norm before the sublayers (no `input_layernorm`), only
    # `post_attention_layernorm` / `post_feedforward_layernorm` after them (OLMo 2, EXAONE 4).
    input_norms: bool = True
    # x + attn(N(x)) + mlp(N(x)), one norm (`input_layernorm`) per block (Cohere 2)
    parallel_residual: bool = False
    # N, the rows of a learned absolute position table (GPT-2's `wpe`), or None: none
    position_embeddings: int | None = None
    # `MultiHeadLatentAttention` keywords when every block's self-attention is multi-head
    # latent attention (DeepSeek V3: `self_attn.q_a_proj`, `kv_a_proj_with_mqa`, ...), or
    # None: `MultiHeadAttention` from the sizes above.
    latent_attention: dict[str, Any] | None = None
    # Where a mixture's shared expert lies under a layer (DeepSeek V3's `mlp.shared_experts.`,
    # Qwen3-Next's `mlp.shared_expert.`).
    shared_expert_prefix: str = "mlp.shared_experts."
    # The config field of the dense MLPs' F, for the errors (Llama 4's `intermediate_size_mlp`:
    # its `intermediate_size` is the experts').
    intermediate_field: str = "intermediate_size"
    # Every mixture beside the dense MLP, each with its norms (Gemma 4's `enable_moe_block`:
    # a `ParallelMixtureOfExperts` feed-forward in a block without `feed_forward_norm`).
    parallel_dense_mlp: bool = False

    def layer_head_dim(self, index):
        """d of layer `index` (its own, or the model's `head_dim`)."""
        return self.layers[index].head_dim or self.head_dim

    def layer_kv_heads(self, index):
        """H_kv of layer `index` (its own, or the model's `num_key_value_heads`)."""
        return self.layers[index].num_key_value_heads or self.num_key_value_heads


def table_of(fields):
    """A family's `FIELDS` with the fields every config has: `{"read": [...], "neutral":
    {field: values}, "ignored": {field: why}}`."""
    return {"read": sorted(set(fields["read"])),
            "neutral": {**NEUTRAL_ALL, **fields.get("neutral", {})},
            "ignored": {**IGNORED, **fields.get("ignored", {})}}


def family_table():
    """`{model_type: {"read": [...], "neutral": {field: values}, "ignored": {field: why}}}`."""
    from keras_attn.convert import families

    return {name: table_of(families.family(name).FIELDS) for name in families.model_types()}


def _as_dict(config):
    if isinstance(config, Mapping):
        return dict(config)
    to_dict = getattr(config, "to_dict", None)
    if callable(to_dict):
        return dict(to_dict())
    raise ValueError("`config` must be a transformers config or a dict (a config.json). "
                     f"Received: config of type {type(config).__name__}")


def _refuse(field, value, why):
    raise ValueError(f"config field `{field}` is not supported ({why}). Received: "
                     f"{field}={value!r}")


def _positive_int(config, field, default=None):
    value = config.get(field, default)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"config field `{field}` must be a positive integer. "
                         f"Received: {field}={value!r}")
    return value


def _number(config, field, default=None, allow_none=False, positive=True):
    value = config.get(field, default)
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(
            value) or (positive and value <= 0) or value < 0:
        raise ValueError(f"config field `{field}` must be a {'positive' if positive else 'non-negative'} "
                         f"number. Received: {field}={value!r}")
    return float(value)


def check_fields(config, family, fields):
    """Refuse a field of `config` that `fields` (a family's `FIELDS`) does not classify, or a
    neutral one away from its neutral value."""
    table = table_of(fields)
    for field, value in config.items():
        if field in table["read"] or field in table["ignored"]:
            continue
        if field in table["neutral"]:
            if not any(value == neutral and isinstance(value, bool) == isinstance(neutral, bool)
                       for neutral in table["neutral"][field]):
                _refuse(field, value, "keras_attn reproduces only "
                        + " or ".join(repr(v) for v in table["neutral"][field]))
            continue
        _refuse(field, value, f"unknown to keras_attn's {family!r} converter, which refuses "
                "what it does not know to leave the logits unchanged; remove it from a dict "
                "config if it does")


def _rope(params, where, max_positions, *, partial_rotary=False, longrope=False):
    """AttentionOptions RoPE fields from one `rope_parameters` dict (named `where` in errors):
    `keras_attn.rope.RopeSpec.from_rope_parameters`, flat (`rope_max_wavelength`,
    `rope_type` and the fields that differ from their defaults).

    `partial_rotary`: the family's modeling rotates a leading slice of each head
    (`partial_rotary_factor`: Phi-3, GLM-4); elsewhere a factor other than 1 is refused,
    as those modelings rotate the whole head whatever the config says.
    `longrope`: the family's generation recomputes its cache at longrope's switch, as
    `CausalLM.generate` does (Phi-3's `prepare_inputs_for_generation`); elsewhere
    transformers keeps the short-rotated keys past the switch, which keras_attn's
    `generate` does not reproduce, so longrope is refused.
    """
    kind = (params.get("rope_type", params.get("type")) if isinstance(params, Mapping)
            else None)
    if not longrope and kind == "longrope":
        _refuse(f"{where}['rope_type']", kind,
                "this family's transformers generation keeps its cache across longrope's "
                "switch to the long factors; keras_attn's generate recomputes it there, as "
                "Phi-3's does (the phi3 family reads longrope)")
    partial = params.get("partial_rotary_factor") if isinstance(params, Mapping) else None
    if not partial_rotary and partial not in (None, 1, 1.0):
        _refuse(f"{where}['partial_rotary_factor']", partial,
                "this family's modeling rotates the whole head")
    spec = RopeSpec.from_rope_parameters(params, max_position_embeddings=max_positions,
                                         where=where)
    defaults = RopeSpec(max_wavelength=spec.max_wavelength).options()
    return {name: value for name, value in spec.options().items()
            if name in ("rope_max_wavelength", "rope_type") or value != defaults[name]}


def read_config(config):
    """The `ModelSpec` of a transformers config or dict; a `ValueError` for what is refused.

    The family module registered for `config["model_type"]`
    (`keras_attn.convert.families`) checks every field and reads the spec; a config whose
    `architectures` names another family's class is refused, naming both fields.
    """
    from keras_attn.convert import families  # the registry imports the modules it lists

    config = _as_dict(config)
    module = families.family(config.get("model_type"))
    families.check_architectures(config, module)  # `architectures` of another family: refused
    check_fields(config, module.MODEL_TYPE, module.FIELDS)
    return module.spec(config)
