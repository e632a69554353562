"""Where each entry of a transformers state dict goes in the keras_attn layers built from
its config: the weight plans `[(variable, array, what)]` of an attention, a block and a
whole model, every entry checked against the config before anything is assigned
(`keras_attn.convert.transformers` builds the layers; `keras_attn.convert.pretrained`
runs `model_plan` backwards to write a checkpoint).

Mapping (`W` a torch `Linear` weight `(out, in)`, a Keras kernel is `W.T`):
`self_attn.{q,k,v,o}_proj` to `self_attention.{query,key,value,output}_dense`,
`self_attn.{q,k}_norm` to `self_attention.{query,key}_norm`,
`input_layernorm` to `self_attention_norm`, `mlp.{gate,up,down}_proj` to
`feed_forward.{gate,intermediate,output}_dense`, `self_attn.sinks` (gpt-oss) to
`self_attention.sinks` where the layer has `use_sinks`; Llama-style layers map
`post_attention_layernorm` to `feed_forward_norm`, Gemma's (four norms) map
it to `post_attention_norm`, `pre_feedforward_layernorm` to
`feed_forward_norm` and `post_feedforward_layernorm` to
`post_feed_forward_norm`; OLMo 2's and EXAONE 4's (no `input_layernorm`) map
`post_attention_layernorm` to `post_attention_norm` and `post_feedforward_layernorm` to
`post_feed_forward_norm` of a block with `use_input_norm=False`; OLMo 2's full-width
`q_norm` / `k_norm` are `(H * d,)` / `(H_kv * d,)`. Gemma's RMSNorms multiply by `1 + w`: the stored
`w` becomes the Keras scale `1 + w`. Gemma 4's `layer_scalar` (a buffer) maps to the
block's `layer_scalar`, its per-layer input weights (`per_layer_input_gate`,
`per_layer_projection`, `post_per_layer_input_norm`; the model's
`embed_tokens_per_layer`, `per_layer_model_projection`, `per_layer_projection_norm`) to
the sublayers of the same names; a layer's head width, key/value heads and MLP width
are its own where `ModelSpec.layers[i]` says so (checked against the weights as such).
"""

from collections.abc import Mapping

from keras_attn.convert import _common, families, gated_deltanet
from keras_attn.convert import latent_attention as _latent
from keras_attn.convert._common import cross_check as _cross_check
from keras_attn.convert._experts import experts_plan, parallel_experts_plan, shared_experts_plan
from keras_attn.convert._transformers_config import ModelSpec
from keras_attn.layers.gated_deltanet import GatedDeltaNet
from keras_attn.layers.latent_attention import MultiHeadLatentAttention
from keras_attn.layers.mixture_of_experts import MixtureOfExperts
from keras_attn.layers.parallel_mixture_of_experts import ParallelMixtureOfExperts


def _attention_plan(entries, spec: ModelSpec, layer, sub="", check=_cross_check):
    """Check and plan the attention entries under `sub` onto MultiHeadAttention `layer`.

    `check(entries, name, shape, letters, fields)` reads each entry and checks its shape
    (`_cross_check`: against the config's `fields`; keras_attn.convert.huggingface, which
    has no config, passes its own)."""
    # The layer's own d and H_kv (built from the spec: per layer where the config says so).
    H, D = spec.num_heads, spec.hidden_dim
    H_kv, d = getattr(layer, "num_key_value_heads", None), getattr(layer, "key_dim", None)
    H_kv, d = H_kv or spec.num_key_value_heads, d or spec.head_dim
    own = (H_kv, d) != (spec.num_key_value_heads, spec.head_dim)
    where = (" (this layer's own, per_layer_config or global_head_dim / "
             "num_global_key_value_heads)" if own else "")
    heads = f"num_attention_heads={H}, head_dim={d}{where} (H * d = {H * d})"
    kv_heads = f"num_key_value_heads={H_kv}, head_dim={d}{where} (H_kv * d = {H_kv * d})"
    width = f"hidden_size={D}"
    k_eq_v = bool(getattr(layer, "attention_k_eq_v", False))
    shared = bool(getattr(layer, "is_kv_shared_layer", False))  # no k/v: another layer's
    q = check(entries, sub + "q_proj.weight", (H * d, D), "(H * d, D)", f"{heads}, {width}")
    k = v = None
    if not shared:
        k = check(entries, sub + "k_proj.weight", (H_kv * d, D), "(H_kv * d, D)",
                  f"{kv_heads}, {width}")
    if k_eq_v and not shared:  # the keys' projection is the values' too: there is no v_proj
        for name in (sub + "v_proj.weight", sub + "v_proj.bias"):
            if entries.has(name):
                raise ValueError(
                    "The config and the weights disagree: attention_k_eq_v=True (the values "
                    f"are the projected keys) on this layer, but state_dict has "
                    f"{entries.key(name)}.")
    elif not shared:
        v = check(entries, sub + "v_proj.weight", (H_kv * d, D), "(H_kv * d, D)",
                  f"{kv_heads}, {width}")
    o = check(entries, sub + "o_proj.weight", (D, H * d), "(D, H * d)", f"{width}, {heads}")
    bias = {}
    parts = [("q", H * d, "(H * d,)", spec.qkv_bias, heads),
             ("k", H_kv * d, "(H_kv * d,)", spec.qkv_bias, kv_heads),
             ("v", H_kv * d, "(H_kv * d,)", spec.qkv_bias, kv_heads),
             ("o", D, "(D,)", spec.output_bias, width)]
    for part, rows, letters, flag, what in parts:
        if (part == "v" and k_eq_v) or (part in ("k", "v") and shared):
            continue
        name = f"{sub}{part}_proj.bias"
        if flag:
            bias[part] = check(entries, name, (rows,), letters, what)
        elif entries.has(name):
            why = (f"{spec.family!r} has no output bias" if spec.qkv_bias else
                   "the config has attention_bias=False")
            raise ValueError(
                f"The config and the weights disagree: {why}, but state_dict has "
                f"{entries.key(name)}.")
    weights = {"query": (q.T, bias.get("q")), "output": (o.T, bias.get("o"))}
    if k is not None:
        weights["key"] = (k.T, bias.get("k"))
    if v is not None:
        weights["value"] = (v.T, bias.get("v"))
    plan = _common.mha_plan(layer, weights)
    if getattr(layer, "use_sinks", False):  # attention sinks: one logit per query head
        w = check(entries, sub + "sinks", (H,), "(H,)", f"num_attention_heads={H}")
        plan.append((layer.sinks, w, "sinks"))
    elif entries.has(sub + "sinks"):
        raise ValueError(f"The config and the weights disagree: the layer has no attention "
                         f"sinks, but state_dict has {entries.key(sub + 'sinks')}.")
    if getattr(layer, "use_gate", False):  # the gated output (Qwen 3.5: from q_proj's rows)
        gate = check(entries, sub + "gate_proj.weight", (H * d, D), "(H * d, D)",
                     f"{heads}, {width}")
        gate_bias = (check(entries, sub + "gate_proj.bias", (H * d,), "(H * d,)", heads)
                     if spec.qkv_bias else None)
        plan += _common.dense_plan(layer.gate_dense, gate.T, gate_bias, "gate")
    if spec.qk_norm:
        norms = [("q", layer.query_norm)] + ([] if shared else [("k", layer.key_norm)])
        full = bool(getattr(layer, "qk_norm_full_width", False))  # OLMo 2: over H * d
        for part, norm in norms:
            shape, letters, what = (d,), "(d,)", f"head_dim={d}"
            if full:
                shape, letters, what = ((H * d,), "(H * d,)", heads) if part == "q" else (
                    (H_kv * d,), "(H_kv * d,)", kv_heads)
            w = check(entries, f"{sub}{part}_norm.weight", shape, letters, what)
            plan.append((norm.scale, w + spec.norm_offset, f"{part}_norm weight"))
    return plan


def _per_layer_embedding_plan(entries, spec, lm, check=_cross_check):
    """The per-layer input embeddings' model weights (Gemma 4), or none (`check` as for
    `_attention_plan`: the writer's probe runs through it too)."""
    P = spec.per_layer_input_dim
    if not P:
        return []
    L, D = spec.num_layers, spec.hidden_dim
    V_p = spec.per_layer_vocabulary_size or spec.vocabulary_size
    what = (f"vocab_size_per_layer_input={V_p}, num_hidden_layers={L}, "
            f"hidden_size_per_layer_input={P} (L * P = {L * P})")
    table = check(entries, "model.embed_tokens_per_layer.weight", (V_p, L * P),
                  "(V_p, L * P)", what)
    projection = check(entries, "model.per_layer_model_projection.weight", (L * P, D),
                       "(L * P, D)", f"{what}, hidden_size={D}")
    norm = check(entries, "model.per_layer_projection_norm.weight", (P,), "(P,)",
                 f"hidden_size_per_layer_input={P}")
    return [(lm.embed_tokens_per_layer.embeddings, table, "embed_tokens_per_layer weight"),
            (lm.per_layer_model_projection.kernel, projection.T,
             "per_layer_model_projection weight"),
            (lm.per_layer_projection_norm.scale, norm + spec.norm_offset,
             "per_layer_projection_norm weight")]


def _norm_plan(entries, spec, norm, name, check=_cross_check):
    """An RMSNorm's `norm_offset + w`, or a LayerNorm's weight and bias."""
    D = spec.hidden_dim
    w = check(entries, f"{name}.weight", (D,), "(D,)", f"hidden_size={D}")
    if spec.normalization == "rms":
        return [(norm.scale, w + spec.norm_offset if spec.norm_offset else w, f"{name} weight")]
    b = check(entries, f"{name}.bias", (D,), "(D,)", f"hidden_size={D}")
    return [(norm.gamma, w, f"{name} weight"), (norm.beta, b, f"{name} bias")]


def _block_plan(entries, spec: ModelSpec, block, sub="", check=_cross_check):
    """Check and plan a decoder layer's entries under `sub` onto the block (`check` as for
    `_attention_plan`)."""
    D, F = spec.hidden_dim, block.intermediate_dim or spec.intermediate_dim
    if isinstance(block.self_attention, GatedDeltaNet):  # a hybrid stack's linear block
        plan = gated_deltanet.plan(entries, spec, block.self_attention, sub + "linear_attn.",
                                   check)
    elif isinstance(block.self_attention, MultiHeadLatentAttention):
        plan = _latent._plan(entries, block.self_attention, D, sub + "self_attn.", check)
    else:
        plan = _attention_plan(entries, spec, block.self_attention, sub + "self_attn.", check)
    ff = block.feed_forward
    if isinstance(ff, MixtureOfExperts):
        plan += experts_plan(entries, spec, ff, sub, check)
        plan += shared_experts_plan(entries, spec, ff, sub, check,
                                    shared_prefix=spec.shared_expert_prefix)
        return plan + _block_norms_plan(entries, spec, block, sub, check)
    if isinstance(ff, ParallelMixtureOfExperts):  # Gemma 4: the dense MLP below, the rest
        plan += parallel_experts_plan(entries, spec, ff, sub, check,
                                      lambda norm, name: _norm_plan(entries, spec, norm, name,
                                                                    check))
        ff = ff.dense
        F = ff.intermediate_dim
    sizes = f"{spec.intermediate_field}={F}, hidden_size={D}"
    if F != spec.intermediate_dim:
        sizes = (f"{spec.intermediate_field}={spec.intermediate_dim} (this layer's F={F}: "
                 f"use_double_wide_mlp), hidden_size={D}")
    parts = [("gate", getattr(ff, "gate_dense", None), (F, D), "(F, D)"),
             ("up", ff.intermediate_dense, (F, D), "(F, D)"),
             ("down", ff.output_dense, (D, F), "(D, F)")]
    for part, dense, shape, letters in parts[0 if spec.gated_feed_forward else 1:]:
        name = f"{sub}mlp.{part}_proj"
        w = check(entries, name + ".weight", shape, letters, sizes)
        b = None
        if spec.mlp_bias:
            b = check(entries, name + ".bias", shape[:1], letters[:2] + ",)", sizes)
        elif entries.has(name + ".bias"):
            raise ValueError(f"The config and the weights disagree: mlp_bias=False but "
                             f"state_dict has {entries.key(name + '.bias')}.")
        plan += _common.dense_plan(dense, w.T, b, f"mlp.{part}_proj")
    return plan + _block_norms_plan(entries, spec, block, sub, check)


def _block_norms_plan(entries, spec: ModelSpec, block, sub, check):
    """A decoder layer's norms, per-layer input and layer scalar (after its MLP's)."""
    D = spec.hidden_dim
    plan = []
    norms = [("input_layernorm", block.self_attention_norm)]
    if spec.sandwich_norms:  # Gemma 4's MoE block: its feed-forward holds the pre norm
        norms += [("post_attention_layernorm", block.post_attention_norm),
                  ("pre_feedforward_layernorm", block.feed_forward_norm),
                  ("post_feedforward_layernorm", block.post_feed_forward_norm)]
        norms = [(name, norm) for name, norm in norms if norm is not None
                 or not isinstance(block.feed_forward, ParallelMixtureOfExperts)]
    elif not spec.parallel_residual:  # the parallel block's one norm is input_layernorm
        norms += [("post_attention_layernorm", block.feed_forward_norm)]
    if not spec.input_norms:  # OLMo 2's block: the norms after the sublayers only
        norms = [("post_attention_layernorm", block.post_attention_norm),
                 ("post_feedforward_layernorm", block.post_feed_forward_norm)]
    for norm_name, norm in norms:
        plan += _norm_plan(entries, spec, norm, sub + norm_name, check)
    P = spec.per_layer_input_dim
    if P:  # the per-layer input's gate, projection and norm
        what = f"hidden_size_per_layer_input={P}, hidden_size={D}"
        for part, dense, shape, letters in (
                ("per_layer_input_gate", block.per_layer_input_gate, (P, D), "(P, D)"),
                ("per_layer_projection", block.per_layer_projection, (D, P), "(D, P)")):
            w = check(entries, f"{sub}{part}.weight", shape, letters, what)
            plan += _common.dense_plan(dense, w.T, None, part)
        plan += _norm_plan(entries, spec, block.post_per_layer_input_norm,
                           sub + "post_per_layer_input_norm", check)
    if spec.layer_scalar:  # a buffer of transformers' state dict: one number per layer
        w = check(entries, sub + "layer_scalar", (1,), "(1,)", "a layer scalar")
        plan.append((block.layer_scalar, w, "layer_scalar"))
    return plan


def _entries(state_dict, spec, prefix=""):
    """The state dict's entries in the Llama layout: the family renames and splits its own
    (`canonical_state_dict`, where it has one)."""
    module = families.family(spec.family)
    canonical = getattr(module, "canonical_state_dict", None)
    if canonical is not None:
        if not isinstance(state_dict, Mapping) and callable(getattr(state_dict, "state_dict", None)):
            state_dict = state_dict.state_dict()
        state_dict = canonical(dict(state_dict), spec)
    return _common.StateDict(state_dict, prefix)


def model_plan(entries, spec, lm, embedding, head, check=_cross_check):
    """The whole model's plan `[(variable, array, what)]`: the embedding and head arrays (read
    by the caller: `head` None when tied), the per-layer embeddings, every block, the final
    norm (`check` as for `_attention_plan`). keras_attn.convert.pretrained runs it backwards
    to write a checkpoint: one map both ways."""
    plan = [(lm.token_embedding.embeddings, embedding, "model.embed_tokens weight")]
    plan += _per_layer_embedding_plan(entries, spec, lm, check)
    if spec.position_embeddings:  # learned absolute positions (GPT-2's wpe)
        N, D = spec.position_embeddings, lm.hidden_dim
        table = check(entries, "model.embed_positions.weight", (N, D), "(N, D)",
                      f"max_position_embeddings={N}, hidden_size={D}")
        plan.append((lm.position_embedding.embeddings, table, "model.embed_positions weight"))
    for i, block in enumerate(lm.blocks):
        plan += _block_plan(entries, spec, block, f"model.layers.{i}.", check)
    plan += _norm_plan(entries, spec, lm.final_norm, "model.norm", check)
    if head is not None and lm.lm_head is not None:
        plan.append((lm.lm_head.kernel, head.T, "lm_head weight"))
    return plan
