"""keras_attn models and layers from Hugging Face `transformers` decoder-only LMs, read from their configs.

Families (`config.model_type`): `llama`, `mistral`, `qwen2`, `qwen3`,
`gemma2`, `gemma3_text`, `gemma4_text`, `starcoder2`, `gemma`, `phi3`, `granite`,
`ministral`, `ministral3`, `glm4`, `smollm3`, `olmo2`, `olmo3`, `exaone4`, `cohere2`,
`gpt2`, `mixtral`, `qwen3_moe`, `gpt_oss` and `deepseek_v3` (their mixtures of experts a
`MixtureOfExperts` per block, from `mlp.gate.weight` and the fused
`mlp.experts.gate_up_proj` / `down_proj`, with gpt-oss's biases `mlp.gate.bias`,
`gate_up_proj_bias`, `down_proj_bias` after its `canonical_state_dict`; DeepSeek V3's
shared expert and correction bias, through `keras_attn.convert._experts`; its latent
attention, `self_attn.q_a_proj` ..., through `keras_attn.convert.latent_attention`'s map),
`qwen3_5_text` (a hybrid stack: its "linear_attention" layers' `linear_attn` a
`GatedDeltaNet`, mapped by `keras_attn.convert.gated_deltanet`; its gated attention's
`self_attn.gate_proj`, split from `q_proj` by the family, to `self_attention.gate_dense`),
`qwen3_next` (the same, its fused `in_proj_qkvz` / `in_proj_ba` split by the family; its
mixtures' shared expert under `ModelSpec.shared_expert_prefix`, `mlp.shared_expert.`)
`llama4_text` (its `feed_forward.*` and stacked experts renamed by the family; its
mixtures' shared expert under `mlp.shared_expert.` too)
(`deepseek_v32`,
`deepseek_v4` and the multimodal `llama4` are refused as `families.REFUSED` says), each a module of
`keras_attn.convert.families` (its fields, its spec, and its own weight names renamed or
split into the Llama layout mapped below). `deepseek_v3`'s latent attention also converts
one layer at a time through `keras_attn.convert.latent_attention`.
transformers is never imported: configs are
read through `to_dict()` (or are plain dicts, a `config.json`), tensors
through `keras_attn.convert._common.to_numpy`. The config's fields are
classified per family in `keras_attn.convert._transformers_config` (read,
refused unless neutral, ignored); a field in none of those is refused. The
weights are then checked against the config (H * d query rows, H_kv * d
key/value rows, d for the qk-norms, F, V, tied or not): a mismatch is a
`ValueError` naming the config field, the entry and both values. Nothing is
assigned before everything is checked.

The weights are mapped by `keras_attn.convert._weight_plan` (its docstring has the map).
"""

from collections.abc import Mapping
from typing import Any

import numpy as np

from keras_attn.convert import _common, gated_deltanet, pretrained
from keras_attn.convert._common import cross_check as _cross_check
from keras_attn.convert._transformers_config import ModelSpec, family_table, read_config
from keras_attn.convert._weight_plan import _attention_plan, _block_plan, _entries, model_plan
from keras_attn.layers._common import gelu_approximate
from keras_attn.layers.latent_attention import MultiHeadLatentAttention
from keras_attn.layers.mixture_of_experts import MixtureOfExperts
from keras_attn.layers.multi_head_attention import MultiHeadAttention
from keras_attn.layers.parallel_mixture_of_experts import ParallelMixtureOfExperts
from keras_attn.layers.transformer_decoder import TransformerDecoderLayer
from keras_attn.models.causal_lm import CausalLM

__all__ = ["causal_lm_from_transformers", "family_table",
           "multi_head_attention_from_transformers",
           "transformer_decoder_layer_from_transformers"]


def _check_feed_forward(spec: ModelSpec):
    """Refuse, naming the config field, a feed-forward keras_attn does not build."""
    if spec.mixture_of_experts is not None:
        field, value = spec.mixture_of_experts
        raise ValueError(
            f"config field `{field}` is not supported (every block's feed-forward of "
            f"{spec.family!r} is a mixture of experts, which keras_attn does not convert yet: "
            "issue 34 will add it; `multi_head_attention_from_transformers` converts each "
            f"block's attention). Received: {field}={value!r}")


def _block(spec: ModelSpec, index, name=None, dtype=None):
    """The unbuilt `TransformerDecoderLayer` of layer `index`."""
    _check_feed_forward(spec)
    activation = gelu_approximate if spec.activation == "gelu_approximate" else spec.activation
    moe = spec.layers[index].mixture_of_experts
    F = spec.layers[index].intermediate_dim or spec.intermediate_dim
    feed_forward: dict[str, Any]
    if moe is None:
        feed_forward = dict(intermediate_dim=F, gated_feed_forward=spec.gated_feed_forward,
                            activation=activation, feed_forward_use_bias=spec.mlp_bias)
    elif spec.parallel_dense_mlp:  # Gemma 4: its own norms, the router on the residual
        feed_forward = dict(use_feed_forward_norm=False, feed_forward=ParallelMixtureOfExperts(
            intermediate_dim=F, num_experts=moe["num_experts"],
            num_experts_per_tok=moe["num_experts_per_tok"],
            expert_intermediate_dim=moe["intermediate_dim"], activation=activation,
            epsilon=spec.epsilon, name="feed_forward", dtype=dtype))
    else:  # the block's `feed_forward=`: the dense MLP's flat arguments stay unset
        feed_forward = dict(feed_forward=MixtureOfExperts(
            **moe, activation=activation, name="feed_forward", dtype=dtype))
    flat = dict(num_heads=spec.num_heads, attention_use_bias=spec.qkv_bias,
                attention_output_use_bias=spec.output_bias,
                attention_dropout=spec.attention_dropout, **spec.layers[index].attention)
    attention: dict[str, Any]
    if spec.layers[index].linear_attention is not None:  # a hybrid stack's linear block
        attention = dict(attention=gated_deltanet.layer(spec, index, dtype))
    elif spec.latent_attention is None:
        attention = dict(key_dim=spec.layer_head_dim(index),
                         num_key_value_heads=spec.layer_kv_heads(index), **flat)
    else:  # DeepSeek V3: the block's self-attention is latent (its options its own)
        attention = dict(attention=MultiHeadLatentAttention(
            **spec.latent_attention, name="self_attention", dtype=dtype), **flat)
    return TransformerDecoderLayer(
        normalization=spec.normalization, normalize_first=True,
        layer_norm_epsilon=spec.epsilon, use_bias=spec.mlp_bias,
        use_post_attention_norm=spec.sandwich_norms or not spec.input_norms,
        use_post_ffw_norm=spec.sandwich_norms or not spec.input_norms,
        name=name, dtype=dtype, **attention, **feed_forward, **_block_options(spec))


def _block_options(spec):
    """The block keywords newer than the first families' (set only when used)."""
    options = {}
    if spec.residual_scale is not None:
        options["residual_scale"] = spec.residual_scale
    if spec.layer_scalar:
        options["use_layer_scalar"] = True
    if spec.per_layer_input_dim:
        options["hidden_size_per_layer_input"] = spec.per_layer_input_dim
    if not spec.input_norms:
        options["use_input_norm"] = False
    if spec.parallel_residual:
        options["use_parallel_residual"] = True
    return options


def _model_options(spec):
    """The CausalLM keywords newer than the first families' (set only when used)."""
    options = {}
    sources = [layer.kv_source for layer in spec.layers]
    if any(source is not None for source in sources):
        options["kv_sharing"] = sources
    if spec.per_layer_input_dim:
        options["hidden_size_per_layer_input"] = spec.per_layer_input_dim
        if spec.per_layer_vocabulary_size is not None:
            options["vocab_size_per_layer_input"] = spec.per_layer_vocabulary_size
    if spec.position_embeddings:
        options["max_position_embeddings"] = spec.position_embeddings
    return options


def _json_config(config):
    """The config as a plain JSON-able dict (kept on the model: `CausalLM.source_config`)."""
    import json

    from keras_attn.convert._transformers_config import _as_dict

    return json.loads(json.dumps(_as_dict(config), default=str))


def _check_layer_index(spec, layer_index):
    if isinstance(layer_index, bool) or not isinstance(layer_index, int) or not (
            0 <= layer_index < spec.num_layers):
        raise ValueError(f"`layer_index` must be an int in [0, num_hidden_layers="
                         f"{spec.num_layers}). Received: layer_index={layer_index!r}")


def _convert_layer(module_or_state_dict, config, layer_index, make, plan_of, prefix):
    """The layer converters' one path: read and check the config, `make(spec)` the built
    layer, check every state-dict entry under `prefix` against it (`plan_of`), then
    assign."""
    spec = read_config(config)
    _check_layer_index(spec, layer_index)
    entries = _entries(module_or_state_dict, spec, prefix)
    layer = make(spec)
    plan = plan_of(entries, spec, layer)
    entries.check_all_used()
    _common.assign(plan)
    return layer


def multi_head_attention_from_transformers(module_or_state_dict: Any, config: Any,
                                           layer_index: int = 0,
                                           prefix: str = "") -> MultiHeadAttention:
    """A `keras_attn.MultiHeadAttention` from the attention of layer `layer_index` of a transformers LM.

    Reads `q_proj`, `k_proj`, `v_proj`, `o_proj` (and `q_norm`, `k_norm`)
    relative to the attention module (e.g. `model.model.layers[i].self_attn`),
    with the options of that layer from the config: RoPE (per layer type for
    Gemma 3), the window of sliding layers, Gemma's scale and soft-cap,
    qk-norm. Call it as `layer(x, use_causal_mask=True)` on `(B, T, D)`;
    positions are `0 .. T - 1`.

    Args:
        module_or_state_dict: the attention module, or its state dict (a
            mapping from names to arrays or tensors).
        config: a transformers config of a supported family, or its dict.
        layer_index: which layer's options to use (0-based).
        prefix: where the attention's entries start in the state dict, for a whole
            model's (e.g. "model.layers.1.self_attn."); only keys under it are read.

    Returns:
        A built `keras_attn.MultiHeadAttention` for `(B, T, D)`.

    Raises:
        ValueError: a refused or unknown config field, an entry missing,
            extra or disagreeing with the config.
    """
    def make(spec):
        if spec.layers[layer_index].linear_attention is not None:
            raise ValueError(
                f"Layer {layer_index} is a linear-attention layer (config field `layer_types`"
                ": 'linear_attention'), not a multi-head attention: convert its block with "
                "`transformer_decoder_layer_from_transformers`. Received: layer_index="
                f"{layer_index}")
        if spec.latent_attention is not None:
            raise ValueError(
                f"config field `kv_lora_rank` is not supported here ({spec.family!r}'s "
                "attention is multi-head latent attention: convert it with "
                "keras_attn.convert.multi_head_latent_attention_from_transformers). "
                f"Received: kv_lora_rank={spec.latent_attention['kv_lora_rank']!r}")
        layer = MultiHeadAttention(
            spec.num_heads, spec.layer_head_dim(layer_index),
            num_key_value_heads=spec.layer_kv_heads(layer_index),
            use_bias=spec.qkv_bias, output_use_bias=spec.output_bias,
            dropout=spec.attention_dropout, **spec.layers[layer_index].attention)
        layer.build(query_shape=(None, None, spec.hidden_dim))
        return layer

    return _convert_layer(module_or_state_dict, config, layer_index, make, _attention_plan,
                          prefix)


def transformer_decoder_layer_from_transformers(module_or_state_dict: Any, config: Any,
                                                layer_index: int = 0,
                                                prefix: str = "") -> TransformerDecoderLayer:
    """A `keras_attn.TransformerDecoderLayer` from decoder layer `layer_index` of a transformers LM.

    Keys are relative to the layer (`self_attn.q_proj.weight`,
    `input_layernorm.weight`, `mlp.gate_proj.weight`, ...); see the module
    docstring for the mapping. The block is pre-norm RMS with a gated MLP,
    causal, with that layer's window and RoPE.

    Args:
        module_or_state_dict: the decoder layer, or its state dict.
        config: a transformers config of a supported family, or its dict.
        layer_index: which layer's options to use (0-based).
        prefix: where the layer's entries start in the state dict, for a whole
            model's (e.g. "model.layers.1."); only keys under it are read.

    Returns:
        A built decoder-only `keras_attn.TransformerDecoderLayer` for
        `(B, T, D)`.

    Raises:
        ValueError: a refused or unknown config field, an entry missing,
            extra or disagreeing with the config.
    """
    def make(spec):
        block = _block(spec, layer_index)
        block.build((None, None, spec.hidden_dim))
        return block

    return _convert_layer(module_or_state_dict, config, layer_index, make, _block_plan, prefix)


def causal_lm_from_transformers(model_or_config: Any, state_dict: Mapping[str, Any] | None = None,
                                **kwargs) -> CausalLM:
    """A `keras_attn.CausalLM` from a transformers `*ForCausalLM` (or its config and state dict).

    Args:
        model_or_config: a transformers `LlamaForCausalLM`,
            `MistralForCausalLM`, `Qwen2ForCausalLM`, `Qwen3ForCausalLM`,
            `Gemma2ForCausalLM` or `Gemma3ForCausalLM` (its `.config` and
            `.state_dict()` are read), a config (object or dict) with
            `state_dict`, or a checkpoint folder's path (`str` or
            `os.PathLike`: `config.json` and safetensors weights, read
            without torch by `keras_attn.convert.causal_lm_from_pretrained`).
        state_dict: with a config: the model's entries
            (`model.embed_tokens.weight`, `model.layers.{i}....`,
            `model.norm.weight`, `lm_head.weight` unless tied), arrays or
            tensors. None with a model.
        **kwargs: `name`, `dtype` of the `CausalLM` (the dtype, e.g.
            `"mixed_bfloat16"`, is its blocks' too).

    Returns:
        The built `keras_attn.CausalLM` with the weights set: `lm(ids)`
        gives the transformers model's logits, `lm.generate` its greedy
        tokens.

    Raises:
        ValueError: a refused or unknown config field (named, with its
            value), or an entry missing, extra or disagreeing with the
            config.
    """
    if state_dict is None and pretrained.is_checkpoint_path(model_or_config):
        # A checkpoint folder: read without torch (keras_attn.convert.pretrained).
        return pretrained.causal_lm_from_pretrained(model_or_config, **kwargs)
    if state_dict is None:
        config = getattr(model_or_config, "config", None)
        if config is None or not callable(getattr(model_or_config, "state_dict", None)):
            raise ValueError(
                "Pass a transformers *ForCausalLM module, a config with `state_dict`, or a "
                "checkpoint folder's path. "
                f"Received: {type(model_or_config).__name__} and state_dict=None")
        state_dict = model_or_config.state_dict()
    else:
        config = model_or_config
    spec = read_config(config)
    _check_feed_forward(spec)  # before any weight is read
    entries = _entries(state_dict, spec)
    V, D = spec.vocabulary_size, spec.hidden_dim
    sizes = f"vocab_size={V}, hidden_size={D}"
    embedding = _cross_check(entries, "model.embed_tokens.weight", (V, D), "(V, D)", sizes)
    head = None
    if spec.tie_word_embeddings:
        if entries.has("lm_head.weight"):
            tied = _cross_check(entries, "lm_head.weight", (V, D), "(V, D)", sizes)
            if not np.array_equal(tied, embedding):
                raise ValueError(
                    "The config and the weights disagree: tie_word_embeddings=True but "
                    "state_dict entry 'lm_head.weight' differs from 'model.embed_tokens.weight'.")
    else:
        entries.require("lm_head.weight", hint=" (the config has tie_word_embeddings=False: "
                        "the head is its own weight)")
        head = _cross_check(entries, "lm_head.weight", (V, D), "(V, D)",
                            f"tie_word_embeddings=False, {sizes}")
    with _common.deferred_variables():  # made without values: the checkpoint's are their first
        lm = CausalLM(
            V, D, [_block(spec, i, name=f"block_{i}", dtype=kwargs.get("dtype"))
                   for i in range(spec.num_layers)],
            normalization=spec.normalization, layer_norm_epsilon=spec.epsilon,
            tie_word_embeddings=spec.tie_word_embeddings, embedding_scale=spec.embedding_scale,
            final_logit_soft_cap=spec.final_logit_soft_cap,
            **({"logits_scaling": spec.logits_scaling} if spec.logits_scaling is not None
               else {}),
            **_model_options(spec), source_config=_json_config(config), **kwargs)
        plan = model_plan(entries, spec, lm, embedding, head)
        entries.check_all_used()
    _common.assign(plan)
    return lm
