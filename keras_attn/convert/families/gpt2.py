"""`model_type="gpt2"` (GPT-2): learned absolute positions (`wpe`, `n_positions` rows) added
to the token embeddings, no RoPE, pre-LayerNorm blocks with biases everywhere, a plain
(ungated) MLP with `activation_function` (GPT-2's "gelu_new", the tanh approximation),
the head tied to the embeddings.

Its own names: `n_embd` (D), `n_head` (H), `n_layer`, `n_inner` (F, 4 D when None),
`n_positions` (N), `layer_norm_epsilon`. Its weights are `Conv1D`s, stored `(in, out)`,
and the query, key and value are one fused `c_attn` `(D, 3 D)`: `canonical_state_dict`
splits it (cross-checked against `n_embd`) and renames everything into the Llama layout
the converter maps, the position table as `model.embed_positions.weight`;
`checkpoint_state_dict` is its inverse (writing a checkpoint: `transformer.`-prefixed
names, `c_attn` fused, `Conv1D` weights `(in, out)` again).
`scale_attn_weights=False` (no 1/sqrt(d)) and `scale_attn_by_inverse_layer_idx` (the
scale over `layer_idx + 1`) are reproduced with each block's attention `scale`.
"""

from keras_attn.convert._transformers_config import (
    ACTIVATIONS,
    ModelSpec,
    _number,
    _positive_int,
)
from keras_attn.convert.families import _shared

MODEL_TYPE = "gpt2"
ARCHITECTURES = ("GPT2LMHeadModel", "GPT2Model")  # transformers' classes (`architectures`)
FIELDS = {
    "read": ("vocab_size", "n_embd", "n_head", "n_layer", "n_inner", "n_positions",
             "activation_function", "layer_norm_epsilon", "tie_word_embeddings",
             "scale_attn_weights", "scale_attn_by_inverse_layer_idx"),
    "neutral": {},
    "ignored": {
        "resid_pdrop": "dropout (inference)", "embd_pdrop": "dropout (inference)",
        "attn_pdrop": "dropout (inference)",
        "summary_type": "GPT2DoubleHeadsModel's classification head",
        "summary_use_proj": "as `summary_type`", "summary_activation": "as `summary_type`",
        "summary_proj_to_labels": "as `summary_type`",
        "summary_first_dropout": "as `summary_type`",
        "reorder_and_upcast_attn": "the same scores in float32 (it scales the keys first "
                                   "and upcasts under half precision only)",
        "n_ctx": "an old alias of `n_positions`, not read by transformers' GPT-2",
        "max_position_embeddings": "read as `n_positions` (transformers' attribute map)",
    },
}


def spec(config):
    D = _positive_int(config, "n_embd")
    H = _positive_int(config, "n_head")
    if D % H:
        _shared.refuse("n_head", H, f"it must divide n_embd={D}")
    n = _positive_int(config, "n_layer")
    F = _positive_int(config, "n_inner") if config.get("n_inner") is not None else 4 * D
    activation = config.get("activation_function", "gelu_new")
    if activation not in ACTIVATIONS:
        _shared.refuse("activation_function", activation,
                       f"supported: {', '.join(map(repr, ACTIVATIONS))}")
    d = D // H
    scale = d ** -0.5 if config.get("scale_attn_weights", True) else 1.0
    by_layer = bool(config.get("scale_attn_by_inverse_layer_idx", False))
    return ModelSpec(
        family=MODEL_TYPE, vocabulary_size=_positive_int(config, "vocab_size"), hidden_dim=D,
        intermediate_dim=F, num_layers=n, num_heads=H, num_key_value_heads=H, head_dim=d,
        activation=ACTIVATIONS[activation], epsilon=_number(config, "layer_norm_epsilon", 1e-5),
        attention_dropout=0.0, tie_word_embeddings=bool(config.get("tie_word_embeddings", True)),
        qkv_bias=True, output_bias=True, mlp_bias=True, qk_norm=False,
        final_logit_soft_cap=None, normalization="layer", gated_feed_forward=False,
        position_embeddings=_positive_int(config, "n_positions", 1024),
        layers=[_shared.layer_specs(1, {}, uses_rope=[False],
                                    scale=scale / (i + 1) if by_layer else scale)[0]
                for i in range(n)])


# GPT-2's block entries -> the Llama layout's (a whole block's, or an attention's alone).
_RENAMES = {"ln_1.": "input_layernorm.", "ln_2.": "post_attention_layernorm.",
            "attn.c_proj.": "self_attn.o_proj.", "mlp.c_fc.": "mlp.up_proj.",
            "mlp.c_proj.": "mlp.down_proj.", "c_proj.": "o_proj."}
_TOP = {"wte.weight": "model.embed_tokens.weight", "wpe.weight": "model.embed_positions.weight",
        "ln_f.weight": "model.norm.weight", "ln_f.bias": "model.norm.bias"}


def _split_qkv(key, value, D):
    """The fused `c_attn` weight `(D, 3 D)` or bias `(3 D,)` as q, k, v in a Linear's
    layout, cross-checked against `n_embd`."""
    import numpy as np

    from keras_attn.convert import _common

    part = _common.to_numpy(value, f"state_dict entry {key!r}")
    is_weight = key.endswith("weight")
    shape = (D, 3 * D) if is_weight else (3 * D,)
    if part.shape != shape:
        raise ValueError(
            f"The config and the weights disagree: n_embd={D} gives {shape} for state_dict "
            f"entry {key!r} (the fused query, key and value), which has shape "
            f"{_common.shape_text(part.shape)}.")
    return [piece.T if is_weight else piece for piece in np.split(part, 3, axis=-1)]


def canonical_state_dict(entries, spec):
    """GPT-2's entries (a model's, a block's or an attention's) in the Llama layout:
    `c_attn` split into q/k/v, every `Conv1D` weight `(in, out)` transposed to a Linear's
    `(out, in)`, the position table `model.embed_positions.weight`."""
    from keras_attn.convert import _common

    out = {}
    for key, value in entries.items():
        if not isinstance(key, str):
            out[key] = value
            continue
        name = key[len("transformer."):] if key.startswith("transformer.") else key
        if name in _TOP:
            out[_TOP[name]] = value
            continue
        prefix, rest = "", name
        if name.startswith("h."):
            index, rest = name[2:].split(".", 1)
            prefix = f"model.layers.{index}."
        if rest in ("attn.bias", "attn.masked_bias"):
            continue  # older checkpoints' causal-mask buffers, not weights
        if rest.startswith(("attn.c_attn.", "c_attn.")):
            sub = "self_attn." if rest.startswith("attn.") else ""
            leaf = rest.rsplit(".", 1)[1]
            for proj, piece in zip(("q_proj", "k_proj", "v_proj"),
                                   _split_qkv(key, value, spec.hidden_dim)):
                out[f"{prefix}{sub}{proj}.{leaf}"] = piece
            continue
        for old, new in _RENAMES.items():
            if rest.startswith(old):
                rest = new + rest[len(old):]
                if new.endswith("proj.") and rest.endswith("weight"):  # Conv1D: (in, out)
                    value = _common.to_numpy(value, f"state_dict entry {key!r}").T
                break
        out[prefix + rest] = value  # lm_head.weight; anything unknown is reported unused
    return out


def checkpoint_state_dict(tensors, spec):
    """The inverse of `canonical_state_dict` (for writing a checkpoint): GPT-2's names under
    `transformer.` (`lm_head.weight` where untied), q/k/v fused back into `c_attn` (columns
    q, k, v, as `split(n_embd, dim=2)` reads them), every `Conv1D` weight `(in, out)`."""
    import numpy as np

    top = {new: "transformer." + old for old, new in _TOP.items()}
    block = {new: old for old, new in _RENAMES.items() if old != "c_proj."}
    out = {}
    for key, value in tensors.items():
        if key in top:
            out[top[key]] = value
            continue
        if not key.startswith("model.layers."):
            out[key] = value  # lm_head.weight
            continue
        index, rest = key[len("model.layers."):].split(".", 1)
        prefix = f"transformer.h.{index}."
        if rest.startswith(("self_attn.k_proj.", "self_attn.v_proj.")):
            continue  # fused with its q_proj below
        if rest.startswith("self_attn.q_proj."):
            leaf = rest.rsplit(".", 1)[1]
            parts = [tensors[f"model.layers.{index}.self_attn.{p}_proj.{leaf}"]
                     for p in ("q", "k", "v")]
            out[prefix + "attn.c_attn." + leaf] = np.concatenate(
                [p.T for p in parts] if leaf == "weight" else parts, axis=-1)
            continue
        for new, old in block.items():
            if rest.startswith(new):
                if new.endswith("proj.") and rest.endswith("weight"):  # Conv1D: (in, out)
                    value = value.T
                rest = old + rest[len(new):]
                break
        out[prefix + rest] = value
    return out
